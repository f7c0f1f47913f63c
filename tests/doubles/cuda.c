/*
 * A CPU-only libcuda.so.1: the driver calls mqfqd's warm driver and the mqfq CUDA interposer
 * make, on host memory, recording them.
 *
 *   FAKE_CUDA_GPUS  number of devices (default 1)
 *   FAKE_CUDA_LOG   file that each call appends a line to
 *   FAKE_CUDA_FAIL  if set, cuInit fails with CUDA_ERROR_NO_DEVICE (100)
 *   FAKE_CUDA_KERNEL_MS  if set, every launch is asynchronous work of that many milliseconds on
 *                   one in-order timeline (as a GPU stream runs it): the launch returns at once,
 *                   the log gets "kernel <begin_us> <end_us>" (CLOCK_MONOTONIC, microseconds, the
 *                   same clock in every container), cuCtxSynchronize waits for the timeline to
 *                   drain and cuStreamQuery says 600 (not ready) until then
 *   FAKE_CUDA_COPY_MS  if set, a synchronous copy between host and device (cuMemcpyHtoD_v2,
 *                   cuMemcpyDtoH_v2) takes that many milliseconds, between the log lines
 *                   "copy begins" and "copy ends" (a large pageable copy holds its thread so)
 *
 * It runs two kernels for real, on the host: `inc` from any module (p[i] += 1), so programs can
 * check their results, and `spin(ns, ...)`, which sleeps ns nanoseconds (the GPU check's
 * concurrency program). Streams exist only as handles; cuStreamSynchronize waits like
 * cuCtxSynchronize. Copies are memcpy (device memory is host memory here).
 *
 * Side channel for tests: fake_cuda_kind(ptr) (0 unknown, 1 native, 2 managed, 3 imported
 * through IPC) and fake_cuda_location(ptr) (1 device, 2 host).
 *
 * What the driver documents for memory that cuMemAlloc did not make, modelled here: native
 * allocations are shared memory (a memfd), so cuIpcGetMemHandle / cuIpcOpenMemHandle_v2 really
 * share them between processes (the handle names the exporter's pid and descriptor); on managed
 * memory cuIpcGetMemHandle and cuMemGetHandleForAddressRange answer CUDA_ERROR_INVALID_VALUE (1).
 * Pointer attributes report memory type device (2) for both, IS_MANAGED 1 and
 * IS_LEGACY_CUDA_IPC_CAPABLE 0 for managed memory. cuMemGetAddressRange_v2 on managed memory
 * answers CUDA_ERROR_NOT_FOUND (500): the real driver's answer is not documented, so the double
 * takes the unhelpful one (the GPU check, tests/gpu/run.sh, reports the real one).
 *
 * The driver's checkpoint API, across processes (cuCheckpointProcess*: Lock, Checkpoint, Restore,
 * Unlock, GetState, called by a controller for another process's pid): with FAKE_CUDA_CKPT_DIR
 * set, a process that initialises the double publishes a page there, fake-cuda-ckpt-<pid>,
 * holding its state (0 running, 1 locked, 2 checkpointed, 3 failed), its CUDA calls in
 * progress, the end of its queued kernels and its device / host bytes. Its launches, allocations,
 * copies and synchronizations wait while it is not running. Lock takes it from running once no
 * call is in progress and its queued kernels are done (timeoutMs, 0: no limit; past it, 909
 * CUDA_ERROR_TIMEOUT and it runs on); Checkpoint (from locked) moves its device bytes to host;
 * Restore (from checkpointed) moves them back and leaves it locked; Unlock lets it run. A call in
 * the wrong state answers 401 (CUDA_ERROR_ILLEGAL_STATE); a pid without a page (or no longer
 * alive), 1 (CUDA_ERROR_INVALID_VALUE). FAKE_CUDA_CKPT_FAIL in the controller injects failures: `lock`
 * (times out at once), `checkpoint` (the process goes failed, 999), `restore-oom` (Restore
 * answers 2, CUDA_ERROR_OUT_OF_MEMORY, and the process stays checkpointed); `<failure>:N` injects
 * it the controller's first N times only. FAKE_CUDA_CKPT_DELAY_MS makes each Checkpoint take that
 * long (the process reads locked meanwhile). Side channel:
 * fake_cuda_ckpt_bytes(pid, &device, &host). Memory is not really moved (it is host memory). A
 * page is published whole (renamed into place) with its process's start time; a controller maps
 * only a regular file of the page's size whose process is alive and started then (a stale page
 * is removed). A forked child has no page until it initialises. The page is named by the pid the
 * process sees and lives in its own root: a controller in another pid and mount namespace (the
 * shim, for a container's process) passes the host pid, and the double finds the page under
 * /proc/<pid>/root by the process's innermost NSpid (resolved inside that root). A process with
 * FAKE_CUDA_CKPT_CONTROLLER=1 publishes no page of its own.
 *
 * Context lifetimes and stream capture, as far as an interposer can break them: a context reset
 * (cuDevicePrimaryCtxReset_v2) or destroyed (cuCtxDestroy_v2) and then made current or
 * synchronized logs "used destroyed context" (a real driver may crash there); synchronizing the
 * context while a capture is open invalidates it (cuStreamEndCapture then answers 901,
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, and logs "capture invalidated"). An `inc` kernel
 * launched while a capture is open is recorded, not run; cuGraphLaunch runs what was recorded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
/* memfd_create through the system call: glibc has the wrapper only from 2.27, and the double is
 * also built for 2.17 (shim/runtime/tests/interposer_glibc.rs). */
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 1U
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "../gpu/ckpt_args.h"
#include "ckpt_page.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUfunction;
typedef void *CUgraphExec;
typedef unsigned long long CUdeviceptr;
typedef struct { int type; int id; } CUmemLocation;

