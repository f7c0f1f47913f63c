//! The shim's side of the interposer's control protocol (see `hooks/src/control.rs`): one
//! command to every CUDA process of a container, through the sockets they made in its control
//! directory. Blocking; callers run it off the async executor.
//!
//! A socket nobody listens on any more (its process exited) is removed. A process whose answer
//! is an error fails the command, but the others are still asked: an eviction that reached two
//! of three processes has moved their memory, and the caller should know both facts.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// What the processes of a container answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// CUDA processes that answered.
    pub processes: usize,
    /// Sum of the byte figures they answered (evicted, prefetched, or managed for `status`).
    pub bytes: u64,
    /// For `status`: bytes resident on the device.
    pub resident: u64,
    /// Errors, one per process that failed: `socket: message`.
    pub errors: Vec<String>,
}

impl Answer {
    /// Whether every process did it.
    #[must_use]
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }
}

/// A command to the interposer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Bytes managed and resident.
    Status,
    /// Move memory to the host; launches wait.
    Evict,
    /// Move memory back; launches go on.
    Prefetch,
}

impl Command {
    fn word(self) -> &'static str {
        match self {
            Command::Status => "status",
            Command::Evict => "evict",
            Command::Prefetch => "prefetch",
        }
    }
}

fn field(reply: &str, name: &str) -> Option<u64> {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn one(
    path: &Path,
    container_id: &str,
    cmd: Command,
    timeout: Duration,
) -> Result<(u64, u64), String> {
    let conn = UnixStream::connect(path).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(timeout))
        .and_then(|()| conn.set_write_timeout(Some(Duration::from_secs(5))))
        .map_err(|e| e.to_string())?;
    let mut out = conn.try_clone().map_err(|e| e.to_string())?;
    let mut lines = BufReader::new(conn);
    let mut ask = |line: &str| -> Result<String, String> {
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
        let mut reply = String::new();
        lines.read_line(&mut reply).map_err(|e| e.to_string())?;
        let reply = reply.trim_end().to_owned();
        if reply == "ok" || reply.starts_with("ok ") {
            Ok(reply)
        } else if reply.is_empty() {
            Err("connection closed".into())
        } else {
            Err(reply)
        }
    };
    ask(&format!("hello {container_id}"))?;
    let reply = ask(cmd.word())?;
    Ok(match cmd {
        Command::Status => (
            field(&reply, "managed").unwrap_or(0),
            field(&reply, "resident").unwrap_or(0),
        ),
        Command::Evict => (field(&reply, "evicted").unwrap_or(0), 0),
        Command::Prefetch => (field(&reply, "prefetched").unwrap_or(0), 0),
    })
}

/// Sends `cmd` to every CUDA process of the container whose control directory is `dir`.
/// `timeout` bounds each answer (an eviction synchronizes the process's work first).
#[must_use]
pub fn send(dir: &Path, container_id: &str, cmd: Command, timeout: Duration) -> Answer {
    let mut a = Answer::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return a;
    };
    let mut socks: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cuda-") && n.ends_with(".sock"))
        })
        .collect();
    socks.sort();
    for s in socks {
        match one(&s, container_id, cmd, timeout) {
            Ok((bytes, resident)) => {
                a.processes += 1;
                a.bytes += bytes;
                a.resident += resident;
            }
            Err(e) if e.contains("Connection refused") || e.contains("No such file") => {
                // Its process is gone.
                let _ = std::fs::remove_file(&s);
            }
            Err(e) => a.errors.push(format!(
                "{}: {e}",
                s.file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
            )),
        }
    }
    a
}

#[cfg(test)]
mod tests {
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
        assert!(!r.ok());
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
}
