//! The extender's HTTP API on recorded `ExtenderArgs` JSON, its cache filled from a fake API
//! server's `GpuNodeState` objects: filter (by names and by objects), prioritize, and bad input
//! answered with an HTTP 400 that says what was wrong.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

#[expect(dead_code, reason = "the publisher tests use the rest")]
mod common;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, PostParams};
use mqfq_cluster::crd::{GpuNodeState, GpuNodeStateSpec};
use mqfq_cluster::extender::{
    BadRequest, Cache, Extender, HostPriority, MAX_BODY, MAX_IN_FLIGHT, MAX_NODES, refresh, router,
    untyped,
};
use mqfq_cluster::http::{Limits, serve};
use scheduler_core::placement::cluster::{GpuSummary, NodeSummary};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn gpu(name: &str, tflops: f64, mem_gbps: f64, free: u64, health: &str) -> GpuSummary {
    GpuSummary {
        index: 0,
        name: name.into(),
        tflops,
        mem_gbps,
        memory_total: 100,
        memory_free: free,
        utilization: 0.1,
        health: health.into(),
        limit: 2,
        running: 0,
        queued: 0,
    }
}

/// gpu-a: compute-rich, memory nearly full; gpu-b: bandwidth-rich; gpu-c: its GPU failed;
/// cpu-1 publishes nothing.
async fn cluster(api: &Api<GpuNodeState>) {
    let nodes = [
        (
            "gpu-a",
            gpu("NVIDIA L40S", 91.6, 864.0, 5, "healthy"),
            vec![("team/bert".to_owned(), "compute-long".to_owned(), 0)],
        ),
        (
            "gpu-b",
            gpu("NVIDIA H200", 67.0, 4800.0, 90, "healthy"),
            vec![("team/etl".to_owned(), "memory-short".to_owned(), 0)],
        ),
        (
            "gpu-c",
            gpu("NVIDIA A30", 10.3, 933.0, 90, "failed"),
            vec![],
        ),
    ];
    for (node, g, functions) in nodes {
        let spec = GpuNodeStateSpec {
            node: node.into(),
            published_unix_ms: mqfq_cluster::unix_ms(),
            why: "first".into(),
            summary: NodeSummary::new(vec![g], &functions),
        };
        api.create(&PostParams::default(), &GpuNodeState::new(node, spec))
            .await
            .unwrap();
    }
}

/// One HTTP/1.1 request; the status code and the body.
async fn http(addr: std::net::SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let code = text[9..12].parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1;
    (
        code,
        serde_json::from_str(body).unwrap_or(Value::String(body.into())),
    )
}

