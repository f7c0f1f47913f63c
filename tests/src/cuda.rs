//! CUDA nodes on a CPU: the libcuda and NVML doubles and the test programs built from
//! `tests/doubles/`, the interposer installed where a kit containerd's shims look for it, GPU
//! containers running the CUDA client, and the double's kernel timeline read back.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::{Containerd, GLIBC_IMAGE, Mqfqd, built_interposer, daemon_program, host_glibc};

impl Containerd {
    /// A CUDA node for a test: [`install_cuda`](Self::install_cuda) of the interposer this
    /// build made, and an `mqfqd` of this build on `restart_grace_ms = 0` plus `extra`. Returns
    /// the doubles' directory and the daemon.
    ///
    /// # Panics
    /// The interposer cannot be installed, a double does not build, or `mqfqd` does not come up.
    #[must_use]
    pub fn cuda_test_node(&self, extra: &str) -> (PathBuf, Mqfqd) {
        let cuda = self
            .install_cuda(&built_interposer())
            .expect("install the interposer and build the doubles");
        let d = Mqfqd::start(
            &daemon_program("mqfqd"),
            &daemon_program("mqfqctl"),
            self.dir(),
            &self.daemon_socket(),
            &format!("restart_grace_ms = 0\n{extra}"),
        );
        (cuda, d)
    }

    /// A CUDA node for the benchmarks, from one directory `bin` of built binaries (the
    /// interposer, `mqfqd`, `mqfqctl`): [`install_cuda`](Self::install_cuda), and an `mqfqd`
    /// on `restart_grace_ms = 0` plus `extra`. Returns the doubles' directory and the daemon.
    ///
    /// # Panics
    /// The interposer cannot be installed, a double does not build, or `mqfqd` does not come up.
    #[must_use]
    pub fn cuda_node(&self, bin: &Path, extra: &str) -> (PathBuf, Mqfqd) {
        let cuda = self
            .install_cuda(&bin.join("libmqfq_cuda.so"))
            .expect("install the interposer and build the doubles");
        let d = Mqfqd::start(
            &bin.join("mqfqd"),
            &bin.join("mqfqctl"),
            self.dir(),
            &self.daemon_socket(),
            &format!("restart_grace_ms = 0\n{extra}"),
        );
        (cuda, d)
    }

    /// Makes this containerd's nodes "CUDA nodes" on a CPU: installs `interposer` where its
    /// shims look for `libmqfq_cuda.so` and builds the libcuda double and the CUDA client into
    /// `<dir>/cuda`, which it returns.
    ///
    /// # Errors
    /// Copying, or `cc`.
    pub fn install_cuda(&self, interposer: &Path) -> std::io::Result<PathBuf> {
        std::fs::copy(interposer, self.dir().join("libmqfq_cuda.so"))?;
        self.import_image(GLIBC_IMAGE, &host_glibc()?);
        let cuda = self.dir().join("cuda");
        std::fs::create_dir_all(&cuda)?;
        build_double("cuda", &cuda)?;
        build_double("cuda_client", &cuda)?;
        Ok(cuda)
    }

    /// `ctr run -d` of a GPU container of `function` running the CUDA client in a loop (see
    /// [`Containerd::install_cuda`]), with the host's glibc and the doubles' folder mounted in
    /// (busybox is static) and the driver double logging to `<cuda>/<id>.log`.
    #[must_use]
    pub fn run_cuda_client(&self, runtime: &str, id: &str, function: &str, cuda: &Path) -> Output {
        self.run_cuda(runtime, id, function, cuda, &[], &["loop"])
    }

    /// [`run_cuda_client`](Self::run_cuda_client) with more `--env` settings and the client's
    /// arguments (`serve <kernels> <gap_ms>`: a long-running GPU server).
    #[must_use]
    pub fn run_cuda(
        &self,
        runtime: &str,
        id: &str,
        function: &str,
        cuda: &Path,
        env: &[&str],
        args: &[&str],
    ) -> Output {
        let mut flags = vec!["-d"];
        for e in env {
            flags.extend(["--env", e]);
        }
        self.run_cuda_with(runtime, id, function, cuda, &flags, args)
    }

    /// The CUDA client in a GPU container, with raw `ctr run` flags (`-d`, `--rm`, `--env`,
    /// `--annotation`, …) and the client's arguments.
    #[must_use]
    pub fn run_cuda_with(
        &self,
        runtime: &str,
        id: &str,
        function: &str,
        cuda: &Path,
        flags: &[&str],
        args: &[&str],
    ) -> Output {
        self.run_cuda_program(runtime, id, function, cuda, "cuda_client", flags, args)
    }

