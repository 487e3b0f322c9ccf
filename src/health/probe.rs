//! The native check's I/O edge, all through [`Sys`]: what each mount
//! target of a volume shows, its filesystem's usage and flags, ext4's
//! error count, whether the backing device or hostPath is still there.
//!
//! A pass must stay near the cost of one `statfs` per volume, so the mount
//! table is not read per pass: when the monitor first sees a mount target
//! it reads the table once for all such targets and remembers the mount
//! there (its id, device, and for ext4 the `errors_count` file with its
//! value then). Each pass after that is one `statfs` per volume, plus one
//! `statx` per mount target (its mount id and mount-root attribute,
//! against the remembered mount) when the mount table changed since the
//! last pass or a full round is due ([`TableGate`]). A target the table did
//! not show is looked up again on the next pass, so a mount put back is
//! seen.

use fxhash::{FxHashMap, FxHashSet};
use std::path::{Path, PathBuf};

use super::decide::{DirUsage, Finding, Gone, MountSeen, Observation, findings};
use super::{Subject, Usage};
use crate::host::mountinfo::MountTable;
use crate::host::sys::{Errno, Sys};
use crate::model::{DevId, SharedPath, StorageMedium, TargetKind, VolumeSpec};

/// sysfs attributes are one page at most.
const SYSFS_LIMIT: u64 = 4096;

/// The mount volumed made at a target, as the table showed it first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Baseline {
    mnt_id: u64,
    dev: DevId,
    /// ext4's `errors_count` file and its value when first read (boxed:
    /// only an ext4 volume's data mount has one)
    errors: Option<Box<(PathBuf, u64)>>,
}

/// What is remembered per mount target path where the table showed a
/// mount (keyed by the subject's shared handle: no copy of the path); a
/// target without one is looked up again each pass.
pub(super) type Baselines = FxHashMap<SharedPath, Baseline>;

/// The mount targets of `s`: the device target, then the pods' mounts.
fn mount_targets(s: &Subject) -> impl Iterator<Item = &SharedPath> {
    s.device.iter().chain(
        s.pods
            .iter()
            .filter(|p| p.kind == TargetKind::Mount)
            .map(|p| &p.path),
    )
}

/// Where the volume's data is measured: its device mount, else its first
/// pod target on disk, else a hostPath's path. A raw block map has none:
/// its pod path is a link to the device node, whose `statfs` would tell
/// of devtmpfs, not of the volume.
fn data_path(s: &Subject) -> Option<&Path> {
    if let Some(d) = &s.device {
        return Some(d);
    }
    let on_disk = |k: TargetKind| matches!(k, TargetKind::Mount | TargetKind::Dir);
    if let Some(p) = s.pods.iter().find(|p| on_disk(p.kind)) {
        return Some(&p.path);
    }
    match s.spec.as_deref() {
        Some(VolumeSpec::HostPath { path, .. }) => Some(path.as_ref()),
        _ => None,
    }
}

/// Remembers the mount at every target of `subjects` without one (new,
/// or showing none when last looked): one table read when there is any,
/// none otherwise. Forgets targets no subject has.
pub(super) fn learn(sys: &dyn Sys, subjects: &[&Subject], known: &mut Baselines) {
    let mut wanted: Vec<(&SharedPath, bool)> = Vec::new();
    for s in subjects {
        let data = data_path(s);
        for t in mount_targets(s) {
            if !known.contains_key(t) {
                wanted.push((t, Some(&**t) == data));
            }
        }
    }
    if wanted.is_empty() {
        return;
    }
    let table = match sys.read_mountinfo() {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("health: reading the mount table: {e}");
            return;
        }
    };
    for (path, is_data) in wanted {
        if let Some(b) = baseline(sys, &table, path, is_data) {
            known.insert(path.clone(), b);
        }
    }
}

/// Forgets the targets none of `subjects` has (kept O(targets) per pass).
pub(super) fn prune(subjects: &[&Subject], known: &mut Baselines) {
    if known.is_empty() {
        return;
    }
    let live: FxHashSet<&Path> = subjects
        .iter()
        .flat_map(|s| mount_targets(s))
        .map(|p| &**p)
        .collect();
    known.retain(|p, _| live.contains(&**p));
}