static int initialized = 0;
static int contexts[8];
static CUcontext current = NULL;

#define MAX_ALLOCS 256
static struct { CUdeviceptr ptr; size_t size; int kind; int location; int fd; } allocs[MAX_ALLOCS];

/* The checkpoint page of this process (NULL until cuInit) and its gate; see the end of file. */
static void ckpt_publish(void);
static void ckpt_enter(void);
static void ckpt_leave(void);
static void ckpt_busy_until(long long us);
static void ckpt_bytes(long long delta);

static void note(const char *fmt, long a, long b) {
    const char *path = getenv("FAKE_CUDA_LOG");
    if (!path || !*path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, fmt, a, b);
    fputc('\n', f);
    fclose(f);
}

static int count(void) {
    const char *n = getenv("FAKE_CUDA_GPUS");
    int v = n ? atoi(n) : 1;
    return v < 0 ? 0 : (v > 8 ? 8 : v);
}

static void ckpt_on_device(int d);

CUresult cuInit(unsigned int flags) {
    (void)flags;
    if (getenv("FAKE_CUDA_FAIL")) return 100;
    initialized = 1;
    ckpt_publish();
    note("cuInit %ld", -1, 0);
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

/* Fake GPU `d`'s UUID (ckpt_page.h's, as the NVML double spells it) and model name (one for
 * all, as the NVML double's). */
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) {
    if (!initialized) return 3;
    if (!uuid || d < 0 || d >= count()) return 101;
    fake_gpu_uuid(d, uuid);
    return 0;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (!initialized) return 3;
    if (!name || len <= 0 || d < 0 || d >= count()) return 101;
    snprintf(name, (size_t)len, "Fake NVML GPU");
    return 0;
}

/* Contexts destroyed (reset) and not retained since: using one is what a real driver may crash
 * on, logged "used destroyed context". */
static int destroyed[8];
/* A stream capture in progress, and whether something invalidated it (synchronizing the context
 * while it is open, as CUDA's global capture mode has it). */
static int capturing, capture_invalidated;
/* The `inc` kernels launched while a capture is open: recorded into the graph, not run; the
 * graph's launch runs them (one graph at a time). */
static struct { unsigned *p; unsigned n; } captured[16];
static int n_captured;

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
    if (!initialized) return 3;
    if (d < 0 || d >= count()) return 101;
    contexts[d]++;
    destroyed[d] = 0;
    *ctx = &contexts[d];
    ckpt_on_device(d);
    note("retain %ld", d, 0);
    return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= count() || contexts[d] == 0) return 201;
    contexts[d]--;
    note("release %ld", d, 0);
    return 0;
}

static int is_destroyed(CUcontext c) {
    for (int d = 0; d < 8; d++)
        if (c == (CUcontext)&contexts[d]) return destroyed[d];
    return 0;
}
CUresult cuCtxSetCurrent(CUcontext c) {
    if (c && is_destroyed(c)) {
        note("used destroyed context", 0, 0);
        return 201;
    }
    current = c;
    return 0;
}
CUresult cuCtxDestroy_v2(CUcontext c) {
    for (int d = 0; d < 8; d++)
        if (c == (CUcontext)&contexts[d]) destroyed[d] = 1;
    if (current == c) current = NULL;
    note("destroy", 0, 0);
    return 0;
}
CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    (void)s; (void)mode;
    capturing = 1;
    capture_invalidated = 0;
    n_captured = 0;
    note("capture begin", 0, 0);
    return 0;
}
CUresult cuStreamEndCapture(CUstream s, void **graph) {
    (void)s;
    if (!capturing) return 401;
    capturing = 0;
    if (graph) *graph = NULL;
    if (capture_invalidated) {
        note("capture invalidated", 0, 0);
        return 901;
    }
    note("capture end", 0, 0);
    return 0;
}
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return 0; }
/* The timeline of FAKE_CUDA_KERNEL_MS work: when the last queued kernel ends. */
static pthread_mutex_t timeline = PTHREAD_MUTEX_INITIALIZER;
static long long busy_until_us = 0;
static long long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}
static int kernel_ms(void) {
    const char *v = getenv("FAKE_CUDA_KERNEL_MS");
    return v ? atoi(v) : 0;
}
/* Queues one kernel on the timeline and logs its interval. */
static void enqueue_kernel(void) {
    int ms = kernel_ms();
    if (ms <= 0) return;
    pthread_mutex_lock(&timeline);
    long long now = now_us();
    long long begin = busy_until_us > now ? busy_until_us : now;
    busy_until_us = begin + (long long)ms * 1000;
    long long end = busy_until_us;
    ckpt_busy_until(end);
    pthread_mutex_unlock(&timeline);
    note("kernel %ld %ld", (long)begin, (long)end);
}
static long long pending_us(void) {
    pthread_mutex_lock(&timeline);
    long long left = busy_until_us - now_us();
    pthread_mutex_unlock(&timeline);
    return left;
}
CUresult cuCtxSynchronize(void) {
    ckpt_enter();
    if (capturing) capture_invalidated = 1;
    if (current && is_destroyed(current)) note("used destroyed context", 0, 0);
    long long left = pending_us();
    if (left > 0) usleep((useconds_t)left);
    note("sync", 0, 0);
    ckpt_leave();
    return 0;
}
CUresult cuStreamQuery(CUstream s) { (void)s; return pending_us() > 0 ? 600 : 0; }
CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    if (!s) return 1;
    *s = malloc(1);
    note("stream create", 0, 0);
    return *s ? 0 : 2;
}
CUresult cuStreamDestroy_v2(CUstream s) { free(s); return 0; }
CUresult cuStreamSynchronize(CUstream s) {
    (void)s;
    ckpt_enter();
    long long left = pending_us();
    if (left > 0) usleep((useconds_t)left);
    ckpt_leave();
    return 0;
}

