//! What a container's CUDA processes hold, as their interposers report it (`status` on the
//! control socket): managed bytes, which the pool can move, and native bytes by reason, which it
//! cannot. The shim reads it at a pause or a burst's end and passes it to `mqfqd` (Release,
//! Register); `mqfqctl` and the metrics show it, so an operator sees which functions the pool can
//! really move and why the rest stays on the GPU.

use serde::Serialize;

use crate::api;

/// Native bytes by reason, and refused exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Native {
    /// `cuMemCreate` (virtual memory management).
    pub vmm: u64,
    /// `cuMemAllocAsync` / `cuMemAllocFromPoolAsync`.
    pub stream_ordered: u64,
    /// CUDA arrays.
    pub array: u64,
    /// `cuMemAlloc` kept native by the function's setting (`io.mqfq.native-alloc=all`).
    pub setting: u64,
    /// `cuMemAlloc` from a listed communication library.
    pub library: u64,
    /// `cuMemAlloc` after the process asked to export converted memory.
    pub export: u64,
    /// `cuMemAlloc` left native for another reason (conversion failed).
    pub other: u64,
    /// Export requests the driver refused on converted memory (a count).
    pub refused: u64,
}

/// What the processes hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Managed bytes (the pool moves them).
    pub managed: u64,
    /// Native bytes by reason.
    pub native: Native,
}

impl Native {
    /// Bytes by reason, in a fixed order, as `(name, bytes)`.
    #[must_use]
    pub fn reasons(&self) -> [(&'static str, u64); 7] {
        [
            ("vmm", self.vmm),
            ("stream-ordered", self.stream_ordered),
            ("array", self.array),
            ("setting", self.setting),
            ("library", self.library),
            ("export", self.export),
            ("other", self.other),
        ]
    }

    /// All native bytes.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.reasons()
            .iter()
            .fold(0u64, |t, (_, b)| t.saturating_add(*b))
    }

    /// The reasons that hold bytes, comma-separated (`-` for none).
    #[must_use]
    pub fn why(&self) -> String {
        let names: Vec<&str> = self
            .reasons()
            .iter()
            .filter(|(_, b)| *b > 0)
            .map(|(n, _)| *n)
            .collect();
        if names.is_empty() {
            "-".into()
        } else {
            names.join(",")
        }
    }

    /// Adds another process's figures (saturating).
    pub fn add(&mut self, o: &Native) {
        // Destructured: a new field cannot be forgotten here.
        let Native {
            vmm,
            stream_ordered,
            array,
            setting,
            library,
            export,
            other,
            refused,
        } = *o;
        self.vmm = self.vmm.saturating_add(vmm);
        self.stream_ordered = self.stream_ordered.saturating_add(stream_ordered);
        self.array = self.array.saturating_add(array);
        self.setting = self.setting.saturating_add(setting);
        self.library = self.library.saturating_add(library);
        self.export = self.export.saturating_add(export);
        self.other = self.other.saturating_add(other);
        self.refused = self.refused.saturating_add(refused);
    }

    /// On the wire.
    #[must_use]
    pub fn to_proto(&self) -> api::NativeMemory {
        api::NativeMemory {
            vmm: self.vmm,
            stream_ordered: self.stream_ordered,
            array: self.array,
            setting: self.setting,
            library: self.library,
            export: self.export,
            other: self.other,
            refused: self.refused,
            ..Default::default()
        }
    }

    /// From the wire.
    #[must_use]
    pub fn from_proto(p: &api::NativeMemory) -> Self {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_sum_and_name_what_holds_bytes() {
        let mut n = Native {
            library: 5,
            export: 7,
            refused: 1,
            ..Native::default()
        };
        assert_eq!(n.total(), 12, "refusals are a count, not bytes");
        assert_eq!(n.why(), "library,export");
        assert_eq!(Native::default().why(), "-");
        n.add(&Native {
            vmm: u64::MAX,
            refused: 2,
            ..Native::default()
        });
        assert_eq!((n.vmm, n.refused, n.total()), (u64::MAX, 3, u64::MAX));
        assert_eq!(Native::from_proto(&n.to_proto()), n);
    }
}
