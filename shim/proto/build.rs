//! Generates the mqfqd ttrpc API from `mqfqd.proto` (pure-Rust codegen: no protoc needed).

fn main() {
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into());
    let dir = std::path::PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into()),
    );
    ttrpc_codegen::Codegen::new()
        .out_dir(&out)
        .input(dir.join("mqfqd.proto"))
        .include(&dir)
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize {
            async_all: true,
            ..Default::default()
        })
        .run()
        .unwrap_or_else(|e| panic!("generating the mqfqd API from mqfqd.proto: {e}"));
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
    println!("cargo:rerun-if-changed=mqfqd.proto");
}
