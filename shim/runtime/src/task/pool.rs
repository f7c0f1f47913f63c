//! The pool agent: this shim's hands for `mqfqd`'s pool manager (Pause and Resume are in
//! `pause.rs` and `resume.rs`; what they share in `turn.rs`).
//!
//! A paused container's processes are frozen, so they cannot answer the interposer's control
//! socket. Moving a paused container's memory therefore takes a thaw, the move, and a freeze
//! again, serialized with the container's own Pause / Resume by its `pool_lock`; containerd
//! still sees it paused throughout (no events, state unchanged). The daemon decides; this
//! agent long-polls it for orders, carries them out, and reports each result while still
//! holding the container's lock, so a report can never overtake the one for a later move.
//!
//! Resume of a container whose memory was evicted restores it before the task runs: the lease
//! is granted, the container thawed, its memory prefetched (the interposer holds its launches
//! until then), and only then does Resume return. The shim keeps this truth itself (`evicted`),
//! so a container is restored even if the daemon lost track of it.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::TaskService;
use crate::api as mqfqd;
use crate::process::Status;
use crate::uvm::client::{self, Answer, Command};
use mqfq_proto::warm::Warm;

/// How long the processes of a container may take to evict or prefetch (they synchronize
/// first; 80 GB moves in a few seconds): past it the container is frozen again, reported
/// failed and dropped from the pool.
const MOVE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long they may take to say how much memory they hold (before a Pause).
const STATUS_TIMEOUT: Duration = Duration::from_secs(2);
/// The deadlines on a container's CUDA processes.
#[derive(Clone, Copy, Debug)]
pub(super) struct PoolTimeouts {
    pub(super) status: Duration,
    pub(super) moves: Duration,
}

impl Default for PoolTimeouts {
    /// The constants, or `MQFQ_POOL_MOVE_TIMEOUT_MS` for memory moves.
    fn default() -> Self {
        let moves = std::env::var("MQFQ_POOL_MOVE_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|ms| *ms > 0)
            .map_or(MOVE_TIMEOUT, Duration::from_millis);
        PoolTimeouts {
            status: STATUS_TIMEOUT,
            moves,
        }
    }
}

/// A container's processes that the driver did not bring back (see [`TaskService::restore`]).
#[derive(Debug)]
pub(super) struct NotRestored {
    /// For want of GPU memory in time: trying again later may succeed.
    pub(super) busy: bool,
    /// What the driver said.
    pub(super) why: String,
}

/// How long one PoolOrders call waits in the daemon.
const ORDERS_WAIT: Duration = Duration::from_secs(25);

/// One command to a container's CUDA processes, off the async threads, bounded by `timeout`.
pub(super) async fn uvm(dir: &Path, id: &str, cmd: Command, timeout: Duration) -> Answer {
    let (dir, id) = (dir.to_owned(), id.to_owned());
    tokio::task::spawn_blocking(move || client::send(&dir, &id, cmd, timeout))
        .await
        .unwrap_or_else(|e| Answer {
            errors: vec![format!("control client: {e}")],
            ..Answer::default()
        })
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl TaskService {
    /// After a thaw at Resume: brings evicted memory back before the task goes on.
    ///
    /// # Errors
    /// Under `checkpoint`, its processes could not be brought back (they stay suspended, and
    /// would block in their next CUDA call): [`NotRestored`] says whether for want of GPU
    /// memory (`busy`: the caller may try again) or for good. Under `uvm` a failed prefetch is
    /// no error: the interposer lets launches through and its memory pages in.
    pub(super) async fn restore(
        &self,
        id: &str,
        dir: &Path,
        thawed: Instant,
    ) -> std::result::Result<(), NotRestored> {
        let found = {
            let mut st = self.state.lock().await;
            st.containers.get_mut(id).and_then(|c| {
                c.gpu
                    .take_evicted()
                    .then(|| (c.gpu.warm(), c.runtime.clone()))
            })
        };
        if found.is_none() {
            return Ok(());
        }
        let checkpoint = matches!(found, Some((Warm::Checkpoint, _)));
        let a = match found {
            Some((Warm::Checkpoint, runtime)) => {
                let onto = self.gpu_pairs(id);
                self.checkpoint_move(id, &*runtime, dir, false, onto, self.pool_timeouts.moves)
                    .await
            }
            _ => uvm(dir, id, Command::Prefetch, self.pool_timeouts.moves).await,
        };
        let failed = checkpoint && !(a.ok() && a.busy.is_empty());
        if failed && let Some(c) = self.state.lock().await.containers.get_mut(id) {
            // Still (partly) suspended: whoever runs it next restores it first.
            c.gpu.moved(true);
        }
        if failed && !a.ok() {
            // Not for want of memory: no order moves it again (a Resume still tries).
            self.drop_from_pool(id, "its processes could not be restored")
                .await;
        }
        if !a.ok() {
            // The interposer lets launches through after a failed prefetch (and prefetches
            // itself after its bounded wait): the memory is still reachable, only slower.
            tracing::warn!(container = %id, "restore: {}", a.errors.join("; "));
        }
        if a.timed_out {
            self.drop_from_pool(id, "did not restore its memory in time")
                .await;
        }
        let why = a
            .errors
            .iter()
            .chain(&a.busy)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        let ok = a.ok() && a.busy.is_empty();
        tracing::info!(container = %id, bytes = a.bytes, ok, ms = thawed.elapsed().as_secs_f64() * 1e3, "restored");
        self.orders
            .pool_report(vec![mqfqd::PoolResult {
                namespace: self.namespace.clone(),
                container_id: id.to_owned(),
                action: mqfqd::PoolAction::RESTORE.into(),
                ok,
                bytes: a.bytes,
                duration_ns: nanos(thawed.elapsed()),
                error: why.clone(),
                ..Default::default()
            }])
            .await;
        if failed {
            return Err(NotRestored { busy: a.ok(), why });
        }
        Ok(())
    }

    /// How long moving `bytes` may take: 2 s plus 1 GiB/s, at most the move timeout.
    fn move_deadline(&self, bytes: u64) -> Duration {
        #[expect(
            clippy::cast_precision_loss,
            reason = "a deadline in seconds: rounding is harmless"
        )]
        let secs = 2.0 + bytes as f64 / f64::from(1u32 << 30);
        self.pool_timeouts
            .moves
            .min(Duration::from_secs_f64(secs.min(3600.0)))
    }

