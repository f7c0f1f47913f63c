//! The libcuda double's checkpoint API (issue 36): what a controller such as the shim drives for
//! another process's pid. A GPU server over the double (`cuda_client serve`, no interposer) is
//! locked, checkpointed, restored and unlocked by a second process (`ckpt_ctl`); its CUDA calls
//! wait while it is not running, its bytes move to the host and back (and the NVML double's
//! memory in use with them), calls in the wrong state and injected failures answer as
//! documented in `tests/doubles/cuda.c`.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::built;

/// Runs `ckpt_ctl <pid> <verbs>` with `fail` injected; its output lines.
fn ctl(ckpt_ctl: &Path, dir: &Path, pid: u32, verbs: &[&str], fail: &str) -> Vec<String> {
    let o = Command::new(ckpt_ctl)
        .arg(pid.to_string())
        .args(verbs)
        .env("FAKE_CUDA_CKPT_DIR", dir)
        .env("FAKE_CUDA_CKPT_FAIL", fail)
        .env("FAKE_CUDA_LOG", dir.join("ctl.log"))
        .env("FAKE_NVML_CUDA_DIR", dir)
        .env("FAKE_CUDA_GPUS", "2")
        .env("FAKE_NVML_GPUS", "2")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn launches(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("cuda.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == "launch")
        .count()
}

/// Waits (at most 10 s) until `f` holds.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `(device, host)` bytes from a `bytes` line.
fn bytes(line: &str) -> (i64, i64) {
    let mut it = line
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(_, v)| v.parse::<i64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

/// A GPU's memory in use as NVML reports it, from an `nvml` line.
fn nvml_used(line: &str) -> u64 {
    line.strip_prefix("nvml rc=0 used=")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("not an answer from NVML: {line}"))
}

/// A GPU server over the double, publishing its checkpoint page in `dir`: it launches a 2 ms
/// kernel and synchronizes every 5 ms, forever. The NVML double is built beside it.
fn server(dir: &Path) -> Option<(Child, PathBuf)> {
    let client = built(dir, &["nvml", "cuda", "cuda_client"])?;
    let ckpt_ctl = built(dir, &["ckpt_ctl"])?;
    // Its output goes nowhere: unread, a pipe would fill and stop it.
    let c = Command::new(&client)
        .args(["serve", "1", "5", "-1"])
        .env("FAKE_CUDA_LOG", dir.join("cuda.log"))
        .env("FAKE_CUDA_CKPT_DIR", dir)
        .env("FAKE_CUDA_KERNEL_MS", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("client.err")).unwrap())
        .spawn()
        .unwrap();
    let page = dir.join(format!("fake-cuda-ckpt-{}", c.id()));
    until("the server's page", || page.exists());
    // The page names its process by its start time (`/proc/<pid>/stat` field 22), so that a
    // reused pid's page is stale: the double's own reading must be that field.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", c.id())).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    let started: i64 = after.split_whitespace().nth(19).unwrap().parse().unwrap();
    let bytes = std::fs::read(&page).unwrap();
    let published = i64::from_ne_bytes(bytes[32..40].try_into().unwrap());
    assert!(started > 0, "{stat}");
    assert_eq!(
        published, started,
        "the page's start time (offset 32, ckpt_page.h)"
    );
    until("the server's first launches", || launches(dir) >= 3);
    Some((c, ckpt_ctl))
}

#[test]
fn a_controller_checkpoints_and_restores_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let Some((mut c, ckpt_ctl)) = server(dir) else {
        return;
    };
    let pid = c.id();
    let out = ctl(
        &ckpt_ctl,
        dir,
        pid,
        &[
            "lock:5000",
            "state",
            "bytes",
            "nvml",
            "checkpoint",
            "state",
            "bytes",
            "nvml",
        ],
        "",
    );
    assert_eq!(out[..2], ["lock rc=0", "state rc=0 1"], "{out:?}");
    let (device, host) = bytes(&out[2]);
    assert!(device > 0 && host == 0, "{out:?}");
    let held = u64::try_from(device).unwrap();
    assert_eq!(nvml_used(&out[3]), held, "NVML sees its memory on the GPU");
    assert_eq!(out[4..6], ["checkpoint rc=0", "state rc=0 2"], "{out:?}");
    assert_eq!(bytes(&out[6]), (0, device), "its memory is on the host");
    assert_eq!(nvml_used(&out[7]), 0, "NVML sees it released");
    // Locked and checkpointed, it launches nothing (it launched every few ms before).
    let before = launches(dir);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(launches(dir), before, "a launch while checkpointed");
    // In the wrong state a call changes nothing.
    assert_eq!(
        ctl(&ckpt_ctl, dir, pid, &["unlock", "state"], ""),
        ["unlock rc=401", "state rc=0 2"]
    );
    let out = ctl(
        &ckpt_ctl,
        dir,
        pid,
        &["restore", "state", "bytes", "nvml", "unlock", "state"],
        "",
    );
    assert_eq!(out[..2], ["restore rc=0", "state rc=0 1"], "{out:?}");
    assert_eq!(bytes(&out[2]), (device, 0), "its memory is back");
    assert_eq!(
        nvml_used(&out[3]),
        held,
        "and NVML sees it on the GPU again"
    );
    assert_eq!(out[4..], ["unlock rc=0", "state rc=0 0"], "{out:?}");
    until("launches again", || launches(dir) > before);
    assert_eq!(
        ctl(&ckpt_ctl, dir, pid, &["checkpoint"], ""),
        ["checkpoint rc=401"]
    );
    c.kill().unwrap();
    c.wait().unwrap();
    // Killed, it left its page behind (no exit handler ran): NVML counts no dead process.
    assert!(dir.join(format!("fake-cuda-ckpt-{pid}")).exists());
    assert_eq!(
        ctl(&ckpt_ctl, dir, pid, &["nvml"], ""),
        ["nvml rc=0 used=0"]
    );
    // A process without a page is not one the controller can touch.
    assert_eq!(
        ctl(&ckpt_ctl, dir, pid, &["state", "lock:10"], ""),
        ["state rc=1 -1", "lock rc=1"]
    );
}

