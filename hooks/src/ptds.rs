//! The per-thread default stream variants of the wrapped calls. A program built with
//! `--default-stream per-thread` (or `CUDA_API_PER_THREAD_DEFAULT_STREAM`) calls
//! `cuLaunchKernel_ptsz`, `cuMemcpyHtoD_v2_ptds`, … — by name, or through `cuGetProcAddress`
//! with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` — and their stream 0 is the calling
//! thread's own, not the legacy default stream that synchronizes with every other. Each variant
//! has its own wrapper and its own real function: a single one per call had collapsed both to
//! whichever was looked up first (a per-thread program's work then went to the legacy stream,
//! or the other way round).

use std::ffi::{c_ulonglong, c_void};

use crate::lifecycle::{self, BeginCaptureFn, EndCaptureFn};
use crate::native::{self, MemAllocAsyncFn, MemAllocFromPoolAsyncFn, MemFreeAsyncFn};
use crate::real::{self, Fn};
// The gated calls' per-thread wrappers are made beside their legacy twins (`gated!`).
use crate::{
    CuDevicePtr, CuResult, GraphLaunchFn, LaunchCooperativeFn, LaunchKernelExFn, LaunchKernelFn,
    MemcpyAsyncFn, MemcpyDtoDFn, MemcpyDtoHAsyncFn, MemcpyDtoHFn, MemcpyFn, MemcpyHtoDAsyncFn,
    MemcpyHtoDFn, cuGraphLaunch_ptsz, cuLaunchCooperativeKernel_ptsz, cuLaunchKernel_ptsz,
    cuLaunchKernelEx_ptsz, cuMemcpy_ptds, cuMemcpyAsync_ptsz, cuMemcpyDtoD_v2_ptds,
    cuMemcpyDtoDAsync_v2_ptsz, cuMemcpyDtoH_v2_ptds, cuMemcpyDtoHAsync_v2_ptsz,
    cuMemcpyHtoD_v2_ptds, cuMemcpyHtoDAsync_v2_ptsz,
};

/// `cuGetProcAddress`'s flag for the per-thread variants.
pub const PER_THREAD_FLAG: c_ulonglong = 2;

/// `name` without a per-thread suffix, and whether it had one.
pub fn split(name: &[u8]) -> (&[u8], bool) {
    for suffix in [&b"_ptds"[..], b"_ptsz"] {
        if let Some(plain) = name.strip_suffix(suffix) {
            return (plain, true);
        }
    }
    (name, false)
}

/// Whether a lookup of `which` by `cuGetProcAddress` (`flags`, which found `found`) is of its
/// per-thread variant: asked for by the flag, or what the driver handed out is that variant
/// (the default flag leaves the choice to the driver).
pub fn asked_per_thread(which: Fn, flags: c_ulonglong, found: *mut c_void) -> bool {
    if flags & PER_THREAD_FLAG != 0 {
        return true;
    }
    per_thread(which).is_some_and(|(variant, _)| {
        let real = real::driver_symbol(variant.symbol());
        !real.is_null() && real == found
    })
}

