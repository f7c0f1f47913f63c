//! The Warm tier by the CUDA driver's checkpoint API (`cuCheckpointProcess*`): the shim, as the
//! controller, suspends a container's CUDA processes whole (lock, then checkpoint: their GPU
//! memory, context included, goes to host memory and the GPU's is freed) and brings them back
//! (restore, then unlock). Nothing of their allocations is converted, so CUDA IPC, dma-buf,
//! pointer queries and graph capture behave as without the interposer.
//!
//! The driver acts on host PIDs. The ones used here come from the container's own cgroup
//! (`runc ps`) and are kept with the start time they had when first read: before every call the
//! PID is checked to be that process still, so a PID reused after it was found is never acted
//! on. What the API leaves open is the gap between `runc ps` and that first read, and between a
//! check and the driver's call (a PID-based API; SECURITY.md says what that gives a container).
//! What a container can do to its own processes through their checkpoint state is stall or fail
//! them, which the deadlines and the pool's failure path bound.
//!
//! `libcuda.so.1` (or `MQFQ_LIBCUDA`) is loaded into the shim the first time a container needs
//! it; a node without it, or a driver without the API, is a clear error on that container's
//! move ([`CkptError::Unavailable`]), never a failed shim.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::process::start_time;

/// A process's state as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcState {
    /// Running: its CUDA calls go on.
    Running,
    /// Locked: its CUDA calls wait.
    Locked,
    /// Checkpointed: its GPU memory is on the host.
    Checkpointed,
    /// The driver gave up on it.
    Failed,
    /// A value this shim does not know (a newer driver's transient state): not ours to touch.
    Other(i32),
}

impl ProcState {
    fn from_raw(v: i32) -> Self {
        match v {
            0 => ProcState::Running,
            1 => ProcState::Locked,
            2 => ProcState::Checkpointed,
            3 => ProcState::Failed,
            v => ProcState::Other(v),
        }
    }
}

/// Why a checkpoint call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CkptError {
    /// The library or the API is missing.
    #[error("the CUDA driver's checkpoint API is not available: {0}")]
    Unavailable(String),
    /// The process did not reach locked within the deadline (work still running).
    #[error("process {pid} did not lock within {ms} ms")]
    LockTimeout {
        /// Host PID.
        pid: u32,
        /// The deadline.
        ms: u64,
    },
    /// A restore found no room on the GPU (the process stays checkpointed).
    #[error("process {pid}: no GPU memory to restore into")]
    OutOfMemory {
        /// Host PID.
        pid: u32,
    },
    /// The PID is no longer the process it was (exited, or reused).
    #[error("process {pid} is gone")]
    Gone {
        /// Host PID.
        pid: u32,
    },
    /// The process is in a state the move cannot start from (failed, or unknown to this shim).
    #[error("process {pid} is {state:?}")]
    State {
        /// Host PID.
        pid: u32,
        /// Its state.
        state: ProcState,
    },
    /// The caller's last look, with every process locked, refused the checkpoint.
    #[error("checkpoint refused: {0}")]
    Refused(String),
    /// The caller's last look could not be taken now (the move is tried again later).
    #[error("not now: {0}")]
    NotNow(String),
    /// A GPU UUID that is not one (the pairs a restore onto another GPU was given).
    #[error("not a GPU UUID: {0:?}")]
    Uuid(String),
    /// More GPU pairs than the driver's count can say.
    #[error("{0} GPU pairs: too many")]
    Pairs(usize),
    /// Any other driver answer.
    #[error("{call}({pid}) returned CUDA error {code}")]
    Cuda {
        /// The call.
        call: &'static str,
        /// Host PID.
        pid: u32,
        /// The CUresult.
        code: i32,
    },
}

