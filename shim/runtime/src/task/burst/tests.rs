//! The burst book, its parser and its socket, without containerd.

use super::*;

#[test]
fn requests_parse_strictly() {
    assert_eq!(parse(b"begin"), Ok(Request::Begin));
    assert_eq!(
        parse(b"end 1500"),
        Ok(Request::End(Duration::from_nanos(1500), None))
    );
    assert_eq!(
        parse(b"end 0 4096"),
        Ok(Request::End(Duration::ZERO, Some(4096)))
    );
    for bad in [
        &b""[..],
        b"begin ",
        b"begin now",
        b"end",
        b"end ",
        b"end -1",
        b"end +5",
        b"end 007",
        b"end 1 2 3",
        b"end 1 ",
        b"end 1 02",
        b"end 1 -2",
        b"end 1 99999999999999999999",
        b"end 99999999999999999999999",
        b"hello c1",
        b"\xff",
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn one_lease_per_container_released_when_the_last_process_is_done() {
    let b = Book::default();
    let peer = |pid| Peer { pid, start: 7 };
    let (p1, p2) = (
        b.open(Some(peer(101))).unwrap(),
        b.open(Some(peer(102))).unwrap(),
    );
    // p1 asks; p2 begins while the admission is in flight and waits for it too.
    assert_eq!(b.begin(p1), (false, true, 0));
    assert_eq!(b.begin(p2), (false, false, 0));
    assert!(b.answer(p1, 0).is_none());
    assert!(!b.admitted(None));
    assert_eq!(b.answer(p1, 0), Some(Ok(())));
    assert_eq!(b.answer(p2, 0), Some(Ok(())));
    assert!(b.busy());
    let granted = match b.lock().lease {
        Lease::Held(t) => t,
        l => panic!("{l:?}"),
    };
    // p1 ends: p2 still runs, nothing released.
    assert_eq!(
        b.end(p1, Some(granted + Duration::from_millis(30)), Some(1000)),
        After::Nothing
    );
    // p2 ends, its work done earlier than p1's: charged to the latest completion; the
    // bytes of both, and both processes, go with the release.
    assert_eq!(
        b.end(p2, Some(granted + Duration::from_millis(10)), Some(24)),
        After::Release(Ended {
            service: Duration::from_millis(30),
            transfer_bytes: Some(1024),
            peers: vec![peer(101), peer(102)],
        })
    );
    assert!(!b.busy());
    // A later joiner of a held lease gets it at once; the next burst starts its count
    // afresh, and a process that counted nothing leaves it unknown.
    assert_eq!(b.begin(p1), (false, true, 1));
    b.admitted(None);
    assert_eq!(b.answer(p1, 1), Some(Ok(())));
    assert!(b.begin(p2).0);
    assert_eq!(b.end(p2, None, None), After::Nothing);
    match b.end(p1, None, None) {
        After::Release(r) => {
            assert_eq!(
                (r.transfer_bytes, r.peers),
                (None, vec![peer(101), peer(102)])
            );
        }
        a => panic!("{a:?}"),
    }
}

#[test]
fn a_waiter_that_goes_away_leaves_no_lease_behind() {
    let b = Book::default();
    let p = b.open(None).unwrap();
    b.begin(p);
    assert_eq!(b.end(p, None, None), After::Nothing);
    // The grant arrives after everyone left: it must be released at once.
    assert!(b.admitted(None));
    assert!(!b.busy());
    // A refused admission answers every waiter with the reason.
    b.begin(p);
    b.admitted(Some("no".into()));
    assert_eq!(b.answer(p, 1), Some(Err("no".into())));
    assert!(!b.busy());
    // A process killed mid-burst releases the lease (charged until now).
    b.begin(p);
    b.admitted(None);
    b.answer(p, 2);
    assert!(matches!(b.end(p, None, None), After::Release(_)));
    b.released();
    // One that dies after the grant, before it was answered: released too, not leaked.
    b.begin(p);
    b.admitted(None);
    assert!(matches!(b.end(p, None, None), After::Release(_)));
    assert!(!b.busy());
}

#[tokio::test]
async fn a_peer_is_known_by_what_the_kernel_says_and_checked_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let l = tokio::net::UnixListener::from_std(bind(dir.path()).unwrap()).unwrap();
    let _client = std::os::unix::net::UnixStream::connect(dir.path().join(SOCKET)).unwrap();
    let (server, _) = l.accept().await.unwrap();
    let me = peer(&server).unwrap();
    assert_eq!(me.pid, std::process::id());
    assert_eq!(Some(me.start), start_time(std::process::id()));
    // The report keeps a process that is still the one that connected, and drops a PID
    // whose process is gone or was replaced (another start time).
    let ended = |peers| Ended {
        service: Duration::ZERO,
        transfer_bytes: None,
        peers,
    };
    assert_eq!(ended(vec![me]).report().pids, vec![me.pid]);
    let reused = Peer {
        start: me.start + 1,
        ..me
    };
    assert!(ended(vec![reused]).report().pids.is_empty());
    let gone = Peer {
        pid: u32::MAX - 1,
        start: 1,
    };
    assert!(ended(vec![gone]).report().pids.is_empty());
}

/// containerd runs its shims under umask 022, which would leave the socket 0755: only host
/// root could connect, and a container running as any other user (`runAsUser`, a user
/// namespace) would run its GPU work unadmitted.
#[test]
fn the_socket_is_open_to_every_uid_whatever_the_umask() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let bound = bind(dir.path());
    nix::sys::stat::umask(old);
    let _l = bound.unwrap();
    let meta = std::fs::symlink_metadata(dir.path().join(SOCKET)).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, SOCKET_MODE);
}

