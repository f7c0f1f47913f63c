//! The node's NVIDIA container edits, CDI-shaped (field names as in CDI specs), and how the shim
//! applies them to a container's OCI spec.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::GpuSelection;

/// Why edits could not be built or applied; each names the device, file or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The container asked for a GPU the node's edits do not have.
    #[error("GPU {name:?} requested but not on this node (known: {known})")]
    UnknownDevice {
        /// The requested name.
        name: String,
        /// The names that exist.
        known: String,
    },
    /// A device node lacks type or major/minor, and the host node could not be read.
    #[error("device node {path}: {reason}")]
    DeviceNode {
        /// Container path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A CDI spec or the edits file is malformed or inconsistent.
    #[error("{file}: {reason}")]
    Spec {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The driver is not there (no device nodes, no driver version).
    #[error("no NVIDIA driver under {root}: {reason}")]
    NoDriver {
        /// The driver root searched.
        root: PathBuf,
        /// What was missing.
        reason: String,
    },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The OCI spec has an unexpected shape.
    #[error("OCI spec: {0}")]
    OciSpec(String),
    /// A path inside the container's rootfs could not be used (the shim's rootfs resolver's
    /// error, kept as the source).
    #[error(transparent)]
    Rootfs(Box<dyn std::error::Error + Send + Sync>),
}

impl EditError {
    /// Whether the container's request is at fault (a GPU the node does not have, a spec of the
    /// wrong shape) rather than the node (a broken or unreadable edits file, a driver problem):
    /// the first is the caller's invalid argument, the second a node not ready for GPU work.
    #[must_use]
    pub fn is_callers(&self) -> bool {
        matches!(
            self,
            EditError::UnknownDevice { .. } | EditError::OciSpec(_) | EditError::Rootfs(_)
        )
    }

    /// Maps an I/O error to [`EditError::Io`] saying what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EditError {
        let what = what.into();
        move |source| EditError::Io { what, source }
    }
}

/// A device node, as in CDI `deviceNodes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host (default: `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` or `b`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Major number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// File mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// cgroup permissions (default `rwm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    /// Owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A mount, as in CDI `mounts`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Host path.
    pub host_path: String,
    /// Container path.
    pub container_path: String,
    /// Mount type (default `bind`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Options (default `ro,nosuid,nodev,rbind,rprivate`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// A hook, as in CDI `hooks` (kept to know what the spec asked for; see [`ContainerEdits`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// Stage (`createContainer`, …).
    pub hook_name: String,
    /// Binary.
    pub path: String,
    /// argv.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

/// A symlink to create in the container's rootfs (`link` → `target`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Symlink {
    /// Where the link goes (container path).
    pub link: String,
    /// What it points to.
    pub target: String,
}

/// A driver library the container's `ld.so.cache` must list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Library {
    /// Its soname (`libcuda.so.1`).
    pub soname: String,
    /// Where the loader finds it in the container.
    pub path: String,
}

/// One set of edits, as CDI `containerEdits`, plus the symlinks the shim creates itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerEdits {
    /// `KEY=value` entries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// Hooks the source asked for. The shim runs none: `create-symlinks` becomes
    /// [`symlinks`](Self::symlinks), and the rest are reported as skipped.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Symlinks created in the rootfs at Create.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub symlinks: Vec<Symlink>,
    /// Driver libraries for the container's `ld.so.cache` (replaces `update-ldcache`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub libraries: Vec<Library>,
}

impl ContainerEdits {
    /// Appends `other`, without duplicate device nodes, mounts or symlinks.
    pub fn merge(&mut self, other: &ContainerEdits) {
        for e in &other.env {
            if !self.env.contains(e) {
                self.env.push(e.clone());
            }
        }
        for d in &other.device_nodes {
            if !self.device_nodes.iter().any(|x| x.path == d.path) {
                self.device_nodes.push(d.clone());
            }
        }
        for m in &other.mounts {
            if !self
                .mounts
                .iter()
                .any(|x| x.container_path == m.container_path)
            {
                self.mounts.push(m.clone());
            }
        }
        for h in &other.hooks {
            if !self.hooks.contains(h) {
                self.hooks.push(h.clone());
            }
        }
        for s in &other.symlinks {
            if !self.symlinks.contains(s) {
                self.symlinks.push(s.clone());
            }
        }
        for l in &other.libraries {
            if !self.libraries.contains(l) {
                self.libraries.push(l.clone());
            }
        }
    }
}

/// One GPU or MIG device and its own edits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedDevice {
    /// Names it answers to: index (`0`), UUID (`GPU-…`), MIG (`0:1`, `MIG-…`).
    pub names: Vec<String>,
    /// Whether it is a MIG device (not part of `all`, which means whole GPUs).
    #[serde(default)]
    pub mig: bool,
    /// Its edits (its device nodes, mostly).
    pub edits: ContainerEdits,
}

