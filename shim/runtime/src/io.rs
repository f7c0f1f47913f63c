//! Process stdio: pipes between the container and the shim, copied to the caller's FIFOs.
//!
//! The container never holds the caller's FIFOs: it writes to pipes the shim owns, and the shim
//! copies to the FIFOs (opened read-write, so opening never blocks and a vanished reader never
//! kills the container with SIGPIPE). When the container exits, the pipes reach EOF; the exit is
//! published only after the copies drained, so `ctr run --rm` sees all output.
//!
//! Log URIs (nerdctl, `ctr --log-uri`): `file:///path` appends stdout and stderr to a file;
//! `binary:///path?k=v` starts a logging binary with the output pipes' read ends as fds 3 and 4,
//! a readiness pipe as fd 5 (closed by the binary when ready), `CONTAINER_ID` and
//! `CONTAINER_NAMESPACE` in its environment, and `k v` pairs as arguments — containerd's
//! protocol. Terminals go through [`crate::console`]: runc sends the pty master over a console
//! socket and the shim copies between it and the FIFOs.

use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::task::JoinHandle;

use crate::console::{Console, ConsoleSocket, fifo_sender};
use crate::error::{Error, Result};

/// Where a process's stdio goes, as containerd names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StdioPaths {
    /// stdin FIFO (empty: none).
    pub stdin: String,
    /// stdout FIFO or URI (empty: discard).
    pub stdout: String,
    /// stderr FIFO or URI (empty: discard).
    pub stderr: String,
    /// Whether the process wants a terminal.
    pub terminal: bool,
}

impl StdioPaths {
    /// A request's stdio, checked (see [`check`](Self::check)).
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub fn checked(stdin: &str, stdout: &str, stderr: &str, terminal: bool) -> Result<Self> {
        let s = StdioPaths {
            stdin: stdin.to_owned(),
            stdout: stdout.to_owned(),
            stderr: stderr.to_owned(),
            terminal,
        };
        s.check()?;
        Ok(s)
    }

    /// Checks that the shim can serve these paths.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed or unknown log URI, a URI on stdin, or a log
    /// URI with a terminal.
    pub fn check(&self) -> Result<()> {
        if self.terminal && self.stdout.contains("://") {
            return Err(Error::InvalidArgument(
                "a terminal writes to a FIFO, not a log URI".into(),
            ));
        }
        if self.stdin.contains("://") {
            return Err(Error::InvalidArgument(format!(
                "stdin {:?} must be a FIFO",
                self.stdin
            )));
        }
        for p in [&self.stdout, &self.stderr] {
            Target::parse(p)?;
        }
        Ok(())
    }
}

/// Where an output stream goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Nowhere.
    Discard,
    /// A FIFO (or plain path) containerd created.
    Fifo(String),
    /// `file:///path`.
    File(String),
    /// `binary:///path?k=v…`: the program and its arguments.
    Binary(String, Vec<String>),
}

fn percent_decode(s: &str) -> Result<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| Error::InvalidArgument(format!("bad escape in {s:?}")))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| Error::InvalidArgument(format!("{s:?} is not UTF-8")))
}

impl Target {
    /// Parses containerd's stdout/stderr string.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unknown scheme, a relative path, or bad escapes.
    pub fn parse(s: &str) -> Result<Target> {
        if s.is_empty() {
            return Ok(Target::Discard);
        }
        let Some((scheme, rest)) = s.split_once("://") else {
            return Ok(Target::Fifo(s.to_owned()));
        };
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let path = percent_decode(path)?;
        if !path.starts_with('/') {
            return Err(Error::InvalidArgument(format!(
                "log URI {s:?}: path must be absolute"
            )));
        }
        match scheme {
            "file" => Ok(Target::File(path)),
            "binary" => {
                let mut args = Vec::new();
                for kv in query.split('&').filter(|kv| !kv.is_empty()) {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    args.push(percent_decode(k)?);
                    if !v.is_empty() {
                        args.push(percent_decode(v)?);
                    }
                }
                Ok(Target::Binary(path, args))
            }
            other => Err(Error::InvalidArgument(format!(
                "log URI {s:?}: unknown scheme {other:?} (fifo path, file:// or binary://)"
            ))),
        }
    }
}

