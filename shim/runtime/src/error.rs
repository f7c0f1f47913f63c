//! The shim's errors and their one mapping to ttrpc status codes.
//!
//! containerd and CRI act on the code: `NOT_FOUND` for an unknown task makes `ctr task delete` of a
//! gone container succeed, `FAILED_PRECONDITION` tells the caller the state is wrong, and
//! `UNIMPLEMENTED` (not the protos' default `NOT_FOUND`) tells it a call is unsupported.

use containerd_shim_protos::ttrpc;

/// Errors of the task service.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input from the caller (a malformed annotation, an unknown option type, a bad spec).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Bad input that a parser refused: what was being read, and the parser's error.
    #[error("invalid argument: {what}")]
    Invalid {
        /// What was being read (the field, annotation or file at fault).
        what: String,
        /// Why the parser refused it.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No such container or exec process.
    #[error("{0}: not found")]
    NotFound(String),
    /// A container or exec process with that id exists already.
    #[error("{0}: already exists")]
    AlreadyExists(String),
    /// The process is not in a state that allows the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A service the call needs (mqfqd, with fail-closed admission) is unreachable.
    #[error("{0}")]
    Unavailable(String),
    /// A step with a deadline did not finish in time (work on a container's rootfs).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The call is not supported by this shim.
    #[error("{0} is not implemented by the mqfq shim")]
    Unimplemented(&'static str),
    /// runc failed; `stderr` is what runc said.
    #[error("runc {op} {id}: {detail}")]
    Runc {
        /// The runc subcommand.
        op: &'static str,
        /// Container id.
        id: String,
        /// runc's message (its last log line or stderr).
        detail: String,
    },
    /// A filesystem or process operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An error from the containerd-shim library (mounts, spec reading, events).
    #[error("shim runtime")]
    Shim(#[source] containerd_shim::Error),
}

impl From<containerd_shim::Error> for Error {
    fn from(e: containerd_shim::Error) -> Self {
        Error::Shim(e)
    }
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// Input a parser refused, with the parser's error as the source.
    pub fn invalid(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Invalid {
            what: what.into(),
            source: source.into(),
        }
    }

    /// The ttrpc code for this error.
    #[must_use]
    pub fn code(&self) -> ttrpc::Code {
        match self {
            Error::InvalidArgument(_) | Error::Invalid { .. } => ttrpc::Code::INVALID_ARGUMENT,
            Error::NotFound(_) => ttrpc::Code::NOT_FOUND,
            Error::AlreadyExists(_) => ttrpc::Code::ALREADY_EXISTS,
            Error::FailedPrecondition(_) => ttrpc::Code::FAILED_PRECONDITION,
            Error::Unimplemented(_) => ttrpc::Code::UNIMPLEMENTED,
            Error::Unavailable(_) => ttrpc::Code::UNAVAILABLE,
            Error::DeadlineExceeded(_) => ttrpc::Code::DEADLINE_EXCEEDED,
            Error::Runc { .. } | Error::Io { .. } | Error::Shim(_) => ttrpc::Code::INTERNAL,
        }
    }

    /// The message with every source appended, as containerd shows it to the user.
    #[must_use]
    pub fn full_message(&self) -> String {
        chain(&self.to_string(), std::error::Error::source(self))
    }
}

impl From<Error> for ttrpc::Error {
    fn from(e: Error) -> Self {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), e.full_message()))
    }
}

/// `msg`, then each error of the chain from `src` on that it does not already end with (an
/// error whose message quotes its source would otherwise say it twice).
pub fn chain(msg: &str, mut src: Option<&(dyn std::error::Error + 'static)>) -> String {
    let mut msg = msg.to_owned();
    while let Some(s) = src {
        let text = s.to_string();
        if !msg.ends_with(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        src = s.source();
    }
    msg
}

/// Results of the task service.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    fn status(e: Error) -> (ttrpc::Code, String) {
        match ttrpc::Error::from(e) {
            ttrpc::Error::RpcStatus(s) => (s.code(), s.message().to_owned()),
            other => panic!("not a status: {other:?}"),
        }
    }

    #[test]
    fn one_code_per_kind() {
        assert_eq!(
            status(Error::InvalidArgument("annotation io.mqfq.weight".into())).0,
            ttrpc::Code::INVALID_ARGUMENT
        );
        assert_eq!(
            status(Error::NotFound("c1".into())).0,
            ttrpc::Code::NOT_FOUND
        );
        assert_eq!(
            status(Error::AlreadyExists("c1".into())).0,
            ttrpc::Code::ALREADY_EXISTS
        );
        assert_eq!(
            status(Error::FailedPrecondition("stopped".into())).0,
            ttrpc::Code::FAILED_PRECONDITION
        );
        assert_eq!(
            status(Error::Unimplemented("checkpoint")).0,
            ttrpc::Code::UNIMPLEMENTED
        );
        assert_eq!(
            status(Error::DeadlineExceeded("rootfs work".into())).0,
            ttrpc::Code::DEADLINE_EXCEEDED
        );
        let bad = serde_json::from_str::<u32>("x").unwrap_err();
        let (code, msg) = status(Error::invalid("exec e1 spec", bad));
        assert_eq!(code, ttrpc::Code::INVALID_ARGUMENT);
        assert!(
            msg.starts_with("invalid argument: exec e1 spec: expected"),
            "{msg}"
        );
        // A source whose text its error already ends with is said once.
        let quoting = crate::nvidia::edits::EditError::Io {
            what: "read /x".into(),
            source: std::io::Error::from_raw_os_error(libc::ELOOP),
        };
        let msg = Error::invalid("GPU container c", quoting).full_message();
        assert_eq!(msg.matches("os error 40").count(), 1, "{msg}");
        let (code, msg) = status(Error::io(
            "open fifo /x",
            std::io::Error::from_raw_os_error(libc::ENOENT),
        ));
        assert_eq!(code, ttrpc::Code::INTERNAL);
        assert!(msg.starts_with("open fifo /x: "), "{msg}");
        let (code, msg) = status(Error::Runc {
            op: "create",
            id: "c1".into(),
            detail: "exec: \"nope\": not found".into(),
        });
        assert_eq!(code, ttrpc::Code::INTERNAL);
        assert!(msg.contains("runc create c1"), "{msg}");
    }
}
