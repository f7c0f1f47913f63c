//! What burst admission adds to a CUDA call, through the real shim and mqfqd: the first launch
//! of a burst (asks the container's shim, which asks mqfqd; uncontended) and every later launch
//! of the burst (one atomic check), against the same client in a GPU container without the
//! interposer (`io.mqfq.uvm=off`), in one run. CPU only: launches go to the libcuda double,
//! which returns at once, so the figures are the interposer's and the admission path's own.
//!
//! Usage: `bench-burst <dir with containerd-shim-mqfq-v2, mqfqd, mqfqctl, libmqfq_cuda.so>
//! [bursts] [calls per burst]`

use std::path::Path;

use mqfq_testkit::{Containerd, MQFQ};

/// `(first p50 ns, first p99 ns, in-burst mean ns)` from the client's bench output.
fn parse(out: &str) -> Option<(f64, f64, f64)> {
    let mut first = None;
    let mut inburst = None;
    for l in out.lines() {
        let w: Vec<f64> = l
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        if l.starts_with("first ") && w.len() == 2 {
            first = Some((w[0], w[1]));
        } else if l.starts_with("inburst ") && w.len() == 1 {
            inburst = Some(w[0]);
        }
    }
    let (p50, p99) = first?;
    Some((p50, p99, inburst?))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1).map(Path::new) else {
        eprintln!("usage: bench-burst <dir of the built binaries> [bursts] [calls]");
        return std::process::ExitCode::from(2);
    };
    let bursts = args.get(2).map_or("300", String::as_str);
    let calls = args.get(3).map_or("2000", String::as_str);
    let Some(c) = Containerd::start("benchburst", dir) else {
        eprintln!("cannot run containerd here (needs root, containerd, runc, busybox-static)");
        return std::process::ExitCode::FAILURE;
    };
    let (cuda, d) = c.cuda_node(dir, "");
    // 20 ms between bursts: past the 5 ms idle time, so every first launch asks again.
    let bench = ["bench", bursts, calls, "20"];
    let run = |id: &str, extra: &[&str]| {
        let mut flags = vec!["--rm", "--env", "FAKE_CUDA_LOG="];
        flags.extend(extra);
        let o = c.run_cuda_with(MQFQ, id, id, &cuda, &flags, &bench);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        match parse(&out) {
            Some(r) if o.status.success() => r,
            _ => panic!(
                "{id}: {out}{}\n{}",
                String::from_utf8_lossy(&o.stderr),
                d.stderr()
            ),
        }
    };
    let plain = run("plain", &["--annotation", "io.mqfq.uvm=off"]);
    let burst = run("burst", &[]);
    let admitted = d
        .records()
        .iter()
        .filter(|r| r["event"] == "dispatch")
        .count();
    println!("cuLaunchKernel through the shim and mqfqd, {bursts} bursts of 1 + {calls} launches");
    println!("| launch | without interposer | burst admission | added |");
    println!("|---|---|---|---|");
    let us = |ns: f64| ns / 1e3;
    println!(
        "| first of a burst, p50 | {:.1} µs | {:.1} µs | {:+.1} µs |",
        us(plain.0),
        us(burst.0),
        us(burst.0 - plain.0)
    );
    println!(
        "| first of a burst, p99 | {:.1} µs | {:.1} µs | {:+.1} µs |",
        us(plain.1),
        us(burst.1),
        us(burst.1 - plain.1)
    );
    println!(
        "| later in the burst, mean | {:.0} ns | {:.0} ns | {:+.0} ns |",
        plain.2,
        burst.2,
        burst.2 - plain.2
    );
    println!("mqfqd dispatched {admitted} leases (the plain container's start, and the bursts)");
    std::process::ExitCode::SUCCESS
}
