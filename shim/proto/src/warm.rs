//! The Warm-tier backend on the wire and in annotations: the type is `scheduler_core::warm`'s (the
//! simulator models the same choice); the annotation that picks it per pod is the shim's.

pub use scheduler_core::warm::{Warm, WarmError};

/// The annotation that chooses a container's backend.
pub const ANNOTATION: &str = "io.mqfq.warm";
