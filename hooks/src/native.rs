//! Allocations the interposer leaves native and counts apart: virtual-memory-management
//! allocations (`cuMemCreate`; the application maps them itself, so they cannot become managed),
//! stream-ordered ones (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`; their pools are the
//! driver's) and CUDA arrays (opaque layouts for textures). They stay on the GPU through an
//! eviction, so `status` reports them apart (`vmm=`, `async=`, `array=` bytes): the pool knows
//! what an eviction cannot free.

use std::ffi::{c_uint, c_ulonglong, c_void};

use crate::real::{self, Fn};
use crate::state::{self, Apart};
use crate::{CUDA_SUCCESS, CuDevicePtr, CuResult, guard};

type MemCreateFn =
    unsafe extern "C" fn(*mut c_ulonglong, usize, *const c_void, c_ulonglong) -> CuResult;
type MemReleaseFn = unsafe extern "C" fn(c_ulonglong) -> CuResult;
pub(crate) type MemAllocAsyncFn =
    unsafe extern "C" fn(*mut CuDevicePtr, usize, *mut c_void) -> CuResult;
pub(crate) type MemAllocFromPoolAsyncFn =
    unsafe extern "C" fn(*mut CuDevicePtr, usize, *mut c_void, *mut c_void) -> CuResult;
pub(crate) type MemFreeAsyncFn = unsafe extern "C" fn(CuDevicePtr, *mut c_void) -> CuResult;
type ArrayCreateFn = unsafe extern "C" fn(*mut *mut c_void, *const ArrayDescriptor) -> CuResult;
type Array3DCreateFn = unsafe extern "C" fn(*mut *mut c_void, *const Array3DDescriptor) -> CuResult;
type ArrayDestroyFn = unsafe extern "C" fn(*mut c_void) -> CuResult;

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3DDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

/// Bytes per channel of a `CUarray_format` (8-, 16- and 32-bit formats; others counted as 4).
fn element(format: c_uint) -> usize {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    }
}

fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    let n = w
        .saturating_mul(h.max(1))
        .saturating_mul(d.max(1))
        .saturating_mul(channels.max(1) as usize)
        .saturating_mul(element(format));
    n as u64
}

/// `cuMemCreate`: native, counted as VMM.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut c_ulonglong,
    size: usize,
    prop: *const c_void,
    flags: c_ulonglong,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<MemCreateFn>(Fn::MemCreate) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(handle, size, prop, flags) };
        if r == CUDA_SUCCESS && !handle.is_null() {
            // SAFETY: checked non-null; the driver wrote it.
            state::apart_add(Apart::Vmm, unsafe { *handle }, size as u64);
        }
        r
    })
}

/// `cuMemRelease`.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemRelease(handle: c_ulonglong) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<MemReleaseFn>(Fn::MemRelease) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding.
        let r = unsafe { f(handle) };
        if r == CUDA_SUCCESS {
            state::apart_remove(Apart::Vmm, handle);
        }
        r
    })
}

/// `cuMemAllocAsync`: native, counted as stream-ordered.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CuDevicePtr,
    size: usize,
    stream: *mut c_void,
) -> CuResult {
    alloc_async(Fn::MemAllocAsync, dptr, size, stream)
}

/// `cuMemAllocAsync` or its per-thread variant (`which`).
pub(crate) fn alloc_async(
    which: Fn,
    dptr: *mut CuDevicePtr,
    size: usize,
    stream: *mut c_void,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<MemAllocAsyncFn>(which) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(dptr, size, stream) };
        if r == CUDA_SUCCESS && !dptr.is_null() {
            // SAFETY: checked non-null; the driver wrote it.
            state::apart_add(Apart::Async, unsafe { *dptr }, size as u64);
        }
        r
    })
}

/// `cuMemAllocFromPoolAsync`: native, counted as stream-ordered.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> CuResult {
    alloc_from_pool_async(Fn::MemAllocFromPoolAsync, dptr, size, pool, stream)
}

/// `cuMemAllocFromPoolAsync` or its per-thread variant (`which`).
pub(crate) fn alloc_from_pool_async(
    which: Fn,
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<MemAllocFromPoolAsyncFn>(which) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(dptr, size, pool, stream) };
        if r == CUDA_SUCCESS && !dptr.is_null() {
            // SAFETY: checked non-null; the driver wrote it.
            state::apart_add(Apart::Async, unsafe { *dptr }, size as u64);
        }
        r
    })
}

