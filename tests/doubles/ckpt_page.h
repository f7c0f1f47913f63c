/*
 * The libcuda double's checkpoint page (cuda.c publishes one per process that initialised it,
 * fake-cuda-ckpt-<pid> in FAKE_CUDA_CKPT_DIR), read by the NVML double too (nvml.c's
 * FAKE_NVML_CUDA_DIR): one layout for both.
 */
#ifndef FAKE_CKPT_PAGE_H
#define FAKE_CKPT_PAGE_H

typedef struct {
    int state;
    int in_calls;
    long long busy_until_us;
    /* Bytes of its allocations on the device, and moved to the host by a checkpoint. */
    long long device;
    long long host;
    /* The publisher's start time (/proc/<pid>/stat field 22): a page whose pid was reused
     * by another process is stale. */
    long long started;
} ckpt_page;

#endif
