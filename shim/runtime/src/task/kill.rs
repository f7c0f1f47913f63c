//! Kill: a signal to the init process, an exec process, or every process of the container.

use super::{TaskService, nf};
use crate::error::{Error, Result};
use crate::process::Status;

impl TaskService {
    /// Signals the init (through runc, optionally every process) or an exec.
    ///
    /// # Errors
    /// `NOT_FOUND` for unknown or finished processes, or runc's failure.
    pub async fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let (runtime, pid, gpu) = {
            let mut st = self.state.lock().await;
            let c = st.containers.get_mut(id).ok_or_else(|| nf(id))?;
            let runtime = c.runtime.clone();
            let gpu = exec_id.is_empty() && c.gpu.is_gpu();
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
}
