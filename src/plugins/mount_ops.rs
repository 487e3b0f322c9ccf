//! Mount steps the plugins share: option splitting, "is the intended mount
//! already there", replace-never-adopt, and unmounting a target completely.

use std::path::{Path, PathBuf};

use crate::host::mountinfo::MountInfo;
use crate::host::sys::{Beneath, Errno, FileKind, MntFlags, MsFlags, mkdir_all_beneath};
use crate::model::SeLinuxContext;
use crate::plugins::{Action, Certainty, Op, PluginError};

/// How many stacked mounts a target may have before we give up unmounting.
pub(crate) const MAX_UNMOUNTS: usize = 8;

/// Mode of directories volumed creates for mount targets (the kubelet's 0750).
pub(crate) const TARGET_DIR_MODE: u32 = 0o750;

/// Splits mount options into per-mount flags and the data string's options.
/// `rw`, `defaults` and `bind` are implied and dropped.
pub(crate) fn split_options(opts: &[String]) -> (MsFlags, Vec<String>) {
    let mut flags = MsFlags::empty();
    let mut data = Vec::new();
    for o in opts {
        let f = match o.as_str() {
            "ro" => MsFlags::MS_RDONLY,
            "nosuid" => MsFlags::MS_NOSUID,
            "nodev" => MsFlags::MS_NODEV,
            "noexec" => MsFlags::MS_NOEXEC,
            "noatime" => MsFlags::MS_NOATIME,
            "nodiratime" => MsFlags::MS_NODIRATIME,
            "relatime" => MsFlags::MS_RELATIME,
            "strictatime" => MsFlags::MS_STRICTATIME,
            "sync" => MsFlags::MS_SYNCHRONOUS,
            "dirsync" => MsFlags::MS_DIRSYNC,
            "rw" | "defaults" | "bind" => continue,
            other => {
                data.push(other.to_owned());
                continue;
            }
        };
        flags |= f;
    }
    (flags, data)
}

/// The data string: the options plus `context="…"` when a label is given.
pub(crate) fn data_string(opts: &[String], selinux: Option<&SeLinuxContext>) -> Option<String> {
    let mut all: Vec<String> = opts.to_vec();
    all.extend(selinux.map(SeLinuxContext::mount_option));
    (!all.is_empty()).then(|| all.join(","))
}

/// Unmounts the top mount at `at` without following symlinks, on the way
/// or at the target. `EINVAL` counts as done only when nothing is mounted
/// there any more.
fn umount_once(op: &mut Op<'_>, at: Beneath<'_>) -> Result<(), PluginError> {
    match op.sys.umount2_beneath(at, MntFlags::UMOUNT_NOFOLLOW) {
        Err(e) if e.errno() == Some(Errno::EINVAL) => {
            if mounted_at(op, at)? {
                Err(op.sys_err(e, true))
            } else {
                Ok(())
            }
        }
        r => op.act(r),
    }
}

/// Whether something is mounted at `at`, asked of that one path (not the
/// table: a mass teardown stays linear); a path gone is nothing mounted.
fn mounted_at(op: &Op<'_>, at: Beneath<'_>) -> Result<bool, PluginError> {
    match op.sys.mount_root_beneath(at) {
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
        r => op.look(r),
    }
}

/// Unmounts everything stacked at `at`; true when something was unmounted.
pub(crate) fn unmount_all(op: &mut Op<'_>, at: Beneath<'_>) -> Result<bool, PluginError> {
    let target = &at.full();
    let mut any = false;
    for _ in 0..MAX_UNMOUNTS {
        if !mounted_at(op, at)? {
            return Ok(any);
        }
        umount_once(op, at)?;
        any = true;
    }
    Err(still_mounted(op, target))
}

fn still_mounted(op: &Op<'_>, target: &Path) -> PluginError {
    PluginError::StillMounted {
        op: op.op,
        volume: op.volume.clone(),
        path: target.to_owned(),
        tries: MAX_UNMOUNTS,
        certainty: if op.changed {
            Certainty::Uncertain
        } else {
            Certainty::Final
        },
    }
}

