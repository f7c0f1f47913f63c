//! The gate against mqfqd's own service (in process), with a heartbeat's registration held in
//! flight while a container's lease ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use mqfq_daemon::server::{Daemon, Service};
use tokio::sync::Notify;
use ttrpc::r#async::TtrpcContext;

use super::daemon::DaemonGate;
use super::{Gate, GateConfig, Kind};
use crate::api;
use crate::gpu::{GpuSelection, GpuWork};

/// mqfqd's service, except that the second Register waits for the test; it tells when a
/// Release arrives.
struct Holding {
    mqfqd: Service,
    registers: AtomicU32,
    held: Notify,
    go: Notify,
    released: Notify,
    /// Each Release's reason and PIDs, in order.
    releases: std::sync::Mutex<Vec<(String, Vec<u32>)>>,
}

#[async_trait::async_trait]
impl api::Admission for Holding {
    async fn admit(
        &self,
        ctx: &TtrpcContext,
        r: api::AdmitRequest,
    ) -> ttrpc::Result<api::AdmitResponse> {
        self.mqfqd.admit(ctx, r).await
    }
    async fn release(
        &self,
        ctx: &TtrpcContext,
        r: api::ReleaseRequest,
    ) -> ttrpc::Result<api::ReleaseResponse> {
        self.releases
            .lock()
            .unwrap()
            .push((r.reason.clone(), r.pids.clone()));
        let answer = self.mqfqd.release(ctx, r).await;
        self.released.notify_one();
        answer
    }
    async fn cancel(
        &self,
        ctx: &TtrpcContext,
        r: api::CancelRequest,
    ) -> ttrpc::Result<api::CancelResponse> {
        self.mqfqd.cancel(ctx, r).await
    }
    async fn register(
        &self,
        ctx: &TtrpcContext,
        r: api::RegisterRequest,
    ) -> ttrpc::Result<api::RegisterResponse> {
        if self.registers.fetch_add(1, Ordering::SeqCst) == 1 {
            self.held.notify_one();
            self.go.notified().await;
        }
        self.mqfqd.register(ctx, r).await
    }
}

fn mqfqd() -> Arc<Daemon> {
    let cfg = mqfq_daemon::config::DaemonConfig::parse("", std::path::Path::new("mqfqd.toml"))
        .expect("default config");
    let gpu = scheduler_core::node::admission::GpuInfo {
        index: 0,
        uuid: "GPU-test".into(),
        name: "test".into(),
        mode: scheduler_core::GpuMode::Plain,
        memory_total: 1 << 34,
        mig: Vec::new(),
    };
    let node = mqfq_daemon::build_node(&cfg, vec![gpu]).expect("node");
    Daemon::new(node, "simulated", None).expect("daemon")
}

/// [`Holding`] over `daemon`'s service, served on `socket` (until the server is dropped).
async fn serve_holding(
    daemon: Arc<Daemon>,
    socket: &std::path::Path,
) -> (Arc<Holding>, ttrpc::r#async::Server) {
    let holding = Arc::new(Holding {
        mqfqd: Service(daemon),
        registers: AtomicU32::new(0),
        held: Notify::new(),
        go: Notify::new(),
        released: Notify::new(),
        releases: std::sync::Mutex::default(),
    });
    let mut server = ttrpc::r#async::Server::new()
        .bind(&format!("unix://{}", socket.display()))
        .unwrap()
        .register_service(api::create_admission(holding.clone()));
    server.start().await.unwrap();
    (holding, server)
}

