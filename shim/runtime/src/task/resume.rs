//! Resume: a gated container waits for admission, is thawed, and has its evicted memory
//! brought back before Resume returns; a burst-mode container resumes at once (its next burst is
//! admitted, and its memory restored, when it comes). A restore the checkpoint backend cannot do
//! fails the Resume with the container frozen again and its lease handed back.

use std::time::Instant;

use super::TaskService;
use crate::error::{Error, Result};
use crate::gate::Kind;
use crate::memory::Usage;

impl TaskService {
    /// Resume: wait for admission, thaw, restore evicted memory.
    ///
    /// # Errors
    /// `NOT_FOUND`, a transition not allowed now, the queue's refusal (fail-closed), runc's
    /// failure to thaw, or `FAILED_PRECONDITION` when its memory could not be restored.
    pub(super) async fn resume_task(&self, id: &str) -> Result<()> {
        let t = self.turn(id, false).await?;
        // One paused mid-burst goes on with that burst once thawed, so like any other container
        // it takes a lease (kind burst) first.
        let (gated, kind) = match &t.book {
            None => (t.work.is_some(), Kind::Resume),
            Some(b) => (t.work.is_some() && b.held(), Kind::Burst),
        };
        if let (true, Some(w)) = (gated, &t.work) {
            self.gate
                .admit(&self.namespace, id, w, kind, t.pooled)
                .await?;
            if t.book.as_ref().is_some_and(|b| !b.regranted()) {
                // Its processes went away while it waited: nobody will end that burst.
                self.gate
                    .release(&self.namespace, id, "idle", Usage::default())
                    .await;
            }
        }
        let thawed = Instant::now();
        if let Err(e) = t.runtime.resume(id).await {
            if gated {
                self.release_lease(id, true, "resume failed").await;
            }
            return Err(e);
        }
        if let (true, Some(d)) = (gated, &t.ctl)
            && let Err(e) = self.restore(id, d, thawed).await
        {
            // Its processes are still suspended: it must not run, or hold a slot, so. Frozen
            // again and its lease given back as one it could not use (the pool keeps it, Warm);
            // containerd sees the Resume fail and the container still paused.
            let mut frozen = t.runtime.pause(id).await;
            if frozen.is_err() {
                frozen = t.runtime.pause(id).await;
            }
            self.hand_back(id).await;
            if let Err(f) = frozen {
                tracing::error!(container = %id, "freeze after a failed restore: {f}; the container runs while containerd sees it paused");
            }
            return Err(Error::FailedPrecondition(format!(
                "container {id}: its GPU memory could not be restored{}: {}",
                if e.busy {
                    " (no GPU memory free in time)"
                } else {
                    ""
                },
                e.why
            )));
        }
        self.turned(id, false).await
    }
}
