//! Injecting the CUDA interposer (`libmqfq_cuda.so`, issue 6) into GPU containers: a read-only
//! bind mount of the library, `LD_PRELOAD`, and a per-container control directory (host
//! `$MQFQ_CTL_ROOT/<namespace>/<id>`, `/run/mqfq/ctl` inside) named in `MQFQ_CTL_DIR`, where each
//! CUDA process of the container makes its control socket. Opt out per container with the
//! annotation `io.mqfq.uvm=off`. A node without the library installed (`MQFQ_INTERPOSER`,
//! default `/usr/lib/mqfq/libmqfq_cuda.so`) injects nothing.

pub mod client;

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::error::{Error, Result};

/// Annotation: `on` (default) or `off`.
pub const ANN_UVM: &str = "io.mqfq.uvm";
/// Where the library and the control directory appear in the container.
pub const CONTAINER_LIB: &str = "/usr/lib/mqfq/libmqfq_cuda.so";
/// The control directory in the container.
pub const CONTAINER_CTL: &str = "/run/mqfq/ctl";

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

/// Injects the interposer into a GPU container's spec; returns the host control directory it
/// made, or `None` (opted out, or not installed).
///
/// # Errors
/// A bad `io.mqfq.uvm` value, a spec of the wrong shape, or the directory cannot be made.
pub fn inject(
    spec: &mut Value,
    lib: &Path,
    root: &Path,
    ns: &str,
    id: &str,
) -> Result<Option<PathBuf>> {
    match spec
        .get("annotations")
        .and_then(|a| a.get(ANN_UVM))
        .and_then(Value::as_str)
    {
        None | Some("on") => {}
        Some("off") => return Ok(None),
        Some(v) => {
            return Err(Error::InvalidArgument(format!(
                "annotation {ANN_UVM}={v:?}: must be on or off"
            )));
        }
    }
    if !lib.is_file() {
        tracing::debug!("no interposer at {}: not injected", lib.display());
        return Ok(None);
    }
    let shape =
        |what: &str| Error::InvalidArgument(format!("OCI spec: `{what}` has the wrong shape"));
    let dir = ctl_dir(root, ns, id);
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
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    // The container's processes may run as any user; the directory is theirs alone.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .map_err(|e| Error::io(format!("chmod {}", dir.display()), e))?;
    Ok(Some(dir))
}

/// Removes a container's control directory (at Delete, or when Create fails).
pub fn cleanup(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!("remove {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injects_preload_mounts_and_env_unless_opted_out() {
        let t = tempfile::tempdir().unwrap();
        let lib = t.path().join("libmqfq_cuda.so");
        std::fs::write(&lib, "x").unwrap();
        let mut spec = json!({"process": {"env": ["LD_PRELOAD=/other.so", "PATH=/bin"]}});
        let dir = inject(&mut spec, &lib, t.path(), "ns", "c1")
            .unwrap()
            .unwrap();
        assert_eq!(dir, t.path().join("ns/c1"));
        assert!(dir.is_dir());
        let env = &spec["process"]["env"];
        assert_eq!(env[0], "PATH=/bin");
        assert_eq!(env[1], format!("LD_PRELOAD={CONTAINER_LIB}:/other.so"));
        assert_eq!(env[2], "MQFQ_CTL_DIR=/run/mqfq/ctl");
        assert_eq!(env[3], "MQFQ_CONTAINER_ID=c1");
        assert_eq!(spec["mounts"][1]["source"], dir.display().to_string());
        cleanup(&dir);
        assert!(!dir.exists());

        let mut off = json!({"process": {}, "annotations": {ANN_UVM: "off"}});
        assert!(
            inject(&mut off, &lib, t.path(), "ns", "c2")
                .unwrap()
                .is_none()
        );
        assert!(off.get("mounts").is_none());
        let mut bad = json!({"process": {}, "annotations": {ANN_UVM: "maybe"}});
        let e = inject(&mut bad, &lib, t.path(), "ns", "c3")
            .unwrap_err()
            .to_string();
        assert!(e.contains(ANN_UVM), "{e}");
        let mut none = json!({"process": {}});
        assert!(
            inject(
                &mut none,
                &t.path().join("missing.so"),
                t.path(),
                "ns",
                "c4"
            )
            .unwrap()
            .is_none()
        );
    }
}
