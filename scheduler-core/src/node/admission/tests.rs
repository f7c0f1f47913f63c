use super::*;

fn k(s: &str) -> ContainerKey {
    s.parse().unwrap()
}
use crate::FlowState;
use proptest::prelude::*;

fn secs(s: f64) -> Time {
    Time::from_secs_f64(s)
}

fn gpu(index: u32) -> GpuInfo {
    GpuInfo {
        index,
        uuid: format!("GPU-{index}"),
        name: "sim".into(),
        mode: GpuMode::Plain,
        memory_total: 1 << 30,
        mig: vec![format!("MIG-{index}-a")],
    }
}

fn qcfg() -> QueueConfig {
    super::testing::qcfg(0.0)
}

fn core(n: u32, d: u32) -> Core {
    Core::new((0..n).map(gpu).collect(), &qcfg(), |_| ConcurrencyConfig {
        d_max: d,
        d_initial: f64::from(d),
        ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)
    })
    .unwrap()
}

fn req(id: &str, function: &str) -> AdmitInfo {
    super::testing::admit_info(id, function, Kind::Start)
}

fn keys(g: &[Grant]) -> Vec<String> {
    g.iter().map(|g| g.key.to_string()).collect()
}

#[test]
fn admits_up_to_the_limit_then_queues_and_release_dispatches_fairly() {
    let mut c = core(1, 1);
    let g = c.admit(&req("f0", "flood"), secs(0.0)).unwrap();
    assert_eq!(keys(&g), ["ns/f0"]);
    for i in 1..6 {
        assert!(
            c.admit(&req(&format!("f{i}"), "flood"), secs(0.0))
                .unwrap()
                .is_empty()
        );
    }
    assert!(c.admit(&req("l0", "light"), secs(0.1)).unwrap().is_empty());
    assert_eq!(c.waiting(), 6);
    // The light function is one flood invocation ahead of FCFS's sixth place.
    let mut lease = g[0].lease;
    let mut order = Vec::new();
    let mut t = 1.0;
    while let Ok(next) = c.release(lease, Some(1.0), "exit", secs(t)) {
        let Some(n) = next.first() else { break };
        order.push(n.key.clone());
        lease = n.lease;
        t += 1.0;
    }
    assert_eq!(order.len(), 6);
    let light = order.iter().position(|k| k == "ns/l0").unwrap();
    assert!(light <= 1, "{order:?}");
    assert_eq!(c.leases().count(), 0);
    assert_eq!(c.waiting(), 0);
}

#[test]
fn bad_requests_name_the_field_and_change_nothing() {
    let mut c = core(1, 2);
    let mut r = req("", "f");
    assert!(matches!(
        c.admit(&r, secs(0.0)).unwrap_err(),
        CoreError::Invalid {
            field: "container_id",
            ..
        }
    ));
    r = req("a", "");
    assert!(matches!(
        c.admit(&r, secs(0.0)).unwrap_err(),
        CoreError::Invalid {
            field: "function",
            ..
        }
    ));
    r = req("a", "f");
    r.weight = f64::NAN;
    assert!(matches!(
        c.admit(&r, secs(0.0)).unwrap_err(),
        CoreError::Invalid {
            field: "weight",
            ..
        }
    ));
    r.weight = -1.0;
    assert!(matches!(
        c.admit(&r, secs(0.0)).unwrap_err(),
        CoreError::Invalid {
            field: "weight",
            ..
        }
    ));
    r = req("a", "f");
    r.namespace = String::new();
    assert!(matches!(
        c.admit(&r, secs(0.0)).unwrap_err(),
        CoreError::Invalid {
            field: "namespace",
            ..
        }
    ));
    r = req("a", "f");
    r.gpus = vec!["7".into()];
    assert_eq!(
        c.admit(&r, secs(0.0)).unwrap_err(),
        CoreError::UnknownGpu("7".into())
    );
    assert_eq!(
        c.release(99, None, "exit", secs(0.0)).unwrap_err(),
        CoreError::UnknownLease(99)
    );
    assert!(c.drain_log().is_empty());
    assert_eq!(c.leases().count(), 0);
    assert_eq!(c.waiting(), 0);
}

