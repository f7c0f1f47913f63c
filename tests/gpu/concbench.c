/*
 * What the GPU's load signals read while N "invocations" share it, and what sharing costs each
 * of them. Driver API and NVML loaded at run time and the kernel as PTX (JIT-compiled by the
 * driver), so no CUDA toolkit is needed to build:
 *   cc -O2 -o concbench concbench.c -ldl -lpthread
 *
 *   concbench MODE N SECONDS [BLOCKS] [SPIN_US] [GAP_US]
 *
 *   MODE procs    N worker processes, each with its own context (time-sliced by the driver, as
 *                 separate containers are)
 *   MODE streams  one process, N threads, each with its own stream in one shared context
 *
 * Every worker repeats for SECONDS: launch a kernel of BLOCKS blocks of 128 threads that spins
 * for SPIN_US microseconds of %globaltimer, wait for it (cuStreamSynchronize) and record that
 * launch-to-completion time as one burst, then sleep GAP_US on the CPU (defaults 4, 2000, 2000).
 * Meanwhile the parent samples NVML on the workers' GPU every 200 ms: busy time
 * (nvmlDeviceGetUtilizationRates().gpu) and, where GPM is supported, SM activity (SM_UTIL) and
 * DRAM bandwidth (DRAM_BW_UTIL) between consecutive GPM samples. Samples and bursts of the
 * first 0.5 s are warm-up and left out. Prints one line to stdout:
 *
 *   conc mode=procs n=4 busy=0.970 sm=0.120 dram=0.010 bursts_per_s=1234.5 burst_ms=3.210
 *
 * busy, sm and dram are averages as fractions 0-1 (nan where NVML or GPM is unavailable);
 * bursts_per_s counts all workers' bursts together; burst_ms is their mean length.
 *
 * The spin counts wall time, so a kernel switched out mid-spin catches up when it is switched
 * back in: under time slicing its burst grows by the wait only, a lower bound of what a kernel
 * with a fixed amount of work would see. CONCBENCH_SPIN=ontime counts only the time the kernel's
 * threads are on the GPU (gaps over 20 us between two reads of the timer are left out; a kernel
 * gives up after 64 x SPIN_US of wall time, which a timer coarser than 20 us would show).
 *
 * Diagnostics go to stderr; exit 1 on any error, 2 on bad arguments. Nothing waits forever:
 * workers stop at their deadline, the parent waits for them with a timeout, and an alarm ends
 * the whole run SECONDS + 120 s after it began (a worker process: SECONDS + 90 s).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h> /* NAN only: no -lm needed */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **, void **);
static CUresult (*cuDeviceGetPCIBusId)(char *, int, int);   /* optional */
static CUresult (*cuGetErrorName)(CUresult, const char **); /* optional */

/* spin(ns, ontime): every thread reads %globaltimer until ns nanoseconds have passed; with ontime
 * set, only steps under 20 us between two reads count, with a wall-time cap of 64 x ns. */
