//! What the interposer test files share: the client processes over the libcuda double, and the
//! control-socket conversation.
#![allow(dead_code, reason = "each test file uses its own part")]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The interposer cargo built with this test: `target/<profile>/deps/libmqfq_cuda.so`, beside
/// the test binary (the copy one level up is only refreshed by `cargo build`).
pub fn interposer() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let so = exe.parent().unwrap().join("libmqfq_cuda.so");
    assert!(so.exists(), "{} not built", so.display());
    so
}

pub struct Client {
    pub child: Child,
    pub stdin: ChildStdin,
    pub stdout: BufReader<ChildStdout>,
    stderr: PathBuf,
}

impl Client {
    pub fn start(dir: &Path, env: &[(&str, &Path)]) -> Option<Self> {
        let client = built(dir, &["cuda", "cuda_client"])?;
        Some(Self::spawn(&client, &[], dir, "client.err", env, true))
    }

    /// `program args` with the double's log in `dir`, stderr in `dir/<err>`, the interposer
    /// preloaded if `preload`.
    pub fn spawn(
        program: &Path,
        args: &[&str],
        dir: &Path,
        err: &str,
        env: &[(&str, &Path)],
        preload: bool,
    ) -> Self {
        let stderr = dir.join(err);
        let mut cmd = Command::new(program);
        if preload {
            cmd.env("LD_PRELOAD", interposer());
        }
        let mut child = cmd
            .args(args)
            .env("FAKE_CUDA_LOG", dir.join("cuda.log"))
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Client {
            child,
            stdin,
            stdout,
            stderr,
        }
    }

    /// The next line, or `None` if none comes within `limit` (the client is then killed, so a
    /// test that would hang fails instead).
    pub fn line_within(&mut self, limit: Duration) -> Option<String> {
        use std::os::fd::AsRawFd;
        if !self.stdout.buffer().contains(&b'\n') {
            let mut fds = [libc_pollfd(self.stdout.get_ref().as_raw_fd())];
            let ms = i32::try_from(limit.as_millis()).unwrap_or(i32::MAX);
            if poll(&mut fds, ms) == 0 {
                let _ = self.child.kill();
                return None;
            }
        }
        Some(self.line())
    }

    pub fn line(&mut self) -> String {
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l.trim_end().to_owned()
    }

    /// The allocation report, up to "ready".
    pub fn report(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let l = self.line();
            if l == "ready" || l.is_empty() {
                return out;
            }
            out.push(l);
        }
    }

    pub fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[repr(C)]
pub struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}

pub fn libc_pollfd(fd: i32) -> PollFd {
    PollFd {
        fd,
        events: 1, // POLLIN
        revents: 0,
    }
}

unsafe extern "C" {
    #[link_name = "poll"]
    fn c_poll(fds: *mut PollFd, n: u64, timeout: i32) -> i32;
}

pub fn poll(fds: &mut [PollFd], ms: i32) -> i32 {
    // SAFETY: a live array of pollfd structs of the length passed.
    unsafe { c_poll(fds.as_mut_ptr(), fds.len() as u64, ms) }
}

/// No VMM, stream-ordered or array allocations.
pub const NONE_APART: &str =
    "vmm=0 async=0 array=0 setting=0 library=0 export=0 refused=0 shared=0 sharing=0";

pub struct Ctl(pub BufReader<UnixStream>);

impl Ctl {
    pub fn connect(dir: &Path) -> Self {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let sock = std::fs::read_dir(dir)
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|e| e == "sock"));
            if let Some(s) = sock
                && let Ok(c) = UnixStream::connect(s)
            {
                return Ctl(BufReader::new(c));
            }
            assert!(
                Instant::now() < deadline,
                "no control socket in {}",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn ask(&mut self, line: &str) -> String {
        writeln!(self.0.get_mut(), "{line}").unwrap();
        let mut l = String::new();
        self.0.read_line(&mut l).unwrap();
        l.trim_end().to_owned()
    }
}

/// Builds the doubles named (see `mqfq_testkit::build_double`) into `dir` and returns the last;
/// `None` (the test skips) without a C compiler, unless the CI requires everything.
pub fn built(dir: &Path, names: &[&str]) -> Option<PathBuf> {
    let mut last = None;
    for n in names {
        match mqfq_testkit::build_double(n, dir) {
            Ok(p) => last = Some(p),
            Err(e) if std::env::var_os("MQFQ_REQUIRE_CONTAINERD").is_some() => panic!("{e}"),
            Err(e) => {
                eprintln!("skipped: {e}");
                return None;
            }
        }
    }
    last
}

/// Compiles the GPU check's program `tests/gpu/<name>.c` into `dir` (it loads `libcuda.so.1` at
/// run time: over the double when `LD_LIBRARY_PATH` finds it).
pub fn gpu_program(dir: &Path, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/gpu")
        .join(format!("{name}.c"));
    let bin = dir.join(name);
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    bin
}

/// Runs the GPU check's program `bin` with `args` over the doubles in `dir` (`LD_LIBRARY_PATH`)
/// and `env`; its standard output, once it exited successfully.
///
/// # Panics
/// It could not run, it failed (the message has its output), or it ran past 120 s (killed).
pub fn run_gpu_program(bin: &Path, dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> String {
    let (ok, out) = run_gpu_program_status(bin, dir, args, env);
    assert!(ok, "{args:?}: {out}");
    out
}

/// As [`run_gpu_program`], whether it exited successfully or not: `(success, stdout + stderr)`.
///
/// # Panics
/// It could not run, or it ran past 120 s (killed: a program that hangs fails the test).
pub fn run_gpu_program_status(
    bin: &Path,
    dir: &Path,
    args: &[&str],
    env: &[(&str, &Path)],
) -> (bool, String) {
    let out_file = dir.join(format!("gpu-program-{}.out", std::process::id()));
    let file = std::fs::File::create(&out_file).unwrap();
    let mut child = Command::new(bin)
        .args(args)
        .env("LD_LIBRARY_PATH", dir)
        .envs(env.iter().copied())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let out = std::fs::read_to_string(&out_file).unwrap_or_default();
            panic!("{args:?} ran past 120 s: {out}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    (status.success(), out)
}
