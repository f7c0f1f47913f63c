//! Pre-created GPU state: the NVIDIA container edits computed once per node and applied by the
//! shim at Create, instead of a hook process per container redoing node-constant work (NVML,
//! ld.so.cache parsing, device discovery).
//!
//! - [`edits`] — the CDI-shaped model of the edits, device selection, and applying them to an
//!   OCI spec (device nodes with type/major/minor already filled, read-only bind mounts, env;
//!   legacy NVIDIA prestart hooks dropped), in the `mqfq-edits` crate, which `mqfqd` shares.
//! - [`ldcache`] — reading and writing `ld.so.cache` (the container's cache gets the driver's
//!   libraries), from the same crate.
//! - [`rootfs`] — what the edits do inside a container's rootfs (symlinks, the cache file),
//!   through the shim's rootfs resolver.
//!
//! `mqfqd` builds the edits (CDI import or discovery, in the daemon's crate) at start and whenever
//! their sources change, and writes them with [`store`] to one JSON file (default
//! `/run/mqfq/nvidia-edits.json`); the shim reads that file at Create.

pub mod rootfs;

pub use mqfq_edits::{DEFAULT_EDITS_FILE, edits, ldcache, load, store};

use std::path::{Path, PathBuf};

use serde_json::Value;

use self::edits::{Applied, ContainerEdits, EditError};
use crate::gpu::GpuWork;

/// The edits file the shim reads: `MQFQ_EDITS_FILE`, else [`DEFAULT_EDITS_FILE`].
#[must_use]
pub fn edits_file() -> PathBuf {
    std::env::var_os("MQFQ_EDITS_FILE")
        .map_or_else(|| PathBuf::from(DEFAULT_EDITS_FILE), PathBuf::from)
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
