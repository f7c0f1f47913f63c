//! What the burst idle time (`MQFQ_BURST_IDLE_MS`) trades, through the real shim, interposer and
//! mqfqd: for each idle time, one GPU server runs inference-like requests (kernels of 1 ms on
//! the libcuda double's timeline, each waited for, with exponential CPU pauses between them) and
//! the dispatch log says how many bursts each request became and how long their leases held a
//! slot. A short idle time splits requests at their pauses (each piece asks for a slot again:
//! more admission latency, and other flows can get in between); a long one holds the slot idle
//! through pauses and after the work.
//!
//! Usage: `bench-idle <dir with containerd-shim-mqfq-v2, mqfqd, mqfqctl, libmqfq_cuda.so>
//! [requests] [pause mean µs] [idle ms list, comma-separated]`

use std::collections::HashMap;
use std::path::Path;

use mqfq_testkit::{Containerd, MQFQ};

/// Kernels per request, each 1 ms on the double's timeline.
const KERNELS: u32 = 8;

struct Row {
    idle_ms: u32,
    bursts: f64,
    request_ms: f64,
    held_ms: f64,
}

fn measure(dir: &Path, idle_ms: u32, requests: &str, pause_us: &str) -> Row {
    let idle = idle_ms.to_string();
    let c = Containerd::start_with_env(
        &format!("benchidle{idle_ms}"),
        dir,
        &[("MQFQ_BURST_IDLE_MS", &idle)],
    )
    .expect("containerd (needs root, containerd, runc)");
    let (cuda, d) = c.cuda_node(dir, "");
    let o = c.run_cuda_with(
        MQFQ,
        "server",
        "server",
        &cuda,
        &[
            "--rm",
            "--env",
            "FAKE_CUDA_LOG=",
            "--env",
            "FAKE_CUDA_KERNEL_MS=1",
        ],
        &["infer", requests, &KERNELS.to_string(), pause_us, "50"],
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let request_ns: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("infer "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "idle {idle_ms}: {out}{}\n{}",
                String::from_utf8_lossy(&o.stderr),
                d.stderr()
            )
        });
    // Each lease, dispatch → release (the container's Start is not gated in burst mode: every
    // lease is a burst).
    let mut granted = HashMap::new();
    let mut held = 0u64;
    let mut bursts = 0u32;
    for r in d.records() {
        let lease = r["lease"].as_u64();
        let t = r["t_ns"].as_u64().unwrap_or(0);
        match (r["event"].as_str(), lease) {
            (Some("dispatch"), Some(l)) => {
                granted.insert(l, t);
                bursts += 1;
            }
            (Some("release"), Some(l)) => {
                if let Some(t0) = granted.remove(&l) {
                    held += t.saturating_sub(t0);
                }
            }
            _ => {}
        }
    }
    let n: f64 = requests.parse().expect("requests");
    Row {
        idle_ms,
        bursts: f64::from(bursts) / n,
        request_ms: request_ns / 1e6,
        #[expect(
            clippy::cast_precision_loss,
            reason = "nanoseconds held, reported in ms"
        )]
        held_ms: held as f64 / 1e6 / n,
    }
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1).map(Path::new) else {
        eprintln!(
            "usage: bench-idle <dir of the built binaries> [requests] [pause µs] [idle ms,…]"
        );
        return std::process::ExitCode::from(2);
    };
    let requests = args.get(2).map_or("40", String::as_str);
    let pause_us = args.get(3).map_or("1000", String::as_str);
    let idles: Vec<u32> = args
        .get(4)
        .map_or("1,2,5,10,20", String::as_str)
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let rows: Vec<Row> = idles
        .iter()
        .map(|&i| measure(dir, i, requests, pause_us))
        .collect();
    println!(
        "{requests} requests of {KERNELS} × 1 ms kernels, exponential CPU pauses (mean {pause_us} µs) \
         between them, 50 ms between requests"
    );
    println!(
        "| idle ms | bursts per request | request time | slot held per request | held while the GPU idles |"
    );
    println!("|---|---|---|---|---|");
    for r in rows {
        let gpu = f64::from(KERNELS);
        println!(
            "| {} | {:.2} | {:.2} ms | {:.2} ms | {:.0} % |",
            r.idle_ms,
            r.bursts,
            r.request_ms,
            r.held_ms,
            100.0 * (r.held_ms - gpu).max(0.0) / r.held_ms.max(f64::EPSILON)
        );
    }
    std::process::ExitCode::SUCCESS
}
