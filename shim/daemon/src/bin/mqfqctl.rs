//! `mqfqctl`: status and top for `mqfqd`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};

/// Look at the node's GPU admission queue.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// mqfqd's socket.
    #[arg(long, global = true, env = "MQFQ_DAEMON_SOCKET", default_value = mqfq_daemon::config::DEFAULT_SOCKET)]
    socket: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Flows (VT, state, in-flight, queue), GPUs (D, utilization) and leases.
    Status {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Status, refreshed.
    Top {
        /// Refresh period in milliseconds.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Stop after this many refreshes (0: until interrupted).
        #[arg(long, default_value_t = 0)]
        count: u64,
    },
    /// Shell completions on stdout (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// The manual page (roff) on stdout: `mqfqctl man > /usr/share/man/man8/mqfqctl.8`.
    Man,
    /// Checks this node's setup (shim, containerd, mqfqd, GPUs, CDI, interposer) and says how
    /// to fix what is wrong. Exits 1 when a check fails.
    Doctor {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// containerd's config.
        #[arg(long, default_value = "/etc/containerd/config.toml")]
        containerd_config: PathBuf,
        /// The containerd program.
        #[arg(long, default_value = "containerd")]
        containerd: PathBuf,
        /// Read every file under this directory instead of / (a node image, a test).
        #[arg(long, default_value = "/")]
        root: PathBuf,
    },
}

/// Writes `out` to stdout whole: a reader that went away (`| head`) is an error, not a panic.
fn emit(out: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out)
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
}

fn main() -> anyhow::Result<()> {
    mqfq_daemon::logging::init_stderr();
    let args = Args::parse();
    // These two need no daemon. Written whole, so a closed pipe is an error, not a panic.
    let generated = match args.cmd {
        Cmd::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Args::command(), "mqfqctl", &mut out);
            Some(out)
        }
        Cmd::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(Args::command().name("mqfqctl"))
                .section("8")
                .render(&mut out)
                .context("rendering the manual page")?;
            Some(out)
        }
        Cmd::Status { .. } | Cmd::Top { .. } | Cmd::Doctor { .. } => None,
    };
    if let Some(out) = generated {
        return emit(&out);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async move {
        let get = || async {
            mqfq_daemon::ctl::status(&args.socket)
                .await
                .with_context(|| format!("mqfqd at {}", args.socket.display()))
        };
        match args.cmd {
            Cmd::Status { json } => {
                let s = get().await?;
                let text = if json {
                    serde_json::to_string_pretty(&mqfq_daemon::ctl::to_json(&s))? + "\n"
                } else {
                    mqfq_daemon::ctl::render(&s)
                };
                emit(text.as_bytes())?;
            }
            Cmd::Top { interval_ms, count } => {
                let mut n = 0;
                loop {
                    let s = get().await?;
                    // Clear the screen and home the cursor, then draw.
                    emit(format!("\x1b[2J\x1b[H{}", mqfq_daemon::ctl::render(&s)).as_bytes())?;
                    n += 1;
                    if count != 0 && n >= count {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(interval_ms)).await;
                }
            }
            Cmd::Doctor {
                json,
                ref containerd_config,
                ref containerd,
                ref root,
            } => {
                let setup = mqfq_daemon::doctor::Setup {
                    root: root.clone(),
                    containerd_config: containerd_config.clone(),
                    containerd: containerd.clone(),
                    ..mqfq_daemon::doctor::Setup::node(&args.socket)
                };
                let findings = mqfq_daemon::doctor::run(&setup).await;
                let text = if json {
                    serde_json::to_string_pretty(&findings)? + "\n"
                } else {
                    mqfq_daemon::doctor::render(&findings)
                };
                emit(text.as_bytes())?;
                if mqfq_daemon::doctor::worst(&findings) == mqfq_daemon::doctor::Level::Fail {
                    std::process::exit(1);
                }
            }
            Cmd::Completions { .. } | Cmd::Man => {}
        }
        anyhow::Ok(())
    })
}
