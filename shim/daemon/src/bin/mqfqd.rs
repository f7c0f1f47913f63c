//! `mqfqd`: the node daemon (see the `mqfq_daemon` library).

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use mqfq_daemon::config::DaemonConfig;

/// The node daemon of mqfq-shim: gates GPU task starts on an MQFQ-Sticky queue.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Config file (TOML); without it, /etc/mqfq/mqfqd.toml if present, else the defaults.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Listen on this socket instead of the config's.
    #[arg(long)]
    socket: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    mqfq_daemon::logging::init_stderr();
    // Everything the daemon creates (socket, edits file, dispatch log) is root's alone.
    mqfq_daemon::restrict_umask();
    let args = Args::parse();
    let path = args.config.or_else(|| {
        let p = PathBuf::from("/etc/mqfq/mqfqd.toml");
        p.exists().then_some(p)
    });
    let mut cfg = match &path {
        Some(p) => DaemonConfig::load(p)?,
        None => DaemonConfig::default(),
    };
    if let Some(s) = args.socket {
        cfg.socket = s;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async move {
        let stop = async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        mqfq_daemon::run(cfg, stop).await
    })?;
    Ok(())
}
