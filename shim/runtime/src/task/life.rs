//! A container's GPU life as one value: whether it is GPU work, what admits that work (its Start
//! and Resume, or each burst its interposer sees), and, where the interposer is injected, where
//! the pool has put its memory. The verbs ask it ([`GpuLife::gated`], [`GpuLife::pooled`],
//! [`GpuLife::evicted`]) instead of re-deriving the mode from loose flags, and change it only
//! through the transitions named here.
//!
//! ```text
//!             Create
//!   ┌───────────┼─────────────┬──────────────────┐
//! NotGpu     Gated(work)   Pooled{work, memory}   Bursts{work, memory, book, task}
//!                              memory: Resident ⇄ Evicted      (moved / take_evicted)
//!                                        └──────┴─→ Dropped{evicted}   (drop_from_pool)
//! ```
//! `Dropped` is final for the pool (no order moves it again; `io.mqfq.warm=off` starts there),
//! but a container dropped while evicted is still restored before it runs again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use tokio::task::AbortHandle;

use super::burst::Book;
use crate::gpu::{Classification, GpuWork};
use crate::memory::Usage;
use mqfq_proto::warm::Warm;

/// A burst-mode container's book and the task serving its burst socket.
pub type Bursts = (Arc<Book>, AbortHandle);

/// A container's GPU life (see the module's docs).
#[derive(Debug)]
pub struct GpuLife(Life);

#[derive(Debug)]
enum Life {
    /// Not GPU work: it runs as under runc; nothing waits, nothing moves.
    NotGpu,
    /// GPU work without the interposer: its Start and Resume wait for a lease; its memory
    /// stays where it is.
    Gated(GpuWork),
    /// GPU work with the interposer: gated as above, its memory the pool's.
    Pooled { work: GpuWork, memory: Memory },
    /// GPU work whose interposer asks for a lease at each burst (its Start and Resume are not
    /// gated); its memory the pool's.
    Bursts {
        work: GpuWork,
        memory: Memory,
        book: Arc<Book>,
        task: AbortHandle,
    },
}

/// Where the pool has a container's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tier {
    /// On the GPU.
    Resident,
    /// Moved to the host (wholly or partly): restored before the container runs again.
    Evicted,
    /// Out of the pool for good (its Warm tier is `off`, or a move failed or stalled); if it
    /// was dropped while evicted, still restored before it runs.
    Dropped { evicted: bool },
}

/// The interposer's side of a pooled container.
#[derive(Debug)]
struct Memory {
    /// The interposer's control directory on the host.
    dir: PathBuf,
    tier: Tier,
    /// What its CUDA processes held at the last Pause or burst end (managed bytes size the
    /// memory-move deadlines).
    held: Usage,
    /// When a burst's end last asked its processes for `held`.
    asked: Option<Instant>,
    /// A driver call of the checkpoint backend is in progress for it (one at a time).
    in_flight: Arc<AtomicBool>,
}

impl GpuLife {
    /// The life Create settles: its classification and, when the interposer was injected, its
    /// control directory with the burst book and socket task when its interposer asks per
    /// burst (which it can only do through that directory).
    #[must_use]
    pub fn new(gpu: Classification, ctl: Option<(PathBuf, Option<Bursts>)>) -> Self {
        let (work, ctl) = match gpu {
            // The interposer goes only into GPU containers.
            Classification::NotGpu => {
                debug_assert!(ctl.is_none(), "a control directory for a non-GPU container");
                return GpuLife(Life::NotGpu);
            }
            Classification::Gpu(w) => (w, ctl),
        };
        let Some((dir, bursts)) = ctl else {
            return GpuLife(Life::Gated(work));
        };
        let memory = Memory {
            dir,
            // `io.mqfq.warm=off`: the pool never moves it, as if dropped from the start.
            tier: if work.warm == Warm::Off {
                Tier::Dropped { evicted: false }
            } else {
                Tier::Resident
            },
            held: Usage::default(),
            asked: None,
            in_flight: Arc::default(),
        };
        GpuLife(match bursts {
            Some((book, task)) => Life::Bursts {
                work,
                memory,
                book,
                task,
            },
            None => Life::Pooled { work, memory },
        })
    }

    fn memory(&self) -> Option<&Memory> {
        match &self.0 {
            Life::Pooled { memory, .. } | Life::Bursts { memory, .. } => Some(memory),
            Life::NotGpu | Life::Gated(_) => None,
        }
    }

