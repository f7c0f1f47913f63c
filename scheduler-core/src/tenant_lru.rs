//! Which entry a per-function registry bounded in size forgets, so that no tenant can make it
//! forget another's. Function keys come from pods (hostile input): a registry that forgot the
//! entry seen least recently across everyone let a tenant cycling made-up function names evict
//! every other tenant's advice and measurements. Here the entry forgotten is the least recently
//! seen of the tenant that holds the most entries — a tenant's entries go only once it holds at
//! least as many as anyone, so one that cycles names forgets its own.
//!
//! The tenant of a key is what precedes its first `/` (flow keys are `tenant/function`); a node
//! without tenants (`tenant_from = "none"`) groups its function keys by that prefix, if any.

use std::collections::HashMap;

/// The tenant part of a flow key (`""` for a key without one).
#[must_use]
pub fn tenant_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(t, _)| t)
}

/// The key to forget among `entries` (key, when last seen or used, in any order): the least
/// recently seen of the tenant holding the most (ties between tenants: the one whose oldest
/// entry is older; between entries: the smaller key). `None` for no entries.
pub fn victim<'a, S: Ord + Copy>(entries: impl Iterator<Item = (&'a str, S)>) -> Option<&'a str> {
    // Per tenant: how many entries, and its least recently seen one.
    let mut tenants: HashMap<&str, (usize, (S, &str))> = HashMap::new();
    for (k, seen) in entries {
        let e = tenants.entry(tenant_of(k)).or_insert((0, (seen, k)));
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
        let e = [("a/x", t(1.0)), ("b/y", t(2.0)), ("b/z", t(3.0))];
        assert_eq!(victim(e.iter().copied()), Some("b/y"));
        // Equal holdings: the oldest entry overall.
        let e = [("a/x", t(5.0)), ("b/y", t(2.0))];
        assert_eq!(victim(e.iter().copied()), Some("b/y"));
        assert_eq!(victim(std::iter::empty::<(&str, Time)>()), None);
        assert_eq!(tenant_of("f"), "");
        assert_eq!(tenant_of("t/docker.io/f"), "t");
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
        f.observe("victim/model", &s, t(0.0)).unwrap();
        for i in 0..500 {
            f.observe(&format!("hostile/n{i}"), &s, t(1.0 + f64::from(i)))
                .unwrap();
        }
        assert_eq!(f.len(), 8);
        assert!(f.get("victim/model").is_some());
        assert!(f.get("hostile/n499").is_some() && f.get("hostile/n0").is_none());
    }
}
