//! Orphan cleanup: the pod dirs of pods that are gone (in neither the DSW
//! nor the ASW), swept once every pod source has been listed and the
//! reconstruction's pod-dir walk is done, then periodically.
//!
//! The removal rules (docs/layout.md) hold: a volume dir is only ever `rmdir`ed —
//! never emptied — so nothing inside a volume is deleted here; a dir that is
//! a mount point (by the mount table *or* statx's mount-root flag, which
//! catches same-filesystem binds) is left; nothing is followed through a
//! symlink; dirs of volume types volumed has no plugin for (secret,
//! projected, …) are left and reported. The only files deleted are the
//! emptyDir `ready` markers under `pods/<uid>/plugins/kubernetes.io~empty-dir/`;
//! any other plugin's dir there is left and reported too. An orphan's
//! subpath binds (`pods/<uid>/volume-subpaths/`, `host::subpath`) are
//! unmounted and their dirs and empty bind-target files removed first.
//!
//! An orphan's dir, and a known pod's dir the core names (a TearDown ran
//! there since the last sweep; every pod after a start), first gets its
//! interrupted deletions of disk emptyDirs and configMaps (whose payload
//! sits in a wrapped disk emptyDir), `<name>.deleting~<seq>`, finished: a
//! TearDown cut by a crash, or by an error, completes here. Other known
//! pods' dirs are not entered: a settled sweep is one listing of `pods/`
//! (at 10,000 pods on ext4, release build: 27–42 ms, against 0.31–0.43 s
//! looking into every pod's dirs; most of what is left is the listing's
//! `statx` of each entry).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::host::mountinfo::MountTable;
use crate::host::remove::is_pending_deletion;
use crate::host::sys::{Errno, FileKind, Sys};
use crate::model::{Layout, PluginName, PodUid, READY_MARKER};
use crate::plugins::EmptyDirPlugin;
use crate::reconciler::effects::Finish;

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct SweepReport {
    /// orphaned pod dirs examined
    pub examined: usize,
    /// orphaned pod dirs removed completely
    pub removed: usize,
    /// orphaned pod dirs that could not be fully cleaned
    pub errors: usize,
    /// what was left and why
    pub left: Vec<(PathBuf, String)>,
    /// interrupted disk emptyDir and configMap deletions finished
    pub finished_deletions: usize,
    /// pods whose interrupted deletions are not finished (see
    /// [`Swept::unfinished`](crate::reconciler::effects::Swept))
    pub unfinished: Finish,
    /// an orphan was removed or a deletion finished completely (one that
    /// keeps a mount inside is tried again each sweep, changing nothing)
    pub changed: bool,
}

/// Unmounts and removes a pod's subPath binds (the daemon's journals
/// each: `Subpaths::clean_pod`).
pub(crate) type CleanSubpaths<'a> = dyn Fn(&PodUid) -> Result<crate::host::subpath::Cleaned, crate::host::subpath::SubpathError>
    + 'a;

