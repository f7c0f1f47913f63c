//! Placement's side of the service: `Place` answers which GPU a container that may use several
//! should get; ended bursts teach the functions' features and every sample each GPU's health.
//! The decisions are `scheduler_core::placement`'s.

use scheduler_core::Time;
use scheduler_core::node::admission::{AdmitInfo, Core, Kind};
use scheduler_core::placement::{Health, HealthSample, Near, Placement, Sample as BurstSample};

use super::{Daemon, Inner, admit_info, check_asked, status, to_ttrpc};
use crate::monitor::Sample;
use mqfq_proto::api;

/// The most processes of one burst whose samples are looked at (the shim's connection cap).
const MAX_PIDS: usize = 64;

/// A run that ended, as its release describes it.
#[derive(Debug)]
pub(super) struct Ended<'a> {
    /// Its flow key.
    pub function: &'a str,
    /// Its tenant, if any.
    pub tenant: Option<&'a str>,
    /// The GPU its lease was on, and since when.
    pub gpu: u32,
    pub since: Time,
    /// Its GPU time, seconds (capped at the time held).
    pub service_s: f64,
    /// A burst's processes (host PIDs).
    pub pids: &'a [u32],
    /// A burst's host↔device bytes, where counted.
    pub transfer_bytes: Option<u64>,
    /// Device bytes its processes hold, where reported.
    pub footprint: Option<u64>,
}

impl Daemon {
    /// Turns placement on with `p`, or off with `None` (containers keep what they were given).
    pub fn set_placement(&self, p: Option<Placement>) {
        self.lock().placement = p;
    }

    /// The Warm-tier backend told to shims for containers whose pod did not choose one, and
    /// the ones a pod may choose (empty: any).
    pub fn set_warm(&self, w: mqfq_proto::warm::Warm, allowed: Vec<mqfq_proto::warm::Warm>) {
        self.lock().warm = (w, allowed);
    }

    /// A run that ended as runs do teaches its function's features: its GPU time, and what
    /// its release says (a burst's bytes and processes, whose NVML samples over the lease give
    /// its SM and bandwidth shares; what its processes hold).
    pub(super) fn placement_learn(inner: &mut Inner, run: &Ended<'_>, now: Time) {
        let Some(p) = inner.placement.as_mut() else {
            return;
        };
        let pids = &run.pids[..run.pids.len().min(MAX_PIDS)];
        let shares = (!pids.is_empty())
            .then(|| p.burst_use(run.gpu, pids, run.since, now))
            .flatten();
        #[expect(
            clippy::cast_precision_loss,
            reason = "bytes: a sample needs no more than f64's 52 bits"
        )]
        let s = BurstSample {
            burst_ms: run.service_s * 1e3,
            sm: shares.map(|(sm, _)| sm),
            dram: shares.map(|(_, mem)| mem),
            footprint_mib: run.footprint.map(|b| b as f64 / f64::from(1u32 << 20)),
            transfer_bytes: run.transfer_bytes.map(|b| b as f64),
        };
        if let Err(e) = p.observe_burst(run.function, run.tenant, &s, now) {
            tracing::debug!(function = run.function, "placement sample dropped: {e}");
        }
    }

    /// One sampling period: each GPU's health moves on its reading, or on NVML's failure to
    /// read that GPU (`failed`: NVML answered for none).
    pub(super) fn placement_sample(
        &self,
        inner: &mut Inner,
        samples: &[Sample],
        failed: bool,
        now: Time,
    ) {
        // Xids are counted whether or not placement is on: an operator alerts on them.
        for s in samples {
            for x in &s.xids {
                self.metrics.xid(s.index, *x);
            }
        }
        let Some(p) = inner.placement.as_mut() else {
            return;
        };
        // NVML not answering at all says nothing against any one GPU: no sample then.
        if failed {
            return;
        }
        for s in samples {
            if !s.processes.is_empty() {
                p.observe_processes(s.index, now, &s.processes);
            }
            let fatal: Vec<u64> = s.xids.iter().copied().filter(|x| p.fatal_xid(*x)).collect();
            if !fatal.is_empty() {
                tracing::error!(gpu = s.index, xids = ?fatal, "a critical Xid says this GPU is failing");
            }
            let h = HealthSample {
                utilization: s.sm_activity,
                error: s.failed,
                xid: !fatal.is_empty(),
                busy: s.busy,
                power: s
                    .power_mw
                    .zip(s.power_limit_mw.filter(|l| *l > 0))
                    .map(|(p, l)| f64::from(p) / f64::from(l)),
            };
            let changed = p.observe_gpu(s.index, h);
            self.metrics.set_gpu_health(s.index, p.health(s.index));
            if let Some((from, to)) = changed {
                tracing::warn!(
                    gpu = s.index,
                    from = from.name(),
                    to = to.name(),
                    "GPU health for new containers changed"
                );
                if to == Health::Failed {
                    let gone = inner.node.pool_mut().gpu_failed(s.index, now);
                    tracing::warn!(
                        gpu = s.index,
                        containers = gone,
                        "idle pooled containers of a failed GPU go cold"
                    );
                }
            }
        }
    }
}

