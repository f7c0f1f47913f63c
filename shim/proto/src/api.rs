//! The mqfqd admission API (`mqfqd.proto`), generated at build time by ttrpc-codegen.
//! Shims, `mqfqd` and `mqfqctl` all use these types, so the wire format has one definition.

#[allow(
    warnings,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks,
    clippy::uninlined_format_args
)]
mod generated {
    /// Messages.
    pub mod mqfqd {
        include!(concat!(env!("OUT_DIR"), "/mqfqd.rs"));
    }

    /// The ttrpc client and server glue.
    pub mod mqfqd_ttrpc {
        include!(concat!(env!("OUT_DIR"), "/mqfqd_ttrpc.rs"));
    }
}

pub use generated::mqfqd::*;
pub use generated::mqfqd_ttrpc::{Admission, AdmissionClient, create_admission};
pub use generated::{mqfqd, mqfqd_ttrpc};
