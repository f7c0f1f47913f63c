//! The `mqfq-sim` binary end to end: real files, real process, real exit codes.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mqfq-sim"))
}

/// A scratch directory removed when the test ends, pass or fail.
fn tmp(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("mqfq-sim-cli-{name}-"))
        .tempdir()
        .unwrap()
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("mqfq-sim runs");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "panic: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn gen_mix(dir: &Path) -> PathBuf {
    let trace = dir.join("mix.csv");
    let o = run(bin()
        .args(["gen", "mix", "--duration-s", "120", "--seed", "7", "--out"])
        .arg(&trace));
    assert!(o.status.success(), "{}", stderr(&o));
    trace
}

#[test]
fn run_writes_one_row_per_invocation_and_a_json_summary() {
    let scratch = tmp("run");
    let dir = scratch.path();
    let trace = gen_mix(dir);
    let rows = fs::read_to_string(&trace).unwrap().lines().count() - 1;
    let per = dir.join("per.csv");
    let o = run(bin()
        .args(["run", "--policy", "mqfq-sticky", "--trace"])
        .arg(&trace)
        .arg("--per-invocation")
        .arg(&per));
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    assert_eq!(summary["invocations"].as_u64(), Some(rows as u64));
    for key in [
        "mean_ms",
        "p50_ms",
        "p99_ms",
        "jain_slowdown",
        "gpu_busy",
        "throughput_per_s",
    ] {
        assert!(summary[key].as_f64().is_some(), "summary lacks {key}");
    }
    assert!(
        summary["per_function"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    );
    let t = &summary["tiers"];
    let tiers: u64 = ["hot", "warm", "cold"]
        .iter()
        .map(|k| t[k].as_u64().unwrap())
        .sum();
    assert_eq!(tiers, rows as u64);
    let csv = fs::read_to_string(&per).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("function,arrival_ms,start_ms,end_ms,tier")
    );
    let body: Vec<&str> = lines.collect();
    assert_eq!(body.len(), rows);
    for l in body {
        let f: Vec<&str> = l.split(',').collect();
        let (a, s, e): (f64, f64, f64) = (
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        );
        assert!(a <= s + 1e-3 && s < e, "{l}");
        assert!(["hot", "warm", "cold"].contains(&f[4]), "{l}");
    }
}

#[test]
fn compare_prints_every_policy_and_draws_the_cdf() {
    let scratch = tmp("compare");
    let dir = scratch.path();
    let trace = gen_mix(dir);
    let svg = dir.join("cdf.svg");
    let json = dir.join("all.json");
    let o = run(bin()
        .arg("compare")
        .arg("--trace")
        .arg(&trace)
        .arg("--plot")
        .arg(&svg)
        .arg("--json")
        .arg(&json));
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    for p in [
        "fcfs",
        "batch",
        "sjf",
        "paella",
        "mqfq-paper",
        "mqfq-sticky",
    ] {
        assert!(table.contains(&format!("| {p} |")), "{p} missing:\n{table}");
    }
    assert!(table.contains("mqfq-sticky / fcfs"), "{table}");
    let svg = fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg"));
    for p in ["fcfs", "mqfq-sticky"] {
        assert!(svg.contains(p), "legend lacks {p}");
    }
    let all: serde_json::Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(all.as_array().map(Vec::len), Some(6));
}

#[test]
fn bad_traces_fail_with_the_line_number() {
    let scratch = tmp("bad");
    let dir = scratch.path();
    let cases = [
        (
            "time_ms,function,exec_ms\n0,a,1\n",
            "line 1: missing required column `mem_mb`",
        ),
        (
            "time_ms,function,exec_ms,mem_mb\n5,a,1,1\n3,a,1,1\n",
            "line 3: rows must be sorted",
        ),
        (
            "time_ms,function,exec_ms,mem_mb\n-5,a,1,1\n",
            "line 2: column `time_ms`: -5 is negative",
        ),
    ];
    for (i, (text, needle)) in cases.iter().enumerate() {
        let trace = dir.join(format!("t{i}.csv"));
        fs::write(&trace, text).unwrap();
        let o = run(bin()
            .args(["run", "--policy", "fcfs", "--trace"])
            .arg(&trace)
            .arg("--per-invocation")
            .arg(dir.join("o.csv")));
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains(needle),
            "want {needle:?} in {}",
            stderr(&o)
        );
    }
    let trace = dir.join("ok.csv");
    fs::write(&trace, "time_ms,function,exec_ms,mem_mb\n0,a,1,1\n").unwrap();
    let o = run(bin()
        .args(["run", "--policy", "lottery", "--trace"])
        .arg(&trace)
        .arg("--per-invocation")
        .arg(dir.join("o.csv")));
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown policy `lottery`"),
        "{}",
        stderr(&o)
    );
    let o = run(bin()
        .args(["run", "--policy", "fcfs", "--mode", "vgpu", "--trace"])
        .arg(&trace)
        .arg("--per-invocation")
        .arg(dir.join("o.csv")));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("`mode`"), "{}", stderr(&o));
    let o = run(bin()
        .args(["run", "--policy", "fcfs", "--trace"])
        .arg(dir.join("missing.csv"))
        .arg("--per-invocation")
        .arg(dir.join("o.csv")));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("missing.csv"), "{}", stderr(&o));
}

