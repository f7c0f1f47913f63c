//! The NVIDIA container edits as one file format: `mqfqd` builds the node's edits (CDI import or
//! discovery) and writes them with [`store`]; each pod's shim reads them with [`load`], selects
//! a container's GPUs and applies them to its OCI spec. The readers both sides need live here
//! too: [`ldcache`] (`ld.so.cache`, written into containers and read on the host) and [`elf`]
//! (a library's soname and glibc versions, from untrusted bytes).
//!
//! Its own crate so that `mqfqd` shares the format without linking the shim (containerd-shim,
//! runc, the task service): this crate depends on nothing of the project's. What touches a
//! container's rootfs (symlinks, the cache file) is the shim's, with its rootfs resolver.

pub mod edits;
pub mod elf;
pub mod ldcache;

use std::path::Path;

use serde::Serialize;

use self::edits::{EditError, NodeEdits};

/// Where `mqfqd` writes the node's edits and the shim reads them.
pub const DEFAULT_EDITS_FILE: &str = "/run/mqfq/nvidia-edits.json";

/// Which GPUs a container asked for, as it named them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSelection {
    /// All GPUs (`all`), or unspecified.
    All,
    /// Devices by index, UUID or MIG name.
    Devices(Vec<String>),
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
