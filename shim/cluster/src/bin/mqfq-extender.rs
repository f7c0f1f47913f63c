//! `mqfq-extender`: the kube-scheduler extender (see `mqfq_cluster::extender`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use mqfq_cluster::extender::{Cache, Extender, refresh, router, untyped};

/// Ranks GPU nodes for pods from the GpuNodeState objects mqfq's publishers write.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to serve the extender API on.
    #[arg(long, default_value = "0.0.0.0:8888", env = "MQFQ_EXTENDER_LISTEN")]
    listen: String,
    /// Namespace of the GpuNodeState objects.
    #[arg(long, default_value = "mqfq-system", env = "MQFQ_NAMESPACE")]
    namespace: String,
    /// Seconds between lists of the objects.
    #[arg(long, default_value_t = 5.0)]
    refresh_s: f64,
    /// A summary older than this many seconds is ignored (three publisher heartbeats).
    #[arg(long, default_value_t = 180.0)]
    stale_s: f64,
    /// Serve over TLS with this certificate chain (PEM); with --tls-key and --client-ca.
    #[arg(long, requires_all = ["tls_key", "client_ca"])]
    tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// CA (PEM) whose certificates clients must present (kube-scheduler's `tlsConfig`).
    #[arg(long, requires = "tls_cert")]
    client_ca: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    mqfq_cluster::init_logging();
    let a = Args::parse();
    anyhow::ensure!(
        a.refresh_s.is_finite() && a.refresh_s >= 0.1,
        "--refresh-s must be at least 0.1"
    );
    anyhow::ensure!(
        a.stale_s.is_finite() && a.stale_s > 0.0,
        "--stale-s must be > 0"
    );
    let client = kube::Client::try_default()
        .await
        .context("Kubernetes client (in-cluster or KUBECONFIG)")?;
    let api = untyped(client, &a.namespace);
    let cache = Arc::new(Cache::default());
    tokio::spawn(refresh(
        api,
        cache.clone(),
        Duration::from_secs_f64(a.refresh_s),
    ));
    let x = Arc::new(Extender::new(cache, a.stale_s));
    let tls = match (&a.tls_cert, &a.tls_key, &a.client_ca) {
        (Some(cert), Some(key), Some(ca)) => Some(mqfq_cluster::tls::acceptor(cert, key, ca)?),
        _ => {
            tracing::warn!(
                "serving plain HTTP: any pod that reaches it can use the extender (docs/CLUSTER.md: TLS with client certificates)"
            );
            None
        }
    };
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .with_context(|| format!("listen on {}", a.listen))?;
    tracing::info!(listen = %a.listen, namespace = %a.namespace, tls = tls.is_some(), "mqfq-extender serving");
    mqfq_cluster::http::serve(
        listener,
        router(x),
        mqfq_cluster::http::Limits::default(),
        tls,
    )
    .await?;
    Ok(())
}
