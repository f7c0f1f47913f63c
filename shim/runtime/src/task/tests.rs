use std::sync::atomic::Ordering;

use containerd_shim_protos::api;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::shim_async::Task;
use containerd_shim_protos::ttrpc;
use containerd_shim_protos::ttrpc::r#async::TtrpcContext;
use serde_json::json;

use super::*;
use crate::gate::Kind;
use crate::runtime::fake::{FakeFactory, FakeRuntime};

mod adapter;
mod gate_races;
mod pool_orders;

struct Harness {
    svc: TaskService,
    events: mpsc::UnboundedReceiver<Event>,
    fake: Arc<FakeRuntime>,
    exit: Arc<ExitSignal>,
    dir: tempfile::TempDir,
}

fn harness() -> Harness {
    // No daemon socket: GPU starts fail open at once.
    let link = crate::gate::DaemonGate::new(crate::gate::GateConfig {
        socket: "/nonexistent/mqfqd.sock".into(),
        fail_open: true,
        reconnect_grace: std::time::Duration::ZERO,
        admit_timeout: None,
    });
    harness_with(Arc::new(link.clone()), Arc::new(link))
}

/// A pool channel with no orders, ever.
#[derive(Debug)]
struct NoOrders;

#[async_trait::async_trait]
impl crate::gate::PoolChannel for NoOrders {
    async fn pool_orders(&self, _: Duration) -> Vec<crate::api::PoolOrder> {
        std::future::pending().await
    }
    async fn pool_report(&self, _: Vec<crate::api::PoolResult>) {}
}

fn harness_with(
    gate: Arc<dyn crate::gate::Gate>,
    orders: Arc<dyn crate::gate::PoolChannel>,
) -> Harness {
    let (tx, events) = mpsc::unbounded_channel();
    let fake = Arc::new(FakeRuntime::default());
    let exit = Arc::new(ExitSignal::default());
    let svc = TaskService::new(
        tx,
        Arc::new(FakeFactory(fake.clone())),
        exit.clone(),
        "test",
        (gate, orders),
    );
    Harness {
        svc,
        events,
        fake,
        exit,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl Harness {
    fn bundle(&self, id: &str, spec: &serde_json::Value) -> api::CreateTaskRequest {
        let b = self.dir.path().join(id);
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(b.join("config.json"), spec.to_string()).unwrap();
        api::CreateTaskRequest {
            id: id.into(),
            bundle: b.to_str().unwrap().into(),
            ..Default::default()
        }
    }

    fn topics(&mut self) -> Vec<&'static str> {
        let mut v = Vec::new();
        while let Ok((t, _)) = self.events.try_recv() {
            v.push(t.rsplit('/').next().unwrap());
        }
        v
    }

    async fn next_topic(&mut self) -> &'static str {
        let (t, _) = tokio::time::timeout(Duration::from_secs(5), self.events.recv())
            .await
            .expect("event within 5 s")
            .expect("channel open");
        t.rsplit('/').next().unwrap()
    }
}

