/*
 * What the GPU check's programs share: the driver API's basic types (the driver is loaded at
 * run time, so no CUDA toolkit is needed to build), a monotonic clock in milliseconds, and the
 * two macros that look a function up and check a call.
 */
#ifndef MQFQ_DRVAPI_H
#define MQFQ_DRVAPI_H

#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;

static inline double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Looks `name` up in `h` into the function pointer `f`; returns 1 from the caller if missing. */
#define LOAD(h, f, name)                                                                   \
    do {                                                                                   \
        *(void **)&f = dlsym(h, name);                                                     \
        if (!f) {                                                                          \
            printf("missing %s\n", name);                                                  \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

/* Returns 1 from the caller, saying which call failed, unless `call` answers 0. */
#define CHECK(call)                                                                        \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_) {                                                                          \
            printf("error %s = %d\n", #call, r_);                                          \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

/* The driver calls both benches make (run time lookups: see load_driver). */
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, void *, void **, void **);

/* Loads libcuda.so.1 into *out and looks the calls above up; 1 (said on stdout) when it cannot. */
static int load_driver(void **out) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("no libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    LOAD(h, cuInit, "cuInit");
    LOAD(h, cuDeviceGet, "cuDeviceGet");
    LOAD(h, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(h, cuCtxSetCurrent, "cuCtxSetCurrent");
    LOAD(h, cuCtxSynchronize, "cuCtxSynchronize");
    LOAD(h, cuMemAlloc, "cuMemAlloc_v2");
    LOAD(h, cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    LOAD(h, cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    LOAD(h, cuModuleLoadData, "cuModuleLoadData");
    LOAD(h, cuModuleGetFunction, "cuModuleGetFunction");
    LOAD(h, cuLaunchKernel, "cuLaunchKernel");
    *out = h;
    return 0;
}

/* GPU 0's primary context made current, and `kernel` of the PTX module `ptx` loaded into *f;
 * nonzero (said) on a failed call. */
static inline int context_with(const char *ptx, const char *kernel, CUfunction *f) {
    int dev;
    CUcontext ctx;
    CUmodule m;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&m, ptx));
    CHECK(cuModuleGetFunction(f, m, kernel));
    return 0;
}

/* The `inc` kernel over n words at p, then a synchronize; nonzero on failure. */
static inline int launch(CUfunction f, CUdeviceptr p, unsigned n) {
    void *args[] = {&p, &n};
    unsigned blocks = (n + 255) / 256;
    return cuLaunchKernel(f, blocks, 1, 1, 256, 1, 1, 0, NULL, args, NULL) || cuCtxSynchronize();
}

#endif