#[test]
fn duplicate_admissions_are_refused_or_answered_with_the_same_lease() {
    let mut c = core(1, 1);
    let g = c.admit(&req("a", "f"), secs(0.0)).unwrap();
    let again = c.admit(&req("a", "f"), secs(0.0)).unwrap();
    assert_eq!(again[0].lease, g[0].lease);
    assert!(c.admit(&req("b", "f"), secs(0.0)).unwrap().is_empty());
    assert_eq!(
        c.admit(&req("b", "f"), secs(0.0)).unwrap_err(),
        CoreError::AlreadyWaiting(k("ns/b"))
    );
}

#[test]
fn devices_resolve_by_index_uuid_and_mig_and_route_to_the_least_loaded() {
    let c = core(2, 1);
    let n = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(c.resolve(&n(&[])).unwrap(), [0, 1]);
    assert_eq!(c.resolve(&n(&["all"])).unwrap(), [0, 1]);
    assert_eq!(c.resolve(&n(&["1"])).unwrap(), [1]);
    assert_eq!(c.resolve(&n(&["0:1"])).unwrap(), [0]);
    assert_eq!(c.resolve(&n(&["GPU-1", "MIG-0-a"])).unwrap(), [1, 0]);
    assert_eq!(
        c.resolve(&n(&["GPU-x"])).unwrap_err(),
        CoreError::UnknownGpu("GPU-x".into())
    );
    let mut c = c;
    let a = c.admit(&req("a", "f"), secs(0.0)).unwrap();
    let b = c.admit(&req("b", "f"), secs(0.0)).unwrap();
    assert_eq!((a[0].gpu, b[0].gpu), (0, 1));
}

#[test]
fn cancel_and_dead_shims_free_everything_they_held() {
    let mut c = core(1, 1);
    let a = c.admit(&req("a", "f"), secs(0.0)).unwrap();
    assert_eq!(a.len(), 1);
    c.admit(&req("b", "f"), secs(0.0)).unwrap();
    let mut other = req("c", "g");
    other.shim_pid = 8;
    c.admit(&other, secs(0.0)).unwrap();
    assert!(c.cancel(&k("ns/b"), "killed", secs(0.1)).is_some());
    assert!(c.cancel(&k("ns/b"), "killed", secs(0.1)).is_none());
    // Shim 7 (holding `a`) dies: its lease goes and `c` (shim 8) is dispatched.
    let (withdrawn, released, grants) = c.shim_gone(7, secs(0.2));
    assert!(withdrawn.is_empty());
    assert_eq!(released, [a[0].lease]);
    assert_eq!(keys(&grants), ["ns/c"]);
    let (_, released, _) = c.shim_gone(8, secs(0.3));
    assert_eq!(released.len(), 1);
    assert_eq!(c.leases().count(), 0);
    assert_eq!(c.gpus()[0].running, 0);
}

#[test]
fn registration_adopts_running_containers_and_keeps_known_leases() {
    let mut c = core(1, 1);
    let run = |id: &str, lease| RunningInfo {
        info: req(id, "f"),
        lease,
    };
    let adopted = c
        .register(7, &[run("a", 0), run("b", 41)], &[], 2, secs(0.0))
        .unwrap()
        .leases;
    assert_eq!(adopted.len(), 2);
    assert_eq!(c.gpus()[0].running, 2);
    assert_eq!(c.fail_open_starts(), 2);
    // Registering again is idempotent.
    let again = c
        .register(7, &[run("a", 0), run("b", 41)], &[], 0, secs(0.1))
        .unwrap()
        .leases;
    assert_eq!(again, adopted);
    assert_eq!(c.gpus()[0].running, 2);
    // Over the limit: new work waits until both adopted leases end.
    assert!(c.admit(&req("x", "g"), secs(0.2)).unwrap().is_empty());
    assert!(
        c.release(adopted[0].1, Some(1.0), "exit", secs(1.0))
            .unwrap()
            .is_empty()
    );
    let g = c
        .release(adopted[1].1, Some(1.0), "exit", secs(1.0))
        .unwrap();
    assert_eq!(keys(&g), ["ns/x"]);
}

