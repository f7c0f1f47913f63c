//! Burst leases: a running GPU container's work admitted a burst at a time (issue 12).
//!
//! Kubernetes never pauses a container and a function server runs for hours, so what waits in
//! the node's queue is each burst of GPU work, which the CUDA interposer sees. Its processes
//! ask this shim — never `mqfqd`: the container reaches nothing but its own control directory —
//! on `shim.sock` there (protocol in `hooks/src/burst.rs`). The shim attaches everything it
//! knows (namespace, container, function, weight, tenant, GPUs) and asks `mqfqd` for a lease
//! of kind `burst`; the processes only say `begin` and `end`.
//!
//! One lease per container: the first process to begin asks, others that begin meanwhile or
//! while it is held join it, and it is released (`idle`, the container lives on) when the last
//! active process ends its burst or goes away (its connection closes when it dies). The
//! service charged is the burst's GPU-busy time: from the grant to the last observed
//! completion, without the idle tail. Memory the pool evicted comes back (prefetch, under the
//! container's pool lock) before the first call of the burst runs.
//!
//! Bounds: at most [`MAX_CONNS`] connections per container, requests of at most [`MAX_LINE`]
//! bytes, one request at a time per connection; a flood or a lie concerns this container's own
//! lease, and the service it implies moves the GPU's D only within the bounds mqfqd puts on one
//! tenant's reports (docs/SECURITY.md §10).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;

use super::TaskService;
use crate::error::{Error, Result};
use crate::gate::BurstReport;
use crate::memory::Usage;
use crate::uvm::client::Command;
use peer::{Peer, peer, start_time};

/// Connections one container may hold open (the control tmpfs has 64 inodes anyway).
pub const MAX_CONNS: usize = 64;
/// The longest request line.
pub const MAX_LINE: usize = 64;
/// The socket's name in the control directory.
pub const SOCKET: &str = "shim.sock";
/// How often a burst's end asks the container's processes what memory they hold.
const STATUS_EVERY: Duration = Duration::from_secs(5);
/// Processes of one burst whose PIDs go to mqfqd (as many as it reads): a container that
/// forks and connects without end cannot grow the release.
pub const MAX_BURST_PIDS: usize = 64;

/// What a burst's end measured, before its processes are checked.
#[derive(Debug, PartialEq)]
struct Ended {
    service: Duration,
    transfer_bytes: Option<u64>,
    peers: Vec<Peer>,
}

impl Ended {
    /// A lease handed back unused: no service, nothing copied, no process.
    fn nothing() -> Self {
        Ended {
            service: Duration::ZERO,
            transfer_bytes: None,
            peers: Vec::new(),
        }
    }

    /// The report: only the processes still the ones that connected.
    fn report(self) -> BurstReport {
        BurstReport {
            service: self.service,
            transfer_bytes: self.transfer_bytes,
            pids: self
                .peers
                .iter()
                .filter(|p| start_time(p.pid) == Some(p.start))
                .map(|p| p.pid)
                .collect(),
        }
    }
}

/// A request from a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Its burst begins: answer once admitted.
    Begin,
    /// Its burst ended; its work completed this long ago, and it copied this many bytes
    /// between host and device (`None`: an interposer that does not count them).
    End(Duration, Option<u64>),
}

/// A decimal u64 spelled one way: digits only, no sign, no leading zeros.
fn number(word: &str, what: &str) -> std::result::Result<u64, String> {
    if word.is_empty()
        || word.len() > 20
        || !word.bytes().all(|b| b.is_ascii_digit())
        || (word != "0" && word.starts_with('0'))
    {
        return Err("unknown request".to_owned());
    }
    word.parse::<u64>()
        .map_err(|_| format!("{what} out of range"))
}