/* Native memory is a shared mapping of a memfd (exportable); managed memory is malloc'd. */
static void *obtain(size_t size, int kind, int *fd) {
    *fd = -1;
    if (kind == 2) return malloc(size);
    *fd = (int)syscall(SYS_memfd_create, "fake-cuda", MFD_CLOEXEC);
    if (*fd < 0) return NULL;
    void *m = MAP_FAILED;
    if (ftruncate(*fd, (off_t)size) == 0)
        m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
    if (m == MAP_FAILED) {
        close(*fd);
        *fd = -1;
        return NULL;
    }
    return m;
}
static void release(int i) {
    if (allocs[i].kind == 2) free((void *)allocs[i].ptr);
    else munmap((void *)allocs[i].ptr, allocs[i].size);
    if (allocs[i].fd >= 0) close(allocs[i].fd);
    allocs[i].ptr = 0;
}
static CUresult insert(void *m, size_t size, int kind, int fd) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        if (allocs[i].ptr == 0) {
            allocs[i].ptr = (CUdeviceptr)m;
            allocs[i].size = size;
            allocs[i].kind = kind;
            allocs[i].location = 1;
            allocs[i].fd = fd;
            return 0;
        }
    }
    return 2;
}
static CUresult record_in(CUdeviceptr *p, size_t size, int kind);
static CUresult record(CUdeviceptr *p, size_t size, int kind) {
    ckpt_enter();
    CUresult r = record_in(p, size, kind);
    if (r == 0) ckpt_bytes((long long)size);
    ckpt_leave();
    return r;
}
static CUresult record_in(CUdeviceptr *p, size_t size, int kind) {
    if (!initialized) return 3;
    if (!p || size == 0) return 1;
    int fd;
    void *m = obtain(size, kind, &fd);
    if (!m) return 2;
    if (insert(m, size, kind, fd) != 0) {
        if (kind == 2) free(m);
        else munmap(m, size);
        if (fd >= 0) close(fd);
        return 2;
    }
    *p = (CUdeviceptr)m;
    note(kind == 2 ? "alloc managed %ld" : "alloc native %ld", (long)size, 0);
    return 0;
}

static int find(CUdeviceptr p) {
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].ptr == p && p != 0) return i;
    return -1;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) { return record(p, size, 1); }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags) {
    (void)flags;
    return record(p, size, 2);
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e) {
    (void)e;
    *pitch = (w + 511) / 512 * 512;
    return record(p, *pitch * h, 1);
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    int i = find(p);
    if (i < 0 || allocs[i].kind == 3) return 1;
    ckpt_enter();
    ckpt_bytes(-(long long)allocs[i].size);
    release(i);
    ckpt_leave();
    note("free %ld", (long)allocs[i].size, 0);
    return 0;
}
CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, int advice, CUmemLocation loc) {
    if (find(p) < 0) return 1;
    note("advise %ld %ld", advice, loc.type);
    (void)n;
    return 0;
}
CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags,
                               CUstream s) {
    (void)flags; (void)s;
    int i = find(p);
    if (i < 0 || allocs[i].kind != 2) return 1;
    ckpt_enter();
    ckpt_leave();
    allocs[i].location = loc.type == 1 ? 1 : 2;
    note(loc.type == 1 ? "prefetch device %ld" : "prefetch host %ld", (long)n, 0);
    /* FAKE_CUDA_PREFETCH_MS: a slow move (a test's window to act in while memory moves). */
    const char *v = getenv("FAKE_CUDA_PREFETCH_MS");
    int ms = v ? atoi(v) : 0;
    if (ms > 0) usleep((useconds_t)ms * 1000);
    return 0;
}
/* A module is any data; its functions are "inc" and "spin". */
static int inc_kernel;
static int spin_kernel;
CUresult cuModuleLoadData(void **m, const void *image) {
    (void)image;
    *m = &inc_kernel;
    note("module load", 0, 0);
    return 0;
}
CUresult cuModuleGetFunction(CUfunction *f, void *m, const char *name) {
    (void)m;
    if (strcmp(name, "inc") == 0) {
        *f = &inc_kernel;
    } else if (strcmp(name, "spin") == 0) {
        *f = &spin_kernel;
    } else {
        return 500;
    }
    return 0;
}
CUresult cuMemAllocHost_v2(void **p, size_t size) {
    *p = malloc(size);
    return *p ? 0 : 2;
}
/* FAKE_CUDA_COPY_MS: a synchronous copy holds its thread that long. */
static void copy_time(void) {
    const char *v = getenv("FAKE_CUDA_COPY_MS");
    long ms = v ? atol(v) : 0;
    if (ms <= 0) return;
    note("copy begins", 0, 0);
    usleep((useconds_t)ms * 1000);
    note("copy ends", 0, 0);
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) {
    ckpt_enter();
    copy_time();
    memcpy((void *)d, h, n);
    ckpt_leave();
    return 0;
}
CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) {
    ckpt_enter();
    copy_time();
    memcpy(h, (const void *)d, n);
    ckpt_leave();
    return 0;
}
/* A launch, logged as `what` (the legacy and the per-thread stream variants share it). */
static CUresult launch(const char *what, CUfunction f, void **params) {
    ckpt_enter();
    note(what, 0, 0);
    enqueue_kernel();
    if (f == (CUfunction)&inc_kernel && params) {
        /* The one kernel this double runs: inc(p, n), p[i] += 1 (into the graph if capturing). */
        unsigned *p = *(unsigned **)params[0];
        unsigned n = *(unsigned *)params[1];
        if (capturing && n_captured < 16) {
            captured[n_captured].p = p;
            captured[n_captured++].n = n;
        } else {
            for (unsigned i = 0; i < n; i++) p[i]++;
        }
    }
    if (f == (CUfunction)&spin_kernel && params) {
        /* spin(ns, ...): the time, slept. */
        unsigned long long ns = *(unsigned long long *)params[0];
        struct timespec t = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
        nanosleep(&t, NULL);
    }
    ckpt_leave();
    return 0;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                        void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s;
    (void)extra;
    return launch("launch", f, params);
}
/* cuLaunchKernel's per-thread default stream variant: the same launch, logged as its own. */
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                             void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s;
    (void)extra;
    return launch("launch ptsz", f, params);
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, void *g, unsigned long long flags) {
    (void)flags;
    *e = g;
    note("graph-instantiate", 0, 0);
    return 0;
}
CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    (void)g; (void)s;
    ckpt_enter();
    note("graph-launch", 0, 0);
    for (int k = 0; k < n_captured; k++)
        for (unsigned i = 0; i < captured[k].n; i++) captured[k].p[i]++;
    ckpt_leave();
    return 0;
}
CUresult cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra) {
    (void)config; (void)f; (void)params; (void)extra;
    ckpt_enter();
    note("launch-ex", 0, 0);
    ckpt_leave();
    return 0;
}
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                   unsigned bx, unsigned by, unsigned bz, unsigned shm,
                                   CUstream s, void **params) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s;
    (void)params;
    ckpt_enter();
    note("launch-cooperative", 0, 0);
    ckpt_leave();
    return 0;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) {
    (void)d; (void)h; (void)s;
    ckpt_enter();
    note("copy-htod-async %ld", (long)n, 0);
    ckpt_leave();
    return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) {
    (void)d; (void)h; (void)s;
    ckpt_enter();
    note("copy-dtoh-async %ld", (long)n, 0);
    ckpt_leave();
    return 0;
}
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) {
    (void)d; (void)src; (void)s;
    ckpt_enter();
    note("copy-async %ld", (long)n, 0);
    ckpt_leave();
    return 0;
}

