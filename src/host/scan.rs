//! The host side of reconstruction: what is mounted and what directories
//! exist in the kubelet layout, as one [`HostView`].
//!
//! Three parts, so the rules can be tested without a kernel:
//! - [`scan_mounts`] (pure): from one parsed [`MountTable`], the device
//!   targets under `<root>/plugins/kubernetes.io/` (local `local-volume/mounts/<pv>`,
//!   CSI `csi/<driver>/<handle hash>/globalmount`) and the pod targets under
//!   `<root>/pods/<uid>/volumes/<plugin~escaped>/<name>` (`/mount` for CSI).
//!   Device targets come from the mount table itself, never only through pod
//!   dirs (k8s #85476). Each mount point is read by [`Layout::parse_in`].
//!   Raw block pod maps come from the mount table too: each bind on
//!   `plugins/kubernetes.io~local-volume/volumeDevices/<pv>/<uid>` (a
//!   local PV's) or `plugins/kubernetes.io/csi/volumeDevices/<pv>/dev/<uid>`
//!   (a CSI volume's) is a pod's map ([`BlockPodMap`]; [`read_block_links`]
//!   then reads its symlink, [`attach_vol_data`] a CSI volume's
//!   `vol_data.json`); [`walk_block_links_until`] finds those left as a
//!   symlink alone.
//! - [`walk_pod_dirs`]: the directories `<root>/pods/*/volumes/*/*` that exist
//!   but are not mount points (disk emptyDirs, leftovers), never following a
//!   symlink; dirs of plugins volumed has no plugin for (secret, projected, …)
//!   are reported apart and never touched.
//! - [`attach_vol_data`]: CSI `vol_data.json` files beside pod `mount` dirs
//!   and globalmounts; a corrupt one is a reported problem, not a failure.
//!
//! [`scan_host`] runs all three over one read of the mount table. Paths in the
//! mount table are as the kernel resolved them, so the root dir is
//! canonicalised once (it is trusted configuration); nothing below it is.
//!
//! *Invariant:* a scan fails only when the mount table or the boot id cannot
//! be read; every other oddity is a [`ScanProblem`] and the rest still scans.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::host::HostError;
use crate::host::boot::{BootId, read_boot_id};
use crate::host::mountinfo::{LineError, MountStack, MountTable};
pub use crate::host::pod_dirs::{
    VolData, attach_vol_data, read_vol_data, walk_block_links_until, walk_pod_dirs,
    walk_pod_dirs_until,
};
use crate::host::sys::{Beneath, FileKind, Sys};
use crate::model::{
    Area, KubeletPath, Layout, LayoutError, ModelError, MountIdentity, PluginName, PodName, PodUid,
};

/// What the mount table shows at a target path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedMount {
    /// the identity of the visible (top) mount
    pub identity: MountIdentity,
    /// its source (the device, `tmpfs`, …)
    pub source: OsString,
    /// its mount id
    pub mount_id: u32,
    /// how many mounts are stacked at the path (1 normally)
    pub stacked: usize,
}

/// What the host shows for a pod target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// A mount point.
    Mounted(ObservedMount),
    /// A directory that is not a mount point.
    DirPresent,
}

/// The name part of a device target path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceName {
    /// `local-volume/mounts/<pv>`
    Local {
        /// the PV name
        pv: String,
    },
    /// `csi/<driver>/<hash>/globalmount`
    Csi {
        /// the driver name
        driver: String,
        /// the directory named by the SHA-256 of the volume handle
        handle_hash: String,
    },
}

/// A device (global) target found mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceTarget {
    /// the mount point
    pub path: PathBuf,
    /// the plugin that owns the layout
    pub plugin: PluginName,
    /// PV name or CSI driver and handle hash
    pub name: DeviceName,
    /// what is mounted there
    pub mount: ObservedMount,
    /// the CSI `vol_data.json` beside the globalmount, when read
    pub vol_data: Option<VolData>,
}

/// A pod target found mounted, or a pod volume directory found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodTarget {
    /// the target path (for CSI the `mount` dir; for a CSI dir without one, the volume dir)
    pub path: PathBuf,
    /// the pod
    pub pod_uid: PodUid,
    /// the plugin, from the escaped dir name
    pub plugin: PluginName,
    /// the spec name (pod volume name or PV name)
    pub spec_name: String,
    /// mounted or a bare directory
    pub observed: Observed,
    /// the CSI `vol_data.json` beside the `mount` dir, when read
    pub vol_data: Option<VolData>,
}