#[test]
fn leases_a_shim_no_longer_lists_are_released_but_never_one_it_may_not_know_yet() {
    let mut c = core(1, 2);
    let running = |c: &Core| -> Vec<RunningInfo> {
        c.leases()
            .map(|(id, l)| RunningInfo {
                info: req(l.key.id(), "f"),
                lease: id,
            })
            .collect()
    };
    c.register(7, &[], &[], 0, secs(0.0)).unwrap();
    let a = c.admit(&req("a", "f"), secs(0.1)).unwrap()[0].lease;
    let b = c.admit(&req("b", "f"), secs(0.1)).unwrap()[0].lease;
    // A registration sent before the grants reached the shim lists neither: nothing released.
    let r = c.register(7, &[], &[], 0, secs(0.2)).unwrap();
    assert!(r.released.is_empty(), "{r:?}");
    // Next one: `a` is listed, `b`'s Admit is still in flight — kept too.
    let listed = running(&c)
        .into_iter()
        .filter(|r| r.lease == a)
        .collect::<Vec<_>>();
    let r = c.register(7, &listed, &[k("ns/b")], 0, secs(0.3)).unwrap();
    assert!(r.released.is_empty(), "{r:?}");
    // Then `b` is in neither list (its Release was lost): released, and its slot reused.
    c.admit(&req("w", "f"), secs(0.35)).unwrap();
    let r = c.register(7, &listed, &[], 0, secs(0.4)).unwrap();
    assert_eq!(r.released, [(k("ns/b"), b)]);
    assert_eq!(keys(&r.grants), ["ns/w"]);
    assert!(c.lease(a).is_some());
    // Another shim's leases are never touched.
    let mut other = req("o", "f");
    other.shim_pid = 8;
    c.release(a, None, "exit", secs(0.5)).unwrap();
    c.admit(&other, secs(0.5)).unwrap();
    c.register(7, &[], &[], 0, secs(0.6)).unwrap();
    let r = c.register(7, &[], &[], 0, secs(0.7)).unwrap();
    assert!(r.released.iter().all(|(k, _)| k != "ns/o"), "{r:?}");
    assert!(c.lease_of(&k("ns/o")).is_some());
}

#[test]
fn per_shim_caps_refuse_with_their_name() {
    let mut c = core(1, 1);
    c.set_limits(2, 3);
    c.admit(&req("a", "f"), secs(0.0)).unwrap();
    c.admit(&req("b", "f"), secs(0.0)).unwrap();
    c.admit(&req("c", "f"), secs(0.0)).unwrap();
    let e = c.admit(&req("d", "f"), secs(0.0)).unwrap_err();
    assert_eq!(
        e,
        CoreError::Limit {
            what: "waiting admissions",
            limit: 2
        }
    );
    let mut other = req("x", "f");
    other.shim_pid = 8;
    c.admit(&other, secs(0.0)).unwrap();
    let many: Vec<RunningInfo> = (0..4)
        .map(|i| RunningInfo {
            info: req(&format!("r{i}"), "f"),
            lease: 0,
        })
        .collect();
    let e = c.register(9, &many, &[], 0, secs(0.1)).unwrap_err();
    assert!(e.to_string().contains("registered containers"), "{e}");
}