static const char PTX[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns, .param .u32 ontime)\n{\n"
    "  .reg .pred %p<4>;\n  .reg .b32 %r<2>;\n  .reg .b64 %rd<10>;\n"
    "  ld.param.u64 %rd1, [ns];\n  ld.param.u32 %r1, [ontime];\n"
    "  mov.u64 %rd2, %globaltimer;\n  mov.u64 %rd5, %rd2;\n  mov.u64 %rd6, 0;\n"
    "  shl.b64 %rd8, %rd1, 6;\n  setp.ne.u32 %p3, %r1, 0;\n"
    "LOOP:\n"
    "  mov.u64 %rd3, %globaltimer;\n  sub.u64 %rd4, %rd3, %rd2;\n"
    "  @%p3 bra ONTIME;\n"
    "  setp.lt.u64 %p1, %rd4, %rd1;\n  @%p1 bra LOOP;\n  ret;\n"
    "ONTIME:\n"
    "  sub.u64 %rd7, %rd3, %rd5;\n  mov.u64 %rd5, %rd3;\n"
    "  setp.lt.u64 %p2, %rd7, 20000;\n  @%p2 add.u64 %rd6, %rd6, %rd7;\n"
    "  setp.ge.u64 %p1, %rd4, %rd8;\n  @%p1 bra DONE;\n"
    "  setp.lt.u64 %p1, %rd6, %rd1;\n  @%p1 bra LOOP;\n"
    "DONE:\n  ret;\n}\n";

/* NVML, as much of it as the sampler needs. */
#include "nvml_gpm.h"
typedef void *nvmlDevice_t;
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
enum { GPM_SM_UTIL = NVML_GPM_METRIC_SM_UTIL, GPM_DRAM_BW_UTIL = NVML_GPM_METRIC_DRAM_BW_UTIL };

static nvmlReturn_t (*nvmlInit_v2)(void);
static nvmlReturn_t (*nvmlShutdown)(void);
static nvmlReturn_t (*nvmlDeviceGetHandleByIndex_v2)(unsigned int, nvmlDevice_t *);
static nvmlReturn_t (*nvmlDeviceGetHandleByPciBusId_v2)(const char *, nvmlDevice_t *);
static nvmlReturn_t (*nvmlDeviceGetUtilizationRates)(nvmlDevice_t, nvmlUtilization_t *);
static nvmlReturn_t (*nvmlGpmQueryDeviceSupport)(nvmlDevice_t, nvmlGpmSupport_t *);
static nvmlReturn_t (*nvmlGpmSampleAlloc)(nvmlGpmSample_t *);
static nvmlReturn_t (*nvmlGpmSampleFree)(nvmlGpmSample_t);
static nvmlReturn_t (*nvmlGpmSampleGet)(nvmlDevice_t, nvmlGpmSample_t);
static nvmlReturn_t (*nvmlGpmMetricsGet)(nvmlGpmMetricsGet_t *);

#define WARMUP_MS 500.0
#define TICK_MS 200.0 /* NVML wants two GPM samples more than 100 ms apart */
#define MAX_N 64

/* The run's parameters. */
static int n_workers, blocks = 4, spin_us = 2000, gap_us = 2000;
static unsigned ontime;
static double seconds;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void sleep_until_ms(double t) {
    long long ns = (long long)(t * 1e6);
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "concbench: timed out\n";
    if (write(2, m, sizeof m - 1) < 0) {
    }
    _exit(1);
}

static const char *cu_name(CUresult r) {
    const char *s = NULL;
    if (cuGetErrorName && cuGetErrorName(r, &s) == 0 && s) return s;
    return "?";
}

#define CU(call)                                                                           \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_) {                                                                          \
            snprintf(err, cap, "%s = %d (%s)", #call, r_, cu_name(r_));                   \
            return -1;                                                                     \
        }                                                                                  \
    } while (0)

#define SYM(h, f, name, required)                                                          \
    do {                                                                                   \
        *(void **)&f = dlsym(h, name);                                                     \
        if (!f && required) {                                                              \
            snprintf(err, cap, "missing %s", name);                                        \
            return -1;                                                                     \
        }                                                                                  \
    } while (0)

static int cuda_load(char *err, size_t cap) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        snprintf(err, cap, "dlopen libcuda.so.1: %s", dlerror());
        return -1;
    }
    SYM(h, cuInit, "cuInit", 1);
    SYM(h, cuDeviceGet, "cuDeviceGet", 1);
    SYM(h, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 1);
    SYM(h, cuCtxSetCurrent, "cuCtxSetCurrent", 1);
    SYM(h, cuModuleLoadData, "cuModuleLoadData", 1);
    SYM(h, cuModuleGetFunction, "cuModuleGetFunction", 1);
    SYM(h, cuStreamCreate, "cuStreamCreate", 1);
    SYM(h, cuStreamSynchronize, "cuStreamSynchronize", 1);
    SYM(h, cuLaunchKernel, "cuLaunchKernel", 1);
    SYM(h, cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", 0);
    SYM(h, cuGetErrorName, "cuGetErrorName", 0);
    return 0;
}

/* GPU 0's primary context, current on the calling thread, and the spin kernel in it. The bus id
 * (empty when the driver does not say) lets the sampler find the same GPU in NVML, whose order
 * may differ from CUDA's. */
static int cuda_setup(CUcontext *ctx, CUfunction *f, char *bus, char *err, size_t cap) {
    int dev;
    CUmodule m;
    CU(cuInit(0));
    CU(cuDeviceGet(&dev, 0));
    CU(cuDevicePrimaryCtxRetain(ctx, dev));
    CU(cuCtxSetCurrent(*ctx));
    CU(cuModuleLoadData(&m, PTX));
    CU(cuModuleGetFunction(f, m, "spin"));
    bus[0] = 0;
    if (cuDeviceGetPCIBusId && cuDeviceGetPCIBusId(bus, 32, dev) != 0) bus[0] = 0;
    return 0;
}

