//! The kube-scheduler extender: `POST /filter` and `POST /prioritize` with the extender API's
//! JSON (`ExtenderArgs` in, `ExtenderFilterResult` / `HostPriorityList` out), answered from a
//! cache of the `GpuNodeState` objects.
//!
//! Configured `nodeCacheCapable: true` the scheduler sends node names only; without it, whole
//! `Node` objects, which are passed back as they came (filtered). Meant to be `ignorable`: the
//! cluster keeps scheduling when the extender is down, and a node it knows nothing about (or
//! whose object is stale) passes the filter with score 0 — the extender narrows and ranks,
//! it never keeps a pod from a node mqfq does not run on. Bad input is an HTTP 400 whose
//! body names what was wrong. The ranking is `scheduler_core::placement::cluster::rank`.
//!
//! Any pod can reach the Service, so a request costs about its own size: node objects are kept
//! as the text they came in (only their names parsed), at most [`MAX_NODES`] are kept however
//! many a body lists, the body is read only once a request slot is held, within
//! [`Extender::body_timeout`], and parsing and ranking run off the async workers.
//! [`crate::http::serve`] bounds connections and the time to send headers.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use scheduler_core::placement::cluster::{NodeState, NodeSummary, rank};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::crd::{GpuNodeState, GpuNodeStateSpec};

/// The largest request body taken: names of the most nodes a cluster has (configured
/// `nodeCacheCapable`, as shipped, kube-scheduler sends names only), or whole `Node` objects of
/// a hundred or two nodes.
pub const MAX_BODY: usize = 2 << 20;
/// Requests answered at once; more get 503 (kube-scheduler treats the ignorable extender's
/// error as no opinion). kube-scheduler schedules one pod at a time.
pub const MAX_IN_FLIGHT: usize = 8;
/// The most candidate nodes one request may name (Kubernetes supports clusters of 5 000).
pub const MAX_NODES: usize = 15_000;
/// How long a request's body may take to arrive once its headers have.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// `ExtenderArgs`: the pod and its candidate nodes.
#[derive(Debug, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled (only its metadata is read).
    pub pod: Option<PodRef>,
    /// Candidate nodes as objects (`nodeCacheCapable: false`).
    #[serde(default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names (`nodeCacheCapable: true`).
    #[serde(default)]
    pub nodenames: Option<Bounded<String>>,
}

/// A list of which at most [`MAX_NODES`] items are kept; the rest are only counted (read past,
/// never stored), so a body of a million tiny items costs no more than one of the most kept.
#[derive(Debug)]
pub struct Bounded<T> {
    /// The first items.
    pub kept: Vec<T>,
    /// How many the list had.
    pub count: usize,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Bounded<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Items<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Items<T> {
            type Value = Bounded<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut kept = Vec::new();
                let mut count = 0;
                loop {
                    let more = if count < MAX_NODES {
                        seq.next_element::<T>()?.map(|t| kept.push(t)).is_some()
                    } else {
                        seq.next_element::<IgnoredAny>()?.is_some()
                    };
                    if !more {
                        return Ok(Bounded { kept, count });
                    }
                    count += 1;
                }
            }
        }
        d.deserialize_seq(Items(PhantomData))
    }
}

/// `ExtenderArgs.nodes`: a `NodeList`, of which only the items count.
#[derive(Debug, Deserialize)]
pub struct NodeList {
    /// Its items.
    #[serde(default)]
    pub items: Option<Bounded<NodeItem>>,
}

/// One node object: the text it came as (passed back as it was when it passes the filter) and
/// its `metadata.name`, if it has one.
#[derive(Debug)]
pub struct NodeItem {
    /// `metadata.name`.
    pub name: Option<String>,
    /// The object, as sent.
    pub raw: Box<RawValue>,
}

impl<'de> Deserialize<'de> for NodeItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        // Only an object whose `metadata` is an object with a string `name` is a named node
        // (a derived struct would read `[[""]]` as one named ""); the rest of it is read over,
        // never held: a node object can be most of a 2 MiB body.
        let mut de = serde_json::Deserializer::from_str(raw.get());
        let name = FieldOf::<MetaName>::new("metadata")
            .deserialize(&mut de)
            .ok()
            .flatten()
            .and_then(|m| m.0);
        Ok(NodeItem { name, raw })
    }
}

/// `metadata.name`, read as [`FieldOf`] reads it.
struct MetaName(Option<String>);

