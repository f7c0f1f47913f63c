//! The real functions behind the wrappers: the real `dlsym` (through `dlvsym`, so the lookup
//! never comes back to our own `dlsym`), the driver's pointers as the application's lookups
//! found them, and the driver library's own symbols for the calls the interposer makes itself.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `CUDA_ERROR_NOT_FOUND`: what a wrapper answers when the real function cannot be found.
pub const NOT_FOUND: i32 = 500;

/// The wrapped driver functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fn {
    MemAlloc,
    MemAllocPitch,
    MemFree,
    LaunchKernel,
    GraphLaunch,
    MemcpyHtoD,
    MemcpyDtoH,
    MemcpyDtoD,
    GetProcAddressV2,
    GetProcAddress,
    LaunchKernelEx,
    LaunchCooperativeKernel,
    Memcpy,
    MemcpyAsync,
    MemcpyHtoDAsync,
    MemcpyDtoHAsync,
    MemcpyDtoDAsync,
    MemCreate,
    MemRelease,
    MemAllocAsync,
    MemAllocFromPoolAsync,
    MemFreeAsync,
    ArrayCreate,
    Array3DCreate,
    ArrayDestroy,
    IpcGetMemHandle,
    IpcOpenMemHandle,
    MemGetHandleForAddressRange,
    PointerGetAttribute,
    PointerGetAttributes,
    MemGetAddressRange,
    // The per-thread default stream variants (`_ptds` / `_ptsz`, see `ptds`).
    LaunchKernelPtsz,
    GraphLaunchPtsz,
    MemcpyHtoDPtds,
    MemcpyDtoHPtds,
    MemcpyDtoDPtds,
    LaunchKernelExPtsz,
    LaunchCooperativeKernelPtsz,
    MemcpyPtds,
    MemcpyAsyncPtsz,
    MemcpyHtoDAsyncPtsz,
    MemcpyDtoHAsyncPtsz,
    MemcpyDtoDAsyncPtsz,
    MemAllocAsyncPtsz,
    MemAllocFromPoolAsyncPtsz,
    MemFreeAsyncPtsz,
    // Context lifetimes and stream capture (see `lifecycle`).
    StreamBeginCapture,
    StreamEndCapture,
    StreamBeginCapturePtsz,
    StreamEndCapturePtsz,
    CtxDestroy,
    PrimaryCtxReset,
    // Sharing memory with other processes (see `share`).
    IpcOpenMemHandleV1,
    MemExportToShareableHandle,
    MemImportFromShareableHandle,
    MemPoolExportToShareableHandle,
    MemPoolImportFromShareableHandle,
    MemPoolExportPointer,
    MemPoolImportPointer,
    // Keep last: it sizes the table.
    PrimaryCtxRelease,
}

/// One slot per [`Fn`]: the last variant's index plus one (a hand-kept count once fell one short
/// of a new variant, and the last one's lookups indexed past the table).
const COUNT: usize = Fn::PrimaryCtxRelease as usize + 1;

impl Fn {
    fn index(self) -> usize {
        self as usize
    }