/// A pod's raw block map found by its bind in the mount table: the device
/// bound on the pod's file in a local PV's global map dir, or in a CSI
/// volume's global map path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPodMap {
    /// the pod's symlink (`pods/<uid>/volumeDevices/<plugin~escaped>/<pv>`):
    /// the pod target's path
    pub link: PathBuf,
    /// the device target's path: a local PV's global map dir, a CSI
    /// volume's staging dir
    pub map_dir: PathBuf,
    /// the pod
    pub pod_uid: PodUid,
    /// the plugin
    pub plugin: PluginName,
    /// the PV name (the spec name)
    pub pv: String,
    /// where the pod's symlink points, when there is one
    /// ([`read_block_links`])
    pub link_target: Option<PathBuf>,
    /// whether the device is bound on the pod's file (found in the mount
    /// table); a symlink alone is found by the pod-dir walk
    pub bound: bool,
    /// a CSI volume's `volumeDevices/<pv>/data/vol_data.json`, when read
    /// ([`attach_vol_data`]): its driver and handle name the volume
    pub vol_data: Option<VolData>,
}

impl BlockPodMap {
    /// The map of `pod` on the block volume `pv` of `plugin` (a local PV
    /// or CSI), its paths from `layout`; `bound` when the mount table shows
    /// the pod's file bound.
    pub fn of(layout: &Layout, plugin: PluginName, pv: &str, pod_uid: PodUid, bound: bool) -> Self {
        let map_dir = match plugin {
            PluginName::Csi => layout.csi_block_staging_path(pv),
            _ => layout.local_block_map_dir(pv),
        };
        BlockPodMap {
            link: layout.pod_device_map_path(&pod_uid, plugin, pv),
            map_dir,
            pod_uid,
            plugin,
            pv: pv.to_owned(),
            link_target: None,
            bound,
            vol_data: None,
        }
    }

    /// The file in the volume's global map path the pod's device is bound
    /// on.
    pub fn map_file(layout: &Layout, plugin: PluginName, pv: &str, pod: &PodUid) -> PathBuf {
        match plugin {
            PluginName::Csi => layout.csi_block_pod_map(pv, pod),
            _ => layout.local_block_pod_map(pv, pod),
        }
    }
}

/// A pod volume dir of a plugin volumed does not know (secret, projected, …):
/// reported, never cleaned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPluginDir {
    /// the volume dir
    pub path: PathBuf,
    /// the pod
    pub pod_uid: PodUid,
    /// the plugin dir name as on disk (`kubernetes.io~secret`), lossily decoded
    pub plugin_dir: String,
    /// the volume dir name, lossily decoded
    pub name: String,
    /// whether it is a mount point
    pub mounted: bool,
}

/// Something the scan saw and did not use; the scan went on.
#[derive(Debug, thiserror::Error)]
pub enum ScanProblem {
    /// a mountinfo line that was left out, or kept with a part ignored
    #[error(transparent)]
    MountInfoLine(LineError),
    /// a `pods/<uid>` name that is not a valid pod UID
    #[error("invalid pod uid at {path}")]
    InvalidPodUid {
        /// the path carrying it
        path: PathBuf,
        /// why it was refused
        #[source]
        source: ModelError,
    },
    /// a path component in the layout that is not UTF-8
    #[error("name is not utf-8 at {path}")]
    NonUtf8Name {
        /// the path
        path: PathBuf,
    },
    /// a symlink where the layout has a directory: not followed
    #[error("symlink not followed at {path}")]
    Symlink {
        /// the symlink
        path: PathBuf,
    },
    /// a file where the layout has a directory
    #[error("not a directory at {path}")]
    NotADirectory {
        /// the path
        path: PathBuf,
    },
    /// a mount in the kubelet layout that is not a target volumed knows
    #[error("unrecognised mount at {path}")]
    UnrecognisedMount {
        /// the mount point
        path: PathBuf,
    },
    /// an I/O or parse failure on one path
    #[error(transparent)]
    Host(#[from] HostError),
}

/// The mount-table part of a scan.
#[derive(Debug, Default)]
pub struct MountScan {
    /// device targets found mounted
    pub device_targets: Vec<DeviceTarget>,
    /// pod targets found mounted
    pub pod_targets: Vec<PodTarget>,
    /// pod volume mounts of unknown plugins
    pub unknown_plugin_dirs: Vec<UnknownPluginDir>,
    /// raw block pod maps found by their bind
    pub block_maps: Vec<BlockPodMap>,
    /// what was skipped and why
    pub problems: Vec<ScanProblem>,
}

/// Everything the host shows, for reconstruction.
#[derive(Debug)]
pub struct HostView {
    /// the current boot
    pub boot_id: BootId,
    /// device targets found mounted
    pub device_targets: Vec<DeviceTarget>,
    /// pod targets found mounted
    pub pod_targets: Vec<PodTarget>,
    /// pod volume dirs of known plugins that exist and are not mount points
    pub found_dirs: Vec<PodTarget>,
    /// pod volume dirs (mounted or not) of plugins volumed does not know
    pub unknown_plugin_dirs: Vec<UnknownPluginDir>,
    /// raw block pod maps found by their bind in the mount table
    pub block_maps: Vec<BlockPodMap>,
    /// what was skipped and why
    pub problems: Vec<ScanProblem>,
}

fn observe(stack: &MountStack<'_>) -> ObservedMount {
    let top = stack.top();
    ObservedMount {
        identity: top.identity(),
        source: top.source.clone(),
        mount_id: top.mount_id,
        stacked: stack.len(),
    }
}

pub(super) fn utf8<'a>(
    name: &'a OsStr,
    path: &Path,
    problems: &mut Vec<ScanProblem>,
) -> Option<&'a str> {
    let s = name.to_str();
    if s.is_none() {
        non_utf8(path, problems);
    }
    s
}

