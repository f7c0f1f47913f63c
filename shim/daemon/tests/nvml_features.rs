//! A function's features from NVML's per-process samples (issue 17), through the real NVML
//! backend against the CPU-only double: `mqfqd` reads each GPU's process samples, and a burst
//! released with its processes' PIDs is classified by what those processes did — one
//! function's process reads memory-bound, another's compute-bound, on the same GPU at the same
//! time. Then critical Xid events: one that says the GPU is failing takes it out of placement
//! for a while, an application's does not. Apart from `nvml.rs` because the double reads the
//! process environment.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mqfq_proto::api;
use serde_json::Value;

use common::status;

/// Lines in the double's call log.
fn calls(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// mqfqd on the NVML double `lib` (D starting at 4, sampling every 20 ms, then `extra` TOML
/// tables) with `env`, in `dir`: the process, its socket and its log.
fn on_double(
    dir: &Path,
    lib: &Path,
    extra: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> (std::process::Child, std::path::PathBuf, std::path::PathBuf) {
    let (cfg, sock) = common::write_config(
        dir,
        &format!(
            "metrics_addr = \"\"\nbackend = \"nvml\"\nnvml_library = \"{}\"\n\
             mps_pipe_dir = \"/nonexistent-mps\"\nsample_interval_ms = 20\n\
             [concurrency]\nd_initial = 4\n[nvidia]\nedits = false\n{extra}",
            lib.display()
        ),
    );
    let log = dir.join("mqfqd.log");
    let child = common::serving(&cfg, &sock, &log, env);
    (child, sock, log)
}

/// Admits a burst of `function` (container `id`).
async fn admit(c: &api::AdmissionClient, function: &str, id: &str) -> u64 {
    admit_as(c, function, id, false).await
}

/// Admits a burst of `function` (container `id`, its memory pooled or not).
async fn admit_as(c: &api::AdmissionClient, function: &str, id: &str, pooled: bool) -> u64 {
    c.admit(
        ttrpc::context::with_timeout(5_000_000_000),
        &api::AdmitRequest {
            namespace: "t".into(),
            container_id: id.into(),
            function: function.into(),
            kind: api::Kind::BURST.into(),
            shim_pid: std::process::id(),
            pooled,
            ..Default::default()
        },
    )
    .await
    .unwrap()
    .lease_id
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "process samples, then Xids, each through a daemon on the double"
)]
fn nvml_process_samples_and_xids_drive_placement() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let Some(lib) = common::nvml_double(dir.path()) else {
        return;
    };
    // Process 4242 streams memory (80 % bandwidth, 10 % SM); 5151 computes (90 % SM).
    let procs = dir.path().join("processes");
    std::fs::write(&procs, "0 4242 10 80\n0 5151 90 5\n").unwrap();
    let proc_calls = dir.path().join("proc-calls");
    let (child, sock, log) = on_double(
        dir.path(),
        &lib,
        "[placement]\nenabled = true\nprobe_runs = 2\n",
        &[
            ("FAKE_NVML_GPUS", "1".as_ref()),
            ("FAKE_NVML_PROCESSES", procs.as_os_str()),
            ("FAKE_NVML_PROC_CALLS", proc_calls.as_os_str()),
        ],
    );
    let cfg = dir.path().join("mqfqd.toml");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = mqfq_daemon::ctl::connect(&sock).await.unwrap();
        for round in 0..2 {
            for (function, pid) in [("etl", 4242), ("dense", 5151), ("blind", 0)] {
                let id = format!("{function}-{round}");
                let lease_id = admit(&c, function, &id).await;
                // Two reads of the process samples after the grant: at least one lies
                // inside the lease.
                let before = calls(&proc_calls);
                let deadline = Instant::now() + Duration::from_secs(30);
                while calls(&proc_calls) < before + 2 {
                    assert!(
                        Instant::now() < deadline,
                        "the daemon never read the samples"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                c.release(
                    ttrpc::context::with_timeout(5_000_000_000),
                    &api::ReleaseRequest {
                        lease_id,
                        service_ns: 50_000_000,
                        reason: "idle".into(),
                        transfer_bytes: Some(1 << 20),
                        // A burst whose shim knew no process: its time alone is learned.
                        pids: if pid == 0 { Vec::new() } else { vec![pid] },
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            }
        }
        // Held leases keep each function's flow in the status.
        for f in ["etl", "dense", "blind"] {
            admit(&c, f, &format!("{f}-held")).await;
        }
    });
    let s = status(&sock).unwrap();
    let flow = |name: &str| {
        s["flows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["function"].as_str().is_some_and(|k| k.ends_with(name)))
            .cloned()
            .unwrap_or_else(|| panic!("no flow {name}: {s}"))
    };
    let (etl, dense, blind) = (flow("etl"), flow("dense"), flow("blind"));
    assert_eq!(etl["class"], "memory-short", "{s}");
    assert_eq!(dense["class"], "compute-short", "{s}");
    // Its shim named no process: what NVML saw of others is not its.
    assert_eq!(blind["class"], "compute-short", "{s}");
    // Each burst averages the samples of its lease (how many depends on when NVML was read).
    let near = |v: &Value, want: f64| v.as_f64().is_some_and(|x| (x - want).abs() < 1e-9);
    assert!(
        near(&etl["sm_share"], 0.1) && near(&etl["dram_share"], 0.8),
        "{etl}"
    );
    assert!(
        near(&dense["sm_share"], 0.9) && near(&dense["dram_share"], 0.05),
        "{dense}"
    );
    assert_eq!(
        (&blind["sm_share"], &blind["dram_share"]),
        (&Value::Null, &Value::Null)
    );
    for f in [&etl, &dense, &blind] {
        assert_eq!(f["transfer_bytes"], 1_048_576.0, "{f}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .arg("--socket")
        .arg(&sock)
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("etl: memory-short, SM 10 %, DRAM 80 %, 1.0 MiB copied a burst"),
        "{text}"
    );
    common::stop(child);

    // Critical Xids: an application's (13) leaves its GPU alone; one that says the GPU is
    // failing (79, fallen off the bus) fails it for new containers until it has been clean
    // for `xid_recover_samples`.
    let xids = dir.path().join("xids");
    std::fs::write(&xids, "").unwrap();
    std::fs::write(
        &cfg,
        std::fs::read_to_string(&cfg).unwrap().replace(
            "probe_runs = 2\n",
            "probe_runs = 2\nrecover_samples = 1\nxid_recover_samples = 150\n",
        ),
    )
    .unwrap();
    let child = common::serving(
        &cfg,
        &sock,
        &log,
        &[
            ("FAKE_NVML_GPUS", "2".as_ref()),
            ("FAKE_NVML_XID", xids.as_os_str()),
        ],
    );
    let health = |want: [&str; 2]| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = status(&sock)
                && s["gpus"][0]["health"] == want[0]
                && s["gpus"][1]["health"] == want[1]
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "never {want:?}: {:?}\n{}",
                status(&sock),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    health(["healthy", "healthy"]);
    // Delivered in order: once GPU 0's 79 has failed it, GPU 1's 13 was read before.
    std::fs::write(&xids, "1 13\n0 79\n").unwrap();
    let s = health(["failed", "healthy"]);
    assert_eq!(
        s["gpus"][1]["health"], "healthy",
        "an application's Xid failed its GPU"
    );
    // Back once clean for 150 samples (3 s at 20 ms).
    health(["healthy", "healthy"]);
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(log_text.contains("critical Xid"), "{log_text}");
    common::stop(child);
}

/// Xids reach `mqfq_gpu_xid` with placement off too: an operator alerts on them whatever
/// mqfqd does with them.
#[test]
fn xids_are_counted_with_placement_off() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let Some(lib) = common::nvml_double(dir.path()) else {
        return;
    };
    let xids = dir.path().join("xids");
    std::fs::write(&xids, "").unwrap();
    let addr = mqfq_testkit::free_metrics_addr();
    let (cfg, sock) = common::write_config(
        dir.path(),
        &format!(
            "metrics_addr = \"{addr}\"\nbackend = \"nvml\"\nnvml_library = \"{}\"\n\
             mps_pipe_dir = \"/nonexistent-mps\"\nsample_interval_ms = 20\n[nvidia]\nedits = false\n",
            lib.display()
        ),
    );
    let log = dir.path().join("mqfqd.log");
    let child = common::serving(
        &cfg,
        &sock,
        &log,
        &[
            ("FAKE_NVML_GPUS", "1".as_ref()),
            ("FAKE_NVML_XID", xids.as_os_str()),
        ],
    );
    std::fs::write(&xids, "0 79\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = mqfq_testkit::scrape(&addr);
        if m.lines().any(|l| {
            l.starts_with("mqfq_gpu_xid_total{") && l.contains("xid=\"79\"") && l.ends_with(" 1")
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "no Xid 79 counted:\n{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
    common::stop(child);
}

/// What a pooled container's processes hold on the GPU as NVML measures it (their CUDA contexts
/// too, which their own reports leave out) is its function's footprint: a burst released with
/// its processes' PIDs is charged what NVML lists for those PIDs on its GPU, not what its shim
/// reported, and another process's memory on the same GPU is not its.
#[test]
fn nvml_per_process_memory_is_a_pooled_function_s_footprint() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let Some(lib) = common::nvml_double(dir.path()) else {
        return;
    };
    // The burst's processes 4242 and 4343 hold 6 + 2 GiB; 999 is another container's.
    let held = dir.path().join("held");
    std::fs::write(&held, "0 4242 6144\n0 4343 2048\n0 999 8192\n").unwrap();
    let held_calls = dir.path().join("held-calls");
    // 8 GiB of the double's 16 in use: a report up to that is believed.
    let util = dir.path().join("util");
    std::fs::write(&util, "50\n").unwrap();
    let (child, sock, _) = on_double(
        dir.path(),
        &lib,
        "",
        &[
            ("FAKE_NVML_GPUS", "1".as_ref()),
            ("FAKE_NVML_HELD", held.as_os_str()),
            ("FAKE_NVML_HELD_CALLS", held_calls.as_os_str()),
            ("FAKE_NVML_UTIL", util.as_os_str()),
        ],
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let gib = 1u64 << 30;
    rt.block_on(async {
        let c = mqfq_daemon::ctl::connect(&sock).await.unwrap();
        let lease_id = admit_as(&c, "f", "a", true).await;
        // A sample read after the grant: the release below finds its processes in it.
        let before = calls(&held_calls);
        let deadline = Instant::now() + Duration::from_secs(30);
        // Two reads: the double logs a read before mqfqd keeps it.
        while calls(&held_calls) < before + 2 {
            assert!(Instant::now() < deadline, "the daemon never read NVML");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        c.release(
            ttrpc::context::with_timeout(5_000_000_000),
            &api::ReleaseRequest {
                lease_id,
                service_ns: 50_000_000,
                reason: "idle".into(),
                managed_bytes: gib,
                native: Some(api::NativeMemory::default()).into(),
                pids: vec![4242, 4343, 4242],
                ..Default::default()
            },
        )
        .await
        .unwrap();
        // The next call of f is charged the 8 GiB measured, not the 1 GiB reported.
        admit_as(&c, "f", "b", true).await;
    });
    let s = status(&sock).unwrap();
    let entry = s["pool"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["container_id"] == "a")
        .cloned()
        .unwrap_or_else(|| panic!("a not pooled: {s}"));
    assert_eq!(
        (&entry["bytes"], &entry["resident"]),
        (&gib.into(), &(8 * gib).into()),
        "{entry}"
    );
    assert_eq!(s["gpus"][0]["memory_held"], 8 * gib, "{s}");
    let o = Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .arg("--socket")
        .arg(&sock)
        .arg("status")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("ON GPU MiB"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("t/a ") && l.contains(" 1024.0     8192.0 ")),
        "{text}"
    );
    common::stop(child);
}
