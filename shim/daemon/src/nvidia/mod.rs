//! Building the node's NVIDIA edits, which the shim applies at Create (`mqfq_edits`):
//!
//! - [`cdi`] — importing an existing CDI spec (`/etc/cdi`, `/var/run/cdi`; JSON or YAML).
//! - [`discover`] — discovery from a driver root when no CDI spec exists (ld.so.cache, `/dev`,
//!   `/proc/driver/nvidia`).
//! - [`warm`] — page-cache warming of driver and library files within a byte budget.
//!
//! Here rather than in the shim's crate: the YAML parser and the discovery code run once per node,
//! in `mqfqd`, never in a pod's shim.

pub mod cdi;
pub mod discover;
pub mod warm;

pub use mqfq_edits::{DEFAULT_EDITS_FILE, edits, ldcache, store};

use std::path::{Path, PathBuf};

use self::edits::{EditError, NodeEdits};

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
