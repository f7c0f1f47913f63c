//! The daemon's configuration: defaults, the packaged example, and every bad key or value named.

use super::*;

fn parse(t: &str) -> Result<DaemonConfig, ConfigFileError> {
    DaemonConfig::parse(t, Path::new("mqfqd.toml"))
}

#[test]
fn empty_file_is_the_documented_defaults() {
    let c = parse("").unwrap();
    assert_eq!(c, DaemonConfig::default());
    assert_eq!(c.socket, Path::new(DEFAULT_SOCKET));
    assert_eq!(c.concurrency_config(GpuMode::Plain).unwrap().d_max, 8);
    assert_eq!(c.concurrency_config(GpuMode::Mig).unwrap().d_max, 1);
}

#[test]
fn the_packaged_example_is_the_defaults() {
    let text = include_str!("../../../../packaging/mqfqd.toml");
    assert_eq!(parse(text).unwrap(), DaemonConfig::default());
}

#[test]
fn the_packaged_unit_is_hardened_and_valid() {
    let unit = include_str!("../../../../packaging/systemd/mqfqd.service");
    for want in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "RuntimeDirectoryMode=0700",
        "UMask=0077",
        "LimitNOFILE=",
        "MemoryMax=",
        "CapabilityBoundingSet=",
        "KillMode=process",
    ] {
        assert!(unit.lines().any(|l| l.starts_with(want)), "{want} missing");
    }
    // systemd's own check of the file: its exit status and what it says of the unit. Where
    // systemd is not installed the check is skipped, except in CI (scripts/test.sh), where a
    // missing prerequisite fails.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mqfqd.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/mqfqd", "/bin/true")).unwrap();
    match std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
    {
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "systemd-analyze verify failed: {err}");
            let bad: Vec<&str> = err
                .lines()
                .filter(|l| l.contains("mqfqd.service"))
                .collect();
            assert!(bad.is_empty(), "{err}");
        }
        Err(e) => {
            assert!(
                std::env::var("MQFQ_REQUIRE_CONTAINERD").as_deref() != Ok("1"),
                "systemd-analyze cannot run ({e}): CI needs systemd"
            );
            eprintln!("SKIPPED: systemd-analyze cannot run: {e}");
        }
    }
}

#[test]
fn overrides_reach_the_knobs() {
    let c = parse(
        "profile = \"light\"\n[queue]\noverrun_s = 0.5\n[concurrency]\nd_max = 2\nd_initial = 2\n",
    )
    .unwrap();
    let q = c.queue_config().unwrap();
    assert_eq!(q.overrun, scheduler_core::config::Overrun::Fixed(0.5));
    let k = c.concurrency_config(GpuMode::Plain).unwrap();
    assert_eq!((k.d_max, k.d_initial, k.alpha), (2, 2.0, 0.1));
}

#[test]
fn memory_admission_is_on_by_default_with_the_pool_s_headroom() {
    let m = parse("[pool]\nheadroom = 0.2")
        .unwrap()
        .memory_admission()
        .unwrap();
    let m = m.expect("on by default");
    assert_eq!(m.headroom, 0.2);
    assert_eq!(m.default_footprint, 4096 << 20);
    let m = parse("[queue]\ndefault_footprint_mb = 512").unwrap();
    assert_eq!(
        m.memory_admission().unwrap().unwrap().default_footprint,
        512 << 20
    );
    let off = parse("[queue]\nmemory_admission = false").unwrap();
    assert_eq!(off.memory_admission().unwrap(), None);
}

#[test]
fn policy_fcfs_is_fifo_without_the_reserve_on_the_same_d() {
    let ours = parse("").unwrap();
    let fcfs = parse("policy = \"fcfs\"").unwrap();
    let q = fcfs.queue_config().unwrap();
    assert_eq!(q.selection, scheduler_core::config::Selection::Fifo);
    assert_eq!(q.short_charge_s, 0.0);
    assert_eq!(
        GrantOrder::of(&ours.queue_config().unwrap()),
        GrantOrder::MqfqSticky
    );
    assert_eq!(
        fcfs.concurrency_config(GpuMode::Plain).unwrap(),
        ours.concurrency_config(GpuMode::Plain).unwrap()
    );
}

