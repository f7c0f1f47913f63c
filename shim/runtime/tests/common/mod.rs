//! Shared by the daemon and burst integration tests.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mqfq_daemon::config::DaemonConfig;
use scheduler_core::{MqfqQueue, Time};
use serde_json::Value;

/// Replays a dispatch record through scheduler-core's queue with the daemon's config: every
/// dispatch must pick the same container as the daemon did (the record is enough to replay
/// the queue's decisions exactly).
///
/// # Panics
/// The replay diverges, or the record is malformed.
pub fn replay(records: &[Value], config: &Path) {
    let cfg = DaemonConfig::parse(&std::fs::read_to_string(config).unwrap(), config).unwrap();
    let mut q: MqfqQueue<String> = MqfqQueue::new(cfg.queue_config().unwrap()).unwrap();
    let mut tickets = HashMap::new();
    for r in records {
        let t = Time::from_nanos(r["t_ns"].as_u64().unwrap());
        let key = r["key"].as_str().unwrap().to_owned();
        let tenant = r["tenant"].as_str();
        let f = q.flow_in(r["function"].as_str().unwrap(), tenant);
        if let (Some(name), Some(w)) = (tenant, r["tenant_weight"].as_f64()) {
            q.set_tenant_weight(name, w).unwrap();
        }
        q.tick(t);
        match r["event"].as_str().unwrap() {
            "enqueue" => {
                q.set_weight(f, r["weight"].as_f64().unwrap()).unwrap();
                q.enqueue(f, key, t).unwrap();
            }
            "dispatch" => {
                let free = u32::try_from(r["free"].as_u64().unwrap()).unwrap();
                let got = q.dispatch_slot(t, free).expect("replay dispatches too");
                assert_eq!(got.item, key, "replay diverges at {r}");
                tickets.insert(r["lease"].as_u64().unwrap(), got.ticket);
            }
            // A running container the daemon did not know (a fail-open start it is told of,
            // a restarted daemon): charged as running from now, like a dispatch.
            "adopt" => {
                let ticket = q.adopt(f, t).expect("replay adopts too");
                tickets.insert(r["lease"].as_u64().unwrap(), ticket);
            }
            "release" => {
                let ticket = tickets.remove(&r["lease"].as_u64().unwrap()).unwrap();
                q.complete(&ticket, r["measured_s"].as_f64(), t).unwrap();
            }
            "charge" => {
                let ticket = &tickets[&r["lease"].as_u64().unwrap()];
                assert!(
                    q.charge_running(ticket, r["served_s"].as_f64().unwrap())
                        .unwrap()
                );
            }
            // A waiting admission left (its container was killed or deleted).
            "withdraw" => assert!(
                q.withdraw(f, |k| *k == key).is_some(),
                "replay withdraws too: {r}"
            ),
            // A burst past the maximum hold: the core's limits rise (the dispatches after it
            // carry the free slots), the queue is unchanged.
            "overtime" => assert!(tickets.contains_key(&r["lease"].as_u64().unwrap())),
            other => panic!("unexpected {other} in {r}"),
        }
    }
}

/// `kill -9 pid`.
///
/// # Panics
/// kill fails.
pub fn kill9(pid: u64) {
    let ok = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -9 {pid}");
}

/// Polls `pred` every 50 ms until it holds.
///
/// # Panics
/// It never holds within 60 s (`what` names it).
pub fn until(what: &str, pred: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pred() {
        assert!(Instant::now() < deadline, "never {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