/// Sweeps `<root>/pods`. `known` holds every pod the DSW or the ASW knows;
/// of those, only the dirs of pods in `finish` are looked into (their
/// interrupted deletions finished), so a settled sweep is one listing of
/// `pods/`. An orphan's deletions are always finished, and the mount table
/// is read only once one turns up (its volume dirs are checked against it).
/// Ends early, between two pods, once `stop` is set: a graceful stop must
/// not wait for a walk of every pod dir (the next start sweeps again).
pub(crate) fn sweep(
    layout: &Layout,
    sys: &dyn Sys,
    subpaths: &CleanSubpaths<'_>,
    known: &BTreeSet<PodUid>,
    finish: &Finish,
    stop: &AtomicBool,
) -> SweepReport {
    let mut report = SweepReport::default();
    let pods = layout.pods_dir();
    let entries = match sys.read_dir_beneath(&pods, Path::new("")) {
        Ok(e) => e,
        Err(e) if e.errno() == Some(Errno::ENOENT) => return report,
        Err(e) => {
            report.left.push((pods, e.to_string()));
            report.unfinished = finish.clone();
            return report;
        }
    };
    let mut table: Option<Result<MountTable, String>> = None;
    let empty_dir = EmptyDirPlugin::new(layout.clone());
    for entry in entries {
        if stop.load(Ordering::SeqCst) {
            // the rest is not reached: all of it stays to do
            report.unfinished.merge(finish.clone());
            break;
        }
        let Some(uid) = entry.name.to_str().and_then(|n| PodUid::new(n).ok()) else {
            report
                .left
                .push((pods.join(&entry.name), "not a pod uid".into()));
            continue;
        };
        let path = pods.join(&entry.name);
        if entry.kind != FileKind::Dir {
            report
                .left
                .push((path, "not a directory (never followed)".into()));
            continue;
        }
        let is_known = known.contains(&uid);
        if is_known && !finish.contains(&uid) {
            continue;
        }
        match empty_dir.finish_pending(&uid, sys) {
            Ok(done) => {
                report.finished_deletions += done.len();
                let complete = done.iter().filter(|(_, r)| r.complete()).count();
                report.changed |= complete > 0;
                if complete < done.len() {
                    report.unfinished.insert(uid.clone());
                }
            }
            Err(e) => {
                report
                    .left
                    .push((path.clone(), format!("finish pending deletions: {e}")));
                report.unfinished.insert(uid.clone());
            }
        }
        if is_known {
            continue;
        }
        report.examined += 1;
        let table = table.get_or_insert_with(|| {
            sys.read_mountinfo()
                .map_err(|e| format!("read the mount table: {e}"))
        });
        let table = match table {
            Ok(t) => &*t,
            Err(e) => {
                report.errors += 1;
                report.left.push((path, e.clone()));
                continue;
            }
        };
        match clean_pod(layout, sys, subpaths, table, &uid) {
            Ok(()) => {
                report.removed += 1;
                report.changed = true;
            }
            Err(left) => {
                report.errors += 1;
                report.left.extend(left);
            }
        }
    }
    report
}

fn is_mounted(sys: &dyn Sys, table: &MountTable, path: &Path) -> bool {
    table.is_mount_point(path) || sys.mount_root(path).unwrap_or(true)
}

