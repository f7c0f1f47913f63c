//! The demo's workload, run once per `policy` (mqfqd restarted in between): the same gate, the
//! same D and the same pool, only the order of admission differs, so the two tables side by side
//! show what the queue buys.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use mqfq_testkit::{BUSYBOX, Containerd, MQFQ};

/// (function, service seconds, invocations, seconds between arrivals)
pub const MIX: [(&str, f64, usize, f64); 3] = [
    ("thumbnail", 0.3, 16, 0.3),
    ("bert", 1.0, 6, 0.8),
    ("train-batch", 3.0, 4, 0.0),
];

/// The concurrency ceiling of the demo's GPU.
pub const D_MAX: u32 = 3;

/// One function's figures under one policy.
#[derive(Clone, Debug, Default)]
pub struct Row {
    pub n: usize,
    pub wait_mean: f64,
    pub latency_mean: f64,
    pub latency_p95: f64,
    pub slowdown: f64,
}

/// One run of the mix.
pub struct Outcome {
    pub rows: HashMap<&'static str, Row>,
    pub failed: usize,
    pub wall_s: f64,
}

impl Outcome {
    /// Jain's index over per-function mean slowdown.
    pub fn jain(&self) -> f64 {
        let s: Vec<f64> = MIX
            .iter()
            .filter_map(|m| self.rows.get(m.0).map(|r| r.slowdown))
            .collect();
        #[expect(clippy::cast_precision_loss, reason = "a function count")]
        let n = s.len() as f64;
        s.iter().sum::<f64>().powi(2) / (n * s.iter().map(|x| x * x).sum::<f64>())
    }
}

/// Starts mqfqd for the demo's containerd under `policy`, its dispatch record at `log`.
pub fn start_daemon(c: &Containerd, bin: &Path, policy: &str, log: &Path) -> Result<Child, String> {
    let sock = c.daemon_socket();
    let _ = std::fs::remove_file(&sock);
    let cfg = c.dir().join(format!("mqfqd-{policy}.toml"));
    let toml = format!(
        "socket = \"{}\"\nmetrics_addr = \"127.0.0.1:9464\"\nbackend = \"auto\"\npolicy = \"{policy}\"\n\
         dispatch_log = \"{}\"\nrestart_grace_ms = 0\n[concurrency]\nd_max = {D_MAX}\n\
         [simulated]\nutilization_per_lease = 0.3\n[pool]\nhot_ttl_s = 2.0\n[nvidia]\nedits_file = \"{}\"\n",
        sock.display(),
        log.display(),
        c.edits_file().display()
    );
    std::fs::write(&cfg, toml).map_err(|e| format!("write {}: {e}", cfg.display()))?;
    let daemon_log = c.dir().join(format!("mqfqd-{policy}.log"));
    let stderr = std::fs::File::create(&daemon_log).map_err(|e| format!("daemon log: {e}"))?;
    let mut daemon = Command::new(bin.join("mqfqd"))
        .arg("--config")
        .arg(&cfg)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("start mqfqd: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        if Instant::now() > deadline {
            let _ = daemon.kill();
            let _ = daemon.wait();
            return Err(format!(
                "mqfqd did not start:\n{}",
                std::fs::read_to_string(&daemon_log).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(daemon)
}

/// Stops a daemon started by [`start_daemon`] (SIGTERM, then waits).
pub fn stop_daemon(mut daemon: Child) {
    let _ = Command::new("kill").arg(daemon.id().to_string()).status();
    let _ = daemon.wait();
}

/// Submits the mix through `ctr` (container ids prefixed by `tag`) and reads the queue waits
/// from the dispatch record at `log`.
pub fn run(c: &Containerd, tag: &str, log: &Path) -> Outcome {
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
                format!("{tag}-{f}-{i}"),
                "sleep".into(),
                format!("{service}"),
            ];
            #[expect(clippy::cast_precision_loss, reason = "a launch index")]
            let delay = Duration::from_secs_f64(gap * i as f64);
            runs.push((
                f,
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
    for (f, h) in runs {
        match h.join() {
            Ok((true, s)) => lat.entry(f).or_default().push(s),
            _ => failed += 1,
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    let mut wait: HashMap<String, Vec<f64>> = HashMap::new();
    for line in std::fs::read_to_string(log).unwrap_or_default().lines() {
        let Ok(r) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if r["event"] == "dispatch" {
            #[expect(clippy::cast_precision_loss, reason = "a wait in ns, as seconds")]
            let w = r["waited_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
            // The record names the flow: `namespace/function`.
            let flow = r["function"].as_str().unwrap_or("");
            let function = flow.rsplit('/').next().unwrap_or(flow);
            wait.entry(function.to_owned()).or_default().push(w);
        }
    }
    let mut rows = HashMap::new();
    for (f, service, _, _) in MIX {
        let mut l = lat.remove(f).unwrap_or_default();
        let w = wait.remove(f).unwrap_or_default();
        if l.is_empty() {
            continue;
        }
        let row = Row {
            n: l.len(),
            wait_mean: mqfq_testkit::mean(&w),
            latency_mean: mqfq_testkit::mean(&l),
            latency_p95: mqfq_testkit::percentile(&mut l, 0.95),
            slowdown: mqfq_testkit::mean(&l) / service,
        };
        rows.insert(f, row);
    }
    Outcome {
        rows,
        failed,
        wall_s,
    }
}

/// The two runs side by side.
pub fn print_side_by_side(fcfs: &Outcome, ours: &Outcome) {
    println!(
        "{:<12} {:>8} | {:^37} | {:^37} |",
        "", "", "policy = \"fcfs\"", "policy = \"mqfq-sticky\""
    );
    let head = format!(
        "{:>3} {:>7} {:>8} {:>8} {:>8}",
        "n", "wait", "latency", "p95", "slowdown"
    );
    println!(
        "{:<12} {:>8} | {head:>37} | {head:>37} | {:>9}",
        "function", "service", "latency ×"
    );
    let empty = Row::default();
    let cells = |r: &Row| {
        format!(
            "{:>3} {:>6.2}s {:>7.2}s {:>7.2}s {:>7.2}×",
            r.n, r.wait_mean, r.latency_mean, r.latency_p95, r.slowdown
        )
    };
    for (f, service, _, _) in MIX {
        let a = fcfs.rows.get(f).unwrap_or(&empty);
        let b = ours.rows.get(f).unwrap_or(&empty);
        println!(
            "{f:<12} {service:>7.1}s | {:>37} | {:>37} | {:>8.2}×",
            cells(a),
            cells(b),
            b.latency_mean / a.latency_mean
        );
    }
    println!(
        "{:<21} | {:>37} | {:>37} |",
        "Jain (mean slowdown)",
        format!("{:.2}", fcfs.jain()),
        format!("{:.2}", ours.jain())
    );
    println!(
        "{:<21} | {:>37} | {:>37} |",
        "wall time",
        format!("{:.1} s", fcfs.wall_s),
        format!("{:.1} s", ours.wall_s)
    );
}
