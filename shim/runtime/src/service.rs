//! The shim process: `start` (spawn or reuse the server), `delete` (clean up after a crashed
//! shim), and the server's task service with its event forwarder.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::asynchronous::{ExitSignal, Shim};
use containerd_shim::protos::api::DeleteResponse;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::ttrpc::context::Context;
use containerd_shim::util::{convert_to_timestamp, write_str_to_file};
use containerd_shim::{Config, Flags, StartOpts, socket_address};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use crate::options::{self, RuntimeOptions};
use crate::runtime::{RuncFactory, RuntimeFactory};
use crate::task::{TaskService, unmount};

/// File in the bundle holding the decoded runtime options.
pub const OPTIONS_FILE: &str = "mqfq-options.json";

/// Annotation CRI sets on every container of a pod: one shim serves the whole pod.
const SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

/// The shim.
pub struct Service {
    exit: Arc<ExitSignal>,
    id: String,
    namespace: String,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("id", &self.id)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// `what` failed, with the error and every source under it (what containerd prints).
fn shim_err(what: &str, e: &(dyn std::error::Error + 'static)) -> containerd_shim::Error {
    containerd_shim::Error::Other(crate::error::chain(&format!("{what}: {e}"), e.source()))
}

/// The grouping key: the pod sandbox id for CRI containers, else the container id.
#[must_use]
pub fn grouping(spec: &serde_json::Value, id: &str) -> String {
    spec.get("annotations")
        .and_then(|a| a.get(SANDBOX_ID))
        .and_then(serde_json::Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(id)
        .to_owned()
}

async fn socket_answers(address: &str) -> bool {
    let path = address.strip_prefix("unix://").unwrap_or(address);
    tokio::net::UnixStream::connect(path).await.is_ok()
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        Service {
            exit: Arc::new(ExitSignal::default()),
            id: args.id.clone(),
            namespace: args.namespace.clone(),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        // Options arrive on stdin, typed by type_url; decode them ourselves (the crate's own
        // spawn decodes blindly as runc options).
        let mut raw = Vec::new();
        tokio::io::stdin()
            .read_to_end(&mut raw)
            .await
            .map_err(|e| shim_err("read options from stdin", &e))?;
        let rt = options::decode_bytes(&raw).map_err(|e| shim_err("runtime options", &e))?;
        let spec_text = tokio::fs::read_to_string("config.json")
            .await
            .map_err(|e| shim_err("read config.json", &e))?;
        let spec: serde_json::Value =
            serde_json::from_str(&spec_text).map_err(|e| shim_err("parse config.json", &e))?;
        let group = grouping(&spec, &opts.id);
        let address = socket_address(&opts.address, &opts.namespace, &group);
        if group != opts.id && socket_answers(&address).await {
            write_str_to_file("address", &address).await?;
            return Ok(address);
        }
        let exe = std::env::current_exe().map_err(|e| shim_err("current exe", &e))?;
        let mut cmd = tokio::process::Command::new(exe);
        cmd.stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .args([
                "-namespace",
                &opts.namespace,
                "-id",
                &opts.id,
                "-address",
                &opts.address,
                "-socket",
                &address,
            ]);
        if opts.debug {
            cmd.arg("-debug");
        }
        let mut child = cmd.spawn().map_err(|e| shim_err("spawn shim server", &e))?;
        let pid = child.id().unwrap_or_default();
        if let Some(cg) = rt.shim_cgroup.as_deref() {
            containerd_shim::cgroup::add_task_to_cgroup(cg, pid)?;
        }
        containerd_shim::cgroup::adjust_oom_score(pid)?;
        // The server dups stderr over stdout once it listens: EOF here means "started".
        if let Some(mut out) = child.stdout.take() {
            let mut sink = Vec::new();
            let _ = out.read_to_end(&mut sink).await;
        }
        write_str_to_file("address", &address).await?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        // containerd lost the shim: remove runc state and mounts. cwd is the bundle.
        let bundle = std::env::current_dir().map_err(|e| shim_err("cwd", &e))?;
        let opts: RuntimeOptions = match tokio::fs::read(bundle.join(OPTIONS_FILE)).await {
            Ok(b) => serde_json::from_slice(&b).unwrap_or_default(),
            Err(_) => RuntimeOptions::default(),
        };
        let factory = RuncFactory {
            namespace: self.namespace.clone(),
        };
        match factory.runtime(&bundle, &opts) {
            Ok(rt) => {
                if let Err(e) = rt.delete(&self.id, true).await {
                    tracing::warn!("delete after crash: {}", e.full_message());
                }
            }
            Err(e) => tracing::warn!("delete after crash: {}", e.full_message()),
        }
        unmount(&bundle.join("rootfs"));
        if !self.id.is_empty() && !self.id.contains('/') && self.id != "." && self.id != ".." {
            crate::uvm::cleanup(&crate::uvm::ctl_dir(
                &crate::uvm::ctl_root(),
                &self.namespace,
                &self.id,
            ));
        }
        Ok(DeleteResponse {
            pid: 0,
            exit_status: 137,
            exited_at: MessageField::some(convert_to_timestamp(Some(
                std::time::SystemTime::now().into(),
            ))),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        let (tx, mut rx) = mpsc::unbounded_channel::<crate::task::Event>();
        let ns = self.namespace.clone();
        tokio::spawn(async move {
            while let Some((topic, ev)) = rx.recv().await {
                if let Err(e) = publisher.publish(Context::default(), topic, &ns, ev).await {
                    tracing::warn!("publish {topic}: {e}");
                }
            }
        });
        let svc = TaskService::new(
            tx,
            Arc::new(SavingFactory(RuncFactory {
                namespace: self.namespace.clone(),
            })),
            self.exit.clone(),
            &self.namespace,
            gate(),
        );
        if let Err(e) = svc.watch_exits().await {
            tracing::error!("cannot watch process exits: {}", e.full_message());
        }
        svc
    }
}

/// The admission gate and the pool's order channel (one link to mqfqd), configured from the
/// environment containerd gave the shim. A bad value fails closed: the operator asked for
/// something other than the defaults.
fn gate() -> (
    Arc<dyn crate::gate::Gate>,
    Arc<dyn crate::gate::PoolChannel>,
) {
    let cfg = crate::gate::GateConfig::from_env().unwrap_or_else(|e| {
        tracing::error!("{}; GPU admission fails closed", e.full_message());
        crate::gate::GateConfig {
            socket: mqfq_proto::DEFAULT_SOCKET.into(),
            fail_open: false,
            reconnect_grace: std::time::Duration::from_secs(5),
            admit_timeout: Some(std::time::Duration::from_secs(100)),
        }
    });
    let link = crate::gate::DaemonGate::new(cfg);
    (Arc::new(link.clone()), Arc::new(link))
}

/// Saves the options into the bundle before handing out the runtime (for `delete`).
#[derive(Debug)]
struct SavingFactory(RuncFactory);

impl RuntimeFactory for SavingFactory {
    fn runtime(
        &self,
        bundle: &Path,
        opts: &RuntimeOptions,
    ) -> crate::error::Result<Arc<dyn crate::runtime::Runtime>> {
        let json = serde_json::to_vec(opts).unwrap_or_default();
        std::fs::write(bundle.join(OPTIONS_FILE), json)
            .map_err(|e| crate::error::Error::io(format!("write {OPTIONS_FILE}"), e))?;
        self.0.runtime(bundle, opts)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn one_shim_per_pod_else_per_container() {
        let pod = json!({"annotations": {"io.kubernetes.cri.sandbox-id": "sb1"}});
        assert_eq!(grouping(&pod, "c1"), "sb1");
        assert_eq!(grouping(&json!({}), "c1"), "c1");
    }
}
