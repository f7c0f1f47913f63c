//! What keeps converted memory compatible with the code it is handed to.
//!
//! Why: CUDA defines some operations only for memory `cuMemAlloc` made — a legacy IPC handle
//! (`cuIpcGetMemHandle`), a dma-buf (`cuMemGetHandleForAddressRange`), GPUDirect RDMA tokens —
//! and the driver refuses them on managed memory. A converted allocation cannot become exportable
//! later (its address is the application's), so the choice is made when it is allocated. An
//! allocation stays native (counted apart, never evicted) when:
//! - the function asked for it: `MQFQ_NATIVE=all` (the shim sets it from the annotation
//!   `io.mqfq.native-alloc=all`) — **setting**;
//! - it is allocated from inside a communication library that exports or registers its own
//!   buffers — NCCL, UCX, MPI, NVSHMEM, GDRCopy, plus the names `MQFQ_NATIVE` lists — found by
//!   walking the caller's stack — **library**;
//! - the process already asked to export converted memory: that request gets the driver's own
//!   answer for managed memory (an error), is counted (`refused=`), marked in the control
//!   directory (`exported`: the node then keeps the function's next containers native) and
//!   logged with the setting that avoids it, and every later allocation of the process stays
//!   native — **export**.
//!
//! Pointer queries answer for converted memory as for the device memory the application asked
//! for: `IS_MANAGED` is 0 and the memory type is device, except to the listed libraries, which
//! get the truth (they move managed memory through host staging instead of IPC or RDMA, which
//! would fail); `HOST_POINTER` has none, as device memory; `RANGE_START_ADDR`, `RANGE_SIZE` and
//! `cuMemGetAddressRange` come from the interposer's own table (the allocation the application
//! made). Every wrapper asks the driver first, and corrects only a successful answer about a
//! pointer the driver still reports managed (an entry freed behind the interposer's back, by a
//! context reset, is dropped).

use std::collections::HashMap;
use std::ffi::{CStr, c_int, c_uint, c_ulonglong, c_void};
use std::sync::{Mutex, OnceLock};

use crate::real::{self, Fn};
use crate::state::{self, Apart};
use crate::{CUDA_SUCCESS, CuDevicePtr, CuResult, guard};

/// Libraries whose allocations stay native and who get the truth about converted memory, by
/// the start of a file name (`libnccl` matches `libnccl.so.2` and `libnccl-net.so`).
pub const DEFAULT_LIBRARIES: &[&str] = &[
    "libnccl",
    "libucp",
    "libuct",
    "libucs",
    "libmpi",
    "libopen-pal",
    "libnvshmem",
    "libgdrapi",
    "libucc",
    "libfabric",
    "libhcoll",
    "libmca_common_cuda",
];
/// The most names `MQFQ_NATIVE` adds, and the longest one.
const MAX_NAMES: usize = 16;
const MAX_NAME: usize = 64;
/// How deep the caller's stack is searched for a listed library.
const MAX_FRAMES: usize = 48;
/// `MAX_FRAMES` as `backtrace` takes it: the same number, or `backtrace` would write past the
/// array (checked when compiled).
const FRAMES_C: c_int = 48;
const _: () = assert!(FRAMES_C.unsigned_abs() as usize == MAX_FRAMES);

/// `CUpointer_attribute` values this module reads or answers.
const ATTR_MEMORY_TYPE: c_int = 2;
const ATTR_HOST_POINTER: c_int = 4;
const ATTR_P2P_TOKENS: c_int = 5;
const ATTR_IS_MANAGED: c_int = 8;
const ATTR_RANGE_START_ADDR: c_int = 11;
const ATTR_RANGE_SIZE: c_int = 12;
/// `CUDA_ERROR_INVALID_VALUE`.
const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORYTYPE_DEVICE: c_uint = 2;

/// The process's compatibility policy, from `MQFQ_NATIVE`.
#[derive(Debug, PartialEq, Eq)]
pub struct Policy {
    /// Every allocation stays native.
    pub all: bool,
    /// Listed libraries (the defaults and the valid names added).
    pub libraries: Vec<String>,
    /// Entries that were not valid names (logged, ignored).
    pub rejected: Vec<String>,
}

/// Parses `MQFQ_NATIVE`: `all`, or a comma-separated list of library names (letters, digits,
/// `.`, `_`, `+`, `-`; at most 16 of at most 64 bytes) added to [`DEFAULT_LIBRARIES`].
pub fn parse(value: Option<&str>) -> Policy {
    let mut p = Policy {
        all: false,
        libraries: DEFAULT_LIBRARIES.iter().map(|s| (*s).to_owned()).collect(),
        rejected: Vec::new(),
    };
    let Some(v) = value else { return p };
    let mut added = 0;
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name == "all" {
            p.all = true;
            continue;
        }
        let valid = name.len() <= MAX_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
        if valid && added < MAX_NAMES {
            added += 1;
            p.libraries.push(name.to_owned());
        } else {
            p.rejected.push(name.chars().take(MAX_NAME).collect());
        }
    }
    p
}

