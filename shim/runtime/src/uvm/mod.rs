//! Injecting the CUDA interposer (`libmqfq_cuda.so`, issue 6) into GPU containers: a read-only
//! bind mount of the library, `LD_PRELOAD`, and a per-container control directory (host
//! `$MQFQ_CTL_ROOT/<namespace>/<id>`, `/run/mqfq/ctl` inside) named in `MQFQ_CTL_DIR`, where each
//! CUDA process of the container makes its control socket. Opt out per container with the
//! annotation `io.mqfq.uvm=off`. A node without the library installed (`MQFQ_INTERPOSER`,
//! default `/usr/lib/mqfq/libmqfq_cuda.so`) injects nothing.
//!
//! The container's processes are untrusted, and the control directory is the one place they
//! write that the shim (root) reads. So: the host root of the directories is root-only (0700),
//! each container's directory is its own small tmpfs (64 inodes, 64 KiB: it can neither fill
//! host `/run` nor reach another container's), and [`client`] opens what it finds there without
//! following links and with a deadline on every command.
//!
//! A preloaded library that needs a newer glibc than the image has stops every program of the
//! container from starting. So the shim reads both — the newest `GLIBC_x.y` the interposer
//! needs and the newest the image's `libc.so.6` defines — and injects only where they fit;
//! elsewhere (an older glibc, musl, a static image) the container runs unpooled, with a log line.

pub mod client;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use mqfq_proto::warm::{ANNOTATION as WARM, Warm};
use serde_json::{Value, json};

use crate::elf::GlibcVersion;
use crate::error::{Error, Result};
use crate::rootfs::Root;

/// Annotation: `on` (default) or `off`.
pub const ANN_UVM: &str = "io.mqfq.uvm";
/// Annotation: which GPU allocations of the container stay native (never converted to managed
/// memory, so never evicted): `all`, or library file-name prefixes (`libfoo,libbar`) added to the
/// interposer's list of communication libraries. Passed to the interposer as `MQFQ_NATIVE`.
pub const ANN_NATIVE: &str = "io.mqfq.native-alloc";
/// The most library names the annotation may list, and the longest.
const NATIVE_NAMES: usize = 16;
const NATIVE_NAME_LEN: usize = 64;
/// Where the library and the control directory appear in the container.
pub const CONTAINER_LIB: &str = "/usr/lib/mqfq/libmqfq_cuda.so";
/// The control directory in the container.
pub const CONTAINER_CTL: &str = "/run/mqfq/ctl";
/// The per-container tmpfs: enough for one socket per CUDA process of a container.
const CTL_TMPFS: &str = "size=64k,nr_inodes=64,mode=1777";

/// Where an image's C library may be, in the order the loader's usual paths give.
const LIBC_PATHS: &[&str] = &[
    "/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/lib/aarch64-linux-gnu/libc.so.6",
    "/usr/lib/aarch64-linux-gnu/libc.so.6",
    "/lib64/libc.so.6",
    "/usr/lib64/libc.so.6",
    "/lib/libc.so.6",
    "/usr/lib/libc.so.6",
];
/// The largest `libc.so.6` read (glibc's is about 2 MiB).
const LIBC_CAP: u64 = 32 << 20;

/// The installed interposer: `MQFQ_INTERPOSER`, else `/usr/lib/mqfq/libmqfq_cuda.so`.
#[must_use]
pub fn interposer() -> PathBuf {
    std::env::var_os("MQFQ_INTERPOSER").map_or_else(|| PathBuf::from(CONTAINER_LIB), PathBuf::from)
}

/// Host root of the per-container control directories: `MQFQ_CTL_ROOT`, else `/run/mqfq/ctl`.
#[must_use]
pub fn ctl_root() -> PathBuf {
    std::env::var_os("MQFQ_CTL_ROOT").map_or_else(|| PathBuf::from(CONTAINER_CTL), PathBuf::from)
}

/// The control directory of a container on the host.
#[must_use]
pub fn ctl_dir(root: &Path, ns: &str, id: &str) -> PathBuf {
    root.join(ns).join(id)
}

fn env_set(env: &mut Vec<Value>, key: &str, value: &str) {
    env.retain(|e| {
        e.as_str()
            .is_none_or(|s| s.split_once('=').map_or(s, |(k, _)| k) != key)
    });
    env.push(json!(format!("{key}={value}")));
}