/* Allocations the interposer leaves native: VMM handles, stream-ordered memory, arrays. */
static unsigned long long next_handle = 0x1000;
CUresult cuMemCreate(unsigned long long *handle, size_t size, const void *prop,
                     unsigned long long flags) {
    (void)prop; (void)flags;
    if (!initialized) return 3;
    *handle = next_handle++;
    note("vmm create %ld", (long)size, 0);
    return 0;
}
CUresult cuMemRelease(unsigned long long handle) { note("vmm release %ld", (long)handle, 0); return 0; }
/* Sharing VMM allocations and memory pools with other processes: each export hands out a
 * number, each import takes one; nothing is really shared (the interposer's counts are what the
 * tests look at). */
CUresult cuMemExportToShareableHandle(void *out, unsigned long long handle, int kind,
                                      unsigned long long flags) {
    (void)flags;
    if (!out || kind != 1 /* POSIX file descriptor */) return 1;
    *(int *)out = (int)handle;
    note("vmm export %ld", (long)handle, 0);
    return 0;
}
CUresult cuMemImportFromShareableHandle(unsigned long long *handle, void *os, int kind) {
    if (!handle || kind != 1) return 1;
    *handle = next_handle++;
    note("vmm import %ld", (long)(intptr_t)os, 0);
    return 0;
}
CUresult cuMemPoolExportToShareableHandle(void *out, void *pool, int kind,
                                          unsigned long long flags) {
    (void)pool; (void)flags;
    if (!out || kind != 1) return 1;
    *(int *)out = 7;
    return 0;
}
CUresult cuMemPoolImportFromShareableHandle(void **pool, void *handle, int kind,
                                            unsigned long long flags) {
    (void)handle; (void)flags;
    if (!pool || kind != 1) return 1;
    *pool = (void *)&next_handle;
    return 0;
}
CUresult cuMemPoolExportPointer(void *out, CUdeviceptr p) {
    if (!out) return 1;
    memcpy(out, &p, sizeof p);
    return 0;
}
CUresult cuMemPoolImportPointer(CUdeviceptr *p, void *pool, void *data) {
    (void)pool;
    if (!p || !data) return 1;
    memcpy(p, data, sizeof *p);
    return 0;
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) {
    (void)s;
    return record(p, size, 1);
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return cuMemFree_v2(p); }
typedef struct { size_t w, h; unsigned format, channels; } ArrayDesc;
CUresult cuArrayCreate_v2(void **array, const ArrayDesc *d) {
    if (!initialized) return 3;
    *array = malloc(16);
    note("array create %ld", (long)(d->w * d->h), 0);
    return 0;
}
CUresult cuArrayDestroy(void *array) { free(array); note("array destroy", 0, 0); return 0; }

/* The allocation `p` points into. */
static int containing(CUdeviceptr p) {
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].ptr != 0 && p >= allocs[i].ptr && p - allocs[i].ptr < allocs[i].size)
            return i;
    return -1;
}