    /// The versioned name libcuda exports it under.
    pub fn symbol(self) -> &'static CStr {
        match self {
            Fn::MemAlloc => c"cuMemAlloc_v2",
            Fn::MemAllocPitch => c"cuMemAllocPitch_v2",
            Fn::MemFree => c"cuMemFree_v2",
            Fn::LaunchKernel => c"cuLaunchKernel",
            Fn::GraphLaunch => c"cuGraphLaunch",
            Fn::MemcpyHtoD => c"cuMemcpyHtoD_v2",
            Fn::MemcpyDtoH => c"cuMemcpyDtoH_v2",
            Fn::MemcpyDtoD => c"cuMemcpyDtoD_v2",
            Fn::GetProcAddressV2 => c"cuGetProcAddress_v2",
            Fn::GetProcAddress => c"cuGetProcAddress",
            Fn::LaunchKernelEx => c"cuLaunchKernelEx",
            Fn::LaunchCooperativeKernel => c"cuLaunchCooperativeKernel",
            Fn::Memcpy => c"cuMemcpy",
            Fn::MemcpyAsync => c"cuMemcpyAsync",
            Fn::MemcpyHtoDAsync => c"cuMemcpyHtoDAsync_v2",
            Fn::MemcpyDtoHAsync => c"cuMemcpyDtoHAsync_v2",
            Fn::MemcpyDtoDAsync => c"cuMemcpyDtoDAsync_v2",
            Fn::MemCreate => c"cuMemCreate",
            Fn::MemRelease => c"cuMemRelease",
            Fn::MemAllocAsync => c"cuMemAllocAsync",
            Fn::MemAllocFromPoolAsync => c"cuMemAllocFromPoolAsync",
            Fn::MemFreeAsync => c"cuMemFreeAsync",
            Fn::ArrayCreate => c"cuArrayCreate_v2",
            Fn::Array3DCreate => c"cuArray3DCreate_v2",
            Fn::ArrayDestroy => c"cuArrayDestroy",
            Fn::IpcGetMemHandle => c"cuIpcGetMemHandle",
            Fn::IpcOpenMemHandle => c"cuIpcOpenMemHandle_v2",
            Fn::MemGetHandleForAddressRange => c"cuMemGetHandleForAddressRange",
            Fn::PointerGetAttribute => c"cuPointerGetAttribute",
            Fn::PointerGetAttributes => c"cuPointerGetAttributes",
            Fn::MemGetAddressRange => c"cuMemGetAddressRange_v2",
            Fn::LaunchKernelPtsz => c"cuLaunchKernel_ptsz",
            Fn::GraphLaunchPtsz => c"cuGraphLaunch_ptsz",
            Fn::MemcpyHtoDPtds => c"cuMemcpyHtoD_v2_ptds",
            Fn::MemcpyDtoHPtds => c"cuMemcpyDtoH_v2_ptds",
            Fn::MemcpyDtoDPtds => c"cuMemcpyDtoD_v2_ptds",
            Fn::LaunchKernelExPtsz => c"cuLaunchKernelEx_ptsz",
            Fn::LaunchCooperativeKernelPtsz => c"cuLaunchCooperativeKernel_ptsz",
            Fn::MemcpyPtds => c"cuMemcpy_ptds",
            Fn::MemcpyAsyncPtsz => c"cuMemcpyAsync_ptsz",
            Fn::MemcpyHtoDAsyncPtsz => c"cuMemcpyHtoDAsync_v2_ptsz",
            Fn::MemcpyDtoHAsyncPtsz => c"cuMemcpyDtoHAsync_v2_ptsz",
            Fn::MemcpyDtoDAsyncPtsz => c"cuMemcpyDtoDAsync_v2_ptsz",
            Fn::MemAllocAsyncPtsz => c"cuMemAllocAsync_ptsz",
            Fn::MemAllocFromPoolAsyncPtsz => c"cuMemAllocFromPoolAsync_ptsz",
            Fn::MemFreeAsyncPtsz => c"cuMemFreeAsync_ptsz",
            Fn::StreamBeginCapture => c"cuStreamBeginCapture_v2",
            Fn::StreamEndCapture => c"cuStreamEndCapture",
            Fn::StreamBeginCapturePtsz => c"cuStreamBeginCapture_v2_ptsz",
            Fn::StreamEndCapturePtsz => c"cuStreamEndCapture_ptsz",
            Fn::CtxDestroy => c"cuCtxDestroy_v2",
            Fn::PrimaryCtxReset => c"cuDevicePrimaryCtxReset_v2",
            Fn::PrimaryCtxRelease => c"cuDevicePrimaryCtxRelease_v2",
            Fn::IpcOpenMemHandleV1 => c"cuIpcOpenMemHandle",
            Fn::MemExportToShareableHandle => c"cuMemExportToShareableHandle",
            Fn::MemImportFromShareableHandle => c"cuMemImportFromShareableHandle",
            Fn::MemPoolExportToShareableHandle => c"cuMemPoolExportToShareableHandle",
            Fn::MemPoolImportFromShareableHandle => c"cuMemPoolImportFromShareableHandle",
            Fn::MemPoolExportPointer => c"cuMemPoolExportPointer",
            Fn::MemPoolImportPointer => c"cuMemPoolImportPointer",
        }
    }
}