/// `io.mqfq.native-alloc`, checked: `all`, or up to 16 comma-separated library names of
/// letters, digits, `.`, `_`, `+` and `-` (at most 64 bytes each). `None` when absent.
///
/// # Errors
/// Any other value (the message names the annotation).
pub fn native_alloc(spec: &Value) -> Result<Option<String>> {
    let Some(v) = spec.get("annotations").and_then(|a| a.get(ANN_NATIVE)) else {
        return Ok(None);
    };
    let bad = |why: &str| {
        Error::InvalidArgument(format!(
            "annotation {ANN_NATIVE}: {why}; it must be `all` or up to {NATIVE_NAMES} \
             comma-separated library names"
        ))
    };
    let v = v.as_str().ok_or_else(|| bad("not a string"))?;
    let names: Vec<&str> = v.split(',').map(str::trim).collect();
    if names.iter().filter(|n| **n != "all").count() > NATIVE_NAMES {
        return Err(bad("too many names"));
    }
    for n in &names {
        let ok = !n.is_empty()
            && n.len() <= NATIVE_NAME_LEN
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
        if !ok {
            return Err(bad(&format!(
                "{:?} is not a library name",
                n.chars().take(NATIVE_NAME_LEN).collect::<String>()
            )));
        }
    }
    Ok(Some(names.join(",")))
}

/// The Warm-tier backend the pod chose (`io.mqfq.warm`), if any.
///
/// # Errors
/// Not a string, or not `checkpoint`, `uvm` or `off`.
pub fn warm_asked(spec: &Value) -> Result<Option<Warm>> {
    let Some(v) = spec.get("annotations").and_then(|a| a.get(WARM)) else {
        return Ok(None);
    };
    let v = v
        .as_str()
        .ok_or_else(|| Error::InvalidArgument(format!("annotation {WARM}: not a string")))?;
    v.parse()
        .map(Some)
        .map_err(|e| Error::invalid(format!("annotation {WARM}"), e))
}

/// Whether the container wants the interposer (`io.mqfq.uvm`, default on); also checks
/// `io.mqfq.native-alloc` and `io.mqfq.warm`, so a bad value fails Create before any work.
///
/// # Errors
/// A value other than `on` or `off`, or a bad `io.mqfq.native-alloc`.
pub fn wanted(spec: &Value) -> Result<bool> {
    native_alloc(spec)?;
    warm_asked(spec)?;
    match spec
        .get("annotations")
        .and_then(|a| a.get(ANN_UVM))
        .and_then(Value::as_str)
    {
        None | Some("on") => Ok(true),
        Some("off") => Ok(false),
        Some(v) => Err(Error::InvalidArgument(format!(
            "annotation {ANN_UVM}={v:?}: must be on or off"
        ))),
    }
}

/// The newest glibc version the installed library needs, read once per (path, size, mtime).
/// `None`: not installed, or not a library this machine can read.
#[must_use]
pub fn interposer_needs(lib: &Path) -> Option<GlibcVersion> {
    type Key = (PathBuf, u64, std::time::SystemTime);
    static CACHE: Mutex<Option<(Key, Option<GlibcVersion>)>> = Mutex::new(None);
    let md = std::fs::metadata(lib)
        .ok()
        .filter(std::fs::Metadata::is_file)?;
    let key = (lib.to_owned(), md.len(), md.modified().ok()?);
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((k, v)) = cache.as_ref()
        && *k == key
    {
        return *v;
    }
    let needs = std::fs::read(lib)
        .ok()
        .and_then(|d| crate::elf::glibc_needed(&d));
    *cache = Some((key, needs));
    needs
}

/// The newest glibc version the image's C library defines; `None` when it has no glibc (musl,
/// a static or distroless image) or one the shim cannot read.
#[must_use]
pub fn image_glibc(root: &Root) -> Option<GlibcVersion> {
    LIBC_PATHS
        .iter()
        .find_map(|p| match root.read(p, LIBC_CAP) {
            Ok(Some(d)) => crate::elf::glibc_defined(&d),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!("image C library: {e}");
                None
            }
        })
}

