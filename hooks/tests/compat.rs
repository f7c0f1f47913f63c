//! Converted memory handed to code that needs `cuMemAlloc` memory (issue 13): a two-process IPC
//! exchange, pointer queries, and a communication library's registered buffer, each run without
//! and with the interposer over the libcuda double (which refuses IPC and dma-buf exports of
//! managed memory and reports it managed, as the driver documents).
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod common;

use std::path::{Path, PathBuf};

use common::{Client, Ctl, built};

const MIB: u64 = 1 << 20;

/// The doubles and the IPC client, built in `dir`.
fn ipc_client(dir: &Path) -> Option<PathBuf> {
    built(dir, &["cuda", "commlib", "ipc_client"])
}

/// Runs `ipc_client <args>` up to its "ready" (with the interposer in container `c1` when `ctl`
/// is given) and returns its lines and the process (kept alive for the control socket).
fn run(
    bin: &Path,
    dir: &Path,
    args: &[&str],
    ctl: Option<&Path>,
    env: &[(&str, &Path)],
) -> (Vec<String>, Client) {
    let mut all: Vec<(&str, &Path)> = env.to_vec();
    if let Some(ctl) = ctl {
        std::fs::create_dir_all(ctl).unwrap();
        all.push(("MQFQ_CTL_DIR", ctl));
        all.push(("MQFQ_CONTAINER_ID", Path::new("c1")));
    }
    let err = format!("{}.err", args[0]);
    let mut c = Client::spawn(bin, args, dir, &err, &all, ctl.is_some());
    let mut lines = Vec::new();
    loop {
        let l = c
            .line_within(std::time::Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{args:?}: no answer; so far {lines:?}; {}", c.stderr()));
        if l == "ready" || l.is_empty() {
            return (lines, c);
        }
        lines.push(l);
    }
}

/// The `status` figures of the process in `ctl`, by name.
fn status(ctl: &Path) -> std::collections::BTreeMap<String, u64> {
    let mut s = Ctl::connect(ctl);
    assert_eq!(s.ask("hello c1"), "ok");
    let reply = s.ask("status");
    let body = reply
        .strip_prefix("ok ")
        .unwrap_or_else(|| panic!("{reply}"));
    body.split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

/// A process's `status` figures, when it has an interposer.
type Status = Option<std::collections::BTreeMap<String, u64>>;

/// Exporter and importer in two processes; the exporter's lines, the importer's, and the
/// exporter's and the importer's status when `ctl` (the interposer's) is given.
fn exchange(
    bin: &Path,
    dir: &Path,
    ctl: Option<&Path>,
    env: &[(&str, &Path)],
) -> (Vec<String>, Vec<String>, Status, Status) {
    let meet = dir.join(if ctl.is_some() { "meet-on" } else { "meet-off" });
    std::fs::create_dir_all(&meet).unwrap();
    let m = meet.to_str().unwrap();
    let exporter = std::thread::scope(|s| {
        let e = s.spawn(|| run(bin, dir, &["export", m], ctl, env));
        let ictl = ctl.map(|c| c.with_file_name("ctl-importer"));
        let (import, _i) = run(bin, dir, &["import", m], ictl.as_deref(), &[]);
        let ist = ictl.as_deref().map(status);
        (e.join().unwrap(), import, ist)
    });
    let ((export, _e), import, ist) = exporter;
    let st = ctl.map(status);
    (export, import, st, ist)
}

#[test]
fn an_ipc_exchange_with_the_native_setting_works_as_without_the_interposer() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ipc_client(dir.path()) else {
        return;
    };
    let (export, import, _, _) = exchange(&bin, dir.path(), None, &[]);
    assert_eq!(export, ["export rc=0 kind=1", "sees 777"], "without");
    assert_eq!(
        import,
        [
            "import rc=0 words=0 1 2",
            "range rc=0 offset=0 size=1048576",
            "closed rc=0"
        ]
    );
    // The function's setting (io.mqfq.native-alloc=all → MQFQ_NATIVE=all): the same exchange.
    let ctl = dir.path().join("ctl");
    let (export2, import2, st, ist) = exchange(
        &bin,
        dir.path(),
        Some(&ctl),
        &[("MQFQ_NATIVE", Path::new("all"))],
    );
    assert_eq!((export2, import2), (export, import), "with the interposer");
    let st = st.unwrap();
    assert_eq!(
        (st["managed"], st["setting"], st["native"], st["refused"]),
        (0, MIB, MIB, 0),
        "{st:?}"
    );
    // Memory shared with another process, as both sides' interposers count it (the checkpoint
    // backend leaves such processes on the GPU).
    assert_eq!((st["shared"], ist.unwrap()["shared"]), (1, 1), "{st:?}");
}

#[test]
fn exporting_converted_memory_gets_the_drivers_refusal_once_then_memory_stays_native() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ipc_client(dir.path()) else {
        return;
    };
    let ctl = dir.path().join("ctl");
    let meet = dir.path().join("meet");
    std::fs::create_dir_all(&meet).unwrap();
    let (lines, c) = run(
        &bin,
        dir.path(),
        &["export", meet.to_str().unwrap()],
        Some(&ctl),
        &[],
    );
    // The first buffer was converted before anyone knew it would be exported: the driver's answer
    // for managed memory (CUDA_ERROR_INVALID_VALUE). Every later allocation stays native.
    assert_eq!(lines, ["export rc=1 kind=2", "export2 rc=0 kind=1"]);
    let st = status(&ctl);
    assert_eq!(
        (st["managed"], st["export"], st["refused"], st["shared"]),
        (MIB, MIB, 1, 1),
        "the refused export is not shared, the second one is: {st:?}"
    );
    let err = c.stderr();
    assert_eq!(
        err.matches("cuIpcGetMemHandle on converted memory").count(),
        1,
        "{err}"
    );
    assert!(err.contains("io.mqfq.native-alloc=all"), "{err}");
    assert!(ctl.join("exported").is_file(), "marked for the shim");
    drop(c);
    // A dma-buf export is an export too.
    let ctl = dir.path().join("ctl-dmabuf");
    let (lines, _c) = run(&bin, dir.path(), &["dmabuf"], Some(&ctl), &[]);
    assert_eq!(lines, ["dmabuf rc=1 kind=2", "dmabuf2 rc=0 kind=1"]);
    let st = status(&ctl);
    assert_eq!(
        (st["export"], st["refused"], st["shared"]),
        (MIB, 1, 1),
        "{st:?}"
    );
}

