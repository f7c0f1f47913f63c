//! Which containers are GPU work, whose, and which GPUs the shim may give them.
//!
//! Decided once, at Create, from the OCI spec alone, so the shim needs no GPU and no daemon to
//! classify. The result is recorded with the container; the daemon gate acts on it.
//!
//! **Who grants GPUs.** The shim hands a container device nodes (with `rwm` cgroup rules) only
//! for what the platform assigned it — never for what the image or the pod author wrote
//! (`nvidia/cuda` images set `NVIDIA_VISIBLE_DEVICES=all` in their ENV). A grant comes from:
//! - `/dev/nvidia<N>` nodes already in `linux.devices` (containerd applied CDI, a device plugin's
//!   device specs, a privileged container);
//! - NVIDIA's volume-mount device list: mounts of `/dev/null` at
//!   `/var/run/nvidia-container-devices/<device>` (the device plugin's `volume-mounts` strategy;
//!   a pod author would need a hostPath volume);
//! - CDI annotations `cdi.k8s.io/*` — outside CRI always (the caller is the node's root), under
//!   CRI only with `MQFQ_GPU_ACCESS=cdi-annotations` (containerd 1.7+ applies CDI itself);
//! - `NVIDIA_VISIBLE_DEVICES` — only with `MQFQ_GPU_ACCESS=env` (ctr and Docker users who want
//!   the env-var path) or in a privileged container (its device cgroup already allows every
//!   device), as NVIDIA's `accept-nvidia-visible-devices-envvar-when-unprivileged=false`.
//!
//! **What is GPU work** (gated by the queue): a container with a grant (whatever `io.mqfq.gpu`
//! says: one holding a GPU cannot opt out of the queue); outside CRI also `io.mqfq.gpu=true`
//! (classifies, never grants) or a legacy NVIDIA prestart hook (Docker `--gpus`, `ctr --gpus`:
//! the hook then gives the devices, by NVIDIA's own rules). Under CRI a pod without a GPU from
//! the platform never takes a queue slot. `CUDA_VISIBLE_DEVICES` and an untrusted
//! `NVIDIA_VISIBLE_DEVICES` only pick the GPU queue of a container that is GPU work.
//! Sandbox (pause) containers never are; exec processes are never classified at all.
//!
//! The function key (one MQFQ flow each) is the first of: annotation `io.mqfq.function`; Knative's
//! `serving.knative.dev/service` (or `…/revision`) as `knative/<namespace>/<name>`; an OpenWhisk
//! action container name (`wsk<invoker>_<n>_<action>`) as `openwhisk/<action>`; the image name
//! (`io.kubernetes.cri.image-name`); the container id. The daemon scopes it by tenant, so a pod
//! naming another namespace's function does not join that function's flow.

use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

/// Annotation that forces GPU classification on or off.
pub const ANN_GPU: &str = "io.mqfq.gpu";
/// Annotation naming the function (flow key).
pub const ANN_FUNCTION: &str = "io.mqfq.function";
/// Annotation with the flow's weight.
pub const ANN_WEIGHT: &str = "io.mqfq.weight";
/// Annotation naming the tenant.
pub const ANN_TENANT: &str = "io.mqfq.tenant";
/// Annotation naming the functions a container works with (comma-separated): placement puts
/// it next to them.
pub const ANN_PARTNERS: &str = "io.mqfq.partners";
/// The most partners a container may name.
pub const MAX_PARTNERS: usize = 8;

pub use mqfq_edits::GpuSelection;