    /// Whether a container was dropped from the pool.
    pub(super) async fn pool_failed(&self, id: &str) -> bool {
        self.state
            .lock()
            .await
            .containers
            .get(id)
            .is_some_and(|c| c.gpu.dropped())
    }

    /// A container whose processes did not answer in time: its memory is never moved again
    /// (no more thaws for it), and it runs unpooled from now on.
    pub(super) async fn drop_from_pool(&self, id: &str, why: &str) {
        let mut st = self.state.lock().await;
        if let Some(c) = st.containers.get_mut(id)
            && c.gpu.drop_from_pool()
        {
            tracing::warn!(container = %id, "dropped from the GPU memory pool: {why}");
        }
    }

    /// Starts the loop that carries out the daemon's pool orders (once per shim).
    pub(super) fn start_pool_agent(&self) {
        if self.pool_agent.swap(true, Ordering::SeqCst) {
            return;
        }
        let svc = self.clone();
        tokio::spawn(async move {
            loop {
                for o in svc.orders.pool_orders(ORDERS_WAIT).await {
                    svc.run_order(&o).await;
                }
            }
        });
    }

    /// Carries out one order and reports it.
    pub(super) async fn run_order(&self, o: &mqfqd::PoolOrder) {
        let id = o.container_id.as_str();
        let mut r = mqfqd::PoolResult {
            namespace: o.namespace.clone(),
            container_id: id.to_owned(),
            action: o.action,
            ..Default::default()
        };
        let found = if o.namespace == self.namespace {
            let st = self.state.lock().await;
            st.containers.get(id).map(|c| {
                (
                    c.runtime.clone(),
                    c.gpu.ctl_dir().map(Path::to_path_buf),
                    c.pool_lock.clone(),
                    c.gpu.dropped(),
                    c.gpu.book().cloned(),
                )
            })
        } else {
            None
        };
        let Some((runtime, ctl, lock, failed, book)) = found else {
            r.gone = true;
            r.error = "no such container in this shim".into();
            self.orders.pool_report(vec![r]).await;
            return;
        };
        if failed {
            // The daemon forgets it: no order will thaw it again.
            r.gone = true;
            r.error = "not pooled (its Warm tier is off, or a memory move failed)".into();
            self.orders.pool_report(vec![r]).await;
            return;
        }
        // A Pause or Resume in progress (a Resume may wait long in the queue) makes the order
        // stale: skip it rather than hold up the orders for this shim's other containers.
        let Ok(_moving) = lock.try_lock() else {
            r.skipped = true;
            r.error = "pause or resume in progress".into();
            self.orders.pool_report(vec![r]).await;
            return;
        };
        let now = {
            let st = self.state.lock().await;
            st.containers
                .get(id)
                .map(|c| (c.init.status(), c.gpu.evicted()))
        };
        let started = Instant::now();
        match (now, o.action.enum_value()) {
            (None, _) => {
                r.gone = true;
                r.error = "deleted".into();
            }
            (
                Some((Status::Paused, evicted)),
                Ok(a @ (mqfqd::PoolAction::EVICT | mqfqd::PoolAction::PREFETCH)),
            ) if ctl.is_some() && (evicted || a == mqfqd::PoolAction::EVICT) => {
                let evict = a == mqfqd::PoolAction::EVICT;
                let dir: PathBuf = ctl.unwrap_or_default();
                self.move_memory(id, &*runtime, true, &dir, evict, &mut r)
                    .await;
            }
            // A running burst-mode container between bursts: its processes answer without a
            // thaw, and its next burst restores what was evicted before it runs.
            (
                Some((Status::Running, evicted)),
                Ok(a @ (mqfqd::PoolAction::EVICT | mqfqd::PoolAction::PREFETCH)),
            ) if ctl.is_some()
                && book.as_ref().is_some_and(|b| !b.busy())
                && (evicted || a == mqfqd::PoolAction::EVICT) =>
            {
                let evict = a == mqfqd::PoolAction::EVICT;
                let dir: PathBuf = ctl.unwrap_or_default();
                self.move_memory(id, &*runtime, false, &dir, evict, &mut r)
                    .await;
            }
            (Some((Status::Paused, _)), Ok(mqfqd::PoolAction::RECLAIM)) => {
                tracing::info!(container = %id, "pool: reclaiming a Cold container");
                match self.kill(id, "", 9, true).await {
                    Ok(()) => r.ok = true,
                    Err(e) => r.error = e.to_string(),
                }
                // Frozen processes die once thawed.
                let _ = runtime.resume(id).await;
            }
            (Some((status, evicted)), Ok(_)) => {
                r.skipped = true;
                r.error = format!("container is {status:?}, evicted={evicted}");
            }
            (_, Err(v)) => r.error = format!("unknown pool action {v}"),
        }
        r.duration_ns = nanos(started.elapsed());
        self.orders.pool_report(vec![r]).await;
    }