/// Whether the interposer can load into this image: `Err` says why not.
///
/// # Errors
/// The image's glibc is missing or older than the library needs.
pub fn fits(needs: GlibcVersion, image: Option<GlibcVersion>) -> std::result::Result<(), String> {
    match image {
        None => Err("the image has no glibc the interposer can load into".into()),
        Some(v) if v < needs => Err(format!(
            "the image's glibc {}.{} is older than the {}.{} the interposer needs",
            v.0, v.1, needs.0, needs.1
        )),
        Some(_) => Ok(()),
    }
}

/// Makes a container's control directory: the host root (and its namespace directory) made
/// root-only, then a small tmpfs of its own mounted there.
///
/// # Errors
/// The directories cannot be made or the tmpfs cannot be mounted.
pub fn make_ctl_dir(root: &Path, ns: &str, id: &str) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let io =
        |what: &str, p: &Path, e: std::io::Error| Error::io(format!("{what} {}", p.display()), e);
    let dir = ctl_dir(root, ns, id);
    for d in [root.to_owned(), root.join(ns)] {
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&d)
        {
            Ok(()) => {}
            Err(e) => return Err(io("create", &d, e)),
        }
        // An existing directory (made by an older shim 0777) is tightened.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("chmod", &d, e))?;
    }
    // One left by a shim that died before Delete: its tmpfs goes, never stacked under a new one.
    cleanup(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| io("create", &dir, e))?;
    let flags = nix::mount::MsFlags::MS_NOSUID
        | nix::mount::MsFlags::MS_NODEV
        | nix::mount::MsFlags::MS_NOEXEC;
    if let Err(e) = nix::mount::mount(
        Some("mqfq-ctl"),
        &dir,
        Some("tmpfs"),
        flags,
        Some(CTL_TMPFS),
    ) {
        let _ = std::fs::remove_dir(&dir);
        return Err(io("mount a tmpfs on", &dir, e.into()));
    }
    Ok(dir)
}

/// Whether GPU work of containers with the interposer is admitted a burst at a time (the
/// shim's `MQFQ_BURST`: `on`, the default, or `off` for Start / Resume gating of every GPU
/// container, as OpenWhisk with pauses through the shim had it).
#[must_use]
pub fn burst_mode() -> bool {
    !matches!(std::env::var("MQFQ_BURST").as_deref(), Ok("off" | "0"))
}

