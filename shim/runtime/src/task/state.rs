//! State: what containerd asks of a process (status, pid, stdio, exit).

use containerd_shim_protos::api;

use super::{TaskService, exit_status, nf};
use crate::error::Result;
use crate::process::Status;

impl TaskService {
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
}
