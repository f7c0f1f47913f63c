//! The containerd Task service: thin ttrpc adapters over plain async operations, one file per
//! lifecycle verb (`create`, `start`, `exec`, `kill`, `delete`, `state`, `wait`; Pause and Resume
//! with the pool's hands in `pool`), the process exits in `exits`.
//!
//! Events go through one ordered channel (a single forwarder publishes them one at a time), so
//! containerd always sees TaskCreate → TaskStart → TaskExit → TaskDelete and ExecAdded →
//! ExecStarted → TaskExit. An exit that races its own start (a process that ends before `runc
//! start` returns) is held until the start event is out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use containerd_shim::ExitSignal;
use containerd_shim::util::convert_to_timestamp;
use containerd_shim_protos::protobuf::{MessageDyn, MessageField};
use tokio::sync::{Mutex, mpsc};

use crate::error::{Error, Result};
use crate::gate::{Gate, PoolChannel};
use crate::gpu::Classification;
use crate::process::{Exit, Proc};
use crate::runtime::{Runtime, RuntimeFactory};

/// How long an exit waits for its stdio to drain before it is published anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(3);

/// How long an exit of an unknown pid is kept for a process whose pid is not recorded yet.
const UNCLAIMED_TTL: Duration = Duration::from_secs(60);

/// An event for containerd: topic and message.
pub type Event = (&'static str, Box<dyn MessageDyn>);

/// One container: its init process, exec processes, and what Create learned.
#[derive(Debug)]
pub struct Container {
    /// Container id.
    pub id: String,
    /// Bundle directory.
    pub bundle: PathBuf,
    /// Whether the shim mounted `bundle/rootfs` (and must unmount it).
    pub mounted_rootfs: bool,
    /// Its runtime.
    pub runtime: Arc<dyn Runtime>,
    /// The init process.
    pub init: Proc,
    /// Exec processes by exec id.
    pub execs: HashMap<String, Proc>,
    /// Its GPU life: what admits its GPU work and where the pool has its memory.
    pub gpu: life::GpuLife,
    /// Serializes Pause / Resume with each other and with the pool's thaw-move-freeze of this
    /// container.
    pub pool_lock: Arc<Mutex<()>>,
}

impl Container {
    fn proc_mut(&mut self, exec_id: &str) -> Result<&mut Proc> {
        if exec_id.is_empty() {
            Ok(&mut self.init)
        } else {
            self.execs
                .get_mut(exec_id)
                .ok_or_else(|| Error::NotFound(format!("exec {exec_id} in {}", self.id)))
        }
    }
}

#[derive(Debug, Default)]
struct State {
    containers: HashMap<String, Container>,
    /// Ids whose Create is in progress (reserved, so a racing duplicate cannot clean up ours).
    creating: std::collections::HashSet<String>,
    /// Exits of pids not (yet) known — an exec that ended before its pid was recorded — with
    /// when they were seen. Most entries are runc's own processes; they age out.
    unclaimed: HashMap<u32, (Exit, Instant)>,
}

/// The task service.
#[derive(Clone)]
pub struct TaskService {
    state: Arc<Mutex<State>>,
    events: mpsc::UnboundedSender<Event>,
    factory: Arc<dyn RuntimeFactory>,
    exit: Arc<ExitSignal>,
    namespace: String,
    gate: Arc<dyn Gate>,
    /// The pool's orders for this shim's paused containers, and its reports.
    orders: Arc<dyn PoolChannel>,
    pool_agent: Arc<std::sync::atomic::AtomicBool>,
    pool_timeouts: pool::PoolTimeouts,
    /// The driver's checkpoint API (loaded on first use), for `checkpoint` containers.
    ckpt: crate::checkpoint::SharedDriver,
}

fn nf(id: &str) -> Error {
    Error::NotFound(format!("container {id}"))
}

fn exit_status(
    exit: Option<Exit>,
) -> (
    u32,
    MessageField<containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp>,
) {
    match exit {
        Some(e) => (
            e.code,
            MessageField::some(convert_to_timestamp(Some(e.at.into()))),
        ),
        None => (0, MessageField::none()),
    }
}

impl std::fmt::Debug for TaskService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskService")
            .field("factory", &self.factory)
            .finish_non_exhaustive()
    }
}

