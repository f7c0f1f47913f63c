//! Which containers are GPU work, and whose.
//!
//! Decided once, at Create, from the OCI spec alone, so the shim needs no GPU and no daemon to
//! classify. The result is recorded with the container; the daemon gate (issue 4) acts on it.
//!
//! A container is GPU work if any of these holds (an explicit `io.mqfq.gpu` wins over all):
//! a CDI annotation (`cdi.k8s.io/*`), `NVIDIA_VISIBLE_DEVICES` naming devices (not empty, `void`
//! or `none`), `CUDA_VISIBLE_DEVICES` non-empty, or a `/dev/nvidia*` device in `linux.devices`.
//! Sandbox (pause) containers never are; exec processes are never classified at all.
//!
//! The function key (one MQFQ flow each) is the first of: annotation `io.mqfq.function`; Knative's
//! `serving.knative.dev/service` (or `…/revision`) as `knative/<namespace>/<name>`; an OpenWhisk
//! action container name (`wsk<invoker>_<n>_<action>`) as `openwhisk/<action>`; the image name
//! (`io.kubernetes.cri.image-name`); the container id.

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

/// Which GPUs a container asked for, as it named them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuSelection {
    /// All GPUs (`all`), or unspecified.
    All,
    /// Devices by index, UUID or MIG name.
    Devices(Vec<String>),
}

/// A GPU container's scheduling identity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuWork {
    /// Function key: one MQFQ flow per key.
    pub function: String,
    /// Flow weight (default 1).
    pub weight: f64,
    /// Tenant, if given.
    pub tenant: Option<String>,
    /// Requested devices.
    pub gpus: GpuSelection,
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

fn invalid(key: &str, value: &str, why: &str) -> Error {
    Error::InvalidArgument(format!("annotation {key}={value:?}: {why}"))
}

/// A key or tenant: 1..=253 printable ASCII characters without spaces.
fn check_name(key: &str, value: &str) -> Result<String> {
    let ok = !value.is_empty() && value.len() <= 253 && value.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(value.to_owned())
    } else {
        Err(invalid(
            key,
            value,
            "must be 1 to 253 printable ASCII characters without spaces",
        ))
    }
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

/// Classifies a container from its OCI spec (`config.json` as JSON). `id` is the container id.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the annotation when an `io.mqfq.*` annotation is malformed.
pub fn classify(spec: &Value, id: &str) -> Result<Classification> {
    // Validate our annotations first, even on containers that turn out not to be GPU work, so a
    // typo never silently disables scheduling.
    let forced = match annotation(spec, ANN_GPU) {
        None => None,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Some(true),
            "false" | "0" | "no" => Some(false),
            _ => return Err(invalid(ANN_GPU, v, "expected true or false")),
        },
    };
    let weight = match annotation(spec, ANN_WEIGHT) {
        None => 1.0,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(w) if w.is_finite() && w > 0.0 && w <= 1000.0 => w,
            _ => return Err(invalid(ANN_WEIGHT, v, "expected a number in (0, 1000]")),
        },
    };
    let function = annotation(spec, ANN_FUNCTION)
        .map(|v| check_name(ANN_FUNCTION, v))
        .transpose()?;
    let tenant = annotation(spec, ANN_TENANT)
        .map(|v| check_name(ANN_TENANT, v))
        .transpose()?;

    if annotation(spec, "io.kubernetes.cri.container-type") == Some("sandbox") {
        return Ok(Classification::NotGpu);
    }
    let nvidia =
        env(spec, "NVIDIA_VISIBLE_DEVICES").filter(|v| !matches!(v.trim(), "" | "void" | "none"));
    let cuda = env(spec, "CUDA_VISIBLE_DEVICES").filter(|v| !v.trim().is_empty());
    let cdi: Vec<&str> = annotations(spec)
        .filter(|(k, _)| k.starts_with("cdi.k8s.io/"))
        .map(|(_, v)| v)
        .collect();
    let dev_nodes: Vec<&str> = devices(spec)
        .filter(|p| p.starts_with("/dev/nvidia"))
        .collect();
    let detected = nvidia.is_some() || cuda.is_some() || !cdi.is_empty() || !dev_nodes.is_empty();
    if !forced.unwrap_or(detected) {
        return Ok(Classification::NotGpu);
    }

    let gpus = if let Some(v) = nvidia {
        parse_list(v)
    } else if !cdi.is_empty() {
        // CDI values are comma-separated fully-qualified names: vendor/class=device.
        let names: Vec<String> = cdi
            .iter()
            .flat_map(|v| v.split(','))
            .filter_map(|d| d.split_once('=').map(|(_, n)| n.trim().to_owned()))
            .filter(|n| !n.is_empty())
            .collect();
        if names.iter().any(|n| n == "all") || names.is_empty() {
            GpuSelection::All
        } else {
            GpuSelection::Devices(names)
        }
    } else if let Some(v) = cuda {
        parse_list(v)
    } else {
        let idx: Vec<String> = dev_nodes
            .iter()
            .filter_map(|p| p.strip_prefix("/dev/nvidia"))
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .map(str::to_owned)
            .collect();
        if idx.is_empty() {
            GpuSelection::All
        } else {
            GpuSelection::Devices(idx)
        }
    };

    let function = function.unwrap_or_else(|| derive_function(spec, id));
    Ok(Classification::Gpu(GpuWork {
        function,
        weight,
        tenant,
        gpus,
    }))
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
mod tests {
    use serde_json::json;