/* Legacy IPC: the handle names the exporter's pid and the allocation's memfd. */
typedef struct { char bytes[64]; } CUipcMemHandle;
struct ipc_payload { char magic[8]; int pid; int fd; unsigned long long size; };
CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    int i = find(p);
    if (!h || i < 0 || allocs[i].kind != 1) return 1;
    struct ipc_payload x = {"FAKEIPC", (int)getpid(), allocs[i].fd, allocs[i].size};
    memset(h, 0, sizeof *h);
    memcpy(h->bytes, &x, sizeof x);
    note("ipc export %ld", (long)allocs[i].size, 0);
    return 0;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    (void)flags;
    struct ipc_payload x;
    memcpy(&x, h.bytes, sizeof x);
    if (!initialized) return 3;
    if (!p || memcmp(x.magic, "FAKEIPC", 8) != 0 || x.size == 0) return 1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", x.pid, x.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return 1;
    void *m = mmap(NULL, x.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return 2;
    if (insert(m, x.size, 3, -1) != 0) {
        munmap(m, x.size);
        return 2;
    }
    *p = (CUdeviceptr)m;
    note("ipc open %ld", (long)x.size, 0);
    return 0;
}
/* The name before CUDA 11: the same call. */
CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    return cuIpcOpenMemHandle_v2(p, h, flags);
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    int i = find(p);
    if (i < 0 || allocs[i].kind != 3) return 1;
    release(i);
    return 0;
}
/* dma-buf export: a duplicate of the memfd for native memory, refused for managed. */
CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t size, int type,
                                       unsigned long long flags) {
    (void)type; (void)flags;
    int i = containing(p);
    if (!handle || i < 0 || allocs[i].kind != 1 || size > allocs[i].size) return 1;
    *(int *)handle = dup(allocs[i].fd);
    return 0;
}

/* Pointer attributes (CUpointer_attribute numbers) for the memory this double made. */
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p) {
    int i = containing(p);
    if (!data || i < 0) return 1;
    switch (attribute) {
    case 2: *(unsigned *)data = 2; return 0;                        /* MEMORY_TYPE: device */
    case 3: *(CUdeviceptr *)data = p; return 0;                     /* DEVICE_POINTER */
    case 8: *(char *)data = allocs[i].kind == 2; return 0;          /* IS_MANAGED (a bool) */
    case 9: *(int *)data = 0; return 0;                             /* DEVICE_ORDINAL */
    case 10: *(char *)data = allocs[i].kind == 1; return 0;         /* IS_LEGACY_CUDA_IPC_CAPABLE */
    case 11: *(CUdeviceptr *)data = allocs[i].ptr; return 0;        /* RANGE_START_ADDR */
    case 12: *(size_t *)data = allocs[i].size; return 0;            /* RANGE_SIZE */
    default: return 1;
    }
}
/* As the driver: no error for a pointer it does not know, the values left zero. */
CUresult cuPointerGetAttributes(unsigned n, int *attributes, void **data, CUdeviceptr p) {
    if (!attributes || !data) return 1;
    for (unsigned k = 0; k < n; k++) {
        if (cuPointerGetAttribute(data[k], attributes[k], p) != 0 && data[k])
            memset(data[k], 0, attributes[k] == 11 || attributes[k] == 12 || attributes[k] == 3 ? 8 : 4);
    }
    return 0;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    int i = containing(p);
    if (i < 0) return 1;
    if (allocs[i].kind == 2) return 500;
    if (base) *base = allocs[i].ptr;
    if (size) *size = allocs[i].size;
    return 0;
}

/* Resetting the primary context frees every allocation (behind an interposer's back). */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
    if (d >= 0 && d < 8) {
        destroyed[d] = 1;
        if (current == (CUcontext)&contexts[d]) current = NULL;
    }
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].ptr) release(i);
    note("reset", 0, 0);
    return 0;
}

int fake_cuda_kind(CUdeviceptr p) { int i = find(p); return i < 0 ? 0 : allocs[i].kind; }
int fake_cuda_location(CUdeviceptr p) { int i = find(p); return i < 0 ? 0 : allocs[i].location; }

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags,
                             int *status);

static const struct { const char *name; void *fn; } table[] = {
    {"cuInit", (void *)cuInit},
    {"cuDeviceGet", (void *)cuDeviceGet},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid_v2},
    {"cuDeviceGetName", (void *)cuDeviceGetName},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
    {"cuCtxSynchronize", (void *)cuCtxSynchronize},
    {"cuStreamQuery", (void *)cuStreamQuery},
    {"cuMemAlloc", (void *)cuMemAlloc_v2},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch_v2},
    {"cuMemFree", (void *)cuMemFree_v2},
    {"cuMemAdvise", (void *)cuMemAdvise_v2},
    {"cuMemPrefetchAsync", (void *)cuMemPrefetchAsync_v2},
    {"cuLaunchKernel", (void *)cuLaunchKernel},
    {"cuGraphLaunch", (void *)cuGraphLaunch},
    {"cuGetProcAddress", (void *)cuGetProcAddress_v2},
    {"cuLaunchKernelEx", (void *)cuLaunchKernelEx},
    {"cuLaunchCooperativeKernel", (void *)cuLaunchCooperativeKernel},
    {"cuMemcpyHtoDAsync", (void *)cuMemcpyHtoDAsync_v2},
    {"cuMemcpyDtoHAsync", (void *)cuMemcpyDtoHAsync_v2},
    {"cuMemcpyAsync", (void *)cuMemcpyAsync},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuMemExportToShareableHandle", (void *)cuMemExportToShareableHandle},
    {"cuMemImportFromShareableHandle", (void *)cuMemImportFromShareableHandle},
    {"cuMemPoolExportToShareableHandle", (void *)cuMemPoolExportToShareableHandle},
    {"cuMemPoolImportFromShareableHandle", (void *)cuMemPoolImportFromShareableHandle},
    {"cuMemPoolExportPointer", (void *)cuMemPoolExportPointer},
    {"cuMemPoolImportPointer", (void *)cuMemPoolImportPointer},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync},
    {"cuArrayCreate", (void *)cuArrayCreate_v2},
    {"cuArrayDestroy", (void *)cuArrayDestroy},
    {"cuIpcGetMemHandle", (void *)cuIpcGetMemHandle},
    {"cuIpcOpenMemHandle", (void *)cuIpcOpenMemHandle_v2},
    {"cuIpcCloseMemHandle", (void *)cuIpcCloseMemHandle},
    {"cuMemGetHandleForAddressRange", (void *)cuMemGetHandleForAddressRange},
    {"cuPointerGetAttribute", (void *)cuPointerGetAttribute},
    {"cuPointerGetAttributes", (void *)cuPointerGetAttributes},
    {"cuMemGetAddressRange", (void *)cuMemGetAddressRange_v2},
    {"cuDevicePrimaryCtxReset", (void *)cuDevicePrimaryCtxReset_v2},
    {"cuCtxDestroy", (void *)cuCtxDestroy_v2},
    {"cuStreamBeginCapture", (void *)cuStreamBeginCapture_v2},
    {"cuStreamEndCapture", (void *)cuStreamEndCapture},
};