/// A fail-closed gate on `socket`, and a container's work (function `f`, every GPU).
fn gate_and_work(socket: std::path::PathBuf) -> (Arc<DaemonGate>, GpuWork) {
    let gate = DaemonGate::new(GateConfig {
        socket,
        fail_open: false,
        reconnect_grace: Duration::ZERO,
        admit_timeout: None,
    });
    let work = GpuWork {
        function: "f".into(),
        weight: 1.0,
        tenant: None,
        pod_namespace: String::new(),
        gpus: GpuSelection::All,
        grant: None,
        placeable: false,
        partners: Vec::new(),
        warm: Default::default(),
    };
    (gate, work)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_a_registration_leaves_no_lease_behind() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mqfqd.sock");
    let daemon = mqfqd();
    let (holding, _server) = serve_holding(daemon.clone(), &socket).await;
    let (gate, work) = gate_and_work(socket);
    // The first registration (on connect) passes; the container gets a lease.
    gate.admit("ns", "c1", &work, Kind::Start, false)
        .await
        .unwrap();
    assert_eq!(daemon.status().leases.len(), 1);
    // The heartbeat's registration lists c1's lease and is held on its way to mqfqd...
    tokio::time::timeout(Duration::from_secs(10), holding.held.notified())
        .await
        .expect("the heartbeat registers within a second or so");
    // ...while c1 exits. Its Release must not overtake that registration: arriving first, the
    // stale set would have mqfqd adopt the ended lease again, and keep it (it releases an
    // unlisted lease only once it predates the shim's previous registration). The wait below
    // only gives a wrong gate the time to send its Release (well under a millisecond); a right
    // one sends nothing until the registration is answered, whatever the wait.
    let g = gate.clone();
    let releasing = tokio::spawn(async move {
        g.release("ns", "c1", "exit", crate::memory::Usage::default())
            .await;
    });
    let overtook = tokio::time::timeout(Duration::from_secs(2), holding.released.notified());
    assert!(
        overtook.await.is_err(),
        "a Release overtook a registration that lists its lease"
    );
    holding.go.notify_one();
    releasing.await.unwrap();
    let leases = daemon.status().leases;
    assert!(
        leases.is_empty(),
        "a lease outlived its container: {leases:?}"
    );
}

/// A lease handed back unused (its container was paused while its burst waited) leaves the
/// container's memory where it was: evicted memory is still reported evicted at the next
/// registration (it had been reported on the GPU), and the release reports no service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_handed_back_unused_leaves_evicted_memory_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mqfqd.sock");
    let daemon = mqfqd();
    let mut server = ttrpc::r#async::Server::new()
        .bind(&format!("unix://{}", socket.display()))
        .unwrap()
        .register_service(api::create_admission(Arc::new(Service(daemon.clone()))));
    server.start().await.unwrap();
    let (gate, work) = gate_and_work(socket);
    let none = crate::memory::Usage::default();
    gate.admit("ns", "c1", &work, Kind::Burst, true)
        .await
        .unwrap();
    gate.release("ns", "c1", "idle", none).await;
    gate.pool_done(&[api::PoolResult {
        namespace: "ns".into(),
        container_id: "c1".into(),
        action: api::PoolAction::EVICT.into(),
        ok: true,
        ..Default::default()
    }]);
    assert_eq!(gate.idle_evicted("ns", "c1"), Some(true));
    // Granted, then handed back unused: still evicted.
    gate.admit("ns", "c1", &work, Kind::Burst, true)
        .await
        .unwrap();
    assert_eq!(gate.idle_evicted("ns", "c1"), None, "held, not idle");
    gate.release("ns", "c1", mqfq_proto::UNUSED, none).await;
    assert_eq!(gate.idle_evicted("ns", "c1"), Some(true));
    // A burst that ran restored it (the shim brings evicted memory back before it runs).
    gate.admit("ns", "c1", &work, Kind::Burst, true)
        .await
        .unwrap();
    gate.release("ns", "c1", "idle", none).await;
    assert_eq!(gate.idle_evicted("ns", "c1"), Some(false));
    assert!(daemon.status().leases.is_empty());
}

/// A Pause's release names the container's processes (mqfqd reads what NVML measured them
/// holding); a later burst's release names its own, not the Pause's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_release_names_the_container_s_processes() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mqfqd.sock");
    let (holding, _server) = serve_holding(mqfqd(), &socket).await;
    let (gate, work) = gate_and_work(socket);
    let none = crate::memory::Usage::default();
    gate.admit("ns", "c1", &work, Kind::Start, true)
        .await
        .unwrap();
    gate.pause_release("ns", "c1", none, vec![41, 42]).await;
    gate.admit("ns", "c1", &work, Kind::Burst, true)
        .await
        .unwrap();
    let report = super::BurstReport {
        pids: vec![43],
        ..Default::default()
    };
    gate.end_burst("ns", "c1", report, none).await;
    gate.admit("ns", "c1", &work, Kind::Burst, true)
        .await
        .unwrap();
    gate.release("ns", "c1", "exit", none).await;
    assert_eq!(
        *holding.releases.lock().unwrap(),
        [
            ("pause".to_owned(), vec![41, 42]),
            ("idle".to_owned(), vec![43]),
            ("exit".to_owned(), vec![]),
        ]
    );
}
