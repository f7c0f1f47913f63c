//! What NVML measures a pooled container's processes holding, end to end: real containerd, runc,
//! the shim and `mqfqd` on the NVML double (not simulated GPUs), a container running the CUDA
//! client under the injected interposer. At its Pause the shim names the container's processes
//! (runc's list, host PIDs) with the release, and `mqfqd` charges its function what NVML lists
//! those processes holding on the GPU — their CUDA contexts too, which the interposer's figure
//! leaves out — and nothing of another process on the same GPU.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use mqfq_testkit::{Containerd, MQFQ, Mqfqd};

/// Lines in a file (the double's call log).
fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

#[test]
fn a_paused_container_is_charged_what_nvml_measured_its_processes_holding() {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    let Some(c) = Containerd::start_with_env(
        &format!("it-{}-nvml-pool", std::process::id()),
        shim.parent().unwrap(),
        &[("MQFQ_BURST", "off")],
    ) else {
        return;
    };
    let cuda = c.install_cuda(&mqfq_testkit::built_interposer()).unwrap();
    let nvml_dir = c.dir().join("nvml");
    std::fs::create_dir_all(&nvml_dir).unwrap();
    let nvml = mqfq_testkit::build_double("nvml", &nvml_dir).unwrap();
    let (held, calls, util) = (
        nvml_dir.join("held"),
        nvml_dir.join("held-calls"),
        nvml_dir.join("util"),
    );
    std::fs::write(&held, "").unwrap();
    // 8 GiB of the double's 16 in use: the interposer's few MiB are believed.
    std::fs::write(&util, "50\n").unwrap();
    let env = [
        ("FAKE_NVML_GPUS", "1".into()),
        ("FAKE_NVML_HELD", held.clone().into_os_string()),
        ("FAKE_NVML_HELD_CALLS", calls.clone().into_os_string()),
        ("FAKE_NVML_UTIL", util.into_os_string()),
    ];
    let d = Mqfqd::start_on_nvml(
        &mqfq_testkit::daemon_program("mqfqd"),
        &mqfq_testkit::daemon_program("mqfqctl"),
        (c.dir(), &c.daemon_socket()),
        &nvml,
        env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        "restart_grace_ms = 0\nsample_interval_ms = 20\n",
    );
    let o = c.run_cuda_client(MQFQ, "n", "fn-n", &cuda);
    assert!(o.status.success(), "{o:?}");
    let pid = c.task_pid("n");
    d.wait_for("n pooled and running", |s| entry(s, "n").is_some());
    // NVML lists the container's process with 3000 MiB (its context included) and pid 1, which
    // is not the container's, with 5000.
    std::fs::write(&held, format!("0 {pid} 3000\n0 1 5000\n")).unwrap();
    let before = lines(&calls);
    let deadline = Instant::now() + Duration::from_secs(30);
    while lines(&calls) < before + 2 {
        assert!(
            Instant::now() < deadline,
            "mqfqd never read NVML's processes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(c.ctr(&["task", "pause", "n"]).status.success());
    let s = d.wait_for("n's measured footprint", |s| {
        entry(s, "n").is_some_and(|e| e["busy"] == false && e["resident"] != 0)
    });
    let e = entry(&s, "n").unwrap();
    assert_eq!(e["resident"], 3000u64 << 20, "{e}");
    assert!(
        e["bytes"].as_u64().is_some_and(|b| b > 0 && b < 3000 << 20),
        "the interposer's own figure, smaller: {e}"
    );
    let table = d.ctl(&["status"]);
    assert!(
        table
            .lines()
            .any(|l| l.contains("/n ") && l.contains(" 3000.0 ")),
        "{table}"
    );
    c.remove("n");
    d.wait_for("the pool empty", |s| {
        s["pool"].as_array().is_none_or(Vec::is_empty)
            && s["leases"].as_array().is_none_or(Vec::is_empty)
    });
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

fn entry<'a>(s: &'a serde_json::Value, id: &str) -> Option<&'a serde_json::Value> {
    s["pool"]
        .as_array()?
        .iter()
        .find(|e| e["container_id"] == id)
}