fn baseline(sys: &dyn Sys, table: &MountTable, path: &Path, is_data: bool) -> Option<Baseline> {
    let m = table.top_at(path)?;
    let errors = (is_data && m.fs_type == "ext4" && m.dev.major != 0)
        .then(|| ext4_errors_file(sys, m.dev))
        .flatten()
        .and_then(|f| {
            let n = read_count(sys, &f)?;
            Some(Box::new((f, n)))
        });
    Some(Baseline {
        mnt_id: u64::from(m.mount_id),
        dev: m.dev,
        errors,
    })
}

/// `/sys/fs/ext4/<name>/errors_count`, `<name>` the block device's kernel
/// name (`loop3`, `dm-0`, `sda1`: the `DEVNAME` of its `uevent`).
fn ext4_errors_file(sys: &dyn Sys, dev: DevId) -> Option<PathBuf> {
    let uevent = PathBuf::from(format!("/sys/dev/block/{}:{}/uevent", dev.major, dev.minor));
    let bytes = sys.read_file(&uevent, SYSFS_LIMIT, true).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    let name = text.lines().find_map(|l| l.strip_prefix("DEVNAME="))?;
    // a kernel name is one path component
    (!name.is_empty() && !name.contains('/') && name != "..")
        .then(|| Path::new("/sys/fs/ext4").join(name).join("errors_count"))
}

fn read_count(sys: &dyn Sys, file: &Path) -> Option<u64> {
    let bytes = sys.read_file(file, SYSFS_LIMIT, true).ok()?;
    std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
}

/// Every this many passes the mounts are looked at one by one even when
/// the table did not change: a directory renamed above a mount point moves
/// it without any change of the table.
const FULL_ROUND_EVERY: u32 = 10;

/// Whether a pass may trust the remembered mounts: none of the mounts
/// volumed made can vanish or be covered without a change of the mount
/// table, so while the table is unchanged a pass skips the `statx` per
/// mount target and costs about one `statfs` per volume.
#[derive(Default)]
pub(super) struct TableGate {
    /// whether a pass ran (the first one made the watch)
    started: bool,
    /// the host's watch of its mount table, if it has one
    watch: Option<Box<dyn crate::host::sys::MountTableWatch>>,
    /// passes since the last full round
    since_full: u32,
}

impl TableGate {
    /// Whether this pass may skip the per-target `statx`: the table is
    /// unchanged since the last pass and a full round is not due.
    pub(super) fn unchanged(&mut self, sys: &dyn Sys) -> bool {
        let first = !self.started;
        if first {
            self.started = true;
            self.watch = sys.watch_mount_table();
        }
        let changed = self.watch.as_mut().is_none_or(|w| w.changed());
        if first || changed || self.since_full + 1 >= FULL_ROUND_EVERY {
            self.since_full = 0;
            return false;
        }
        self.since_full += 1;
        true
    }
}

/// What one `statx` of `path` says against `b`; none is made when the
/// mount table is `unchanged` since `b` was seen there.
fn seen(
    sys: &dyn Sys,
    path: &Path,
    b: Option<&Baseline>,
    unchanged: bool,
) -> Result<MountSeen, String> {
    let Some(b) = b else {
        return Ok(MountSeen::Vanished);
    };
    if unchanged {
        return Ok(MountSeen::Same);
    }
    match sys.mount_probe(path) {
        Ok(p) if p.mnt_id == b.mnt_id && p.mnt_id != 0 => Ok(MountSeen::Same),
        Ok(p) => match p.mount_root {
            Some(true) => Ok(MountSeen::Replaced),
            Some(false) => Ok(MountSeen::Vanished),
            // no attribute (before 5.8, no mount id either): the device says
            None if p.dev == b.dev => Ok(MountSeen::Same),
            None => Ok(MountSeen::Vanished),
        },
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(MountSeen::Vanished),
        Err(e) => Err(e.to_string()),
    }
}

