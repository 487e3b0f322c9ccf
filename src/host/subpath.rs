//! The kubelet's subpath binds: one volumeMount's `subPath` bound at
//! `pods/<uid>/volume-subpaths/<volume>/<container>/<index>`, which the
//! container runtime then binds into the container.
//!
//! Made as the kubelet's safe subpath makes them (the fixes of CVE
//! 2017-1002101 and 2021-25741): the subpath is opened beneath the volume,
//! following a symlink only while it stays inside the volume (a configMap
//! key is a symlink into `..data`; an absolute one, or one climbing out,
//! fails), and the bind is made from that descriptor's `/proc/self/fd/N`,
//! so nothing swapped in after the check is bound. The bind target is
//! reached beneath the root following no symlink. A missing subpath is
//! made as a directory with the volume root's mode, as the kubelet does
//! (it never makes a file). A socket or a device node is refused: a
//! container must not reach a host socket or device through a volume.
//!
//! [`clean_volume`] undoes them for one pod volume before its TearDown,
//! and [`clean_pod`] for a whole pod dir (orphan cleanup): each bind is
//! unmounted (no `MNT_DETACH`), then its entry removed; nothing is deleted
//! while it is still a mount point, and no symlink is followed.

use std::path::{Path, PathBuf};

use super::sys::{Beneath, Errno, FileKind, MntFlags, Sys, SysError};
use crate::model::{Layout, PodUid};

/// The mode of the directories volumed makes on the way to a bind target.
const SUBPATH_DIR_MODE: u32 = 0o750;
/// The mode of the empty file a file subpath is bound onto.
const SUBPATH_FILE_MODE: u32 = 0o640;
/// How many mounts stacked on one bind target are unmounted at most (a
/// bind made twice by an older daemon, or by the kubelet and then us).
const MAX_STACKED: usize = 8;

/// Why a subpath bind or its cleanup failed.
#[derive(Debug, thiserror::Error)]
pub enum SubpathError {
    /// the subpath resolves out of the volume (through a symlink)
    #[error("resolves out of the volume {}", .volume.display())]
    Escapes {
        /// the volume's path
        volume: PathBuf,
    },
    /// the subpath names a socket or a device node
    #[error("is a {kind}, which is never bound into a container")]
    Refused {
        /// `socket`, `character device`, `block device`
        kind: &'static str,
    },
    /// a host call failed
    #[error(transparent)]
    Sys(#[from] SysError),
    /// a path that is not below the root (a bug: the layout builds them)
    #[error("{} is not below the root dir", .0.display())]
    NotBelowRoot(PathBuf),
    /// the caller's step around a removal would not let it run (its
    /// intent could not be journaled)
    #[error("{0}")]
    Declined(String),
}

/// Where one bind goes.
#[derive(Debug, Clone, Copy)]
pub struct SubpathAt<'a> {
    /// the pod
    pub pod: &'a PodUid,
    /// the pod volume (`volumeMounts[i].name`)
    pub volume: &'a str,
    /// the container
    pub container: &'a str,
    /// the mount's index in the container's `volumeMounts`
    pub index: usize,
}