    use super::*;

    fn gpu(spec: &Value) -> GpuWork {
        match classify(spec, "cid").unwrap() {
            Classification::Gpu(w) => w,
            Classification::NotGpu => panic!("expected GPU work for {spec}"),
        }
    }

    #[test]
    fn plain_containers_are_not_gpu_work() {
        let spec = json!({"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]},
                          "linux": {"devices": [{"path": "/dev/fuse"}]}});
        assert_eq!(classify(&spec, "c").unwrap(), Classification::NotGpu);
        assert_eq!(
            classify(&json!({"process": {"env": ["CUDA_VISIBLE_DEVICES="]}}), "c").unwrap(),
            Classification::NotGpu
        );
    }

    #[test]
    fn each_signal_makes_gpu_work() {
        let w = gpu(&json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0,GPU-abc"]}}));
        assert_eq!(
            w.gpus,
            GpuSelection::Devices(vec!["0".into(), "GPU-abc".into()])
        );
        assert_eq!(w.function, "cid");
        assert_eq!(w.weight, 1.0);
        let w = gpu(&json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}));
        assert_eq!(w.gpus, GpuSelection::All);
        let w = gpu(&json!({"process": {"env": ["CUDA_VISIBLE_DEVICES=1"]}}));
        assert_eq!(w.gpus, GpuSelection::Devices(vec!["1".into()]));
        let w =
            gpu(&json!({"annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=0,nvidia.com/gpu=1"}}));
        assert_eq!(w.gpus, GpuSelection::Devices(vec!["0".into(), "1".into()]));
        let w = gpu(
            &json!({"linux": {"devices": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia3"}]}}),
        );
        assert_eq!(w.gpus, GpuSelection::Devices(vec!["3".into()]));
        let w = gpu(&json!({"annotations": {"io.mqfq.gpu": "true"}}));
        assert_eq!(w.gpus, GpuSelection::All);
    }

    #[test]
    fn explicit_annotation_and_sandbox_win() {
        let spec = json!({"annotations": {"io.mqfq.gpu": "false"},
                          "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
        assert_eq!(classify(&spec, "c").unwrap(), Classification::NotGpu);
        let pause = json!({"annotations": {"io.kubernetes.cri.container-type": "sandbox"},
                           "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
        assert_eq!(classify(&pause, "c").unwrap(), Classification::NotGpu);
    }

    #[test]
    fn function_key_sources_in_order() {
        let base = |ann: Value| json!({"annotations": ann, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
        let w = gpu(&base(
            json!({"io.mqfq.function": "resnet", "serving.knative.dev/service": "x",
                                  "io.mqfq.weight": "2.5", "io.mqfq.tenant": "acme"}),
        ));
        assert_eq!(
            (w.function.as_str(), w.weight, w.tenant.as_deref()),
            ("resnet", 2.5, Some("acme"))
        );
        let w = gpu(&base(json!({"serving.knative.dev/service": "hello",
                                  "io.kubernetes.cri.sandbox-namespace": "prod"})));
        assert_eq!(w.function, "knative/prod/hello");
        let w = gpu(&base(
            json!({"serving.knative.dev/revision": "hello-00001"}),
        ));
        assert_eq!(w.function, "knative/default/hello-00001");
        let w = gpu(&base(
            json!({"io.kubernetes.cri.sandbox-name": "wsk0_12_guest_classify"}),
        ));
        assert_eq!(w.function, "openwhisk/guest_classify");
        let w = gpu(&base(
            json!({"io.kubernetes.cri.image-name": "docker.io/acme/resnet:1"}),
        ));
        assert_eq!(w.function, "docker.io/acme/resnet:1");
    }

    #[test]
    fn malformed_annotations_name_themselves_even_on_non_gpu_containers() {
        for (k, v) in [
            ("io.mqfq.weight", "0"),
            ("io.mqfq.weight", "-1"),
            ("io.mqfq.weight", "NaN"),
            ("io.mqfq.weight", "heavy"),
            ("io.mqfq.gpu", "maybe"),
            ("io.mqfq.function", ""),
            ("io.mqfq.function", "has space"),
            ("io.mqfq.tenant", "tab\there"),
        ] {
            let spec = json!({"annotations": {k: v}});
            match classify(&spec, "c") {
                Err(Error::InvalidArgument(msg)) => assert!(msg.contains(k), "{msg}"),
                other => panic!("{k}={v:?}: {other:?}"),
            }
        }
        let long = "f".repeat(254);
        classify(&json!({"annotations": {"io.mqfq.function": long}}), "c").unwrap_err();
    }
}
