/*
 * A CPU-only libnvidia-ml.so.1 for tests: the NVML symbols mqfqd calls, answering from the
 * environment instead of a driver, so the daemon's real NVML code path runs anywhere.
 *
 *   FAKE_NVML_GPUS   number of GPUs (default 2, at most 8)
 *   FAKE_NVML_MIG    index of a GPU that reports MIG mode on (unset: none)
 *   FAKE_NVML_UTIL   file whose lines are each GPU's utilization percent, read at every call
 *   FAKE_NVML_FAIL   if set, nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED
 *   FAKE_NVML_LOST   file whose lines are indices of GPUs that have fallen off the bus, read at
 *                    every call: their memory queries answer NVML_ERROR_GPU_IS_LOST
 *   FAKE_NVML_PERSIST file that nvmlDeviceSetPersistenceMode appends "<index> <mode>" to
 *   FAKE_NVML_PERSIST_DENY  if set, nvmlDeviceSetPersistenceMode fails with NVML_ERROR_NO_PERMISSION
 *   FAKE_NVML_PROCESSES  file of lines "<gpu> <pid> <sm %> <mem %>", read at every
 *                    nvmlDeviceGetProcessUtilization: each line of that GPU is one sample taken
 *                    now (at most 64); none: NVML_ERROR_NOT_FOUND, as NVML answers
 *   FAKE_NVML_PROC_CALLS  file that each nvmlDeviceGetProcessUtilization given a buffer appends
 *                    "<index>" to
 *   FAKE_NVML_CUDA_DIR  the libcuda double's checkpoint folder (its FAKE_CUDA_CKPT_DIR): each
 *                    GPU's memory in use is then what the double's live processes hold on that
 *                    device, read from their pages at every call (a checkpoint releases it, a
 *                    restore takes it again, onto the device a GPU pair names), not the
 *                    utilization file's share
 *   FAKE_NVML_HELD   file of lines "<gpu> <pid> <MiB>", read at every
 *                    nvmlDeviceGetComputeRunningProcesses_v3: the GPU's compute processes and
 *                    the memory each holds (at most 64 a GPU); unset or none: no processes
 *   FAKE_NVML_HELD_CALLS  file that each nvmlDeviceGetComputeRunningProcesses_v3 given a buffer
 *                    (or finding no process) appends "<index>" to
 *   FAKE_NVML_XID    file of lines "<gpu> <xid>": each is one critical-Xid event, delivered once
 *                    (in order) by nvmlEventSetWait_v2 to a set that registered that GPU;
 *                    none pending: NVML_ERROR_TIMEOUT. nvmlDeviceGetSupportedEventTypes says
 *                    every GPU supports them. Power: 50 W + 2.5 W per utilization percent, of
 *                    an enforced limit of 300 W.
 *
 * GPU performance monitoring (GPM), the Hopper-and-later sampling API:
 *
 *   FAKE_NVML_GPM    if set and non-empty, every GPU supports GPM; otherwise
 *                    nvmlGpmQueryDeviceSupport says no and sampling fails with NOT_SUPPORTED
 *   FAKE_NVML_SM     file whose lines are each GPU's SM activity percent (GPM metric SM_UTIL;
 *                    SM_OCCUPANCY reads half of it), read at every nvmlGpmMetricsGet; unset: 0
 *   FAKE_NVML_DRAM   file whose lines are each GPU's DRAM bandwidth percent (DRAM_BW_UTIL),
 *                    read the same way; unset: 0
 *   FAKE_NVML_GPM_CALLS  file that each nvmlGpmSampleGet appends "<index>" to (and each
 *                    nvmlGpmMigSampleGet "<index> <gpuInstanceId>"), one line per sample taken
 *
 * PCIE_TX_PER_SEC and PCIE_RX_PER_SEC are fixed at 1e6 and 2e6 bytes/s; every other metric
 * answers NOT_SUPPORTED in its own nvmlReturn. Percent files hold numbers 0-100 (clamped), as
 * real NVML reports them; the two samples given to nvmlGpmMetricsGet must come from the same GPU
 * (and GPU instance), the second taken after the first.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "../gpu/nvml_gpm.h"
#include "ckpt_page.h"

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
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

/* Line `index` of the file named by environment variable `var`, as a percent in 0..100 (0 when
 * the variable is unset, the file is missing or too short). */
