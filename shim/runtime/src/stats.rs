//! Task metrics. cgroup v1 goes through containerd-shim's collector (its `Metrics`); on a pure
//! cgroup v2 host that collector has nothing to read, so the v2 `Metrics` are built here from
//! the unified hierarchy's files (`memory.current`, `memory.max`, `memory.stat`,
//! `memory.events`, `cpu.stat`, `pids.current`, `pids.max`).

use std::path::Path;

use containerd_shim_protos::cgroups_v2::metrics::{
    CPUStat, MemoryEvents, MemoryStat, Metrics, PidsStat,
};
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::protobuf::well_known_types::any::Any;

use crate::error::Result;
use crate::oom::{MemoryCgroup, memory_cgroup};

fn read_u64(dir: &Path, file: &str) -> u64 {
    std::fs::read_to_string(dir.join(file))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0) // "max" (no limit) and missing files read as 0, as containerd does
}

fn flat_keyed(dir: &Path, file: &str) -> std::collections::HashMap<String, u64> {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_owned(), v.trim().parse().ok()?))
        })
        .collect()
}

/// cgroup v2 metrics of the cgroup directory `dir`.
#[must_use]
pub fn v2_metrics(dir: &Path) -> Metrics {
    let mem = flat_keyed(dir, "memory.stat");
    let m = |k: &str| mem.get(k).copied().unwrap_or(0);
    let cpu = flat_keyed(dir, "cpu.stat");
    let c = |k: &str| cpu.get(k).copied().unwrap_or(0);
    let ev = flat_keyed(dir, "memory.events");
    let e = |k: &str| ev.get(k).copied().unwrap_or(0);
    Metrics {
        pids: MessageField::some(PidsStat {
            current: read_u64(dir, "pids.current"),
            limit: read_u64(dir, "pids.max"),
            ..Default::default()
        }),
        cpu: MessageField::some(CPUStat {
            usage_usec: c("usage_usec"),
            user_usec: c("user_usec"),
            system_usec: c("system_usec"),
            nr_periods: c("nr_periods"),
            nr_throttled: c("nr_throttled"),
            throttled_usec: c("throttled_usec"),
            ..Default::default()
        }),
        memory: MessageField::some(MemoryStat {
            anon: m("anon"),
            file: m("file"),
            kernel_stack: m("kernel_stack"),
            slab: m("slab"),
            sock: m("sock"),
            shmem: m("shmem"),
            file_mapped: m("file_mapped"),
            file_dirty: m("file_dirty"),
            file_writeback: m("file_writeback"),
            inactive_anon: m("inactive_anon"),
            active_anon: m("active_anon"),
            inactive_file: m("inactive_file"),
            active_file: m("active_file"),
            unevictable: m("unevictable"),
            pgfault: m("pgfault"),
            pgmajfault: m("pgmajfault"),
            usage: read_u64(dir, "memory.current"),
            usage_limit: read_u64(dir, "memory.max"),
            swap_usage: read_u64(dir, "memory.swap.current"),
            swap_limit: read_u64(dir, "memory.swap.max"),
            ..Default::default()
        }),
        memory_events: MessageField::some(MemoryEvents {
            low: e("low"),
            high: e("high"),
            max: e("max"),
            oom: e("oom"),
            oom_kill: e("oom_kill"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The metrics of the container whose init is `pid`, as containerd expects them for this host's
/// cgroup version.
///
/// # Errors
/// No cgroup for the pid, or the v1 collector failed.
pub fn collect(pid: u32) -> Result<Any> {
    let any = match memory_cgroup(pid, Path::new("/sys/fs/cgroup"))? {
        MemoryCgroup::V2(dir) => containerd_shim::util::convert_to_any(Box::new(v2_metrics(&dir)))?,
        MemoryCgroup::V1(_) => {
            let cg = containerd_shim::cgroup::get_cgroup(pid)?;
            let metrics = containerd_shim::cgroup::collect_metrics(&cg)?;
            containerd_shim::util::convert_to_any(Box::new(metrics))?
        }
    };
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_v2_cgroup() {
        let d = tempfile::tempdir().unwrap();
        let w = |f: &str, s: &str| std::fs::write(d.path().join(f), s).unwrap();
        w("memory.current", "4096\n");
        w("memory.max", "max\n");
        w("memory.stat", "anon 1024\nfile 2048\npgfault 7\n");
        w("memory.events", "low 0\nhigh 1\nmax 2\noom 3\noom_kill 4\n");
        w(
            "cpu.stat",
            "usage_usec 500\nuser_usec 300\nsystem_usec 200\n",
        );
        w("pids.current", "3\n");
        w("pids.max", "64\n");
        let m = v2_metrics(d.path());
        assert_eq!(m.memory.usage, 4096);
        assert_eq!(m.memory.usage_limit, 0, "max = no limit");
        assert_eq!(
            (m.memory.anon, m.memory.file, m.memory.pgfault),
            (1024, 2048, 7)
        );
        assert_eq!(m.memory_events.oom_kill, 4);
        assert_eq!(
            (m.cpu.usage_usec, m.cpu.user_usec, m.cpu.system_usec),
            (500, 300, 200)
        );
        assert_eq!((m.pids.current, m.pids.limit), (3, 64));
    }
}
