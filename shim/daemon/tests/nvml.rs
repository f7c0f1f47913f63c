//! The real NVML backend (nvml-wrapper) against the CPU-only `libnvidia-ml.so.1` double built
//! from `tests/doubles/nvml.c`: the library API (GPM included), then `mqfqd` with
//! `backend = "nvml"`: busy-time alone never moves D; SM activity under the target and
//! admissions that keep their speed raise it. One test, because the double reads the process
//! environment.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mqfq_daemon::monitor::{GpuMonitor, NvmlGpus};
use mqfq_proto::api;
use scheduler_core::GpuMode;
use serde_json::Value;

use common::{serving, status, stop};

/// Admits as many admissions as the limit lets run, ends them all after the same service, and
/// lets a few samples pass; again until D exceeds `d`. Returns the status then.
async fn rounds_until_d_exceeds(sock: &Path, d: f64) -> Value {
    let c = mqfq_daemon::ctl::connect(sock).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0u32;
    loop {
        let s = status(sock).unwrap();
        if s["gpus"][0]["d"].as_f64().unwrap() > d {
            return s;
        }
        assert!(Instant::now() < deadline, "D never rose: {s}");
        let limit = s["gpus"][0]["limit"].as_u64().unwrap();
        let mut leases = Vec::new();
        for _ in 0..limit {
            n += 1;
            let r = c
                .admit(
                    ttrpc::context::with_timeout(5_000_000_000),
                    &api::AdmitRequest {
                        namespace: "t".into(),
                        container_id: format!("c{n}"),
                        function: "f".into(),
                        shim_pid: std::process::id(),
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            leases.push(r.lease_id);
        }
        // Held longer than the service reported (mqfqd clamps a report to the time held).
        tokio::time::sleep(Duration::from_millis(60)).await;
        for lease_id in leases {
            c.release(
                ttrpc::context::with_timeout(5_000_000_000),
                &api::ReleaseRequest {
                    lease_id,
                    service_ns: 50_000_000,
                    reason: "idle".into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "the NVML double through backend then daemon, one feature at a time"
)]
fn nvml_backend_reads_the_double_and_drives_d() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let Some(lib) = common::nvml_double(dir.path()) else {
        return;
    };
    let util = dir.path().join("util");
    std::fs::write(&util, "37\n0\n").unwrap();
    // SAFETY: this test binary has this one test, and it sets the environment before any
    // other thread reads it.
    unsafe {
        std::env::set_var("FAKE_NVML_GPUS", "2");
        std::env::set_var("FAKE_NVML_UTIL", &util);
        std::env::set_var("FAKE_NVML_MIG", "1");
    }
    let lib_s = lib.to_str().unwrap();
    let mut m = NvmlGpus::open(lib_s, Path::new("/nonexistent-mps")).unwrap();
    assert_eq!(m.backend(), "nvml");
    let d = m.devices().unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(d[0].uuid, "GPU-fa4e0000-0000-4000-8000-000000000000");
    assert_eq!(d[0].name, "Fake NVML GPU");
    assert_eq!(d[0].memory_total, 16 << 30);
    assert_eq!((d[0].mode, d[1].mode), (GpuMode::Plain, GpuMode::Mig));
    let s = m.sample(&[]).unwrap();
    assert!((s[0].busy.unwrap() - 0.37).abs() < 1e-9);
    assert_eq!(s[0].sm_activity, None, "no GPM on this double until asked");
    assert_eq!(s[0].memory_used, 37 * ((16u64 << 30) / 100));
    assert_eq!(
        (s[0].pcie_tx_kbps, s[0].pcie_rx_kbps),
        (Some(1000), Some(2000))
    );
    assert_eq!(s[0].power_mw, Some(50000 + 2500 * 37));
    assert_eq!(s[0].power_limit_mw, Some(300_000));
    assert!(s[0].xids.is_empty() && s[0].processes.is_empty());
    // A GPU fallen off the bus is that GPU's failed sample, not the node's failure.
    let lost = dir.path().join("lost");
    std::fs::write(&lost, "1\n").unwrap();
    // SAFETY: as above, no other thread reads the environment.
    unsafe { std::env::set_var("FAKE_NVML_LOST", &lost) };
    let s = m.sample(&[]).unwrap();
    assert!(!s[0].failed && s[1].failed, "{s:?}");
    assert_eq!((s[1].busy, s[1].memory_used), (None, 0));
    // SAFETY: as above.
    unsafe { std::env::remove_var("FAKE_NVML_LOST") };
    // An MPS control pipe puts whole GPUs in MPS mode.
    let mps = dir.path().join("mps");
    std::fs::create_dir_all(&mps).unwrap();
    std::fs::write(mps.join("control"), "").unwrap();
    let mut m2 = NvmlGpus::open(lib_s, &mps).unwrap();
    assert_eq!(m2.devices().unwrap()[0].mode, GpuMode::Mps);
    drop((m, m2));

    // GPM: one new sample per GPU per period, metrics against the previous one; PCIe rates
    // from GPM instead of NVML's blocking counters.
    let sm = dir.path().join("sm");
    std::fs::write(
        &sm, "30
55
",
    )
    .unwrap();
    let dram = dir.path().join("dram");
    std::fs::write(
        &dram, "12
0
",
    )
    .unwrap();
    let calls = dir.path().join("gpm-calls");
    // SAFETY: as above, no other thread reads the environment.
    unsafe {
        std::env::set_var("FAKE_NVML_GPM", "1");
        std::env::set_var("FAKE_NVML_SM", &sm);
        std::env::set_var("FAKE_NVML_DRAM", &dram);
        std::env::set_var("FAKE_NVML_GPM_CALLS", &calls);
    }
    let mut g = NvmlGpus::open(lib_s, Path::new("/nonexistent-mps")).unwrap();
    let first = g.sample(&[]).unwrap();
    assert_eq!(first[0].sm_activity, None, "a period needs two samples");
    // NVML wants them more than 100 ms apart.
    std::thread::sleep(Duration::from_millis(160));
    let second = g.sample(&[]).unwrap();
    assert_eq!(second[0].sm_activity, Some(0.30));
    assert_eq!(second[1].sm_activity, Some(0.55));
    assert_eq!(second[0].dram_bandwidth, Some(0.12));
    assert_eq!(
        (second[0].pcie_tx_kbps, second[0].pcie_rx_kbps),
        (Some(976), Some(1953)),
        "1e6 and 2e6 B/s from GPM"
    );
    assert!((second[0].busy.unwrap() - 0.37).abs() < 1e-9);
    // Sampled again at once: the period's reading stands, no new GPM sample is taken.
    let third = g.sample(&[]).unwrap();
    assert_eq!(third[0].sm_activity, Some(0.30));
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap(),
        "0\n1\n0\n1\n",
        "one GPM sample per GPU per period"
    );
    drop(g);
    // SAFETY: as above.
    unsafe {
        std::env::remove_var("FAKE_NVML_GPM");
        std::env::remove_var("FAKE_NVML_GPM_CALLS");
    }

    // The daemon on the double: GPU 0 reads 100 % busy, which never cuts D (and, at or above u_target, never grows it); GPU 1 is
    // a MIG GPU, so D stays at 1.
    std::fs::write(&util, "100\n0\n").unwrap();
    let sock = dir.path().join("d.sock");
    let cfg = dir.path().join("mqfqd.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = \"{}\"\nmetrics_addr = \"\"\nbackend = \"nvml\"\nnvml_library = \"{lib_s}\"\n\
             mps_pipe_dir = \"/nonexistent-mps\"\nsample_interval_ms = 20\n\
             [concurrency]\nd_initial = 4\n[nvidia]\nedits = false\n",
            sock.display()
        ),
    )
    .unwrap();
    let persist = dir.path().join("persist");
    let log = dir.path().join("mqfqd.log");
    let child = serving(
        &cfg,
        &sock,
        &log,
        &[("FAKE_NVML_PERSIST", persist.as_os_str())],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        if let Some(s) = status(&sock)
            && s["gpus"][0]["utilization"].as_f64() == Some(1.0)
        {
            break s;
        }
        assert!(Instant::now() < deadline, "no sample: {:?}", status(&sock));
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(s["backend"], "nvml");
    assert_eq!(s["gpus"][0]["d"], 4.0, "busy-time alone moved D: {s}");
    assert_eq!(s["gpus"][0]["sm_activity"], Value::Null, "no GPM here");
    assert_eq!(s["gpus"][1]["mode"], "mig");
    assert_eq!(s["gpus"][1]["d"], 1.0);
    // The warm driver: persistence mode asked for on both GPUs.
    assert_eq!(std::fs::read_to_string(&persist).unwrap(), "0 1\n1 1\n");
    stop(child);

    // With GPM: busy-time 100 %, SM activity 30 %, and admissions that keep their solo speed:
    // D rises from 1.
    let cfg_gpm = dir.path().join("mqfqd-gpm.toml");
    std::fs::write(
        &cfg_gpm,
        std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("d_initial = 4", "d_initial = 1"),
    )
    .unwrap();
    let child = serving(
        &cfg_gpm,
        &sock,
        &log,
        &[
            ("FAKE_NVML_GPM", "1".as_ref()),
            ("FAKE_NVML_GPUS", "1".as_ref()),
        ],
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(rounds_until_d_exceeds(&sock, 2.0));
    assert_eq!(s["gpus"][0]["utilization"], 1.0);
    assert_eq!(s["gpus"][0]["sm_activity"], 0.3);
    stop(child);

    // Placement on: a GPU NVML loses is failed for new containers (status, Place) until it
    // has been read cleanly `recover_samples` times; its last memory figure stands meanwhile.
    let cfg_place = dir.path().join("mqfqd-place.toml");
    std::fs::write(
        &cfg_place,
        format!(
            "{}[placement]\nenabled = true\nrecover_samples = 5\n",
            std::fs::read_to_string(&cfg).unwrap()
        ),
    )
    .unwrap();
    std::fs::write(&lost, "").unwrap();
    std::fs::write(&util, "10\n20\n").unwrap();
    let child = serving(
        &cfg_place,
        &sock,
        &log,
        &[
            ("FAKE_NVML_LOST", lost.as_os_str()),
            ("FAKE_NVML_MIG", "9".as_ref()),
        ],
    );
    let health = |want: [&str; 2]| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = status(&sock).unwrap();
            if s["gpus"][0]["health"] == want[0] && s["gpus"][1]["health"] == want[1] {
                return s;
            }
            assert!(Instant::now() < deadline, "never {want:?}: {s}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let s = health(["healthy", "healthy"]);
    let memory = s["gpus"][1]["memory_used"].clone();
    std::fs::write(&lost, "1\n").unwrap();
    let s = health(["healthy", "failed"]);
    assert_eq!(s["gpus"][1]["memory_used"], memory, "last figure kept");
    let place_with = |function: &str, partners: Vec<String>| {
        rt.block_on(async {
            let c = mqfq_daemon::ctl::connect(&sock).await.unwrap();
            c.place(
                ttrpc::context::with_timeout(5_000_000_000),
                &api::AdmitRequest {
                    namespace: "t".into(),
                    container_id: "p".into(),
                    function: function.into(),
                    partners,
                    shim_pid: std::process::id(),
                    ..Default::default()
                },
            )
            .await
        })
    };
    let place = |function: &str| place_with(function, Vec::new());
    for f in ["a", "b", "c"] {
        assert_eq!(place(f).unwrap().device, "0", "only GPU 0 is healthy");
    }
    let e = place("not a function name").unwrap_err();
    assert!(e.to_string().contains("function"), "{e}");
    let e = place_with("f", (0..9).map(|i| format!("p{i}")).collect()).unwrap_err();
    assert!(e.to_string().contains("partners"), "{e}");
    std::fs::write(&lost, "").unwrap();
    health(["healthy", "healthy"]);
    // Both usable again: the three placements just made count on GPU 0 for a while.
    assert_eq!(place("d").unwrap().device, "1");
    stop(child);

    // Persistence mode refused: the daemon holds each GPU's primary CUDA context instead (through
    // the libcuda double), and releases them when it stops.
    let cuda = mqfq_testkit::build_double("cuda", dir.path()).unwrap();
    let cuda_log = dir.path().join("cuda.log");
    let cfg2 = dir.path().join("mqfqd2.toml");
    let base = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg2,
        base.replace(
            "[nvidia]\nedits = false\n",
            &format!(
                "[nvidia]\nedits = false\ncuda_library = \"{}\"\n",
                cuda.display()
            ),
        ),
    )
    .unwrap();
    let stderr = dir.path().join("mqfqd2.log");
    let child = serving(
        &cfg2,
        &sock,
        &stderr,
        &[
            ("FAKE_NVML_PERSIST_DENY", "1".as_ref()),
            ("FAKE_CUDA_GPUS", "2".as_ref()),
            ("FAKE_CUDA_LOG", cuda_log.as_os_str()),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(&cuda_log).unwrap(),
        "cuInit -1\nretain 0\nretain 1\n"
    );
    stop(child);
    assert!(
        std::fs::read_to_string(&cuda_log)
            .unwrap()
            .ends_with("release 0\nrelease 1\n"),
        "contexts released at stop"
    );
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        log.contains("holding the primary CUDA context of 2 GPUs"),
        "{log}"
    );

    // No libcuda either: a logged state, and the daemon serves on.
    std::fs::write(
        &cfg2,
        base.replace(
            "[nvidia]\nedits = false\n",
            "[nvidia]\nedits = false\ncuda_library = \"/nonexistent/libcuda.so.1\"\n",
        ),
    )
    .unwrap();
    stop(serving(
        &cfg2,
        &sock,
        &stderr,
        &[("FAKE_NVML_PERSIST_DENY", "1".as_ref())],
    ));
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(
        log.contains("/nonexistent/libcuda.so.1") && log.contains("may pay driver initialization"),
        "{log}"
    );

    // A driver that is not loaded is an error at startup that says so, not a panic.
    let o = Command::new(env!("CARGO_BIN_EXE_mqfqd"))
        .arg("--config")
        .arg(&cfg)
        .env("FAKE_NVML_FAIL", "1")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("NVML init"), "{err}");
}
