//! The on-disk half of the host scan: the walk of `<root>/pods/*/volumes/*/*`
//! for volume directories that are not mount points, the walk of
//! `<root>/pods/*/volumeDevices/*/*` for raw block maps left as a symlink
//! alone, and the CSI `vol_data.json` files beside pod `mount` dirs and
//! globalmounts and of CSI block volumes.
//!
//! Every read goes through the [`Sys`] seam. Nothing here follows a
//! symlink: entries are classified by `lstat`, a symlink where the layout has a directory is a
//! reported [`ScanProblem::Symlink`], and `vol_data.json` is opened with
//! `O_NOFOLLOW` and read only if it is a small regular file. Every failure on
//! one path is a [`ScanProblem`]; the walk goes on.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::host::HostError;
use crate::host::mountinfo::MountTable;
use crate::host::scan::{
    BlockPodMap, DeviceName, HostView, Observed, PodTarget, ScanProblem, UnknownPluginDir, pod_uid,
    utf8,
};
use crate::host::sys::{Errno, FileKind, Sys};
use crate::model::{CsiLifecycle, CsiParams, Layout, PluginName, check_component};

/// Largest `vol_data.json` we read (the kubelet's are a few hundred bytes).
const MAX_VOL_DATA_BYTES: u64 = 64 << 10;

/// The CSI `vol_data.json` the kubelet writes: a JSON object of strings.
/// Keys we do not know are ignored; missing ones are `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct VolData {
    /// `specVolID`: the PV name (or inline volume name)
    #[serde(rename = "specVolID")]
    pub spec_vol_id: Option<String>,
    /// `volumeHandle`
    #[serde(rename = "volumeHandle")]
    pub volume_handle: Option<String>,
    /// `driverName`
    #[serde(rename = "driverName")]
    pub driver_name: Option<String>,
    /// `nodeName`
    #[serde(rename = "nodeName")]
    pub node_name: Option<String>,
    /// `attachmentID`
    #[serde(rename = "attachmentID")]
    pub attachment_id: Option<String>,
    /// `volumeLifecycleMode` (`Persistent` or `Ephemeral`)
    #[serde(rename = "volumeLifecycleMode")]
    pub volume_lifecycle_mode: Option<String>,
    /// `seLinuxMountContext`
    #[serde(rename = "seLinuxMountContext")]
    pub selinux_mount_context: Option<String>,
    /// every other key
    #[serde(flatten)]
    pub other: BTreeMap<String, String>,
}

impl VolData {
    /// Parses a `vol_data.json`'s bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// The CSI arguments this file gives — driver, handle, lifecycle,
    /// attachment id: what undoing the target needs without a journal, as
    /// the kubelet reads them for its TearDown and UnmountDevice — or what
    /// is missing.
    pub fn csi_params(&self) -> Result<CsiParams, &'static str> {
        let (Some(driver), Some(handle)) = (&self.driver_name, &self.volume_handle) else {
            return Err("no driverName or volumeHandle");
        };
        if check_component("CSI driver", driver).is_err() || handle.is_empty() {
            return Err("driverName or volumeHandle is not usable");
        }
        Ok(CsiParams {
            driver: driver.clone(),
            volume_handle: handle.clone(),
            lifecycle: match self.volume_lifecycle_mode.as_deref() {
                Some("Ephemeral") => CsiLifecycle::Ephemeral,
                _ => CsiLifecycle::Persistent,
            },
            access_modes: Vec::new(),
            read_only: false,
            publish_context: BTreeMap::new(),
            volume_context: BTreeMap::new(),
            stage_secret: None,
            publish_secret: None,
            mount_group: None,
            attachment_id: self.attachment_id.clone().filter(|a| !a.is_empty()),
        })
    }
}