impl<'de> Deserialize<'de> for MetaName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        FieldOf::<String>::new("name").deserialize(d).map(MetaName)
    }
}

/// The one field `key` of a JSON object, the others skipped unparsed; anything but an object is
/// an error.
struct FieldOf<T> {
    key: &'static str,
    _t: PhantomData<T>,
}

impl<T> FieldOf<T> {
    fn new(key: &'static str) -> Self {
        FieldOf {
            key,
            _t: PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for FieldOf<T> {
    type Value = Option<T>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for FieldOf<T> {
    type Value = Option<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an object (its `{}`)", self.key)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Option<T>, A::Error> {
        let mut out = None;
        while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
            if out.is_none() && k == self.key {
                out = Some(m.next_value::<T>()?);
            } else {
                m.next_value::<IgnoredAny>()?;
            }
        }
        Ok(out)
    }
}

/// The node objects that pass the filter, as they came.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodesOut {
    /// The objects.
    pub items: Vec<Box<RawValue>>,
}

impl PartialEq for NodesOut {
    fn eq(&self, other: &Self) -> bool {
        self.items.len() == other.items.len()
            && self
                .items
                .iter()
                .zip(&other.items)
                .all(|(a, b)| a.get() == b.get())
    }
}

/// The part of a pod the extender reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodRef {
    /// Its metadata.
    #[serde(default)]
    pub metadata: PodMeta,
}

/// Pod metadata.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodMeta {
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
    /// Namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `ExtenderFilterResult`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FilterResult {
    /// The nodes that pass, as objects (when they came as objects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodesOut>,
    /// The nodes that pass, by name (when they came by name).
    #[serde(rename = "nodenames", skip_serializing_if = "Option::is_none")]
    pub node_names: Option<Vec<String>>,
    /// Nodes that fail, with why.
    pub failed_nodes: BTreeMap<String, String>,
    /// What went wrong with the request, if anything.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// `HostPriority`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    pub host: String,
    /// 0..=10.
    pub score: i64,
}

/// A request the extender cannot answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BadRequest {
    /// Not `ExtenderArgs` JSON.
    #[error("request body is not ExtenderArgs JSON: {0}")]
    Json(String),
    /// No `pod`.
    #[error("ExtenderArgs.pod is missing")]
    NoPod,
    /// Neither `nodes` nor `nodenames`.
    #[error("ExtenderArgs has neither nodes nor nodenames")]
    NoNodes,
    /// `nodes` has no `items` array.
    #[error("ExtenderArgs.nodes is not a NodeList (no items array)")]
    NotNodeList,
    /// `nodes` is not a NodeList with named items.
    #[error("ExtenderArgs.nodes.items[{0}] has no metadata.name")]
    NodeName(usize),
    /// Too many nodes.
    #[error("ExtenderArgs names {0} nodes (at most {MAX_NODES})")]
    TooMany(usize),
}

/// The published summaries the extender answers from, by node name.
#[derive(Debug, Default)]
pub struct Cache {
    by_node: RwLock<HashMap<String, (NodeSummary, u64)>>,
}

impl Cache {
    /// Replaces the cache with `objects`: each filed under its object's name, and only if it
    /// says it is that node's (a publisher writing another node's name into its own object
    /// speaks for nobody); each summary held to plausible figures.
    pub fn replace(&self, objects: Vec<GpuNodeState>) {
        self.fill(
            objects
                .into_iter()
                .map(|o| (o.metadata.name.unwrap_or_default(), o.spec)),
        );
    }

    /// Replaces the cache with what a list returned, read object by object: one that does not
    /// parse is skipped and logged, never the list.
    pub fn replace_raw(&self, objects: Vec<DynamicObject>) {
        self.fill(objects.into_iter().filter_map(|o| {
            let name = o.metadata.name.unwrap_or_default();
            let spec = o.data.get("spec").cloned().unwrap_or(Value::Null);
            match serde_json::from_value::<GpuNodeStateSpec>(spec) {
                Ok(spec) => Some((name, spec)),
                Err(e) => {
                    tracing::warn!(object = %name, "GpuNodeState skipped: {e}");
                    None
                }
            }
        }));
    }

    fn fill(&self, objects: impl Iterator<Item = (String, GpuNodeStateSpec)>) {
        let fresh: HashMap<String, (NodeSummary, u64)> = objects
            .filter(|(name, spec)| *name == spec.node)
            .map(|(name, spec)| (name, (spec.summary.sanitized(), spec.published_unix_ms)))
            .collect();
        *self
            .by_node
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
    }