fn non_utf8(path: &Path, problems: &mut Vec<ScanProblem>) {
    problems.push(ScanProblem::NonUtf8Name {
        path: path.to_owned(),
    });
}

pub(super) fn pod_uid(name: &str, path: &Path, problems: &mut Vec<ScanProblem>) -> Option<PodUid> {
    PodUid::new(name)
        .map_err(|source| {
            problems.push(ScanProblem::InvalidPodUid {
                path: path.to_owned(),
                source,
            })
        })
        .ok()
}

/// The pure part: device and pod targets from one parsed mount table.
pub fn scan_mounts(table: &MountTable, layout: &Layout) -> MountScan {
    let mut scan = MountScan::default();
    for e in table.errors().iter().chain(table.warnings()) {
        scan.problems.push(ScanProblem::MountInfoLine(e.clone()));
    }
    for m in table.stacks_under(&layout.plugins_dir()) {
        device_mount(&m, layout, &mut scan);
    }
    let pods = layout.pods_dir();
    // at most one target per mount below `pods/`: one allocation, where
    // growing by doubling moved every target found so far each time
    scan.pod_targets.reserve(table.under(&pods).count());
    let mut last_uid = None;
    for m in table.stacks_under(&pods) {
        pod_mount(&m, layout, &mut last_uid, &mut scan);
    }
    for m in table.stacks_under(&layout.local_block_maps_dir()) {
        block_map_mount(&m, layout, &mut scan);
    }
    scan
}

/// A mount in the local PV's global map dirs: a pod's raw block map (the
/// device bound on the pod's file) when it is at `<pv>/<uid>`.
fn block_map_mount(m: &MountStack<'_>, layout: &Layout, scan: &mut MountScan) {
    let path = &m.top().mount_point;
    match layout.parse_in(Area::BlockMaps, path) {
        Ok(KubeletPath::LocalBlockPodMap { pv, pod }) => {
            let Some(pod_uid) = pod_uid(pod.as_str(), path, &mut scan.problems) else {
                return;
            };
            let map = BlockPodMap::of(layout, PluginName::LocalVolume, pv, pod_uid, true);
            scan.block_maps.push(map);
        }
        Err(LayoutError::NonUtf8) => non_utf8(path, &mut scan.problems),
        _ => scan
            .problems
            .push(ScanProblem::UnrecognisedMount { path: path.clone() }),
    }
}

/// Reads where each found raw block pod map's symlink points (one
/// `lstat` and `readlink` per map found; none is followed).
pub fn read_block_links(sys: &dyn Sys, maps: &mut [BlockPodMap]) {
    for m in maps {
        m.link_target = match sys.stat(&m.link, false) {
            Ok(st) if st.kind == FileKind::Symlink => Beneath::split(Path::new("/"), &m.link)
                .and_then(|at| sys.read_link_beneath(at).ok()),
            _ => None,
        };
    }
}

