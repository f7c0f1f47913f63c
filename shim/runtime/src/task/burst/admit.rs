//! A burst's admission: the lease asked of mqfqd (fail-closed: for as long as a process
//! waits), never taken or kept while the container is paused, and evicted memory restored
//! before the burst's first call runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::TaskService;
use super::{After, Book, Ended};
use crate::error::Error;
use crate::gate::Kind;

/// How long a burst whose restore found no GPU memory waits before it asks for a slot again.
const RESTORE_RETRY: Duration = Duration::from_millis(200);

impl TaskService {
    /// Asks `mqfqd` for the container's burst lease, restores evicted memory once granted,
    /// and tells the waiting processes.
    pub(super) async fn admit_burst(&self, id: &str, book: &Arc<Book>) {
        let found = {
            let st = self.state.lock().await;
            st.containers
                .get(id)
                .and_then(|c| Some((c.gpu.work()?.clone(), c.pool_lock.clone(), c.gpu.pooled())))
        };
        let Some((work, lock, pooled)) = found else {
            book.admitted(Some("no such GPU container".into()));
            return;
        };
        book.no_release_pending().await;
        let wait = book.pace(super::vouched_tail());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let result = loop {
            // A paused container's processes run only while the pool thaws it to move its
            // memory: a burst begun then waits for the container's Resume (a lease taken in
            // that window would be held, frozen, until then).
            while self.is_paused(id).await {
                if book.lock().waiting.is_empty() {
                    book.admitted(Some("the container is paused".into()));
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if let Err(e) = self.admit_until_answered(id, book, &work, pooled).await {
                break Err(e);
            }
            // Memory the pool evicted comes back before the burst's first call runs; a move
            // in progress (or a Pause, which holds the same lock) finishes first.
            let moving = lock.lock().await;
            if self.is_paused(id).await {
                // Paused while it waited in the queue: a frozen container must not hold the
                // slot until its Resume. The grant goes straight back (no service measured:
                // its flow keeps the dispatch's estimate, as for any grant nobody could use)
                // and the burst waits for the Resume, then for a slot again.
                drop(moving);
                tracing::info!(container = %id, "burst lease granted while paused: handed back");
                // Its frozen processes cannot say what they hold: what was last known goes.
                self.hand_back(id).await;
                continue;
            }
            let restored = self.restore_for_burst(id).await;
            drop(moving);
            let Err(e) = restored else {
                break Ok(());
            };
            // Its processes are still suspended: the lease goes back (a locked process holds
            // no GPU work) and the memory stays where it is.
            self.hand_back(id).await;
            if !e.busy {
                break Err(format!("its GPU memory could not be restored: {}", e.why));
            }
            if book.lock().waiting.is_empty() {
                break Err("its GPU memory could not be restored, and nobody waits".into());
            }
            // No GPU memory free in time: the burst waits (its first call blocks meanwhile)
            // and asks for a slot again, as a restore without room waits for memory.
            tracing::info!(container = %id, "restore without room: the burst asks again");
            tokio::time::sleep(RESTORE_RETRY).await;
        };
        if book.admitted(result.err()) {
            self.after_burst(id, After::Release(Ended::nothing())).await;
            book.released();
        }
    }

    /// Asks mqfqd for the container's burst lease until it answers: fail-closed (the daemon is
    /// away, or no slot in time), the burst waits for as long as a process waits for it.
    async fn admit_until_answered(
        &self,
        id: &str,
        book: &Book,
        work: &crate::gpu::GpuWork,
        pooled: bool,
    ) -> std::result::Result<(), String> {
        loop {
            match self
                .gate
                .admit(&self.namespace, id, work, Kind::Burst, pooled)
                .await
            {
                Ok(()) => return Ok(()),
                Err(e @ (Error::Unavailable(_) | Error::DeadlineExceeded(_))) => {
                    if !book.lock().waiting.is_empty() {
                        tracing::info!(container = %id, "burst admission: {e}; waiting");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        if !book.lock().waiting.is_empty() {
                            continue;
                        }
                    }
                    return Err(e.to_string());
                }
                Err(e) => {
                    let e = e.full_message();
                    tracing::warn!(container = %id, "burst admission refused: {e}");
                    return Err(e);
                }
            }
        }
    }

    async fn is_paused(&self, id: &str) -> bool {
        let st = self.state.lock().await;
        st.containers
            .get(id)
            .is_some_and(|c| c.init.status() == crate::process::Status::Paused)
    }

    /// Brings an evicted burst container's memory back (its processes are running).
    async fn restore_for_burst(&self, id: &str) -> Result<(), super::super::pool::NotRestored> {
        let dir = {
            let st = self.state.lock().await;
            st.containers
                .get(id)
                .filter(|c| c.gpu.evicted())
                .and_then(|c| c.gpu.ctl_dir().map(std::path::Path::to_path_buf))
        };
        match dir {
            Some(dir) => self.restore(id, &dir, Instant::now()).await,
            None => Ok(()),
        }
    }
}