/// A `Place` request checked as an admission would be, with its partners as flow keys (they
/// are functions of its own tenant).
fn checked(d: &Daemon, req: &api::AdmitRequest) -> ttrpc::Result<(AdmitInfo, Vec<String>)> {
    check_asked(req.weight, &req.tenant, &req.pod_namespace).map_err(|e| to_ttrpc(&e))?;
    let info = admit_info(&d.policy, req, Kind::Start);
    // Its features are kept under its function's name: the checks an admission makes.
    Core::validate(&info).map_err(|e| to_ttrpc(&e))?;
    if req.partners.len() > 8 || !req.partners.iter().all(|p| scheduler_core::node::is_key(p)) {
        return Err(status(
            ttrpc::Code::INVALID_ARGUMENT,
            "invalid `partners`: at most 8 function names of A-Z a-z 0-9 . _ - : / @ +",
        ));
    }
    // Partners are functions of its own tenant.
    let partners: Vec<String> = req
        .partners
        .iter()
        .map(|p| {
            AdmitInfo {
                function: p.clone(),
                ..info.clone()
            }
            .flow_key()
        })
        .collect();
    if req.gpus.len() > 64 {
        return Err(status(
            ttrpc::Code::INVALID_ARGUMENT,
            format!("invalid `gpus`: {} entries (at most 64)", req.gpus.len()),
        ));
    }
    Ok((info, partners))
}

/// `Place`: the GPU a container being created should get among those it was given.
pub(super) fn place(d: &Daemon, req: &api::AdmitRequest) -> ttrpc::Result<api::PlaceResponse> {
    let (info, partners) = checked(d, req)?;
    let flow = info.flow_key();
    let now = d.now();
    let mut inner = d.lock();
    if inner.placement.is_none() {
        return Ok(api::PlaceResponse::default());
    }
    // Candidates as the request named them; a name that stands for several GPUs (a MIG UUID
    // NVML does not list) makes no choice: the container keeps what it was given.
    let mut named: Vec<(String, u32)> = Vec::new();
    if req.gpus.is_empty() {
        named = inner
            .node
            .core()
            .gpus()
            .iter()
            .map(|g| (g.info.index.to_string(), g.info.index))
            .collect();
    } else {
        for n in &req.gpus {
            let idx = inner
                .node
                .core()
                .resolve(std::slice::from_ref(n))
                .map_err(|e| to_ttrpc(&e))?;
            let [i] = idx[..] else {
                return Ok(api::PlaceResponse::default());
            };
            if !named.iter().any(|(_, j)| *j == i) {
                named.push((n.clone(), i));
            }
        }
    }
    if named.len() < 2 {
        return Ok(api::PlaceResponse::default());
    }
    let candidates: Vec<u32> = named.iter().map(|(_, i)| *i).collect();
    let (resident, start_s) = inner.node.pool().presence(&flow);
    let mut near = Near {
        resident,
        start_s,
        ..Near::default()
    };
    for p in &partners {
        near.partners.extend(inner.node.pool().hot_gpus(p));
    }
    near.partners.extend(
        inner
            .node
            .core()
            .leases()
            .filter(|(_, l)| partners.contains(&l.function))
            .map(|(_, l)| l.gpu),
    );
    let gpus = inner.node.core().gpus();
    let ahead = inner.node.core().work_ahead(&flow);
    let minute = crate::placement::minute_of_day_utc();
    let Some(p) = inner.placement.as_mut() else {
        return Ok(api::PlaceResponse::default());
    };
    let choice = p.choose(&gpus, &ahead, &candidates, &flow, &near, minute, now);
    // Under the same lock: a Create racing this one sees the choice.
    if let Ok(c) = &choice {
        p.placed(c.gpu, now);
    }
    drop(inner);
    match choice {
        Ok(c) => {
            let device = named
                .iter()
                .find(|(_, i)| *i == c.gpu)
                .map(|(n, _)| n.clone())
                .unwrap_or_default();
            tracing::info!(container = %req.container_id, function = %flow, gpu = c.gpu,
                reason = c.reason, score = c.score, "placed");
            d.metrics.placed(c.gpu, c.reason);
            Ok(api::PlaceResponse {
                device,
                reason: c.reason.into(),
                ..Default::default()
            })
        }
        Err(e) => {
            tracing::warn!(container = %req.container_id, function = %flow,
                "no placement: {e}; the container keeps the GPUs it was given");
            Ok(api::PlaceResponse::default())
        }
    }
}
