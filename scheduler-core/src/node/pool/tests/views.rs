//! What the pool tells the core and placement: residency per GPU, footprints, where a function is
//! Hot and what starting it on each GPU would cost.

use super::*;

/// `function`'s residency as the pool reports it with one GPU listed.
fn on(function: &str, gpu: u32, resident: bool, cost: f64) -> (String, ByGpu) {
    (
        function.to_owned(),
        BTreeMap::from([(gpu, (resident, cost))]),
    )
}

#[test]
fn residency_is_per_gpu() {
    let mut p = pool(30.0, false);
    p.observe_memory(0, 0, 80 * GIB);
    p.observe_memory(1, 0, 80 * GIB);
    paused(&mut p, "ns/a", "f", GIB, 0.0);
    p.granted(&k("ns/b"), "f", 1, 7, t(0.0));
    assert_eq!(
        p.residency(),
        [(
            "f".to_owned(),
            BTreeMap::from([(0, (true, 0.0)), (1, (false, 0.0))])
        )],
        "Hot and idle on GPU 0; busy on GPU 1"
    );
}

#[test]
fn residency_says_which_functions_have_an_idle_hot_container_and_what_a_warm_one_costs() {
    let mut p = pool(30.0, false);
    p.observe_memory(0, 0, 80 * GIB);
    paused(&mut p, "ns/a", "f", 12 * GIB, 0.0);
    p.granted(&k("ns/b"), "g", 0, 7, t(0.0));
    assert_eq!(
        p.residency(),
        [on("f", 0, true, 0.0), on("g", 0, false, 0.0)],
        "f idle and Hot; g's only container is busy"
    );
    p.tick(t(31.0), None);
    assert_eq!(p.take_orders(), [order("ns/a", Action::Evict)]);
    let unmeasured = Outcome {
        seconds: 0.0,
        ..ok("ns/a", Action::Evict, 12 * GIB)
    };
    p.report(&unmeasured, t(31.5));
    let (resident, cost) = p.residency()[0].1[&0];
    assert!(!resident, "evicted: not resident");
    assert!(
        (0.9..1.2).contains(&cost),
        "12 GiB at the assumed 12 GB/s: about a second to restore, got {cost}"
    );
}

#[test]
fn footprints_are_the_largest_container_measured_per_function() {
    let mut p = pool(30.0, false);
    p.observe_memory(0, 0, 80 * GIB);
    paused(&mut p, "ns/a", "f", 3 * GIB, 0.0);
    paused(&mut p, "ns/b", "f", 5 * GIB, 0.0);
    paused(&mut p, "ns/c", "g", 2 * GIB, 0.0);
    // Granted, never released: nothing measured of h yet.
    p.granted(&k("ns/d"), "h", 0, 7, t(0.0));
    assert_eq!(
        p.footprints(),
        [("f".to_owned(), 5 * GIB), ("g".to_owned(), 2 * GIB)]
    );
}

#[test]
fn a_function_whose_last_container_left_reads_not_resident_until_its_flow_is_forgotten() {
    let mut p = pool(30.0, false);
    p.observe_memory(0, 0, 80 * GIB);
    paused(&mut p, "ns/a", "f", GIB, 0.0);
    assert_eq!(p.residency(), [on("f", 0, true, 0.0)]);
    p.forget(&k("ns/a"));
    assert_eq!(
        p.residency(),
        [("f".to_owned(), BTreeMap::new())],
        "the core must hear that f's memory is gone, not keep preferring it"
    );
    p.forget_functions(&["f".to_owned()]);
    assert!(p.residency().is_empty());
}

