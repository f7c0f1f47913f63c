use std::collections::HashMap;
use std::sync::Mutex;

use super::*;

/// A driver that keeps states in a map, with failures to inject.
#[derive(Debug, Default)]
pub(crate) struct FakeDriver {
    pub(crate) states: Mutex<HashMap<u32, ProcState>>,
    /// PIDs whose lock times out.
    pub(crate) busy: Mutex<Vec<u32>>,
    /// Restores that answer out of memory before one succeeds.
    pub(crate) oom_restores: Mutex<u32>,
    /// PIDs whose checkpoint fails (they go Failed, or stay Locked with `fail_stays_locked`).
    pub(crate) fail_checkpoint: Mutex<Vec<u32>>,
    pub(crate) fail_stays_locked: Mutex<bool>,
    pub(crate) calls: Mutex<Vec<String>>,
    /// Restores with GPU pairs are refused (a driver without the move).
    pub(crate) refuse_pairs: Mutex<bool>,
}

impl FakeDriver {
    pub(crate) fn with(pids: &[u32]) -> Self {
        let d = FakeDriver::default();
        for p in pids {
            d.states.lock().unwrap().insert(*p, ProcState::Running);
        }
        d
    }
    fn of(&self, pid: u32) -> ProcState {
        self.states.lock().unwrap()[&pid]
    }
    fn go(&self, call: &str, pid: u32, from: ProcState, to: ProcState) -> Result<(), CkptError> {
        self.calls.lock().unwrap().push(format!("{call} {pid}"));
        let mut s = self.states.lock().unwrap();
        let now = s.get(&pid).copied().ok_or(CkptError::Gone { pid })?;
        if now != from {
            return Err(CkptError::Cuda {
                call: "fake",
                pid,
                code: 401,
            });
        }
        s.insert(pid, to);
        Ok(())
    }
}

impl Driver for FakeDriver {
    fn state(&self, pid: u32) -> Result<ProcState, CkptError> {
        self.states
            .lock()
            .unwrap()
            .get(&pid)
            .copied()
            .ok_or(CkptError::Cuda {
                call: "cuCheckpointProcessGetState",
                pid,
                code: 1,
            })
    }
    fn lock(&self, pid: u32, timeout: Duration) -> Result<(), CkptError> {
        if self.busy.lock().unwrap().contains(&pid) {
            return Err(CkptError::LockTimeout {
                pid,
                ms: u64::try_from(timeout.as_millis()).unwrap(),
            });
        }
        self.go("lock", pid, ProcState::Running, ProcState::Locked)
    }
    fn checkpoint(&self, pid: u32) -> Result<(), CkptError> {
        if self.fail_checkpoint.lock().unwrap().contains(&pid) {
            if !*self.fail_stays_locked.lock().unwrap() {
                self.states.lock().unwrap().insert(pid, ProcState::Failed);
            }
            return Err(CkptError::Cuda {
                call: "cuCheckpointProcessCheckpoint",
                pid,
                code: 999,
            });
        }
        self.go(
            "checkpoint",
            pid,
            ProcState::Locked,
            ProcState::Checkpointed,
        )
    }
    fn restore(&self, pid: u32, onto: &[GpuPair]) -> Result<(), CkptError> {
        if !onto.is_empty() {
            self.calls
                .lock()
                .unwrap()
                .push(format!("pairs {pid} {}", onto.len()));
            if *self.refuse_pairs.lock().unwrap() {
                return Err(CkptError::Cuda {
                    call: "cuCheckpointProcessRestore",
                    pid,
                    code: 1,
                });
            }
        }
        {
            let mut n = self.oom_restores.lock().unwrap();
            if *n > 0 {
                *n -= 1;
                return Err(CkptError::OutOfMemory { pid });
            }
        }
        self.go("restore", pid, ProcState::Checkpointed, ProcState::Locked)
    }
    fn unlock(&self, pid: u32) -> Result<(), CkptError> {
        self.go("unlock", pid, ProcState::Locked, ProcState::Running)
    }
}

struct Children(Vec<std::process::Child>);
impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The CUDA processes the driver knows among `pids`.
fn found(d: &FakeDriver, pids: &[u32]) -> Vec<CudaProc> {
    cuda_processes(d, pids)
        .unwrap()
        .into_iter()
        .map(|p| p.0)
        .collect()
}

fn sleepers(n: usize) -> (Children, Vec<u32>) {
    let c: Vec<_> = (0..n)
        .map(|_| {
            std::process::Command::new("sleep")
                .arg("60")
                .spawn()
                .unwrap()
        })
        .collect();
    let pids = c.iter().map(std::process::Child::id).collect();
    (Children(c), pids)
}

