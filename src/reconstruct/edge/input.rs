//! Filling the [`MergeInput`] from one scan: journal targets' observations,
//! host-found targets, device ids, and the index of the table's top mounts.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use fxhash::{FxHashMap, FxHashSet};

use crate::host::mountinfo::{MountInfo, MountTable};
use crate::host::scan::{
    BlockPodMap, DeviceName, DeviceTarget, HostView, Observed, PodTarget, UnknownPluginDir, VolData,
};
use crate::host::sys::{Beneath, FileKind, Sys};
use crate::journal::JournalState;
use crate::model::{
    CsiLifecycle, Layout, PluginName, PodUid, SeLinuxContext, TargetKind, TargetRef,
    UniqueVolumeName, VOL_DATA_FILE,
};

use crate::reconstruct::{
    BlockMap, HostObservation, HostTarget, MergeInput, ObservedMount, Rebuild, devices,
};

/// Fills the merge input from one scan (see the module doc for what goes
/// where).
#[cfg(test)]
pub(super) fn build_input<'a>(
    sys: &dyn Sys,
    table: &MountTable,
    view: &HostView,
    journal: Option<&'a JournalState>,
) -> MergeInput<'a> {
    let tops = MountIndex::new(table, true);
    let host_targets = host_targets(&tops, view);
    fill_input(sys, &tops, host_targets, view, journal)
}

/// `build_input`, taking the view's pod targets and bare dirs instead of
/// copying them.
pub(super) fn build_input_moving<'a>(
    sys: &dyn Sys,
    table: &MountTable,
    view: &mut HostView,
    journal: Option<&'a JournalState>,
) -> MergeInput<'a> {
    let tops = MountIndex::new(table, true);
    let mut pods = std::mem::take(&mut view.pod_targets);
    pods.append(&mut view.found_dirs);
    let host_targets = host_targets_moving(&tops, view, pods);
    fill_input(sys, &tops, host_targets, view, journal)
}

