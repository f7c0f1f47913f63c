//! The README demo: a private containerd with containerd-shim-mqfq-v2, a private `mqfqd` on a
//! simulated GPU, and a mixed workload of annotated busybox "GPU functions" (sleep-based
//! service) submitted through `ctr`, once under `policy = "fcfs"` and once under
//! `"mqfq-sticky"`. Prints per-function queue wait, latency and fairness under both side by
//! side, and the daemon's view. Then, when the CUDA interposer was built (`libmqfq_cuda.so` beside the
//! binaries) and `cc` exists, the pool: two paused containers of a CUDA client (over the CPU-only
//! libcuda double) evicted by mqfqd, one resumed and restored, the other prefetched; and five
//! long-running GPU servers that are never paused, sharing the GPU a burst of work at a time.
//! Usage: `mqfq-demo <dir with containerd-shim-mqfq-v2, mqfqd, mqfqctl[, libmqfq_cuda.so]>`.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use mqfq_testkit::{Containerd, MQFQ};

mod mix;
mod servers;

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
    println!(
        "The same workload twice through `ctr run`, mqfqd restarted in between: policy = \"fcfs\"\n\
         (first come, first served) then \"mqfq-sticky\"; same gate, same D (≤ {}), same pool.\n",
        mix::D_MAX
    );
    let fcfs_log = c.dir().join("dispatch-fcfs.jsonl");
    let fcfs = match mix::start_daemon(&c, &bin, "fcfs", &fcfs_log) {
        Ok(d) => {
            let o = mix::run(&c, "fcfs", &fcfs_log);
            mix::stop_daemon(d);
            o
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let log = c.dir().join("dispatch.jsonl");
    let daemon = match mix::start_daemon(&c, &bin, "mqfq-sticky", &log) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let ours = mix::run(&c, "mqfq", &log);
    let failed = fcfs.failed + ours.failed;
    println!(
        "{} invocations per run ({failed} failed)\n",
        mix::MIX.iter().map(|m| m.2).sum::<usize>()
    );
    mix::print_side_by_side(&fcfs, &ours);
    println!(
        "\nlatency = `ctr run --rm` wall time (create + queue wait + run + delete), mean; wait = time\n\
         queued in mqfqd, mean; slowdown = latency / service; latency × = mqfq-sticky / fcfs\n"
    );
    if let Ok(o) = Command::new(bin.join("mqfqctl"))
        .arg("--socket")
        .arg(&sock)
        .arg("status")
        .output()
    {
        print!("{}", String::from_utf8_lossy(&o.stdout));
    }
    println!(
        "\ndispatch records: {} and {}",
        fcfs_log.display(),
        log.display()
    );
    let pool_ok = match install_cuda(&c, &bin) {
        Some(cuda) => pool_demo(&c, &bin, &cuda) && servers::servers_demo(&c, &cuda, &log, 8),
        None => true,
    };
    mix::stop_daemon(daemon);
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