/// Parses one request line (without its newline).
///
/// # Errors
/// Anything but `begin`, `end <idle_ns>` or `end <idle_ns> <bytes>` (decimal u64s, no leading
/// zeros: one spelling per request).
pub fn parse(line: &[u8]) -> std::result::Result<Request, String> {
    let text = std::str::from_utf8(line).map_err(|_| "not UTF-8".to_owned())?;
    let mut words = text.split(' ');
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some("begin"), None, None, None) => Ok(Request::Begin),
        (Some("end"), Some(ns), bytes, None) => {
            let idle = Duration::from_nanos(number(ns, "idle_ns")?);
            let bytes = bytes.map(|b| number(b, "bytes")).transpose()?;
            Ok(Request::End(idle, bytes))
        }
        _ => Err("unknown request".to_owned()),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    /// No burst.
    Idle,
    /// The admission is in flight.
    Asking,
    /// Admitted at this instant.
    Held(Instant),
}

#[derive(Debug)]
struct BookInner {
    next_conn: u64,
    conns: usize,
    /// Connections whose burst was admitted and has not ended.
    active: HashSet<u64>,
    /// Connections waiting for the admission.
    waiting: HashSet<u64>,
    lease: Lease,
    /// The latest completion any process of the current burst reported.
    completed: Option<Instant>,
    /// Bumped when an admission finishes (granted or given up), so waiters look again.
    round: u64,
    /// The answer of the last admission round: `None` granted, `Some(why)` not.
    refused: Option<String>,
    /// A burst's release is on its way to the daemon: the next admission waits for it.
    releasing: bool,
    /// When the container's last lease went back: its next admission is asked no sooner than
    /// the burst idle time after it ([`Book::pace`]).
    last_release: Option<Instant>,
    /// Each connection's process (the kernel's peer credentials), where known.
    pids: HashMap<u64, Peer>,
    /// The current burst's processes (at most [`MAX_BURST_PIDS`]), and the bytes they said
    /// they copied (`None`: none counted them).
    burst_pids: Vec<Peer>,
    moved: Option<u64>,
}

/// One container's burst state.
#[derive(Debug)]
pub struct Book {
    inner: StdMutex<BookInner>,
    changed: tokio::sync::Notify,
}

impl Default for Book {
    fn default() -> Self {
        Book {
            inner: StdMutex::new(BookInner {
                next_conn: 0,
                conns: 0,
                active: HashSet::new(),
                waiting: HashSet::new(),
                lease: Lease::Idle,
                completed: None,
                round: 0,
                refused: None,
                releasing: false,
                last_release: None,
                pids: HashMap::new(),
                burst_pids: Vec::new(),
                moved: None,
            }),
            changed: tokio::sync::Notify::new(),
        }
    }
}

/// What ending a process's part of the burst requires of the caller.
#[derive(Debug, PartialEq)]
enum After {
    Nothing,
    /// Release the lease with what the burst measured.
    Release(Ended),
}

impl Book {
    fn lock(&self) -> std::sync::MutexGuard<'_, BookInner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a burst is admitted or being admitted (the pool leaves the container alone).
    #[must_use]
    pub fn busy(&self) -> bool {
        self.lock().lease != Lease::Idle
    }

    /// Whether a burst holds the lease (a process is mid-burst).
    #[must_use]
    pub fn held(&self) -> bool {
        matches!(self.lock().lease, Lease::Held(_))
    }

    /// A burst that held the lease was granted a new one (at Resume): its service counts from
    /// now. `false` if it is no longer held (its processes went away meanwhile).
    pub(super) fn regranted(&self) -> bool {
        let mut b = self.lock();
        if matches!(b.lease, Lease::Held(_)) {
            b.lease = Lease::Held(Instant::now());
            true
        } else {
            false
        }
    }

    /// A process connected (`peer`: what the kernel said of it, where it did).
    fn open(&self, peer: Option<Peer>) -> Option<u64> {
        let mut b = self.lock();
        if b.conns >= MAX_CONNS {
            return None;
        }
        b.conns += 1;
        b.next_conn += 1;
        let conn = b.next_conn;
        if let Some(peer) = peer {
            b.pids.insert(conn, peer);
        }
        Some(conn)
    }

