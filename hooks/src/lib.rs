//! `libmqfq_cuda.so`: the CUDA interposer the shim injects into GPU containers (LD_PRELOAD).
//!
//! Why: to move a function's GPU memory between the device and the host as its flow turns
//! active and inactive, that memory must be CUDA managed memory. The interposer turns
//! `cuMemAlloc` / `cuMemAllocPitch` into `cuMemAllocManaged`, records each allocation, and
//! answers on a per-process control socket: **evict** (stop launches, synchronize, prefer host,
//! prefetch to host), **prefetch** (back to the device, then let launches run), **status**.
//!
//! How the calls are caught: the CUDA runtime does not call the driver by name — it `dlopen`s
//! `libcuda.so.1` and resolves entry points with `dlsym(handle, …)` or `cuGetProcAddress_v2`,
//! both of which bypass a plain LD_PRELOAD. So this library exports `dlsym` itself (the real one
//! is fetched with `dlvsym`; `RTLD_NEXT` lookups pass through untouched, see `dlsym.rs`), wraps
//! both `cuGetProcAddress` versions, and also exports the
//! wrapped driver functions for programs linked to libcuda directly. Every wrapper resolves the
//! real function first and only substitutes successful lookups.
//!
//! Without `MQFQ_CTL_DIR` the interposer converts nothing and says so once on stderr; it never
//! crashes the application (no panics on any path: errors fall back to the real call).
// The C entry points keep the driver's names; under `fuzzing` they are plain Rust functions.
#![cfg_attr(feature = "fuzzing", allow(non_snake_case))]

/// A line on stderr that can never fail or panic (`eprintln!` panics when stderr is closed or
/// broken, and a panic must not reach the application through a C entry point).
macro_rules! log {
    ($($t:tt)*) => {
        $crate::log_line(&format!($($t)*))
    };
}

mod burst;
mod compat;
mod control;
mod dlsym;
mod lifecycle;
mod native;
mod real;
mod share;
mod state;

/// The fuzz targets' entry point (feature `fuzzing`; not part of the library's interface). With
/// the feature, no C symbol is exported (`#[no_mangle]` is off): linked into a fuzzer, this
/// library's `dlsym` would replace the C library's for the whole process.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    /// A conversation on the control socket: each line of `data` answered in turn, as a
    /// connection from container `c1` would be.
    pub fn control_lines(data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        let mut greeted = false;
        for line in text.split('\n').take(64) {
            let reply = crate::control::answer(line.trim_end(), &mut greeted, Some("c1"));
            assert!(
                reply.starts_with("ok") || reply.starts_with("error"),
                "{reply}"
            );
        }
    }
}

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};

pub use dlsym::dlsym;
use real::Fn;

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdeviceptr`.
pub type CuDevicePtr = c_ulonglong;

const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_UNKNOWN`: what an entry point answers if the interposer itself failed.
const CUDA_ERROR_UNKNOWN: CuResult = 999;

/// Writes `mqfq-cuda: <line>` to fd 2, ignoring every error.
fn log_line(line: &str) {
    let msg = format!("mqfq-cuda: {line}\n");
    let mut rest = msg.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writes from a live buffer of the given length to fd 2; the result is checked.
        let n = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        let Ok(n) = usize::try_from(n) else { return };
        if n == 0 {
            return;
        }
        rest = &rest[n..];
    }
}

/// Runs an entry point's body, never letting a panic cross into the application: a panic (a bug
/// here) becomes `fallback` — an error code, or a null pointer for `dlsym`.
fn guard<R>(fallback: R, body: impl FnOnce() -> R) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(fallback)
}
const CU_MEM_ATTACH_GLOBAL: c_uint = 1;

type AllocFn = unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult;
type AllocManagedFn = unsafe extern "C" fn(*mut CuDevicePtr, usize, c_uint) -> CuResult;
type AllocPitchFn =
    unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, usize, usize, c_uint) -> CuResult;