fn fill_input<'a>(
    sys: &dyn Sys,
    tops: &MountIndex<'_>,
    host_targets: Vec<HostTarget>,
    view: &HostView,
    journal: Option<&'a JournalState>,
) -> MergeInput<'a> {
    // Only journal paths are looked up in `observe`: one table lookup each,
    // else one `lstat`. A target path that is a host-found target's with a
    // mount is skipped: the merge takes that target's observation, the same
    // top mount of the same table. Device mount paths are always observed
    // here (the merge compares pod binds with them through `observe`).
    let mut found_mounted: FxHashSet<&[u8]> = FxHashSet::default();
    found_mounted.reserve(host_targets.len());
    found_mounted.extend(
        host_targets
            .iter()
            .filter(|h| matches!(h.observation, HostObservation::Mounted(_)))
            .map(|h| h.path.as_os_str().as_bytes()),
    );
    let mut observe = crate::reconstruct::PathMap::default();
    let mut device_paths: FxHashSet<&[u8]> = FxHashSet::default();
    let mut bind_sources = crate::reconstruct::PathMap::default();
    if let Some(state) = journal {
        observe.reserve(state.len() / 8 + 1);
        // looked-up paths by bytes (`Path`'s hash walks components): a path
        // spelt two ways is looked up twice, to the same answer
        let mut looked: FxHashSet<&[u8]> = FxHashSet::default();
        // `map_file`: for a raw block pod target (`path` its symlink), the
        // pod's file in the global map dir, where its bind sits
        let mut look = |path: &'a Path, map_file: Option<PathBuf>| {
            if !looked.insert(path.as_os_str().as_bytes()) {
                return;
            }
            if let Some(file) = map_file {
                if let Some(seen) = block_map_at(sys, tops, path, &file) {
                    observe.insert(path.to_owned(), seen);
                }
                return;
            }
            if let Some(top) = tops.top_at(path) {
                observe.insert(path.to_owned(), HostObservation::Mounted(observed(top)));
            } else if is_dir(sys, path) {
                observe.insert(path.to_owned(), HostObservation::DirPresent);
            }
        };
        // a volume's targets come together and name the same device paths:
        // the previous ones are skipped without hashing them again
        let (mut last_mount, mut last_device): (Option<&[u8]>, Option<&[u8]>) = (None, None);
        for (_, entry) in state.entries() {
            let params =
                std::iter::once(&entry.params).chain(entry.pending.iter().map(|p| &p.params));
            for p in params {
                if let Some(path) = p.path()
                    && !found_mounted.contains(path.as_os_str().as_bytes())
                {
                    let map_file = match (p.kind, &p.target, p.device_mount_path()) {
                        // a CSI block volume's device target is its staging
                        // dir; the pod's bind is in its global map path
                        (TargetKind::Block, TargetRef::Pod(pod), Some(dir))
                            if p.plugin == crate::model::PluginName::Csi =>
                        {
                            Layout::csi_block_pod_map_beside(dir, &p.spec_name, pod)
                        }
                        (TargetKind::Block, TargetRef::Pod(pod), Some(dir)) => {
                            Some(Layout::block_pod_map_in(dir, pod))
                        }
                        _ => None,
                    };
                    look(path, map_file);
                }
                if let Some(path) = p.device_mount_path() {
                    let b = path.as_os_str().as_bytes();
                    if last_mount != Some(b) {
                        look(path, None);
                        last_mount = Some(b);
                    }
                }
                // a directory bound into a pod (a local PV that is one): the
                // identity its bind must show, from the same table
                if p.plugin == PluginName::LocalVolume
                    && p.device_mount_path().is_none()
                    && let Some(d) = p.device_path()
                    && !bind_sources.contains_key(d)
                    && let Some(id) = tops.table.identity_at(d)
                {
                    bind_sources.insert(d.to_owned(), id);
                }
                // one `stat` per distinct device path, however many targets name it
                if let Some(d) = p.device_path() {
                    let b = d.as_os_str().as_bytes();
                    if last_device != Some(b) {
                        device_paths.insert(b);
                        last_device = Some(b);
                    }
                }
            }
        }
    }
    let device_paths = device_paths
        .into_iter()
        .map(|b| Path::new(std::ffi::OsStr::from_bytes(b)));
    MergeInput {
        journal,
        current_boot_id: view.boot_id.as_str().to_owned(),
        host_targets,
        observe,
        device_ids: devices::device_ids(sys, device_paths),
        bind_sources,
    }
}

/// The top mount at every mount point of one table, by path bytes (one
/// hash lookup where [`MountTable::top_at`] searches the sorted table),
/// built on first need: the first [`INDEX_AFTER`] lookups search the table,
/// as few do not repay hashing every mount point (with every mounted target
/// found by the scan, a journal that agrees looks up little else). A path
/// not in the index (`/`, or one spelt with a trailing `/`) is looked up in
/// the table.
pub(super) struct MountIndex<'t> {
    table: &'t MountTable,
    /// lookups so far, while the index is not built
    lookups: std::cell::Cell<usize>,
    tops: std::cell::OnceCell<FxHashMap<&'t [u8], &'t MountInfo>>,
}

/// Lookups a [`MountIndex`] answers from the sorted table before indexing it.
const INDEX_AFTER: usize = 64;

impl<'t> MountIndex<'t> {
    /// Indexes `table` once more than [`INDEX_AFTER`] lookups are asked
    /// (`full` false: never; every lookup goes to the table).
    pub(super) fn new(table: &'t MountTable, full: bool) -> Self {
        let tops = std::cell::OnceCell::new();
        if !full {
            let _ = tops.set(FxHashMap::default());
        }
        MountIndex {
            table,
            lookups: std::cell::Cell::new(0),
            tops,
        }
    }