    /// A process begins: `Ok(true)` if it joined a held lease, `Ok(false)` if it must wait
    /// (and `start` says whether it must start the admission).
    fn begin(&self, conn: u64) -> (bool, bool, u64) {
        let mut b = self.lock();
        match b.lease {
            Lease::Held(_) => {
                b.activate(conn);
                (true, false, b.round)
            }
            Lease::Asking => {
                b.waiting.insert(conn);
                (false, false, b.round)
            }
            Lease::Idle => {
                b.waiting.insert(conn);
                b.lease = Lease::Asking;
                b.completed = None;
                b.burst_pids.clear();
                b.moved = None;
                (false, true, b.round)
            }
        }
    }

    /// After an admission round: `Some(answer)` once `round` has passed.
    fn answer(&self, conn: u64, round: u64) -> Option<std::result::Result<(), String>> {
        let mut b = self.lock();
        if b.round == round {
            return None;
        }
        b.waiting.remove(&conn);
        match b.refused.clone() {
            None => {
                b.activate(conn);
                Some(Ok(()))
            }
            Some(why) => Some(Err(why)),
        }
    }

    /// The admission finished: granted (`None`) or not. Whether the lease must go straight
    /// back (everyone who waited for it went away).
    fn admitted(&self, refused: Option<String>) -> bool {
        let mut b = self.lock();
        b.round += 1;
        let granted = refused.is_none();
        b.refused = refused;
        let nobody = b.waiting.is_empty() && b.active.is_empty();
        b.lease = if granted && !nobody {
            Lease::Held(Instant::now())
        } else {
            Lease::Idle
        };
        if granted && nobody {
            b.releasing = true;
        }
        drop(b);
        self.changed.notify_waiters();
        granted && nobody
    }

    /// A process's burst ended (`completed_at`, having copied `moved` bytes) or the process
    /// went away (`None`: now).
    fn end(&self, conn: u64, completed_at: Option<Instant>, moved: Option<u64>) -> After {
        let mut b = self.lock();
        let was_waiting = b.waiting.remove(&conn);
        let was_active = b.active.remove(&conn);
        if was_active {
            let at = completed_at.unwrap_or_else(Instant::now);
            b.completed = Some(b.completed.map_or(at, |c| c.max(at)));
            if let Some(m) = moved {
                b.moved = Some(b.moved.unwrap_or(0).saturating_add(m));
            }
        }
        if !b.active.is_empty() || !b.waiting.is_empty() {
            return After::Nothing;
        }
        match b.lease {
            // Also a waiter that went away between the grant and its answer.
            Lease::Held(granted) if was_active || was_waiting => {
                let done = b.completed.unwrap_or_else(Instant::now);
                b.lease = Lease::Idle;
                b.releasing = true;
                After::Release(Ended {
                    service: done.saturating_duration_since(granted),
                    transfer_bytes: b.moved.take(),
                    peers: std::mem::take(&mut b.burst_pids),
                })
            }
            // An admission nobody waits for any more is not withdrawn (a cancel could land on
            // a later process's admission of this container): its grant goes straight back.
            _ => After::Nothing,
        }
    }

    fn released(&self) {
        let mut b = self.lock();
        b.releasing = false;
        b.last_release = Some(Instant::now());
        drop(b);
        self.changed.notify_waiters();
    }

    /// How long the next admission must still wait: a container's bursts are asked at most
    /// once per `gap` after a release (the idle time an honest interposer keeps between
    /// bursts anyway), so a process that cycles `begin`/`end` as fast as it can costs mqfqd at
    /// most two calls per `gap`, not two per round trip.
    fn pace(&self, gap: Duration) -> Duration {
        self.lock()
            .last_release
            .map_or(Duration::ZERO, |t| gap.saturating_sub(t.elapsed()))
    }

    /// Waits until no release is on its way.
    async fn no_release_pending(&self) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.lock().releasing {
                return;
            }
            notified.await;
        }
    }

    fn close(&self, conn: u64) {
        let mut b = self.lock();
        b.conns = b.conns.saturating_sub(1);
        b.pids.remove(&conn);
    }
}

impl BookInner {
    /// `conn`'s process takes part in the burst.
    fn activate(&mut self, conn: u64) {
        self.active.insert(conn);
        if let Some(&peer) = self.pids.get(&conn)
            && self.burst_pids.len() < MAX_BURST_PIDS
            && !self.burst_pids.contains(&peer)
        {
            self.burst_pids.push(peer);
        }
    }
}