/* Base names, as the CUDA runtime asks for them; versioned ABIs are this double's only ones.
 * With CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (2), cuLaunchKernel is its _ptsz variant. */
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags,
                             int *status) {
    (void)version;
    if ((flags & 2) && strcmp(sym, "cuLaunchKernel") == 0) {
        *pfn = (void *)cuLaunchKernel_ptsz;
        if (status) *status = 0;
        return 0;
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, sym) == 0) {
            *pfn = table[i].fn;
            if (status) *status = 0;
            return 0;
        }
    }
    *pfn = NULL;
    if (status) *status = 1;
    return 500;
}

/* ---- The checkpoint API (see the header). ---- */

/* The page's layout: ckpt_page.h (the NVML double reads it too). */

/* The driver's states, and three of the double's own while a controller works (reported as the
 * state they leave). */
enum {
    CKPT_RUNNING = 0,
    CKPT_LOCKED = 1,
    CKPT_CHECKPOINTED = 2,
    CKPT_FAILED = 3,
    CKPT_LOCKING = 10,
    CKPT_CHECKPOINTING = 12,
    CKPT_RESTORING = 11,
};

static ckpt_page *my_page;
static char my_page_path[256];
static pid_t my_page_pid;
static pthread_once_t ckpt_once = PTHREAD_ONCE_INIT;

/* The page's path, or 0 when FAKE_CUDA_CKPT_DIR is not set (no page, no checkpoints). */
static int ckpt_path(int pid, char *out, size_t n, const char *suffix) {
    const char *dir = getenv("FAKE_CUDA_CKPT_DIR");
    if (!dir || !*dir) return 0;
    int w = snprintf(out, n, "%s/fake-cuda-ckpt-%d%s", dir, pid, suffix);
    return w > 0 && (size_t)w < n;
}

/* /proc/<pid>/<what> into buf (NUL-terminated), or 0 when it cannot be read. */
static int read_proc(int pid, const char *what, char *buf, size_t cap) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", pid, what);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    return 1;
}


static ckpt_page *ckpt_map(int fd) {
    void *m = mmap(NULL, sizeof(ckpt_page), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return m == MAP_FAILED ? NULL : (ckpt_page *)m;
}

static void ckpt_unlink(void) {
    if (my_page_path[0] && getpid() == my_page_pid) unlink(my_page_path);
}

/* A forked child is another process: it has no page of its own until it initialises. */
static void ckpt_forked(void) {
    if (my_page) munmap(my_page, sizeof *my_page);
    my_page = NULL;
    my_page_path[0] = 0;
    ckpt_once = (pthread_once_t)PTHREAD_ONCE_INIT;
}

/* Published whole: written under a temporary name, then renamed into place. */
static void ckpt_publish_once(void) {
    char tmp[256];
    int pid = (int)getpid();
    if (!ckpt_path(pid, my_page_path, sizeof my_page_path, "") ||
        !ckpt_path(pid, tmp, sizeof tmp, ".new")) {
        my_page_path[0] = 0;
        return;
    }
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        my_page_path[0] = 0;
        return;
    }
    ckpt_page *p = ftruncate(fd, (off_t)sizeof(ckpt_page)) == 0 ? ckpt_map(fd) : (close(fd), NULL);
    if (!p) {
        unlink(tmp);
        my_page_path[0] = 0;
        return;
    }
    p->started = ckpt_start_time(pid);
    if (rename(tmp, my_page_path) != 0) {
        munmap(p, sizeof *p);
        unlink(tmp);
        my_page_path[0] = 0;
        return;
    }
    my_page_pid = (pid_t)pid;
    my_page = p;
    atexit(ckpt_unlink);
    pthread_atfork(NULL, NULL, ckpt_forked);
}

static void ckpt_publish(void) {
    /* A controller only (the shim): it acts on other processes and has no page of its own. */
    const char *c = getenv("FAKE_CUDA_CKPT_CONTROLLER");
    if (c && strcmp(c, "1") == 0) return;
    pthread_once(&ckpt_once, ckpt_publish_once);
}

/* A CUDA call begins: counted first, then the state read, so that a Lock that saw no call in
 * progress is never passed by one. */
static void ckpt_enter(void) {
    if (!my_page) return;
    for (;;) {
        __atomic_add_fetch(&my_page->in_calls, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&my_page->state, __ATOMIC_SEQ_CST) == CKPT_RUNNING) return;
        __atomic_sub_fetch(&my_page->in_calls, 1, __ATOMIC_SEQ_CST);
        usleep(1000);
    }
}

static void ckpt_leave(void) {
    if (my_page) __atomic_sub_fetch(&my_page->in_calls, 1, __ATOMIC_SEQ_CST);
}

static void ckpt_busy_until(long long us) {
    if (my_page) __atomic_store_n(&my_page->busy_until_us, us, __ATOMIC_SEQ_CST);
}

