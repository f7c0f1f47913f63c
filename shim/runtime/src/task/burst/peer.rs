//! Who is on the other end of a burst connection, as the kernel says — never as the process
//! says: its PID in this shim's PID namespace (the host's, which mqfqd matches with NVML's
//! per-process samples) and its start time then, so that a PID reused since is not taken for
//! it.
//!
//! Read from a pidfd of the peer (`SO_PEERPIDFD`, Linux 6.5+): the kernel took it at connect,
//! so it names that process even if it has exited since, and the PID read through it is
//! checked to still be that process's after its start time is read (a PID is not reused while
//! its process exists). `SO_PEERCRED`'s PID, the fallback on older kernels, is a number: a
//! process that connected and exited before the shim read it could have its PID reused by
//! another, which was then taken for it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::net::UnixStream;

/// A connected process: its host PID, and its start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Peer {
    pub(super) pid: u32,
    pub(super) start: u64,
}

pub(super) use crate::process::start_time;

/// The process that connected `stream`, if it still runs (see the module docs).
pub(super) fn peer(stream: &UnixStream) -> Option<Peer> {
    match pidfd_of(stream) {
        Some(pidfd) => by_pidfd(&pidfd),
        None => by_cred(stream),
    }
}

/// A pidfd of the peer; `None` where the kernel has none to give (before 6.5).
fn pidfd_of(stream: &UnixStream) -> Option<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).ok()?;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`, a c_int of that size.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &raw mut len,
        )
    };
    if r != 0 || fd < 0 {
        return None;
    }
    // SAFETY: the kernel just made `fd`, a new descriptor nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Through the pidfd: the PID the kernel shows for it (none once the process has exited), its
/// start time, and the process still alive after that was read.
fn by_pidfd(pidfd: &OwnedFd) -> Option<Peer> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    let pid: i64 = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()?;
    // -1: exited; 0: in a PID namespace this shim cannot see.
    let pid = u32::try_from(pid).ok().filter(|p| *p > 0)?;
    let start = start_time(pid)?;
    alive(pidfd).then_some(Peer { pid, start })
}

/// Whether the pidfd's process has not exited (a pidfd turns readable when it does).
fn alive(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&raw mut p, 1, 0) };
    n == 0
}

/// `SO_PEERCRED`'s PID and that PID's start time (older kernels).
fn by_cred(stream: &UnixStream) -> Option<Peer> {
    let pid = stream
        .peer_cred()
        .ok()
        .and_then(|c| c.pid())
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)?;
    Some(Peer {
        pid,
        start: start_time(pid)?,
    })
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    /// A process that connected and exited before the shim looked is not taken for the one that
    /// got its PID since: through the pidfd the kernel took at connect, it is known to be gone
    /// (by `SO_PEERCRED`'s number it was the new process). The PID is made to be reused through
    /// `/proc/sys/kernel/ns_last_pid` (root; what CI runs as).
    #[tokio::test]
    async fn a_peer_that_exited_is_not_taken_for_the_process_that_reused_its_pid() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_none(),
                "needs root to reuse a PID"
            );
            eprintln!("SKIPPED: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let l =
            tokio::net::UnixListener::from_std(super::super::bind(dir.path()).unwrap()).unwrap();
        let path = dir.path().join(super::super::SOCKET);
        let mut a = Command::new("python3")
            .args([
                "-c",
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])",
            ])
            .arg(&path)
            .spawn()
            .expect("python3");
        assert!(a.wait().unwrap().success());
        let (server, _) = l.accept().await.unwrap();
        let gone = a.id();
        // Another process with the PID that connected.
        let mut b = None;
        for _ in 0..200 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", gone - 1)).unwrap();
            let mut c = Command::new("sleep").arg("30").spawn().unwrap();
            if c.id() == gone {
                b = Some(c);
                break;
            }
            c.kill().unwrap();
            c.wait().unwrap();
        }
        let mut b = b.expect("the PID was not reused in 200 tries");
        let reused = Peer {
            pid: gone,
            start: start_time(gone).unwrap(),
        };
        assert_eq!(
            by_cred(&server),
            Some(reused),
            "the number alone names the new process"
        );
        assert_eq!(
            peer(&server),
            None,
            "taken for the process that reused its PID"
        );
        b.kill().unwrap();
        b.wait().unwrap();
    }
}
