//! Resume of a pooled GPU container through the shim and mqfqd: Hot (memory still on the
//! "GPU") and Warm (evicted by mqfqd's hot TTL, restored by the shim before Resume returns),
//! against io.containerd.runc.v2 resuming a plain container; `ctr`'s own cost is in all three.
//! CPU only: the driver is the libcuda double, so this measures the control path (admission,
//! thaw, the interposer's socket, advise/prefetch calls), not data movement over PCIe.
//!
//! Usage: `bench-pool <dir with containerd-shim-mqfq-v2, mqfqd, mqfqctl, libmqfq_cuda.so> [N]`

use std::path::Path;
use std::time::{Duration, Instant};

use mqfq_testkit::{Containerd, MQFQ, Mqfqd};

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    let m = mqfq_testkit::mean(&v);
    (
        m,
        mqfq_testkit::percentile(&mut v, 0.5),
        mqfq_testkit::percentile(&mut v, 0.9),
    )
}

fn ok(o: &std::process::Output, what: &str) {
    assert!(
        o.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn tier(d: &Mqfqd, id: &str) -> String {
    mqfq_testkit::pool_tiers(&d.status())
        .remove(id)
        .unwrap_or_default()
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1).map(Path::new) else {
        eprintln!("usage: bench-pool <dir of the built binaries> [N]");
        return std::process::ExitCode::from(2);
    };
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20);
    // Pause / Resume with Start and Resume gating (what the pool benchmark measures).
    let Some(c) = Containerd::start_with_env("benchpool", dir, &[("MQFQ_BURST", "off")]) else {
        eprintln!("cannot run containerd here (needs root, containerd, runc, busybox-static)");
        return std::process::ExitCode::FAILURE;
    };
    let (cuda, d) = c.cuda_node(dir, "[queue]\nttl_s = 0.3\n[pool]\nhot_ttl_s = 0.5\n");
    ok(
        &c.run_cuda_client(MQFQ, "g", "bench", &cuda),
        "run the GPU container",
    );
    ok(
        &c.run_detached("io.containerd.runc.v2", "r", &["sleep", "600"]),
        "run the runc-v2 container",
    );
    let log = cuda.join("g.log");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("launch")
    {
        assert!(Instant::now() < deadline, "the CUDA client never launched");
        std::thread::sleep(Duration::from_millis(20));
    }
    let resume = |id: &str| {
        let t = Instant::now();
        ok(&c.ctr(&["task", "resume", id]), "resume");
        t.elapsed().as_secs_f64() * 1e3
    };
    let (mut base, mut hot, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        ok(&c.ctr(&["task", "pause", "r"]), "pause r");
        base.push(resume("r"));
        ok(&c.ctr(&["task", "pause", "g"]), "pause g");
        assert_eq!(tier(&d, "g"), "hot");
        hot.push(resume("g"));
        ok(&c.ctr(&["task", "pause", "g"]), "pause g");
        let deadline = Instant::now() + Duration::from_secs(30);
        while tier(&d, "g") != "warm" {
            assert!(Instant::now() < deadline, "never evicted: {}", d.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
        warm.push(resume("g"));
    }
    // The shim's own restore time (thaw + prefetch), from its log lines.
    let restored: Vec<f64> = c
        .log()
        .lines()
        .filter(|l| l.contains("restored"))
        .filter_map(|l| {
            l.split("ms=")
                .nth(1)?
                .split(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
                .next()?
                .parse()
                .ok()
        })
        .collect();
    for id in ["g", "r"] {
        let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        std::thread::sleep(Duration::from_millis(300));
        let _ = c.ctr(&["task", "delete", "-f", id]);
        let _ = c.ctr(&["containers", "rm", id]);
    }
    let rows = [
        ("runc-v2, plain container", stats(base)),
        ("mqfq, pooled GPU container, Hot", stats(hot)),
        ("mqfq, pooled GPU container, Warm (restored)", stats(warm)),
    ];
    println!("ctr task resume, N = {n} each (CPU double: control path only)");
    println!("| resume | mean ms | p50 ms | p90 ms |");
    println!("|---|---|---|---|");
    for (name, (m, p50, p90)) in &rows {
        println!("| {name} | {m:.1} | {p50:.1} | {p90:.1} |");
    }
    let base50 = rows[0].1.1;
    println!(
        "added over runc-v2 at p50: Hot {:+.1} ms, Warm {:+.1} ms",
        rows[1].1.1 - base50,
        rows[2].1.1 - base50
    );
    if !restored.is_empty() {
        let (m, p50, p90) = stats(restored.clone());
        println!(
            "shim restore (thaw + prefetch), {} samples: mean {m:.2} ms, p50 {p50:.2} ms, p90 {p90:.2} ms",
            restored.len()
        );
    }
    std::process::ExitCode::SUCCESS
}
