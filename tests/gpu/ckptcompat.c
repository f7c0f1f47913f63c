/*
 * What the interposer's `uvm` backend refuses, across the driver's checkpoint API (issue 36's GPU
 * check): CUDA IPC and a graph capture left open while another process suspends and resumes the
 * application, as the shim does under `checkpoint`. NVIDIA's cuda-checkpoint README says r570
 * "does not support UVM or IPC memory": this says what the driver in hand does. Driver API
 * loaded at run time, one kernel as PTX, so no CUDA toolkit is needed:
 *   cc -O2 -o ckptcompat ckptcompat.c -ldl
 *
 *   ckptcompat   forks five applications, then initialises the driver (the controller), and
 *                runs three rounds, one property each, so that a refusal is pinned on it:
 *   ipc_*        an exporter allocates 1 MiB of native memory (word i = i) and exports it
 *                (`ipc_export rc`); the controller locks, checkpoints, restores and unlocks it
 *                (`ipc_lock rc`, `ipc_checkpoint rc`, `ipc_state_after_checkpoint`,
 *                `ipc_restore rc`, `ipc_unlock rc`); then an importer opens the handle
 *                (`ipc_import rc`, `ipc_import_words 0 1 2` expected), writes 777 into word 0,
 *                the exporter reads it (`ipc_exporter_sees`), the importer closes it
 *                (`ipc_import_close rc`).
 *   ipc_live_*   the same pair with the mapping opened first: both locked, checkpointed,
 *                restored and unlocked together (two lines each), then the write and the read
 *                (what r570 is documented not to support).
 *   capture_*    a capturer fills 1 MiB the same way and begins a stream capture (global mode)
 *                holding one `inc` kernel, left open (`capture_begin rc`); lock ... unlock as
 *                above; then it ends the capture, instantiates and launches the graph
 *                (`capture_end rc`, `capture_graph_launch rc`, `capture_results_wrong N`: every
 *                word must be i + 1).
 * Every answer is awaited 15 s at most, and a lock 10 s.
 * A round that fails says `error <round> ...` and the other still runs; a process left locked
 * or checkpointed is restored and unlocked before it is killed (killing a locked process has
 * been reported to hang). Exits 0 when every round held, 1 otherwise.
 */
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt_api.h"
#include "inc_ptx.h"

typedef void *CUstream;
typedef void *CUgraph;
typedef void *CUgraphExec;
typedef struct {
    char bytes[64];
} CUipcMemHandle;

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

/* What an application answers: up to four figures and, from the exporter, its handle. */
typedef struct {
    int v[4];
    CUipcMemHandle h;
} Answer;

static int say(int fd, int a, int b, int c, int d, const CUipcMemHandle *h) {
    Answer x;
    memset(&x, 0, sizeof x);
    x.v[0] = a, x.v[1] = b, x.v[2] = c, x.v[3] = d;
    if (h) x.h = *h;
    return write(fd, &x, sizeof x) == sizeof x ? 0 : 1;
}

/* A context on GPU 0 with the `inc` kernel loaded, and 1 MiB of native memory, word i = i. */
static int setup(CUfunction *f, CUdeviceptr *p, unsigned *host) {
    if (context_with(PTX, "inc", f)) return 1;
    if (!p) return 0;
    for (unsigned i = 0; i < WORDS; i++) host[i] = i;
    CHECK(cuMemAlloc(p, WORDS * 4));
    CHECK(cuMemcpyHtoD(*p, host, WORDS * 4));
    return 0;
}

static unsigned host[WORDS];

/* The exporter: answers (export rc, handle), then (read rc, word 0) per command. */
static int exporter(int cmd, int ans) {
    CUfunction f;
    CUdeviceptr p;
    if (setup(&f, &p, host)) return 1;
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    int exported = cuIpcGetMemHandle(&h, p);
    if (say(ans, exported, 0, 0, 0, &h)) return 1;
    char c;
    while (read(cmd, &c, 1) == 1) {
        unsigned w = 0;
        int r = cuMemcpyDtoH(&w, p, sizeof w);
        if (say(ans, r, (int)w, 0, 0, NULL)) return 1;
    }
    return 0;
}

/* The importer: reads the handle, opens it and reads three words: (open rc, word 0, word 1,
 * word 2); then per command, 'w' writes 777 into the first word: (rc), 'c' closes it: (rc). */
static int importer(int cmd, int ans) {
    CUipcMemHandle h;
    if (read(cmd, &h, sizeof h) != sizeof h) return 0;
    CUfunction f;
    if (setup(&f, NULL, NULL)) return 1;
    CUdeviceptr p = 0;
    unsigned w[3] = {0, 0, 0}, v = 777;
    int r = cuIpcOpenMemHandle(&p, h, 1 /* lazy peer access */);
    if (!r) r = cuMemcpyDtoH(w, p, sizeof w);
    if (say(ans, r, (int)w[0], (int)w[1], (int)w[2], NULL)) return 1;
    char c;
    while (read(cmd, &c, 1) == 1) {
        int rc = r;
        if (!r && c == 'w') {
            rc = cuMemcpyHtoD(p, &v, sizeof v);
            if (!rc) rc = cuCtxSynchronize();
        } else if (!r) {
            rc = cuIpcCloseMemHandle(p);
        }
        if (say(ans, rc, 0, 0, 0, NULL)) return 1;
    }
    return 0;
}