/// Binds `sub_path` of the volume at `volume_path` for `at` (see the module
/// doc) and returns the bind's path. Idempotent: a bind of the same file
/// in place is kept (nothing stacked); another one is unmounted first.
pub fn bind(
    sys: &dyn Sys,
    layout: &Layout,
    at: SubpathAt<'_>,
    volume_path: &Path,
    sub_path: &str,
) -> Result<PathBuf, SubpathError> {
    let source = Beneath {
        base: volume_path,
        rel: Path::new(sub_path),
    };
    let stat = match sys.stat_within(source) {
        Err(e) if e.errno() == Some(Errno::ENOENT) => {
            let mode = sys.stat(volume_path, true)?.perm;
            super::sys::mkdir_all_beneath(sys, source, mode)?;
            sys.stat_within(source)
        }
        other => other,
    }
    .map_err(|e| match e.errno() {
        Some(Errno::EXDEV) => SubpathError::Escapes {
            volume: volume_path.to_owned(),
        },
        _ => SubpathError::Sys(e),
    })?;
    match stat.kind {
        FileKind::Socket => return Err(SubpathError::Refused { kind: "socket" }),
        FileKind::CharDevice => {
            return Err(SubpathError::Refused {
                kind: "character device",
            });
        }
        FileKind::BlockDevice => {
            return Err(SubpathError::Refused {
                kind: "block device",
            });
        }
        _ => {}
    }
    let target = layout.subpath_target(at.pod, at.volume, at.container, at.index);
    let root = layout.root();
    let dest =
        Beneath::split(root, &target).ok_or_else(|| SubpathError::NotBelowRoot(target.clone()))?;
    match sys.stat_beneath(dest) {
        Ok(there) => {
            if sys.mount_root(&target)? {
                let mounted = sys.stat(&target, false)?;
                if (mounted.dev, mounted.ino) == (stat.dev, stat.ino) {
                    return Ok(target);
                }
                unmount_all(sys, dest, &target)?;
            }
            if there.kind != stat.kind {
                // a file target for a dir subpath (or the reverse): made again
                sys.remove_beneath(root, dest.rel, there.kind == FileKind::Dir)?;
                make_target(sys, dest, stat.kind)?;
            }
        }
        Err(e) if e.errno() == Some(Errno::ENOENT) => {
            if let Some(parent) = dest.parent() {
                super::sys::mkdir_all_beneath(sys, parent, SUBPATH_DIR_MODE)?;
            }
            make_target(sys, dest, stat.kind)?;
        }
        Err(e) => return Err(e.into()),
    }
    sys.bind_within(source, dest, stat.kind)?;
    // Crash point: the bind is made, the runtime has not been answered.
    crate::failpoint::hit("subpath.after_bind");
    Ok(target)
}

fn make_target(sys: &dyn Sys, dest: Beneath<'_>, kind: FileKind) -> Result<(), SysError> {
    match kind {
        FileKind::Dir => sys.mkdir_beneath(dest, SUBPATH_DIR_MODE),
        _ => sys.create_file_beneath(dest, b"", SUBPATH_FILE_MODE),
    }
}

/// Unmounts every mount stacked on `dest` (bounded), never detaching.
fn unmount_all(sys: &dyn Sys, dest: Beneath<'_>, target: &Path) -> Result<(), SysError> {
    for _ in 0..MAX_STACKED {
        if !sys.mount_root(target)? {
            return Ok(());
        }
        sys.umount2_beneath(dest, MntFlags::empty())?;
    }
    if sys.mount_root(target)? {
        return Err(SysError::call(
            super::sys::Call::Umount,
            target,
            Errno::EBUSY,
        ));
    }
    Ok(())
}

/// What a cleanup did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cleaned {
    /// the binds unmounted
    pub unmounted: Vec<PathBuf>,
}

/// One entry of a `volume-subpaths` dir about to be unmounted (if it is a
/// bind) and removed: its path and the names on the way to it (pod
/// volume, container, index; fewer for an entry higher up that is not a
/// directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundBind {
    /// the entry
    pub path: PathBuf,
    /// the names below `volume-subpaths/` that lead to it, itself last
    pub names: Vec<String>,
}

impl FoundBind {
    /// (pod volume, container, index) when the entry sits where a bind
    /// goes and its name is an index.
    pub fn key_parts(&self) -> Option<(&str, &str, u32)> {
        match &self.names[..] {
            [volume, container, index] => Some((volume, container, index.parse().ok()?)),
            _ => None,
        }
    }
}

/// Runs around each entry's removal: given the entry and the removal,
/// runs the removal (once, or not at all) and returns its result. The
/// journaled cleanup writes its intent before and its outcome after.
pub type Around<'a> = dyn FnMut(&FoundBind, &mut dyn FnMut() -> Result<(), SubpathError>) -> Result<(), SubpathError>
    + 'a;

/// Removes with no journal around it.
pub fn plain(
    _: &FoundBind,
    remove: &mut dyn FnMut() -> Result<(), SubpathError>,
) -> Result<(), SubpathError> {
    remove()
}

