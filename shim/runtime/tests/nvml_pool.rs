//! What NVML measures of a pooled container's processes, end to end: real containerd, runc, the
//! shim and `mqfqd` on the NVML double (not simulated GPUs), containers running the CUDA client
//! under the injected interposer.
//! - At its Pause the shim names the container's processes (runc's list, host PIDs) with the
//!   release, and `mqfqd` charges its function what NVML lists those processes holding on the
//!   GPU — their CUDA contexts too, which the interposer's figure leaves out — and nothing of
//!   another process on the same GPU.
//! - Under `checkpoint`, a container that may use either GPU, suspended on one and resumed
//!   while that one is busy, is granted the other and restored there by the driver's GPU pairs:
//!   its work runs where the node counts it.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mqfq_testkit::{CheckpointDouble, Containerd, MQFQ, Mqfqd};
use serde_json::Value;

/// Lines in a file (the double's call log).
fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

fn entry<'a>(s: &'a Value, id: &str) -> Option<&'a Value> {
    s["pool"]
        .as_array()?
        .iter()
        .find(|e| e["container_id"] == id)
}

/// A node of `gpus` NVML-double GPUs (8 GiB of each 16 in use) whose shims have `shim_env`, the
/// interposer and doubles installed, and an mqfqd with `extra` config; also the file NVML's
/// per-process memory is read from, and the double's log of those reads.
struct Node {
    c: Containerd,
    d: Mqfqd,
    cuda: PathBuf,
    held: PathBuf,
    calls: PathBuf,
}

impl Node {
    fn start(name: &str, gpus: &str, shim_env: &[(&str, &str)], extra: &str) -> Option<Self> {
        let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
        let mut env = vec![("MQFQ_BURST", "off")];
        env.extend_from_slice(shim_env);
        let c = Containerd::start_with_env(
            &format!("it-{}-{name}", std::process::id()),
            shim.parent().unwrap(),
            &env,
        )?;
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
        // 8 GiB of the double's 16 in use on each GPU: the interposer's few MiB are believed.
        std::fs::write(&util, "50\n50\n").unwrap();
        let env = [
            ("FAKE_NVML_GPUS", gpus.into()),
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
            &format!("restart_grace_ms = 0\nsample_interval_ms = 20\n{extra}"),
        );
        Some(Node {
            c,
            d,
            cuda,
            held,
            calls,
        })
    }

    /// NVML lists `lines` ("<gpu> <pid> <MiB>") from now: returns once mqfqd read them twice.
    fn nvml_lists(&self, lines_now: &str) {
        std::fs::write(&self.held, lines_now).unwrap();
        let before = lines(&self.calls);
        let deadline = Instant::now() + Duration::from_secs(30);
        while lines(&self.calls) < before + 4 {
            assert!(
                Instant::now() < deadline,
                "mqfqd never read NVML's processes"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The containers removed, and nothing of them left.
    fn clean(&self, ids: &[&str]) {
        for id in ids {
            self.c.remove(id);
        }
        self.d.wait_for("the pool empty", |s| {
            s["pool"].as_array().is_none_or(Vec::is_empty)
                && s["leases"].as_array().is_none_or(Vec::is_empty)
        });
        assert!(self.c.leftovers().is_empty(), "{:?}", self.c.leftovers());
    }
}

#[test]
fn a_paused_container_is_charged_what_nvml_measured_its_processes_holding() {
    let Some(n) = Node::start("nvml-pool", "1", &[], "") else {
        return;
    };
    let o = n.c.run_cuda_client(MQFQ, "n", "fn-n", &n.cuda);
    assert!(o.status.success(), "{o:?}");
    let pid = n.c.task_pid("n");
    n.d.wait_for("n pooled and running", |s| entry(s, "n").is_some());
    // NVML lists the container's process with 3000 MiB (its context included) and pid 1, which
    // is not the container's, with 5000.
    n.nvml_lists(&format!("0 {pid} 3000\n0 1 5000\n"));
    assert!(n.c.ctr(&["task", "pause", "n"]).status.success());
    let s = n.d.wait_for("n's measured footprint", |s| {
        entry(s, "n").is_some_and(|e| e["busy"] == false && e["resident"] != 0)
    });
    let e = entry(&s, "n").unwrap();
    assert_eq!(e["resident"], 3000u64 << 20, "{e}");
    assert!(
        e["bytes"].as_u64().is_some_and(|b| b > 0 && b < 3000 << 20),
        "the interposer's own figure, smaller: {e}"
    );
    let table = n.d.ctl(&["status"]);
    assert!(
        table
            .lines()
            .any(|l| l.contains("/n ") && l.contains(" 3000.0 ")),
        "{table}"
    );
    n.clean(&["n"]);
}

/// Under `checkpoint`, container `m` sees both GPUs; NVML measured its process on GPU 0 at its
/// Pause, and it is suspended there. While `p`, given GPU 0 only, holds a lease on it, `m` is
/// resumed: the node grants it GPU 1 (the least loaded of its two), and the shim restores its
/// process onto GPU 1 by the driver's GPU pair — the double's page says so — before Resume
/// returns.
#[test]
fn a_checkpointed_container_is_restored_onto_the_gpu_its_lease_names() {
    let ck = CheckpointDouble::new().unwrap();
    let owned = ck.shim_env();
    let mut env: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("FAKE_CUDA_GPUS", "2"));
    let extra = "[queue]\nttl_s = 0.3\n[pool]\nhot_ttl_s = 1.0\nwarm = \"checkpoint\"\n";
    let Some(n) = Node::start("nvml-move", "2", &env, extra) else {
        return;
    };
    let ctl = mqfq_testkit::build_double("ckpt_ctl", &n.cuda).unwrap();
    let mut flags = vec!["-d".to_owned()];
    flags.extend(ck.container_flags());
    flags.extend(["--env".to_owned(), "NVIDIA_VISIBLE_DEVICES=all".to_owned()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let o =
        n.c.run_cuda_with(MQFQ, "m", "fn-m", &n.cuda, &flags, &["loop"]);
    assert!(o.status.success(), "{o:?}");
    let pid = n.c.task_pid("m");
    n.d.wait_for("m pooled and running", |s| entry(s, "m").is_some());
    assert_eq!(ck.gpu(&ctl, pid), 0, "its memory on GPU 0");
    n.nvml_lists(&format!("0 {pid} 100\n"));
    assert!(n.c.ctr(&["task", "pause", "m"]).status.success());
    n.d.wait_for("m checkpointed", |s| {
        entry(s, "m").is_some_and(|e| e["tier"] == "warm")
    });
    assert_eq!(ck.state(&ctl, pid).0, 2, "checkpointed");
    // p runs on GPU 0 (its lease held while it runs).
    let o = n.c.run_cuda_client(MQFQ, "p", "fn-p", &n.cuda);
    assert!(o.status.success(), "{o:?}");
    n.d.wait_for("p's lease on GPU 0", |s| {
        s["leases"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l["container_id"] == "p" && l["gpu"] == 0))
    });
    let o = n.c.ctr(&["task", "resume", "m"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(ck.state(&ctl, pid).0, 0, "restored and running");
    assert_eq!(ck.gpu(&ctl, pid), 1, "restored onto GPU 1");
    let s = n.d.wait_for("m hot on GPU 1", |s| {
        entry(s, "m").is_some_and(|e| e["tier"] == "hot" && e["gpu"] == 1)
    });
    let lease = s["leases"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["container_id"] == "m"))
        .cloned();
    assert_eq!(lease.map(|l| l["gpu"].clone()), Some(1.into()), "{s}");
    n.clean(&["m", "p"]);
}
