//! `mqfqctl doctor`: is this node set up to run GPU containers through mqfq-shim?
//!
//! Each check reads what an operator would look at by hand — the shim on containerd's `PATH`,
//! containerd's version and config (the runtime registered, the scheduling annotations let
//! through), `mqfqd` answering and what it sees of the GPUs, the CDI specs against the loaded
//! driver, the interposer file, the runtime directory's permissions — and says what it found,
//! how bad it is and how to fix it. Every file is read under `root` (a fake node in tests), and
//! nothing is changed.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// As it should be.
    Ok,
    /// Works, but not as well as it could (or cannot be checked).
    Warn,
    /// GPU containers will not go through mqfq-shim as intended.
    Fail,
}

/// One check's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Which check.
    pub check: &'static str,
    /// How bad.
    pub level: Level,
    /// What was found.
    pub detail: String,
    /// What to do about it (none when it is fine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, detail: impl Into<String>) -> Self {
        Finding {
            check,
            level: Level::Ok,
            detail: detail.into(),
            fix: None,
        }
    }
    fn bad(check: &'static str, level: Level, detail: impl Into<String>, fix: &str) -> Self {
        Finding {
            check,
            level,
            detail: detail.into(),
            fix: Some(fix.to_owned()),
        }
    }
}

/// Where the node's pieces are.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Every file below is read under this directory (`/` on a real node).
    pub root: PathBuf,
    /// containerd's config.
    pub containerd_config: PathBuf,
    /// The containerd program (`--version` is asked).
    pub containerd: PathBuf,
    /// Directories searched for `containerd-shim-mqfq-v2` (containerd's `PATH`).
    pub path: Vec<PathBuf>,
    /// The CUDA interposer.
    pub interposer: PathBuf,
    /// mqfqd's socket, as it is reached (not under `root`); its directory is the runtime
    /// directory checked.
    pub socket: PathBuf,
}

impl Setup {
    /// A real node's places, with `socket` for mqfqd.
    #[must_use]
    pub fn node(socket: &Path) -> Self {
        Setup {
            root: PathBuf::from("/"),
            containerd_config: PathBuf::from("/etc/containerd/config.toml"),
            containerd: PathBuf::from("containerd"),
            path: [
                "/usr/local/bin",
                "/usr/bin",
                "/bin",
                "/usr/local/sbin",
                "/usr/sbin",
            ]
            .iter()
            .map(PathBuf::from)
            .collect(),
            interposer: PathBuf::from("/usr/lib/mqfq/libmqfq_cuda.so"),
            socket: socket.to_owned(),
        }
    }

    /// `p` under the root.
    fn at(&self, p: &Path) -> PathBuf {
        self.root.join(p.strip_prefix("/").unwrap_or(p))
    }
}

/// The runtime type containerd must name.
pub const RUNTIME_TYPE: &str = "io.containerd.mqfq.v2";
/// The oldest containerd line the shim supports.
const OLDEST: (u64, u64) = (1, 6);
/// Config files read at most (the main one and its imports), and bytes each.
const MAX_FILES: usize = 32;
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Runs every check.
pub async fn run(setup: &Setup) -> Vec<Finding> {
    let mut out = vec![shim_binary(setup), containerd_version(setup)];
    out.extend(containerd_config(setup));
    out.push(runtime_dir(setup));
    out.push(interposer(setup));
    out.extend(daemon(setup).await);
    out.push(cdi(setup));
    out
}

/// The worst level found (`Ok` for none).
#[must_use]
pub fn worst(findings: &[Finding]) -> Level {
    findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok)
}