    /// As [`run_cuda_with`](Self::run_cuda_with), running `program` of the doubles' folder (built
    /// there with [`build_double`]).
    #[must_use]
    #[expect(clippy::too_many_arguments)]
    pub fn run_cuda_program(
        &self,
        runtime: &str,
        id: &str,
        function: &str,
        cuda: &Path,
        program: &str,
        flags: &[&str],
        args: &[&str],
    ) -> Output {
        let dir = cuda.display().to_string();
        let log = format!("FAKE_CUDA_LOG={dir}/{id}.log");
        let client = format!("{dir}/{program}");
        let mut cmd = vec!["run", "--snapshotter", "native", "--runtime", runtime];
        cmd.extend(["--env", "NVIDIA_VISIBLE_DEVICES=0", "--env", &log]);
        cmd.extend(flags);
        let lib_path = format!("LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:{dir}");
        let function = format!("io.mqfq.function={function}");
        let own = format!("type=bind,src={dir},dst={dir},options=rbind:rw");
        cmd.extend([
            "--env",
            &lib_path,
            "--annotation",
            &function,
            "--mount",
            &own,
            "--mount",
            "type=bind,src=/usr/lib/x86_64-linux-gnu,dst=/lib/x86_64-linux-gnu,options=rbind:ro",
            "--mount",
            "type=bind,src=/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2,\
             dst=/lib64/ld-linux-x86-64.so.2,options=rbind:ro",
            GLIBC_IMAGE,
            id,
            &client,
        ]);
        cmd.extend(args);
        self.ctr(&cmd)
    }
}

/// Compiles one of the CPU-only library doubles in `tests/doubles/` (`nvml` →
/// `libnvidia-ml.so.1`, `cuda` → `libcuda.so.1`, `commlib` → `libnccl.so.2`) or test programs
/// (`cuda_client`, `ipc_client`, `hostile_ctl`, `ckpt_ctl`) into `out` with the system C compiler and returns
/// its path. Programs link to the libraries built before them in `out`.
///
/// # Errors
/// No C compiler, or it failed.
pub fn build_double(name: &str, out: &Path) -> std::io::Result<PathBuf> {
    let (src, lib) = match name {
        "nvml" => ("nvml.c", "libnvidia-ml.so.1"),
        "cuda" => ("cuda.c", "libcuda.so.1"),
        "cuda_client" => ("cuda_client.c", "cuda_client"),
        "commlib" => ("commlib.c", "libnccl.so.2"),
        "ipc_client" => ("ipc_client.c", "ipc_client"),
        "hostile_ctl" => ("hostile_ctl.c", "hostile_ctl"),
        "ckpt_ctl" => ("ckpt_ctl.c", "ckpt_ctl"),
        other => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no double named {other}"),
            ));
        }
    };
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("doubles")
        .join(src);
    let path = out.join(lib);
    let mut cc = Command::new("cc");
    if name == "hostile_ctl" {
        // Static: the interposer preloaded into the container never loads into it.
        cc.args(["-static", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&path)
            .arg(&src);
    } else if name == "cuda_client" || name == "ipc_client" || name == "ckpt_ctl" {
        // A program linked straight to the libcuda double (built first, in the same folder), and
        // the IPC client to the communication library's double too (built before it).
        cc.args(["-O1", "-Wall", "-Werror", "-o"])
            .arg(&path)
            .arg(&src)
            .arg(format!("-L{}", out.display()))
            .arg("-l:libcuda.so.1")
            .args((name == "ipc_client").then_some("-l:libnccl.so.2"))
            .arg(format!("-Wl,-rpath,{}", out.display()))
            .args(["-ldl", "-lpthread"]);
    } else if name == "commlib" {
        cc.args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&path)
            .arg(&src)
            .arg(format!("-L{}", out.display()))
            .arg("-l:libcuda.so.1");
    } else {
        // Functions bound inside the library, as a real driver's entry-point table is: the
        // `cuda` double's `cuGetProcAddress` hands out its own functions, not an interposer's
        // exports of the same names.
        cc.args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror"])
            .arg("-Wl,-Bsymbolic-functions")
            .arg("-o")
            .arg(&path)
            .arg(&src);
    }
    let o = cc.output()?;
    if !o.status.success() {
        return Err(std::io::Error::other(format!(
            "cc {}: {}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    Ok(path)
}

/// CLOCK_MONOTONIC in microseconds: the clock of the libcuda double's kernel intervals (the
/// same in every container).
#[must_use]
pub fn monotonic_us() -> i64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut t) };
    t.tv_sec * 1_000_000 + t.tv_nsec / 1000
}

