//! A process that forks while the interposer is mid-conversation: the child keeps none of the
//! parent's connections, so a parent that dies is seen to die.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

mod common;

use common::Client;

/// A child forked while a thread of its parent waits for the shim's answer to `begin`: when
/// the parent is killed, its burst connection closes (the shim learns it is gone and releases
/// its lease) although the child lives on, and the parent's control socket refuses connections.
/// Before, the child's copies kept both open: the lease was held for as long as the child lived,
/// and a client of the dead parent's socket was connected to nobody.
#[test]
fn a_child_forked_mid_request_keeps_none_of_its_parents_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let done = dir.path().join("done");
    let shim = UnixListener::bind(ctl.join("shim.sock")).unwrap();
    let Some(mut c) = Client::start(
        dir.path(),
        &[
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_BURST", Path::new("1")),
            ("CLIENT_CHILD_DONE", &done),
        ],
    ) else {
        return;
    };
    c.report();
    let parent = c.child.id();
    // A launch on a thread of its own: its begin waits for an answer that does not come.
    c.send("launch-bg");
    assert_eq!(c.line(), "started");
    let (conn, _) = shim.accept().unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut conn = BufReader::new(conn);
    let mut begin = String::new();
    conn.read_line(&mut begin).unwrap();
    assert_eq!(begin, "begin\n");
    // The control socket answers while the parent lives.
    let parent_sock = ctl.join(format!("cuda-{parent}.sock"));
    let mut probe = UnixStream::connect(&parent_sock).unwrap();
    probe
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    writeln!(probe, "hello any").unwrap();
    let mut probe = BufReader::new(probe);
    let mut hello = String::new();
    probe.read_line(&mut hello).unwrap();
    assert_eq!(hello, "ok\n");
    // Forked now, while the begin is in flight.
    c.send("fork");
    let line = c.line();
    assert!(line.starts_with("child rc=0 "), "{line}");
    c.child.kill().unwrap();
    let _ = c.child.wait();
    // The parent is gone, the child lives (it waits for `done`): the parent's connection ends.
    let mut rest = String::new();
    let n = conn
        .read_line(&mut rest)
        .expect("the burst connection outlived its process");
    assert_eq!((n, rest.as_str()), (0, ""));
    assert!(
        UnixStream::connect(&parent_sock).is_err(),
        "the dead parent's control socket still takes connections"
    );
    let mut rest = String::new();
    let n = probe
        .read_line(&mut rest)
        .expect("a control connection outlived its process");
    assert_eq!(n, 0, "{rest:?}");
    std::fs::write(&done, "").unwrap();
}
