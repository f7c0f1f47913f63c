//! Create: classify the container, apply the node's NVIDIA edits to GPU containers, decode the
//! runtime options, mount the rootfs, set up stdio, `runc create`; undo everything on failure.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use containerd_shim_protos::api;
use containerd_shim_protos::events::task::{TaskCreate, TaskIO};
use containerd_shim_protos::protobuf::MessageField;

use super::{Container, TaskService, unmount};
use crate::error::{Error, Result};
use crate::gpu::{self, Classification};
use crate::io::{ProcessIo, StdioPaths};
use crate::options;
use crate::process::Proc;
use crate::runtime::CreateArgs;
use mqfq_proto::warm::{ANNOTATION as WARM, Warm};

/// Why the driver's checkpoint API cannot suspend this container's processes, if it cannot: it
/// serves neither MIG instances nor MPS clients (NVIDIA's documented limits). A GPU in MIG mode
/// granted whole (`all`, an index) is not seen here: the shim does not know the GPU's mode.
pub(crate) fn checkpoint_cannot_serve(
    spec: &serde_json::Value,
    work: &gpu::GpuWork,
) -> Option<&'static str> {
    let mig = |d: &str| d.starts_with("MIG-") || d.contains(':');
    let named = |s: &mqfq_edits::GpuSelection| matches!(s, mqfq_edits::GpuSelection::Devices(d) if d.iter().any(|d| mig(d)));
    let mut env = spec
        .pointer("/process/env")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str);
    let mut mounts = spec
        .get("mounts")
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("destination")?.as_str());
    // The container's own pick among its devices can name a MIG instance too.
    let picked = env.clone().any(|kv| {
        kv.strip_prefix("CUDA_VISIBLE_DEVICES=")
            .is_some_and(|v| v.split(',').any(|d| d.trim().starts_with("MIG-")))
    });
    if picked || named(&work.gpus) || work.grant.as_ref().is_some_and(named) {
        return Some("a MIG instance");
    }
    if env.any(|kv| kv.starts_with("CUDA_MPS_PIPE_DIRECTORY="))
        || mounts.any(|d| d.trim_end_matches('/').ends_with("/nvidia-mps"))
    {
        return Some("an MPS client");
    }
    None
}