/// How long a burst's process stays idle, its work complete, before the burst ends: the
/// shim's `MQFQ_BURST_IDLE_MS` (default 5), passed to the interposer over any value the image
/// set (a longer one would hold a GPU slot while idle).
#[must_use]
pub fn burst_idle_ms() -> u64 {
    std::env::var("MQFQ_BURST_IDLE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| (1..=60_000).contains(v))
        .unwrap_or(5)
}

/// The longest a burst's first call waits inside the CUDA call for its grant, ms: the shim's
/// `MQFQ_BURST_WAIT_MS` (default 600 000, ten minutes), passed to the interposer over any value
/// the image set. A node serving probe-sensitive servers (a Python server's probes wait with its
/// GIL held) sets it below their probes' patience: past it the burst runs without admission
/// (docs/SECURITY.md §9). The node's setting, never a pod's: a wait a pod chose would let it
/// skip the queue by timing out.
#[must_use]
pub fn burst_wait_ms() -> u64 {
    std::env::var("MQFQ_BURST_WAIT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| (1..=3_600_000).contains(v))
        .unwrap_or(600_000)
}

/// Adds the interposer to a GPU container's spec: library mount, control directory mount,
/// `LD_PRELOAD`, `MQFQ_CTL_DIR`, `MQFQ_CONTAINER_ID`, `MQFQ_BURST=1` for burst admission, and
/// `MQFQ_NATIVE` from `io.mqfq.native-alloc` (when absent, the image's own `MQFQ_NATIVE`, if any,
/// stays: keeping memory native costs only the container's own evictability).
///
/// # Errors
/// A spec of the wrong shape.
pub fn add_to_spec(spec: &mut Value, lib: &Path, dir: &Path, id: &str, burst: bool) -> Result<()> {
    let shape =
        |what: &str| Error::InvalidArgument(format!("OCI spec: `{what}` has the wrong shape"));
    let native = native_alloc(spec)?;
    {
        let env = spec
            .get_mut("process")
            .and_then(|p| p.as_object_mut())
            .ok_or_else(|| shape("process"))?
            .entry("env")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .ok_or_else(|| shape("process.env"))?;
        let preload = env
            .iter()
            .filter_map(Value::as_str)
            .find_map(|e| e.strip_prefix("LD_PRELOAD="))
            .filter(|v| !v.is_empty())
            .map_or_else(
                || CONTAINER_LIB.to_owned(),
                |v| format!("{CONTAINER_LIB}:{v}"),
            );
        env_set(env, "LD_PRELOAD", &preload);
        env_set(env, "MQFQ_CTL_DIR", CONTAINER_CTL);
        env_set(env, "MQFQ_CONTAINER_ID", id);
        if let Some(n) = &native {
            env_set(env, "MQFQ_NATIVE", n);
        }
        // Set by the shim whatever the image said: the image does not choose its admission.
        if burst {
            env_set(env, "MQFQ_BURST", "1");
            env_set(env, "MQFQ_BURST_IDLE_MS", &burst_idle_ms().to_string());
            env_set(env, "MQFQ_BURST_WAIT_MS", &burst_wait_ms().to_string());
        } else {
            env.retain(|e| e.as_str().is_none_or(|s| !s.starts_with("MQFQ_BURST")));
        }
    }
    let mounts = spec
        .as_object_mut()
        .ok_or_else(|| shape("spec"))?
        .entry("mounts")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or_else(|| shape("mounts"))?;
    mounts.push(
        json!({"destination": CONTAINER_LIB, "source": lib.display().to_string(),
        "type": "bind", "options": ["ro", "nosuid", "nodev", "bind", "rprivate"]}),
    );
    mounts.push(
        json!({"destination": CONTAINER_CTL, "source": dir.display().to_string(),
        "type": "bind", "options": ["rw", "nosuid", "nodev", "noexec", "bind", "rprivate"]}),
    );
    Ok(())
}

/// Whether a CUDA process of the container had an export of converted memory refused: the
/// interposer leaves a file `exported` in the control directory. Looked at without opening or
/// following it; the container could plant it, which only makes its own function's memory
/// native.
#[must_use]
pub fn exported(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join("exported")).is_ok_and(|m| m.file_type().is_file())
}

/// Removes the mark once reported (removing a name never follows it: a link swapped in
/// meanwhile is itself removed).
pub fn clear_exported(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("exported"));
}