/// Removes one orphaned pod dir, or says what it left.
fn clean_pod(
    layout: &Layout,
    sys: &dyn Sys,
    subpaths: &CleanSubpaths<'_>,
    table: &MountTable,
    uid: &PodUid,
) -> Result<(), Vec<(PathBuf, String)>> {
    let mut left = Vec::new();
    let pod_dir = layout.pod_dir(uid);
    let volumes = layout.pod_volumes_dir(uid);
    // Its subpath binds first, as the kubelet cleans them before the
    // volumes (a kubelet node's leftovers too): unmounted, then removed.
    if let Err(e) = subpaths(uid) {
        left.push((
            layout.pod_subpaths_dir(uid),
            format!("subpath binds not cleaned: {e}"),
        ));
    }
    for plugin_dir in sys
        .read_dir_beneath(&volumes, Path::new(""))
        .unwrap_or_default()
    {
        let pdir = volumes.join(&plugin_dir.name);
        let known = plugin_dir
            .name
            .to_str()
            .and_then(PluginName::from_escaped)
            .is_some();
        if plugin_dir.kind != FileKind::Dir {
            left.push((pdir, "not a directory (never followed)".into()));
            continue;
        }
        if !known {
            left.push((
                pdir,
                "a volume type volumed has no plugin for: left in place".into(),
            ));
            continue;
        }
        for vol in sys
            .read_dir_beneath(&pdir, Path::new(""))
            .unwrap_or_default()
        {
            let vdir = pdir.join(&vol.name);
            if is_pending_deletion(&vol.name) {
                left.push((vdir, "an interrupted deletion that could not finish".into()));
            } else if vol.kind != FileKind::Dir {
                left.push((vdir, "not a directory (never followed)".into()));
            } else if vol.mount_root || is_mounted(sys, table, &vdir) {
                left.push((vdir, "a mount point: never removed".into()));
            } else if let Err(e) = sys.rmdir(&vdir) {
                left.push((
                    vdir,
                    format!("not removed (only empty volume dirs are): {e}"),
                ));
            }
        }
        let _ = sys.rmdir(&pdir);
    }
    // Raw block maps: each unmap removed its pod's symlink, so only empty
    // dirs are left, rmdir'ed; a link still there is a map not undone,
    // left and reported (never removed here)
    let devices = layout.pod_volume_devices_dir(uid);
    for plugin_dir in sys
        .read_dir_beneath(&devices, Path::new(""))
        .unwrap_or_default()
    {
        let pdir = devices.join(&plugin_dir.name);
        if plugin_dir.kind != FileKind::Dir {
            left.push((pdir, "not a directory (never followed)".into()));
        } else if let Err(e) = sys.rmdir(&pdir) {
            left.push((pdir, format!("not removed (a device map is left): {e}")));
        }
    }
    // Crash point: the volume dirs are gone, the markers and the pod dir not yet.
    crate::failpoint::hit("orphan_cleanup.mid");
    // Under plugins/ only emptyDir `ready` markers are volumed's: those are
    // unlinked and their dirs removed; anything else (another plugin's
    // data, a mount, a link) is left and reported.
    let plugins = layout.pod_plugins_dir(uid);
    clean_plugin_dirs(&plugins, sys, &mut left);
    let mut dirs = vec![volumes, devices, pod_dir];
    if !left.iter().any(|(p, _)| p.starts_with(&plugins)) {
        dirs.insert(0, plugins);
    }
    for dir in dirs {
        match sys.rmdir(&dir) {
            Ok(()) => {}
            Err(e) if e.errno() == Some(Errno::ENOENT) => {}
            Err(e) => left.push((dir, format!("not removed: {e}"))),
        }
    }
    if left.is_empty() { Ok(()) } else { Err(left) }
}