/// An ExecProcess request whose process runs `args`.
fn exec_req(id: &str, exec_id: &str, args: &[&str]) -> api::ExecProcessRequest {
    let spec = json!({"args": args, "cwd": "/", "user": {"uid": 0, "gid": 0}});
    api::ExecProcessRequest {
        id: id.into(),
        exec_id: exec_id.into(),
        spec: MessageField::some(Any {
            type_url: "types.containerd.io/opencontainers/runtime-spec/1/Process".into(),
            value: spec.to_string().into_bytes(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn plain() -> serde_json::Value {
    json!({"process": {"args": ["sh"], "env": ["PATH=/bin"]}})
}

/// A GPU container's spec (by annotation).
fn gpu() -> serde_json::Value {
    json!({"process": {"args": ["sh"], "env": ["PATH=/bin"]},
           "annotations": {"io.mqfq.gpu": "true"}})
}

#[tokio::test]
async fn init_lifecycle_publishes_events_in_order() {
    let mut h = harness();
    let req = h.bundle("c1", &plain());
    let pid = h.svc.create(req).await.unwrap();
    assert_eq!(
        h.svc.classification("c1").await,
        Some(Classification::NotGpu)
    );
    assert_eq!(
        h.svc.state("c1", "").await.unwrap().status(),
        api::Status::CREATED
    );
    assert_eq!(h.svc.start("c1", "").await.unwrap(), pid);
    assert_eq!(
        h.svc.state("c1", "").await.unwrap().status(),
        api::Status::RUNNING
    );
    h.svc.on_exit(pid, 7).await;
    let w = h.svc.wait("c1", "").await.unwrap();
    assert_eq!(w.exit_status, 7);
    assert!(w.exited_at.is_some());
    let d = h.svc.delete("c1", "").await.unwrap();
    assert_eq!((d.pid, d.exit_status), (pid, 7));
    assert_eq!(h.topics(), vec!["create", "start", "exit", "delete"]);
    assert_eq!(
        h.fake.calls(),
        vec!["create c1", "start c1", "delete c1 force=true"]
    );
    assert!(h.svc.is_empty().await);
    assert!(matches!(
        h.svc.state("c1", "").await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn an_exit_racing_its_start_is_published_after_the_start() {
    let mut h = harness();
    h.svc.watch_exits().await.unwrap();
    h.fake.exit_during_start.store(true, Ordering::SeqCst);
    let req = h.bundle("race", &plain());
    h.svc.create(req).await.unwrap();
    h.svc.start("race", "").await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(h.next_topic().await);
    }
    assert_eq!(seen, vec!["create", "start", "exit"]);
    assert_eq!(h.svc.wait("race", "").await.unwrap().exit_status, 0);
}

#[tokio::test]
async fn an_init_that_dies_during_a_failed_start_still_gets_its_exit() {
    let mut h = harness();
    h.svc.watch_exits().await.unwrap();
    h.fake.exit_during_start.store(true, Ordering::SeqCst);
    h.fake.fail_start.store(true, Ordering::SeqCst);
    let req = h.bundle("dead", &plain());
    h.svc.create(req).await.unwrap();
    h.svc.start("dead", "").await.unwrap_err();
    assert_eq!(h.next_topic().await, "create");
    assert_eq!(h.next_topic().await, "exit", "no start event, but the exit");
    let w = tokio::time::timeout(Duration::from_secs(5), h.svc.wait("dead", ""));
    assert_eq!(w.await.expect("Wait returns").unwrap().exit_status, 0);
}

#[tokio::test]
async fn delete_right_after_an_exit_still_publishes_the_exit_first() {
    let mut h = harness();
    let req = h.bundle("d1", &plain());
    let pid = h.svc.create(req).await.unwrap();
    h.svc.start("d1", "").await.unwrap();
    // The exit is recorded; its drain task has not run yet (single-threaded test runtime).
    h.svc.on_exit(pid, 137).await;
    let d = h.svc.delete("d1", "").await.unwrap();
    assert_eq!(d.exit_status, 137);
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(h.topics(), vec!["create", "start", "exit", "delete"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_duplicate_creates_never_destroy_the_winner() {
    let h = harness();
    let req = h.bundle("dup", &plain());
    let (a, b) = tokio::join!(h.svc.create(req.clone()), h.svc.create(req));
    let (ok, err) = match (a, b) {
        (Ok(p), Err(e)) | (Err(e), Ok(p)) => (p, e),
        other => panic!("exactly one create must win: {other:?}"),
    };
    assert!(ok > 0);
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    assert_eq!(
        h.fake.calls(),
        vec!["create dup"],
        "the loser never reached runc"
    );
    assert_eq!(
        h.svc.state("dup", "").await.unwrap().status(),
        api::Status::CREATED
    );
}

#[tokio::test]
async fn a_stale_exit_of_a_reused_pid_is_not_claimed() {
    let h = harness();
    let req = h.bundle("r1", &plain());
    h.svc.create(req).await.unwrap();
    h.svc.start("r1", "").await.unwrap();
    let exec = exec_req("r1", "probe", &["true"]);
    h.svc.exec(exec).await.unwrap();
    // Some earlier process (a runc run, say) had every pid the fake may hand out next, and
    // exited before this exec was started.
    let base = {
        let probe = h.bundle("probe", &plain());
        h.svc.create(probe).await.unwrap()
    };
    for pid in base + 1..base + 1000 {
        h.svc.on_exit(pid, 99).await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let pid = h.svc.start("r1", "probe").await.unwrap();
    assert!(
        pid > base && pid < base + 1000,
        "the exec's pid {pid} had a stale exit"
    );
    let st = h.svc.state("r1", "probe").await.unwrap();
    assert_eq!(
        st.status(),
        api::Status::RUNNING,
        "a stale exit was taken for pid {pid}"
    );
}

#[tokio::test]
async fn exec_lifecycle() {
    let mut h = harness();
    let req = h.bundle("c2", &plain());
    h.svc.create(req).await.unwrap();
    h.svc.start("c2", "").await.unwrap();
    let exec = exec_req("c2", "e1", &["sh", "-c", "exit 3"]);
    h.svc.exec(exec.clone()).await.unwrap();
    assert!(matches!(
        h.svc.exec(exec).await,
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(
        h.svc.kill("c2", "e1", 9, false).await,
        Err(Error::NotFound(_))
    ));
    let epid = h.svc.start("c2", "e1").await.unwrap();
    h.svc.on_exit(epid, 3).await;
    assert_eq!(h.svc.wait("c2", "e1").await.unwrap().exit_status, 3);
    assert_eq!(h.svc.delete("c2", "e1").await.unwrap().exit_status, 3);
    assert!(matches!(
        h.svc.state("c2", "e1").await,
        Err(Error::NotFound(_))
    ));
    assert_eq!(
        h.topics(),
        vec!["create", "start", "exec-added", "exec-started", "exit"]
    );
    let bad = api::ExecProcessRequest {
        id: "c2".into(),
        exec_id: "e2".into(),
        ..Default::default()
    };
    let e = h.svc.exec(bad).await.unwrap_err();
    assert_eq!(e.code(), ttrpc::Code::INVALID_ARGUMENT, "{e}");
}

#[tokio::test]
async fn an_exec_that_exits_before_its_pid_is_known_is_not_lost() {
    let mut h = harness();
    h.svc.watch_exits().await.unwrap();
    let req = h.bundle("c3", &plain());
    h.svc.create(req).await.unwrap();
    h.svc.start("c3", "").await.unwrap();
    let exec = exec_req("c3", "fast", &["true"]);
    h.svc.exec(exec).await.unwrap();
    // The reaper reports the exec's pid before `runc exec` returns it.
    h.fake.exit_during_exec.store(true, Ordering::SeqCst);
    h.svc.start("c3", "fast").await.unwrap();
    let w = tokio::time::timeout(Duration::from_secs(5), h.svc.wait("c3", "fast"))
        .await
        .expect("the early exit was claimed")
        .unwrap();
    assert_eq!(w.exit_status, 9);
    let topics = h.topics();
    let started = topics.iter().position(|t| *t == "exec-started").unwrap();
    let exited = topics.iter().rposition(|t| *t == "exit").unwrap();
    assert!(started < exited, "{topics:?}");
}

#[tokio::test]
async fn bad_annotations_create_nothing() {
    let mut h = harness();
    for (i, (key, value)) in [
        ("io.mqfq.weight", json!("-2")),
        ("io.mqfq.warm", json!("criu")),
        ("io.mqfq.warm", json!(1)),
    ]
    .into_iter()
    .enumerate()
    {
        let spec = json!({"annotations": {key: value},
                          "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
        let req = h.bundle(&format!("bad{i}"), &spec);
        match h.svc.create(req).await {
            Err(e) if e.code() == ttrpc::Code::INVALID_ARGUMENT => {
                assert!(e.to_string().contains(key), "{e}");
            }
            other => panic!("{key}={value}: {other:?}"),
        }
    }
    assert!(h.fake.calls().is_empty(), "runc never ran");
    assert!(h.topics().is_empty());
    assert!(h.svc.is_empty().await);
}

#[tokio::test]
async fn bad_stdio_restore_and_failed_runc_leave_nothing() {
    let mut h = harness();
    let mut req = h.bundle("tty", &plain());
    req.terminal = true;
    req.stdout = "file:///tmp/never".into();
    assert!(matches!(
        h.svc.create(req).await,
        Err(Error::InvalidArgument(_))
    ));
    let mut req = h.bundle("ckpt", &plain());
    req.checkpoint = "/some/checkpoint".into();
    assert!(matches!(
        h.svc.create(req).await,
        Err(Error::Unimplemented(_))
    ));
    h.fake.fail_create.store(true, Ordering::SeqCst);
    let req = h.bundle("boom", &plain());
    assert!(matches!(h.svc.create(req).await, Err(Error::Runc { .. })));
    assert_eq!(
        h.fake.calls(),
        vec!["create boom", "delete boom force=true"]
    );
    assert!(h.svc.is_empty().await);
    assert!(h.topics().is_empty());
    let req = api::CreateTaskRequest {
        id: "nobundle".into(),
        bundle: h.dir.path().join("missing").to_str().unwrap().into(),
        ..Default::default()
    };
    assert!(matches!(h.svc.create(req).await, Err(Error::Io { .. })));
}

#[tokio::test]
async fn gpu_containers_are_classified_at_create() {
    let h = harness();
    let spec = json!({"annotations": {"io.mqfq.function": "resnet", "io.mqfq.weight": "2"},
                      "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]},
                      "linux": {"devices": [{"path": "/dev/nvidia0"}]}});
    let req = h.bundle("g1", &spec);
    h.svc.create(req).await.unwrap();
    match h.svc.classification("g1").await {
        Some(Classification::Gpu(w)) => {
            assert_eq!(w.function, "resnet");
            assert_eq!(w.weight, 2.0);
            assert_eq!(
                w.grant,
                Some(crate::gpu::GpuSelection::Devices(vec!["0".into()]))
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn state_machine_errors_and_pause_resume() {
    let mut h = harness();
    let req = h.bundle("p1", &plain());
    let pid = h.svc.create(req.clone()).await.unwrap();
    assert!(matches!(
        h.svc.create(req).await,
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(
        h.svc.pause_task("p1").await,
        Err(Error::FailedPrecondition(_))
    ));
    h.svc.start("p1", "").await.unwrap();
    assert!(matches!(
        h.svc.start("p1", "").await,
        Err(Error::FailedPrecondition(_))
    ));
    assert!(matches!(
        h.svc.delete("p1", "").await,
        Err(Error::FailedPrecondition(_))
    ));
    h.svc.pause_task("p1").await.unwrap();
    assert_eq!(
        h.svc.state("p1", "").await.unwrap().status(),
        api::Status::PAUSED
    );
    h.svc.resume_task("p1").await.unwrap();
    h.svc.kill("p1", "", 15, false).await.unwrap();
    h.svc.on_exit(pid, 143).await;
    h.svc.wait("p1", "").await.unwrap();
    assert!(matches!(
        h.svc.kill("p1", "", 15, false).await,
        Err(Error::NotFound(_))
    ));
    assert_eq!(
        h.topics(),
        vec!["create", "start", "paused", "resumed", "exit"]
    );
    assert!(matches!(
        h.svc.start("nope", "").await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        h.svc.kill("nope", "", 9, false).await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn shutdown_only_when_empty() {
    let h = harness();
    let gpu = gpu();
    let req = h.bundle("s1", &gpu);
    let pid = h.svc.create(req).await.unwrap();
    assert!(!h.svc.is_empty().await);
    h.svc.on_exit(pid, 0).await;
    h.svc.wait("s1", "").await.unwrap();
    h.svc.delete("s1", "").await.unwrap();
    assert!(h.svc.is_empty().await);
    // ExitSignal fires once signalled; nothing else flips it.
    let waiter = {
        let e = h.exit.clone();
        tokio::spawn(async move { e.wait().await })
    };
    h.exit.signal();
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn terminal_processes_get_their_pty_master() {
    let h = harness();
    let fifo = h.dir.path().join("tty-out");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut req = h.bundle("t1", &plain());
    req.terminal = true;
    req.stdout = fifo.to_str().unwrap().into();
    let pid = h.svc.create(req).await.unwrap();
    let resize = api::ResizePtyRequest {
        id: "t1".into(),
        width: 120,
        height: 30,
        ..Default::default()
    };
    {
        let st = h.svc.state.lock().await;
        let io = st.containers["t1"].init.io.as_ref().unwrap();
        io.resize(resize.width, resize.height).unwrap();
    }
    h.svc.start("t1", "").await.unwrap();
    h.svc.on_exit(pid, 0).await;
    assert_eq!(h.svc.wait("t1", "").await.unwrap().exit_status, 0);
}

fn ctx() -> TtrpcContext {
    TtrpcContext {
        mh: Default::default(),
        metadata: Default::default(),
        timeout_nano: 0,
    }
}

#[test]
fn the_checkpoint_backend_is_not_chosen_for_mig_instances_or_mps_clients() {
    let work = |gpus: &[&str]| crate::gpu::GpuWork {
        function: "f".into(),
        weight: 0.0,
        tenant: None,
        pod_namespace: String::new(),
        gpus: crate::gpu::GpuSelection::Devices(gpus.iter().map(|g| (*g).to_owned()).collect()),
        grant: None,
        placeable: false,
        partners: Vec::new(),
        warm: mqfq_proto::warm::Warm::Checkpoint,
    };
    let cannot = super::create::checkpoint_cannot_serve;
    let plain = json!({"process": {"env": ["PATH=/bin"]}, "mounts": [{"destination": "/tmp"}]});
    assert_eq!(cannot(&plain, &work(&["0", "GPU-8f2c"])), None);
    for mig in ["MIG-4c1d", "0:1"] {
        assert_eq!(cannot(&plain, &work(&["0", mig])), Some("a MIG instance"));
    }
    let picked = json!({"process": {"env": ["CUDA_VISIBLE_DEVICES=0, MIG-77aa"]}});
    assert_eq!(cannot(&picked, &work(&["all"])), Some("a MIG instance"));
    let mut granted = work(&["0"]);
    granted.grant = Some(crate::gpu::GpuSelection::Devices(vec!["MIG-4c1d".into()]));
    assert_eq!(cannot(&plain, &granted), Some("a MIG instance"));
    let pipe = json!({"process": {"env": ["CUDA_MPS_PIPE_DIRECTORY=/run/mps"]}});
    let mounted = json!({"mounts": [{"destination": "/tmp/nvidia-mps/"}]});
    for spec in [pipe, mounted] {
        assert_eq!(
            cannot(&spec, &work(&["0"])),
            Some("an MPS client"),
            "{spec}"
        );
    }
}