static int stream(CUstream *s, char *err, size_t cap) {
    CU(cuStreamCreate(s, 1)); /* CU_STREAM_NON_BLOCKING */
    return 0;
}

static int burst(CUfunction f, CUstream s, char *err, size_t cap) {
    unsigned long long ns = (unsigned long long)spin_us * 1000ULL;
    unsigned flag = ontime;
    void *args[] = {&ns, &flag};
    CU(cuLaunchKernel(f, (unsigned)blocks, 1, 1, 128, 1, 1, 0, s, args, NULL));
    CU(cuStreamSynchronize(s));
    return 0;
}

/* One worker's bursts from `go` for `seconds`, counting those that begin after the warm-up. */
static int work(CUfunction f, CUstream s, double go, long long *bursts, double *sum_ms, char *err,
                size_t cap) {
    double end = go + seconds * 1e3, from = go + WARMUP_MS;
    struct timespec gap = {gap_us / 1000000, (long)(gap_us % 1000000) * 1000};
    *bursts = 0;
    *sum_ms = 0;
    for (;;) {
        double t0 = now_ms();
        if (t0 >= end) return 0;
        if (burst(f, s, err, cap) != 0) return -1;
        double t1 = now_ms();
        if (t0 >= from) {
            ++*bursts;
            *sum_ms += t1 - t0;
        }
        if (gap_us > 0) nanosleep(&gap, NULL);
    }
}

/* The sampler: NVML busy time and GPM metrics every 200 ms from `go` for `seconds`. */
struct signals {
    double busy, sm, dram;
};

static nvmlDevice_t nvml_open(const char *bus) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    nvmlDevice_t d = NULL;
    if (!h) {
        fprintf(stderr, "concbench: dlopen libnvidia-ml.so.1: %s (busy, sm, dram: nan)\n", dlerror());
        return NULL;
    }
    *(void **)&nvmlInit_v2 = dlsym(h, "nvmlInit_v2");
    *(void **)&nvmlShutdown = dlsym(h, "nvmlShutdown");
    *(void **)&nvmlDeviceGetHandleByIndex_v2 = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvmlDeviceGetHandleByPciBusId_v2 = dlsym(h, "nvmlDeviceGetHandleByPciBusId_v2");
    *(void **)&nvmlDeviceGetUtilizationRates = dlsym(h, "nvmlDeviceGetUtilizationRates");
    *(void **)&nvmlGpmQueryDeviceSupport = dlsym(h, "nvmlGpmQueryDeviceSupport");
    *(void **)&nvmlGpmSampleAlloc = dlsym(h, "nvmlGpmSampleAlloc");
    *(void **)&nvmlGpmSampleFree = dlsym(h, "nvmlGpmSampleFree");
    *(void **)&nvmlGpmSampleGet = dlsym(h, "nvmlGpmSampleGet");
    *(void **)&nvmlGpmMetricsGet = dlsym(h, "nvmlGpmMetricsGet");
    if (!nvmlInit_v2 || !nvmlDeviceGetHandleByIndex_v2 || !nvmlDeviceGetUtilizationRates) {
        fprintf(stderr, "concbench: NVML lacks nvmlInit_v2 or the utilization call (busy, sm, dram: nan)\n");
        return NULL;
    }
    nvmlReturn_t r = nvmlInit_v2();
    if (r != 0) {
        fprintf(stderr, "concbench: nvmlInit_v2 = %d (busy, sm, dram: nan)\n", r);
        return NULL;
    }
    if (bus[0] && nvmlDeviceGetHandleByPciBusId_v2 &&
        nvmlDeviceGetHandleByPciBusId_v2(bus, &d) == 0)
        return d;
    if (bus[0]) fprintf(stderr, "concbench: NVML does not know bus id %s; sampling NVML GPU 0\n", bus);
    if ((r = nvmlDeviceGetHandleByIndex_v2(0, &d)) != 0) {
        fprintf(stderr, "concbench: nvmlDeviceGetHandleByIndex_v2(0) = %d (busy, sm, dram: nan)\n", r);
        return NULL;
    }
    return d;
}

