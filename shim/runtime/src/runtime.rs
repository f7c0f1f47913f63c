//! The seam to runc: a small trait, the real implementation over the `runc` crate, and (in
//! tests) a recording fake.
//!
//! Every runc invocation goes through [`MonitorSpawner`]: the shim is a subreaper whose SIGCHLD
//! handler reaps *every* child and publishes the exit on the containerd-shim exit monitor, so
//! waiting on a child any other way races that handler and loses the exit (ECHILD). The spawner
//! subscribes before spawning and takes its exit from the monitor.

use std::fmt::Debug;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::monitor::{ExitEvent, Subject, Topic, monitor_subscribe, monitor_unsubscribe};
use oci_spec::runtime::{LinuxResources, Process};
use runc::options::{CreateOpts, DeleteOpts, ExecOpts, GlobalOpts, KillOpts};

use crate::error::{Error, Result};
use crate::options::RuntimeOptions;

#[cfg(test)]
pub mod fake;

/// What `create` needs besides the id and bundle.
#[derive(Debug, Clone)]
pub struct CreateArgs {
    /// Where runc writes the init pid.
    pub pid_file: PathBuf,
    /// The process's stdio.
    pub io: Option<Arc<dyn runc::io::Io>>,
    /// `--no-pivot`.
    pub no_pivot: bool,
    /// `--no-new-keyring`.
    pub no_new_keyring: bool,
    /// `--console-socket` (terminals).
    pub console_socket: Option<PathBuf>,
}

/// What `exec` needs besides the container id and process spec.
#[derive(Debug, Clone)]
pub struct ExecArgs {
    /// Where runc writes the exec pid.
    pub pid_file: PathBuf,
    /// The process's stdio.
    pub io: Option<Arc<dyn runc::io::Io>>,
    /// `--console-socket` (terminals).
    pub console_socket: Option<PathBuf>,
}

/// The container runtime operations the task service needs.
#[async_trait]
pub trait Runtime: Debug + Send + Sync {
    /// `runc create`; returns the init pid.
    async fn create(&self, id: &str, bundle: &Path, args: &CreateArgs) -> Result<u32>;
    /// `runc start`.
    async fn start(&self, id: &str) -> Result<()>;
    /// `runc exec --detach`; returns the process pid.
    async fn exec(&self, id: &str, process: &Process, args: &ExecArgs) -> Result<u32>;
    /// `runc kill [--all]`.
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()>;
    /// `runc delete [--force]`.
    async fn delete(&self, id: &str, force: bool) -> Result<()>;
    /// `runc pause`.
    async fn pause(&self, id: &str) -> Result<()>;
    /// `runc resume`.
    async fn resume(&self, id: &str) -> Result<()>;
    /// `runc ps`: pids in the container.
    async fn ps(&self, id: &str) -> Result<Vec<u32>>;
    /// `runc update`.
    async fn update(&self, id: &str, resources: &LinuxResources) -> Result<()>;
}

/// Makes the runtime for a container from its bundle and options.
pub trait RuntimeFactory: Debug + Send + Sync {
    /// The runtime for the container whose bundle is `bundle`.
    ///
    /// # Errors
    /// The runtime cannot be set up (e.g. runc not found).
    fn runtime(&self, bundle: &Path, opts: &RuntimeOptions) -> Result<Arc<dyn Runtime>>;
}

/// Spawns runc and takes its exit status from the shim's exit monitor.
#[derive(Debug, Default)]
pub struct MonitorSpawner;

fn exit_status(code: i32) -> ExitStatus {
    // The monitor reports 128 + signal for signalled processes.
    if code > 128 {
        ExitStatus::from_raw(code - 128)
    } else {
        ExitStatus::from_raw(code << 8)
    }
}

fn read_all(src: Option<impl std::io::Read>) -> String {
    let mut s = String::new();
    if let Some(mut r) = src {
        let _ = r.read_to_string(&mut s);
    }
    s
}

#[async_trait]
impl runc::Spawner for MonitorSpawner {
    async fn execute(&self, cmd: runc::Command) -> runc::Result<(ExitStatus, u32, String, String)> {
        let mut cmd = cmd.into_std();
        let mut sub = monitor_subscribe(Topic::Pid)
            .await
            .map_err(|e| runc::error::Error::Other(Box::new(e)))?;
        let spawned = cmd.spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let _ = monitor_unsubscribe(sub.id).await;
                return Err(runc::error::Error::ProcessSpawnFailed(e));
            }
        };
        let pid = child.id();
        let out = child.stdout.take();
        let err = child.stderr.take();
        let out = tokio::task::spawn_blocking(move || read_all(out));
        let err = tokio::task::spawn_blocking(move || read_all(err));
        let want = i32::try_from(pid).unwrap_or(-1);
        let code = loop {
            match sub.rx.recv().await {
                Some(ExitEvent {
                    subject: Subject::Pid(p),
                    exit_code,
                }) if p == want => break exit_code,
                Some(_) => {}
                None => break -1,
            }
        };
        let _ = monitor_unsubscribe(sub.id).await;
        // The monitor reaped it; dropping std's Child does not wait.
        drop(child);
        let stdout = out.await.unwrap_or_default();
        let stderr = err.await.unwrap_or_default();
        Ok((exit_status(code), pid, stdout, stderr))
    }
}

/// The real runtime: runc through the `runc` crate, logging JSON into the bundle.
#[derive(Debug)]
pub struct RuncRuntime {
    runc: runc::Runc,
    log: PathBuf,
}