    /// The index, built on first call (one pass over the table).
    fn index(&self) -> &FxHashMap<&'t [u8], &'t MountInfo> {
        self.tops.get_or_init(|| {
            let mut tops = FxHashMap::default();
            tops.reserve(self.table.len());
            for stack in self.table.stacks_under(Path::new("/")) {
                let top = stack.top();
                tops.insert(top.mount_point.as_os_str().as_bytes(), top);
            }
            tops
        })
    }

    /// The visible mount at `path`, as [`MountTable::top_at`] finds it.
    fn top_at(&self, path: &Path) -> Option<&'t MountInfo> {
        if self.tops.get().is_none() {
            let n = self.lookups.get() + 1;
            self.lookups.set(n);
            if n <= INDEX_AFTER {
                return self.table.top_at(path);
            }
        }
        match self.index().get(path.as_os_str().as_bytes()) {
            Some(top) => Some(*top),
            None => self.table.top_at(path),
        }
    }

    /// What the table shows at `path`: its top mount, else a present dir.
    fn observation_at(&self, path: &Path) -> HostObservation {
        match self.top_at(path) {
            Some(top) => HostObservation::Mounted(observed(top)),
            None => HostObservation::DirPresent,
        }
    }
}

/// What the host shows of a pod's raw block map: its symlink at `link`
/// (where it points) and a mount on the pod's `file` in the global map
/// dir; `None` when neither is there. Anything but a symlink at `link` is
/// a dir (not our map).
fn block_map_at(
    sys: &dyn Sys,
    tops: &MountIndex<'_>,
    link: &Path,
    file: &Path,
) -> Option<HostObservation> {
    let bound = tops.top_at(file).is_some();
    let target = match sys.stat(link, false) {
        Ok(st) if st.kind == FileKind::Symlink => {
            Beneath::split(Path::new("/"), link).and_then(|at| sys.read_link_beneath(at).ok())
        }
        Ok(_) => return Some(HostObservation::DirPresent),
        Err(_) => None,
    };
    (target.is_some() || bound).then_some(HostObservation::Mapped(BlockMap {
        link: target,
        bound,
    }))
}

/// A directory, not followed through a symlink.
fn is_dir(sys: &dyn Sys, path: &Path) -> bool {
    sys.stat(path, false)
        .is_ok_and(|st| st.kind == FileKind::Dir)
}

/// The merge's view of one mountinfo line.
fn observed(m: &MountInfo) -> ObservedMount {
    ObservedMount {
        identity: m.identity(),
        source: PathBuf::from(&m.source),
    }
}

/// Every host-found target, in scan order: device targets, mounted pod
/// targets, bare dirs, then dirs of unknown plugins.
#[cfg(test)]
fn host_targets(table: &MountIndex<'_>, view: &HostView) -> Vec<HostTarget> {
    let pods = view.pod_targets.iter().chain(&view.found_dirs).cloned();
    host_targets_moving(table, view, pods.collect())
}

/// `host_targets`, with the pod targets and bare dirs moved in (in that
/// order).
pub(super) fn host_targets_moving(
    table: &MountIndex<'_>,
    view: &HostView,
    pods: Vec<PodTarget>,
) -> Vec<HostTarget> {
    let devices = view.device_targets.iter().map(|t| device_target(table, t));
    let pods = pods.into_iter().map(pod_target);
    let unknown = view
        .unknown_plugin_dirs
        .iter()
        .map(|d| unknown_target(table, d));
    let maps = block_map_targets(&view.block_maps);
    devices.chain(pods).chain(maps).chain(unknown).collect()
}

