//! Importing NVIDIA edits from CDI specs (`nvidia-ctk cdi generate` output, JSON or YAML) in the
//! CDI directories. Later directories win, as in CDI (`/etc/cdi`, then `/var/run/cdi`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::edits::{ContainerEdits, EditError, NamedDevice, NodeEdits, Symlink};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    cdi_version: String,
    kind: String,
    #[serde(default)]
    devices: Vec<Device>,
    #[serde(default)]
    container_edits: ContainerEdits,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    #[serde(default)]
    container_edits: ContainerEdits,
}

fn spec_err(file: &Path, reason: impl Into<String>) -> EditError {
    EditError::Spec {
        file: file.to_owned(),
        reason: reason.into(),
    }
}

/// Turns `nvidia-cdi-hook create-symlinks --link target::link …` hooks into symlinks the shim
/// makes itself; other hooks stay listed (and are reported as not run).
fn convert_hooks(e: &mut ContainerEdits) {
    let mut kept = Vec::new();
    for h in std::mem::take(&mut e.hooks) {
        if h.args.iter().any(|a| a == "create-symlinks") {
            let mut it = h.args.iter();
            while let Some(a) = it.next() {
                let pair = if a == "--link" {
                    it.next().map(String::as_str)
                } else {
                    a.strip_prefix("--link=")
                };
                if let Some((target, link)) = pair.and_then(|p| p.split_once("::")) {
                    e.symlinks.push(Symlink {
                        link: link.to_owned(),
                        target: target.to_owned(),
                    });
                }
            }
        } else {
            kept.push(h);
        }
    }
    e.hooks = kept;
}

/// Parses one CDI spec into node edits.
///
/// # Errors
/// Unreadable, not JSON/YAML, not an NVIDIA kind, or a device without a name.
pub fn parse(file: &Path, text: &str) -> Result<NodeEdits, EditError> {
    let yaml = file.extension().is_some_and(|e| e == "yaml" || e == "yml");
    let spec: Spec = if yaml {
        serde_saphyr::from_str(text).map_err(|e| spec_err(file, e.to_string()))?
    } else {
        serde_json::from_str(text).map_err(|e| spec_err(file, e.to_string()))?
    };
    if !spec.kind.starts_with("nvidia.com/") {
        return Err(spec_err(
            file,
            format!("kind {:?} is not an NVIDIA kind", spec.kind),
        ));
    }
    if spec.cdi_version.is_empty() {
        return Err(spec_err(file, "cdiVersion is missing"));
    }
    let mut common = spec.container_edits;
    convert_hooks(&mut common);
    let mut devices: Vec<NamedDevice> = Vec::new();
    for d in spec.devices {
        if d.name.is_empty() {
            return Err(spec_err(file, "a device has no name"));
        }
        if d.name == "all" {
            continue;
        }
        let mut edits = d.container_edits;
        convert_hooks(&mut edits);
        // nvidia-ctk writes one entry per name (index, UUID) with the same edits: merge them.
        if let Some(same) = devices.iter_mut().find(|x| x.edits == edits) {
            same.names.push(d.name);
            continue;
        }
        let mig = d.name.contains(':') || d.name.starts_with("MIG-");
        devices.push(NamedDevice {
            names: vec![d.name],
            mig,
            edits,
        });
    }
    if devices.is_empty() {
        return Err(spec_err(file, "no devices"));
    }
    let driver_version = common
        .env
        .iter()
        .find_map(|e| e.strip_prefix("NVIDIA_DRIVER_VERSION="))
        .unwrap_or("")
        .to_owned();
    Ok(NodeEdits {
        source: format!("cdi:{}", file.display()),
        driver_version,
        common,
        devices,
        error: None,
    })
}

/// The NVIDIA spec in `dirs` (the last one found wins), if any, with device numbers filled.
///
/// # Errors
/// A spec that is malformed, or names device nodes that do not exist (stale).
pub fn import(dirs: &[PathBuf]) -> Result<Option<NodeEdits>, EditError> {
    let mut found: Option<NodeEdits> = None;
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !matches!(ext, "json" | "yaml" | "yml") {
                continue;
            }
            let text = std::fs::read_to_string(&f)
                .map_err(EditError::io(format!("read {}", f.display())))?;
            // Other vendors' specs live here too.
            if !text.contains("nvidia.com/") {
                continue;
            }
            let mut e = parse(&f, &text)?;
            derive_libraries(&mut e.common);
            e.fill_device_numbers()
                .map_err(|err| spec_err(&f, format!("stale or inconsistent spec: {err}")))?;
            found = Some(e);
        }
    }
    Ok(found)
}

/// The soname of a host library a CDI spec mounts (the first 256 MiB read: the dynamic
/// section and its strings sit near the start of every shared library).
fn library_soname(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut d = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(256 << 20)
        .read_to_end(&mut d)
        .ok()?;
    mqfq_edits::elf::soname(&d)
}

/// What `update-ldcache` would have registered: each mounted shared library's soname (read from
/// the host file) at its container directory, with the soname link `ldconfig` would have made.
fn derive_libraries(e: &mut ContainerEdits) {
    for m in &e.mounts {
        let cp = Path::new(&m.container_path);
        let Some(name) = cp.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !(name.starts_with("lib") && name.contains(".so")) {
            continue;
        }
        let Some(soname) = library_soname(Path::new(&m.host_path)) else {
            continue;
        };
        let dir = cp.parent().unwrap_or(Path::new("/"));
        let path = dir.join(&soname).display().to_string();
        if soname != name && !e.symlinks.iter().any(|s| s.link == path) {
            e.symlinks.push(Symlink {
                link: path.clone(),
                target: name.to_owned(),
            });
        }
        e.libraries.push(super::edits::Library { soname, path });
    }
}
