//! Where the executor's paths part: the memory model a run is on. The event loop, the
//! co-running model, PCIe and the records are the same for every policy; what differs is who
//! admits work and who moves memory, and that is one implementation of [`Model`] per model,
//! each in its own file:
//!
//! - [`NodePool`] (`node.rs`): `mqfqd`'s `Node` decides both; the executor runs its grants and
//!   carries out its pool's orders, reporting back as the shims and NVML would.
//! - [`Budget`] (`budget.rs`): the executor's own slot gate (dynamic D, or a fixed D with the
//!   published utilization gate) and memory under each GPU's budget (the baselines).
//! - [`Physical`] (`physical.rs`): no admission and no memory manager (`none`).
//!
//! The engine is generic over the model, so a run's model is chosen once (in `simulate`) and a
//! path of one model cannot run under another.

use scheduler_core::concurrency::Signals;
use scheduler_core::node::admission::GpuReading;

use super::{Engine, Policy};

pub(super) use super::budget::Budget;
pub(super) use super::node::NodePool;
pub(super) use super::physical::Physical;

/// One memory model's rules; every place the executor's paths part is one of these.
pub(super) trait Model: Sized {
    /// Whether GPU `g` has a slot a dispatch may take now.
    fn slots_free(e: &Engine<'_, Self>, g: usize) -> bool;

    /// The slots a dispatch fills GPU `g` up to.
    fn limit(e: &Engine<'_, Self>, g: usize) -> u32;

    /// The limit counted in the run's mean D.
    fn d_in_force(e: &Engine<'_, Self>, g: usize) -> u32 {
        Self::limit(e, g)
    }

    /// Before the first event.
    fn start(_e: &mut Engine<'_, Self>, _policy: &mut dyn Policy) {}

    /// Gives run `r` its container and startup, or leaves it waiting for memory (`force`: it is
    /// alone on its GPU, so waiting would never end).
    fn acquire(e: &mut Engine<'_, Self>, r: usize, force: bool, policy: &mut dyn Policy);

    /// Invocation `inv` began executing on GPU `g` (a burst begins).
    fn exec_began(e: &mut Engine<'_, Self>, g: usize, inv: usize) {
        e.gpus[g].conc.admitted(inv as u64, true);
    }

    /// Invocation `inv` ended on GPU `g` after executing `service_ms`; the policy hears it.
    fn exec_ended(
        e: &mut Engine<'_, Self>,
        g: usize,
        inv: usize,
        service_ms: f64,
        policy: &mut dyn Policy,
    ) {
        let f = &e.trace.functions[e.trace.invocations[inv].func];
        let tenant = f.tenant.as_deref().unwrap_or_default();
        e.gpus[g]
            .conc
            .released(inv as u64, &f.name, tenant, Some(service_ms / 1e3));
        policy.complete(inv, e.trace, service_ms, super::ms(e.now));
    }

    /// A run of function `f` gave back its slot on GPU `g`; its container `c` is idle.
    fn released(e: &mut Engine<'_, Self>, c: usize, g: usize, f: usize, policy: &mut dyn Policy);

    /// The policy's timers ran: act on its flow signals (and, under the node, on its orders).
    fn signals(e: &mut Engine<'_, Self>, policy: &mut dyn Policy) {
        let _ = policy.tick(super::ms(e.now));
    }

    /// Starts what may start now.
    fn dispatch(e: &mut Engine<'_, Self>, policy: &mut dyn Policy) {
        e.dispatch_own(policy);
    }

    /// The executor's own dispatch took a slot on GPU `g`.
    fn dispatched(_e: &mut Engine<'_, Self>, _g: usize) {}

    /// Whether a slot is idle that waiting work may take (the work-conservation audit).
    fn idle_slot(e: &Engine<'_, Self>, policy: &dyn Policy) -> bool {
        policy.queued() > 0 && (0..e.gpus.len()).any(|g| e.gpus[g].slots < Self::limit(e, g))
    }

    /// A sampling step read `readings`; it is the `nth` since the start.
    fn sampled(
        e: &mut Engine<'_, Self>,
        nth: u64,
        readings: &[GpuReading],
        policy: &mut dyn Policy,
    );

    /// The node sat idle through `n` samples from `from` to `resume`, each reading `idle`.
    fn idle_gap(
        _e: &mut Engine<'_, Self>,
        _span: (f64, f64),
        _n: u64,
        _idle: Signals,
        _policy: &mut dyn Policy,
    ) {
    }

    /// Function `f`'s idle containers changed: what policies see at dispatch follows.
    fn refresh(e: &mut Engine<'_, Self>, f: usize, policy: &mut dyn Policy) {
        e.refresh_view(f, policy);
    }
}