/// Checks `s` natively: its findings and, when its data could be
/// measured on the mount volumed made, its usage. With the mount table
/// `unchanged` since the last pass, each mount target is taken to hold the
/// mount remembered there (no `statx`).
pub(super) fn check(
    sys: &dyn Sys,
    s: &Subject,
    known: &Baselines,
    unchanged: bool,
) -> (Vec<Finding>, Option<Usage>) {
    let mut o = Observation::default();
    let data = data_path(s);
    let mut data_intact = true;
    let mut data_baseline = None;
    for t in mount_targets(s) {
        let t: &Path = t;
        let b = known.get(t);
        match seen(sys, t, b, unchanged) {
            Ok(m) => {
                if Some(t) == data {
                    data_intact = m == MountSeen::Same;
                    data_baseline = b;
                }
                // the mounts as volumed made them say nothing (and a
                // string per mount per pass was a tenth of a quiet pass)
                if m != MountSeen::Same {
                    o.mounts.push((t.display().to_string(), m));
                }
            }
            Err(e) => {
                data_intact &= Some(t) != data;
                o.failed = Some(e);
            }
        }
    }
    match s.spec.as_deref() {
        Some(VolumeSpec::Local {
            path,
            is_block: true,
            mount_options,
            ..
        }) => {
            o.expect_read_only = mount_options.iter().any(|m| m == "ro");
            if absent(sys, path) {
                o.gone = Some(Gone::Device(path.display().to_string()));
            }
        }
        Some(VolumeSpec::Local { mount_options, .. }) => {
            o.expect_read_only = mount_options.iter().any(|m| m == "ro");
        }
        Some(VolumeSpec::HostPath { path, .. }) if absent(sys, path) => {
            o.gone = Some(Gone::Path(path.display().to_string()));
            data_intact = false;
        }
        Some(VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit,
        }) => o.size_limit = *size_limit,
        Some(VolumeSpec::EmptyDir {
            size_limit: Some(limit),
            ..
        }) => {
            o.size_limit = Some(*limit);
            if let Some(dir) = data.filter(|_| data_intact) {
                match walk_usage(sys, dir, WALK_ENTRIES) {
                    Ok(w) => o.walked = Some(w),
                    Err(e) => o.failed = Some(e.to_string()),
                }
            }
        }
        _ => {}
    }
    // a pod target its pod mounts read-only (a claim's `readOnly`, a CSI
    // `readOnly`) is meant to be so
    if s.device.is_none()
        && let Some(p) = s.pods.iter().find(|p| Some(&*p.path) == data)
    {
        o.expect_read_only |= p.read_only;
    }
    if let Some(e) = data_baseline.and_then(|b| b.errors.as_deref())
        && data_intact
    {
        let (file, first) = e;
        o.fs_errors = read_count(sys, file).map(|now| (*first, now));
    }
    if let Some(path) = data.filter(|_| data_intact) {
        match sys.statfs(path) {
            Ok(u) => o.usage = Some(u),
            Err(e) => o.failed = Some(e.to_string()),
        }
    }
    let usage = o.usage.map(Usage::from);
    (findings(&o), usage)
}

/// The most entries one walk of a disk emptyDir counts: a pass stays
/// bounded however many files a pod makes (each costs a `statx`).
pub(super) const WALK_ENTRIES: usize = 65_536;

/// The disk space of everything below `dir`, as `du` counts it: every
/// entry's blocks, directories included; no symlink followed, no mount
/// below it entered (a mount is another volume's, or someone else's), at
/// most `max` entries. Each directory is opened beneath `dir`, so one
/// swapped for a symlink mid-walk fails the walk instead of leading out.
pub(super) fn walk_usage(
    sys: &dyn Sys,
    dir: &Path,
    max: usize,
) -> Result<DirUsage, crate::host::sys::SysError> {
    let mut out = DirUsage {
        bytes: 0,
        complete: true,
    };
    let mut seen = 0usize;
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        for e in sys.read_dir_beneath(dir, &rel)? {
            if seen == max {
                out.complete = false;
                return Ok(out);
            }
            seen += 1;
            if e.mount_root {
                continue;
            }
            out.bytes = out.bytes.saturating_add(e.bytes);
            if e.kind == crate::host::sys::FileKind::Dir {
                todo.push(rel.join(&e.name));
            }
        }
    }
    Ok(out)
}

