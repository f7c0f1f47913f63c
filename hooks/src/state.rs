//! What the interposer knows about its process: whether it converts allocations, the managed
//! allocations it made, whether they are evicted (launches then wait), and the evict / prefetch
//! steps themselves.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::{CuDevicePtr, CuResult};

#[derive(Clone, Copy, Debug)]
struct Alloc {
    ptr: CuDevicePtr,
    size: usize,
}

#[derive(Debug, Default)]
struct Memory {
    allocs: Vec<Alloc>,
    context: usize,
    evicted: bool,
}

static MEMORY: Mutex<Memory> = Mutex::new(Memory {
    allocs: Vec::new(),
    context: 0,
    evicted: false,
});
static RESIDENT: Condvar = Condvar::new();
static NATIVE: AtomicU64 = AtomicU64::new(0);
/// The pid this process's setup was done for (0: not yet; a forked child sees its parent's).
static SETUP_PID: AtomicU32 = AtomicU32::new(0);
static CONVERTING: AtomicU32 = AtomicU32::new(0);

fn memory() -> MutexGuard<'static, Memory> {
    MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether allocations are converted; sets the process up on first use, and again in a forked
/// child (which gets its own control socket and an empty table: CUDA state does not survive
/// fork).
pub fn converting() -> bool {
    let pid = std::process::id();
    if SETUP_PID.load(Ordering::Acquire) == pid {
        return CONVERTING.load(Ordering::Acquire) == 1;
    }
    if SETUP_PID.swap(pid, Ordering::AcqRel) == pid {
        return CONVERTING.load(Ordering::Acquire) == 1;
    }
    {
        let mut m = memory();
        *m = Memory::default();
    }
    NATIVE.store(0, Ordering::Release);
    let on = match std::env::var_os("MQFQ_CTL_DIR") {
        Some(dir) => match crate::control::start(std::path::Path::new(&dir)) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("mqfq-cuda: control socket: {e}; allocations stay native");
                false
            }
        },
        None => {
            eprintln!("mqfq-cuda: MQFQ_CTL_DIR is not set; allocations stay native");
            false
        }
    };
    CONVERTING.store(u32::from(on), Ordering::Release);
    on
}

type CtxGetCurrentFn = unsafe extern "C" fn(*mut *mut c_void) -> CuResult;
type CtxSetCurrentFn = unsafe extern "C" fn(*mut c_void) -> CuResult;
type CtxSynchronizeFn = unsafe extern "C" fn() -> CuResult;

#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    kind: c_int,
    id: c_int,
}
type MemAdviseFn = unsafe extern "C" fn(CuDevicePtr, usize, c_int, MemLocation) -> CuResult;
type MemPrefetchFn =
    unsafe extern "C" fn(CuDevicePtr, usize, MemLocation, c_uint, *mut c_void) -> CuResult;

const LOCATION_DEVICE: c_int = 1;
const LOCATION_HOST: c_int = 2;
const SET_PREFERRED_LOCATION: c_int = 3;
const UNSET_PREFERRED_LOCATION: c_int = 4;

/// Records a managed allocation (and the context it was made in).
pub fn record(ptr: CuDevicePtr, size: usize) {
    let mut ctx = std::ptr::null_mut();
    if let Some(get) = crate::real::driver::<CtxGetCurrentFn>(c"cuCtxGetCurrent") {
        // SAFETY: a valid out-pointer.
        let _ = unsafe { get(&raw mut ctx) };
    }
    let mut m = memory();
    if m.context == 0 {
        m.context = ctx as usize;
    }
    m.allocs.push(Alloc { ptr, size });
}

/// Counts an allocation left native.
pub fn record_native(size: usize) {
    NATIVE.fetch_add(size as u64, Ordering::AcqRel);
}

/// Forgets a freed allocation.
pub fn forget(ptr: CuDevicePtr) {
    memory().allocs.retain(|a| a.ptr != ptr);
}

/// Blocks a launch or copy while the process's memory is evicted.
pub fn wait_resident(call: &str) {
    let mut m = memory();
    if m.evicted {
        eprintln!("mqfq-cuda: {call} waits for prefetch");
    }
    while m.evicted {
        m = RESIDENT
            .wait(m)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}

/// `(managed, resident, native, evicted)` bytes and state.
pub fn status() -> (u64, u64, u64, bool) {
    let m = memory();
    let managed: u64 = m.allocs.iter().map(|a| a.size as u64).sum();
    let resident = if m.evicted { 0 } else { managed };
    (managed, resident, NATIVE.load(Ordering::Acquire), m.evicted)
}

fn sync_in(context: usize) -> Result<(), String> {
    if let Some(set) = crate::real::driver::<CtxSetCurrentFn>(c"cuCtxSetCurrent") {
        // SAFETY: the context the allocations were made in (or null, the driver's default).
        let _ = unsafe { set(context as *mut c_void) };
    }
    let sync = crate::real::driver::<CtxSynchronizeFn>(c"cuCtxSynchronize")
        .ok_or("cuCtxSynchronize not found")?;
    // SAFETY: no arguments.
    let r = unsafe { sync() };
    if r == 0 {
        Ok(())
    } else {
        Err(format!("cuCtxSynchronize: CUDA error {r}"))
    }
}

fn move_all(allocs: &[Alloc], to: c_int, advice: c_int) -> Result<u64, String> {
    let advise =
        crate::real::driver::<MemAdviseFn>(c"cuMemAdvise_v2").ok_or("cuMemAdvise_v2 not found")?;
    let prefetch = crate::real::driver::<MemPrefetchFn>(c"cuMemPrefetchAsync_v2")
        .ok_or("cuMemPrefetchAsync_v2 not found")?;
    let loc = MemLocation { kind: to, id: 0 };
    let mut bytes = 0u64;
    for a in allocs {
        // SAFETY: ranges this process allocated as managed memory and has not freed.
        let r = unsafe { advise(a.ptr, a.size, advice, loc) };
        if r != 0 {
            return Err(format!("cuMemAdvise_v2: CUDA error {r}"));
        }
        // SAFETY: as above, on the default stream.
        let r = unsafe { prefetch(a.ptr, a.size, loc, 0, std::ptr::null_mut()) };
        if r != 0 {
            return Err(format!("cuMemPrefetchAsync_v2: CUDA error {r}"));
        }
        bytes += a.size as u64;
    }
    Ok(bytes)
}

/// Evict: hold new launches, finish running work, prefer the host and move everything there.
///
/// # Errors
/// A driver call failed; launches are let through again then.
pub fn evict() -> Result<u64, String> {
    let (allocs, context) = {
        let mut m = memory();
        m.evicted = true;
        (m.allocs.clone(), m.context)
    };
    let done = sync_in(context)
        .and_then(|()| move_all(&allocs, LOCATION_HOST, SET_PREFERRED_LOCATION))
        .and_then(|bytes| sync_in(context).map(|()| bytes));
    if done.is_err() {
        memory().evicted = false;
        RESIDENT.notify_all();
    }
    done
}

/// Prefetch: back to the device, then let launches run.
///
/// # Errors
/// A driver call failed (launches are let through anyway: the memory is still reachable).
pub fn prefetch() -> Result<u64, String> {
    let (allocs, context) = {
        let m = memory();
        (m.allocs.clone(), m.context)
    };
    let done = move_all(&allocs, LOCATION_DEVICE, UNSET_PREFERRED_LOCATION)
        .and_then(|bytes| sync_in(context).map(|()| bytes));
    memory().evicted = false;
    RESIDENT.notify_all();
    done
}
