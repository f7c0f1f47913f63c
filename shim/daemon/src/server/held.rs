//! What NVML measured each process holding on each GPU, kept from the last sample: a pooled
//! container's whole footprint (its CUDA context included, which its own reports leave out) at
//! a release that names its processes, the GPU they are on, and so the GPU pairs a checkpointed
//! container is restored with when the node grants it another GPU of the same model.

use std::collections::{HashMap, HashSet};

use mqfq_proto::api;
use mqfq_proto::warm::Warm;
use scheduler_core::GpuMode;
use scheduler_core::node::admission::GpuInfo;
use scheduler_core::node::pool::Action;
use scheduler_core::node::{ContainerKey, PooledEnd};
use scheduler_core::tiers::Tier;

use super::{Daemon, Inner};
use crate::monitor::Sample;

/// The most PIDs of one release looked at (the shim names at most 1024 at a Pause, 64 a burst).
const MAX_PIDS: usize = 1024;

/// What the last sample said of the GPUs' processes.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// (GPU, host PID) → bytes (0 where NVML lists the process without a figure).
    by: HashMap<(u32, u32), u64>,
    /// GPUs NVML could not read: where a process is cannot be said while one is listed.
    unknown: HashSet<u32>,
}

impl Held {
    /// The last sample's reading, whole: a GPU whose processes NVML did not list (not read, or
    /// failed) is unknown, and no figure outlives the sample it came from.
    pub(super) fn keep(&mut self, samples: &[Sample]) {
        self.by.clear();
        self.unknown.clear();
        for s in samples {
            match &s.held {
                Some(list) if !s.failed => self
                    .by
                    .extend(list.iter().map(|&(pid, b)| ((s.index, pid), b))),
                _ => {
                    self.unknown.insert(s.index);
                }
            }
        }
    }

    /// What the processes a release names (host PIDs: a burst's socket peers from the
    /// kernel's credentials, or a Pause's from runc) held on GPU `gpu` at the last sample, as
    /// NVML measured them; `None` where it measured none of them.
    pub(super) fn resident_of(&self, gpu: u32, pids: &[u32]) -> Option<u64> {
        let pids: HashSet<u32> = pids.iter().take(MAX_PIDS).copied().collect();
        pids.iter()
            .filter_map(|p| self.by.get(&(gpu, *p)))
            .copied()
            .reduce(u64::saturating_add)
    }

    /// The one GPU NVML lists the processes a release names on at the last sample; `None`
    /// where it lists none of them, lists them on several GPUs, or could not read a GPU.
    pub(super) fn gpu_of(&self, pids: &[u32]) -> Option<u32> {
        if !self.unknown.is_empty() {
            return None;
        }
        let pids: HashSet<u32> = pids.iter().take(MAX_PIDS).copied().collect();
        let mut gpus = self
            .by
            .keys()
            .filter(|(_, pid)| pids.contains(pid))
            .map(|&(gpu, _)| gpu);
        let first = gpus.next()?;
        gpus.all(|g| g == first).then_some(first)
    }
}

impl Daemon {
    /// A pooled container's lease on `gpu` ended (`req`): after a pause or a burst it lives on,
    /// idle, holding what its shim reported and what NVML measured its named processes holding
    /// (and where); after anything else it is gone. `None` for a container not pooled.
    pub(super) fn pooled_end(
        inner: &mut Inner,
        key: ContainerKey,
        gpu: u32,
        reason: &str,
        req: &api::ReleaseRequest,
    ) -> Option<PooledEnd> {
        if !inner.pooled.contains_key(&key) {
            return None;
        }
        let paused = mqfq_proto::stays_idle(reason);
        let measured_on = inner.held.gpu_of(&req.pids);
        if !paused {
            inner.pooled.remove(&key);
        } else if let Some(p) = inner.pooled.get_mut(&key)
            && reason != mqfq_proto::UNUSED
        {
            // What this release's processes say, even unknown (none named, none listed): a
            // GPU measured before may no longer be where they are. Only a grant handed back
            // unused (nothing ran, nothing moved) leaves it.
            p.on_gpu = measured_on;
        }
        Some(PooledEnd {
            key,
            paused,
            bytes: req.managed_bytes,
            native: req.native.as_ref().map(mqfq_proto::memory::from_proto),
            resident: inner.held.resident_of(gpu, &req.pids),
        })
    }