/// `target` as a path beneath the root dir, to be reached without
/// following symlinks ([`Beneath`]); a target elsewhere is refused.
pub(crate) fn beneath<'p>(
    op: &Op<'_>,
    root: &'p Path,
    target: &'p Path,
) -> Result<Beneath<'p>, PluginError> {
    Beneath::split(root, target).ok_or_else(|| PluginError::OutsideRoot {
        op: op.op,
        volume: op.volume.clone(),
        path: target.to_owned(),
        root: root.to_owned(),
    })
}

/// Idempotent by identity (docs/kubelet.md, "The reconciler"): if the
/// visible mount at `target` is the intended one
/// (`wanted`), nothing is mounted and it is returned; a different mount is
/// unmounted (repeatedly, for stacks) and then `mount` runs. Never adopts.
///
/// The target must lie beneath `root`; its directories are made, and
/// `mount` is given the target to mount on, without following any symlink
/// below `root` ([`Beneath`]), so the volume lands at the path the mount
/// table is searched for and never outside the pod dir.
pub(crate) fn ensure_mounted(
    op: &mut Op<'_>,
    root: &Path,
    target: &Path,
    wanted: &dyn Fn(&MountInfo) -> bool,
    mount: &mut dyn FnMut(&mut Op<'_>, Beneath<'_>) -> Result<(), PluginError>,
) -> Result<(Action, Option<MountInfo>), PluginError> {
    let at = beneath(op, root, target)?;
    // It is made beneath the root, so a symlink on the way fails it (ELOOP).
    let found = op.sys.stat_beneath(at);
    ensure_mounted_found(op, at, found, wanted, mount)
}

/// [`ensure_mounted`] of `at` after its `lstat` (`found`), for a caller
/// that made it through a handle.
pub(crate) fn ensure_mounted_found(
    op: &mut Op<'_>,
    at: Beneath<'_>,
    found: Result<crate::host::sys::FileStat, crate::host::sys::SysError>,
    wanted: &dyn Fn(&MountInfo) -> bool,
    mount: &mut dyn FnMut(&mut Op<'_>, Beneath<'_>) -> Result<(), PluginError>,
) -> Result<(Action, Option<MountInfo>), PluginError> {
    let target = &at.full();
    // One `lstat` of the target answers three questions. Only a definite
    // ENOENT says it is missing (any other error takes the careful path).
    if matches!(&found, Err(e) if e.errno() == Some(Errno::ENOENT)) {
        // Nothing can be mounted on a path that does not exist, so the mount
        // table (O(mounts) to read: O(n²) over a mass start) is not needed.
        op.look(mkdir_all_beneath(op.sys, at, TARGET_DIR_MODE))?;
        mount(op, at)?;
        return Ok((Action::Performed, None));
    }
    // A symlink at the target is never mounted through: the volume would
    // land wherever it points, outside the pod dir (one on the way is
    // refused by the mount itself, `ELOOP`).
    if matches!(&found, Ok(st) if st.kind == FileKind::Symlink) {
        return Err(op.wrong_type(target, "directory (not a symlink)"));
    }
    // whether a directory is there now (asked again after an unmount,
    // which shows what was beneath)
    let mut is_dir = matches!(found, Ok(st) if st.kind == FileKind::Dir);
    let mut replaced = false;
    for _ in 0..=MAX_UNMOUNTS {
        let table = op.look(op.sys.read_mountinfo())?;
        match table.top_at(target) {
            None => {
                // Creating the directory does not change what is mounted.
                // A directory there (the usual case) needs nothing;
                // anything else goes through `mkdir_all`, which refuses
                // what is not a directory.
                if !is_dir {
                    op.look(mkdir_all_beneath(op.sys, at, TARGET_DIR_MODE))?;
                }
                mount(op, at)?;
                let action = if replaced {
                    Action::Replaced
                } else {
                    Action::Performed
                };
                return Ok((action, None));
            }
            Some(m) if wanted(m) => {
                let action = if replaced {
                    Action::Replaced
                } else {
                    Action::AlreadyInPlace
                };
                return Ok((action, Some(m.clone())));
            }
            Some(_) => {
                umount_once(op, at)?;
                replaced = true;
                is_dir = matches!(op.sys.stat_beneath(at), Ok(st) if st.kind == FileKind::Dir);
            }
        }
    }
    Err(still_mounted(op, target))
}