#[test]
fn injected_failures_leave_the_process_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let Some((mut c, ckpt_ctl)) = server(dir) else {
        return;
    };
    let pid = c.id();
    // A lock that times out leaves it running, and it goes on.
    assert_eq!(
        ctl(&ckpt_ctl, dir, pid, &["lock:100", "state"], "lock"),
        ["lock rc=909", "state rc=0 0"]
    );
    let n = launches(dir);
    until("launches after a failed lock", || launches(dir) > n);
    // A restore without memory answers out-of-memory and leaves it checkpointed; a later one
    // brings it back.
    let out = ctl(&ckpt_ctl, dir, pid, &["lock:5000", "checkpoint"], "");
    assert_eq!(out, ["lock rc=0", "checkpoint rc=0"]);
    let out = ctl(&ckpt_ctl, dir, pid, &["restore", "state"], "restore-oom");
    assert_eq!(out, ["restore rc=2", "state rc=0 2"]);
    let out = ctl(&ckpt_ctl, dir, pid, &["restore", "unlock", "state"], "");
    assert_eq!(out, ["restore rc=0", "unlock rc=0", "state rc=0 0"]);
    // A checkpoint that fails leaves it failed: nothing but a restart serves it.
    let out = ctl(
        &ckpt_ctl,
        dir,
        pid,
        &["lock:5000", "checkpoint", "state", "unlock"],
        "checkpoint",
    );
    assert_eq!(
        out,
        [
            "lock rc=0",
            "checkpoint rc=999",
            "state rc=0 3",
            "unlock rc=401"
        ]
    );
    c.kill().unwrap();
    c.wait().unwrap();
}

/// A restore with GPU pairs brings a process back onto the GPU its pair names (the driver's
/// `gpuPairs`, by UUID as NVML spells it, every GPU named): NVML sees its memory there and not
/// where it was; a pair list that does not name every GPU, or names one that is not here, is
/// refused and leaves it checkpointed.
#[test]
fn a_restore_with_a_gpu_pair_brings_a_process_back_onto_the_other_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let Some((mut c, ckpt_ctl)) = server(dir) else {
        return;
    };
    let pid = c.id();
    let out = ctl(&ckpt_ctl, dir, pid, &["gpu", "bytes"], "");
    assert_eq!(out[0], "gpu 0", "{out:?}");
    let (device, _) = bytes(&out[1]);
    let held = u64::try_from(device).unwrap();
    let out = ctl(
        &ckpt_ctl,
        dir,
        pid,
        &[
            "lock:5000",
            "checkpoint",
            "restore-one:0:1",
            "restore:0:7",
            "state",
            "restore:0:1",
            "gpu",
            "nvml:0",
            "nvml:1",
            "unlock",
        ],
        "",
    );
    assert_eq!(
        out[..6],
        [
            "lock rc=0",
            "checkpoint rc=0",
            "restore rc=1",
            "restore rc=101",
            "state rc=0 2",
            "restore rc=0"
        ],
        "{out:?}"
    );
    assert_eq!(out[6], "gpu 1");
    assert_eq!(nvml_used(&out[7]), 0, "nothing left on GPU 0: {out:?}");
    assert_eq!(nvml_used(&out[8]), held, "all of it on GPU 1: {out:?}");
    assert_eq!(out[9], "unlock rc=0");
    let before = launches(dir);
    until("launches on its new GPU", || launches(dir) > before);
    c.kill().unwrap();
    c.wait().unwrap();
}

