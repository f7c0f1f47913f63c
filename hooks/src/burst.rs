//! Burst admission: the GPU work of a long-running process, admitted a burst at a time.
//!
//! Why: a Kubernetes pod or a Knative function server is never paused, so gating its container
//! start admits nothing useful; what has to wait its turn is each invocation's GPU work. This
//! process sees that work: a **burst** begins at the first launch or copy after an idle gap and
//! ends once the work it submitted has completed and nothing new came for `MQFQ_BURST_IDLE_MS`.
//!
//! With `MQFQ_BURST=1` (the shim sets it, with the socket `$MQFQ_CTL_DIR/shim.sock` that the
//! container's own shim serves), the first gated call of a burst asks the shim (`begin`) and is
//! held until it answers; every later call of the burst pays one atomic load (and a
//! compare-and-swap, once per monitor tick). A monitor thread watches the burst: when no call
//! came for the idle time, it synchronizes the contexts the burst used — the work is then
//! observed complete, not merely no longer submitted — and, if still nothing came, ends it
//! (`end <idle_ns>`: how long ago the work completed, so the shim charges GPU-busy time, not
//! the idle tail).
//!
//! ```text
//! → begin                   ← ok | error <why>   (held until the shim's lease is granted)
//! → end <idle_ns> <bytes>   ← ok                 (bytes: copied host↔device in the burst)
//! ```
//! A shim older than the byte count answers `error unknown request` to the three-word `end`;
//! the process then says `end <idle_ns>` to it from there on.
//! The shim attaches every identity (container, function, weight): the process says only
//! begin and end. A shim that cannot be reached, or that answers an error, lets the burst run
//! (its own fail mode decides for it while it lives); a forked child has its own connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::CuResult;

/// `STATE`: no burst; calls take the slow path.
const IDLE: u8 = 0;
/// A burst is admitted and no call came since the monitor's last look.
const GRANTED: u8 = 1;
/// A burst is admitted and a call came since the monitor's last look.
const TOUCHED: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(IDLE);
/// Gated calls in progress: a burst never ends under one (a launch that compiles or loads
/// for longer than the idle time has not queued its work yet).
static IN_CALL: AtomicU32 = AtomicU32::new(0);
/// Bytes the burst copied between host and device (explicit HtoD / DtoH copies; a unified
/// `cuMemcpy` may go either way, or stay on the device, and is not counted).
static MOVED: AtomicU64 = AtomicU64::new(0);
/// The shim answered the three-word `end` as unknown: it is older, and hears two words.
static OLD_SHIM: AtomicBool = AtomicBool::new(false);
/// The burst connection's descriptor while a request is in flight on it (-1: none). The thread
/// that asks holds the connection outside the lock; a child forked meanwhile gets a copy of the
/// descriptor that no thread of its own owns, and it must close it: otherwise the connection
/// outlives a parent that dies mid-burst, and the shim keeps the parent's lease for as long as
/// the child lives.
static IN_FLIGHT_FD: AtomicI32 = AtomicI32::new(-1);
/// 0: not looked at yet; 1: off; 2: on. Decided from the environment, which a forked child
/// shares, so it holds for the whole process image (an exec starts over).
static MODE: AtomicU8 = AtomicU8::new(0);

#[derive(Debug)]
pub(crate) struct Inner {
    conn: Option<BufReader<UnixStream>>,
    /// A thread is asking the shim; others wait for its answer.
    asking: bool,
    /// The contexts the burst's first calls were made in (synchronized at its end).
    contexts: Vec<usize>,
    monitor: bool,
}

static INNER: Mutex<Inner> = Mutex::new(Inner {
    conn: None,
    asking: false,
    contexts: Vec::new(),
    monitor: false,
});
static CHANGED: Condvar = Condvar::new();