/// The driver's checkpoint calls, for another process. Blocking; callers run them off the async
/// threads.
pub trait Driver: Send + Sync + std::fmt::Debug {
    /// The process's state; an error for a process that is not a CUDA process of this driver.
    ///
    /// # Errors
    /// The driver's answer.
    fn state(&self, pid: u32) -> Result<ProcState, CkptError>;
    /// Locks the process once its submitted work is done, within `timeout`.
    ///
    /// # Errors
    /// [`CkptError::LockTimeout`] past the deadline, or the driver's answer.
    fn lock(&self, pid: u32, timeout: Duration) -> Result<(), CkptError>;
    /// Moves the locked process's GPU memory to host memory.
    ///
    /// # Errors
    /// The driver's answer.
    fn checkpoint(&self, pid: u32) -> Result<(), CkptError>;
    /// Brings a checkpointed process's memory back (it stays locked): where it was, or with
    /// `onto`'s pairs onto other GPUs of the same model.
    ///
    /// # Errors
    /// [`CkptError::OutOfMemory`], or the driver's answer.
    fn restore(&self, pid: u32, onto: &[GpuPair]) -> Result<(), CkptError>;
    /// Lets the locked process run.
    ///
    /// # Errors
    /// The driver's answer.
    fn unlock(&self, pid: u32) -> Result<(), CkptError>;
}

type GetState = unsafe extern "C" fn(i32, *mut i32) -> i32;
type PidCall = unsafe extern "C" fn(i32, *mut std::ffi::c_void) -> i32;
type CuInit = unsafe extern "C" fn(u32) -> i32;

/// One of a restore's `gpuPairs` (`CUcheckpointGpuPair`): the GPU a process was checkpointed on
/// and the one to restore it onto, each UUID as the driver's 16 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuPair {
    /// Where it was.
    pub old: [u8; 16],
    /// Where it goes.
    pub new: [u8; 16],
}

impl GpuPair {
    /// From two UUIDs as NVML spells them (`GPU-` and 32 hex digits grouped 8-4-4-4-12).
    ///
    /// # Errors
    /// [`CkptError::Uuid`] naming one that is not such a UUID (a MIG instance's included: the
    /// checkpoint API does not serve MIG).
    pub fn parse(old: &str, new: &str) -> Result<Self, CkptError> {
        Ok(GpuPair {
            old: uuid_bytes(old)?,
            new: uuid_bytes(new)?,
        })
    }
}

fn uuid_bytes(s: &str) -> Result<[u8; 16], CkptError> {
    let bad = || CkptError::Uuid(s.chars().take(64).collect());
    let hex = s.strip_prefix("GPU-").ok_or_else(bad)?;
    let groups: Vec<&str> = hex.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return Err(bad());
    }
    let digits: String = groups.concat();
    // Hex digits only (`from_str_radix` would take a sign).
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        let pair = digits.get(2 * i..2 * i + 2).ok_or_else(bad)?;
        *b = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// `cuCheckpointProcessRestore`'s arguments (`CUcheckpointRestoreArgs`): the pairs, their
/// count, reserved bytes to 56, a reserved word; 64 bytes.
#[repr(C)]
struct RestoreArgs {
    gpu_pairs: *mut GpuPair,
    gpu_pairs_count: u32,
    reserved: [u8; 44],
    reserved1: u64,
}

const _: () = assert!(std::mem::size_of::<RestoreArgs>() == 64);
const _: () = assert!(std::mem::size_of::<GpuPair>() == 32);

/// `cuCheckpointProcessLock`'s arguments (CUDA 12.8's layout: a timeout, then reserved words).
#[repr(C)]
struct LockArgs {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

/// The real driver, loaded on first use.
#[derive(Debug, Default)]
pub struct LibCuda {
    loaded: OnceLock<Result<Loaded, String>>,
}

#[derive(Debug)]
struct Loaded {
    // Kept loaded for as long as the function pointers are used.
    _lib: libloading::Library,
    get_state: GetState,
    lock: PidCall,
    checkpoint: PidCall,
    restore: PidCall,
    unlock: PidCall,
}

const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
const CUDA_ERROR_TIMEOUT: i32 = 909;

/// The library the shim loads: `MQFQ_LIBCUDA`, or `libcuda.so.1` found as `dlopen` finds it.
fn library_name() -> String {
    std::env::var("MQFQ_LIBCUDA")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "libcuda.so.1".into())
}

