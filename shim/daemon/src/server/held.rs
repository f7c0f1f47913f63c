//! What NVML measured each process holding on each GPU, kept from the last sample: a pooled
//! container's whole footprint (its CUDA context included, which its own reports leave out) at
//! a release that names its processes, the GPU they are on, and so the GPU pairs a checkpointed
//! container is restored with when the node grants it another GPU of the same model.

use std::collections::HashMap;

use mqfq_proto::api;
use mqfq_proto::warm::Warm;
use scheduler_core::node::{ContainerKey, Input, Output};
use scheduler_core::tiers::Tier;

use super::{Daemon, Inner};
use crate::monitor::Sample;

/// (GPU, host PID) → bytes.
pub(super) type Held = HashMap<(u32, u32), u64>;

/// What the processes a release names (host PIDs: a burst's socket peers from the kernel's
/// credentials, or a Pause's from runc) held on GPU `gpu` at the last sample, as NVML measured
/// them; `None` where it measured none of them.
pub(super) fn resident_of(held: &Held, gpu: u32, pids: &[u32]) -> Option<u64> {
    let mut pids: Vec<u32> = pids.to_vec();
    pids.sort_unstable();
    pids.dedup();
    pids.iter()
        .filter_map(|p| held.get(&(gpu, *p)))
        .copied()
        .reduce(u64::saturating_add)
}

/// The one GPU NVML lists the processes a release names on at the last sample; `None` where it
/// lists none of them, or them on several GPUs.
pub(super) fn gpu_of(held: &Held, pids: &[u32]) -> Option<u32> {
    let mut gpus = held
        .keys()
        .filter(|(_, pid)| pids.contains(pid))
        .map(|&(gpu, _)| gpu);
    let first = gpus.next()?;
    gpus.all(|g| g == first).then_some(first)
}

/// Each GPU's entries replaced by its sample's reading: a GPU NVML could not read (or a
/// monitor that read nothing) leaves none, so no figure outlives the sample it came from.
pub(super) fn keep(held: &mut Held, samples: &[Sample]) {
    for s in samples {
        held.retain(|(gpu, _), _| *gpu != s.index);
        if !s.failed {
            held.extend(s.held.iter().map(|&(pid, b)| ((s.index, pid), b)));
        }
    }
}

impl Daemon {
    /// A pooled container's lease on `gpu` ended (`req`): after a pause or a burst it lives on,
    /// idle, holding what its shim reported and what NVML measured its named processes holding
    /// (and where); after anything else it is gone. `None` for a container not pooled.
    pub(super) fn pooled_released(
        inner: &mut Inner,
        key: ContainerKey,
        gpu: u32,
        reason: &str,
        req: &api::ReleaseRequest,
        now: scheduler_core::Time,
    ) -> Option<Output> {
        if !inner.pooled.contains_key(&key) {
            return None;
        }
        let paused = mqfq_proto::stays_idle(reason);
        if !paused {
            inner.pooled.remove(&key);
        } else if let (Some(p), Some(g)) =
            (inner.pooled.get_mut(&key), gpu_of(&inner.held, &req.pids))
        {
            p.on_gpu = Some(g);
        }
        let released = Input::Released {
            key,
            paused,
            bytes: req.managed_bytes,
            native: req.native.as_ref().map(mqfq_proto::memory::from_proto),
            resident: resident_of(&inner.held, gpu, &req.pids),
        };
        inner.node.step(&released, now).ok()
    }