fn inner() -> MutexGuard<'static, Inner> {
    INNER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The longest a `begin` waits for the shim (a shim that stopped answering must not hang the
/// application): `MQFQ_BURST_WAIT_MS`, default 10 minutes; the shim's own admission deadline
/// is far shorter.
fn begin_wait() -> Duration {
    Duration::from_millis(env_ms("MQFQ_BURST_WAIT_MS", 600_000))
}

/// How long a burst's process stays idle, its work complete, before the burst ends:
/// `MQFQ_BURST_IDLE_MS`, default 5 ms (docs/PERFORMANCE.md).
fn idle_time() -> Duration {
    Duration::from_millis(env_ms("MQFQ_BURST_IDLE_MS", 5))
}

fn env_ms(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// Whether burst admission is on in this process (decided once: one atomic load after that,
/// no `getpid` on every gated call).
fn enabled() -> bool {
    match MODE.load(Ordering::Acquire) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var_os("MQFQ_BURST").is_some_and(|v| v == "1")
                && std::env::var_os("MQFQ_CTL_DIR").is_some();
            MODE.store(if on { 2 } else { 1 }, Ordering::Release);
            on
        }
    }
}

/// A gated call in progress (see [`enter`]); dropping it is the call's [`leave`], whatever
/// way the call returns.
#[derive(Debug)]
pub struct InCall(());

impl Drop for InCall {
    fn drop(&mut self) {
        leave();
    }
}

/// Before a gated call: returns at once inside a burst; otherwise begins one (held until the
/// shim admits it). The call is in progress until the guard is dropped.
#[must_use]
pub fn enter(call: &str) -> InCall {
    enter_inner(call);
    InCall(())
}

fn enter_inner(call: &str) {
    // Counted before the state is read: the monitor ends a burst only with no call in
    // progress, and a call that finds the burst ended begins the next one.
    IN_CALL.fetch_add(1, Ordering::AcqRel);
    let s = STATE.load(Ordering::Acquire);
    if s == TOUCHED {
        return;
    }
    if s == GRANTED
        && STATE
            .compare_exchange(GRANTED, TOUCHED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        return;
    }
    if !enabled() {
        return;
    }
    begin(call);
}