/// The pipe ends handed to runc (and through it to the container).
#[derive(Debug, Default)]
struct ChildEnds {
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

/// runc's view of the pipes: it gives the child ends to the process and drops them afterwards.
#[derive(Debug)]
pub struct ChildIo(Mutex<ChildEnds>);

#[async_trait]
impl runc::io::Io for ChildIo {
    async fn set(&self, cmd: &mut runc::Command) -> std::io::Result<()> {
        let ends = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("stdio lock poisoned"))?;
        if let Some(fd) = &ends.stdin {
            cmd.stdin(fd.try_clone()?);
        }
        if let Some(fd) = &ends.stdout {
            cmd.stdout(fd.try_clone()?);
        }
        if let Some(fd) = &ends.stderr {
            cmd.stderr(fd.try_clone()?);
        }
        Ok(())
    }

    async fn close_after_start(&self) {
        if let Ok(mut ends) = self.0.lock() {
            *ends = ChildEnds::default();
        }
    }
}

/// The shim's side of a process's stdio.
#[derive(Debug)]
pub struct ProcessIo {
    /// Handed to runc create / exec.
    pub child: std::sync::Arc<ChildIo>,
    stdin: Option<JoinHandle<()>>,
    outputs: Vec<JoinHandle<()>>,
    console_socket: Option<ConsoleSocket>,
    console: Option<Console>,
    paths: StdioPaths,
}

fn pipe_pair(what: &str) -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io(format!("create {what} pipe"), e.into()))
}

fn open_fifo_writer(path: &str) -> Result<pipe::Sender> {
    pipe::OpenOptions::new()
        .read_write(true)
        .open_sender(path)
        .map_err(|e| Error::io(format!("open stdio fifo {path}"), e))
}

async fn copy_out(rd: OwnedFd, path: String) {
    let mut reader = match pipe::Receiver::from_owned_fd(rd) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("stdio pipe for {path}: {e}");
            return;
        }
    };
    let mut writer = match open_fifo_writer(&path) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("{}", e.full_message());
            // Drain so the container never blocks on a full pipe.
            let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
            return;
        }
    };
    if let Err(e) = tokio::io::copy(&mut reader, &mut writer).await {
        tracing::debug!("copy to {path} ended: {e}");
    }
    let _ = writer.flush().await;
}

async fn discard(rd: OwnedFd) {
    if let Ok(mut r) = pipe::Receiver::from_owned_fd(rd) {
        let _ = tokio::io::copy(&mut r, &mut tokio::io::sink()).await;
    }
}

async fn copy_to_file(rd: OwnedFd, mut file: tokio::fs::File) {
    if let Ok(mut r) = pipe::Receiver::from_owned_fd(rd) {
        if let Err(e) = tokio::io::copy(&mut r, &mut file).await {
            tracing::warn!("copy to log file: {e}");
        }
        let _ = file.flush().await;
    }
}

/// How long a logging binary may take to signal readiness.
const BINARY_READY: Duration = Duration::from_secs(10);

/// Starts a logging binary with stdout/stderr read ends as fds 3 and 4 and the readiness pipe's
/// write end as fd 5, then waits until it closes fd 5 (or exits).
async fn start_binary(
    bin: &str,
    args: &[String],
    out: OwnedFd,
    err: OwnedFd,
    id: &str,
    namespace: &str,
) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

    let (ready_rd, ready_wr) = pipe_pair("log binary readiness")?;
    let fds = [out.as_raw_fd(), err.as_raw_fd(), ready_wr.as_raw_fd()];
    let mut cmd = std::process::Command::new(bin);
    cmd.args(args)
        .env("CONTAINER_ID", id)
        .env("CONTAINER_NAMESPACE", namespace)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and only calls dup2, which is
    // async-signal-safe; it touches no memory shared with the parent beyond the copied array.
    unsafe {
        cmd.pre_exec(move || {
            // Move the three descriptors out of the way first, so dup2 onto 3, 4, 5 never
            // clobbers one of them.
            let mut tmp = [0; 3];
            for (t, fd) in tmp.iter_mut().zip(fds) {
                let d = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10);
                if d < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                *t = d;
            }
            for (target, fd) in (3..).zip(tmp) {
                // dup2 clears close-on-exec on the new descriptor.
                if libc::dup2(fd, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    // The child is reaped by the shim's reaper; nothing waits on it here.
    let child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("start logging binary {bin}"), e))?;
    drop(child);
    drop((out, err, ready_wr));
    let mut ready = pipe::Receiver::from_owned_fd(ready_rd)
        .map_err(|e| Error::io("log binary readiness pipe", e))?;
    let mut buf = [0u8; 1];
    match tokio::time::timeout(
        BINARY_READY,
        tokio::io::AsyncReadExt::read(&mut ready, &mut buf),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Error::io(format!("logging binary {bin}"), e)),
        Err(_) => Err(Error::io(
            format!("logging binary {bin} not ready after {BINARY_READY:?}"),
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        )),
    }
}