/// The raw block pod maps found by their bind: each pod's target (its
/// symlink, the map whole or in part) and, once per volume, the device's
/// (a local PV's global map dir, a CSI volume's staging dir), as the
/// kubelet reconstructs a block volume's global map path with its pods.
/// A CSI volume is named by its `vol_data.json` (driver and handle), as the
/// kubelet's CSI block mapper rebuilds its spec; without one it cannot be
/// rebuilt.
fn block_map_targets(maps: &[BlockPodMap]) -> Vec<HostTarget> {
    let mut out = Vec::with_capacity(maps.len() + 1);
    let mut dirs: FxHashSet<&Path> = FxHashSet::default();
    for m in maps {
        let rebuild = || match m.plugin {
            PluginName::Csi => csi_rebuild(m.vol_data.as_ref(), &m.link, None),
            _ => Rebuild::Ready {
                volume: UniqueVolumeName::shared(m.plugin, &m.pv),
                selinux: None,
                csi: None,
            },
        };
        if dirs.insert(&m.map_dir) {
            out.push(HostTarget {
                path: m.map_dir.clone(),
                target: TargetRef::Device,
                plugin_name: m.plugin.as_str().into(),
                plugin: Some(m.plugin),
                spec_name: m.pv.clone(),
                kind: TargetKind::Block,
                observation: HostObservation::DirPresent,
                rebuild: rebuild(),
            });
        }
        out.push(HostTarget {
            path: m.link.clone(),
            target: TargetRef::Pod(m.pod_uid.clone()),
            plugin_name: m.plugin.as_str().into(),
            plugin: Some(m.plugin),
            spec_name: m.pv.clone(),
            kind: TargetKind::Block,
            observation: HostObservation::Mapped(BlockMap {
                link: m.link_target.clone(),
                bound: m.bound,
            }),
            rebuild: rebuild(),
        });
    }
    out
}

fn device_target(table: &MountIndex<'_>, t: &DeviceTarget) -> HostTarget {
    let (spec_name, rebuild) = match &t.name {
        DeviceName::Local { pv } => (
            pv.clone(),
            Rebuild::Ready {
                volume: UniqueVolumeName::shared(PluginName::LocalVolume, pv),
                selinux: None,
                csi: None,
            },
        ),
        DeviceName::Csi { handle_hash, .. } => {
            let spec = t.vol_data.as_ref().and_then(|v| v.spec_vol_id.clone());
            (
                spec.unwrap_or_else(|| handle_hash.clone()),
                csi_rebuild(t.vol_data.as_ref(), &t.path, None),
            )
        }
    };
    HostTarget {
        path: t.path.clone(),
        target: TargetRef::Device,
        plugin_name: t.plugin.as_str().into(),
        plugin: Some(t.plugin),
        spec_name,
        kind: TargetKind::Mount,
        observation: table.observation_at(&t.path),
        rebuild,
    }
}

/// One pod target, moved in: its path, pod, name and observed mount
/// become the host target's (the scan took them from the top mount at its
/// path in the same table).
fn pod_target(t: PodTarget) -> HostTarget {
    let mounted = matches!(t.observed, Observed::Mounted(_));
    let kind = match t.plugin {
        // a payload volume's wrapped emptyDir: a tmpfs or a dir
        PluginName::EmptyDir
        | PluginName::ConfigMap
        | PluginName::Secret
        | PluginName::DownwardApi
        | PluginName::Projected
            if mounted =>
        {
            TargetKind::Mount
        }
        PluginName::EmptyDir
        | PluginName::ConfigMap
        | PluginName::Secret
        | PluginName::DownwardApi
        | PluginName::Projected => TargetKind::Dir,
        PluginName::HostPath => TargetKind::None,
        PluginName::LocalVolume | PluginName::Csi => TargetKind::Mount,
    };
    // the name follows from the path: built only if the target is rebuilt
    let rebuild = match t.plugin {
        PluginName::EmptyDir
        | PluginName::HostPath
        | PluginName::LocalVolume
        | PluginName::ConfigMap
        | PluginName::Secret
        | PluginName::DownwardApi
        | PluginName::Projected => Rebuild::FromPath,
        PluginName::Csi => csi_rebuild(
            t.vol_data.as_ref(),
            &t.path,
            Some((&t.pod_uid, &t.spec_name)),
        ),
    };
    let observation = match t.observed {
        Observed::Mounted(seen) => HostObservation::Mounted(ObservedMount {
            identity: seen.identity,
            source: PathBuf::from(seen.source),
        }),
        Observed::DirPresent => HostObservation::DirPresent,
    };
    HostTarget {
        path: t.path,
        target: TargetRef::Pod(t.pod_uid),
        plugin_name: t.plugin.as_str().into(),
        plugin: Some(t.plugin),
        spec_name: t.spec_name,
        kind,
        observation,
        rebuild,
    }
}