/// The policy, read once (also before a `fork`, so a child never inherits a half-done read).
pub fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| {
        let raw = std::env::var("MQFQ_NATIVE").ok();
        let p = parse(raw.as_deref());
        if !p.rejected.is_empty() {
            log!("MQFQ_NATIVE: ignored {:?} (not library names)", p.rejected);
        }
        p
    })
}

/// Whether a file name is one of the listed libraries.
pub fn listed(file_name: &[u8], libraries: &[String]) -> bool {
    libraries.iter().any(|l| {
        file_name
            .strip_prefix(l.as_bytes())
            .is_some_and(|rest| rest.is_empty() || b"._-".contains(&rest[0]))
    })
}

unsafe extern "C" {
    /// glibc's `backtrace(3)`.
    fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
}

/// Return addresses already looked up: address → in a listed library. Bounded (emptied when
/// full); a library unloaded and another loaded at its addresses could be answered from an
/// old entry until then, which costs at most a native or a converted allocation.
static PCS: Mutex<Option<HashMap<usize, bool>>> = Mutex::new(None);
const MAX_PCS: usize = 4096;

/// The return-address cache's lock, for the fork handlers: a child forked while another thread
/// held it would wait for it for ever at its first allocation.
pub(crate) fn pcs_for_fork() -> std::sync::MutexGuard<'static, Option<HashMap<usize, bool>>> {
    PCS.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn pc_listed(pc: *mut c_void, libraries: &[String]) -> bool {
    let key = pc as usize;
    if let Some(&hit) = PCS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
        .and_then(|m| m.get(&key))
    {
        return hit;
    }
    // SAFETY: Dl_info is plain data (pointers and integers), valid zeroed.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address and fills `info`.
    let found = unsafe { libc::dladdr(pc, &raw mut info) } != 0 && !info.dli_fname.is_null();
    let hit = found && {
        // SAFETY: dladdr's file name is a NUL-terminated string owned by the loader.
        let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
        let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        listed(base, libraries)
    };
    let mut pcs = PCS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let m = pcs.get_or_insert_with(HashMap::new);
    if m.len() >= MAX_PCS {
        m.clear();
    }
    m.insert(key, hit);
    hit
}

/// Whether a listed library is on the calling thread's stack.
fn caller_listed() -> bool {
    let mut frames = [std::ptr::null_mut::<c_void>(); MAX_FRAMES];
    // SAFETY: a live array of MAX_FRAMES pointers, its length passed.
    let n = unsafe { backtrace(frames.as_mut_ptr(), FRAMES_C) };
    let n = usize::try_from(n).unwrap_or(0).min(MAX_FRAMES);
    let libraries = &policy().libraries;
    frames[..n].iter().any(|&pc| pc_listed(pc, libraries))
}

/// The converted allocation `ptr` points into, if the driver still has managed memory there:
/// an entry whose memory was freed behind the interposer's back (a context destroyed or reset)
/// is forgotten, and the address, perhaps reused by a native allocation, is left alone.
fn live_converted(ptr: CuDevicePtr) -> Option<(CuDevicePtr, usize)> {
    let (base, size) = state::converted(ptr)?;
    let f = real::get::<PointerGetAttributeFn>(Fn::PointerGetAttribute)?;
    let mut managed: u64 = 0;
    // SAFETY: an 8-byte zeroed buffer for a boolean attribute; the real driver function.
    let r = unsafe { f((&raw mut managed).cast(), ATTR_IS_MANAGED, ptr) };
    if r == CUDA_SUCCESS && managed & 0xff != 0 {
        Some((base, size))
    } else {
        state::forget(base);
        None
    }
}

/// Why the allocation being made stays native, or `None` to convert it.
pub fn keep_native() -> Option<Apart> {
    if policy().all {
        Some(Apart::Setting)
    } else if state::exporting() {
        Some(Apart::Export)
    } else if caller_listed() {
        Some(Apart::Library)
    } else {
        None
    }
}

/// The file the first refused export leaves in the control directory, so the shim learns of it
/// even when the process exits right after (as an application whose export failed often does).
pub const MARKER: &str = "exported";

/// The driver refused to export converted memory: counted, marked, and said once per process.
fn refused(call: &str, base: CuDevicePtr, size: usize, r: CuResult) {
    if state::export_refused() {
        if let Some(dir) = std::env::var_os("MQFQ_CTL_DIR") {
            use std::os::unix::fs::OpenOptionsExt;
            let marked = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                // Non-blocking: a FIFO planted under that name fails instead of hanging.
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(std::path::Path::new(&dir).join(MARKER));
            if let Err(e) = marked {
                log!("control directory: {MARKER}: {e}");
            }
        }
        log!(
            "{call} on converted memory ({size} bytes at {base:#x}): CUDA error {r}, as the \
             driver answers for managed memory; this process's later allocations stay native. \
             Give the function the annotation io.mqfq.native-alloc=all to keep all its memory \
             exportable"
        );
    }
}

