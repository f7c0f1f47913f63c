//! Who decides weights and tenants: the operator, in `mqfqd.toml`, never a pod.
//!
//! A pod's annotations (`io.mqfq.weight`, `io.mqfq.tenant`) reach the daemon through its shim,
//! but they are its author's words: honoured only when the operator says so
//! (`trust_annotations`). Otherwise the weight and tenant come from rules matched on the pod's
//! namespace and function, and by default each namespace is a tenant — so a pod can neither
//! give itself a larger share nor shrink another tenant's, and a function key it names is
//! scoped to its own tenant (it cannot join another namespace's flow).
//!
//! ```toml
//! [fairness]
//! trust_annotations = false      # io.mqfq.weight / io.mqfq.tenant count only when true
//! tenant_from = "namespace"      # namespace (the pod's, else containerd's) | none (one flat queue)
//! tenants = { team-a = 2.0 }     # tenant weights (default 1)
//! [[fairness.rule]]              # first match wins; globs with * and ?
//! namespace = "prod-*"
//! function = "*"
//! tenant = "prod"                # optional
//! weight = 4.0                   # optional
//! [limits]
//! waiters_per_shim = 256         # admissions one shim may have waiting
//! containers_per_shim = 256      # containers one shim may register (running + idle)
//! flow_idle_s = 600              # a flow idle this long is forgotten, with its metric series
//! max_burst_hold_s = 60          # a burst held longer no longer keeps waiting work out (0: off)
//! ```

use std::collections::BTreeMap;

use scheduler_core::ConfigError;
use serde::Deserialize;

/// One `[[fairness.rule]]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Glob on the pod's namespace (the containerd namespace outside CRI); absent: any.
    pub namespace: Option<String>,
    /// Glob on the function key; absent: any.
    pub function: Option<String>,
    /// The tenant to put matching containers in.
    pub tenant: Option<String>,
    /// Their flow weight.
    pub weight: Option<f64>,
}

/// `[fairness]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FairnessSection {
    /// Honour the pods' `io.mqfq.weight` and `io.mqfq.tenant`.
    pub trust_annotations: bool,
    /// `namespace` or `none`.
    pub tenant_from: String,
    /// Tenant weights.
    pub tenants: BTreeMap<String, f64>,
    /// Rules, first match wins.
    #[serde(rename = "rule")]
    pub rules: Vec<Rule>,
}

impl Default for FairnessSection {
    fn default() -> Self {
        FairnessSection {
            trust_annotations: false,
            tenant_from: "namespace".into(),
            tenants: BTreeMap::new(),
            rules: Vec::new(),
        }
    }
}

/// `[limits]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Admissions one shim may have waiting at once.
    pub waiters_per_shim: usize,
    /// Containers one shim may register (running and idle).
    pub containers_per_shim: usize,
    /// Seconds after which an idle flow is forgotten (0: never).
    pub flow_idle_s: f64,
    /// Seconds a burst lease may keep waiting work out before it is in overtime (0: for ever).
    pub max_burst_hold_s: f64,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            waiters_per_shim: 256,
            containers_per_shim: 256,
            flow_idle_s: 600.0,
            max_burst_hold_s: scheduler_core::node::admission::DEFAULT_MAX_BURST_HOLD_S,
        }
    }
}

/// What a shim says about a container, for [`FairnessSection::resolve`].
#[derive(Clone, Copy, Debug)]
pub struct Asked<'a> {
    /// containerd namespace.
    pub namespace: &'a str,
    /// The pod's namespace (CRI), or empty.
    pub pod_namespace: &'a str,
    /// Function key.
    pub function: &'a str,
    /// `io.mqfq.tenant`, or empty.
    pub tenant: &'a str,
    /// `io.mqfq.weight`, or 0.
    pub weight: f64,
}

/// What is in force for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decided {
    /// Its tenant (`None`: none, one flat queue).
    pub tenant: Option<String>,
    /// That tenant's weight.
    pub tenant_weight: f64,
    /// Its flow weight.
    pub weight: f64,
}