/// The burst socket's mode: every uid of the container may connect (connecting needs write
/// permission), whatever user the image or the pod runs as, a user namespace's mapped ids
/// included (to them the root-owned socket is "other"). Nobody outside the container reaches it:
/// its directory sits under the root-only control root and is mounted into this container alone.
pub const SOCKET_MODE: u32 = 0o666;

/// Binds the container's burst socket in its control directory, with [`SOCKET_MODE`] whatever
/// the umask containerd gave the shim.
///
/// # Errors
/// The socket cannot be made.
pub fn bind(dir: &Path) -> Result<std::os::unix::net::UnixListener> {
    let path = dir.join(SOCKET);
    let l = std::os::unix::net::UnixListener::bind(&path)
        .map_err(|e| Error::io(format!("bind {}", path.display()), e))?;
    let chmod = nix::fcntl::open(
        dir,
        nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .and_then(|d| {
        // Never through a link: the directory is one the container writes to (it is bound
        // before any of its processes exist, but a link swapped in must not aim a root chmod).
        nix::sys::stat::fchmodat(
            &d,
            SOCKET,
            nix::sys::stat::Mode::from_bits_truncate(SOCKET_MODE),
            nix::sys::stat::FchmodatFlags::NoFollowSymlink,
        )
    });
    if let Err(e) = chmod {
        let _ = std::fs::remove_file(&path);
        return Err(Error::io(format!("chmod {}", path.display()), e.into()));
    }
    l.set_nonblocking(true)
        .map_err(|e| Error::io(format!("{}", path.display()), e))?;
    Ok(l)
}

/// The longest idle tail a process's `end` may subtract from its burst: the idle time the shim
/// gave it, which the shim can vouch for (the interposer ends a burst only after that long
/// idle) — nothing more. It had also allowed the monitor's tick and synchronize (twice the idle
/// time plus 50 ms): a process holding the lease 50 ms and claiming 49 ms idle billed 1 ms, and
/// its flow kept the lowest tag. An honest process now pays for its monitor's latency.
fn vouched_tail() -> Duration {
    Duration::from_millis(crate::uvm::burst_idle_ms())
}

/// When a process's burst ended for its charge: now, less the idle it claims up to `vouched`.
fn charged_end(now: Instant, claimed_idle: Duration, vouched: Duration) -> Instant {
    now.checked_sub(claimed_idle.min(vouched)).unwrap_or(now)
}

/// Reads one line of at most [`MAX_LINE`] bytes; `None` at end of stream, on an error or an
/// overlong line.
async fn read_line(rd: &mut BufReader<OwnedReadHalf>) -> Option<Vec<u8>> {
    let mut line = Vec::new();
    let n = (&mut *rd)
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)
        .await
        .ok()?;
    if n == 0 || line.last() != Some(&b'\n') {
        return None;
    }
    line.pop();
    Some(line)
}