/// The findings as a table, each fix under its finding.
#[must_use]
pub fn render(findings: &[Finding]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    for f in findings {
        let level = match f.level {
            Level::Ok => "ok",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        let _ = writeln!(o, "{level:<5} {:<18} {}", f.check, f.detail);
        if let Some(fix) = &f.fix {
            let _ = writeln!(o, "      {:<18} fix: {fix}", "");
        }
    }
    o
}

fn shim_binary(s: &Setup) -> Finding {
    const CHECK: &str = "shim";
    let found = s
        .path
        .iter()
        .map(|d| s.at(d).join("containerd-shim-mqfq-v2"))
        .find(|p| p.is_file());
    match found {
        Some(p) => Finding::ok(CHECK, format!("{}", p.display())),
        None => Finding::bad(
            CHECK,
            Level::Fail,
            "containerd-shim-mqfq-v2 is on none of containerd's PATH directories",
            "install it in /usr/local/bin or /usr/bin (containerd finds shims on its PATH)",
        ),
    }
}

/// `(2, 1)` from `containerd github.com/containerd/containerd/v2 v2.1.4 abc`, or from a
/// distribution's `containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1`.
fn parse_version(text: &str) -> Option<(u64, u64)> {
    let v = text.split_whitespace().skip(1).find_map(|w| {
        let w = w.strip_prefix('v').unwrap_or(w);
        (w.starts_with(|c: char| c.is_ascii_digit()) && w.contains('.')).then_some(w)
    })?;
    let mut parts = v.split(['.', '-', '+', '~']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn containerd_version(s: &Setup) -> Finding {
    const CHECK: &str = "containerd";
    let out = output_within(
        std::process::Command::new(&s.containerd).arg("--version"),
        std::time::Duration::from_secs(10),
    );
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => {
            return Finding::bad(
                CHECK,
                Level::Fail,
                format!(
                    "`{} --version` failed ({})",
                    s.containerd.display(),
                    o.status
                ),
                "install containerd 1.6 or later",
            );
        }
        Err(e) => {
            return Finding::bad(
                CHECK,
                Level::Fail,
                format!("{}: {e}", s.containerd.display()),
                "install containerd 1.6 or later",
            );
        }
    };
    match parse_version(&text) {
        Some(v) if v >= OLDEST => Finding::ok(CHECK, format!("containerd {}.{}", v.0, v.1)),
        Some(v) => Finding::bad(
            CHECK,
            Level::Fail,
            format!("containerd {}.{} is older than 1.6", v.0, v.1),
            "upgrade containerd to 1.6 or later (task API v2 with the shim's options)",
        ),
        None => Finding::bad(
            CHECK,
            Level::Warn,
            format!("cannot read a version in {:?}", text.trim()),
            "check that this is containerd 1.6 or later",
        ),
    }
}

/// A command's output, or an error once it has run for `limit` (then it is killed).
fn output_within(
    cmd: &mut std::process::Command,
    limit: std::time::Duration,
) -> std::io::Result<std::process::Output> {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let end = std::time::Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer in {} s", limit.as_secs()),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output()
}

/// The config and the files it imports (relative imports are next to the config; a `*` in an
/// import's file name is a glob over its directory, as containerd reads it). Each file is read
/// once, only if it is a regular file, and at most 1 MiB of it.
fn config_files(s: &Setup) -> Result<Vec<(PathBuf, toml::Table)>, String> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut todo = vec![s.containerd_config.clone()];
    while let Some(p) = todo.pop() {
        if !seen.insert(p.clone()) {
            continue;
        }
        if out.len() >= MAX_FILES {
            return Err(format!(
                "more than {MAX_FILES} config files through imports"
            ));
        }
        let table: toml::Table = read_config(&s.at(&p))
            .and_then(|text| text.parse().map_err(|e: toml::de::Error| e.to_string()))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        if let Some(imports) = table.get("imports").and_then(toml::Value::as_array) {
            for i in imports.iter().filter_map(toml::Value::as_str) {
                let i = Path::new(i);
                let i = if i.is_absolute() {
                    i.to_owned()
                } else {
                    p.parent().unwrap_or(Path::new("/")).join(i)
                };
                todo.extend(expand(s, &i));
            }
        }
        out.push((p, table));
    }
    Ok(out)
}

/// A config file's text: a regular file, at most `MAX_CONFIG_BYTES`.
fn read_config(real: &Path) -> Result<String, String> {
    use std::io::Read;
    let m = std::fs::metadata(real).map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("not a regular file".into());
    }
    let mut text = String::new();
    std::fs::File::open(real)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err("larger than 1 MiB".into());
    }
    Ok(text)
}

