/*
 * A CUDA driver-API client for the interposer tests. It links libcuda.so.1 directly and also
 * gets entry points through dlsym(handle) and cuGetProcAddress_v2, allocating through each, and
 * prints what the (fake) driver says each allocation is. Then it takes commands on stdin:
 *   launch   cuLaunchKernel, then prints "launched"
 *   status   prints the location of every allocation (1 device, 2 host)
 *   others   allocates natively: 2 MiB VMM (cuMemCreate), 3 MiB stream-ordered (cuMemAllocAsync,
 *            through cuGetProcAddress_v2), a 256×256 float array; prints "others rc=<sum>"
 *   free-others  releases them; prints "freed rc=<sum>"
 *   launchex cuLaunchKernelEx through cuGetProcAddress_v2, then prints "launchedex rc=<r>"
 *   copyasync  cuMemcpyHtoDAsync_v2 (direct), then prints "copied rc=<r>"
 *   threads  four threads launch at once; prints "threads rc=<sum>" when all four returned
 *   launch-bg  a thread launches, and the client prints "started" at once (a launch in flight
 *            while the main thread goes on)
 *   copy-bg  a thread copies 16 bytes to the first allocation (cuMemcpyHtoD_v2) and writes
 *            "copy-bg rc=<r>" to stderr; the client prints "started" at once
 *   capture  on a new stream: begins a capture, launches, idles 100 ms, ends the capture; prints
 *            "captured rc=<sum> end=<cuStreamEndCapture's result>"
 *   reset    cuDevicePrimaryCtxReset_v2 of its device; prints "reset rc=<r>"
 *   fork     forks a child that allocates 1 MiB, prints "child kind=<k> pid=<pid>", and exits
 *            once the file named by CLIENT_CHILD_DONE exists (at most 20 s)
 *   quit
 * CLIENT_EXTRA_MIB=<n> in its environment has it allocate <n> MiB more (cuMemAlloc_v2) after
 * those four, printing "extra rc=<r> kind=<k>": a container holding that much GPU memory.
 * With the argument `loop` it takes no commands: after the allocations it launches a kernel
 * every 20 ms forever (a function's container between and during invocations; the driver
 * double's log shows each launch). With `serve <kernels> <gap_ms> [<requests> [<copy>]]` it
 * is a long-running GPU server: each request copies <copy> bytes (at most 1 MiB, default 0) to
 * the device (cuMemcpyHtoD_v2), launches <kernels> kernels and waits for them
 * (cuCtxSynchronize), then it idles <gap_ms>; forever (<requests> < 0), or <requests> times
 * then it exits.
 * With `bench <bursts> <calls> <gap_ms>` it times launches: <bursts> times it idles <gap_ms>,
 * times the first launch after the gap (a burst's first call) and then <calls> more (calls
 * inside the burst), and prints "first p50_ns p99_ns" and "inburst mean_ns".
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
CUresult cuMemCreate(unsigned long long *, size_t, const void *, unsigned long long);
CUresult cuMemRelease(unsigned long long);
CUresult cuMemFreeAsync(CUdeviceptr, void *);
typedef struct { size_t w, h; unsigned format, channels; } ArrayDesc;
CUresult cuArrayCreate_v2(void **, const ArrayDesc *);
CUresult cuArrayDestroy(void *);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, void *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(void **, unsigned);
CUresult cuStreamBeginCapture_v2(void *, int);
CUresult cuStreamEndCapture(void *, void **);
CUresult cuDevicePrimaryCtxReset_v2(int);
static long long mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}
static int cmp_ll(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}
static void *launcher(void *rc) {
    *(int *)rc = cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    return NULL;
}
/* A synchronous copy to the device pointer `dst` points at. */
static void *copier(void *dst) {
    char buf[16] = {0};
    int rc = cuMemcpyHtoD_v2(*(CUdeviceptr *)dst, buf, sizeof buf);
    fprintf(stderr, "copy-bg rc=%d\n", rc);
    return NULL;
}
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, void *);
typedef CUresult (*launch_ex_fn)(const void *, void *, void **, void **);
int fake_cuda_kind(CUdeviceptr);
int fake_cuda_location(CUdeviceptr);

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*gpa_fn)(const char *, void **, int, unsigned long long, int *);

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* As Python and many servers do: a write to a closed pipe fails with EPIPE instead. */
    if (getenv("CLIENT_IGNORE_SIGPIPE")) signal(SIGPIPE, SIG_IGN);
    int dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx)) {
        printf("init failed\n");
        return 1;
    }
    CUdeviceptr p[4] = {0};
    int r = cuMemAlloc_v2(&p[0], 1 << 20);
    printf("direct rc=%d kind=%d\n", r, fake_cuda_kind(p[0]));

    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    alloc_fn by_dlsym = h ? (alloc_fn)dlsym(h, "cuMemAlloc_v2") : NULL;
    r = by_dlsym ? by_dlsym(&p[1], 2 << 20) : -1;
    printf("dlsym rc=%d kind=%d\n", r, fake_cuda_kind(p[1]));

    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    void *f = NULL;
    int st = -1;
    r = gpa ? gpa("cuMemAlloc", &f, 12000, 0, &st) : -1;
    r = (r == 0 && f) ? ((alloc_fn)f)(&p[2], 4 << 20) : -1;
    printf("procaddr rc=%d kind=%d\n", r, fake_cuda_kind(p[2]));

    size_t pitch = 0;
    r = cuMemAllocPitch_v2(&p[3], &pitch, 1000, 10, 4);
    printf("pitch rc=%d kind=%d pitch=%zu\n", r, fake_cuda_kind(p[3]), pitch);
    const char *extra_mib = getenv("CLIENT_EXTRA_MIB");
    if (extra_mib) {
        CUdeviceptr x = 0;
        r = cuMemAlloc_v2(&x, (size_t)atol(extra_mib) << 20);
        printf("extra rc=%d kind=%d\n", r, fake_cuda_kind(x));
    }
    printf("ready\n");
    if (argc > 1 && strcmp(argv[1], "loop") == 0) {
        for (;;) {
            cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            usleep(20000);
        }
    }

    if (argc > 4 && strcmp(argv[1], "bench") == 0) {
        int bursts = atoi(argv[2]), calls = atoi(argv[3]), gap_ms = atoi(argv[4]);
        if (bursts < 1 || bursts > 100000 || calls < 1) return 2;
        long long *first = calloc((size_t)bursts, sizeof *first);
        long long inburst = 0;
        for (int b = 0; b < bursts; b++) {
            usleep((useconds_t)gap_ms * 1000);
            long long t0 = mono_ns();
            cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            long long t1 = mono_ns();
            for (int k = 0; k < calls; k++)
                cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            inburst += mono_ns() - t1;
            first[b] = t1 - t0;
        }
        qsort(first, (size_t)bursts, sizeof *first, cmp_ll);
        printf("first %lld %lld\n", first[bursts / 2], first[(bursts * 99) / 100]);
        printf("inburst %lld\n", inburst / ((long long)bursts * calls));
        return 0;
    }
    /* Inference-like requests: `kernels` kernels, each waited for, with a CPU pause after each
     * but the last (exponential with mean `pause_us`, as 16 fixed quantiles picked by a seeded
     * generator, so every run sees the same pauses); `gap_ms` idle before each request. Prints
     * the mean request time from its first launch to its last synchronize. */
    if (argc > 5 && strcmp(argv[1], "infer") == 0) {
        static const double quantile[16] = {0.032, 0.098, 0.170, 0.247, 0.330, 0.421,
                                            0.521, 0.633, 0.758, 0.901, 1.068, 1.269,
                                            1.520, 1.856, 2.367, 3.466};
        int requests = atoi(argv[2]), kernels = atoi(argv[3]);
        int pause_us = atoi(argv[4]), gap_ms = atoi(argv[5]);
        if (requests < 1 || kernels < 1 || pause_us < 0 || gap_ms < 0) return 2;
        unsigned long long seed = 42;
        long long total = 0;
        for (int i = 0; i < requests; i++) {
            usleep((useconds_t)gap_ms * 1000);
            long long t0 = mono_ns();
            for (int k = 0; k < kernels; k++) {
                cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
                cuCtxSynchronize();
                if (k + 1 == kernels) break;
                seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                usleep((useconds_t)(quantile[(seed >> 33) % 16] * pause_us));
            }
            total += mono_ns() - t0;
        }
        printf("infer %lld\n", total / requests);
        return 0;
    }
    if (argc > 3 && strcmp(argv[1], "serve") == 0) {
        int kernels = atoi(argv[2]), gap_ms = atoi(argv[3]);
        long requests = argc > 4 ? atol(argv[4]) : -1;
        size_t copy = argc > 5 ? (size_t)atol(argv[5]) : 0;
        static char input[1 << 20];
        if (copy > sizeof input) return 2;
        for (long i = 0; requests < 0 || i < requests; i++) {
            if (copy > 0) cuMemcpyHtoD_v2(p[0], input, copy);
            for (int k = 0; k < kernels; k++)
                cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            cuCtxSynchronize();
            printf("request %ld\n", i);
            if (gap_ms > 0) usleep((useconds_t)gap_ms * 1000);
        }
        return 0;
    }

    unsigned long long vmm = 0;
    CUdeviceptr async_p = 0;
    void *array = NULL;
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "others", 6) == 0) {
            int rc = cuMemCreate(&vmm, 2 << 20, NULL, 0);
            void *fa = NULL;
            rc += gpa ? gpa("cuMemAllocAsync", &fa, 12000, 0, &st) : 1;
            rc += fa ? ((alloc_async_fn)fa)(&async_p, 3 << 20, NULL) : 1;
            ArrayDesc d = {256, 256, 0x20, 1};
            rc += cuArrayCreate_v2(&array, &d);
            printf("others rc=%d\n", rc);
            continue;
        }
        if (strncmp(line, "free-others", 11) == 0) {
            int rc = cuMemRelease(vmm) + cuMemFreeAsync(async_p, NULL) + cuArrayDestroy(array);
            printf("freed rc=%d\n", rc);
            continue;
        }
        if (strncmp(line, "launchex", 8) == 0) {
            void *fl = NULL;
            r = gpa ? gpa("cuLaunchKernelEx", &fl, 12000, 0, &st) : -1;
            r = fl ? ((launch_ex_fn)fl)(NULL, NULL, NULL, NULL) : -1;
            printf("launchedex rc=%d\n", r);
            continue;
        }
        if (strncmp(line, "capture", 7) == 0) {
            /* A stream capture that stays open past the burst idle time, a launch inside it. */
            void *stream = NULL, *graph = NULL;
            int rc = cuStreamCreate(&stream, 0);
            rc += cuStreamBeginCapture_v2(stream, 0);
            rc += cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
            usleep(100000);
            int end = cuStreamEndCapture(stream, &graph);
            printf("captured rc=%d end=%d\n", rc, end);
            continue;
        }
        if (strncmp(line, "reset", 5) == 0) {
            printf("reset rc=%d\n", cuDevicePrimaryCtxReset_v2(dev));
            continue;
        }
        if (strncmp(line, "launch-bg", 9) == 0) {
            /* A launch on a thread of its own: the main thread takes the next command at once. */
            static pthread_t bg;
            static int bg_rc;
            pthread_create(&bg, NULL, launcher, &bg_rc);
            printf("started\n");
            continue;
        }
        if (strncmp(line, "copy-bg", 7) == 0) {
            /* A synchronous copy on a thread of its own. */
            static pthread_t bg;
            pthread_create(&bg, NULL, copier, &p[0]);
            printf("started\n");
            continue;
        }
        if (strncmp(line, "threads", 7) == 0) {
            pthread_t t[4];
            int rc[4] = {0}, sum = 0;
            for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, launcher, &rc[i]);
            for (int i = 0; i < 4; i++) {
                pthread_join(t[i], NULL);
                sum += rc[i];
            }
            printf("threads rc=%d\n", sum);
            continue;
        }
        if (strncmp(line, "copyasync", 9) == 0) {
            char buf[16] = {0};
            r = cuMemcpyHtoDAsync_v2(p[0], buf, sizeof buf, NULL);
            printf("copied rc=%d\n", r);
            continue;
        }
        if (strncmp(line, "launch", 6) == 0) {
            r = cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            printf("launched rc=%d\n", r);
        } else if (strncmp(line, "status", 6) == 0) {
            printf("locations %d %d %d %d\n", fake_cuda_location(p[0]), fake_cuda_location(p[1]),
                   fake_cuda_location(p[2]), fake_cuda_location(p[3]));
        } else if (strncmp(line, "fork", 4) == 0) {
            pid_t pid = fork();
            if (pid == 0) {
                CUdeviceptr c = 0;
                int rc = cuMemAlloc_v2(&c, 1 << 20);
                printf("child rc=%d kind=%d pid=%d\n", rc, fake_cuda_kind(c), (int)getpid());
                fflush(stdout);
                const char *done = getenv("CLIENT_CHILD_DONE");
                for (int i = 0; i < 200 && done && access(done, F_OK) != 0; i++) usleep(100000);
                _exit(0);
            }
            waitpid(pid, NULL, 0);
            printf("forked\n");
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    return 0;
}