/// The dirs under a gone pod's `plugins/`: emptyDir volume dirs holding at
/// most their `ready` marker are emptied of it and removed; every other
/// entry is left and reported (never followed, never emptied).
fn clean_plugin_dirs(plugins: &Path, sys: &dyn Sys, left: &mut Vec<(PathBuf, String)>) {
    let empty_dir = PluginName::EmptyDir.escaped();
    let list = |dir: &Path, left: &mut Vec<(PathBuf, String)>| match sys
        .read_dir_beneath(dir, Path::new(""))
    {
        Ok(entries) => entries,
        Err(e) if e.errno() == Some(Errno::ENOENT) => Vec::new(),
        Err(e) => {
            left.push((dir.to_owned(), e.to_string()));
            Vec::new()
        }
    };
    for p in list(plugins, left) {
        let pdir = plugins.join(&p.name);
        if p.name != empty_dir {
            left.push((
                pdir,
                "a plugin dir of a volume type volumed has no plugin for: left in place".into(),
            ));
            continue;
        }
        if p.kind != FileKind::Dir || p.mount_root {
            left.push((pdir, "not a plain directory: left in place".into()));
            continue;
        }
        for v in list(&pdir, left) {
            let vdir = pdir.join(&v.name);
            if v.kind != FileKind::Dir || v.mount_root {
                left.push((vdir, "not a plain directory: left in place".into()));
                continue;
            }
            for f in list(&vdir, left) {
                if f.name == READY_MARKER && f.kind == FileKind::File {
                    if let Err(e) = sys.remove_beneath(&vdir, Path::new(&f.name), false) {
                        left.push((vdir.join(&f.name), e.to_string()));
                    }
                } else {
                    left.push((
                        vdir.join(&f.name),
                        "not an emptyDir ready marker: left".into(),
                    ));
                }
            }
            if let Err(e) = sys.rmdir(&vdir) {
                left.push((vdir, format!("not removed: {e}")));
            }
        }
        if let Err(e) = sys.rmdir(&pdir) {
            left.push((pdir, format!("not removed: {e}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::MsFlags;

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }

    /// The subpath cleanup without a journal.
    fn plain_cleanup<'a>(
        sys: &'a dyn Sys,
        layout: &'a Layout,
    ) -> impl Fn(&PodUid) -> Result<crate::host::subpath::Cleaned, crate::host::subpath::SubpathError> + 'a
    {
        move |uid| {
            crate::host::subpath::clean_pod(sys, layout, uid, &mut crate::host::subpath::plain)
        }
    }

    fn pods(names: &[&str]) -> BTreeSet<PodUid> {
        names.iter().map(|n| uid(n)).collect()
    }

    /// Sweeps `/r` to its end (never asked to stop).
    fn sweep_r(sys: &dyn Sys, known: &BTreeSet<PodUid>, finish: &Finish) -> SweepReport {
        let layout = Layout::new("/r");
        sweep(
            &layout,
            sys,
            &plain_cleanup(sys, &layout),
            known,
            finish,
            &AtomicBool::new(false),
        )
    }

    #[test]
    fn a_sweep_asked_to_stop_ends_before_the_next_pod() {
        let sys = RecordingSys::new();
        let layout = Layout::new("/r");
        sys.add(
            "/r/pods/gone/volumes/kubernetes.io~empty-dir/cache",
            FileKind::Dir,
        );
        let r = sweep(
            &layout,
            &sys,
            &plain_cleanup(&sys, &layout),
            &BTreeSet::new(),
            &Finish::All,
            &AtomicBool::new(true),
        );
        assert_eq!(r.examined, 0);
        assert!(sys.exists("/r/pods/gone"), "left for the next sweep");
        assert_eq!(r.unfinished, Finish::All, "and so are its deletions");
    }

    const CUT: &str = "volumes/kubernetes.io~empty-dir/scratch.deleting~7";

    /// Known pods `a` and `b` and, with `orphan`, a gone pod `gone`, each
    /// with an interrupted emptyDir deletion.
    fn cut_pods(orphan: bool) -> RecordingSys {
        let sys = RecordingSys::new();
        let mut names = vec!["a", "b"];
        if orphan {
            names.push("gone");
        }
        for p in names {
            sys.add(format!("/r/pods/{p}/{CUT}/f"), FileKind::File);
        }
        sys
    }

    #[test]
    fn a_settled_sweep_is_one_listing_of_pods_and_reads_no_mount_table() {
        let sys = cut_pods(false);
        let r = sweep_r(&sys, &pods(&["a", "b"]), &Finish::default());
        assert_eq!(
            sys.calls(),
            [SysCall::ReadDirBeneath {
                base: "/r/pods".into(),
                rel: "".into()
            }],
            "nothing beneath a known pod's dir, no mount table"
        );
        assert_eq!(r, SweepReport::default());
        assert!(sys.exists(format!("/r/pods/a/{CUT}")), "not looked for");
    }

    #[test]
    fn an_orphans_pending_rename_is_finished_without_entering_known_pods() {
        let sys = cut_pods(true);
        let r = sweep_r(&sys, &pods(&["a", "b"]), &Finish::default());
        assert_eq!(
            (r.finished_deletions, r.examined, r.removed),
            (1, 1, 1),
            "{r:?}"
        );
        assert!(r.changed);
        assert!(!sys.exists("/r/pods/gone"));
        let calls = sys.calls();
        // any call naming a path in the pod's dir, whatever its kind
        let beneath = |pod: &str| {
            let dir = format!("/r/pods/{pod}");
            calls.iter().any(|c| format!("{c:?}").contains(&dir))
        };
        assert!(beneath("gone"));
        assert!(!beneath("a") && !beneath("b"), "{calls:#?}");
        // one for the removal of its rename (which keeps mounts inside),
        // one for its volume dirs
        let tables = calls.iter().filter(|c| **c == SysCall::ReadMountinfo);
        assert_eq!(tables.count(), 2, "read for the orphan only");
        assert!(sys.exists(format!("/r/pods/a/{CUT}/f")));
    }

    #[test]
    fn only_the_known_pods_named_are_finished_and_a_failure_is_kept_for_the_next() {
        let sys = cut_pods(false);
        let finish = Finish::Pods(pods(&["a", "absent"]));
        let r = sweep_r(&sys, &pods(&["a", "b"]), &finish);
        assert_eq!(r.finished_deletions, 1, "{r:?}");
        assert!(!sys.exists(format!("/r/pods/a/{CUT}")));
        assert!(sys.exists(format!("/r/pods/b/{CUT}")), "b had no TearDown");
        assert_eq!(
            r.unfinished,
            Finish::default(),
            "a pod without a dir is done"
        );

        // a's listing fails: a is finished by the next sweep
        let sys = cut_pods(false);
        sys.fail_nth(crate::host::sys::Call::ReadDirBeneath, 2, Errno::EIO);
        let r = sweep_r(&sys, &pods(&["a", "b"]), &finish);
        assert_eq!(r.unfinished, Finish::Pods(pods(&["a"])), "{r:?}");
        assert!(sys.exists(format!("/r/pods/a/{CUT}")));
    }

    /// The same on a real directory tree through the real syscalls (no
    /// mount needed: nothing here is mounted, so it runs unprivileged).
    #[test]
    fn on_real_files_a_settled_sweep_leaves_known_pods_and_finishes_an_orphan() {
        let root = tempfile::tempdir().unwrap();
        let layout = Layout::new(root.path());
        let cut = |p: &str| root.path().join(format!("pods/{p}/{CUT}"));
        for p in ["a", "b", "gone"] {
            std::fs::create_dir_all(cut(p).join("sub")).unwrap();
            std::fs::write(cut(p).join("sub/f"), b"data").unwrap();
        }
        let sys = crate::host::sys::LinuxSys;
        let known = pods(&["a", "b"]);
        let stop = AtomicBool::new(false);
        let clean = plain_cleanup(&sys, &layout);
        let r = sweep(&layout, &sys, &clean, &known, &Finish::default(), &stop);
        assert_eq!((r.finished_deletions, r.removed), (1, 1), "{r:?}");
        assert!(!root.path().join("pods/gone").exists());
        assert!(cut("a").join("sub/f").exists() && cut("b").join("sub/f").exists());

        // a TearDown ran on a: the next sweep finishes there, only there
        let r = sweep(
            &layout,
            &sys,
            &clean,
            &known,
            &Finish::Pods(pods(&["a"])),
            &stop,
        );
        assert_eq!((r.finished_deletions, r.examined), (1, 0), "{r:?}");
        assert!(!cut("a").exists());
        assert!(
            root.path().join("pods/a/volumes").exists(),
            "a known pod's dir stays"
        );
        assert!(cut("b").join("sub/f").exists());
        assert_eq!(r.unfinished, Finish::default());
    }

    #[test]
    fn orphans_are_removed_known_pods_kept_and_risky_dirs_left() {
        let sys = RecordingSys::new();
        let d = |p: &str| sys.add(p, FileKind::Dir);
        // a gone pod with an empty volume dir and a ready marker: removed
        d("/r/pods/gone/volumes/kubernetes.io~empty-dir/cache");
        d("/r/pods/gone/plugins/kubernetes.io~empty-dir/cache");
        sys.add(
            "/r/pods/gone/plugins/kubernetes.io~empty-dir/cache/ready",
            FileKind::File,
        );
        // a gone pod whose volume dir is still a mount point: left
        d("/r/pods/mounted/volumes/kubernetes.io~local-volume/pv1");
        sys.preset_mount(
            None,
            Path::new("/r/pods/mounted/volumes/kubernetes.io~local-volume/pv1"),
            Some("tmpfs"),
            MsFlags::empty(),
            None,
        )
        .unwrap();
        // a gone pod with an nfs volume: left and reported
        d("/r/pods/secret/volumes/kubernetes.io~nfs/token");
        // a gone pod whose emptyDir still has data: never emptied here
        d("/r/pods/data/volumes/kubernetes.io~empty-dir/scratch");
        sys.add(
            "/r/pods/data/volumes/kubernetes.io~empty-dir/scratch/file",
            FileKind::File,
        );
        // a live pod: untouched
        d("/r/pods/live/volumes/kubernetes.io~empty-dir/cache");

        let known: BTreeSet<_> = [uid("live")].into();
        let r = sweep_r(&sys, &known, &Finish::All);
        assert_eq!(r.examined, 4);
        assert_eq!(r.removed, 1, "{:#?}", r.left);
        assert_eq!(r.errors, 3);
        assert!(!sys.exists("/r/pods/gone"));
        assert!(sys.exists("/r/pods/mounted/volumes/kubernetes.io~local-volume/pv1"));
        assert!(sys.exists("/r/pods/secret/volumes/kubernetes.io~nfs/token"));
        assert!(
            sys.exists("/r/pods/data/volumes/kubernetes.io~empty-dir/scratch/file"),
            "never deletes volume contents"
        );
        assert!(sys.exists("/r/pods/live/volumes/kubernetes.io~empty-dir/cache"));
        let why = |p: &str| {
            r.left
                .iter()
                .find(|(x, _)| x == Path::new(p))
                .map(|(_, w)| w.clone())
        };
        assert!(
            why("/r/pods/mounted/volumes/kubernetes.io~local-volume/pv1")
                .unwrap()
                .contains("mount point")
        );
        assert!(
            why("/r/pods/secret/volumes/kubernetes.io~nfs")
                .unwrap()
                .contains("no plugin")
        );
    }

    /// A gone pod's raw block map dirs, emptied by its unmaps, are
    /// removed with it; one still holding a map's symlink is left, the
    /// link untouched, and reported.
    #[test]
    fn a_gone_pods_empty_device_map_dirs_go_and_a_left_map_stays() {
        let sys = RecordingSys::new();
        let d = |p: &str| sys.add(p, FileKind::Dir);
        d("/r/pods/unmapped/volumeDevices/kubernetes.io~csi");
        d("/r/pods/unmapped/volumeDevices/kubernetes.io~local-volume");
        d("/r/pods/mapped/volumeDevices/kubernetes.io~csi");
        let link = "/r/pods/mapped/volumeDevices/kubernetes.io~csi/pv-raw";
        sys.add(link, FileKind::Symlink);

        let r = sweep_r(&sys, &BTreeSet::new(), &Finish::All);
        assert_eq!((r.examined, r.removed), (2, 1), "{:#?}", r.left);
        assert!(!sys.exists("/r/pods/unmapped"));
        assert!(sys.exists(link), "a map's link is never removed here");
        let left: Vec<&Path> = r.left.iter().map(|(p, _)| p.as_path()).collect();
        assert!(
            left.contains(&Path::new("/r/pods/mapped/volumeDevices/kubernetes.io~csi")),
            "{left:?}"
        );
    }

    #[test]
    fn under_plugins_only_emptydir_ready_markers_are_removed() {
        let sys = RecordingSys::new();
        let d = |p: &str| sys.add(p, FileKind::Dir);
        let f = |p: &str| sys.add(p, FileKind::File);
        // a gone pod: its marker goes, a CSI plugin's data and a stray file stay
        d("/r/pods/gone/volumes");
        f("/r/pods/gone/plugins/kubernetes.io~empty-dir/cache/ready");
        f("/r/pods/gone/plugins/kubernetes.io~empty-dir/other/not-a-marker");
        f("/r/pods/gone/plugins/kubernetes.io~csi/pv-x/vol_data.json");
        // a gone pod with nothing but markers: removed completely
        d("/r/pods/clean/volumes");
        f("/r/pods/clean/plugins/kubernetes.io~empty-dir/a/ready");
        f("/r/pods/clean/plugins/kubernetes.io~empty-dir/b/ready");

        let r = sweep_r(&sys, &BTreeSet::new(), &Finish::All);
        assert_eq!((r.examined, r.removed), (2, 1), "{:#?}", r.left);
        assert!(!sys.exists("/r/pods/clean"));
        assert!(!sys.exists("/r/pods/gone/plugins/kubernetes.io~empty-dir/cache"));
        assert!(sys.exists("/r/pods/gone/plugins/kubernetes.io~empty-dir/other/not-a-marker"));
        assert!(sys.exists("/r/pods/gone/plugins/kubernetes.io~csi/pv-x/vol_data.json"));
        let left: Vec<_> = r.left.iter().map(|(p, _)| p.to_str().unwrap()).collect();
        assert!(
            left.contains(&"/r/pods/gone/plugins/kubernetes.io~csi"),
            "{left:?}"
        );
        assert!(
            left.contains(&"/r/pods/gone/plugins/kubernetes.io~empty-dir/other/not-a-marker"),
            "{left:?}"
        );
    }

    #[test]
    fn an_interrupted_emptydir_deletion_is_finished_even_for_a_live_pod_when_named() {
        let sys = RecordingSys::new();
        sys.add(
            "/r/pods/live/volumes/kubernetes.io~empty-dir/scratch.deleting~7/sub",
            FileKind::Dir,
        );
        sys.add(
            "/r/pods/live/volumes/kubernetes.io~empty-dir/scratch.deleting~7/sub/f",
            FileKind::File,
        );
        let known: BTreeSet<_> = [uid("live")].into();
        let r = sweep_r(&sys, &known, &Finish::Pods(known.clone()));
        assert_eq!(r.finished_deletions, 1);
        assert!(!sys.exists("/r/pods/live/volumes/kubernetes.io~empty-dir/scratch.deleting~7"));
        assert_eq!(r.examined, 0);
    }

    /// A configMap's payload sits in a wrapped disk emptyDir, so its
    /// TearDown renames it to `.deleting~N` too: a crash after the rename
    /// is finished like an emptyDir's — the dir gone, a mount inside it
    /// kept and not entered, a symlink unlinked, never followed — and the
    /// gone pod's dir is removed with it.
    #[test]
    fn an_interrupted_config_map_deletion_is_finished_without_entering_a_mount() {
        let sys = RecordingSys::new();
        let cut = "/r/pods/gone/volumes/kubernetes.io~configmap/config.deleting~9";
        sys.add(
            format!("{cut}/..2026_01_01_00_00_00.0.abcdef012345/app.conf"),
            FileKind::File,
        );
        sys.add(format!("{cut}/..data"), FileKind::Symlink);
        sys.add(format!("{cut}/app.conf"), FileKind::Symlink);
        sys.add("/outside/precious", FileKind::File);
        let r = sweep_r(&sys, &BTreeSet::new(), &Finish::All);
        assert_eq!(r.finished_deletions, 1, "{r:?}");
        assert!(!sys.exists(cut));
        assert_eq!((r.removed, r.errors), (1, 0), "{r:?}");
        assert!(!sys.exists("/r/pods/gone"));
        assert!(sys.exists("/outside/precious"));

        // a mount someone made inside it is kept, and so is the dir
        let sys = RecordingSys::new();
        sys.add(format!("{cut}/m/inside"), FileKind::File);
        sys.add(format!("{cut}/f"), FileKind::File);
        sys.add("/src", FileKind::Dir);
        let m = format!("{cut}/m");
        sys.preset_mount(
            Some(Path::new("/src")),
            Path::new(&m),
            None,
            MsFlags::MS_BIND,
            None,
        )
        .unwrap();
        let known: BTreeSet<_> = [uid("gone")].into();
        let r = sweep_r(&sys, &known, &Finish::All);
        assert!(
            sys.exists(format!("{m}/inside")),
            "nothing deleted in a mount"
        );
        assert!(!sys.exists(format!("{cut}/f")));
        assert_eq!(r.finished_deletions, 1, "{r:?}");
        // not finished: the next sweep tries again, and this one changed
        // nothing (its idle successor may wait by its cost)
        assert_eq!(r.unfinished, Finish::Pods(known), "{r:?}");
        assert!(!r.changed);
    }
}