/// A dir of a plugin volumed does not have: the merge lists it as failed
/// (never cleaned), whatever `rebuild` says.
fn unknown_target(table: &MountIndex<'_>, d: &UnknownPluginDir) -> HostTarget {
    HostTarget {
        path: d.path.clone(),
        target: TargetRef::Pod(d.pod_uid.clone()),
        plugin_name: d.plugin_dir.replace('~', "/").into(),
        plugin: None,
        spec_name: d.name.clone(),
        kind: if d.mounted {
            TargetKind::Mount
        } else {
            TargetKind::Dir
        },
        observation: if d.mounted {
            table.observation_at(&d.path)
        } else {
            HostObservation::DirPresent
        },
        rebuild: Rebuild::MissingMetadata {
            what: format!("no volumed plugin for {}", d.plugin_dir),
        },
    }
}

/// A CSI target's unique name `kubernetes.io/csi/<driver>^<handle>` and
/// label, from the `vol_data.json` beside it.
fn csi_rebuild(vol_data: Option<&VolData>, target: &Path, pod: Option<(&PodUid, &str)>) -> Rebuild {
    let missing = |what: &str| Rebuild::MissingMetadata {
        what: format!("{VOL_DATA_FILE} beside {}: {what}", target.display()),
    };
    let Some(v) = vol_data else {
        return missing("missing or unreadable");
    };
    let csi = match v.csi_params() {
        Ok(c) => c,
        Err(what) => return missing(what),
    };
    // an inline volume is named per pod, as the DSW names it; a wrong name
    // would tear down a running pod's volume to publish it again
    let volume = match (csi.lifecycle, pod) {
        (CsiLifecycle::Ephemeral, Some((uid, spec_name))) => {
            UniqueVolumeName::per_pod(PluginName::Csi, uid, spec_name)
        }
        _ => UniqueVolumeName::shared(
            PluginName::Csi,
            &format!("{}^{}", csi.driver, csi.volume_handle),
        ),
    };
    Rebuild::Ready {
        volume,
        selinux: v
            .selinux_mount_context
            .as_deref()
            .and_then(|c| SeLinuxContext::parse(c).ok()),
        csi: Some(std::sync::Arc::new(csi)),
    }
}

#[cfg(test)]
mod csi_rebuild_tests {
    use super::*;

    fn vol_data(mode: &str) -> VolData {
        serde_json::from_value(serde_json::json!({
            "driverName": "d.example.com",
            "volumeHandle": "csi-abc",
            "volumeLifecycleMode": mode,
        }))
        .unwrap()
    }

    fn name(r: Rebuild) -> String {
        match r {
            Rebuild::Ready { volume, .. } => volume.as_str().to_owned(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_rebuilt_csi_target_is_named_as_the_dsw_names_it() {
        let uid = PodUid::new("u1").unwrap();
        let path = Path::new("/r/pods/u1/volumes/kubernetes.io~csi/scratch/mount");
        let pod = Some((&uid, "scratch"));
        assert_eq!(
            name(csi_rebuild(Some(&vol_data("Ephemeral")), path, pod)),
            "kubernetes.io/csi/u1-scratch",
            "an inline volume is per pod"
        );
        assert_eq!(
            name(csi_rebuild(Some(&vol_data("Persistent")), path, pod)),
            "kubernetes.io/csi/d.example.com^csi-abc"
        );
        assert!(matches!(
            csi_rebuild(None, path, pod),
            Rebuild::MissingMetadata { .. }
        ));
    }
}
