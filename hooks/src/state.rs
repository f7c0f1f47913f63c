//! What the interposer knows about its process: whether it converts allocations, the managed
//! allocations it made, whether they are evicted (launches then wait), and the evict / prefetch
//! steps themselves.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::{CuDevicePtr, CuResult};

#[derive(Clone, Copy, Debug)]
struct Alloc {
    ptr: CuDevicePtr,
    size: usize,
}

#[derive(Debug, Default)]
struct Memory {
    /// Converted allocations: base → size (ordered, so a pointer inside one is found).
    allocs: BTreeMap<CuDevicePtr, usize>,
    context: usize,
    /// The device of that context (where prefetches go back to).
    device: c_int,
    evicted: bool,
    /// An evict or prefetch is under way (a waiting call does not prefetch over it).
    moving: bool,
    /// Gated calls past their residency check and not yet returned. An evict waits for them:
    /// a thread frozen (by a Pause) between the check and the driver would otherwise launch
    /// on evicted memory once thawed for the move, pulling it back behind the pool's back.
    in_calls: u32,
}

static MEMORY: Mutex<Memory> = Mutex::new(Memory {
    allocs: BTreeMap::new(),
    context: 0,
    device: 0,
    evicted: false,
    moving: false,
    in_calls: 0,
});
static RESIDENT: Condvar = Condvar::new();
/// Native allocations counted apart: (kind, pointer or handle) → bytes.
static APART: Mutex<BTreeMap<(Apart, u64), u64>> = Mutex::new(BTreeMap::new());

