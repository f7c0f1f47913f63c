//! `mqfq-sim`: compare GPU queueing policies on a trace. See `docs/SIMULATOR.md`.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    mqfq_sim::cli::Cli::parse().run()
}