impl TaskService {
    /// Settles how the container's memory goes Warm and whether its allocations stay native,
    /// asking mqfqd when the interposer will be injected and the pod did not say both: the
    /// node's backend (`[pool] warm`) where the pod chose none (`io.mqfq.warm`), and whether
    /// its function keeps its allocations native (its earlier containers exported GPU memory).
    /// Both become annotations, visible in the bundle. A container the driver's checkpoint
    /// cannot serve (MIG, MPS) gets `uvm` instead of the node's `checkpoint` (`off` where the node
    /// does not allow `uvm`, or where the pod asked for `checkpoint` itself). Under `checkpoint`
    /// and `off` nothing is
    /// converted (`io.mqfq.native-alloc=all`): the driver suspends the processes whole, or
    /// nothing moves them.
    async fn warm_advice(
        &self,
        spec: &mut serde_json::Value,
        id: &str,
        work: &gpu::GpuWork,
    ) -> Result<Warm> {
        let asked = crate::uvm::native_alloc(spec)?;
        let asked_warm = crate::uvm::warm_asked(spec)?;
        if !crate::uvm::wanted(spec)?
            || crate::uvm::interposer_needs(&crate::uvm::interposer()).is_none()
        {
            return Ok(asked_warm.unwrap_or_default());
        }
        let all = |v: &str| v.split(',').any(|n| n == "all");
        let advice = self
            .gate
            .advise(&self.namespace, id, work)
            .await
            .unwrap_or_default();
        if let Some(w) = asked_warm
            && !advice.warm_allowed.is_empty()
            && !advice.warm_allowed.iter().any(|a| a == w.as_str())
        {
            return Err(Error::InvalidArgument(format!(
                "annotation {WARM}={w}: not allowed on this node (mqfqd's [pool] warm_allowed: {})",
                advice.warm_allowed.join(", ")
            )));
        }
        let warm = asked_warm.unwrap_or_else(|| {
            if advice.warm.is_empty() {
                return Warm::default();
            }
            advice.warm.parse().unwrap_or_else(|e| {
                tracing::warn!(container = %id, "mqfqd's Warm-tier backend ignored: {e}");
                Warm::default()
            })
        });
        let warm = match (warm, checkpoint_cannot_serve(spec, work)) {
            (Warm::Checkpoint, Some(why)) => {
                let allowed = |w: Warm| {
                    advice.warm_allowed.is_empty()
                        || advice.warm_allowed.iter().any(|a| a == w.as_str())
                };
                // A pod that asked for `checkpoint` itself may rely on nothing being converted
                // (its IPC exports): `off`, never a conversion it did not ask for.
                let instead = if asked_warm.is_none() && allowed(Warm::Uvm) {
                    Warm::Uvm
                } else {
                    Warm::Off
                };
                tracing::warn!(container = %id, function = %work.function,
                    "the driver's checkpoint cannot serve this container ({why}): Warm tier by {instead} instead");
                instead
            }
            (w, _) => w,
        };
        let native = if asked.as_deref().is_some_and(all) {
            None
        } else if warm != Warm::Uvm {
            // The driver moves the processes whole, or nothing moves them: no conversion.
            Some("all")
        } else if advice.native_alloc == "all" {
            tracing::info!(container = %id, function = %work.function,
                "mqfqd advises native allocations (this function's containers exported GPU memory)");
            Some("all")
        } else {
            if !advice.native_alloc.is_empty() {
                tracing::warn!(container = %id, advice = %advice.native_alloc,
                    "mqfqd's native advice not understood: ignored");
            }
            None
        };
        let Some(obj) = spec.as_object_mut() else {
            return Ok(warm);
        };
        let annotations = obj
            .entry("annotations")
            .or_insert_with(|| serde_json::json!({}));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(WARM.into(), warm.as_str().into());
            if let Some(advice) = native {
                // Names the pod listed stay listed (moot with `all`, but they say what it asked).
                let value =
                    asked.map_or_else(|| advice.to_owned(), |names| format!("{advice},{names}"));
                a.insert(crate::uvm::ANN_NATIVE.into(), value.into());
            }
        }
        Ok(warm)
    }

    /// Create: classify, decode options, mount the rootfs, `runc create`.
    ///
    /// # Errors
    /// `ALREADY_EXISTS`, `INVALID_ARGUMENT` (annotations, options, spec), `UNIMPLEMENTED`
    /// (tty, log URIs), or runc's failure; nothing is left behind on error.
    pub async fn create(&self, req: api::CreateTaskRequest) -> Result<u32> {
        let id = req.id.clone();
        if id.is_empty() || id.contains('/') || id == "." || id == ".." {
            return Err(Error::InvalidArgument(format!("container id {id:?}")));
        }
        {
            let mut st = self.state.lock().await;
            if st.containers.contains_key(&id) || !st.creating.insert(id.clone()) {
                return Err(Error::AlreadyExists(format!("container {id}")));
            }
        }
        let result = self.create_reserved(&id, req).await;
        self.state.lock().await.creating.remove(&id);
        result
    }

    async fn create_reserved(&self, id: &str, req: api::CreateTaskRequest) -> Result<u32> {
        let id = id.to_owned();
        let bundle = PathBuf::from(&req.bundle);
        let spec_path = bundle.join("config.json");
        let (mut spec, gpu, nvidia) = self.read_spec(&spec_path, &id).await?;
        let opts = options::decode(req.options.as_ref())?;
        let stdio = StdioPaths::checked(&req.stdin, &req.stdout, &req.stderr, req.terminal)?;
        if !req.checkpoint.is_empty() {
            return Err(Error::Unimplemented("restore from checkpoint"));
        }
        let runtime = self.factory.runtime(&bundle, &opts)?;

        // From here on, everything done is undone on failure (the guard, when dropped).
        let rootfs = bundle.join("rootfs");
        let mut undo = Undo::default();
        for m in &req.rootfs {
            containerd_shim::util::mount_rootfs(m, &rootfs).await?;
            undo.rootfs = Some(rootfs.clone());
        }
        // The rootfs runc will use: the spec's `root.path` (relative to the bundle), which is
        // `rootfs` for containerd's own mounts but may name a directory (`ctr run --rootfs`).
        let image_root = spec
            .get("root")
            .and_then(|r| r.get("path"))
            .and_then(serde_json::Value::as_str)
            .filter(|p| !p.is_empty())
            .map_or_else(|| rootfs.clone(), |p| bundle.join(p));
        let ctl_dir = finish_gpu(
            &gpu,
            &mut spec,
            &spec_path,
            &image_root,
            nvidia.as_ref(),
            &self.namespace,
            &id,
        )
        .await?;
        undo.ctl.clone_from(&ctl_dir);
        // Burst admission: the socket exists before any of the container's processes do.
        let burst_listener = match &ctl_dir {
            Some(d) if crate::uvm::burst_mode() => Some(super::burst::bind(d)?),
            _ => None,
        };
        let mut io = ProcessIo::new(&stdio, &id, &self.namespace).await?;
        let since = Instant::now();
        let args = CreateArgs {
            pid_file: bundle.join("init.pid"),
            io: Some(io.child.clone()),
            no_pivot: opts.no_pivot_root,
            no_new_keyring: opts.no_new_keyring,
            console_socket: io.console_socket_path(),
        };
        let created = match runtime.create(&id, &bundle, &args).await {
            Ok(pid) => match io.take_console_socket() {
                None => Ok(pid),
                Some(sock) => match sock.receive().await {
                    Ok(master) => io.attach_console(master).map(|()| pid),
                    Err(e) => Err(e),
                },
            },
            Err(e) => Err(e),
        };
        let pid = match created {
            Ok(pid) => pid,
            Err(e) => {
                // runc may have left state behind; remove it, then (the guard) the mounts.
                let _ = runtime.delete(&id, true).await;
                drop(io);
                return Err(e);
            }
        };
        let mounted = undo.disarm();
        if let Classification::Gpu(w) = &gpu {
            tracing::info!(
                container = %id, function = %w.function, weight = w.weight,
                tenant = ?w.tenant, gpus = ?w.gpus, granted = ?w.grant, "GPU container created"
            );
        }
        // Watched from here, not from Start: a process OOM-killed at once (a buffer past its
        // limit in its first instruction) was gone before a watch made at Start could read its
        // cgroup, and its TaskOOM was lost (runc's own shim watches from Create too).
        self.watch_oom(&id, pid);
        let init = Proc::new("", pid, stdio.clone(), Some(io));
        if ctl_dir.is_some() {
            self.start_pool_agent();
        }
        let bursts = burst_listener.and_then(|l| {
            let book = std::sync::Arc::new(super::burst::Book::default());
            let task = self.serve_bursts(&id, l, book.clone())?;
            Some((book, task))
        });
        let container = Container {
            id: id.clone(),
            bundle,
            mounted_rootfs: mounted,
            runtime,
            init,
            execs: HashMap::new(),
            gpu: super::life::GpuLife::new(gpu, ctl_dir.map(|d| (d, bursts))),
            pool_lock: std::sync::Arc::default(),
        };
        self.created(container, &req, stdio, pid).await;
        self.claim_early_exit(&id, "", pid, since).await;
        Ok(pid)
    }

    /// The bundle's spec, read and classified; for a GPU container, the node's NVIDIA edits
    /// selected and applied in memory (an unknown GPU fails before anything is mounted; they are
    /// written once the rootfs is there for the symlinks and the `ld.so.cache`), and mqfqd's
    /// advice on its allocations taken.
    async fn read_spec(
        &self,
        spec_path: &Path,
        id: &str,
    ) -> Result<(serde_json::Value, Classification, Option<Prepared>)> {
        let text = tokio::fs::read_to_string(spec_path)
            .await
            .map_err(|e| Error::io(format!("read {}", spec_path.display()), e))?;
        let mut spec: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::invalid(spec_path.display().to_string(), e))?;
        let mut gpu = gpu::classify(&spec, id, gpu::GpuAccess::from_env()?)?;
        // Checked on every container, as the other annotations are: a typo fails where it is.
        crate::uvm::warm_asked(&spec)?;
        let Classification::Gpu(w) = &mut gpu else {
            return Ok((spec, gpu, None));
        };
        let nvidia = self.placed_edits(&mut spec, id, w).await;
        let nvidia = nvidia.map_err(|e| {
            if e.is_callers() {
                Error::invalid(format!("GPU container {id}"), e)
            } else {
                Error::FailedPrecondition(format!(
                    "GPU container {id}: {e} (the node's NVIDIA setup)"
                ))
            }
        })?;
        // Still before anything is mounted: a bad interposer annotation fails with nothing to
        // undo.
        w.warm = self.warm_advice(&mut spec, id, w).await?;
        Ok((spec, gpu, nvidia))
    }

    /// The node's NVIDIA edits for the container, for the one GPU mqfqd chooses when the
    /// shim grants it several (issue 17): the grant and the routing narrow to that device. An
    /// answer that is not one of the candidates, or that the edits cannot give, is ignored and
    /// the container gets what it was granted: placement never fails a Create.
    async fn placed_edits(
        &self,
        spec: &mut serde_json::Value,
        id: &str,
        w: &mut gpu::GpuWork,
    ) -> std::result::Result<Option<Prepared>, crate::nvidia::edits::EditError> {
        let file = crate::nvidia::edits_file();
        let several = w.placeable
            && match &w.grant {
                Some(gpu::GpuSelection::All) => true,
                Some(gpu::GpuSelection::Devices(d)) => d.len() > 1,
                None => false,
            };
        if several && let Some(device) = self.gate.place(&self.namespace, id, w).await {
            let among = match &w.grant {
                Some(gpu::GpuSelection::Devices(d)) => d.contains(&device),
                // All: only an index (a MIG name could add devices `all` never gave).
                _ => {
                    !device.is_empty()
                        && device.len() <= 3
                        && device.bytes().all(|b| b.is_ascii_digit())
                }
            };
            if among {
                let narrowed = gpu::GpuWork {
                    grant: Some(gpu::GpuSelection::Devices(vec![device.clone()])),
                    gpus: gpu::GpuSelection::Devices(vec![device.clone()]),
                    placeable: false,
                    ..w.clone()
                };
                let mut trial = spec.clone();
                match crate::nvidia::prepare(&mut trial, &narrowed, &file) {
                    Ok(Some(p)) => {
                        tracing::info!(container = %id, %device, "mqfqd placed the container on one GPU");
                        *spec = trial;
                        *w = narrowed;
                        return Ok(Some(p));
                    }
                    Ok(None) => tracing::warn!(container = %id, %device,
                        "no NVIDIA edits to narrow: the container keeps its grant"),
                    Err(e) => tracing::warn!(container = %id, %device,
                        "mqfqd's placement cannot be applied ({e}): the container keeps its grant"),
                }
            } else {
                tracing::warn!(container = %id, %device,
                    "mqfqd placed the container on a GPU it was not given: ignored");
            }
        }
        crate::nvidia::prepare(spec, w, &file)
    }

    /// Records a created container and announces it (`TaskCreate`).
    async fn created(
        &self,
        container: Container,
        req: &api::CreateTaskRequest,
        stdio: StdioPaths,
        pid: u32,
    ) {
        let id = container.id.clone();
        let mut st = self.state.lock().await;
        st.containers.insert(id.clone(), container);
        self.emit(
            containerd_shim_protos::topics::TASK_CREATE_EVENT_TOPIC,
            Box::new(TaskCreate {
                container_id: id,
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(TaskIO {
                    stdin: stdio.stdin,
                    stdout: stdio.stdout,
                    stderr: stdio.stderr,
                    terminal: stdio.terminal,
                    ..Default::default()
                }),
                checkpoint: req.checkpoint.clone(),
                pid,
                ..Default::default()
            }),
        );
    }
}

