//! Which functions keep their GPU allocations native, learned from what their containers did.
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
    /// Function → when it was last seen exporting or advised.
    seen: BTreeMap<String, Time>,
}

impl NativeAdvice {
    /// A container of `function` had an export of converted memory refused.
    pub fn learn(&mut self, function: &str, now: Time) {
        self.seen.insert(function.to_owned(), now);
        while self.seen.len() > CAPACITY {
            let oldest = self
                .seen
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(f, _)| f.clone());
            match oldest {
                Some(f) => self.seen.remove(&f),
                None => break,
            };
        }
    }

    /// Whether a new container of `function` should keep all its allocations native; asking
    /// renews the memory (a function created often is never forgotten).
    pub fn advises(&mut self, function: &str, now: Time) -> bool {
        match self.seen.get_mut(function) {
            Some(t) if now.secs_since(*t) < FORGET_AFTER_S => {
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
        a.learn("f", t(1.0));
        assert!(a.advises("f", t(2.0)));
        assert!(!a.advises("g", t(2.0)), "only the function that exported");
        // Asked again within the day: renewed from each question.
        assert!(a.advises("f", t(2.0 + FORGET_AFTER_S - 1.0)));
        assert!(a.advises("f", t(2.0 + 2.0 * FORGET_AFTER_S - 2.0)));
        assert!(!a.advises("f", t(10.0 * FORGET_AFTER_S)), "forgotten");
        assert!(a.is_empty());
    }

    proptest! {
        /// However many functions export, the set stays bounded and the newest is kept.
        #[test]
        fn bounded_and_keeps_the_newest(n in 1usize..(CAPACITY + 300)) {
            let mut a = NativeAdvice::default();
            for i in 0..n {
                #[expect(clippy::cast_precision_loss)]
                a.learn(&format!("f{i}"), t(i as f64));
            }
            prop_assert!(a.len() <= CAPACITY);
            #[expect(clippy::cast_precision_loss)]
            let now = t(n as f64);
            let newest = format!("f{}", n - 1);
            prop_assert!(a.advises(&newest, now));
            if n > CAPACITY {
                prop_assert!(!a.advises("f0", now), "the oldest went first");
            }
        }
    }
}
