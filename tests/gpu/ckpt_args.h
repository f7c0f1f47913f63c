/*
 * The driver's checkpoint API argument structs (cuda.h, CUDA 12.8 and later), for the GPU check's
 * checkpoint program and the libcuda double that implements the API: one layout for both.
 */
#ifndef MQFQ_CKPT_ARGS_H
#define MQFQ_CKPT_ARGS_H

/* cuCheckpointProcessLock's: a timeout (0: none), then reserved words. */
typedef struct {
    unsigned int timeoutMs;
    unsigned int reserved0;
    unsigned long long reserved1[7];
} CUcheckpointLockArgs;

/* A GPU a process was checkpointed on and the one to restore it onto, by UUID. */
typedef struct {
    unsigned char oldUuid[16], newUuid[16];
} CUcheckpointGpuPair;

/* cuCheckpointProcessRestore's: the pairs (none: where it was), reserved bytes and a word. */
typedef struct {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    char reserved[52 - sizeof(CUcheckpointGpuPair *)];
    unsigned long long reserved1;
} CUcheckpointRestoreArgs;

#endif
