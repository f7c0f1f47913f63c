/*
 * The interposer on a real GPU (issue 6 GPU check). Driver API loaded at run time and one
 * kernel as PTX (JIT-compiled by the driver), so no CUDA toolkit is needed to build:
 *   cc -O2 -o uvmbench uvmbench.c -ldl
 *
 *   uvmbench baseline MIB   pinned cuMemcpy HtoD / DtoH bandwidth into native device memory
 *   uvmbench uvm MIB        run under the interposer (LD_PRELOAD, MQFQ_CTL_DIR): fill, kernel,
 *                           evict and prefetch through its own control socket (timed), NVML's
 *                           per-process view after each, kernel again, check every value; hot
 *                           and warm restore: a kernel when resident vs prefetch + kernel
 *   uvmbench oversub MIB PASSES  no interposer: MIB of managed memory written on the host, then
 *                           PASSES kernels over all of it, each timed (`pass_ms`); the first
 *                           faults every page in on demand (`fault_GBps`: fault-driven
 *                           migration's rate, against pinned cuMemcpy's); run two at once on a
 *                           GPU that cannot hold both to see them thrash
 *   uvmbench hold MIB SECONDS  holds MIB of native device memory for SECONDS (shrinks the GPU
 *                           for the oversubscription runs), printing `holding` once it does
 *
 * Prints `name value` lines; exits 1 on a wrong result or a missing driver function.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "drvapi.h"


static CUresult (*cuMemAllocHost)(void **, size_t);
static CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);

#include "inc_ptx.h"
/* One command to this process's own interposer control socket; returns the reply. */
static int ctl(const char *cmd, char *reply, size_t cap) {
    const char *dir = getenv("MQFQ_CTL_DIR");
    if (!dir) return -1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/cuda-%d.sock", dir, (int)getpid());
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
    char out[128];
    const char *id = getenv("MQFQ_CONTAINER_ID");
    int n = snprintf(out, sizeof out, "hello %s\n%s\n", id ? id : "bench", cmd);
    if (write(fd, out, n) != n) return -1;
    size_t got = 0;
    int lines = 0;
    while (lines < 2 && got + 1 < cap) {
        ssize_t k = read(fd, reply + got, 1);
        if (k <= 0) break;
        if (reply[got] == '\n') lines++;
        got++;
    }
    reply[got] = 0;
    close(fd);
    return lines == 2 ? 0 : -1;
}