static int gpm_usable(nvmlDevice_t d) {
    if (!d || !nvmlGpmQueryDeviceSupport || !nvmlGpmSampleAlloc || !nvmlGpmSampleFree ||
        !nvmlGpmSampleGet || !nvmlGpmMetricsGet) {
        if (d) fprintf(stderr, "concbench: NVML has no GPM calls (sm, dram: nan)\n");
        return 0;
    }
    nvmlGpmSupport_t s = {1, 0};
    nvmlReturn_t r = nvmlGpmQueryDeviceSupport(d, &s);
    if (r != 0 || !s.isSupportedDevice) {
        fprintf(stderr, "concbench: GPM not supported on this GPU (query %d; sm, dram: nan)\n", r);
        return 0;
    }
    return 1;
}

static struct signals sample(nvmlDevice_t d, double go) {
    static nvmlGpmMetricsGet_t mg;
    struct signals out = {NAN, NAN, NAN};
    double busy = 0, sm = 0, dram = 0;
    int n_busy = 0, n_sm = 0, n_dram = 0, gpm = gpm_usable(d), warned = 0;
    nvmlGpmSample_t s[2] = {NULL, NULL};
    double taken[2] = {0, 0};
    if (gpm && (nvmlGpmSampleAlloc(&s[0]) != 0 || nvmlGpmSampleAlloc(&s[1]) != 0)) {
        fprintf(stderr, "concbench: nvmlGpmSampleAlloc failed (sm, dram: nan)\n");
        gpm = 0;
    }
    int have_prev = 0, cur = 0;
    for (int k = 0;; k++) {
        double tick = go + k * TICK_MS;
        if (tick > go + seconds * 1e3) break;
        sleep_until_ms(tick);
        if (!d) continue;
        nvmlUtilization_t u;
        if (tick >= go + WARMUP_MS && nvmlDeviceGetUtilizationRates(d, &u) == 0) {
            busy += u.gpu;
            n_busy++;
        }
        if (!gpm) continue;
        nvmlReturn_t r = nvmlGpmSampleGet(d, s[cur]);
        if (r != 0) {
            if (!warned++) fprintf(stderr, "concbench: nvmlGpmSampleGet = %d\n", r);
            have_prev = 0;
            continue;
        }
        taken[cur] = now_ms();
        if (have_prev && taken[1 - cur] >= go + WARMUP_MS) {
            memset(&mg, 0, sizeof mg);
            mg.version = 1;
            mg.numMetrics = 2;
            mg.sample1 = s[1 - cur];
            mg.sample2 = s[cur];
            mg.metrics[0].metricId = GPM_SM_UTIL;
            mg.metrics[1].metricId = GPM_DRAM_BW_UTIL;
            r = nvmlGpmMetricsGet(&mg);
            if (r != 0) {
                if (!warned++) fprintf(stderr, "concbench: nvmlGpmMetricsGet = %d\n", r);
            } else {
                if (mg.metrics[0].nvmlReturn == 0) {
                    sm += mg.metrics[0].value;
                    n_sm++;
                }
                if (mg.metrics[1].nvmlReturn == 0) {
                    dram += mg.metrics[1].value;
                    n_dram++;
                }
            }
        }
        have_prev = 1;
        cur = 1 - cur;
    }
    if (s[0]) nvmlGpmSampleFree(s[0]);
    if (s[1]) nvmlGpmSampleFree(s[1]);
    if (n_busy) out.busy = busy / n_busy / 100;
    if (n_sm) out.sm = sm / n_sm / 100;
    if (n_dram) out.dram = dram / n_dram / 100;
    return out;
}

static void report(const char *mode, struct signals sig, long long bursts, double sum_ms) {
    double counted_s = seconds - WARMUP_MS / 1e3;
    printf("conc mode=%s n=%d busy=%.3f sm=%.3f dram=%.3f bursts_per_s=%.1f burst_ms=%.3f\n", mode,
           n_workers, sig.busy, sig.sm, sig.dram, bursts / counted_s,
           bursts ? sum_ms / bursts : NAN);
}

/* procs: one process per worker. A worker says READY (with its GPU's bus id) or ERROR on its
 * pipe, waits for a byte on the shared go pipe (end of file: the parent is gone, so it stops),
 * runs, and says DONE or ERROR. */
enum { READY = 1, DONE = 2, FAILED = 3 };
struct msg {
    int kind;
    int worker;
    long long bursts;
    double sum_ms;
    char text[160];
};

static void send_msg(int fd, int kind, int worker, long long bursts, double sum_ms, const char *text) {
    struct msg m;
    memset(&m, 0, sizeof m);
    m.kind = kind;
    m.worker = worker;
    m.bursts = bursts;
    m.sum_ms = sum_ms;
    snprintf(m.text, sizeof m.text, "%s", text ? text : "");
    if (write(fd, &m, sizeof m) != (ssize_t)sizeof m) _exit(1);
}

