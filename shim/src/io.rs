//! Process stdio: pipes between the container and the shim, copied to the caller's FIFOs.
//!
//! The container never holds the caller's FIFOs: it writes to pipes the shim owns, and the shim
//! copies to the FIFOs (opened read-write, so opening never blocks and a vanished reader never
//! kills the container with SIGPIPE). When the container exits, the pipes reach EOF; the exit is
//! published only after the copies drained, so `ctr run --rm` sees all output.
//!
//! `binary://` and `file://` log URIs (nerdctl) and terminals are not supported yet: they are
//! rejected with `UNIMPLEMENTED` at Create instead of losing output.

use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::task::JoinHandle;

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
    /// Checks that the shim can serve these paths.
    ///
    /// # Errors
    /// [`Error::Unimplemented`] for a terminal or a `binary://` / `file://` URI.
    pub fn check(&self) -> Result<()> {
        if self.terminal {
            return Err(Error::Unimplemented("terminal (tty) stdio"));
        }
        for p in [&self.stdin, &self.stdout, &self.stderr] {
            if p.starts_with("binary://") {
                return Err(Error::Unimplemented("binary:// log URIs"));
            }
            if p.starts_with("file://") {
                return Err(Error::Unimplemented("file:// log URIs"));
            }
        }
        Ok(())
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
    ///
    /// # Errors
    /// Pipe creation failed.
    pub fn new(paths: &StdioPaths) -> Result<Self> {
        let mut child = ChildEnds::default();
        let mut outputs = Vec::new();
        let mut stdin = None;
        if !paths.stdin.is_empty() {
            let (rd, wr) = pipe_pair("stdin")?;
            child.stdin = Some(rd);
            stdin = Some(tokio::spawn(copy_in(paths.stdin.clone(), wr)));
        }
        for (path, slot) in [
            (&paths.stdout, &mut child.stdout),
            (&paths.stderr, &mut child.stderr),
        ] {
            let (rd, wr) = pipe_pair("output")?;
            *slot = Some(wr);
            if path.is_empty() {
                outputs.push(tokio::spawn(async move {
                    if let Ok(mut r) = pipe::Receiver::from_owned_fd(rd) {
                        let _ = tokio::io::copy(&mut r, &mut tokio::io::sink()).await;
                    }
                }));
            } else {
                outputs.push(tokio::spawn(copy_out(rd, path.clone())));
            }
        }
        Ok(ProcessIo {
            child: std::sync::Arc::new(ChildIo(Mutex::new(child))),
            stdin,
            outputs,
        })
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
            ..StdioPaths::default()
        };
        assert!(matches!(tty.check(), Err(Error::Unimplemented(_))));
        let bin = StdioPaths {
            stdout: "binary:///usr/bin/logger?x=1".into(),
            ..StdioPaths::default()
        };
        assert!(matches!(bin.check(), Err(Error::Unimplemented(_))));
        StdioPaths::default().check().unwrap();
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
        let mut io = ProcessIo::new(&paths).unwrap();
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