static void ckpt_on_device(int d) {
    if (my_page) __atomic_store_n(&my_page->gpu, d, __ATOMIC_SEQ_CST);
}

static void ckpt_bytes(long long delta) {
    if (my_page) __atomic_add_fetch(&my_page->device, delta, __ATOMIC_SEQ_CST);
}

/* The pid a process sees itself as (the last NSpid of /proc/<pid>/status), or -1. */
static int ns_pid(int pid) {
    char buf[16384];
    if (!read_proc(pid, "status", buf, sizeof buf)) return -1;
    char *line = strstr(buf, "\nNSpid:");
    if (!line) return pid;
    line += 7;
    int last = -1;
    for (char *end; *line && *line != '\n';) {
        long v = strtol(line, &end, 10);
        if (end == line) break;
        last = (int)v;
        line = end;
    }
    return last;
}

/* openat2(2) without the glibc wrapper (and for headers that lack it). */
struct fake_open_how { unsigned long long flags, mode, resolve; };
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#define FAKE_RESOLVE_NO_MAGICLINKS 0x02
#define FAKE_RESOLVE_IN_ROOT 0x10

/* The directory of another process's pages, resolved inside its own root (a controller outside
 * its mount namespace, as the shim is for a container, sees it under /proc/<pid>/root; a link
 * there cannot lead out of that root), or -1. */
static int ckpt_dir_of(int pid) {
    const char *dir = getenv("FAKE_CUDA_CKPT_DIR");
    if (!dir || !*dir) return -1;
    char root[64];
    snprintf(root, sizeof root, "/proc/%d/root", pid);
    int rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0) return -1;
    struct fake_open_how how = {O_PATH | O_DIRECTORY | O_CLOEXEC, 0,
                                FAKE_RESOLVE_IN_ROOT | FAKE_RESOLVE_NO_MAGICLINKS};
    int d = (int)syscall(SYS_openat2, rfd, dir, &how, sizeof how);
    close(rfd);
    return d;
}

/* Another process's page, or NULL when it has none: not a CUDA process of this double, gone,
 * or its pid now another process's (a stale page is removed here). Only a regular file of the
 * page's size is mapped. `pid` is as the controller sees it; the page is named by the pid the
 * process sees, in its own root. */