#[test]
fn hot_gpus_are_where_the_functions_hot_containers_are() {
    let mut p = pool(1000.0, false);
    for (key, f, gpu) in [("ns/a", "f", 0), ("ns/b", "f", 1), ("ns/c", "g", 1)] {
        p.granted(&k(key), f, gpu, 7, t(1.0));
        p.released(&k(key), true, GIB, t(2.0));
    }
    let by_entries = |f: &str| -> BTreeSet<u32> {
        p.entries(t(3.0))
            .into_iter()
            .filter(|e| e.function == f && e.tier == Tier::Hot)
            .map(|e| e.gpu)
            .collect()
    };
    assert_eq!(p.hot_gpus("f"), by_entries("f"));
    assert_eq!(p.hot_gpus("g"), by_entries("g"));
    assert_eq!(p.hot_gpus("f"), BTreeSet::from([0, 1]));
    assert!(p.hot_gpus("nobody").is_empty());
    // Serving a call, its memory is still there; it is just not ready for another call.
    p.granted(&k("ns/a"), "f", 0, 7, t(4.0));
    assert_eq!(p.hot_gpus("f"), BTreeSet::from([0, 1]));
    assert!(!p.start_costs("f").contains_key(&0));
}

#[test]
#[expect(clippy::cast_precision_loss, reason = "GIB is 2^30: exact in f64")]
fn start_costs_are_what_each_gpus_readiest_idle_container_of_the_function_would_take() {
    let mut p = pool(30.0, false);
    p.observe_memory(0, 0, 80 * GIB);
    p.observe_memory(1, 0, 80 * GIB);
    // f: one idle Hot container on GPU 0, one evicted on GPU 1 (12 GB at the assumed 12 GB/s,
    // 10 ms of overhead), one busy on GPU 2; g only on GPU 1.
    paused(&mut p, "ns/a", "f", GIB, 100.0);
    p.granted(&k("ns/b"), "f", 1, 7, t(0.0));
    p.released(&k("ns/b"), true, 12 * GIB, t(0.0));
    p.granted(&k("ns/c"), "f", 2, 7, t(0.0));
    p.granted(&k("ns/d"), "g", 1, 7, t(0.0));
    p.released(&k("ns/d"), true, GIB, t(0.0));
    p.tick(t(31.0), None);
    for o in p.take_orders() {
        assert_eq!(o.action, Action::Evict);
        // Evictions whose time was not measured.
        let unmeasured = Outcome {
            seconds: 0.0,
            ..ok(&o.key.to_string(), Action::Evict, 0)
        };
        assert!(p.report(&unmeasured, t(31.0)));
    }
    let f = p.start_costs("f");
    assert_eq!(f.get(&0), Some(&0.0), "{f:?}");
    let warm = f[&1];
    assert!(
        (warm - (12.0 * GIB as f64 / 12e9 + 0.01)).abs() < 1e-9,
        "{warm}"
    );
    assert!(
        !f.contains_key(&2),
        "a busy container serves no other call: {f:?}"
    );
    assert_eq!(f.len(), 2);
    // A measured restore replaces the estimate; the cheapest container on a GPU counts.
    p.granted(&k("ns/b"), "f", 1, 7, t(40.0));
    assert!(p.report(&ok("ns/b", Action::Restore, 12 * GIB), t(40.5)));
    p.released(&k("ns/b"), true, 12 * GIB, t(41.0));
    assert_eq!(p.start_costs("f").get(&1), Some(&0.0), "Hot again");
    assert_eq!(p.start_costs("g").keys().copied().collect::<Vec<_>>(), [1]);
    assert!(p.start_costs("nobody").is_empty());
    // Hot with its eviction in flight: priced as the restore it is about to need.
    p.tick(t(131.0), None);
    assert!(p.take_orders().contains(&order("ns/a", Action::Evict)));
    let gib = GIB as f64 / 12e9 + 0.01;
    assert!(
        (p.start_costs("f")[&0] - gib).abs() < 1e-9,
        "{:?}",
        p.start_costs("f")
    );
    // Its eviction took 0.3 s over this GPU's link: the restore is priced at that, not at the
    // assumed speed.
    let timed = Outcome {
        seconds: 0.3,
        ..ok("ns/a", Action::Evict, GIB)
    };
    assert!(p.report(&timed, t(131.5)));
    assert_eq!(p.start_costs("f").get(&0), Some(&0.3));
}
