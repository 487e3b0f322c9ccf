//! The two phases' decisions, changing nothing anywhere: the scan, the
//! merge input and the merge, for the dry run and for the daemon.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::path::Path;

use fxhash::FxHashSet;

use crate::host::pod_dirs::attach_vol_data_except;
use crate::host::scan::{
    HostView, attach_vol_data, read_block_links, scan_mounts, scan_with_table,
    walk_block_links_until, walk_pod_dirs_until,
};
use crate::host::sys::Sys;
use crate::model::Layout;

use super::input::{MountIndex, build_input_moving, host_targets_moving};
use super::{HostInput, JournalInput, Reconstruction};
use crate::reconstruct::paths::plain_bytes;
use crate::reconstruct::{MergeInput, MergeOutput, merge, merge_leftovers};

/// The layout with its root canonicalised (the mount table shows resolved
/// paths).
fn resolved(sys: &dyn Sys, layout: &Layout) -> Layout {
    Layout::new(
        sys.canonicalize(layout.root())
            .unwrap_or_else(|_| layout.root().into()),
    )
}

fn alarm_if_unreadable(journal: JournalInput<'_>) {
    if let JournalInput::Unreadable { reason } = journal {
        tracing::error!(
            %reason,
            "journal unreadable: every target is rebuilt from the host alone, as the kubelet does; \
             mounts the host cannot prove stay uncertain"
        );
    }
}

/// Scans the host, fills the merge input, merges, and builds the report:
/// both phases in one pass ([`reconstruct_ready`] then
/// [`reconstruct_leftovers`] decide the same targets the same way).
/// Changes nothing anywhere (the dry run shares it).
pub fn reconstruct(host: &HostInput<'_>, journal: JournalInput<'_>) -> Reconstruction {
    alarm_if_unreadable(journal);
    let layout = resolved(host.sys, host.layout);
    let view = scan_with_table(host.sys, host.table, &layout, host.boot_id.clone());
    finish(host, journal, view, merge)
}

/// Phase 1, up to a ready ASW: the mount-table part of the scan
/// ([`scan_mounts`], CSI `vol_data.json` of mounted CSI targets), every
/// journal target's own observation (the table, or one `lstat` for a path
/// with nothing mounted) and the merge. Decides every journal target and
/// every target mounted in the kubelet layout; the pod-dir walk is left to
/// [`reconstruct_leftovers`]. Changes nothing anywhere.
pub fn reconstruct_ready(host: &HostInput<'_>, journal: JournalInput<'_>) -> Reconstruction {
    ready_with(host, journal, merge)
}

/// [`reconstruct_ready`], and per decision whether the journal already
/// implies it (see [`crate::reconstruct::merge_checked`]).
pub(super) fn reconstruct_ready_checked(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
) -> (Reconstruction, Vec<bool>) {
    let mut agrees = Vec::new();
    let r = ready_with(host, journal, |input| {
        let (out, checked) = crate::reconstruct::merge_checked(input);
        agrees = checked;
        out
    });
    (r, agrees)
}

