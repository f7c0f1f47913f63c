//! The pool's moves for a container whose Warm tier is the driver's checkpoint API
//! ([`crate::checkpoint`]): the same orders, results and deadlines as the interposer's moves,
//! carried out by suspending and resuming the container's CUDA processes from the shim. Their
//! host PIDs are the container's own (`runc ps`, its cgroup), each checked by start time before
//! every call. A lock that does not come in time is "busy" (the container stays Hot, the pool
//! backs off), as a restore without GPU memory is past its deadline (the container stays Warm,
//! and its next burst or Resume tries again); any other failure fails the move. A container
//! whose processes exported or imported GPU memory (CUDA IPC, dma-buf, VMM, pools: its interposer
//! counts them) is never suspended: the driver does not support such memory. It leaves the pool
//! at the Pause or burst end whose status says so; one that shared since is refused here, by
//! the status a move begins with or by the last look with its processes locked.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::TaskService;

/// The longest a suspend waits for the processes' submitted work to end before it gives up for
/// now (the container stays Hot; the pool backs off and asks again).
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// What the driver gets past a move's window before the move counts as timed out.
const DRIVER_GRACE: Duration = Duration::from_secs(5);
use crate::checkpoint::{self, CkptError};
use crate::memory::Usage;
use crate::runtime::Runtime;
use crate::uvm::client::{Answer, Command};
use mqfq_proto::warm::Warm;

/// What a container's processes hold, as the pool sees it: under `checkpoint` every byte they
/// hold moves (native allocations and context alike), so all of it is the pool's to move.
pub(super) fn held_from(a: &Answer, warm: Warm) -> Usage {
    match warm {
        Warm::Checkpoint => Usage {
            managed: a.bytes.saturating_add(a.native.total()),
            native: crate::memory::Native {
                refused: a.native.refused,
                ..Default::default()
            },
        },
        Warm::Uvm | Warm::Off => Usage {
            managed: a.bytes,
            native: a.native,
        },
    }
}

/// Why a container whose processes share GPU memory (`shared` exports and IPC opens the
/// driver granted, as their interposers count them) is never checkpointed: r570's checkpoint
/// "does not support UVM or IPC memory", and leaves a process it fails on in no good state.
pub(super) fn shared_why(shared: u64) -> String {
    format!(
        "its processes share GPU memory with others ({shared} exports and imports: CUDA IPC, \
         dma-buf, VMM, pools), which the driver's checkpoint does not support: left on the GPU"
    )
}

/// The last look before a suspend, every process locked: did they share GPU memory since the
/// status the move began with (the container ran meanwhile)? Their interposers answer without
/// CUDA; one that cannot answer now makes the move wait for a later try.
fn unshared(ctl: &Path, id: &str, within: Duration) -> Result<(), CkptError> {
    let s = crate::uvm::client::send(ctl, id, Command::Status, within);
    if s.shared > 0 {
        Err(CkptError::Refused(shared_why(s.shared)))
    } else if s.sharing > 0 {
        Err(CkptError::NotNow(format!(
            "{} sharing calls of its processes under way",
            s.sharing
        )))
    } else if !s.ok() {
        Err(CkptError::NotNow(format!(
            "its status: {}",
            s.errors.join("; ")
        )))
    } else {
        Ok(())
    }
}

/// A container's one driver call in progress: taken before a move's thread starts, given back
/// when that thread ends (even one that outlived its move's deadline).
struct InFlight(Arc<AtomicBool>);