#[tokio::test]
#[expect(
    clippy::too_many_lines,
    reason = "one extender on one cache: filter, prioritize, then bad input"
)]
async fn the_extender_filters_and_ranks_nodes_from_published_state() {
    let (url, store) = common::serve().await;
    let api: Api<GpuNodeState> = Api::namespaced(common::client(&url), "mqfq-system");
    cluster(&api).await;
    let cache = Arc::new(Cache::default());
    // An object that does not parse and one filed under another node's name are skipped;
    // the others still count.
    let mut broken = GpuNodeState::new(
        "gpu-x",
        GpuNodeStateSpec {
            node: "gpu-x".into(),
            published_unix_ms: 0,
            why: "first".into(),
            summary: NodeSummary::default(),
        },
    );
    broken.metadata.namespace = None;
    store.lock().unwrap().objects.insert(
        "gpu-x".into(),
        serde_json::json!({"apiVersion": "mqfq.io/v1alpha1", "kind": "GpuNodeState",
            "metadata": {"name": "gpu-x", "resourceVersion": "900"},
            "spec": {"node": "gpu-x", "summary": {"gpus": "not a list"}}}),
    );
    let mut spoof = broken.clone();
    spoof.metadata.name = Some("spoof".into());
    spoof.spec.node = "gpu-b".into();
    api.create(&PostParams::default(), &spoof).await.unwrap();
    let client = common::client(&url);
    tokio::spawn(refresh(
        untyped(client, "mqfq-system"),
        cache.clone(),
        Duration::from_millis(50),
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cache.len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the cache never filled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Two more lists: still the three good ones only.
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(
        cache.len(),
        3,
        "the malformed and the spoofed object are skipped"
    );
    let x = Arc::new(Extender::new(cache, 180.0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, router(x), Limits::default(), None));

    // nodeCacheCapable: names in, names out; the failed node fails with why, the node that
    // publishes nothing passes.
    let names = include_bytes!("data/prioritize-nodenames.json");
    let (code, r) = http(addr, "POST", "/filter", names).await;
    assert_eq!(code, 200, "{r}");
    assert_eq!(
        r["nodenames"],
        serde_json::json!(["gpu-a", "gpu-b", "cpu-1"])
    );
    assert!(
        r["failedNodes"]["gpu-c"]
            .as_str()
            .unwrap()
            .contains("no usable GPU"),
        "{r}"
    );
    assert!(r.get("error").is_none(), "{r}");

    // A memory-bound function (learned on gpu-b, named by the pod's annotation under its
    // namespace): the bandwidth-rich node first.
    let (code, r) = http(addr, "POST", "/prioritize", names).await;
    assert_eq!(code, 200, "{r}");
    let scores: Vec<HostPriority> = serde_json::from_value(r).unwrap();
    let score = |n: &str| scores.iter().find(|h| h.host == n).unwrap().score;
    assert_eq!(score("gpu-b"), 10);
    assert!(score("gpu-a") < score("gpu-b"));
    assert_eq!((score("gpu-c"), score("cpu-1")), (0, 0));

    // Whole Node objects in (nodeCacheCapable: false): the passing ones back as they came.
    let objects = include_bytes!("data/filter-nodes.json");
    let (code, r) = http(addr, "POST", "/filter", objects).await;
    assert_eq!(code, 200, "{r}");
    let items = r["nodes"]["items"].as_array().unwrap();
    let kept: Vec<&str> = items
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(kept, ["gpu-a", "gpu-b", "cpu-1"]);
    assert_eq!(
        items[1]["metadata"]["labels"]["nvidia.com/gpu.product"],
        "NVIDIA-H200"
    );
    assert!(r.get("nodenames").is_none(), "{r}");
    // A compute-bound function: the compute-rich node first.
    let (_, r) = http(addr, "POST", "/prioritize", objects).await;
    let scores: Vec<HostPriority> = serde_json::from_value(r).unwrap();
    assert_eq!(scores[0].host, "gpu-a");
    assert_eq!(scores[0].score, 10);
    assert!(scores[1].score < 10);

    // Bad input: a 400 whose body says what was wrong.
    for (body, says) in [
        (&b"not json"[..], "not ExtenderArgs JSON"),
        (br#"{"nodenames": ["gpu-a"]}"#, "pod is missing"),
        (
            br#"{"pod": {"metadata": {}}}"#,
            "neither nodes nor nodenames",
        ),
        (
            br#"{"pod": {}, "nodes": {"items": [{"metadata": {}}]}}"#,
            "items[0] has no metadata.name",
        ),
        (
            br#"{"pod": {}, "nodenames": "gpu-a"}"#,
            "not ExtenderArgs JSON",
        ),
    ] {
        for verb in ["/filter", "/prioritize"] {
            let (code, r) = http(addr, "POST", verb, body).await;
            assert_eq!(code, 400, "{verb} {r}");
            assert!(r["error"].as_str().unwrap().contains(says), "{verb} {r}");
        }
    }
    let (code, _) = http(addr, "GET", "/healthz", b"").await;
    assert_eq!(code, 200);
}

#[test]
fn a_stale_summary_is_ignored() {
    let cache = Arc::new(Cache::default());
    let summary = NodeSummary::new(vec![gpu("NVIDIA A30", 10.3, 933.0, 90, "failed")], &[]);
    cache.replace(vec![GpuNodeState::new(
        "gpu-c",
        GpuNodeStateSpec {
            node: "gpu-c".into(),
            published_unix_ms: 1_000,
            why: "first".into(),
            summary,
        },
    )]);
    let x = Extender::new(cache, 180.0);
    let body = br#"{"pod": {}, "nodenames": ["gpu-c"]}"#;
    // Fresh: its failed GPU fails it. Three minutes later: no longer trusted, so it passes.
    let fresh = x.filter(body, 2_000).unwrap();
    assert!(fresh.failed_nodes.contains_key("gpu-c"));
    let stale = x.filter(body, 1_000 + 181_000).unwrap();
    assert_eq!(stale.node_names, Some(vec!["gpu-c".to_owned()]));
    // Stamped in the future: within 30 s, a clock a little ahead; beyond, not fresh for ever.
    let ahead = x.filter(body, 1_000 - 999).unwrap();
    assert!(ahead.failed_nodes.contains_key("gpu-c"), "1 s ahead counts");
    let far = Extender::new(Arc::new(Cache::default()), 180.0);
    far.cache.replace(vec![GpuNodeState::new(
        "gpu-c",
        GpuNodeStateSpec {
            node: "gpu-c".into(),
            published_unix_ms: 10_000_000,
            why: "first".into(),
            summary: NodeSummary::new(vec![gpu("NVIDIA A30", 10.3, 933.0, 90, "failed")], &[]),
        },
    )]);
    let r = far.filter(body, 2_000).unwrap();
    assert_eq!(
        r.node_names,
        Some(vec!["gpu-c".to_owned()]),
        "ignored, so it passes"
    );
}

/// Serves `x` under `limits` on a free port.
async fn serving(x: Extender, limits: Limits) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, router(Arc::new(x)), limits, None));
    addr
}