type IpcGetMemHandleFn = unsafe extern "C" fn(*mut c_void, CuDevicePtr) -> CuResult;
type GetHandleForAddressRangeFn =
    unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, c_ulonglong) -> CuResult;
type PointerGetAttributeFn = unsafe extern "C" fn(*mut c_void, c_int, CuDevicePtr) -> CuResult;
type PointerGetAttributesFn =
    unsafe extern "C" fn(c_uint, *mut c_int, *mut *mut c_void, CuDevicePtr) -> CuResult;
type MemGetAddressRangeFn =
    unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult;

/// `cuIpcGetMemHandle`: the driver's answer; a refusal on converted memory is counted.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut c_void, dptr: CuDevicePtr) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<IpcGetMemHandleFn>(Fn::IpcGetMemHandle) else {
            return real::NOT_FOUND;
        };
        state::sharing_begins();
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(handle, dptr) };
        state::sharing_ends(r == CUDA_SUCCESS);
        if r != CUDA_SUCCESS
            && let Some((base, size)) = live_converted(dptr)
        {
            refused("cuIpcGetMemHandle", base, size, r);
        }
        r
    })
}

/// `cuMemGetHandleForAddressRange` (dma-buf export): as `cuIpcGetMemHandle`.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemGetHandleForAddressRange(
    handle: *mut c_void,
    dptr: CuDevicePtr,
    size: usize,
    kind: c_int,
    flags: c_ulonglong,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<GetHandleForAddressRangeFn>(Fn::MemGetHandleForAddressRange)
        else {
            return real::NOT_FOUND;
        };
        state::sharing_begins();
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(handle, dptr, size, kind, flags) };
        state::sharing_ends(r == CUDA_SUCCESS);
        if r != CUDA_SUCCESS
            && let Some((base, bytes)) = live_converted(dptr)
        {
            refused("cuMemGetHandleForAddressRange", base, bytes, r);
        }
        r
    })
}

/// Whether the caller is in a listed library: one stack walk, and only when an answer depends
/// on it (a batch of attributes asks at most once).
#[derive(Default)]
struct Caller(Option<bool>);

impl Caller {
    fn listed(&mut self) -> bool {
        *self.0.get_or_insert_with(caller_listed)
    }
}

/// Corrects one attribute the driver answered about converted memory `(base, size)`; `true` when
/// it erased a host pointer (device memory has none: a single query then fails, as for it).
///
/// # Safety
/// `data` is the caller's buffer for `attribute`, which the driver just filled.
unsafe fn correct(
    attribute: c_int,
    data: *mut c_void,
    (base, size): (CuDevicePtr, usize),
    caller: &mut Caller,
) -> bool {
    if data.is_null() {
        return false;
    }
    match attribute {
        // SAFETY: a CUmemorytype (an unsigned int) is this attribute's buffer, just written.
        ATTR_MEMORY_TYPE => unsafe { data.cast::<c_uint>().write_unaligned(MEMORYTYPE_DEVICE) },
        // A boolean: its first byte, whether the caller's variable is a bool or an int.
        // SAFETY: the buffer holds at least one byte, just written by the driver.
        ATTR_IS_MANAGED if !caller.listed() => unsafe { data.cast::<u8>().write(0) },
        // SAFETY: a CUdeviceptr is this attribute's buffer, just written.
        ATTR_RANGE_START_ADDR => unsafe { data.cast::<CuDevicePtr>().write_unaligned(base) },
        // SAFETY: a size_t is this attribute's buffer, just written.
        ATTR_RANGE_SIZE => unsafe { data.cast::<usize>().write_unaligned(size) },
        ATTR_HOST_POINTER if !caller.listed() => {
            // SAFETY: a pointer-sized buffer, just written.
            unsafe {
                data.cast::<*mut c_void>()
                    .write_unaligned(std::ptr::null_mut())
            };
            return true;
        }
        _ => {}
    }
    false
}

/// `cuPointerGetAttribute`: the driver's answer, corrected for converted memory.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_int,
    ptr: CuDevicePtr,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<PointerGetAttributeFn>(Fn::PointerGetAttribute) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(data, attribute, ptr) };
        if let Some((base, size)) = live_converted(ptr) {
            if r == CUDA_SUCCESS {
                // SAFETY: the driver filled `data` for this attribute.
                let erased =
                    unsafe { correct(attribute, data, (base, size), &mut Caller::default()) };
                if erased {
                    return CUDA_ERROR_INVALID_VALUE;
                }
            } else if attribute == ATTR_P2P_TOKENS {
                refused("cuPointerGetAttribute(P2P_TOKENS)", base, size, r);
            }
        }
        r
    })
}

