/*
 * The libcuda double's checkpoint page (cuda.c publishes one per process that initialised it,
 * fake-cuda-ckpt-<pid> in FAKE_CUDA_CKPT_DIR), read by the NVML double too (nvml.c's
 * FAKE_NVML_CUDA_DIR): one layout for both.
 */
#ifndef FAKE_CKPT_PAGE_H
#define FAKE_CKPT_PAGE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    /* The device its memory is on (the last one it retained a context on; a restore with GPU
     * pairs moves it). */
    int gpu;
} ckpt_page;

/* Fake GPU `index`'s UUID as the driver's 16 bytes: the NVML double's nvmlDeviceGetUUID string
 * for it ("GPU-fa4e0000-0000-4000-8000-00000000000<index>") read as hex, so that a controller
 * that pairs NVML's UUIDs names the libcuda double's devices. */
static inline void fake_gpu_uuid(int index, unsigned char u[16]) {
    static const unsigned char base[16] = {0xfa, 0x4e, 0, 0, 0, 0, 0x40, 0, 0x80, 0};
    memcpy(u, base, 16);
    u[15] = (unsigned char)index;
}

/* Field 22 of /proc/<pid>/stat (the start time, in clock ticks since boot), or -1 when the
 * process is gone: what a page's `started` holds, and what a reader checks it against. */
static inline long long ckpt_start_time(long pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    /* After the name's last ")": each step lands on the space before field 3, 4, … 22. */
    char *p = strrchr(buf, ')');
    for (int field = 3; field <= 22 && p; field++) p = strchr(p + 1, ' ');
    return p ? atoll(p + 1) : -1;
}

#endif
