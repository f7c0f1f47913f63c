//! A process (a container's init or an exec) and its life cycle as an explicit state machine.
//!
//! Three things move independently and must stay consistent: its [`Status`] (what `State`
//! reports), its start (runc start / exec happens outside the shim's lock, so an exit can be seen
//! while a start is still in progress), and its exit (seen when reaped, published as `TaskExit`
//! once its stdio is drained — and never before its start event). The fields are private; every
//! change goes through a method named after what happened, so no caller can, say, publish an
//! exit twice or mark a stopped process running.

use std::time::SystemTime;

use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::io::{ProcessIo, StdioPaths};

/// Where a process is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Created by runc (init) or recorded (exec), not started.
    Created,
    /// Running.
    Running,
    /// Frozen (init only).
    Paused,
    /// Exited.
    Stopped,
}

/// A call that moves a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Start.
    Start,
    /// Pause.
    Pause,
    /// Resume.
    Resume,
    /// The process exited.
    Exit,
}

impl Status {
    /// The status after `t`, or why `t` is not allowed now.
    ///
    /// # Errors
    /// [`Error::FailedPrecondition`] naming the status and the call.
    pub fn apply(self, t: Transition) -> Result<Status> {
        match (self, t) {
            (Status::Created, Transition::Start) | (Status::Paused, Transition::Resume) => {
                Ok(Status::Running)
            }
            (Status::Running, Transition::Pause) => Ok(Status::Paused),
            (_, Transition::Exit) => Ok(Status::Stopped),
            (s, t) => Err(Error::FailedPrecondition(format!(
                "cannot {t:?} a process that is {s:?}"
            ))),
        }
    }
}

/// How and when a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Exit status (128 + signal when killed).
    pub code: u32,
    /// When the shim saw it.
    pub at: SystemTime,
}

/// Where the process's start is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    NotYet,
    InProgress,
    Done,
}

/// Where its exit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// Not exited.
    Alive,
    /// Reaped; its stdio is being drained.
    Seen(Exit),
    /// Drained while its start was in progress: published right after the start event.
    Deferred(Exit),
    /// `TaskExit` went out and Wait returned (exactly once).
    Published(Exit),
}

/// One process.
#[derive(Debug)]
pub struct Proc {
    exec_id: String,
    pid: u32,
    status: Status,
    start: Start,
    ending: Ending,
    /// Its stdio as containerd named it.
    pub stdio: StdioPaths,
    /// The shim's side of its stdio (taken at exit to drain).
    pub io: Option<ProcessIo>,
    /// Exec process spec (JSON), for execs.
    pub spec: Option<oci_spec::runtime::Process>,
    exit_tx: watch::Sender<Option<Exit>>,
}

impl Proc {
    /// A process in `Created`.
    #[must_use]
    pub fn new(exec_id: &str, pid: u32, stdio: StdioPaths, io: Option<ProcessIo>) -> Self {
        Proc {
            exec_id: exec_id.to_owned(),
            pid,
            status: Status::Created,
            start: Start::NotYet,
            ending: Ending::Alive,
            stdio,
            io,
            spec: None,
            exit_tx: watch::channel(None).0,
        }
    }

    /// `""` for init, else the exec id.
    #[must_use]
    pub fn exec_id(&self) -> &str {
        &self.exec_id
    }

    /// Pid once known (0 before an exec starts).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What `State` reports.
    #[must_use]
    pub fn status(&self) -> Status {
        self.status
    }

    /// The exit, once seen.
    #[must_use]
    pub fn exit(&self) -> Option<Exit> {
        match self.ending {
            Ending::Alive => None,
            Ending::Seen(e) | Ending::Deferred(e) | Ending::Published(e) => Some(e),
        }
    }

    /// Whether a reaped `pid` is this process, still alive as far as the shim knows.
    #[must_use]
    pub fn is_running_pid(&self, pid: u32) -> bool {
        pid != 0 && self.pid == pid && self.ending == Ending::Alive
    }