fn load() -> Result<Loaded, String> {
    let name = library_name();
    // SAFETY: loading the CUDA driver runs its initializers, which have no preconditions on our
    // side; a missing file is an error, not UB.
    let lib = unsafe { libloading::Library::new(&name) }.map_err(|e| format!("{name}: {e}"))?;
    // SAFETY: each symbol is looked up with the signature the driver API documents for it (the
    // argument structs as opaque pointers, passed null or as their documented layout); the
    // pointers are copied out while `lib` stays loaded in the same `Loaded`.
    unsafe {
        let sym = |n: &[u8]| -> Result<PidCall, String> {
            lib.get::<PidCall>(n)
                .map(|s| *s)
                .map_err(|e| format!("{name}: {e}"))
        };
        let get_state = *lib
            .get::<GetState>(b"cuCheckpointProcessGetState\0")
            .map_err(|e| format!("{name}: {e}"))?;
        let (lock, checkpoint, restore, unlock) = (
            sym(b"cuCheckpointProcessLock\0")?,
            sym(b"cuCheckpointProcessCheckpoint\0")?,
            sym(b"cuCheckpointProcessRestore\0")?,
            sym(b"cuCheckpointProcessUnlock\0")?,
        );
        // A restore needs an initialised driver in the caller (or persistence mode): tried
        // once, and a failure only logged (persistence mode may serve).
        if let Ok(init) = lib.get::<CuInit>(b"cuInit\0") {
            let rc = init(0);
            if rc != 0 {
                tracing::info!(
                    rc,
                    "cuInit in the shim failed; restores rely on persistence mode"
                );
            }
        }
        Ok(Loaded {
            _lib: lib,
            get_state,
            lock,
            checkpoint,
            restore,
            unlock,
        })
    }
}

fn pid_arg(pid: u32) -> Result<i32, CkptError> {
    i32::try_from(pid).map_err(|_| CkptError::Gone { pid })
}

impl LibCuda {
    fn get(&self) -> Result<&Loaded, CkptError> {
        self.loaded
            .get_or_init(load)
            .as_ref()
            .map_err(|e| CkptError::Unavailable(e.clone()))
    }

    fn call(
        &self,
        call: &'static str,
        pid: u32,
        f: impl Fn(&Loaded) -> PidCall,
    ) -> Result<(), CkptError> {
        let l = self.get()?;
        let p = pid_arg(pid)?;
        // SAFETY: a documented driver call for another process's PID with null arguments (the
        // driver takes NULL for its optional argument structs).
        let rc = unsafe { f(l)(p, std::ptr::null_mut()) };
        Self::answer(call, pid, rc)
    }

    fn answer(call: &'static str, pid: u32, rc: i32) -> Result<(), CkptError> {
        match rc {
            0 => Ok(()),
            CUDA_ERROR_OUT_OF_MEMORY if call == "cuCheckpointProcessRestore" => {
                Err(CkptError::OutOfMemory { pid })
            }
            code => Err(CkptError::Cuda { call, pid, code }),
        }
    }
}

impl Driver for LibCuda {
    fn state(&self, pid: u32) -> Result<ProcState, CkptError> {
        let l = self.get()?;
        let mut s = -1;
        // SAFETY: a documented driver call with a valid out-pointer.
        let rc = unsafe { (l.get_state)(pid_arg(pid)?, &raw mut s) };
        if rc == 0 {
            Ok(ProcState::from_raw(s))
        } else {
            Err(CkptError::Cuda {
                call: "cuCheckpointProcessGetState",
                pid,
                code: rc,
            })
        }
    }

    fn lock(&self, pid: u32, timeout: Duration) -> Result<(), CkptError> {
        let l = self.get()?;
        // 0 means no limit to the driver: at least 1 ms.
        let ms = u32::try_from(timeout.as_millis())
            .unwrap_or(u32::MAX)
            .max(1);
        let mut args = LockArgs {
            timeout_ms: ms,
            reserved0: 0,
            reserved1: [0; 7],
        };
        // SAFETY: a documented driver call; `args` has the documented layout and outlives it.
        let rc = unsafe { (l.lock)(pid_arg(pid)?, (&raw mut args).cast()) };
        match rc {
            0 => Ok(()),
            CUDA_ERROR_TIMEOUT => Err(CkptError::LockTimeout {
                pid,
                ms: u64::from(ms),
            }),
            code => Err(CkptError::Cuda {
                call: "cuCheckpointProcessLock",
                pid,
                code,
            }),
        }
    }

    fn checkpoint(&self, pid: u32) -> Result<(), CkptError> {
        self.call("cuCheckpointProcessCheckpoint", pid, |l| l.checkpoint)
    }