/// The per-thread variant of a wrapped call, and its wrapper; `None` for a call without one.
pub fn per_thread(which: Fn) -> Option<(Fn, *mut c_void)> {
    let w: (Fn, *mut c_void) = match which {
        Fn::LaunchKernel => (
            Fn::LaunchKernelPtsz,
            cuLaunchKernel_ptsz as LaunchKernelFn as *mut c_void,
        ),
        Fn::GraphLaunch => (
            Fn::GraphLaunchPtsz,
            cuGraphLaunch_ptsz as GraphLaunchFn as *mut c_void,
        ),
        Fn::MemcpyHtoD => (
            Fn::MemcpyHtoDPtds,
            cuMemcpyHtoD_v2_ptds as MemcpyHtoDFn as *mut c_void,
        ),
        Fn::MemcpyDtoH => (
            Fn::MemcpyDtoHPtds,
            cuMemcpyDtoH_v2_ptds as MemcpyDtoHFn as *mut c_void,
        ),
        Fn::MemcpyDtoD => (
            Fn::MemcpyDtoDPtds,
            cuMemcpyDtoD_v2_ptds as MemcpyDtoDFn as *mut c_void,
        ),
        Fn::LaunchKernelEx => (
            Fn::LaunchKernelExPtsz,
            cuLaunchKernelEx_ptsz as LaunchKernelExFn as *mut c_void,
        ),
        Fn::LaunchCooperativeKernel => (
            Fn::LaunchCooperativeKernelPtsz,
            cuLaunchCooperativeKernel_ptsz as LaunchCooperativeFn as *mut c_void,
        ),
        Fn::Memcpy => (Fn::MemcpyPtds, cuMemcpy_ptds as MemcpyFn as *mut c_void),
        Fn::MemcpyAsync => (
            Fn::MemcpyAsyncPtsz,
            cuMemcpyAsync_ptsz as MemcpyAsyncFn as *mut c_void,
        ),
        Fn::MemcpyHtoDAsync => (
            Fn::MemcpyHtoDAsyncPtsz,
            cuMemcpyHtoDAsync_v2_ptsz as MemcpyHtoDAsyncFn as *mut c_void,
        ),
        Fn::MemcpyDtoHAsync => (
            Fn::MemcpyDtoHAsyncPtsz,
            cuMemcpyDtoHAsync_v2_ptsz as MemcpyDtoHAsyncFn as *mut c_void,
        ),
        Fn::MemcpyDtoDAsync => (
            Fn::MemcpyDtoDAsyncPtsz,
            cuMemcpyDtoDAsync_v2_ptsz as MemcpyAsyncFn as *mut c_void,
        ),
        Fn::MemAllocAsync => (
            Fn::MemAllocAsyncPtsz,
            cuMemAllocAsync_ptsz as MemAllocAsyncFn as *mut c_void,
        ),
        Fn::MemAllocFromPoolAsync => (
            Fn::MemAllocFromPoolAsyncPtsz,
            cuMemAllocFromPoolAsync_ptsz as MemAllocFromPoolAsyncFn as *mut c_void,
        ),
        Fn::MemFreeAsync => (
            Fn::MemFreeAsyncPtsz,
            cuMemFreeAsync_ptsz as MemFreeAsyncFn as *mut c_void,
        ),
        Fn::StreamBeginCapture => (
            Fn::StreamBeginCapturePtsz,
            cuStreamBeginCapture_v2_ptsz as BeginCaptureFn as *mut c_void,
        ),
        Fn::StreamEndCapture => (
            Fn::StreamEndCapturePtsz,
            cuStreamEndCapture_ptsz as EndCaptureFn as *mut c_void,
        ),
        _ => return None,
    };
    Some(w)
}

/// `cuMemAllocAsync_ptsz`: native, counted as stream-ordered.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CuDevicePtr,
    size: usize,
    stream: *mut c_void,
) -> CuResult {
    native::alloc_async(Fn::MemAllocAsyncPtsz, dptr, size, stream)
}

/// `cuMemAllocFromPoolAsync_ptsz`: native, counted as stream-ordered.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CuDevicePtr,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> CuResult {
    native::alloc_from_pool_async(Fn::MemAllocFromPoolAsyncPtsz, dptr, size, pool, stream)
}

/// `cuMemFreeAsync_ptsz`.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(dptr: CuDevicePtr, stream: *mut c_void) -> CuResult {
    native::free_async(Fn::MemFreeAsyncPtsz, dptr, stream)
}

/// `cuStreamBeginCapture_v2_ptsz`, tracked.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuStreamBeginCapture_v2_ptsz(
    stream: *mut c_void,
    mode: std::ffi::c_int,
) -> CuResult {
    lifecycle::begin_capture(Fn::StreamBeginCapturePtsz, stream, mode)
}

/// `cuStreamEndCapture_ptsz`, tracked.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(
    stream: *mut c_void,
    graph: *mut *mut c_void,
) -> CuResult {
    lifecycle::end_capture(Fn::StreamEndCapturePtsz, stream, graph)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_is_named_for_its_call_and_suffix() {
        let calls = [
            Fn::LaunchKernel,
            Fn::GraphLaunch,
            Fn::MemcpyHtoD,
            Fn::MemcpyDtoH,
            Fn::MemcpyDtoD,
            Fn::LaunchKernelEx,
            Fn::LaunchCooperativeKernel,
            Fn::Memcpy,
            Fn::MemcpyAsync,
            Fn::MemcpyHtoDAsync,
            Fn::MemcpyDtoHAsync,
            Fn::MemcpyDtoDAsync,
            Fn::MemAllocAsync,
            Fn::MemAllocFromPoolAsync,
            Fn::MemFreeAsync,
            Fn::StreamBeginCapture,
            Fn::StreamEndCapture,
        ];
        for which in calls {
            let (variant, _) = per_thread(which).unwrap();
            let name = variant.symbol().to_bytes();
            let (plain, suffixed) = split(name);
            assert!(suffixed, "{name:?}");
            assert_eq!(plain, which.symbol().to_bytes(), "{which:?}");
        }
        assert!(per_thread(Fn::MemAlloc).is_none());
        assert_eq!(split(b"cuMemAlloc_v2"), (&b"cuMemAlloc_v2"[..], false));
    }
}