/// A GPU container's scheduling identity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuWork {
    /// Function key: one MQFQ flow per key.
    pub function: String,
    /// Flow weight the pod asked for (`io.mqfq.weight`; 0 = none): the daemon decides whether
    /// it counts.
    pub weight: f64,
    /// Tenant the pod named (`io.mqfq.tenant`), if any: the daemon decides whether it counts.
    pub tenant: Option<String>,
    /// The pod's Kubernetes namespace (CRI), or empty.
    pub pod_namespace: String,
    /// Which GPUs it uses, for routing to a GPU queue.
    pub gpus: GpuSelection,
    /// The GPUs the shim may give it (device nodes and driver files), from a trusted source
    /// only; `None`: the shim gives none (the platform or a legacy hook does, or nobody).
    pub grant: Option<GpuSelection>,
    /// mqfqd may narrow the grant to one GPU (placement): it came from
    /// `NVIDIA_VISIBLE_DEVICES`, and the container does not pick GPUs itself with
    /// `CUDA_VISIBLE_DEVICES` (whose indices would then name other devices, or none). A grant
    /// from a device plugin, a DRA claim or CDI is the platform's and stays whole.
    pub placeable: bool,
    /// Functions it works with (`io.mqfq.partners`).
    pub partners: Vec<String>,
    /// How its memory goes Warm (settled at Create: `io.mqfq.warm`, or mqfqd's default).
    pub warm: mqfq_proto::warm::Warm,
}

/// Where the shim accepts GPU grants from, beyond what the platform put in the spec
/// (`MQFQ_GPU_ACCESS`, comma-separated: `env`, `cdi-annotations`; empty or `platform` for none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuAccess {
    /// `NVIDIA_VISIBLE_DEVICES` grants devices (ctr / Docker hosts whose users are trusted).
    pub env: bool,
    /// Under CRI, `cdi.k8s.io/*` annotations grant devices.
    pub cdi_annotations: bool,
}

impl GpuAccess {
    /// Parses a `MQFQ_GPU_ACCESS` value.
    ///
    /// # Errors
    /// An unknown word.
    pub fn parse(v: &str) -> Result<Self> {
        let mut a = GpuAccess::default();
        for w in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "platform" => {}
                "env" => a.env = true,
                "cdi-annotations" => a.cdi_annotations = true,
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "MQFQ_GPU_ACCESS={v:?}: unknown source {other:?} (expected platform, env, cdi-annotations)"
                    )));
                }
            }
        }
        Ok(a)
    }

    /// From the shim's environment.
    ///
    /// # Errors
    /// An unknown word in `MQFQ_GPU_ACCESS`.
    pub fn from_env() -> Result<Self> {
        Self::parse(&std::env::var("MQFQ_GPU_ACCESS").unwrap_or_default())
    }
}

/// What Create learned about a container.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Classification {
    /// Not GPU work: behaves exactly as with runc.
    NotGpu,
    /// GPU work, gated by the daemon.
    Gpu(GpuWork),
}

fn annotations(spec: &Value) -> impl Iterator<Item = (&str, &str)> {
    spec.get("annotations")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
}

fn annotation<'a>(spec: &'a Value, key: &str) -> Option<&'a str> {
    spec.get("annotations")?.get(key)?.as_str()
}

fn env<'a>(spec: &'a Value, key: &str) -> Option<&'a str> {
    spec.get("process")?
        .get("env")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| v)
        .next_back()
}

