/*
 * The driver's checkpoint API as the GPU check's controllers call it (ckptbench, ckptcompat):
 * the five calls, looked up at run time from the loaded driver.
 */
#ifndef MQFQ_CKPT_API_H
#define MQFQ_CKPT_API_H

#include "ckpt_args.h"
#include "drvapi.h"

static CUresult (*ckLock)(int, CUcheckpointLockArgs *);
static CUresult (*ckCheckpoint)(int, void *);
static CUresult (*ckRestore)(int, void *);
static CUresult (*ckUnlock)(int, void *);
static CUresult (*ckState)(int, int *);

/* Looks the five calls up in `h`; 1 (said on stdout) when one is missing. */
static inline int load_ckpt_api(void *h) {
    LOAD(h, ckLock, "cuCheckpointProcessLock");
    LOAD(h, ckCheckpoint, "cuCheckpointProcessCheckpoint");
    LOAD(h, ckRestore, "cuCheckpointProcessRestore");
    LOAD(h, ckUnlock, "cuCheckpointProcessUnlock");
    LOAD(h, ckState, "cuCheckpointProcessGetState");
    return 0;
}

#endif