/// The entries of `dir` that are directories (by `lstat`), sorted by name.
/// A missing `dir` is empty; symlinks and files are reported, not returned.
fn subdirs(sys: &dyn Sys, dir: &Path, problems: &mut Vec<ScanProblem>) -> Vec<(OsString, PathBuf)> {
    let entries = match sys.read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.errno() == Some(Errno::ENOENT) => return Vec::new(),
        Err(e) => {
            problems.push(
                HostError::ReadDir {
                    path: dir.to_owned(),
                    source: e.to_io(),
                }
                .into(),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (name, kind) in entries {
        let path = dir.join(&name);
        match kind {
            Ok(FileKind::Symlink) => problems.push(ScanProblem::Symlink { path }),
            Ok(FileKind::Dir) => out.push((name, path)),
            Ok(_) => problems.push(ScanProblem::NotADirectory { path }),
            Err(e) => problems.push(
                HostError::Stat {
                    path,
                    source: e.to_io(),
                }
                .into(),
            ),
        }
    }
    out.sort();
    out
}

/// What an `lstat` of `path` shows: `Some(true)` a directory, `Some(false)`
/// nothing there, `None` something else (reported).
fn dir_present(sys: &dyn Sys, path: &Path, problems: &mut Vec<ScanProblem>) -> Option<bool> {
    match sys.stat(path, false) {
        Ok(st) if st.kind == FileKind::Symlink => {
            problems.push(ScanProblem::Symlink {
                path: path.to_owned(),
            });
            None
        }
        Ok(st) if st.kind == FileKind::Dir => Some(true),
        Ok(_) => {
            problems.push(ScanProblem::NotADirectory {
                path: path.to_owned(),
            });
            None
        }
        Err(e) if e.errno() == Some(Errno::ENOENT) => Some(false),
        Err(e) => {
            problems.push(
                HostError::Stat {
                    path: path.to_owned(),
                    source: e.to_io(),
                }
                .into(),
            );
            None
        }
    }
}

/// Walks `<root>/pods/*/volumes/*/*` for directories that exist but are not
/// mount points in `table`. Returns (found dirs of known plugins, dirs of
/// unknown plugins that are not mount points); problems are appended.
pub fn walk_pod_dirs(
    sys: &dyn Sys,
    layout: &Layout,
    table: &MountTable,
    problems: &mut Vec<ScanProblem>,
) -> (Vec<PodTarget>, Vec<UnknownPluginDir>) {
    walk_pod_dirs_until(sys, layout, table, problems, &|| false).unwrap_or_default()
}

/// [`walk_pod_dirs`], asking `stop` before each pod's dir: `None` once it
/// says so (a daemon stopping need not wait for a walk of the whole node;
/// the walk only reads, so nothing is left half done).
pub fn walk_pod_dirs_until(
    sys: &dyn Sys,
    layout: &Layout,
    table: &MountTable,
    problems: &mut Vec<ScanProblem>,
    stop: &dyn Fn() -> bool,
) -> Option<(Vec<PodTarget>, Vec<UnknownPluginDir>)> {
    let (mut found, mut unknown) = (Vec::new(), Vec::new());
    for (uid_name, pod_dir) in subdirs(sys, &layout.pods_dir(), problems) {
        if stop() {
            return None;
        }
        let Some(uid_str) = utf8(&uid_name, &pod_dir, problems) else {
            continue;
        };
        let Some(uid) = pod_uid(uid_str, &pod_dir, problems) else {
            continue;
        };
        let volumes = layout.pod_volumes_dir(&uid);
        if dir_present(sys, &volumes, problems) != Some(true) {
            continue;
        }
        for (plugin_name, plugin_dir) in subdirs(sys, &volumes, problems) {
            let Some(plugin_str) = utf8(&plugin_name, &plugin_dir, problems) else {
                continue;
            };
            let plugin = PluginName::from_escaped(plugin_str);
            for (vol_name, vol_dir) in subdirs(sys, &plugin_dir, problems) {
                // `<name>.deleting~<seq>`: an emptyDir TearDown cut by a crash.
                // Not a volume: orphan cleanup finishes deleting it.
                if crate::host::remove::is_pending_deletion(&vol_name) {
                    continue;
                }
                let Some(plugin) = plugin else {
                    if !table.is_mount_point(&vol_dir) {
                        unknown.push(UnknownPluginDir {
                            pod_uid: uid.clone(),
                            plugin_dir: plugin_str.to_owned(),
                            name: vol_name.to_string_lossy().into_owned(),
                            mounted: false,
                            path: vol_dir,
                        });
                    }
                    continue;
                };
                let Some(spec_name) = utf8(&vol_name, &vol_dir, problems) else {
                    continue;
                };
                let mut target = vol_dir.clone();
                if plugin == PluginName::Csi {
                    let mount = layout.pod_target_path(&uid, plugin, spec_name);
                    match dir_present(sys, &mount, problems) {
                        Some(true) => target = mount,
                        Some(false) => {}
                        None => continue,
                    }
                }
                if table.is_mount_point(&target) {
                    continue; // a pod target, found by scan_mounts
                }
                found.push(PodTarget {
                    path: target,
                    pod_uid: uid.clone(),
                    plugin,
                    spec_name: spec_name.to_owned(),
                    observed: Observed::DirPresent,
                    vol_data: None,
                });
            }
        }
    }
    Some((found, unknown))
}

/// The raw block pod maps of local PVs and CSI volumes left as a symlink
/// alone, their bind gone (a reboot leaves a map so): each symlink
/// `pods/<uid>/volumeDevices/<kubernetes.io~local-volume|kubernetes.io~csi>/<pv>`
/// whose pod's file in the global map path is not a mount point (one that
/// is comes from the mount table). Not followed: [`read_block_links`]
/// reads where it points. `None` when `stop` said so.
///
/// [`read_block_links`]: crate::host::scan::read_block_links
pub fn walk_block_links_until(
    sys: &dyn Sys,
    layout: &Layout,
    table: &MountTable,
    problems: &mut Vec<ScanProblem>,
    stop: &dyn Fn() -> bool,
) -> Option<Vec<BlockPodMap>> {
    let mut found = Vec::new();
    // what is odd in `pods/` itself the volume walk reports, once
    let mut told = Vec::new();
    for (uid_name, pod_dir) in subdirs(sys, &layout.pods_dir(), &mut told) {
        if stop() {
            return None;
        }
        let Some(uid_str) = utf8(&uid_name, &pod_dir, &mut told) else {
            continue;
        };
        let Some(uid) = pod_uid(uid_str, &pod_dir, &mut told) else {
            continue;
        };
        for plugin in [PluginName::LocalVolume, PluginName::Csi] {
            block_links_of(sys, layout, table, &uid, plugin, problems, &mut found);
        }
    }
    Some(found)
}

/// [`walk_block_links_until`] in one pod's `volumeDevices/<plugin~escaped>`.
fn block_links_of(
    sys: &dyn Sys,
    layout: &Layout,
    table: &MountTable,
    uid: &crate::model::PodUid,
    plugin: PluginName,
    problems: &mut Vec<ScanProblem>,
    found: &mut Vec<BlockPodMap>,
) {
    let dir = layout.pod_device_maps_dir(uid, plugin);
    if dir_present(sys, &dir, problems) != Some(true) {
        return;
    }
    let entries = match sys.read_dir(&dir) {
        Ok(e) => e,
        Err(e) => {
            problems.push(
                HostError::ReadDir {
                    path: dir.clone(),
                    source: e.to_io(),
                }
                .into(),
            );
            return;
        }
    };
    for (name, kind) in entries {
        let path = dir.join(&name);
        if !matches!(kind, Ok(FileKind::Symlink)) {
            continue;
        }
        let Some(pv) = utf8(&name, &path, problems) else {
            continue;
        };
        if check_component("PV name", pv).is_err() {
            continue;
        }
        if table.is_mount_point(&BlockPodMap::map_file(layout, plugin, pv, uid)) {
            continue; // a whole map, found by scan_mounts
        }
        found.push(BlockPodMap::of(layout, plugin, pv, uid.clone(), false));
    }
}

/// Reads a CSI `vol_data.json`: `Ok(None)` when there is none. Never follows
/// a symlink and refuses anything but a small regular file.
pub fn read_vol_data(sys: &dyn Sys, path: &Path) -> Result<Option<VolData>, HostError> {
    let refuse = |why| HostError::RefuseVolData {
        path: path.to_owned(),
        why,
    };
    let bytes = match sys.read_file(path, MAX_VOL_DATA_BYTES, false) {
        Ok(b) => b,
        Err(e) => match e.errno() {
            Some(Errno::ENOENT) => return Ok(None),
            // the last component is a symlink
            Some(Errno::ELOOP) => return Err(refuse("it is a symlink")),
            Some(Errno::EINVAL) => return Err(refuse("not a regular file")),
            Some(Errno::EFBIG) => return Err(refuse("larger than 64 KiB")),
            _ => {
                return Err(HostError::ReadVolData {
                    path: path.to_owned(),
                    source: e.to_io(),
                });
            }
        },
    };
    VolData::parse(&bytes)
        .map(Some)
        .map_err(|source| HostError::ParseVolData {
            path: path.to_owned(),
            source,
        })
}

fn load(sys: &dyn Sys, path: &Path, problems: &mut Vec<ScanProblem>) -> Option<VolData> {
    read_vol_data(sys, path)
        .map_err(|e| problems.push(e.into()))
        .ok()
        .flatten()
}

/// Reads the `vol_data.json` of every CSI target in `view`, found under
/// `layout`.
pub fn attach_vol_data(sys: &dyn Sys, view: &mut HostView, layout: &Layout) {
    attach_vol_data_except(sys, view, layout, &|_| false);
}

/// [`attach_vol_data`] for the targets `known` does not claim: the file
/// only serves to rebuild a target the journal does not hold, and reading
/// one per target was most of a restart's merge phase.
pub fn attach_vol_data_except(
    sys: &dyn Sys,
    view: &mut HostView,
    layout: &Layout,
    known: &dyn Fn(&Path) -> bool,
) {
    let problems = &mut view.problems;
    for t in &mut view.device_targets {
        if known(&t.path) {
            continue;
        }
        if let DeviceName::Csi {
            driver,
            handle_hash,
        } = &t.name
        {
            t.vol_data = load(
                sys,
                &layout.csi_device_vol_data(driver, handle_hash),
                problems,
            );
        }
    }
    for t in view.pod_targets.iter_mut().chain(&mut view.found_dirs) {
        if t.plugin == PluginName::Csi && !known(&t.path) {
            t.vol_data = load(
                sys,
                &layout.csi_pod_vol_data(&t.pod_uid, &t.spec_name),
                problems,
            );
        }
    }
    // a CSI block volume's file, read once for maps of one volume that
    // come together (the mount table's: sorted by path)
    let mut last: Option<(String, Option<VolData>)> = None;
    for m in &mut view.block_maps {
        if m.plugin != PluginName::Csi || known(&m.link) {
            continue;
        }
        m.vol_data = match &last {
            Some((pv, v)) if *pv == m.pv => v.clone(),
            _ => {
                let v = load(sys, &layout.csi_block_vol_data(&m.pv), problems);
                last = Some((m.pv.clone(), v.clone()));
                v
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::host::sys::LinuxSys;

    #[test]
    fn missing_root_scans_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let mut problems = Vec::new();
        let layout = Layout::new(tmp.path().join("absent"));
        let (found, unknown) =
            walk_pod_dirs(&LinuxSys, &layout, &MountTable::default(), &mut problems);
        assert!(found.is_empty() && unknown.is_empty() && problems.is_empty());
        assert_eq!(
            read_vol_data(&LinuxSys, &tmp.path().join("none.json")).unwrap(),
            None
        );
        fs::write(tmp.path().join("n.json"), r#"{"volumeHandle": 5}"#).unwrap();
        let err = read_vol_data(&LinuxSys, &tmp.path().join("n.json")).unwrap_err();
        assert!(
            err.to_string().starts_with("parsing csi volume data"),
            "{err}"
        );
    }

    #[test]
    fn an_interrupted_emptydir_deletion_is_not_a_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        let ed = tmp.path().join("pods/u1/volumes/kubernetes.io~empty-dir");
        fs::create_dir_all(ed.join("disk.deleting~7/sub")).unwrap();
        fs::create_dir_all(ed.join("cache")).unwrap();
        let mut problems = Vec::new();
        let (found, unknown) =
            walk_pod_dirs(&LinuxSys, &layout, &MountTable::default(), &mut problems);
        let names: Vec<_> = found.iter().map(|t| t.spec_name.as_str()).collect();
        assert_eq!(
            names,
            ["cache"],
            "the .deleting~ dir is orphan cleanup's, not a volume"
        );
        assert!(unknown.is_empty() && problems.is_empty(), "{problems:?}");
    }

    /// The walk asks before each pod's dir: told to stop after the first
    /// pod it returns nothing; never told, it finds every pod's dir.
    #[test]
    fn a_walk_told_to_stop_ends_at_the_next_pod() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout::new(tmp.path());
        for uid in ["u1", "u2", "u3"] {
            let dir = tmp.path().join("pods").join(uid);
            fs::create_dir_all(dir.join("volumes/kubernetes.io~empty-dir/cache")).unwrap();
        }
        let table = MountTable::default();
        let asked = std::cell::Cell::new(0);
        let stop_after_one = || {
            asked.set(asked.get() + 1);
            asked.get() > 1
        };
        let mut problems = Vec::new();
        let walked =
            walk_pod_dirs_until(&LinuxSys, &layout, &table, &mut problems, &stop_after_one);
        assert!(walked.is_none(), "stopped");
        assert_eq!(asked.get(), 2, "asked before the first and the second pod");
        let (found, _) =
            walk_pod_dirs_until(&LinuxSys, &layout, &table, &mut problems, &|| false).unwrap();
        assert_eq!(found.len(), 3);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn oversized_and_non_regular_vol_data_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let big = tmp.path().join("big.json");
        fs::write(&big, vec![b' '; 70 << 10]).unwrap();
        let err = read_vol_data(&LinuxSys, &big).unwrap_err();
        assert!(
            matches!(
                err,
                HostError::RefuseVolData {
                    why: "larger than 64 KiB",
                    ..
                }
            ),
            "{err}"
        );
        let err = read_vol_data(&LinuxSys, tmp.path()).unwrap_err();
        assert!(
            matches!(
                err,
                HostError::RefuseVolData {
                    why: "not a regular file",
                    ..
                }
            ),
            "{err}"
        );
    }
}
