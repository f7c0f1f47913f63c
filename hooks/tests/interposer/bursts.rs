//! Burst admission in the interposer against a shim the test plays: a burst's first call waits
//! for the shim, the burst ends only once its work completed, and a missing or vanishing shim
//! never takes the process down.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use super::common::{Client, libc_pollfd, poll};

/// The container's shim, played by the test: its `shim.sock` in the control folder.
struct FakeShim {
    listener: std::os::unix::net::UnixListener,
}

impl FakeShim {
    fn bind(ctl: &Path) -> Self {
        FakeShim {
            listener: std::os::unix::net::UnixListener::bind(ctl.join("shim.sock")).unwrap(),
        }
    }

    /// The next process connection (at most 10 s).
    fn accept(&self) -> BufReader<UnixStream> {
        use std::os::fd::AsRawFd;
        let mut fds = [libc_pollfd(self.listener.as_raw_fd())];
        assert!(poll(&mut fds, 10_000) > 0, "no process connected");
        let (s, _) = self.listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        BufReader::new(s)
    }
}

/// The next request on a burst connection ("" at end of stream).
fn request(conn: &mut BufReader<UnixStream>) -> String {
    let mut l = String::new();
    conn.read_line(&mut l).unwrap();
    l.trim_end().to_owned()
}

fn answer(conn: &mut BufReader<UnixStream>, line: &str) {
    writeln!(conn.get_mut(), "{line}").unwrap();
}

/// Whether the client printed nothing for `ms` (without killing it).
fn quiet_for(c: &Client, ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    if c.stdout.buffer().contains(&b'\n') {
        return false;
    }
    let mut fds = [libc_pollfd(c.stdout.get_ref().as_raw_fd())];
    poll(&mut fds, ms) == 0
}

/// The end of the last kernel the double queued (its "kernel <begin> <end>" lines in `log`).
fn last_kernel_end(log: &Path) -> i64 {
    let name = log.file_stem().and_then(|n| n.to_str()).unwrap_or_default();
    mqfq_testkit::kernel_intervals(log.parent().unwrap(), name)
        .iter()
        .map(|k| k.1)
        .max()
        .unwrap_or(0)
}

#[test]
fn a_burst_waits_for_its_shim_and_ends_only_after_its_work_completed() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let shim = FakeShim::bind(&ctl);
    let Some(mut c) = Client::start(
        dir.path(),
        &[
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_BURST", Path::new("1")),
            ("MQFQ_BURST_IDLE_MS", Path::new("5")),
            // Each kernel runs 150 ms after its launch returns: the burst must outlive the calls.
            ("FAKE_CUDA_KERNEL_MS", Path::new("150")),
        ],
    ) else {
        return;
    };
    // Allocations are not GPU work: no burst yet.
    assert_eq!(c.report().len(), 4);
    c.send("launch");
    let mut conn = shim.accept();
    assert_eq!(request(&mut conn), "begin");
    // Held until the shim grants it.
    assert!(
        quiet_for(&c, 300),
        "the launch ran before its burst was admitted"
    );
    answer(&mut conn, "ok");
    assert_eq!(c.line(), "launched rc=0");
    // Later calls of the burst run at once, without asking again; four threads at once too.
    c.send("launch");
    assert_eq!(c.line(), "launched rc=0");
    c.send("threads");
    assert_eq!(c.line(), "threads rc=0");
    // Two 16-byte copies to the device: the burst's end counts them.
    for _ in 0..2 {
        c.send("copyasync");
        assert_eq!(c.line(), "copied rc=0");
    }
    // The end comes only once the queued kernels have finished on the double's timeline.
    let end = request(&mut conn);
    let now = mqfq_testkit::monotonic_us();
    let (idle_ns, moved): (u64, u64) = end
        .strip_prefix("end ")
        .and_then(|v| v.split_once(' '))
        .and_then(|(i, b)| Some((i.parse().ok()?, b.parse().ok()?)))
        .unwrap_or_else(|| panic!("expected end, got {end:?}"));
    assert_eq!(moved, 32, "{end}");
    let log = dir.path().join("cuda.log");
    let kernels_end = last_kernel_end(&log);
    assert!(kernels_end > 0, "no kernel ran");
    assert!(
        now >= kernels_end,
        "the burst ended at {now} µs, before its work did at {kernels_end} µs"
    );
    // What the process says was idle time lies after the work completed.
    let completed = now - i64::try_from(idle_ns / 1000).unwrap();
    assert!(
        completed >= kernels_end - 1000,
        "{completed} < {kernels_end}"
    );
    answer(&mut conn, "ok");
    // The next burst asks again, on the same connection; four threads at once ask once.
    c.send("threads");
    assert_eq!(request(&mut conn), "begin");
    assert!(quiet_for(&c, 200), "threads ran before admission");
    answer(&mut conn, "ok");
    assert_eq!(c.line(), "threads rc=0");
    // No copy in this burst; and a shim older than the byte count: the process says the
    // two-word end to it, from then on.
    let end = request(&mut conn);
    assert!(end.starts_with("end ") && end.ends_with(" 0"), "{end}");
    answer(&mut conn, "error unknown request");
    let end = request(&mut conn);
    assert_eq!(end.split(' ').count(), 2, "{end}");
    answer(&mut conn, "ok");
    c.send("copyasync");
    assert_eq!(request(&mut conn), "begin");
    answer(&mut conn, "ok");
    assert_eq!(c.line(), "copied rc=0");
    let end = request(&mut conn);
    assert_eq!(end.split(' ').count(), 2, "{end}");
    answer(&mut conn, "ok");
    // A process killed mid-burst: its connection closes, which is how the shim learns.
    c.send("launch");
    assert_eq!(request(&mut conn), "begin");
    answer(&mut conn, "ok");
    assert_eq!(c.line(), "launched rc=0");
    c.child.kill().unwrap();
    let _ = c.child.wait();
    assert_eq!(
        request(&mut conn),
        "",
        "the connection outlived the process"
    );
}

