//! Paths inside a container's root filesystem, resolved inside it.
//!
//! Why: an image is hostile input. A path joined onto the rootfs by hand follows any symlink
//! the image planted, so an image whose `/usr/lib/x86_64-linux-gnu` points at a host directory
//! would have the shim (root) create links or write files on the host — the class of runc's
//! CVE-2024-21626 and the NVIDIA toolkit's CVE-2024-0132. Every file, directory and symlink the
//! shim reads or creates in a rootfs goes through [`Root`]: paths are resolved as the container
//! will see them (absolute symlinks and `..` stay inside the root), with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` where the kernel has it and otherwise a
//! component-by-component walk that opens each step with `O_NOFOLLOW` and follows symlinks
//! itself, inside the root. Then only `*at` calls on the descriptors that came back.
//!
//! Reads are for regular files only, capped in size, and never open anything else (a FIFO, a
//! device) for reading: the target is opened `O_PATH` first, checked, then reopened.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{OFlag, ResolveFlag};
use nix::sys::stat::{Mode, SFlag};

/// Symlinks followed in one resolution before it fails with `ELOOP` (as the kernel's 40).
const MAX_LINKS: u32 = 40;

/// Why a rootfs operation failed; each names the container path.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// The OS refused (missing, loop, permission, read-only …).
    #[error("{path} in the container: {source}")]
    Io {
        /// The container path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The target exists but is not a regular file.
    #[error("{path} in the container is a {kind}, not a regular file")]
    NotRegular {
        /// The container path.
        path: String,
        /// What it is.
        kind: &'static str,
    },
    /// The file is larger than the caller accepts.
    #[error("{path} in the container has {size} bytes, more than the {cap} accepted")]
    TooLarge {
        /// The container path.
        path: String,
        /// Its size.
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// A path the shim was asked to use is not a plain absolute path.
    #[error("{path:?}: must be an absolute path without '..'")]
    BadPath {
        /// The path as given.
        path: String,
    },
}

impl RootError {
    fn io(path: &str, e: impl Into<std::io::Error>) -> Self {
        RootError::Io {
            path: path.to_owned(),
            source: e.into(),
        }
    }

    /// Whether the path (or a directory on it) does not exist.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, RootError::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)))
    }

    /// The OS error number, when there is one.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            RootError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

type Result<T> = std::result::Result<T, RootError>;

/// How paths are resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolver {
    /// `openat2(RESOLVE_IN_ROOT)`, falling back to the walk where the kernel lacks it.
    Auto,
    /// Always the component walk (tests compare the two).
    Walk,
}

/// 0 unknown, 1 openat2 works, 2 it does not (ENOSYS, or a seccomp filter's EPERM).
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// A container root filesystem, opened once.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
    resolver: Resolver,
}

fn file_kind(mode: u32) -> &'static str {
    match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFLNK => "symbolic link",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character device",
        SFlag::S_IFBLK => "block device",
        SFlag::S_IFREG => "regular file",
        _ => "special file",
    }
}

fn is(mode: u32, kind: SFlag) -> bool {
    mode & SFlag::S_IFMT.bits() == kind.bits()
}

/// The steps of a path for the walk: its names and `..`s (the root and `.` are no steps).
fn steps(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// The normal components of an absolute container path; `..` is refused.
fn plain(path: &str) -> Result<Vec<&OsStr>> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(RootError::BadPath { path: path.into() });
    }
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(RootError::BadPath { path: path.into() });
            }
        }
    }
    Ok(out)
}

impl Root {
    /// Opens the root directory (`bundle/rootfs`, a path the shim itself chose).
    ///
    /// # Errors
    /// It cannot be opened as a directory.
    pub fn open(rootfs: &Path) -> Result<Self> {
        Self::open_with(rootfs, Resolver::Auto)
    }

    /// Like [`open`](Self::open), choosing the resolver.
    ///
    /// # Errors
    /// It cannot be opened as a directory.
    pub fn open_with(rootfs: &Path, resolver: Resolver) -> Result<Self> {
        let dir = nix::fcntl::open(
            rootfs,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| RootError::io("/", e))?;
        Ok(Root { dir, resolver })
    }