static REAL: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];
/// The C library's `dlsym` once resolved (0 before): read by the exported `dlsym`'s trampoline.
pub(crate) static DLSYM: AtomicUsize = AtomicUsize::new(0);
static DRIVER: AtomicUsize = AtomicUsize::new(0);

/// The real `dlsym` signature.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The versions glibc has exported `dlsym` under, newest first: 2.34 (libdl merged into libc)
/// and the architecture's base version before it (x86_64's 2.2.5, aarch64's 2.17).
#[cfg(target_arch = "x86_64")]
const DLSYM_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.2.5"];
#[cfg(target_arch = "aarch64")]
const DLSYM_VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.17"];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the interposer names dlsym's glibc versions for x86_64 and aarch64 only");

thread_local! {
    /// This thread is resolving `dlsym`: a lookup made meanwhile (another preloaded library's
    /// `dlvsym` or allocator calling `dlsym`) answers nothing instead of resolving again.
    static RESOLVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The C library's `dlsym`, found with `dlvsym` (glibc ≥ 2.34 first, then the older version).
pub fn dlsym() -> Option<DlsymFn> {
    let mut p = DLSYM.load(Ordering::Acquire);
    if p == 0 {
        if RESOLVING.with(|r| r.replace(true)) {
            return None;
        }
        for version in DLSYM_VERSIONS {
            // SAFETY: dlvsym with constant NUL-terminated strings.
            let f = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !f.is_null() {
                p = f as usize;
                DLSYM.store(p, Ordering::Release);
                break;
            }
        }
        RESOLVING.with(|r| r.set(false));
    }
    if p == 0 {
        return None;
    }
    // SAFETY: `p` is glibc's dlsym, whose signature is DlsymFn.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// Keeps the first real pointer seen for a wrapped function.
pub fn remember(which: Fn, p: *mut c_void) {
    let _ =
        REAL[which.index()].compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Acquire);
}

fn as_fn<F: Copy>(p: usize) -> Option<F> {
    if p == 0 || std::mem::size_of::<F>() != std::mem::size_of::<usize>() {
        return None;
    }
    // SAFETY: `p` is a function pointer of the type the caller names (one per `Fn`, or the
    // driver's documented signature), and F is pointer-sized.
    Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
}

/// The real function for a wrapper: as the application's lookup found it, else the next
/// definition after this library (a program linked to libcuda), else libcuda's own.
pub fn get<F: Copy>(which: Fn) -> Option<F> {
    let mut p = REAL[which.index()].load(Ordering::Acquire);
    if p == 0 {
        let real = dlsym()?;
        // SAFETY: RTLD_NEXT lookup of a constant name.
        let mut f = unsafe { real(libc::RTLD_NEXT, which.symbol().as_ptr()) };
        if f.is_null() {
            f = driver_symbol(which.symbol());
        }
        remember(which, f);
        p = REAL[which.index()].load(Ordering::Acquire);
    }
    as_fn(p)
}

pub(crate) fn driver_symbol(name: &CStr) -> *mut c_void {
    let mut h = DRIVER.load(Ordering::Acquire);
    if h == 0 {
        // SAFETY: dlopen of a constant name; NOLOAD first so an application's own load is used.
        let mut handle =
            unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if handle.is_null() {
            // SAFETY: as above.
            handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        }
        if handle.is_null() {
            return std::ptr::null_mut();
        }
        h = handle as usize;
        DRIVER.store(h, Ordering::Release);
    }
    let Some(real) = dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    unsafe { real(h as *mut c_void, name.as_ptr()) }
}

/// A driver function the interposer calls itself (`cuMemAllocManaged`, `cuMemAdvise_v2`, …),
/// from libcuda directly.
pub fn driver<F: Copy>(name: &CStr) -> Option<F> {
    as_fn(driver_symbol(name) as usize)
}
