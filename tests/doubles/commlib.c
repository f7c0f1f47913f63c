/*
 * A communication library's double, built as libnccl.so.2: it allocates a buffer of its own and
 * registers it as NCCL, UCX or MPI do for their transports — a legacy IPC handle for peers on the
 * node, and the pointer attributes they branch on. The interposer must leave such buffers native
 * (allocation-site rule) and tell such a library the truth about converted memory.
 */
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { char bytes[64]; } CUipcMemHandle;
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);

/* Allocates and registers a buffer: the allocation's rc, the export's rc and the IPC-capable
 * attribute, in out[0..3]; the buffer in *p. */
void commlib_register(size_t size, CUdeviceptr *p, int out[3]) {
    CUipcMemHandle h;
    unsigned char capable = 0;
    out[0] = cuMemAlloc_v2(p, size);
    out[1] = out[0] ? -1 : cuIpcGetMemHandle(&h, *p);
    out[2] = cuPointerGetAttribute(&capable, 10, *p) == 0 ? capable : -1;
}

/* Whether this library sees `p` as managed memory (CU_POINTER_ATTRIBUTE_IS_MANAGED, into an
 * unsigned int as UCX reads it); -1 on error. */
int commlib_is_managed(CUdeviceptr p) {
    unsigned int managed = 0;
    return cuPointerGetAttribute(&managed, 8, p) == 0 ? (int)managed : -1;
}
