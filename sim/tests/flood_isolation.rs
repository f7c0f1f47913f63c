//! A flood beside light functions (the design mix at load 0.6 with its first long function
//! offering 1.0 more on its own): the light functions keep their isolation under mqfq-sticky's
//! defaults, the overtake bound included.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use mqfq_sim::workload::{MixSpec, design_mix};
use mqfq_sim::{SimConfig, Trace, run_policy};

/// The light functions' P99 latency (every function but the one with the most calls), s.
fn light_p99(trace: &Trace, policy: &str) -> f64 {
    let out = run_policy(policy, trace, &SimConfig::default()).unwrap();
    let mut calls = vec![0usize; trace.functions.len()];
    for inv in &trace.invocations {
        calls[inv.func] += 1;
    }
    let flood = (0..calls.len()).max_by_key(|&f| calls[f]).unwrap();
    let mut light: Vec<f64> = out
        .records
        .iter()
        .zip(&trace.invocations)
        .filter(|(_, inv)| inv.func != flood)
        .map(|(r, inv)| (r.end_ms - inv.arrival_ms) / 1e3)
        .collect();
    light.sort_by(f64::total_cmp);
    let at = (light.len() * 99 / 100).min(light.len() - 1);
    light[at]
}

/// Serving calls overdue under the bound ahead of the fair order would turn a sustained flood
/// back into arrival order (every call overdue, the earliest first): the light functions' P99
/// was 0.97× FCFS's with the bound applied to the Throttled flooding flow too, against 0.14×
/// without the bound. The bound only reorders eligible flows, so the flood stays held to T.
#[test]
fn a_flood_stays_held_to_its_share() {
    let trace = design_mix(&MixSpec {
        load: 0.6,
        flood: Some(1.0),
        duration_s: 300.0,
        ..MixSpec::default()
    })
    .unwrap();
    let fcfs = light_p99(&trace, "fcfs");
    let ours = light_p99(&trace, "mqfq-sticky");
    assert!(
        ours <= 0.3 * fcfs,
        "light functions' P99 {ours} s against FCFS's {fcfs} s"
    );
}