#[test]
fn every_bad_key_or_value_is_named() {
    let cases = [
        ("sockt = \"/x\"", "sockt"),
        ("profile = \"fast\"", "profile"),
        ("policy = \"sjf\"", "policy"),
        (
            "policy = \"fcfs\"\n[queue]\nshort_charge_s = 1",
            "short_charge_s",
        ),
        ("sample_interval_ms = 500", "sample_interval_ms"),
        ("metrics_addr = \"nowhere\"", "metrics_addr"),
        ("[queue]\noverrun_s = -1", "overrun_s"),
        ("[queue]\nttl = 1", "ttl"),
        ("[concurrency]\nalpha = 7", "alpha"),
        ("[concurrency]\nd_initial = 99", "d_initial"),
        ("[simulated]\ngpus = 0", "simulated.gpus"),
        ("[simulated]\nmode = \"vgpu\"", "simulated.mode"),
        ("[simulated]\nmemory_mib = 0", "simulated.memory_mib"),
        (
            "[simulated]\nmemory_gib = 8\nmemory_mib = 64",
            "simulated.memory_mib",
        ),
        ("[simulated]\nmemory_gib = 0", "simulated.memory_gib"),
        ("backend = \"cuda\"", "backend"),
        (
            "[nvidia]\nrefresh_interval_ms = 5",
            "nvidia.refresh_interval_ms",
        ),
        ("[nvidia]\ndriver = \"/\"", "driver"),
        ("sample_interval_ms = \"fast\"", "sample_interval_ms"),
        ("[pool]\nheadroom = 1.5", "pool.headroom"),
        (
            "[queue]\ndefault_footprint_mb = 0",
            "queue.default_footprint_mb",
        ),
        (
            "[queue]\ndefault_footprint_mb = 2000000",
            "queue.default_footprint_mb",
        ),
        ("[queue]\nmemory_admission = \"yes\"", "memory_admission"),
        ("[pool]\nhost_headroom = -1", "pool.host_headroom"),
        ("[pool]\nwarm = \"criu\"", "not a Warm-tier backend"),
        (
            "[pool]\nwarm_allowed = [\"uvm\", \"criu\"]",
            "not a Warm-tier backend",
        ),
        (
            "[pool]\nwarm = \"checkpoint\"\nwarm_allowed = [\"uvm\"]",
            "pool.warm",
        ),
        ("[pool]\nhot_ttl_s = -1", "pool.hot_ttl_s"),
        ("[pool]\nevict = true", "evict"),
        ("[fairness]\ntenant_from = \"pod\"", "fairness.tenant_from"),
        ("[fairness]\ntenants = { a = -1.0 }", "fairness.tenants"),
        ("[[fairness.rule]]\nweight = 0.0", "fairness.rule.weight"),
        ("[[fairness.rule]]\nnamspace = \"x\"", "namspace"),
        (
            "[limits]\ncontainers_per_shim = 0",
            "limits.containers_per_shim",
        ),
        ("[limits]\nmax_burst_hold_s = -1", "limits.max_burst_hold_s"),
        ("[placement]\nprobe_runs = 0", "placement.probe_runs"),
        (
            "[placement]\nxid_recover_samples = 0",
            "placement.xid_recover_samples",
        ),
        ("[placement]\npeak_end_min = 1440", "placement.peak_end_min"),
        ("[placement.off_peak]\nenergy = -1.0", "placement.off_peak"),
        ("[placement.peak]\nspeed = 1.0", "speed"),
        (
            "[[placement.models]]\npattern = \"X1\"\ntflops = 0.0\nmem_gbps = 1.0\npcie_gbps = 1.0",
            "placement.models.tflops",
        ),
        (
            "[placement]\noverload_utilization = 2.0",
            "placement.overload_utilization",
        ),
        ("[placement]\ncold_start_s = -1.0", "placement.cold_start_s"),
        ("[placement]\ncold_start_s = 1e9", "placement.cold_start_s"),
    ];
    for (text, key) in cases {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text:?} → {e}");
        assert!(e.contains("mqfqd.toml"), "{e}");
    }
    let many: Vec<String> = (0..300).map(|x| x.to_string()).collect();
    let e = parse(&format!("[placement]\nfatal_xids = [{}]", many.join(",")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("placement.fatal_xids"), "{e}");
}
