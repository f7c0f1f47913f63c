//! The status socket (`status_socket`): what a reader such as the cluster publisher is given
//! answers Status and refuses everything that changes the node — no admission, release,
//! registration or pool report goes through it — while the admission socket is unchanged.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use mqfq_proto::api;

#[test]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the budget mqfqd computes, computed the same way"
)]
#[expect(
    clippy::too_many_lines,
    reason = "every write RPC refused, then what the socket still reads"
)]
fn the_status_socket_reads_and_never_writes() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let sock = dir.path().join("run/mqfqd.sock");
    let status_sock = dir.path().join("status/status.sock");
    let cfg = dir.path().join("mqfqd.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = \"{}\"\nstatus_socket = \"{}\"\nmetrics_addr = \"\"\nbackend = \"simulated\"\n\
             [nvidia]\nedits = false\n",
            sock.display(),
            status_sock.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("mqfqd.log");
    let child = common::serving(&cfg, &sock, &log, &[]);
    assert!(status_sock.exists());
    let mode = std::fs::metadata(&status_sock)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "root's alone, like the admission socket"
    );
    // mqfqctl reads the node through it.
    let o = Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .arg("--socket")
        .arg(&status_sock)
        .args(["status", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["backend"], "simulated");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = || ttrpc::context::with_timeout(5_000_000_000);
        let ro = mqfq_daemon::ctl::connect(&status_sock).await.unwrap();
        let admit = api::AdmitRequest {
            namespace: "t".into(),
            container_id: "c1".into(),
            function: "f".into(),
            shim_pid: std::process::id(),
            ..Default::default()
        };
        let refused = |r: Result<(), ttrpc::Error>, what: &str| {
            let e = r.expect_err(what).to_string();
            assert!(e.contains("not supported"), "{what}: {e}");
        };
        refused(ro.admit(ctx(), &admit).await.map(|_| ()), "admit");
        refused(
            ro.release(
                ctx(),
                &api::ReleaseRequest {
                    lease_id: 1,
                    ..Default::default()
                },
            )
            .await
            .map(|_| ()),
            "release",
        );
        refused(
            ro.register(ctx(), &api::RegisterRequest::default())
                .await
                .map(|_| ()),
            "register",
        );
        refused(
            ro.cancel(ctx(), &api::CancelRequest::default())
                .await
                .map(|_| ()),
            "cancel",
        );
        refused(
            ro.pool_report(ctx(), &api::PoolReportRequest::default())
                .await
                .map(|_| ()),
            "pool report",
        );
        refused(ro.place(ctx(), &admit).await.map(|_| ()), "place");
        // Nothing was admitted through it; the admission socket still admits, and the
        // status socket shows the lease.
        let rw = mqfq_daemon::ctl::connect(&sock).await.unwrap();
        let lease = rw.admit(ctx(), &admit).await.unwrap().lease_id;
        let s = ro
            .status(ctx(), &api::StatusRequest::default())
            .await
            .unwrap();
        assert_eq!(s.leases.len(), 1);
        assert_eq!(s.leases[0].lease_id, lease);
        // Memory admission charges the lease the default footprint (nothing measured yet)
        // against the simulated 80 GiB less the pool's 15 % headroom; `f` is short until
        // measured (the fallback charge), so room for another of its calls is kept.
        let g = &s.gpus[0];
        assert_eq!(g.memory_held, 4096 << 20);
        assert_eq!(
            g.memory_budget,
            (80.0 * 0.85 * f64::from(1u32 << 30)) as u64
        );
        assert!(!g.memory_blocked);
        let text = mqfq_daemon::ctl::render(&s);
        assert!(
            text.contains("admitted memory GiB: held 4.0, reserved 4.0, free 60.0 of 68.0"),
            "{text}"
        );
        // mqfqd's defaults: no late binding, Warm by UVM.
        assert!((!s.late_binding, s.warm.as_str()) == (true, "uvm"), "{s:?}");
        assert!(text.contains("· warm by uvm ·"), "{text}");
    });
    common::stop(child);
    assert!(!status_sock.exists(), "removed at a clean stop");
}
