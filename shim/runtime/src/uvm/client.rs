//! The shim's side of the interposer's control protocol (see `hooks/src/control.rs`): one
//! command to every CUDA process of a container, through the sockets they made in its control
//! directory. Blocking; callers run it off the async executor.
//!
//! Whatever answers there is the container's own code, so nothing it does can hold the shim:
//! entries are opened without following links and used only if they are sockets (connected
//! through the descriptor, so a swapped name cannot redirect the connection), connections are
//! non-blocking, each command has one deadline for connect, question and answer, replies are
//! capped at [`MAX_REPLY`] bytes, at most [`MAX_SOCKETS`] processes are asked (all at once, so
//! one that stalls does not delay the others), and figures are parsed strictly and summed
//! saturating.
//!
//! A socket nobody listens on any more (its process exited) is removed. A process whose answer
//! is an error fails the command, but the others are still asked: an eviction that reached two
//! of three processes has moved their memory, and the caller should know both facts.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};

/// The longest reply line read from a process (the interposer's longest, `status` with every
/// figure at 20 digits, is under 400 bytes).
pub const MAX_REPLY: usize = 512;
/// The most sockets asked per command (the control directory holds 64 inodes).
pub const MAX_SOCKETS: usize = 64;

/// What the processes of a container answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    /// CUDA processes that answered.
    pub processes: usize,
    /// Sum of the byte figures they answered (evicted, prefetched, or managed for `status`).
    pub bytes: u64,
    /// For `status`: bytes resident on the device.
    pub resident: u64,
    /// For `status`: what they keep native, and why.
    pub native: crate::memory::Native,
    /// For `status`: their exports (CUDA IPC, dma-buf) and IPC opens of GPU memory the driver
    /// granted — memory shared with another process, which the driver's checkpoint does not
    /// support (r570), so the checkpoint backend leaves such a container on the GPU.
    pub shared: u64,
    /// For `status`: their sharing calls under way (a look while the driver holds one must not
    /// take the memory for unshared).
    pub sharing: u64,
    /// Errors, one per process that failed: `socket: message`.
    pub errors: Vec<String>,
    /// Whether a process did not answer within the deadline.
    pub timed_out: bool,
    /// A checkpoint move reached the driver (a process may be locked or suspended): a failed
    /// one needs a restore before the container's GPU work runs again.
    pub acted: bool,
    /// Processes that refused an evict for now (GPU calls still under way): not errors, the
    /// move is tried again later.
    pub busy: Vec<String>,
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

/// Why one process's command failed.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// Nobody listens (its process is gone): the socket is removed.
    Gone,
    /// The entry is not a socket (planted by the container): ignored.
    NotSocket,
    /// No answer within the deadline.
    Timeout,
    /// The reply lacks a figure (`name=`).
    Missing(String),
    /// An evict refused for now: GPU calls were still under way in the process.
    Busy(String),
    /// Anything else, said as text.
    Other(String),
}

/// `name=<digits>` in a reply: strictly decimal, fits in u64; anything else is an error.
fn field(reply: &str, name: &str) -> Result<u64, Failure> {
    let v = reply
        .split_ascii_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .ok_or_else(|| Failure::Missing(name.to_owned()))?;
    if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Failure::Other(format!("bad {name}={v:.24}")));
    }
    v.parse()
        .map_err(|_| Failure::Other(format!("bad {name}={v:.24}")))
}

/// `name=<digits>` if the reply has it (an older interposer's `status` lacks the native
/// reasons: 0); present but malformed is an error.
fn optional(reply: &str, name: &str) -> Result<u64, Failure> {
    match field(reply, name) {
        Err(Failure::Missing(_)) => Ok(0),
        r => r,
    }
}

/// One process's figures: bytes (evicted, prefetched, or managed), resident, native, and (for
/// `status`) its exports and IPC opens of GPU memory the driver granted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// Evicted, prefetched, or (for `status`) managed bytes.
    pub bytes: u64,
    /// For `status`: bytes resident on the device.
    pub resident: u64,
    /// For `status`: what it keeps native, and why.
    pub native: crate::memory::Native,
    /// For `status`: exports and imports of GPU memory the driver granted it.
    pub shared: u64,
    /// For `status`: such calls under way (entered, not yet answered).
    pub sharing: u64,
}

