//! Pre-created GPU state: the NVIDIA container edits computed once per node and applied by the
//! shim at Create, instead of a hook process per container redoing node-constant work (NVML,
//! ld.so.cache parsing, device discovery).
//!
//! - [`edits`] — the CDI-shaped model of the edits, device selection, and applying them to an
//!   OCI spec (device nodes with type/major/minor already filled, read-only bind mounts, env,
//!   symlinks created in the rootfs; legacy NVIDIA prestart hooks dropped).
//! - [`ldcache`] — reading and writing `ld.so.cache` (the container's cache gets the driver's
//!   libraries).
//!
//! `mqfqd` builds the edits (CDI import or discovery, in the daemon's crate) at start and whenever
//! their sources change, and writes them with [`store`] to one JSON file (default
//! `/run/mqfq/nvidia-edits.json`); the shim reads that file at Create.

pub mod edits;
pub mod ldcache;

/// Where `mqfqd` writes the node's edits and the shim reads them.
pub const DEFAULT_EDITS_FILE: &str = "/run/mqfq/nvidia-edits.json";

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
