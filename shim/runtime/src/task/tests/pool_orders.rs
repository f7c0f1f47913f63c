//! The pool agent carrying out mqfqd's orders on paused containers.

use super::*;

/// A gate that admits at once and keeps the pool reports.
#[derive(Debug, Default)]
struct RecordingGate {
    reports: std::sync::Mutex<Vec<crate::api::PoolResult>>,
    /// (container, pooled) of each admission.
    admits: std::sync::Mutex<Vec<(String, bool)>>,
    /// (container, PIDs) of each Pause's release.
    pauses: std::sync::Mutex<Vec<(String, Vec<u32>)>>,
}

#[async_trait::async_trait]
impl crate::gate::Gate for RecordingGate {
    async fn admit(
        &self,
        _: &str,
        id: &str,
        _: &crate::gpu::GpuWork,
        _: Kind,
        pooled: bool,
    ) -> Result<()> {
        self.admits.lock().unwrap().push((id.to_owned(), pooled));
        Ok(())
    }
    async fn cancel(&self, _: &str, _: &str) {}
    async fn release(&self, _: &str, _: &str, _: &str, _: crate::memory::Usage) {}
    async fn pause_release(&self, _: &str, id: &str, _: crate::memory::Usage, pids: Vec<u32>) {
        self.pauses.lock().unwrap().push((id.to_owned(), pids));
    }
}

#[async_trait::async_trait]
impl crate::gate::PoolChannel for RecordingGate {
    async fn pool_orders(&self, _: Duration) -> Vec<crate::api::PoolOrder> {
        std::future::pending().await
    }
    async fn pool_report(&self, results: Vec<crate::api::PoolResult>) {
        self.reports.lock().unwrap().extend(results);
    }
}

#[tokio::test]
async fn pool_orders_thaw_move_and_freeze_only_idle_containers() {
    use crate::api::{PoolAction, PoolOrder};
    let gate = Arc::new(RecordingGate::default());
    let h = harness_with(gate.clone(), gate.clone());
    let req = h.bundle("p1", &gpu());
    h.svc.create(req).await.unwrap();
    h.svc.start("p1", "").await.unwrap();
    h.svc.pause_task("p1").await.unwrap();
    // A control folder with no CUDA process in it yet.
    let ctl = h.dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    h.svc
        .state
        .lock()
        .await
        .containers
        .get_mut("p1")
        .unwrap()
        .gpu
        .inject(ctl);
    let order = |ns: &str, id: &str, a: PoolAction| PoolOrder {
        namespace: ns.into(),
        container_id: id.into(),
        action: a.into(),
        ..Default::default()
    };
    let last = || gate.reports.lock().unwrap().last().cloned().unwrap();
    let before = h.fake.calls().len();
    h.svc
        .run_order(&order("test", "p1", PoolAction::EVICT))
        .await;
    assert_eq!(
        h.fake.calls()[before..],
        ["resume p1", "pause p1"],
        "thaw, move, freeze"
    );
    let r = last();
    assert!(r.ok && !r.skipped && !r.gone, "{r:?}");
    assert_eq!(
        h.svc.state("p1", "").await.unwrap().status(),
        api::Status::PAUSED,
        "containerd still sees it paused"
    );
    // Nothing was evicted (no process): a prefetch has nothing to do.
    h.svc
        .run_order(&order("test", "p1", PoolAction::PREFETCH))
        .await;
    assert!(last().skipped);
    // Running: not idle, skipped without touching runc.
    h.svc.resume_task("p1").await.unwrap();
    let before = h.fake.calls().len();
    h.svc
        .run_order(&order("test", "p1", PoolAction::EVICT))
        .await;
    assert!(last().skipped, "{:?}", last());
    assert_eq!(h.fake.calls().len(), before);
    // Not ours: gone.
    h.svc
        .run_order(&order("test", "nope", PoolAction::EVICT))
        .await;
    assert!(last().gone);
    h.svc
        .run_order(&order("other", "p1", PoolAction::EVICT))
        .await;
    assert!(last().gone);
    // Reclaim of a paused container: killed, then thawed so it can die.
    h.svc.pause_task("p1").await.unwrap();
    // A pooled container's Pause names its processes (the runtime's list) with its release;
    // before its interposer was there it was not pooled, and named none.
    assert_eq!(
        *gate.pauses.lock().unwrap(),
        [("p1".to_owned(), vec![]), ("p1".to_owned(), vec![1000])]
    );
    let before = h.fake.calls().len();
    h.svc
        .run_order(&order("test", "p1", PoolAction::RECLAIM))
        .await;
    assert!(last().ok, "{:?}", last());
    assert_eq!(
        h.fake.calls()[before..],
        ["kill p1 9 all=true", "resume p1"]
    );
}