type FreeFn = unsafe extern "C" fn(CuDevicePtr) -> CuResult;
type LaunchKernelFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type GraphLaunchFn = unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult;
type MemcpyHtoDFn = unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult;
type MemcpyDtoHFn = unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult;
type MemcpyDtoDFn = unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize) -> CuResult;
type LaunchKernelExFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type LaunchCooperativeFn = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
) -> CuResult;
type MemcpyFn = unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize) -> CuResult;
type MemcpyAsyncFn = unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize, *mut c_void) -> CuResult;
type MemcpyHtoDAsyncFn =
    unsafe extern "C" fn(CuDevicePtr, *const c_void, usize, *mut c_void) -> CuResult;
type MemcpyDtoHAsyncFn =
    unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, *mut c_void) -> CuResult;
type GetProcAddressV2Fn = unsafe extern "C" fn(
    *const c_char,
    *mut *mut c_void,
    c_int,
    c_ulonglong,
    *mut c_int,
) -> CuResult;
type GetProcAddressFn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, c_ulonglong) -> CuResult;

/// Our replacement for a driver entry point, by the base name the runtime asks for.
fn wrapper(base: &[u8]) -> Option<(Fn, *mut c_void)> {
    let w: (Fn, *mut c_void) = match base {
        b"cuMemAlloc" => (Fn::MemAlloc, cuMemAlloc_v2 as AllocFn as *mut c_void),
        b"cuMemAllocPitch" => (
            Fn::MemAllocPitch,
            cuMemAllocPitch_v2 as AllocPitchFn as *mut c_void,
        ),
        b"cuMemFree" => (Fn::MemFree, cuMemFree_v2 as FreeFn as *mut c_void),
        b"cuLaunchKernel" => (
            Fn::LaunchKernel,
            cuLaunchKernel as LaunchKernelFn as *mut c_void,
        ),
        b"cuGraphLaunch" => (
            Fn::GraphLaunch,
            cuGraphLaunch as GraphLaunchFn as *mut c_void,
        ),
        b"cuMemcpyHtoD" => (
            Fn::MemcpyHtoD,
            cuMemcpyHtoD_v2 as MemcpyHtoDFn as *mut c_void,
        ),
        b"cuMemcpyDtoH" => (
            Fn::MemcpyDtoH,
            cuMemcpyDtoH_v2 as MemcpyDtoHFn as *mut c_void,
        ),
        b"cuMemcpyDtoD" => (
            Fn::MemcpyDtoD,
            cuMemcpyDtoD_v2 as MemcpyDtoDFn as *mut c_void,
        ),
        b"cuGetProcAddress" => (
            Fn::GetProcAddressV2,
            cuGetProcAddress_v2 as GetProcAddressV2Fn as *mut c_void,
        ),
        b"cuLaunchKernelEx" => (
            Fn::LaunchKernelEx,
            cuLaunchKernelEx as LaunchKernelExFn as *mut c_void,
        ),
        b"cuLaunchCooperativeKernel" => (
            Fn::LaunchCooperativeKernel,
            cuLaunchCooperativeKernel as LaunchCooperativeFn as *mut c_void,
        ),
        b"cuMemcpy" => (Fn::Memcpy, cuMemcpy as MemcpyFn as *mut c_void),
        b"cuMemcpyAsync" => (
            Fn::MemcpyAsync,
            cuMemcpyAsync as MemcpyAsyncFn as *mut c_void,
        ),
        b"cuMemcpyHtoDAsync" => (
            Fn::MemcpyHtoDAsync,
            cuMemcpyHtoDAsync_v2 as MemcpyHtoDAsyncFn as *mut c_void,
        ),
        b"cuMemcpyDtoHAsync" => (
            Fn::MemcpyDtoHAsync,
            cuMemcpyDtoHAsync_v2 as MemcpyDtoHAsyncFn as *mut c_void,
        ),
        b"cuMemcpyDtoDAsync" => (
            Fn::MemcpyDtoDAsync,
            cuMemcpyDtoDAsync_v2 as MemcpyAsyncFn as *mut c_void,
        ),
        other => {
            return native::wrapper(other)
                .or_else(|| compat::wrapper(other))
                .or_else(|| share::wrapper(other))
                .or_else(|| lifecycle::wrapper(other));
        }
    };
    Some(w)
}