    /// Evict or prefetch, by the container's backend; a `paused` container is thawed first
    /// and frozen again after.
    async fn move_memory(
        &self,
        id: &str,
        runtime: &dyn crate::runtime::Runtime,
        paused: bool,
        dir: &Path,
        evict: bool,
        r: &mut mqfqd::PoolResult,
    ) {
        if paused && let Err(e) = runtime.resume(id).await {
            r.error = format!("thaw: {e}");
            return;
        }
        let cmd = if evict {
            Command::Evict
        } else {
            Command::Prefetch
        };
        // Thawed, the container runs without a lease: its window is what moving its memory
        // should take (2 s plus 1 GiB/s), never the whole move timeout for a few bytes.
        let (bytes, warm) = {
            let st = self.state.lock().await;
            st.containers
                .get(id)
                .map_or((0, Warm::Uvm), |c| (c.gpu.held().managed, c.gpu.warm()))
        };
        let within = self.move_deadline(bytes);
        let a = if warm == Warm::Checkpoint {
            // An order's prefetch brings it back where it was (no lease names another GPU).
            self.checkpoint_move(id, runtime, dir, evict, Vec::new(), within)
                .await
        } else {
            uvm(dir, id, cmd, within).await
        };
        if paused {
            let mut frozen = runtime.pause(id).await;
            if frozen.is_err() {
                frozen = runtime.pause(id).await;
            }
            if let Err(e) = frozen {
                tracing::error!(container = %id, "pool: freeze after a memory move failed: {e}; the container runs while containerd sees it paused");
                r.error = format!("freeze again: {e}");
            }
        }
        {
            let mut st = self.state.lock().await;
            if let Some(c) = st.containers.get_mut(id) {
                // Partly evicted still needs a restore; a failed prefetch is tried again at
                // Resume.
                c.gpu.moved(if evict {
                    // A checkpoint move that failed may have left processes suspended or
                    // locked; resuming a running one does nothing, so a restore is tried.
                    a.processes > 0 || (warm == Warm::Checkpoint && !a.ok() && a.acted)
                } else {
                    !a.ok() || !a.busy.is_empty()
                });
            }
        }
        if !a.ok() {
            // Frozen again above; never thawed for the pool again (a container whose processes
            // fail or stall a move would otherwise be thawed at every retry).
            let why = format!("a memory move failed: {}", a.errors.join("; "));
            self.drop_from_pool(id, &why).await;
            r.gone = true;
        }
        // A process still in a GPU call (a large copy thawed mid-way) refused the evict for
        // now: not a failure of the container, so it stays pooled; reported not done, the pool
        // backs off and orders it again.
        r.ok = a.ok() && a.busy.is_empty() && r.error.is_empty();
        r.bytes = a.bytes;
        if !a.busy.is_empty() {
            r.error = [r.error.clone(), a.busy.join("; ")]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
        }
        if !a.ok() {
            r.error = [r.error.clone(), a.errors.join("; ")]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
        }
        tracing::info!(container = %id, evict, bytes = a.bytes, processes = a.processes, ok = r.ok, "pool: memory moved");
    }
}
