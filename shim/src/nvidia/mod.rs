//! Pre-created GPU state: the NVIDIA container edits computed once per node and applied by the
//! shim at Create, instead of a hook process per container redoing node-constant work (NVML,
//! ld.so.cache parsing, device discovery).
//!
//! - [`edits`] — the CDI-shaped model of the edits, device selection, and applying them to an
//!   OCI spec (device nodes with type/major/minor already filled, read-only bind mounts, env,
//!   symlinks created in the rootfs; legacy NVIDIA prestart hooks dropped).
//! - [`cdi`] — importing an existing CDI spec (`/etc/cdi`, `/var/run/cdi`; JSON or YAML).
//! - [`discover`] — discovery from a driver root when no CDI spec exists (ld.so.cache, `/dev`,
//!   `/proc/driver/nvidia`), with its ld.so.cache reader.
//! - [`warm`] — page-cache warming of driver and library files within a byte budget.
//!
//! `mqfqd` builds the edits at start and whenever their sources change, and writes them to one
//! JSON file (default `/run/mqfq/nvidia-edits.json`); the shim reads that file at Create.

pub mod cdi;
pub mod discover;
pub mod edits;
pub mod ldcache;
pub mod warm;

/// Where `mqfqd` writes the node's edits and the shim reads them.
pub const DEFAULT_EDITS_FILE: &str = "/run/mqfq/nvidia-edits.json";

/// Where earlier versions of the shim kept the `ld.so.cache` files they built (one per image,
/// never removed). The cache is now written into each container's rootfs; `mqfqd` clears this
/// directory at start.
pub const LEGACY_LDCACHE_DIR: &str = "/var/lib/mqfq/ldcache";

/// Removes the `ld.so.cache` files earlier versions left in `dir` (and the directory once
/// empty); returns how many. Only regular files named `*.cache` or `*.tmp` are touched.
pub fn collect_legacy_ldcache(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let ours = name.ends_with(".cache") || name.ends_with(".tmp");
        if ours
            && e.file_type().is_ok_and(|t| t.is_file())
            && std::fs::remove_file(e.path()).is_ok()
        {
            n += 1;
        }
    }
    let _ = std::fs::remove_dir(dir);
    n
}

use std::path::{Path, PathBuf};

use serde_json::Value;

use self::edits::{Applied, ContainerEdits, EditError, NodeEdits};
use crate::gpu::GpuWork;

/// The edits file the shim reads: `MQFQ_EDITS_FILE`, else [`DEFAULT_EDITS_FILE`].
#[must_use]
pub fn edits_file() -> PathBuf {
    std::env::var_os("MQFQ_EDITS_FILE")
        .map_or_else(|| PathBuf::from(DEFAULT_EDITS_FILE), PathBuf::from)
}

/// Loads the node's edits, `None` when `mqfqd` has written none (no driver, or no daemon).
///
/// # Errors
/// A file that exists but cannot be read or parsed.
pub fn load(file: &Path) -> Result<Option<NodeEdits>, EditError> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(EditError::io(format!("read {}", file.display()))(e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| EditError::Spec {
            file: file.to_owned(),
            reason: e.to_string(),
        })
}

/// Writes the edits atomically (temp file + rename), so a shim never reads half a file.
///
/// # Errors
/// The directory or file cannot be written.
pub fn store(file: &Path, edits: &NodeEdits) -> Result<(), EditError> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(EditError::io(format!("create {}", dir.display())))?;
    }
    let tmp = file.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(edits).unwrap_or_default();
    std::fs::write(&tmp, text).map_err(EditError::io(format!("write {}", tmp.display())))?;
    std::fs::rename(&tmp, file).map_err(EditError::io(format!("rename to {}", file.display())))
}