static void worker_proc(int i, int out, int go_fd) {
    char err[200], bus[32];
    CUcontext ctx;
    CUfunction f;
    CUstream s;
    size_t cap = sizeof err;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm((unsigned)seconds + 90);
    err[0] = 0;
    if (cuda_load(err, cap) != 0 || cuda_setup(&ctx, &f, bus, err, cap) != 0 ||
        stream(&s, err, cap) != 0 || burst(f, s, err, cap) != 0) {
        send_msg(out, FAILED, i, 0, 0, err);
        _exit(1);
    }
    send_msg(out, READY, i, 0, 0, bus);
    char g;
    if (read(go_fd, &g, 1) != 1) _exit(0);
    long long bursts;
    double sum_ms;
    if (work(f, s, now_ms(), &bursts, &sum_ms, err, cap) != 0) {
        send_msg(out, FAILED, i, 0, 0, err);
        _exit(1);
    }
    send_msg(out, DONE, i, bursts, sum_ms, NULL);
    _exit(0);
}

/* One message from fd by `deadline` (ms): 1 read, 0 end of file, -1 timed out or broken. */
static int recv_msg(int fd, struct msg *m, double deadline) {
    size_t got = 0;
    while (got < sizeof *m) {
        int left = (int)(deadline - now_ms());
        if (left <= 0) return -1;
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        ssize_t k = read(fd, (char *)m + got, sizeof *m - got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) return got ? -1 : 0;
        got += (size_t)k;
    }
    return 1;
}

static pid_t pids[MAX_N];

static void kill_workers(void) {
    for (int i = 0; i < n_workers; i++)
        if (pids[i] > 0) kill(pids[i], SIGKILL);
    for (int i = 0; i < n_workers; i++)
        if (pids[i] > 0) waitpid(pids[i], NULL, 0);
}

static int run_procs(void) {
    int res[MAX_N], go[2];
    struct msg m;
    if (pipe(go) != 0) {
        perror("concbench: pipe");
        return 1;
    }
    for (int i = 0; i < n_workers; i++) {
        int p[2];
        if (pipe(p) != 0) {
            perror("concbench: pipe");
            kill_workers();
            return 1;
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            perror("concbench: fork");
            kill_workers();
            return 1;
        }
        if (pid == 0) {
            close(p[0]);
            close(go[1]);
            for (int j = 0; j < i; j++) close(res[j]);
            worker_proc(i, p[1], go[0]);
        }
        close(p[1]);
        res[i] = p[0];
        pids[i] = pid;
    }
    close(go[0]);
    char bus[sizeof m.text] = "";
    double ready_by = now_ms() + 60e3;
    for (int i = 0; i < n_workers; i++) {
        int r = recv_msg(res[i], &m, ready_by);
        if (r == 1 && m.kind == READY) {
            if (i == 0) {
                memcpy(bus, m.text, sizeof bus);
                bus[sizeof bus - 1] = 0;
            }
            continue;
        }
        if (r == 1) fprintf(stderr, "concbench: worker %d: %s\n", i, m.text);
        else fprintf(stderr, "concbench: worker %d %s before it was ready\n", i,
                     r == 0 ? "exited" : "timed out");
        kill_workers();
        return 1;
    }
    nvmlDevice_t d = nvml_open(bus);
    char gos[MAX_N];
    memset(gos, 'g', sizeof gos);
    double t_go = now_ms();
    if (write(go[1], gos, (size_t)n_workers) != n_workers) {
        perror("concbench: starting the workers");
        kill_workers();
        return 1;
    }
    struct signals sig = sample(d, t_go);
    long long bursts = 0;
    double sum_ms = 0, done_by = t_go + seconds * 1e3 + 30e3;
    int failed = 0;
    for (int i = 0; i < n_workers; i++) {
        int r = recv_msg(res[i], &m, done_by);
        if (r == 1 && m.kind == DONE) {
            bursts += m.bursts;
            sum_ms += m.sum_ms;
            continue;
        }
        failed = 1;
        if (r == 1) fprintf(stderr, "concbench: worker %d: %s\n", i, m.text);
        else fprintf(stderr, "concbench: worker %d %s without a result\n", i,
                     r == 0 ? "exited" : "timed out");
    }
    close(go[1]);
    kill_workers();
    if (d && nvmlShutdown) nvmlShutdown();
    if (failed) return 1;
    report("procs", sig, bursts, sum_ms);
    return 0;
}

