/*
 * Managed-memory compatibility on a real driver (issue 13 GPU check). Driver API loaded at run
 * time, so no CUDA toolkit is needed: cc -O2 -o compatcheck compatcheck.c -ldl
 *
 *   compatcheck probe        no interposer: what the driver says of cuMemAlloc memory and of
 *                            cuMemAllocManaged memory (also after a prefetch to the host): legacy
 *                            IPC export, pointer attributes, cuMemGetAddressRange, dma-buf export
 *   compatcheck attrs        pointer queries on a cuMemAlloc buffer (run under the interposer:
 *                            converted memory)
 *   compatcheck export DIR   allocates 2 MiB, fills it, exports it (cuIpcGetMemHandle) to
 *                            DIR/handle, waits for DIR/imported, prints what the importer wrote;
 *                            on a refused export it allocates and exports a second buffer
 *   compatcheck import DIR   opens DIR/handle in a second process, checks the contents, reads the
 *                            address range of the imported pointer, writes 777, DIR/imported
 *
 * Prints `name value` lines; exit 1 on a missing function or a wrong result.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct { char bytes[64]; } CUipcMemHandle;
typedef struct { int type; int id; } CUmemLocation;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
static CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
static CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
static CUresult (*cuPointerGetAttribute)(void *, int, CUdeviceptr);
static CUresult (*cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
static CUresult (*cuMemGetHandleForAddressRange)(void *, CUdeviceptr, size_t, int,
                                                 unsigned long long);
static CUresult (*cuMemPrefetchAsync)(CUdeviceptr, size_t, CUmemLocation, unsigned, void *);

#define SIZE (2u << 20)

static int load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("no libcuda.so.1: %s\n", dlerror());
        return 1;
    }
#define LOAD(f, name)                                                                      \
    if (!(*(void **)&f = dlsym(h, name))) {                                                \
        printf("missing %s\n", name);                                                      \
        return 1;                                                                          \
    }
    LOAD(cuInit, "cuInit");
    LOAD(cuDeviceGet, "cuDeviceGet");
    LOAD(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(cuCtxSetCurrent, "cuCtxSetCurrent");
    LOAD(cuCtxSynchronize, "cuCtxSynchronize");
    LOAD(cuMemAlloc, "cuMemAlloc_v2");
    LOAD(cuMemAllocManaged, "cuMemAllocManaged");
    LOAD(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    LOAD(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    LOAD(cuIpcGetMemHandle, "cuIpcGetMemHandle");
    LOAD(cuPointerGetAttribute, "cuPointerGetAttribute");
    LOAD(cuMemGetAddressRange, "cuMemGetAddressRange_v2");
    LOAD(cuIpcCloseMemHandle, "cuIpcCloseMemHandle");
    if (!(*(void **)&cuIpcOpenMemHandle = dlsym(h, "cuIpcOpenMemHandle_v2")))
        LOAD(cuIpcOpenMemHandle, "cuIpcOpenMemHandle");
    /* Optional: dma-buf export (CUDA 11.7+), location-based prefetch (12.2+). */
    *(void **)&cuMemGetHandleForAddressRange = dlsym(h, "cuMemGetHandleForAddressRange");
    *(void **)&cuMemPrefetchAsync = dlsym(h, "cuMemPrefetchAsync_v2");
    int dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        printf("init failed\n");
        return 1;
    }
    return 0;
}

