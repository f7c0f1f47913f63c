//! The crates point one way (docs/ARCHITECTURE.md, "Crates and folders"): each rule here is an
//! edge the design forbids, read from `cargo tree` over the locked workspace, so a dependency
//! added against the layering fails the tests rather than waiting for someone to draw the graph.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The packages `package` links in a normal build (itself included), `depth` levels down
/// (`None`: all of them).
fn linked(package: &str, depth: Option<u32>) -> BTreeSet<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args([
        "tree", "--locked", "-e", "normal", "--prefix", "none", "-f", "{p}", "-p", package,
    ]);
    if let Some(d) = depth {
        cmd.args(["--depth", &d.to_string()]);
    }
    let out = cmd.output().expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The project's own crates among `names`.
fn ours(names: &BTreeSet<String>) -> BTreeSet<&str> {
    names
        .iter()
        .map(String::as_str)
        .filter(|n| n.starts_with("mqfq-") || *n == "scheduler-core")
        .collect()
}

fn assert_none(package: &str, of: &[&str]) {
    let deps = linked(package, None);
    let found: Vec<_> = of.iter().filter(|n| deps.contains(**n)).collect();
    assert!(found.is_empty(), "{package} links {found:?}");
}

#[test]
fn the_decision_crate_links_serde_and_thiserror_only() {
    let direct = linked("scheduler-core", Some(1));
    let expected: BTreeSet<String> = ["scheduler-core", "serde", "thiserror"]
        .map(String::from)
        .into();
    assert_eq!(
        direct, expected,
        "no tokio, no I/O: time and readings come in as data"
    );
}

#[test]
fn each_crate_links_only_the_project_crates_below_it() {
    for (package, allowed) in [
        ("mqfq-edits", &["mqfq-edits"][..]),
        ("mqfq-cuda-hook", &["mqfq-cuda-hook"][..]),
        ("mqfq-proto", &["mqfq-proto", "scheduler-core"][..]),
        ("mqfq-sim", &["mqfq-sim", "scheduler-core"][..]),
        (
            "mqfq-daemon",
            &["mqfq-daemon", "mqfq-edits", "mqfq-proto", "scheduler-core"][..],
        ),
        (
            "mqfq-shim",
            &["mqfq-shim", "mqfq-edits", "mqfq-proto", "scheduler-core"][..],
        ),
        (
            "mqfq-cluster",
            &["mqfq-cluster", "mqfq-proto", "scheduler-core"][..],
        ),
    ] {
        let deps = linked(package, None);
        let extra: Vec<_> = ours(&deps)
            .into_iter()
            .filter(|n| !allowed.contains(n))
            .collect();
        assert!(extra.is_empty(), "{package} links {extra:?}");
    }
}

#[test]
fn the_daemon_links_no_shim_runtime_and_the_shim_no_daemon_libraries() {
    assert_none("mqfq-daemon", &["containerd-shim", "runc"]);
    // containerd starts one shim per pod: what only the daemon needs stays out of it.
    assert_none(
        "mqfq-shim",
        &[
            "prometheus-client",
            "nvml-wrapper",
            "serde-saphyr",
            "clap",
            "anyhow",
        ],
    );
    // The simulator replays decisions; it runs no async runtime.
    assert_none("mqfq-sim", &["tokio"]);
}
