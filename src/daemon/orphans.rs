//! Orphan cleanup: the pod dirs of pods that are gone (in neither the DSW
//! nor the ASW), swept once every pod source has been listed and the
//! reconstruction's pod-dir walk is done, then periodically.
//!
//! DESIGN.md's removal rules hold: a volume dir is only ever `rmdir`ed —
//! never emptied — so nothing inside a volume is deleted here; a dir that is
//! a mount point (by the mount table *or* statx's mount-root flag, which
//! catches same-filesystem binds) is left; nothing is followed through a
//! symlink; dirs of volume types volumed has no plugin for (secret,
//! projected, …) are left and reported. The only files deleted are the
//! emptyDir `ready` markers under `pods/<uid>/plugins/`, removed on one
//! filesystem. Every pod dir (orphan or not) first gets its interrupted
//! emptyDir deletions (`<name>.deleting~<seq>`) finished: a TearDown cut by
//! a crash completes here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::host::mountinfo::MountTable;
use crate::host::remove::{is_pending_deletion, remove_dir_one_fs};
use crate::host::sys::{Errno, FileKind, Sys};
use crate::model::{Layout, PluginName, PodUid};
use crate::plugins::EmptyDirPlugin;

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// orphaned pod dirs examined
    pub examined: usize,
    /// orphaned pod dirs removed completely
    pub removed: usize,
    /// orphaned pod dirs that could not be fully cleaned
    pub errors: usize,
    /// what was left and why
    pub left: Vec<(PathBuf, String)>,
    /// interrupted emptyDir deletions finished
    pub finished_deletions: usize,
}

/// Sweeps `<root>/pods`. `known` holds every pod the DSW or the ASW knows.
pub fn sweep(layout: &Layout, sys: &dyn Sys, known: &BTreeSet<PodUid>) -> SweepReport {
    let mut report = SweepReport::default();
    let pods = layout.pods_dir();
    let entries = match sys.read_dir_beneath(&pods, Path::new("")) {
        Ok(e) => e,
        Err(e) if e.errno() == Some(Errno::ENOENT) => return report,
        Err(e) => {
            report.left.push((pods, e.to_string()));
            return report;
        }
    };
    let table = match sys.read_mountinfo() {
        Ok(t) => t,
        Err(e) => {
            report
                .left
                .push((pods, format!("read the mount table: {e}")));
            return report;
        }
    };
    let empty_dir = EmptyDirPlugin::new(layout.clone());
    for entry in entries {
        let path = pods.join(&entry.name);
        let Some(uid) = entry.name.to_str().and_then(|n| PodUid::new(n).ok()) else {
            report.left.push((path, "not a pod uid".into()));
            continue;
        };
        if entry.kind != FileKind::Dir {
            report
                .left
                .push((path, "not a directory (never followed)".into()));
            continue;
        }
        match empty_dir.finish_pending(&uid, sys) {
            Ok(done) => report.finished_deletions += done.len(),
            Err(e) => report
                .left
                .push((path.clone(), format!("finish pending deletions: {e}"))),
        }
        if known.contains(&uid) {
            continue;
        }
        report.examined += 1;
        match clean_pod(layout, sys, &table, &uid) {
            Ok(()) => report.removed += 1,
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
    table: &MountTable,
    uid: &PodUid,
) -> Result<(), Vec<(PathBuf, String)>> {
    let mut left = Vec::new();
    let pod_dir = layout.pod_dir(uid);
    let volumes = pod_dir.join("volumes");
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
    // Crash point: the volume dirs are gone, the markers and the pod dir not yet.
    crate::failpoint::hit("orphan_cleanup.mid");
    // Only emptyDir ready markers live under plugins/; one filesystem, no links followed.
    let plugins = pod_dir.join("plugins");
    match remove_dir_one_fs(&plugins, sys) {
        Ok(r) if !r.complete() => {
            for m in r.kept_mounts {
                left.push((m, "a mount point under plugins/: never removed".into()));
            }
        }
        Ok(_) => {}
        Err(e) => left.push((plugins, e.to_string())),
    }
    for dir in [volumes, pod_dir] {
        match sys.rmdir(&dir) {
            Ok(()) => {}
            Err(e) if e.errno() == Some(Errno::ENOENT) => {}
            Err(e) => left.push((dir, format!("not removed: {e}"))),
        }
    }
    if left.is_empty() { Ok(()) } else { Err(left) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::MsFlags;

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }

    #[test]
    fn orphans_are_removed_known_pods_kept_and_risky_dirs_left() {
        let sys = RecordingSys::new();
        let layout = Layout::new("/r");
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
        // a gone pod with a secret volume: left and reported
        d("/r/pods/secret/volumes/kubernetes.io~secret/token");
        // a gone pod whose emptyDir still has data: never emptied here
        d("/r/pods/data/volumes/kubernetes.io~empty-dir/scratch");
        sys.add(
            "/r/pods/data/volumes/kubernetes.io~empty-dir/scratch/file",
            FileKind::File,
        );
        // a live pod: untouched
        d("/r/pods/live/volumes/kubernetes.io~empty-dir/cache");

        let known: BTreeSet<_> = [uid("live")].into();
        let r = sweep(&layout, &sys, &known);
        assert_eq!(r.examined, 4);
        assert_eq!(r.removed, 1, "{:#?}", r.left);
        assert_eq!(r.errors, 3);
        assert!(!sys.exists("/r/pods/gone"));
        assert!(sys.exists("/r/pods/mounted/volumes/kubernetes.io~local-volume/pv1"));
        assert!(sys.exists("/r/pods/secret/volumes/kubernetes.io~secret/token"));
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
            why("/r/pods/secret/volumes/kubernetes.io~secret")
                .unwrap()
                .contains("no plugin")
        );
    }

    #[test]
    fn an_interrupted_emptydir_deletion_is_finished_even_for_a_live_pod() {
        let sys = RecordingSys::new();
        let layout = Layout::new("/r");
        sys.add(
            "/r/pods/live/volumes/kubernetes.io~empty-dir/scratch.deleting~7/sub",
            FileKind::Dir,
        );
        sys.add(
            "/r/pods/live/volumes/kubernetes.io~empty-dir/scratch.deleting~7/sub/f",
            FileKind::File,
        );
        let known: BTreeSet<_> = [uid("live")].into();
        let r = sweep(&layout, &sys, &known);
        assert_eq!(r.finished_deletions, 1);
        assert!(!sys.exists("/r/pods/live/volumes/kubernetes.io~empty-dir/scratch.deleting~7"));
        assert_eq!(r.examined, 0);
    }
}