    /// For Wait: the exit, once published.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Option<Exit>> {
        self.exit_tx.subscribe()
    }

    /// Whether `t` is allowed now.
    ///
    /// # Errors
    /// [`Error::FailedPrecondition`] naming the status and the call.
    pub fn check(&self, t: Transition) -> Result<()> {
        self.status.apply(t).map(|_| ())
    }

    /// Pause or Resume happened (runc did it): the status moves, unless the process exited
    /// meanwhile (an exit is final).
    pub fn paused(&mut self, paused: bool) {
        let t = if paused {
            Transition::Pause
        } else {
            Transition::Resume
        };
        if let Ok(s) = self.status.apply(t) {
            self.status = s;
        }
    }

    /// A Start call begins (runc start / exec comes next, outside the shim's lock).
    ///
    /// # Errors
    /// `FAILED_PRECONDITION` unless Created, or while another start is in progress.
    pub fn begin_start(&mut self) -> Result<()> {
        self.check(Transition::Start)?;
        if self.start == Start::InProgress {
            return Err(Error::FailedPrecondition(format!(
                "{} {}: already starting",
                if self.exec_id.is_empty() {
                    "init"
                } else {
                    "exec"
                },
                self.exec_id
            )));
        }
        self.start = Start::InProgress;
        Ok(())
    }

    /// The start did not happen (admission refused, runc failed): it may be tried again.
    pub fn start_failed(&mut self) {
        if self.start == Start::InProgress {
            self.start = Start::NotYet;
        }
    }

    /// An exec whose `runc exec` failed never ran: it is over, Wait returns 255, and no exit
    /// event goes out (there was no start event either). Only for the start in progress (a
    /// process made again under the same id since is not this one).
    pub fn never_ran(&mut self) {
        if self.start != Start::InProgress {
            return;
        }
        self.start_failed();
        self.status = Status::Stopped;
        let e = Exit {
            code: 255,
            at: SystemTime::now(),
        };
        self.ending = Ending::Published(e);
        self.exit_tx.send_replace(Some(e));
    }

    /// runc started it (an exec with its pid). Running, unless it already exited. False, and
    /// nothing changes, when no start of this process is in progress (it was deleted while
    /// starting and made again under the same id).
    #[must_use]
    pub fn started(&mut self, pid: Option<u32>) -> bool {
        if self.start != Start::InProgress {
            return false;
        }
        if let Some(pid) = pid {
            self.pid = pid;
        }
        if let Ok(s) = self.status.apply(Transition::Start) {
            self.status = s;
        }
        self.start = Start::Done;
        true
    }

    /// It was reaped: Stopped, and its stdio handed back to drain (once).
    pub fn exited(&mut self, exit: Exit) -> Option<ProcessIo> {
        if self.ending == Ending::Alive {
            self.ending = Ending::Seen(exit);
        }
        self.status = Status::Stopped;
        self.io.take()
    }

    /// Its stdio is drained: the exit is published now (`emit` sends the event, then Wait
    /// returns), or right after the start event when a start is in progress.
    pub fn drained(&mut self, emit: impl FnOnce(&str, u32, Exit)) {
        if let Ending::Seen(e) = self.ending {
            if self.start == Start::InProgress {
                self.ending = Ending::Deferred(e);
            } else {
                self.publish(e, emit);
            }
        }
    }

    /// After the start event: an exit drained meanwhile is published now.
    pub fn publish_deferred(&mut self, emit: impl FnOnce(&str, u32, Exit)) {
        if let Ending::Deferred(e) = self.ending {
            self.publish(e, emit);
        }
    }

    /// Its record goes (Delete): an exit not published yet (its stdio still draining, or
    /// waiting for a start event) goes out now, so `TaskExit` precedes `TaskDelete`.
    pub fn publish_now(&mut self, emit: impl FnOnce(&str, u32, Exit)) {
        if let Ending::Seen(e) | Ending::Deferred(e) = self.ending {
            self.publish(e, emit);
        }
    }

    fn publish(&mut self, e: Exit, emit: impl FnOnce(&str, u32, Exit)) {
        self.ending = Ending::Published(e);
        emit(&self.exec_id, self.pid, e);
        self.exit_tx.send_replace(Some(e));
    }
}