    /// The GPU pairs a grant on `gpu` restores container `key` with: pooled under `checkpoint`,
    /// its memory off the GPU (Warm, no prefetch of it in flight), and its processes measured
    /// at its last release on another GPU of the same model, both whole (not MIG) — the driver
    /// restores them onto the lease's GPU, so the work runs where the node counts it. The map
    /// names every whole GPU the container's `devices` give it (the driver wants every GPU it
    /// could have checkpointed listed): the two swapped, the rest onto themselves. Empty otherwise (restored where it was). Where the processes are
    /// is learned again at the lease's release, never assumed from the grant.
    pub(super) fn restore_onto(
        &self,
        key: &ContainerKey,
        gpu: u32,
        devices: &[String],
    ) -> Vec<api::GpuPair> {
        let inner = self.lock();
        let Some(from) = moved_from(&inner, key, gpu) else {
            return Vec::new();
        };
        // Its own GPUs: all it could have been checkpointed on, none it cannot see.
        let Ok(own) = inner.node.core().resolve(devices) else {
            return Vec::new();
        };
        let gpus = inner.node.core().gpus();
        let info = |i: u32| gpus.iter().find(|g| g.info.index == i).map(|g| &g.info);
        let (Some(old), Some(new)) = (info(from), info(gpu)) else {
            return Vec::new();
        };
        // The driver restores only onto the same chip, and not into MIG instances.
        let whole = |g: &GpuInfo| g.mode != GpuMode::Mig;
        if old.name != new.name || !whole(old) || !whole(new) {
            return Vec::new();
        }
        tracing::info!(container = %key, from, to = gpu, "restoring onto another GPU");
        gpus.iter()
            .filter(|g| own.contains(&g.info.index) && whole(&g.info))
            .map(|g| {
                let onto = match g.info.index {
                    i if i == from => &new.uuid,
                    i if i == gpu => &old.uuid,
                    _ => &g.info.uuid,
                };
                api::GpuPair {
                    old_uuid: g.info.uuid.clone(),
                    new_uuid: onto.clone(),
                    ..Default::default()
                }
            })
            .collect()
    }
}