    /// Nodes cached.
    #[must_use]
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether nothing is cached.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, (NodeSummary, u64)>> {
        self.by_node
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The extender's state.
#[derive(Debug)]
pub struct Extender {
    /// The summaries.
    pub cache: Arc<Cache>,
    /// A summary older than this (seconds) is ignored.
    pub stale_s: f64,
    /// Requests in flight, at most [`MAX_IN_FLIGHT`].
    pub in_flight: Arc<tokio::sync::Semaphore>,
    /// How long a body may take to arrive ([`BODY_TIMEOUT`]); then the request is answered 408.
    pub body_timeout: Duration,
}

impl Extender {
    /// Answers from `cache`, ignoring summaries older than `stale_s` seconds.
    #[must_use]
    pub fn new(cache: Arc<Cache>, stale_s: f64) -> Self {
        Extender {
            cache,
            stale_s,
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
            body_timeout: BODY_TIMEOUT,
        }
    }
}

/// The function a pod's GPU work runs as, in the flow keys nodes publish: its
/// `io.mqfq.function`, else its Knative service, each tried under the pod's namespace (mqfqd's
/// default tenant) and bare.
fn function_keys(pod: &PodMeta) -> Vec<String> {
    let ns = pod.namespace.as_deref().unwrap_or("default");
    let named = pod
        .annotations
        .get("io.mqfq.function")
        .cloned()
        .or_else(|| {
            pod.labels
                .get("serving.knative.dev/service")
                .or_else(|| pod.annotations.get("serving.knative.dev/service"))
                .map(|s| format!("knative/{ns}/{s}"))
        });
    named
        .map(|f| vec![format!("{ns}/{f}"), f])
        .unwrap_or_default()
}

impl Extender {
    /// The request, its pod's metadata and its candidate nodes' names (the list's own for
    /// names; for objects, cloned out of them).
    fn parse(body: &[u8]) -> Result<(ExtenderArgs, PodMeta, Vec<String>), BadRequest> {
        let mut args: ExtenderArgs =
            serde_json::from_slice(body).map_err(|e| BadRequest::Json(e.to_string()))?;
        let pod = args.pod.take().ok_or(BadRequest::NoPod)?.metadata;
        let names = match (&mut args.nodenames, &args.nodes) {
            (Some(n), _) if n.count > MAX_NODES => return Err(BadRequest::TooMany(n.count)),
            (Some(n), _) => std::mem::take(&mut n.kept),
            (None, Some(list)) => {
                let items = list.items.as_ref().ok_or(BadRequest::NotNodeList)?;
                if items.count > MAX_NODES {
                    return Err(BadRequest::TooMany(items.count));
                }
                items
                    .kept
                    .iter()
                    .enumerate()
                    .map(|(i, n)| n.name.clone().ok_or(BadRequest::NodeName(i)))
                    .collect::<Result<_, _>>()?
            }
            (None, None) => return Err(BadRequest::NoNodes),
        };
        Ok((args, pod, names))
    }

    fn ranked(
        &self,
        pod: &PodMeta,
        names: &[String],
        now_ms: u64,
    ) -> Vec<scheduler_core::placement::cluster::Ranked> {
        let cache = self.cache.read();
        let keys = function_keys(pod);
        let function = keys
            .iter()
            .find(|k| cache.values().any(|(s, _)| s.functions.contains_key(*k)))
            .or(keys.first());
        let nodes: Vec<NodeState<'_>> = names
            .iter()
            .map(|n| NodeState {
                name: n,
                summary: cache.get(n).map(|(s, at)| {
                    // From a clock more than 30 s ahead: not to be trusted as fresh for ever.
                    #[expect(clippy::cast_precision_loss, reason = "ages in seconds")]
                    let age = if *at > now_ms.saturating_add(30_000) {
                        f64::INFINITY
                    } else {
                        now_ms.saturating_sub(*at) as f64 / 1e3
                    };
                    (s, age)
                }),
            })
            .collect();
        rank(&nodes, function.map(String::as_str), self.stale_s)
    }

    /// `filter` on a request body at `now_ms`.
    ///
    /// # Errors
    /// The body is not usable `ExtenderArgs`.
    pub fn filter(&self, body: &[u8], now_ms: u64) -> Result<FilterResult, BadRequest> {
        let (args, pod, names) = Self::parse(body)?;
        let ranked = self.ranked(&pod, &names, now_ms);
        let mut out = FilterResult::default();
        let mut pass = Vec::new();
        for r in ranked {
            match r.failed {
                Some(why) => {
                    out.failed_nodes.insert(r.name, why);
                }
                None => pass.push(r.name),
            }
        }
        if args.nodenames.is_some() {
            out.node_names = Some(pass);
        } else if let Some(items) = args.nodes.and_then(|l| l.items) {
            let items = items
                .kept
                .into_iter()
                .filter(|n| {
                    n.name
                        .as_ref()
                        .is_some_and(|name| !out.failed_nodes.contains_key(name))
                })
                .map(|n| n.raw)
                .collect();
            out.nodes = Some(NodesOut { items });
        }
        Ok(out)
    }

    /// `prioritize` on a request body at `now_ms`.
    ///
    /// # Errors
    /// The body is not usable `ExtenderArgs`.
    pub fn prioritize(&self, body: &[u8], now_ms: u64) -> Result<Vec<HostPriority>, BadRequest> {
        let (_, pod, names) = Self::parse(body)?;
        Ok(self
            .ranked(&pod, &names, now_ms)
            .into_iter()
            .map(|r| HostPriority {
                host: r.name,
                score: r.score,
            })
            .collect())
    }
}

fn bad(e: &BadRequest) -> Response {
    tracing::info!("bad extender request: {e}");
    let body = FilterResult {
        error: e.to_string(),
        ..FilterResult::default()
    };
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

fn busy() -> Response {
    let body = FilterResult {
        error: format!("mqfq-extender: more than {MAX_IN_FLIGHT} requests at once"),
        ..FilterResult::default()
    };
    (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response()
}

fn refused(code: StatusCode, error: String) -> Response {
    tracing::info!("extender request refused: {error}");
    let body = FilterResult {
        error,
        ..FilterResult::default()
    };
    (code, axum::Json(body)).into_response()
}

/// One verb: a request slot first (else 503), then the body within [`MAX_BODY`] and
/// `x.body_timeout` (else 413 or 408), then `answer` on it off the async workers: JSON, or a 400.
async fn respond<T: Serialize + Send + 'static>(
    x: Arc<Extender>,
    headers: &HeaderMap,
    body: Body,
    answer: fn(&Extender, &[u8], u64) -> Result<T, BadRequest>,
) -> Response {
    let Ok(permit) = x.in_flight.clone().try_acquire_owned() else {
        return busy();
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body over {MAX_BODY} bytes"),
        );
    }
    let body =
        match tokio::time::timeout(x.body_timeout, axum::body::to_bytes(body, MAX_BODY)).await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                return refused(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body unreadable or over {MAX_BODY} bytes: {e}"),
                );
            }
            Err(_) => {
                return refused(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("request body not sent within {:?}", x.body_timeout),
                );
            }
        };
    let work = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        answer(&x, &body, crate::unix_ms())
    });
    match work.await {
        Ok(Ok(r)) => axum::Json(r).into_response(),
        Ok(Err(e)) => bad(&e),
        Err(e) => refused(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("mqfq-extender: {e}"),
        ),
    }
}

async fn filter(State(x): State<Arc<Extender>>, headers: HeaderMap, body: Body) -> Response {
    respond(x, &headers, body, Extender::filter).await
}

async fn prioritize(State(x): State<Arc<Extender>>, headers: HeaderMap, body: Body) -> Response {
    respond(x, &headers, body, Extender::prioritize).await
}

/// The HTTP API: `POST /filter`, `POST /prioritize`, `GET /healthz`.
pub fn router(x: Arc<Extender>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(x)
}

/// The `GpuNodeState` objects of `namespace` untyped, so that one malformed object cannot fail
/// a whole list.
#[must_use]
pub fn untyped(client: kube::Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, namespace, &ApiResource::erase::<GpuNodeState>(&()))
}

/// Lists the objects into `cache` every `period`, for ever; a failed list keeps the last
/// cache (its summaries age out through their timestamps).
pub async fn refresh(api: Api<DynamicObject>, cache: Arc<Cache>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        match api.list(&ListParams::default()).await {
            Ok(list) => cache.replace_raw(list.items),
            Err(e) => tracing::warn!("list GpuNodeState: {e}"),
        }
    }
}
