//! The raw block steps every block mapper shares (docs/kubelet.md, "Raw
//! block volumes"): the device bound on one file per pod in the volume's
//! global map dir, and the pod's symlink to the device. The kubelet's
//! volume path handler does the same with a bind mount and a symlink.
//!
//! The hold ([`hold_device`], [`release_device`]): while a pod maps a
//! device, a loop device backed by the pod's file keeps the device open,
//! so it cannot silently vanish and come back under the same name with
//! other data behind it (a container runtime would not notice). The
//! kubelet attaches it after the pod's bind and link and detaches it
//! before unmapping them (its `MapBlockVolume` / `UnmapBlockVolume`); a
//! hold already gone on the way out is only a warning there, and here.
//!
//! *Invariants:* every path is reached beneath the root, following no
//! symlink; the device path (the operator's, outside the root) is the
//! only path followed. Nothing but our own symlink and our own empty map
//! file is ever removed, and the file only once nothing is mounted on it.
//! One pod's file is held by at most one loop device: an existing one is
//! reused, never a second attached; every one found is detached.

use std::path::Path;

use crate::host::sys::{Errno, FileKind, FileStat, MsFlags, SysError};
use crate::plugins::mount_ops::{beneath, unmount_all};
use crate::plugins::{Op, PluginError};

/// Mode of the map dirs, as the kubelet makes them.
const MAP_DIR_MODE: u32 = 0o750;
/// Mode of the file a device is bound on (the bind shows the device's own).
const MAP_FILE_MODE: u32 = 0o640;

fn missing(r: &Result<FileStat, SysError>) -> bool {
    matches!(r, Err(e) if e.errno() == Some(Errno::ENOENT))
}

/// The device a block volume maps: `path`, through symlinks
/// (`/dev/disk/by-id/…`), must be a block device.
pub(crate) fn device_of(op: &Op<'_>, path: &Path) -> Result<FileStat, PluginError> {
    let st = op.look(op.sys.stat(path, true))?;
    if st.kind != FileKind::BlockDevice {
        return Err(op.wrong_type(path, "block device"));
    }
    Ok(st)
}

/// Makes the global map dir `dir` (and its parents) beneath `root`.
pub(crate) fn make_map_dir(op: &mut Op<'_>, root: &Path, dir: &Path) -> Result<(), PluginError> {
    let at = beneath(op, root, dir)?;
    match op.sys.stat_beneath(at) {
        Ok(st) if st.kind == FileKind::Dir => Ok(()),
        Ok(_) => Err(op.wrong_type(dir, "directory")),
        Err(_) => {
            let r = op.sys.mkdirs_beneath(at, MAP_DIR_MODE);
            op.act(r)
        }
    }
}

/// Removes the global map dir `dir` once no pod file is left in it (a
/// missing dir is done); a dir still holding a pod's file fails, final.
pub(crate) fn remove_map_dir(op: &mut Op<'_>, root: &Path, dir: &Path) -> Result<(), PluginError> {
    let at = beneath(op, root, dir)?;
    let r = op.sys.remove_beneath(at.base, at.rel, true);
    op.act_or(r, Errno::ENOENT)
}

/// Binds the device `device` (a block device: `dev`) on the file `file`
/// beneath `root`, made empty first when missing. A file already showing
/// that device is in place; a different device bound there is unmounted
/// and the right one bound (never adopted).
pub(crate) fn bind_device_file(
    op: &mut Op<'_>,
    root: &Path,
    device: &Path,
    dev: &FileStat,
    file: &Path,
) -> Result<(), PluginError> {
    let at = beneath(op, root, file)?;
    let found = op.sys.stat_beneath(at);
    if let Ok(st) = &found {
        match st.kind {
            FileKind::BlockDevice if st.rdev == dev.rdev => return Ok(()),
            FileKind::BlockDevice => {
                unmount_all(op, at)?;
            }
            FileKind::File => {}
            _ => return Err(op.wrong_type(file, "regular file or block device")),
        }
    } else if missing(&found) {
        // the map dir too, as the kubelet's map makes it at every call
        if let Some(parent) = at.parent() {
            let r = op.sys.mkdirs_beneath(parent, MAP_DIR_MODE);
            op.act(r)?;
        }
        let r = op.sys.create_file_beneath(at, b"", MAP_FILE_MODE);
        op.act_or(r, Errno::EEXIST)?;
    } else {
        op.look(found)?;
    }
    let r = op
        .sys
        .mount_beneath(Some(device), at, None, MsFlags::MS_BIND, None);
    op.act(r)
}