/* Pointer attributes of p + 4096 (the range start as an offset from p). */
static void attributes(const char *what, CUdeviceptr p) {
    static const int which[] = {2, 8, 9, 10, 11, 12, 14, 15};
    CUdeviceptr q = p + 4096;
    for (size_t i = 0; i < sizeof which / sizeof which[0]; i++) {
        unsigned long long v = 0;
        int r = cuPointerGetAttribute(&v, which[i], q);
        if (which[i] == 11 && r == 0) v = q - v;
        printf("%s attr%d rc=%d value=%llu\n", what, which[i], r, v);
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    int r = cuMemGetAddressRange(&base, &size, q);
    printf("%s range rc=%d offset=%lld size=%zu\n", what, r, r ? 0LL : (long long)(q - base), size);
}

static void probe(const char *what, CUdeviceptr p) {
    CUipcMemHandle h;
    printf("%s ipc_export rc=%d\n", what, cuIpcGetMemHandle(&h, p));
    attributes(what, p);
    if (cuMemGetHandleForAddressRange) {
        int fd = -1;
        int r = cuMemGetHandleForAddressRange(&fd, p, SIZE, 1, 0);
        printf("%s dmabuf_export rc=%d\n", what, r);
        if (r == 0 && fd >= 0) close(fd);
    } else {
        printf("%s dmabuf_export absent\n", what);
    }
}

static int wait_for(const char *path) {
    for (int i = 0; i < 300; i++) {
        if (access(path, F_OK) == 0) return 1;
        usleep(100000);
    }
    return 0;
}

static int export_mode(const char *dir) {
    CUdeviceptr p = 0;
    unsigned *w = malloc(SIZE);
    for (unsigned i = 0; i < SIZE / 4; i++) w[i] = i;
    CUipcMemHandle h;
    int r = cuMemAlloc(&p, SIZE);
    if (!r) r = cuMemcpyHtoD(p, w, SIZE);
    if (!r) r = cuIpcGetMemHandle(&h, p);
    printf("export rc=%d\n", r);
    if (r) {
        CUdeviceptr q = 0;
        r = cuMemAlloc(&q, SIZE);
        printf("export2 rc=%d\n", r ? r : cuIpcGetMemHandle(&h, q));
        return 0;
    }
    char tmp[4096], path[4096];
    snprintf(tmp, sizeof tmp, "%s/handle.tmp", dir);
    snprintf(path, sizeof path, "%s/handle", dir);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(&h, sizeof h, 1, f) != 1 || fclose(f) || rename(tmp, path)) return 1;
    snprintf(path, sizeof path, "%s/imported", dir);
    if (!wait_for(path)) {
        printf("no importer\n");
        return 1;
    }
    unsigned first = 0;
    cuMemcpyDtoH(&first, p, sizeof first);
    printf("sees %u\n", first);
    return first == 777 ? 0 : 1;
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
    int r = cuIpcOpenMemHandle(&p, h, 1);
    unsigned w[3] = {0};
    if (!r) r = cuMemcpyDtoH(w, p, sizeof w);
    printf("import rc=%d words=%u %u %u\n", r, w[0], w[1], w[2]);
    if (r) return 1;
    CUdeviceptr base = 0;
    size_t size = 0;
    int rr = cuMemGetAddressRange(&base, &size, p + 100);
    printf("import range rc=%d offset=%lld size=%zu\n", rr, (long long)(p - base), size);
    unsigned v = 777;
    cuMemcpyHtoD(p, &v, sizeof v);
    cuCtxSynchronize();
    snprintf(path, sizeof path, "%s/imported", dir);
    fclose(fopen(path, "w"));
    printf("closed rc=%d\n", cuIpcCloseMemHandle(p));
    return w[1] == 1 && w[2] == 2 ? 0 : 1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2 || load()) return argc < 2 ? 2 : 1;
    if (!strcmp(argv[1], "probe")) {
        CUdeviceptr d = 0, m = 0;
        if (cuMemAlloc(&d, SIZE) || cuMemAllocManaged(&m, SIZE, 1)) return 1;
        probe("device", d);
        probe("managed", m);
        if (cuMemPrefetchAsync) {
            CUmemLocation host = {2, 0};
            int r = cuMemPrefetchAsync(m, SIZE, host, 0, NULL);
            if (!r) r = cuCtxSynchronize();
            printf("managed-on-host prefetch rc=%d\n", r);
            attributes("managed-on-host", m);
        }
        return 0;
    }
    if (!strcmp(argv[1], "attrs")) {
        CUdeviceptr p = 0;
        if (cuMemAlloc(&p, SIZE)) return 1;
        attributes("interposed", p);
        return 0;
    }
    if (!strcmp(argv[1], "export") && argc > 2) return export_mode(argv[2]);
    if (!strcmp(argv[1], "import") && argc > 2) return import_mode(argv[2]);
    return 2;
}