async fn copy_in(path: String, wr: OwnedFd) {
    let mut writer = match pipe::Sender::from_owned_fd(wr) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("stdin pipe: {e}");
            return;
        }
    };
    let mut reader = match pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&path)
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("open stdin fifo {path}: {e}");
            return;
        }
    };
    if let Err(e) = tokio::io::copy(&mut reader, &mut writer).await {
        tracing::debug!("copy from {path} ended: {e}");
    }
}

impl ProcessIo {
    /// Creates the pipes for `paths` and starts copying. Call [`StdioPaths::check`] first.
    /// `id` and `namespace` go to a logging binary's environment.
    ///
    /// # Errors
    /// Pipe creation failed, a log file could not be opened, or a logging binary could not be
    /// started or did not become ready.
    pub async fn new(paths: &StdioPaths, id: &str, namespace: &str) -> Result<Self> {
        if paths.terminal {
            return Ok(ProcessIo {
                child: std::sync::Arc::new(ChildIo(Mutex::new(ChildEnds::default()))),
                stdin: None,
                outputs: Vec::new(),
                console_socket: Some(ConsoleSocket::new()?),
                console: None,
                paths: paths.clone(),
            });
        }
        let mut child = ChildEnds::default();
        let mut outputs = Vec::new();
        let mut stdin = None;
        if !paths.stdin.is_empty() {
            let (rd, wr) = pipe_pair("stdin")?;
            child.stdin = Some(rd);
            stdin = Some(tokio::spawn(copy_in(paths.stdin.clone(), wr)));
        }
        let out_target = Target::parse(&paths.stdout)?;
        let err_target = Target::parse(&paths.stderr)?;
        let (out_rd, out_wr) = pipe_pair("stdout")?;
        let (err_rd, err_wr) = pipe_pair("stderr")?;
        child.stdout = Some(out_wr);
        child.stderr = Some(err_wr);
        if let Target::Binary(bin, args) = &out_target {
            // One logging binary reads both streams (containerd sends the same URI for both).
            start_binary(bin, args, out_rd, err_rd, id, namespace).await?;
        } else {
            for (rd, target) in [(out_rd, out_target), (err_rd, err_target)] {
                outputs.push(match target {
                    Target::Fifo(path) => tokio::spawn(copy_out(rd, path)),
                    Target::File(path) => {
                        let f = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&path)
                            .map_err(|e| Error::io(format!("open log file {path}"), e))?;
                        tokio::spawn(copy_to_file(rd, tokio::fs::File::from_std(f)))
                    }
                    Target::Discard | Target::Binary(..) => tokio::spawn(discard(rd)),
                });
            }
        }
        Ok(ProcessIo {
            child: std::sync::Arc::new(ChildIo(Mutex::new(child))),
            stdin,
            outputs,
            console_socket: None,
            console: None,
            paths: paths.clone(),
        })
    }

    /// The console socket runc must send the pty master to (terminals only).
    #[must_use]
    pub fn console_socket_path(&self) -> Option<std::path::PathBuf> {
        self.console_socket.as_ref().map(|s| s.path().to_owned())
    }

    /// Takes the console socket, to receive on it without holding the process.
    pub fn take_console_socket(&mut self) -> Option<ConsoleSocket> {
        self.console_socket.take()
    }

    /// Starts copying between the pty master and the FIFOs.
    ///
    /// # Errors
    /// The master cannot be used, or the stdout FIFO cannot be opened.
    pub fn attach_console(&mut self, master: std::os::fd::OwnedFd) -> Result<()> {
        let console = Console::new(master)?;
        if !self.paths.stdout.is_empty() {
            let out = fifo_sender(&self.paths.stdout)?;
            let c = console.handle();
            self.outputs
                .push(tokio::spawn(async move { c.copy_out(out).await }));
        } else {
            let c = console.handle();
            self.outputs.push(tokio::spawn(
                async move { c.copy_out(tokio::io::sink()).await },
            ));
        }
        if !self.paths.stdin.is_empty() {
            let input = pipe::OpenOptions::new()
                .read_write(true)
                .open_receiver(&self.paths.stdin)
                .map_err(|e| Error::io(format!("open stdin fifo {}", self.paths.stdin), e))?;
            let c = console.handle();
            self.stdin = Some(tokio::spawn(async move { c.copy_in(input).await }));
        }
        self.console = Some(console);
        Ok(())
    }

    /// Resizes the terminal; a no-op for processes without one.
    ///
    /// # Errors
    /// The ioctl failed.
    pub fn resize(&self, width: u32, height: u32) -> Result<()> {
        match &self.console {
            Some(c) => c.resize(width, height),
            None => Ok(()),
        }
    }

    /// Closes the process's stdin (CloseIO): the process reads EOF.
    pub fn close_stdin(&mut self) {
        if let Some(h) = self.stdin.take() {
            h.abort();
        }
    }

    /// Waits until the output copies drained (the process and everything holding its pipes
    /// exited), at most `limit`.
    pub async fn drain(&mut self, limit: Duration) {
        let outs = std::mem::take(&mut self.outputs);
        let all = async {
            for h in outs {
                let _ = h.await;
            }
        };
        if tokio::time::timeout(limit, all).await.is_err() {
            tracing::warn!("stdio still open {limit:?} after exit; publishing the exit anyway");
        }
    }

    /// Stops every copy now (Delete).
    pub fn shutdown(&mut self) {
        self.close_stdin();
        for h in self.outputs.drain(..) {
            h.abort();
        }
    }
}

