use super::super::*;

use super::super::testing::{GIB, secs};

/// One 24 GiB GPU with D fixed at `d`, memory admission on (budget 20.4 GiB), T = 0.5 s.
fn core(d: u32) -> Core {
    super::super::testing::memory_core(d, 0.0, 1024)
}

fn req(id: &str, function: &str, tenant: &str) -> AdmitInfo {
    AdmitInfo {
        namespace: "ns".into(),
        container_id: id.into(),
        function: function.into(),
        tenant: Some(tenant.into()),
        tenant_weight: 0.0,
        weight: 0.0,
        gpus: vec![],
        kind: Kind::Burst,
        shim_pid: 7,
    }
}

fn granted(g: &[Grant]) -> Vec<String> {
    g.iter().map(|g| g.key.id().to_owned()).collect()
}

/// Tenant `b` has run 0.3 s and waits again; tenant `a` holds one of two slots and waits with a
/// second function whose tag is lower. Returns the core and `b1`'s lease.
fn contested() -> (Core, u64) {
    let mut c = core(2);
    let g = c.admit(&req("b1", "bf", "b"), secs(0.0)).unwrap();
    let b1 = g[0].lease;
    assert_eq!(
        granted(&c.admit(&req("a1", "af", "a"), secs(0.0)).unwrap()),
        ["a1"]
    );
    assert!(
        c.admit(&req("a2", "ag", "a"), secs(0.0))
            .unwrap()
            .is_empty()
    );
    assert!(
        c.admit(&req("b2", "bf", "b"), secs(0.0))
            .unwrap()
            .is_empty()
    );
    (c, b1)
}

#[test]
fn a_tenant_at_its_share_yields_the_slot_to_another_tenants_waiting_work() {
    let (mut c, b1) = contested();
    // Virtual time alone would serve `ag` (tag 0) before `bf` (0.3, within T): tenant `a` would
    // hold both slots while `b` waits. At its share (one of two), `a` yields.
    let g = c.release(b1, Some(0.3), "idle", secs(0.3)).unwrap();
    assert_eq!(granted(&g), ["b2"]);
}

#[test]
fn a_tenant_takes_every_slot_while_no_other_tenant_waits() {
    let mut c = core(2);
    assert_eq!(
        granted(&c.admit(&req("a1", "af", "a"), secs(0.0)).unwrap()),
        ["a1"]
    );
    assert_eq!(
        granted(&c.admit(&req("a2", "ag", "a"), secs(0.0)).unwrap()),
        ["a2"]
    );
    // Another tenant holding a slot but not waiting does not cap `a` either.
    let mut c = core(3);
    c.admit(&req("b1", "bf", "b"), secs(0.0)).unwrap();
    c.admit(&req("a1", "af", "a"), secs(0.0)).unwrap();
    assert_eq!(
        granted(&c.admit(&req("a2", "ag", "a"), secs(0.0)).unwrap()),
        ["a2"]
    );
}

#[test]
fn a_slot_no_other_tenant_can_use_still_goes_to_the_tenant_at_its_share() {
    let (mut c, b1) = contested();
    // `bf` is measured at 30 GiB: it no longer fits beside `a1` (1 GiB) in 20.4 GiB, so the
    // slot `b1` frees goes to `ag` rather than stay idle.
    assert!(c.set_footprint("b/bf", 30 * GIB, secs(0.1)).is_empty());
    let g = c.release(b1, Some(0.3), "idle", secs(0.3)).unwrap();
    assert_eq!(granted(&g), ["a2"]);
}

#[test]
fn a_heavier_tenant_has_a_larger_share() {
    let mut c = core(3);
    let heavy = |id: &str, f: &str| AdmitInfo {
        tenant_weight: 5.0,
        ..req(id, f, "a")
    };
    let b1 = c.admit(&req("b1", "bf", "b"), secs(0.0)).unwrap()[0].lease;
    c.admit(&heavy("a1", "af"), secs(0.0)).unwrap();
    c.admit(&heavy("a2", "ag"), secs(0.0)).unwrap();
    assert!(c.admit(&heavy("a3", "ah"), secs(0.0)).unwrap().is_empty());
    assert!(
        c.admit(&req("b2", "bf", "b"), secs(0.0))
            .unwrap()
            .is_empty()
    );
    // Weights 5 : 1 over three slots: `a`'s share is all three (equal weights: two), so the
    // slot `b1` frees goes by tag, to `a3`.
    let g = c.release(b1, Some(0.05), "idle", secs(0.05)).unwrap();
    assert_eq!(granted(&g), ["a3"]);
}

#[derive(Clone, Debug)]
enum Op {
    Admit { id: u8, function: u8 },
    Release { id: u8, measured: u8 },
    Footprint { function: u8, gib: u8 },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        (0u8..16, 0u8..6).prop_map(|(id, function)| Op::Admit { id, function }),
        (0u8..16, 0u8..10).prop_map(|(id, measured)| Op::Release { id, measured }),
        (0u8..6, 1u8..16).prop_map(|(function, gib)| Op::Footprint { function, gib }),
    ]
}

proptest::proptest! {
    /// The share never leaves a slot idle: after every step, either every slot is taken or no
    /// waiting work fits beside the leases held.
    #[test]
    fn the_share_keeps_the_gpu_work_conserving(ops in proptest::collection::vec(op(), 1..80)) {
        let mut c = core(3);
        let mut t = 0.0;
        for o in ops {
            t += 0.05;
            let now = secs(t);
            // A function belongs to one tenant (its flow is `tenant/function`).
            let tenant_of = |f: u8| format!("t{}", f % 3);
            match o {
                Op::Admit { id, function } => {
                    let r = req(&format!("c{id}"), &format!("f{function}"), &tenant_of(function));
                    let _ = c.admit(&r, now);
                }
                Op::Release { id, measured } => {
                    let key: ContainerKey = format!("ns/c{id}").parse().unwrap();
                    if let Some(l) = c.lease_of(&key) {
                        c.release(l, Some(f64::from(measured) / 10.0), "idle", now).unwrap();
                    }
                }
                Op::Footprint { function, gib } => {
                    let flow = format!("{}/f{function}", tenant_of(function));
                    c.set_footprint(&flow, u64::from(gib) * GIB, now);
                }
            }
            let (any, _) = c.limits_of(0);
            let running = c.gpus[0].running;
            if running < any {
                let free = any - running;
                let idle = c.gpus[0].queue.fitting(free, c.fit_test(0));
                proptest::prop_assert!(idle.is_none(), "a slot is free and {idle:?} fits");
            }
        }
    }
}
