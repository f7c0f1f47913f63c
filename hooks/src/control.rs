//! The per-process control socket: `$MQFQ_CTL_DIR/cuda-<pid>.sock`, a line protocol for `mqfqd`.
//!
//! ```text
//! → hello <container id>     (must match MQFQ_CONTAINER_ID when the shim set it)
//! ← ok
//! → status                   ← ok managed=<bytes> resident=<bytes> native=<bytes> evicted=<0|1>
//!                                 vmm=<bytes> async=<bytes> array=<bytes> setting=<bytes>
//!                                 library=<bytes> export=<bytes> refused=<count>
//!                                 shared=<count> sharing=<count>                   (one line)
//! → evict                    ← ok evicted=<bytes>
//! → prefetch                 ← ok prefetched=<bytes>
//! anything else              ← error <why>            (logged; the connection stays usable)
//! ```
//! Lines are at most 256 bytes; a longer one ends the connection. Nothing here can take the
//! application down: every failure is an answer or a log line.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

const MAX_LINE: u64 = 256;

/// The control socket's descriptors in use (its listener, and each connection being served):
/// a forked child closes its copies, which no thread of its own owns. Kept open there, the
/// listener would let clients connect to a dead parent's socket and wait for an answer that
/// never comes, and a connection would not end when the parent dies.
static FDS: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];

/// A descriptor in [`FDS`] while this lives (`None` when every slot is taken: that one stays
/// open in a child).
struct Registered(Option<usize>);

impl Registered {
    fn new(fd: RawFd) -> Self {
        Registered(FDS.iter().position(|s| {
            s.compare_exchange(-1, fd, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        }))
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            FDS[i].store(-1, Ordering::SeqCst);
        }
    }
}

/// In a forked child (one thread, this one): closes its copies of the parent's control socket.
pub(crate) fn close_in_child() {
    for slot in &FDS {
        let fd = slot.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: a copy of one of the parent's control descriptors, which nothing in the
            // child owns (its owners were the parent's other threads).
            unsafe { libc::close(fd) };
        }
    }
}

/// Binds the socket and starts the control thread.
///
/// # Errors
/// The directory or socket cannot be made.
pub fn start(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(format!("cuda-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    let expected = std::env::var("MQFQ_CONTAINER_ID").ok();
    std::thread::Builder::new()
        .name("mqfq-cuda-ctl".into())
        .spawn(move || {
            let _listening = Registered::new(listener.as_raw_fd());
            for conn in listener.incoming() {
                match conn {
                    Ok(c) => {
                        // One thread per connection: a client that stays connected (mqfqd) must
                        // not lock others out.
                        let expected = expected.clone();
                        let spawned = std::thread::Builder::new()
                            .name("mqfq-cuda-conn".into())
                            .spawn(move || serve(c, expected.as_deref()));
                        if let Err(e) = spawned {
                            log!("control connection: {e}");
                        }
                    }
                    Err(e) => log!("accept: {e}"),
                }
            }
        })?;
    Ok(())
}

fn serve(conn: UnixStream, expected: Option<&str>) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let conn_fd = conn.as_raw_fd();
    let mut lines = BufReader::new(conn.take(u64::MAX));
    // Declared after the streams, so dropped (unregistered) before they are closed.
    let _serving = (Registered::new(conn_fd), Registered::new(out.as_raw_fd()));
    let mut greeted = false;
    loop {
        let mut line = String::new();
        match (&mut lines).take(MAX_LINE + 1).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with('\n') {
            log!("control: truncated or overlong message; connection closed");
            let _ = writeln!(out, "error truncated or overlong message");
            return;
        }
        let reply = answer(line.trim_end(), &mut greeted, expected);
        if reply.starts_with("error") {
            log!("control: {:?}: {reply}", line.trim_end());
        }
        if writeln!(out, "{reply}").is_err() {
            return;
        }
        if reply.starts_with("error wrong container") {
            return;
        }
    }
}

pub(crate) fn answer(line: &str, greeted: &mut bool, expected: Option<&str>) -> String {
    let mut words = line.split_whitespace();
    let cmd = words.next().unwrap_or("");
    if !*greeted {
        return match (cmd, words.next()) {
            ("hello", Some(id)) if expected.is_none_or(|e| e == id) => {
                *greeted = true;
                "ok".into()
            }
            ("hello", Some(id)) => format!("error wrong container {id}"),
            _ => "error say hello <container id> first".into(),
        };
    }
    match cmd {
        "status" => {
            let (managed, resident, evicted) = crate::state::status();
            let k = crate::state::native();
            let (shared, sharing) = crate::state::shared();
            format!(
                "ok managed={managed} resident={resident} native={} evicted={} vmm={} async={} \
                 array={} setting={} library={} export={} refused={} shared={} sharing={}",
                k.alloc_native(),
                u8::from(evicted),
                k.vmm,
                k.stream_ordered,
                k.array,
                k.setting,
                k.library,
                k.export,
                k.refused,
                shared,
                sharing
            )
        }
        "evict" => match crate::state::evict() {
            Ok(b) => format!("ok evicted={b}"),
            Err(e) => format!("error evict: {e}"),
        },
        "prefetch" => match crate::state::prefetch() {
            Ok(b) => format!("ok prefetched={b}"),
            Err(e) => format!("error prefetch: {e}"),
        },
        "" => "error empty message".into(),
        other => format!("error unknown command {other:?}"),
    }
}
