//! containerd finds this binary by the runtime name `io.containerd.mqfq.v2`.

use containerd_shim::Config;
use mqfq_shim::service::Service;

/// Worker threads of the shim's runtime. One shim runs per pod: its threads (each with a stack
/// and, under glibc, a malloc arena) must not grow with the node's core count, as tokio's default
/// of one per core would. Blocking work (runc's output, rootfs preparation, the interposer's
/// control socket) goes to tokio's blocking pool, not to these.
const WORKERS: usize = 2;

fn main() {
    if std::env::args()
        .skip(1)
        .any(|a| a == "-v" || a == "--version")
    {
        println!("containerd-shim-mqfq-v2: {}", mqfq_shim::version());
        return;
    }
    // containerd 2.x asks the runtime's features (`-info`, options on stdin, RuntimeInfo on
    // stdout) before it starts any shim; nothing else runs for it.
    if std::env::args()
        .skip(1)
        .any(|a| a == "-info" || a == "--info")
    {
        match mqfq_shim::info::run(std::io::stdin().lock()) {
            Ok(bytes) => {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                if out.write_all(&bytes).and_then(|()| out.flush()).is_ok() {
                    return;
                }
                eprintln!("containerd-shim-mqfq-v2 -info: cannot write to stdout");
            }
            Err(e) => eprintln!("containerd-shim-mqfq-v2 -info: {}", e.full_message()),
        }
        std::process::exit(1);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("containerd-shim-mqfq-v2: cannot start its runtime: {e}");
            std::process::exit(1);
        }
    };
    rt.block_on(containerd_shim::asynchronous::run::<Service>(
        "io.containerd.mqfq.v2",
        Some(Config::default()),
    ));
}