#[test]
fn function_keys_are_scoped_by_tenant_and_idle_flows_are_forgotten() {
    let mut c = core(1, 4);
    let mut a = req("a", "resnet");
    a.tenant = Some("team-a".into());
    let mut b = req("b", "resnet");
    b.tenant = Some("team-b".into());
    b.tenant_weight = 3.0;
    let la = c.admit(&a, secs(0.0)).unwrap()[0].lease;
    let lb = c.admit(&b, secs(0.0)).unwrap()[0].lease;
    let mut flows: Vec<(String, Option<String>)> = c
        .flows()
        .into_iter()
        .map(|(_, f)| (f.key, f.tenant))
        .collect();
    flows.sort();
    assert_eq!(
        flows,
        [
            ("team-a/resnet".to_owned(), Some("team-a".to_owned())),
            ("team-b/resnet".to_owned(), Some("team-b".to_owned()))
        ]
    );
    assert_eq!(c.lease(la).unwrap().function, "team-a/resnet");
    c.release(la, Some(0.1), "exit", secs(1.0)).unwrap();
    c.release(lb, Some(0.1), "exit", secs(1.0)).unwrap();
    assert!(c.forget_idle(secs(5.0), 60.0).is_empty());
    let mut gone = c.forget_idle(secs(100.0), 60.0);
    gone.sort();
    assert_eq!(gone, ["team-a/resnet", "team-b/resnet"]);
    assert!(c.flows().is_empty());
    // A forgotten function comes back as a new flow.
    c.admit(&a, secs(101.0)).unwrap();
    assert_eq!(c.flows().len(), 1);
}

fn reading(index: u32, busy: f64, sm: Option<f64>, memory_used: u64) -> GpuReading {
    GpuReading {
        index,
        signals: Signals {
            busy: Some(busy),
            sm_activity: sm,
        },
        memory_used,
    }
}

#[test]
fn admissions_that_keep_their_speed_raise_the_limit_whatever_busy_time_says() {
    let mut c = Core::new(vec![gpu(0)], &qcfg(), |_| ConcurrencyConfig {
        alpha: 0.5,
        d_max: 4,
        d_initial: 1.0,
        ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.5)
    })
    .unwrap();
    let lease = |c: &Core, id: &str| c.lease_of(&k(&format!("ns/{id}"))).unwrap();
    // `a` runs alone: its baseline, 1 s.
    c.admit(&req("a", "f"), secs(0.0)).unwrap();
    assert!(c.admit(&req("b", "f"), secs(0.0)).unwrap().is_empty());
    let g = c
        .release(lease(&c, "a"), Some(1.0), "idle", secs(1.0))
        .unwrap();
    assert_eq!(keys(&g), ["ns/b"]);
    // Busy-time 100 % and nothing measured since: D holds.
    assert!(c.observe(&reading(0, 1.0, None, 5), secs(1.1)).is_empty());
    assert_eq!(c.gpus()[0].d, 1.0);
    // `b` ran at the limit in its baseline's time: pressure 1 / 2 (the slowdown target), D
    // grows to 1 × (1 + 0.5 × (1 − ½)), and on with SM activity at 30 %, up to 2 and more.
    c.admit(&req("c", "f"), secs(1.2)).unwrap();
    c.admit(&req("d", "f"), secs(1.2)).unwrap();
    let g = c
        .release(lease(&c, "b"), Some(1.0), "idle", secs(2.0))
        .unwrap();
    assert_eq!(keys(&g), ["ns/c"]);
    assert!(
        c.observe(&reading(0, 1.0, Some(0.3), 5), secs(2.1))
            .is_empty()
    );
    assert!((c.gpus()[0].d - 1.25).abs() < 1e-9);
    for t in 0..8 {
        let now = 2.2 + f64::from(t) * 0.1;
        let l = c.leases().next().map(|(l, _)| l).unwrap();
        c.release(l, Some(1.0), "idle", secs(now)).unwrap();
        let again = format!("r{t}");
        c.admit(&req(&again, "f"), secs(now)).unwrap();
        c.observe(&reading(0, 1.0, Some(0.3), 5), secs(now + 0.05));
    }
    assert!(c.gpus()[0].limit >= 2, "{:?}", c.gpus()[0]);
    let r = c.gpus()[0].reading;
    assert_eq!((r.busy, r.sm_activity), (Some(1.0), Some(0.3)));
    assert_eq!(c.gpus()[0].memory_used, 5);
}

#[derive(Clone, Debug)]
enum Op {
    Admit(u8, u8),
    Release(u8),
    Cancel(u8),
    Observe(u8),
    ShimGone,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..12, 0u8..3).prop_map(|(c, f)| Op::Admit(c, f)),
        (0u8..12).prop_map(Op::Release),
        (0u8..12).prop_map(Op::Cancel),
        (0u8..=10).prop_map(Op::Observe),
        Just(Op::ShimGone),
    ]
}

