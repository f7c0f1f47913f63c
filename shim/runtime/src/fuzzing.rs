//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not part of the runtime).
//!
//! Every parser of hostile input in the shim has one: what an image holds (`ld.so.cache`, ELF
//! libraries), what a pod writes in its spec (classification and annotations), what containerd
//! passes (runtime options, the shim's TOML config), and what a container process answers on
//! its control socket. (The daemon's — CDI specs, `mqfqd.toml`, shims' requests — are in
//! `mqfq_daemon::fuzzing`.) Each must answer
//! (a value or an error) and never panic, hang or allocate without bound; some also check a
//! property that must hold whatever the input.

use std::path::Path;

/// `ld.so.cache`: parse, merge with driver libraries, write, and parse back to the same entries.
pub fn ldcache(data: &[u8]) {
    use crate::nvidia::ldcache;
    let Ok(entries) = ldcache::parse(data) else {
        return;
    };
    let driver = [(
        "libcuda.so.1".to_owned(),
        "/usr/lib/libcuda.so.1".to_owned(),
    )];
    let out = ldcache::for_container(&entries, &driver);
    // The output never grows past the input plus the driver's entries: no amplification.
    assert!(
        out.len() <= data.len() + 64 + 24 * entries.len() + 4096,
        "{} from {}",
        out.len(),
        data.len()
    );
    let back = ldcache::parse(&out).expect("a written cache parses");
    let mut want: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| e.key != "libcuda.so.1")
        .map(|e| (e.key.as_ref(), e.value.as_ref()))
        .chain([("libcuda.so.1", "/usr/lib/libcuda.so.1")])
        .collect();
    let mut got: Vec<(&str, &str)> = back
        .iter()
        .map(|e| (e.key.as_ref(), e.value.as_ref()))
        .collect();
    want.sort_unstable();
    got.sort_unstable();
    assert_eq!(want, got);
}

/// ELF: soname and glibc versions; a library's needs never exceed what a glibc defines of it.
pub fn elf(data: &[u8]) {
    let _ = crate::elf::soname(data);
    let _ = crate::elf::glibc_defined(data);
    let _ = crate::elf::glibc_needed(data);
}

/// An OCI spec's classification and what the shim writes into it: under every access policy,
/// a grant only ever comes with GPU work.
pub fn classify(data: &[u8]) {
    use crate::gpu::{Classification, GpuAccess, classify};
    let Ok(spec) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    for access in [
        GpuAccess::default(),
        GpuAccess {
            env: true,
            cdi_annotations: true,
        },
    ] {
        if let Ok(Classification::Gpu(w)) = classify(&spec, "cid", access) {
            assert!(!w.function.is_empty());
        }
    }
    let mut s = spec.clone();
    if crate::uvm::wanted(&s).is_ok() {
        let _ = crate::uvm::add_to_spec(&mut s, Path::new("/l.so"), Path::new("/ctl"), "cid", true);
    }
    let mut s = spec;
    let _ = crate::nvidia::edits::apply(&mut s, &crate::nvidia::edits::ContainerEdits::default());
}

/// Runtime options as containerd sends them: the `Any`, its two known payloads, and the shim's
/// TOML config in a CRI body. A `config_path` is never read here (it names a file of the
/// operator's, not input).
pub fn options(data: &[u8]) {
    use containerd_shim_protos::protobuf::well_known_types::any::Any;
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let type_url = match pick % 3 {
        0 => "containerd.runc.v1.Options",
        1 => "runtimeoptions.v1.Options",
        _ => "example.com/unknown",
    };
    if pick % 3 == 1
        && let Ok((path, _)) = crate::options::decode_cri(rest)
        && !path.is_empty()
    {
        return;
    }
    let any = Any {
        type_url: type_url.into(),
        value: rest.to_vec(),
        ..Default::default()
    };
    let _ = crate::options::decode(Some(&any));
    if let Ok(text) = std::str::from_utf8(rest) {
        let _ = crate::options::parse_config(text, "fuzz");
    }
}

/// A container process's answers on its control socket, and its requests on the burst
/// socket, as the shim parses them.
pub fn interposer_reply(data: &[u8]) {
    for line in data.split(|b| *b == b'\n').take(64) {
        match crate::task::burst::parse(line) {
            Ok(crate::task::burst::Request::Begin) => assert_eq!(line, b"begin"),
            Ok(crate::task::burst::Request::End(d, None)) => {
                assert_eq!(line, format!("end {}", d.as_nanos()).as_bytes());
            }
            Ok(crate::task::burst::Request::End(d, Some(b))) => {
                assert_eq!(line, format!("end {} {b}", d.as_nanos()).as_bytes());
            }
            Err(_) => {}
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for cmd in [
        crate::uvm::client::Command::Status,
        crate::uvm::client::Command::Evict,
        crate::uvm::client::Command::Prefetch,
    ] {
        let _ = crate::uvm::client::parse_reply_text(cmd, text);
    }
}