#[test]
fn start_time_reads_this_process_and_not_a_missing_one() {
    let me = start_time(std::process::id()).expect("own start time");
    assert!(me > 0);
    assert_eq!(start_time(u32::MAX), None);
}

#[test]
fn only_the_drivers_processes_are_cuda_processes() {
    let (_c, pids) = sleepers(3);
    let d = FakeDriver::with(&pids[..2]);
    let found = cuda_processes(&d, &pids).unwrap();
    assert_eq!(
        found.iter().map(|(p, _)| p.pid()).collect::<Vec<_>>(),
        pids[..2]
    );
    assert!(found.iter().all(|(_, s)| *s == ProcState::Running));
}

#[test]
fn suspend_then_resume_round_trips_every_process() {
    let (_c, pids) = sleepers(2);
    let d = FakeDriver::with(&pids);
    let procs = found(&d, &pids);
    let out = suspend(&d, &procs, Duration::from_secs(1));
    assert_eq!(
        out,
        Outcome {
            done: 2,
            error: None
        }
    );
    assert!(pids.iter().all(|p| d.of(*p) == ProcState::Checkpointed));
    // Locked both before checkpointing either.
    let calls = d.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            format!("lock {}", pids[0]),
            format!("lock {}", pids[1]),
            format!("checkpoint {}", pids[0]),
            format!("checkpoint {}", pids[1]),
        ]
    );
    let out = resume(&d, &procs, &[], Instant::now() + Duration::from_secs(1));
    assert_eq!(
        out,
        Outcome {
            done: 2,
            error: None
        }
    );
    assert!(pids.iter().all(|p| d.of(*p) == ProcState::Running));
}

#[test]
fn a_process_that_does_not_lock_leaves_all_running() {
    let (_c, pids) = sleepers(2);
    let d = FakeDriver::with(&pids);
    d.busy.lock().unwrap().push(pids[1]);
    let procs = found(&d, &pids);
    let out = suspend(&d, &procs, Duration::from_millis(50));
    assert_eq!(out.done, 0);
    assert!(matches!(out.error, Some(CkptError::LockTimeout { pid, .. }) if pid == pids[1]));
    assert!(
        pids.iter().all(|p| d.of(*p) == ProcState::Running),
        "the first was unlocked again"
    );
}

#[test]
fn a_failed_checkpoint_is_reported_and_a_failed_process_never_touched_again() {
    let (_c, pids) = sleepers(1);
    let d = FakeDriver::with(&pids);
    d.fail_checkpoint.lock().unwrap().push(pids[0]);
    let procs = found(&d, &pids);
    let out = suspend(&d, &procs, Duration::from_secs(1));
    assert!(matches!(out.error, Some(CkptError::Cuda { code: 999, .. })));
    let again = suspend(&d, &procs, Duration::from_secs(1));
    assert!(matches!(
        again.error,
        Some(CkptError::State {
            state: ProcState::Failed,
            ..
        })
    ));
}

#[test]
fn a_restore_without_room_waits_for_it_within_the_deadline() {
    let (_c, pids) = sleepers(1);
    let d = FakeDriver::with(&pids);
    let procs = found(&d, &pids);
    assert_eq!(suspend(&d, &procs, Duration::from_secs(1)).done, 1);
    *d.oom_restores.lock().unwrap() = 3;
    let out = resume(&d, &procs, &[], Instant::now() + Duration::from_secs(30));
    assert_eq!(
        out,
        Outcome {
            done: 1,
            error: None
        }
    );
    // Past the deadline the process stays checkpointed and the error says why.
    assert_eq!(suspend(&d, &procs, Duration::from_secs(1)).done, 1);
    *d.oom_restores.lock().unwrap() = u32::MAX;
    let out = resume(&d, &procs, &[], Instant::now());
    assert!(matches!(out.error, Some(CkptError::OutOfMemory { .. })));
    assert_eq!(d.of(pids[0]), ProcState::Checkpointed);
}

#[test]
fn a_reused_pid_is_never_acted_on() {
    let (mut c, pids) = sleepers(1);
    let d = FakeDriver::with(&pids);
    let procs = found(&d, &pids);
    // The same PID with another start time: not the process found.
    let forged = [CudaProc {
        pid: pids[0],
        started: procs[0].started + 1,
    }];
    let out = suspend(&d, &forged, Duration::from_secs(1));
    assert_eq!(
        out,
        Outcome::default(),
        "skipped, as a process that exited is"
    );
    assert!(
        d.calls.lock().unwrap().is_empty(),
        "no call reached the driver"
    );
    // A process that exited is no error on resume: nothing of it is held.
    for ch in &mut c.0 {
        ch.kill().unwrap();
        ch.wait().unwrap();
    }
    let out = resume(&d, &procs, &[], Instant::now());
    assert_eq!(
        out,
        Outcome {
            done: 0,
            error: None
        }
    );
}