/// Unmounts and removes `pods/<uid>/volume-subpaths/<volume>/` (every
/// container's binds of that volume), as the kubelet's `CleanSubPaths`
/// does before a TearDown. Absent: nothing to do. A bind that will not
/// unmount fails the whole (its volume must not be torn down under it).
pub fn clean_volume(
    sys: &dyn Sys,
    layout: &Layout,
    pod: &PodUid,
    volume: &str,
    around: &mut Around<'_>,
) -> Result<Cleaned, SubpathError> {
    let dir = layout.pod_volume_subpaths_dir(pod, volume);
    let done = Walk::over(sys, layout, around, &dir, vec![volume.to_owned()], 2)?;
    // the pod's volume-subpaths dir goes with its last volume
    let top = layout.pod_subpaths_dir(pod);
    remove_if_empty(sys, layout.root(), &top)?;
    Ok(done)
}

/// [`clean_volume`] for every volume of the pod (orphan cleanup of a
/// dead pod, where no volume is known any more).
pub fn clean_pod(
    sys: &dyn Sys,
    layout: &Layout,
    pod: &PodUid,
    around: &mut Around<'_>,
) -> Result<Cleaned, SubpathError> {
    Walk::over(
        sys,
        layout,
        around,
        &layout.pod_subpaths_dir(pod),
        Vec::new(),
        3,
    )
}

struct Walk<'a, 'b> {
    sys: &'a dyn Sys,
    root: &'a Path,
    around: &'a mut Around<'b>,
    done: Cleaned,
}

impl<'a, 'b> Walk<'a, 'b> {
    /// Cleans `dir` ([`Walk::tree`]) and says what it did.
    fn over(
        sys: &'a dyn Sys,
        layout: &'a Layout,
        around: &'a mut Around<'b>,
        dir: &Path,
        names: Vec<String>,
        depth: usize,
    ) -> Result<Cleaned, SubpathError> {
        let mut walk = Walk {
            sys,
            root: layout.root(),
            around,
            done: Cleaned::default(),
        };
        walk.tree(dir, names, depth)?;
        Ok(walk.done)
    }

