//! Wait: blocks until a process has exited, then says how.

use containerd_shim_protos::api;

use super::{TaskService, exit_status, nf};
use crate::error::{Error, Result};

impl TaskService {
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
}
