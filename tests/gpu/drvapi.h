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

static double now_ms(void) {
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

#endif
