//! Under `checkpoint`, memory a process shares over CUDA IPC stays native (nothing converted:
//! the export works on its first try), and the process is never handed to the driver's
//! checkpoint, which does not support such memory (r570: "does not support UVM or IPC memory",
//! and a process it fails on is left in no good state). What a newer driver does is for the GPU
//! check (`tests/gpu/ckptcompat.c`) to say.

use super::*;

/// A container whose process exported 1 MiB over CUDA IPC is paused: its status says so, and it
/// leaves the pool there (never thawed for a move, never handed to the driver: its process stays
/// running, its memory on the device); after its Resume a second process of the container opens
/// the handle, reads the exporter's words and writes one the exporter sees.
#[test]
fn a_container_sharing_memory_over_ipc_is_never_checkpointed_and_keeps_sharing() {
    let metrics = mqfq_testkit::free_metrics_addr();
    let extra = format!("metrics_addr = \"{metrics}\"\n");
    let Some((c, d, cuda, ctl, ck)) = checkpoint_node("ckpt-ipc", &[], &extra) else {
        return;
    };
    for double in ["commlib", "ipc_client"] {
        mqfq_testkit::build_double(double, &cuda).unwrap();
    }
    let meet = cuda.join("meet-ckpt");
    std::fs::create_dir_all(&meet).unwrap();
    let meet = meet.display().to_string();
    let mut flags = vec!["--rm".to_owned(), "--env".into(), "CLIENT_EXIT=1".into()];
    flags.extend(ck.container_flags());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    std::thread::scope(|t| {
        let exporter = t.spawn(|| {
            let args = ["export", meet.as_str()];
            c.run_cuda_program(MQFQ, "ex", "fn-ipc", &cuda, "ipc_client", &flags, &args)
        });
        // A failed check must not leave the exporter frozen and its `ctr run` waiting forever.
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            left_on_the_gpu_then_shared(&c, &d, &cuda, &ctl, &ck, &meet);
            // Taken out of the pool at its Pause: no move was tried, none failed.
            let m = mqfq_testkit::scrape(&metrics);
            for result in ["ok", "error"] {
                let moved = format!(
                    "mqfq_pool_backend_moves_total{{backend=\"checkpoint\",action=\"evict\",\
                     result=\"{result}\"}}"
                );
                assert_eq!(mqfq_testkit::metric(&m, &moved), 0.0, "{m}");
            }
        }));
        if let Err(p) = checked {
            let _ = c.ctr(&["task", "kill", "-s", "SIGKILL", "ex"]);
            let _ = c.ctr(&["task", "resume", "ex"]);
            std::panic::resume_unwind(p);
        }
        let o = exporter.join().unwrap();
        let export = text(&o);
        assert!(o.status.success(), "{export}");
        assert!(
            export.contains("export rc=0 kind=1") && export.contains("sees 777"),
            "exported native memory on the first try, shared after the Resume: {export}"
        );
    });
    let log = driver_log(&cuda, "ex");
    assert_eq!(
        count(&log, "alloc managed"),
        0,
        "nothing converted: {log:?}"
    );
    assert_eq!(count(&log, "ipc open"), 1, "{log:?}");
    nothing_left(&c, &d);
}

/// The exporter pooled, paused, refused to the driver and left on the GPU, resumed; then a
/// second process of its container imports the memory.
fn left_on_the_gpu_then_shared(
    c: &Containerd,
    d: &Mqfqd,
    cuda: &Path,
    ctl: &Path,
    ck: &CheckpointDouble,
    meet: &str,
) {
    const MIB: i64 = 1 << 20;
    let handle = Path::new(meet).join("handle");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !handle.exists() {
        assert!(Instant::now() < deadline, "no handle: {}", c.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    d.wait_for("pooled", |s| entry(s, "ex").is_some());
    let pid = c.task_pid("ex");
    assert_eq!(ck.state(ctl, pid), (0, MIB, 0), "running, on the device");

    assert!(c.ctr(&["task", "pause", "ex"]).status.success());
    d.wait_for("out of the pool", |s| entry(s, "ex").is_none());
    assert_eq!(
        ck.state(ctl, pid),
        (0, MIB, 0),
        "never locked or checkpointed"
    );
    assert!(
        c.log().contains("share GPU memory with others"),
        "the shim says why: {}",
        c.log()
    );
    let o = c.ctr(&["task", "resume", "ex"]);
    assert!(o.status.success(), "{}", text(&o));

    let program = cuda.join("ipc_client").display().to_string();
    let o = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "imp",
        "ex",
        &program,
        "import",
        meet,
    ]);
    let import = text(&o);
    assert!(o.status.success(), "{import}");
    assert!(import.contains("import rc=0 words=0 1 2"), "{import}");
    assert!(import.contains("closed rc=0"), "{import}");
}