/// An import path, with a `*` in its file name matched against its directory's entries
/// (sorted; none when nothing matches, as containerd does).
fn expand(s: &Setup, import: &Path) -> Vec<PathBuf> {
    let name = import.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let Some((head, tail)) = name.split_once('*') else {
        return vec![import.to_owned()];
    };
    let dir = import.parent().unwrap_or(Path::new("/"));
    let mut found: Vec<PathBuf> = std::fs::read_dir(s.at(dir))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| {
                    n.len() >= head.len() + tail.len() && n.starts_with(head) && n.ends_with(tail)
                })
                .map(|n| dir.join(n))
                .take(MAX_FILES + 1)
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// The CRI runtimes tables of a config, v2 (1.6 / 1.7) or v3 (2.x).
fn runtimes(t: &toml::Table) -> Vec<(&str, &toml::Table)> {
    let plugins = t.get("plugins").and_then(toml::Value::as_table);
    let mut out = Vec::new();
    for cri in ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"] {
        let r = plugins
            .and_then(|p| p.get(cri))
            .and_then(|c| c.get("containerd"))
            .and_then(|c| c.get("runtimes"))
            .and_then(toml::Value::as_table);
        if let Some(r) = r {
            out.extend(
                r.iter()
                    .filter_map(|(name, v)| Some((name.as_str(), v.as_table()?))),
            );
        }
    }
    out
}

fn listed(table: &toml::Table, key: &str, want: &str) -> bool {
    table
        .get(key)
        .and_then(toml::Value::as_array)
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(want)))
}

fn containerd_config(s: &Setup) -> Vec<Finding> {
    const CHECK: &str = "runtime";
    const ANN: &str = "annotations";
    let files = match config_files(s) {
        Ok(f) => f,
        Err(e) => {
            return vec![Finding::bad(
                CHECK,
                Level::Fail,
                format!("containerd's config: {e}"),
                "register the runtime (docs/USAGE.md, \"Kubernetes (CRI)\"); ctr and Docker need no config",
            )];
        }
    };
    let ours: Vec<(&str, String, &toml::Table)> = files
        .iter()
        .flat_map(|(p, t)| {
            runtimes(t)
                .into_iter()
                .filter(|(_, r)| is_ours(r))
                .map(move |(name, r)| (name, format!("{name} ({})", p.display()), r))
        })
        .collect();
    let Some((key, name, table)) = ours.first() else {
        return vec![Finding::bad(
            CHECK,
            Level::Fail,
            format!(
                "no CRI runtime has runtime_type = \"{RUNTIME_TYPE}\" or runtime_path naming {SHIM}"
            ),
            "mqfq-containerd.sh register; by hand, add \
             [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq] (containerd 2.x: \
             runtime_type = \"io.containerd.runc.v2\", runtime_path = the shim) or \
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.mqfq] (1.6 / 1.7: that \
             runtime_type), then restart containerd",
        )];
    };
    // containerd 2.x's CRI asks only runc-typed runtimes for their features.
    let v3 = files
        .iter()
        .any(|(_, t)| t.get("version").and_then(toml::Value::as_integer) == Some(3));
    let features = if v3
        && table.get("runtime_type").and_then(toml::Value::as_str) == Some(RUNTIME_TYPE)
    {
        Some(Finding::bad(
            "features",
            Level::Warn,
            format!(
                "runtime {name} has runtime_type = \"{RUNTIME_TYPE}\": containerd 2.x does not ask \
                 it for its features, so the kubelet refuses recursive read-only mounts and user \
                 namespaces on it"
            ),
            "set runtime_type = \"io.containerd.runc.v2\" and runtime_path = the shim's path \
             (mqfq-containerd.sh register writes it so)",
        ))
    } else {
        None
    };
    let ann = if listed(table, "pod_annotations", "io.mqfq.*") {
        Finding::ok(ANN, "pod annotations io.mqfq.* reach the shim")
    } else {
        Finding::bad(
            ANN,
            Level::Warn,
            "pod annotations io.mqfq.* are not passed to the shim: functions are named from image and pod metadata only",
            "add pod_annotations = [\"io.mqfq.*\"] to the runtime's table",
        )
    };
    let mut out = vec![Finding::ok(CHECK, format!("runtime {name}")), ann];
    out.extend(features);
    // With runc's type, CRI reads the runtime's options as runc's, and drops other keys.
    if table.get("runtime_type").and_then(toml::Value::as_str) == Some(RUNC_TYPE) {
        let dropped: Vec<&str> = files
            .iter()
            .flat_map(|(_, t)| runtimes(t))
            .filter(|(n, _)| n == key)
            .filter_map(|(_, r)| r.get("options").and_then(toml::Value::as_table))
            .flat_map(|o| o.keys())
            .map(String::as_str)
            .filter(|k| !RUNC_OPTIONS.iter().any(|r| r.eq_ignore_ascii_case(k)))
            .collect();
        if !dropped.is_empty() {
            out.push(Finding::bad(
                "options",
                Level::Fail,
                format!(
                    "runtime {name} has runc's type, so containerd drops its options {}",
                    dropped.join(", ")
                ),
                "use runc's names (BinaryName, Root, SystemdCgroup, NoPivotRoot, NoNewKeyring)",
            ));
        }
    }
    out
}