/// `*` any run of characters, `?` one character.
#[must_use]
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut i, mut j) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

impl FairnessSection {
    /// Checks the section; errors name the key.
    ///
    /// # Errors
    /// An unknown `tenant_from`, or a weight that is not finite and > 0.
    pub fn check(&self) -> Result<(), ConfigError> {
        if !matches!(self.tenant_from.as_str(), "namespace" | "none") {
            return Err(ConfigError::new(
                "fairness.tenant_from",
                &self.tenant_from,
                "must be namespace or none",
            ));
        }
        let ok = |w: f64| w.is_finite() && w > 0.0 && w <= 1e6;
        if let Some(w) = self.tenants.values().find(|w| !ok(**w)) {
            return Err(ConfigError::new(
                "fairness.tenants",
                w,
                "weights must be finite numbers in (0, 1e6]",
            ));
        }
        if let Some(w) = self.rules.iter().filter_map(|r| r.weight).find(|w| !ok(*w)) {
            return Err(ConfigError::new(
                "fairness.rule.weight",
                w,
                "must be a finite number in (0, 1e6]",
            ));
        }
        if self
            .rules
            .iter()
            .filter_map(|r| r.tenant.as_deref())
            .any(str::is_empty)
        {
            return Err(ConfigError::new(
                "fairness.rule.tenant",
                "\"\"",
                "must not be empty",
            ));
        }
        Ok(())
    }

    /// The tenant and weights in force for a container.
    #[must_use]
    pub fn resolve(&self, a: Asked<'_>) -> Decided {
        let ns = if a.pod_namespace.is_empty() {
            a.namespace
        } else {
            a.pod_namespace
        };
        let rule = self.rules.iter().find(|r| {
            r.namespace.as_deref().is_none_or(|p| glob(p, ns))
                && r.function.as_deref().is_none_or(|p| glob(p, a.function))
        });
        let trusted = |s: &str| (self.trust_annotations && !s.is_empty()).then(|| s.to_owned());
        let tenant = rule
            .and_then(|r| r.tenant.clone())
            .or_else(|| trusted(a.tenant))
            .or_else(|| (self.tenant_from == "namespace").then(|| ns.to_owned()));
        let weight = rule
            .and_then(|r| r.weight)
            .or_else(|| {
                (self.trust_annotations && a.weight.is_finite() && a.weight > 0.0)
                    .then_some(a.weight)
            })
            .unwrap_or(1.0);
        let tenant_weight = tenant
            .as_deref()
            .and_then(|t| self.tenants.get(t).copied())
            .unwrap_or(1.0);
        Decided {
            tenant,
            tenant_weight,
            weight,
        }
    }
}

