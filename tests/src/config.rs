//! containerd's configuration for a throwaway instance, per release line: config version 2 for
//! 1.6 and 1.7, version 3 for 2.x (where the CRI plugin is split into `io.containerd.cri.v1.images`
//! and `io.containerd.cri.v1.runtime`, and `ctr images import` goes through the transfer
//! service, which must be told to unpack with the native snapshotter).

use std::path::Path;

use crate::{MQFQ, PAUSE};

/// Where the CNI plugins are (Debian's `containernetworking-plugins`).
pub const CNI_BIN: &str = "/usr/lib/cni";
/// The CNI plugins the kit's pod network uses (containerd's CRI adds `loopback` itself).
pub const CNI_PLUGINS: &[&str] = &["bridge", "host-local", "loopback"];

/// The pod network of a CRI instance under `dir`: a bridge with host-local addresses, which
/// exists only in that instance's own network namespace (see `Containerd::start_cri`).
#[must_use]
pub fn cni_conflist(dir: &Path) -> String {
    format!(
        r#"{{"cniVersion": "1.0.0", "name": "mqfq-test", "plugins": [
  {{"type": "bridge", "bridge": "mqfq0", "isGateway": true, "ipMasq": false,
    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "10.88.0.0/24"}}]],
              "dataDir": "{}/cni/ipam"}}}}
]}}
"#,
        dir.display()
    )
}

/// The shim configuration file (under the instance's directory) that CRI's runtime options name.
pub const SHIM_CONFIG: &str = "mqfq-shim.toml";

/// Where an instance under `dir` keeps runc's state. CRI always uses the namespace `k8s.io`, so
/// two CRI instances at once would share `/run/containerd/runc/k8s.io` (and one test's cleanup
/// would remove the other's containers); each CRI instance gets a root of its own through
/// [`SHIM_CONFIG`] instead. Other instances use a namespace per test.
#[must_use]
pub fn runc_root(dir: &Path, cri: bool) -> std::path::PathBuf {
    if cri {
        dir.join("runc")
    } else {
        Path::new("/run/containerd/runc").to_owned()
    }
}

/// The text of [`SHIM_CONFIG`] for an instance under `dir`.
#[must_use]
pub fn shim_config(dir: &Path) -> String {
    format!("root = \"{}\"\n", runc_root(dir, true).display())
}

/// The config file's text for an instance under `dir`, with the CRI plugin on or off, for
/// containerd `version` (major, minor), the shim in `shim_dir`. From 1.7, CRI's CDI injection
/// is on, with the specs in [`cdi_dir`].
#[must_use]
pub fn containerd_config(dir: &Path, cri: bool, version: (u32, u32), shim_dir: &Path) -> String {
    config_text(dir, cri, version.0, Some(shim_dir), version >= (1, 7))
}

/// Where a CRI instance under `dir` reads CDI specs (containerd 1.7 and later).
#[must_use]
pub fn cdi_dir(dir: &Path) -> std::path::PathBuf {
    dir.join("cdi")
}

/// A user's own CRI config for an instance under `dir`: as [`containerd_config`] with the CRI
/// plugin on, without the mqfq runtime (which an installer is to add).
#[must_use]
pub fn users_cri_config(dir: &Path, major: u32) -> String {
    config_text(dir, true, major, None, false)
}

fn config_text(dir: &Path, cri: bool, major: u32, mqfq: Option<&Path>, cdi: bool) -> String {
    let d = dir.display();
    let common = format!(
        "root = \"{d}/root\"\nstate = \"{d}/state\"\n\
         [grpc]\n  address = \"{d}/containerd.sock\"\n[ttrpc]\n  address = \"{d}/containerd.sock.ttrpc\"\n\
         [debug]\n  level = \"debug\"\n"
    );
    let mut cdi = if cdi {
        format!(
            "  enable_cdi = true\n  cdi_spec_dirs = [\"{}\"]\n",
            cdi_dir(dir).display()
        )
    } else {
        String::new()
    };
    // The kit's own instances pin their pods' network namespaces under their state directory,
    // which goes with them, not under the machine's /run/netns.
    if mqfq.is_some() {
        cdi.push_str("  netns_mounts_under_state_dir = true\n");
    }
    if major >= 2 {
        v3(&common, &d.to_string(), cri, mqfq, &cdi)
    } else {
        v2(&common, &d.to_string(), cri, mqfq, &cdi)
    }
}

fn v2(common: &str, d: &str, cri: bool, mqfq: Option<&Path>, cdi: &str) -> String {
    if !cri {
        return format!(
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n{common}"
        );
    }
    let runtime = if mqfq.is_some() {
        format!(
            r#"    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.mqfq]
      runtime_type = "{MQFQ}"
      pod_annotations = ["io.mqfq.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.mqfq.options]
        ConfigPath = "{d}/{SHIM_CONFIG}"
"#
        )
    } else {
        String::new()
    };
    format!(
        r#"version = 2
{common}[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE}"
  restrict_oom_score_adj = true
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
{cdi}  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d}/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{runtime}"#
    )
}

fn v3(common: &str, d: &str, cri: bool, mqfq: Option<&Path>, cdi: &str) -> String {
    // NRI (on by default in 2.x) binds /var/run/nri/nri.sock: two test containerds at once
    // would fight over it ("address already in use" kills the second's CRI), so each has its own.
    let transfer = format!(
        "[plugins.'io.containerd.transfer.v1.local']\n\
         \x20 [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]\n\
         \x20   platform = \"linux/amd64\"\n\
         \x20   snapshotter = \"native\"\n\
         [plugins.'io.containerd.nri.v1.nri']\n\
         \x20 socket_path = \"{d}/nri.sock\"\n"
    );
    if !cri {
        return format!(
            "version = 3\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\", \
             \"io.containerd.cri.v1.runtime\", \"io.containerd.cri.v1.images\", \
             \"io.containerd.podsandbox.controller.v1.podsandbox\"]\n{common}{transfer}"
        );
    }
    // As `mqfq-containerd.sh register` writes it for 2.x: runc's type with the shim as its
    // path, so that CRI asks the shim for its features; runc's options.
    let runtime = if let Some(shim) = mqfq {
        format!(
            r#"    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{}/containerd-shim-mqfq-v2"
      pod_annotations = ["io.mqfq.*"]
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.mqfq.options]
        Root = "{}"
"#,
            shim.display(),
            runc_root(Path::new(d), true).display()
        )
    } else {
        String::new()
    };
    format!(
        r#"version = 3
{common}{transfer}[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
{cdi}  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{d}/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
{runtime}[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
    )
}
