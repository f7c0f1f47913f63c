use super::*;
use crate::placement::features::Stability;

fn gpu(index: u32, name: &str, tflops: f64, mem_gbps: f64, utilization: f64) -> GpuSummary {
    GpuSummary {
        index,
        name: name.into(),
        tflops,
        mem_gbps,
        memory_total: 100,
        memory_free: 80,
        utilization,
        health: "healthy".into(),
        limit: 2,
        running: 0,
        queued: 0,
    }
}

fn at(s: f64) -> Time {
    Time::from_secs_f64(s)
}

#[test]
fn a_summary_sums_free_compute_and_bandwidth_over_usable_gpus_and_counts_queues_by_class() {
    let mut failed = gpu(2, "H100", 67.0, 3350.0, 0.0);
    failed.health = "failed".into();
    let s = NodeSummary::new(
        vec![
            gpu(0, "A30", 10.0, 1000.0, 0.5),
            gpu(1, "A30", 10.0, 1000.0, 0.0),
            failed,
        ],
        &[
            ("bert".into(), "compute-long".into(), 3),
            ("etl".into(), "memory-short".into(), 0),
            ("new".into(), "probing".into(), 2),
        ],
    );
    assert!((s.free_tflops - 15.0).abs() < 1e-9, "{s:?}");
    assert!((s.free_mem_gbps - 1600.0).abs() < 1e-9, "{s:?}");
    assert_eq!(s.queue_by_class["compute-long"], 3);
    assert_eq!(s.queue_by_class["probing"], 2);
    assert!(!s.queue_by_class.contains_key("memory-short"));
    assert_eq!(s.functions.len(), 2, "probing functions are not listed");
    // Bounded however many functions a node has seen.
    let many: Vec<(String, String, u32)> = (0..1000)
        .map(|i| (format!("f{i}"), "compute-short".to_owned(), 1))
        .collect();
    let s = NodeSummary::new(vec![gpu(0, "A30", 10.0, 1000.0, 0.0)], &many);
    assert_eq!(s.functions.len(), MAX_FUNCTIONS);
    assert_eq!(s.queue_by_class["compute-short"], 1000);
}

#[test]
fn the_gate_writes_first_on_crossings_and_heartbeats_never_faster_than_its_interval() {
    let mut g = PublishGate::new(PublishConfig::default()).unwrap();
    let calm = NodeSummary::new(vec![gpu(0, "A30", 10.0, 1000.0, 0.1)], &[]);
    assert_eq!(g.due(&calm, at(0.0)), Some(Why::First));
    // Not written (the API server refused): still due.
    assert_eq!(g.due(&calm, at(1.0)), Some(Why::First));
    g.written(&calm, at(1.0));
    // Small moves within a bucket: nothing until the heartbeat.
    let jitter = NodeSummary::new(vec![gpu(0, "A30", 10.0, 1000.0, 0.2)], &[]);
    assert_eq!(g.due(&jitter, at(30.0)), None);
    assert_eq!(g.due(&jitter, at(61.0)), Some(Why::Heartbeat));
    g.written(&jitter, at(61.0));
    // A crossing, but within the minimum interval: held back, then written.
    let busy = NodeSummary::new(vec![gpu(0, "A30", 10.0, 1000.0, 0.9)], &[]);
    assert_eq!(g.due(&busy, at(66.0)), None);
    assert_eq!(g.due(&busy, at(72.0)), Some(Why::Crossing));
    g.written(&busy, at(72.0));
    // Health, a queue doubling, a newly classified function: each a crossing.
    let mut sick = busy.clone();
    sick.gpus[0].health = "overloaded".into();
    assert_eq!(g.due(&sick, at(82.0)), Some(Why::Crossing));
    let queued = NodeSummary::new(
        vec![gpu(0, "A30", 10.0, 1000.0, 0.9)],
        &[("f".into(), "probing".into(), 4)],
    );
    assert_eq!(g.due(&queued, at(82.0)), Some(Why::Crossing));
    g.written(&queued, at(82.0));
    let one_more = NodeSummary::new(
        vec![gpu(0, "A30", 10.0, 1000.0, 0.9)],
        &[("f".into(), "probing".into(), 5)],
    );
    assert_eq!(g.due(&one_more, at(95.0)), None, "4 and 5 share a bucket");
}

