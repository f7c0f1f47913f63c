//! OOM notifications: a `TaskOOM` event each time the kernel's OOM killer acts in a container's
//! memory cgroup.
//!
//! cgroup v1: an eventfd registered on `memory.oom_control` through `cgroup.event_control`; the
//! kernel signals it on every OOM and once more when the cgroup is removed. cgroup v2: inotify
//! on `memory.events`, reporting each increase of `oom_kill`.

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;

use crate::error::{Error, Result};

/// Where a process's memory cgroup is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryCgroup {
    /// v1: the memory controller's directory.
    V1(PathBuf),
    /// v2: the unified directory.
    V2(PathBuf),
}

/// Finds the memory cgroup of `pid` from `/proc/<pid>/cgroup` under `root` (normally
/// `/sys/fs/cgroup`).
///
/// # Errors
/// The file is unreadable or names no memory cgroup.
pub fn memory_cgroup(pid: u32, root: &Path) -> Result<MemoryCgroup> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| Error::io(format!("read /proc/{pid}/cgroup"), e))?;
    parse_cgroup(&text, root).ok_or_else(|| {
        Error::io(
            format!("no memory cgroup for pid {pid}"),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
    })
}

fn parse_cgroup(text: &str, root: &Path) -> Option<MemoryCgroup> {
    let mut unified = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if ctrls.split(',').any(|c| c == "memory") {
            return Some(MemoryCgroup::V1(root.join("memory").join(rel)));
        }
        if ctrls.is_empty() {
            unified = Some(rel.to_owned());
        }
    }
    // Pure v2: the memory controller is enabled in the unified hierarchy.
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok()?;
    if controllers.split_whitespace().any(|c| c == "memory") {
        return unified.map(|rel| MemoryCgroup::V2(root.join(rel)));
    }
    None
}

/// Watches a container's memory cgroup and calls `on_oom` for each OOM kill, until the cgroup
/// goes away. Returns once the watch is set up; the watching runs in a task.
///
/// # Errors
/// The cgroup files cannot be opened or registered.
pub fn watch(cg: &MemoryCgroup, on_oom: impl Fn() + Send + 'static) -> Result<()> {
    match cg {
        MemoryCgroup::V1(dir) => watch_v1(dir, on_oom),
        MemoryCgroup::V2(dir) => watch_v2(dir, on_oom),
    }
}

fn watch_v1(dir: &Path, on_oom: impl Fn() + Send + 'static) -> Result<()> {
    let control = std::fs::File::open(dir.join("memory.oom_control"))
        .map_err(|e| Error::io(format!("open {}/memory.oom_control", dir.display()), e))?;
    let efd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(|e| Error::io("eventfd", e.into()))?;
    let line = format!("{} {}", efd.as_fd().as_raw_fd(), control.as_raw_fd());
    std::fs::write(dir.join("cgroup.event_control"), line)
        .map_err(|e| Error::io(format!("register OOM eventfd in {}", dir.display()), e))?;
    // SAFETY: the EventFd owns its descriptor for the AsyncFd's whole life.
    let afd =
        unsafe { AsyncFd::register(efd) }.map_err(|e| Error::io("register eventfd", e.into()))?;
    let dir = dir.to_owned();
    tokio::spawn(async move {
        let _control = control; // keep the registration's file open
        loop {
            let Ok(mut guard) = afd.readable().await else {
                return;
            };
            match guard.try_io(|e| e.get_ref().read().map_err(std::io::Error::from)) {
                Ok(Ok(_)) => {
                    // The kernel also signals when the cgroup is removed.
                    if !dir.exists() {
                        return;
                    }
                    on_oom();
                }
                Ok(Err(_)) => return,
                Err(_would_block) => {}
            }
        }
    });
    Ok(())
}

fn oom_kills(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("memory.events"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

/// `Inotify` has `AsFd` but not the `AsRawFd` that `AsyncFd` wants.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

fn watch_v2(dir: &Path, on_oom: impl Fn() + Send + 'static) -> Result<()> {
    let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
        .map_err(|e| Error::io("inotify", e.into()))?;
    ino.add_watch(&dir.join("memory.events"), AddWatchFlags::IN_MODIFY)
        .map_err(|e| Error::io(format!("watch {}/memory.events", dir.display()), e.into()))?;
    // SAFETY: the Inotify owns its descriptor for the AsyncFd's whole life.
    let afd = unsafe { AsyncFd::register(InotifyFd(ino)) }
        .map_err(|e| Error::io("register inotify", e.into()))?;
    let dir = dir.to_owned();
    let mut seen = oom_kills(&dir).unwrap_or(0);
    tokio::spawn(async move {
        loop {
            let Ok(mut guard) = afd.readable().await else {
                return;
            };
            match guard.try_io(|i| i.get_ref().0.read_events().map_err(std::io::Error::from)) {
                Ok(Ok(_)) => {
                    let Some(now) = oom_kills(&dir) else { return };
                    for _ in seen..now {
                        on_oom();
                    }
                    seen = seen.max(now);
                }
                Ok(Err(_)) => return,
                Err(_would_block) => {}
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_v1_memory_controller_first() {
        let text = "12:pids:/a\n9:memory:/kubepods/pod1/c1\n0::/unified/x\n";
        assert_eq!(
            parse_cgroup(text, Path::new("/sys/fs/cgroup")),
            Some(MemoryCgroup::V1(PathBuf::from(
                "/sys/fs/cgroup/memory/kubepods/pod1/c1"
            )))
        );
    }

    #[test]
    fn v2_needs_the_memory_controller() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpu io memory pids\n",
        )
        .unwrap();
        assert_eq!(
            parse_cgroup("0::/system.slice/c1\n", dir.path()),
            Some(MemoryCgroup::V2(dir.path().join("system.slice/c1")))
        );
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu io\n").unwrap();
        assert_eq!(parse_cgroup("0::/c1\n", dir.path()), None);
    }

    #[tokio::test]
    async fn v2_counts_oom_kills_from_memory_events() {
        let dir = tempfile::tempdir().unwrap();
        let ev = dir.path().join("memory.events");
        std::fs::write(&ev, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        watch(&MemoryCgroup::V2(dir.path().to_owned()), move || {
            let _ = tx.send(());
        })
        .unwrap();
        std::fs::write(&ev, "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n").unwrap();
        for _ in 0..2 {
            tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap();
        }
    }
}