    fn restore(&self, pid: u32, onto: &[GpuPair]) -> Result<(), CkptError> {
        const CALL: &str = "cuCheckpointProcessRestore";
        if onto.is_empty() {
            return self.call(CALL, pid, |l| l.restore);
        }
        let l = self.get()?;
        let mut pairs = onto.to_vec();
        let mut args = RestoreArgs {
            gpu_pairs: pairs.as_mut_ptr(),
            gpu_pairs_count: u32::try_from(pairs.len())
                .map_err(|_| CkptError::Pairs(pairs.len()))?,
            reserved: [0; 44],
            reserved1: 0,
        };
        // SAFETY: a documented driver call; `args` has `CUcheckpointRestoreArgs`' layout (checked
        // size, reserved bytes zeroed) and it and the pairs it points to outlive the call.
        let rc = unsafe { (l.restore)(pid_arg(pid)?, (&raw mut args).cast()) };
        Self::answer(CALL, pid, rc)
    }

    fn unlock(&self, pid: u32) -> Result<(), CkptError> {
        self.call("cuCheckpointProcessUnlock", pid, |l| l.unlock)
    }
}

/// One CUDA process of a container: its host PID and the start time it had when found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaProc {
    pid: u32,
    started: u64,
}

impl CudaProc {
    /// Its host PID.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the PID is still this process.
    fn same(&self) -> Result<(), CkptError> {
        (start_time(self.pid) == Some(self.started))
            .then_some(())
            .ok_or(CkptError::Gone { pid: self.pid })
    }
}

/// The CUDA processes among `pids` (a container's, from its cgroup): those the driver knows,
/// with their state. A PID the driver does not know is not a CUDA process; one that is gone is
/// skipped.
///
/// # Errors
/// The driver's API is not there ([`CkptError::Unavailable`]): nothing can be said of any.
pub fn cuda_processes(
    driver: &dyn Driver,
    pids: &[u32],
) -> Result<Vec<(CudaProc, ProcState)>, CkptError> {
    let mut found = Vec::new();
    for &pid in pids {
        let Some(started) = start_time(pid) else {
            continue;
        };
        let state = match driver.state(pid) {
            Ok(s) => s,
            Err(e @ CkptError::Unavailable(_)) => return Err(e),
            Err(_) => continue,
        };
        // Read again after the driver answered: the answer was this process's.
        if start_time(pid) == Some(started) {
            found.push((CudaProc { pid, started }, state));
        }
    }
    Ok(found)
}

/// What suspending or resuming a container's processes did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Processes now in the state asked for.
    pub done: usize,
    /// The first failure, if any.
    pub error: Option<CkptError>,
}

/// Unlocks those of `procs` still locked (a suspend that could not finish); a failure to is
/// logged (the caller reports why the suspend stopped, and a later restore unlocks them).
fn unlock_all(driver: &dyn Driver, procs: &[CudaProc]) {
    for p in procs {
        let r = p.same().and_then(|()| match driver.state(p.pid)? {
            ProcState::Locked => driver.unlock(p.pid),
            _ => Ok(()),
        });
        match r {
            Ok(()) | Err(CkptError::Gone { .. }) => {}
            Err(e) => tracing::warn!(pid = p.pid, "unlock after a failed suspend: {e}"),
        }
    }
}

/// Suspends `procs`: every one locked first (within `lock_timeout` in all), then each
/// checkpointed. A process that exited meanwhile is skipped (it holds nothing). A process that
/// does not lock in time leaves all of them running (unlocked again): the container stays Hot,
/// and the caller may try later. A failed checkpoint stops there and is reported, the processes
/// not yet checkpointed unlocked again (the failed one too, if still locked); those already
/// checkpointed stay so (a later resume restores them, and unlocks any an unlock missed).
pub fn suspend(driver: &dyn Driver, procs: &[CudaProc], lock_timeout: Duration) -> Outcome {
    suspend_checked(driver, procs, lock_timeout, &|| Ok(()))
}

