//! `containerd-shim-mqfq-v2`: a containerd shim v2 (task API v2) that runs containers through
//! runc and records, at Create, which are GPU work and whose. GPU work (task starts without the
//! CUDA interposer, bursts with it) is admitted by the node's MQFQ-Sticky queue in `mqfqd`;
//! non-GPU containers behave as with runc. This crate is what containerd starts for every pod:
//! it links the protocol (`mqfq-proto`) and not the daemon (`mqfq-daemon`).
//!
//! - [`service`]: the shim process (`start`, `delete`, the server).
//! - [`task`]: the Task service (create, start, exec, kill, delete, pause, resume, state, wait,
//!   pids, stats, update, close_io, resize_pty, connect, shutdown).
//! - [`runtime`]: the runc seam, with the exit-monitor spawner; [`info`]: `-info`, the runtime's
//!   features for containerd 2.x (runc's).
//! - [`gpu`], [`options`], [`io`], [`console`], [`process`], [`error`]: classification, runtime
//!   options, stdio, terminals, the process state machine, errors and their ttrpc codes.

pub mod checkpoint;
pub mod console;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod gate;
pub mod gpu;
pub mod info;
pub mod io;
pub mod nvidia;
pub mod oom;
pub mod options;
pub mod process;
pub mod rootfs;
pub mod runtime;
pub mod service;
pub mod stats;
pub mod task;
pub mod uvm;

pub use mqfq_edits::elf;
pub use mqfq_proto::{api, memory};

/// Version and git revision, as `-v` prints them.
#[must_use]
pub fn version() -> String {
    format!(
        "{} {} (revision {})",
        env!("CARGO_PKG_NAME"),
        env!("CARGO_PKG_VERSION"),
        option_env!("MQFQ_GIT_REVISION").unwrap_or("unknown")
    )
}