/// The node's edits: built once by `mqfqd`, applied by the shim to each GPU container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEdits {
    /// Where they came from (`cdi:<file>` or `discovery:<root>`).
    pub source: String,
    /// The driver version, when known.
    #[serde(default)]
    pub driver_version: String,
    /// Edits every GPU container gets.
    pub common: ContainerEdits,
    /// Per-device edits.
    pub devices: Vec<NamedDevice>,
    /// Set when the node's NVIDIA setup is broken (a stale or inconsistent CDI spec): GPU
    /// containers then fail at Create with this message instead of starting without a GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl NodeEdits {
    /// Every name a device answers to, for messages.
    fn known(&self) -> String {
        let names: Vec<&str> = self
            .devices
            .iter()
            .flat_map(|d| d.names.iter().map(String::as_str))
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(", ")
        }
    }

    /// The edits for exactly the GPUs a container asked for: the common edits plus each named
    /// device's (`All`: every whole GPU).
    ///
    /// # Errors
    /// [`EditError::UnknownDevice`] naming the first device the node does not have.
    pub fn select(&self, wanted: &GpuSelection) -> Result<ContainerEdits, EditError> {
        if let Some(e) = &self.error {
            return Err(EditError::Spec {
                file: PathBuf::from(&self.source),
                reason: e.clone(),
            });
        }
        let mut out = self.common.clone();
        match wanted {
            GpuSelection::All => {
                for d in self.devices.iter().filter(|d| !d.mig) {
                    out.merge(&d.edits);
                }
            }
            GpuSelection::Devices(names) => {
                for n in names {
                    let d = self
                        .devices
                        .iter()
                        .find(|d| d.names.iter().any(|x| x == n))
                        .ok_or_else(|| EditError::UnknownDevice {
                            name: n.clone(),
                            known: self.known(),
                        })?;
                    out.merge(&d.edits);
                }
            }
        }
        Ok(out)
    }

    /// Fills `type`, `major` and `minor` of device nodes that lack them from the host nodes, so
    /// that applying them is pure data.
    ///
    /// # Errors
    /// A node that is missing or not a device.
    pub fn fill_device_numbers(&mut self) -> Result<(), EditError> {
        let all =
            std::iter::once(&mut self.common).chain(self.devices.iter_mut().map(|d| &mut d.edits));
        for e in all {
            for n in &mut e.device_nodes {
                if n.kind.is_some() && n.major.is_some() {
                    continue;
                }
                let host = n.host_path.clone().unwrap_or_else(|| n.path.clone());
                let (kind, major, minor) =
                    stat_device(Path::new(&host)).map_err(|reason| EditError::DeviceNode {
                        path: n.path.clone(),
                        reason,
                    })?;
                n.kind = Some(kind.into());
                n.major = Some(major);
                n.minor = Some(minor);
            }
        }
        Ok(())
    }
}

/// `(type, major, minor)` of a device node.
///
/// # Errors
/// Missing, or not a character or block device.
pub fn stat_device(path: &Path) -> Result<(&'static str, i64, i64), String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let kind = if md.file_type().is_char_device() {
        "c"
    } else if md.file_type().is_block_device() {
        "b"
    } else {
        return Err(format!("{} is not a device node", path.display()));
    };
    let rdev = md.rdev();
    let number = |n: u64| {
        i64::try_from(n).map_err(|_| format!("{}: device number {n} out of range", path.display()))
    };
    let major = number(nix::sys::stat::major(rdev))?;
    let minor = number(nix::sys::stat::minor(rdev))?;
    Ok((kind, major, minor))
}

/// What [`apply`] did, for the log line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Device nodes added.
    pub devices: usize,
    /// Mounts added.
    pub mounts: usize,
    /// Legacy NVIDIA hooks removed from the spec.
    pub hooks_dropped: usize,
    /// Source hooks the shim did not run (other than create-symlinks).
    pub hooks_skipped: Vec<String>,
}

fn is_nvidia_legacy_hook(h: &Value) -> bool {
    h.get("path").and_then(Value::as_str).is_some_and(|p| {
        let name = p.rsplit('/').next().unwrap_or(p);
        matches!(
            name,
            "nvidia-container-runtime-hook" | "nvidia-container-toolkit"
        )
    })
}

fn obj<'a>(
    v: &'a mut Value,
    key: &str,
) -> Result<&'a mut serde_json::Map<String, Value>, EditError> {
    let m = v
        .as_object_mut()
        .ok_or_else(|| EditError::OciSpec("not an object".into()))?;
    let e = m.entry(key.to_owned()).or_insert_with(|| json!({}));
    e.as_object_mut()
        .ok_or_else(|| EditError::OciSpec(format!("`{key}` is not an object")))
}

fn arr<'a>(
    m: &'a mut serde_json::Map<String, Value>,
    key: &str,
) -> Result<&'a mut Vec<Value>, EditError> {
    let e = m.entry(key.to_owned()).or_insert_with(|| json!([]));
    e.as_array_mut()
        .ok_or_else(|| EditError::OciSpec(format!("`{key}` is not an array")))
}