    /// Removes `dir` (reached through `names`), whose binds sit `depth`
    /// levels down: each level's entries are walked (no symlink followed,
    /// no mount crossed), a bind unmounted then removed, the directories
    /// removed once empty.
    fn tree(&mut self, dir: &Path, names: Vec<String>, depth: usize) -> Result<(), SubpathError> {
        let (sys, root) = (self.sys, self.root);
        let at =
            Beneath::split(root, dir).ok_or_else(|| SubpathError::NotBelowRoot(dir.to_owned()))?;
        let entries = match sys.read_dir_beneath(root, at.rel) {
            Ok(e) => e,
            Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        for entry in entries {
            let path = dir.join(&entry.name);
            let mut below = names.clone();
            below.push(entry.name.to_string_lossy().into_owned());
            if depth > 1 && entry.kind == FileKind::Dir && !entry.mount_root {
                self.tree(&path, below, depth - 1)?;
                continue;
            }
            let found = FoundBind { path, names: below };
            let done = &mut self.done;
            (self.around)(&found, &mut || remove_bind(sys, root, &found.path, done))?;
        }
        // Left non-empty only by an entry we do not remove (reported): no
        // bind is left, so the volume's TearDown may go on.
        remove_if_empty(sys, root, dir)
    }
}

/// Unmounts the bind at `path` if it is one, then removes its entry (a
/// directory or the empty file a file subpath is bound onto).
fn remove_bind(
    sys: &dyn Sys,
    root: &Path,
    path: &Path,
    done: &mut Cleaned,
) -> Result<(), SubpathError> {
    let at =
        Beneath::split(root, path).ok_or_else(|| SubpathError::NotBelowRoot(path.to_owned()))?;
    if sys.mount_root(path)? {
        unmount_all(sys, at, path)?;
        done.unmounted.push(path.to_owned());
        // Crash point: the bind is unmounted, its entry not removed.
        crate::failpoint::hit("subpath.after_unmount");
    }
    let kind = sys.stat_beneath(at)?.kind;
    let removed = match kind {
        // an empty dir or the empty file a file bind was made onto; one
        // with contents is not ours to empty
        FileKind::Dir => sys.remove_beneath(root, at.rel, true),
        FileKind::File => sys.remove_beneath(root, at.rel, false),
        // never made by a subpath bind (a symlink is never followed)
        _ => Err(SysError::call(
            super::sys::Call::RemoveBeneath,
            path,
            Errno::EPERM,
        )),
    };
    if let Err(e) = removed {
        tracing::warn!(path = %path.display(), error = %e, "an entry in a volume-subpaths dir is not a bind's; left in place");
    }
    Ok(())
}

fn remove_if_empty(sys: &dyn Sys, root: &Path, dir: &Path) -> Result<(), SubpathError> {
    let at = Beneath::split(root, dir).ok_or_else(|| SubpathError::NotBelowRoot(dir.to_owned()))?;
    match sys.remove_beneath(root, at.rel, true) {
        Ok(()) => Ok(()),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(()),
        Err(e) if e.errno() == Some(Errno::ENOTEMPTY) => {
            tracing::warn!(dir = %dir.display(), "a volume-subpaths dir keeps entries that are not binds; left in place");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::MsFlags;

    fn uid() -> PodUid {
        PodUid::new("p1").unwrap()
    }

    fn at(pod: &PodUid, index: usize) -> SubpathAt<'_> {
        SubpathAt {
            pod,
            volume: "data",
            container: "app",
            index,
        }
    }

    #[test]
    fn a_socket_or_a_device_is_refused_and_nothing_is_made_for_it() {
        let sys = RecordingSys::new();
        let layout = Layout::new("/r");
        sys.add("/r", FileKind::Dir);
        sys.add("/v/s.sock", FileKind::Socket);
        sys.add("/v/tty", FileKind::CharDevice);
        sys.add("/v/sda", FileKind::BlockDevice);
        for (i, (name, kind)) in [
            ("s.sock", "socket"),
            ("tty", "character device"),
            ("sda", "block device"),
        ]
        .into_iter()
        .enumerate()
        {
            let e = bind(&sys, &layout, at(&uid(), i), Path::new("/v"), name).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("is a {kind}, which is never bound into a container")
            );
        }
        assert!(sys.mutations().is_empty(), "{:?}", sys.mutations());
    }

    #[test]
    fn a_missing_subpath_is_made_as_a_directory_then_bound() {
        let sys = RecordingSys::new();
        let layout = Layout::new("/r");
        sys.add("/r", FileKind::Dir);
        sys.add("/v", FileKind::Dir);
        let got = bind(&sys, &layout, at(&uid(), 0), Path::new("/v"), "logs/app").unwrap();
        assert_eq!(got, layout.subpath_target(&uid(), "data", "app", 0));
        assert!(sys.exists("/v/logs/app") && sys.exists(&got));
        assert_eq!(
            sys.stat(Path::new("/v/logs/app"), false).unwrap().kind,
            FileKind::Dir
        );
        assert!(sys.mounts().iter().any(|m| m.target == got));
    }

    #[test]
    fn cleaning_unmounts_binds_removes_their_entries_and_leaves_what_is_not_a_bind() {
        let sys = RecordingSys::new();
        let layout = Layout::new("/r");
        sys.add("/src", FileKind::Dir);
        let bound = layout.subpath_target(&uid(), "data", "app", 0);
        let file = layout.subpath_target(&uid(), "data", "app", 1);
        let odd = layout.subpath_target(&uid(), "data", "app", 2);
        sys.add(&bound, FileKind::Dir);
        sys.add(&file, FileKind::File);
        sys.add(&odd, FileKind::Symlink);
        sys.preset_mount(
            Some(Path::new("/src")),
            &bound,
            None,
            MsFlags::MS_BIND,
            None,
        )
        .unwrap();
        let done = clean_volume(&sys, &layout, &uid(), "data", &mut plain).unwrap();
        assert_eq!(done.unmounted, std::slice::from_ref(&bound));
        assert!(!sys.exists(&bound) && !sys.exists(&file));
        assert!(sys.exists(&odd), "a symlink is never followed nor removed");
        assert!(sys.mounts().iter().all(|m| m.target != bound));
        // nothing there: nothing to do
        let other = clean_pod(&sys, &layout, &PodUid::new("p2").unwrap(), &mut plain).unwrap();
        assert!(other.unmounted.is_empty());
    }
}
