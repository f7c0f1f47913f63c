/*
 * The compatibility client for the interposer tests: what applications and libraries do with
 * cuMemAlloc memory beyond launching on it. Modes (argv[1]):
 *   export <dir>  allocates 1 MiB (cuMemAlloc_v2), fills it (word i = i), exports it
 *                 (cuIpcGetMemHandle) and prints "export rc=<r> kind=<k>"; on success writes the
 *                 handle to <dir>/handle, waits (at most 20 s) for <dir>/imported and prints
 *                 "sees <word 0>" (what the importer wrote); on failure allocates and exports a
 *                 second buffer, "export2 rc=<r> kind=<k>"
 *   import <dir>  waits for <dir>/handle, opens it (cuIpcOpenMemHandle_v2), prints
 *                 "import rc=<r> words=<w0> <w1> <w2>", the address range of an inner pointer as
 *                 "range rc=<r> offset=<base - p> size=<s>", writes 777 to word 0, creates
 *                 <dir>/imported, closes the handle: "closed rc=<r>"
 *   attrs         allocates 1 MiB and prints what pointer queries say of p + 4096, one line
 *                 each: single attributes, the batch form, cuMemGetAddressRange_v2, and what the
 *                 communication library (libnccl.so.2 double) sees
 *   lib           the communication library allocates and registers its buffer:
 *                 "lib alloc rc=<r> export rc=<r> ipc=<c> kind=<k>"
 *   alloc         allocates 1 MiB: "alloc rc=<r> kind=<k>"
 *   allocbench N managed|alloc  times N allocate + free pairs of 4 KiB, through cuMemAllocManaged
 *                 directly or cuMemAlloc_v2: "allocbench <ns per pair>" (the interposer's cost per
 *                 allocation is the difference between the two under it)
 *   legacy        cuMemAlloc through cuGetProcAddress_v2 asked for CUDA 3.1 (the 32-bit-size ABI,
 *                 which is not substituted) and for 12.0: "legacy kind=<k> current kind=<k>"
 *   stale         allocates 1 MiB, resets the primary context (freeing it without cuMemFree),
 *                 then asks its address range and IS_MANAGED: "stale range rc=<r> managed rc=<r>"
 *   dmabuf        allocates 1 MiB and exports it as a dma-buf (cuMemGetHandleForAddressRange), then
 *                 a second buffer: "dmabuf rc=<r> kind=<k>", "dmabuf2 rc=<r> kind=<k>"
 *   share         the other ways to share memory with a process: a VMM allocation exported and
 *                 imported, a memory pool exported and imported, a pointer of it exported and
 *                 imported: "share vmm rc=<r> <r> pool rc=<r> <r> pointer rc=<r> <r>"
 *   release       releases the primary context it retained: "release rc=<r>"
 *   v1open        exports 1 MiB and opens its own handle through the name before CUDA 11, looked
 *                 up with dlsym: "v1open rc=<r>"
 * Then it prints "ready" and waits for stdin to close (the test reads the control socket), or
 * with CLIENT_HOLD set (a container without stdin) forever, or with CLIENT_EXIT set not at all.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct { char bytes[64]; } CUipcMemHandle;

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned int);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuPointerGetAttributes(unsigned, int *, void **, CUdeviceptr);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);
CUresult cuMemGetHandleForAddressRange(void *, CUdeviceptr, size_t, int, unsigned long long);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuDevicePrimaryCtxReset_v2(int);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemCreate(unsigned long long *, size_t, const void *, unsigned long long);
CUresult cuMemExportToShareableHandle(void *, unsigned long long, int, unsigned long long);
CUresult cuMemImportFromShareableHandle(unsigned long long *, void *, int);
CUresult cuMemPoolExportToShareableHandle(void *, void *, int, unsigned long long);
CUresult cuMemPoolImportFromShareableHandle(void **, void *, int, unsigned long long);
CUresult cuMemPoolExportPointer(void *, CUdeviceptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *, void *, void *);
CUresult cuDevicePrimaryCtxRelease_v2(int);
int fake_cuda_kind(CUdeviceptr);
void commlib_register(size_t, CUdeviceptr *, int[3]);
int commlib_is_managed(CUdeviceptr);

#define SIZE (1u << 20)

static int wait_for(const char *path) {
    for (int i = 0; i < 200; i++) {
        if (access(path, F_OK) == 0) return 1;
        usleep(100000);
    }
    return 0;
}

static int export_mode(const char *dir) {
    CUdeviceptr p = 0;
    int r = cuMemAlloc_v2(&p, SIZE);
    unsigned *words = malloc(SIZE);
    for (unsigned i = 0; i < SIZE / 4; i++) words[i] = i;
    if (r == 0) r = cuMemcpyHtoD_v2(p, words, SIZE);
    CUipcMemHandle h;
    r = r ? r : cuIpcGetMemHandle(&h, p);
    printf("export rc=%d kind=%d\n", r, fake_cuda_kind(p));
    char path[4096], tmp[4096];
    if (r != 0) {
        CUdeviceptr q = 0;
        r = cuMemAlloc_v2(&q, SIZE);
        r = r ? r : cuIpcGetMemHandle(&h, q);
        printf("export2 rc=%d kind=%d\n", r, fake_cuda_kind(q));
        return 0;
    }
    snprintf(tmp, sizeof tmp, "%s/handle.tmp", dir);
    snprintf(path, sizeof path, "%s/handle", dir);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(&h, sizeof h, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
        printf("handle write failed\n");
        return 1;
    }
    snprintf(path, sizeof path, "%s/imported", dir);
    if (!wait_for(path)) {
        printf("no importer\n");
        return 1;
    }
    unsigned first = 0;
    cuMemcpyDtoH_v2(&first, p, sizeof first);
    printf("sees %u\n", first);
    return 0;
}

static int import_mode(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/handle", dir);
    CUipcMemHandle h;
    FILE *f = wait_for(path) ? fopen(path, "rb") : NULL;
    if (!f || fread(&h, sizeof h, 1, f) != 1) {
        printf("no handle\n");
        return 1;
    }
    fclose(f);
    CUdeviceptr p = 0;
    int r = cuIpcOpenMemHandle_v2(&p, h, 1);
    unsigned w[3] = {0};
    if (r == 0) cuMemcpyDtoH_v2(w, p, sizeof w);
    printf("import rc=%d words=%u %u %u\n", r, w[0], w[1], w[2]);
    CUdeviceptr base = 0;
    size_t size = 0;
    int rr = r ? r : cuMemGetAddressRange_v2(&base, &size, p + 100);
    printf("range rc=%d offset=%lld size=%zu\n", rr, (long long)(p - base), size);
    unsigned v = 777;
    if (r == 0) cuMemcpyHtoD_v2(p, &v, sizeof v);
    snprintf(path, sizeof path, "%s/imported", dir);
    fclose(fopen(path, "w"));
    printf("closed rc=%d\n", r ? r : cuIpcCloseMemHandle(p));
    return 0;
}

static int attrs_mode(void) {
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, SIZE) != 0) return 1;
    CUdeviceptr q = p + 4096;
    unsigned type = 0, managed = 0;
    unsigned char ipc = 9;
    CUdeviceptr start = 0;
    size_t size = 0;
    int r = cuPointerGetAttribute(&type, 2, q) | cuPointerGetAttribute(&managed, 8, q) |
            cuPointerGetAttribute(&ipc, 10, q) | cuPointerGetAttribute(&start, 11, q) |
            cuPointerGetAttribute(&size, 12, q);
    printf("single rc=%d type=%u managed=%u start=%lld size=%zu\n", r, type, managed,
           (long long)(q - start), size);
    printf("ipc-capable %u\n", ipc);
    int which[4] = {2, 8, 11, 12};
    unsigned btype = 0;
    unsigned char bmanaged = 7;
    CUdeviceptr bstart = 0;
    size_t bsize = 0;
    void *data[4] = {&btype, &bmanaged, &bstart, &bsize};
    r = cuPointerGetAttributes(4, which, data, q);
    printf("batch rc=%d type=%u managed=%u start=%lld size=%zu\n", r, btype, bmanaged,
           (long long)(q - bstart), bsize);
    CUdeviceptr base = 0;
    size_t len = 0;
    r = cuMemGetAddressRange_v2(&base, &len, q);
    printf("range rc=%d offset=%lld size=%zu\n", r, (long long)(q - base), len);
    printf("library-sees managed=%d\n", commlib_is_managed(q));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int dev;
    CUcontext ctx;
    if (argc < 2 || cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        printf("init failed\n");
        return 1;
    }
    int rc = 2;
    if (strcmp(argv[1], "export") == 0 && argc > 2) rc = export_mode(argv[2]);
    else if (strcmp(argv[1], "import") == 0 && argc > 2) rc = import_mode(argv[2]);
    else if (strcmp(argv[1], "attrs") == 0) rc = attrs_mode();
    else if (strcmp(argv[1], "legacy") == 0) {
        CUdeviceptr a = 0, b = 0;
        void *old = NULL, *cur = NULL;
        int st;
        if (cuGetProcAddress_v2("cuMemAlloc", &old, 3010, 0, &st) ||
            cuGetProcAddress_v2("cuMemAlloc", &cur, 12000, 0, &st))
            return 1;
        /* The double's only cuMemAlloc is the 64-bit one: called the same way either way. */
        ((CUresult(*)(CUdeviceptr *, size_t))old)(&a, SIZE);
        ((CUresult(*)(CUdeviceptr *, size_t))cur)(&b, SIZE);
        printf("legacy kind=%d current kind=%d\n", fake_cuda_kind(a), fake_cuda_kind(b));
        rc = 0;
    } else if (strcmp(argv[1], "stale") == 0) {
        CUdeviceptr p = 0, base = 0;
        size_t size = 0;
        unsigned managed = 0;
        if (cuMemAlloc_v2(&p, SIZE) || cuDevicePrimaryCtxReset_v2(0)) return 1;
        int r1 = cuMemGetAddressRange_v2(&base, &size, p);
        int r2 = cuPointerGetAttribute(&managed, 8, p);
        printf("stale range rc=%d managed rc=%d\n", r1, r2);
        rc = 0;
    } else if (strcmp(argv[1], "allocbench") == 0 && argc > 3) {
        int n = atoi(argv[2]), managed = strcmp(argv[3], "managed") == 0;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < n; i++) {
            CUdeviceptr p = 0;
            if ((managed ? cuMemAllocManaged(&p, 4096, 1) : cuMemAlloc_v2(&p, 4096)) ||
                cuMemFree_v2(p))
                return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
        printf("allocbench %.0f\n", n > 0 ? ns / n : 0);
        return 0;
    } else if (strcmp(argv[1], "share") == 0) {
        unsigned long long h = 0, h2 = 0;
        int fd = -1, pfd = -1;
        void *pool = NULL;
        CUdeviceptr p = 0, q = 0;
        char data[64] = {0};
        int c = cuMemCreate(&h, SIZE, NULL, 0);
        int e = c ? c : cuMemExportToShareableHandle(&fd, h, 1, 0);
        int i = e ? e : cuMemImportFromShareableHandle(&h2, (void *)(long)fd, 1);
        int pe = cuMemPoolExportToShareableHandle(&pfd, (void *)1, 1, 0);
        int pi = pe ? pe : cuMemPoolImportFromShareableHandle(&pool, (void *)(long)pfd, 1, 0);
        int xe = cuMemAlloc_v2(&p, SIZE);
        xe = xe ? xe : cuMemPoolExportPointer(data, p);
        int xi = xe ? xe : cuMemPoolImportPointer(&q, pool, data);
        printf("share vmm rc=%d %d pool rc=%d %d pointer rc=%d %d\n", e, i, pe, pi, xe, xi);
        rc = 0;
    } else if (strcmp(argv[1], "v1open") == 0) {
        CUdeviceptr p = 0, q = 0;
        CUipcMemHandle h;
        void *lib = dlopen("libcuda.so.1", RTLD_NOW);
        CUresult (*open1)(CUdeviceptr *, CUipcMemHandle, unsigned) =
            lib ? (CUresult(*)(CUdeviceptr *, CUipcMemHandle, unsigned))dlsym(lib, "cuIpcOpenMemHandle")
                : NULL;
        int r = open1 ? cuMemAlloc_v2(&p, SIZE) : 98;
        r = r ? r : cuIpcGetMemHandle(&h, p);
        r = r ? r : open1(&q, h, 1);
        printf("v1open rc=%d\n", r);
        rc = 0;
    } else if (strcmp(argv[1], "release") == 0) {
        printf("release rc=%d\n", cuDevicePrimaryCtxRelease_v2(0));
        rc = 0;
    } else if (strcmp(argv[1], "dmabuf") == 0) {
        for (int i = 0; i < 2; i++) {
            CUdeviceptr p = 0;
            int fd = -1;
            int r = cuMemAlloc_v2(&p, SIZE);
            r = r ? r : cuMemGetHandleForAddressRange(&fd, p, SIZE, 1, 0);
            printf("dmabuf%s rc=%d kind=%d\n", i ? "2" : "", r, fake_cuda_kind(p));
            if (fd >= 0) close(fd);
        }
        rc = 0;
    } else if (strcmp(argv[1], "alloc") == 0) {
        CUdeviceptr p = 0;
        int r = cuMemAlloc_v2(&p, SIZE);
        printf("alloc rc=%d kind=%d\n", r, fake_cuda_kind(p));
        rc = 0;
    }
    else if (strcmp(argv[1], "lib") == 0) {
        CUdeviceptr p = 0;
        int out[3];
        commlib_register(SIZE, &p, out);
        printf("lib alloc rc=%d export rc=%d ipc=%d kind=%d\n", out[0], out[1], out[2],
               fake_cuda_kind(p));
        rc = 0;
    }
    if (rc != 0) return rc;
    printf("ready\n");
    if (getenv("CLIENT_EXIT")) return 0;
    if (getenv("CLIENT_HOLD"))
        for (;;) pause();
    char buf[64];
    while (fgets(buf, sizeof buf, stdin)) {}
    return 0;
}
