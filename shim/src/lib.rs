//! `containerd-shim-mqfq-v2`: a containerd shim v2 (task API v2) that runs containers through
//! runc and records, at Create, which are GPU work and whose. GPU task starts will be gated on
//! the node's MQFQ-Sticky queue (`mqfqd`, issue 4); non-GPU containers behave as with runc.
//!
//! - [`service`]: the shim process (`start`, `delete`, the server).
//! - [`task`]: the Task service (create, start, exec, kill, delete, pause, resume, state, wait,
//!   pids, stats, update, close_io, resize_pty, connect, shutdown).
//! - [`runtime`]: the runc seam, with the exit-monitor spawner.
//! - [`gpu`], [`options`], [`io`], [`console`], [`process`], [`error`]: classification, runtime
//!   options, stdio, terminals, the process state machine, errors and their ttrpc codes.

pub mod api;
pub mod console;
pub mod ctl;
pub mod daemon;
pub mod elf;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod gate;
pub mod gpu;
pub mod io;
pub mod logging;
pub mod memory;
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
