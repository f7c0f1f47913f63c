//! The CUDA interposer loads into images with an old glibc: built against glibc 2.17's symbol
//! versions (`scripts/build-interposer.sh`), it needs nothing newer, and a program of Debian 11
//! (glibc 2.31) runs under its own loader with it preloaded — converting allocations too —
//! while the interposer as cargo builds it on this machine stops that program from starting.
//!
//! Needs the portable builds and the old glibc, which `scripts/test.sh` prepares and names in
//! `MQFQ_PORTABLE_INTERPOSER` (and `…_AARCH64`), `MQFQ_OLD_GLIBC_ROOT` and `MQFQ_ZIG`; the
//! aarch64 build also runs, emulated, under `qemu-aarch64` on Debian's aarch64 glibc
//! (`/usr/aarch64-linux-gnu`, package libc6-arm64-cross). Without them the tests skip, unless
//! `MQFQ_REQUIRE_PORTABLE=1`.
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
    // The libcuda double and the client, built for glibc 2.17 as an old image's would be.
    zig_doubles(&zig, "x86_64-linux-gnu.2.17", dir.path());
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
    assert_converted(&o, &text(&o));
}

/// The CUDA client's output `out` says every lookup path converted its allocation.
fn assert_converted(o: &Output, out: &str) {
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

/// Compiles `src` with `zig cc` for `target` (`x86_64-linux-gnu.2.17`, …) in `dir` as `out`.
fn zig_cc(zig: &Path, target: &str, dir: &Path, out: &str, src: &Path, args: &[&str]) {
    let o = Command::new(zig)
        .args(["cc", "-target", target, "-O1", "-o", out])
        .arg(src)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "zig cc {out}: {}", text(&o));
}

/// The libcuda double (`libcuda.so.1`) and the CUDA client (`client`) for `target`, in `dir`.
fn zig_doubles(zig: &Path, target: &str, dir: &Path) {
    let doubles = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/doubles");
    zig_cc(
        zig,
        target,
        dir,
        "libcuda.so.1",
        &doubles.join("cuda.c"),
        &["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1"],
    );
    zig_cc(
        zig,
        target,
        dir,
        "client",
        &doubles.join("cuda_client.c"),
        &["-L.", "-l:libcuda.so.1", "-ldl", "-lpthread"],
    );
}

/// Debian's aarch64 glibc (libc6-arm64-cross), which `qemu-aarch64 -L` runs programs on.
const AARCH64_ROOT: &str = "/usr/aarch64-linux-gnu";

/// Runs an aarch64 `program` under `qemu-aarch64` with `env` in its environment (not qemu's).
fn emulated(program: &Path, env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new("qemu-aarch64");
    cmd.arg("-L").arg(AARCH64_ROOT);
    for (k, v) in env {
        cmd.arg("-E").arg(format!("{k}={v}"));
    }
    cmd.arg(program)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// At most the first 2000 characters of a program's output (a recursing wrapper prints
/// megabytes before it crashes).
fn head(o: &Output) -> String {
    text(o).chars().take(2000).collect()
}

/// The aarch64 build, run: its `dlsym` trampoline resolves another preloaded wrapper's
/// `dlsym(RTLD_NEXT, "puts")` as without it, in either preload order and from the wrapper's
/// constructor (it answered those lookups itself and the wrapper recursed until it crashed),
/// and a client's allocations over the libcuda double are converted by every lookup path.
#[test]
fn the_aarch64_interposer_runs_emulated() {
    let (Some(so), Some(zig)) = (var("MQFQ_PORTABLE_INTERPOSER_AARCH64"), var("MQFQ_ZIG")) else {
        return;
    };
    let emulator = Command::new("qemu-aarch64").arg("--version").output();
    let root_there = Path::new(AARCH64_ROOT).join("lib/libc.so.6").exists();
    if !(emulator.is_ok_and(|o| o.status.success()) && root_there) {
        assert!(
            std::env::var("MQFQ_REQUIRE_PORTABLE").as_deref() != Ok("1"),
            "qemu-aarch64 or {AARCH64_ROOT} missing (scripts/deps.sh installs them)"
        );
        eprintln!("SKIPPED: qemu-aarch64 or {AARCH64_ROOT} missing");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let target = "aarch64-linux-gnu.2.17";
    let cc = |out: &str, src: &Path, args: &[&str]| zig_cc(&zig, target, d, out, src, args);
    let write = |name: &str, src: &str| {
        std::fs::write(d.join(name), src).unwrap();
        d.join(name)
    };
    let wrap = "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <stdio.h>\n\
        static int (*next)(const char *);\n\
        __attribute__((constructor)) static void at_load(void) {\n\
            if (AT_LOAD) next = (int (*)(const char *))dlsym(RTLD_NEXT, \"puts\");\n}\n\
        int puts(const char *s) {\n\
            if (!next) next = (int (*)(const char *))dlsym(RTLD_NEXT, \"puts\");\n\
            if (!next) return -1;\n    fputs(\"wrapped: \", stdout);\n    return next(s);\n}\n";
    let wrap = write("wrap.c", wrap);
    cc("libwrap.so", &wrap, &["-shared", "-fPIC", "-DAT_LOAD=0"]);
    cc(
        "libwrapload.so",
        &wrap,
        &["-shared", "-fPIC", "-DAT_LOAD=1"],
    );
    let main = write(
        "main.c",
        "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n",
    );
    cc("main", &main, &[]);
    let ours = so.display().to_string();
    for lib in ["libwrap.so", "libwrapload.so"] {
        let wrapper = d.join(lib).display().to_string();
        for preload in [format!("{ours}:{wrapper}"), format!("{wrapper}:{ours}")] {
            let o = emulated(&d.join("main"), &[("LD_PRELOAD", preload.clone())]);
            assert!(
                o.status.success(),
                "{preload}: {:?}: {}",
                o.status,
                head(&o)
            );
            assert_eq!(
                String::from_utf8_lossy(&o.stdout),
                "wrapped: hello\n",
                "{preload}"
            );
        }
    }

    zig_doubles(&zig, target, d);
    std::fs::create_dir(d.join("ctl")).unwrap();
    let o = emulated(
        &d.join("client"),
        &[
            ("LD_PRELOAD", ours),
            ("LD_LIBRARY_PATH", d.display().to_string()),
            ("MQFQ_CTL_DIR", d.join("ctl").display().to_string()),
            ("FAKE_CUDA_LOG", d.join("cuda.log").display().to_string()),
        ],
    );
    assert_converted(&o, &head(&o));
}
