/*
 * The driver's checkpoint API on a real GPU (issue 36 GPU check), the way the shim uses it: a
 * controller process suspends and resumes another process that holds native device memory.
 * Driver API loaded at run time and one kernel as PTX, so no CUDA toolkit is needed:
 *   cc -O2 -o ckptbench ckptbench.c -ldl
 *
 *   ckptbench MIB ROUNDS   forks an application that allocates MIB of native device memory
 *                          (cuMemAlloc), fills it and runs a kernel over it; this process (the
 *                          controller, initialising the driver only after the fork) then, ROUNDS
 *                          times: locks it, checkpoints it, restores it, unlocks it (each timed,
 *                          `lock_ms`, `checkpoint_ms` / `checkpoint_GBps`, `restore_ms` /
 *                          `restore_GBps`, `unlock_ms`; `state_after_checkpoint` as the driver
 *                          reports it), and has the application run the kernel again and check
 *                          every value (`results_wrong`). Compare with uvmbench's prefetch_GBps
 *                          for the same bytes. In the first round, NVML's per-process used
 *                          memory of the application (`nvml_running`, `nvml_checkpointed`,
 *                          `nvml_restored`, from nvidia-smi where it is found): what mqfqd charges
 *                          a container's function, its CUDA context included (issue 36).
 *                          Then, where GPUs 0 and 1 are one model, a round restored onto GPU 1
 *                          by the driver's GPU pairs (`moved_restore_ms` / `_GBps`,
 *                          `nvml_moved`, `moved_results_wrong`); else why not (`moved: ...`).
 *
 * Prints `name value` lines; exits 1 on a wrong result, a failed call or a missing function.
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_api.h"


#include "inc_ptx.h"

/* The application: native memory, filled and incremented once; then one kernel and a check per
 * byte read from `cmd` ('k'), answering each on `ans` with the count of wrong values. */
static int app(void *h, size_t bytes, int cmd, int ans) {
    unsigned n = (unsigned)(bytes / 4);
    CUfunction f;
    CUdeviceptr d;
    if (context_with(PTX, "inc", &f)) return 1;
    unsigned *host = malloc(bytes);
    if (!host) return 1;
    for (unsigned i = 0; i < n; i++) host[i] = i;
    CHECK(cuMemAlloc(&d, bytes));
    CHECK(cuMemcpyHtoD(d, host, bytes));
    CHECK(launch(f, d, n));
    unsigned rounds = 1;
    unsigned wrong = 0;
    if (write(ans, &wrong, sizeof wrong) != sizeof wrong) return 1;
    (void)h;
    char c;
    while (read(cmd, &c, 1) == 1) {
        CHECK(launch(f, d, n));
        rounds++;
        CHECK(cuMemcpyDtoH(host, d, bytes));
        wrong = 0;
        for (unsigned i = 0; i < n; i++)
            if (host[i] != i + rounds) wrong++;
        if (write(ans, &wrong, sizeof wrong) != sizeof wrong) return 1;
    }
    return 0;
}

static void nvml_view(pid_t pid, const char *when);

/* Pairs naming every GPU, 0 and 1 swapped, into `pairs` (at most 16) when the driver has two
 * GPUs of one model as 0 and 1: their count; 0 (said why) when it has not; -1 when it cannot
 * say. */
static int swap_pairs(void *h, CUcheckpointGpuPair *pairs) {
    CUresult (*count)(int *), (*uuid)(unsigned char *, int), (*name)(char *, int, int);
    *(void **)&count = dlsym(h, "cuDeviceGetCount");
    *(void **)&uuid = dlsym(h, "cuDeviceGetUuid_v2");
    *(void **)&name = dlsym(h, "cuDeviceGetName");
    int n = 0;
    if (!count || !uuid || !name || count(&n) || n < 2) {
        printf("moved: one GPU\n");
        return 0;
    }
    if (n > 16) n = 16;
    char a[256], b[256];
    if (name(a, sizeof a, 0) || name(b, sizeof b, 1)) {
        printf("error moved: device names\n");
        return -1;
    }
    if (strcmp(a, b) != 0) {
        printf("moved: GPUs 0 and 1 are different models (%s, %s)\n", a, b);
        return 0;
    }
    for (int d = 0; d < n; d++) {
        int to = d == 0 ? 1 : d == 1 ? 0 : d;
        if (uuid(pairs[d].oldUuid, d) || uuid(pairs[d].newUuid, to)) {
            printf("error moved: device UUIDs\n");
            return -1;
        }
    }
    return n;
}

/* One round onto GPU 1 by the driver's GPU pairs, where the machine has two GPUs of one model:
 * the application's kernel then checks every value on its new GPU. Nonzero on a failure. */
