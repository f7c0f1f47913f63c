//! The real NVML backend (nvml-wrapper) against the CPU-only `libnvidia-ml.so.1` double built
//! from `tests/doubles/nvml.c`: the library API, then `mqfqd` with `backend = "nvml"` turning
//! utilization into D. One test, because the double reads the process environment.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mqfq_daemon::monitor::{GpuMonitor, NvmlGpus};
use scheduler_core::GpuMode;
use serde_json::Value;

fn status(sock: &Path) -> Option<Value> {
    let o = Command::new(env!("CARGO_BIN_EXE_mqfqctl"))
        .arg("--socket")
        .arg(sock)
        .args(["status", "--json"])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).ok())?
}

/// Starts mqfqd on `cfg` with `env`, stderr to `log`, and waits until it answers on `sock`.
fn serving(
    cfg: &Path,
    sock: &Path,
    log: &Path,
    env: &[(&str, &std::ffi::OsStr)],
) -> std::process::Child {
    let child = Command::new(env!("CARGO_BIN_EXE_mqfqd"))
        .arg("--config")
        .arg(cfg)
        .envs(env.iter().copied())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(sock).is_none() {
        assert!(
            Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// SIGTERM (a clean stop), then reap.
fn stop(mut child: std::process::Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();
}

#[test]
fn nvml_backend_reads_the_double_and_drives_d() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let lib = match mqfq_testkit::build_double("nvml", dir.path()) {
        Ok(l) => l,
        Err(e) if std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_some() => panic!("{e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
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
    assert_eq!(d[0].name, "Fake NVML GPU 0");
    assert_eq!(d[0].memory_total, 16 << 30);
    assert_eq!((d[0].mode, d[1].mode), (GpuMode::Plain, GpuMode::Mig));
    let s = m.sample(&[]).unwrap();
    assert!((s[0].utilization - 0.37).abs() < 1e-9);
    assert_eq!(s[0].memory_used, 37 * ((16u64 << 30) / 100));
    assert_eq!(
        (s[0].pcie_tx_kbps, s[0].pcie_rx_kbps),
        (Some(1000), Some(2000))
    );
    assert_eq!(s[0].power_mw, Some(50000 + 2500 * 37));
    // An MPS control pipe puts whole GPUs in MPS mode.
    let mps = dir.path().join("mps");
    std::fs::create_dir_all(&mps).unwrap();
    std::fs::write(mps.join("control"), "").unwrap();
    let mut m2 = NvmlGpus::open(lib_s, &mps).unwrap();
    assert_eq!(m2.devices().unwrap()[0].mode, GpuMode::Mps);
    drop((m, m2));

    // The daemon on the double: GPU 0 busy → D falls; GPU 1 is a MIG GPU → D stays at 1.
    std::fs::write(&util, "100\n0\n").unwrap();
    let sock = dir.path().join("d.sock");
    let cfg = dir.path().join("mqfqd.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = \"{}\"\nmetrics_addr = \"\"\nbackend = \"nvml\"\nnvml_library = \"{lib_s}\"\n\
             mps_pipe_dir = \"/nonexistent-mps\"\n[concurrency]\nd_initial = 4\n\
             [nvidia]\nedits = false\n",
            sock.display()
        ),
    )
    .unwrap();
    let persist = dir.path().join("persist");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mqfqd"))
        .arg("--config")
        .arg(&cfg)
        .env("FAKE_NVML_PERSIST", &persist)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        if let Some(s) = status(&sock)
            && s["gpus"][0]["d"].as_f64().unwrap_or(9.0) < 3.0
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "D never fell: {:?}",
            status(&sock)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(s["backend"], "nvml");
    assert_eq!(s["gpus"][0]["utilization"], 1.0);
    assert_eq!(s["gpus"][1]["mode"], "mig");
    assert_eq!(s["gpus"][1]["d"], 1.0);
    // The warm driver: persistence mode asked for on both GPUs.
    assert_eq!(std::fs::read_to_string(&persist).unwrap(), "0 1\n1 1\n");
    // Idle again: D climbs past where it started.
    std::fs::write(&util, "0\n0\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(&sock)
        .and_then(|s| s["gpus"][0]["d"].as_f64())
        .unwrap_or(0.0)
        <= 4.0
    {
        assert!(
            Instant::now() < deadline,
            "D never rose: {:?}",
            status(&sock)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let _ = child.wait();

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