    /// The GPU pairs a grant on `gpu` restores container `key` with: pooled under `checkpoint`,
    /// its memory off the GPU (Warm), and its processes last measured on another GPU of the same
    /// model — the driver restores them onto the lease's GPU, so the work runs where the node
    /// counted it. Noted as on `gpu` from then on. Empty otherwise (restored where it was).
    pub(super) fn restore_onto(&self, key: &ContainerKey, gpu: u32) -> Vec<api::GpuPair> {
        let mut inner = self.lock();
        let Some(from) = moved_from(&inner, key, gpu) else {
            return Vec::new();
        };
        let gpus = inner.node.core().gpus();
        let info = |i: u32| gpus.iter().find(|g| g.info.index == i).map(|g| &g.info);
        let (Some(old), Some(new)) = (info(from), info(gpu)) else {
            return Vec::new();
        };
        // The driver restores only onto the same chip.
        if old.name != new.name {
            return Vec::new();
        }
        let pair = api::GpuPair {
            old_uuid: old.uuid.clone(),
            new_uuid: new.uuid.clone(),
            ..Default::default()
        };
        if let Some(p) = inner.pooled.get_mut(key) {
            p.on_gpu = Some(gpu);
        }
        tracing::info!(container = %key, from, to = gpu, "restored onto another GPU");
        vec![pair]
    }
}

/// The GPU a checkpointed, Warm container's processes are on when a lease names another.
fn moved_from(inner: &Inner, key: &ContainerKey, gpu: u32) -> Option<u32> {
    let p = inner.pooled.get(key)?;
    if p.warm != Warm::Checkpoint || inner.node.pool().tier(key) != Some(Tier::Warm) {
        return None;
    }
    p.on_gpu.filter(|&h| h != gpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_s_processes_are_found_on_their_gpu_only() {
        let held: Held = [((0, 10), 100), ((0, 11), 50), ((1, 12), 7), ((0, 99), 1000)]
            .into_iter()
            .collect();
        assert_eq!(resident_of(&held, 0, &[10, 11, 10, 12]), Some(150));
        assert_eq!(resident_of(&held, 1, &[10, 11, 10, 12]), Some(7));
        assert_eq!(resident_of(&held, 0, &[5]), None);
        assert_eq!(gpu_of(&held, &[10, 11]), Some(0));
        assert_eq!(gpu_of(&held, &[10, 12]), None, "on two GPUs");
        assert_eq!(gpu_of(&held, &[5]), None);
    }

    #[test]
    fn each_sample_replaces_its_gpu_s_entries() {
        let mut held: Held = [((0, 10), 100), ((1, 12), 7)].into_iter().collect();
        let sample = |index, failed, list: &[(u32, u64)]| Sample {
            index,
            failed,
            held: list.to_vec(),
            ..Sample::default()
        };
        keep(
            &mut held,
            &[sample(0, false, &[(11, 5)]), sample(1, true, &[(12, 9)])],
        );
        assert_eq!(held, [((0, 11), 5)].into_iter().collect());
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
        let gpus = vec![gpu(0, "A100"), gpu(1, "A100"), gpu(2, "H100")];
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
        let pairs = d.restore_onto(&key, 1);
        assert_eq!(pairs.len(), 1);
        assert_eq!(
            (pairs[0].old_uuid.as_str(), pairs[0].new_uuid.as_str()),
            (
                "GPU-fa4e0000-0000-4000-8000-000000000000",
                "GPU-fa4e0000-0000-4000-8000-000000000001"
            )
        );
        assert_eq!(
            d.lock().pooled[&key].on_gpu,
            Some(1),
            "noted where it is now"
        );
        // Nothing to move: granted where it was, onto another model, Hot (its memory is on
        // GPU 0, where its processes run), or held by the interposer's managed memory.
        for (gpu, warm, evicted) in [
            (0, Warm::Checkpoint, true),
            (2, Warm::Checkpoint, true),
            (1, Warm::Checkpoint, false),
            (1, Warm::Uvm, true),
        ] {
            pool(&d, &key, warm, evicted);
            assert!(
                d.restore_onto(&key, gpu).is_empty(),
                "{gpu} {warm:?} {evicted}"
            );
            assert_eq!(d.lock().pooled[&key].on_gpu, Some(0));
        }
        // Not pooled (or never measured): nothing.
        assert!(d.restore_onto(&"ns/other".parse().unwrap(), 1).is_empty());
    }
}