/// `cuMemFreeAsync`.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CuDevicePtr, stream: *mut c_void) -> CuResult {
    free_async(Fn::MemFreeAsync, dptr, stream)
}

/// `cuMemFreeAsync` or its per-thread variant (`which`).
pub(crate) fn free_async(which: Fn, dptr: CuDevicePtr, stream: *mut c_void) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<MemFreeAsyncFn>(which) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(dptr, stream) };
        if r == CUDA_SUCCESS {
            // It frees cuMemAlloc memory too (converted or not).
            state::forget(dptr);
            state::apart_remove_pointer(dptr);
        }
        r
    })
}

/// `cuArrayCreate_v2`: native, counted as an array.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut *mut c_void,
    desc: *const ArrayDescriptor,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<ArrayCreateFn>(Fn::ArrayCreate) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding.
        let r = unsafe { f(array, desc) };
        if r == CUDA_SUCCESS && !array.is_null() && !desc.is_null() {
            // SAFETY: both checked non-null; the caller's descriptor, the driver's handle.
            let (a, d) = unsafe { (*array, &*desc) };
            let bytes = array_bytes(d.width, d.height, 1, d.format, d.channels);
            state::apart_add(Apart::Array, a as u64, bytes);
        }
        r
    })
}

/// `cuArray3DCreate_v2`: native, counted as an array.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut *mut c_void,
    desc: *const Array3DDescriptor,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<Array3DCreateFn>(Fn::Array3DCreate) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding.
        let r = unsafe { f(array, desc) };
        if r == CUDA_SUCCESS && !array.is_null() && !desc.is_null() {
            // SAFETY: both checked non-null.
            let (a, d) = unsafe { (*array, &*desc) };
            let _ = d.flags;
            let bytes = array_bytes(d.width, d.height, d.depth, d.format, d.channels);
            state::apart_add(Apart::Array, a as u64, bytes);
        }
        r
    })
}

/// `cuArrayDestroy`.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuArrayDestroy(array: *mut c_void) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<ArrayDestroyFn>(Fn::ArrayDestroy) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding.
        let r = unsafe { f(array) };
        if r == CUDA_SUCCESS {
            state::apart_remove(Apart::Array, array as u64);
        }
        r
    })
}

/// Our replacement for a counted native allocator, by base name.
pub fn wrapper(base: &[u8]) -> Option<(Fn, *mut c_void)> {
    let w: (Fn, *mut c_void) = match base {
        b"cuMemCreate" => (Fn::MemCreate, cuMemCreate as MemCreateFn as *mut c_void),
        b"cuMemRelease" => (Fn::MemRelease, cuMemRelease as MemReleaseFn as *mut c_void),
        b"cuMemAllocAsync" => (
            Fn::MemAllocAsync,
            cuMemAllocAsync as MemAllocAsyncFn as *mut c_void,
        ),
        b"cuMemAllocFromPoolAsync" => (
            Fn::MemAllocFromPoolAsync,
            cuMemAllocFromPoolAsync as MemAllocFromPoolAsyncFn as *mut c_void,
        ),
        b"cuMemFreeAsync" => (
            Fn::MemFreeAsync,
            cuMemFreeAsync as MemFreeAsyncFn as *mut c_void,
        ),
        b"cuArrayCreate" => (
            Fn::ArrayCreate,
            cuArrayCreate_v2 as ArrayCreateFn as *mut c_void,
        ),
        b"cuArray3DCreate" => (
            Fn::Array3DCreate,
            cuArray3DCreate_v2 as Array3DCreateFn as *mut c_void,
        ),
        b"cuArrayDestroy" => (
            Fn::ArrayDestroy,
            cuArrayDestroy as ArrayDestroyFn as *mut c_void,
        ),
        _ => return None,
    };
    Some(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_sizes_follow_format_channels_and_depth() {
        assert_eq!(array_bytes(256, 256, 1, 0x20, 1), 256 * 256 * 4);
        assert_eq!(array_bytes(100, 0, 0, 0x01, 4), 400, "1D, 4 channels of u8");
        assert_eq!(array_bytes(8, 8, 8, 0x10, 2), 8 * 8 * 8 * 2 * 2, "3D half2");
    }
}
