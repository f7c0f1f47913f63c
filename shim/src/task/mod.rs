//! The containerd Task service: thin ttrpc adapters over plain async operations.
//!
//! Events go through one ordered channel (a single forwarder publishes them one at a time), so
//! containerd always sees TaskCreate → TaskStart → TaskExit → TaskDelete and ExecAdded →
//! ExecStarted → TaskExit. An exit that races its own start (a process that ends before `runc
//! start` returns) is held until the start event is out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use containerd_shim::ExitSignal;
use containerd_shim::monitor::{ExitEvent, Subject, Topic, monitor_subscribe};
use containerd_shim::util::convert_to_timestamp;
use containerd_shim_protos::api;
use containerd_shim_protos::events::task::{TaskDelete, TaskExecAdded, TaskExit};
use containerd_shim_protos::protobuf::{MessageDyn, MessageField};
use tokio::sync::{Mutex, mpsc};

use crate::error::{Error, Result};
use crate::gate::{Gate, PoolChannel};
use crate::gpu::Classification;
use crate::io::{ProcessIo, StdioPaths};
use crate::process::{Exit, Proc, Status};
use crate::runtime::{Runtime, RuntimeFactory};
use mqfq_proto::warm::Warm;

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
    /// GPU classification.
    pub gpu: Classification,
    /// The CUDA interposer's control directory on the host, when injected (its GPU memory is
    /// then pooled).
    pub ctl_dir: Option<PathBuf>,
    /// Its memory was evicted to the host for the pool (it must be restored before it runs).
    pub evicted: bool,
    /// Serializes Pause / Resume with the pool's thaw-move-freeze of this container.
    pub pool_lock: Arc<Mutex<()>>,
    /// Its processes failed to answer a memory move in time, or its Warm tier is `off`: it runs
    /// unpooled.
    pub pool_failed: bool,
    /// What its CUDA processes held at the last Pause or burst end (managed bytes size
    /// memory-move deadlines).
    pub held: crate::memory::Usage,
    /// When a burst's end last asked its processes for `held`.
    pub managed_asked: Option<Instant>,
    /// A driver call of the checkpoint backend is in progress for it (one at a time).
    pub ckpt_in_flight: Arc<std::sync::atomic::AtomicBool>,
    /// Burst admission (its interposer asks for each burst of GPU work): its Start and Resume
    /// are then not gated.
    pub burst: Option<Arc<burst::Book>>,
    /// The task serving its burst socket (aborted at Delete).
    pub burst_task: Option<tokio::task::AbortHandle>,
}

impl Container {
    /// How its memory goes Warm (meaningful where the interposer is injected).
    fn warm(&self) -> Warm {
        match &self.gpu {
            Classification::Gpu(w) => w.warm,
            Classification::NotGpu => Warm::Off,
        }
    }

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
            st.containers.get(id).map(|c| c.held).unwrap_or_default()
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
                .and_then(|c| match (&c.ctl_dir, &c.gpu) {
                    (Some(d), Classification::Gpu(w)) => Some((d.clone(), w.clone())),
                    _ => None,
                })
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

    /// Starts the loop that turns reaped pids into process exits. Call once.
    ///
    /// # Errors
    /// The exit monitor refused the subscription.
    pub async fn watch_exits(&self) -> Result<()> {
        let mut sub = monitor_subscribe(Topic::All).await?;
        let svc = self.clone();
        tokio::spawn(async move {
            while let Some(ExitEvent { subject, exit_code }) = sub.rx.recv().await {
                if let Subject::Pid(pid) = subject
                    && let Ok(pid) = u32::try_from(pid)
                {
                    svc.on_exit(pid, u32::try_from(exit_code).unwrap_or(255))
                        .await;
                }
            }
        });
        Ok(())
    }

    fn emit(&self, topic: &'static str, ev: Box<dyn MessageDyn>) {
        // The forwarder only goes away at shutdown; events after that have nobody to go to.
        let _ = self.events.send((topic, ev));
    }