impl TaskService {
    /// A service publishing into `events`, making runtimes with `factory`, signalling `exit`
    /// when the last container is gone and containerd asks to shut down, gating GPU starts on
    /// `gate`, obeying the pool's `orders`.
    pub fn new(
        events: mpsc::UnboundedSender<Event>,
        factory: Arc<dyn RuntimeFactory>,
        exit: Arc<ExitSignal>,
        namespace: &str,
        (gate, orders): (Arc<dyn Gate>, Arc<dyn PoolChannel>),
    ) -> Self {
        TaskService {
            state: Arc::new(Mutex::new(State::default())),
            events,
            factory,
            exit,
            namespace: namespace.to_owned(),
            gate,
            orders,
            pool_agent: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            pool_timeouts: pool::PoolTimeouts::default(),
            ckpt: Arc::new(crate::checkpoint::LibCuda::default()),
        }
    }

    /// Ends the container's GPU lease, if it is GPU work and holds one (first reporting a
    /// refused export its processes marked: they may be gone, as an application whose export
    /// failed often exits).
    async fn release_lease(&self, id: &str, gpu: bool, reason: &str) {
        if gpu {
            self.report_exports(id).await;
            self.gate
                .release(&self.namespace, id, reason, Default::default())
                .await;
        }
    }

    /// Gives back a lease the container could not use, with what its processes were last
    /// known to hold (reason `unused`: its memory stays where it is).
    pub(super) async fn hand_back(&self, id: &str) {
        let held = {
            let st = self.state.lock().await;
            st.containers
                .get(id)
                .map(|c| c.gpu.held())
                .unwrap_or_default()
        };
        self.gate
            .release(&self.namespace, id, mqfq_proto::UNUSED, held)
            .await;
    }

    /// Tells mqfqd that a CUDA process of the container had an export of converted memory
    /// refused (its function's next containers then keep allocations native), off the caller's
    /// path: the mark is removed once the daemon took it, so an absent daemon hears of it later.
    pub(super) async fn report_exports(&self, id: &str) {
        let found = {
            let st = self.state.lock().await;
            st.containers
                .get(id)
                .and_then(|c| Some((c.gpu.ctl_dir()?.to_path_buf(), c.gpu.work()?.clone())))
        };
        let Some((dir, work)) = found.filter(|(d, _)| crate::uvm::exported(d)) else {
            return;
        };
        let (gate, ns, id) = (self.gate.clone(), self.namespace.clone(), id.to_owned());
        tokio::spawn(async move {
            if gate.exported(&ns, &id, &work).await {
                crate::uvm::clear_exported(&dir);
            }
        });
    }

    async fn runtime_and_pid(&self, id: &str) -> Result<(Arc<dyn Runtime>, u32)> {
        let st = self.state.lock().await;
        let c = st.containers.get(id).ok_or_else(|| nf(id))?;
        Ok((c.runtime.clone(), c.init.pid()))
    }

    /// Whether no container is left.
    pub async fn is_empty(&self) -> bool {
        self.state.lock().await.containers.is_empty()
    }

    /// The GPU classification recorded at Create.
    pub async fn classification(&self, id: &str) -> Option<Classification> {
        self.state
            .lock()
            .await
            .containers
            .get(id)
            .map(|c| c.gpu.classification())
    }
}

/// Unmounts the rootfs (and anything below it), logging failures: there is nothing better to do
/// on a cleanup path.
/// A mount still busy (a worker that missed its deadline may hold a descriptor in it) is
/// detached instead, so no failed Create leaves a mount behind.
pub fn unmount(rootfs: &Path) {
    if let Some(p) = rootfs.to_str()
        && let Err(e) = containerd_shim::mount::umount_recursive(Some(p), 0)
    {
        match nix::mount::umount2(rootfs, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => tracing::warn!("unmount {p}: {e}; detached instead"),
            Err(e2) => tracing::warn!("unmount {p}: {e}; detach: {e2}"),
        }
    }
}

mod adapter;
pub mod burst;
mod checkpoint;
mod create;
mod delete;
mod exec;
mod exits;
mod kill;
mod life;
mod pause;
mod pool;
mod resume;
mod start;
mod state;
mod turn;
mod wait;

#[cfg(test)]
mod tests;
