//! Embeds the git revision for `-v` (".m" when the tree has uncommitted changes), and generates
//! the mqfqd ttrpc API from `proto/mqfqd.proto` (pure-Rust codegen: no protoc needed).

use std::process::Command;

fn main() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .is_some_and(|o| o.status.success() && !o.stdout.is_empty());
    if let Some(rev) = rev {
        let suffix = if dirty { ".m" } else { "" };
        println!("cargo:rustc-env=MQFQ_GIT_REVISION={rev}{suffix}");
    }
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into());
    ttrpc_codegen::Codegen::new()
        .out_dir(&out)
        .input("proto/mqfqd.proto")
        .include("proto")
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize {
            async_all: true,
            ..Default::default()
        })
        .run()
        .unwrap_or_else(|e| panic!("generating the mqfqd API from proto/mqfqd.proto: {e}"));
    // The generated files carry inner attributes, which `include!` cannot take; src/api.rs puts
    // the equivalent allows on the modules instead.
    for name in ["mqfqd.rs", "mqfqd_ttrpc.rs"] {
        let path = std::path::Path::new(&out).join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let kept: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("#!["))
            .map(|l| match l.strip_prefix("//!") {
                Some(rest) => format!("//{rest}\n"),
                None => format!("{l}\n"),
            })
            .collect();
        std::fs::write(&path, kept).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
    println!("cargo:rerun-if-changed=proto/mqfqd.proto");
    println!("cargo:rerun-if-changed=../.git/HEAD");
    println!("cargo:rerun-if-changed=../.git/index");
}
