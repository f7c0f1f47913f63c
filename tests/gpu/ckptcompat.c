/*
 * What the interposer's `uvm` backend refuses, across the driver's checkpoint API (issue 36's GPU
 * check): CUDA IPC and a graph capture left open while another process suspends and resumes the
 * application, as the shim does under `checkpoint`. Driver API loaded at run time, one kernel as
 * PTX, so no CUDA toolkit is needed:
 *   cc -O2 -o ckptcompat ckptcompat.c -ldl
 *
 *   ckptcompat   forks an exporter and an importer, then initialises the driver (the
 *                controller). The exporter allocates 1 MiB of native memory (word i = i), exports
 *                it (`export rc`) and begins a stream capture (global mode) holding one `inc`
 *                kernel, left open (`capture_begin rc`). The controller locks, checkpoints,
 *                restores and unlocks it (`lock rc`, `checkpoint rc`, `state_after_checkpoint`,
 *                `restore rc`, `unlock rc`). Then the exporter ends the capture, instantiates and
 *                launches the graph (`capture_end rc`, `graph_launch rc`, `graph_results_wrong N`:
 *                every word must be i + 1), the importer opens the handle (`import rc`,
 *                `import_words 1 2 3` expected), writes 777 into word 0 and closes it
 *                (`import_close rc`), and the exporter reads the word back (`exporter_sees 777`).
 *
 * Prints `name value` lines and `error ...` on the first failure; exits 1 then, 0 when all held.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_args.h"
#include "drvapi.h"
#include "inc_ptx.h"

typedef void *CUstream;
typedef void *CUgraph;
typedef void *CUgraphExec;
typedef struct {
    char bytes[64];
} CUipcMemHandle;

static CUresult (*ckLock)(int, CUcheckpointLockArgs *);
static CUresult (*ckCheckpoint)(int, void *);
static CUresult (*ckRestore)(int, void *);
static CUresult (*ckUnlock)(int, void *);
static CUresult (*ckState)(int, int *);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuStreamBeginCapture)(CUstream, int);
static CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
static CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
static CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
static CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
static CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
static CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);

#define WORDS (1u << 18)

/* What a child answers: up to four figures. */
typedef struct {
    int v[4];
} Answer;

static int say(int fd, int a, int b, int c, int d) {
    Answer x = {{a, b, c, d}};
    return write(fd, &x, sizeof x) == sizeof x ? 0 : 1;
}

/* A context on GPU 0 with the `inc` kernel loaded. */
static int setup(CUfunction *f) {
    int dev;
    CUcontext ctx;
    CUmodule m;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&m, PTX));
    CHECK(cuModuleGetFunction(f, m, "inc"));
    return 0;
}

/* The exporter: answers (export rc, capture rc), then one answer per command: 'g' ends the
 * capture and launches its graph (end rc, launch rc, wrong words), 'r' reads word 0. */
static int exporter(int cmd, int ans, int handle_out) {
    CUfunction f;
    CUdeviceptr p;
    if (setup(&f)) return 1;
    unsigned *host = malloc(WORDS * 4);
    if (!host) return 1;
    for (unsigned i = 0; i < WORDS; i++) host[i] = i;
    CHECK(cuMemAlloc(&p, WORDS * 4));
    CHECK(cuMemcpyHtoD(p, host, WORDS * 4));
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    int exported = cuIpcGetMemHandle(&h, p);
    if (write(handle_out, &h, sizeof h) != sizeof h) return 1;
    CUstream s = NULL;
    unsigned n = WORDS;
    void *args[] = {&p, &n};
    int begun = cuStreamCreate(&s, 1 /* non-blocking */);
    if (!begun) begun = cuStreamBeginCapture(s, 0 /* global */);
    if (!begun) begun = cuLaunchKernel(f, WORDS / 256, 1, 1, 256, 1, 1, 0, s, args, NULL);
    if (say(ans, exported, begun, 0, 0)) return 1;
    char c;
    while (read(cmd, &c, 1) == 1) {
        if (c == 'g') {
            CUgraph g = NULL;
            CUgraphExec e = NULL;
            int end = cuStreamEndCapture(s, &g), launched = -1, wrong = -1;
            if (!end) launched = cuGraphInstantiate(&e, g, 0);
            if (!end && !launched) launched = cuGraphLaunch(e, s);
            if (!end && !launched && !cuStreamSynchronize(s) &&
                !cuMemcpyDtoH(host, p, WORDS * 4)) {
                wrong = 0;
                for (unsigned i = 0; i < WORDS; i++) wrong += host[i] != i + 1;
            }
            if (say(ans, end, launched, wrong, 0)) return 1;
        } else {
            unsigned w = 0;
            int r = cuMemcpyDtoH(&w, p, sizeof w);
            if (say(ans, r, (int)w, 0, 0)) return 1;
        }
    }
    return 0;
}

/* The importer: reads the handle, opens it, reads three words, writes 777 into the first,
 * closes it: (open rc, word 0, word 1, word 2), then (close rc). */
static int importer(int cmd, int ans) {
    CUipcMemHandle h;
    if (read(cmd, &h, sizeof h) != sizeof h) return 0;
    CUfunction f;
    if (setup(&f)) return 1;
    CUdeviceptr p = 0;
    unsigned w[3] = {0, 0, 0}, v = 777;
    int r = cuIpcOpenMemHandle(&p, h, 1 /* lazy peer access */);
    if (!r) r = cuMemcpyDtoH(w, p, sizeof w);
    if (say(ans, r, (int)w[0], (int)w[1], (int)w[2])) return 1;
    int closed = r;
    if (!r) {
        closed = cuMemcpyHtoD(p, &v, sizeof v);
        if (!closed) closed = cuCtxSynchronize();
        if (!closed) closed = cuIpcCloseMemHandle(p);
    }
    return say(ans, closed, 0, 0, 0);
}

