//! `mqfq-publish`: publishes this node's GPU state for the cluster's scheduler (see
//! `mqfq_cluster::publisher`), or prints the CRD.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use mqfq_cluster::crd::crd_yaml;
use mqfq_cluster::publisher::{Publisher, Settings, run};
use scheduler_core::placement::cluster::{PublishConfig, PublishGate};

/// Writes this node's GpuNodeState from mqfqd's status.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Print the GpuNodeState CRD as YAML and exit.
    #[arg(long)]
    print_crd: bool,
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node: String,
    /// Namespace of the GpuNodeState objects.
    #[arg(long, default_value = "mqfq-system", env = "MQFQ_NAMESPACE")]
    namespace: String,
    /// mqfqd's control socket.
    #[arg(long, default_value = mqfq_proto::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Seconds between reads of mqfqd.
    #[arg(long, default_value_t = 1.0)]
    period_s: f64,
    /// Seconds between writes of an unchanged summary.
    #[arg(long, default_value_t = 60.0)]
    heartbeat_s: f64,
    /// Fewest seconds between two writes.
    #[arg(long, default_value_t = 10.0)]
    min_interval_s: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    mqfq_cluster::init_logging();
    let a = Args::parse();
    if a.print_crd {
        print!("{}", crd_yaml()?);
        return Ok(());
    }
    anyhow::ensure!(!a.node.is_empty(), "--node (or NODE_NAME) is required");
    anyhow::ensure!(
        a.period_s.is_finite() && a.period_s >= 0.1,
        "--period-s must be at least 0.1"
    );
    let gate = PublishGate::new(PublishConfig {
        heartbeat_s: a.heartbeat_s,
        min_interval_s: a.min_interval_s,
        ..PublishConfig::default()
    })?;
    let api = mqfq_cluster::objects(&a.namespace)
        .await
        .context("Kubernetes client (in-cluster or KUBECONFIG)")?;
    tracing::info!(node = %a.node, namespace = %a.namespace, "mqfq-publish started");
    run(
        Publisher::new(api, &a.node, gate),
        Settings {
            socket: a.socket,
            period: Duration::from_secs_f64(a.period_s),
        },
    )
    .await;
    Ok(())
}
