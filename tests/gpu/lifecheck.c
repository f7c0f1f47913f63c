/*
 * The interposer's burst monitor against the real driver's rules on stream capture and context
 * lifetimes (issue 35, GPU check step 7). Driver API loaded at run time, the kernel as PTX, so
 * no CUDA toolkit is needed to build:
 *   cc -O2 -o lifecheck lifecheck.c -ldl -lpthread
 *
 * Run under the interposer with burst admission on (LD_PRELOAD, MQFQ_BURST=1, MQFQ_CTL_DIR):
 * the program serves `$MQFQ_CTL_DIR/shim.sock` itself, a shim that grants every burst and
 * counts begins and ends. Then:
 *   capture  a stream capture (global mode) of one kernel, left open 50 ms inside a burst whose
 *            idle time is 5 ms (the monitor must not synchronize the context under it: that
 *            invalidates the capture), ended, instantiated, launched; every value checked
 *   reset    a kernel, then the primary context reset at once, its work possibly still queued
 *            (the monitor must never use that context again); 50 ms later the context is
 *            retained again and a kernel runs and is checked
 *   bursts   after 100 ms idle, every burst begun has ended
 *
 * Prints `name value` lines and `lifecheck ok` at the end; exits 1 on the first failure.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUgraph;
typedef void *CUgraphExec;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuDevicePrimaryCtxReset)(int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **, void **);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuStreamBeginCapture)(CUstream, int);
static CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
static CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
static CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);

#include "inc_ptx.h"
#define N 4096

static void fail(const char *what, int r) {
    printf("lifecheck FAILED %s: %d\n", what, r);
    fflush(stdout);
    exit(1);
}

#define CHECK(call)                         \
    do {                                    \
        int r_ = (call);                    \
        if (r_ != 0) fail(#call, r_);       \
    } while (0)

static void *load(void *h, const char *name) {
    void *f = dlsym(h, name);
    if (!f) fail(name, -1);
    return f;
}

/* The shim: grants every begin, acknowledges every end, counts both. */
static int listener = -1;
static int begins, ends;
static pthread_mutex_t counts = PTHREAD_MUTEX_INITIALIZER;

static void *serve_conn(void *arg) {
    int fd = (int)(long)arg;
    FILE *in = fdopen(fd, "r+");
    char line[256];
    while (in && fgets(line, sizeof line, in)) {
        pthread_mutex_lock(&counts);
        if (strncmp(line, "begin", 5) == 0) begins++;
        if (strncmp(line, "end", 3) == 0) ends++;
        pthread_mutex_unlock(&counts);
        if (write(fd, "ok\n", 3) != 3) break;
    }
    if (in) fclose(in);
    return NULL;
}

static void *serve(void *unused) {
    (void)unused;
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) return NULL;
        pthread_t t;
        pthread_create(&t, NULL, serve_conn, (void *)(long)fd);
        pthread_detach(t);
    }
}

static void start_shim(void) {
    const char *dir = getenv("MQFQ_CTL_DIR");
    if (!dir) fail("MQFQ_CTL_DIR not set", -1);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (snprintf(a.sun_path, sizeof a.sun_path, "%s/shim.sock", dir) >= (int)sizeof a.sun_path)
        fail("MQFQ_CTL_DIR too long for a socket path", -1);
    unlink(a.sun_path);
    listener = socket(AF_UNIX, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(listener, 8) != 0)
        fail("shim socket", -1);
    pthread_t t;
    pthread_create(&t, NULL, serve, NULL);
    pthread_detach(t);
}

static CUfunction inc;
static CUdeviceptr buf;
static unsigned host[N];

/* A context of device 0 made current, the kernel loaded, the buffer zeroed. */
static void setup(void) {
    int dev = 0;
    CUcontext ctx = NULL;
    CUmodule mod = NULL;
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&inc, mod, "inc"));
    CHECK(cuMemAlloc(&buf, sizeof host));
    memset(host, 0, sizeof host);
    CHECK(cuMemcpyHtoD(buf, host, sizeof host));
}

static CUresult launch(CUstream s) {
    unsigned n = N;
    void *params[] = {&buf, &n};
    return cuLaunchKernel(inc, (N + 255) / 256, 1, 1, 256, 1, 1, 0, s, params, NULL);
}

/* Every value is `want`. */
static void expect(unsigned want, const char *what) {
    CHECK(cuMemcpyDtoH(host, buf, sizeof host));
    for (int i = 0; i < N; i++)
        if (host[i] != want) {
            printf("lifecheck FAILED %s: value[%d] = %u, want %u\n", what, i, host[i], want);
            exit(1);
        }
    printf("%s_values ok\n", what);
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) fail("dlopen libcuda.so.1", -1);
    cuInit = load(h, "cuInit");
    cuDeviceGet = load(h, "cuDeviceGet");
    cuDevicePrimaryCtxRetain = load(h, "cuDevicePrimaryCtxRetain");
    cuDevicePrimaryCtxReset = load(h, "cuDevicePrimaryCtxReset_v2");
    cuCtxSetCurrent = load(h, "cuCtxSetCurrent");
    cuCtxSynchronize = load(h, "cuCtxSynchronize");
    cuMemAlloc = load(h, "cuMemAlloc_v2");
    cuMemcpyHtoD = load(h, "cuMemcpyHtoD_v2");
    cuMemcpyDtoH = load(h, "cuMemcpyDtoH_v2");
    cuModuleLoadData = load(h, "cuModuleLoadData");
    cuModuleGetFunction = load(h, "cuModuleGetFunction");
    cuLaunchKernel = load(h, "cuLaunchKernel");
    cuStreamCreate = load(h, "cuStreamCreate");
    cuStreamSynchronize = load(h, "cuStreamSynchronize");
    cuStreamBeginCapture = load(h, "cuStreamBeginCapture_v2");
    cuStreamEndCapture = load(h, "cuStreamEndCapture");
    cuGraphInstantiate = load(h, "cuGraphInstantiateWithFlags");
    cuGraphLaunch = load(h, "cuGraphLaunch");
    start_shim();
    CHECK(cuInit(0));
    setup();

    /* capture: open across many idle times of the burst it is in. */
    CUstream s = NULL;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CHECK(cuStreamCreate(&s, 1 /* non-blocking */));
    CHECK(cuStreamBeginCapture(s, 0 /* global */));
    CHECK(launch(s));
    usleep(50 * 1000);
    int end = cuStreamEndCapture(s, &graph);
    printf("capture_end %d\n", end);
    if (end != 0) fail("cuStreamEndCapture (901: the capture was invalidated)", end);
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    expect(1, "capture");

    /* reset: the context goes away inside a burst that used it. */
    CHECK(launch(NULL));
    CHECK(cuDevicePrimaryCtxReset(0));
    usleep(50 * 1000);
    setup();
    CHECK(launch(NULL));
    CHECK(cuCtxSynchronize());
    expect(1, "reset");

    /* bursts: all ended once idle. */
    usleep(100 * 1000);
    pthread_mutex_lock(&counts);
    printf("bursts begun %d ended %d\n", begins, ends);
    int open = begins - ends;
    pthread_mutex_unlock(&counts);
    if (begins < 2 || open != 0) fail("bursts begun and ended", open);
    printf("lifecheck ok\n");
    return 0;
}
