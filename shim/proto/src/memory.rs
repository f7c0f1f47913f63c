//! What a container's CUDA processes hold, as their interposers report it (`status` on the
//! control socket): managed bytes, which the pool can move, and native bytes by reason
//! ([`Native`]), which it cannot. The shim reads it at a pause or a burst's end and passes it to
//! `mqfqd` (Release, Register); `mqfqctl` and the metrics show it, so an operator sees which
//! functions the pool can really move and why the rest stays on the GPU.

pub use scheduler_core::native::Native;

use crate::api;

/// What the processes hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Managed bytes (the pool moves them).
    pub managed: u64,
    /// Native bytes by reason.
    pub native: Native,
}

/// On the wire.
#[must_use]
pub fn to_proto(n: &Native) -> api::NativeMemory {
    api::NativeMemory {
        vmm: n.vmm,
        stream_ordered: n.stream_ordered,
        array: n.array,
        setting: n.setting,
        library: n.library,
        export: n.export,
        other: n.other,
        refused: n.refused,
        ..Default::default()
    }
}

/// From the wire.
#[must_use]
pub fn from_proto(p: &api::NativeMemory) -> Native {
    Native {
        vmm: p.vmm,
        stream_ordered: p.stream_ordered,
        array: p.array,
        setting: p.setting,
        library: p.library,
        export: p.export,
        other: p.other,
        refused: p.refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_figures_survive_the_wire() {
        let n = Native {
            vmm: 1,
            stream_ordered: 2,
            array: 3,
            setting: 4,
            library: 5,
            export: 6,
            other: 7,
            refused: 8,
        };
        assert_eq!(from_proto(&to_proto(&n)), n);
    }
}