impl InFlight {
    fn take(flag: Arc<AtomicBool>) -> Option<Self> {
        (!flag.swap(true, Ordering::SeqCst)).then_some(InFlight(flag))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl TaskService {
    /// Under `checkpoint`, takes the container out of the pool as soon as a status says its
    /// processes share GPU memory (at a Pause, at a burst's end), so the pool never plans on
    /// its memory nor thaws it to be refused.
    pub(super) async fn drop_if_shared(&self, id: &str, a: &Answer, warm: Warm) {
        if warm == Warm::Checkpoint && a.shared > 0 {
            self.drop_from_pool(id, &shared_why(a.shared)).await;
        }
    }

    /// The GPU pairs mqfqd granted the container's lease with, as the driver takes them; none
    /// (restored where it was) when one is not a GPU UUID.
    pub(super) fn gpu_pairs(&self, id: &str) -> Vec<checkpoint::GpuPair> {
        let wire = self.gate.restore_onto(&self.namespace, id);
        let parsed: Result<Vec<_>, _> = wire
            .iter()
            .map(|(old, new)| checkpoint::GpuPair::parse(old, new))
            .collect();
        parsed.unwrap_or_else(|e| {
            tracing::warn!(container = %id, "restore onto another GPU: {e}; restored where it was");
            Vec::new()
        })
    }

    /// Suspends (`evict`) or resumes the container's CUDA processes through the driver (a
    /// resume onto other GPUs by `onto`'s pairs), within `within`; answered as the interposer's
    /// moves are. `dir` is its control directory, asked
    /// for the bytes before a suspend (its processes run then).
    pub(super) async fn checkpoint_move(
        &self,
        id: &str,
        runtime: &dyn Runtime,
        dir: &Path,
        evict: bool,
        onto: Vec<checkpoint::GpuPair>,
        within: Duration,
    ) -> Answer {
        let mut a = Answer::default();
        let Some((held, in_flight)) = ({
            let st = self.state.lock().await;
            st.containers
                .get(id)
                .and_then(|c| Some((c.gpu.held().managed, c.gpu.in_flight()?)))
        }) else {
            a.errors.push("no such container".into());
            return a;
        };
        let bytes = if evict {
            let s = super::pool::uvm(dir, id, Command::Status, self.pool_timeouts.status).await;
            if !s.ok() {
                // Without its figure nothing says what a suspend would move.
                a.errors
                    .push(format!("its status failed: {}", s.errors.join("; ")));
                return a;
            }
            if s.shared > 0 {
                // Shared since its last status: never handed to the driver (see `shared_why`).
                a.errors.push(shared_why(s.shared));
                return a;
            }
            held_from(&s, Warm::Checkpoint).managed
        } else {
            held
        };
        let pids = match runtime.ps(id).await {
            Ok(p) => p,
            Err(e) => {
                a.errors
                    .push(format!("its processes: {}", e.full_message()));
                return a;
            }
        };
        // One driver call at a time per container: a thread still in the driver from a move
        // that timed out (its process stalled it) is never joined by another.
        let Some(flight) = InFlight::take(in_flight) else {
            a.errors
                .push("a driver call for this container is still in progress".into());
            return a;
        };
        let driver = self.ckpt.clone();
        // From here the driver may have locked or suspended a process: a failure must be
        // followed by a restore before the container runs its GPU work again.
        a.acted = true;
        // The lock waits for the processes' submitted work only: a short deadline, so a
        // thawed container (running without a lease) is not given long; the rest of the
        // window is the copy's.
        let lock = within.min(LOCK_WAIT);
        let (ctl, key, ask) = (dir.to_owned(), id.to_owned(), self.pool_timeouts.status);
        let work = tokio::task::spawn_blocking(move || {
            let _flight = flight;
            let procs: Vec<_> = checkpoint::cuda_processes(&*driver, &pids)?
                .into_iter()
                .map(|(p, _)| p)
                .collect();
            let out = if evict {
                checkpoint::suspend_checked(&*driver, &procs, lock, &|| unshared(&ctl, &key, ask))
            } else {
                checkpoint::resume(&*driver, &procs, &onto, Instant::now() + within)
            };
            Ok::<_, CkptError>((procs.len(), out))
        });
        // The driver's calls other than the lock have no deadline of their own, and the process
        // is the container's: past the window (and a grace for the driver) the move has timed
        // out, and the caller drops the container from the pool; its thread may stay in the
        // driver, and until it leaves no other move of this container starts (above).
        let (found, out) = match tokio::time::timeout(within + DRIVER_GRACE, work).await {
            Err(_) => {
                a.timed_out = true;
                a.errors.push(format!(
                    "the driver did not answer within {} ms",
                    (within + DRIVER_GRACE).as_millis()
                ));
                return a;
            }
            Ok(Err(e)) => {
                a.errors.push(format!("checkpoint thread: {e}"));
                return a;
            }
            Ok(Ok(Err(e))) => {
                a.errors.push(e.to_string());
                return a;
            }
            Ok(Ok(Ok(r))) => r,
        };
        if evict && found == 0 && bytes > 0 {
            // Memory held and no process the driver knows: nothing was moved, whatever else.
            a.errors.push(format!(
                "{bytes} bytes held and no CUDA process of the container known to the driver"
            ));
            return a;
        }
        a.processes = out.done;
        // What moved: nothing when no process did (on a restore, its processes may have
        // exited meanwhile: nothing of them is held, and that is no failure).
        let bytes = if out.done > 0 { bytes } else { 0 };
        a.bytes = bytes;
        match out.error {
            None => {}
            Some(
                e @ (CkptError::LockTimeout { .. }
                | CkptError::OutOfMemory { .. }
                | CkptError::NotNow(_)),
            ) => {
                a.busy.push(e.to_string());
            }
            Some(e) => a.errors.push(e.to_string()),
        }
        tracing::info!(container = %id, evict, processes = a.processes, bytes,
            error = ?a.errors.first().or(a.busy.first()), "pool: checkpoint move");
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_driver_call_per_container_until_its_thread_ends() {
        let flag = Arc::new(AtomicBool::new(false));
        let first = InFlight::take(flag.clone()).expect("free");
        assert!(
            InFlight::take(flag.clone()).is_none(),
            "a second waits its turn"
        );
        // The first thread ends (even long after its move gave up on it): free again.
        std::thread::spawn(move || drop(first)).join().unwrap();
        assert!(InFlight::take(flag).is_some());
    }
}