/// The base name of a versioned driver symbol (`cuMemAlloc_v2` → `cuMemAlloc`).
fn base_name(sym: &[u8]) -> &[u8] {
    for suffix in [&b"_v2"[..], b"_v3"] {
        if let Some(b) = sym.strip_suffix(suffix) {
            return b;
        }
    }
    sym
}

/// The first CUDA version whose entry points are the `_v2` ABI: `cuGetProcAddress` asked for
/// an older one hands out the 32-bit-size functions, which are never substituted.
const V2_ABI: c_int = 3020;

/// Substitutes a successful entry-point lookup of a function we wrap (`flags` say which stream
/// variant was asked for).
fn substitute(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: c_ulonglong) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: checked non-null; the driver just resolved this name and wrote `*pfn`.
    let (name, found) = unsafe { (CStr::from_ptr(symbol).to_bytes(), *pfn) };
    if found.is_null() {
        return;
    }
    if let Some((which, ours)) = wrapper(base_name(name)) {
        // A `_v2` / `_v3` function's lookup for an older CUDA is its 32-bit-size ABI.
        let sym = which.symbol().to_bytes();
        if which == Fn::IpcOpenMemHandle && version < share::IPC_OPEN_V2 {
            // SAFETY: `pfn` is the caller's out-pointer, checked non-null.
            unsafe { *pfn = share::ipc_open_v1(found) };
            return;
        }
        if base_name(sym) != sym && version < V2_ABI {
            return;
        }
        // Its per-thread default stream variant has a wrapper and a real function of its own.
        let (which, ours) = if ptds::asked_per_thread(which, flags, found) {
            ptds::per_thread(which).unwrap_or((which, ours))
        } else {
            (which, ours)
        };
        if found != ours {
            real::remember(which, found);
        }
        // SAFETY: `pfn` is the caller's out-pointer, checked non-null.
        unsafe { *pfn = ours };
    }
}

/// `cuGetProcAddress_v2` (CUDA 12+): resolve for real, then substitute.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: c_ulonglong,
    status: *mut c_int,
) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<GetProcAddressV2Fn>(Fn::GetProcAddressV2) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments to the real function.
        let r = unsafe { f(symbol, pfn, version, flags, status) };
        if r == CUDA_SUCCESS {
            substitute(symbol, pfn, version, flags);
        }
        r
    })
}

/// `cuGetProcAddress` (CUDA 11.3–11.8): resolve for real, then substitute.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: c_ulonglong,
) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<GetProcAddressFn>(Fn::GetProcAddress) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments to the real function.
        let r = unsafe { f(symbol, pfn, version, flags) };
        if r == CUDA_SUCCESS {
            substitute(symbol, pfn, version, flags);
        }
        r
    })
}

/// Whether this allocation is converted: `None` to convert, or why it stays native.
fn native_reason() -> Option<state::Apart> {
    if state::converting() {
        compat::keep_native()
    } else {
        Some(state::Apart::Other)
    }
}

/// `cuMemAlloc_v2` → managed memory, recorded (unless `compat` keeps it native).
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, size: usize) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let why = native_reason();
        if why.is_none()
            && let Some(managed) = real::driver::<AllocManagedFn>(c"cuMemAllocManaged")
        {
            // SAFETY: the caller's out-pointer and size, with the documented flag.
            let r = unsafe { managed(dptr, size, CU_MEM_ATTACH_GLOBAL) };
            if r == CUDA_SUCCESS && !dptr.is_null() {
                // SAFETY: checked non-null; the driver just wrote it.
                state::record(unsafe { *dptr }, size);
                return r;
            }
        }
        let Some(f) = real::get::<AllocFn>(Fn::MemAlloc) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding to the real allocator.
        let r = unsafe { f(dptr, size) };
        if r == CUDA_SUCCESS && !dptr.is_null() {
            let why = why.unwrap_or(state::Apart::Other);
            // SAFETY: checked non-null; the driver just wrote it.
            state::apart_add(why, unsafe { *dptr }, size as u64);
        }
        r
    })
}