impl Drop for ProcessIo {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[test]
    fn unsupported_stdio_is_refused_up_front() {
        let tty = StdioPaths {
            terminal: true,
            stdout: "file:///tmp/x".into(),
            ..StdioPaths::default()
        };
        assert!(matches!(tty.check(), Err(Error::InvalidArgument(_))));
        let bad = StdioPaths {
            stdout: "syslog:///x".into(),
            ..StdioPaths::default()
        };
        assert!(matches!(bad.check(), Err(Error::InvalidArgument(_))));
        StdioPaths::default().check().unwrap();
    }

    #[test]
    fn targets_parse_like_containerd() {
        assert_eq!(Target::parse("").unwrap(), Target::Discard);
        assert_eq!(
            Target::parse("/run/x/stdout").unwrap(),
            Target::Fifo("/run/x/stdout".into())
        );
        assert_eq!(
            Target::parse("file:///var/log/a%20b.log").unwrap(),
            Target::File("/var/log/a b.log".into())
        );
        assert_eq!(
            Target::parse("binary:///usr/bin/nerdctl?_NERDCTL_INTERNAL_LOGGING=%2Fvar%2Flib&x")
                .unwrap(),
            Target::Binary(
                "/usr/bin/nerdctl".into(),
                vec![
                    "_NERDCTL_INTERNAL_LOGGING".into(),
                    "/var/lib".into(),
                    "x".into()
                ]
            )
        );
        Target::parse("file://relative/path").unwrap_err();
        Target::parse("binary:///x?a=%zz").unwrap_err();
    }

    #[tokio::test]
    async fn output_reaches_the_fifo_and_drains() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("out");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let mut reader = pipe::OpenOptions::new().open_receiver(&fifo).unwrap();
        let paths = StdioPaths {
            stdout: fifo.to_str().unwrap().into(),
            ..StdioPaths::default()
        };
        let mut io = ProcessIo::new(&paths, "c", "ns").await.unwrap();
        // Play the container: write to the child end, then close it.
        let wr = io.child.0.lock().unwrap().stdout.take().unwrap();
        io.child.0.lock().unwrap().stderr.take();
        let mut w = pipe::Sender::from_owned_fd(wr).unwrap();
        w.write_all(b"hello\n").await.unwrap();
        drop(w);
        io.drain(Duration::from_secs(5)).await;
        let mut buf = [0u8; 6];
        reader.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello\n");
    }
}
