//! The README demo: a private containerd with containerd-shim-mqfq-v2, a private `mqfqd` on a
//! simulated GPU, and a mixed workload of annotated busybox "GPU functions" (sleep-based
//! service) submitted through `ctr`. Prints per-function queue wait, latency and fairness, and
//! the daemon's view. Then, when the CUDA interposer was built (`libmqfq_cuda.so` beside the
//! binaries) and `cc` exists, the pool: two paused containers of a CUDA client (over the CPU-only
//! libcuda double) evicted by mqfqd, one resumed and restored, the other prefetched; and five
//! long-running GPU servers that are never paused, sharing the GPU a burst of work at a time.
//! Usage: `mqfq-demo <dir with containerd-shim-mqfq-v2, mqfqd, mqfqctl[, libmqfq_cuda.so]>`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use mqfq_testkit::{BUSYBOX, Containerd, MQFQ};

mod servers;

/// (function, service seconds, invocations, seconds between arrivals)
const MIX: [(&str, f64, usize, f64); 3] = [
    ("thumbnail", 0.3, 16, 0.3),
    ("bert", 1.0, 6, 0.8),
    ("train-batch", 3.0, 4, 0.0),
];

fn main() -> ExitCode {
    let Some(bin) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: mqfq-demo <dir with containerd-shim-mqfq-v2, mqfqd, mqfqctl>");
        return ExitCode::from(2);
    };
    let Some(c) = Containerd::start_with_env("demo", &bin, &[]) else {
        eprintln!("cannot run containerd here (needs root, containerd, runc, busybox-static)");
        return ExitCode::FAILURE;
    };
    let sock = c.daemon_socket();
    let log = c.dir().join("dispatch.jsonl");
    let cfg = c.dir().join("mqfqd.toml");
    let toml = format!(
        "socket = \"{}\"\nmetrics_addr = \"127.0.0.1:9464\"\nbackend = \"auto\"\ndispatch_log = \"{}\"\n\
         restart_grace_ms = 0\n[concurrency]\nd_max = 3\n[simulated]\nutilization_per_lease = 0.3\n\
         [pool]\nhot_ttl_s = 2.0\n[nvidia]\nedits_file = \"{}\"\n",
        sock.display(),
        log.display(),
        c.edits_file().display()
    );
    if let Err(e) = std::fs::write(&cfg, toml) {
        eprintln!("write {}: {e}", cfg.display());
        return ExitCode::FAILURE;
    }
    let daemon_log = c.dir().join("mqfqd.log");
    let mut daemon = match Command::new(bin.join("mqfqd"))
        .arg("--config")
        .arg(&cfg)
        .stderr(std::fs::File::create(&daemon_log).expect("daemon log"))
        .spawn()
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("start mqfqd: {e}");
            return ExitCode::FAILURE;
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        if Instant::now() > deadline {
            eprintln!(
                "mqfqd did not start:\n{}",
                std::fs::read_to_string(&daemon_log).unwrap_or_default()
            );
            let _ = daemon.kill();
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "containerd {} · mqfqd {} · metrics http://127.0.0.1:9464/metrics",
        c.socket().display(),
        sock.display()
    );
    println!(
        "watch it live from another shell:  {} --socket {} top\n",
        bin.join("mqfqctl").display(),
        sock.display()
    );

    let started = Instant::now();
    let mut runs = Vec::new();
    for (f, service, n, gap) in MIX {
        for i in 0..n {
            let args: Vec<String> = vec![
                "-a".into(),
                c.socket().display().to_string(),
                "-n".into(),
                c.ns.clone(),
                "run".into(),
                "--rm".into(),
                "--snapshotter".into(),
                "native".into(),
                "--runtime".into(),
                MQFQ.into(),
                "--env".into(),
                "NVIDIA_VISIBLE_DEVICES=0".into(),
                "--annotation".into(),
                format!("io.mqfq.function={f}"),
                BUSYBOX.into(),
                format!("{f}-{i}"),
                "sleep".into(),
                format!("{service}"),
            ];
            let delay = Duration::from_secs_f64(gap * i as f64);
            runs.push((
                f,
                service,
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let t = Instant::now();
                    let ok = mqfq_testkit::ctr_command()
                        .args(&args)
                        .output()
                        .is_ok_and(|o| o.status.success());
                    (ok, t.elapsed().as_secs_f64())
                }),
            ));
        }
    }
    let mut lat: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut failed = 0;
    for (f, _, h) in runs {
        match h.join() {
            Ok((true, s)) => lat.entry(f).or_default().push(s),
            _ => failed += 1,
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let mut wait: HashMap<String, Vec<f64>> = HashMap::new();
    for line in std::fs::read_to_string(&log).unwrap_or_default().lines() {
        let Ok(r) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if r["event"] == "dispatch" {
            #[expect(clippy::cast_precision_loss)]
            let w = r["waited_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
            wait.entry(r["function"].as_str().unwrap_or("").to_owned())
                .or_default()
                .push(w);
        }
    }
    println!(
        "{} invocations in {wall:.1} s ({failed} failed); GPU concurrency limit D ≤ 3\n",
        MIX.iter().map(|m| m.2).sum::<usize>()
    );
    println!(
        "{:<12} {:>4} {:>9} {:>10} {:>10} {:>12} {:>12} {:>9}",
        "function",
        "n",
        "service",
        "wait mean",
        "wait p95",
        "latency mean",
        "latency p95",
        "slowdown"
    );
    let mut slowdowns = Vec::new();
    for (f, service, _, _) in MIX {
        let mut l = lat.remove(f).unwrap_or_default();
        let mut w = wait.remove(f).unwrap_or_default();
        if l.is_empty() {
            continue;
        }
        let sd = mqfq_testkit::mean(&l) / service;
        slowdowns.push(sd);
        println!(
            "{f:<12} {:>4} {service:>8.1}s {:>9.2}s {:>9.2}s {:>11.2}s {:>11.2}s {sd:>8.2}×",
            l.len(),
            mqfq_testkit::mean(&w),
            if w.is_empty() {
                0.0
            } else {
                mqfq_testkit::percentile(&mut w, 0.95)
            },
            mqfq_testkit::mean(&l),
            mqfq_testkit::percentile(&mut l, 0.95),
        );
    }
    #[expect(clippy::cast_precision_loss)]
    let jain = slowdowns.iter().sum::<f64>().powi(2)
        / (slowdowns.len() as f64 * slowdowns.iter().map(|x| x * x).sum::<f64>());
    println!(
        "\nJain's fairness over per-function mean slowdown: {jain:.2} (1 = every function slowed alike)"
    );
    println!(
        "latency = `ctr run --rm` wall time (create + queue wait + run + delete); wait = time queued in mqfqd\n"
    );
    if let Ok(o) = Command::new(bin.join("mqfqctl"))
        .arg("--socket")
        .arg(&sock)
        .arg("status")
        .output()
    {
        print!("{}", String::from_utf8_lossy(&o.stdout));
    }
    println!("\ndispatch record: {}", log.display());
    let pool_ok = match install_cuda(&c, &bin) {
        Some(cuda) => pool_demo(&c, &bin, &cuda) && servers::servers_demo(&c, &cuda, &log, 8),
        None => true,
    };
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let _ = daemon.wait();
    if failed == 0 && pool_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The pool lines of `mqfqctl status`.
fn pool_view(bin: &std::path::Path, sock: &std::path::Path) -> String {
    let o = Command::new(bin.join("mqfqctl"))
        .arg("--socket")
        .arg(sock)
        .arg("status")
        .output();
    let text = o
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    text.find("\nPOOL FUNCTION").map_or_else(
        || "(no pooled containers)\n".to_owned(),
        |i| text[i + 1..].to_owned(),
    )
}

fn tiers(bin: &std::path::Path, sock: &std::path::Path) -> Vec<String> {
    let status: serde_json::Value = Command::new(bin.join("mqfqctl"))
        .arg("--socket")
        .arg(sock)
        .args(["status", "--json"])
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or_default();
    mqfq_testkit::pool_tiers(&status).into_values().collect()
}

/// The interposer and the CUDA doubles in the demo's containerd, if they can be had.
fn install_cuda(c: &Containerd, bin: &std::path::Path) -> Option<PathBuf> {
    let lib = bin.join("libmqfq_cuda.so");
    if !lib.exists() {
        println!(
            "\n(pool and server demos skipped: no {} — scripts/demo.sh builds it)",
            lib.display()
        );
        return None;
    }
    match c.install_cuda(&lib) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("\n(pool and server demos skipped: {e})");
            None
        }
    }
}

/// Two pooled containers: paused (Hot), evicted by mqfqd after the demo's 2 s hot TTL (Warm),
/// one resumed (its next burst restored before it ran); returns whether every step worked.
fn pool_demo(c: &Containerd, bin: &std::path::Path, cuda: &std::path::Path) -> bool {
    let sock = c.daemon_socket();
    println!(
        "\n== The pool: two containers of `resnet` running a CUDA client (CPU double) under the interposer"
    );
    for id in ["resnet-a", "resnet-b"] {
        if !c.run_cuda_client(MQFQ, id, "resnet", cuda).status.success() {
            println!("could not start {id}");
            return false;
        }
    }
    let wait = |what: &str, pred: &dyn Fn(&[String]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !pred(&tiers(bin, &sock)) {
            if Instant::now() > deadline {
                println!("never {what}");
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    };
    let ok = wait("running", &|t| t.len() == 2) && {
        std::thread::sleep(Duration::from_millis(300));
        ["resnet-a", "resnet-b"]
            .iter()
            .all(|id| c.ctr(&["task", "pause", id]).status.success())
    };
    if !ok {
        return false;
    }
    println!("paused (OpenWhisk's pause between invocations): memory stays on the GPU — Hot\n");
    print!("{}", pool_view(bin, &sock));
    if !wait("evicted", &|t| t.iter().all(|x| x == "warm")) {
        return false;
    }
    println!(
        "\nidle past the hot TTL (2 s here, 30 min by default): mqfqd had the shims thaw, evict, freeze — Warm\n"
    );
    print!("{}", pool_view(bin, &sock));
    std::thread::sleep(Duration::from_secs(1));
    let t = Instant::now();
    let resumed = c.ctr(&["task", "resume", "resnet-a"]).status.success();
    println!(
        "\nctr task resume resnet-a: {:.0} ms; its next burst of GPU work was admitted and its memory\n\
         restored before that work ran; its flow turned active, so mqfqd had resnet-b's memory\n\
         prefetched while it stays paused\n",
        t.elapsed().as_secs_f64() * 1e3
    );
    let _ = wait("prefetched", &|t| t.iter().all(|x| x == "hot"));
    print!("{}", pool_view(bin, &sock));
    for id in ["resnet-a", "resnet-b"] {
        let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        let _ = c.ctr(&["task", "resume", id]);
        let _ = c.wait_status(id, "STOPPED");
        let _ = c.ctr(&["task", "delete", id]);
        let _ = c.ctr(&["containers", "rm", id]);
    }
    resumed
}
