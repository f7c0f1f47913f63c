/*
 * A checkpoint controller over the libcuda double, as the shim will be one: for process <pid>,
 * each verb in order, printing one line each.
 *   lock:<ms>   cuCheckpointProcessLock with timeoutMs <ms>   → "lock rc=<r>"
 *   checkpoint  cuCheckpointProcessCheckpoint                 → "checkpoint rc=<r>"
 *   restore     cuCheckpointProcessRestore                    → "restore rc=<r>"
 *   unlock      cuCheckpointProcessUnlock                     → "unlock rc=<r>"
 *   state       cuCheckpointProcessGetState                   → "state rc=<r> <state>"
 *   bytes       the double's side channel                     → "bytes device=<d> host=<h>"
 *   gpu         the device its memory is on (side channel)    → "gpu <index>"
 *   restore:<i>:<j>  cuCheckpointProcessRestore with GPU pairs naming every fake GPU
 *               (FAKE_CUDA_GPUS): i → j, j → i, the rest onto themselves → "restore rc=<r>"
 *   restore-one:<i>:<j>  with the one pair i → j                 → "restore rc=<r>"
 *   nvml        GPU 0's memory in use as libnvidia-ml.so.1 reports it (the NVML double, with
 *               FAKE_NVML_CUDA_DIR: what the libcuda double's processes hold); nvml:<i> GPU i's
 *                                                             → "nvml rc=<r> used=<bytes>"
 *   sleep:<ms>  waits                                         → nothing
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../gpu/ckpt_args.h"
#include "ckpt_page.h"

typedef int CUresult;
CUresult cuInit(unsigned int flags);
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
CUresult cuCheckpointProcessCheckpoint(int pid, void *args);
CUresult cuCheckpointProcessRestore(int pid, void *args);
CUresult cuCheckpointProcessUnlock(int pid, void *args);
CUresult cuCheckpointProcessGetState(int pid, int *state);
int fake_cuda_ckpt_bytes(int pid, long long *device, long long *host);
int fake_cuda_ckpt_gpu(int pid);


typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

/* GPU `index`'s memory in use through libnvidia-ml.so.1, loaded now; rc -1 when it cannot be. */
static void nvml_used(unsigned index) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    int (*init)(void) = h ? (int (*)(void))dlsym(h, "nvmlInit_v2") : NULL;
    int (*get)(unsigned, void **) =
        h ? (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    int (*info)(void *, nvmlMemory_v2_t *) =
        h ? (int (*)(void *, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2") : NULL;
    if (!init || !get || !info) {
        printf("nvml rc=-1 used=0\n");
        return;
    }
    void *dev = NULL;
    nvmlMemory_v2_t m = {0};
    m.version = (unsigned)sizeof m | 2u << 24;
    int r = init();
    if (r == 0) r = get(index, &dev);
    if (r == 0) r = info(dev, &m);
    printf("nvml rc=%d used=%llu\n", r, m.used);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: ckpt_ctl <pid> <verb>...\n");
        return 2;
    }
    int pid = atoi(argv[1]);
    for (int i = 2; i < argc; i++) {
        const char *v = argv[i];
        if (strncmp(v, "lock:", 5) == 0) {
            CUcheckpointLockArgs a = {0};
            a.timeoutMs = (unsigned)atoi(v + 5);
            printf("lock rc=%d\n", cuCheckpointProcessLock(pid, &a));
        } else if (strcmp(v, "checkpoint") == 0) {
            printf("checkpoint rc=%d\n", cuCheckpointProcessCheckpoint(pid, NULL));
        } else if (strncmp(v, "restore:", 8) == 0 || strncmp(v, "restore-one:", 12) == 0) {
            int one = v[7] == '-';
            const char *from = strchr(v, ':') + 1, *to = strchr(from, ':');
            int i = atoi(from), j = to ? atoi(to + 1) : 0;
            const char *n = getenv("FAKE_CUDA_GPUS");
            int gpus = one ? 1 : (n ? atoi(n) : 1);
            if (gpus < 1 || gpus > 8) gpus = 1;
            CUcheckpointGpuPair pairs[8];
            CUcheckpointRestoreArgs a = {0};
            for (int d = 0; d < gpus; d++) {
                int src = one ? i : d;
                fake_gpu_uuid(src, pairs[d].oldUuid);
                fake_gpu_uuid(src == i ? j : src == j ? i : src, pairs[d].newUuid);
            }
            a.gpuPairs = pairs;
            a.gpuPairsCount = (unsigned)gpus;
            printf("restore rc=%d\n", cuCheckpointProcessRestore(pid, &a));
        } else if (strcmp(v, "gpu") == 0) {
            printf("gpu %d\n", fake_cuda_ckpt_gpu(pid));
        } else if (strcmp(v, "restore") == 0) {
            printf("restore rc=%d\n", cuCheckpointProcessRestore(pid, NULL));
        } else if (strcmp(v, "unlock") == 0) {
            printf("unlock rc=%d\n", cuCheckpointProcessUnlock(pid, NULL));
        } else if (strcmp(v, "state") == 0) {
            int s = -1;
            CUresult r = cuCheckpointProcessGetState(pid, &s);
            printf("state rc=%d %d\n", r, s);
        } else if (strcmp(v, "bytes") == 0) {
            long long d = -1, h = -1;
            fake_cuda_ckpt_bytes(pid, &d, &h);
            printf("bytes device=%lld host=%lld\n", d, h);
        } else if (strncmp(v, "nvml:", 5) == 0) {
            nvml_used((unsigned)atoi(v + 5));
        } else if (strcmp(v, "nvml") == 0) {
            nvml_used(0);
        } else if (strncmp(v, "sleep:", 6) == 0) {
            usleep((useconds_t)atoi(v + 6) * 1000);
        } else {
            fprintf(stderr, "unknown verb %s\n", v);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