fn device_mount(m: &MountStack<'_>, layout: &Layout, scan: &mut MountScan) {
    let path = &m.top().mount_point;
    let (plugin, name) = match layout.parse_in(Area::Devices, path) {
        Ok(KubeletPath::LocalDevice { pv }) => (
            PluginName::LocalVolume,
            DeviceName::Local { pv: pv.to_owned() },
        ),
        Ok(KubeletPath::CsiGlobalMount { driver, hash }) => (
            PluginName::Csi,
            DeviceName::Csi {
                driver: driver.to_owned(),
                handle_hash: hash.to_owned(),
            },
        ),
        // ours on a pod's map file: that pod's map of a CSI block volume,
        // as the kubelet finds it by its `volumeDevices` entry
        Ok(KubeletPath::CsiBlockPodMap { spec_name, pod }) => {
            if let Some(uid) = pod_uid(pod.as_str(), path, &mut scan.problems) {
                let map = BlockPodMap::of(layout, PluginName::Csi, spec_name, uid, true);
                scan.block_maps.push(map);
            }
            return;
        }
        // the driver's bind on a publish file and a mount a driver keeps at
        // its staging dir: no target's path, the pod's map stands for them
        // (docs/merge-table.md)
        Ok(KubeletPath::CsiBlockStaging { .. } | KubeletPath::CsiBlockPublish { .. }) => return,
        Err(LayoutError::NonUtf8) => return non_utf8(path, &mut scan.problems),
        _ => {
            return scan
                .problems
                .push(ScanProblem::UnrecognisedMount { path: path.clone() });
        }
    };
    scan.device_targets.push(DeviceTarget {
        path: path.clone(),
        plugin,
        name,
        mount: observe(m),
        vol_data: None,
    });
}

/// `last_uid`: the UID of the previous pod target (the table is sorted, so
/// a pod's targets come together): not checked again, and shared.
fn pod_mount(
    m: &MountStack<'_>,
    layout: &Layout,
    last_uid: &mut Option<PodUid>,
    scan: &mut MountScan,
) {
    let path = &m.top().mount_point;
    // Only `<uid>/volumes/…` holds volume targets; subpaths and the rest are
    // someone else's business.
    let parsed = layout.parse_in_known(Area::PodVolumes, path, last_uid.as_ref());
    let mut uid = |pod: PodName<'_>| match last_uid {
        Some(u) if u.as_str() == pod.as_str() => u.clone(),
        _ => last_uid.insert(pod.to_uid()).clone(),
    };
    let (pod, plugin, spec_name) = match parsed {
        Ok(KubeletPath::PodVolume {
            pod,
            plugin,
            spec_name,
        }) if plugin != PluginName::Csi => (pod, plugin, spec_name),
        Ok(KubeletPath::CsiPodMount { pod, spec_name }) => (pod, PluginName::Csi, spec_name),
        Ok(KubeletPath::UnknownPodVolume {
            pod,
            plugin_dir,
            name,
        }) => {
            return scan.unknown_plugin_dirs.push(UnknownPluginDir {
                path: path.clone(),
                pod_uid: uid(pod),
                plugin_dir: plugin_dir.to_owned(),
                name: name.to_string_lossy().into_owned(),
                mounted: true,
            });
        }
        Err(LayoutError::Outside | LayoutError::Elsewhere) => return,
        Err(LayoutError::NonUtf8) => return non_utf8(path, &mut scan.problems),
        Err(LayoutError::InvalidPodUid(source)) => {
            return scan.problems.push(ScanProblem::InvalidPodUid {
                path: path.clone(),
                source,
            });
        }
        Ok(_) | Err(LayoutError::Unrecognised) => {
            return scan
                .problems
                .push(ScanProblem::UnrecognisedMount { path: path.clone() });
        }
    };
    scan.pod_targets.push(PodTarget {
        path: path.clone(),
        pod_uid: uid(pod),
        plugin,
        spec_name: spec_name.to_owned(),
        observed: Observed::Mounted(observe(m)),
        vol_data: None,
    });
}

/// A full scan over an already-read mount table: the pure mount part, the
/// pod-dir walk and the CSI volume data.
pub fn scan_with_table(
    sys: &dyn Sys,
    table: &MountTable,
    layout: &Layout,
    boot_id: BootId,
) -> HostView {
    let mut mounts = scan_mounts(table, layout);
    let (found_dirs, unknown) = walk_pod_dirs(sys, layout, table, &mut mounts.problems);
    let links = walk_block_links_until(sys, layout, table, &mut mounts.problems, &|| false);
    mounts.block_maps.extend(links.into_iter().flatten());
    mounts.unknown_plugin_dirs.extend(unknown);
    mounts
        .unknown_plugin_dirs
        .sort_by(|a, b| a.path.cmp(&b.path));
    read_block_links(sys, &mut mounts.block_maps);
    let mut view = HostView {
        boot_id,
        device_targets: mounts.device_targets,
        pod_targets: mounts.pod_targets,
        found_dirs,
        unknown_plugin_dirs: mounts.unknown_plugin_dirs,
        block_maps: mounts.block_maps,
        problems: mounts.problems,
    };
    attach_vol_data(sys, &mut view, layout);
    view
}