static ckpt_page *ckpt_of(int pid) {
    char name[64];
    if (pid <= 0) return NULL;
    int inner = ns_pid(pid);
    if (inner <= 0) return NULL;
    snprintf(name, sizeof name, "fake-cuda-ckpt-%d", inner);
    int dfd = ckpt_dir_of(pid);
    if (dfd < 0) return NULL;
    /* The name is the container's: looked at without opening it (a device node or a FIFO
     * must not be opened by the controller), then reopened as the regular file it is. */
    int pfd = openat(dfd, name, O_PATH | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (pfd < 0 || fstat(pfd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size < (off_t)sizeof(ckpt_page)) {
        if (pfd >= 0) close(pfd);
        close(dfd);
        return NULL;
    }
    char via[64];
    snprintf(via, sizeof via, "/proc/self/fd/%d", pfd);
    int fd = open(via, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    close(pfd);
    /* Its size again, on what is mapped (a page truncated between the two would fault the
     * controller; one truncated after this still can: a test double's limit). */
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(ckpt_page)) {
        if (fd >= 0) close(fd);
        close(dfd);
        return NULL;
    }
    ckpt_page *p = ckpt_map(fd);
    if (p && (kill(pid, 0) != 0 && errno == ESRCH ? 1 : p->started != ckpt_start_time(pid))) {
        munmap(p, sizeof *p);
        unlinkat(dfd, name, 0);
        p = NULL;
    }
    close(dfd);
    return p;
}

/* Whether FAKE_CUDA_CKPT_FAIL injects `what`: named alone, every time; as `what:N`, this
 * controller's first N times only (one kind is injected at a time). */
static int ckpt_fail(const char *what) {
    static int times;
    const char *v = getenv("FAKE_CUDA_CKPT_FAIL");
    size_t n = strlen(what);
    if (!v || strncmp(v, what, n) != 0) return 0;
    if (v[n] == 0) return 1;
    return v[n] == ':' && __atomic_fetch_add(&times, 1, __ATOMIC_SEQ_CST) < atoi(v + n + 1);
}

/* From one state to another, or 401 (CUDA_ERROR_ILLEGAL_STATE). */
static CUresult ckpt_move(ckpt_page *p, int from, int to) {
    int expected = from;
    return __atomic_compare_exchange_n(&p->state, &expected, to, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST)
               ? 0
               : 401;
}


CUresult cuCheckpointProcessGetState(int pid, int *state) {
    if (!state) return 1;
    ckpt_page *p = ckpt_of(pid);
    if (!p) return 1;
    int v = __atomic_load_n(&p->state, __ATOMIC_SEQ_CST);
    /* The double's own transient states read as the state they leave. */
    *state = v == CKPT_LOCKING                                 ? CKPT_RUNNING
             : v == CKPT_RESTORING                             ? CKPT_CHECKPOINTED
             : v == CKPT_CHECKPOINTING                         ? CKPT_LOCKED
                                                               : v;
    munmap(p, sizeof *p);
    return 0;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    ckpt_page *p = ckpt_of(pid);
    if (!p) return 1;
    /* Locking: new calls wait from now; locked once nothing is in progress or queued. */
    CUresult r = ckpt_move(p, CKPT_RUNNING, CKPT_LOCKING);
    if (r == 0) {
        long long limit = args && args->timeoutMs ? (long long)args->timeoutMs * 1000 : -1;
        long long start = now_us();
        /* Asked once per call: a `lock:N` injection counts calls, not polls. */
        int fail = ckpt_fail("lock");
        for (;;) {
            int calls = __atomic_load_n(&p->in_calls, __ATOMIC_SEQ_CST);
            long long busy = __atomic_load_n(&p->busy_until_us, __ATOMIC_SEQ_CST);
            if (!fail && calls == 0 && busy <= now_us()) {
                r = ckpt_move(p, CKPT_LOCKING, CKPT_LOCKED);
                break;
            }
            if (fail || (limit >= 0 && now_us() - start >= limit)) {
                ckpt_move(p, CKPT_LOCKING, CKPT_RUNNING);
                r = 909;
                break;
            }
            usleep(1000);
        }
    }
    note("ckpt lock %ld rc=%ld", pid, r);
    munmap(p, sizeof *p);
    return r;
}

CUresult cuCheckpointProcessCheckpoint(int pid, void *args) {
    (void)args;
    ckpt_page *p = ckpt_of(pid);
    if (!p) return 1;
    CUresult r = ckpt_move(p, CKPT_LOCKED, CKPT_CHECKPOINTING);
    const char *delay = getenv("FAKE_CUDA_CKPT_DELAY_MS");
    if (r == 0 && delay) {
        note("ckpt checkpointing %ld", pid, 0);
        usleep((useconds_t)atol(delay) * 1000);
    }
    if (r == 0 && ckpt_fail("checkpoint")) {
        ckpt_move(p, CKPT_CHECKPOINTING, CKPT_FAILED);
        r = 999;
    } else if (r == 0) {
        long long d = __atomic_exchange_n(&p->device, 0, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&p->host, d, __ATOMIC_SEQ_CST);
        ckpt_move(p, CKPT_CHECKPOINTING, CKPT_CHECKPOINTED);
    }
    note("ckpt checkpoint %ld rc=%ld", pid, r);
    munmap(p, sizeof *p);
    return r;
}

/* The index of the pair whose old UUID is fake GPU `d`'s in `a`, or -1. */
static int ckpt_pair_of(const CUcheckpointRestoreArgs *a, int d) {
    unsigned char u[16];
    fake_gpu_uuid(d, u);
    for (unsigned i = 0; i < a->gpuPairsCount; i++)
        if (memcmp(a->gpuPairs[i].oldUuid, u, 16) == 0) return (int)i;
    return -1;
}

/* Where a restore with `a` puts a process whose memory was on `from`: `from` without pairs; with
 * pairs, the device the pair for `from` names; -1 when the pairs do not name every GPU here (as
 * the driver is reported to want: CUDA_ERROR_INVALID_VALUE) and -2 when the new one is no device
 * here (CUDA_ERROR_INVALID_DEVICE). */
static int ckpt_restore_onto(const CUcheckpointRestoreArgs *a, int from) {
    if (!a || a->gpuPairsCount == 0) return from;
    if (!a->gpuPairs) return -1;
    for (int d = 0; d < count(); d++)
        if (ckpt_pair_of(a, d) < 0) return -1;
    int i = ckpt_pair_of(a, from);
    unsigned char u[16];
    for (int d = 0; d < count(); d++) {
        fake_gpu_uuid(d, u);
        if (memcmp(a->gpuPairs[i].newUuid, u, 16) == 0) return d;
    }
    return -2;
}

CUresult cuCheckpointProcessRestore(int pid, void *args) {
    ckpt_page *p = ckpt_of(pid);
    if (!p) return 1;
    CUresult r = __atomic_load_n(&p->state, __ATOMIC_SEQ_CST) == CKPT_CHECKPOINTED ? 0 : 401;
    int onto = ckpt_restore_onto(args, __atomic_load_n(&p->gpu, __ATOMIC_SEQ_CST));
    if (r == 0 && onto < 0) r = onto == -1 ? 1 : 101;
    if (r == 0 && ckpt_fail("restore-oom")) r = 2;
    if (r == 0) r = ckpt_move(p, CKPT_CHECKPOINTED, CKPT_RESTORING);
    if (r == 0) {
        long long h = __atomic_exchange_n(&p->host, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&p->gpu, onto, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&p->device, h, __ATOMIC_SEQ_CST);
        ckpt_move(p, CKPT_RESTORING, CKPT_LOCKED);
    }
    note("ckpt restore %ld rc=%ld", pid, r);
    if (r == 0 && args && ((CUcheckpointRestoreArgs *)args)->gpuPairsCount > 0)
        note("ckpt restore %ld onto %ld", pid, onto);
    munmap(p, sizeof *p);
    return r;
}

CUresult cuCheckpointProcessUnlock(int pid, void *args) {
    (void)args;
    ckpt_page *p = ckpt_of(pid);
    if (!p) return 1;
    CUresult r = ckpt_move(p, CKPT_LOCKED, CKPT_RUNNING);
    note("ckpt unlock %ld rc=%ld", pid, r);
    munmap(p, sizeof *p);
    return r;
}

/* Side channel: the device a process's memory is on, as its page has it; -1 without a page. */
int fake_cuda_ckpt_gpu(int pid) {
    ckpt_page *p = ckpt_of(pid);
    if (!p) return -1;
    int g = __atomic_load_n(&p->gpu, __ATOMIC_SEQ_CST);
    munmap(p, sizeof *p);
    return g;
}

/* Side channel: a process's device and host bytes as its page has them; -1 without a page. */
int fake_cuda_ckpt_bytes(int pid, long long *device, long long *host) {
    ckpt_page *p = ckpt_of(pid);
    if (!p) return -1;
    *device = __atomic_load_n(&p->device, __ATOMIC_SEQ_CST);
    *host = __atomic_load_n(&p->host, __ATOMIC_SEQ_CST);
    munmap(p, sizeof *p);
    return 0;
}