/// The native figures of a `status` reply. `native=` counts every `cuMemAlloc` kept native;
/// what the named reasons do not cover is `other`.
fn native(reply: &str) -> Result<crate::memory::Native, Failure> {
    let mut n = crate::memory::Native {
        vmm: optional(reply, "vmm")?,
        stream_ordered: optional(reply, "async")?,
        array: optional(reply, "array")?,
        setting: optional(reply, "setting")?,
        library: optional(reply, "library")?,
        export: optional(reply, "export")?,
        other: 0,
        refused: optional(reply, "refused")?,
    };
    let named = n.setting.saturating_add(n.library).saturating_add(n.export);
    n.other = optional(reply, "native")?.saturating_sub(named);
    Ok(n)
}

/// Parses one reply to `cmd`.
fn parse_reply(cmd: Command, reply: &str) -> Result<Figures, Failure> {
    if reply.starts_with("error evict: busy") {
        return Err(Failure::Busy(reply.chars().take(200).collect()));
    }
    if reply != "ok" && !reply.starts_with("ok ") {
        return Err(Failure::Other(reply.chars().take(200).collect()));
    }
    Ok(match cmd {
        Command::Status => Figures {
            bytes: field(reply, "managed")?,
            resident: field(reply, "resident")?,
            native: native(reply)?,
            shared: optional(reply, "shared")?,
            sharing: optional(reply, "sharing")?,
        },
        Command::Evict => Figures {
            bytes: field(reply, "evicted")?,
            ..Figures::default()
        },
        Command::Prefetch => Figures {
            bytes: field(reply, "prefetched")?,
            ..Figures::default()
        },
    })
}

/// Parses one reply line to `cmd` as [`send`] does: `(bytes, resident, native)`, or why it is
/// refused.
///
/// # Errors
/// Not an `ok` reply, or a figure missing or not a plain decimal `u64`.
pub fn parse_reply_text(cmd: Command, reply: &str) -> Result<Figures, String> {
    parse_reply(cmd, reply).map_err(|f| match f {
        Failure::Other(s) | Failure::Busy(s) => s,
        Failure::Missing(name) => format!("reply without {name}="),
        other => format!("{other:?}"),
    })
}

/// Waits until `fd` is ready for `events` or `deadline` passes.
fn ready(fd: &OwnedFd, events: nix::poll::PollFlags, deadline: Instant) -> Result<(), Failure> {
    use nix::poll::{PollFd, PollTimeout, poll};
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::Timeout);
        }
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(fd.as_fd(), events)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(Errno::EINTR) => {}
            Ok(_) => return Ok(()),
            Err(e) => return Err(Failure::Other(e.to_string())),
        }
    }
}

/// Connected to a socket entry of the directory, without following a link and without
/// blocking: the entry is opened `O_PATH | O_NOFOLLOW`, checked to be a socket, and connected
/// through `/proc/self/fd`.
fn connect(dir: &OwnedFd, name: &str) -> Result<OwnedFd, Failure> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, socket};
    let entry = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ENOENT => Failure::Gone,
        e => Failure::Other(e.to_string()),
    })?;
    let st = nix::sys::stat::fstat(&entry).map_err(|e| Failure::Other(e.to_string()))?;
    if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFSOCK.bits() {
        return Err(Failure::NotSocket);
    }
    let sock = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| Failure::Other(e.to_string()))?;
    let addr = UnixAddr::new(format!("/proc/self/fd/{}", entry.as_raw_fd()).as_str())
        .map_err(|e| Failure::Other(e.to_string()))?;
    match nix::sys::socket::connect(sock.as_raw_fd(), &addr) {
        Ok(()) => Ok(sock),
        Err(Errno::ECONNREFUSED) => Err(Failure::Gone),
        // A full backlog: the process is not accepting.
        Err(Errno::EAGAIN) => Err(Failure::Other("not accepting connections".into())),
        Err(e) => Err(Failure::Other(e.to_string())),
    }
}

/// Writes a line, reads one reply line, all before `deadline`.
fn ask(sock: &OwnedFd, line: &str, deadline: Instant) -> Result<String, Failure> {
    use nix::poll::PollFlags;
    let msg = format!("{line}\n");
    let mut sent = 0;
    while sent < msg.len() {
        ready(sock, PollFlags::POLLOUT, deadline)?;
        match nix::unistd::write(sock, &msg.as_bytes()[sent..]) {
            Ok(n) => sent += n,
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(Errno::EPIPE | Errno::ECONNRESET) => {
                return Err(Failure::Other("connection closed".into()));
            }
            Err(e) => return Err(Failure::Other(e.to_string())),
        }
    }
    let mut reply = Vec::with_capacity(64);
    let mut buf = [0u8; 128];
    loop {
        ready(sock, PollFlags::POLLIN, deadline)?;
        // Read at most up to the cap; one line only (the protocol is question / answer).
        let room = (MAX_REPLY + 1 - reply.len()).min(buf.len());
        match nix::unistd::read(sock, &mut buf[..room]) {
            Ok(0) => return Err(Failure::Other("connection closed".into())),
            Ok(n) => {
                reply.extend_from_slice(&buf[..n]);
                if let Some(end) = reply.iter().position(|&b| b == b'\n') {
                    reply.truncate(end);
                    break;
                }
                if reply.len() > MAX_REPLY {
                    return Err(Failure::Other(format!(
                        "reply longer than {MAX_REPLY} bytes"
                    )));
                }
            }
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(e) => return Err(Failure::Other(e.to_string())),
        }
    }
    String::from_utf8(reply).map_err(|_| Failure::Other("reply is not UTF-8".into()))
}

