//! The burst monitor beside what the application does to its streams and contexts: it never
//! synchronizes while a stream capture is open (that would invalidate it) nor a context that was
//! destroyed (a use after free in a real driver). The libcuda double models both.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

mod common;

use common::Client;

/// A shim that admits every burst at once and tells the test what it was asked.
fn admitting_shim(ctl: &Path) -> mpsc::Receiver<String> {
    let listener = UnixListener::bind(ctl.join("shim.sock")).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok((conn, _)) = listener.accept() else {
            return;
        };
        let mut out = conn.try_clone().unwrap();
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { return };
            if writeln!(out, "ok").is_err() || tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn client(dir: &Path, idle_ms: &str) -> Option<(Client, mpsc::Receiver<String>)> {
    let ctl = dir.join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let shim = admitting_shim(&ctl);
    let mut c = Client::start(
        dir,
        &[
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_BURST", Path::new("1")),
            ("MQFQ_BURST_IDLE_MS", Path::new(idle_ms)),
        ],
    )?;
    c.report();
    Some((c, shim))
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("cuda.log")).unwrap_or_default()
}

/// A stream capture left open for 100 ms inside a burst whose idle time is 5 ms: the monitor
/// waits for it to close before it synchronizes, and the capture ends well (it was invalidated:
/// `cuStreamEndCapture` answered 901).
#[test]
fn a_capture_open_past_the_idle_time_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let Some((mut c, shim)) = client(dir.path(), "5") else {
        return;
    };
    c.send("capture");
    assert_eq!(c.line(), "captured rc=0 end=0", "{}", log(dir.path()));
    assert_eq!(shim.recv_timeout(Duration::from_secs(10)).unwrap(), "begin");
    // The burst still ends once the capture is closed and its work done.
    let end = shim.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(end.starts_with("end "), "{end}");
    assert!(!log(dir.path()).contains("capture invalidated"));
}

/// The application resets its context mid-burst (as `cudaDeviceReset` does): when the burst's
/// idle time is up, the monitor does not make that context current nor synchronize it.
#[test]
fn a_context_reset_mid_burst_is_never_touched_again() {
    let dir = tempfile::tempdir().unwrap();
    // 500 ms of idle before the burst ends: the reset comes well before.
    let Some((mut c, shim)) = client(dir.path(), "500") else {
        return;
    };
    c.send("launch");
    assert_eq!(c.line(), "launched rc=0");
    c.send("reset");
    assert_eq!(c.line(), "reset rc=0");
    assert_eq!(shim.recv_timeout(Duration::from_secs(10)).unwrap(), "begin");
    let end = shim.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(end.starts_with("end "), "{end}");
    let l = log(dir.path());
    assert!(l.contains("reset"), "{l}");
    assert!(!l.contains("used destroyed context"), "{l}");
}

/// The GPU check's program for capture and context resets (`tests/gpu/lifecheck.c`, run on a
/// real driver by `tests/gpu/run.sh`) passes over the double: what it asserts there is what the
/// double models here.
#[test]
fn the_gpu_checks_lifetime_program_passes_over_the_double() {
    let dir = tempfile::tempdir().unwrap();
    if common::built(dir.path(), &["cuda"]).is_none() {
        return;
    }
    let ctl = dir.path().join("ctl");
    std::fs::create_dir_all(&ctl).unwrap();
    let out = common::run_gpu_program(
        &common::gpu_program(dir.path(), "lifecheck"),
        dir.path(),
        &[],
        &[
            ("LD_PRELOAD", &common::interposer()),
            ("FAKE_CUDA_LOG", &dir.path().join("cuda.log")),
            ("MQFQ_CTL_DIR", &ctl),
            ("MQFQ_BURST", Path::new("1")),
        ],
    );
    assert!(out.contains("capture_end 0\n"), "{out}");
    assert!(out.ends_with("lifecheck ok\n"), "{out}");
    let log = log(dir.path());
    assert!(log.contains("graph-launch"), "{log}");
    assert!(!log.contains("capture invalidated"), "{log}");
    assert!(!log.contains("used destroyed context"), "{log}");
}