/// A host process's start time (`/proc/<pid>/stat` field 22, clock ticks since boot), or `None`
/// when it is gone: with its PID, what names one process (a PID is reused, the pair is not).
/// Read as bytes: a process names itself, and a name that is not UTF-8 must not hide it (the
/// burst socket's peers and the checkpoint backend's processes are both found by it).
#[must_use]
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis (the last one: the name may hold any byte):
    // field 3 onward; field 22 is the 20th.
    let rest = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let field = rest
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty())
        .nth(19)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions() {
        use Status::*;
        use Transition::*;
        assert_eq!(Created.apply(Start).unwrap(), Running);
        assert_eq!(Running.apply(Pause).unwrap(), Paused);
        assert_eq!(Paused.apply(Resume).unwrap(), Running);
        for s in [Created, Running, Paused, Stopped] {
            assert_eq!(s.apply(Exit).unwrap(), Stopped);
        }
        for (s, t) in [
            (Running, Start),
            (Stopped, Start),
            (Created, Pause),
            (Running, Resume),
        ] {
            let e = s.apply(t).unwrap_err();
            assert!(matches!(e, Error::FailedPrecondition(_)), "{s:?} {t:?}");
        }
    }

    fn init() -> Proc {
        Proc::new("", 7, StdioPaths::default(), None)
    }

    fn exit(code: u32) -> super::Exit {
        super::Exit {
            code,
            at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn an_exit_drained_during_its_start_goes_out_after_the_start_and_once() {
        let mut p = init();
        let wait = p.subscribe();
        p.begin_start().unwrap();
        p.begin_start().unwrap_err();
        assert!(p.is_running_pid(7));
        p.exited(exit(3));
        assert!(!p.is_running_pid(7), "reaped");
        let mut sent = Vec::new();
        p.drained(|id, pid, e| sent.push((id.to_owned(), pid, e.code)));
        assert!(sent.is_empty(), "not before the start event");
        assert_eq!(
            *wait.borrow(),
            None,
            "Wait does not return before the event"
        );
        assert!(p.started(None));
        assert_eq!(p.status(), Status::Stopped, "an exit is final");
        p.publish_deferred(|id, pid, e| sent.push((id.to_owned(), pid, e.code)));
        p.publish_deferred(|id, pid, e| sent.push((id.to_owned(), pid, e.code)));
        p.drained(|id, pid, e| sent.push((id.to_owned(), pid, e.code)));
        p.publish_now(|id, pid, e| sent.push((id.to_owned(), pid, e.code)));
        assert_eq!(sent, [(String::new(), 7, 3)], "exactly once");
        assert_eq!(wait.borrow().map(|e| e.code), Some(3));
    }

    #[test]
    fn a_failed_start_can_be_retried_and_an_exec_that_never_ran_is_over() {
        let mut p = init();
        p.begin_start().unwrap();
        p.start_failed();
        p.begin_start().unwrap();
        assert!(p.started(None));
        assert_eq!(p.status(), Status::Running);
        p.check(Transition::Start).unwrap_err();
        p.paused(true);
        assert_eq!(p.status(), Status::Paused);
        p.exited(exit(0));
        p.paused(false);
        assert_eq!(p.status(), Status::Stopped, "no resume after an exit");
        assert!(!p.started(None), "no start in progress");
        let mut e = Proc::new("e1", 0, StdioPaths::default(), None);
        e.never_ran();
        assert_eq!(e.status(), Status::Created, "not its start");
        let wait = e.subscribe();
        e.begin_start().unwrap();
        e.never_ran();
        assert_eq!(
            (e.status(), wait.borrow().map(|x| x.code)),
            (Status::Stopped, Some(255))
        );
        let mut sent = 0;
        e.drained(|_, _, _| sent += 1);
        e.publish_now(|_, _, _| sent += 1);
        assert_eq!(sent, 0, "no exit event for an exec that never started");
    }

    #[test]
    fn a_delete_publishes_an_exit_still_draining() {
        let mut p = init();
        p.begin_start().unwrap();
        assert!(p.started(None));
        p.exited(exit(9));
        let mut sent = Vec::new();
        p.publish_now(|_, pid, e| sent.push((pid, e.code)));
        p.drained(|_, pid, e| sent.push((pid, e.code)));
        assert_eq!(sent, [(7, 9)]);
    }
}
