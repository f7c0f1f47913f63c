/*
 * A CPU-only libcuda.so.1 with the few driver calls mqfqd's warm driver makes, recording them.
 *
 *   FAKE_CUDA_GPUS  number of devices (default 1)
 *   FAKE_CUDA_LOG   file that each call appends a line to
 *   FAKE_CUDA_FAIL  if set, cuInit fails with CUDA_ERROR_NO_DEVICE (100)
 */
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;

static int initialized = 0;
static int contexts[8];

static void note(const char *what, int dev) {
    const char *path = getenv("FAKE_CUDA_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s %d\n", what, dev);
    fclose(f);
}

static int count(void) {
    const char *n = getenv("FAKE_CUDA_GPUS");
    int v = n ? atoi(n) : 1;
    return v < 0 ? 0 : (v > 8 ? 8 : v);
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    if (getenv("FAKE_CUDA_FAIL")) return 100;
    initialized = 1;
    note("cuInit", -1);
    return 0;
}

CUresult cuDeviceGetCount(int *n) {
    if (!initialized) return 3;
    *n = count();
    return 0;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialized) return 3;
    if (ordinal < 0 || ordinal >= count()) return 101;
    *d = ordinal;
    return 0;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
    if (!initialized) return 3;
    if (d < 0 || d >= count()) return 101;
    contexts[d]++;
    *ctx = &contexts[d];
    note("retain", d);
    return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= count() || contexts[d] == 0) return 201;
    contexts[d]--;
    note("release", d);
    return 0;
}
