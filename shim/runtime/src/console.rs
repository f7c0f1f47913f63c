//! Terminals: runc creates the pty and hands its master to the shim over a unix "console
//! socket"; the shim copies between the master and the caller's FIFOs and resizes it.
//!
//! All I/O on the master is non-blocking (`AsyncFd`), so nothing can pin a thread: a blocking
//! read left in tokio's blocking pool would keep the shim from exiting after Shutdown.

use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::net::unix::pipe;

use crate::error::{Error, Result};

/// How long runc may take to send the pty master after create/exec returned.
const RECEIVE_LIMIT: Duration = Duration::from_secs(10);

/// A listening console socket in its own temporary directory.
#[derive(Debug)]
pub struct ConsoleSocket {
    dir: PathBuf,
    path: PathBuf,
    listener: UnixListener,
}

impl ConsoleSocket {
    /// Binds `/tmp/mqfq-pty-<random>/pty.sock` (short: socket paths are limited to 108 bytes,
    /// bundle paths can be longer).
    ///
    /// # Errors
    /// The directory or socket could not be made.
    pub fn new() -> Result<Self> {
        // mkdtemp replaces the trailing six X characters with random ones.
        let template = format!("/tmp/mqfq-pty-{}", "X".repeat(6));
        let dir = nix::unistd::mkdtemp(template.as_str())
            .map_err(|e| Error::io("create console socket dir", e.into()))?;
        let path = dir.join("pty.sock");
        let listener =
            UnixListener::bind(&path).map_err(|e| Error::io("bind console socket", e))?;
        Ok(ConsoleSocket {
            dir,
            path,
            listener,
        })
    }

    /// Where runc should connect.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts runc's connection and takes the pty master it sends.
    ///
    /// # Errors
    /// Nothing arrived in time, or the message held no descriptor.
    pub async fn receive(&self) -> Result<OwnedFd> {
        let (stream, _) = tokio::time::timeout(RECEIVE_LIMIT, self.listener.accept())
            .await
            .map_err(|_| {
                Error::io(
                    "no pty master on the console socket",
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                )
            })?
            .map_err(|e| Error::io("accept on console socket", e))?;
        let std = stream
            .into_std()
            .map_err(|e| Error::io("console socket", e))?;
        std.set_nonblocking(false)
            .map_err(|e| Error::io("console socket", e))?;
        tokio::task::spawn_blocking(move || receive_fd(&std))
            .await
            .map_err(|e| Error::io("console socket", std::io::Error::other(e)))?
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn receive_fd(sock: &std::os::unix::net::UnixStream) -> Result<OwnedFd> {
    let mut name = [0u8; 4096];
    let mut iov = [IoSliceMut::new(&mut name)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| Error::io("receive pty master", e.into()))?;
    for c in msg
        .cmsgs()
        .map_err(|e| Error::io("receive pty master", e.into()))?
    {
        if let ControlMessageOwned::ScmRights(fds) = c
            && let Some(&fd) = fds.first()
        {
            // Close any extra descriptors a confused peer sent.
            for &extra in &fds[1..] {
                // SAFETY: the kernel just installed `extra` in our table for us alone.
                drop(unsafe { OwnedFd::from_raw_fd(extra) });
            }
            // SAFETY: SCM_RIGHTS installed `fd` in our descriptor table; nothing else owns it.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    Err(Error::io(
        "console socket message carried no descriptor",
        std::io::Error::from(std::io::ErrorKind::InvalidData),
    ))
}

/// The shim's end of a process's terminal.
#[derive(Debug)]
pub struct Console {
    master: Arc<AsyncFd<std::fs::File>>,
}

impl Console {
    /// Wraps a pty master (made non-blocking).
    ///
    /// # Errors
    /// The descriptor cannot be made non-blocking or registered with the reactor.
    pub fn new(master: OwnedFd) -> Result<Self> {
        let flags = nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_GETFL)
            .map_err(|e| Error::io("pty flags", e.into()))?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&master, nix::fcntl::FcntlArg::F_SETFL(flags))
            .map_err(|e| Error::io("pty flags", e.into()))?;
        // SAFETY: the File owns the descriptor for the AsyncFd's whole life, so it stays open
        // and its as_raw_fd never changes.
        let master = unsafe { AsyncFd::register(std::fs::File::from(master)) }
            .map_err(|e| Error::io("register pty", e.into()))?;
        Ok(Console {
            master: Arc::new(master),
        })
    }