fn devices(spec: &Value) -> impl Iterator<Item = &str> {
    spec.get("linux")
        .and_then(|l| l.get("devices"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("path").and_then(Value::as_str))
}

/// NVIDIA's character major: GPUs, and two control nodes.
const NVIDIA_MAJOR: i64 = 195;
/// The first minor of major 195 that is no GPU: 254 is `/dev/nvidia-modeset`, 255
/// `/dev/nvidiactl`. (`nvidia-uvm`, `nvidia-uvm-tools` and the MIG `nvidia-caps` nodes have majors
/// of their own.)
const FIRST_CONTROL_MINOR: i64 = 254;
/// Minors of NVIDIA GPU device nodes in `linux.devices`: character major 195, minors 0–253,
/// whatever their names (a CDI spec or DRA driver may choose one; a GPU's numbers under a
/// control node's name are still a GPU, so naming cannot take a GPU out of the queue).
fn gpu_minors(spec: &Value) -> Vec<String> {
    spec.get("linux")
        .and_then(|l| l.get("devices"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|d| d.get("type").and_then(Value::as_str) == Some("c"))
        .filter(|d| d.get("major").and_then(Value::as_i64) == Some(NVIDIA_MAJOR))
        .filter_map(|d| d.get("minor").and_then(Value::as_i64))
        .filter(|m| (0..FIRST_CONTROL_MINOR).contains(m))
        .map(|m| m.to_string())
        .collect()
}

/// The device name of a CDI device NVIDIA's tools name (`nvidia.com/gpu=0`, the device plugin's
/// `k8s.device-plugin.nvidia.com/gpu=GPU-…`, MIG as `nvidia.com/mig=…`): a vendor of
/// `nvidia.com` or under it, a class of `gpu` or `mig`. Another vendor's device (`vendor.com/fpga=0`)
/// is not a GPU, even where its name is one of a GPU's.
fn nvidia_cdi_name(device: &str) -> Option<String> {
    let (kind, name) = device.trim().split_once('=')?;
    let (vendor, class) = kind.split_once('/')?;
    let nvidia = vendor == "nvidia.com" || vendor.ends_with(".nvidia.com");
    let name = name.trim();
    (nvidia && matches!(class, "gpu" | "mig") && !name.is_empty()).then(|| name.to_owned())
}

/// At most this many characters of a bad annotation's value go into its error (a value may be
/// as long as the pod author likes).
const SHOWN_CHARS: usize = 64;

fn invalid(key: &str, value: &str, why: &str) -> Error {
    let mut shown: String = value.chars().take(SHOWN_CHARS).collect();
    if shown.len() < value.len() {
        shown.push('…');
    }
    Error::InvalidArgument(format!("annotation {key}={shown:?}: {why}"))
}

/// A key or tenant: 1–253 characters from `A–Z a–z 0–9 . _ - : / @ +` (they become metric labels
/// and log fields).
fn check_name(key: &str, value: &str) -> Result<String> {
    if mqfq_proto::is_key(value) {
        Ok(value.to_owned())
    } else {
        Err(invalid(
            key,
            value,
            "must be 1 to 253 characters of A-Z a-z 0-9 . _ - : / @ +",
        ))
    }
}

/// A function key derived from names the platform or the pod chose: characters outside the
/// key alphabet become `_`, and it is cut to 253 bytes.
fn sanitize(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-:/@+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    s.truncate(253);
    if s.is_empty() { "_".to_owned() } else { s }
}

fn parse_list(v: &str) -> GpuSelection {
    let v = v.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("all") {
        GpuSelection::All
    } else {
        GpuSelection::Devices(
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }
}

fn openwhisk_action(name: &str) -> Option<&str> {
    // Docker factory names: wsk<invoker>_<counter>_<namespace>_<action>.
    let rest = name.strip_prefix("wsk")?;
    let (_, rest) = rest.split_once('_')?;
    let (counter, action) = rest.split_once('_')?;
    (!counter.is_empty() && counter.bytes().all(|b| b.is_ascii_digit()) && !action.is_empty())
        .then_some(action)
}

/// The device list of NVIDIA's volume-mount strategy: `/dev/null` mounted at
/// `/var/run/nvidia-container-devices/<device>`.
const DEVICE_MOUNTS: &str = "/var/run/nvidia-container-devices/";

fn volume_mount_devices(spec: &Value) -> Vec<String> {
    spec.get("mounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|m| {
            m.get("source")
                .and_then(Value::as_str)
                .is_some_and(|s| s.trim_end_matches('/') == "/dev/null")
        })
        .filter_map(|m| m.get("destination").and_then(Value::as_str))
        .filter_map(|d| d.strip_prefix(DEVICE_MOUNTS))
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .map(str::to_owned)
        .collect()
}

/// Privileged as runc sees it: the device cgroup allows every device (`rwm` on all), which is
/// what `--privileged` gives. (A capability alone, such as an added `CAP_SYS_ADMIN`, is not.)
fn privileged(spec: &Value) -> bool {
    spec.get("linux")
        .and_then(|l| l.get("resources"))
        .and_then(|r| r.get("devices"))
        .and_then(Value::as_array)
        .is_some_and(|rules| {
            rules.iter().any(|r| {
                r.get("allow").and_then(Value::as_bool) == Some(true)
                    && r.get("type")
                        .and_then(Value::as_str)
                        .is_none_or(|t| t == "a")
                    && r.get("major").is_none_or(Value::is_null)
                    && r.get("minor").is_none_or(Value::is_null)
                    && r.get("access")
                        .and_then(Value::as_str)
                        .is_none_or(|a| a.contains('r') && a.contains('w') && a.contains('m'))
            })
        })
}

fn legacy_hook(spec: &Value) -> bool {
    let Some(hooks) = spec.get("hooks") else {
        return false;
    };
    ["prestart", "createRuntime", "createContainer"]
        .iter()
        .filter_map(|stage| hooks.get(*stage).and_then(Value::as_array))
        .flatten()
        .any(|h| {
            let path = h.get("path").and_then(Value::as_str).unwrap_or("");
            let name = path.rsplit('/').next().unwrap_or(path);
            let args = h.get("args").and_then(Value::as_array);
            matches!(
                name,
                "nvidia-container-runtime-hook" | "nvidia-container-toolkit"
            ) || args.is_some_and(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .any(|x| x.ends_with("nvidia-container-cli"))
            })
        })
}

fn selection(names: Vec<String>) -> GpuSelection {
    if names.is_empty() || names.iter().any(|n| n == "all") {
        GpuSelection::All
    } else {
        GpuSelection::Devices(names)
    }
}

/// What a container's `io.mqfq.*` annotations ask, each checked.
struct Asked {
    /// `io.mqfq.gpu`.
    forced: Option<bool>,
    /// `io.mqfq.weight` (0: none asked).
    weight: f64,
    /// `io.mqfq.function`.
    function: Option<String>,
    /// `io.mqfq.partners`.
    partners: Vec<String>,
    /// `io.mqfq.tenant`.
    tenant: Option<String>,
}

/// Reads and checks the container's own annotations.
fn asked(spec: &Value) -> Result<Asked> {
    let forced = match annotation(spec, ANN_GPU) {
        None => None,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Some(true),
            "false" | "0" | "no" => Some(false),
            _ => return Err(invalid(ANN_GPU, v, "expected true or false")),
        },
    };
    let weight = match annotation(spec, ANN_WEIGHT) {
        None => 0.0,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(w) if w.is_finite() && w > 0.0 && w <= 1000.0 => w,
            _ => return Err(invalid(ANN_WEIGHT, v, "expected a number in (0, 1000]")),
        },
    };
    let function = annotation(spec, ANN_FUNCTION)
        .map(|v| check_name(ANN_FUNCTION, v))
        .transpose()?;
    let partners = annotation(spec, ANN_PARTNERS)
        .map(partners_of)
        .transpose()?
        .unwrap_or_default();
    let tenant = annotation(spec, ANN_TENANT)
        .map(|v| check_name(ANN_TENANT, v))
        .transpose()?;
    Ok(Asked {
        forced,
        weight,
        function,
        partners,
        tenant,
    })
}

