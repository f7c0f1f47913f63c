//! The node publisher: `mqfqd`'s Status, summarized, written as the node's `GpuNodeState`
//! when the gate says so.
//!
//! Writes are plain create / replace with the last resourceVersion this publisher saw, so one
//! request per write in steady state; a conflict (someone else wrote the object, or it was
//! deleted and recreated) re-reads it and tries again, at most [`ATTEMPTS`] times. A write
//! that fails is tried again after the gate's minimum interval, doubled at each failure in a
//! row up to the heartbeat.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use mqfq_proto::api;
use scheduler_core::Time;
use scheduler_core::placement::cluster::{GpuSummary, NodeSummary, PublishGate, Why};

use crate::crd::{GpuNodeState, GpuNodeStateSpec};

/// Tries of one write through conflicts.
pub const ATTEMPTS: usize = 3;

/// Why a write did not go through.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The API server refused or could not be reached.
    #[error("API server: {0}")]
    Api(#[from] kube::Error),
    /// Every attempt met a conflicting write.
    #[error("GpuNodeState {0}: still conflicting after {ATTEMPTS} attempts")]
    Conflict(String),
}

/// `mqfqd`'s Status as the node's summary: each GPU with its model's figures, free memory,
/// utilization (SM activity where measured, else its share of slots in use) and health; each
/// flow's class and queue.
#[must_use]
pub fn summarize(s: &api::StatusResponse) -> NodeSummary {
    let gpus = s
        .gpus
        .iter()
        .map(|g| GpuSummary {
            index: g.index,
            name: g.name.clone(),
            tflops: g.tflops,
            mem_gbps: g.mem_gbps,
            memory_total: g.memory_total,
            memory_free: g.memory_total.saturating_sub(g.memory_used),
            utilization: g
                .sm_activity
                .unwrap_or_else(|| f64::from(g.running) / f64::from(g.limit.max(1)))
                .clamp(0.0, 1.0),
            health: if g.health.is_empty() {
                "healthy".into()
            } else {
                g.health.clone()
            },
            limit: g.limit,
            running: g.running,
            queued: u32::try_from(g.queued).unwrap_or(u32::MAX),
        })
        .collect();
    let flows: Vec<(String, String, u32)> = s
        .flows
        .iter()
        .map(|f| {
            let class = if f.class.is_empty() {
                "probing".to_owned()
            } else {
                f.class.clone()
            };
            (
                f.function.clone(),
                class,
                u32::try_from(f.queued).unwrap_or(u32::MAX),
            )
        })
        .collect();
    NodeSummary::new(gpus, &flows)
}

/// One node's writer.
#[derive(Debug)]
pub struct Publisher {
    api: Api<GpuNodeState>,
    node: String,
    gate: PublishGate,
    version: Option<String>,
    writes: u64,
}

impl Publisher {
    /// Writes `node`'s object through `api` when `gate` says so.
    #[must_use]
    pub fn new(api: Api<GpuNodeState>, node: &str, gate: PublishGate) -> Self {
        Publisher {
            api,
            node: node.to_owned(),
            gate,
            version: None,
            writes: 0,
        }
    }

    /// Write requests sent so far (successful or not).
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Publishes `summary` if it is due at `now` (written at `unix_ms`); why, if it was.
    ///
    /// # Errors
    /// The write failed; it is tried again at the next due step.
    pub async fn step(
        &mut self,
        summary: &NodeSummary,
        now: Time,
        unix_ms: u64,
    ) -> Result<Option<Why>, PublishError> {
        let Some(why) = self.gate.due(summary, now) else {
            return Ok(None);
        };
        let spec = GpuNodeStateSpec {
            node: self.node.clone(),
            published_unix_ms: unix_ms,
            why: why.name().to_owned(),
            summary: summary.clone(),
        };
        if let Err(e) = self.write(spec).await {
            self.gate.failed(now);
            return Err(e);
        }
        self.gate.written(summary, now);
        Ok(Some(why))
    }

    async fn write(&mut self, spec: GpuNodeStateSpec) -> Result<(), PublishError> {
        let pp = PostParams::default();
        for _ in 0..ATTEMPTS {
            let mut obj = GpuNodeState::new(&self.node, spec.clone());
            obj.metadata.resource_version.clone_from(&self.version);
            self.writes += 1;
            let sent = match &self.version {
                None => self.api.create(&pp, &obj).await,
                Some(_) => self.api.replace(&self.node, &pp, &obj).await,
            };
            match sent {
                Ok(o) => {
                    self.version = o.metadata.resource_version;
                    return Ok(());
                }
                // Exists already (a restarted publisher) or changed since: read it again.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    self.version = self
                        .api
                        .get_opt(&self.node)
                        .await?
                        .and_then(|o| o.metadata.resource_version);
                }
                // Deleted meanwhile: create it again.
                Err(kube::Error::Api(s)) if s.code == 404 => self.version = None,
                Err(e) => return Err(e.into()),
            }
        }
        Err(PublishError::Conflict(self.node.clone()))
    }
}

/// What the publisher loop needs.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `mqfqd`'s control socket.
    pub socket: PathBuf,
    /// How often `mqfqd` is read.
    pub period: Duration,
}

/// Reads `mqfqd` every period and publishes; runs until the process is stopped. A daemon that
/// does not answer is logged and asked again next period (nothing is written meanwhile: the
/// object ages, and the extender stops trusting it after three heartbeats).
pub async fn run(mut p: Publisher, s: Settings) {
    let start = Instant::now();
    let mut client: Option<api::AdmissionClient> = None;
    let mut tick = tokio::time::interval(s.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if client.is_none() {
            match mqfq_proto::connect(&s.socket).await {
                Ok(c) => client = Some(c),
                Err(e) => {
                    tracing::warn!(socket = %s.socket.display(), "mqfqd not reachable: {e}");
                    continue;
                }
            }
        }
        let Some(c) = &client else { continue };
        let status = match c
            .status(
                ttrpc::context::with_timeout(5_000_000_000),
                &api::StatusRequest::default(),
            )
            .await
        {
            Ok(st) => st,
            Err(e) => {
                tracing::warn!("mqfqd status: {e}");
                client = None;
                continue;
            }
        };
        let now = Time::from_secs_f64(start.elapsed().as_secs_f64());
        match p.step(&summarize(&status), now, crate::unix_ms()).await {
            Ok(Some(why)) => tracing::debug!(why = why.name(), "published"),
            Ok(None) => {}
            Err(e) => tracing::warn!("publish: {e}"),
        }
    }
}