#[test]
fn churn_is_bounded_by_the_minimum_interval() {
    let cfg = PublishConfig::default();
    let mut g = PublishGate::new(cfg).unwrap();
    let mut writes = 0;
    // Ten minutes of a node flipping between idle and saturated every 100 ms.
    for i in 0..6000 {
        let u = if i % 2 == 0 { 0.0 } else { 1.0 };
        let s = NodeSummary::new(vec![gpu(0, "A30", 10.0, 1000.0, u)], &[]);
        let now = at(f64::from(i) * 0.1);
        if g.due(&s, now).is_some() {
            g.written(&s, now);
            writes += 1;
        }
    }
    assert!(writes <= 61, "{writes} writes in 10 minutes");
    assert!(writes >= 50, "crossings are still written: {writes}");
}

#[test]
fn bad_publish_knobs_are_named() {
    let e = PublishGate::new(PublishConfig {
        heartbeat_s: 1.0,
        min_interval_s: 5.0,
        ..PublishConfig::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("publish.heartbeat_s"), "{e}");
    let e = PublishGate::new(PublishConfig {
        utilization_step: 0.0,
        ..PublishConfig::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("publish.utilization_step"), "{e}");
}

#[test]
fn nodes_rank_by_what_the_functions_class_needs() {
    // Node a: a fast compute GPU, little bandwidth free. Node b: the reverse.
    let mut a_gpu = gpu(0, "L40S", 90.0, 800.0, 0.1);
    a_gpu.memory_free = 10;
    let a = NodeSummary::new(
        vec![a_gpu],
        &[("team/bert".into(), "compute-long".into(), 0)],
    );
    let b = NodeSummary::new(
        vec![gpu(0, "H200", 60.0, 4800.0, 0.5)],
        &[("team/etl".into(), "memory-short".into(), 0)],
    );
    let nodes = [
        NodeState {
            name: "a",
            summary: Some((&a, 1.0)),
        },
        NodeState {
            name: "b",
            summary: Some((&b, 1.0)),
        },
    ];
    let score =
        |f: Option<&str>| -> Vec<i64> { rank(&nodes, f, 180.0).iter().map(|r| r.score).collect() };
    // Classes learned anywhere count everywhere.
    let bert = score(Some("team/bert"));
    assert!(bert[0] > bert[1], "{bert:?}");
    let etl = score(Some("team/etl"));
    assert!(etl[1] > etl[0], "{etl:?}");
    assert_eq!(etl[1], MAX_SCORE);
    // Unknown: free slots, both equal here.
    assert_eq!(score(Some("other")), score(None));
    assert_eq!(score(None)[0], score(None)[1]);
}

#[test]
fn a_queue_lowers_a_nodes_score_and_failed_or_unpublished_nodes_are_handled() {
    let idle = NodeSummary::new(vec![gpu(0, "A30", 10.0, 1000.0, 0.0)], &[]);
    let mut q = gpu(0, "A30", 10.0, 1000.0, 0.0);
    q.running = 2;
    q.queued = 6;
    let queued = NodeSummary::new(vec![q], &[]);
    let mut f = gpu(0, "A30", 10.0, 1000.0, 0.0);
    f.health = "failed".into();
    let failed = NodeSummary::new(vec![f], &[]);
    let nodes = [
        NodeState {
            name: "idle",
            summary: Some((&idle, 0.0)),
        },
        NodeState {
            name: "queued",
            summary: Some((&queued, 0.0)),
        },
        NodeState {
            name: "failed",
            summary: Some((&failed, 0.0)),
        },
        NodeState {
            name: "stale",
            summary: Some((&idle, 500.0)),
        },
        NodeState {
            name: "plain",
            summary: None,
        },
    ];
    let r = rank(&nodes, None, 180.0);
    assert_eq!(r[0].score, MAX_SCORE);
    assert!(r[1].score < r[0].score, "{r:?}");
    assert!(r[2].failed.as_deref().unwrap().contains("no usable GPU"));
    assert_eq!(
        (r[3].failed.as_deref(), r[3].score),
        (None, 0),
        "stale passes"
    );
    assert_eq!(
        (r[4].failed.as_deref(), r[4].score),
        (None, 0),
        "plain passes"
    );
}

#[test]
fn class_labels_round_trip() {
    for bound in [Bound::Compute, Bound::Memory] {
        for length in [Length::Short, Length::Long] {
            let c = Class::Known {
                bound,
                length,
                stability: Stability::Steady,
            };
            let label = class_label(c).unwrap();
            assert_eq!(parse_label(label), Some((bound, length)));
        }
    }
    assert_eq!(class_label(Class::Probing { runs_left: 1 }), None);
    assert_eq!(parse_label("probing"), None);
}

#[test]
fn a_hostile_summary_is_held_to_plausible_figures_once_sanitized() {
    let mut liar = gpu(0, "H100", f64::INFINITY, f64::NAN, f64::NAN);
    liar.memory_free = u64::MAX;
    let mut s = NodeSummary::new(vec![liar], &[]);
    // What a publisher could write instead of what `new` computes.
    s.free_tflops = 1e308;
    s.free_mem_gbps = f64::NAN;
    s.gpus
        .extend((1..500).map(|i| gpu(i, "x", -5.0, 1e300, 2.0)));
    s.functions = (0..5000)
        .map(|i| (format!("f{i}"), "compute-long".to_owned()))
        .collect();
    let s = s.sanitized();
    assert_eq!(s.gpus.len(), 64);
    assert_eq!(s.functions.len(), MAX_FUNCTIONS);
    assert!(s.free_tflops.is_finite() && s.free_tflops <= 64.0 * 10_000.0);
    assert!(s.free_mem_gbps.is_finite());
    assert_eq!(s.gpus[0].memory_free, s.gpus[0].memory_total);
    assert!(
        (s.gpus[0].utilization - 1.0).abs() < 1e-12,
        "NaN counts as busy"
    );
    assert_eq!(
        s.free_tflops, 0.0,
        "inf TFLOPS held to the cap, then fully busy"
    );
    let honest = NodeSummary::new(vec![gpu(0, "A30", 10.0, 1000.0, 0.0)], &[]);
    let nodes = [
        NodeState {
            name: "liar",
            summary: Some((&s, 0.0)),
        },
        NodeState {
            name: "honest",
            summary: Some((&honest, 0.0)),
        },
    ];
    for r in rank(&nodes, None, 180.0) {
        assert!((0..=MAX_SCORE).contains(&r.score), "{r:?}");
        assert_eq!(r.failed, None);
    }
}

#[test]
fn a_node_publishing_no_gpus_is_not_filtered_out() {
    let empty = NodeSummary::new(Vec::new(), &[]);
    let r = rank(
        &[NodeState {
            name: "n",
            summary: Some((&empty, 0.0)),
        }],
        None,
        180.0,
    );
    assert_eq!((r[0].failed.as_deref(), r[0].score), (None, 0));
}

#[test]
fn failed_writes_back_off_and_a_queue_flipping_between_none_and_one_is_not_news() {
    let mut g = PublishGate::new(PublishConfig::default()).unwrap();
    let s = NodeSummary::new(vec![gpu(0, "A30", 10.0, 1000.0, 0.1)], &[]);
    g.failed(at(0.0));
    assert_eq!(g.due(&s, at(5.0)), None, "10 s after one failure");
    assert_eq!(g.due(&s, at(10.0)), Some(Why::First));
    g.failed(at(10.0));
    assert_eq!(g.due(&s, at(25.0)), None, "20 s after two");
    for i in 0..10 {
        g.failed(at(100.0 + f64::from(i)));
    }
    assert_eq!(g.due(&s, at(150.0)), None);
    assert_eq!(
        g.due(&s, at(170.0)),
        Some(Why::First),
        "never longer than a heartbeat"
    );
    g.written(&s, at(170.0));
    let one = NodeSummary::new(
        vec![gpu(0, "A30", 10.0, 1000.0, 0.1)],
        &[("f".into(), "probing".into(), 1)],
    );
    assert_eq!(g.due(&one, at(200.0)), None);
}