#[test]
fn pointer_queries_on_converted_memory_answer_as_for_device_memory() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ipc_client(dir.path()) else {
        return;
    };
    let (without, _a) = run(&bin, dir.path(), &["attrs"], None, &[]);
    let ctl = dir.path().join("ctl");
    let (with, _b) = run(&bin, dir.path(), &["attrs"], Some(&ctl), &[]);
    let st = status(&ctl);
    assert_eq!(st["managed"], MIB, "the buffer was converted: {st:?}");
    let pick = |v: &[String], p: &str| v.iter().find(|l| l.starts_with(p)).cloned().unwrap();
    // Type, IS_MANAGED, range (single and batch) and cuMemGetAddressRange: as without it.
    for p in ["single", "batch", "range"] {
        assert_eq!(pick(&with, p), pick(&without, p), "{p}");
    }
    assert_eq!(
        pick(&with, "single"),
        "single rc=0 type=2 managed=0 start=4096 size=1048576"
    );
    // Two answers are the truth on purpose: it cannot be exported through legacy IPC, and a
    // communication library stages managed memory instead of trying IPC or RDMA on it.
    assert_eq!(pick(&without, "ipc-capable"), "ipc-capable 1");
    assert_eq!(pick(&with, "ipc-capable"), "ipc-capable 0");
    assert_eq!(pick(&without, "library-sees"), "library-sees managed=0");
    assert_eq!(pick(&with, "library-sees"), "library-sees managed=1");
}

#[test]
fn the_old_32_bit_entry_points_are_never_substituted() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ipc_client(dir.path()) else {
        return;
    };
    let ctl = dir.path().join("ctl");
    let (lines, _c) = run(&bin, dir.path(), &["legacy"], Some(&ctl), &[]);
    assert_eq!(lines, ["legacy kind=1 current kind=2"]);
}

#[test]
fn memory_freed_behind_the_interposers_back_is_not_answered_for() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ipc_client(dir.path()) else {
        return;
    };
    let ctl = dir.path().join("ctl");
    let (lines, _c) = run(&bin, dir.path(), &["stale"], Some(&ctl), &[]);
    // The driver's answers for memory it no longer has, and the entry forgotten.
    assert_eq!(lines, ["stale range rc=1 managed rc=1"]);
    assert_eq!(status(&ctl)["managed"], 0);
}