static int ask(int cmd, int ans, char c, Answer *a) {
    if ((c && write(cmd, &c, 1) != 1) || read(ans, a, sizeof *a) != sizeof *a) {
        printf("error a child is gone\n");
        return 1;
    }
    return 0;
}

/* Lock, checkpoint, restore, unlock the exporter, each answer printed; nonzero on a failure. */
static int suspend_resume(pid_t pid) {
    CUcheckpointLockArgs la = {.timeoutMs = 10000};
    CUresult r = ckLock(pid, &la);
    printf("lock rc %d\n", r);
    if (!r) printf("checkpoint rc %d\n", r = ckCheckpoint(pid, NULL));
    int st = -1;
    if (!r) {
        ckState(pid, &st);
        printf("state_after_checkpoint %d\n", st);
    }
    if (!r) printf("restore rc %d\n", r = ckRestore(pid, NULL));
    if (!r) printf("unlock rc %d\n", r = ckUnlock(pid, NULL));
    if (r) printf("error the exporter could not be suspended and resumed\n");
    return r != 0;
}

static pid_t child(int (*body)(int, int, int), int in[2], int out[2], int extra) {
    pid_t pid = fork();
    if (pid == 0) {
        close(in[1]);
        close(out[0]);
        _exit(body(in[0], out[1], extra));
    }
    close(in[0]);
    close(out[1]);
    return pid;
}

static int exporter_body(int cmd, int ans, int handle) { return exporter(cmd, ans, handle); }
static int importer_body(int cmd, int ans, int unused) {
    (void)unused;
    return importer(cmd, ans);
}

/* The controller's part once both children run; nonzero on a failure. */
static int control(pid_t ex, int ecmd, int eans, int hin, int icmd, int ians) {
    Answer a;
    CUipcMemHandle h;
    if (ask(ecmd, eans, 0, &a) || read(hin, &h, sizeof h) != sizeof h) return 1;
    printf("export rc %d\ncapture_begin rc %d\n", a.v[0], a.v[1]);
    if (a.v[0] || a.v[1]) return 1;
    printf("controller_init %d\n", cuInit(0));
    if (suspend_resume(ex) || ask(ecmd, eans, 'g', &a)) return 1;
    printf("capture_end rc %d\ngraph_launch rc %d\ngraph_results_wrong %d of %u\n", a.v[0],
           a.v[1], a.v[2], WORDS);
    if (a.v[0] || a.v[1] || a.v[2]) return 1;
    if (write(icmd, &h, sizeof h) != sizeof h || ask(icmd, ians, 0, &a)) return 1;
    printf("import rc %d\nimport_words %d %d %d\n", a.v[0], a.v[1], a.v[2], a.v[3]);
    if (a.v[0] || ask(icmd, ians, 0, &a)) return 1;
    printf("import_close rc %d\n", a.v[0]);
    if (a.v[0] || ask(ecmd, eans, 'r', &a)) return 1;
    printf("exporter_sees %d\n", a.v[1]);
    return a.v[0] || a.v[1] != 777;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *h;
    if (load_driver(&h)) return 1;
    LOAD(h, ckLock, "cuCheckpointProcessLock");
    LOAD(h, ckCheckpoint, "cuCheckpointProcessCheckpoint");
    LOAD(h, ckRestore, "cuCheckpointProcessRestore");
    LOAD(h, ckUnlock, "cuCheckpointProcessUnlock");
    LOAD(h, ckState, "cuCheckpointProcessGetState");
    LOAD(h, cuStreamCreate, "cuStreamCreate");
    LOAD(h, cuStreamSynchronize, "cuStreamSynchronize");
    LOAD(h, cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    LOAD(h, cuStreamEndCapture, "cuStreamEndCapture");
    LOAD(h, cuGraphInstantiate, "cuGraphInstantiateWithFlags");
    LOAD(h, cuGraphLaunch, "cuGraphLaunch");
    LOAD(h, cuIpcGetMemHandle, "cuIpcGetMemHandle");
    LOAD(h, cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2");
    LOAD(h, cuIpcCloseMemHandle, "cuIpcCloseMemHandle");
    int ecmd[2], eans[2], hpipe[2], icmd[2], ians[2];
    if (pipe(ecmd) || pipe(eans) || pipe(hpipe) || pipe(icmd) || pipe(ians)) return 1;
    /* Both children before the controller's driver starts: a forked CUDA process is unusable. */
    pid_t ex = child(exporter_body, ecmd, eans, hpipe[1]);
    close(hpipe[1]);
    pid_t im = child(importer_body, icmd, ians, -1);
    if (ex < 0 || im < 0) return 1;
    int status = control(ex, ecmd[1], eans[0], hpipe[0], icmd[1], ians[0]);
    close(ecmd[1]);
    close(icmd[1]);
    pid_t pids[2] = {ex, im};
    for (int k = 0; k < 2; k++) {
        int ws = 0;
        if (waitpid(pids[k], &ws, 0) < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws)) {
            kill(pids[k], SIGKILL);
            if (!status) printf("error child exit %d\n", ws);
            status = 1;
        }
    }
    if (status) printf("error ckptcompat failed\n");
    return status;
}