#[test]
fn azure_converter_end_to_end() {
    let scratch = tmp("azure");
    let dir = scratch.path();
    let inv = dir.join("inv.csv");
    let dur = dir.join("dur.csv");
    fs::write(
        &inv,
        "HashOwner,HashApp,HashFunction,Trigger,1,2\no,app,fn1,http,3,2\n",
    )
    .unwrap();
    fs::write(
        &dur,
        "HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum,percentile_Average_0,percentile_Average_1,percentile_Average_25,percentile_Average_50,percentile_Average_75,percentile_Average_99,percentile_Average_100\n\
         o,app,fn1,100,5,50,900,50,50,80,100,120,150,160\n",
    )
    .unwrap();
    let out = dir.join("trace.csv");
    let o = run(bin()
        .args(["gen", "azure", "--minutes", "2", "--invocations"])
        .arg(&inv)
        .arg("--durations")
        .arg(&dur)
        .arg("--out")
        .arg(&out));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 1 + 5);
    let per = dir.join("per.csv");
    let o = run(bin()
        .args(["run", "--policy", "sjf", "--trace"])
        .arg(&out)
        .arg("--per-invocation")
        .arg(&per));
    assert!(o.status.success(), "{}", stderr(&o));
}

/// `controllers` over a table in the GPU check's format (as `tests/gpu/run.sh` writes it from
/// concbench's lines, `nan` where a GPU has no GPM): one row per law, busy-time pinned at 1.
#[test]
fn controllers_replays_each_law_over_a_measured_table() {
    let dir = tmp("controllers");
    let table = dir.path().join("conc-procs.csv");
    fs::write(
        &table,
        "streams,busy,sm,dram,bursts_per_s,burst_ms\n1,0.980,nan,nan,240.0,2.10\n\
         2,1.000,nan,nan,470.0,2.15\n4,1.000,nan,nan,520.0,3.90\n8,1.000,nan,nan,520.0,7.80\n",
    )
    .unwrap();
    let o = run(bin()
        .args(["controllers", "--table"])
        .arg(&table)
        .args(["--samples", "400"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| busy-time | 1.00 | 1–1 |"), "{out}");
    assert!(out.contains("| interference |"), "{out}");
    assert!(!out.contains("interference+gpm"), "no SM column: {out}");
    // A table without the one-invocation row is refused with a message.
    fs::write(
        &table,
        "streams,busy,sm,dram,bursts_per_s,burst_ms\n2,1,nan,nan,1,1\n",
    )
    .unwrap();
    let o = run(bin().args(["controllers", "--table"]).arg(&table));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("streams = 1"), "{}", stderr(&o));
}

#[test]
fn cluster_compares_node_choices_and_refuses_nodes_that_do_not_divide_the_gpus() {
    let dir = tmp("cluster");
    let trace = gen_mix(dir.path());
    let o = run(bin().args(["cluster", "--trace"]).arg(&trace).args([
        "--gpus",
        "2",
        "--nodes",
        "2",
        "--gpu-models",
        "NVIDIA A30,NVIDIA H100 80GB HBM3",
    ]));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for mode in ["| extender |", "| round-robin |", "| random |"] {
        assert!(out.contains(mode), "{out}");
    }
    assert!(out.contains("API writes / node / min"), "{out}");
    let o = run(bin()
        .args(["cluster", "--trace"])
        .arg(&trace)
        .args(["--gpus", "3", "--nodes", "2"]));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("nodes"), "{}", stderr(&o));
}

/// `placements` runs every placement side by side: a `--placement` there (which it had
/// accepted and ignored) is refused, naming the flag and the command that runs one.
#[test]
fn placements_refuses_a_placement_it_would_ignore() {
    let scratch = tmp("placements");
    let trace = gen_mix(scratch.path());
    let o = run(bin()
        .args(["placements", "--placement", "fitness", "--trace"])
        .arg(&trace));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("--placement fitness") && e.contains("run --placement"),
        "{e}"
    );
}

/// `--fixed-d` holds D (every policy with a dynamic D runs at that limit: the summary's mean D
/// is it) and `--order fifo` runs mqfq-sticky's core in arrival order, so a gap to FCFS can be
/// split into what D, the order and the memory each do. Bad values name their flag.
#[test]
fn fixed_d_and_order_split_a_gap_into_its_parts() {
    let scratch = tmp("split");
    let dir = scratch.path();
    let trace = gen_mix(dir);
    let summary = |extra: &[&str]| -> serde_json::Value {
        let o = run(bin()
            .args(["run", "--trace"])
            .arg(&trace)
            .arg("--per-invocation")
            .arg(dir.join("per.csv"))
            .args(extra));
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    for policy in ["mqfq-sticky", "fcfs"] {
        let s = summary(&["--policy", policy, "--fixed-d", "2"]);
        assert_eq!(s["mean_d"].as_f64(), Some(2.0), "{policy}: {s}");
    }
    let sticky = summary(&["--policy", "mqfq-sticky", "--fixed-d", "2"]);
    let fifo = summary(&[
        "--policy",
        "mqfq-sticky",
        "--fixed-d",
        "2",
        "--order",
        "fifo",
    ]);
    assert_eq!(fifo["invocations"], sticky["invocations"]);
    assert_ne!(
        fifo["mean_ms"], sticky["mean_ms"],
        "the order changed nothing"
    );
    for (flags, named) in [
        (&["--order", "lifo"][..], "--order"),
        (&["--fixed-d", "0"][..], "fixed_d"),
        (&["--fixed-d", "2", "--d-max", "4"][..], "fixed_d"),
    ] {
        let o = run(bin()
            .args(["run", "--policy", "mqfq-sticky", "--trace"])
            .arg(&trace)
            .arg("--per-invocation")
            .arg(dir.join("per.csv"))
            .args(flags));
        assert!(!o.status.success(), "{flags:?}");
        assert!(stderr(&o).contains(named), "{flags:?}: {}", stderr(&o));
    }
}