    /// An `O_PATH` descriptor for a container path, resolved inside the root; with
    /// `follow_last` a final symlink is followed (inside the root too).
    ///
    /// # Errors
    /// Missing components, a symlink loop, or any other resolution failure.
    pub fn open_path(&self, path: &str, follow_last: bool) -> Result<OwnedFd> {
        let rel = path.trim_start_matches('/');
        if self.resolver == Resolver::Auto && OPENAT2.load(Ordering::Relaxed) != 2 {
            let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
            if !follow_last {
                flags |= OFlag::O_NOFOLLOW;
            }
            let how = nix::fcntl::OpenHow::new()
                .flags(flags)
                .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
            let target = if rel.is_empty() { "." } else { rel };
            match nix::fcntl::openat2(self.dir.as_fd(), target, how) {
                Ok(fd) => {
                    OPENAT2.store(1, Ordering::Relaxed);
                    return Ok(fd);
                }
                Err(Errno::ENOSYS | Errno::EPERM) if OPENAT2.load(Ordering::Relaxed) == 0 => {
                    tracing::info!("openat2 is not available: rootfs paths resolved by a walk");
                    OPENAT2.store(2, Ordering::Relaxed);
                }
                Err(e) => return Err(RootError::io(path, e)),
            }
        }
        self.walk(path, follow_last)
    }

