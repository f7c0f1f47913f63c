//! Delete: a stopped process's record, or the container with its runc state, mounts, control
//! directory and lease.

use containerd_shim_protos::api;
use containerd_shim_protos::events::task::TaskDelete;

use super::{TaskService, exit_status, nf, unmount};
use crate::error::{Error, Result};
use crate::process::Status;

impl TaskService {
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
            (c.runtime.clone(), c.gpu.is_gpu())
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
        c.gpu.end();
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
}