    fn memory_mut(&mut self) -> Option<&mut Memory> {
        match &mut self.0 {
            Life::Pooled { memory, .. } | Life::Bursts { memory, .. } => Some(memory),
            Life::NotGpu | Life::Gated(_) => None,
        }
    }

    /// Its GPU work, if it is GPU work.
    #[must_use]
    pub fn work(&self) -> Option<&GpuWork> {
        match &self.0 {
            Life::NotGpu => None,
            Life::Gated(work) | Life::Pooled { work, .. } | Life::Bursts { work, .. } => Some(work),
        }
    }

    /// Whether it is GPU work (its lease ends when its init ends).
    #[must_use]
    pub fn is_gpu(&self) -> bool {
        self.work().is_some()
    }

    /// The classification Create made.
    #[must_use]
    pub fn classification(&self) -> Classification {
        self.work()
            .map_or(Classification::NotGpu, |w| Classification::Gpu(w.clone()))
    }

    /// How its memory goes Warm (meaningful where the interposer is injected).
    #[must_use]
    pub fn warm(&self) -> Warm {
        self.work().map_or(Warm::Off, |w| w.warm)
    }

    /// Its burst book, when its interposer asks for a lease at each burst.
    #[must_use]
    pub fn book(&self) -> Option<&Arc<Book>> {
        match &self.0 {
            Life::Bursts { book, .. } => Some(book),
            _ => None,
        }
    }

    /// What its init's Start waits for: its work and whether its memory is pooled; `None` when
    /// its Start is not gated (not GPU work, or its bursts are admitted instead).
    #[must_use]
    pub fn gated(&self) -> Option<(GpuWork, bool)> {
        match &self.0 {
            Life::Gated(work) => Some((work.clone(), false)),
            Life::Pooled { work, .. } => Some((work.clone(), self.pooled())),
            Life::NotGpu | Life::Bursts { .. } => None,
        }
    }

    /// The interposer's control directory, when injected.
    #[must_use]
    pub fn ctl_dir(&self) -> Option<&Path> {
        self.memory().map(|m| m.dir.as_path())
    }

    /// Whether the pool moves its memory (the interposer injected, not dropped).
    #[must_use]
    pub fn pooled(&self) -> bool {
        self.memory()
            .is_some_and(|m| !matches!(m.tier, Tier::Dropped { .. }))
    }

    /// Whether it was dropped from the pool (no order moves its memory again).
    #[must_use]
    pub fn dropped(&self) -> bool {
        self.memory()
            .is_some_and(|m| matches!(m.tier, Tier::Dropped { .. }))
    }

    /// Whether its memory (or part of it) is on the host: it is restored before it runs.
    #[must_use]
    pub fn evicted(&self) -> bool {
        self.memory()
            .is_some_and(|m| matches!(m.tier, Tier::Evicted | Tier::Dropped { evicted: true }))
    }

    /// A restore begins: whether there was anything to restore. It counts as restored from
    /// here (a second caller does not restore it again); [`GpuLife::moved`]`(true)` if the
    /// restore did not finish.
    pub fn take_evicted(&mut self) -> bool {
        let Some(m) = self.memory_mut() else {
            return false;
        };
        match m.tier {
            Tier::Evicted => m.tier = Tier::Resident,
            Tier::Dropped { evicted: true } => m.tier = Tier::Dropped { evicted: false },
            Tier::Resident | Tier::Dropped { evicted: false } => return false,
        }
        true
    }

    /// A move ended with its memory on the host (`evicted`, wholly or partly) or on the GPU.
    pub fn moved(&mut self, evicted: bool) {
        if let Some(m) = self.memory_mut() {
            m.tier = match m.tier {
                Tier::Dropped { .. } => Tier::Dropped { evicted },
                Tier::Resident | Tier::Evicted if evicted => Tier::Evicted,
                Tier::Resident | Tier::Evicted => Tier::Resident,
            };
        }
    }

    /// Takes it out of the pool for good; whether it was in it.
    pub fn drop_from_pool(&mut self) -> bool {
        let Some(m) = self.memory_mut() else {
            return false;
        };
        let evicted = match m.tier {
            Tier::Dropped { .. } => return false,
            Tier::Resident => false,
            Tier::Evicted => true,
        };
        m.tier = Tier::Dropped { evicted };
        true
    }

    /// What its CUDA processes were last known to hold (nothing known: zero).
    #[must_use]
    pub fn held(&self) -> Usage {
        self.memory().map(|m| m.held).unwrap_or_default()
    }