    /// Sets the terminal size.
    ///
    /// # Errors
    /// The ioctl failed.
    pub fn resize(&self, width: u32, height: u32) -> Result<()> {
        let ws = libc::winsize {
            ws_row: u16::try_from(height).unwrap_or(u16::MAX),
            ws_col: u16::try_from(width).unwrap_or(u16::MAX),
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which lives for the call;
        // the descriptor is a pty master we own.
        let r = unsafe { libc::ioctl(self.master.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if r < 0 {
            return Err(Error::io("resize pty", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Copies the terminal's output to `out` until the process side closes (EIO on Linux).
    pub async fn copy_out(&self, mut out: impl tokio::io::AsyncWrite + Unpin) {
        let mut buf = vec![0u8; 8192];
        loop {
            let Ok(mut guard) = self.master.readable().await else {
                break;
            };
            match guard.try_io(|f| f.get_ref().read(&mut buf)) {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(n)) => {
                    if out.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                Err(_would_block) => {}
            }
        }
        let _ = out.flush().await;
    }

    /// Copies `input` into the terminal until `input` ends.
    pub async fn copy_in(&self, mut input: impl tokio::io::AsyncRead + Unpin) {
        let mut buf = vec![0u8; 8192];
        loop {
            let n = match input.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let mut done = 0;
            while done < n {
                let Ok(mut guard) = self.master.writable().await else {
                    return;
                };
                match guard.try_io(|f| f.get_ref().write(&buf[done..n])) {
                    Ok(Ok(w)) => done += w,
                    Ok(Err(_)) => return,
                    Err(_would_block) => {}
                }
            }
        }
    }

    /// A second handle for another task.
    #[must_use]
    pub fn handle(&self) -> Console {
        Console {
            master: self.master.clone(),
        }
    }
}

/// Opens a FIFO for writing without blocking on the reader.
///
/// # Errors
/// The FIFO cannot be opened.
pub fn fifo_sender(path: &str) -> Result<pipe::Sender> {
    pipe::OpenOptions::new()
        .read_write(true)
        .open_sender(path)
        .map_err(|e| Error::io(format!("open stdio fifo {path}"), e))
}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;

    use nix::sys::socket::{ControlMessage, sendmsg};

    use super::*;

    #[tokio::test]
    async fn receives_a_pty_master_and_moves_bytes_both_ways() {
        let sock = ConsoleSocket::new().unwrap();
        let pty = nix::pty::openpty(None, None).unwrap();
        // Play runc: connect and send the master with the pty's name.
        let path = sock.path().to_owned();
        let master_fd = pty.master.as_raw_fd();
        let sender = std::thread::spawn(move || {
            let s = std::os::unix::net::UnixStream::connect(path).unwrap();
            let fds = [master_fd];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            sendmsg::<()>(
                s.as_raw_fd(),
                &[IoSlice::new(b"/dev/pts/x")],
                &cmsg,
                MsgFlags::empty(),
                None,
            )
            .unwrap();
        });
        let master = sock.receive().await.unwrap();
        sender.join().unwrap();
        drop(pty.master);
        let console = Console::new(master).unwrap();
        console.resize(100, 40).unwrap();
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one winsize into `ws`.
        let r = unsafe { libc::ioctl(pty.slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!(r, 0);
        assert_eq!((ws.ws_col, ws.ws_row), (100, 40));
        // Output: the "process" writes on the slave, then closes it.
        let mut slave = std::fs::File::from(pty.slave);
        slave.write_all(b"hi\n").unwrap();
        let (mut rd, wr) = tokio::io::duplex(64);
        let out = tokio::spawn({
            let c = console.handle();
            async move { c.copy_out(wr).await }
        });
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("hi") {
            let mut b = [0u8; 16];
            let n = rd.read(&mut b).await.unwrap();
            got.extend_from_slice(&b[..n]);
        }
        drop(slave);
        tokio::time::timeout(Duration::from_secs(5), out)
            .await
            .unwrap()
            .unwrap();
    }
}