static int moved_round(void *h, pid_t pid, int cmd, int ans, size_t bytes) {
    CUcheckpointGpuPair pairs[16];
    int n = swap_pairs(h, pairs);
    if (n <= 0) return n < 0;
    CUcheckpointLockArgs la = {.timeoutMs = 10000};
    CUresult r = ckLock(pid, &la);
    if (!r) r = ckCheckpoint(pid, NULL);
    if (r) {
        printf("error moved: lock or checkpoint = %d\n", r);
        return 1;
    }
    CUcheckpointRestoreArgs ra;
    memset(&ra, 0, sizeof ra);
    ra.gpuPairs = pairs;
    ra.gpuPairsCount = (unsigned)n;
    double t0 = now_ms();
    r = ckRestore(pid, &ra);
    double t1 = now_ms();
    if (r) {
        /* Said, then restored where it was so that the application ends well. */
        printf("moved: restore with pairs refused = %d\n", r);
        return ckRestore(pid, NULL) || ckUnlock(pid, NULL);
    }
    if ((r = ckUnlock(pid, NULL))) {
        printf("error moved: unlock = %d\n", r);
        return 1;
    }
    printf("moved_restore_ms %.2f\nmoved_restore_GBps %.2f\n", t1 - t0,
           bytes / 1e9 / ((t1 - t0) / 1e3));
    nvml_view(pid, "moved");
    unsigned wrong;
    if (write(cmd, "k", 1) != 1 || read(ans, &wrong, sizeof wrong) != sizeof wrong) {
        printf("error application gone\n");
        return 1;
    }
    printf("moved_results_wrong %u of %zu\n", wrong, bytes / 4);
    return wrong != 0;
}

/* NVML's per-process used memory of `pid` as nvidia-smi lists it, as `nvml_<when> pid, MiB`. */
static void nvml_view(pid_t pid, const char *when) {
    char cmd[240];
    /* awk's status, not a pipeline's last stage's, says whether the pid was listed. */
    snprintf(cmd, sizeof cmd,
             "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null "
             "| awk -F', ' '$1 == %d { print \"nvml_%s \" $0; f = 1 } END { exit !f }'",
             (int)pid, when);
    if (system(cmd) != 0) printf("nvml_%s (pid not listed)\n", when);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: ckptbench MIB ROUNDS\n");
        return 2;
    }
    size_t bytes = (size_t)atol(argv[1]) << 20;
    int rounds = atoi(argv[2]);
    void *h;
    if (load_driver(&h) || load_ckpt_api(h)) return 1;
    int cmd[2], ans[2];
    if (pipe(cmd) || pipe(ans)) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        close(cmd[1]);
        close(ans[0]);
        _exit(app(h, bytes, cmd[0], ans[1]));
    }
    close(cmd[0]);
    close(ans[1]);
    unsigned wrong;
    int status = 1;
    if (read(ans[0], &wrong, sizeof wrong) != sizeof wrong) {
        printf("error application did not start\n");
        goto out;
    }
    /* The controller's driver, initialised after the fork (restore needs it, or persistence). */
    CUresult init = cuInit(0);
    printf("controller_init %d\n", init);
    double gb = bytes / 1e9;
    for (int k = 0; k < rounds; k++) {
        if (k == 0) nvml_view(pid, "running");
        CUcheckpointLockArgs la = {.timeoutMs = 10000};
        double t0 = now_ms();
        CUresult r = ckLock(pid, &la);
        double t1 = now_ms();
        if (r) {
            printf("error lock = %d\n", r);
            goto out;
        }
        printf("lock_ms %.2f\n", t1 - t0);
        t0 = now_ms();
        r = ckCheckpoint(pid, NULL);
        t1 = now_ms();
        if (r) {
            printf("error checkpoint = %d\n", r);
            goto out;
        }
        printf("checkpoint_ms %.2f\ncheckpoint_GBps %.2f\n", t1 - t0, gb / ((t1 - t0) / 1e3));
        int st = -1;
        ckState(pid, &st);
        printf("state_after_checkpoint %d\n", st);
        if (k == 0) nvml_view(pid, "checkpointed");
        t0 = now_ms();
        r = ckRestore(pid, NULL);
        t1 = now_ms();
        if (r) {
            printf("error restore = %d\n", r);
            goto out;
        }
        printf("restore_ms %.2f\nrestore_GBps %.2f\n", t1 - t0, gb / ((t1 - t0) / 1e3));
        t0 = now_ms();
        r = ckUnlock(pid, NULL);
        t1 = now_ms();
        if (r) {
            printf("error unlock = %d\n", r);
            goto out;
        }
        printf("unlock_ms %.2f\n", t1 - t0);
        if (k == 0) nvml_view(pid, "restored");
        if (write(cmd[1], "k", 1) != 1 || read(ans[0], &wrong, sizeof wrong) != sizeof wrong) {
            printf("error application gone\n");
            goto out;
        }
        printf("results_wrong %u of %zu\n", wrong, bytes / 4);
        if (wrong) goto out;
    }
    if (moved_round(h, pid, cmd[1], ans[0], bytes)) goto out;
    status = 0;
out:
    close(cmd[1]);
    int ws = 0;
    if (waitpid(pid, &ws, 0) < 0 || !WIFEXITED(ws) || WEXITSTATUS(ws)) {
        kill(pid, SIGKILL);
        if (status == 0) printf("error application exit %d\n", ws);
        status = 1;
    }
    return status;
}
