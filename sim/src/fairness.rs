//! GPU-time share against the fair share, from a run's records alone.
//!
//! Jain over per-function mean slowdown says whose latency suffered, not whether the GPU was
//! shared fairly: a function that asks for little can have a high slowdown under a perfectly
//! fair scheduler. This module measures the share itself, among the functions that compete.
//! Between consecutive events (an arrival, a start, an end) every function has some invocations
//! waiting and some holding a slot. The *backlogged* functions (something of theirs waits) hold
//! some of the slots between them; their fair division is weighted max-min (water-filling): each
//! is entitled to its weight's share, never more than it asks for (waiting plus running), and
//! what one does not ask for goes to the others. Slots held by functions with nothing waiting
//! are left out: a slot is not preempted, so a function that took idle slots before the others
//! arrived keeps them until its runs end, whatever the policy.
//!
//! For the same reason a function that arrives while every slot runs a 9 s invocation waits
//! for one whatever the order: its entitlement counts from the first dispatch after its
//! backlog began (the policy's first chance to serve it, which it may give to someone else),
//! and only backlogs of at least [`MIN_BACKLOG_MS`] count. The figure sums, per function, the
//! slot-time it received and the slot-time it was entitled to over those backlogs; its ratio is
//! received / entitled, and Jain's index over the ratios is the figure (1 = fair).
//!
//! Slot-time is what MQFQ charges (the service a lease held), so this is the share the queue
//! tries to equalize. Tenants are not modelled here: functions are weighted by their own weight.

use crate::trace::Trace;
use crate::types::Record;

/// Backlogs shorter than this do not count (see the module docs), ms.
pub const MIN_BACKLOG_MS: f64 = 10_000.0;

/// The share figures of one run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Share {
    /// Jain's index over the backlogged functions' received / entitled ratios (1 = fair).
    pub jain: f64,
    /// The lowest ratio (the most short-changed backlogged function).
    pub min_ratio: f64,
    /// Per function, in trace order: `Some(ratio)` if it was ever backlogged long enough.
    pub ratios: Vec<Option<f64>>,
}

/// A function's backlog in progress.
#[derive(Clone, Copy, Debug)]
struct Backlog {
    since: f64,
    /// From the first dispatch (of anyone's) after the backlog began: the policy's first chance
    /// to serve it.
    counting: bool,
    received: f64,
    entitled: f64,
}

/// Weighted max-min shares of `capacity` among `demands` (each `(demand, weight)`), written to
/// `out` (same order).
fn water_fill(demands: &[(f64, f64)], capacity: f64, out: &mut Vec<f64>) {
    out.clear();
    out.resize(demands.len(), 0.0);
    let mut order: Vec<usize> = (0..demands.len()).filter(|&i| demands[i].0 > 0.0).collect();
    order.sort_by(|&a, &b| (demands[a].0 / demands[a].1).total_cmp(&(demands[b].0 / demands[b].1)));
    let mut left = capacity;
    let mut weight: f64 = order.iter().map(|&i| demands[i].1).sum();
    for &i in &order {
        let (d, w) = demands[i];
        let fair = if weight > 0.0 { left * w / weight } else { 0.0 };
        let got = d.min(fair);
        out[i] = got;
        left -= got;
        weight -= w;
    }
}

