//! Test images built here, offline and byte for byte reproducible: a single-layer OCI image
//! tar of the host's static busybox, plus extra entries (the host's glibc for the CUDA tests).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

fn digest(b: &[u8]) -> String {
    let mut s = String::from("sha256:");
    for byte in Sha256::digest(b) {
        let _ = write!(s, "{byte:02x}");
    }
    s
}

fn header(path: &str, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_path(path).expect("tar path");
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    h
}

/// Builds a deterministic single-layer OCI image tar of the host's static busybox named `name`
/// with default command `cmd`: one symlink per applet, `/etc/passwd` and `/etc/group`, empty
/// `/proc`, `/sys`, `/dev`, `/tmp`.
///
/// # Errors
/// Reading busybox or writing the tar failed.
pub fn build_busybox_image(out: &Path, name: &str, cmd: &[&str]) -> std::io::Result<()> {
    build_image(out, name, cmd, &[])
}

/// An extra entry of a test image's layer (paths relative to the root, no leading `/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// A regular file with its bytes and mode.
    File(String, Vec<u8>, u32),
    /// A directory.
    Dir(String),
    /// A symlink `path → target`.
    Symlink(String, String),
    /// A FIFO.
    Fifo(String),
    /// A character device `major:minor`.
    CharDev(String, u32, u32),
}

/// The host's C library and loader as image entries, at the x86-64 Debian paths.
///
/// # Errors
/// The host has no glibc there.
pub fn host_glibc() -> std::io::Result<Vec<Item>> {
    let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6")?;
    let ld = std::fs::read("/lib64/ld-linux-x86-64.so.2")?;
    Ok(vec![
        Item::Dir("lib".into()),
        Item::Dir("lib/x86_64-linux-gnu".into()),
        Item::Dir("lib64".into()),
        Item::File("lib/x86_64-linux-gnu/libc.so.6".into(), libc, 0o755),
        Item::File("lib64/ld-linux-x86-64.so.2".into(), ld, 0o755),
    ])
}

/// [`build_busybox_image`] with `items` added to its layer (after busybox's own entries, so an
/// item may replace one).
///
/// # Errors
/// Reading busybox or writing the tar failed.
#[expect(
    clippy::too_many_lines,
    reason = "writes one image archive: layer, config, manifest, index in order"
)]
pub fn build_image(out: &Path, name: &str, cmd: &[&str], items: &[Item]) -> std::io::Result<()> {
    let bb = std::fs::read("/bin/busybox")?;
    let applets = Command::new("/bin/busybox").arg("--list").output()?;
    let mut applets: Vec<String> = String::from_utf8_lossy(&applets.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|a| a != "busybox" && !a.is_empty())
        .collect();
    applets.sort();
    let mut layer = tar::Builder::new(Vec::new());
    for d in ["bin", "dev", "etc", "proc", "sys", "tmp"] {
        let h = header(&format!("{d}/"), tar::EntryType::Directory, 0o755, 0);
        layer.append(&h, std::io::empty())?;
    }
    layer.append(
        &header(
            "bin/busybox",
            tar::EntryType::Regular,
            0o755,
            bb.len() as u64,
        ),
        &bb[..],
    )?;
    for a in &applets {
        let mut h = header(&format!("bin/{a}"), tar::EntryType::Symlink, 0o777, 0);
        h.set_link_name("busybox")?;
        h.set_cksum();
        layer.append(&h, std::io::empty())?;
    }
    for (p, c) in [
        ("etc/passwd", "root:x:0:0:root:/:/bin/sh\n"),
        ("etc/group", "root:x:0:\n"),
    ] {
        layer.append(
            &header(p, tar::EntryType::Regular, 0o644, c.len() as u64),
            c.as_bytes(),
        )?;
    }
    for item in items {
        match item {
            Item::File(p, data, mode) => layer.append(
                &header(p, tar::EntryType::Regular, *mode, data.len() as u64),
                &data[..],
            )?,
            Item::Dir(p) => layer.append(
                &header(&format!("{p}/"), tar::EntryType::Directory, 0o755, 0),
                std::io::empty(),
            )?,
            Item::Symlink(p, target) => {
                let mut h = header(p, tar::EntryType::Symlink, 0o777, 0);
                h.set_link_name(target)?;
                h.set_cksum();
                layer.append(&h, std::io::empty())?;
            }
            Item::Fifo(p) => {
                layer.append(&header(p, tar::EntryType::Fifo, 0o644, 0), std::io::empty())?
            }
            Item::CharDev(p, major, minor) => {
                let mut h = header(p, tar::EntryType::Char, 0o600, 0);
                h.set_device_major(*major)?;
                h.set_device_minor(*minor)?;
                h.set_cksum();
                layer.append(&h, std::io::empty())?;
            }
        }
    }
    let layer = layer.into_inner()?;
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": cmd},
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]}
    })
    .to_string()
    .into_bytes();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest(&layer), "size": layer.len()}]
    })
    .to_string()
    .into_bytes();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": digest(&manifest), "size": manifest.len(),
                       "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": "latest"}}]
    })
    .to_string()
    .into_bytes();
    let mut img = tar::Builder::new(std::fs::File::create(out)?);
    let mut add = |name: &str, data: &[u8]| -> std::io::Result<()> {
        img.append(
            &header(name, tar::EntryType::Regular, 0o644, data.len() as u64),
            data,
        )
    };
    // Docker's `docker load` reads the archive through `manifest.json` (as `docker save` writes
    // it beside the OCI layout); ctr reads `index.json`.
    let docker_manifest = serde_json::json!([{
        "Config": format!("blobs/sha256/{}", &digest(&config)[7..]),
        "RepoTags": [name.strip_prefix("docker.io/").unwrap_or(name)],
        "Layers": [format!("blobs/sha256/{}", &digest(&layer)[7..])]
    }])
    .to_string()
    .into_bytes();
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index)?;
    add("manifest.json", &docker_manifest)?;
    for b in [&layer, &config, &manifest] {
        let name = format!("blobs/sha256/{}", &digest(b)[7..]);
        add(&name, b)?;
    }
    img.into_inner()?.flush()
}
