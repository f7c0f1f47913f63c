//! Discovery of the NVIDIA edits from a driver root, for nodes without a CDI spec: the driver
//! version and GPUs from `/proc/driver/nvidia`, device nodes from `/dev` (type and numbers read
//! once here), driver libraries from the root's `/etc/ld.so.cache`, binaries, firmware and IPC
//! sockets. The root is `/` in production; tests point it at a fake driver root.

use std::path::{Path, PathBuf};

use super::edits::{ContainerEdits, DeviceNode, EditError, Mount, NamedDevice, NodeEdits, Symlink};

/// Driver libraries (by soname prefix) mounted into GPU containers: utility and compute.
pub const LIBRARIES: &[&str] = &[
    "libnvidia-ml.so",
    "libnvidia-cfg.so",
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-opencl.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
];

/// Driver binaries mounted when present.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

const CONTROL_NODES: &[&str] = &[
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// The `(soname, path)` entries of a glibc ld.so.cache.
///
/// # Errors
/// Unreadable, or not an ld.so.cache.
pub fn read_ld_cache(path: &Path) -> Result<Vec<(String, String)>, EditError> {
    use std::io::Read;
    let mut data = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(super::ldcache::MAX_CACHE_BYTES)
                .read_to_end(&mut data)
        })
        .map_err(EditError::io(format!("read {}", path.display())))?;
    super::ldcache::parse(&data)
        .map(|v| {
            v.into_iter()
                .map(|e| (e.key.into_owned(), e.value.into_owned()))
                .collect()
        })
        .map_err(|reason| EditError::Spec {
            file: path.to_owned(),
            reason,
        })
}

fn host(root: &Path, path: &str) -> String {
    root.join(path.trim_start_matches('/'))
        .display()
        .to_string()
}

fn node(root: &Path, path: &str) -> DeviceNode {
    DeviceNode {
        path: path.to_owned(),
        host_path: Some(host(root, path)),
        ..DeviceNode::default()
    }
}

fn driver_version(root: &Path) -> Result<String, EditError> {
    let f = root.join("proc/driver/nvidia/version");
    let text = std::fs::read_to_string(&f).map_err(|e| EditError::NoDriver {
        root: root.to_owned(),
        reason: format!("{}: {e}", f.display()),
    })?;
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 …"
    text.split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
        .ok_or_else(|| EditError::NoDriver {
            root: root.to_owned(),
            reason: format!("no version number in {}", f.display()),
        })
}

/// `(minor, uuid)` per GPU in bus order (NVML's index order), from
/// `/proc/driver/nvidia/gpus/<bus id>/information`.
fn gpus(root: &Path) -> Vec<(u32, Option<String>)> {
    let dir = root.join("proc/driver/nvidia/gpus");
    let mut buses: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    buses.sort();
    let mut out = Vec::new();
    for b in buses {
        let info = std::fs::read_to_string(b.join("information")).unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim_start_matches(':').trim().to_owned())
        };
        if let Some(minor) = field("Device Minor").and_then(|m| m.parse().ok()) {
            out.push((minor, field("GPU UUID")));
        }
    }
    if out.is_empty() {
        // No /proc details: the device nodes themselves, by minor.
        let mut minors: Vec<u32> = std::fs::read_dir(root.join("dev"))
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter_map(|e| e.file_name().to_str()?.strip_prefix("nvidia")?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        minors.sort_unstable();
        out = minors.into_iter().map(|m| (m, None)).collect();
    }
    out
}

/// Whether the MPS pipe directory is the MPS daemon's: a real directory (not a symlink) owned by
/// root and writable by nobody else. The default (`/tmp/nvidia-mps`) lies in a world-writable
/// directory, so any local user could make it first and have it mounted read-write into every
/// GPU container.
#[must_use]
pub fn trusted_mps_dir(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::symlink_metadata(dir) else {
        return false;
    };
    let ok = md.is_dir() && md.uid() == 0 && md.mode() & 0o022 == 0;
    if !ok {
        tracing::warn!(
            "MPS pipe directory {} is not a root-owned directory only root can write: not mounted",
            dir.display()
        );
    }
    ok
}

