//! The Grafana dashboard (`packaging/grafana/mqfq-dashboard.json`) queries only what mqfqd
//! exports: every `mqfq_*` series in its expressions is a family of `/metrics` used with its
//! kind's suffix (a counter's `_total`, a histogram's `_bucket` / `_sum` / `_count`, a gauge
//! bare), and every label it groups by is one that family carries in a live daemon's exposition
//! (a simulated node that admitted and ended work), where that family has samples there.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use std::time::Duration;

use mqfq_proto::api;
use serde_json::Value;

/// Family name → kind, from `# TYPE` lines.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect()
}

/// Sample name → the label names it was seen with.
fn labels(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = l.find(['{', ' ']).unwrap_or(l.len());
        let e = out.entry(l[..name_end].to_owned()).or_default();
        if let Some(rest) = l[name_end..].strip_prefix('{') {
            for pair in rest.split(',') {
                if let Some((k, _)) = pair.split_once('=') {
                    e.insert(k.trim_matches('}').to_owned());
                }
            }
        }
    }
    out
}

/// The family a sample name belongs to, if its suffix fits the family's kind.
fn family_of(sample: &str, fams: &BTreeMap<String, String>) -> Option<String> {
    if fams.get(sample).is_some_and(|k| k == "gauge") {
        return Some(sample.to_owned());
    }
    for (suffix, kind) in [
        ("_total", "counter"),
        ("_bucket", "histogram"),
        ("_sum", "histogram"),
        ("_count", "histogram"),
    ] {
        if let Some(base) = sample.strip_suffix(suffix)
            && fams.get(base).is_some_and(|k| k == kind)
        {
            return Some(base.to_owned());
        }
    }
    None
}

/// The `mqfq_*` names in an expression, and the label names after `by (` or before `=~`/`=`.
fn names_in(expr: &str) -> (Vec<String>, Vec<String>) {
    let mut names = Vec::new();
    let mut by = Vec::new();
    let mut i = 0;
    while let Some(at) = expr[i..].find("mqfq_") {
        let start = i + at;
        let end = start
            + expr[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(expr.len() - start);
        names.push(expr[start..end].to_owned());
        i = end;
    }
    let mut rest = expr;
    while let Some(at) = rest.find("by (") {
        let after = &rest[at + 4..];
        let close = after.find(')').unwrap();
        by.extend(after[..close].split(',').map(|s| s.trim().to_owned()));
        rest = &after[close..];
    }
    by.retain(|l| l != "le");
    (names, by)
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one daemon's scrape checked against every dashboard query"
)]
fn every_series_the_dashboard_queries_is_exported() {
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    let addr = mqfq_testkit::free_metrics_addr();
    let (cfg, sock) = common::write_config(
        dir.path(),
        &format!(
            "metrics_addr = \"{addr}\"\nbackend = \"simulated\"\nrestart_grace_ms = 0\n\
             [nvidia]\nedits = false\n[placement]\nenabled = true\n"
        ),
    );
    let log = dir.path().join("mqfqd.log");
    let child = common::serving(&cfg, &sock, &log, &[]);
    // Work of a few kinds, so the labelled series exist: admissions that wait and end, a
    // placement.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = mqfq_daemon::ctl::connect(&sock).await.unwrap();
        let ctx = || ttrpc::context::with_timeout(5_000_000_000);
        for i in 0..3 {
            let req = api::AdmitRequest {
                namespace: "t".into(),
                container_id: format!("c{i}"),
                function: "f".into(),
                shim_pid: std::process::id(),
                ..Default::default()
            };
            let lease_id = c.admit(ctx(), &req).await.unwrap().lease_id;
            c.release(
                ctx(),
                &api::ReleaseRequest {
                    lease_id,
                    service_ns: 10_000_000,
                    reason: "exit".into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        }
        let _ = c
            .place(
                ctx(),
                &api::AdmitRequest {
                    namespace: "t".into(),
                    container_id: "p".into(),
                    function: "f".into(),
                    shim_pid: std::process::id(),
                    ..Default::default()
                },
            )
            .await;
    });
    std::thread::sleep(Duration::from_millis(300));
    let text = mqfq_testkit::scrape(&addr);
    common::stop(child);

    // Every family's name and kind (an empty family prints nothing in a live exposition);
    // the labels they carry, from the live one.
    let fams = families(&mqfq_daemon::metrics::Metrics::new().every_family_for_tests());
    assert!(families(&text).iter().all(|(n, k)| fams.get(n) == Some(k)));
    let seen = labels(&text);
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../packaging/grafana/mqfq-dashboard.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    let mut grouped = 0;
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let (names, by) = names_in(expr);
            assert!(!names.is_empty(), "{expr}");
            for n in names {
                let fam = family_of(&n, &fams).unwrap_or_else(|| {
                    panic!(
                        "{:?}: {n} is no series mqfqd exports ({fams:?})",
                        p["title"]
                    )
                });
                checked += 1;
                // Labels are checked where the daemon above made samples of the family.
                let carried: BTreeSet<String> = seen
                    .iter()
                    .filter(|(s, _)| family_of(s, &fams).as_deref() == Some(fam.as_str()))
                    .flat_map(|(_, l)| l.iter().cloned())
                    .collect();
                if carried.is_empty() {
                    continue;
                }
                for l in by.iter().chain(std::iter::once(&"instance".to_owned())) {
                    if l == "instance" {
                        continue; // added by Prometheus at scrape time
                    }
                    assert!(
                        carried.contains(l),
                        "{:?}: {fam} has no label {l} ({carried:?})",
                        p["title"]
                    );
                    grouped += 1;
                }
            }
        }
    }
    assert!(checked >= 20, "{checked}");
    assert!(grouped >= 5, "{grouped}");
}
