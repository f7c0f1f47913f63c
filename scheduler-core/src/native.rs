//! GPU memory the pool cannot move: what a container keeps native and why ([`Native`]), and which
//! functions keep their allocations native, learned from what their containers did ([`NativeAdvice`]).
//!
//! Why: the CUDA interposer converts `cuMemAlloc` to managed memory so that idle memory can move
//! to the host, and the driver refuses to export managed memory (legacy IPC, dma-buf). A
//! converted allocation cannot be made exportable later, so the first export a function's
//! container attempts is refused (its process then keeps later allocations native). The node
//! remembers the function: its next containers are created with every allocation native, so the
//! refusal happens once per function, not once per container. A function not created for
//! [`FORGET_AFTER_S`] is forgotten (its image may have changed), and the set is bounded.

use std::collections::BTreeMap;

use crate::time::Time;

/// The most functions remembered; past it the least recently used is forgotten.
pub const CAPACITY: usize = 4096;
/// A function not asked about (nor seen exporting) for this long is forgotten: one day.
pub const FORGET_AFTER_S: f64 = 86_400.0;

/// The functions whose containers asked to export converted memory.
#[derive(Clone, Debug, Default)]
pub struct NativeAdvice {
    /// Function → when it was last seen exporting or advised, and its tenant.
    seen: BTreeMap<String, (Time, Option<String>)>,
}

impl NativeAdvice {
    /// A container of `function` (of `tenant`, if any) had an export of converted memory
    /// refused. Past [`CAPACITY`] functions, one is forgotten: the least recently seen of the
    /// tenant that holds the most ([`crate::tenant_lru`]), so a tenant cycling names forgets its
    /// own.
    pub fn learn(&mut self, function: &str, tenant: Option<&str>, now: Time) {
        self.learn_within(function, tenant, now, CAPACITY);
    }

    fn learn_within(&mut self, function: &str, tenant: Option<&str>, now: Time, capacity: usize) {
        self.seen
            .insert(function.to_owned(), (now, tenant.map(str::to_owned)));
        while self.seen.len() > capacity {
            let victim = crate::tenant_lru::victim(
                self.seen
                    .iter()
                    .map(|(f, (t, tenant))| (f.as_str(), tenant.as_deref(), *t)),
            )
            .map(str::to_owned);
            match victim {
                Some(f) => self.seen.remove(&f),
                None => break,
            };
        }
    }

    /// Whether a new container of `function` should keep all its allocations native; asking
    /// renews the memory (a function created often is never forgotten).
    pub fn advises(&mut self, function: &str, now: Time) -> bool {
        match self.seen.get_mut(function) {
            Some((t, _)) if now.secs_since(*t) < FORGET_AFTER_S => {
                *t = now;
                true
            }
            Some(_) => {
                self.seen.remove(function);
                false
            }
            None => false,
        }
    }

    /// How many functions are remembered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// Native bytes by reason, and refused exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(s: f64) -> Time {
        Time::from_secs_f64(s)
    }

    #[test]
    fn a_learned_function_is_advised_until_forgotten() {
        let mut a = NativeAdvice::default();
        assert!(!a.advises("f", t(0.0)));
        a.learn("f", None, t(1.0));
        assert!(a.advises("f", t(2.0)));
        assert!(!a.advises("g", t(2.0)), "only the function that exported");
        // Asked again within the day: renewed from each question.
        assert!(a.advises("f", t(2.0 + FORGET_AFTER_S - 1.0)));
        assert!(a.advises("f", t(2.0 + 2.0 * FORGET_AFTER_S - 2.0)));
        assert!(!a.advises("f", t(10.0 * FORGET_AFTER_S)), "forgotten");
        assert!(a.is_empty());
    }

    #[test]
    fn a_tenant_cycling_function_names_forgets_only_its_own() {
        let mut a = NativeAdvice::default();
        for (i, f) in ["victim/f0", "victim/f1", "victim/f2"].iter().enumerate() {
            #[expect(clippy::cast_precision_loss, reason = "an index below 3")]
            a.learn_within(f, Some("victim"), t(i as f64), 8);
        }
        for i in 0..1000 {
            a.learn_within(
                &format!("hostile/n{i}"),
                Some("hostile"),
                t(10.0 + f64::from(i)),
                8,
            );
        }
        assert_eq!(a.len(), 8);
        let now = t(2000.0);
        for f in ["victim/f0", "victim/f1", "victim/f2"] {
            assert!(a.advises(f, now), "{f} was forgotten");
        }
        assert!(a.advises("hostile/n999", now) && !a.advises("hostile/n0", now));
    }

    proptest! {
        /// However many functions export, the set stays bounded and the newest is kept.
        #[test]
        fn bounded_and_keeps_the_newest(n in 1usize..(CAPACITY + 300)) {
            let mut a = NativeAdvice::default();
            for i in 0..n {
                #[expect(clippy::cast_precision_loss, reason = "an index below CAPACITY + 300")]
                a.learn(&format!("f{i}"), None, t(i as f64));
            }
            prop_assert!(a.len() <= CAPACITY);
            #[expect(clippy::cast_precision_loss, reason = "a count below CAPACITY + 300")]
            let now = t(n as f64);
            let newest = format!("f{}", n - 1);
            prop_assert!(a.advises(&newest, now));
            if n > CAPACITY {
                prop_assert!(!a.advises("f0", now), "the oldest went first");
            }
        }
    }
}

#[cfg(test)]
mod native_tests {
    use super::Native;

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
    }
}
