//! Which entry a per-function registry bounded in size forgets, so that no tenant can make it
//! forget another's. Function keys come from pods (hostile input): a registry that forgot the
//! entry seen least recently across everyone let a tenant cycling made-up function names evict
//! every other tenant's advice and measurements. Here the entry forgotten is the least recently
//! seen of the tenant that holds the most entries — a tenant's entries go only once it holds at
//! least as many as anyone, so one that cycles names forgets its own.
//!
//! Each entry carries the tenant its flow was admitted in, as the node's policy decided it (not
//! read from the key: function keys may hold `/`); every entry without one is one group, so a
//! node without tenants forgets the least recently seen, as before.

use std::collections::HashMap;

/// The key to forget among `entries` (key, its tenant, when last seen or used, in any order):
/// the least recently seen of the tenant holding the most (ties between tenants: the one whose
/// oldest entry is older; between entries: the smaller key). `None` for no entries.
pub fn victim<'a, S: Ord + Copy>(
    entries: impl Iterator<Item = (&'a str, Option<&'a str>, S)>,
) -> Option<&'a str> {
    // Per tenant: how many entries, and its least recently seen one.
    let mut tenants: HashMap<Option<&str>, (usize, (S, &str))> = HashMap::new();
    for (k, tenant, seen) in entries {
        let e = tenants.entry(tenant).or_insert((0, (seen, k)));
        e.0 += 1;
        e.1 = e.1.min((seen, k));
    }
    tenants
        .into_values()
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|(_, (_, k))| k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Time;

    fn t(s: f64) -> Time {
        Time::from_secs_f64(s)
    }

    #[test]
    fn the_largest_tenant_forgets_its_oldest() {
        let (a, b) = (Some("a"), Some("b"));
        let e = [("a/x", a, t(1.0)), ("b/y", b, t(2.0)), ("b/z", b, t(3.0))];
        assert_eq!(victim(e.iter().copied()), Some("b/y"));
        // Equal holdings: the oldest entry overall.
        let e = [("a/x", a, t(5.0)), ("b/y", b, t(2.0))];
        assert_eq!(victim(e.iter().copied()), Some("b/y"));
        assert_eq!(
            victim(std::iter::empty::<(&str, Option<&str>, Time)>()),
            None
        );
        // The tenant is the entry's, never read from the key: entries without one are one group
        // however their keys look (`r1/f`, `r2/f`: no tenants of one entry each).
        let e = [
            ("victim/a", a, t(1.0)),
            ("victim/b", a, t(2.0)),
            ("r1/f", None, t(3.0)),
            ("r2/f", None, t(4.0)),
            ("r3/f", None, t(5.0)),
        ];
        assert_eq!(victim(e.iter().copied()), Some("r1/f"));
    }

    /// The placement registry: a tenant that cycles function names keeps another tenant's
    /// measurements (they went first before, as the least recently seen).
    #[test]
    fn a_tenant_cycling_names_keeps_another_tenants_features() {
        use crate::placement::features::{FeatureConfig, Features, Sample};
        let mut f = Features::new(FeatureConfig {
            max_functions: 8,
            ..FeatureConfig::default()
        });
        let s = Sample {
            burst_ms: 10.0,
            ..Sample::default()
        };
        f.observe_in("victim/model", Some("victim"), &s, t(0.0))
            .unwrap();
        for i in 0..500 {
            f.observe_in(
                &format!("hostile/n{i}"),
                Some("hostile"),
                &s,
                t(1.0 + f64::from(i)),
            )
            .unwrap();
        }
        assert_eq!(f.len(), 8);
        assert!(f.get("victim/model").is_some());
        assert!(f.get("hostile/n499").is_some() && f.get("hostile/n0").is_none());
    }
}