proptest! {
    /// Every dispatch respects the limit in force, and once everything is released or
    /// withdrawn no lease or slot is left.
    #[test]
    fn never_over_the_limit_and_nothing_leaks(ops in prop::collection::vec(op(), 1..80)) {
        let mut c = core(2, 3);
        c.set_late_binding(true);
        let mut t = 0.0;
        for o in ops {
            t += 0.05;
            let now = secs(t);
            match o {
                Op::Admit(id, f) => {
                    let mut r = req(&format!("c{id}"), &format!("f{f}"));
                    r.shim_pid = u32::from(id % 2);
                    let _ = c.admit(&r, now);
                }
                Op::Release(id) => {
                    let lease = c.leases().find(|(_, l)| l.key == k(&format!("ns/c{id}"))).map(|(l, _)| l);
                    if let Some(l) = lease {
                        c.release(l, Some(0.3), "exit", now).unwrap();
                    }
                }
                Op::Cancel(id) => {
                    c.cancel(&k(&format!("ns/c{id}")), "killed", now);
                }
                Op::Observe(u) => {
                    let sm = (u % 3 == 0).then(|| f64::from(u) / 10.0);
                    c.observe(&reading(u32::from(u % 2), f64::from(u) / 10.0, sm, 0), now);
                }
                Op::ShimGone => {
                    c.shim_gone(1, now);
                }
            }
            for r in c.drain_log() {
                if let Record::Dispatch { running, limit, .. } = r {
                    prop_assert!(running <= limit, "{running} > {limit}");
                    prop_assert!(limit <= 3);
                }
            }
        }
        c.shim_gone(0, secs(t + 1.0));
        c.shim_gone(1, secs(t + 1.0));
        prop_assert_eq!(c.leases().count(), 0);
        prop_assert_eq!(c.waiting(), 0);
        for g in c.gpus() {
            prop_assert_eq!(g.running, 0);
            prop_assert_eq!(g.queued, 0);
        }
    }
}

#[test]
fn nothing_is_dispatched_during_the_restart_hold() {
    let mut c = core(1, 1);
    c.hold_until(secs(1.5));
    assert!(c.admit(&req("w", "f"), secs(0.1)).unwrap().is_empty());
    // A running container re-registers during the hold and takes the only slot.
    let adopted = c
        .register(
            9,
            &[RunningInfo {
                info: req("r", "f"),
                lease: 0,
            }],
            &[],
            0,
            secs(0.5),
        )
        .unwrap()
        .leases;
    assert!(c.tick_all(secs(1.6)).is_empty());
    let g = c
        .release(adopted[0].1, Some(1.0), "exit", secs(2.0))
        .unwrap();
    assert_eq!(keys(&g), ["ns/w"]);
}

#[test]
fn unknown_mig_uuids_go_to_the_gpus_in_mig_mode() {
    let mut g1 = gpu(1);
    g1.mode = GpuMode::Mig;
    let c = Core::new(vec![gpu(0), g1], &qcfg(), |_| ConcurrencyConfig {
        d_max: 1,
        d_initial: 1.0,
        ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)
    })
    .unwrap();
    assert_eq!(c.resolve(&["MIG-unlisted".to_owned()]).unwrap(), [1]);
    assert_eq!(
        c.resolve(&["GPU-unlisted".to_owned()]).unwrap_err(),
        CoreError::UnknownGpu("GPU-unlisted".into())
    );
    let plain = core(1, 1);
    assert_eq!(
        plain.resolve(&["MIG-x".to_owned()]).unwrap_err(),
        CoreError::UnknownGpu("MIG-x".into())
    );
}

