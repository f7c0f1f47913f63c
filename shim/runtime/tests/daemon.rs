//! `mqfqd` gating real containers: containerd + runc + the shim + the daemon, driven by `ctr`.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod common;
#[path = "daemon/restart.rs"]
mod restart;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use mqfq_shim::api;
use mqfq_testkit::{Containerd, MQFQ, Mqfqd};
use serde_json::Value;

fn containerd(name: &str, env: &[(&str, &str)]) -> Option<Containerd> {
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-mqfq-v2"));
    Containerd::start_with_env(
        &format!("it-{}-{name}", std::process::id()),
        shim.parent()?,
        env,
    )
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A private mqfqd (simulated GPUs, dispatch log) from the binaries built for this test.
fn mqfqd(dir: &Path, socket: &Path, extra: &str) -> Mqfqd {
    Mqfqd::start(
        &mqfq_testkit::daemon_program("mqfqd"),
        &mqfq_testkit::daemon_program("mqfqctl"),
        dir,
        socket,
        extra,
    )
}

/// A containerd and a daemon with a single GPU slot (D = 1), and the containers' shared folder.
fn one_slot(name: &str) -> Option<(Containerd, Mqfqd, PathBuf)> {
    let c = containerd(name, &[])?;
    let d = mqfqd(
        c.dir(),
        &c.daemon_socket(),
        "[concurrency]\nd_max = 1\nd_initial = 1\n",
    );
    let out = c.dir().join("out");
    std::fs::create_dir_all(out.join("run")).unwrap();
    Some((c, d, out))
}

/// `ctr run` of a GPU container through the shim (flags before the image; `-d`/`--rm` and the
/// rest follow).
const GPU_RUN: [&str; 7] = [
    "run",
    "--snapshotter",
    "native",
    "--runtime",
    MQFQ,
    "--env",
    "NVIDIA_VISIBLE_DEVICES=0",
];

/// `ctr run -d` of an annotated GPU container (`sleep 300`), function named after it.
fn gpu_detached(c: &Containerd, id: &str) {
    let function = format!("io.mqfq.function={id}");
    let mut args = GPU_RUN.to_vec();
    args.extend([
        "-d",
        "--annotation",
        &function,
        mqfq_testkit::BUSYBOX,
        id,
        "sleep",
        "300",
    ]);
    let o = c.ctr(&args);
    assert!(o.status.success(), "{}", text(&o));
}

fn leases(s: &Value) -> usize {
    s["leases"].as_array().map_or(0, Vec::len)
}

fn waiting(s: &Value) -> u64 {
    s["waiting"].as_u64().unwrap_or(0)
}

/// `ctr run --rm` of an annotated busybox "GPU function" in a thread.
fn gpu_run(
    c: &Containerd,
    id: &str,
    function: &str,
    out: &Path,
    script: &str,
) -> std::thread::JoinHandle<Output> {
    let sock = c.socket();
    let ns = c.ns.clone();
    let args: Vec<String> = ["-a", sock.to_str().unwrap(), "-n", &ns]
        .into_iter()
        .chain(GPU_RUN)
        .chain([
            "--rm",
            "--env",
            &format!("ID={id}"),
            "--annotation",
            &format!("io.mqfq.function={function}"),
            "--mount",
            &format!("type=bind,src={},dst=/out,options=rbind:rw", out.display()),
            mqfq_testkit::BUSYBOX,
            id,
            "sh",
            "-c",
            script,
        ])
        .map(str::to_owned)
        .collect();
    std::thread::spawn(move || mqfq_testkit::ctr_command().args(&args).output().unwrap())
}

/// Each container marks itself running, waits for the test's go (so nothing finishes before
/// the whole workload is queued, however slow the machine), works, counts how many are marked,
/// unmarks itself.
const WORK: &str = "touch /out/run/$ID; while [ ! -e /out/go ]; do sleep 0.05; done; sleep 0.4; \
                    ls /out/run | wc -l >> /out/counts; rm /out/run/$ID";

/// The function of a dispatch record's flow (`tenant/function`).
fn function_of(r: &Value) -> &str {
    let f = r["function"].as_str().unwrap();
    f.rsplit('/').next().unwrap_or(f)
}

#[test]
fn starts_wait_for_mqfq_sticky_within_d_and_a_flood_cannot_starve_a_light_function() {
    let Some(c) = containerd("gate", &[]) else {
        return;
    };
    let extra = "[simulated]\nutilization_per_lease = 0.5\n[concurrency]\nd_max = 2\nd_initial = 2\n\
                 [queue]\noverrun_s = 0.5\nttl_s = 1.0\nfallback_charge_s = 0.5\nshort_charge_s = 0\n";
    let d = mqfqd(c.dir(), &c.daemon_socket(), extra);
    let out = c.dir().join("out");
    std::fs::create_dir_all(out.join("run")).unwrap();
    // Skewed rates: a flood of 10 at once, 3 of a medium function a little later, then one light.
    let mut runs = Vec::new();
    for i in 0..10 {
        runs.push(gpu_run(&c, &format!("flood{i}"), "flood", &out, WORK));
    }
    d.wait_for("the flood queued", |s| waiting(s) >= 6);
    for i in 0..3 {
        runs.push(gpu_run(&c, &format!("medium{i}"), "medium", &out, WORK));
    }
    d.wait_for("medium queued", |s| waiting(s) >= 8);
    runs.push(gpu_run(&c, "light0", "light", &out, WORK));
    d.wait_for("light queued", |s| waiting(s) >= 12);
    std::fs::write(out.join("go"), "").unwrap();
    for r in runs {
        let o = r.join().unwrap();
        assert!(o.status.success(), "{}\n{}", text(&o), c.log());
    }
    let s = d.wait_for("every lease released", |s| {
        leases(s) == 0 && waiting(s) == 0
    });
    assert_eq!(s["gpus"][0]["running"], 0);

    // (a) Never more than D: the daemon's limit in force, and what the containers saw.
    let records = d.records();
    let dispatches: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "dispatch")
        .collect();
    assert_eq!(dispatches.len(), 14, "{records:#?}");
    for r in &dispatches {
        let (running, limit) = (r["running"].as_u64().unwrap(), r["limit"].as_u64().unwrap());
        assert!(running <= limit && limit <= 2, "{r}");
    }
    let counts = std::fs::read_to_string(out.join("counts")).unwrap();
    assert_eq!(counts.lines().count(), 14);
    for n in counts.lines() {
        assert!(n.trim().parse::<u32>().unwrap() <= 2, "{counts}");
    }

    // (b) The order is MQFQ-Sticky's: replaying the record through scheduler-core gives the same
    // dispatch at every step.
    common::replay(&records, d.config());

    // (c) The light function is not starved: it is dispatched while most of the flood still
    // waits (FCFS would run every flood container first).
    let order: Vec<&str> = dispatches.iter().map(|r| function_of(r)).collect();
    let light = order.iter().position(|f| *f == "light").unwrap();
    let flood_after = order[light..].iter().filter(|f| **f == "flood").count();
    assert!(flood_after >= 3, "{order:?}");
    let first_medium = order.iter().position(|f| *f == "medium").unwrap();
    assert!(
        order[first_medium..]
            .iter()
            .filter(|f| **f == "flood")
            .count()
            >= 3,
        "{order:?}"
    );

    // A malformed annotation is refused at Create, before the queue sees anything.
    let o = c.run(
        MQFQ,
        "bad",
        &[
            "--env",
            "NVIDIA_VISIBLE_DEVICES=0",
            "--annotation",
            "io.mqfq.weight=heavy",
        ],
        &["true"],
    );
    assert!(!o.status.success());
    assert!(text(&o).contains("io.mqfq.weight"), "{}", text(&o));
    assert_eq!(d.records().len(), records.len(), "the queue saw nothing");
    let _ = c.ctr(&["containers", "rm", "bad"]);
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "every malformed frame and request, then proof nothing changed"
)]
fn malformed_frames_and_requests_get_clear_errors_and_change_nothing() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let sock = dir.path().join("d.sock");
    let d = mqfqd(dir.path(), &sock, "");
    // Garbage, a truncated frame, and a frame with an oversized length.
    for bytes in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        &[0, 0, 0, 9, 0, 0, 0, 1, 1][..],
        &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 1, 1, 0][..],
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        let _ = s.write_all(bytes);
        drop(s);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = mqfq_daemon::ctl::connect(&sock).await.unwrap();
        let ctx = || ttrpc::context::with_timeout(5_000_000_000);
        let good = api::AdmitRequest {
            namespace: "ns".into(),
            container_id: "c1".into(),
            function: "f".into(),
            shim_pid: std::process::id(),
            ..Default::default()
        };
        let cases: Vec<(api::AdmitRequest, &str)> = vec![
            (
                api::AdmitRequest {
                    container_id: String::new(),
                    ..good.clone()
                },
                "container_id",
            ),
            (
                api::AdmitRequest {
                    namespace: String::new(),
                    ..good.clone()
                },
                "namespace",
            ),
            (
                api::AdmitRequest {
                    function: String::new(),
                    ..good.clone()
                },
                "function",
            ),
            (
                api::AdmitRequest {
                    weight: -2.0,
                    ..good.clone()
                },
                "weight",
            ),
            (
                api::AdmitRequest {
                    weight: f64::INFINITY,
                    ..good.clone()
                },
                "weight",
            ),
            (
                api::AdmitRequest {
                    gpus: vec!["GPU-nope".into()],
                    ..good.clone()
                },
                "GPU-nope",
            ),
            (
                api::AdmitRequest {
                    kind: protobuf::EnumOrUnknown::from_i32(7),
                    ..good.clone()
                },
                "kind",
            ),
            (
                api::AdmitRequest {
                    pooled: true,
                    warm: "criu".into(),
                    ..good.clone()
                },
                "warm",
            ),
        ];
        for (req, field) in cases {
            match c.admit(ctx(), &req).await {
                Err(ttrpc::Error::RpcStatus(s)) => {
                    assert_eq!(s.code(), ttrpc::Code::INVALID_ARGUMENT, "{s:?}");
                    assert!(s.message.contains(field), "{field}: {}", s.message);
                }
                other => panic!("{field}: {other:?}"),
            }
        }
        let r = c
            .release(
                ctx(),
                &api::ReleaseRequest {
                    lease_id: 42,
                    ..Default::default()
                },
            )
            .await;
        assert!(matches!(r, Err(ttrpc::Error::RpcStatus(s)) if s.code() == ttrpc::Code::NOT_FOUND));
        // The pool's RPCs: bad fields are named; a report about an unknown container and a
        // poll with nothing to hand out change nothing.
        let code = |r: ttrpc::Result<_>, field: &str| match r {
            Err(ttrpc::Error::RpcStatus(s)) => {
                assert_eq!(s.code(), ttrpc::Code::INVALID_ARGUMENT, "{s:?}");
                assert!(s.message.contains(field), "{field}: {}", s.message);
            }
            other => panic!("{field}: {other:?}"),
        };
        let orders = |pid: u32| api::PoolOrdersRequest {
            shim_pid: pid,
            wait_ms: 50,
            ..Default::default()
        };
        code(
            c.pool_orders(ctx(), &orders(0)).await.map(|_| ()),
            "shim_pid",
        );
        let none = c
            .pool_orders(ctx(), &orders(std::process::id()))
            .await
            .unwrap();
        assert!(none.orders.is_empty());
        let result = api::PoolResult {
            namespace: "ns".into(),
            container_id: "nobody".into(),
            ok: true,
            ..Default::default()
        };
        let report = |r: api::PoolResult| api::PoolReportRequest {
            shim_pid: std::process::id(),
            results: vec![r],
            ..Default::default()
        };
        let bad_action = api::PoolResult {
            action: protobuf::EnumOrUnknown::from_i32(9),
            ..result.clone()
        };
        code(
            c.pool_report(ctx(), &report(bad_action)).await.map(|_| ()),
            "results[0].action",
        );
        let no_id = api::PoolResult {
            container_id: String::new(),
            ..result.clone()
        };
        code(
            c.pool_report(ctx(), &report(no_id)).await.map(|_| ()),
            "results[0]",
        );
        // One report may carry at most 4096 results (each is one order's answer).
        let flood = api::PoolReportRequest {
            shim_pid: std::process::id(),
            results: vec![result.clone(); 4097],
            ..Default::default()
        };
        code(c.pool_report(ctx(), &flood).await.map(|_| ()), "results");
        c.pool_report(ctx(), &report(result)).await.unwrap();
        // The good request still works after all that.
        let ok = c.admit(ctx(), &good).await.unwrap();
        c.release(
            ctx(),
            &api::ReleaseRequest {
                lease_id: ok.lease_id,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    });
    let s = d.status();
    assert_eq!((leases(&s), waiting(&s)), (0, 0));
    let records = d.records();
    assert_eq!(
        records
            .iter()
            .map(|r| r["event"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["enqueue", "dispatch", "release"],
        "bad requests changed nothing"
    );
}

#[test]
fn pause_gives_the_slot_back_and_resume_waits_for_it() {
    let Some((c, d, _)) = one_slot("pause") else {
        return;
    };
    gpu_detached(&c, "frozen");
    d.wait_for("frozen admitted", |s| leases(s) == 1);
    // OpenWhisk's pause (Knative's container freezer does the same): the slot goes back.
    assert!(c.ctr(&["task", "pause", "frozen"]).status.success());
    d.wait_for("the paused container's lease released", |s| leases(s) == 0);
    gpu_detached(&c, "busy");
    d.wait_for("busy admitted", |s| leases(s) == 1);
    // Resume waits in the queue while the only slot is busy.
    let sock = c.socket();
    let ns = c.ns.clone();
    let resume = std::thread::spawn(move || {
        mqfq_testkit::ctr_command()
            .arg("-a")
            .arg(&sock)
            .args(["-n", &ns, "task", "resume", "frozen"])
            .output()
            .unwrap()
    });
    d.wait_for("the resume queued", |s| waiting(s) == 1 && leases(s) == 1);
    assert!(
        c.wait_status("frozen", "PAUSED"),
        "still frozen while it waits"
    );
    assert!(
        c.ctr(&["task", "kill", "-s", "SIGKILL", "busy"])
            .status
            .success()
    );
    let o = resume.join().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(c.wait_status("frozen", "RUNNING"));
    let s = d.wait_for("frozen holds the slot", |s| {
        leases(s) == 1 && waiting(s) == 0
    });
    assert_eq!(s["leases"][0]["container_id"], "frozen");
    let kinds: Vec<String> = d
        .records()
        .iter()
        .filter(|r| r["event"] == "enqueue")
        .map(|r| {
            format!(
                "{}:{}",
                r["key"].as_str().unwrap().rsplit('/').next().unwrap(),
                r["kind"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(kinds, ["frozen:start", "busy:start", "frozen:resume"]);
    for id in ["frozen", "busy"] {
        let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        assert!(c.wait_status(id, "STOPPED"));
        assert!(c.ctr(&["task", "delete", id]).status.success());
        assert!(c.ctr(&["containers", "rm", id]).status.success());
    }
    d.wait_for("nothing held", |s| leases(s) == 0 && waiting(s) == 0);
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}

/// A slot that is never given back (a leaked lease, a stuck container) does not hang later
/// starts of GPU containers without the interposer: past `MQFQ_ADMIT_TIMEOUT_MS` the waiting
/// admission is withdrawn and the container starts anyway, logged and counted, whatever the
/// fail mode — the queue never makes a pod fail to start.
#[test]
fn a_start_never_waits_past_its_admission_deadline() {
    for fail in ["open", "closed"] {
        let Some(c) = containerd(
            &format!("deadline-{fail}"),
            &[("MQFQ_ADMIT_TIMEOUT_MS", "1500"), ("MQFQ_FAIL", fail)],
        ) else {
            return;
        };
        let d = mqfqd(
            c.dir(),
            &c.daemon_socket(),
            "restart_grace_ms = 0\n[concurrency]\nd_max = 1\nd_initial = 1\n",
        );
        gpu_detached(&c, "holder");
        d.wait_for("the holder admitted", |s| leases(s) == 1);
        let started = Instant::now();
        let o = c.run(
            MQFQ,
            "late",
            &["--env", "NVIDIA_VISIBLE_DEVICES=0"],
            &["true"],
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{fail}: {:?}",
            started.elapsed()
        );
        assert!(o.status.success(), "{fail}: {}", text(&o));
        assert!(c.log().contains("no GPU slot within 1s"), "{}", c.log());
        d.wait_for("the start past its deadline reported", |s| {
            s["fail_open_starts"] == 1
        });
        // The withdrawn admission left nothing waiting.
        d.wait_for("nothing waiting", |s| waiting(s) == 0 && leases(s) == 1);
        assert!(
            c.ctr(&["task", "kill", "-s", "SIGKILL", "holder"])
                .status
                .success()
        );
        assert!(c.wait_status("holder", "STOPPED"));
        assert!(c.ctr(&["task", "delete", "holder"]).status.success());
        assert!(c.ctr(&["containers", "rm", "holder"]).status.success());
        d.wait_for("no lease left", |s| leases(s) == 0);
        assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
    }
}

/// A Release the daemon could not take (it was stopped) is not lost: the shim keeps it and
/// delivers it once the daemon answers again, so no lease outlives its container.
#[test]
fn a_release_the_daemon_missed_is_delivered_later() {
    let Some((c, d, out)) = one_slot("lostrelease") else {
        return;
    };
    let run = gpu_run(&c, "brief", "f", &out, "sleep 1");
    d.wait_for("admitted", |s| leases(s) == 1);
    let pid = d.pid().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // The container exits while the daemon cannot answer; its Release times out in the shim.
    let o = run.join().unwrap();
    let cont = Command::new("kill").args(["-CONT", &pid]).status().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(cont.success());
    d.wait_for("the lease released after all", |s| leases(s) == 0);
    assert!(c.leftovers().is_empty(), "{:?}", c.leftovers());
}
