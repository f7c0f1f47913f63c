//! Pause and Resume share how they begin and end: the container read and its pool lock taken
//! (a move of its memory and the other verb wait), the transition checked again under the lock,
//! and at the end the new status recorded and its event sent. What each does in between is in
//! `pause.rs` and `resume.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim_protos::events::task::{TaskPaused, TaskResumed};
use tokio::sync::OwnedMutexGuard;

use super::{TaskService, burst, nf};
use crate::error::Result;
use crate::gpu::GpuWork;
use crate::process::Transition;
use crate::runtime::Runtime;
use mqfq_proto::warm::Warm;

/// What Pause or Resume knows of a container, read under its pool lock (held until dropped).
pub(super) struct Turn {
    pub(super) runtime: Arc<dyn Runtime>,
    pub(super) work: Option<GpuWork>,
    pub(super) ctl: Option<PathBuf>,
    /// Its memory is pooled (the interposer injected and not dropped from the pool).
    pub(super) pooled: bool,
    pub(super) book: Option<Arc<burst::Book>>,
    pub(super) warm: Warm,
    _moving: OwnedMutexGuard<()>,
}

fn transition(pause: bool) -> Transition {
    if pause {
        Transition::Pause
    } else {
        Transition::Resume
    }
}

impl TaskService {
    /// The container, its pool lock taken, for a Pause (`pause`) or Resume.
    ///
    /// # Errors
    /// `NOT_FOUND`, or the transition is not allowed now.
    pub(super) async fn turn(&self, id: &str, pause: bool) -> Result<Turn> {
        let (runtime, lock, (work, ctl, pooled, book, warm)) = {
            let st = self.state.lock().await;
            let c = st.containers.get(id).ok_or_else(|| nf(id))?;
            c.init.check(transition(pause))?;
            let g = &c.gpu;
            (
                c.runtime.clone(),
                c.pool_lock.clone(),
                (
                    g.work().cloned(),
                    g.ctl_dir().map(Path::to_path_buf),
                    g.pooled(),
                    g.book().cloned(),
                    g.warm(),
                ),
            )
        };
        let moving = lock.lock_owned().await;
        // Checked again under the lock: a second Pause or Resume that waited behind this one
        // must not act twice (a second Resume would re-admit, fail in runc, and release the
        // lease the first one holds).
        {
            let st = self.state.lock().await;
            let c = st.containers.get(id).ok_or_else(|| nf(id))?;
            c.init.check(transition(pause))?;
        }
        Ok(Turn {
            runtime,
            work,
            ctl,
            pooled,
            book,
            warm,
            _moving: moving,
        })
    }

    /// Records the container paused (`pause`) or running again and tells containerd.
    ///
    /// # Errors
    /// `NOT_FOUND` (deleted meanwhile).
    pub(super) async fn turned(&self, id: &str, pause: bool) -> Result<()> {
        let mut st = self.state.lock().await;
        let c = st.containers.get_mut(id).ok_or_else(|| nf(id))?;
        c.init.paused(pause);
        if pause {
            self.emit(
                containerd_shim_protos::topics::TASK_PAUSED_EVENT_TOPIC,
                Box::new(TaskPaused {
                    container_id: id.to_owned(),
                    ..Default::default()
                }),
            );
        } else {
            self.emit(
                containerd_shim_protos::topics::TASK_RESUMED_EVENT_TOPIC,
                Box::new(TaskResumed {
                    container_id: id.to_owned(),
                    ..Default::default()
                }),
            );
        }
        Ok(())
    }
}