/// [`suspend`], with a last look once every process is locked and before any is checkpointed:
/// `check` failing unlocks them all and is the outcome's error (nothing was checkpointed). The
/// shim asks there whether the processes shared GPU memory since it last asked (a locked
/// process makes no CUDA call, so the answer holds until the checkpoint).
pub fn suspend_checked(
    driver: &dyn Driver,
    procs: &[CudaProc],
    lock_timeout: Duration,
    check: &dyn Fn() -> Result<(), CkptError>,
) -> Outcome {
    let deadline = Instant::now() + lock_timeout;
    let mut locked = Vec::new();
    let mut out = Outcome::default();
    for p in procs {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = p.same().and_then(|()| match driver.state(p.pid)? {
            ProcState::Running => driver.lock(p.pid, left).map(|()| true),
            ProcState::Locked => Ok(true),
            // Suspended already (an earlier move whose report was lost).
            ProcState::Checkpointed => Ok(false),
            state @ (ProcState::Failed | ProcState::Other(_)) => {
                Err(CkptError::State { pid: p.pid, state })
            }
        });
        match r {
            Ok(true) => locked.push(*p),
            Ok(false) => out.done += 1,
            Err(CkptError::Gone { .. }) => {}
            Err(e) => {
                unlock_all(driver, &locked);
                out.error = Some(e);
                return out;
            }
        }
    }
    if let Err(e) = check() {
        unlock_all(driver, &locked);
        out.error = Some(e);
        return out;
    }
    for (i, p) in locked.iter().enumerate() {
        match p.same().and_then(|()| driver.checkpoint(p.pid)) {
            Ok(()) => out.done += 1,
            Err(CkptError::Gone { .. }) => {}
            Err(e) => {
                // This one too, if the driver left it locked.
                unlock_all(driver, &locked[i..]);
                out.error = Some(e);
                return out;
            }
        }
    }
    out
}

/// Resumes `procs`: each checkpointed one restored (with `onto`'s GPU pairs, when the node moved
/// it), then each locked one unlocked. A restore
/// without room is retried until `deadline` (the node reserved the memory; what is still in use
/// is being freed); past it the process stays checkpointed and the error says so. A process
/// that died meanwhile is not an error (nothing of it is held); one the driver gave up on is.
pub fn resume(
    driver: &dyn Driver,
    procs: &[CudaProc],
    onto: &[GpuPair],
    deadline: Instant,
) -> Outcome {
    let mut out = Outcome::default();
    // Once the driver refuses the pairs, the processes after it are restored where they were. A
    // driver that took them for an earlier process of the container has split it across two
    // GPUs then (the same driver, the same pairs: not expected): said, and mqfqd measures where
    // each runs at the lease's release.
    let mut pairs = onto;
    let mut moved = 0;
    for p in procs {
        let r = (|| -> Result<(), CkptError> {
            p.same()?;
            match driver.state(p.pid)? {
                ProcState::Checkpointed => {
                    loop {
                        match driver.restore(p.pid, pairs) {
                            Err(CkptError::OutOfMemory { .. }) if Instant::now() < deadline => {
                                std::thread::sleep(Duration::from_millis(20));
                                p.same()?;
                            }
                            // A driver that will not move it (an older one, or pairs it does
                            // not take): where it was, rather than not at all; mqfqd learns
                            // where it runs at the lease's release.
                            Err(e @ CkptError::Cuda { .. }) if !pairs.is_empty() => {
                                tracing::warn!(
                                    pid = p.pid,
                                    moved_before = moved,
                                    "restore onto another GPU refused ({e}); restored where it was"
                                );
                                pairs = &[];
                                p.same()?;
                            }
                            r => break r?,
                        }
                    }
                    moved += usize::from(!pairs.is_empty());
                }
                ProcState::Running | ProcState::Locked => {}
                state @ (ProcState::Failed | ProcState::Other(_)) => {
                    return Err(CkptError::State { pid: p.pid, state });
                }
            }
            p.same()?;
            if driver.state(p.pid)? == ProcState::Locked {
                driver.unlock(p.pid)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => out.done += 1,
            Err(CkptError::Gone { .. }) => {}
            // A failure no retry mends outranks a want of memory: the caller must not wait
            // for memory to come back for a process that cannot be restored anyway.
            Err(e) => match &out.error {
                None | Some(CkptError::OutOfMemory { .. }) => out.error = Some(e),
                Some(_) => {}
            },
        }
    }
    out
}

/// The driver the shim uses, shared by its containers.
pub type SharedDriver = Arc<dyn Driver>;

#[cfg(test)]
mod tests;
