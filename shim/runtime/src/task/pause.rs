//! Pause: the container frozen, and its GPU slot given back with what its CUDA processes hold
//! (read before the freeze, while they can still answer), so the queue and the pool know.

use super::TaskService;
use super::pool::uvm;
use crate::error::Result;
use crate::memory::Usage;
use crate::runtime::Runtime;
use crate::uvm::client::Command;

/// The most processes a Pause's release names (a container's pid limit may be far higher).
const MAX_PAUSE_PIDS: usize = 1024;

impl TaskService {
    /// A pooled container's processes, for what NVML measures them holding: read frozen (none
    /// can start meanwhile), within the status deadline, at most [`MAX_PAUSE_PIDS`]; none when
    /// that fails, which only leaves the figure unmeasured.
    async fn pause_pids(&self, id: &str, runtime: &dyn Runtime) -> Vec<u32> {
        let read = tokio::time::timeout(self.pool_timeouts.status, runtime.ps(id)).await;
        let mut pids = match read {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                tracing::debug!(container = %id, "its processes not read at the pause: {e}");
                Vec::new()
            }
            Err(_) => {
                tracing::debug!(container = %id, "its processes not read at the pause in time");
                Vec::new()
            }
        };
        pids.truncate(MAX_PAUSE_PIDS);
        pids
    }

    /// Pause: freeze; the lease goes back, with the bytes its CUDA processes hold.
    ///
    /// # Errors
    /// `NOT_FOUND`, a transition not allowed now, or runc's failure to freeze.
    pub(super) async fn pause_task(&self, id: &str) -> Result<()> {
        let t = self.turn(id, true).await?;
        // Read while the processes can still answer, within a deadline.
        let held = match &t.ctl {
            Some(d) if t.pooled => {
                let a = uvm(d, id, Command::Status, self.pool_timeouts.status).await;
                if !a.ok() {
                    let why = format!("its status failed: {}", a.errors.join("; "));
                    self.drop_from_pool(id, &why).await;
                }
                self.drop_if_shared(id, &a, t.warm).await;
                let held = super::checkpoint::held_from(&a, t.warm);
                if let Some(c) = self.state.lock().await.containers.get_mut(id) {
                    c.gpu.set_held(held, false);
                }
                held
            }
            _ => Usage::default(),
        };
        self.report_exports(id).await;
        t.runtime.pause(id).await?;
        let pids = if t.pooled && t.work.is_some() {
            self.pause_pids(id, &*t.runtime).await
        } else {
            Vec::new()
        };
        // A frozen container uses no GPU time: its slot goes to the queue.
        if t.work.is_some() {
            self.gate
                .pause_release(&self.namespace, id, held, pids)
                .await;
            if self.pool_failed(id).await {
                // Not idle in the pool: its memory is never moved again.
                self.gate.cancel(&self.namespace, id).await;
            }
        }
        self.turned(id, true).await
    }
}
