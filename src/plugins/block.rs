//! The raw block steps every block mapper shares (docs/kubelet.md, "Raw
//! block volumes"): the device bound on one file per pod in the volume's
//! global map dir, and the pod's symlink to the device. The kubelet's
//! volume path handler does the same with a bind mount and a symlink.
//!
//! *Invariants:* every path is reached beneath the root, following no
//! symlink; the device path (the operator's, outside the root) is the
//! only path followed. Nothing but our own symlink and our own empty map
//! file is ever removed, and the file only once nothing is mounted on it.

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