/// The kinds of allocations left native and counted apart: the allocators that cannot give
/// managed memory, and `cuMemAlloc` allocations kept native on purpose (see `compat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Apart {
    /// `cuMemCreate`.
    Vmm,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`.
    Async,
    /// `cuArrayCreate` / `cuArray3DCreate`.
    Array,
    /// `cuMemAlloc` kept native by the function's setting (`MQFQ_NATIVE=all`).
    Setting,
    /// `cuMemAlloc` called from a listed library (NCCL, UCX, MPI, …).
    Library,
    /// `cuMemAlloc` after this process asked to export converted memory.
    Export,
    /// `cuMemAlloc` left native because conversion failed (`cuMemAllocManaged` refused).
    Other,
}

impl Apart {
    /// The kinds a `cuMemAlloc` pointer (freed by `cuMemFree`) can be counted as.
    pub const POINTER_KINDS: [Apart; 5] = [
        Apart::Async,
        Apart::Setting,
        Apart::Library,
        Apart::Export,
        Apart::Other,
    ];
}

/// Bytes held native, per kind, and the export requests refused on converted memory: the
/// interposer's copy of `scheduler_core::native::Native`, field for field (the interposer, loaded
/// into every CUDA process, links no project crate; the control socket's `status` line carries
/// it to the shim).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Native {
    pub vmm: u64,
    pub stream_ordered: u64,
    pub array: u64,
    pub setting: u64,
    pub library: u64,
    pub export: u64,
    pub other: u64,
    pub refused: u64,
}

impl Native {
    /// `cuMemAlloc` bytes left native, whatever the reason.
    pub fn alloc_native(&self) -> u64 {
        self.setting + self.library + self.export + self.other
    }
}

fn apart() -> MutexGuard<'static, BTreeMap<(Apart, u64), u64>> {
    APART
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Counts a native allocation of `kind`. The fork handlers are in place from the first count
/// (a child forked after it starts empty), so the process's first setup keeps what was counted
/// before it (an application whose first allocation is VMM, stream-ordered or an array).
pub fn apart_add(kind: Apart, id: u64, bytes: u64) {
    at_fork();
    apart().insert((kind, id), bytes);
}

/// Forgets one.
pub fn apart_remove(kind: Apart, id: u64) {
    apart().remove(&(kind, id));
}

/// Forgets a freed `cuMemAlloc` / stream-ordered pointer, whichever kind it was counted as.
pub fn apart_remove_pointer(ptr: CuDevicePtr) {
    let mut a = apart();
    for k in Apart::POINTER_KINDS {
        a.remove(&(k, ptr));
    }
}

/// Bytes held per kind, and the refused exports.
pub fn native() -> Native {
    let mut t = Native {
        refused: REFUSED.load(Ordering::Acquire),
        ..Native::default()
    };
    for (&(k, _), &b) in apart().iter() {
        let slot = match k {
            Apart::Vmm => &mut t.vmm,
            Apart::Async => &mut t.stream_ordered,
            Apart::Array => &mut t.array,
            Apart::Setting => &mut t.setting,
            Apart::Library => &mut t.library,
            Apart::Export => &mut t.export,
            Apart::Other => &mut t.other,
        };
        *slot = slot.saturating_add(b);
    }
    t
}

/// Export requests (IPC, dma-buf, RDMA tokens) the driver refused on converted memory.
static REFUSED: AtomicU64 = AtomicU64::new(0);
/// Set by the first refused export: this process's later allocations stay native.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Counts an export the driver refused on converted memory, and turns conversion off for the
/// process's later allocations. `true` the first time.
pub fn export_refused() -> bool {
    REFUSED.fetch_add(1, Ordering::AcqRel);
    !EXPORTING.swap(true, Ordering::AcqRel)
}

/// GPU memory this process shares with another through the driver: exports (CUDA IPC, dma-buf)
/// and IPC opens the driver granted. The driver's checkpoint does not support such memory (r570:
/// "does not support UVM or IPC memory"), so the shim never checkpoints a process that has any.
static SHARED: AtomicU64 = AtomicU64::new(0);

/// Sharing calls under way in this process (entered, not yet answered by the driver).
static SHARING: AtomicU64 = AtomicU64::new(0);

/// A sharing call begins: counted as under way before the driver is called, so a look at the
/// process while the driver holds the call (a checkpoint lock) sees it. Sets the process up
/// first (its control socket, where the shim reads the counts): a process that only opens
/// another's memory never allocates, which is where that otherwise happens.
pub fn sharing_begins() {
    let _ = converting();
    SHARING.fetch_add(1, Ordering::AcqRel);
}

/// The sharing call begun with [`sharing_begins`] ended: counted as shared if the driver
/// granted it.
pub fn sharing_ends(granted: bool) {
    if granted {
        SHARED.fetch_add(1, Ordering::AcqRel);
    }
    SHARING.fetch_sub(1, Ordering::AcqRel);
}

/// Exports and imports the driver granted this process, and sharing calls under way.
pub fn shared() -> (u64, u64) {
    (
        SHARED.load(Ordering::Acquire),
        SHARING.load(Ordering::Acquire),
    )
}

/// Whether this process asked to export converted memory (its later allocations stay native).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Acquire)
}

/// The converted allocation `ptr` points into: `(base, size)`.
pub fn converted(ptr: CuDevicePtr) -> Option<(CuDevicePtr, usize)> {
    let m = memory();
    let (&base, &size) = m.allocs.range(..=ptr).next_back()?;
    (ptr - base < size as u64).then_some((base, size))
}
/// The pid this process's setup was done for (0: not yet; a forked child sees its parent's).
static SETUP_PID: AtomicU32 = AtomicU32::new(0);
static CONVERTING: AtomicU32 = AtomicU32::new(0);

fn memory() -> MutexGuard<'static, Memory> {
    MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The interposer's locks, held together.
type BothLocks = (
    MutexGuard<'static, ()>,
    MutexGuard<'static, Memory>,
    MutexGuard<'static, BTreeMap<(Apart, u64), u64>>,
    crate::burst::Guard,
    MutexGuard<'static, Option<std::collections::HashMap<usize, bool>>>,
);

thread_local! {
    /// The locks the forking thread holds across `fork` (see [`at_fork`]).
    static FORK_HELD: std::cell::RefCell<Option<BothLocks>> =
        const { std::cell::RefCell::new(None) };
}

extern "C" fn fork_prepare() {
    // Read before the fork, so a child never inherits the policy half read by another thread.
    let _ = crate::compat::policy();
    // Taken in the same order as everywhere else (memory, then apart; the burst lock is never
    // held with either), so a fork never copies a lock another thread held mid-update into
    // the child.
    // The return-address cache's lock is a leaf (never held while taking another): last.
    let held = (
        // The burst monitor's lock comes before every other (it is taken before the burst's).
        crate::burst::monitor_lock(),
        memory(),
        apart(),
        crate::burst::lock_for_fork(),
        crate::compat::pcs_for_fork(),
    );
    FORK_HELD.with(|h| *h.borrow_mut() = Some(held));
}

extern "C" fn fork_parent() {
    FORK_HELD.with(|h| drop(h.borrow_mut().take()));
}

extern "C" fn fork_child() {
    // The child has one thread, this one: its copies of the locks are ours to reset and release.
    // CUDA state does not survive fork, so the child starts with an empty table and sets itself
    // up (its own control socket) on its first CUDA call.
    FORK_HELD.with(|h| {
        if let Some((_monitor, mut m, mut a, mut b, mut pcs)) = h.borrow_mut().take() {
            *m = Memory::default();
            a.clear();
            crate::burst::reset_in_child(&mut b);
            *pcs = None;
        }
    });
    crate::control::close_in_child();
    REFUSED.store(0, Ordering::Release);
    EXPORTING.store(false, Ordering::Release);
    SHARED.store(0, Ordering::Release);
    SHARING.store(0, Ordering::Release);
    SETUP_PID.store(0, Ordering::Release);
    CONVERTING.store(0, Ordering::Release);
}

/// Registers the fork handlers, once per process.
pub(crate) fn at_fork() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        // SAFETY: three `extern "C" fn()` with static lifetime; pthread_atfork only stores them.
        let r = unsafe {
            libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child))
        };
        if r != 0 {
            log!("pthread_atfork: error {r}; a child forked mid-update may lose its table");
        }
    });
}

/// Whether allocations are converted; sets the process up on first use, and again in a forked
/// child (which gets its own control socket and an empty table: CUDA state does not survive
/// fork).
pub fn converting() -> bool {
    at_fork();
    let pid = std::process::id();
    if SETUP_PID.load(Ordering::Acquire) == pid {
        return CONVERTING.load(Ordering::Acquire) == 1;
    }
    let before = SETUP_PID.swap(pid, Ordering::AcqRel);
    if before == pid {
        return CONVERTING.load(Ordering::Acquire) == 1;
    }
    if before != 0 {
        // A child made without the fork handlers (a raw clone): its parent's counts are not its.
        apart().clear();
        SHARED.store(0, Ordering::Release);
    }
    {
        let mut m = memory();
        // Calls already under way (another thread's, racing this first use) stay counted.
        let in_calls = m.in_calls;
        *m = Memory {
            in_calls,
            ..Memory::default()
        };
    }
    REFUSED.store(0, Ordering::Release);
    EXPORTING.store(false, Ordering::Release);
    let on = match std::env::var_os("MQFQ_CTL_DIR") {
        Some(dir) => match crate::control::start(std::path::Path::new(&dir)) {
            Ok(()) => true,
            Err(e) => {
                log!("control socket: {e}; allocations stay native");
                false
            }
        },
        None => {
            log!("MQFQ_CTL_DIR is not set; allocations stay native");
            false
        }
    };
    CONVERTING.store(u32::from(on), Ordering::Release);
    on
}

type CtxGetCurrentFn = unsafe extern "C" fn(*mut *mut c_void) -> CuResult;
type CtxSetCurrentFn = unsafe extern "C" fn(*mut c_void) -> CuResult;
type CtxSynchronizeFn = unsafe extern "C" fn() -> CuResult;
type CtxGetDeviceFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type DriverGetVersionFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
/// CUDA ≤ 12.1: `cuMemAdvise(ptr, n, advice, device)`, `cuMemPrefetchAsync(ptr, n, device, stream)`.
type LegacyAdviseFn = unsafe extern "C" fn(CuDevicePtr, usize, c_int, c_int) -> CuResult;
type LegacyPrefetchFn = unsafe extern "C" fn(CuDevicePtr, usize, c_int, *mut c_void) -> CuResult;
/// `CU_DEVICE_CPU`.
const DEVICE_CPU: c_int = -1;

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
    let mut device: c_int = 0;
    if let Some(get) = crate::real::driver::<CtxGetDeviceFn>(c"cuCtxGetDevice") {
        // SAFETY: a valid out-pointer.
        let _ = unsafe { get(&raw mut device) };
    }
    let mut m = memory();
    if m.context == 0 {
        m.context = ctx as usize;
        m.device = device;
    }
    m.allocs.insert(ptr, size);
}

/// Forgets a freed allocation.
pub fn forget(ptr: CuDevicePtr) {
    memory().allocs.remove(&ptr);
}

fn list(m: &Memory) -> Vec<Alloc> {
    m.allocs
        .iter()
        .map(|(&ptr, &size)| Alloc { ptr, size })
        .collect()
}

/// How long a launch or copy waits for the shim's prefetch before the process prefetches its
/// memory itself: `MQFQ_EVICT_WAIT_MS`, default 30 s. The shim restores memory at Resume within
/// milliseconds; a process thawed some other way (a resume outside the shim, a shim that gave up
/// on a move) must not hang forever.
fn evict_wait() -> std::time::Duration {
    static MS: AtomicU64 = AtomicU64::new(0);
    let mut ms = MS.load(Ordering::Relaxed);
    if ms == 0 {
        ms = std::env::var("MQFQ_EVICT_WAIT_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|v| *v > 0)
            .unwrap_or(30_000);
        MS.store(ms, Ordering::Relaxed);
    }
    std::time::Duration::from_millis(ms)
}

/// A gated call on its way through the driver (see [`wait_resident`]); dropped when it returns.
#[must_use = "held across the driver call"]
pub struct InCall(());

impl Drop for InCall {
    fn drop(&mut self) {
        let mut m = memory();
        // Saturating: a forked child starts from a fresh table (no thread of the child is in
        // a call at fork).
        m.in_calls = m.in_calls.saturating_sub(1);
        // Only an evict waits for the count (and it holds `moving`, set under this lock): the
        // common call pays no wake-up.
        let wake = m.in_calls == 0 && m.moving;
        drop(m);
        if wake {
            RESIDENT.notify_all();
        }
    }
}

/// Blocks a launch or copy while the process's memory is evicted, at most
/// [`evict_wait`]; then (unless a move is under way) prefetches it itself and goes on. The
/// call counts as in flight until the returned guard drops.
pub fn wait_resident(call: &str) -> InCall {
    let mut m = memory();
    if m.evicted {
        log!("{call} waits for prefetch");
        m = hold_while_evicted(m, call);
    }
    m.in_calls += 1;
    InCall(())
}

fn hold_while_evicted<'a>(mut m: MutexGuard<'a, Memory>, call: &str) -> MutexGuard<'a, Memory> {
    let deadline = std::time::Instant::now() + evict_wait();
    while m.evicted {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() && !m.moving {
            drop(m);
            log!(
                "{call}: no prefetch within {:?}: prefetching itself",
                evict_wait()
            );
            if let Err(e) = prefetch() {
                log!("self-prefetch: {e}");
            }
            m = memory();
            continue;
        }
        let wait = if left.is_zero() {
            std::time::Duration::from_millis(100)
        } else {
            left
        };
        m = RESIDENT
            .wait_timeout(m, wait)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
    m
}

/// How long an evict waits for the gated calls already under way to return before it gives
/// up (and lets launches through again): a launch thawed mid-way returns in microseconds; a
/// large pageable copy may take seconds, and one stuck behind host work that itself waits for
/// a held launch never returns. Giving up answers `busy`, which the shim takes as "not now"
/// (the container is frozen again and the pool tries later), not as a failed move.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Waits until no gated call is in flight, at most [`DRAIN_WAIT`]; how many are left.
fn drain(mut m: MutexGuard<'_, Memory>) -> (MutexGuard<'_, Memory>, u32) {
    let deadline = std::time::Instant::now() + DRAIN_WAIT;
    while m.in_calls > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        m = RESIDENT
            .wait_timeout(m, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
    let left = m.in_calls;
    (m, left)
}

/// `(managed, resident, evicted)` bytes and state.
pub fn status() -> (u64, u64, bool) {
    let m = memory();
    let managed: u64 = m.allocs.values().map(|&s| s as u64).sum();
    let resident = if m.evicted { 0 } else { managed };
    (managed, resident, m.evicted)
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

/// The driver's advise and prefetch, in whichever form it has: the location-based `_v2` entry
/// points (CUDA 12.2+), the same under their plain names (CUDA 13 renamed them), or the
/// device-number forms of CUDA 11 – 12.1.
enum Mover {
    Location(MemAdviseFn, MemPrefetchFn),
    Legacy(LegacyAdviseFn, LegacyPrefetchFn),
}

fn mover() -> Result<Mover, String> {
    use crate::real::driver;
    if let (Some(a), Some(p)) = (
        driver::<MemAdviseFn>(c"cuMemAdvise_v2"),
        driver::<MemPrefetchFn>(c"cuMemPrefetchAsync_v2"),
    ) {
        return Ok(Mover::Location(a, p));
    }
    let mut version: c_int = 0;
    if let Some(v) = driver::<DriverGetVersionFn>(c"cuDriverGetVersion") {
        // SAFETY: a valid out-pointer.
        let _ = unsafe { v(&raw mut version) };
    }
    if version >= 13000 {
        if let (Some(a), Some(p)) = (
            driver::<MemAdviseFn>(c"cuMemAdvise"),
            driver::<MemPrefetchFn>(c"cuMemPrefetchAsync"),
        ) {
            return Ok(Mover::Location(a, p));
        }
    } else if let (Some(a), Some(p)) = (
        driver::<LegacyAdviseFn>(c"cuMemAdvise"),
        driver::<LegacyPrefetchFn>(c"cuMemPrefetchAsync"),
    ) {
        return Ok(Mover::Legacy(a, p));
    }
    Err(format!(
        "no cuMemAdvise / cuMemPrefetchAsync in this driver (version {version})"
    ))
}

fn move_all(allocs: &[Alloc], to: c_int, advice: c_int, device: c_int) -> Result<u64, String> {
    let mover = mover()?;
    let loc = MemLocation {
        kind: to,
        id: if to == LOCATION_DEVICE { device } else { 0 },
    };
    let legacy_dev = if to == LOCATION_DEVICE {
        device
    } else {
        DEVICE_CPU
    };
    let mut bytes = 0u64;
    for a in allocs {
        // SAFETY: (both arms) ranges this process allocated as managed memory and has not
        // freed; prefetches on the default stream.
        let (r1, r2) = unsafe {
            match mover {
                Mover::Location(advise, prefetch) => (
                    advise(a.ptr, a.size, advice, loc),
                    prefetch(a.ptr, a.size, loc, 0, std::ptr::null_mut()),
                ),
                Mover::Legacy(advise, prefetch) => (
                    advise(a.ptr, a.size, advice, legacy_dev),
                    prefetch(a.ptr, a.size, legacy_dev, std::ptr::null_mut()),
                ),
            }
        };
        if r1 != 0 {
            return Err(format!("cuMemAdvise: CUDA error {r1}"));
        }
        if r2 != 0 {
            return Err(format!("cuMemPrefetchAsync: CUDA error {r2}"));
        }
        bytes += a.size as u64;
    }
    Ok(bytes)
}

/// Evict: hold new launches, let the calls under way return, finish running work, prefer the
/// host and move everything there.
///
/// # Errors
/// Calls still under way after [`DRAIN_WAIT`], or a driver call failed; launches are let
/// through again then.
pub fn evict() -> Result<u64, String> {
    let (allocs, context, device) = {
        let mut m = memory();
        m.evicted = true;
        m.moving = true;
        let (mut m, busy) = drain(m);
        if busy > 0 {
            m.evicted = false;
            m.moving = false;
            drop(m);
            RESIDENT.notify_all();
            return Err(format!(
                "busy: {busy} GPU call(s) still under way after {DRAIN_WAIT:?}"
            ));
        }
        (list(&m), m.context, m.device)
    };
    let done = sync_in(context)
        .and_then(|()| move_all(&allocs, LOCATION_HOST, SET_PREFERRED_LOCATION, device))
        .and_then(|bytes| sync_in(context).map(|()| bytes));
    let mut m = memory();
    m.moving = false;
    if done.is_err() {
        m.evicted = false;
    }
    drop(m);
    RESIDENT.notify_all();
    done
}

/// Prefetch: back to the device, then let launches run.
///
/// # Errors
/// A driver call failed (launches are let through anyway: the memory is still reachable).
pub fn prefetch() -> Result<u64, String> {
    let (allocs, context, device) = {
        let mut m = memory();
        m.moving = true;
        (list(&m), m.context, m.device)
    };
    let done = move_all(&allocs, LOCATION_DEVICE, UNSET_PREFERRED_LOCATION, device)
        .and_then(|bytes| sync_in(context).map(|()| bytes));
    {
        let mut m = memory();
        m.evicted = false;
        m.moving = false;
    }
    RESIDENT.notify_all();
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sharing_call_counts_as_under_way_until_the_driver_answers() {
        let (shared, sharing) = shared();
        sharing_begins();
        assert_eq!(super::shared(), (shared, sharing + 1));
        sharing_ends(true);
        sharing_begins();
        sharing_ends(false);
        assert_eq!(super::shared(), (shared + 1, sharing));
    }

    #[test]
    fn what_was_counted_before_the_first_setup_is_kept() {
        // A process that has not set up yet (as at its start) counts a VMM allocation first.
        SETUP_PID.store(0, Ordering::Release);
        apart_add(Apart::Vmm, 0x7e57_0000, 4096);
        let _ = converting();
        assert!(native().vmm >= 4096, "{:?}", native());
        apart_remove(Apart::Vmm, 0x7e57_0000);
    }
}