/// The NVIDIA edits selected for a GPU container and what applying them in memory did.
type Prepared = (
    crate::nvidia::edits::ContainerEdits,
    crate::nvidia::edits::Applied,
);

/// What a failed Create undoes when this is dropped: the rootfs it mounted and the interposer's
/// control directory it made. [`Undo::disarm`] once the container exists.
#[derive(Debug, Default)]
struct Undo {
    rootfs: Option<PathBuf>,
    ctl: Option<PathBuf>,
}

impl Undo {
    /// The container was created: nothing to undo. Whether a rootfs was mounted.
    fn disarm(mut self) -> bool {
        self.ctl = None;
        self.rootfs.take().is_some()
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some(d) = self.ctl.take() {
            crate::uvm::cleanup(&d);
        }
        if let Some(r) = self.rootfs.take() {
            unmount(&r);
        }
    }
}

/// How long the GPU part of Create may spend in the container's rootfs (links, the
/// `ld.so.cache`, the image's C library). The image is hostile input: whatever it holds, Create
/// answers within this.
const ROOTFS_DEADLINE: Duration = Duration::from_secs(10);

/// What the rootfs work found.
struct RootfsWork {
    spec: serde_json::Value,
    links: usize,
    cache: crate::nvidia::rootfs::LdCache,
    /// Why the interposer is not injected, when it would be wanted.
    unpooled: Option<String>,
}