/// runc's runtime type, which the 2.x registration gives the shim.
const RUNC_TYPE: &str = "io.containerd.runc.v2";
/// The keys of runc's options (`containerd.runc.v1.Options`) as containerd's TOML names them.
const RUNC_OPTIONS: &[&str] = &[
    "BinaryName",
    "Root",
    "SystemdCgroup",
    "NoPivotRoot",
    "NoNewKeyring",
    "ShimCgroup",
    "IoUid",
    "IoGid",
    "CriuImagePath",
    "CriuWorkPath",
];

/// The shim's binary name, as a CRI `runtime_path` names it.
const SHIM: &str = "containerd-shim-mqfq-v2";

/// A CRI runtime table that runs this shim: by its type (resolved on `PATH`), or by a
/// `runtime_path` naming the shim (containerd 2.x registration, with runc's type).
fn is_ours(r: &toml::Table) -> bool {
    r.get("runtime_type").and_then(toml::Value::as_str) == Some(RUNTIME_TYPE)
        || r.get("runtime_path")
            .and_then(toml::Value::as_str)
            .is_some_and(|p| Path::new(p).file_name() == Some(std::ffi::OsStr::new(SHIM)))
}

fn runtime_dir(s: &Setup) -> Finding {
    use std::os::unix::fs::MetadataExt;
    const CHECK: &str = "runtime dir";
    // The directory of the socket this check talks to (not under `root`: it is where mqfqd
    // listens).
    let Some(dir) = s.socket.parent() else {
        return Finding::ok(CHECK, "the socket has no directory");
    };
    match std::fs::metadata(dir) {
        Err(e) => Finding::bad(
            CHECK,
            Level::Fail,
            format!("{}: {e}", dir.display()),
            "start mqfqd (systemctl start mqfqd): it makes the directory, mode 0700",
        ),
        Ok(m) if m.uid() != 0 || m.mode() & 0o022 != 0 => Finding::bad(
            CHECK,
            Level::Fail,
            format!(
                "{} is owned by uid {} with mode {:o}: others could replace the socket",
                dir.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
            &format!("chown root:root {0} && chmod 0700 {0}", dir.display()),
        ),
        Ok(m) => Finding::ok(
            CHECK,
            format!("{} root's, mode {:o}", dir.display(), m.mode() & 0o7777),
        ),
    }
}

fn interposer(s: &Setup) -> Finding {
    use std::io::Read as _;
    use std::os::unix::fs::MetadataExt;
    const CHECK: &str = "interposer";
    let p = s.at(&s.interposer);
    let m = match std::fs::metadata(&p) {
        Ok(m) => m,
        Err(_) => {
            return Finding::bad(
                CHECK,
                Level::Warn,
                format!(
                    "{} is missing: GPU containers run unchanged (no bursts, no pool)",
                    s.interposer.display()
                ),
                "install it: install -D -m 0644 \"$(scripts/build-interposer.sh)\" /usr/lib/mqfq/libmqfq_cuda.so",
            );
        }
    };
    if m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Finding::bad(
            CHECK,
            Level::Fail,
            format!(
                "{} is owned by uid {} with mode {:o}: whoever can write it runs code in every GPU container",
                s.interposer.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
            &format!(
                "chown root:root {0} && chmod 0644 {0}",
                s.interposer.display()
            ),
        );
    }
    let mut head = [0u8; 5];
    let elf = std::fs::File::open(&p)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head[..4] == *b"\x7fELF"
        && head[4] == 2;
    if elf {
        Finding::ok(CHECK, format!("{}", s.interposer.display()))
    } else {
        Finding::bad(
            CHECK,
            Level::Fail,
            format!("{} is not a 64-bit ELF library", s.interposer.display()),
            "reinstall it from scripts/build-interposer.sh",
        )
    }
}

async fn daemon(s: &Setup) -> Vec<Finding> {
    const CHECK: &str = "mqfqd";
    const GPUS: &str = "gpus";
    let st = match crate::ctl::status(&s.socket).await {
        Ok(st) => st,
        Err(e) => {
            return vec![Finding::bad(
                CHECK,
                Level::Fail,
                format!("{}: {e}", s.socket.display()),
                "systemctl enable --now mqfqd (journalctl -u mqfqd says why it stopped)",
            )];
        }
    };
    let mut out = vec![Finding::ok(
        CHECK,
        format!(
            "answering: policy {}, backend {}, {} GPUs",
            st.policy,
            st.backend,
            st.gpus.len()
        ),
    )];
    if st.backend == "simulated" {
        out.push(Finding::bad(
            GPUS,
            Level::Warn,
            "the GPUs are simulated (no NVML): D follows no real measurement",
            "install the NVIDIA driver (libnvidia-ml.so.1), or set backend = \"nvml\" to see why it fails",
        ));
    } else if st.gpus.is_empty() {
        out.push(Finding::bad(
            GPUS,
            Level::Fail,
            "NVML lists no GPU",
            "check nvidia-smi",
        ));
    }
    for g in &st.gpus {
        if g.health == "failed" {
            out.push(Finding::bad(
                GPUS,
                Level::Fail,
                format!("GPU {} ({}) is failed for new containers", g.index, g.name),
                "see mqfqd's log (NVML errors or a critical Xid); a fatal Xid wants a GPU reset",
            ));
        } else if g.mode != "plain" && st.backend != "simulated" {
            out.push(Finding::ok(
                GPUS,
                format!("GPU {} in {} mode", g.index, g.mode),
            ));
        }
    }
    out
}

/// The loaded driver's version, from `/proc/driver/nvidia/version`.
fn driver_version(s: &Setup) -> Option<String> {
    let text = std::fs::read_to_string(s.at(Path::new("/proc/driver/nvidia/version"))).ok()?;
    text.lines()
        .next()?
        .split_whitespace()
        .find(|w| {
            w.chars().filter(|c| *c == '.').count() >= 1
                && w.starts_with(|c: char| c.is_ascii_digit())
        })
        .map(str::to_owned)
}

fn cdi(s: &Setup) -> Finding {
    const CHECK: &str = "cdi";
    let Some(driver) = driver_version(s) else {
        return Finding::ok(CHECK, "no NVIDIA driver loaded: nothing to check");
    };
    let specs: Vec<PathBuf> = ["/etc/cdi", "/var/run/cdi"]
        .iter()
        .filter_map(|d| std::fs::read_dir(s.at(Path::new(d))).ok())
        .flat_map(|rd| rd.filter_map(Result::ok).map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.contains("nvidia") && (n.ends_with(".yaml") || n.ends_with(".json"))
            })
        })
        .collect();
    if specs.is_empty() {
        return Finding::bad(
            CHECK,
            Level::Warn,
            format!("driver {driver}, no NVIDIA CDI spec: the shim builds its own edits"),
            "nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml (optional)",
        );
    }
    let stale: Vec<String> = specs
        .iter()
        .filter(|p| {
            std::fs::read_to_string(p).is_ok_and(|t| t.len() < (8 << 20) && !t.contains(&driver))
        })
        .map(|p| p.display().to_string())
        .collect();
    if stale.is_empty() {
        Finding::ok(
            CHECK,
            format!("{} spec(s) for driver {driver}", specs.len()),
        )
    } else {
        Finding::bad(
            CHECK,
            Level::Fail,
            format!(
                "{} name(s) no file of driver {driver}: written for another driver",
                stale.join(", ")
            ),
            "regenerate: nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml",
        )
    }
}

#[cfg(test)]
mod tests;