/// A copy of `n` bytes between host and device, inside the burst the call entered.
pub fn moved(n: usize) {
    MOVED.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// The line that ends a burst, and what it moved (reset for the next one).
fn end_line(idle_ns: u64) -> String {
    let bytes = MOVED.swap(0, Ordering::AcqRel);
    if OLD_SHIM.load(Ordering::Relaxed) {
        format!("end {idle_ns}")
    } else {
        format!("end {idle_ns} {bytes}")
    }
}

/// After a gated call: no longer in progress, and the burst was busy until now.
fn leave() {
    if STATE.load(Ordering::Relaxed) == GRANTED {
        let _ = STATE.compare_exchange(GRANTED, TOUCHED, Ordering::AcqRel, Ordering::Relaxed);
    }
    IN_CALL.fetch_sub(1, Ordering::AcqRel);
}

type CtxGetCurrentFn = unsafe extern "C" fn(*mut *mut std::ffi::c_void) -> CuResult;

fn current_context() -> usize {
    let mut ctx = std::ptr::null_mut();
    if let Some(get) = crate::real::driver::<CtxGetCurrentFn>(c"cuCtxGetCurrent") {
        // SAFETY: a valid out-pointer.
        let _ = unsafe { get(&raw mut ctx) };
    }
    ctx as usize
}

fn begin(call: &str) {
    crate::state::at_fork();
    let ctx = current_context();
    let mut g = inner();
    loop {
        match STATE.load(Ordering::Acquire) {
            IDLE => {}
            _ => {
                // Another thread's begin was answered: this call joins the burst.
                if ctx != 0 && !g.contexts.contains(&ctx) && g.contexts.len() < 16 {
                    g.contexts.push(ctx);
                }
                let _ =
                    STATE.compare_exchange(GRANTED, TOUCHED, Ordering::AcqRel, Ordering::Acquire);
                return;
            }
        }
        if g.asking {
            g = CHANGED
                .wait(g)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            continue;
        }
        g.asking = true;
        let answer;
        (g, answer) = converse(g, "begin");
        g.asking = false;
        if let Err(e) = &answer {
            log!("{call}: burst admission: {e}; the burst runs without it");
        }
        g.contexts.clear();
        if ctx != 0 {
            g.contexts.push(ctx);
        }
        STATE.store(TOUCHED, Ordering::Release);
        if !g.monitor {
            g.monitor = spawn_monitor();
        }
        drop(g);
        CHANGED.notify_all();
        return;
    }
}

/// One request to the shim on this process's connection (made if there is none), the burst
/// lock `g` given up while the shim answers and taken back; the answer.
///
/// The connection is taken out, made and put back or closed only under the lock, and the
/// descriptor in flight is published in [`IN_FLIGHT_FD`] for as long as it is out: the fork
/// handlers hold the lock, so a forked child always knows which copy of it to close, and never
/// one already closed (whose number may be another's by then).
fn converse(
    mut g: MutexGuard<'static, Inner>,
    line: &str,
) -> (MutexGuard<'static, Inner>, Result<(), String>) {
    let mut conn = match g.conn.take() {
        Some(c) => c,
        None => match connect() {
            Ok(c) => c,
            Err(e) => return (g, Err(e)),
        },
    };
    IN_FLIGHT_FD.store(conn.get_ref().as_raw_fd(), Ordering::SeqCst);
    drop(g);
    let answer = exchange(&mut conn, line);
    let mut g = inner();
    IN_FLIGHT_FD.store(-1, Ordering::SeqCst);
    match answer {
        // Closed here, under the lock, after the number is withdrawn.
        Exchange::Lost(e) => (g, Err(e)),
        Exchange::Answered(a) => {
            g.conn = Some(conn);
            (g, a)
        }
    }
}

enum Exchange {
    /// The connection is unusable.
    Lost(String),
    /// The shim answered (`ok`, or its error).
    Answered(Result<(), String>),
}

fn exchange(conn: &mut BufReader<UnixStream>, line: &str) -> Exchange {
    if let Err(e) = conn.get_mut().write_all(format!("{line}\n").as_bytes()) {
        return Exchange::Lost(format!("send: {e}"));
    }
    let mut reply = String::new();
    // At most 256 bytes of answer.
    match conn.take(256).read_line(&mut reply) {
        Ok(0) => Exchange::Lost("the shim closed the connection".into()),
        Err(e) => Exchange::Lost(format!("no answer: {e}")),
        Ok(_) if reply.trim_end() == "ok" => Exchange::Answered(Ok(())),
        Ok(_) => Exchange::Answered(Err(format!("shim: {}", reply.trim_end()))),
    }
}

fn connect() -> Result<BufReader<UnixStream>, String> {
    let dir = std::env::var_os("MQFQ_CTL_DIR").ok_or("MQFQ_CTL_DIR is not set")?;
    let path = std::path::Path::new(&dir).join("shim.sock");
    let s = UnixStream::connect(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    s.set_read_timeout(Some(begin_wait()))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    Ok(BufReader::new(s))
}

fn spawn_monitor() -> bool {
    match std::thread::Builder::new()
        .name("mqfq-cuda-burst".into())
        .spawn(monitor)
    {
        Ok(_) => true,
        Err(e) => {
            // Without it bursts never end: the lease is then held until the process exits.
            log!("burst monitor: {e}");
            false
        }
    }
}

type CtxSetCurrentFn = unsafe extern "C" fn(*mut std::ffi::c_void) -> CuResult;
type CtxSynchronizeFn = unsafe extern "C" fn() -> CuResult;

/// Waits for the work queued in `contexts` (on this, the monitor's, thread).
fn synchronize(contexts: &[usize]) {
    let (Some(set), Some(sync)) = (
        crate::real::driver::<CtxSetCurrentFn>(c"cuCtxSetCurrent"),
        crate::real::driver::<CtxSynchronizeFn>(c"cuCtxSynchronize"),
    ) else {
        return;
    };
    for &ctx in contexts {
        // SAFETY: a context this process made current on one of its threads; the driver
        // answers an error for one destroyed since, which is ignored.
        let _ = unsafe { set(ctx as *mut std::ffi::c_void) };
        // SAFETY: no arguments.
        let _ = unsafe { sync() };
    }
}

/// The monitor thread: ends a burst once its work has completed and it stayed idle.
fn monitor() {
    let idle = idle_time();
    let tick = (idle / 2).max(Duration::from_micros(200));
    let mut last_call = Instant::now();
    loop {
        if STATE.load(Ordering::Acquire) == IDLE {
            let mut g = inner();
            while STATE.load(Ordering::Acquire) == IDLE {
                g = CHANGED
                    .wait(g)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            last_call = Instant::now();
        }
        std::thread::sleep(tick);
        if STATE
            .compare_exchange(TOUCHED, GRANTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            || IN_CALL.load(Ordering::Acquire) > 0
        {
            last_call = Instant::now();
            continue;
        }
        if last_call.elapsed() < idle {
            continue;
        }
        let monitor = monitor_lock();
        // A capture open: synchronizing would invalidate it, and the burst is not over.
        if crate::lifecycle::capturing() {
            drop(monitor);
            last_call = Instant::now();
            continue;
        }
        let contexts = inner().contexts.clone();
        let before = Instant::now();
        synchronize(&contexts);
        drop(monitor);
        // Work still running when the idle time was up ended when the synchronize returned;
        // otherwise it ended by the last call (as near as this thread can see).
        let completed = if before.elapsed() > tick {
            Instant::now()
        } else {
            last_call
        };
        let mut g = inner();
        if IN_CALL.load(Ordering::Acquire) > 0
            || STATE
                .compare_exchange(GRANTED, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            // A call came meanwhile: the burst goes on.
            continue;
        }
        let idle_ns = u64::try_from(completed.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if g.conn.is_some() {
            // A begin that comes now waits for this end (`asking`), so the shim always hears
            // them in order; the lock itself is not held while the shim answers.
            g.asking = true;
            let mut answer;
            (g, answer) = converse(g, &end_line(idle_ns));
            if answer
                .as_ref()
                .is_err_and(|e| e == "shim: error unknown request")
                && !OLD_SHIM.swap(true, Ordering::Relaxed)
            {
                (g, answer) = converse(g, &end_line(idle_ns));
            }
            if let Err(e) = answer {
                log!("burst end: {e}");
            }
            g.asking = false;
        }
        drop(g);
        CHANGED.notify_all();
    }
}

/// In a forked child: no burst, no connection (the parent's stays the parent's), no monitor
/// (threads do not survive fork). Called with the interposer's locks held by this thread.
pub(crate) fn reset_in_child(g: &mut Inner) {
    // The child's copy of the parent's socket is closed; the parent's connection is untouched.
    g.conn = None;
    // And the copy of one a parent's thread was asking on (that thread is not in the child).
    let fd = IN_FLIGHT_FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: `fd` was the parent's connection at the fork; in the child no object owns
        // this copy (its owner was on another thread's stack), so closing it closes nothing else.
        unsafe { libc::close(fd) };
    }
    g.asking = false;
    g.contexts.clear();
    g.monitor = false;
    STATE.store(IDLE, Ordering::Release);
    IN_CALL.store(0, Ordering::Release);
    MOVED.store(0, Ordering::Release);
}

/// Held by the monitor while it synchronizes the burst's contexts, by a capture while it begins
/// and by a context's destruction (see `lifecycle`): taken before the burst lock, never after.
static MONITOR: Mutex<()> = Mutex::new(());

/// The monitor's lock (see [`MONITOR`]).
pub(crate) fn monitor_lock() -> MutexGuard<'static, ()> {
    MONITOR
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A context is about to be destroyed: the monitor is not synchronizing one, and forgets the
/// burst's contexts, so it never uses this one again. Held until the destruction returns.
pub(crate) fn forget_contexts() -> MutexGuard<'static, ()> {
    let g = monitor_lock();
    inner().contexts.clear();
    g
}

/// The burst lock, for the fork handlers (taken after the interposer's others).
pub(crate) fn lock_for_fork() -> MutexGuard<'static, Inner> {
    inner()
}

/// For the fork handlers' type.
pub(crate) type Guard = MutexGuard<'static, Inner>;
