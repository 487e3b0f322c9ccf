//! The startup steps `Daemon::start` runs in KEP-3756's order: the root
//! dir made a shared mount (never by binding over mounts beneath it),
//! reconstruction phase 1, the source poller, and phase 2 (the pod-dir
//! walk) once the loop is ready. Each logs its phase with its duration.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::host::boot::BootId;
use crate::host::mountinfo::MountTable;
use crate::host::sys::{MsFlags, Sys};
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::model::Layout;
use crate::reconstruct::edge::{
    HostInput, JournalInput, Reconstruction, TableRead, read_and_reconstruct_ready,
    read_live_mount_table, reconstruct_leftovers_until, reconstruct_ready, record_leftovers,
};
use crate::reconstruct::{MergeOutput, apply_to_asw};
use crate::sources::{Sources, SourcesConfig};
use crate::util::time::elapsed_ms;

use super::event_loop::Event;
use super::{DaemonConfig, DaemonError, spawn};
use crate::host::watch;
use crate::reconciler::effects::Reconstructed;

/// The targets `output` found unmounted outside volumed, as `/debug/state`
/// lists them.
fn outside_rows(output: &MergeOutput) -> Vec<crate::state::UnmountedOutside> {
    output
        .unmounted_outside
        .iter()
        .map(|k| {
            let pod_uid = k.target.pod().map(|p| p.as_str().to_owned());
            crate::state::UnmountedOutside {
                volume: k.volume.as_str().to_owned(),
                target: if pod_uid.is_some() { "pod" } else { "device" }.to_owned(),
                pod_uid,
                path: output
                    .decision(k)
                    .and_then(|d| d.params.path())
                    .map(|p| p.to_string_lossy().into_owned()),
            }
        })
        .collect()
}

/// Logs a reconstruction phase; returns its unmounted-outside rows (each
/// logged), for `/debug/state`.
fn log_reconstruction(what: &str, output: &MergeOutput) -> Vec<crate::state::UnmountedOutside> {
    for f in &output.failed {
        tracing::warn!(path = %f.path.display(), cause = ?f.cause,
            "reconstruction failed for this target; the forced cleanup handles it once every source has listed");
    }
    let outside = outside_rows(output);
    for o in &outside {
        tracing::warn!(volume = %o.volume, target = %o.target, path = o.path.as_deref().unwrap_or("?"),
            "unmounted outside volumed: the journal had it mounted this boot; mounted again if still needed");
    }
    tracing::info!(
        decisions = output.decisions.len(),
        failed = output.failed.len(),
        unmounted_outside = output.unmounted_outside.len(),
        "{what}"
    );
    outside
}

/// Makes `root` a shared mount, never by binding over a mount that already
/// exists beneath it: a recursive bind of the root onto itself clones every
/// mount below and leaves the originals under the bind, out of reach of any
/// unmount (their devices stay busy for good); a plain bind hides them.
///
/// - `root` a mount point: made shared, with everything below it;
/// - `root` on a mount that is already shared (the kubelet's `MakeRShared`
///   checks the same): nothing to do, a mount made below it propagates;
/// - otherwise, with nothing mounted below: bound onto itself, then shared;
/// - otherwise: refused with an error naming the mounts and the fixes.
pub(super) fn make_root_shared(sys: &dyn Sys, root: &std::path::Path) -> Result<(), DaemonError> {
    let err = |cause| DaemonError::SharedRoot {
        path: root.to_owned(),
        cause: Box::new(cause),
    };
    let shared = MsFlags::MS_SHARED | MsFlags::MS_REC;
    if sys.mount_root(root).map_err(err)? {
        return sys.mount(None, root, None, shared, None).map_err(err);
    }
    let table = sys.read_mountinfo().map_err(err)?;
    let id = sys.mnt_id(root).map_err(err)?;
    let holder = u32::try_from(id)
        .ok()
        .and_then(|id| table.by_id(id))
        .or_else(|| root.ancestors().find_map(|a| table.top_at(a)));
    if holder.is_some_and(|m| m.propagation.shared.is_some()) {
        return Ok(());
    }
    let beneath: Vec<PathBuf> = table.under(root).map(|m| m.mount_point.clone()).collect();
    if !beneath.is_empty() {
        return Err(DaemonError::MountsBeneathRoot {
            path: root.to_owned(),
            holder: holder.map_or_else(|| PathBuf::from("/"), |m| m.mount_point.clone()),
            mounts: beneath,
        });
    }
    sys.mount(
        Some(root),
        root,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None,
    )
    .map_err(err)?;
    sys.mount(None, root, None, shared, None).map_err(err)
}

/// At most this many paths are named in an error that lists mounts.
const MOUNTS_NAMED: usize = 5;