/// Unbinds and removes the pod's file `file`: everything mounted on it
/// is unmounted, then the (empty) file removed; a missing file is done.
pub(crate) fn unbind_device_file(
    op: &mut Op<'_>,
    root: &Path,
    file: &Path,
) -> Result<(), PluginError> {
    let at = beneath(op, root, file)?;
    let found = op.sys.stat_beneath(at);
    if missing(&found) {
        return Ok(());
    }
    let st = op.look(found)?;
    if !matches!(st.kind, FileKind::BlockDevice | FileKind::File) {
        return Err(op.wrong_type(file, "regular file or block device"));
    }
    unmount_all(op, at)?;
    let r = op.sys.remove_beneath(at.base, at.rel, false);
    op.act_or(r, Errno::ENOENT)
}

/// Makes the pod's symlink `link` (beneath `root`) point to `device`; a
/// symlink elsewhere is replaced, as the kubelet replaces a stale one;
/// anything but a symlink there is refused (never removed).
pub(crate) fn link_pod_device(
    op: &mut Op<'_>,
    root: &Path,
    device: &Path,
    link: &Path,
) -> Result<(), PluginError> {
    let at = beneath(op, root, link)?;
    let found = op.sys.stat_beneath(at);
    match &found {
        Ok(st) if st.kind == FileKind::Symlink => {
            if op.look(op.sys.read_link_beneath(at))? == device {
                return Ok(());
            }
            let r = op.sys.remove_beneath(at.base, at.rel, false);
            op.act_or(r, Errno::ENOENT)?;
        }
        Ok(_) => return Err(op.wrong_type(link, "symlink")),
        Err(_) if missing(&found) => {
            if let Some(parent) = at.parent() {
                let r = op.sys.mkdirs_beneath(parent, MAP_DIR_MODE);
                op.act(r)?;
            }
        }
        Err(_) => {
            op.look(found)?;
        }
    }
    let r = op.sys.symlink_beneath(at, device);
    op.act(r)
}

/// Removes the pod's symlink `link`; a missing one is done, anything but
/// a symlink is refused.
pub(crate) fn unlink_pod_device(
    op: &mut Op<'_>,
    root: &Path,
    link: &Path,
) -> Result<(), PluginError> {
    let at = beneath(op, root, link)?;
    let found = op.sys.stat_beneath(at);
    if missing(&found) {
        return Ok(());
    }
    if op.look(found)?.kind != FileKind::Symlink {
        return Err(op.wrong_type(link, "symlink"));
    }
    let r = op.sys.remove_beneath(at.base, at.rel, false);
    op.act_or(r, Errno::ENOENT)
}

/// Holds the device bound on the pod's file `file` (beneath `root`) with
/// a loop device backed by that file; one already backed by it is the
/// hold (a step re-run, or a restart, attaches no second one).
pub(crate) fn hold_device(op: &mut Op<'_>, root: &Path, file: &Path) -> Result<(), PluginError> {
    let at = beneath(op, root, file)?;
    if !op.look(op.sys.loop_find_backing(&at.full()))?.is_empty() {
        return Ok(());
    }
    let r = op.sys.loop_attach_beneath(at);
    op.act(r).map(drop)
}

/// Releases the hold on the pod's file `file`: every loop device backed
/// by it is detached (one detached meanwhile is done). None found is a
/// warning, not a failure, as in the kubelet: the hold may have been
/// released by a run cut short, or never taken (a map made elsewhere).
pub(crate) fn release_device(op: &mut Op<'_>, root: &Path, file: &Path) -> Result<(), PluginError> {
    let at = beneath(op, root, file)?;
    let held = op.look(op.sys.loop_find_backing(&at.full()))?;
    if held.is_empty() {
        tracing::warn!(
            volume = %op.volume,
            file = %file.display(),
            "no loop device holds the mapped device open; nothing to detach"
        );
    }
    for dev in held {
        let r = op.sys.loop_detach(&dev);
        op.act_or(r, Errno::ENXIO)?;
    }
    Ok(())
}
