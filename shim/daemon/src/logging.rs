//! Logging for `mqfqd` and `mqfqctl`: `tracing` events reach the `log` facade (the crate's
//! `log` feature), and this writes them to stderr, one line each, at the level in `MQFQ_LOG`
//! (error, warn, info — the default —, debug, trace). The shim itself logs to containerd's FIFO.

use std::io::Write;

#[derive(Debug)]
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let _ = writeln!(
            std::io::stderr().lock(),
            "{}.{:03} {:5} {}",
            t.as_secs(),
            t.subsec_millis(),
            r.level(),
            r.args()
        );
    }
    fn flush(&self) {}
}

/// Installs the stderr logger (once; later calls do nothing).
pub fn init_stderr() {
    let level = std::env::var("MQFQ_LOG")
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(log::LevelFilter::Info);
    if log::set_logger(&Stderr).is_ok() {
        log::set_max_level(level);
    }
}
