//! A recording fake of [`Runtime`] for the task service's unit tests.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use oci_spec::runtime::{LinuxResources, Process};

use super::{CreateArgs, ExecArgs, Runtime, RuntimeFactory};
use crate::error::{Error, Result};
use crate::options::RuntimeOptions;

/// Pids are unique across every fake in the test process: the exit monitor is global.
static NEXT_PID: AtomicU32 = AtomicU32::new(100_000);

/// Records every call; hands out unique pids.
#[derive(Debug, Default)]
pub struct FakeRuntime {
    /// Calls, as `op id [args]`.
    pub calls: Mutex<Vec<String>>,
    /// Make the next create fail like runc would.
    pub fail_create: AtomicBool,
    /// Report the init's exit through the exit monitor while `start` is still running (a
    /// process that ends before `runc start` returns).
    pub exit_during_start: AtomicBool,
    /// Make `start` fail (after the exit above, when both are set: runc start on a dead init).
    pub fail_start: AtomicBool,
    /// Report an exec's exit (code 9) through the exit monitor before `exec` returns its pid.
    pub exit_during_exec: AtomicBool,
    init_pids: Mutex<std::collections::HashMap<String, u32>>,
}

impl FakeRuntime {
    fn record(&self, s: String) {
        self.calls.lock().expect("calls lock").push(s);
    }

    /// The recorded calls.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("calls lock").clone()
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn create(&self, id: &str, _bundle: &Path, args: &CreateArgs) -> Result<u32> {
        self.record(format!("create {id}"));
        // Like runc: the process got the child ends of its stdio; the shim's copies close.
        if let Some(io) = &args.io {
            io.close_after_start().await;
        }
        if let Some(sock) = &args.console_socket {
            send_pty(sock);
        }
        if self.fail_create.swap(false, Ordering::SeqCst) {
            return Err(Error::Runc {
                op: "create",
                id: id.to_owned(),
                detail: "fake failure".into(),
            });
        }
        let pid = NEXT_PID.fetch_add(1, Ordering::SeqCst);
        self.init_pids
            .lock()
            .expect("pids lock")
            .insert(id.to_owned(), pid);
        Ok(pid)
    }
    async fn start(&self, id: &str) -> Result<()> {
        self.record(format!("start {id}"));
        if self.exit_during_start.load(Ordering::SeqCst) {
            let pid = self.init_pids.lock().expect("pids lock").get(id).copied();
            if let Some(pid) = pid {
                let pid = i32::try_from(pid).expect("small pid");
                containerd_shim::monitor::monitor_notify_by_pid(pid, 0)
                    .await
                    .expect("monitor");
                // Give the exit loop every chance to run before start returns.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        if self.fail_start.load(Ordering::SeqCst) {
            return Err(Error::io(
                format!("runc start {id}"),
                std::io::Error::other("container not running"),
            ));
        }
        Ok(())
    }
    async fn exec(&self, id: &str, _process: &Process, args: &ExecArgs) -> Result<u32> {
        self.record(format!("exec {id}"));
        if let Some(io) = &args.io {
            io.close_after_start().await;
        }
        if let Some(sock) = &args.console_socket {
            send_pty(sock);
        }
        let pid = NEXT_PID.fetch_add(1, Ordering::SeqCst);
        if self.exit_during_exec.load(Ordering::SeqCst) {
            let raw = i32::try_from(pid).expect("small pid");
            containerd_shim::monitor::monitor_notify_by_pid(raw, 9)
                .await
                .expect("monitor");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok(pid)
    }
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        self.record(format!("kill {id} {signal} all={all}"));
        Ok(())
    }
    async fn delete(&self, id: &str, force: bool) -> Result<()> {
        self.record(format!("delete {id} force={force}"));
        Ok(())
    }
    async fn pause(&self, id: &str) -> Result<()> {
        self.record(format!("pause {id}"));
        Ok(())
    }
    async fn resume(&self, id: &str) -> Result<()> {
        self.record(format!("resume {id}"));
        Ok(())
    }
    async fn ps(&self, id: &str) -> Result<Vec<u32>> {
        self.record(format!("ps {id}"));
        Ok(vec![1000])
    }
    async fn update(&self, id: &str, _resources: &LinuxResources) -> Result<()> {
        self.record(format!("update {id}"));
        Ok(())
    }
}

/// Like runc with `--console-socket`: open a pty and send its master over the socket.
fn send_pty(sock: &Path) {
    use std::io::IoSlice;
    use std::os::fd::AsRawFd;

    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};

    let pty = nix::pty::openpty(None, None).expect("openpty");
    let s = std::os::unix::net::UnixStream::connect(sock).expect("connect console socket");
    let fds = [pty.master.as_raw_fd()];
    sendmsg::<()>(
        s.as_raw_fd(),
        &[IoSlice::new(b"/dev/pts/fake")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .expect("send pty master");
}

/// Hands out one shared [`FakeRuntime`].
#[derive(Debug, Default, Clone)]
pub struct FakeFactory(pub Arc<FakeRuntime>);

impl RuntimeFactory for FakeFactory {
    fn runtime(&self, _bundle: &Path, _opts: &RuntimeOptions) -> Result<Arc<dyn Runtime>> {
        Ok(self.0.clone())
    }
}
