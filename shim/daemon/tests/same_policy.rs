//! One node: the simulator's `mqfq-sticky` and `mqfqd` run the same [`Node`] (admission core
//! and pool, joined inside it). The simulator runs a trace and keeps every input it gave its node
//! with the node's answer; the same inputs, at the same times, go into a node built the way
//! `mqfqd` builds it from its configuration; the answers (grants, pool orders, pool events) and
//! the dispatch records (enqueue, dispatch with GPU, lease, free slots, limit and D, charge,
//! release) must be the same, line for line.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use mqfq_daemon::config::DaemonConfig;
use mqfq_sim::node::{NodeMqfq, Step, gpu_infos};
use mqfq_sim::workload::{MixSpec, design_mix};
use mqfq_sim::{SimConfig, simulate};
use scheduler_core::node::admission::Record;
use scheduler_core::node::pool::Action;
use scheduler_core::node::{ContainerKey, Node, Output};

fn trace(gpus: usize) -> mqfq_sim::Trace {
    design_mix(&MixSpec {
        gpus,
        duration_s: 240.0,
        load: 0.9,
        seed: 7,
        ..MixSpec::default()
    })
    .unwrap()
}

/// Runs the simulator's `mqfq-sticky` over `trace`, keeping its steps and dispatch record.
fn simulated(trace: &mqfq_sim::Trace, cfg: &SimConfig) -> (Vec<Step>, Vec<Record>) {
    let q = cfg.profile.queue();
    let c = cfg.profile.concurrency(cfg.mode);
    let gpus = gpu_infos(cfg.gpus, |g| cfg.mem_mb(g), cfg.mode);
    let pool = mqfq_sim::node::pool_config(cfg);
    let mut p = NodeMqfq::new(trace, gpus, &q, &c, pool, true).unwrap();
    p.set_core_knobs(cfg).unwrap();
    let out = simulate(trace, &mut p, cfg).unwrap();
    assert_eq!(out.audit.unfinished, 0, "every invocation ran");
    (p.steps().to_vec(), p.records().to_vec())
}

/// Feeds the steps' inputs to `node`, as the daemon's handlers and sampling loop would, and
/// returns its answers and dispatch record.
fn replayed(mut node: Node, steps: &[Step]) -> (Vec<Output>, Vec<Record>) {
    let mut outputs = Vec::new();
    let mut log = Vec::new();
    for s in steps {
        outputs.push(node.step(&s.input, s.now).unwrap_or_default());
        log.extend(node.drain_log());
    }
    (outputs, log)
}

/// `mqfqd`'s node from `toml`, with the simulator's GPUs. The simulator's platform reclaims
/// containers past the warm TTL (`[pool] reclaim = true` here), models no host memory, and runs
/// each grant on the GPU it names (`[queue] late_binding = true`).
fn daemon_node(toml: &str, cfg: &SimConfig) -> Node {
    let toml = if toml.contains("[pool]\n") {
        toml.replace("[pool]\n", "[pool]\nreclaim = true\n")
    } else {
        format!("{toml}\n[pool]\nreclaim = true\n")
    };
    let toml = format!("{toml}\n[queue]\nlate_binding = true\n");
    let d = DaemonConfig::parse(&toml, std::path::Path::new("mqfqd.toml")).unwrap();
    mqfq_daemon::build_node(&d, gpu_infos(cfg.gpus, |g| cfg.mem_mb(g), cfg.mode)).unwrap()
}

fn dispatches(r: &[Record]) -> Vec<(ContainerKey, u32)> {
    r.iter()
        .filter_map(|r| match r {
            Record::Dispatch { key, gpu, .. } => Some((key.clone(), *gpu)),
            _ => None,
        })
        .collect()
}

/// The design mix with its functions split between two tenants, most of them in one (tenant
/// skew): the tenants' shares of slots come into play.
fn tenant_trace(gpus: usize) -> mqfq_sim::Trace {
    let mut t = trace(gpus);
    for (i, f) in t.functions.iter_mut().enumerate() {
        f.tenant = Some(if i < 2 { "small" } else { "big" }.into());
    }
    t
}

#[test]
fn the_simulator_and_mqfqd_decide_the_same_sequence() {
    for (gpus, tenants) in [(1, false), (2, false), (1, true), (2, true)] {
        let cfg = SimConfig {
            gpus,
            ..SimConfig::default()
        };
        let trace = if tenants {
            tenant_trace(gpus)
        } else {
            trace(gpus)
        };
        let (steps, sim) = simulated(&trace, &cfg);
        let sent = dispatches(&sim);
        assert_eq!(
            sent.len(),
            trace.invocations.len(),
            "one dispatch per invocation"
        );
        let queued = sim
            .iter()
            .any(|r| matches!(r, Record::Dispatch { waited_ns, .. } if *waited_ns > 0));
        assert!(queued, "the trace makes work queue, so order matters");
        if gpus == 2 {
            assert!(sent.iter().any(|(_, g)| *g == 1) && sent.iter().any(|(_, g)| *g == 0));
        }
        let (outputs, daemon) = replayed(daemon_node("", &cfg), &steps);
        for (i, (s, o)) in steps.iter().zip(&outputs).enumerate() {
            assert_eq!(
                &s.output, o,
                "{gpus} GPU(s): answers diverge at input {i}: {:?}",
                s.input
            );
        }
        assert_eq!(daemon.len(), sim.len(), "{gpus} GPU(s): record lengths");
        for (i, (a, b)) in sim.iter().zip(&daemon).enumerate() {
            assert_eq!(a, b, "{gpus} GPU(s): records diverge at line {i}");
        }
    }
}