#[test]
fn a_burst_sends_at_most_max_burst_pids_processes() {
    let b = Book::default();
    let first = b.open(Some(Peer { pid: 1, start: 1 })).unwrap();
    assert_eq!(b.begin(first), (false, true, 0));
    b.admitted(None);
    b.answer(first, 0);
    // Processes that come and go inside one held burst.
    for pid in 2..200 {
        let c = b.open(Some(Peer { pid, start: 1 })).unwrap();
        assert!(b.begin(c).0);
        assert_eq!(b.end(c, None, None), After::Nothing);
        b.close(c);
    }
    match b.end(first, None, None) {
        After::Release(r) => assert_eq!(r.peers.len(), MAX_BURST_PIDS),
        a => panic!("{a:?}"),
    }
}

#[test]
fn connections_are_capped() {
    let b = Book::default();
    for _ in 0..MAX_CONNS {
        assert!(b.open(Some(Peer { pid: 7, start: 1 })).is_some());
    }
    assert!(b.open(Some(Peer { pid: 7, start: 1 })).is_none());
    b.close(1);
    assert!(b.open(None).is_some());
    assert_eq!(
        b.lock().pids.len(),
        MAX_CONNS - 1,
        "a closed connection's PID is dropped"
    );
}

/// A process that held its lease 50 ms and claims 49 ms of idle is billed the 50 ms less the
/// idle the shim vouches for (its own setting), not 1 ms; an honest claim below it stands.
#[test]
fn a_burst_is_billed_what_the_shim_saw_less_only_the_idle_it_vouches_for() {
    let granted = Instant::now();
    let now = granted + Duration::from_millis(50);
    let vouched = Duration::from_millis(5);
    let lying = charged_end(now, Duration::from_millis(49), vouched);
    assert_eq!(lying.duration_since(granted), Duration::from_millis(45));
    let honest = charged_end(now, Duration::from_millis(3), vouched);
    assert_eq!(honest.duration_since(granted), Duration::from_millis(47));
    // A claim longer than the process has lived is bounded the same way.
    let absurd = charged_end(now, Duration::from_secs(49), vouched);
    assert_eq!(absurd.duration_since(granted), Duration::from_millis(45));
}

#[test]
fn a_container_s_next_admission_waits_out_the_idle_time_after_a_release() {
    let gap = Duration::from_millis(200);
    let book = Book::default();
    assert_eq!(book.pace(gap), Duration::ZERO, "nothing released yet");
    let conn = book.open(None).unwrap();
    assert_eq!(book.begin(conn), (false, true, 0));
    assert!(!book.admitted(None));
    let After::Release(_) = book.end(conn, None, None) else {
        panic!("the last process out releases");
    };
    book.released();
    let wait = book.pace(gap);
    assert!(wait > Duration::ZERO && wait <= gap, "{wait:?}");
    assert_eq!(book.pace(Duration::ZERO), Duration::ZERO);
}