/// Classifies a container from its OCI spec (`config.json` as JSON). `id` is the container id,
/// `access` where GPU grants are accepted from.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the annotation when an `io.mqfq.*` annotation is malformed.
pub fn classify(spec: &Value, id: &str, access: GpuAccess) -> Result<Classification> {
    // Our annotations first, even on containers that turn out not to be GPU work, so a typo
    // never silently disables scheduling.
    let Asked {
        forced,
        weight,
        function,
        partners,
        tenant,
    } = asked(spec)?;

    let container_type = annotation(spec, "io.kubernetes.cri.container-type");
    if container_type == Some("sandbox") {
        return Ok(Classification::NotGpu);
    }
    let cri = container_type.is_some();
    let nvidia =
        env(spec, "NVIDIA_VISIBLE_DEVICES").filter(|v| !matches!(v.trim(), "" | "void" | "none"));
    let cuda = env(spec, "CUDA_VISIBLE_DEVICES").filter(|v| !v.trim().is_empty());
    let cdi: Vec<String> = annotations(spec)
        .filter(|(k, _)| k.starts_with("cdi.k8s.io/"))
        .flat_map(|(_, v)| v.split(','))
        .filter_map(nvidia_cdi_name)
        .collect();
    let mut dev_nodes: Vec<String> = devices(spec)
        .filter_map(|p| p.strip_prefix("/dev/nvidia"))
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .map(str::to_owned)
        .collect();
    // A GPU node under another name (a CDI spec or DRA driver may choose one).
    for minor in gpu_minors(spec) {
        if !dev_nodes.contains(&minor) {
            dev_nodes.push(minor);
        }
    }
    let mounted = volume_mount_devices(spec);

    // Trusted sources only, in the order NVIDIA's toolkit prefers them.
    let mut placeable = false;
    let grant = if !mounted.is_empty() {
        Some(selection(mounted))
    } else if !cdi.is_empty() && (!cri || access.cdi_annotations) {
        Some(selection(cdi.clone()))
    } else if let Some(v) = nvidia.filter(|_| access.env || privileged(spec)) {
        placeable = cuda.is_none();
        Some(parse_list(v))
    } else if !dev_nodes.is_empty() {
        Some(GpuSelection::Devices(dev_nodes.clone()))
    } else {
        None
    };
    let gpu = if grant.is_some() {
        if forced == Some(false) {
            tracing::info!(container = %id, "{ANN_GPU}=false ignored: the container was given a GPU");
        }
        true
    } else if cri {
        // A pod without a GPU from the platform holds no GPU: it takes no queue slot either.
        if forced == Some(true) {
            tracing::info!(container = %id, "{ANN_GPU}=true ignored: no GPU was assigned to the pod");
        }
        false
    } else {
        forced.unwrap_or_else(|| legacy_hook(spec))
    };
    if !gpu {
        if nvidia.is_some() || cuda.is_some() || !cdi.is_empty() {
            tracing::debug!(
                container = %id,
                "GPU variables or annotations from an untrusted source: not GPU work (see MQFQ_GPU_ACCESS)"
            );
        }
        return Ok(Classification::NotGpu);
    }
    // The queue to wait in: the grant, else what the container says it uses.
    let gpus = grant.clone().unwrap_or_else(|| {
        if let Some(v) = nvidia {
            parse_list(v)
        } else if !cdi.is_empty() {
            selection(cdi)
        } else if let Some(v) = cuda {
            parse_list(v)
        } else {
            GpuSelection::All
        }
    });
    let function = function.unwrap_or_else(|| sanitize(&derive_function(spec, id)));
    Ok(Classification::Gpu(GpuWork {
        function,
        weight,
        tenant,
        pod_namespace: annotation(spec, "io.kubernetes.cri.sandbox-namespace")
            .unwrap_or_default()
            .to_owned(),
        gpus,
        grant,
        placeable,
        partners,
        // Settled at Create, once mqfqd was asked.
        warm: mqfq_proto::warm::Warm::default(),
    }))
}