fn ready_with(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    decide: impl FnOnce(&MergeInput<'_>) -> MergeOutput,
) -> Reconstruction {
    alarm_if_unreadable(journal);
    let layout = resolved(host.sys, host.layout);
    let mut mounts = scan_mounts(host.table, &layout);
    read_block_links(host.sys, &mut mounts.block_maps);
    let mut view = HostView {
        boot_id: host.boot_id.clone(),
        device_targets: mounts.device_targets,
        pod_targets: mounts.pod_targets,
        found_dirs: Vec::new(),
        unknown_plugin_dirs: mounts.unknown_plugin_dirs,
        block_maps: mounts.block_maps,
        problems: mounts.problems,
    };
    // Asked only of device targets and CSI pod targets: built on the first
    // question (a node of emptyDirs asks none), keyed by plain bytes, equal
    // exactly when the paths are (`Path`'s hash walks components; at 10k
    // targets the set cost ~10% of the merge phase).
    let journaled: OnceCell<FxHashSet<Cow<'_, [u8]>>> = OnceCell::new();
    let known = |p: &Path| {
        journaled
            .get_or_init(|| {
                journal
                    .state()
                    .map(|s| {
                        s.entries()
                            .filter_map(|(_, e)| e.current_params().path())
                            .map(plain_bytes)
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .contains(plain_bytes(p).as_ref())
    };
    attach_vol_data_except(host.sys, &mut view, &layout, &known);
    finish(host, journal, view, decide)
}

/// The pod-dir walk of phase 2 (with the CSI `vol_data.json` of what it
/// found): bare dirs of known plugins and dirs of unknown plugins that are
/// not mount points.
/// `None` when `stop` said so before the walk ended.
pub(super) fn walk_leftovers(host: &HostInput<'_>, stop: &dyn Fn() -> bool) -> Option<HostView> {
    let layout = resolved(host.sys, host.layout);
    let mut problems = Vec::new();
    let (found_dirs, unknown_plugin_dirs) =
        walk_pod_dirs_until(host.sys, &layout, host.table, &mut problems, stop)?;
    let mut block_maps =
        walk_block_links_until(host.sys, &layout, host.table, &mut problems, stop)?;
    read_block_links(host.sys, &mut block_maps);
    let mut view = HostView {
        boot_id: host.boot_id.clone(),
        device_targets: Vec::new(),
        pod_targets: Vec::new(),
        found_dirs,
        unknown_plugin_dirs,
        block_maps,
        problems,
    };
    attach_vol_data(host.sys, &mut view, &layout);
    Some(view)
}

/// Phase 2, after readiness: the pod-dir walk, and decisions for what it
/// found that neither the journal nor `ready` decided
/// ([`crate::reconstruct::merge_leftovers`]): kubelet-era bare emptyDirs (`found_dir`),
/// `mount` targets' dirs with nothing mounted (`host_leftover`, orphan
/// cleanup), dirs of plugins volumed does not have (listed as failed).
/// Changes nothing anywhere.
pub fn reconstruct_leftovers(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    ready: &Reconstruction,
) -> Reconstruction {
    decide_leftovers(host, journal, walk_all_leftovers(host), ready)
}

/// [`walk_leftovers`] never told to stop.
pub(super) fn walk_all_leftovers(host: &HostInput<'_>) -> HostView {
    // (a walk never told to stop always ends with a view)
    walk_leftovers(host, &|| false).unwrap_or_else(|| HostView {
        boot_id: host.boot_id.clone(),
        device_targets: Vec::new(),
        pod_targets: Vec::new(),
        found_dirs: Vec::new(),
        unknown_plugin_dirs: Vec::new(),
        block_maps: Vec::new(),
        problems: Vec::new(),
    })
}

/// [`reconstruct_leftovers`] for a daemon that may stop meanwhile: `None`
/// when `stop` said so during the walk (nothing decided; the next start
/// walks again).
pub fn reconstruct_leftovers_until(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    ready: &Reconstruction,
    stop: &dyn Fn() -> bool,
) -> Option<Reconstruction> {
    let view = walk_leftovers(host, stop)?;
    Some(decide_leftovers(host, journal, view, ready))
}

pub(super) fn decide_leftovers(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    mut view: HostView,
    ready: &Reconstruction,
) -> Reconstruction {
    // the walk's targets are bare dirs or dirs of unknown plugins: few lookups
    let tops = MountIndex::new(host.table, false);
    let mut pods = std::mem::take(&mut view.pod_targets);
    pods.append(&mut view.found_dirs);
    let input = MergeInput {
        journal: journal.state(),
        current_boot_id: host.boot_id.as_str().to_owned(),
        host_targets: host_targets_moving(&tops, &view, pods),
        observe: Default::default(),
        device_ids: BTreeMap::new(),
        bind_sources: Default::default(),
    };
    let output = merge_leftovers(&input, &ready.output);
    Reconstruction::new(output, view.problems, host.boot_id.as_str(), journal)
}

impl Reconstruction {
    /// Both phases as one reconstruction: `ready`'s decisions and findings,
    /// then `leftovers'` (one report over all of them).
    pub fn combine(
        ready: Reconstruction,
        leftovers: Reconstruction,
        boot_id: &str,
        journal: JournalInput<'_>,
    ) -> Reconstruction {
        let mut output = ready.output;
        let more = leftovers.output;
        output.decisions.extend(more.decisions);
        output.failed.extend(more.failed);
        output.unmounted_outside.extend(more.unmounted_outside);
        output.orphan_leftovers.extend(more.orphan_leftovers);
        output
            .needs_device_path_from_node_status
            .extend(more.needs_device_path_from_node_status);
        let mut problems = ready.problems;
        problems.extend(leftovers.problems);
        Reconstruction::new(output, problems, boot_id, journal)
    }
}

/// Fills the merge input from `view` and merges with `decide`.
fn finish(
    host: &HostInput<'_>,
    journal: JournalInput<'_>,
    mut view: HostView,
    decide: impl FnOnce(&MergeInput<'_>) -> MergeOutput,
) -> Reconstruction {
    let input = build_input_moving(host.sys, host.table, &mut view, journal.state());
    let output = decide(&input);
    drop_aside(input);
    Reconstruction::new(output, view.problems, host.boot_id.as_str(), journal)
}

/// Frees what the merge was given on a thread of its own: a path and a
/// few strings per target, on the restart's critical path otherwise
/// (the ASW and the first pass wait for the merge). Freed here when no
/// thread can be started.
fn drop_aside(input: MergeInput<'_>) {
    let MergeInput {
        host_targets,
        observe,
        device_ids,
        bind_sources,
        ..
    } = input;
    let owned = (host_targets, observe, device_ids, bind_sources);
    let spawned = std::thread::Builder::new()
        .name("volumed-free".into())
        .spawn(move || drop(owned));
    drop(spawned);
}
