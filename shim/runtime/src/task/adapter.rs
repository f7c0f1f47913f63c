//! The ttrpc face of the task service: each method unwraps its request, calls the plain
//! operation in the parent module, and maps errors to codes once (see [`crate::error`]).

use async_trait::async_trait;
use containerd_shim_protos::api;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::ttrpc;
use containerd_shim_protos::ttrpc::r#async::TtrpcContext;

use super::{Error, Result, TaskService, nf};

fn ttrpc_result<T>(r: Result<T>) -> ttrpc::Result<T> {
    r.map_err(|e| {
        tracing::debug!("task call failed: {}", e.full_message());
        e.into()
    })
}

#[async_trait]
impl Task for TaskService {
    async fn state(
        &self,
        _: &TtrpcContext,
        req: api::StateRequest,
    ) -> ttrpc::Result<api::StateResponse> {
        ttrpc_result(TaskService::state(self, &req.id, &req.exec_id).await)
    }

    async fn create(
        &self,
        _: &TtrpcContext,
        req: api::CreateTaskRequest,
    ) -> ttrpc::Result<api::CreateTaskResponse> {
        let pid = ttrpc_result(TaskService::create(self, req).await)?;
        Ok(api::CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start(
        &self,
        _: &TtrpcContext,
        req: api::StartRequest,
    ) -> ttrpc::Result<api::StartResponse> {
        // In a task of its own: ttrpc drops a handler past the caller's deadline, and a start
        // dropped while it waits in the queue or while runc runs would leave the process
        // "already starting", its admission in flight and its start event unsent. Carried to
        // the end, it records what happened; the caller (gone) deletes it as it would any task.
        let svc = self.clone();
        let started = tokio::spawn(async move { svc.start(&req.id, &req.exec_id).await })
            .await
            .map_err(|e| Error::io("start task", std::io::Error::other(e)));
        let pid = ttrpc_result(started.and_then(|r| r))?;
        Ok(api::StartResponse {
            pid,
            ..Default::default()
        })
    }

    async fn delete(
        &self,
        _: &TtrpcContext,
        req: api::DeleteRequest,
    ) -> ttrpc::Result<api::DeleteResponse> {
        ttrpc_result(TaskService::delete(self, &req.id, &req.exec_id).await)
    }

    async fn pids(
        &self,
        _: &TtrpcContext,
        req: api::PidsRequest,
    ) -> ttrpc::Result<api::PidsResponse> {
        let r = async {
            let (runtime, _) = self.runtime_and_pid(&req.id).await?;
            runtime.ps(&req.id).await
        };
        let pids = ttrpc_result(r.await)?;
        Ok(api::PidsResponse {
            processes: pids
                .into_iter()
                .map(|pid| api::ProcessInfo {
                    pid,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }

    async fn pause(&self, _: &TtrpcContext, req: api::PauseRequest) -> ttrpc::Result<api::Empty> {
        ttrpc_result(self.pause_task(&req.id).await)?;
        Ok(api::Empty::new())
    }

    async fn resume(&self, _: &TtrpcContext, req: api::ResumeRequest) -> ttrpc::Result<api::Empty> {
        ttrpc_result(self.resume_task(&req.id).await)?;
        Ok(api::Empty::new())
    }

    async fn checkpoint(
        &self,
        _: &TtrpcContext,
        _: api::CheckpointTaskRequest,
    ) -> ttrpc::Result<api::Empty> {
        Err(Error::Unimplemented("checkpoint").into())
    }

    async fn kill(&self, _: &TtrpcContext, req: api::KillRequest) -> ttrpc::Result<api::Empty> {
        ttrpc_result(TaskService::kill(self, &req.id, &req.exec_id, req.signal, req.all).await)?;
        Ok(api::Empty::new())
    }

    async fn exec(
        &self,
        _: &TtrpcContext,
        req: api::ExecProcessRequest,
    ) -> ttrpc::Result<api::Empty> {
        ttrpc_result(TaskService::exec(self, req).await)?;
        Ok(api::Empty::new())
    }

    async fn resize_pty(
        &self,
        _: &TtrpcContext,
        req: api::ResizePtyRequest,
    ) -> ttrpc::Result<api::Empty> {
        let r = async {
            let mut st = self.state.lock().await;
            let c = st.containers.get_mut(&req.id).ok_or_else(|| nf(&req.id))?;
            match c.proc_mut(&req.exec_id)?.io.as_ref() {
                Some(io) => io.resize(req.width, req.height),
                None => Ok(()),
            }
        };
        ttrpc_result(r.await)?;
        Ok(api::Empty::new())
    }

    async fn close_io(
        &self,
        _: &TtrpcContext,
        req: api::CloseIORequest,
    ) -> ttrpc::Result<api::Empty> {
        let r = async {
            let mut st = self.state.lock().await;
            let c = st.containers.get_mut(&req.id).ok_or_else(|| nf(&req.id))?;
            let p = c.proc_mut(&req.exec_id)?;
            if req.stdin
                && let Some(io) = p.io.as_mut()
            {
                io.close_stdin();
            }
            Ok(())
        };
        ttrpc_result(r.await)?;
        Ok(api::Empty::new())
    }

    async fn update(
        &self,
        _: &TtrpcContext,
        req: api::UpdateTaskRequest,
    ) -> ttrpc::Result<api::Empty> {
        let r = async {
            let resources: oci_spec::runtime::LinuxResources =
                serde_json::from_slice(&req.resources.value)
                    .map_err(|e| Error::invalid("update resources", e))?;
            let (runtime, _) = self.runtime_and_pid(&req.id).await?;
            runtime.update(&req.id, &resources).await
        };
        ttrpc_result(r.await)?;
        Ok(api::Empty::new())
    }

    async fn wait(
        &self,
        _: &TtrpcContext,
        req: api::WaitRequest,
    ) -> ttrpc::Result<api::WaitResponse> {
        ttrpc_result(TaskService::wait(self, &req.id, &req.exec_id).await)
    }

    async fn stats(
        &self,
        _: &TtrpcContext,
        req: api::StatsRequest,
    ) -> ttrpc::Result<api::StatsResponse> {
        let r = async {
            let (_, pid) = self.runtime_and_pid(&req.id).await?;
            crate::stats::collect(pid)
        };
        let any = ttrpc_result(r.await)?;
        Ok(api::StatsResponse {
            stats: MessageField::some(any),
            ..Default::default()
        })
    }

    async fn connect(
        &self,
        _: &TtrpcContext,
        req: api::ConnectRequest,
    ) -> ttrpc::Result<api::ConnectResponse> {
        let task_pid = self
            .runtime_and_pid(&req.id)
            .await
            .map(|(_, p)| p)
            .unwrap_or_default();
        Ok(api::ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: crate::version(),
            ..Default::default()
        })
    }

    async fn shutdown(
        &self,
        _: &TtrpcContext,
        req: api::ShutdownRequest,
    ) -> ttrpc::Result<api::Empty> {
        if req.now || self.is_empty().await {
            self.exit.signal();
        }
        Ok(api::Empty::new())
    }
}