/// Applies edits to an OCI spec (as JSON): env (a key already set is replaced), device nodes
/// into `linux.devices` with allow rules in `linux.resources.devices`, read-only bind mounts, and
/// the NVIDIA legacy prestart hooks removed (the edits replace them: nothing runs twice).
///
/// # Errors
/// A device node without type/major/minor, or a spec of the wrong shape.
pub fn apply(spec: &mut Value, edits: &ContainerEdits) -> Result<Applied, EditError> {
    let mut applied = Applied::default();
    // Env.
    {
        let process = obj(spec, "process")?;
        let env = arr(process, "env")?;
        for kv in &edits.env {
            let key = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k);
            env.retain(|e| {
                e.as_str()
                    .is_none_or(|s| s.split_once('=').map_or(s, |(k, _)| k) != key)
            });
            env.push(json!(kv));
        }
    }
    // Devices.
    {
        let linux = obj(spec, "linux")?;
        let mut rules = Vec::new();
        {
            let devices = arr(linux, "devices")?;
            for n in &edits.device_nodes {
                let (Some(kind), Some(major), Some(minor)) = (&n.kind, n.major, n.minor) else {
                    return Err(EditError::DeviceNode {
                        path: n.path.clone(),
                        reason: "type, major and minor must be known before Create".into(),
                    });
                };
                devices.retain(|d| d.get("path").and_then(Value::as_str) != Some(n.path.as_str()));
                let mut d = json!({"path": n.path, "type": kind, "major": major, "minor": minor});
                if let Some(m) = n.file_mode {
                    d["fileMode"] = json!(m);
                }
                if let Some(u) = n.uid {
                    d["uid"] = json!(u);
                }
                if let Some(g) = n.gid {
                    d["gid"] = json!(g);
                }
                devices.push(d);
                rules.push(json!({
                    "allow": true,
                    "type": kind,
                    "major": major,
                    "minor": minor,
                    "access": n.permissions.clone().unwrap_or_else(|| "rwm".into()),
                }));
                applied.devices += 1;
            }
        }
        if !rules.is_empty() {
            let resources = linux
                .entry("resources".to_owned())
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .ok_or_else(|| EditError::OciSpec("`linux.resources` is not an object".into()))?;
            arr(resources, "devices")?.extend(rules);
        }
    }
    // Mounts.
    {
        let m = spec
            .as_object_mut()
            .ok_or_else(|| EditError::OciSpec("not an object".into()))?;
        let mounts = arr(m, "mounts")?;
        for mt in &edits.mounts {
            let options = if mt.options.is_empty() {
                ["ro", "nosuid", "nodev", "rbind", "rprivate"]
                    .map(String::from)
                    .to_vec()
            } else {
                mt.options.clone()
            };
            mounts.retain(|x| {
                x.get("destination").and_then(Value::as_str) != Some(mt.container_path.as_str())
            });
            mounts.push(json!({
                "destination": mt.container_path,
                "source": mt.host_path,
                "type": mt.kind.clone().unwrap_or_else(|| "bind".into()),
                "options": options,
            }));
            applied.mounts += 1;
        }
    }
    // Hooks: drop the legacy NVIDIA prestart hook; report source hooks not run.
    if let Some(hooks) = spec.get_mut("hooks").and_then(Value::as_object_mut) {
        for stage in ["prestart", "createRuntime", "createContainer"] {
            if let Some(list) = hooks.get_mut(stage).and_then(Value::as_array_mut) {
                let before = list.len();
                list.retain(|h| !is_nvidia_legacy_hook(h));
                applied.hooks_dropped += before - list.len();
            }
        }
    }
    for h in &edits.hooks {
        let what = h.args.get(1).cloned().unwrap_or_else(|| h.path.clone());
        let replaced =
            what == "create-symlinks" || (what == "update-ldcache" && !edits.libraries.is_empty());
        if !replaced {
            applied.hooks_skipped.push(what);
        }
    }
    Ok(applied)
}

/// Points the container's `/etc/ld.so.cache` at `file` (a read-only bind mount), replacing any
/// mount there: where the rootfs cannot take the cache, the bundle's copy stands in.
///
/// # Errors
/// The spec has the wrong shape.
pub fn bind_ld_cache(spec: &mut Value, file: &Path) -> Result<(), EditError> {
    let m = spec
        .as_object_mut()
        .ok_or_else(|| EditError::OciSpec("not an object".into()))?;
    let mounts = arr(m, "mounts")?;
    mounts.retain(|x| x.get("destination").and_then(Value::as_str) != Some("/etc/ld.so.cache"));
    mounts.push(json!({
        "destination": "/etc/ld.so.cache",
        "source": file.display().to_string(),
        "type": "bind",
        "options": ["ro", "nosuid", "nodev", "bind", "rprivate"],
    }));
    Ok(())
}

#[cfg(test)]
mod tests;