#[test]
fn the_pool_s_orders_are_part_of_what_is_compared() {
    // The memory-heavy run makes the pool order: evictions under pressure, prefetches for
    // flows turning Active; the replay gives the same orders, and a daemon with other tier
    // knobs does not.
    let cfg = SimConfig {
        gpus: 1,
        ..SimConfig::default()
    };
    let mut trace = trace(1);
    for f in &mut trace.functions {
        f.mem_mb *= 4.0;
    }
    let (steps, _) = simulated(&trace, &cfg);
    let orders = |outs: &mut dyn Iterator<Item = &Output>| {
        outs.flat_map(|o| o.orders.iter().map(|o| (o.key.clone(), o.action)))
            .collect::<Vec<(ContainerKey, Action)>>()
    };
    let sim = orders(&mut steps.iter().map(|s| &s.output));
    assert!(
        sim.iter().any(|(_, a)| *a == Action::Evict),
        "the pool evicts: {} orders",
        sim.len()
    );
    let (same, _) = replayed(daemon_node("", &cfg), &steps);
    assert_eq!(sim, orders(&mut same.iter()));
    let (other, _) = replayed(daemon_node("[pool]\nheadroom = 0.5\n", &cfg), &steps);
    assert_ne!(sim, orders(&mut other.iter()));
}

#[test]
fn a_differently_configured_daemon_dispatches_differently() {
    // The comparison can fail: the same inputs into a daemon with another profile do not give
    // the simulator's sequence.
    let cfg = SimConfig::default();
    let trace = trace(1);
    let (steps, sim) = simulated(&trace, &cfg);
    let (_, other) = replayed(daemon_node("profile = \"light\"\n", &cfg), &steps);
    assert_ne!(dispatches(&sim), dispatches(&other));
}

#[test]
fn the_simulator_pools_memory_with_mqfqd_s_default_tier_knobs() {
    // The simulator's mqfq-sticky runs the same Pool type; its knobs are the daemon's defaults,
    // except that it reclaims (the executor's platform drops containers past the warm TTL) and
    // models no host memory.
    let d = DaemonConfig::parse("", std::path::Path::new("mqfqd.toml")).unwrap();
    let daemon = d.pool_config();
    let sim = mqfq_sim::node::pool_config(&SimConfig::default());
    assert_eq!(sim.tiers, daemon.tiers);
    assert!(sim.reclaim && !daemon.reclaim);
}

/// `policy = "fcfs"` is the A/B switch: the same daemon core, granting in arrival order. A flood
/// of six then one light admission on one slot: FCFS serves the light one last, mqfq-sticky
/// second.
#[test]
fn policy_fcfs_grants_in_arrival_order_and_mqfq_sticky_does_not() {
    use scheduler_core::Time;
    use scheduler_core::node::admission::{AdmitInfo, Kind};
    let req = |id: &str, function: &str| AdmitInfo {
        namespace: "ns".into(),
        container_id: id.into(),
        function: function.into(),
        tenant: None,
        tenant_weight: 0.0,
        weight: 0.0,
        gpus: vec![],
        kind: Kind::Burst,
        shim_pid: 7,
    };
    let order = |toml: &str| {
        let mut node = daemon_node(
            &format!("{toml}restart_grace_ms = 0\n[concurrency]\nd_max = 1\nd_initial = 1\n"),
            &SimConfig::default(),
        );
        let core = node.core_mut();
        let mut granted = core.admit(&req("f0", "flood"), Time::ZERO).unwrap();
        for i in 1..6 {
            core.admit(&req(&format!("f{i}"), "flood"), Time::from_secs_f64(0.1))
                .unwrap();
        }
        core.admit(&req("light", "light"), Time::from_secs_f64(0.2))
            .unwrap();
        let mut order = Vec::new();
        let mut t = 1.0;
        while let Some(g) = granted.pop() {
            order.push(g.key.to_string());
            granted = core
                .release(g.lease, Some(1.0), "exit", Time::from_secs_f64(t))
                .unwrap();
            t += 1.0;
        }
        assert_eq!(order.len(), 7, "{order:?}");
        order.iter().position(|k| k == "ns/light").unwrap()
    };
    assert_eq!(order("policy = \"fcfs\"\n"), 6);
    assert!(order("policy = \"mqfq-sticky\"\n") <= 2);
}
