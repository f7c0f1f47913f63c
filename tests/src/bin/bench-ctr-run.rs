//! `ctr run --rm` wall time through containerd-shim-mqfq-v2 vs io.containerd.runc.v2, same
//! image, alternating, N runs each, in one throwaway containerd; then each shim's RSS with one
//! running container. Usage: `bench-ctr-run <dir of containerd-shim-mqfq-v2> [N]`.

use std::path::Path;
use std::time::Instant;

use mqfq_testkit::{Containerd, MQFQ, shim_pids};

fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    let m = mqfq_testkit::mean(&v);
    (
        m,
        mqfq_testkit::percentile(&mut v, 0.5),
        mqfq_testkit::percentile(&mut v, 0.9),
    )
}

/// A `kB` figure from a `/proc/<pid>` file.
fn kib(pid: u32, file: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Where a shim's memory is: RSS, of which anonymous and file-backed, PSS, and its threads.
fn memory(pid: u32) -> [u64; 5] {
    [
        kib(pid, "status", "VmRSS:"),
        kib(pid, "status", "RssAnon:"),
        kib(pid, "status", "RssFile:"),
        kib(pid, "smaps_rollup", "Pss:"),
        kib(pid, "status", "Threads:"),
    ]
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1) else {
        eprintln!("usage: bench-ctr-run <dir of containerd-shim-mqfq-v2> [N]");
        return std::process::ExitCode::from(2);
    };
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let Some(c) = Containerd::start("bench", Path::new(dir)) else {
        eprintln!("cannot run containerd here (needs root, containerd, runc, busybox-static)");
        return std::process::ExitCode::FAILURE;
    };
    let runtimes = [MQFQ, "io.containerd.runc.v2"];
    let mut times = [Vec::new(), Vec::new()];
    // One warm-up each (page cache, first shim exec).
    for (i, rt) in runtimes.iter().enumerate() {
        let o = c.run(rt, &format!("warm{i}"), &[], &["true"]);
        assert!(
            o.status.success(),
            "{rt}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    for k in 0..n {
        for (i, rt) in runtimes.iter().enumerate() {
            let t = Instant::now();
            let o = c.run(rt, &format!("b{k}-{i}"), &[], &["true"]);
            times[i].push(t.elapsed().as_secs_f64() * 1e3);
            assert!(
                o.status.success(),
                "{rt}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    let sock = c.socket().display().to_string();
    let mut rss = Vec::new();
    for (i, rt) in runtimes.iter().enumerate() {
        let id = format!("rss{i}");
        let o = c.run_detached(rt, &id, &["sleep", "60"]);
        assert!(o.status.success());
        let before: Vec<u32> = shim_pids(&sock);
        let pid = before.first().copied().unwrap_or(0);
        rss.push(memory(pid));
        let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", &id]);
        std::thread::sleep(std::time::Duration::from_millis(300));
        let _ = c.ctr(&["task", "delete", "-f", &id]);
        let _ = c.ctr(&["containers", "rm", &id]);
    }
    let (m0, p50_0, p90_0) = stats(times[0].clone());
    let (m1, p50_1, p90_1) = stats(times[1].clone());
    println!("ctr run --rm busybox true, N = {n} each, alternating");
    println!(
        "| runtime | mean ms | p50 ms | p90 ms | shim RSS KiB | anon / file KiB | PSS KiB | threads |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (i, (m, p50, p90)) in [(m0, p50_0, p90_0), (m1, p50_1, p90_1)]
        .into_iter()
        .enumerate()
    {
        let [rss, anon, file, pss, threads] = rss[i];
        println!(
            "| {} | {m:.1} | {p50:.1} | {p90:.1} | {rss} | {anon} / {file} | {pss} | {threads} |",
            runtimes[i]
        );
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "RSS and PSS in KiB: far below 2^52"
    )]
    let (rss_ratio, pss_ratio) = (
        rss[0][0] as f64 / rss[1][0].max(1) as f64,
        rss[0][3] as f64 / rss[1][3].max(1) as f64,
    );
    println!(
        "ratio mqfq / runc-v2: mean {:.3}×, p50 {:.3}×, RSS {rss_ratio:.2}×, PSS {pss_ratio:.2}×",
        m0 / m1,
        p50_0 / p50_1
    );
    std::process::ExitCode::SUCCESS
}