/// Measures the share from `records` (one per invocation of `trace`, in order); invocations
/// that never ended are left out.
#[must_use]
pub fn gpu_share(trace: &Trace, records: &[Record]) -> Share {
    let n = trace.functions.len();
    // (time, function, Δwaiting, Δrunning)
    let mut events: Vec<(f64, usize, i32, i32)> = Vec::with_capacity(records.len() * 3);
    for (inv, r) in trace.invocations.iter().zip(records) {
        if !(r.end_ms.is_finite() && r.start_ms.is_finite()) {
            continue;
        }
        events.push((inv.arrival_ms, inv.func, 1, 0));
        events.push((r.start_ms, inv.func, -1, 1));
        events.push((r.end_ms, inv.func, 0, -1));
    }
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let weights: Vec<f64> = trace.functions.iter().map(|f| f.weight.max(1e-9)).collect();
    let mut waiting = vec![0i32; n];
    let mut running = vec![0i32; n];
    let mut received = vec![0.0; n];
    let mut entitled = vec![0.0; n];
    let mut backlog: Vec<Option<Backlog>> = vec![None; n];
    let mut demands = vec![(0.0, 1.0); n];
    let mut fair = Vec::with_capacity(n);
    let mut i = 0;
    while i < events.len() {
        let t = events[i].0;
        let mut dispatched = false;
        while i < events.len() && events[i].0 <= t {
            let (_, f, dq, dr) = events[i];
            waiting[f] += dq;
            running[f] += dr;
            dispatched |= dr > 0;
            i += 1;
        }
        for f in 0..n {
            match (waiting[f] > 0, &mut backlog[f]) {
                (true, None) => {
                    backlog[f] = Some(Backlog {
                        since: t,
                        counting: false,
                        received: 0.0,
                        entitled: 0.0,
                    });
                }
                (true, Some(b)) => b.counting |= dispatched,
                (false, Some(b)) => {
                    if t - b.since >= MIN_BACKLOG_MS {
                        received[f] += b.received;
                        entitled[f] += b.entitled;
                    }
                    backlog[f] = None;
                }
                (false, None) => {}
            }
        }
        let Some(&(next, ..)) = events.get(i) else {
            break;
        };
        let dt = next - t;
        if dt <= 0.0 || backlog.iter().all(Option::is_none) {
            continue;
        }
        let mut capacity = 0.0;
        for f in 0..n {
            demands[f] = (0.0, weights[f]);
            if backlog[f].is_some() {
                let r = f64::from(running[f].max(0));
                demands[f].0 = r + f64::from(waiting[f].max(0));
                capacity += r;
            }
        }
        water_fill(&demands, capacity, &mut fair);
        for f in 0..n {
            if let Some(b) = &mut backlog[f]
                && b.counting
            {
                b.received += f64::from(running[f].max(0)) * dt;
                b.entitled += fair[f] * dt;
            }
        }
    }
    let ratios: Vec<Option<f64>> = (0..n)
        .map(|f| (entitled[f] > 0.0).then(|| received[f] / entitled[f]))
        .collect();
    let xs: Vec<f64> = ratios.iter().flatten().copied().collect();
    Share {
        jain: jain(&xs),
        min_ratio: xs.iter().copied().fold(f64::NAN, f64::min),
        ratios,
    }
}

/// Jain's fairness index of `xs`: (Σx)² / (n Σx²); 1 when all are equal.
#[must_use]
#[expect(clippy::cast_precision_loss, reason = "a sample count")]
pub fn jain(xs: &[f64]) -> f64 {
    let s: f64 = xs.iter().sum();
    let s2: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || s2 == 0.0 {
        return 1.0;
    }
    s * s / (xs.len() as f64 * s2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use scheduler_core::tiers::Tier;

    fn rec(start_ms: f64, end_ms: f64) -> Record {
        Record {
            start_ms,
            end_ms,
            tier: Tier::Hot,
            gpu: Some(0),
        }
    }

    #[test]
    fn water_fill_gives_what_is_not_asked_for_to_the_others() {
        let mut out = Vec::new();
        water_fill(&[(1.0, 1.0), (5.0, 1.0), (5.0, 2.0)], 4.0, &mut out);
        // 1 takes its 1; the 3 left split 1:2.
        assert!((out[0] - 1.0).abs() < 1e-12, "{out:?}");
        assert!((out[1] - 1.0).abs() < 1e-12, "{out:?}");
        assert!((out[2] - 2.0).abs() < 1e-12, "{out:?}");
        water_fill(&[(0.0, 1.0), (3.0, 1.0)], 2.0, &mut out);
        assert_eq!(out, [0.0, 2.0]);
    }

    /// One slot, two functions with 20 invocations each waiting from t = 0. Serving all of a's
    /// first gives a twice its share while b waits; alternating is fair but for the ends.
    #[test]
    #[expect(clippy::cast_precision_loss, reason = "record indices")]
    fn alternating_is_fair_and_serving_one_flow_first_is_not() {
        let s = MIN_BACKLOG_MS;
        let mut csv = String::from("time_ms,function,exec_ms,mem_mb\n");
        for f in ["a", "b"] {
            for _ in 0..20 {
                csv.push_str(&format!("0,{f},{s},1\n"));
            }
        }
        let t = Trace::parse(&csv).unwrap();
        let at = |k: usize| rec(k as f64 * s, (k + 1) as f64 * s);
        let unfair: Vec<Record> = (0..40).map(at).collect();
        let fair: Vec<Record> = (0..20)
            .map(|i| at(2 * i))
            .chain((0..20).map(|i| at(2 * i + 1)))
            .collect();
        let u = gpu_share(&t, &unfair);
        let f = gpu_share(&t, &fair);
        assert!((u.ratios[0].unwrap() - 2.0).abs() < 0.1, "{u:?}");
        assert!(u.jain < 0.9, "{u:?}");
        assert!(f.jain > 0.99, "{f:?}");
    }

    /// A wait shorter than [`MIN_BACKLOG_MS`] is not a backlog: nothing is measured.
    #[test]
    fn a_short_wait_is_not_counted() {
        let t = Trace::parse("time_ms,function,exec_ms,mem_mb\n0,a,100,1\n0,b,100,1\n").unwrap();
        let s = gpu_share(&t, &[rec(0.0, 100.0), rec(100.0, 200.0)]);
        assert_eq!(s.ratios, [None, None]);
        assert_eq!(s.jain, 1.0);
    }
}