/// The part of Create that reads and writes the container's rootfs, in-root and off the async
/// threads: the NVIDIA symlinks, the `ld.so.cache`, and whether the interposer fits the image.
fn rootfs_work(
    mut spec: serde_json::Value,
    rootfs: &Path,
    bundle: &Path,
    edits: Option<&crate::nvidia::edits::ContainerEdits>,
    interposer: Option<crate::elf::GlibcVersion>,
) -> std::result::Result<RootfsWork, crate::nvidia::edits::EditError> {
    use crate::nvidia::rootfs as in_root;
    let root = crate::rootfs::Root::open(rootfs)
        .map_err(|e| crate::nvidia::edits::EditError::Rootfs(Box::new(e)))?;
    let (links, cache) = match edits {
        Some(e) => (
            in_root::make_symlinks(&root, e)?,
            in_root::install_ld_cache(&mut spec, &root, e, bundle)?,
        ),
        None => (0, in_root::LdCache::Unchanged),
    };
    let unpooled =
        interposer.and_then(|needs| crate::uvm::fits(needs, crate::uvm::image_glibc(&root)).err());
    Ok(RootfsWork {
        spec,
        links,
        cache,
        unpooled,
    })
}

/// The GPU part of Create once the rootfs is mounted: the NVIDIA edits that need it (symlinks,
/// the container's ld.so.cache), the CUDA interposer where the image can load it, then the spec
/// written for runc. Returns the container's interposer control directory; removes it again on
/// failure.
async fn finish_gpu(
    gpu: &Classification,
    spec: &mut serde_json::Value,
    spec_path: &Path,
    rootfs: &Path,
    nvidia: Option<&Prepared>,
    ns: &str,
    id: &str,
) -> Result<Option<PathBuf>> {
    if matches!(gpu, Classification::NotGpu) {
        return Ok(None);
    }
    let lib = crate::uvm::interposer();
    let needs = if crate::uvm::wanted(spec)? {
        crate::uvm::interposer_needs(&lib)
    } else {
        None
    };
    if nvidia.is_none() && needs.is_none() {
        return Ok(None);
    }
    let edits = nvidia.map(|(e, _)| e.clone());
    let (taken, root, bundle) = (
        std::mem::take(spec),
        rootfs.to_owned(),
        spec_path.parent().unwrap_or(Path::new("/")).to_owned(),
    );
    let job = tokio::task::spawn_blocking(move || {
        rootfs_work(taken, &root, &bundle, edits.as_ref(), needs)
    });
    let work = match tokio::time::timeout(ROOTFS_DEADLINE, job).await {
        Ok(Ok(Ok(w))) => w,
        Ok(Ok(Err(e))) => return Err(Error::invalid(format!("GPU container {id}"), e)),
        Ok(Err(e)) => return Err(Error::io("rootfs work", std::io::Error::other(e))),
        Err(_) => {
            return Err(Error::DeadlineExceeded(format!(
                "GPU container {id}: its rootfs was not prepared within {}s",
                ROOTFS_DEADLINE.as_secs()
            )));
        }
    };
    *spec = work.spec;
    if let Some((_, applied)) = nvidia {
        tracing::info!(
            container = %id, devices = applied.devices, mounts = applied.mounts,
            symlinks = work.links, ld_cache = ?work.cache,
            legacy_hooks_dropped = applied.hooks_dropped,
            hooks_not_run = ?applied.hooks_skipped, "NVIDIA edits applied"
        );
    }
    let ctl = match (needs, &work.unpooled) {
        (Some(_), None) => {
            let dir = crate::uvm::make_ctl_dir(&crate::uvm::ctl_root(), ns, id)?;
            if let Err(e) = crate::uvm::add_to_spec(spec, &lib, &dir, id, crate::uvm::burst_mode())
            {
                crate::uvm::cleanup(&dir);
                return Err(e);
            }
            Some(dir)
        }
        (Some(_), Some(why)) => {
            tracing::warn!(container = %id, "CUDA interposer not injected: {why}; the container runs unpooled");
            None
        }
        (None, _) => None,
    };
    let write = async {
        let text = serde_json::to_vec(spec)
            .map_err(|e| Error::invalid(spec_path.display().to_string(), e))?;
        tokio::fs::write(spec_path, text)
            .await
            .map_err(|e| Error::io(format!("write {}", spec_path.display()), e))
    };
    if let Err(e) = write.await {
        if let Some(d) = &ctl {
            crate::uvm::cleanup(d);
        }
        return Err(e);
    }
    Ok(ctl)
}
