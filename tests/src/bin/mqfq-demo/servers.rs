//! The demo's third part: long-running GPU servers (the CUDA client's `serve` mode over the
//! CPU-only libcuda double, whose kernels take real time) that are never paused, sharing the
//! GPU through burst admission: they all start at once, and each burst of their GPU work waits
//! its turn in the queue.

use std::path::Path;
use std::time::{Duration, Instant};

use mqfq_testkit::{Containerd, MQFQ};
use serde_json::Value;

/// (container, function, kernels per request, kernel ms, ms between requests)
const SERVERS: [(&str, &str, u32, u32, u32); 5] = [
    ("batch-1", "batch", 4, 30, 10),
    ("batch-2", "batch", 4, 30, 10),
    ("batch-3", "batch", 4, 30, 10),
    ("embed-1", "embed", 2, 10, 100),
    ("chat-1", "chat", 1, 10, 200),
];

fn kernels(cuda: &Path, id: &str) -> Vec<(i64, i64)> {
    mqfq_testkit::kernel_intervals(cuda, id)
}

/// Runs the servers for `secs`, prints what each function got; whether every step worked.
pub fn servers_demo(c: &Containerd, cuda: &Path, record: &Path, secs: u64) -> bool {
    println!(
        "\n== GPU servers that are never paused (Kubernetes, Knative): 3 × batch (4 × 30 ms kernels per \
         request, back to back), embed (2 × 10 ms every 100 ms), chat (10 ms every 200 ms); D = 3"
    );
    let t = Instant::now();
    for (id, function, k, ms, gap) in SERVERS {
        let kernel = format!("FAKE_CUDA_KERNEL_MS={ms}");
        let args = ["serve".to_owned(), k.to_string(), gap.to_string()];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if !c
            .run_cuda(MQFQ, id, function, cuda, &[&kernel], &args)
            .status
            .success()
        {
            println!("could not start {id}");
            return false;
        }
    }
    println!(
        "all five started in {:.0} ms: the queue admits their GPU work, not their start",
        t.elapsed().as_secs_f64() * 1e3
    );
    std::thread::sleep(Duration::from_secs(secs));
    let until = mqfq_testkit::monotonic_us();
    for (id, ..) in SERVERS {
        let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        let _ = c.wait_status(id, "STOPPED");
        let _ = c.ctr(&["task", "delete", id]);
        let _ = c.ctr(&["containers", "rm", id]);
    }
    let records: Vec<Value> = std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    println!(
        "\n| function | servers | bursts | GPU busy s | queue wait p50 ms | p90 ms | max ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for function in ["batch", "embed", "chat"] {
        let ids: Vec<&str> = SERVERS
            .iter()
            .filter(|s| s.1 == function)
            .map(|s| s.0)
            .collect();
        let mine = |r: &Value| {
            ids.iter().any(|id| {
                r["key"]
                    .as_str()
                    .is_some_and(|k| k.ends_with(&format!("/{id}")))
            })
        };
        let mut waits: Vec<f64> = records
            .iter()
            .filter(|r| r["event"] == "dispatch" && mine(r))
            .filter_map(|r| r["waited_ns"].as_f64())
            .map(|ns| ns / 1e6)
            .collect();
        #[expect(
            clippy::cast_precision_loss,
            reason = "kernel durations in ns, summed in ms"
        )]
        let busy: f64 = ids
            .iter()
            .flat_map(|id| kernels(cuda, id))
            .map(|(b, e)| (e - b) as f64 / 1e6)
            .sum();
        let n = waits.len();
        let max = waits.iter().copied().fold(0.0, f64::max);
        let p50 = mqfq_testkit::percentile(&mut waits, 0.5);
        let p90 = mqfq_testkit::percentile(&mut waits, 0.9);
        println!(
            "| {function} | {} | {n} | {busy:.1} | {p50:.1} | {p90:.1} | {max:.1} |",
            ids.len()
        );
    }
    let ids: Vec<&str> = SERVERS.iter().map(|s| s.0).collect();
    let most = mqfq_testkit::most_at_once(cuda, &ids, until);
    println!(
        "\nat most {most} servers' kernels ran at the same instant (D = 3); the light functions' \
         bursts wait about one batch burst, not behind the whole batch backlog"
    );
    most <= 3
}
