//! The CUDA interposer loads into images with an old glibc: built against glibc 2.17's symbol
//! versions (`scripts/build-interposer.sh`), it needs nothing newer, and a program of Debian 11
//! (glibc 2.31) runs under its own loader with it preloaded — converting allocations too —
//! while the interposer as cargo builds it on this machine stops that program from starting.
//!
//! Needs the portable builds and the old glibc, which `scripts/test.sh` prepares and names in
//! `MQFQ_PORTABLE_INTERPOSER` (and `…_AARCH64`), `MQFQ_OLD_GLIBC_ROOT` and `MQFQ_ZIG`; without
//! them the tests skip,
//! unless `MQFQ_REQUIRE_PORTABLE=1`.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mqfq_shim::elf;

fn var(name: &str) -> Option<PathBuf> {
    let v = std::env::var_os(name).map(PathBuf::from);
    if v.is_none() {
        assert!(
            std::env::var("MQFQ_REQUIRE_PORTABLE").as_deref() != Ok("1"),
            "{name} is not set (scripts/test.sh sets it)"
        );
        eprintln!("SKIPPED: {name} is not set");
    }
    v
}

/// Runs `program args…` with the old release's own loader and libraries, `preload` preloaded.
fn old(
    root: &Path,
    preload: &Path,
    env: &[(&str, &Path)],
    program: &Path,
    args: &[&str],
) -> Output {
    let libs = format!(
        "{}:{}",
        root.join("lib/x86_64-linux-gnu").display(),
        root.join("usr/lib/x86_64-linux-gnu").display()
    );
    Command::new(root.join("lib/x86_64-linux-gnu/ld-2.31.so"))
        .arg("--library-path")
        .arg(libs)
        .arg("--preload")
        .arg(preload)
        .arg(program)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_portable_interposer_needs_glibc_2_17_at_most() {
    let Some(so) = var("MQFQ_PORTABLE_INTERPOSER") else {
        return;
    };
    let needs = elf::glibc_needed(&std::fs::read(&so).unwrap()).unwrap();
    assert!(
        needs <= (2, 17),
        "{} needs GLIBC_{}.{}",
        so.display(),
        needs.0,
        needs.1
    );
    // What the shim checks at Create: an image with glibc 2.17 fits.
    mqfq_shim::uvm::fits(needs, Some((2, 17))).unwrap();
    assert_eq!(mqfq_shim::uvm::interposer_needs(&so), Some(needs));
}

/// The interposer built for aarch64 (`scripts/build-interposer.sh aarch64`) needs glibc 2.17
/// at most and asks for `dlsym` under aarch64's versions — 2.34, else its base version 2.17 —
/// never x86_64's 2.2.5, which an aarch64 glibc never had (it had asked for that one: before
/// glibc 2.34 it found no `dlsym`, and every lookup of a driver function failed).
#[test]
fn the_aarch64_interposer_needs_glibc_2_17_and_asks_for_dlsym_by_its_versions() {
    let Some(so) = var("MQFQ_PORTABLE_INTERPOSER_AARCH64") else {
        return;
    };
    let bytes = std::fs::read(&so).unwrap();
    // e_machine: EM_AARCH64.
    assert_eq!(
        bytes.get(18..20),
        Some(&183u16.to_le_bytes()[..]),
        "{}",
        so.display()
    );
    let needs = elf::glibc_needed(&bytes).unwrap();
    assert!(needs <= (2, 17), "needs GLIBC_{}.{}", needs.0, needs.1);
    let has = |s: &[u8]| bytes.windows(s.len()).any(|w| w == s);
    assert!(has(b"GLIBC_2.17\0") && has(b"GLIBC_2.34\0"));
    assert!(!has(b"GLIBC_2.2.5"), "asks for x86_64's version");
}

#[test]
fn a_debian_11_program_runs_with_the_interposer_preloaded() {
    let (Some(so), Some(root)) = (var("MQFQ_PORTABLE_INTERPOSER"), var("MQFQ_OLD_GLIBC_ROOT"))
    else {
        return;
    };
    let iconv = root.join("usr/bin/iconv");
    let o = old(&root, &so, &[], &iconv, &["--version"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("2.31"), "{}", text(&o));
    // The interposer as cargo builds it here needs this machine's newer glibc: the program does
    // not start at all (what the shim now refuses to inject, and what the portable build fixes).
    let host_built = mqfq_testkit::built_interposer();
    let needs = elf::glibc_needed(&std::fs::read(&host_built).unwrap()).unwrap();
    if needs > (2, 31) {
        let o = old(&root, &host_built, &[], &iconv, &["--version"]);
        assert!(!o.status.success());
        assert!(text(&o).contains("version `GLIBC_2.3"), "{}", text(&o));
    }
}

#[test]
fn allocations_are_converted_under_an_old_glibc() {
    let (Some(so), Some(root), Some(zig)) = (
        var("MQFQ_PORTABLE_INTERPOSER"),
        var("MQFQ_OLD_GLIBC_ROOT"),
        var("MQFQ_ZIG"),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let doubles = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/doubles");
    // The libcuda double and the client, built for glibc 2.17 as an old image's would be.
    let cc = |args: &[&str]| {
        let o = Command::new(&zig)
            .args(["cc", "-target", "x86_64-linux-gnu.2.17", "-O1"])
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "zig cc {args:?}: {}", text(&o));
    };
    let cuda = doubles.join("cuda.c").display().to_string();
    let client = doubles.join("cuda_client.c").display().to_string();
    cc(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        "libcuda.so.1",
        &cuda,
    ]);
    cc(&[
        "-o",
        "client",
        &client,
        "-L.",
        "-l:libcuda.so.1",
        "-ldl",
        "-lpthread",
    ]);
    let ctl = dir.path().join("ctl");
    std::fs::create_dir(&ctl).unwrap();
    let log = dir.path().join("cuda.log");
    let libs = format!(
        "{}:{}:{}",
        dir.path().display(),
        root.join("lib/x86_64-linux-gnu").display(),
        root.join("usr/lib/x86_64-linux-gnu").display()
    );
    let o = Command::new(root.join("lib/x86_64-linux-gnu/ld-2.31.so"))
        .arg("--library-path")
        .arg(libs)
        .arg("--preload")
        .arg(&so)
        .arg(dir.path().join("client"))
        .env("MQFQ_CTL_DIR", &ctl)
        .env("FAKE_CUDA_LOG", &log)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for want in [
        "direct rc=0 kind=2",
        "dlsym rc=0 kind=2",
        "procaddr rc=0 kind=2",
        "ready",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
}
