//! A process (a container's init or an exec) and its life cycle as an explicit state machine.

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

/// One process.
#[derive(Debug)]
pub struct Proc {
    /// `""` for init, else the exec id.
    pub exec_id: String,
    /// Pid once known (0 before an exec starts).
    pub pid: u32,
    /// State.
    pub status: Status,
    /// Its stdio as containerd named it.
    pub stdio: StdioPaths,
    /// The shim's side of its stdio (taken at exit to drain).
    pub io: Option<ProcessIo>,
    /// Exit, once seen.
    pub exit: Option<Exit>,
    /// A start call is between "runc start/exec" and publishing the start event.
    pub starting: bool,
    /// The start event was published.
    pub started: bool,
    /// The exit event was published (exactly once).
    pub exit_published: bool,
    /// The exit is recorded and drained, waiting for the start event to go out first.
    pub exit_ready: bool,
    /// Exec process spec (JSON), for execs.
    pub spec: Option<oci_spec::runtime::Process>,
    /// Wait() watchers.
    pub exit_tx: watch::Sender<Option<Exit>>,
}

impl Proc {
    /// A process in `Created`.
    #[must_use]
    pub fn new(exec_id: &str, pid: u32, stdio: StdioPaths, io: Option<ProcessIo>) -> Self {
        Proc {
            exec_id: exec_id.to_owned(),
            pid,
            status: Status::Created,
            stdio,
            io,
            exit: None,
            starting: false,
            started: false,
            exit_published: false,
            exit_ready: false,
            spec: None,
            exit_tx: watch::channel(None).0,
        }
    }
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
}