/// The GPU check's checkpoint program (`tests/gpu/ckptbench.c`) over the double: a controller
/// suspends and resumes an application holding native memory round after round, the driver
/// reports it checkpointed in between, and the application's kernel finds every value where it
/// left it — also after a round restored onto the double's second GPU.
#[test]
fn the_gpu_check_program_suspends_and_resumes_an_application_over_the_double() {
    let dir = tempfile::tempdir().unwrap();
    if built(dir.path(), &["cuda"]).is_none() {
        return;
    }
    let bench = common::gpu_program(dir.path(), "ckptbench");
    let out = common::run_gpu_program(
        &bench,
        dir.path(),
        &["4", "3"],
        &[
            ("FAKE_CUDA_CKPT_DIR", dir.path()),
            ("FAKE_CUDA_GPUS", Path::new("2")),
        ],
    );
    for line in [
        "lock_ms ",
        "checkpoint_GBps ",
        "restore_GBps ",
        "unlock_ms ",
    ] {
        let n = out.lines().filter(|l| l.starts_with(line)).count();
        assert_eq!(n, 3, "{line}: {out}");
    }
    assert_eq!(out.matches("state_after_checkpoint 2").count(), 3, "{out}");
    // Then onto the double's second GPU (one model), every value found there.
    assert_eq!(out.matches("moved_restore_ms ").count(), 1, "{out}");
    assert!(out.contains("moved_results_wrong 0 of 1048576"), "{out}");
    // NVML's view of the application, once (no nvidia-smi here: said so).
    for when in ["running", "checkpointed", "restored", "moved"] {
        let line = format!("nvml_{when} (pid not listed)");
        assert_eq!(out.matches(&line).count(), 1, "{out}");
    }
    let rounds = out
        .lines()
        .filter(|l| l.starts_with("results_wrong 0 of 1048576"))
        .count();
    assert_eq!(rounds, 3, "{out}");
}

/// The GPU check's compatibility program across a checkpoint (`tests/gpu/ckptcompat.c`) over
/// the double: an application that exported its memory over CUDA IPC is suspended and resumed
/// by a controller, and a second process then opens the export and shares the memory with it;
/// a pair whose mapping is open is suspended and resumed together and still shares it; another
/// with a graph capture left open is suspended and resumed, and its graph then runs.
/// (The double moves no memory at a checkpoint: this checks the program, not the driver.)
#[test]
fn the_gpu_check_ipc_and_capture_program_runs_across_a_checkpoint_over_the_double() {
    let dir = tempfile::tempdir().unwrap();
    if built(dir.path(), &["cuda"]).is_none() {
        return;
    }
    let bin = common::gpu_program(dir.path(), "ckptcompat");
    let out = common::run_gpu_program(&bin, dir.path(), &[], &[("FAKE_CUDA_CKPT_DIR", dir.path())]);
    for line in [
        "ipc_export rc 0",
        "ipc_lock rc 0",
        "ipc_checkpoint rc 0",
        "ipc_state_after_checkpoint 2",
        "ipc_restore rc 0",
        "ipc_unlock rc 0",
        "ipc_import rc 0",
        "ipc_import_words 0 1 2",
        "ipc_exporter_sees 777",
        "ipc_import_close rc 0",
        "ipc_live_import_words 0 1 2",
        "ipc_live_exporter_sees 777",
        "ipc_live_import_close rc 0",
        "capture_begin rc 0",
        "capture_lock rc 0",
        "capture_state_after_checkpoint 2",
        "capture_unlock rc 0",
        "capture_end rc 0",
        "capture_graph_launch rc 0",
        "capture_results_wrong 0 of 262144",
    ] {
        assert!(out.lines().any(|l| l == line), "{line}: {out}");
    }
    // Both processes of the live pair locked, then checkpointed, restored and unlocked.
    for call in ["lock", "checkpoint", "restore", "unlock"] {
        let line = format!("ipc_live_{call} rc 0");
        assert_eq!(out.lines().filter(|l| *l == line).count(), 2, "{out}");
    }
    // A driver that fails every checkpoint: each round says so and brings its processes back,
    // and the program ends (failed) rather than hang.
    let (ok, out) = common::run_gpu_program_status(
        &bin,
        dir.path(),
        &[],
        &[
            ("FAKE_CUDA_CKPT_DIR", dir.path()),
            ("FAKE_CUDA_CKPT_FAIL", Path::new("checkpoint")),
        ],
    );
    assert!(!ok, "{out}");
    for round in ["ipc", "ipc_live", "capture"] {
        assert!(
            out.contains(&format!("error {round}: suspend and resume failed")),
            "{round}: {out}"
        );
    }
    assert!(out.contains("error ckptcompat: a round failed"), "{out}");
}
