//! `GpuNodeState` (`mqfq.io/v1alpha1`): one object per GPU node, written by that node's
//! publisher and read by the extender. Namespaced (the operator's namespace for mqfq), named
//! after the node.

use kube::CustomResource;
use scheduler_core::placement::cluster::NodeSummary;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a node published.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "mqfq.io",
    version = "v1alpha1",
    kind = "GpuNodeState",
    namespaced,
    shortname = "gns",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.node"}"#,
    printcolumn = r#"{"name":"Why","type":"string","jsonPath":".spec.why"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GpuNodeStateSpec {
    /// The node's name.
    pub node: String,
    /// When it was written, milliseconds since the Unix epoch (the node's clock): the
    /// extender ignores a summary older than three heartbeats.
    pub published_unix_ms: u64,
    /// `first`, `crossing` or `heartbeat`.
    pub why: String,
    /// The summary (see `scheduler_core::placement::cluster`).
    #[schemars(schema_with = "opaque")]
    pub summary: NodeSummary,
}

/// The summary's schema: an object the API server keeps as written (its shape is versioned
/// with the publisher and the extender, which come from one release).
fn opaque(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// The CRD as YAML (what `packaging/kubernetes/crd.yaml` holds).
///
/// # Errors
/// Serialization fails (it does not).
pub fn crd_yaml() -> Result<String, serde_saphyr::SerializeError> {
    use kube::CustomResourceExt;
    serde_saphyr::to_string(&GpuNodeState::crd())
}