impl TaskService {
    /// Serves a container's burst socket until the container is deleted (the task is aborted).
    pub(super) fn serve_bursts(
        &self,
        id: &str,
        listener: std::os::unix::net::UnixListener,
        book: Arc<Book>,
    ) -> Option<tokio::task::AbortHandle> {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(container = %id, "burst socket: {e}; its GPU work runs without burst admission");
                return None;
            }
        };
        let svc = self.clone();
        let id = id.to_owned();
        let task = tokio::spawn(async move {
            let mut refused_before = false;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let Some(conn) = book.open(peer(&stream)) else {
                    if !std::mem::replace(&mut refused_before, true) {
                        tracing::warn!(container = %id, "burst socket: more than {MAX_CONNS} connections; refused (logged once)");
                    }
                    continue;
                };
                let (svc, id, book) = (svc.clone(), id.clone(), book.clone());
                tokio::spawn(async move {
                    svc.serve_process(&id, &book, conn, stream).await;
                    book.close(conn);
                });
            }
        });
        Some(task.abort_handle())
    }

    async fn serve_process(&self, id: &str, book: &Arc<Book>, conn: u64, stream: UnixStream) {
        let (rd, mut wr) = stream.into_split();
        let mut rd = BufReader::new(rd);
        loop {
            let Some(line) = read_line(&mut rd).await else {
                break;
            };
            let reply = match parse(&line) {
                Ok(Request::Begin) => match self.begin_burst(id, book, conn, &mut rd).await {
                    Some(Ok(())) => "ok".to_owned(),
                    Some(Err(why)) => format!("error {why}"),
                    // The process went away while it waited.
                    None => break,
                },
                Ok(Request::End(idle, moved)) => {
                    // The tail a process may leave out of its charge is what the shim can
                    // vouch for: a process cannot bill a long lease as a short burst.
                    let at = charged_end(Instant::now(), idle, vouched_tail());
                    self.end_part(id, book, conn, Some(at), moved).await;
                    "ok".to_owned()
                }
                Err(why) => {
                    tracing::debug!(container = %id, "burst socket: {why}");
                    format!("error {why}")
                }
            };
            if wr.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
                break;
            }
        }
        // Gone (killed mid-burst, exited, or a broken request): its part ends now.
        self.end_part(id, book, conn, None, None).await;
    }

    /// A process's `begin`: joins the held lease, or waits for the admission (starting it if
    /// nobody has); `None` if the process went away meanwhile.
    async fn begin_burst(
        &self,
        id: &str,
        book: &Arc<Book>,
        conn: u64,
        rd: &mut BufReader<OwnedReadHalf>,
    ) -> Option<std::result::Result<(), String>> {
        let (joined, start, round) = book.begin(conn);
        if joined {
            return Some(Ok(()));
        }
        if start {
            let (svc, id, book) = (self.clone(), id.to_owned(), book.clone());
            tokio::spawn(async move { svc.admit_burst(&id, &book).await });
        }
        loop {
            let notified = book.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(a) = book.answer(conn, round) {
                return Some(a);
            }
            tokio::select! {
                () = &mut notified => {}
                // End of stream: the process went away. More bytes before the answer break
                // the protocol (one request at a time): the connection is closed, which ends
                // this process's part like a death would.
                _ = rd.fill_buf() => return None,
            }
        }
    }

    /// A process's part of the burst is over (`at`: when its work completed; `None`: it went
    /// away now): the lease goes back if it was the last; the next admission of this
    /// container waits until the daemon has the release (`releasing`).
    async fn end_part(
        &self,
        id: &str,
        book: &Book,
        conn: u64,
        at: Option<Instant>,
        moved: Option<u64>,
    ) {
        let after = book.end(conn, at, moved);
        let release = matches!(after, After::Release(_));
        self.after_burst(id, after).await;
        if release {
            book.released();
        }
    }

    async fn after_burst(&self, id: &str, after: After) {
        match after {
            After::Nothing => {}
            After::Release(ended) => {
                // /proc is read here, outside the book's lock.
                let report = ended.report();
                // What its processes hold, for the pool's memory budget: asked (bounded wait)
                // at most once per STATUS_EVERY, so a container that bursts hundreds of times a
                // second does not make the shim ask each time.
                let (dir, known) = {
                    let st = self.state.lock().await;
                    st.containers.get(id).map_or((None, Usage::default()), |c| {
                        let dir = c.gpu.to_ask(STATUS_EVERY).map(Path::to_path_buf);
                        (dir.map(|d| (d, c.gpu.warm())), c.gpu.held())
                    })
                };
                let held = match dir {
                    Some((d, warm)) => {
                        let a =
                            super::pool::uvm(&d, id, Command::Status, self.pool_timeouts.status)
                                .await;
                        let held = super::checkpoint::held_from(&a, warm);
                        if let Some(c) = self.state.lock().await.containers.get_mut(id) {
                            c.gpu.set_held(held, true);
                        }
                        self.drop_if_shared(id, &a, warm).await;
                        // Its status says whether a process had an export refused: only then
                        // is the mark looked for (not at every burst's end).
                        if held.native.refused > 0 {
                            self.report_exports(id).await;
                        }
                        held
                    }
                    None => known,
                };
                self.gate.end_burst(&self.namespace, id, report, held).await;
            }
        }
    }
}

mod admit;
mod peer;
#[cfg(test)]
mod tests;
