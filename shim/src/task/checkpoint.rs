//! The pool's moves for a container whose Warm tier is the driver's checkpoint API
//! ([`crate::checkpoint`]): the same orders, results and deadlines as the interposer's moves,
//! carried out by suspending and resuming the container's CUDA processes from the shim. Their
//! host PIDs are the container's own (`runc ps`, its cgroup), each checked by start time before
//! every call. A lock that does not come in time is "busy" (the container stays Hot, the pool
//! backs off), as a restore without GPU memory is past its deadline (the container stays Warm,
//! and its next burst or Resume tries again); any other failure fails the move.

use std::path::Path;
use std::time::{Duration, Instant};

use super::TaskService;
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

impl TaskService {
    /// Suspends (`evict`) or resumes the container's CUDA processes through the driver, within
    /// `within`; answered as the interposer's moves are. `dir` is its control directory, asked
    /// for the bytes before a suspend (its processes run then).
    pub(super) async fn checkpoint_move(
        &self,
        id: &str,
        runtime: &dyn Runtime,
        dir: &Path,
        evict: bool,
        within: Duration,
    ) -> Answer {
        let mut a = Answer::default();
        let bytes = if evict {
            let s = super::pool::uvm(dir, id, Command::Status, self.pool_timeouts.status).await;
            held_from(&s, Warm::Checkpoint).managed
        } else {
            let st = self.state.lock().await;
            st.containers.get(id).map_or(0, |c| c.held.managed)
        };
        let pids = match runtime.ps(id).await {
            Ok(p) => p,
            Err(e) => {
                a.errors.push(format!("its processes: {e}"));
                return a;
            }
        };
        let driver = self.ckpt.clone();
        let done = tokio::task::spawn_blocking(move || {
            let procs: Vec<_> = checkpoint::cuda_processes(&*driver, &pids)
                .into_iter()
                .map(|(p, _)| p)
                .collect();
            if evict {
                checkpoint::suspend(&*driver, &procs, within)
            } else {
                checkpoint::resume(&*driver, &procs, Instant::now() + within)
            }
        })
        .await;
        let out = match done {
            Ok(o) => o,
            Err(e) => {
                a.errors.push(format!("checkpoint thread: {e}"));
                return a;
            }
        };
        a.processes = out.done;
        a.bytes = bytes;
        match out.error {
            None => {}
            Some(e @ (CkptError::LockTimeout { .. } | CkptError::OutOfMemory { .. })) => {
                a.busy.push(e.to_string());
            }
            Some(e) => a.errors.push(e.to_string()),
        }
        tracing::info!(container = %id, evict, processes = a.processes, bytes,
            error = ?a.errors.first().or(a.busy.first()), "pool: checkpoint move");
        a
    }
}
