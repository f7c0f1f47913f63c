//! Process exits and OOM kills: reaped pids become TaskExit events in order (an exit that
//! races its own start waits for the start event; one whose pid is not recorded yet is kept a
//! while), and each container's cgroup is watched for OOM from Create.

use std::path::Path;
use std::time::{Instant, SystemTime};

use containerd_shim::monitor::{ExitEvent, Subject, Topic, monitor_subscribe};
use containerd_shim_protos::events::task::TaskExit;
use containerd_shim_protos::protobuf::MessageDyn;

use super::{DRAIN_LIMIT, TaskService, UNCLAIMED_TTL, exit_status};
use crate::error::Result;
use crate::process::Exit;

impl TaskService {
    /// Starts the loop that turns reaped pids into process exits. Call once.
    ///
    /// # Errors
    /// The exit monitor refused the subscription.
    pub async fn watch_exits(&self) -> Result<()> {
        let mut sub = monitor_subscribe(Topic::All).await?;
        let svc = self.clone();
        tokio::spawn(async move {
            while let Some(ExitEvent { subject, exit_code }) = sub.rx.recv().await {
                if let Subject::Pid(pid) = subject
                    && let Ok(pid) = u32::try_from(pid)
                {
                    svc.on_exit(pid, u32::try_from(exit_code).unwrap_or(255))
                        .await;
                }
            }
        });
        Ok(())
    }

    pub(super) fn emit(&self, topic: &'static str, ev: Box<dyn MessageDyn>) {
        // The forwarder only goes away at shutdown; events after that have nobody to go to.
        let _ = self.events.send((topic, ev));
    }

    /// A pid was reaped.
    pub async fn on_exit(&self, pid: u32, code: u32) {
        let exit = Exit {
            code,
            at: SystemTime::now(),
        };
        let mut st = self.state.lock().await;
        let mut found = None;
        for c in st.containers.values_mut() {
            let procs = std::iter::once(&mut c.init).chain(c.execs.values_mut());
            for p in procs {
                if p.is_running_pid(pid) {
                    found = Some((c.id.clone(), p.exec_id().to_owned()));
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        match found {
            Some((cid, eid)) => {
                drop(st);
                self.record_exit(&cid, &eid, exit).await;
            }
            None => {
                let now = Instant::now();
                st.unclaimed
                    .retain(|_, (_, seen)| now.duration_since(*seen) < UNCLAIMED_TTL);
                st.unclaimed.insert(pid, (exit, now));
            }
        }
    }

    /// Marks a process exited, then drains its stdio and publishes the exit.
    pub(super) async fn record_exit(&self, cid: &str, eid: &str, exit: Exit) {
        let (io, gpu) = {
            let mut st = self.state.lock().await;
            let Some(c) = st.containers.get_mut(cid) else {
                return;
            };
            let gpu = eid.is_empty() && c.gpu.is_gpu();
            let Ok(p) = c.proc_mut(eid) else { return };
            (p.exited(exit), gpu)
        };
        self.release_lease(cid, gpu, "exit").await;
        let svc = self.clone();
        let (cid, eid) = (cid.to_owned(), eid.to_owned());
        tokio::spawn(async move {
            if let Some(mut io) = io {
                io.drain(DRAIN_LIMIT).await;
            }
            let mut st = svc.state.lock().await;
            if let Some(c) = st.containers.get_mut(&cid)
                && let Ok(p) = c.proc_mut(&eid)
            {
                p.drained(svc.exit_event(&cid));
            }
        });
    }

    /// Sends a process's `TaskExit` (what [`Proc`] calls when it publishes an exit).
    pub(super) fn exit_event<'a>(&'a self, cid: &'a str) -> impl FnOnce(&str, u32, Exit) + 'a {
        move |exec_id, pid, exit| {
            let (code, at) = exit_status(Some(exit));
            self.emit(
                containerd_shim_protos::topics::TASK_EXIT_EVENT_TOPIC,
                Box::new(TaskExit {
                    container_id: cid.to_owned(),
                    id: if exec_id.is_empty() { cid } else { exec_id }.to_owned(),
                    pid,
                    exit_status: code,
                    exited_at: at,
                    ..Default::default()
                }),
            );
        }
    }

    /// Claims an exit of `pid` seen since `since` (when runc was asked to make the process).
    /// An older entry is another process that had the same pid before it was reused.
    pub(super) async fn claim_early_exit(&self, cid: &str, eid: &str, pid: u32, since: Instant) {
        let early = {
            let mut st = self.state.lock().await;
            match st.unclaimed.remove(&pid) {
                Some((exit, seen)) if seen >= since => Some(exit),
                _ => None,
            }
        };
        if let Some(exit) = early {
            self.record_exit(cid, eid, exit).await;
        }
    }

    /// Publishes `TaskOOM` whenever the kernel OOM-kills in the container's memory cgroup.
    /// Best effort: a container without a memory cgroup simply gets no OOM events.
    pub(super) fn watch_oom(&self, id: &str, pid: u32) {
        let cg = match crate::oom::memory_cgroup(pid, Path::new("/sys/fs/cgroup")) {
            Ok(cg) => cg,
            Err(e) => {
                tracing::debug!("no OOM watch for {id}: {}", e.full_message());
                return;
            }
        };
        let events = self.events.clone();
        let cid = id.to_owned();
        let r = crate::oom::watch(&cg, move || {
            tracing::info!(container = %cid, "OOM kill");
            let _ = events.send((
                containerd_shim_protos::topics::TASK_OOM_EVENT_TOPIC,
                Box::new(containerd_shim_protos::events::task::TaskOOM {
                    container_id: cid.clone(),
                    ..Default::default()
                }),
            ));
        });
        if let Err(e) = r {
            tracing::warn!("no OOM watch for {id}: {}", e.full_message());
        }
    }
}
