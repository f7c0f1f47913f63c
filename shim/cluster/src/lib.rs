//! The cluster half of placement (issue 17): Kubernetes sees each GPU node through a
//! `GpuNodeState` object, and a kube-scheduler extender ranks nodes for a pod from them.
//!
//! - [`publisher`]: next to `mqfqd` on each node (a DaemonSet), reads its Status over the
//!   control socket, builds the node's summary and writes it when
//!   `scheduler_core::placement::cluster::PublishGate` says so (threshold crossings, a slow
//!   heartbeat, a minimum interval), retrying a conflicting write once re-read.
//! - [`extender`]: the scheduler-extender HTTP API (filter, prioritize), answering from a
//!   cache of the objects it lists; the ranking is scheduler-core's.
//! - [`http`]: serves the extender with bounds on connections and their time.
//! - [`crd`]: the resource both share.
//!
//! A separate crate because kube-rs is heavy and only clusters need it: `mqfqd`, the shim and
//! the simulator build without it.

pub mod crd;
pub mod extender;
pub mod http;
pub mod publisher;
pub mod tls;

/// Milliseconds since the Unix epoch now.
#[must_use]
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The `GpuNodeState` objects of `namespace`, through the in-cluster configuration or
/// `KUBECONFIG`.
///
/// # Errors
/// No usable Kubernetes configuration.
pub async fn objects(namespace: &str) -> Result<kube::Api<crd::GpuNodeState>, kube::Error> {
    let client = kube::Client::try_default().await?;
    Ok(kube::Api::namespaced(client, namespace))
}

/// Logs to stderr, for the binaries.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
}