/// Factory of [`RuncRuntime`]s for a namespace.
#[derive(Debug, Clone)]
pub struct RuncFactory {
    /// containerd namespace (runc root defaults to `/run/containerd/runc/<namespace>`).
    pub namespace: String,
}

impl RuntimeFactory for RuncFactory {
    fn runtime(&self, bundle: &Path, opts: &RuntimeOptions) -> Result<Arc<dyn Runtime>> {
        let root = opts
            .root
            .clone()
            .unwrap_or_else(|| "/run/containerd/runc".to_owned());
        let log = bundle.join("log.json");
        let mut g = GlobalOpts::new()
            .command(opts.binary_name.as_deref().unwrap_or("runc"))
            .root(Path::new(&root).join(&self.namespace))
            .log(&log)
            .log_json()
            .systemd_cgroup(opts.systemd_cgroup);
        g.custom_spawner(Arc::new(MonitorSpawner));
        let runc = g.build().map_err(|e| Error::Runc {
            op: "setup",
            id: bundle.display().to_string(),
            detail: e.to_string(),
        })?;
        Ok(Arc::new(RuncRuntime { runc, log }))
    }
}

impl RuncRuntime {
    /// runc's last error from its JSON log, else what the crate reported.
    fn fail(&self, op: &'static str, id: &str, e: &runc::error::Error) -> Error {
        let from_log = std::fs::read_to_string(&self.log).ok().and_then(|s| {
            s.lines()
                .rev()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v.get("level").and_then(|l| l.as_str()) == Some("error"))
                .and_then(|v| v.get("msg").and_then(|m| m.as_str()).map(str::to_owned))
        });
        let detail = match (from_log, e) {
            (Some(m), _) => m,
            (None, runc::error::Error::CommandFailed { stderr, stdout, .. }) => {
                let s = if stderr.trim().is_empty() {
                    stdout
                } else {
                    stderr
                };
                s.trim().to_owned()
            }
            (None, other) => other.to_string(),
        };
        let lower = detail.to_ascii_lowercase();
        if op == "kill"
            && (lower.contains("not running")
                || lower.contains("does not exist")
                || lower.contains("no such process"))
        {
            return Error::NotFound(format!("{id}: process already finished"));
        }
        if lower.contains("does not exist") {
            return Error::NotFound(format!("container {id}"));
        }
        Error::Runc {
            op,
            id: id.to_owned(),
            detail,
        }
    }
}

async fn read_pid(path: &Path) -> Result<u32> {
    let s = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| Error::io(format!("read pid file {}", path.display()), e))?;
    s.trim().parse().map_err(|_| {
        Error::io(
            format!("pid file {} holds {s:?}", path.display()),
            std::io::Error::from(std::io::ErrorKind::InvalidData),
        )
    })
}

#[async_trait]
impl Runtime for RuncRuntime {
    async fn create(&self, id: &str, bundle: &Path, args: &CreateArgs) -> Result<u32> {
        let mut opts = CreateOpts::new()
            .pid_file(&args.pid_file)
            .no_pivot(args.no_pivot)
            .no_new_keyring(args.no_new_keyring);
        if let Some(io) = &args.io {
            opts = opts.io(io.clone());
        }
        if let Some(sock) = &args.console_socket {
            opts = opts.console_socket(sock);
        }
        self.runc
            .create(id, bundle, Some(&opts))
            .await
            .map_err(|e| self.fail("create", id, &e))?;
        read_pid(&args.pid_file).await
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.runc
            .start(id)
            .await
            .map_err(|e| self.fail("start", id, &e))
    }

    async fn exec(&self, id: &str, process: &Process, args: &ExecArgs) -> Result<u32> {
        let mut opts = ExecOpts::new().pid_file(&args.pid_file).detach(true);
        if let Some(io) = &args.io {
            opts = opts.io(io.clone());
        }
        if let Some(sock) = &args.console_socket {
            opts = opts.console_socket(sock);
        }
        self.runc
            .exec(id, process, Some(&opts))
            .await
            .map_err(|e| self.fail("exec", id, &e))?;
        read_pid(&args.pid_file).await
    }

    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        let opts = KillOpts::new().all(all);
        self.runc
            .kill(id, signal, Some(&opts))
            .await
            .map_err(|e| self.fail("kill", id, &e))
    }

    async fn delete(&self, id: &str, force: bool) -> Result<()> {
        let opts = DeleteOpts::new().force(force);
        self.runc
            .delete(id, Some(&opts))
            .await
            .map_err(|e| self.fail("delete", id, &e))
    }

    async fn pause(&self, id: &str) -> Result<()> {
        self.runc
            .pause(id)
            .await
            .map_err(|e| self.fail("pause", id, &e))
    }

    async fn resume(&self, id: &str) -> Result<()> {
        self.runc
            .resume(id)
            .await
            .map_err(|e| self.fail("resume", id, &e))
    }

    async fn ps(&self, id: &str) -> Result<Vec<u32>> {
        let pids = self
            .runc
            .ps(id)
            .await
            .map_err(|e| self.fail("ps", id, &e))?;
        Ok(pids
            .into_iter()
            .filter_map(|p| u32::try_from(p).ok())
            .collect())
    }

    async fn update(&self, id: &str, resources: &LinuxResources) -> Result<()> {
        self.runc
            .update(id, resources)
            .await
            .map_err(|e| self.fail("update", id, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_codes_become_wait_statuses() {
        assert_eq!(exit_status(0).code(), Some(0));
        assert_eq!(exit_status(3).code(), Some(3));
        assert_eq!(exit_status(137).signal(), Some(9));
    }
}
