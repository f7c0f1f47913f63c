/*
 * A CPU-only libnvidia-ml.so.1 for tests: the NVML symbols mqfqd calls, answering from the
 * environment instead of a driver, so the daemon's real NVML code path runs anywhere.
 *
 *   FAKE_NVML_GPUS   number of GPUs (default 2, at most 8)
 *   FAKE_NVML_MIG    index of a GPU that reports MIG mode on (unset: none)
 *   FAKE_NVML_UTIL   file whose lines are each GPU's utilization percent, read at every call
 *   FAKE_NVML_FAIL   if set, nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED
 *   FAKE_NVML_PERSIST file that nvmlDeviceSetPersistenceMode appends "<index> <mode>" to
 *   FAKE_NVML_PERSIST_DENY  if set, nvmlDeviceSetPersistenceMode fails with NVML_ERROR_NO_PERMISSION
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
};

typedef struct { int index; } fake_device;
typedef fake_device *nvmlDevice_t;
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

static fake_device devices[8] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
static int initialized = 0;

static unsigned int count(void) {
    const char *n = getenv("FAKE_NVML_GPUS");
    int v = n ? atoi(n) : 2;
    if (v < 0) v = 0;
    if (v > 8) v = 8;
    return (unsigned int)v;
}

static int valid(nvmlDevice_t d) {
    return initialized && d && d >= devices && d < devices + count();
}

static unsigned int util_of(int index) {
    const char *path = getenv("FAKE_NVML_UTIL");
    unsigned int u = 0;
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    for (int i = 0; i <= index; i++) {
        if (fscanf(f, "%u", &u) != 1) { u = 0; break; }
    }
    fclose(f);
    return u > 100 ? 100 : u;
}

nvmlReturn_t nvmlInit_v2(void) {
    if (getenv("FAKE_NVML_FAIL")) return NVML_ERROR_DRIVER_NOT_LOADED;
    initialized = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { initialized = 0; return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = count();
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!d || i >= count()) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &devices[i];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) {
    if (!valid(d) || !i) return NVML_ERROR_INVALID_ARGUMENT;
    *i = (unsigned int)d->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len) {
    if (!valid(d) || !buf) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(buf, len, "GPU-fa4e0000-0000-4000-8000-%012d", d->index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len) {
    if (!valid(d) || !buf) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(buf, len, "Fake NVML GPU %d", d->index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!valid(d) || !m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = 16ULL << 30;
    m->reserved = 0;
    m->used = (unsigned long long)util_of(d->index) * (m->total / 100);
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!valid(d) || !u) return NVML_ERROR_INVALID_ARGUMENT;
    u->gpu = util_of(d->index);
    u->memory = u->gpu / 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *v) {
    if (!valid(d) || !v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = counter == 0 ? 1000 : 2000;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (!valid(d) || !mw) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = 50000 + 2500 * util_of(d->index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    if (!valid(d) || !current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    const char *mig = getenv("FAKE_NVML_MIG");
    *current = *pending = (mig && atoi(mig) == d->index) ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceSetPersistenceMode(nvmlDevice_t d, int mode) {
    if (!valid(d)) return NVML_ERROR_INVALID_ARGUMENT;
    if (getenv("FAKE_NVML_PERSIST_DENY")) return 4; /* NVML_ERROR_NO_PERMISSION */
    const char *path = getenv("FAKE_NVML_PERSIST");
    if (path) {
        FILE *f = fopen(path, "a");
        if (f) {
            fprintf(f, "%d %d\n", d->index, mode);
            fclose(f);
        }
    }
    return NVML_SUCCESS;
}