fn absent(sys: &dyn Sys, path: &Path) -> bool {
    matches!(sys.stat(path, true), Err(e) if e.errno() == Some(Errno::ENOENT))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::health::PodTarget;
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::{DiskFormat, FileKind, FsUsage, MsFlags};
    use crate::model::{PluginName, PodUid, UniqueVolumeName};

    const T: &str = "/k/pods/u1/v/cache";

    fn tmpfs_subject() -> Subject {
        Subject {
            volume: UniqueVolumeName::from_raw("kubernetes.io/empty-dir/u1-cache"),
            plugin: PluginName::EmptyDir,
            spec: Some(Arc::new(VolumeSpec::EmptyDir {
                medium: StorageMedium::Memory,
                size_limit: None,
            })),
            device: None,
            pods: vec![PodTarget {
                uid: PodUid::new("u1").unwrap(),
                outer_name: "cache".into(),
                path: T.into(),
                kind: TargetKind::Mount,
                pod: None,
                read_only: false,
            }],
            claim: None,
        }
    }

    /// A host whose mount table changes when the test says.
    struct Scripted(Arc<Mutex<Vec<bool>>>);
    struct ScriptedWatch(Arc<Mutex<Vec<bool>>>);
    impl crate::host::sys::MountTableWatch for ScriptedWatch {
        fn changed(&mut self) -> bool {
            self.0.lock().unwrap().pop().unwrap_or(false)
        }
    }
    impl Scripted {
        fn watch(&self) -> Option<Box<dyn crate::host::sys::MountTableWatch>> {
            Some(Box::new(ScriptedWatch(self.0.clone())))
        }
    }

    /// The first pass and every pass after a change of the table look at
    /// each mount; the others skip, but never more than nine in a row.
    #[test]
    fn the_table_gate_trusts_remembered_mounts_only_while_the_table_is_unchanged() {
        let host = Scripted(Arc::new(Mutex::new(Vec::new())));
        let mut g = TableGate {
            started: true,
            watch: host.watch(),
            ..TableGate::default()
        };
        // the watch made with the gate: the first pass is full
        let mut first = TableGate::default();
        assert!(!first.unchanged(&RecordingSys::new()), "first pass");
        assert!(
            !first.unchanged(&RecordingSys::new()),
            "the fake has no watch: always full"
        );
        let mut script = |changes: &[bool]| -> Vec<bool> {
            // popped from the end
            *host.0.lock().unwrap() = changes.iter().rev().copied().collect();
            changes
                .iter()
                .map(|_| g.unchanged(&RecordingSys::new()))
                .collect()
        };
        assert_eq!(
            script(&[false, false, true, false]),
            [true, true, false, true]
        );
        let quiet = script(&[false; 12]);
        assert_eq!(quiet.iter().filter(|u| !**u).count(), 1, "{quiet:?}");
        let at = quiet.iter().position(|u| !*u).unwrap();
        assert_eq!(at, 8, "the tenth pass since the last full one is full");
    }

    /// A tmpfs at `T`, its subject, and the baseline a first look learnt.
    fn learnt_tmpfs() -> (RecordingSys, Subject, Baselines) {
        let sys = RecordingSys::new();
        sys.add(T, FileKind::Dir);
        sys.preset_mount(None, Path::new(T), Some("tmpfs"), MsFlags::empty(), None)
            .unwrap();
        let s = tmpfs_subject();
        let mut known = Baselines::default();
        learn(&sys, &[&s], &mut known);
        (sys, s, known)
    }

    fn reasons(f: &[Finding]) -> Vec<&'static str> {
        f.iter().map(|f| f.reason).collect()
    }

    /// `du` of a disk emptyDir: every file below it, nested ones too, but
    /// nothing under a mount inside it, and at most the bound.
    #[test]
    fn a_walk_counts_files_below_skips_mounts_and_stops_at_its_bound() {
        let sys = RecordingSys::new();
        let d = "/k/pods/u1/volumes/kubernetes.io~empty-dir/scratch";
        sys.add(d, FileKind::Dir);
        sys.add_file(format!("{d}/a"), vec![0; 1000]);
        sys.add(format!("{d}/sub"), FileKind::Dir);
        sys.add(format!("{d}/sub/deeper"), FileKind::Dir);
        sys.add_file(format!("{d}/sub/deeper/b"), vec![0; 24]);
        sys.add(format!("{d}/other"), FileKind::Dir);
        sys.preset_mount(
            None,
            &Path::new(d).join("other"),
            Some("tmpfs"),
            MsFlags::empty(),
            None,
        )
        .unwrap();
        sys.add_file(format!("{d}/other/big"), vec![0; 1 << 20]);
        let w = walk_usage(&sys, Path::new(d), 100).unwrap();
        assert_eq!(
            w,
            DirUsage {
                bytes: 1024,
                complete: true
            }
        );
        let cut = walk_usage(&sys, Path::new(d), 2).unwrap();
        assert!(!cut.complete);
        assert!(cut.bytes <= 1024);
        // the over-limit finding comes from the walk, through `check`
        let mut s = tmpfs_subject();
        s.spec = Some(Arc::new(VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: Some(1023),
        }));
        s.pods[0].path = d.into();
        s.pods[0].kind = TargetKind::Dir;
        let (f, _) = check(&sys, &s, &Baselines::default(), false);
        assert_eq!(reasons(&f), ["SizeLimitExceeded"]);
    }

    #[test]
    fn a_pass_after_the_first_costs_one_statx_and_one_statfs_per_tmpfs_volume() {
        let (sys, s, mut known) = learnt_tmpfs();
        sys.clear_calls();
        learn(&sys, &[&s], &mut known);
        let (f, usage) = check(&sys, &s, &known, false);
        assert_eq!(reasons(&f), Vec::<&str>::new());
        assert!(usage.is_some());
        assert_eq!(
            sys.calls(),
            vec![
                SysCall::MountProbe { path: T.into() },
                SysCall::Statfs { path: T.into() }
            ]
        );
    }

    /// With the mount table unchanged since the last pass a pass is one
    /// `statfs` per volume: the mount remembered is taken as there.
    #[test]
    fn with_the_table_unchanged_a_pass_is_one_statfs_per_tmpfs_volume() {
        let (sys, s, known) = learnt_tmpfs();
        sys.clear_calls();
        let (f, usage) = check(&sys, &s, &known, true);
        assert_eq!(reasons(&f), Vec::<&str>::new());
        assert!(usage.is_some());
        assert_eq!(sys.calls(), vec![SysCall::Statfs { path: T.into() }]);
        // what the gate relies on: a change of the mount is a change of
        // the table, and a pass told of it looks again
        sys.preset_mount(None, Path::new(T), Some("tmpfs"), MsFlags::empty(), None)
            .unwrap();
        let (f, _) = check(&sys, &s, &known, false);
        assert_eq!(reasons(&f), ["MountReplaced"]);
    }

    #[test]
    fn a_mount_gone_or_replaced_is_found_and_its_usage_not_measured() {
        let (sys, s, known) = learnt_tmpfs();
        sys.preset_mount(None, Path::new(T), Some("tmpfs"), MsFlags::empty(), None)
            .unwrap();
        let (f, usage) = check(&sys, &s, &known, false);
        assert_eq!(reasons(&f), ["MountReplaced"]);
        assert_eq!(usage, None);

        let bare = RecordingSys::new();
        bare.add(T, FileKind::Dir);
        let mut known = Baselines::default();
        learn(&bare, &[&s], &mut known);
        let (f, usage) = check(&bare, &s, &known, false);
        assert_eq!(reasons(&f), ["MountVanished"]);
        assert_eq!(usage, None);
    }

    /// A directory PV's data is its first pod target: read-only there is
    /// a fault only when that pod does not mount it read-only (its claim's
    /// `readOnly`).
    #[test]
    fn a_read_only_pod_target_is_read_only_on_purpose() {
        let (sys, mut s, known) = learnt_tmpfs();
        s.plugin = PluginName::LocalVolume;
        s.spec = Some(Arc::new(VolumeSpec::Local {
            path: PathBuf::from("/srv/pv1").into(),
            fs_type: None,
            access_modes: vec![],
            mount_options: vec![],
            is_block: false,
            volume_mode: Default::default(),
        }));
        let dev = sys.mounts().last().expect("the mount").dev;
        sys.set_fs_usage(
            dev,
            FsUsage {
                block_size: 4096,
                blocks: 10,
                blocks_free: 5,
                blocks_available: 5,
                files: 10,
                files_free: 5,
                read_only: true,
            },
        );
        let (f, _) = check(&sys, &s, &known, false);
        assert_eq!(reasons(&f), ["ReadOnlyFilesystem"], "a writable pod's");
        s.pods[0].read_only = true;
        let (f, _) = check(&sys, &s, &known, false);
        assert_eq!(reasons(&f), Vec::<&str>::new(), "a read-only claim's");
    }

    #[test]
    fn a_full_read_only_local_pv_with_new_ext4_errors_and_its_device_gone() {
        let sys = RecordingSys::new();
        let dev = DevId { major: 7, minor: 3 };
        sys.add_device("/dev/loop3", dev, DiskFormat::Filesystem("ext4".into()));
        let g = "/k/plugins/local/mounts/pv1";
        sys.add(g, FileKind::Dir);
        sys.preset_mount(
            Some(Path::new("/dev/loop3")),
            Path::new(g),
            Some("ext4"),
            MsFlags::empty(),
            None,
        )
        .unwrap();
        sys.add_file(
            "/sys/dev/block/7:3/uevent",
            "MAJOR=7\nMINOR=3\nDEVNAME=loop3\n",
        );
        sys.add_file("/sys/fs/ext4/loop3/errors_count", "0\n");
        let s = Subject {
            volume: UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            plugin: PluginName::LocalVolume,
            spec: Some(Arc::new(VolumeSpec::Local {
                path: PathBuf::from("/dev/loop3").into(),
                fs_type: Some("ext4".into()),
                access_modes: vec![],
                mount_options: vec![],
                is_block: true,
                volume_mode: Default::default(),
            })),
            device: Some(g.into()),
            pods: vec![],
            claim: None,
        };
        let mut known = Baselines::default();
        learn(&sys, &[&s], &mut known);
        let (f, _) = check(&sys, &s, &known, false);
        assert_eq!(reasons(&f), Vec::<&str>::new(), "healthy first");

        sys.add_file("/sys/fs/ext4/loop3/errors_count", "2\n");
        sys.set_fs_usage(
            dev,
            FsUsage {
                block_size: 4096,
                blocks: 10,
                blocks_free: 0,
                blocks_available: 0,
                files: 10,
                files_free: 3,
                read_only: true,
            },
        );
        let (f, usage) = check(&sys, &s, &known, false);
        assert_eq!(
            reasons(&f),
            ["FilesystemErrors", "ReadOnlyFilesystem", "OutOfSpace"]
        );
        assert_eq!(usage.map(|u| u.available_bytes), Some(0));
    }

    /// A raw block map's pod path is a link to a device node: no `statfs`
    /// of it (devtmpfs would answer), so no usage and no failure.
    #[test]
    fn a_raw_block_map_is_not_measured_through_its_device_link() {
        let sys = RecordingSys::new();
        let link = "/k/pods/u1/volumeDevices/kubernetes.io~local-volume/pv-raw";
        let s = Subject {
            volume: UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv-raw"),
            plugin: PluginName::LocalVolume,
            spec: None,
            device: None,
            pods: vec![PodTarget {
                uid: PodUid::new("u1").unwrap(),
                outer_name: "data".into(),
                path: link.into(),
                kind: TargetKind::Block,
                pod: None,
                read_only: false,
            }],
            claim: None,
        };
        let mut known = Baselines::default();
        learn(&sys, &[&s], &mut known);
        let (f, usage) = check(&sys, &s, &known, false);
        assert_eq!(reasons(&f), Vec::<&str>::new());
        assert_eq!(usage, None);
        let statfs = sys
            .calls()
            .into_iter()
            .filter(|c| matches!(c, SysCall::Statfs { .. }))
            .count();
        assert_eq!(statfs, 0, "{:?}", sys.calls());
    }
}