    /// A pid was reaped.
    pub async fn on_exit(&self, pid: u32, code: u32) {
        let exit = Exit {
            code,
            at: SystemTime::now(),
        };
        let mut st = self.state.lock().await;
        let mut found = None;
        for c in st.containers.values_mut() {
            let procs = std::iter::once(&mut c.init).chain(c.execs.values_mut());
            for p in procs {
                if p.is_running_pid(pid) {
                    found = Some((c.id.clone(), p.exec_id().to_owned()));
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        match found {
            Some((cid, eid)) => {
                drop(st);
                self.record_exit(&cid, &eid, exit).await;
            }
            None => {
                let now = Instant::now();
                st.unclaimed
                    .retain(|_, (_, seen)| now.duration_since(*seen) < UNCLAIMED_TTL);
                st.unclaimed.insert(pid, (exit, now));
            }
        }
    }

    /// Marks a process exited, then drains its stdio and publishes the exit.
    async fn record_exit(&self, cid: &str, eid: &str, exit: Exit) {
        let (io, gpu) = {
            let mut st = self.state.lock().await;
            let Some(c) = st.containers.get_mut(cid) else {
                return;
            };
            let gpu = eid.is_empty() && matches!(c.gpu, Classification::Gpu(_));
            let Ok(p) = c.proc_mut(eid) else { return };
            (p.exited(exit), gpu)
        };
        self.release_lease(cid, gpu, "exit").await;
        let svc = self.clone();
        let (cid, eid) = (cid.to_owned(), eid.to_owned());
        tokio::spawn(async move {
            if let Some(mut io) = io {
                io.drain(DRAIN_LIMIT).await;
            }
            let mut st = svc.state.lock().await;
            if let Some(c) = st.containers.get_mut(&cid)
                && let Ok(p) = c.proc_mut(&eid)
            {
                p.drained(svc.exit_event(&cid));
            }
        });
    }

    /// Sends a process's `TaskExit` (what [`Proc`] calls when it publishes an exit).
    fn exit_event<'a>(&'a self, cid: &'a str) -> impl FnOnce(&str, u32, Exit) + 'a {
        move |exec_id, pid, exit| {
            let (code, at) = exit_status(Some(exit));
            self.emit(
                containerd_shim_protos::topics::TASK_EXIT_EVENT_TOPIC,
                Box::new(TaskExit {
                    container_id: cid.to_owned(),
                    id: if exec_id.is_empty() { cid } else { exec_id }.to_owned(),
                    pid,
                    exit_status: code,
                    exited_at: at,
                    ..Default::default()
                }),
            );
        }
    }

    /// Claims an exit of `pid` seen since `since` (when runc was asked to make the process).
    /// An older entry is another process that had the same pid before it was reused.
    async fn claim_early_exit(&self, cid: &str, eid: &str, pid: u32, since: Instant) {
        let early = {
            let mut st = self.state.lock().await;
            match st.unclaimed.remove(&pid) {
                Some((exit, seen)) if seen >= since => Some(exit),
                _ => None,
            }
        };
        if let Some(exit) = early {
            self.record_exit(cid, eid, exit).await;
        }
    }

    /// Publishes `TaskOOM` whenever the kernel OOM-kills in the container's memory cgroup.
    /// Best effort: a container without a memory cgroup simply gets no OOM events.
    fn watch_oom(&self, id: &str, pid: u32) {
        let cg = match crate::oom::memory_cgroup(pid, Path::new("/sys/fs/cgroup")) {
            Ok(cg) => cg,
            Err(e) => {
                tracing::debug!("no OOM watch for {id}: {}", e.full_message());
                return;
            }
        };
        let events = self.events.clone();
        let cid = id.to_owned();
        let r = crate::oom::watch(&cg, move || {
            tracing::info!(container = %cid, "OOM kill");
            let _ = events.send((
                containerd_shim_protos::topics::TASK_OOM_EVENT_TOPIC,
                Box::new(containerd_shim_protos::events::task::TaskOOM {
                    container_id: cid.clone(),
                    ..Default::default()
                }),
            ));
        });
        if let Err(e) = r {
            tracing::warn!("no OOM watch for {id}: {}", e.full_message());
        }
    }

    /// Records an exec process (`runc exec` happens at Start).
    ///
    /// # Errors
    /// `NOT_FOUND`, `ALREADY_EXISTS`, `INVALID_ARGUMENT` for a bad process spec, `UNIMPLEMENTED`
    /// for tty, `FAILED_PRECONDITION` if the container has exited.
    pub async fn exec(&self, req: api::ExecProcessRequest) -> Result<()> {
        let spec: oci_spec::runtime::Process = serde_json::from_slice(&req.spec.value)
            .map_err(|e| Error::InvalidArgument(format!("exec {} spec: {e}", req.exec_id)))?;
        if req.exec_id.is_empty() {
            return Err(Error::InvalidArgument("exec id is empty".into()));
        }
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        stdio.check()?;
        let check = |c: &Container| -> Result<()> {
            if c.execs.contains_key(&req.exec_id) {
                return Err(Error::AlreadyExists(format!(
                    "exec {} in {}",
                    req.exec_id, req.id
                )));
            }
            if c.init.status() == Status::Stopped {
                return Err(Error::FailedPrecondition(format!(
                    "container {} has exited",
                    req.id
                )));
            }
            Ok(())
        };
        {
            let st = self.state.lock().await;
            check(st.containers.get(&req.id).ok_or_else(|| nf(&req.id))?)?;
        }
        // Setting up stdio may wait on a logging binary: not under the lock.
        let io = ProcessIo::new(&stdio, &req.id, &self.namespace).await?;
        let mut st = self.state.lock().await;
        let c = st.containers.get_mut(&req.id).ok_or_else(|| nf(&req.id))?;
        check(c)?;
        let mut p = Proc::new(&req.exec_id, 0, stdio, Some(io));
        p.spec = Some(spec);
        c.execs.insert(req.exec_id.clone(), p);
        self.emit(
            containerd_shim_protos::topics::TASK_EXEC_ADDED_EVENT_TOPIC,
            Box::new(TaskExecAdded {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                ..Default::default()
            }),
        );
        Ok(())
    }

    /// Signals the init (through runc, optionally every process) or an exec.
    ///
    /// # Errors
    /// `NOT_FOUND` for unknown or finished processes, or runc's failure.
    pub async fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let (runtime, pid, gpu) = {
            let mut st = self.state.lock().await;
            let c = st.containers.get_mut(id).ok_or_else(|| nf(id))?;
            let runtime = c.runtime.clone();
            let gpu = exec_id.is_empty() && matches!(c.gpu, Classification::Gpu(_));
            let p = c.proc_mut(exec_id)?;
            if p.status() == Status::Stopped && !all {
                return Err(Error::NotFound(format!(
                    "{id} {exec_id}: process already finished"
                )));
            }
            (runtime, p.pid(), gpu)
        };
        if exec_id.is_empty() {
            if gpu {
                // A start still waiting for admission must not be let in after the kill.
                self.gate.cancel(&self.namespace, id).await;
            }
            runtime.kill(id, signal, all).await?;
            self.release_lease(id, gpu, "kill").await;
            return Ok(());
        }
        if pid == 0 {
            return Err(Error::NotFound(format!(
                "exec {exec_id} in {id} was never started"
            )));
        }
        let sig = nix::sys::signal::Signal::try_from(i32::try_from(signal).unwrap_or(-1))
            .map_err(|_| Error::InvalidArgument(format!("signal {signal}")))?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(-1));
        nix::sys::signal::kill(pid, sig).map_err(|e| {
            if e == nix::errno::Errno::ESRCH {
                Error::NotFound(format!("exec {exec_id} in {id}: process already finished"))
            } else {
                Error::io(format!("kill exec {exec_id}"), e.into())
            }
        })
    }

    /// Deletes an exec record, or the container (`runc delete --force`, unmount, forget).
    ///
    /// # Errors
    /// `NOT_FOUND`, `FAILED_PRECONDITION` while running, or runc's failure.
    pub async fn delete(&self, id: &str, exec_id: &str) -> Result<api::DeleteResponse> {
        if !exec_id.is_empty() {
            let mut st = self.state.lock().await;
            let c = st.containers.get_mut(id).ok_or_else(|| nf(id))?;
            let p = c.proc_mut(exec_id)?;
            if matches!(p.status(), Status::Running | Status::Paused) {
                return Err(Error::FailedPrecondition(format!(
                    "exec {exec_id} in {id} is still running"
                )));
            }
            let mut p = c.execs.remove(exec_id).ok_or_else(|| nf(id))?;
            // An exit still draining its stdio is published now, before the record goes.
            p.publish_now(self.exit_event(id));
            let (code, at) = exit_status(p.exit());
            return Ok(api::DeleteResponse {
                pid: p.pid(),
                exit_status: code,
                exited_at: at,
                ..Default::default()
            });
        }
        let (runtime, gpu) = {
            let st = self.state.lock().await;
            let c = st.containers.get(id).ok_or_else(|| nf(id))?;
            if matches!(c.init.status(), Status::Running | Status::Paused) {
                return Err(Error::FailedPrecondition(format!(
                    "container {id} is still running; kill it first"
                )));
            }
            (c.runtime.clone(), matches!(c.gpu, Classification::Gpu(_)))
        };
        if gpu {
            self.gate.cancel(&self.namespace, id).await;
            self.release_lease(id, true, "delete").await;
        }
        match runtime.delete(id, true).await {
            Ok(()) | Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let mut st = self.state.lock().await;
        let mut c = st.containers.remove(id).ok_or_else(|| nf(id))?;
        // TaskExit must precede TaskDelete even when the exit is still draining its stdio.
        c.init.publish_now(self.exit_event(id));
        if c.mounted_rootfs {
            unmount(&c.bundle.join("rootfs"));
        }
        if let Some(t) = &c.burst_task {
            t.abort();
        }
        if let Some(d) = &c.ctl_dir {
            crate::uvm::cleanup(d);
        }
        if let Some(mut io) = c.init.io.take() {
            io.shutdown();
        }
        let (code, at) = exit_status(c.init.exit());
        self.emit(
            containerd_shim_protos::topics::TASK_DELETE_EVENT_TOPIC,
            Box::new(TaskDelete {
                container_id: id.to_owned(),
                pid: c.init.pid(),
                exit_status: code,
                exited_at: at.clone(),
                id: id.to_owned(),
                ..Default::default()
            }),
        );
        Ok(api::DeleteResponse {
            pid: c.init.pid(),
            exit_status: code,
            exited_at: at,
            ..Default::default()
        })
    }

    /// The state of the init or an exec.
    ///
    /// # Errors
    /// `NOT_FOUND`.
    pub async fn state(&self, id: &str, exec_id: &str) -> Result<api::StateResponse> {
        let mut st = self.state.lock().await;
        let c = st.containers.get_mut(id).ok_or_else(|| nf(id))?;
        let bundle = c.bundle.display().to_string();
        let p = c.proc_mut(exec_id)?;
        let status = match p.status() {
            Status::Created => api::Status::CREATED,
            Status::Running => api::Status::RUNNING,
            Status::Paused => api::Status::PAUSED,
            Status::Stopped => api::Status::STOPPED,
        };
        let (code, at) = exit_status(p.exit());
        Ok(api::StateResponse {
            id: id.to_owned(),
            bundle,
            pid: p.pid(),
            status: status.into(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exit_status: code,
            exited_at: at,
            exec_id: exec_id.to_owned(),
            ..Default::default()
        })
    }

    /// Waits for the init or an exec to exit (its exit event published).
    ///
    /// # Errors
    /// `NOT_FOUND`.
    pub async fn wait(&self, id: &str, exec_id: &str) -> Result<api::WaitResponse> {
        let mut rx = {
            let mut st = self.state.lock().await;
            let c = st.containers.get_mut(id).ok_or_else(|| nf(id))?;
            c.proc_mut(exec_id)?.subscribe()
        };
        let exit = loop {
            if let Some(e) = *rx.borrow_and_update() {
                break e;
            }
            if rx.changed().await.is_err() {
                return Err(Error::NotFound(format!(
                    "{id} {exec_id}: deleted while waiting"
                )));
            }
        };
        let (code, at) = exit_status(Some(exit));
        Ok(api::WaitResponse {
            exit_status: code,
            exited_at: at,
            ..Default::default()
        })
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
            .map(|c| c.gpu.clone())
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
mod pool;
mod start;

#[cfg(test)]
mod tests;