impl LimitsSection {
    /// Checks the section; errors name the key.
    ///
    /// # Errors
    /// A zero cap, or a negative idle time.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.waiters_per_shim == 0 {
            return Err(ConfigError::new(
                "limits.waiters_per_shim",
                0,
                "must be at least 1",
            ));
        }
        if self.containers_per_shim == 0 {
            return Err(ConfigError::new(
                "limits.containers_per_shim",
                0,
                "must be at least 1",
            ));
        }
        if !(self.flow_idle_s.is_finite() && self.flow_idle_s >= 0.0) {
            return Err(ConfigError::new(
                "limits.flow_idle_s",
                self.flow_idle_s,
                "must be a finite number >= 0",
            ));
        }
        if !(self.max_burst_hold_s.is_finite() && self.max_burst_hold_s >= 0.0) {
            return Err(ConfigError::new(
                "limits.max_burst_hold_s",
                self.max_burst_hold_s,
                "must be a finite number >= 0 (0: no maximum)",
            ));
        }
        Ok(())
    }

    /// The maximum burst hold for the admission core (`None`: none).
    #[must_use]
    pub fn max_burst_hold(&self) -> Option<f64> {
        Some(self.max_burst_hold_s).filter(|&s| s > 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked<'a>(ns: &'a str, pod_ns: &'a str, function: &'a str) -> Asked<'a> {
        Asked {
            namespace: ns,
            pod_namespace: pod_ns,
            function,
            tenant: "evil",
            weight: 1000.0,
        }
    }

    #[test]
    fn globs() {
        for (p, t, m) in [
            ("*", "", true),
            ("prod-*", "prod-a", true),
            ("prod-*", "dev-a", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*/resnet", "knative/prod/resnet", true),
            ("k*n*e", "knative", true),
            ("x", "xx", false),
        ] {
            assert_eq!(glob(p, t), m, "{p} ~ {t}");
        }
    }

    #[test]
    fn pods_cannot_set_their_weight_or_tenant_unless_the_operator_allows() {
        let f = FairnessSection::default();
        let d = f.resolve(asked("k8s.io", "team-a", "resnet"));
        assert_eq!(
            d,
            Decided {
                tenant: Some("team-a".into()),
                tenant_weight: 1.0,
                weight: 1.0
            }
        );
        // Outside CRI the containerd namespace is the tenant.
        assert_eq!(
            f.resolve(asked("default", "", "f")).tenant.as_deref(),
            Some("default")
        );
        let trusting = FairnessSection {
            trust_annotations: true,
            ..FairnessSection::default()
        };
        let d = trusting.resolve(asked("k8s.io", "team-a", "resnet"));
        assert_eq!((d.tenant.as_deref(), d.weight), (Some("evil"), 1000.0));
        let flat = FairnessSection {
            tenant_from: "none".into(),
            ..FairnessSection::default()
        };
        assert_eq!(flat.resolve(asked("k8s.io", "a", "f")).tenant, None);
    }

    #[test]
    fn operator_rules_decide_first_match_wins() {
        let f = FairnessSection {
            tenants: [("prod".to_owned(), 3.0)].into(),
            rules: vec![
                Rule {
                    namespace: Some("prod-*".into()),
                    function: Some("*resnet*".into()),
                    tenant: Some("prod".into()),
                    weight: Some(4.0),
                },
                Rule {
                    namespace: Some("prod-*".into()),
                    tenant: Some("prod".into()),
                    ..Rule::default()
                },
            ],
            ..FairnessSection::default()
        };
        f.check().unwrap();
        assert_eq!(
            f.resolve(asked("k8s.io", "prod-eu", "knative/prod-eu/resnet")),
            Decided {
                tenant: Some("prod".into()),
                tenant_weight: 3.0,
                weight: 4.0
            }
        );
        let d = f.resolve(asked("k8s.io", "prod-us", "bert"));
        assert_eq!((d.tenant.as_deref(), d.weight), (Some("prod"), 1.0));
        assert_eq!(
            f.resolve(asked("k8s.io", "dev", "resnet"))
                .tenant
                .as_deref(),
            Some("dev")
        );
    }

    #[test]
    fn bad_sections_are_named() {
        let bad = |f: FairnessSection, key: &str| {
            let e = f.check().unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        };
        bad(
            FairnessSection {
                tenant_from: "pod".into(),
                ..FairnessSection::default()
            },
            "fairness.tenant_from",
        );
        bad(
            FairnessSection {
                tenants: [("a".to_owned(), 0.0)].into(),
                ..FairnessSection::default()
            },
            "fairness.tenants",
        );
        bad(
            FairnessSection {
                rules: vec![Rule {
                    weight: Some(f64::NAN),
                    ..Rule::default()
                }],
                ..FairnessSection::default()
            },
            "fairness.rule.weight",
        );
        let e = LimitsSection {
            waiters_per_shim: 0,
            ..LimitsSection::default()
        }
        .check()
        .unwrap_err()
        .to_string();
        assert!(e.contains("limits.waiters_per_shim"), "{e}");
    }
}