/// `io.mqfq.partners`: up to [`MAX_PARTNERS`] function names, comma-separated.
fn partners_of(v: &str) -> Result<Vec<String>> {
    let names: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if names.len() > MAX_PARTNERS {
        return Err(invalid(ANN_PARTNERS, v, "names at most 8 functions"));
    }
    names
        .into_iter()
        .map(|n| check_name(ANN_PARTNERS, n))
        .collect()
}

fn derive_function(spec: &Value, id: &str) -> String {
    let ns = annotation(spec, "io.kubernetes.cri.sandbox-namespace").unwrap_or("default");
    for key in [
        "serving.knative.dev/service",
        "serving.knative.dev/revision",
    ] {
        if let Some(v) = annotation(spec, key).filter(|v| !v.is_empty()) {
            return format!("knative/{ns}/{v}");
        }
    }
    let names = [
        annotation(spec, "io.kubernetes.cri.sandbox-name"),
        annotation(spec, "io.kubernetes.cri.container-name"),
        spec.get("hostname").and_then(Value::as_str),
    ];
    if let Some(action) = names.into_iter().flatten().find_map(openwhisk_action) {
        return format!("openwhisk/{action}");
    }
    if let Some(image) = annotation(spec, "io.kubernetes.cri.image-name").filter(|v| !v.is_empty())
    {
        return image.to_owned();
    }
    id.to_owned()
}

#[cfg(test)]
mod tests;