#[test]
fn a_flow_turning_active_is_reported_once_per_activation() {
    let mut c = core(1, 2);
    let g = c.admit(&req("a", "f"), secs(0.0)).unwrap();
    assert_eq!(c.drain_activated(), [(0, "f".to_owned())]);
    // Still active (sticky TTL 1 s): a second admission activates nothing.
    c.release(g[0].lease, Some(0.1), "pause", secs(0.1))
        .unwrap();
    let g = c.admit(&req("b", "f"), secs(0.5)).unwrap();
    assert!(c.drain_activated().is_empty());
    c.release(g[0].lease, Some(0.1), "exit", secs(0.6)).unwrap();
    // Past the TTL the flow is inactive; the next admission activates it again.
    c.tick_all(secs(5.0));
    c.admit(&req("c", "f"), secs(5.0)).unwrap();
    assert_eq!(c.drain_activated(), [(0, "f".to_owned())]);
}

#[test]
fn a_burst_that_keeps_its_slot_is_charged_while_it_runs() {
    let mut c = core(1, 1);
    let mut hog = req("hog", "hog");
    hog.kind = Kind::Burst;
    let g = c.admit(&hog, secs(0.0)).unwrap();
    // A second container of the same flow and one of another flow wait.
    let mut hog2 = req("hog2", "hog");
    hog2.kind = Kind::Burst;
    assert!(c.admit(&hog2, secs(0.1)).unwrap().is_empty());
    let mut light = req("light", "light");
    light.kind = Kind::Burst;
    assert!(c.admit(&light, secs(0.1)).unwrap().is_empty());
    // Start and resume leases are never charged early; bursts are, a step per second.
    for t in [0.5, 1.9, 2.0, 2.2, 3.1, 4.5] {
        c.charge_running(secs(t));
    }
    let charges: Vec<f64> = c
        .drain_log()
        .into_iter()
        .filter_map(|r| match r {
            Record::Charge {
                served_s, lease, ..
            } if lease == g[0].lease => Some(served_s),
            _ => None,
        })
        .collect();
    assert_eq!(charges, vec![2.0, 3.1, 4.5]);
    // Its release corrects to the measured service; the light flow goes first.
    let next = c.release(g[0].lease, Some(4.0), "idle", secs(5.0)).unwrap();
    assert_eq!(keys(&next), ["ns/light"]);
}