fn one(
    dir: &OwnedFd,
    name: &str,
    container_id: &str,
    cmd: Command,
    deadline: Instant,
) -> Result<Figures, Failure> {
    let sock = connect(dir, name)?;
    let hello = ask(&sock, &format!("hello {container_id}"), deadline)?;
    parse_hello(&hello)?;
    parse_reply(cmd, &ask(&sock, cmd.word(), deadline)?)
}

fn parse_hello(reply: &str) -> Result<(), Failure> {
    if reply == "ok" {
        Ok(())
    } else {
        Err(Failure::Other(reply.chars().take(200).collect()))
    }
}

/// The names in the control directory that look like a process's socket (`cuda-<pid>.sock`),
/// at most [`MAX_SOCKETS`] of them, sorted.
fn socket_names(dir: &OwnedFd) -> Vec<String> {
    let Ok(d) = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    let mut names: Vec<String> = d
        .into_iter()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
        .filter(|n| {
            n.strip_prefix("cuda-")
                .and_then(|r| r.strip_suffix(".sock"))
                .is_some_and(|pid| {
                    !pid.is_empty() && pid.len() <= 10 && pid.bytes().all(|b| b.is_ascii_digit())
                })
        })
        .take(MAX_SOCKETS * 4)
        .collect();
    names.sort();
    names.truncate(MAX_SOCKETS);
    names
}

/// Sends `cmd` to every CUDA process of the container whose control directory is `dir`, all
/// within `timeout` (each process is asked at once on its own thread).
#[must_use]
pub fn send(dir: &Path, container_id: &str, cmd: Command, timeout: Duration) -> Answer {
    let deadline = Instant::now() + timeout;
    let mut a = Answer::default();
    // The directory is the shim's own (a tmpfs mounted on a root-only path): opened once, and
    // every entry is reached from this descriptor.
    let Ok(dirfd) = nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return a;
    };
    let names = socket_names(&dirfd);
    type Outcome = (String, Result<Figures, Failure>);
    let results: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .iter()
            .map(|n| {
                let dirfd = &dirfd;
                (
                    n,
                    s.spawn(move || one(dirfd, n, container_id, cmd, deadline)),
                )
            })
            .collect();
        handles
            .into_iter()
            .map(|(n, h)| {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(Failure::Other("client thread panicked".into())));
                (n.clone(), r)
            })
            .collect()
    });
    for (name, r) in results {
        match r {
            Ok(f) => {
                a.processes += 1;
                a.bytes = a.bytes.saturating_add(f.bytes);
                a.resident = a.resident.saturating_add(f.resident);
                a.native.add(&f.native);
                a.shared = a.shared.saturating_add(f.shared);
                a.sharing = a.sharing.saturating_add(f.sharing);
            }
            Err(Failure::Gone) => {
                // Its process is gone: the name is removed (from our descriptor, no link followed).
                let _ = nix::unistd::unlinkat(
                    &dirfd,
                    name.as_str(),
                    nix::unistd::UnlinkatFlags::NoRemoveDir,
                );
            }
            Err(Failure::NotSocket) => {
                tracing::info!("{}: {name} is not a socket: ignored", dir.display());
            }
            Err(Failure::Timeout) => {
                a.timed_out = true;
                a.errors.push(format!(
                    "{name}: no answer within {}ms",
                    timeout.as_millis()
                ));
            }
            Err(Failure::Busy(e)) => a.busy.push(format!("{name}: {e}")),
            Err(Failure::Other(e)) => a.errors.push(format!("{name}: {e}")),
            Err(Failure::Missing(f)) => a.errors.push(format!("{name}: reply without {f}=")),
        }
    }
    a
}

#[cfg(test)]
mod tests;