/* streams: one context, one thread and stream per worker; a barrier starts them together. */
struct thread_slot {
    CUcontext ctx;
    CUfunction f;
    long long bursts;
    double sum_ms;
    char err[200];
};
static pthread_barrier_t start;

static void *worker_thread(void *arg) {
    struct thread_slot *t = arg;
    char *err = t->err;
    size_t cap = sizeof t->err;
    CUstream s = NULL;
    CUresult r = cuCtxSetCurrent(t->ctx);
    if (r) snprintf(err, cap, "cuCtxSetCurrent = %d (%s)", r, cu_name(r));
    else if (stream(&s, err, cap) == 0) burst(t->f, s, err, cap);
    pthread_barrier_wait(&start);
    if (!err[0]) work(t->f, s, now_ms(), &t->bursts, &t->sum_ms, err, cap);
    return NULL;
}

static int run_streams(void) {
    char err[200] = "", bus[32];
    size_t cap = sizeof err;
    CUcontext ctx;
    CUfunction f;
    static struct thread_slot slots[MAX_N];
    pthread_t th[MAX_N];
    if (cuda_setup(&ctx, &f, bus, err, cap) != 0) {
        fprintf(stderr, "concbench: %s\n", err);
        return 1;
    }
    nvmlDevice_t d = nvml_open(bus);
    if (pthread_barrier_init(&start, NULL, (unsigned)n_workers + 1) != 0) {
        fprintf(stderr, "concbench: pthread_barrier_init failed\n");
        return 1;
    }
    for (int i = 0; i < n_workers; i++) {
        slots[i].ctx = ctx;
        slots[i].f = f;
        int e = pthread_create(&th[i], NULL, worker_thread, &slots[i]);
        if (e != 0) {
            /* The barrier would never open: nothing to clean up but the process. */
            fprintf(stderr, "concbench: pthread_create: %s\n", strerror(e));
            return 1;
        }
    }
    pthread_barrier_wait(&start);
    struct signals sig = sample(d, now_ms());
    long long bursts = 0;
    double sum_ms = 0;
    int failed = 0;
    for (int i = 0; i < n_workers; i++) {
        pthread_join(th[i], NULL);
        if (slots[i].err[0]) {
            fprintf(stderr, "concbench: worker %d: %s\n", i, slots[i].err);
            failed = 1;
        }
        bursts += slots[i].bursts;
        sum_ms += slots[i].sum_ms;
    }
    if (d && nvmlShutdown) nvmlShutdown();
    if (failed) return 1;
    report("streams", sig, bursts, sum_ms);
    return 0;
}

static int number(const char *s, int lo, int hi, const char *what, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "concbench: %s must be an integer in %d..%d, not '%s'\n", what, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 4 || argc > 7 || (strcmp(argv[1], "procs") != 0 && strcmp(argv[1], "streams") != 0)) {
        fprintf(stderr, "usage: concbench procs|streams N SECONDS [BLOCKS] [SPIN_US] [GAP_US]\n");
        return 2;
    }
    char *end;
    seconds = strtod(argv[3], &end);
    if (number(argv[2], 1, MAX_N, "N", &n_workers) != 0 ||
        (argc > 4 && number(argv[4], 1, 1 << 20, "BLOCKS", &blocks) != 0) ||
        (argc > 5 && number(argv[5], 1, 10000000, "SPIN_US", &spin_us) != 0) ||
        (argc > 6 && number(argv[6], 0, 10000000, "GAP_US", &gap_us) != 0))
        return 2;
    if (*end || !(seconds > WARMUP_MS / 1e3) || seconds > 3600) {
        fprintf(stderr, "concbench: SECONDS must be over %.1f (the warm-up) and at most 3600, not '%s'\n",
                WARMUP_MS / 1e3, argv[3]);
        return 2;
    }
    const char *mode = getenv("CONCBENCH_SPIN");
    ontime = mode && strcmp(mode, "ontime") == 0;
    signal(SIGALRM, on_alarm);
    signal(SIGPIPE, SIG_IGN);
    alarm((unsigned)seconds + 120);
    /* Fail early and plainly without a driver; the workers load it again for themselves. */
    char err[200];
    if (cuda_load(err, sizeof err) != 0) {
        fprintf(stderr, "concbench: %s\n", err);
        return 1;
    }
    return strcmp(argv[1], "procs") == 0 ? run_procs() : run_streams();
}