/// The kernels the libcuda double ran for container `id` (`FAKE_CUDA_KERNEL_MS`), as
/// `(begin_us, end_us)` from its log `<cuda>/<id>.log`.
#[must_use]
pub fn kernel_intervals(cuda: &Path, id: &str) -> Vec<(i64, i64)> {
    std::fs::read_to_string(cuda.join(format!("{id}.log")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("kernel ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// The most containers among `ids` whose kernels ran at the same instant, counting the
/// kernels that ended by `until_us` (the double logs a kernel when it is queued; kernels a
/// killed process had queued never run, as on a GPU, where its context goes with it).
#[must_use]
pub fn most_at_once(cuda: &Path, ids: &[&str], until_us: i64) -> usize {
    let mut edges: Vec<(i64, i32, usize)> = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        for (b, e) in kernel_intervals(cuda, id)
            .into_iter()
            .filter(|k| k.1 <= until_us)
        {
            edges.push((b, 1, n));
            edges.push((e, -1, n));
        }
    }
    // Ends before begins at the same instant: touching intervals do not overlap.
    edges.sort_by_key(|&(t, d, _)| (t, d));
    let mut per = vec![0i32; ids.len()];
    let (mut now, mut most) = (0usize, 0usize);
    for (_, d, n) in edges {
        let before = per[n] > 0;
        per[n] += d;
        match (before, per[n] > 0) {
            (false, true) => now += 1,
            (true, false) => now -= 1,
            _ => {}
        }
        most = most.max(now);
    }
    most
}

/// The libcuda double's checkpoint API as the shim drives it: a copy of the double for the
/// shim to load (`MQFQ_LIBCUDA`, as a controller only), and the pages of the containers'
/// processes in each container's own `/tmp` (`FAKE_CUDA_CKPT_DIR`, the same path for both
/// sides: the controller looks it up inside the process's root).
#[derive(Debug)]
pub struct CheckpointDouble {
    _dir: tempfile::TempDir,
    lib: PathBuf,
}

/// Where the containers' processes publish their pages, inside their own root.
const PAGES: &str = "/tmp";

impl CheckpointDouble {
    /// Builds the shim's copy of the double.
    ///
    /// # Errors
    /// The double does not build, or the folder cannot be made.
    pub fn new() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let lib = build_double("cuda", dir.path())?;
        Ok(CheckpointDouble { _dir: dir, lib })
    }

    /// The shims' environment (for [`Containerd::start_with_env`]).
    #[must_use]
    pub fn shim_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MQFQ_LIBCUDA", self.lib.display().to_string()),
            ("FAKE_CUDA_CKPT_DIR", PAGES.into()),
            ("FAKE_CUDA_CKPT_CONTROLLER", "1".into()),
        ]
    }

    /// The `ctr run` flags that have a container's CUDA processes publish their pages.
    #[must_use]
    pub fn container_flags(&self) -> Vec<String> {
        vec!["--env".into(), format!("FAKE_CUDA_CKPT_DIR={PAGES}")]
    }

    /// The fake GPU host PID `pid`'s memory is on, as the controller `ctl` reads its page (-1:
    /// none).
    ///
    /// # Panics
    /// `ctl` cannot run or prints no figure.
    #[must_use]
    pub fn gpu(&self, ctl: &Path, pid: u32) -> i64 {
        let o = Command::new(ctl)
            .args([&pid.to_string(), "gpu"])
            .env("FAKE_CUDA_CKPT_DIR", PAGES)
            .env("FAKE_CUDA_CKPT_CONTROLLER", "1")
            .output()
            .expect("run ckpt_ctl");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.trim()
            .strip_prefix("gpu ")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("a GPU in {out:?}"))
    }

    /// `(state, device bytes, host bytes)` of host PID `pid` as the controller `ctl` (the
    /// `ckpt_ctl` double, built into the doubles' folder) reads it: state 0 running, 2
    /// checkpointed, -1 unknown.
    ///
    /// # Panics
    /// `ctl` cannot run or prints no figures.
    #[must_use]
    pub fn state(&self, ctl: &Path, pid: u32) -> (i64, i64, i64) {
        let o = Command::new(ctl)
            .args([&pid.to_string(), "state", "bytes"])
            .env("FAKE_CUDA_CKPT_DIR", PAGES)
            .env("FAKE_CUDA_CKPT_CONTROLLER", "1")
            .output()
            .expect("run ckpt_ctl");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let num = |key: &str| -> i64 {
            out.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.parse().ok())
                .unwrap_or_else(|| panic!("{key} in {out:?}"))
        };
        let state = out
            .lines()
            .find_map(|l| l.strip_prefix("state rc=0 ")?.trim().parse().ok())
            .unwrap_or(-1);
        (state, num("device="), num("host="))
    }
}

impl Containerd {
    /// The host PID of task `id`'s init process (`ctr task ls`).
    ///
    /// # Panics
    /// The task is not listed.
    #[must_use]
    pub fn task_pid(&self, id: &str) -> u32 {
        let o = String::from_utf8_lossy(&self.ctr(&["task", "ls"]).stdout).into_owned();
        o.lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(id)).then(|| w.next()?.parse().ok())?
            })
            .unwrap_or_else(|| panic!("no pid for {id}: {o}"))
    }
}
