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
        Cmd::Status { .. } | Cmd::Top { .. } => None,
    };
    if let Some(out) = generated {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(&out)
            .and_then(|()| stdout.flush())
            .context("writing to stdout")?;
        return Ok(());
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
                if json {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&mqfq_daemon::ctl::to_json(&s))?
                    );
                } else {
                    print!("{}", mqfq_daemon::ctl::render(&s));
                }
            }
            Cmd::Top { interval_ms, count } => {
                let mut n = 0;
                loop {
                    let s = get().await?;
                    // Clear the screen and home the cursor, then draw.
                    print!("\x1b[2J\x1b[H{}", mqfq_daemon::ctl::render(&s));
                    n += 1;
                    if count != 0 && n >= count {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(interval_ms)).await;
                }
            }
            Cmd::Completions { .. } | Cmd::Man => {}
        }
        anyhow::Ok(())
    })
}
