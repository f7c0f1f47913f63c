use super::*;

/// Connections this process has accepted on `port`: its established sockets whose local
/// port is the listener's (counted exactly, so other tests' descriptors in the same
/// process do not count).
fn accepted_on(port: u16) -> usize {
    let ours: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let local = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            // local address, state 01 (established), inode
            w.len() > 9 && w[1].ends_with(&local) && w[3] == "01" && ours.contains(w[9])
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_holds_a_bounded_number_of_connections() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, Arc::new(Metrics::new())));
    // 200 clients that connect and say nothing: the server takes them until it holds
    // MAX_CONNECTIONS (polled; the deadline only ends a hang), and never more.
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let server_side = accepted_on(addr.port());
        assert!(
            server_side <= MAX_CONNECTIONS,
            "{server_side} connections accepted at once"
        );
        if server_side == MAX_CONNECTIONS {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {server_side} connections ever accepted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // Once they go, a real client is served: the cap holds connections, it does not wedge.
    drop(idle);
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").await.unwrap();
    let mut page = String::new();
    c.read_to_string(&mut page).await.unwrap();
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_trickles_its_request_is_cut_off() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, Arc::new(Metrics::new())));
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = tokio::time::Instant::now();
    // One byte every half second would keep a per-read timeout happy for half an hour.
    let mut sent = 0;
    while c.write_all(b"G").await.is_ok() && sent < 4000 {
        sent += 1;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let mut probe = [0u8; 1];
        if let Ok(Ok(0)) =
            tokio::time::timeout(std::time::Duration::from_millis(1), c.read(&mut probe)).await
        {
            break;
        }
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "closed after {:?} ({sent} bytes)",
        started.elapsed()
    );
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new();
    m.record(&[Record::Adopt {
        seq: 0,
        t_ns: 0,
        gpu: 0,
        key: "ns/x".parse().unwrap(),
        function: "x\",gpu=\"9\\".into(),
        tenant: None,
        lease: 1,
    }]);
    let text = m.render();
    assert!(text.contains(r#"function="x\",gpu=\"9\\""#), "{text}");
}

#[test]
fn gpm_series_exist_only_for_gpus_that_report_them() {
    let m = Metrics::new();
    let sample = |index: u32, sm: Option<f64>| crate::monitor::Sample {
        index,
        busy: Some(1.0),
        sm_activity: sm,
        dram_bandwidth: sm.map(|v| v / 2.0),
        ..Default::default()
    };
    m.gpm(&[sample(0, Some(0.3)), sample(1, None)]);
    let text = m.render();
    assert!(
        text.contains("mqfq_gpu_sm_activity_ratio{gpu=\"0\"} 0.3"),
        "{text}"
    );
    assert!(text.contains("mqfq_gpu_dram_bandwidth_ratio{gpu=\"0\"} 0.15"));
    assert!(!text.contains("sm_activity_ratio{gpu=\"1\"}"), "{text}");
    // GPM lost (a sampling failure): the series leaves rather than freezing.
    m.gpm(&[sample(0, None)]);
    assert!(!m.render().contains("sm_activity_ratio{gpu="));
}

#[test]
fn forgotten_functions_leave_the_exposition() {
    let m = Metrics::new();
    for f in ["a", "b"] {
        m.record(&[Record::Adopt {
            seq: 0,
            t_ns: 0,
            gpu: 0,
            key: format!("ns/{f}").parse().unwrap(),
            function: f.into(),
            tenant: None,
            lease: 1,
        }]);
    }
    assert!(m.render().contains("function=\"a\""));
    m.forget_functions(&["a".to_owned()]);
    let text = m.render();
    assert!(!text.contains("function=\"a\""), "{text}");
    assert!(text.contains("function=\"b\""), "{text}");
}

#[test]
fn queue_length_follows_the_dispatch_record() {
    let m = Metrics::new();
    let enq = |k: &str| Record::Enqueue {
        seq: 0,
        t_ns: 0,
        gpu: 0,
        key: k.parse().unwrap(),
        function: "f".into(),
        tenant: None,
        tenant_weight: 1.0,
        weight: 1.0,
        kind: scheduler_core::node::admission::Kind::Start,
    };
    let dispatch = Record::Dispatch {
        seq: 0,
        t_ns: 0,
        gpu: 0,
        key: "ns/a".parse().unwrap(),
        function: "f".into(),
        lease: 1,
        free: 1,
        running: 1,
        limit: 1,
        d: 1.0,
        waited_ns: 2_000_000,
        overdue: true,
    };
    let withdraw = Record::Withdraw {
        seq: 0,
        t_ns: 0,
        gpu: 0,
        key: "ns/b".parse().unwrap(),
        function: "f".into(),
        reason: "cancelled".into(),
    };
    m.record(&[enq("ns/a"), enq("ns/b"), enq("ns/c")]);
    assert!(m.render().contains("mqfq_queue_length{function=\"f\"} 3"));
    m.record(&[dispatch, withdraw]);
    let text = m.render();
    assert!(
        text.contains("mqfq_queue_length{function=\"f\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("mqfq_admitted_total{function=\"f\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("mqfq_overdue_admitted_total{function=\"f\"} 1"),
        "{text}"
    );
}