/// At Create of a GPU container: selects the edits for exactly the GPUs it was granted (see
/// `gpu`) and applies them to its spec. `None` when it was granted none, or the node has no edits
/// file (the spec stays as it came, hooks included).
///
/// # Errors
/// An unknown device, a bad edits file, or a spec of the wrong shape.
pub fn prepare(
    spec: &mut Value,
    work: &GpuWork,
    file: &Path,
) -> Result<Option<(ContainerEdits, Applied)>, EditError> {
    let Some(grant) = &work.grant else {
        return Ok(None);
    };
    let Some(node) = load(file)? else {
        return Ok(None);
    };
    let edits = node.select(grant)?;
    let applied = edits::apply(spec, &edits)?;
    Ok(Some((edits, applied)))
}

/// Builds the node's edits: an NVIDIA CDI spec when there is one, else discovery under
/// `driver_root`; `None` on a node without an NVIDIA driver. A broken setup (stale CDI spec,
/// unreadable ld.so.cache) comes back as edits carrying the error, so GPU containers fail at
/// Create with the cause rather than start without their GPU.
#[must_use]
pub fn build(cdi_dirs: &[PathBuf], driver_root: &Path, mps_pipe_dir: &Path) -> Option<NodeEdits> {
    let broken = |source: String, e: &EditError| NodeEdits {
        source,
        error: Some(e.to_string()),
        ..NodeEdits::default()
    };
    match cdi::import(cdi_dirs) {
        Ok(Some(e)) => return Some(e),
        Ok(None) => {}
        Err(e) => return Some(broken("cdi".into(), &e)),
    }
    match discover::discover(driver_root, mps_pipe_dir) {
        Ok(e) => Some(e),
        Err(EditError::NoDriver { .. }) => None,
        Err(e) => Some(broken(format!("discovery:{}", driver_root.display()), &e)),
    }
}

/// What the edits depend on, cheaply read: when it changes, `mqfqd` rebuilds them (driver
/// upgrade, GPUs added or removed, MIG reconfigured, MPS daemon started or stopped, CDI spec
/// regenerated).
#[must_use]
pub fn fingerprint(cdi_dirs: &[PathBuf], driver_root: &Path, mps_pipe_dir: &Path) -> String {
    use std::fmt::Write as _;
    let mut f = String::new();
    let version = std::fs::read_to_string(driver_root.join("proc/driver/nvidia/version"));
    let _ = write!(f, "{:?}|", version.ok());
    for dir in cdi_dirs.iter().map(PathBuf::as_path).chain([
        driver_root.join("dev").as_path(),
        driver_root.join("proc/driver/nvidia/gpus").as_path(),
        driver_root.join("proc/driver/nvidia-caps").as_path(),
    ]) {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| {
                        let n = e.file_name();
                        let n = n.to_string_lossy();
                        !dir.ends_with("dev") || n.starts_with("nvidia")
                    })
                    .map(|e| {
                        // Device nodes' times move with use: only CDI files count by time.
                        if !cdi_dirs.iter().any(|c| c == dir) {
                            return e.file_name().to_string_lossy().into_owned();
                        }
                        let mtime = e
                            .metadata()
                            .and_then(|m| m.modified())
                            .ok()
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map_or(0, |d| d.as_nanos());
                        format!("{}@{mtime}", e.file_name().to_string_lossy())
                    })
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        let _ = write!(f, "{}:{}|", dir.display(), names.join(","));
    }
    let _ = write!(f, "mps:{}", mps_pipe_dir.join("control").exists());
    f
}

#[cfg(test)]
mod legacy_tests {
    #[test]
    fn old_ld_caches_are_collected_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("ldcache");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("ab12.cache"), "x").unwrap();
        std::fs::write(d.join("ab12.77.tmp"), "x").unwrap();
        assert_eq!(super::collect_legacy_ldcache(&d), 2);
        assert!(!d.exists(), "the emptied directory goes too");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("notes.txt"), "keep").unwrap();
        assert_eq!(super::collect_legacy_ldcache(&d), 0);
        assert!(d.join("notes.txt").exists());
    }
}