/// Scans the host: reads the boot id (from `boot_id_path`, default the
/// kernel's) and the mount table at `mountinfo` once, then everything else.
pub fn scan_host(
    sys: &dyn Sys,
    layout: &Layout,
    mountinfo: &Path,
    boot_id_path: Option<&Path>,
) -> Result<HostView, HostError> {
    let boot_id = read_boot_id(boot_id_path)?;
    let table = MountTable::read(mountinfo)?;
    let root = sys
        .canonicalize(layout.root())
        .unwrap_or_else(|_| layout.root().to_owned());
    Ok(scan_with_table(sys, &table, &Layout::new(root), boot_id))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::host::mountinfo::escape;
    use crate::host::sys::LinuxSys;
    use crate::model::DevId;
    use std::os::unix::ffi::OsStrExt;

    const P1: &str = "6f1b2c3d-0a4e-4b5f-9c8d-1e2f3a4b5c6d";
    const P2: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
    const HASH: &str = "3f8e0c1d9b7a65f4e3d2c1b0a9f8e7d6c5b4a3928170f6e5d4c3b2a190817263";
    const PVC: &str = "pvc-2b7c9d4e-1f3a-4c5b-8d6e-7f8091a2b3c4";

    fn fixture(name: &str) -> MountTable {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/mountinfo")
            .join(name);
        MountTable::read(&path).unwrap()
    }

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }

    fn mounted(t: &PodTarget) -> &ObservedMount {
        match &t.observed {
            Observed::Mounted(m) => m,
            Observed::DirPresent => panic!("{} is not mounted", t.path.display()),
        }
    }

    #[test]
    fn kubelet_fixture_targets() {
        let layout = Layout::new("/var/lib/kubelet");
        let scan = scan_mounts(&fixture("kubelet-node.txt"), &layout);

        let dev: Vec<(&DeviceName, &Path)> = scan
            .device_targets
            .iter()
            .map(|t| (&t.name, t.path.as_path()))
            .collect();
        let csi_name = DeviceName::Csi {
            driver: "pd.csi.example.com".into(),
            handle_hash: HASH.into(),
        };
        let local_name = DeviceName::Local {
            pv: "pv-local-1".into(),
        };
        let csi_path = layout.csi_device_path("pd.csi.example.com", HASH);
        let local_path = layout.local_device_path("pv-local-1");
        assert_eq!(
            dev,
            vec![
                (&csi_name, csi_path.as_path()),
                (&local_name, local_path.as_path())
            ]
        );
        let local = &scan.device_targets[1];
        assert_eq!(local.plugin, PluginName::LocalVolume);
        assert_eq!(local.mount.identity.dev, DevId { major: 7, minor: 0 });
        assert_eq!(local.mount.identity.fs_type, "ext4");
        assert_eq!(local.mount.source, "/dev/loop0");
        assert_eq!(local.mount.stacked, 1);
        assert_eq!(scan.device_targets[0].mount.source, "/dev/sdb");

        let pods: Vec<(String, PluginName, &str)> = scan
            .pod_targets
            .iter()
            .map(|t| (t.pod_uid.to_string(), t.plugin, t.spec_name.as_str()))
            .collect();
        assert_eq!(
            pods,
            vec![
                (P1.into(), PluginName::EmptyDir, "cache"),
                (P1.into(), PluginName::LocalVolume, "pv-local-1"),
                // the service account token's projected volume: a tmpfs
                (P1.into(), PluginName::Projected, "kube-api-access-x7k2p"),
                (P2.into(), PluginName::Csi, PVC),
                (P2.into(), PluginName::LocalVolume, "pv-local-1"),
            ]
        );
        let t: Vec<_> = scan
            .pod_targets
            .iter()
            .filter(|t| t.plugin != PluginName::Projected)
            .collect();
        assert_eq!(
            t[2].path,
            layout.pod_target_path(&uid(P2), PluginName::Csi, PVC)
        );
        assert_eq!(mounted(t[0]).identity.fs_type, "tmpfs");
        // both pod binds of the local PV are the device's filesystem, root /
        for bind in [t[1], t[3]] {
            let m = mounted(bind);
            assert_eq!(m.identity.dev, local.mount.identity.dev);
            assert_eq!(&*m.identity.root, Path::new("/"));
        }
        assert!(!mounted(t[1]).identity.read_only);
        assert!(mounted(t[3]).identity.read_only);
        assert_eq!(
            mounted(t[2]).identity.dev,
            scan.device_targets[0].mount.identity.dev
        );

        // (a projected volume has a plugin now: it is a pod target above)
        assert!(scan.unknown_plugin_dirs.is_empty());

        // the bad uid is reported; the subpath and the containerd rootfs are not targets
        assert_eq!(scan.problems.len(), 1, "{:?}", scan.problems);
        assert!(matches!(
            &scan.problems[0],
            ScanProblem::InvalidPodUid { path, .. } if path.ends_with("pods/bad uid/volumes/kubernetes.io~empty-dir/x")
        ));
    }

    #[test]
    fn selinux_fixture_labels_reach_the_targets() {
        let layout = Layout::new("/var/lib/kubelet");
        let scan = scan_mounts(&fixture("selinux-host.txt"), &layout);
        assert_eq!(scan.device_targets.len(), 1);
        let label = |m: &ObservedMount| m.identity.selinux.as_ref().map(|c| c.to_string());
        let dev = label(&scan.device_targets[0].mount);
        assert_eq!(
            dev.as_deref(),
            Some("system_u:object_r:container_file_t:s0:c5,c10")
        );
        let csi = scan
            .pod_targets
            .iter()
            .find(|t| t.plugin == PluginName::Csi)
            .unwrap();
        assert_eq!(label(mounted(csi)), dev);
        assert_eq!(scan.pod_targets.len(), 3);
    }

    #[test]
    fn stacked_and_odd_mounts() {
        let k = "/var/lib/kubelet";
        let table = MountTable::parse(
            format!(
                "1 0 0:1 / / rw - ext4 /dev/a rw\n\
                 10 1 0:40 / {k}/pods/u1/volumes/kubernetes.io~empty-dir/c rw - tmpfs lower rw\n\
                 11 10 0:41 / {k}/pods/u1/volumes/kubernetes.io~empty-dir/c rw - tmpfs upper rw\n\
                 12 1 0:42 / {k}/pods/u1/volumes/kubernetes.io~csi/pv1 rw - tmpfs t rw\n\
                 13 1 0:43 / {k}/pods/u1/volumes/kubernetes.io~empty-dir/c/deeper rw - tmpfs t rw\n\
                 14 1 0:44 / {k}/plugins/kubernetes.io/csi/d/h rw - tmpfs t rw\n\
                 15 1 0:45 / {k}/pods/u1/volumes rw - tmpfs t rw\n\
                 16 1 0:46 / {k}/pods/u1/etc-hosts rw - tmpfs t rw\n\
                 bad line\n"
            )
            .as_bytes(),
        );
        let scan = scan_mounts(&table, &Layout::new(k));
        assert_eq!(scan.pod_targets.len(), 1);
        let m = mounted(&scan.pod_targets[0]);
        assert_eq!((m.mount_id, m.stacked), (11, 2));
        assert_eq!(m.source, "upper");
        let odd: Vec<String> = scan
            .problems
            .iter()
            .map(|p| match p {
                ScanProblem::UnrecognisedMount { path } => {
                    path.strip_prefix(k).unwrap().display().to_string()
                }
                ScanProblem::MountInfoLine(e) => format!("line {}", e.line),
                other => panic!("{other}"),
            })
            .collect();
        assert_eq!(
            odd,
            vec![
                "line 9",
                "plugins/kubernetes.io/csi/d/h",
                "pods/u1/volumes",
                "pods/u1/volumes/kubernetes.io~csi/pv1",
                "pods/u1/volumes/kubernetes.io~empty-dir/c/deeper",
            ]
        );
    }

    /// A bind on a pod's file in a local PV's global map dir is that pod's
    /// raw block map (its symlink and map dir named from the layout);
    /// anything else mounted in the global map dirs is reported.
    #[test]
    fn raw_block_pod_maps_come_from_the_mount_table() {
        let k = "/var/lib/kubelet";
        let maps = format!("{k}/plugins/kubernetes.io~local-volume/volumeDevices");
        let table = MountTable::parse(
            format!(
                "1 0 0:1 / / rw - ext4 /dev/a rw\n\
                 20 1 0:5 /loop7 {maps}/pv-raw/{P1} rw - devtmpfs udev rw\n\
                 21 1 0:5 /loop7 {maps}/pv-raw/{P2} rw - devtmpfs udev rw\n\
                 22 1 0:46 / {maps}/pv-raw rw - tmpfs t rw\n"
            )
            .as_bytes(),
        );
        let layout = Layout::new(k);
        let scan = scan_mounts(&table, &layout);
        let found: Vec<(&str, &Path, &Path, &str)> = scan
            .block_maps
            .iter()
            .map(|m| {
                (
                    m.pod_uid.as_str(),
                    m.link.as_path(),
                    m.map_dir.as_path(),
                    m.pv.as_str(),
                )
            })
            .collect();
        let link = |p: &str| layout.pod_device_map_path(&uid(p), PluginName::LocalVolume, "pv-raw");
        let (l1, l2, dir) = (link(P1), link(P2), layout.local_block_map_dir("pv-raw"));
        assert_eq!(
            found,
            [
                (P1, l1.as_path(), dir.as_path(), "pv-raw"),
                (P2, l2.as_path(), dir.as_path(), "pv-raw"),
            ]
        );
        assert!(scan.block_maps.iter().all(|m| m.link_target.is_none()));
        assert!(
            matches!(&scan.problems[..], [ScanProblem::UnrecognisedMount { path }] if *path == dir),
            "{:?}",
            scan.problems
        );
    }

    /// Our bind on a pod's file in a CSI block volume's global map path is
    /// that pod's map (its symlink named from the layout, the device target
    /// its staging dir); the driver's bind on the publish file and a mount
    /// at the staging dir are no map, and no problem either.
    #[test]
    fn csi_block_pod_maps_come_from_the_mount_table() {
        let k = "/var/lib/kubelet";
        let csi = format!("{k}/plugins/kubernetes.io/csi/volumeDevices");
        let table = MountTable::parse(
            format!(
                "1 0 0:1 / / rw - ext4 /dev/a rw\n\
                 20 1 0:5 /loop7 {csi}/publish/pv-c/{P1} rw - devtmpfs udev rw\n\
                 21 1 0:5 /loop7 {csi}/pv-c/dev/{P1} rw - devtmpfs udev rw\n\
                 22 1 0:5 /loop7 {csi}/pv-c/dev/{P2} rw - devtmpfs udev rw\n\
                 23 1 0:46 / {csi}/staging/pv-c rw - tmpfs t rw\n"
            )
            .as_bytes(),
        );
        let layout = Layout::new(k);
        let scan = scan_mounts(&table, &layout);
        let found: Vec<(&str, &Path, &Path, PluginName, bool)> = scan
            .block_maps
            .iter()
            .map(|m| {
                (
                    m.pod_uid.as_str(),
                    m.link.as_path(),
                    m.map_dir.as_path(),
                    m.plugin,
                    m.bound,
                )
            })
            .collect();
        let link = |p: &str| layout.pod_device_map_path(&uid(p), PluginName::Csi, "pv-c");
        let (l1, l2) = (link(P1), link(P2));
        let staging = layout.csi_block_staging_path("pv-c");
        assert_eq!(
            found,
            [
                (P1, l1.as_path(), staging.as_path(), PluginName::Csi, true),
                (P2, l2.as_path(), staging.as_path(), PluginName::Csi, true),
            ]
        );
        assert!(scan.device_targets.is_empty(), "{:?}", scan.device_targets);
        assert!(scan.problems.is_empty(), "{:?}", scan.problems);
    }

    fn mkdirs(root: &Path, rels: &[&str]) {
        for r in rels {
            fs::create_dir_all(root.join(r)).unwrap();
        }
    }

    /// A mountinfo line mounting a tmpfs at `path`.
    fn tmpfs_line(id: u32, path: &Path) -> String {
        let esc = escape(path.as_os_str().as_bytes());
        format!(
            "{id} 1 0:{id} / {} rw - tmpfs tmpfs rw\n",
            String::from_utf8(esc).unwrap()
        )
    }

    #[test]
    fn dir_walk_and_vol_data_on_a_real_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap().join("kubelet");
        let outside = tmp.path().join("outside");
        mkdirs(
            &root,
            &[
                "pods/u1/volumes/kubernetes.io~empty-dir/cache",
                "pods/u1/volumes/kubernetes.io~empty-dir/mem",
                "pods/u1/volumes/kubernetes.io~nfs/tok",
                "pods/u1/volumes/kubernetes.io~csi/pv1/mount",
                "pods/u1/volumes/kubernetes.io~csi/pv2",
                "pods/u1/volumes/kubernetes.io~csi/pv3/mount",
                "pods/bad uid/volumes/kubernetes.io~empty-dir/x",
                "pods/u3",
                "plugins/kubernetes.io/csi/d.example.com/abc/globalmount",
            ],
        );
        mkdirs(
            &outside,
            &["volumes/kubernetes.io~empty-dir/stolen", "target"],
        );
        let ed = root.join("pods/u1/volumes/kubernetes.io~empty-dir");
        std::os::unix::fs::symlink(outside.join("target"), ed.join("link")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("pods/u2")).unwrap();
        fs::write(ed.join("file.txt"), "x").unwrap();
        let csi = root.join("pods/u1/volumes/kubernetes.io~csi");
        fs::write(
            csi.join("pv1/vol_data.json"),
            r#"{"specVolID":"pv1","volumeHandle":"h-1","driverName":"d.example.com","attachmentID":"csi-77","volumeLifecycleMode":"Persistent","seLinuxMountContext":"system_u:object_r:container_file_t:s0:c1,c2","extra":"kept"}"#,
        )
        .unwrap();
        fs::write(csi.join("pv2/vol_data.json"), "{not json").unwrap();
        fs::write(outside.join("vd.json"), "{}").unwrap();
        std::os::unix::fs::symlink(outside.join("vd.json"), csi.join("pv3/vol_data.json")).unwrap();
        let gm = root.join("plugins/kubernetes.io/csi/d.example.com/abc");
        fs::write(
            gm.join("vol_data.json"),
            r#"{"driverName":"d.example.com","volumeHandle":"h-1"}"#,
        )
        .unwrap();

        let mut mi = String::from("1 0 0:1 / / rw - ext4 /dev/a rw\n");
        mi += &tmpfs_line(20, &ed.join("mem"));
        mi += &tmpfs_line(21, &gm.join("globalmount"));
        mi += &tmpfs_line(22, &csi.join("pv3/mount"));
        let mi_path = tmp.path().join("mountinfo");
        fs::write(&mi_path, mi).unwrap();
        let boot = tmp.path().join("boot_id");
        fs::write(&boot, "b00t\n").unwrap();

        let view = scan_host(&LinuxSys, &Layout::new(&root), &mi_path, Some(&boot)).unwrap();
        assert_eq!(view.boot_id.as_str(), "b00t");

        let found: Vec<(&str, &Path)> = view
            .found_dirs
            .iter()
            .map(|t| (t.spec_name.as_str(), t.path.strip_prefix(&root).unwrap()))
            .collect();
        assert_eq!(
            found,
            vec![
                (
                    "pv1",
                    Path::new("pods/u1/volumes/kubernetes.io~csi/pv1/mount")
                ),
                ("pv2", Path::new("pods/u1/volumes/kubernetes.io~csi/pv2")),
                (
                    "cache",
                    Path::new("pods/u1/volumes/kubernetes.io~empty-dir/cache")
                ),
            ]
        );
        assert!(
            view.found_dirs
                .iter()
                .all(|t| t.observed == Observed::DirPresent)
        );
        let vd = view.found_dirs[0].vol_data.as_ref().unwrap();
        assert_eq!(vd.volume_handle.as_deref(), Some("h-1"));
        assert_eq!(vd.attachment_id.as_deref(), Some("csi-77"));
        assert_eq!(
            vd.selinux_mount_context.as_deref(),
            Some("system_u:object_r:container_file_t:s0:c1,c2")
        );
        assert_eq!(vd.other.get("extra").map(String::as_str), Some("kept"));
        assert_eq!(
            view.found_dirs[1].vol_data, None,
            "corrupt: reported instead"
        );

        let pods: Vec<&str> = view
            .pod_targets
            .iter()
            .map(|t| t.spec_name.as_str())
            .collect();
        assert_eq!(pods, vec!["pv3", "mem"]);
        assert_eq!(view.device_targets.len(), 1);
        assert_eq!(
            view.device_targets[0]
                .vol_data
                .as_ref()
                .unwrap()
                .driver_name
                .as_deref(),
            Some("d.example.com")
        );

        assert_eq!(view.unknown_plugin_dirs.len(), 1);
        let u = &view.unknown_plugin_dirs[0];
        assert_eq!(
            (u.plugin_dir.as_str(), u.name.as_str(), u.mounted),
            ("kubernetes.io~nfs", "tok", false)
        );

        let mut problems: Vec<String> = view
            .problems
            .iter()
            .map(|p| {
                let kind = match p {
                    ScanProblem::Symlink { .. } => "symlink",
                    ScanProblem::NotADirectory { .. } => "not-dir",
                    ScanProblem::InvalidPodUid { .. } => "bad-uid",
                    ScanProblem::Host(HostError::ParseVolData { .. }) => "corrupt-vol-data",
                    ScanProblem::Host(HostError::RefuseVolData { .. }) => "refused-vol-data",
                    other => panic!("unexpected {other}"),
                };
                let s = p.to_string();
                let path = s
                    .rsplit(&*root.to_string_lossy())
                    .next()
                    .unwrap()
                    .to_owned();
                format!("{kind} {path}")
            })
            .collect();
        problems.sort();
        let want = [
            "bad-uid /pods/bad uid",
            "corrupt-vol-data /pods/u1/volumes/kubernetes.io~csi/pv2/vol_data.json",
            "not-dir /pods/u1/volumes/kubernetes.io~empty-dir/file.txt",
            "refused-vol-data /pods/u1/volumes/kubernetes.io~csi/pv3/vol_data.json: it is a symlink",
            "symlink /pods/u1/volumes/kubernetes.io~empty-dir/link",
            "symlink /pods/u2",
        ];
        assert_eq!(problems, want);
        // nothing outside the root was read through the symlinks
        assert!(view.found_dirs.iter().all(|t| t.path.starts_with(&root)));
    }
}
