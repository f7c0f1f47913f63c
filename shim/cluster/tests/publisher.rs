//! The publisher against a fake API server: create, update on a crossing, heartbeat, conflict
//! retry, a deleted object, an API server that is down, and no write storm under churn.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod common;

use kube::api::Api;
use mqfq_cluster::crd::GpuNodeState;
use mqfq_cluster::publisher::{Publisher, summarize};
use mqfq_proto::api;
use scheduler_core::Time;
use scheduler_core::placement::cluster::{NodeSummary, PublishConfig, PublishGate, Why};

fn status(sm: f64, queued: u64) -> api::StatusResponse {
    api::StatusResponse {
        gpus: vec![api::GpuStatus {
            index: 0,
            name: "NVIDIA A30".into(),
            tflops: 10.3,
            mem_gbps: 933.0,
            memory_total: 24 << 30,
            memory_used: 6 << 30,
            limit: 2,
            running: 1,
            queued,
            sm_activity: Some(sm),
            health: "healthy".into(),
            ..Default::default()
        }],
        flows: vec![api::FlowStatus {
            function: "team/bert".into(),
            class: "compute-long".into(),
            queued,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The same summary, its float sums within a rounding of JSON's.
fn same(a: &NodeSummary, b: &NodeSummary) -> bool {
    a.gpus == b.gpus
        && a.functions == b.functions
        && a.queue_by_class == b.queue_by_class
        && (a.free_tflops - b.free_tflops).abs() < 1e-9
        && (a.free_mem_gbps - b.free_mem_gbps).abs() < 1e-9
}

fn at(s: f64) -> Time {
    Time::from_secs_f64(s)
}

#[test]
fn a_status_becomes_the_nodes_summary() {
    let s = summarize(&status(0.5, 3));
    assert_eq!(s.gpus[0].memory_free, 18 << 30);
    assert!((s.gpus[0].utilization - 0.5).abs() < 1e-12);
    assert!((s.free_tflops - 5.15).abs() < 1e-9);
    assert_eq!(s.functions["team/bert"], "compute-long");
    assert_eq!(s.queue_by_class["compute-long"], 3);
    // Without SM activity: the share of slots in use; without placement: healthy, probing.
    let mut bare = status(0.0, 0);
    bare.gpus[0].sm_activity = None;
    bare.gpus[0].health.clear();
    bare.flows[0].class.clear();
    let s = summarize(&bare);
    assert!((s.gpus[0].utilization - 0.5).abs() < 1e-12);
    assert_eq!(s.gpus[0].health, "healthy");
    assert!(s.functions.is_empty());
}

#[tokio::test]
async fn the_publisher_creates_updates_on_crossings_heartbeats_and_retries_conflicts() {
    let (url, store) = common::serve().await;
    let api: Api<GpuNodeState> = Api::namespaced(common::client(&url), "mqfq-system");
    let gate = PublishGate::new(PublishConfig::default()).unwrap();
    let mut p = Publisher::new(api.clone(), "node-a", gate);
    let calm = summarize(&status(0.1, 0));
    let busy = summarize(&status(0.9, 8));

    assert_eq!(
        p.step(&calm, at(0.0), 1000).await.unwrap(),
        Some(Why::First)
    );
    let obj = api.get("node-a").await.unwrap();
    assert_eq!(obj.spec.node, "node-a");
    assert_eq!(obj.spec.why, "first");
    assert!(same(&obj.spec.summary, &calm), "{obj:?}");
    // Unchanged: nothing until the heartbeat.
    for t in 1..60 {
        assert_eq!(p.step(&calm, at(f64::from(t)), 1000).await.unwrap(), None);
    }
    assert_eq!(store.lock().unwrap().writes(), 1);
    assert_eq!(
        p.step(&calm, at(61.0), 61_000).await.unwrap(),
        Some(Why::Heartbeat)
    );
    // A crossing, written as a replace.
    assert_eq!(
        p.step(&busy, at(75.0), 75_000).await.unwrap(),
        Some(Why::Crossing)
    );
    let obj = api.get("node-a").await.unwrap();
    assert_eq!(
        (obj.spec.why.as_str(), obj.spec.published_unix_ms),
        ("crossing", 75_000)
    );
    assert_eq!(obj.spec.summary.queue_by_class["compute-long"], 8);
    assert_eq!(
        store.lock().unwrap().log,
        [
            "POST node-a",
            "GET node-a",
            "PUT node-a",
            "PUT node-a",
            "GET node-a"
        ]
    );

    // Someone else wrote it: the replace conflicts, is re-read, and goes through.
    store.lock().unwrap().foreign_write("node-a");
    store.lock().unwrap().log.clear();
    assert_eq!(
        p.step(&calm, at(90.0), 90_000).await.unwrap(),
        Some(Why::Crossing)
    );
    assert_eq!(
        store.lock().unwrap().log,
        ["PUT node-a", "GET node-a", "PUT node-a"]
    );
    // Deleted meanwhile: created again.
    store.lock().unwrap().objects.clear();
    store.lock().unwrap().log.clear();
    assert_eq!(
        p.step(&busy, at(100.0), 100_000).await.unwrap(),
        Some(Why::Crossing)
    );
    assert_eq!(store.lock().unwrap().log, ["PUT node-a", "POST node-a"]);
    assert!(same(&api.get("node-a").await.unwrap().spec.summary, &busy));

    // The API server down: an error, and the same write is due at the next step.
    store.lock().unwrap().down = true;
    let e = p.step(&calm, at(115.0), 115_000).await.unwrap_err();
    assert!(e.to_string().contains("API server"), "{e}");
    store.lock().unwrap().down = false;
    // Backed off: not before the minimum interval has passed again.
    assert_eq!(p.step(&calm, at(116.0), 116_000).await.unwrap(), None);
    assert_eq!(
        p.step(&calm, at(125.0), 125_000).await.unwrap(),
        Some(Why::Crossing)
    );
    assert!(same(&api.get("node-a").await.unwrap().spec.summary, &calm));
}

#[tokio::test]
async fn a_publisher_restarted_next_to_its_old_object_takes_it_over() {
    let (url, store) = common::serve().await;
    let api: Api<GpuNodeState> = Api::namespaced(common::client(&url), "mqfq-system");
    let calm = summarize(&status(0.1, 0));
    let gate = || PublishGate::new(PublishConfig::default()).unwrap();
    Publisher::new(api.clone(), "node-a", gate())
        .step(&calm, at(0.0), 1)
        .await
        .unwrap();
    store.lock().unwrap().log.clear();
    let mut again = Publisher::new(api.clone(), "node-a", gate());
    assert_eq!(
        again.step(&calm, at(0.0), 2).await.unwrap(),
        Some(Why::First)
    );
    assert_eq!(
        store.lock().unwrap().log,
        ["POST node-a", "GET node-a", "PUT node-a"]
    );
    assert_eq!(api.get("node-a").await.unwrap().spec.published_unix_ms, 2);
}

/// Ten minutes of a node whose load flips every 100 ms: writes stay near one per minimum
/// interval (what PERFORMANCE.md reports as API writes per node per minute under churn).
#[tokio::test]
async fn churn_makes_no_write_storm() {
    let (url, store) = common::serve().await;
    let api: Api<GpuNodeState> = Api::namespaced(common::client(&url), "mqfq-system");
    let mut p = Publisher::new(
        api,
        "node-a",
        PublishGate::new(PublishConfig::default()).unwrap(),
    );
    let (calm, busy) = (summarize(&status(0.1, 0)), summarize(&status(0.9, 8)));
    for i in 0..6000u32 {
        let s = if i % 2 == 0 { &calm } else { &busy };
        p.step(s, at(f64::from(i) * 0.1), u64::from(i))
            .await
            .unwrap();
    }
    let writes = store.lock().unwrap().writes();
    assert!(writes <= 61, "{writes} writes in 10 minutes");
    assert_eq!(writes as u64, p.writes());
}

/// The whole path on one node: a real `mqfqd` (simulated GPUs, placement on), the publisher's
/// loop reading it over the control socket, the fake API server receiving its object; work
/// queued at `mqfqd` shows in the next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_loop_publishes_what_mqfqd_reports() {
    use mqfq_cluster::publisher::{Settings, run};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let sock = dir.path().join("mqfqd.sock");
    let cfg = dir.path().join("mqfqd.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = \"{}\"\nmetrics_addr = \"\"\nbackend = \"simulated\"\nrestart_grace_ms = 0\n\
             mps_pipe_dir = \"{}\"\n[simulated]\ngpus = 2\n[concurrency]\nd_max = 1\nd_initial = 1\n\
             [nvidia]\nedits = false\n[placement]\nenabled = true\n",
            sock.display(),
            dir.path().join("mps").display()
        ),
    )
    .unwrap();
    let mut daemon = std::process::Command::new(mqfq_testkit::daemon_program("mqfqd"))
        .arg("--config")
        .arg(&cfg)
        .spawn()
        .unwrap();
    let (url, store) = common::serve().await;
    let api: Api<GpuNodeState> = Api::namespaced(common::client(&url), "mqfq-system");
    let gate = PublishGate::new(PublishConfig {
        min_interval_s: 0.1,
        heartbeat_s: 60.0,
        ..PublishConfig::default()
    })
    .unwrap();
    let publisher = tokio::spawn(run(
        Publisher::new(api.clone(), "node-a", gate),
        Settings {
            socket: sock.clone(),
            period: Duration::from_millis(50),
        },
    ));
    let until = async |what: &str, ok: &dyn Fn(&GpuNodeState) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(o)) = api.get_opt("node-a").await
                && ok(&o)
            {
                return o;
            }
            assert!(
                Instant::now() < deadline,
                "never {what}: {:?}",
                store.lock().unwrap().log
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let o = until("published", &|o| o.spec.summary.gpus.len() == 2).await;
    assert!(
        o.spec
            .summary
            .gpus
            .iter()
            .all(|g| g.health == "healthy" && g.tflops > 0.0)
    );
    assert_eq!(o.spec.why, "first");

    // Three admissions for GPU 0 with one slot: one runs, two wait — a crossing.
    let c = mqfq_proto::connect(&sock).await.unwrap();
    let mut waiting = Vec::new();
    for i in 0..3 {
        let c = c.clone();
        waiting.push(tokio::spawn(async move {
            c.admit(
                ttrpc::context::with_timeout(0),
                &api::AdmitRequest {
                    namespace: "t".into(),
                    container_id: format!("c{i}"),
                    function: "f".into(),
                    gpus: vec!["0".into()],
                    shim_pid: std::process::id(),
                    ..Default::default()
                },
            )
            .await
        }));
    }
    let o = until("the queue", &|o| {
        o.spec.summary.queue_by_class.get("probing") == Some(&2)
    })
    .await;
    assert_eq!(o.spec.why, "crossing");
    assert_eq!(o.spec.summary.gpus[0].running, 1);
    publisher.abort();
    for w in waiting {
        w.abort();
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
}