/// The libraries of driver `version`, through the root's own ld.so.cache: each mounted at its
/// real name, its cache name and development name (`libcuda.so`, which frameworks dlopen)
/// linked to it.
fn add_libraries(root: &Path, version: &str, common: &mut ContainerEdits) -> Result<(), EditError> {
    let cache = read_ld_cache(&root.join("etc/ld.so.cache"))?;
    for (soname, path) in cache {
        if !LIBRARIES.iter().any(|p| soname.starts_with(p)) {
            continue;
        }
        let host_link = PathBuf::from(host(root, &path));
        let Ok(real) = std::fs::canonicalize(&host_link) else {
            continue;
        };
        let Some(real_name) = real.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !real_name.ends_with(version) {
            continue;
        }
        let dir = Path::new(&path).parent().unwrap_or(Path::new("/"));
        let container_real = dir.join(real_name).display().to_string();
        if !common
            .mounts
            .iter()
            .any(|m| m.container_path == container_real)
        {
            common.mounts.push(Mount {
                host_path: real.display().to_string(),
                container_path: container_real.clone(),
                ..Mount::default()
            });
        }
        common.libraries.push(super::edits::Library {
            soname: soname.clone(),
            path: path.clone(),
        });
        if path != container_real {
            common.symlinks.push(Symlink {
                link: path.clone(),
                target: real_name.to_owned(),
            });
        }
        // The development name (libcuda.so) that frameworks dlopen.
        if let Some(base) = soname.split(".so").next() {
            let dev = dir.join(format!("{base}.so")).display().to_string();
            if dev != path && !common.symlinks.iter().any(|s| s.link == dev) {
                common.symlinks.push(Symlink {
                    link: dev,
                    target: soname.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Discovers the edits under `root`; `mps_pipe_dir` is mounted when an MPS daemon has made it.
///
/// # Errors
/// No driver (version file, GPUs), an unreadable ld.so.cache, or device nodes that are not
/// devices.
pub fn discover(root: &Path, mps_pipe_dir: &Path) -> Result<NodeEdits, EditError> {
    let version = driver_version(root)?;
    let gpus = gpus(root);
    if gpus.is_empty() {
        return Err(EditError::NoDriver {
            root: root.to_owned(),
            reason: "no GPUs in /proc/driver/nvidia/gpus and no /dev/nvidiaN".into(),
        });
    }
    let mut common = ContainerEdits {
        env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
        ..ContainerEdits::default()
    };
    for p in CONTROL_NODES {
        if root.join(p.trim_start_matches('/')).exists() {
            common.device_nodes.push(node(root, p));
        }
    }
    add_libraries(root, &version, &mut common)?;
    if common.mounts.is_empty() {
        return Err(EditError::NoDriver {
            root: root.to_owned(),
            reason: format!(
                "no driver {version} libraries in {}/etc/ld.so.cache",
                root.display()
            ),
        });
    }
    for b in BINARIES {
        let p = format!("/usr/bin/{b}");
        if root.join(p.trim_start_matches('/')).is_file() {
            common.mounts.push(Mount {
                host_path: host(root, &p),
                container_path: p,
                ..Mount::default()
            });
        }
    }
    let fw = format!("/lib/firmware/nvidia/{version}");
    if root.join(fw.trim_start_matches('/')).is_dir() {
        common.mounts.push(Mount {
            host_path: host(root, &fw),
            container_path: fw,
            ..Mount::default()
        });
    }
    let persistenced = "/run/nvidia-persistenced/socket";
    if root.join(persistenced.trim_start_matches('/')).exists() {
        common.mounts.push(Mount {
            host_path: host(root, persistenced),
            container_path: persistenced.into(),
            ..Mount::default()
        });
    }
    if trusted_mps_dir(mps_pipe_dir) {
        common.mounts.push(Mount {
            host_path: mps_pipe_dir.display().to_string(),
            container_path: mps_pipe_dir.display().to_string(),
            kind: None,
            options: ["rbind", "rprivate", "nosuid", "nodev"]
                .map(String::from)
                .to_vec(),
        });
    }
    let devices = gpus
        .into_iter()
        .enumerate()
        .map(|(i, (minor, uuid))| {
            let mut names = vec![i.to_string()];
            names.extend(uuid);
            NamedDevice {
                names,
                mig: false,
                edits: ContainerEdits {
                    device_nodes: vec![node(root, &format!("/dev/nvidia{minor}"))],
                    ..ContainerEdits::default()
                },
            }
        })
        .collect();
    let mut edits = NodeEdits {
        source: format!("discovery:{}", root.display()),
        driver_version: version,
        common,
        devices,
        error: None,
    };
    edits.fill_device_numbers()?;
    Ok(edits)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn only_a_root_owned_mps_directory_is_trusted() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("nvidia-mps");
        assert!(!trusted_mps_dir(&d), "missing");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = std::fs::metadata("/proc/self")
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0);
        assert_eq!(trusted_mps_dir(&d), root);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!trusted_mps_dir(&d), "world-writable");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(!trusted_mps_dir(&link), "a symlink");
        if root {
            std::os::unix::fs::chown(&d, Some(1000), None).unwrap();
            assert!(!trusted_mps_dir(&d), "made first by a local user");
        }
    }
}