/// `cuPointerGetAttributes`: the driver's answers, corrected for converted memory.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuPointerGetAttributes(
    count: c_uint,
    attributes: *mut c_int,
    data: *mut *mut c_void,
    ptr: CuDevicePtr,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        let Some(f) = real::get::<PointerGetAttributesFn>(Fn::PointerGetAttributes) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(count, attributes, data, ptr) };
        if r != CUDA_SUCCESS || attributes.is_null() || data.is_null() {
            return r;
        }
        if let Some(range) = live_converted(ptr) {
            let mut caller = Caller::default();
            for i in 0..count as usize {
                // SAFETY: the caller's arrays of `count` entries, which the driver just read
                // and filled. In a batch there is no error per attribute: an erased host
                // pointer is null, as for device memory.
                unsafe { correct(*attributes.add(i), *data.add(i), range, &mut caller) };
            }
        }
        r
    })
}

/// `cuMemGetAddressRange_v2`: for converted memory, the allocation the application made.
///
/// # Safety
/// As the CUDA driver API.
#[cfg_attr(not(feature = "fuzzing"), unsafe(no_mangle))]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    pbase: *mut CuDevicePtr,
    psize: *mut usize,
    ptr: CuDevicePtr,
) -> CuResult {
    guard(crate::CUDA_ERROR_UNKNOWN, || {
        if let Some((base, size)) = live_converted(ptr) {
            // SAFETY: the caller's out-pointers, each optional (NULL: not wanted).
            unsafe {
                if !pbase.is_null() {
                    *pbase = base;
                }
                if !psize.is_null() {
                    *psize = size;
                }
            }
            return CUDA_SUCCESS;
        }
        let Some(f) = real::get::<MemGetAddressRangeFn>(Fn::MemGetAddressRange) else {
            return real::NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        unsafe { f(pbase, psize, ptr) }
    })
}

/// Our replacement for an export or query entry point, by base name.
pub fn wrapper(base: &[u8]) -> Option<(Fn, *mut c_void)> {
    let w: (Fn, *mut c_void) = match base {
        b"cuIpcGetMemHandle" => (
            Fn::IpcGetMemHandle,
            cuIpcGetMemHandle as IpcGetMemHandleFn as *mut c_void,
        ),
        b"cuMemGetHandleForAddressRange" => (
            Fn::MemGetHandleForAddressRange,
            cuMemGetHandleForAddressRange as GetHandleForAddressRangeFn as *mut c_void,
        ),
        b"cuPointerGetAttribute" => (
            Fn::PointerGetAttribute,
            cuPointerGetAttribute as PointerGetAttributeFn as *mut c_void,
        ),
        b"cuPointerGetAttributes" => (
            Fn::PointerGetAttributes,
            cuPointerGetAttributes as PointerGetAttributesFn as *mut c_void,
        ),
        b"cuMemGetAddressRange" => (
            Fn::MemGetAddressRange,
            cuMemGetAddressRange_v2 as MemGetAddressRangeFn as *mut c_void,
        ),
        _ => return None,
    };
    Some(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_and_added_names_parse_and_bad_names_are_refused() {
        let p = parse(None);
        assert!(!p.all);
        assert_eq!(p.libraries.len(), DEFAULT_LIBRARIES.len());
        let p = parse(Some(" all , libfoo ,, lib/../x, libbar.so.1"));
        assert!(p.all);
        assert!(p.libraries.iter().any(|l| l == "libfoo"));
        assert!(p.libraries.iter().any(|l| l == "libbar.so.1"));
        assert_eq!(p.rejected, vec!["lib/../x".to_owned()]);
        let many: Vec<String> = (0..40).map(|i| format!("l{i}")).collect();
        let p = parse(Some(&many.join(",")));
        assert_eq!(p.libraries.len(), DEFAULT_LIBRARIES.len() + MAX_NAMES);
        assert_eq!(p.rejected.len(), 40 - MAX_NAMES);
        let long = "x".repeat(MAX_NAME + 1);
        assert_eq!(parse(Some(&long)).rejected.len(), 1);
    }

    #[test]
    fn library_names_match_at_a_name_boundary() {
        let l = parse(None).libraries;
        for yes in [
            "libnccl.so.2",
            "libnccl-net.so",
            "libuct_cuda.so.0",
            "libmpi.so.40",
        ] {
            assert!(listed(yes.as_bytes(), &l), "{yes}");
        }
        for no in ["libncclx.so", "libc.so.6", "libmpiwrap.so", "nccl.so", ""] {
            assert!(!listed(no.as_bytes(), &l), "{no}");
        }
    }
}
