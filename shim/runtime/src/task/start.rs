//! Start: the init (`runc start`, after the node's queue for a gated GPU container) or an exec
//! (`runc exec --detach`). The shim's lock is not held while it waits in the queue or runc runs,
//! so the process's exit may be seen meanwhile; [`Proc`](crate::process::Proc) holds it back
//! until the start event is out.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use containerd_shim_protos::events::task::{TaskExecStarted, TaskStart};

use super::{TaskService, nf};
use crate::console::ConsoleSocket;
use crate::error::{Error, Result};
use crate::gate::Kind;
use crate::gpu::GpuWork;
use crate::io::{ChildIo, ProcessIo};
use crate::runtime::{ExecArgs, Runtime};

/// What a start takes from the shim's state (read under its lock, used without it).
struct Starting {
    runtime: Arc<dyn Runtime>,
    spec: Option<oci_spec::runtime::Process>,
    bundle: PathBuf,
    io: Option<Arc<ChildIo>>,
    console: Option<ConsoleSocket>,
    /// A gated GPU start: its work, and whether it is pooled.
    work: Option<(GpuWork, bool)>,
}

impl TaskService {
    /// Start the init (`runc start`) or an exec (`runc exec --detach`).
    ///
    /// # Errors
    /// `NOT_FOUND`, `FAILED_PRECONDITION` unless Created, or runc's failure.
    pub async fn start(&self, id: &str, exec_id: &str) -> Result<u32> {
        let s = self.begin_start(id, exec_id).await?;
        // A GPU container's start waits for the node's queue; execs never do.
        if let Some((w, pooled)) = &s.work
            && let Err(e) = self
                .gate
                .admit(&self.namespace, id, w, Kind::Start, *pooled)
                .await
        {
            self.start_failed(id, exec_id, None).await;
            return Err(e);
        }
        let since = Instant::now();
        let result = self.run(id, exec_id, s.runtime.as_ref(), &s).await;
        self.finish_start(id, exec_id, s.work.is_some(), result, since)
            .await
    }

    /// Checks the start may happen and marks it in progress.
    async fn begin_start(&self, id: &str, exec_id: &str) -> Result<Starting> {
        let mut st = self.state.lock().await;
        let c = st.containers.get_mut(id).ok_or_else(|| nf(id))?;
        if !exec_id.is_empty() && c.init.status() == crate::process::Status::Stopped {
            return Err(Error::FailedPrecondition(format!(
                "container {id} has exited; cannot start exec {exec_id}"
            )));
        }
        // A burst-mode container starts at once: its GPU work waits instead.
        let work = c.gpu.gated().filter(|_| exec_id.is_empty());
        let (runtime, bundle) = (c.runtime.clone(), c.bundle.clone());
        let p = c.proc_mut(exec_id)?;
        if !exec_id.is_empty() && p.spec.is_none() {
            return Err(Error::InvalidArgument(format!("exec {exec_id}: no spec")));
        }
        p.begin_start()?;
        let io = p.io.as_ref().map(|io| io.child.clone());
        let console = if exec_id.is_empty() {
            None
        } else {
            p.io.as_mut().and_then(ProcessIo::take_console_socket)
        };
        Ok(Starting {
            runtime,
            spec: p.spec.clone(),
            bundle,
            io,
            console,
            work,
        })
    }

    /// runc starts the init (no pid: it has one), or execs the process (its pid, and the pty
    /// master when it has a terminal).
    async fn run(
        &self,
        id: &str,
        exec_id: &str,
        runtime: &dyn Runtime,
        s: &Starting,
    ) -> Result<Option<(u32, Option<OwnedFd>)>> {
        let Some(spec) = s.spec.as_ref().filter(|_| !exec_id.is_empty()) else {
            return runtime.start(id).await.map(|()| None);
        };
        let args = ExecArgs {
            pid_file: s.bundle.join(format!("{exec_id}.pid")),
            io: s.io.clone().map(|c| c as Arc<dyn runc::io::Io>),
            console_socket: s.console.as_ref().map(|c| c.path().to_owned()),
        };
        let pid = runtime.exec(id, spec, &args).await?;
        let master = match &s.console {
            Some(sock) => Some(sock.receive().await?),
            None => None,
        };
        Ok(Some((pid, master)))
    }

    /// The start did not happen: the init may start again (an exit drained meanwhile goes out
    /// now); an exec never ran, and is over.
    async fn start_failed(&self, id: &str, exec_id: &str, lease: Option<&str>) {
        {
            let mut st = self.state.lock().await;
            if let Some(p) = st
                .containers
                .get_mut(id)
                .and_then(|c| c.proc_mut(exec_id).ok())
            {
                if exec_id.is_empty() {
                    p.start_failed();
                    p.publish_deferred(self.exit_event(id));
                } else {
                    // Wait must not hang on it.
                    p.never_ran();
                }
            }
        }
        if let Some(reason) = lease {
            self.release_lease(id, true, reason).await;
        }
    }

    /// Records what runc did: the process runs (the start event goes out, then an exit seen
    /// meanwhile), or the start failed; a lease granted for it goes back unless it runs.
    async fn finish_start(
        &self,
        id: &str,
        exec_id: &str,
        gated: bool,
        result: Result<Option<(u32, Option<OwnedFd>)>>,
        since: Instant,
    ) -> Result<u32> {
        let ran = match result {
            Ok(r) => r,
            Err(e) => {
                let lease = gated.then_some("start failed");
                self.start_failed(id, exec_id, lease).await;
                return Err(e);
            }
        };
        let mut st = self.state.lock().await;
        let found = st
            .containers
            .get_mut(id)
            .ok_or_else(|| nf(id))
            .and_then(|c| c.proc_mut(exec_id));
        let (exec_pid, master) = match ran {
            Some((pid, master)) => (Some(pid), master),
            None => (None, None),
        };
        // Only the process this start began: one made again under the id since is not it.
        let found = found.and_then(|p| {
            if p.started(exec_pid) {
                Ok(p)
            } else {
                Err(Error::NotFound(format!(
                    "{id} {exec_id}: deleted while starting"
                )))
            }
        });
        let p = match found {
            Ok(p) => p,
            Err(e) => {
                // Deleted while it started: whatever runc did, the lease goes back.
                drop(st);
                if gated {
                    self.release_lease(id, true, "deleted while starting").await;
                }
                return Err(e);
            }
        };
        if let Some(m) = master
            && let Some(io) = p.io.as_mut()
            && let Err(e) = io.attach_console(m)
        {
            tracing::warn!("exec {exec_id} terminal: {}", e.full_message());
        }
        let pid = p.pid();
        self.emit_started(id, exec_id, pid);
        p.publish_deferred(self.exit_event(id));
        drop(st);
        if exec_pid.is_some() {
            self.claim_early_exit(id, exec_id, pid, since).await;
        }
        Ok(pid)
    }

    fn emit_started(&self, id: &str, exec_id: &str, pid: u32) {
        if exec_id.is_empty() {
            self.emit(
                containerd_shim_protos::topics::TASK_START_EVENT_TOPIC,
                Box::new(TaskStart {
                    container_id: id.to_owned(),
                    pid,
                    ..Default::default()
                }),
            );
        } else {
            self.emit(
                containerd_shim_protos::topics::TASK_EXEC_STARTED_EVENT_TOPIC,
                Box::new(TaskExecStarted {
                    container_id: id.to_owned(),
                    exec_id: exec_id.to_owned(),
                    pid,
                    ..Default::default()
                }),
            );
        }
    }
}
