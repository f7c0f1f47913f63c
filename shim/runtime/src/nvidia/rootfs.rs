//! What the node's edits do inside a container's rootfs: the driver's symlinks and its
//! `ld.so.cache`, every path resolved inside the root by the shim's resolver ([`Root`]), since
//! an image's own links must never lead the shim out of it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::edits::{self, ContainerEdits, EditError};
use super::ldcache;
use crate::rootfs::{Root, RootError};

/// The resolver's error, as the edits' (the caller's fault: a path in its image).
fn rootfs_error(e: RootError) -> EditError {
    EditError::Rootfs(Box::new(e))
}

/// Creates the edits' symlinks inside the container's root, resolving every path inside it (an
/// image's own symlinks never lead the shim out of it); an existing entry is left alone.
///
/// # Errors
/// A link path that is not absolute or has `..`, or one that cannot be created inside the root.
pub fn make_symlinks(root: &Root, edits: &ContainerEdits) -> Result<usize, EditError> {
    let mut n = 0;
    for s in &edits.symlinks {
        if !crate::rootfs::is_plain(&s.link) {
            return Err(EditError::Spec {
                file: PathBuf::from(&s.link),
                reason: "symlink path must be absolute without '..'".into(),
            });
        }
        if root.symlink(&s.link, &s.target).map_err(rootfs_error)? {
            n += 1;
        }
    }
    Ok(n)
}

/// Where the container's `ld.so.cache` went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LdCache {
    /// No driver library to add.
    Unchanged,
    /// Written into the rootfs as `/etc/ld.so.cache` (`ldconfig` in the container keeps working).
    Written {
        /// Entries taken from the image's own cache (0 when it had none or a bad one).
        image_entries: usize,
    },
    /// The rootfs refused the write (read-only): a file in the bundle, bind-mounted read-only.
    Mounted(PathBuf),
}

/// Gives the container an `ld.so.cache` listing the driver libraries: the image's own cache
/// (read from its rootfs as untrusted input: a regular file of at most
/// [`MAX_CACHE_BYTES`](ldcache::MAX_CACHE_BYTES), parsed with bounds) merged with
/// `edits.libraries`, written atomically into the rootfs. A missing or bad image cache is
/// ignored with a log line: the container still gets the driver libraries. Where the rootfs
/// cannot be written, the cache goes to `bundle/ld.so.cache` and is bind-mounted instead.
///
/// # Errors
/// Neither the rootfs nor the bundle can be written, or the spec has the wrong shape.
pub fn install_ld_cache(
    spec: &mut Value,
    root: &Root,
    edits: &ContainerEdits,
    bundle: &Path,
) -> Result<LdCache, EditError> {
    if edits.libraries.is_empty() {
        return Ok(LdCache::Unchanged);
    }
    let image = match root.read("/etc/ld.so.cache", ldcache::MAX_CACHE_BYTES) {
        Ok(bytes) => bytes,
        Err(e) => {
            tracing::warn!("image ld.so.cache ignored: {e}");
            None
        }
    };
    let entries = match image.as_deref().map(ldcache::parse) {
        Some(Ok(entries)) => entries,
        Some(Err(e)) => {
            tracing::warn!("image ld.so.cache ignored: {e}");
            Vec::new()
        }
        None => Vec::new(),
    };
    let driver: Vec<(String, String)> = edits
        .libraries
        .iter()
        .map(|l| (l.soname.clone(), l.path.clone()))
        .collect();
    let bytes = ldcache::for_container(&entries, &driver);
    match root.write_atomic("/etc/ld.so.cache", &bytes, 0o644) {
        Ok(()) => {
            return Ok(LdCache::Written {
                image_entries: entries.len(),
            });
        }
        Err(e) if e.errno() == Some(libc::EROFS) => {
            tracing::info!("rootfs is read-only ({e}): ld.so.cache bind-mounted instead");
        }
        Err(e) => return Err(rootfs_error(e)),
    }
    let file = bundle.join("ld.so.cache");
    std::fs::write(&file, bytes).map_err(EditError::io(format!("write {}", file.display())))?;
    edits::bind_ld_cache(spec, &file)?;
    Ok(LdCache::Mounted(file))
}

#[cfg(test)]
mod tests;