/// Removes a container's control directory (at Delete, when Create fails, and in `shim delete`
/// after a crash): its tmpfs unmounted (lazily: a process may still hold a socket), then the
/// directory.
pub fn cleanup(dir: &Path) {
    match nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
        Err(e) => tracing::warn!("unmount {}: {e}", dir.display()),
    }
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("remove {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
    }

    #[test]
    fn adds_preload_mounts_and_env_and_reads_the_opt_out() {
        let mut spec = json!({"process": {"env": ["LD_PRELOAD=/other.so", "PATH=/bin"]}});
        add_to_spec(
            &mut spec,
            Path::new("/lib/x.so"),
            Path::new("/run/ctl/ns/c1"),
            "c1",
            false,
        )
        .unwrap();
        let env = &spec["process"]["env"];
        assert_eq!(env[0], "PATH=/bin");
        assert_eq!(env[1], format!("LD_PRELOAD={CONTAINER_LIB}:/other.so"));
        assert_eq!(env[2], "MQFQ_CTL_DIR=/run/mqfq/ctl");
        assert_eq!(env[3], "MQFQ_CONTAINER_ID=c1");
        assert_eq!(spec["mounts"][0]["source"], "/lib/x.so");
        assert_eq!(spec["mounts"][1]["source"], "/run/ctl/ns/c1");
        assert!(wanted(&json!({})).unwrap());
        assert!(!wanted(&json!({"annotations": {ANN_UVM: "off"}})).unwrap());
        let e = wanted(&json!({"annotations": {ANN_UVM: "maybe"}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains(ANN_UVM), "{e}");
    }

    /// The spec's environment entries that start with `prefix`.
    fn env_with(spec: &Value, prefix: &str) -> Vec<String> {
        spec["process"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .filter(|e| e.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    }

    /// The burst settings are the shim's, whatever the image said: its idle time and the
    /// longest a burst waits for its grant (an image's shorter wait had let it skip the queue).
    #[test]
    fn the_burst_settings_are_the_shims_over_the_images() {
        let mut spec = json!({"process": {"env": [
            "MQFQ_BURST_WAIT_MS=1", "MQFQ_BURST_IDLE_MS=60000", "MQFQ_BURST=0"
        ]}});
        add_to_spec(&mut spec, Path::new("/l.so"), Path::new("/c"), "c1", true).unwrap();
        let mut got = env_with(&spec, "MQFQ_BURST");
        got.sort_unstable();
        let mut want = vec![
            "MQFQ_BURST=1".to_owned(),
            format!("MQFQ_BURST_IDLE_MS={}", burst_idle_ms()),
            format!("MQFQ_BURST_WAIT_MS={}", burst_wait_ms()),
        ];
        want.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn the_native_setting_reaches_the_interposer_and_bad_values_are_refused() {
        let mut spec = json!({"process": {"env": ["MQFQ_NATIVE=libimage"]},
            "annotations": {ANN_NATIVE: "all, libfoo.so"}});
        assert!(wanted(&spec).unwrap());
        add_to_spec(&mut spec, Path::new("/l.so"), Path::new("/c"), "c1", true).unwrap();
        assert_eq!(
            env_with(&spec, "MQFQ_NATIVE="),
            ["MQFQ_NATIVE=all,libfoo.so"],
            "the annotation wins"
        );
        // Without the annotation the image's own value stays.
        let mut spec = json!({"process": {"env": ["MQFQ_NATIVE=libimage"]}});
        add_to_spec(&mut spec, Path::new("/l.so"), Path::new("/c"), "c1", true).unwrap();
        assert_eq!(spec["process"]["env"][0], "MQFQ_NATIVE=libimage");
        let many = vec!["l"; NATIVE_NAMES + 1].join(",");
        for bad in [
            json!("lib/../../x"),
            json!(""),
            json!("a,,b"),
            json!("x y"),
            json!(7),
            json!(many),
            json!("l".repeat(NATIVE_NAME_LEN + 1)),
        ] {
            let spec = json!({"annotations": {ANN_NATIVE: bad}});
            let e = wanted(&spec).unwrap_err().to_string();
            assert!(e.contains(ANN_NATIVE), "{bad}: {e}");
        }
    }

    #[test]
    fn the_interposer_goes_only_where_the_image_glibc_is_new_enough() {
        fits((2, 17), Some((2, 31))).unwrap();
        fits((2, 31), Some((2, 31))).unwrap();
        let e = fits((2, 34), Some((2, 31))).unwrap_err();
        assert!(e.contains("2.31") && e.contains("2.34"), "{e}");
        assert!(fits((2, 17), None).is_err());
        // An image's libc found by its usual paths, through the image's own (in-root) links.
        let t = tempfile::tempdir().unwrap();
        let Ok(libc) = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6") else {
            return;
        };
        std::fs::create_dir_all(t.path().join("usr/lib64")).unwrap();
        std::fs::write(t.path().join("usr/lib64/libc-2.x.so"), &libc).unwrap();
        std::os::unix::fs::symlink("/usr/lib64", t.path().join("lib64")).unwrap();
        std::os::unix::fs::symlink("libc-2.x.so", t.path().join("usr/lib64/libc.so.6")).unwrap();
        let root = Root::open(t.path()).unwrap();
        assert_eq!(image_glibc(&root), crate::elf::glibc_defined(&libc));
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(image_glibc(&Root::open(empty.path()).unwrap()), None);
    }

    #[test]
    fn control_directories_are_root_only_and_bounded() {
        use std::os::unix::fs::PermissionsExt;
        if !is_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("ctl");
        let dir = make_ctl_dir(&root, "ns", "c1").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("ns")), 0o700);
        assert_eq!(mode(&dir), 0o1777, "the tmpfs root");
        // 64 inodes: a container cannot make more entries than that.
        let mut made = 0;
        for i in 0..200 {
            if std::fs::write(dir.join(format!("f{i}")), "").is_err() {
                break;
            }
            made += 1;
        }
        assert!(made < 64, "{made}");
        // 64 KiB: nor fill it.
        assert!(std::fs::write(dir.join("big"), vec![0u8; 1 << 20]).is_err());
        cleanup(&dir);
        assert!(!dir.exists());
        assert!(
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .all(|l| !l.contains(&*dir.to_string_lossy()))
        );
    }
}