#[test]
fn a_missing_library_is_an_error_not_a_panic_and_finds_no_process_silently() {
    let d = LibCuda {
        loaded: OnceLock::new(),
    };
    d.loaded
        .set(Err("libnothing.so: not found".into()))
        .unwrap();
    assert!(matches!(d.state(1), Err(CkptError::Unavailable(_))));
    assert!(matches!(
        d.lock(1, Duration::from_secs(1)),
        Err(CkptError::Unavailable(_))
    ));
    // Not "no CUDA process": the move must fail, not report nothing moved as done.
    let me = std::process::id();
    assert!(matches!(
        cuda_processes(&d, &[me]),
        Err(CkptError::Unavailable(_))
    ));
}

#[test]
fn a_process_named_with_bytes_that_are_not_utf8_is_not_hidden() {
    // A container's process can give itself any name, ")" and invalid UTF-8 included.
    let mut child = std::process::Command::new("sh")
        .args(["-c", "printf '\\377) x (' > /proc/self/comm; sleep 60"])
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .starts_with(b"\xff")
    {
        assert!(Instant::now() < deadline, "never renamed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let stat = std::fs::read(format!("/proc/{pid}/stat")).unwrap();
    assert!(std::str::from_utf8(&stat).is_err(), "{stat:?}");
    assert!(start_time(pid).is_some_and(|t| t > 0));
    let d = FakeDriver::with(&[pid]);
    assert_eq!(cuda_processes(&d, &[pid]).unwrap().len(), 1);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn resume_reports_a_failed_process_and_suspend_skips_one_that_exited() {
    let (mut c, pids) = sleepers(2);
    let d = FakeDriver::with(&pids);
    let procs = found(&d, &pids);
    d.states.lock().unwrap().insert(pids[0], ProcState::Failed);
    let out = resume(&d, &procs, &[], Instant::now());
    assert!(matches!(
        out.error,
        Some(CkptError::State {
            state: ProcState::Failed,
            ..
        })
    ));
    assert_eq!(out.done, 1);
    // The first exits: a suspend of both moves the other and reports no error.
    d.states.lock().unwrap().insert(pids[0], ProcState::Running);
    c.0[0].kill().unwrap();
    c.0[0].wait().unwrap();
    let out = suspend(&d, &procs, Duration::from_secs(1));
    assert_eq!(
        out,
        Outcome {
            done: 1,
            error: None
        }
    );
    assert_eq!(d.of(pids[1]), ProcState::Checkpointed);
}

#[test]
fn a_checkpoint_that_fails_unlocks_the_processes_not_yet_suspended() {
    let (_c, pids) = sleepers(3);
    let d = FakeDriver::with(&pids);
    d.fail_checkpoint.lock().unwrap().push(pids[1]);
    let procs = found(&d, &pids);
    let out = suspend(&d, &procs, Duration::from_secs(1));
    assert!(matches!(out.error, Some(CkptError::Cuda { code: 999, .. })));
    assert_eq!(
        [d.of(pids[0]), d.of(pids[1]), d.of(pids[2])],
        [
            ProcState::Checkpointed,
            ProcState::Failed,
            ProcState::Running
        ],
        "the third never stays locked"
    );
}

#[test]
fn a_checkpoint_that_fails_and_leaves_its_process_locked_unlocks_it() {
    let (_c, pids) = sleepers(2);
    let d = FakeDriver::with(&pids);
    d.fail_checkpoint.lock().unwrap().push(pids[0]);
    *d.fail_stays_locked.lock().unwrap() = true;
    let out = suspend(&d, &found(&d, &pids), Duration::from_secs(1));
    assert!(matches!(out.error, Some(CkptError::Cuda { code: 999, .. })));
    assert_eq!(
        [d.of(pids[0]), d.of(pids[1])],
        [ProcState::Running, ProcState::Running],
        "neither left locked"
    );
}

#[test]
fn a_failure_no_retry_mends_outranks_a_want_of_memory() {
    let (_c, pids) = sleepers(2);
    let d = FakeDriver::with(&pids);
    let procs = found(&d, &pids);
    assert_eq!(suspend(&d, &procs, Duration::from_secs(1)).done, 2);
    // The first restore finds no memory (past its deadline); the second process has failed.
    *d.oom_restores.lock().unwrap() = u32::MAX;
    d.states.lock().unwrap().insert(pids[1], ProcState::Failed);
    let out = resume(&d, &procs, &[], Instant::now());
    assert!(
        matches!(
            out.error,
            Some(CkptError::State {
                state: ProcState::Failed,
                ..
            })
        ),
        "{out:?}"
    );
}

#[test]
fn gpu_uuids_parse_as_nvml_spells_them_and_nothing_else() {
    let p = GpuPair::parse(
        "GPU-fa4e0000-0000-4000-8000-000000000000",
        "GPU-FA4E0000-0000-4000-8000-0000000000a1",
    )
    .unwrap();
    assert_eq!(p.old[..2], [0xfa, 0x4e]);
    assert_eq!(
        (p.old[15], p.new[15], p.new[6], p.new[8]),
        (0, 0xa1, 0x40, 0x80)
    );
    for bad in [
        "",
        "GPU-",
        "fa4e0000-0000-4000-8000-000000000000",
        "MIG-fa4e0000-0000-4000-8000-000000000000",
        "GPU-fa4e0000-0000-4000-8000-00000000000",
        "GPU-fa4e0000-0000-4000-8000-0000000000000",
        "GPU-fa4e00000-000-4000-8000-000000000000",
        "GPU-fa4e0000-0000-4000-8000-00000000000g",
        "GPU-fa4e0000-0000-4000-8000-+00000000000",
        "GPU-fa4e0000-0000-4000-8000-00000000000é",
    ] {
        let ok = "GPU-fa4e0000-0000-4000-8000-000000000000";
        assert!(
            matches!(GpuPair::parse(bad, ok), Err(CkptError::Uuid(_))),
            "{bad:?}"
        );
        assert!(GpuPair::parse(ok, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_restore_passes_its_pairs_to_the_driver() {
    let (_c, pids) = sleepers(1);
    let d = FakeDriver::with(&pids);
    let procs = found(&d, &pids);
    assert!(suspend(&d, &procs, Duration::from_secs(1)).error.is_none());
    let pair = GpuPair::parse(
        "GPU-fa4e0000-0000-4000-8000-000000000000",
        "GPU-fa4e0000-0000-4000-8000-000000000001",
    )
    .unwrap();
    let out = resume(&d, &procs, &[pair], Instant::now());
    assert!(out.error.is_none(), "{out:?}");
    assert!(
        d.calls
            .lock()
            .unwrap()
            .contains(&format!("pairs {} 1", pids[0])),
        "{:?}",
        d.calls.lock().unwrap()
    );
    // A driver that refuses the pairs: restored where it was, and running, not left suspended.
    assert!(suspend(&d, &procs, Duration::from_secs(1)).error.is_none());
    *d.refuse_pairs.lock().unwrap() = true;
    d.calls.lock().unwrap().clear();
    let out = resume(&d, &procs, &[pair], Instant::now());
    assert_eq!(out.error, None);
    assert_eq!(out.done, 1);
    assert_eq!(d.of(pids[0]), ProcState::Running);
    // The refused call, then one without pairs.
    let p = pids[0];
    assert_eq!(
        *d.calls.lock().unwrap(),
        [
            format!("pairs {p} 1"),
            format!("restore {p}"),
            format!("unlock {p}")
        ]
    );
}

#[test]
fn once_the_driver_refuses_the_pairs_every_process_is_restored_where_it_was() {
    let (_c, pids) = sleepers(2);
    let d = FakeDriver::with(&pids);
    let procs = found(&d, &pids);
    assert!(suspend(&d, &procs, Duration::from_secs(1)).error.is_none());
    *d.refuse_pairs.lock().unwrap() = true;
    d.calls.lock().unwrap().clear();
    let pair = GpuPair {
        old: [0; 16],
        new: [1; 16],
    };
    let out = resume(&d, &procs, &[pair], Instant::now());
    assert_eq!((out.done, out.error), (2, None));
    let pairs_tried = d
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.starts_with("pairs "))
        .count();
    assert_eq!(pairs_tried, 1, "{:?}", d.calls.lock().unwrap());
}

#[test]
fn a_last_look_that_refuses_leaves_every_process_running_and_nothing_checkpointed() {
    let (_c, pids) = sleepers(2);
    let d = FakeDriver::with(&pids);
    let procs = found(&d, &pids);
    let looked = std::cell::Cell::new(0);
    let refuse = || {
        looked.set(looked.get() + 1);
        // Asked with both locked.
        assert!(pids.iter().all(|p| d.of(*p) == ProcState::Locked));
        Err(CkptError::Refused("shares memory".into()))
    };
    let out = suspend_checked(&d, &procs, Duration::from_secs(1), &refuse);
    assert_eq!(looked.get(), 1);
    assert_eq!(out.done, 0);
    assert!(matches!(out.error, Some(CkptError::Refused(_))), "{out:?}");
    assert!(pids.iter().all(|p| d.of(*p) == ProcState::Running));
    let calls = d.calls.lock().unwrap().clone();
    assert!(
        calls.iter().all(|c| !c.starts_with("checkpoint")),
        "{calls:?}"
    );
}