#[test]
fn without_its_shim_a_burst_runs_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let Some(mut c) = Client::start(
        dir.path(),
        &[("MQFQ_CTL_DIR", &ctl), ("MQFQ_BURST", Path::new("1"))],
    ) else {
        return;
    };
    c.report();
    c.send("launch");
    assert_eq!(c.line(), "launched rc=0");
    // A shim that answers an error: the burst runs too.
    let shim = FakeShim::bind(&ctl);
    std::thread::sleep(Duration::from_millis(50));
    c.send("launch");
    // Either still inside the first burst, or a new one asking: answer it with an error.
    let asked = {
        use std::os::fd::AsRawFd;
        let mut fds = [libc_pollfd(shim.listener.as_raw_fd())];
        poll(&mut fds, 2000) > 0
    };
    if asked {
        let mut conn = shim.accept();
        assert_eq!(request(&mut conn), "begin");
        answer(&mut conn, "error daemon says no");
    }
    assert_eq!(c.line(), "launched rc=0");
    c.send("quit");
    let _ = c.child.wait();
    let err = c.stderr();
    assert!(err.contains("burst admission"), "{err}");
}

/// A shim that dies mid-burst: the burst's end goes to a closed socket, which must not kill the
/// application (std sends with MSG_NOSIGNAL: no SIGPIPE, which the client does not ignore),
/// and later bursts run without admission.
#[test]
fn a_shim_that_goes_away_mid_burst_does_not_take_the_process_down() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let shim = FakeShim::bind(&ctl);
    let Some(mut c) = Client::start(
        dir.path(),
        &[
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_BURST", Path::new("1")),
            // The burst outlives the shim: its kernel runs 300 ms after the launch returned.
            ("FAKE_CUDA_KERNEL_MS", Path::new("300")),
        ],
    ) else {
        return;
    };
    c.report();
    c.send("launch");
    let mut conn = shim.accept();
    assert_eq!(request(&mut conn), "begin");
    answer(&mut conn, "ok");
    assert_eq!(c.line(), "launched rc=0");
    // The shim goes away while the burst runs; the socket file goes with it.
    drop(conn);
    drop(shim);
    std::fs::remove_file(ctl.join("shim.sock")).unwrap();
    // Its end is sent into the closed connection; the next burst finds no shim.
    std::thread::sleep(Duration::from_millis(600));
    c.send("launch");
    assert_eq!(
        c.line_within(Duration::from_secs(10)).as_deref(),
        Some("launched rc=0")
    );
    assert!(c.child.try_wait().unwrap().is_none(), "the process died");
    c.send("quit");
    let status = c.child.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", c.stderr());
}