/// `cuMemAllocPitch_v2` → managed memory of `pitch × height`, recorded (unless kept native).
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CuDevicePtr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        let why = native_reason();
        if why.is_none()
            && !pitch.is_null()
            && let Some(managed) = real::driver::<AllocManagedFn>(c"cuMemAllocManaged")
        {
            // Rows aligned to 512 bytes, as the driver's pitch is for these sizes.
            let p = width.div_ceil(512).saturating_mul(512);
            let size = p.saturating_mul(height);
            // SAFETY: the caller's out-pointer; size computed above.
            let r = unsafe { managed(dptr, size, CU_MEM_ATTACH_GLOBAL) };
            if r == CUDA_SUCCESS && !dptr.is_null() {
                // SAFETY: both checked non-null; the driver wrote `*dptr`.
                unsafe { *pitch = p };
                // SAFETY: as above.
                state::record(unsafe { *dptr }, size);
                return r;
            }
        }
        let Some(f) = real::get::<AllocPitchFn>(Fn::MemAllocPitch) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding to the real allocator.
        let r = unsafe { f(dptr, pitch, width, height, element) };
        if r == CUDA_SUCCESS && !pitch.is_null() && !dptr.is_null() {
            let why = why.unwrap_or(state::Apart::Other);
            // SAFETY: both checked non-null; the driver wrote them.
            let (ptr, bytes) = unsafe { (*dptr, (*pitch).saturating_mul(height)) };
            state::apart_add(why, ptr, bytes as u64);
        }
        r
    })
}

/// `cuMemFree_v2`: forgets the allocation, frees it.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CuDevicePtr) -> CuResult {
    guard(CUDA_ERROR_UNKNOWN, || {
        state::forget(ptr);
        // cuMemFree also frees stream-ordered and native allocations.
        state::apart_remove_pointer(ptr);
        let Some(f) = real::get::<FreeFn>(Fn::MemFree) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding.
        unsafe { f(ptr) }
    })
}