/// Sends `head` (and nothing more) and reads until the server closes; what it answered. A
/// server that never closes fails the test after 60 s rather than hanging it.
async fn send_and_wait(addr: std::net::SocketAddr, head: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut out))
        .await
        .expect("the server kept a stalled request open")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn a_list_longer_than_the_bound_is_counted_not_kept() {
    let x = Extender::new(Arc::new(Cache::default()), 180.0);
    // Names past the bound: refused with how many there were.
    let names: Vec<String> = (0..=MAX_NODES).map(|i| format!("n{i}")).collect();
    let body = serde_json::json!({"pod": {}, "nodenames": names}).to_string();
    assert_eq!(
        x.prioritize(body.as_bytes(), 0).unwrap_err(),
        BadRequest::TooMany(MAX_NODES + 1)
    );
    // About a million one-character items fill the largest body: each would have been held
    // (as a JSON value, 16 times its text) before any check; now past the bound they are read
    // over, and the count is the answer.
    let n = (MAX_BODY - 64) / 2;
    let mut body = String::from(r#"{"pod": {}, "nodes": {"items": [0"#);
    body.push_str(&",0".repeat(n - 1));
    body.push_str("]}}");
    assert!(body.len() <= MAX_BODY);
    assert_eq!(
        x.filter(body.as_bytes(), 0).unwrap_err(),
        BadRequest::TooMany(n)
    );
    // Within the bound, an item that is not a named object is still named in the error.
    let body = br#"{"pod": {}, "nodes": {"items": [{"metadata": {"name": "a"}}, 0]}}"#;
    assert_eq!(x.filter(body, 0).unwrap_err(), BadRequest::NodeName(1));
    // Nor is an array that a derived struct would read as one (the property test found
    // `[[""]]` passing the filter as a node named ""), nor a metadata that is not an object.
    for item in [
        r#"[[""]]"#,
        r#"{"metadata": ["b"]}"#,
        r#"{"metadata": {"name": 7}}"#,
    ] {
        let body = format!(r#"{{"pod": {{}}, "nodes": {{"items": [{item}]}}}}"#);
        assert_eq!(
            x.filter(body.as_bytes(), 0).unwrap_err(),
            BadRequest::NodeName(0),
            "{item}"
        );
    }
}

#[tokio::test]
async fn a_request_cannot_hold_the_extender_by_sending_slowly_or_too_much() {
    let mut x = Extender::new(Arc::new(Cache::default()), 180.0);
    x.body_timeout = Duration::from_millis(200);
    let held = x.in_flight.clone();
    let addr = serving(
        x,
        Limits {
            header: Duration::from_millis(200),
            ..Limits::default()
        },
    )
    .await;
    // A body announced and never sent: 408, and the request slot is free again.
    let r = send_and_wait(
        addr,
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"pod\"",
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 408"), "{r}");
    assert!(r.contains("not sent within"), "{r}");
    assert_eq!(held.available_permits(), MAX_IN_FLIGHT);
    // Headers never finished: the connection is closed, unanswered.
    let r = send_and_wait(addr, "POST /filter HTTP/1.1\r\nHost: x\r\n").await;
    assert!(r.is_empty(), "{r}");
    // A body over the bound is refused from its length, unread.
    let r = send_and_wait(
        addr,
        &format!(
            "POST /prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            MAX_BODY + 1
        ),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 413"), "{r}");
    // Every request slot taken: 503, which an ignorable extender's caller reads as no opinion.
    let all = held
        .clone()
        .try_acquire_many_owned(u32::try_from(MAX_IN_FLIGHT).unwrap())
        .unwrap();
    let (code, r) = http(addr, "POST", "/filter", br#"{"pod": {}, "nodenames": []}"#).await;
    assert_eq!(code, 503, "{r}");
    drop(all);
    let (code, r) = http(addr, "POST", "/filter", br#"{"pod": {}, "nodenames": []}"#).await;
    assert_eq!(code, 200, "{r}");
}
