//! GPU memory shared with other processes: CUDA IPC opens, VMM and memory-pool exports and
//! imports. Each the driver grants is counted (`shared=` in the control socket's status; legacy
//! IPC and dma-buf exports are counted in `compat`), because the driver's checkpoint does not
//! support such memory (r570: "does not support UVM or IPC memory") and the shim must never
//! hand a process that has any to it. Nothing here changes what the application gets.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use crate::real::{self, Fn};
use crate::{CUDA_SUCCESS, CuDevicePtr, CuResult, guard, state};

/// `cudaIpcMemHandle_t`'s bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle([u8; 64]);

type IpcOpenMemHandleFn = unsafe extern "C" fn(*mut CuDevicePtr, IpcHandle, c_uint) -> CuResult;
type MemExportFn = unsafe extern "C" fn(*mut c_void, c_ulonglong, c_int, c_ulonglong) -> CuResult;
type MemImportFn = unsafe extern "C" fn(*mut c_ulonglong, *mut c_void, c_int) -> CuResult;
type PoolExportFn = unsafe extern "C" fn(*mut c_void, *mut c_void, c_int, c_ulonglong) -> CuResult;
type PoolImportFn =
    unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_int, c_ulonglong) -> CuResult;
type PoolExportPointerFn = unsafe extern "C" fn(*mut c_void, CuDevicePtr) -> CuResult;
type PoolImportPointerFn =
    unsafe extern "C" fn(*mut CuDevicePtr, *mut c_void, *mut c_void) -> CuResult;

/// The driver's answer to `call`: under way from before the driver is called, counted as shared
/// memory when it granted it.
pub(crate) fn counted(call: impl FnOnce() -> Option<CuResult>) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        state::sharing_begins();
        let r = call();
        state::sharing_ends(r == Some(CUDA_SUCCESS));
        r.unwrap_or(real::NOT_FOUND)
    })
}

/// The lookups of `cuIpcOpenMemHandle` by its name before CUDA 11 (`dlsym`, and
/// `cuGetProcAddress` for an older version): its own wrapper, the driver's `found` remembered.
pub fn ipc_open_v1(found: *mut c_void) -> *mut c_void {
    let ours = cuIpcOpenMemHandle as IpcOpenMemHandleFn as *mut c_void;
    if found != ours {
        real::remember(Fn::IpcOpenMemHandleV1, found);
    }
    ours
}

/// The first CUDA version whose `cuIpcOpenMemHandle` is `cuIpcOpenMemHandle_v2`.
pub const IPC_OPEN_V2: c_int = 11000;

/// `cuIpcOpenMemHandle_v2`: another process's memory opened here.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    pdptr: *mut CuDevicePtr,
    handle: IpcHandle,
    flags: c_uint,
) -> CuResult {
    counted(|| {
        let f = real::get::<IpcOpenMemHandleFn>(Fn::IpcOpenMemHandle)?;
        // SAFETY: forwarding the caller's arguments.
        Some(unsafe { f(pdptr, handle, flags) })
    })
}

/// `cuIpcOpenMemHandle`, the name before CUDA 11 (the same arguments): exported for callers
/// linked to it, and handed out for lookups of that name ([`ipc_open_v1`]).
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuIpcOpenMemHandle(
    pdptr: *mut CuDevicePtr,
    handle: IpcHandle,
    flags: c_uint,
) -> CuResult {
    counted(|| {
        let f = real::get::<IpcOpenMemHandleFn>(Fn::IpcOpenMemHandleV1)?;
        // SAFETY: forwarding the caller's arguments.
        Some(unsafe { f(pdptr, handle, flags) })
    })
}

/// `cuMemExportToShareableHandle`: a VMM allocation exported (a file descriptor or a fabric
/// handle another process imports).
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    out: *mut c_void,
    handle: c_ulonglong,
    kind: c_int,
    flags: c_ulonglong,
) -> CuResult {
    counted(|| {
        let f = real::get::<MemExportFn>(Fn::MemExportToShareableHandle)?;
        // SAFETY: forwarding the caller's arguments.
        Some(unsafe { f(out, handle, kind, flags) })
    })
}

