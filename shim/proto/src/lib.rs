//! What the shim and `mqfqd` say to each other, in one small crate both link: the ttrpc
//! admission API generated from `mqfqd.proto` ([`api`]), where the daemon listens
//! ([`DEFAULT_SOCKET`]), how a container is named on the node ([`ContainerKey`]), and the memory
//! a container's CUDA processes report ([`memory`]), and how its memory goes Warm ([`warm`]). The shim binary links this crate and not the
//! daemon's, so every pod's shim stays small.

pub mod api;
pub mod memory;
pub mod warm;

pub use scheduler_core::node::{ContainerKey, KeyError, is_key};

/// Where `mqfqd` listens unless configured otherwise (shims use `MQFQ_DAEMON_SOCKET` or the
/// runtime option to point elsewhere).
pub const DEFAULT_SOCKET: &str = "/run/mqfq/mqfqd.sock";

/// Connects to the daemon.
///
/// # Errors
/// Nothing listens on `socket`.
pub async fn connect(socket: &std::path::Path) -> Result<api::AdmissionClient, ttrpc::Error> {
    let c = ttrpc::r#async::Client::connect(&format!("unix://{}", socket.display())).await?;
    Ok(api::AdmissionClient::new(c))
}

/// The release reason of a lease granted to a container that could not use it (paused while
/// its burst waited): handed back at once, no service measured, its memory left where it was.
pub const UNUSED: &str = "unused";

/// Whether a lease that ended for `reason` leaves its container living on, idle: paused, between
/// bursts, or handed a lease it could not use (the release reasons `pause`, `idle`, `unused`).
#[must_use]
pub fn stays_idle(reason: &str) -> bool {
    matches!(reason, "pause" | "idle" | UNUSED)
}