/* The capturer: answers (begin rc) with a capture open; on a command ends it and launches the
 * graph: (end rc, launch rc, wrong words). */
static int capturer(int cmd, int ans) {
    CUfunction f;
    CUdeviceptr p;
    if (setup(&f, &p, host)) return 1;
    CUstream s = NULL;
    unsigned n = WORDS;
    void *args[] = {&p, &n};
    int begun = cuStreamCreate(&s, 1 /* non-blocking */);
    if (!begun) begun = cuStreamBeginCapture(s, 0 /* global */);
    if (!begun) begun = cuLaunchKernel(f, WORDS / 256, 1, 1, 256, 1, 1, 0, s, args, NULL);
    if (say(ans, begun, 0, 0, 0, NULL)) return 1;
    char c;
    if (read(cmd, &c, 1) != 1) return 0;
    CUgraph g = NULL;
    CUgraphExec e = NULL;
    int end = cuStreamEndCapture(s, &g), launched = -1, wrong = -1;
    if (!end) launched = cuGraphInstantiate(&e, g, 0);
    if (!end && !launched) launched = cuGraphLaunch(e, s);
    if (!end && !launched && !cuStreamSynchronize(s) && !cuMemcpyDtoH(host, p, WORDS * 4)) {
        wrong = 0;
        for (unsigned i = 0; i < WORDS; i++) wrong += host[i] != i + 1;
    }
    return say(ans, end, launched, wrong, 0, NULL);
}

/* A forked application: its pid and the controller's ends of its two pipes. */
typedef struct {
    pid_t pid;
    int cmd, ans;
} App;

/* Forks `body` with only its own pipe ends open (so that the controller closing its command
 * pipe is an end of file it sees, whatever else was forked). */
static App spawn(int (*body)(int, int)) {
    App a = {-1, -1, -1};
    int c[2] = {-1, -1}, r[2] = {-1, -1};
    if (pipe(c) || pipe(r) || (a.pid = fork()) < 0) {
        for (int k = 0; k < 2; k++) {
            if (c[k] >= 0) close(c[k]);
            if (r[k] >= 0) close(r[k]);
        }
        a.pid = -1;
        return a;
    }
    if (a.pid == 0) {
        for (int fd = 3; fd < 1024; fd++)
            if (fd != c[0] && fd != r[1]) close(fd);
        _exit(body(c[0], r[1]));
    }
    close(c[0]);
    close(r[1]);
    a.cmd = c[1];
    a.ans = r[0];
    return a;
}

/* Sends command `c` (none: 0) and reads the answer, within 15 s; nonzero when none came. */
static int ask(const App *a, char c, Answer *x) {
    if (c && write(a->cmd, &c, 1) != 1) return 1;
    struct pollfd p = {.fd = a->ans, .events = POLLIN};
    return poll(&p, 1, 15000) != 1 || read(a->ans, x, sizeof *x) != sizeof *x;
}

/* Lock every one of `pids`, then checkpoint, restore and unlock each (as the shim does a
 * container's processes), each answer printed under `round`; on a failure each process is
 * brought back to running as far as the driver lets it, and 1 is returned. */
static int suspend_resume(const char *round, const pid_t *pids, int n) {
    CUresult r = 0;
    CUcheckpointLockArgs la = {.timeoutMs = 10000};
    for (int k = 0; k < n && !r; k++) printf("%s_lock rc %d\n", round, r = ckLock(pids[k], &la));
    for (int k = 0; k < n && !r; k++) {
        printf("%s_checkpoint rc %d\n", round, r = ckCheckpoint(pids[k], NULL));
        int st = -1;
        ckState(pids[k], &st);
        if (!r) printf("%s_state_after_checkpoint %d\n", round, st);
    }
    for (int k = 0; k < n && !r; k++) printf("%s_restore rc %d\n", round, r = ckRestore(pids[k], NULL));
    for (int k = 0; k < n && !r; k++) printf("%s_unlock rc %d\n", round, r = ckUnlock(pids[k], NULL));
    if (!r) return 0;
    for (int k = 0; k < n; k++) {
        int st = -1;
        ckState(pids[k], &st);
        printf("error %s: suspend and resume failed; pid %d's driver state %d\n", round,
               (int)pids[k], st);
        if (st == 2) ckRestore(pids[k], NULL); /* checkpointed */
        if (st == 1 || st == 2) ckUnlock(pids[k], NULL);
    }
    return 1;
}

