//! The GPU check (`tests/gpu/run.sh`) runs only the day a GPU machine is lent, so what it needs
//! is checked here on every run: each `$BIN/<program>` it runs is one `scripts/gpu-prepare.sh`
//! builds into `gpu-bin/`, and each crate that script builds (`-p <crate>`) is a workspace
//! member that has the binaries copied from `target/release`. (It had built `mqfqd` from the
//! shim's crate after the daemon moved to its own.)
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::collections::BTreeSet;
use std::path::Path;

fn read(rel: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Words after `marker` up to the first character that cannot be in a file or crate name.
fn names_after<'a>(text: &'a str, marker: &str) -> BTreeSet<&'a str> {
    text.match_indices(marker)
        .map(|(i, _)| {
            let rest = &text[i + marker.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || "-_.".contains(c)))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| !n.is_empty())
        .collect()
}

#[test]
fn the_gpu_check_runs_only_what_gpu_prepare_builds() {
    let run = read("tests/gpu/run.sh");
    let prepare = read("scripts/gpu-prepare.sh");
    // Where gpu-bin/ is missing, run.sh builds it with gpu-prepare.sh, never a build of its own.
    assert!(!run.contains("cargo build"), "run.sh builds by itself");
    assert!(
        run.contains("scripts/gpu-prepare.sh"),
        "run.sh never builds gpu-bin/"
    );
    // What gpu-prepare.sh puts in gpu-bin/: the release binaries it copies, the C programs.
    let copied: BTreeSet<&str> = prepare
        .lines()
        .find_map(|l| l.strip_prefix("cp target/release/{"))
        .and_then(|l| l.split('}').next())
        .expect("gpu-prepare.sh copies target/release/{…}")
        .split(',')
        .collect();
    let compiled = names_after(&prepare, "-o gpu-bin/");
    let needed = names_after(&run, "$BIN/");
    assert!(needed.len() >= 8, "{needed:?}");
    for n in &needed {
        assert!(
            copied.contains(n) || compiled.contains(n),
            "run.sh runs $BIN/{n}, which gpu-prepare.sh does not build"
        );
    }
    // Each crate it builds exists, and each binary it copies is one of theirs: a `[[bin]]`, the
    // package's own binary, a `src/bin/` program, or the `.so` of a `[lib]`.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let members = [
        "scheduler-core",
        "sim",
        "shim/runtime",
        "shim/proto",
        "shim/edits",
        "shim/daemon",
        "shim/cluster",
        "tests",
        "hooks",
    ];
    // The crates of its `cargo build` command (continued over `\` line ends).
    let build: String = prepare[prepare.find("cargo build").expect("a cargo build")..]
        .split_inclusive('\n')
        .scan(true, |more, line| {
            let this = (*more).then_some(line);
            *more = line.trim_end().ends_with('\\');
            this
        })
        .collect();
    let crates: Vec<(&str, String)> = names_after(&build, "-p ")
        .into_iter()
        .map(|c| {
            let dir = members
                .iter()
                .find(|d| read(&format!("{d}/Cargo.toml")).contains(&format!("name = \"{c}\"")))
                .unwrap_or_else(|| panic!("gpu-prepare.sh builds -p {c}, no such crate"));
            (*dir, read(&format!("{dir}/Cargo.toml")))
        })
        .collect();
    for b in &copied {
        let lib = b.strip_prefix("lib").and_then(|b| b.strip_suffix(".so"));
        let ok = crates.iter().any(|(dir, m)| {
            m.contains(&format!("name = \"{b}\""))
                || lib.is_some_and(|l| m.contains(&format!("name = \"{l}\"")))
                || root.join(dir).join("src/bin").join(b).exists()
        });
        assert!(
            ok,
            "gpu-prepare.sh copies {b}, which no crate it builds makes"
        );
    }
}
