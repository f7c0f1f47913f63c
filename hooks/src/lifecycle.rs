//! What the application does to its contexts and streams that the burst monitor must respect.
//!
//! The monitor observes a burst's completion by synchronizing the contexts the burst used, from
//! its own thread, behind the application's back. Two things make that unsafe: a stream
//! capture in progress (CUDA's global capture mode forbids synchronizing then, and the capture is
//! invalidated: the application's `cuStreamEndCapture` fails), and a context being destroyed
//! (`cuCtxDestroy`, a primary context's reset or last release, which `cudaDeviceReset` makes):
//! synchronizing one destroyed or being destroyed is a use after free in the driver. So the
//! captures open are tracked and the monitor neither synchronizes nor ends a burst while one
//! is (the burst goes on until they close), and destroying a context first takes the monitor's
//! lock and forgets the burst's contexts, so it never touches one again.
//! `cuStreamBeginCaptureToGraph` (CUDA 12.3) is not wrapped: a capture begun with it is not seen.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use crate::real::{self, Fn};
use crate::{CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, CuResult, burst, guard};

pub(crate) type BeginCaptureFn = unsafe extern "C" fn(*mut c_void, c_int) -> CuResult;
pub(crate) type EndCaptureFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> CuResult;
type CtxDestroyFn = unsafe extern "C" fn(*mut c_void) -> CuResult;
type PrimaryCtxFn = unsafe extern "C" fn(c_int) -> CuResult;

/// The streams with a capture open (0: a free slot), and captures past the slots.
static CAPTURES: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
static UNTRACKED: AtomicU32 = AtomicU32::new(0);

/// Whether a stream capture is open in this process.
pub(crate) fn capturing() -> bool {
    UNTRACKED.load(Ordering::Acquire) > 0 || CAPTURES.iter().any(|s| s.load(Ordering::Acquire) != 0)
}

fn capture_opened(stream: *mut c_void) {
    let s = stream as usize;
    // The legacy default stream (0) cannot be captured; counted anyway, apart.
    let taken = s != 0
        && CAPTURES.iter().any(|slot| {
            slot.compare_exchange(0, s, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
    if !taken {
        UNTRACKED.fetch_add(1, Ordering::AcqRel);
    }
}

fn capture_closed(stream: *mut c_void) {
    let s = stream as usize;
    let found = s != 0
        && CAPTURES.iter().any(|slot| {
            slot.compare_exchange(s, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
    if !found {
        let _ = UNTRACKED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }
}

/// A capture begins with the monitor's lock held: the monitor never synchronizes between the
/// driver opening a capture and this library knowing of it.
pub(crate) fn begin_capture(which: Fn, stream: *mut c_void, mode: c_int) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<BeginCaptureFn>(which) else {
            return real::NOT_FOUND;
        };
        let _monitor = burst::monitor_lock();
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(stream, mode) };
        if r == CUDA_SUCCESS {
            capture_opened(stream);
        }
        r
    })
}

/// A capture ends (whatever the driver answers, it is no longer open).
pub(crate) fn end_capture(which: Fn, stream: *mut c_void, graph: *mut *mut c_void) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<EndCaptureFn>(which) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(stream, graph) };
        capture_closed(stream);
        r
    })
}

/// `cuStreamBeginCapture_v2`, tracked.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: c_int) -> CuResult {
    begin_capture(Fn::StreamBeginCapture, stream, mode)
}

/// `cuStreamEndCapture`, tracked.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuStreamEndCapture(
    stream: *mut c_void,
    graph: *mut *mut c_void,
) -> CuResult {
    end_capture(Fn::StreamEndCapture, stream, graph)
}

/// `cuCtxDestroy_v2`: the monitor forgets the burst's contexts first.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<CtxDestroyFn>(Fn::CtxDestroy) else {
            return real::NOT_FOUND;
        };
        let _monitor = burst::forget_contexts();
        // SAFETY: forwarding the caller's argument.
        unsafe { f(ctx) }
    })
}

fn primary(which: Fn, device: c_int) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<PrimaryCtxFn>(which) else {
            return real::NOT_FOUND;
        };
        let _monitor = burst::forget_contexts();
        // SAFETY: forwarding the caller's argument.
        unsafe { f(device) }
    })
}

/// `cuDevicePrimaryCtxReset_v2` (what `cudaDeviceReset` calls): the monitor forgets the
/// burst's contexts first.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(device: c_int) -> CuResult {
    primary(Fn::PrimaryCtxReset, device)
}

/// `cuDevicePrimaryCtxRelease_v2` (the last release destroys the primary context): the
/// monitor forgets the burst's contexts first.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(device: c_int) -> CuResult {
    primary(Fn::PrimaryCtxRelease, device)
}

/// Our replacement for one of these entry points, by the base name the runtime asks for.
pub fn wrapper(base: &[u8]) -> Option<(Fn, *mut c_void)> {
    let w: (Fn, *mut c_void) = match base {
        b"cuStreamBeginCapture" => (
            Fn::StreamBeginCapture,
            cuStreamBeginCapture_v2 as BeginCaptureFn as *mut c_void,
        ),
        b"cuStreamEndCapture" => (
            Fn::StreamEndCapture,
            cuStreamEndCapture as EndCaptureFn as *mut c_void,
        ),
        b"cuCtxDestroy" => (
            Fn::CtxDestroy,
            cuCtxDestroy_v2 as CtxDestroyFn as *mut c_void,
        ),
        b"cuDevicePrimaryCtxReset" => (
            Fn::PrimaryCtxReset,
            cuDevicePrimaryCtxReset_v2 as PrimaryCtxFn as *mut c_void,
        ),
        b"cuDevicePrimaryCtxRelease" => (
            Fn::PrimaryCtxRelease,
            cuDevicePrimaryCtxRelease_v2 as PrimaryCtxFn as *mut c_void,
        ),
        _ => return None,
    };
    Some(w)
}