static double percent_of(const char *var, int index) {
    const char *path = getenv(var);
    double v = 0;
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    for (int i = 0; i <= index; i++) {
        if (fscanf(f, "%lf", &v) != 1) { v = 0; break; }
    }
    fclose(f);
    if (!(v >= 0)) return 0; /* negative or NaN */
    return v > 100 ? 100 : v;
}

static unsigned int util_of(int index) { return (unsigned int)percent_of("FAKE_NVML_UTIL", index); }

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
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case 15: return "GPU is lost";
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
    snprintf(buf, len, "Fake NVML GPU"); /* one model: every GPU the same chip */
    return NVML_SUCCESS;
}

/* Whether GPU `index` is listed in the FAKE_NVML_LOST file. */
static int lost(int index) {
    const char *path = getenv("FAKE_NVML_LOST");
    int i, found = 0;
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (!found && fscanf(f, "%d", &i) == 1) found = i == index;
    fclose(f);
    return found;
}


/* What the libcuda double's live processes hold on the device, from the pages in `dir`: a page
 * counts while its process is alive and started when the page says (a stale one does not). A
 * page is named by the pid its process sees, so this holds for processes in NVML's caller's
 * pid namespace (the checkpoint test's); a zombie still counts. */
static unsigned long long cuda_device_bytes(const char *dir, int index) {
    unsigned long long sum = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "fake-cuda-ckpt-", 15) != 0) continue;
        long pid = strtol(e->d_name + 15, &end, 10);
        if (*end || pid <= 0) continue; /* ".new" pages are not published yet */
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        /* Only a regular file of a page's size (a FIFO of that name must not block NVML). */
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != (off_t)sizeof(ckpt_page)) {
            close(fd);
            continue;
        }
        ckpt_page p;
        ssize_t n = read(fd, &p, sizeof p);
        close(fd);
        if (n != (ssize_t)sizeof p || p.device <= 0 || p.gpu != index ||
            ckpt_start_time(pid) != p.started)
            continue;
        sum += (unsigned long long)p.device;
    }
    closedir(d);
    return sum;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    if (!valid(d) || !m) return NVML_ERROR_INVALID_ARGUMENT;
    if (lost(d->index)) return 15; /* NVML_ERROR_GPU_IS_LOST */
    m->total = 16ULL << 30;
    m->reserved = 0;
    const char *cuda = getenv("FAKE_NVML_CUDA_DIR");
    if (cuda && *cuda) {
        unsigned long long held = cuda_device_bytes(cuda, d->index);
        m->used = held < m->total ? held : m->total;
    } else {
        m->used = (unsigned long long)util_of(d->index) * (m->total / 100);
    }
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

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* The FAKE_NVML_PROCESSES lines of GPU `index`, into `out` (at most `max`); how many. */
static unsigned int process_lines(int index, nvmlProcessUtilizationSample_t *out, unsigned int max) {
    const char *path = getenv("FAKE_NVML_PROCESSES");
    unsigned int n = 0, pid, sm, mem;
    int gpu;
    struct timeval tv;
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    gettimeofday(&tv, NULL);
    while (n < max && fscanf(f, "%d %u %u %u", &gpu, &pid, &sm, &mem) == 4) {
        if (gpu != index) continue;
        if (out) {
            out[n].pid = pid;
            out[n].timeStamp = (unsigned long long)tv.tv_sec * 1000000ULL + tv.tv_usec;
            out[n].smUtil = sm;
            out[n].memUtil = mem;
            out[n].encUtil = out[n].decUtil = 0;
        }
        n++;
    }
    fclose(f);
    return n;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *buf,
                                             unsigned int *count, unsigned long long lastSeen) {
    (void)lastSeen;
    if (!valid(d) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = process_lines(d->index, NULL, 64);
    if (n == 0) {
        *count = 0;
        return 6; /* NVML_ERROR_NOT_FOUND: no sample since lastSeen */
    }
    if (!buf || *count < n) {
        *count = n;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    *count = process_lines(d->index, buf, *count);
    const char *calls = getenv("FAKE_NVML_PROC_CALLS");
    if (calls) {
        FILE *f = fopen(calls, "a");
        if (f) {
            fprintf(f, "%d\n", d->index);
            fclose(f);
        }
    }
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

/* The FAKE_NVML_HELD lines of GPU `index`, into `out` (at most `max`); how many. */
static unsigned int held_lines(int index, nvmlProcessInfo_t *out, unsigned int max) {
    const char *path = getenv("FAKE_NVML_HELD");
    unsigned int n = 0, pid;
    unsigned long long mib;
    int gpu;
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    while (n < max && fscanf(f, "%d %u %llu", &gpu, &pid, &mib) == 3) {
        if (gpu != index) continue;
        if (out) {
            out[n].pid = pid;
            out[n].usedGpuMemory = mib << 20;
            out[n].gpuInstanceId = out[n].computeInstanceId = 0xFFFFFFFFu;
        }
        n++;
    }
    fclose(f);
    return n;
}

/* As NVML: with too small a buffer (or none), the count needed and INSUFFICIENT_SIZE; with no
 * processes, success and 0. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    if (!valid(d) || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = held_lines(d->index, NULL, 64);
    if (n > 0 && (!infos || *count < n)) {
        *count = n;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    *count = n == 0 ? 0 : held_lines(d->index, infos, n);
    const char *calls = getenv("FAKE_NVML_HELD_CALLS");
    if (calls) {
        FILE *f = fopen(calls, "a");
        if (f) {
            fprintf(f, "%d\n", d->index);
            fclose(f);
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    if (!valid(d) || !mw) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = 300000;
    return NVML_SUCCESS;
}

/* Critical Xid events. One event set at a time is enough for mqfqd. */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct { unsigned int registered; } fake_event_set;
typedef fake_event_set *nvmlEventSet_t;
static fake_event_set the_set;
static long xid_delivered = 0; /* lines of FAKE_NVML_XID already delivered */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized || !set) return NVML_ERROR_INVALID_ARGUMENT;
    the_set.registered = 0;
    *set = &the_set;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { (void)set; return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    if (!valid(d) || !types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = 8; /* nvmlEventTypeXidCriticalError */
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    if (!valid(d) || set != &the_set || types != 8) return NVML_ERROR_INVALID_ARGUMENT;
    set->registered |= 1u << d->index;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    (void)timeout_ms;
    if (!initialized || set != &the_set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    const char *path = getenv("FAKE_NVML_XID");
    FILE *f = path ? fopen(path, "r") : NULL;
    int gpu;
    unsigned long long xid;
    long line = 0;
    if (!f) return 10; /* NVML_ERROR_TIMEOUT */
    while (fscanf(f, "%d %llu", &gpu, &xid) == 2) {
        if (line++ < xid_delivered) continue;
        xid_delivered = line;
        if (gpu < 0 || gpu >= (int)count() || !(set->registered & (1u << gpu))) continue;
        fclose(f);
        memset(data, 0, sizeof *data);
        data->device = &devices[gpu];
        data->eventType = 8;
        data->eventData = xid;
        return NVML_SUCCESS;
    }
    fclose(f);
    return 10;
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

/* GPM. A sample is a malloc'ed record of which GPU (and GPU instance) it was taken on and when,
 * as a per-process sequence number; the metrics are read from the files when they are computed. */
struct nvmlGpmSample_st {
    int index;                /* -1 until taken */
    unsigned int instance;    /* GPU instance for MIG samples, ~0u for whole-GPU ones */
    unsigned long long seq;   /* 0 until taken */
};

static unsigned long long gpm_seq = 0;

static int gpm_on(void) {
    const char *g = getenv("FAKE_NVML_GPM");
    return g && *g;
}

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !s) return NVML_ERROR_INVALID_ARGUMENT;
    if (s->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    s->isSupportedDevice = gpm_on() ? 1 : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *s) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!s) return NVML_ERROR_INVALID_ARGUMENT;
    *s = malloc(sizeof **s);
    if (!*s) return 999; /* NVML_ERROR_UNKNOWN */
    (*s)->index = -1;
    (*s)->instance = ~0u;
    (*s)->seq = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t s) {
    if (!s) return NVML_ERROR_INVALID_ARGUMENT;
    free(s);
    return NVML_SUCCESS;
}

static nvmlReturn_t gpm_take(nvmlDevice_t d, unsigned int instance, nvmlGpmSample_t s) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!valid(d) || !s) return NVML_ERROR_INVALID_ARGUMENT;
    if (!gpm_on()) return NVML_ERROR_NOT_SUPPORTED;
    s->index = d->index;
    s->instance = instance;
    s->seq = __atomic_add_fetch(&gpm_seq, 1, __ATOMIC_SEQ_CST);
    const char *path = getenv("FAKE_NVML_GPM_CALLS");
    if (path) {
        FILE *f = fopen(path, "a");
        if (f) {
            if (instance == ~0u) fprintf(f, "%d\n", d->index);
            else fprintf(f, "%d %u\n", d->index, instance);
            fclose(f);
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t d, nvmlGpmSample_t s) { return gpm_take(d, ~0u, s); }

nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned int gpuInstanceId, nvmlGpmSample_t s) {
    if (gpuInstanceId == ~0u) return NVML_ERROR_INVALID_ARGUMENT;
    return gpm_take(d, gpuInstanceId, s);
}

/* The metrics the double answers: a percent read from `file` (times `scale`), or `scale` itself. */
static const struct gpm_metric {
    unsigned int id;
    const char *file;
    double scale;
    const char *short_name, *long_name, *unit;
} GPM_METRICS[] = {
    {NVML_GPM_METRIC_SM_UTIL, "FAKE_NVML_SM", 1, "SM_UTIL", "SM activity", "%"},
    {NVML_GPM_METRIC_SM_OCCUPANCY, "FAKE_NVML_SM", 0.5, "SM_OCCUPANCY", "SM occupancy", "%"},
    {NVML_GPM_METRIC_DRAM_BW_UTIL, "FAKE_NVML_DRAM", 1, "DRAM_BW_UTIL", "DRAM bandwidth utilization", "%"},
    {NVML_GPM_METRIC_PCIE_TX_PER_SEC, NULL, 1e6, "PCIE_TX", "PCIe transmit bytes per second", "B/s"},
    {NVML_GPM_METRIC_PCIE_RX_PER_SEC, NULL, 2e6, "PCIE_RX", "PCIe receive bytes per second", "B/s"},
};

nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *m) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlGpmSample_t a = m->sample1, b = m->sample2;
    if (m->numMetrics > 98 || !a || !b) return NVML_ERROR_INVALID_ARGUMENT;
    if (a->seq == 0 || b->seq <= a->seq || a->index != b->index || a->instance != b->instance)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < m->numMetrics; i++) {
        nvmlGpmMetric_t *x = &m->metrics[i];
        const struct gpm_metric *d = NULL;
        for (size_t k = 0; k < sizeof GPM_METRICS / sizeof GPM_METRICS[0]; k++)
            if (GPM_METRICS[k].id == x->metricId) d = &GPM_METRICS[k];
        if (!d) {
            x->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            x->value = 0;
            x->metricInfo.shortName = x->metricInfo.longName = x->metricInfo.unit = NULL;
            continue;
        }
        x->nvmlReturn = NVML_SUCCESS;
        x->value = d->file ? percent_of(d->file, a->index) * d->scale : d->scale;
        x->metricInfo.shortName = (char *)d->short_name;
        x->metricInfo.longName = (char *)d->long_name;
        x->metricInfo.unit = (char *)d->unit;
    }
    return NVML_SUCCESS;
}