/// `mounts` for an error message: the first few, and how many more.
pub(super) fn name_mounts(mounts: &[PathBuf]) -> String {
    let mut s = mounts
        .iter()
        .take(MOUNTS_NAMED)
        .map(|m| m.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if mounts.len() > MOUNTS_NAMED {
        s.push_str(&format!(" and {} more", mounts.len() - MOUNTS_NAMED));
    }
    s
}

/// The root dir made, resolved and made a shared mount; the layout on it.
/// The root is used resolved: the mount table shows resolved paths, and
/// targets are reached beneath it without following symlinks (a root dir
/// behind a symlink, `/var/lib/kubelet` -> `/data/kubelet`, is fine; a
/// symlink below it is refused).
pub(super) fn resolved_root(layout: &Layout, sys: &dyn Sys) -> Result<Layout, DaemonError> {
    let root = layout.root().to_owned();
    let err = |cause| DaemonError::RootDir {
        path: root.clone(),
        cause,
    };
    crate::host::sys::mkdir_all(sys, &root, 0o755).map_err(|e| err(e.to_io()))?;
    let root = sys.canonicalize(&root).map_err(|e| err(e.to_io()))?;
    make_root_shared(sys, &root)?;
    Ok(Layout::new(&root))
}

/// Reconstruction phase 1: one mount-table read (`early`, when the journal's
/// open started it) merged with the journal (or, with the journal off, the
/// host alone) into a ready ASW. Returns what the loop is handed, the
/// table (phase 2 reuses it) and what was decided.
pub(super) fn reconstruct_first(
    cfg: &DaemonConfig,
    journal: Option<&Arc<Journal>>,
    replaced: Option<&str>,
    sys: &Arc<dyn Sys>,
    metrics: &Metrics,
    started: Instant,
    early: Option<TableRead>,
) -> Result<(Reconstructed, MountTable, Reconstruction), DaemonError> {
    let mut handed = Reconstructed::default();
    // `Reconstructed` records written: none when the journal agreed with
    // the host on every target
    let mut recorded = 0;
    let (table, ready) = match journal {
        Some(j) => {
            let ready = read_and_reconstruct_ready(
                j,
                replaced,
                sys.as_ref(),
                &cfg.layout,
                &cfg.boot_id,
                early,
            )?;
            handed.asw = ready.asw;
            recorded = ready.outcome.appended.len();
            (ready.table, ready.outcome.reconstruction)
        }
        None => {
            let table = read_live_mount_table(sys.as_ref())?;
            let host = HostInput {
                layout: &cfg.layout,
                table: &table,
                boot_id: &cfg.boot_id,
                sys: sys.as_ref(),
            };
            let r = reconstruct_ready(&host, JournalInput::Off);
            for e in apply_to_asw(&r.output, &mut handed.asw) {
                tracing::error!(error = %e, "reconstruction: the ASW refused a decision");
            }
            (table, r)
        }
    };
    crate::reconstruct::record_metrics(metrics, &ready.output);
    metrics
        .reconstruct
        .seconds
        .set(started.elapsed().as_secs_f64());
    tracing::info!(
        phase = "asw_ready",
        elapsed_ms = elapsed_ms(started.elapsed()),
        targets = ready.output.decisions.len(),
        recorded,
        "startup phase"
    );
    handed.unmounted_outside = log_reconstruction("reconstruction done, ASW ready", &ready.output);
    handed.failed = ready.output.failed.clone();
    if journal.is_some() {
        handed.not_mounted = crate::reconciler::core::not_mounted(&ready.output).collect();
    }
    Ok((handed, table, ready))
}

/// The shortest sleep of the source poller for the parsed-manifest cache
/// (a file that has not settled yet is waited for in steps no shorter).
const CACHE_WAKE_MIN: std::time::Duration = std::time::Duration::from_millis(200);

/// The source poller: the first listing at once; then on inotify events
/// (or the fallback poll), with a full re-read every [`watch::RESYNC`] or
/// more on a big node (`Watcher::relisted_unchanged`). A
/// wake that concerns the pods dir only does not list the objects dir
/// again (a `stat` per object file).
pub(super) fn spawn_sources(
    cfg: &DaemonConfig,
    caches: Option<(PathBuf, PathBuf)>,
    sys: Arc<dyn Sys>,
    tx: Sender<Event>,
    gate: Arc<super::api::ReadyGate>,
) -> Result<(JoinHandle<()>, watch::Stopper), DaemonError> {
    let mut sources = Sources::with_sys(
        SourcesConfig {
            pods_dir: cfg.static_pods.clone(),
            objects_dir: cfg.static_objects.clone(),
            node_name: cfg.node_name.clone(),
            poll_interval: cfg.poll_interval,
            secrets: cfg.secrets.clone(),
            payload_objects: cfg.payload_objects.clone(),
            manifest_cache: caches.as_ref().map(|c| c.0.clone()),
            objects_cache: caches.map(|c| c.1),
        },
        sys,
    );
    let dirs: Vec<PathBuf> = [cfg.static_pods.clone(), cfg.static_objects.clone()]
        .into_iter()
        .flatten()
        .collect();
    // the objects dir's index in `dirs`, when there is one
    let objects_at = cfg
        .static_objects
        .is_some()
        .then_some(usize::from(cfg.static_pods.is_some()));
    let mut watcher = watch::Watcher::new(dirs, cfg.poll_interval);
    let stopper = watcher.stopper();
    let thread = spawn("volumed-sources", move || {
        let mut read_now = Some(watch::Changed::All);
        let mut listed = false;
        while !watcher.is_stopped() {
            let polled = Instant::now();
            let evs = match &read_now {
                None => None,
                Some(c) if objects_at.is_some_and(|i| !c.includes(i)) => {
                    sources.poll_pods_changes()
                }
                Some(_) => {
                    let evs = sources.poll_changes();
                    if evs.is_none() && listed {
                        // a full re-list that found nothing: what the
                        // safety net costs on this node
                        watcher.relisted_unchanged(polled.elapsed());
                    }
                    evs
                }
            };
            if !listed && sources.ready_sent() {
                listed = true;
                tracing::info!(
                    phase = "sources_listed",
                    elapsed_ms = elapsed_ms(polled.elapsed()),
                    pods = sources.current().len(),
                    from_cache = sources.cache_hits(),
                    objects_from_cache = sources.objects_cache_hits(),
                    "startup phase"
                );
            }
            if let Some(mut evs) = evs {
                // Readiness is the gate's to send, once every source listed,
                // and only after this source's own events.
                let ready = evs.last() == Some(&crate::sources::SourceEvent::SourcesReady);
                if ready {
                    evs.pop();
                }
                if !evs.is_empty() && tx.send(Event::Sources(evs)).is_err() {
                    return;
                }
                if ready
                    && gate.listed()
                    && tx
                        .send(Event::Sources(vec![
                            crate::sources::SourceEvent::SourcesReady,
                        ]))
                        .is_err()
                {
                    return;
                }
            }
            // the parsed-file caches are written from this thread, when
            // what was parsed has settled (never on the loop's path)
            let now = Instant::now();
            let mut wait = watcher.resync();
            if let Some(due) = sources.cache_due() {
                if due <= Instant::now() {
                    sources.write_cache();
                }
                if let Some(next) = sources.cache_due() {
                    wait = wait.min(next.saturating_duration_since(now).max(CACHE_WAKE_MIN));
                }
            }
            read_now = watcher.wait_changed(wait);
        }
    })?;
    Ok((thread, stopper))
}

/// What reconstruction phase 2 starts from.
pub(super) struct Leftovers {
    pub(super) layout: Layout,
    pub(super) boot: BootId,
    pub(super) journal: Option<Arc<Journal>>,
    pub(super) replaced: Option<String>,
    pub(super) table: MountTable,
    pub(super) ready: Reconstruction,
    /// set when the daemon stops: the walk ends at the next pod (a stop
    /// right after a restart need not wait for a walk of the whole node)
    pub(super) stopping: Arc<std::sync::atomic::AtomicBool>,
}

/// Reconstruction phase 2, the pod-dir walk, once the loop is ready
/// (docs/merge-table.md, "Two phases at startup": it only finds
/// kubelet-era dirs and leftovers for cleanup): a stat of every pod's dirs must not compete for the CPU with
/// the first listing of the sources, which readiness waits for.
pub(super) fn spawn_leftovers(
    l: Leftovers,
    sys: Arc<dyn Sys>,
    metrics: Arc<Metrics>,
    ready: mpsc::Receiver<()>,
    tx: Sender<Event>,
) -> Result<JoinHandle<()>, DaemonError> {
    spawn("volumed-leftovers", move || {
        if ready.recv().is_err() {
            // the loop ended before it was ready: nothing to walk for
            return;
        }
        let walk = Instant::now();
        let host = HostInput {
            layout: &l.layout,
            table: &l.table,
            boot_id: &l.boot,
            sys: sys.as_ref(),
        };
        let stopping = l.stopping.clone();
        let stop = move || stopping.load(std::sync::atomic::Ordering::Acquire);
        let output = match &l.journal {
            Some(j) => {
                let mut scratch = crate::state::ActualStateOfWorld::new();
                let recorded = record_leftovers(
                    j,
                    l.replaced.as_deref(),
                    &host,
                    &l.ready,
                    &mut scratch,
                    &stop,
                );
                match recorded {
                    Ok(o) => o.map(|o| o.reconstruction.output),
                    Err(e) => {
                        tracing::error!(error = %e, "recording leftover decisions failed");
                        return;
                    }
                }
            }
            None => reconstruct_leftovers_until(&host, JournalInput::Off, &l.ready, &stop)
                .map(|r| r.output),
        };
        let Some(output) = output else {
            tracing::info!(
                elapsed_ms = elapsed_ms(walk.elapsed()),
                "pod-dir walk cut short by the stop: nothing recorded, the next start walks again"
            );
            return;
        };
        crate::reconstruct::record_metrics(&metrics, &output);
        let outside = log_reconstruction("pod-dir walk done", &output);
        tracing::info!(
            phase = "pod_dir_walk",
            elapsed_ms = elapsed_ms(walk.elapsed()),
            "startup phase"
        );
        // the mount table and phase 1's decisions go before the loop hears
        // of it: the trim its settling asks for then returns their pages
        drop(l);
        let _ = tx.send(Event::Leftovers(Box::new(output), outside));
    })
}
