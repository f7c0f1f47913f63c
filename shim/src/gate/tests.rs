//! The gate against a fake mqfqd that holds a heartbeat's registration in flight while a
//! release goes out.

use std::collections::BTreeSet;
use std::sync::Mutex as StdMutex;

use tokio::sync::Notify;

use super::daemon::DaemonGate;
use super::{Gate, GateConfig, Kind};
use crate::api;
use crate::gpu::{GpuSelection, GpuWork};

/// A daemon that hands out lease 1, adopts the leases a registration lists and releases those
/// it no longer lists (as mqfqd's reconciliation does), and holds the second Register until
/// the test lets it go.
#[derive(Default)]
struct FakeDaemon {
    live: StdMutex<BTreeSet<u64>>,
    registers: StdMutex<u32>,
    /// Told when the held Register arrived / when a Release arrived.
    register_held: Notify,
    released: Notify,
    third: Notify,
    /// What lets the held Register answer.
    go: Notify,
}

#[async_trait::async_trait]
impl api::Admission for FakeDaemon {
    async fn admit(
        &self,
        _: &ttrpc::r#async::TtrpcContext,
        _: api::AdmitRequest,
    ) -> ttrpc::Result<api::AdmitResponse> {
        self.live.lock().unwrap().insert(1);
        Ok(api::AdmitResponse {
            lease_id: 1,
            ..Default::default()
        })
    }
    async fn release(
        &self,
        _: &ttrpc::r#async::TtrpcContext,
        r: api::ReleaseRequest,
    ) -> ttrpc::Result<api::ReleaseResponse> {
        self.live.lock().unwrap().remove(&r.lease_id);
        self.released.notify_one();
        Ok(api::ReleaseResponse::default())
    }
    async fn register(
        &self,
        _: &ttrpc::r#async::TtrpcContext,
        r: api::RegisterRequest,
    ) -> ttrpc::Result<api::RegisterResponse> {
        let listed: BTreeSet<u64> = r.running.iter().map(|x| x.lease_id).collect();
        let n = {
            let mut n = self.registers.lock().unwrap();
            *n += 1;
            *n
        };
        if n == 2 {
            self.register_held.notify_one();
            self.go.notified().await;
        }
        // Reconciliation as the daemon does it, on arrival of the set (read before the wait).
        *self.live.lock().unwrap() = listed.into_iter().filter(|&l| l != 0).collect();
        if n == 3 {
            self.third.notify_one();
        }
        Ok(api::RegisterResponse::default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_a_registration_leaves_no_lease_behind() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mqfqd.sock");
    let fake = std::sync::Arc::new(FakeDaemon::default());
    let mut server = ttrpc::r#async::Server::new()
        .bind(&format!("unix://{}", socket.display()))
        .unwrap()
        .register_service(api::create_admission(fake.clone()));
    server.start().await.unwrap();
    let gate = DaemonGate::new(GateConfig {
        socket,
        fail_open: false,
        reconnect_grace: std::time::Duration::ZERO,
        admit_timeout: None,
    });
    let work = GpuWork {
        function: "f".into(),
        weight: 1.0,
        tenant: None,
        pod_namespace: String::new(),
        gpus: GpuSelection::All,
        grant: None,
    };
    // The first registration (on connect) passes; the lease is 1.
    gate.admit("ns", "c1", &work, Kind::Start, false)
        .await
        .unwrap();
    // The heartbeat's registration lists c1's lease and is held at the daemon...
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        fake.register_held.notified(),
    )
    .await
    .expect("the heartbeat registers within a second or so");
    // ...while c1 exits: its Release goes out without waiting for the registration.
    let g = gate.clone();
    let releasing = tokio::spawn(async move {
        g.release("ns", "c1", "exit", crate::memory::Usage::default())
            .await;
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), fake.released.notified())
        .await
        .expect("a release does not wait for a registration in flight");
    assert!(fake.live.lock().unwrap().is_empty(), "released");
    // The stale set now arrives and re-adopts lease 1; the gate, seeing a release raced it,
    // registers again without it.
    fake.go.notify_one();
    releasing.await.unwrap();
    // A hang guard only: the third registration comes at once, or (with no release racing
    // detected) never.
    tokio::time::timeout(std::time::Duration::from_secs(10), fake.third.notified())
        .await
        .expect("the gate registers again after a release raced its registration");
    let live = fake.live.lock().unwrap().clone();
    assert!(live.is_empty(), "lease left at the daemon: {live:?}");
}