/// A driver call that is GPU work: it is part of a burst (admitted by the shim, see `burst`),
/// must not run while this process's memory is evicted (it waits for the prefetch), then
/// forwards to the real function.
///
/// A copy between host and device names its byte count (`moved = n`): counted into the
/// burst, for the function's placement features. A call with a per-thread default stream
/// variant (`ptds`) names it after its own (`per thread name as Fn`): the same wrapper, its own
/// symbol and its own real function.
macro_rules! gated {
    (
        $(#[$doc:meta])* $name:ident as $which:ident, per thread $pname:ident as $pwhich:ident:
        $ty:ty, $label:literal, $args:tt $(, moved = $n:ident)?
    ) => {
        gated!($(#[$doc])* $name as $which: $ty, $label, $args $(, moved = $n)?);
        gated!(
            #[doc = concat!(
                "`", stringify!($pname), "`, the per-thread default stream variant (see `ptds`), ",
                "held while evicted."
            )]
            $pname as $pwhich: $ty, $label, $args $(, moved = $n)?
        );
    };
    ($(#[$doc:meta])* $name:ident as $which:ident: $ty:ty, $label:literal, ($($arg:ident: $t:ty),* $(,)?) $(, moved = $n:ident)?) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As the CUDA driver API.
        #[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
        pub unsafe extern "C" fn $name($($arg: $t),*) -> CuResult {
            guard(CUDA_ERROR_UNKNOWN, || {
                let _in_call = burst::enter($label);
                $(burst::moved($n);)?
                let _in_call_resident = state::wait_resident($label);
                let Some(real) = real::get::<$ty>(Fn::$which) else {
                    return real::NOT_FOUND;
                };
                // SAFETY: forwarding the caller's arguments to the real function.
                unsafe { real($($arg),*) }
            })
        }
    };
}

gated!(
    /// `cuLaunchKernel`, held while evicted.
    cuLaunchKernel as LaunchKernel,
    per thread cuLaunchKernel_ptsz as LaunchKernelPtsz: LaunchKernelFn,
    "cuLaunchKernel",
    (f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shared: c_uint, stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void)
);
gated!(
    /// `cuGraphLaunch`, held while evicted.
    cuGraphLaunch as GraphLaunch,
    per thread cuGraphLaunch_ptsz as GraphLaunchPtsz: GraphLaunchFn,
    "cuGraphLaunch",
    (graph: *mut c_void, stream: *mut c_void)
);
gated!(
    /// `cuMemcpyHtoD_v2`, held while evicted.
    cuMemcpyHtoD_v2 as MemcpyHtoD,
    per thread cuMemcpyHtoD_v2_ptds as MemcpyHtoDPtds: MemcpyHtoDFn,
    "cuMemcpyHtoD",
    (dst: CuDevicePtr, src: *const c_void, n: usize), moved = n
);
gated!(
    /// `cuMemcpyDtoH_v2`, held while evicted.
    cuMemcpyDtoH_v2 as MemcpyDtoH,
    per thread cuMemcpyDtoH_v2_ptds as MemcpyDtoHPtds: MemcpyDtoHFn,
    "cuMemcpyDtoH",
    (dst: *mut c_void, src: CuDevicePtr, n: usize), moved = n
);
gated!(
    /// `cuMemcpyDtoD_v2`, held while evicted.
    cuMemcpyDtoD_v2 as MemcpyDtoD,
    per thread cuMemcpyDtoD_v2_ptds as MemcpyDtoDPtds: MemcpyDtoDFn,
    "cuMemcpyDtoD",
    (dst: CuDevicePtr, src: CuDevicePtr, n: usize)
);
gated!(
    /// `cuLaunchKernelEx` (CUDA 12), held while evicted.
    cuLaunchKernelEx as LaunchKernelEx,
    per thread cuLaunchKernelEx_ptsz as LaunchKernelExPtsz: LaunchKernelExFn,
    "cuLaunchKernelEx",
    (config: *const c_void, f: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void)
);
gated!(
    /// `cuLaunchCooperativeKernel`, held while evicted.
    cuLaunchCooperativeKernel as LaunchCooperativeKernel,
    per thread cuLaunchCooperativeKernel_ptsz as LaunchCooperativeKernelPtsz: LaunchCooperativeFn,
    "cuLaunchCooperativeKernel",
    (f: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
     shared: c_uint, stream: *mut c_void, params: *mut *mut c_void)
);
gated!(
    /// `cuMemcpy` (unified addressing), held while evicted.
    cuMemcpy as Memcpy,
    per thread cuMemcpy_ptds as MemcpyPtds: MemcpyFn,
    "cuMemcpy",
    (dst: CuDevicePtr, src: CuDevicePtr, n: usize)
);
gated!(
    /// `cuMemcpyAsync`, held while evicted.
    cuMemcpyAsync as MemcpyAsync,
    per thread cuMemcpyAsync_ptsz as MemcpyAsyncPtsz: MemcpyAsyncFn,
    "cuMemcpyAsync",
    (dst: CuDevicePtr, src: CuDevicePtr, n: usize, stream: *mut c_void)
);
gated!(
    /// `cuMemcpyHtoDAsync_v2`, held while evicted.
    cuMemcpyHtoDAsync_v2 as MemcpyHtoDAsync,
    per thread cuMemcpyHtoDAsync_v2_ptsz as MemcpyHtoDAsyncPtsz: MemcpyHtoDAsyncFn,
    "cuMemcpyHtoDAsync",
    (dst: CuDevicePtr, src: *const c_void, n: usize, stream: *mut c_void), moved = n
);
gated!(
    /// `cuMemcpyDtoHAsync_v2`, held while evicted.
    cuMemcpyDtoHAsync_v2 as MemcpyDtoHAsync,
    per thread cuMemcpyDtoHAsync_v2_ptsz as MemcpyDtoHAsyncPtsz: MemcpyDtoHAsyncFn,
    "cuMemcpyDtoHAsync",
    (dst: *mut c_void, src: CuDevicePtr, n: usize, stream: *mut c_void), moved = n
);
gated!(
    /// `cuMemcpyDtoDAsync_v2`, held while evicted.
    cuMemcpyDtoDAsync_v2 as MemcpyDtoDAsync,
    per thread cuMemcpyDtoDAsync_v2_ptsz as MemcpyDtoDAsyncPtsz: MemcpyAsyncFn,
    "cuMemcpyDtoDAsync",
    (dst: CuDevicePtr, src: CuDevicePtr, n: usize, stream: *mut c_void)
);

mod ptds;