#[tokio::test]
async fn a_container_that_stalls_a_memory_move_is_frozen_again_and_never_thawed_again() {
    use std::os::unix::net::UnixListener;

    use crate::api::{PoolAction, PoolOrder};
    let gate = Arc::new(RecordingGate::default());
    let mut h = harness_with(gate.clone(), gate.clone());
    h.svc.pool_timeouts = pool::PoolTimeouts {
        status: Duration::from_millis(300),
        moves: Duration::from_millis(300),
    };
    let gpu = json!({"process": {"args": ["sh"], "env": ["PATH=/bin"]},
                     "annotations": {"io.mqfq.gpu": "true"}});
    let req = h.bundle("s1", &gpu);
    h.svc.create(req).await.unwrap();
    h.svc.start("s1", "").await.unwrap();
    h.svc.pause_task("s1").await.unwrap();
    // The container's "CUDA process": accepts, reads, never answers.
    let ctl = h.dir.path().join("ctl-s1");
    std::fs::create_dir_all(&ctl).unwrap();
    let l = UnixListener::bind(ctl.join("cuda-5.sock")).unwrap();
    let stall = std::thread::spawn(move || {
        let conns: Vec<_> = (0..1).map(|_| l.accept().unwrap()).collect();
        std::thread::sleep(Duration::from_secs(2));
        drop(conns);
    });
    h.svc
        .state
        .lock()
        .await
        .containers
        .get_mut("s1")
        .unwrap()
        .gpu
        .inject(ctl);
    let order = |a: PoolAction| PoolOrder {
        namespace: "test".into(),
        container_id: "s1".into(),
        action: a.into(),
        ..Default::default()
    };
    let last = || gate.reports.lock().unwrap().last().cloned().unwrap();
    let before = h.fake.calls().len();
    let started = std::time::Instant::now();
    h.svc.run_order(&order(PoolAction::EVICT)).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "bounded by the deadline"
    );
    assert_eq!(
        h.fake.calls()[before..],
        ["resume s1", "pause s1"],
        "frozen again"
    );
    let r = last();
    assert!(!r.ok && r.gone, "failed and dropped from the pool: {r:?}");
    assert_eq!(
        h.svc.state("s1", "").await.unwrap().status(),
        api::Status::PAUSED
    );
    // The next order does not thaw it.
    let before = h.fake.calls().len();
    h.svc.run_order(&order(PoolAction::PREFETCH)).await;
    assert_eq!(h.fake.calls().len(), before);
    assert!(last().gone);
    // Its next admission is not pooled.
    h.svc.resume_task("s1").await.unwrap();
    assert_eq!(gate.admits.lock().unwrap().last().map(|a| a.1), Some(false));
    stall.join().unwrap();
}

/// A process still in a GPU call answers an evict `busy`: the container is frozen again and
/// stays pooled (the report says not done, not gone), so the pool's next order thaws and tries
/// it again. (It had been dropped from the pool for good, its memory left on the GPU.)
#[tokio::test]
async fn an_evict_refused_as_busy_leaves_the_container_pooled_for_the_next_order() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;

    use crate::api::{PoolAction, PoolOrder};
    let gate = Arc::new(RecordingGate::default());
    let h = harness_with(gate.clone(), gate.clone());
    let gpu = json!({"process": {"args": ["sh"], "env": ["PATH=/bin"]},
                     "annotations": {"io.mqfq.gpu": "true"}});
    let req = h.bundle("b1", &gpu);
    h.svc.create(req).await.unwrap();
    h.svc.start("b1", "").await.unwrap();
    h.svc.pause_task("b1").await.unwrap();
    // The container's "CUDA process": greets, then refuses every evict as busy.
    let ctl = h.dir.path().join("ctl-b1");
    std::fs::create_dir_all(&ctl).unwrap();
    let l = UnixListener::bind(ctl.join("cuda-7.sock")).unwrap();
    let busy = std::thread::spawn(move || {
        for _ in 0..2 {
            let (conn, _) = l.accept().unwrap();
            let mut out = conn.try_clone().unwrap();
            for line in BufReader::new(conn).lines() {
                let line = line.unwrap();
                let reply = if line.starts_with("hello") {
                    "ok"
                } else {
                    "error evict: busy: 1 GPU call(s) still under way after 1s"
                };
                if writeln!(out, "{reply}").is_err() || !line.starts_with("hello") {
                    break;
                }
            }
        }
    });
    h.svc
        .state
        .lock()
        .await
        .containers
        .get_mut("b1")
        .unwrap()
        .gpu
        .inject(ctl);
    let evict = PoolOrder {
        namespace: "test".into(),
        container_id: "b1".into(),
        action: PoolAction::EVICT.into(),
        ..Default::default()
    };
    let last = || gate.reports.lock().unwrap().last().cloned().unwrap();
    for _ in 0..2 {
        let before = h.fake.calls().len();
        h.svc.run_order(&evict).await;
        assert_eq!(
            h.fake.calls()[before..],
            ["resume b1", "pause b1"],
            "thawed, refused, frozen again"
        );
        let r = last();
        assert!(!r.ok && !r.gone && !r.skipped, "{r:?}");
        assert!(r.error.contains("busy"), "{r:?}");
    }
    busy.join().unwrap();
    // Still pooled: its next admission is.
    h.svc.resume_task("b1").await.unwrap();
    assert_eq!(gate.admits.lock().unwrap().last().map(|a| a.1), Some(true));
}