/// Whether anything is at `path` (not following a last symlink). Only a
/// definite `ENOENT` says no; any other error says "maybe", so the caller
/// takes the careful path.
pub(crate) fn target_exists(op: &Op<'_>, path: &Path) -> bool {
    !matches!(op.sys.stat(path, false), Err(e) if e.errno() == Some(Errno::ENOENT))
}

/// Removes an unmounted target directory, reached beneath the root dir (a
/// symlink on the way fails with `ELOOP` rather than removing an empty dir
/// elsewhere). Missing is fine; one that is not empty is left and returned
/// for the caller to report.
fn remove_mount_dir(op: &mut Op<'_>, at: Beneath<'_>) -> Result<Vec<PathBuf>, PluginError> {
    match op.sys.stat_beneath(at) {
        Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(Vec::new()),
        r => {
            op.look(r)?;
        }
    }
    match op.sys.rmdir_beneath(at) {
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(Vec::new()),
        Err(e) if e.errno() == Some(Errno::ENOTEMPTY) => Ok(vec![at.full()]),
        r => op.act(r).map(|()| Vec::new()),
    }
}

/// A tmpfs `size=` value in bytes (`1048576k`, `64m`, `1g`, `4096`).
pub(crate) fn parse_size(v: &str) -> Option<u64> {
    let (num, mult) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 1u64 << 10),
        'm' | 'M' => (&v[..v.len() - 1], 1 << 20),
        'g' | 'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// tmpfs rounds its size up to whole pages.
pub(crate) fn page_round(bytes: u64) -> u64 {
    bytes.div_ceil(4096).saturating_mul(4096)
}

/// Unmounts everything stacked at `target`, then removes the empty mount
/// dir (never anything inside a mount); returns what could not go. The
/// target must lie beneath `root`, checked before anything is unmounted.
pub(crate) fn unmount_and_remove_dir(
    op: &mut Op<'_>,
    root: &Path,
    target: &Path,
) -> Result<Vec<PathBuf>, PluginError> {
    let at = beneath(op, root, target)?;
    unmount_all(op, at)?;
    remove_mount_dir(op, at)
}

/// [`unmount_and_remove_dir`] as a finished operation.
pub(crate) fn unmount_target(
    op: &mut Op<'_>,
    root: &Path,
    target: &Path,
) -> crate::plugins::PluginResult {
    let left_behind = unmount_and_remove_dir(op, root, target)?;
    Ok(op.finished(left_behind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_split_into_flags_and_data() {
        let o: Vec<String> = ["ro", "nosuid", "discard", "bind", "size=10"]
            .map(String::from)
            .into();
        let (f, d) = split_options(&o);
        assert_eq!(f, MsFlags::MS_RDONLY | MsFlags::MS_NOSUID);
        assert_eq!(d, vec!["discard", "size=10"]);
        let ctx = SeLinuxContext::parse("system_u:object_r:container_file_t:s0:c5,c1").unwrap();
        assert_eq!(
            data_string(&d, Some(&ctx)).as_deref(),
            Some("discard,size=10,context=\"system_u:object_r:container_file_t:s0:c1,c5\"")
        );
        assert_eq!(data_string(&[], None), None);
    }

    #[test]
    fn tmpfs_sizes_parse_and_round_like_the_kernel() {
        assert_eq!(parse_size("1048576k"), Some(1 << 30));
        assert_eq!(parse_size("64m"), Some(64 << 20));
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("x"), None);
        assert_eq!(page_round(1), 4096);
        assert_eq!(page_round(8192), 8192);
    }
}
