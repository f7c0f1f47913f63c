/*
 * CUDA context creation time, through the driver API loaded at run time (no CUDA toolkit needed
 * to build: cc -O2 -o ctxbench ctxbench.c -ldl).
 *
 *   ctxbench once          time cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain in this process
 *   ctxbench hold SECONDS  retain the primary context of GPU 0 and sleep (a "warm driver" holder)
 *
 * Prints `name milliseconds` lines.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ctxbench once | hold SECONDS\n");
        return 2;
    }
    double t0 = now_ms();
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    double t_load = now_ms();
    CUresult (*cuInit)(unsigned) = (CUresult(*)(unsigned))dlsym(lib, "cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(lib, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))dlsym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*release)(CUdevice) = (CUresult(*)(CUdevice))dlsym(lib, "cuDevicePrimaryCtxRelease_v2");
    if (!cuInit || !cuDeviceGet || !retain) {
        fprintf(stderr, "missing driver symbols\n");
        return 1;
    }
    CUresult r = cuInit(0);
    double t_init = now_ms();
    if (r) { fprintf(stderr, "cuInit: %d\n", r); return 1; }
    CUdevice dev;
    if ((r = cuDeviceGet(&dev, 0))) { fprintf(stderr, "cuDeviceGet: %d\n", r); return 1; }
    CUcontext ctx;
    r = retain(&ctx, dev);
    double t_ctx = now_ms();
    if (r) { fprintf(stderr, "retain: %d\n", r); return 1; }
    printf("dlopen_ms %.3f\ncuInit_ms %.3f\nprimary_ctx_retain_ms %.3f\ntotal_ms %.3f\n",
           t_load - t0, t_init - t_load, t_ctx - t_init, t_ctx - t0);
    fflush(stdout);
    if (strcmp(argv[1], "hold") == 0 && argc > 2) sleep((unsigned)atoi(argv[2]));
    if (release) release(dev);
    return 0;
}