/// `cuMemImportFromShareableHandle`: another process's VMM allocation imported.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut c_ulonglong,
    os: *mut c_void,
    kind: c_int,
) -> CuResult {
    counted(|| {
        let f = real::get::<MemImportFn>(Fn::MemImportFromShareableHandle)?;
        // SAFETY: forwarding the caller's arguments.
        Some(unsafe { f(handle, os, kind) })
    })
}

/// `cuMemPoolExportToShareableHandle`: a memory pool exported.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemPoolExportToShareableHandle(
    out: *mut c_void,
    pool: *mut c_void,
    kind: c_int,
    flags: c_ulonglong,
) -> CuResult {
    counted(|| {
        let f = real::get::<PoolExportFn>(Fn::MemPoolExportToShareableHandle)?;
        // SAFETY: forwarding the caller's arguments.
        Some(unsafe { f(out, pool, kind, flags) })
    })
}

/// `cuMemPoolImportFromShareableHandle`: another process's memory pool imported.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemPoolImportFromShareableHandle(
    pool: *mut *mut c_void,
    handle: *mut c_void,
    kind: c_int,
    flags: c_ulonglong,
) -> CuResult {
    counted(|| {
        let f = real::get::<PoolImportFn>(Fn::MemPoolImportFromShareableHandle)?;
        // SAFETY: forwarding the caller's arguments.
        Some(unsafe { f(pool, handle, kind, flags) })
    })
}

/// `cuMemPoolExportPointer`: an allocation of an exported pool made importable.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemPoolExportPointer(out: *mut c_void, ptr: CuDevicePtr) -> CuResult {
    counted(|| {
        let f = real::get::<PoolExportPointerFn>(Fn::MemPoolExportPointer)?;
        // SAFETY: forwarding the caller's arguments.
        Some(unsafe { f(out, ptr) })
    })
}

/// `cuMemPoolImportPointer`: another process's pool allocation mapped here.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemPoolImportPointer(
    ptr: *mut CuDevicePtr,
    pool: *mut c_void,
    data: *mut c_void,
) -> CuResult {
    counted(|| {
        let f = real::get::<PoolImportPointerFn>(Fn::MemPoolImportPointer)?;
        // SAFETY: forwarding the caller's arguments.
        Some(unsafe { f(ptr, pool, data) })
    })
}

/// Our replacement for a sharing entry point, by base name (`cuGetProcAddress`, `dlsym`).
pub fn wrapper(base: &[u8]) -> Option<(Fn, *mut c_void)> {
    let w: (Fn, *mut c_void) = match base {
        b"cuIpcOpenMemHandle" => (
            Fn::IpcOpenMemHandle,
            cuIpcOpenMemHandle_v2 as IpcOpenMemHandleFn as *mut c_void,
        ),
        b"cuMemExportToShareableHandle" => (
            Fn::MemExportToShareableHandle,
            cuMemExportToShareableHandle as MemExportFn as *mut c_void,
        ),
        b"cuMemImportFromShareableHandle" => (
            Fn::MemImportFromShareableHandle,
            cuMemImportFromShareableHandle as MemImportFn as *mut c_void,
        ),
        b"cuMemPoolExportToShareableHandle" => (
            Fn::MemPoolExportToShareableHandle,
            cuMemPoolExportToShareableHandle as PoolExportFn as *mut c_void,
        ),
        b"cuMemPoolImportFromShareableHandle" => (
            Fn::MemPoolImportFromShareableHandle,
            cuMemPoolImportFromShareableHandle as PoolImportFn as *mut c_void,
        ),
        b"cuMemPoolExportPointer" => (
            Fn::MemPoolExportPointer,
            cuMemPoolExportPointer as PoolExportPointerFn as *mut c_void,
        ),
        b"cuMemPoolImportPointer" => (
            Fn::MemPoolImportPointer,
            cuMemPoolImportPointer as PoolImportPointerFn as *mut c_void,
        ),
        _ => return None,
    };
    Some(w)
}
