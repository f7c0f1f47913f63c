//! Exec: an extra process in a running container, recorded here and started by `runc exec` at
//! Start.

use containerd_shim_protos::api;
use containerd_shim_protos::events::task::TaskExecAdded;

use super::{Container, TaskService, nf};
use crate::error::{Error, Result};
use crate::io::{ProcessIo, StdioPaths};
use crate::process::{Proc, Status};

impl TaskService {
    /// Records an exec process (`runc exec` happens at Start).
    ///
    /// # Errors
    /// `NOT_FOUND`, `ALREADY_EXISTS`, `INVALID_ARGUMENT` for a bad process spec, `UNIMPLEMENTED`
    /// for tty, `FAILED_PRECONDITION` if the container has exited.
    pub async fn exec(&self, req: api::ExecProcessRequest) -> Result<()> {
        let spec: oci_spec::runtime::Process = serde_json::from_slice(&req.spec.value)
            .map_err(|e| Error::invalid(format!("exec {} spec", req.exec_id), e))?;
        if req.exec_id.is_empty() {
            return Err(Error::InvalidArgument("exec id is empty".into()));
        }
        let stdio = StdioPaths::checked(&req.stdin, &req.stdout, &req.stderr, req.terminal)?;
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
}