#[test]
fn residency_reaches_every_queue_and_flow_state_and_sampling_answer_across_gpus() {
    let mut c = core(2, 2);
    assert!(
        c.flow_state("f").is_none(),
        "unknown before its first admission"
    );
    c.admit(&req("a", "f"), secs(0.0)).unwrap();
    c.admit(&req("b", "f"), secs(0.0)).unwrap();
    assert_eq!(c.flow_state("f"), Some(FlowState::Active));
    let resident = |c: &Core| -> Vec<bool> {
        c.flows()
            .into_iter()
            .filter(|(_, f)| f.key == "f")
            .map(|(_, f)| f.resident)
            .collect()
    };
    assert_eq!(resident(&c), [false, false], "routed to both GPUs");
    c.set_residency("f", true, 0.0, secs(0.0)).unwrap();
    c.set_residency("never-seen", false, 1.0, secs(0.0))
        .unwrap();
    assert_eq!(resident(&c), [true, true], "every queue that has f");
    let e = c
        .set_residency("f", false, f64::NAN, secs(0.0))
        .unwrap_err();
    assert!(
        matches!(
            e,
            CoreError::Invalid {
                field: "switch_cost",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(resident(&c), [true, true], "a refused cost changes nothing");
    assert!(
        c.limits(0).is_some_and(|l| l.slots >= 1) && c.limits(7).is_none(),
        "a GPU the node lacks has no limit"
    );
    // A sampling step expires TTLs and feeds D on the GPUs it names.
    assert!(
        c.sample(
            &[reading(0, 0.0, None, 0), reading(1, 0.0, None, 0)],
            secs(0.1)
        )
        .is_empty()
    );
    assert_eq!(c.gpus()[1].reading.busy, Some(0.0));
}

#[test]
fn a_report_is_bounded_by_the_time_held_and_only_a_run_s_end_teaches_the_controller() {
    let mut c = core(1, 4);
    let g = c.admit(&req("a", "f"), secs(0.0)).unwrap();
    c.drain_log();
    // Held one second, "served" a hundred.
    c.release(g[0].lease, Some(100.0), "idle", secs(1.0))
        .unwrap();
    let measured = c.drain_log().into_iter().find_map(|r| match r {
        Record::Release { measured_s, .. } => Some(measured_s),
        _ => None,
    });
    assert_eq!(measured, Some(Some(1.0)));
    assert_eq!(c.gpus[0].conc.baseline("f"), Some((1, 1.0)));
    // A kill says nothing of how long a run takes.
    let g = c.admit(&req("b", "g"), secs(2.0)).unwrap();
    c.release(g[0].lease, Some(0.5), "kill", secs(3.0)).unwrap();
    assert_eq!(c.gpus[0].conc.baseline("g"), None);
}

/// The short-slot reserve is a slot above ⌊D⌋ for short flows only: long work still gets every
/// slot under ⌊D⌋ while a short flow is Active with nothing waiting (work conservation; before,
/// the last slot under D stayed empty for it), and a short admission still finds a slot while
/// ⌊D⌋ long ones run.
#[test]
fn the_short_slot_reserve_sits_above_d_and_never_idles_a_slot_under_it() {
    let cfg = QueueConfig {
        short_charge_s: 0.5,
        ..qcfg()
    };
    let mut c = Core::new(vec![gpu(0)], &cfg, |_| ConcurrencyConfig {
        d_max: 4,
        d_initial: 2.0,
        ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)
    })
    .unwrap();
    let s0 = c.admit(&req("s0", "short"), secs(0.0)).unwrap();
    c.release(s0[0].lease, Some(0.01), "exit", secs(0.05))
        .unwrap();
    // "short" is Active (its TTL runs) and waits for nothing; two long heads take both slots.
    assert_eq!(
        keys(&c.admit(&req("l0", "long"), secs(0.1)).unwrap()),
        ["ns/l0"]
    );
    assert_eq!(
        keys(&c.admit(&req("l1", "long"), secs(0.1)).unwrap()),
        ["ns/l1"]
    );
    assert!(c.admit(&req("l2", "long"), secs(0.1)).unwrap().is_empty());
    let l = c.limits(0).unwrap();
    assert_eq!((l.any, l.slots, l.queued), (2, 3, 1));
    // The reserve's slot goes to the short flow, not to the long one waiting.
    assert_eq!(
        keys(&c.admit(&req("s1", "short"), secs(0.2)).unwrap()),
        ["ns/s1"]
    );
    assert!(c.admit(&req("s2", "short"), secs(0.2)).unwrap().is_empty());
    assert_eq!(c.waiting(), 2);
}

/// At D_max the reserve stays under it: long work gets D_max − 1 slots while a short flow is
/// Active, and a GPU limited to one slot has no reserve at all.
#[test]
fn the_reserve_lives_under_d_max() {
    let cfg = QueueConfig {
        short_charge_s: 0.5,
        ..qcfg()
    };
    for d_max in [1, 2] {
        let mut c = Core::new(vec![gpu(0)], &cfg, |_| ConcurrencyConfig {
            d_max,
            d_initial: f64::from(d_max),
            ..ConcurrencyConfig::for_mode(GpuMode::Plain, 0.2)
        })
        .unwrap();
        let s0 = c.admit(&req("s0", "short"), secs(0.0)).unwrap();
        c.release(s0[0].lease, Some(0.01), "exit", secs(0.05))
            .unwrap();
        assert_eq!(
            keys(&c.admit(&req("l0", "long"), secs(0.1)).unwrap()),
            ["ns/l0"]
        );
        assert!(c.admit(&req("l1", "long"), secs(0.1)).unwrap().is_empty());
        let l = c.limits(0).unwrap();
        assert_eq!((l.any, l.slots), (1, d_max), "d_max {d_max}");
        let s1 = c.admit(&req("s1", "short"), secs(0.2)).unwrap();
        assert_eq!(
            s1.len(),
            usize::try_from(d_max - 1).unwrap(),
            "d_max {d_max}"
        );
    }
}