/* An IPC pair across a checkpoint under `round`: the importer opens the exporter's memory
 * after the exporter was suspended and resumed (`live` 0), or before, both then suspended and
 * resumed together with the mapping open (`live` 1: what r570 is documented not to support). */
static int round_ipc(const char *round, const App *ex, const App *im, int live) {
    Answer x;
    if (ask(ex, 0, &x)) return printf("error %s: the exporter is gone\n", round), 1;
    printf("%s_export rc %d\n", round, x.v[0]);
    if (x.v[0]) return printf("error %s: no export\n", round), 1;
    CUipcMemHandle h = x.h;
    pid_t both[2] = {ex->pid, im->pid};
    if (!live && suspend_resume(round, both, 1)) return 1;
    if (write(im->cmd, &h, sizeof h) != sizeof h || ask(im, 0, &x))
        return printf("error %s: the importer is gone\n", round), 1;
    printf("%s_import rc %d\n%s_import_words %d %d %d\n", round, x.v[0], round, x.v[1], x.v[2],
           x.v[3]);
    if (x.v[0]) return printf("error %s: import failed\n", round), 1;
    if (live && suspend_resume(round, both, 2)) return 1;
    if (ask(im, 'w', &x) || x.v[0]) return printf("error %s: the importer's write failed\n", round), 1;
    if (ask(ex, 'r', &x)) return printf("error %s: the exporter is gone\n", round), 1;
    printf("%s_exporter_sees %d\n", round, x.v[1]);
    int wrong = x.v[0] || x.v[1] != 777;
    if (ask(im, 'c', &x)) return printf("error %s: the importer is gone\n", round), 1;
    printf("%s_import_close rc %d\n", round, x.v[0]);
    return wrong || x.v[0] ? printf("error %s: the memory was not shared\n", round), 1 : 0;
}

static int round_capture(const App *cap) {
    Answer x;
    if (ask(cap, 0, &x)) return printf("error capture: the capturer is gone\n"), 1;
    printf("capture_begin rc %d\n", x.v[0]);
    if (x.v[0]) return printf("error capture: no capture\n"), 1;
    if (suspend_resume("capture", &cap->pid, 1)) return 1;
    if (ask(cap, 'g', &x)) return printf("error capture: the capturer is gone\n"), 1;
    printf("capture_end rc %d\ncapture_graph_launch rc %d\ncapture_results_wrong %d of %u\n",
           x.v[0], x.v[1], x.v[2], WORDS);
    return x.v[0] || x.v[1] || x.v[2] ? printf("error capture: the graph failed\n"), 1 : 0;
}

/* Waits up to 10 s for `a` to exit well; kills it otherwise. Nonzero when it did not. */
static int reap(const App *a) {
    close(a->cmd);
    for (int i = 0; i < 100; i++) {
        int ws = 0;
        pid_t r = waitpid(a->pid, &ws, WNOHANG);
        if (r == a->pid) return !WIFEXITED(ws) || WEXITSTATUS(ws);
        if (r < 0) return 1;
        usleep(100000);
    }
    kill(a->pid, SIGKILL);
    waitpid(a->pid, NULL, 0);
    printf("error pid %d did not exit: killed\n", (int)a->pid);
    return 1;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *h;
    if (load_driver(&h) || load_ckpt_api(h)) return 1;
    LOAD(h, cuStreamCreate, "cuStreamCreate");
    LOAD(h, cuStreamSynchronize, "cuStreamSynchronize");
    LOAD(h, cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    LOAD(h, cuStreamEndCapture, "cuStreamEndCapture");
    LOAD(h, cuGraphInstantiate, "cuGraphInstantiateWithFlags");
    LOAD(h, cuGraphLaunch, "cuGraphLaunch");
    LOAD(h, cuIpcGetMemHandle, "cuIpcGetMemHandle");
    LOAD(h, cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2");
    LOAD(h, cuIpcCloseMemHandle, "cuIpcCloseMemHandle");
    /* Every application before the controller's driver starts: a forked CUDA process is unusable. */
    signal(SIGPIPE, SIG_IGN); /* a child gone is an error said, not the controller's end */
    App apps[5] = {spawn(exporter), spawn(importer), spawn(exporter), spawn(importer),
                   spawn(capturer)};
    int failed = 0;
    for (int k = 0; k < 5; k++) failed |= apps[k].pid < 0;
    if (failed) printf("error fork\n");
    if (!failed) {
        printf("controller_init %d\n", cuInit(0));
        failed |= round_ipc("ipc", &apps[0], &apps[1], 0);
        failed |= round_ipc("ipc_live", &apps[2], &apps[3], 1);
        failed |= round_capture(&apps[4]);
    }
    for (int k = 0; k < 5; k++)
        if (apps[k].pid > 0) failed |= reap(&apps[k]);
    if (failed) printf("error ckptcompat: a round failed\n");
    return failed;
}
