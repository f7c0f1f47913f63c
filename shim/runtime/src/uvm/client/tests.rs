use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;

use super::*;

/// A fake interposer answering a script of replies.
fn fake(
    dir: &Path,
    name: &str,
    replies: &'static [&'static str],
) -> std::thread::JoinHandle<Vec<String>> {
    let l = UnixListener::bind(dir.join(name)).unwrap();
    std::thread::spawn(move || {
        let (c, _) = l.accept().unwrap();
        let mut out = c.try_clone().unwrap();
        let mut lines = BufReader::new(c);
        let mut got = Vec::new();
        for r in replies {
            let mut line = String::new();
            if lines.read_line(&mut line).unwrap() == 0 {
                break;
            }
            got.push(line.trim_end().to_owned());
            writeln!(out, "{r}").unwrap();
        }
        got
    })
}

#[test]
fn sums_every_process_removes_stale_sockets_and_keeps_errors() {
    let t = tempfile::tempdir().unwrap();
    let a = fake(t.path(), "cuda-10.sock", &["ok", "ok evicted=100"]);
    let b = fake(t.path(), "cuda-11.sock", &["ok", "ok evicted=23"]);
    let c = fake(
        t.path(),
        "cuda-12.sock",
        &["ok", "error evict: cuMemAdvise_v2 not found"],
    );
    // A process that exited: its socket file is left, nobody listens.
    drop(UnixListener::bind(t.path().join("cuda-13.sock")).unwrap());
    std::fs::write(t.path().join("probe"), "not a socket").unwrap();
    let r = send(t.path(), "c1", Command::Evict, Duration::from_secs(5));
    assert_eq!(r.processes, 2);
    assert_eq!(r.bytes, 123);
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(
        r.errors[0].starts_with("cuda-12.sock: error evict"),
        "{:?}",
        r.errors
    );
    assert!(!r.ok() && !r.timed_out);
    assert_eq!(a.join().unwrap(), ["hello c1", "evict"]);
    assert_eq!(b.join().unwrap(), ["hello c1", "evict"]);
    c.join().unwrap();
    assert!(
        !t.path().join("cuda-13.sock").exists(),
        "stale socket removed"
    );
    assert!(t.path().join("probe").exists());
}

#[test]
fn status_reads_managed_and_resident_and_a_refused_hello_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let a = fake(
        t.path(),
        "cuda-1.sock",
        &["ok", "ok managed=4096 resident=0 native=7 evicted=1"],
    );
    let r = send(t.path(), "c1", Command::Status, Duration::from_secs(5));
    assert_eq!((r.processes, r.bytes, r.resident), (1, 4096, 0));
    a.join().unwrap();
    let b = fake(t.path(), "cuda-2.sock", &["error wrong container c2"]);
    std::fs::remove_file(t.path().join("cuda-1.sock")).unwrap();
    let r = send(t.path(), "c2", Command::Prefetch, Duration::from_secs(5));
    assert_eq!(r.processes, 0);
    assert!(r.errors[0].contains("wrong container"), "{:?}", r.errors);
    b.join().unwrap();
    assert_eq!(
        send(
            &t.path().join("missing"),
            "c",
            Command::Status,
            Duration::from_secs(1)
        ),
        Answer::default()
    );
}

#[test]
fn a_planted_symlink_is_never_connected_to() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("ctl");
    std::fs::create_dir(&dir).unwrap();
    // A host socket the container must not reach through the shim.
    let host = UnixListener::bind(t.path().join("host.sock")).unwrap();
    host.set_nonblocking(true).unwrap();
    std::os::unix::fs::symlink(t.path().join("host.sock"), dir.join("cuda-7.sock")).unwrap();
    let r = send(&dir, "c1", Command::Evict, Duration::from_secs(2));
    assert_eq!(r.processes, 0);
    assert!(
        r.ok(),
        "a planted entry is ignored, not a failure: {:?}",
        r.errors
    );
    assert!(
        host.accept().is_err(),
        "nothing connected to the host socket"
    );
    // A symlinked control directory is not followed either.
    let link = t.path().join("ctl-link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    assert_eq!(
        send(&link, "c1", Command::Status, Duration::from_secs(1)),
        Answer::default()
    );
}

#[test]
fn a_stalled_or_flooding_process_costs_one_deadline_and_no_memory() {
    let t = tempfile::tempdir().unwrap();
    // Stalls: accepts, reads, never answers.
    let stall = UnixListener::bind(t.path().join("cuda-1.sock")).unwrap();
    let s = std::thread::spawn(move || {
        let (c, _) = stall.accept().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        drop(c);
    });
    // Floods: answers hello with a megabyte and no newline.
    let flood = UnixListener::bind(t.path().join("cuda-2.sock")).unwrap();
    let f = std::thread::spawn(move || {
        let (mut c, _) = flood.accept().unwrap();
        let _ = c.write_all(&vec![b'x'; 1 << 20]);
    });
    // Never accepts at all: a listener whose backlog is never served.
    let _idle = UnixListener::bind(t.path().join("cuda-3.sock")).unwrap();
    let started = Instant::now();
    let r = send(t.path(), "c1", Command::Evict, Duration::from_millis(700));
    let took = started.elapsed();
    assert!(took < Duration::from_millis(2500), "{took:?}");
    assert_eq!(r.processes, 0);
    assert!(r.timed_out);
    assert_eq!(r.errors.len(), 3, "{:?}", r.errors);
    assert!(
        r.errors.iter().any(|e| e.contains("longer than")),
        "{:?}",
        r.errors
    );
    s.join().unwrap();
    f.join().unwrap();
}

#[test]
fn figures_are_parsed_strictly_and_summed_saturating() {
    // An older interposer's status: no reasons, its native bytes are "other".
    assert_eq!(
        parse_reply(Command::Status, "ok managed=5 resident=3 native=1"),
        Ok(Figures {
            bytes: 5,
            resident: 3,
            native: crate::memory::Native {
                other: 1,
                ..Default::default()
            },
            shared: 0,
            sharing: 0,
        })
    );
    let full = "ok managed=5 resident=3 native=14 evicted=0 vmm=1 async=2 array=3 setting=4 \
                library=5 export=0 refused=7 shared=2 sharing=1";
    assert_eq!(
        parse_reply(Command::Status, full),
        Ok(Figures {
            bytes: 5,
            resident: 3,
            native: crate::memory::Native {
                vmm: 1,
                stream_ordered: 2,
                array: 3,
                setting: 4,
                library: 5,
                export: 0,
                other: 5,
                refused: 7,
            },
            shared: 2,
            sharing: 1,
        })
    );
    for bad in [
        "ok managed=1 resident=1 library=x",
        "ok managed=1 resident=1 refused=-1",
        "ok managed=1 resident=1 shared=2x",
        "ok managed=-1 resident=0",
        "ok managed=1e9 resident=0",
        "ok managed=18446744073709551616 resident=0",
        "ok managed= resident=0",
        "ok resident=0",
        "okay managed=1 resident=1",
    ] {
        assert!(parse_reply(Command::Status, bad).is_err(), "{bad}");
    }
    let t = tempfile::tempdir().unwrap();
    let a = fake(
        t.path(),
        "cuda-1.sock",
        &["ok", "ok evicted=18446744073709551615"],
    );
    let b = fake(
        t.path(),
        "cuda-2.sock",
        &["ok", "ok evicted=18446744073709551615"],
    );
    let r = send(t.path(), "c1", Command::Evict, Duration::from_secs(5));
    assert_eq!((r.processes, r.bytes), (2, u64::MAX));
    a.join().unwrap();
    b.join().unwrap();
}