static void nvml_view(const char *when) {
    char cmd[240];
    /* awk's status, not a pipeline's last stage's, says whether the pid was listed. */
    snprintf(cmd, sizeof cmd,
             "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null "
             "| awk -F', ' '$1 == %d { print \"nvml_%s \" $0; f = 1 } END { exit !f }'",
             (int)getpid(), when);
    if (system(cmd) != 0) printf("nvml_%s (this pid not listed)\n", when);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: uvmbench baseline|uvm|oversub|hold MIB [PASSES|SECONDS]\n");
        return 2;
    }
    size_t bytes = (size_t)atol(argv[2]) << 20;
    unsigned n = (unsigned)(bytes / 4);
    void *h;
    if (load_driver(&h)) return 1;
    LOAD(h, cuMemAllocHost, "cuMemAllocHost_v2");
    int dev;
    CUcontext ctx;
    double t0, t1;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    if (strcmp(argv[1], "hold") == 0) {
        CUdeviceptr held;
        CHECK(cuMemAlloc(&held, bytes));
        printf("holding %zu MiB\n", bytes >> 20);
        sleep(argc > 3 ? (unsigned)atoi(argv[3]) : 60);
        return 0;
    }
    if (strcmp(argv[1], "oversub") == 0) {
        LOAD(h, cuMemAllocManaged, "cuMemAllocManaged");
        int passes = argc > 3 ? atoi(argv[3]) : 5;
        CUdeviceptr mm;
        CUmodule m;
        CUfunction f;
        CHECK(cuModuleLoadData(&m, PTX));
        CHECK(cuModuleGetFunction(&f, m, "inc"));
        CHECK(cuMemAllocManaged(&mm, bytes, 1 /* CU_MEM_ATTACH_GLOBAL */));
        unsigned *p = (unsigned *)(uintptr_t)mm;
        for (unsigned i = 0; i < n; i++) p[i] = i; /* on the host: every page starts there */
        for (int k = 0; k < passes; k++) {
            t0 = now_ms();
            CHECK(launch(f, mm, n));
            t1 = now_ms();
            printf("pass_ms %d %.2f\n", k, t1 - t0);
            if (k == 0) printf("fault_GBps %.2f\n", bytes / ((t1 - t0) / 1e3) / 1e9);
        }
        unsigned bad = 0;
        for (unsigned i = 0; i < n; i++)
            if (p[i] != i + (unsigned)passes) bad++;
        printf("results_wrong %u of %u\n", bad, n);
        return bad ? 1 : 0;
    }
    unsigned *host;
    CHECK(cuMemAllocHost((void **)&host, bytes));
    for (unsigned i = 0; i < n; i++) host[i] = i;
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, bytes));

    if (strcmp(argv[1], "baseline") == 0) {
        for (int rep = 0; rep < 3; rep++) {
            t0 = now_ms();
            CHECK(cuMemcpyHtoD(d, host, bytes));
            t1 = now_ms();
            printf("pinned_htod_GBps %.2f\n", bytes / ((t1 - t0) / 1e3) / 1e9);
            t0 = now_ms();
            CHECK(cuMemcpyDtoH(host, d, bytes));
            t1 = now_ms();
            printf("pinned_dtoh_GBps %.2f\n", bytes / ((t1 - t0) / 1e3) / 1e9);
        }
        return 0;
    }

    char reply[256];
    CUmodule m;
    CUfunction f;
    CHECK(cuModuleLoadData(&m, PTX));
    CHECK(cuModuleGetFunction(&f, m, "inc"));
    CHECK(cuMemcpyHtoD(d, host, bytes));
    CHECK(launch(f, d, n));
    if (ctl("status", reply, sizeof reply) != 0) {
        printf("no control socket (run under the interposer with MQFQ_CTL_DIR)\n");
        return 1;
    }
    printf("status_before %s", strchr(reply, '\n') + 1);
    nvml_view("resident");
    /* Hot: a kernel on resident memory. */
    t0 = now_ms();
    CHECK(launch(f, d, n));
    t1 = now_ms();
    printf("hot_kernel_ms %.3f\n", t1 - t0);
    for (int rep = 0; rep < 3; rep++) {
        t0 = now_ms();
        if (ctl("evict", reply, sizeof reply) != 0) return 1;
        t1 = now_ms();
        printf("evict_ms %.2f evict_GBps %.2f reply %s", t1 - t0, bytes / ((t1 - t0) / 1e3) / 1e9,
               strchr(reply, '\n') + 1);
        if (rep == 0) nvml_view("evicted");
        /* Warm: bring the memory back, then the same kernel. */
        t0 = now_ms();
        if (ctl("prefetch", reply, sizeof reply) != 0) return 1;
        double tp = now_ms();
        CHECK(launch(f, d, n));
        t1 = now_ms();
        printf("prefetch_ms %.2f prefetch_GBps %.2f warm_restore_ms %.2f reply %s", tp - t0,
               bytes / ((tp - t0) / 1e3) / 1e9, t1 - t0, strchr(reply, '\n') + 1);
    }
    nvml_view("prefetched");
    /* Fill, 2 + 3 increments: every value must be i + 5. */
    CHECK(cuMemcpyDtoH(host, d, bytes));
    unsigned bad = 0;
    for (unsigned i = 0; i < n; i++)
        if (host[i] != i + 5) bad++;
    printf("results_wrong %u of %u\n", bad, n);
    return bad ? 1 : 0;
}