    /// What its CUDA processes hold, as they just said (`asked`: at a burst's end, which asks
    /// at most so often).
    pub fn set_held(&mut self, held: Usage, asked: bool) {
        if let Some(m) = self.memory_mut() {
            m.held = held;
            if asked {
                m.asked = Some(Instant::now());
            }
        }
    }

    /// The control directory to ask at a burst's end: pooled, and not asked within `every`.
    #[must_use]
    pub fn to_ask(&self, every: Duration) -> Option<&Path> {
        self.memory()
            .filter(|m| !matches!(m.tier, Tier::Dropped { .. }))
            .filter(|m| m.asked.is_none_or(|t| t.elapsed() >= every))
            .map(|m| m.dir.as_path())
    }

    /// The flag of its one driver call in progress (checkpoint backend).
    #[must_use]
    pub fn in_flight(&self) -> Option<Arc<AtomicBool>> {
        self.memory().map(|m| m.in_flight.clone())
    }

    /// Delete: its burst socket is no longer served and the control directory goes.
    pub fn end(&self) {
        if let Life::Bursts { task, .. } = &self.0 {
            task.abort();
        }
        if let Some(d) = self.ctl_dir() {
            crate::uvm::cleanup(d);
        }
    }

    /// Tests: the interposer as if injected at `dir` into a gated container.
    #[cfg(test)]
    pub(super) fn inject(&mut self, dir: PathBuf) {
        if let Life::Gated(work) = &self.0 {
            *self = GpuLife::new(Classification::Gpu(work.clone()), Some((dir, None)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(warm: Warm) -> Classification {
        Classification::Gpu(GpuWork {
            function: "f".into(),
            weight: 0.0,
            tenant: None,
            pod_namespace: String::new(),
            gpus: crate::gpu::GpuSelection::All,
            grant: None,
            placeable: false,
            partners: Vec::new(),
            warm,
        })
    }

    #[test]
    fn the_mode_is_settled_at_create() {
        let not = GpuLife::new(Classification::NotGpu, None);
        assert!(!not.is_gpu() && not.gated().is_none() && !not.pooled());
        let gated = GpuLife::new(work(Warm::Uvm), None);
        assert_eq!(gated.gated().map(|(_, p)| p), Some(false));
        assert!(gated.ctl_dir().is_none() && !gated.dropped());
        let pooled = GpuLife::new(work(Warm::Uvm), Some(("/x".into(), None)));
        assert_eq!(pooled.gated().map(|(_, p)| p), Some(true));
        let off = GpuLife::new(work(Warm::Off), Some(("/x".into(), None)));
        assert_eq!(
            off.gated().map(|(_, p)| p),
            Some(false),
            "off: never pooled"
        );
        assert!(off.dropped());
    }

    #[test]
    fn memory_moves_between_tiers_and_a_dropped_evicted_one_is_still_restored() {
        let mut l = GpuLife::new(work(Warm::Checkpoint), Some(("/x".into(), None)));
        assert!(!l.take_evicted(), "resident: nothing to restore");
        l.moved(true);
        assert!(l.evicted() && l.pooled());
        assert!(l.take_evicted());
        assert!(!l.evicted() && !l.take_evicted(), "one restorer");
        l.moved(true);
        assert!(l.drop_from_pool());
        assert!(!l.drop_from_pool(), "once");
        assert!(l.dropped() && l.evicted(), "dropped, still on the host");
        assert!(l.to_ask(Duration::ZERO).is_none(), "not asked once dropped");
        assert!(l.take_evicted());
        assert!(l.dropped() && !l.evicted());
        l.moved(false);
        assert!(l.dropped(), "dropped is for good");
    }

    #[test]
    fn held_is_known_only_where_the_interposer_is() {
        let mut gated = GpuLife::new(work(Warm::Uvm), None);
        let u = Usage {
            managed: 7,
            ..Usage::default()
        };
        gated.set_held(u, true);
        assert_eq!(gated.held(), Usage::default());
        let mut l = GpuLife::new(work(Warm::Uvm), Some(("/x".into(), None)));
        assert!(l.to_ask(Duration::from_secs(60)).is_some());
        l.set_held(u, true);
        assert_eq!(l.held(), u);
        assert!(
            l.to_ask(Duration::from_secs(60)).is_none(),
            "asked just now"
        );
    }
}