#[test]
fn a_communication_librarys_registered_buffer_stays_native_and_exportable() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ipc_client(dir.path()) else {
        return;
    };
    let (without, _a) = run(&bin, dir.path(), &["lib"], None, &[]);
    assert_eq!(without, ["lib alloc rc=0 export rc=0 ipc=1 kind=1"]);
    let ctl = dir.path().join("ctl");
    let (with, _b) = run(&bin, dir.path(), &["lib"], Some(&ctl), &[]);
    assert_eq!(with, without);
    let st = status(&ctl);
    assert_eq!(
        (st["managed"], st["library"], st["native"], st["refused"]),
        (0, MIB, MIB, 0),
        "{st:?}"
    );
}

/// The GPU check's compatibility step (`tests/gpu/compatcheck.c`, run by `tests/gpu/run.sh`)
/// over the double: its probe tells cuMemAlloc memory from managed memory, and its two-process
/// exchange works under the interposer with the native setting.
#[test]
fn the_gpu_checks_compatibility_program_runs_over_the_double() {
    let dir = tempfile::tempdir().unwrap();
    if built(dir.path(), &["cuda"]).is_none() {
        return;
    }
    let bin = common::gpu_program(dir.path(), "compatcheck");
    let run = |args: &[&str], interposed: bool| {
        let mut c = std::process::Command::new(&bin);
        c.args(args).env("LD_LIBRARY_PATH", dir.path());
        if interposed {
            let ctl = dir.path().join(format!("ctl-{}", args[0]));
            std::fs::create_dir_all(&ctl).unwrap();
            c.env("LD_PRELOAD", common::interposer())
                .env("MQFQ_CTL_DIR", ctl)
                .env("MQFQ_CONTAINER_ID", "c")
                .env("MQFQ_NATIVE", "all");
        }
        let o = c.output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{args:?}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let probe = run(&["probe"], false);
    for line in [
        "device ipc_export rc=0",
        "managed ipc_export rc=1",
        "managed attr8 rc=0 value=1",
        "device attr8 rc=0 value=0",
    ] {
        assert!(probe.lines().any(|l| l == line), "{line}: {probe}");
    }
    let meet = dir.path().join("meet");
    std::fs::create_dir_all(&meet).unwrap();
    let m = meet.to_str().unwrap();
    let (export, import) = std::thread::scope(|s| {
        let e = s.spawn(|| run(&["export", m], true));
        let i = run(&["import", m], true);
        (e.join().unwrap(), i)
    });
    assert_eq!(export, "export rc=0\nsees 777\n");
    assert!(import.starts_with("import rc=0 words=0 1 2\n"), "{import}");
}

/// The other ways a process shares GPU memory — a VMM allocation exported and imported, a
/// memory pool and a pointer of it exported and imported — pass through unchanged and are
/// counted as shared (the checkpoint backend then never suspends the process); and the primary
/// context's release, the wrapper after them in the interposer's table, still reaches the driver
/// (a table one slot short once answered it CUDA_ERROR_UNKNOWN).
#[test]
fn every_way_of_sharing_memory_is_counted_and_the_context_release_still_works() {
    let dir = tempfile::tempdir().unwrap();
    let Some(bin) = ipc_client(dir.path()) else {
        return;
    };
    let ctl = dir.path().join("ctl-share");
    let (lines, _c) = run(&bin, dir.path(), &["share"], Some(&ctl), &[]);
    assert_eq!(lines, ["share vmm rc=0 0 pool rc=0 0 pointer rc=0 0"]);
    assert_eq!(status(&ctl)["shared"], 6, "{:?}", status(&ctl));
    // The name before CUDA 11, looked up by dlsym: the same call, counted too.
    let ctl = dir.path().join("ctl-v1");
    let native = [("MQFQ_NATIVE", Path::new("all"))];
    let (lines, _v) = run(&bin, dir.path(), &["v1open"], Some(&ctl), &native);
    assert_eq!(lines, ["v1open rc=0"]);
    let st = status(&ctl);
    assert_eq!((st["shared"], st["sharing"]), (2, 0), "{st:?}");
    let ctl = dir.path().join("ctl-release");
    let (lines, _r) = run(&bin, dir.path(), &["release"], Some(&ctl), &[]);
    assert_eq!(lines, ["release rc=0"]);
}
