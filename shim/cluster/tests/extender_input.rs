//! The extender's request parsing on hostile bodies: any bytes, and JSON shaped like
//! `ExtenderArgs` with wrong types, nulls, deep nesting and odd names in every field. It never
//! panics, and what it answers is about the nodes the request named: filter splits them into
//! passing and failed, prioritize scores each once, within 0–10. (`mqfq-cluster` is kept out
//! of the fuzz build, which would have to build kube-rs; this is its hostile-input test.)
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::collections::BTreeSet;
use std::sync::Arc;

use mqfq_cluster::crd::{GpuNodeState, GpuNodeStateSpec};
use mqfq_cluster::extender::{Cache, Extender};
use proptest::prelude::*;
use scheduler_core::placement::cluster::{GpuSummary, NodeSummary};
use serde_json::{Value, json};

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        "[a-z0-9./=-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{0,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A node name: those the cache knows, and others.
fn node_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("gpu-a".to_owned()),
        Just("gpu-b".to_owned()),
        "[a-z0-9.-]{0,20}",
    ]
}

/// Bodies shaped like `ExtenderArgs`, each part either right or any JSON at all.
fn args_like() -> impl Strategy<Value = Value> {
    let pod = prop_oneof![
        any_json(),
        (
            prop::option::of("[a-z/.-]{0,20}"),
            prop::option::of("[a-z-]{0,10}")
        )
            .prop_map(|(f, ns)| json!({"metadata": {
                "namespace": ns,
                "annotations": {"io.mqfq.function": f}}})),
    ];
    let names = prop_oneof![
        any_json(),
        prop::collection::vec(node_name(), 0..6).prop_map(|n| json!(n)),
    ];
    let item = prop_oneof![
        any_json(),
        node_name().prop_map(|n| json!({"metadata": {"name": n}, "status": {}})),
    ];
    let nodes = prop_oneof![
        any_json(),
        prop::collection::vec(item, 0..6).prop_map(|i| json!({"items": i})),
    ];
    (
        prop::option::of(pod),
        prop::option::of(names),
        prop::option::of(nodes),
    )
        .prop_map(|(pod, names, nodes)| {
            let mut o = serde_json::Map::new();
            for (k, v) in [("pod", pod), ("nodenames", names), ("nodes", nodes)] {
                if let Some(v) = v {
                    o.insert(k.into(), v);
                }
            }
            Value::Object(o)
        })
}

fn extender() -> Extender {
    let cache = Arc::new(Cache::default());
    let gpu = |health: &str| GpuSummary {
        index: 0,
        name: "NVIDIA A30".into(),
        tflops: 10.3,
        mem_gbps: 933.0,
        memory_total: 100,
        memory_free: 80,
        utilization: 0.2,
        health: health.into(),
        limit: 2,
        running: 0,
        queued: 0,
    };
    cache.replace(
        [("gpu-a", "healthy"), ("gpu-b", "failed")]
            .into_iter()
            .map(|(n, h)| {
                GpuNodeState::new(
                    n,
                    GpuNodeStateSpec {
                        node: n.into(),
                        published_unix_ms: 1_000,
                        why: "first".into(),
                        summary: NodeSummary::new(vec![gpu(h)], &[]),
                    },
                )
            })
            .collect(),
    );
    Extender::new(cache, 180.0)
}

/// The names a well-formed body asked about, in order.
fn asked(body: &Value) -> Vec<String> {
    let names = body
        .get("nodenames")
        .and_then(Value::as_array)
        .or_else(|| body.pointer("/nodes/items").and_then(Value::as_array));
    names
        .into_iter()
        .flatten()
        .map(|n| {
            n.as_str()
                .or_else(|| n.pointer("/metadata/name").and_then(Value::as_str))
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

proptest! {
    #[test]
    fn any_bytes_get_an_answer_or_a_bad_request(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let x = extender();
        let _ = x.filter(&bytes, 2_000);
        let _ = x.prioritize(&bytes, 2_000);
    }

    #[test]
    fn an_answer_is_about_the_nodes_asked(body in args_like()) {
        let x = extender();
        let text = body.to_string();
        let names = asked(&body);
        let unique: BTreeSet<&String> = names.iter().collect();
        if let Ok(f) = x.filter(text.as_bytes(), 2_000) {
            let passed: Vec<String> = match (&f.node_names, &f.nodes) {
                (Some(n), None) => n.clone(),
                (None, Some(list)) => list
                    .items
                    .iter()
                    .map(|raw| {
                        let v: Value = serde_json::from_str(raw.get()).unwrap();
                        v.pointer("/metadata/name").and_then(Value::as_str).unwrap().to_owned()
                    })
                    .collect(),
                other => panic!("filter answered both or neither: {other:?}"),
            };
            for n in passed.iter().chain(f.failed_nodes.keys()) {
                prop_assert!(unique.contains(n), "{n} was not asked about");
            }
            for n in &passed {
                prop_assert!(!f.failed_nodes.contains_key(n), "{n} both passed and failed");
            }
            prop_assert_eq!(f.failed_nodes.contains_key("gpu-b"), unique.contains(&"gpu-b".to_owned()));
            prop_assert!(f.error.is_empty());
        }
        if let Ok(scores) = x.prioritize(text.as_bytes(), 2_000) {
            prop_assert_eq!(scores.len(), names.len());
            for s in &scores {
                prop_assert!((0..=10).contains(&s.score), "{s:?}");
                prop_assert!(unique.contains(&s.host));
            }
        }
    }
}