    /// The walk: each component opened `O_PATH | O_NOFOLLOW` from the directory before it;
    /// symlinks read and spliced into the rest of the path, absolute ones restarting at the
    /// root; `..` never climbs above the root.
    fn walk(&self, path: &str, follow_last: bool) -> Result<OwnedFd> {
        let err = |e: Errno| RootError::io(path, e);
        let mut stack: Vec<OwnedFd> = Vec::new();
        let mut todo = steps(Path::new(path));
        let mut links = 0;
        while let Some(name) = todo.pop_front() {
            if name == ".." {
                stack.pop();
                continue;
            }
            let last = todo.is_empty();
            let at = stack.last().map_or(self.dir.as_fd(), AsFd::as_fd);
            let fd = nix::fcntl::openat(
                at,
                name.as_os_str(),
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(err)?;
            let mode = nix::sys::stat::fstat(&fd).map_err(err)?.st_mode;
            if is(mode, SFlag::S_IFLNK) && (!last || follow_last) {
                links += 1;
                if links > MAX_LINKS {
                    return Err(err(Errno::ELOOP));
                }
                let target = nix::fcntl::readlinkat(&fd, "").map_err(err)?;
                let t = Path::new(&target);
                if t.is_absolute() {
                    stack.clear();
                }
                let mut spliced = steps(t);
                spliced.extend(todo);
                todo = spliced;
                continue;
            }
            if !last && !is(mode, SFlag::S_IFDIR) {
                return Err(err(Errno::ENOTDIR));
            }
            stack.push(fd);
        }
        match stack.pop() {
            Some(fd) => Ok(fd),
            None => self.dir.try_clone().map_err(|e| RootError::io(path, e)),
        }
    }

    /// Reads a regular file of at most `cap` bytes; `None` when it does not exist.
    ///
    /// # Errors
    /// Not a regular file, larger than `cap`, or unreadable.
    pub fn read(&self, path: &str, cap: u64) -> Result<Option<Vec<u8>>> {
        let fd = match self.open_path(path, true) {
            Ok(fd) => fd,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let st = nix::sys::stat::fstat(&fd).map_err(|e| RootError::io(path, e))?;
        if !is(st.st_mode, SFlag::S_IFREG) {
            return Err(RootError::NotRegular {
                path: path.into(),
                kind: file_kind(st.st_mode),
            });
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size > cap {
            return Err(RootError::TooLarge {
                path: path.into(),
                size,
                cap,
            });
        }
        // The O_PATH descriptor names exactly the regular file checked above: reopen it.
        let file = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .map_err(|e| RootError::io(path, e))?;
        let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        file.take(cap.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| RootError::io(path, e))?;
        if out.len() as u64 > cap {
            return Err(RootError::TooLarge {
                path: path.into(),
                size: out.len() as u64,
                cap,
            });
        }
        Ok(Some(out))
    }

    /// Makes every missing directory of `dir` (mode 0755) and returns it.
    ///
    /// # Errors
    /// A component that is not a directory, or one that cannot be made.
    pub fn mkdir_all(&self, dir: &str) -> Result<OwnedFd> {
        let comps = plain(dir)?;
        let mut prefix = PathBuf::from("/");
        let mut fd = self.open_path("/", true)?;
        for c in comps {
            prefix.push(c);
            let p = prefix.to_string_lossy().into_owned();
            let next = match self.open_path(&p, true) {
                Ok(next) => next,
                Err(e) if e.errno() == Some(libc::ENOENT) => {
                    // Made in the directory the previous step resolved to: inside the root.
                    match nix::sys::stat::mkdirat(&fd, c, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(RootError::io(&p, e)),
                    }
                    self.open_path(&p, true)?
                }
                Err(e) => return Err(e),
            };
            let mode = nix::sys::stat::fstat(&next)
                .map_err(|e| RootError::io(&p, e))?
                .st_mode;
            if !is(mode, SFlag::S_IFDIR) {
                return Err(RootError::io(&p, Errno::ENOTDIR));
            }
            fd = next;
        }
        Ok(fd)
    }

    fn parent_and_name<'a>(&self, path: &'a str) -> Result<(OwnedFd, &'a OsStr)> {
        let comps = plain(path)?;
        let Some((name, dirs)) = comps.split_last() else {
            return Err(RootError::BadPath { path: path.into() });
        };
        let mut parent = PathBuf::from("/");
        parent.extend(dirs);
        Ok((self.mkdir_all(&parent.to_string_lossy())?, name))
    }

    /// Creates the symlink `link → target`, making its directory; an existing entry of any kind
    /// is left alone (`Ok(false)`).
    ///
    /// # Errors
    /// A bad path, or the link or a directory cannot be made.
    pub fn symlink(&self, link: &str, target: &str) -> Result<bool> {
        let (dir, name) = self.parent_and_name(link)?;
        match nix::unistd::symlinkat(target, &dir, name) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(false),
            Err(e) => Err(RootError::io(link, e)),
        }
    }

    /// Replaces `path` with a regular file holding `bytes` (mode `mode`): written to a new file
    /// beside it, then renamed over it, so a symlink there is replaced, never followed, and a
    /// reader sees the old or the new file whole.
    ///
    /// # Errors
    /// A bad path, a read-only root, or any write failure (the temporary file is removed).
    pub fn write_atomic(&self, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
        use std::io::Write;
        let (dir, name) = self.parent_and_name(path)?;
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(".mqfq-{}.tmp", std::process::id()));
        let err = |e: std::io::Error| RootError::io(path, e);
        // An earlier crash may have left one behind.
        let _ = nix::unistd::unlinkat(
            &dir,
            tmp.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
        let fd = nix::fcntl::openat(
            &dir,
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode & 0o777),
        )
        .map_err(|e| err(e.into()))?;
        let written = (|| {
            nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode & 0o777))?;
            let mut f = std::fs::File::from(fd);
            f.write_all(bytes)?;
            drop(f);
            nix::fcntl::renameat(&dir, tmp.as_os_str(), &dir, name)?;
            Ok::<(), std::io::Error>(())
        })();
        if let Err(e) = written {
            let _ = nix::unistd::unlinkat(
                &dir,
                tmp.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return Err(err(e));
        }
        Ok(())
    }

    /// `(device, inode)` of what a path resolves to, for tests and checks.
    ///
    /// # Errors
    /// As [`open_path`](Self::open_path).
    pub fn identity(&self, path: &str, follow_last: bool) -> Result<(u64, u64)> {
        let fd = self.open_path(path, follow_last)?;
        let st = nix::sys::stat::fstat(&fd).map_err(|e| RootError::io(path, e))?;
        Ok((st.st_dev, st.st_ino))
    }
}

/// Whether a path is a plain absolute container path (no `..`), as edits must name.
#[must_use]
pub fn is_plain(path: &str) -> bool {
    plain(path).is_ok_and(|c| !c.is_empty()) && !path.as_bytes().contains(&0)
}

/// For messages: a path's bytes, lossily.
#[must_use]
pub fn display(p: &OsStr) -> String {
    String::from_utf8_lossy(p.as_bytes()).into_owned()
}

#[cfg(test)]
mod tests;
