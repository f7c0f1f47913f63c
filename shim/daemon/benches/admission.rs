//! Admission latency of `mqfqd`, uncontended: one client, Admit then Release, N times, over the
//! real ttrpc socket to a daemon running on its own runtime (simulated GPU, D far from full).
//! Then admitted starts per second with 16 concurrent clients. Run: `scripts/bench-admission.sh`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mqfq_daemon::config::DaemonConfig;
use mqfq_proto::api;

fn req(i: usize) -> api::AdmitRequest {
    api::AdmitRequest {
        namespace: "bench".into(),
        container_id: format!("c{i}"),
        function: format!("f{}", i % 8),
        shim_pid: std::process::id(),
        ..Default::default()
    }
}

async fn pair(c: &api::AdmissionClient, i: usize) -> f64 {
    let t = Instant::now();
    let r = c
        .admit(ttrpc::context::with_timeout(0), &req(i))
        .await
        .expect("admit");
    let us = t.elapsed().as_secs_f64() * 1e6;
    c.release(
        ttrpc::context::with_timeout(0),
        &api::ReleaseRequest {
            lease_id: r.lease_id,
            service_ns: 1_000_000,
            ..Default::default()
        },
    )
    .await
    .expect("release");
    us
}

#[expect(clippy::cast_precision_loss, reason = "call counts")]
fn main() {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("d.sock");
    let cfg = DaemonConfig::parse(
        &format!(
            "socket = \"{}\"\nmetrics_addr = \"\"\nbackend = \"simulated\"\nrestart_grace_ms = 0\n\
             [simulated]\nutilization_per_lease = 0.01\n[nvidia]\nedits = false\n",
            sock.display()
        ),
        std::path::Path::new("bench.toml"),
    )
    .expect("config");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(mqfq_daemon::run(cfg, async {
            let _ = stop_rx.await;
        }))
        .expect("mqfqd");
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        let c = loop {
            if let Ok(c) = mqfq_daemon::ctl::connect(&sock).await {
                break c;
            }
            assert!(Instant::now() < deadline, "mqfqd did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        for i in 0..500 {
            pair(&c, i).await;
        }
        let mut lat = Vec::with_capacity(n);
        let t = Instant::now();
        for i in 0..n {
            lat.push(pair(&c, i).await);
        }
        let seq_rate = n as f64 / t.elapsed().as_secs_f64();
        let (p50, p99, max) = (mqfq_testkit::percentile(&mut lat, 0.5), mqfq_testkit::percentile(&mut lat, 0.99), mqfq_testkit::percentile(&mut lat, 1.0));
        println!("uncontended Admit (1 client, {n} calls): p50 {p50:.0} µs, p99 {p99:.0} µs, max {max:.0} µs");
        println!("sequential Admit+Release pairs: {seq_rate:.0} admitted starts/s");
        let c = Arc::new(c);
        let per = n / 16;
        let t = Instant::now();
        let tasks: Vec<_> = (0..16)
            .map(|k| {
                let c = c.clone();
                tokio::spawn(async move {
                    for i in 0..per {
                        pair(&c, 1_000_000 + k * per + i).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("client");
        }
        let rate = (per * 16) as f64 / t.elapsed().as_secs_f64();
        println!("16 concurrent clients (D up to 8): {rate:.0} admitted starts/s");
    });
    let _ = stop_tx.send(());
    let _ = daemon.join();
}