/// The GPU a checkpointed, Warm container's processes are on when a lease names another.
fn moved_from(inner: &Inner, key: &ContainerKey, gpu: u32) -> Option<u32> {
    let p = inner.pooled.get(key)?;
    let pool = inner.node.pool();
    if p.warm != Warm::Checkpoint
        || pool.tier(key) != Some(Tier::Warm)
        || pool.pending(key) == Some(Action::Prefetch)
    {
        return None;
    }
    p.on_gpu.filter(|&h| h != gpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(index: u32, failed: bool, list: &[(u32, u64)]) -> Sample {
        Sample {
            index,
            failed,
            held: Some(list.to_vec()),
            ..Sample::default()
        }
    }

    #[test]
    fn a_release_s_processes_are_found_on_their_gpu_only() {
        let mut held = Held::default();
        held.keep(&[
            sample(0, false, &[(10, 100), (11, 50), (99, 1000)]),
            sample(1, false, &[(12, 7)]),
        ]);
        assert_eq!(held.resident_of(0, &[10, 11, 10, 12]), Some(150));
        assert_eq!(held.resident_of(1, &[10, 11, 10, 12]), Some(7));
        assert_eq!(held.resident_of(0, &[5]), None);
        assert_eq!(held.gpu_of(&[10, 11]), Some(0));
        assert_eq!(held.gpu_of(&[10, 12]), None, "on two GPUs");
        assert_eq!(held.gpu_of(&[5]), None);
    }

    #[test]
    fn each_sample_replaces_the_last_and_an_unread_gpu_is_unknown() {
        let mut held = Held::default();
        held.keep(&[sample(0, false, &[(10, 100)]), sample(1, false, &[(12, 7)])]);
        held.keep(&[sample(0, false, &[(11, 5)]), sample(1, true, &[(12, 9)])]);
        assert_eq!(held.resident_of(0, &[10, 11]), Some(5));
        assert_eq!(
            held.resident_of(1, &[12]),
            None,
            "GPU 1 not read: nothing of it kept"
        );
        // Process 11 is on GPU 0 as far as NVML said, but GPU 1 was not read: it may be there.
        assert_eq!(held.gpu_of(&[11]), None);
        held.keep(&[sample(0, false, &[(11, 5)]), sample(1, false, &[])]);
        assert_eq!(held.gpu_of(&[11]), Some(0));
        // A GPU whose processes were not listed (the simulated backend, a driver that does
        // not answer) is unknown too.
        let unread = Sample {
            index: 1,
            ..Sample::default()
        };
        held.keep(&[sample(0, false, &[(11, 5)]), unread]);
        assert_eq!(held.gpu_of(&[11]), None);
    }
}
#[cfg(test)]
mod onto_tests {
    use super::*;
    use scheduler_core::GpuMode;
    use scheduler_core::Time;
    use scheduler_core::node::admission::GpuInfo;

    fn daemon() -> std::sync::Arc<Daemon> {
        let cfg = crate::config::DaemonConfig::parse("", std::path::Path::new("mqfqd.toml"))
            .expect("default config");
        let gpu = |index: u32, name: &str| GpuInfo {
            index,
            uuid: format!("GPU-fa4e0000-0000-4000-8000-00000000000{index}"),
            name: name.into(),
            mode: GpuMode::Plain,
            memory_total: 1 << 34,
            mig: Vec::new(),
        };
        let mut mig = gpu(3, "A100");
        mig.mode = GpuMode::Mig;
        let gpus = vec![gpu(0, "A100"), gpu(1, "A100"), gpu(2, "H100"), mig];
        Daemon::new(crate::build_node(&cfg, gpus).unwrap(), "simulated", None).unwrap()
    }

    /// Pools `key` as its shim re-registers it: Warm (evicted) or Hot, by `warm`, last measured
    /// on GPU 0.
    fn pool(d: &Daemon, key: &ContainerKey, warm: Warm, evicted: bool) {
        let mut inner = d.lock();
        let p = super::super::Pooled {
            shim: 1,
            warm,
            on_gpu: Some(0),
        };
        inner.pooled.insert(key.clone(), p);
        inner.node.pool_mut().forget(key);
        inner
            .node
            .pool_mut()
            .adopt_idle(key, "f", 0, 1, 0, evicted, Time::ZERO);
    }

    #[test]
    fn a_checkpointed_container_granted_another_gpu_of_its_model_is_restored_onto_it() {
        let d = daemon();
        let key: ContainerKey = "ns/c".parse().unwrap();
        pool(&d, &key, Warm::Checkpoint, true);
        let pairs: Vec<(String, String)> = d
            .restore_onto(&key, 1, &[])
            .into_iter()
            .map(|p| (p.old_uuid, p.new_uuid))
            .collect();
        let uuid = |i: u32| format!("GPU-fa4e0000-0000-4000-8000-00000000000{i}");
        // Every whole GPU it may use named: 0 and 1 swapped, 2 onto itself (3 is in MIG mode).
        assert_eq!(
            pairs,
            [(uuid(0), uuid(1)), (uuid(1), uuid(0)), (uuid(2), uuid(2))]
        );
        // Given GPUs 0 and 1 only: those two.
        assert_eq!(d.restore_onto(&key, 1, &["0".into(), "1".into()]).len(), 2);
        assert_eq!(
            d.lock().pooled[&key].on_gpu,
            Some(0),
            "where it is is measured at its release, not assumed from the grant"
        );
        // Nothing to move: granted where it was, onto another model, Hot (its memory is on
        // GPU 0, where its processes run), or held by the interposer's managed memory.
        for (gpu, warm, evicted) in [
            (0, Warm::Checkpoint, true),
            (2, Warm::Checkpoint, true),
            (3, Warm::Checkpoint, true),
            (1, Warm::Checkpoint, false),
            (1, Warm::Uvm, true),
        ] {
            pool(&d, &key, warm, evicted);
            assert!(
                d.restore_onto(&key, gpu, &[]).is_empty(),
                "{gpu} {warm:?} {evicted}"
            );
        }
        // Not pooled (or never measured): nothing.
        assert!(
            d.restore_onto(&"ns/other".parse().unwrap(), 1, &[])
                .is_empty()
        );
    }

    /// Where a pooled container's processes are is what its last release that named them
    /// measured — unknown when NVML listed none of them — and a release that names none (a
    /// grant handed back unused) or a re-registration of its shim keeps it.
    #[tokio::test]
    async fn where_a_container_s_processes_are_is_what_its_last_release_measured() {
        let d = daemon();
        let key: ContainerKey = "ns/c".parse().unwrap();
        pool(&d, &key, Warm::Checkpoint, false);
        let read = |index, list: Vec<(u32, u64)>| Sample {
            index,
            held: Some(list),
            ..Sample::default()
        };
        let samples = [
            read(0, vec![]),
            read(1, vec![(41, 1 << 30)]),
            read(2, vec![]),
            read(3, vec![]),
        ];
        d.lock().held.keep(&samples);
        let release = |pids: Vec<u32>, reason: &str| {
            let req = api::ReleaseRequest {
                reason: reason.into(),
                pids,
                ..Default::default()
            };
            let mut inner = d.lock();
            Daemon::pooled_end(&mut inner, key.clone(), 1, reason, &req);
            inner.pooled[&key].on_gpu
        };
        assert_eq!(release(vec![41], "pause"), Some(1));
        assert_eq!(release(vec![], mqfq_proto::UNUSED), Some(1), "kept");
        assert_eq!(release(vec![77], "idle"), None, "not measured: unknown");
        assert_eq!(release(vec![41], "idle"), Some(1));
        assert_eq!(
            release(vec![], "pause"),
            None,
            "its processes not named: unknown"
        );
        assert_eq!(release(vec![41], "idle"), Some(1));
        // A shim's registration re-adopts its idle container: what was measured stays.
        let reg = api::RegisterRequest {
            shim_pid: 1,
            idle: vec![api::Running {
                namespace: "ns".into(),
                container_id: "c".into(),
                function: "f".into(),
                pooled: true,
                warm: "checkpoint".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let _ = super::super::register::register(&d, &reg);
        assert_eq!(d.lock().pooled[&key].on_gpu, Some(1));
    }
}
