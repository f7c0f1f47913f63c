//! Under `checkpoint`, memory a process shares over CUDA IPC is the process's own native
//! memory: the driver suspends and restores the process whole, so the export outlives the
//! eviction (on a GPU, `tests/gpu/run.sh` checks the real driver does the same).

use super::*;

/// A container whose process exported 1 MiB over CUDA IPC (first try: nothing is converted) is
/// paused, checkpointed by the pool (its bytes on the host), resumed (restored before it runs),
/// and then a second process of the container opens the handle, reads what the exporter wrote
/// before the checkpoint and writes a word the exporter sees.
#[test]
fn an_ipc_export_outlives_a_checkpoint_and_its_importer_shares_the_memory() {
    const MIB: i64 = 1 << 20;
    let Some((c, d, cuda, ctl, ck)) = checkpoint_node("ckpt-ipc", &[], "") else {
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
    let program = cuda.join("ipc_client").display().to_string();
    std::thread::scope(|t| {
        let exporter = t.spawn(|| {
            let args = ["export", meet.as_str()];
            c.run_cuda_program(MQFQ, "ex", "fn-ipc", &cuda, "ipc_client", &flags, &args)
        });
        let handle = Path::new(&meet).join("handle");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !handle.exists() {
            assert!(Instant::now() < deadline, "no handle: {}", c.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        d.wait_for("pooled", |s| entry(s, "ex").is_some());
        let pid = c.task_pid("ex");
        assert_eq!(ck.state(&ctl, pid), (0, MIB, 0), "running, on the device");

        assert!(c.ctr(&["task", "pause", "ex"]).status.success());
        d.wait_for("checkpointed", |s| tier_is(s, "ex", "warm"));
        assert_eq!(ck.state(&ctl, pid), (2, 0, MIB), "its bytes on the host");
        let o = c.ctr(&["task", "resume", "ex"]);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(ck.state(&ctl, pid), (0, MIB, 0), "restored before it runs");

        let o = c.ctr(&[
            "task",
            "exec",
            "--exec-id",
            "imp",
            "ex",
            &program,
            "import",
            &meet,
        ]);
        let import = text(&o);
        assert!(o.status.success(), "{import}");
        assert!(import.contains("import rc=0 words=0 1 2"), "{import}");
        assert!(import.contains("closed rc=0"), "{import}");
        let o = exporter.join().unwrap();
        let export = text(&o);
        assert!(o.status.success(), "{export}");
        assert!(
            export.contains("export rc=0 kind=1") && export.contains("sees 777"),
            "exported native memory on the first try, shared after the restore: {export}"
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
