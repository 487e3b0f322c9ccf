//! The recording fake's view of its tree: the mount table as text, a
//! path's stat, and the beneath-the-root checks its `*_beneath` calls make.

use std::path::Path;

use crate::host::fake_host::State;
use crate::host::mountinfo::escape;
use crate::host::sys::{Beneath, Call, Errno, FileKind, FileStat, SysError};
use crate::model::DevId;

/// The fake mounts as mountinfo text, under a root mount of the disk.
pub(super) fn mountinfo_text(st: &State) -> String {
    let mut text = String::from("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n");
    for m in &st.mounts {
        let parent = m
            .target
            .ancestors()
            .skip(1)
            .find_map(|a| {
                st.mounts
                    .iter()
                    .rev()
                    .find(|p| p.target == a && p.id < m.id)
            })
            .map_or(1, |p| p.id);
        let path = |p: &Path| {
            String::from_utf8_lossy(&escape(p.as_os_str().as_encoded_bytes())).into_owned()
        };
        let shared = if m.shared {
            format!(" shared:{}", m.id)
        } else {
            String::new()
        };
        text.push_str(&format!(
            "{} {} {} {} {} {}{shared} - {} {} {}\n",
            m.id,
            parent,
            m.dev,
            path(&m.root),
            path(&m.target),
            if m.read_only { "ro" } else { "rw" },
            m.fstype,
            m.source,
            m.super_options
        ));
    }
    text
}

/// What the fake's `statx` reports of `path`.
pub(super) fn stat_of(st: &State, path: &Path) -> Result<FileStat, SysError> {
    let kind = *st
        .files
        .get(path)
        .ok_or_else(|| SysError::call(Call::Stat, path, Errno::ENOENT))?;
    let rdev = st
        .devices
        .get(path)
        .copied()
        .unwrap_or(DevId { major: 0, minor: 0 });
    // a device node bound on a file shows the device, as the kernel's bind
    // of a raw block device on a pod's map file does
    let bound = st.top(path).and_then(|m| st.devices.get(&m.root));
    let (kind, rdev) = match bound {
        Some(dev) if kind == FileKind::File => (FileKind::BlockDevice, *dev),
        _ => (kind, rdev),
    };
    Ok(FileStat {
        kind,
        dev: st.identity_of(path).0,
        rdev,
        perm: 0o755,
        ino: 0,
        ctime_ns: 0,
    })
}

/// `ELOOP` (naming `named`) when a directory above `path` is a symlink in
/// the fake tree, as the real calls that resolve with `RESOLVE_NO_SYMLINKS`
/// from the start of the path refuse it.
pub(super) fn no_symlink_above(
    st: &State,
    call: Call,
    path: &Path,
    named: &Path,
) -> Result<(), SysError> {
    match path
        .ancestors()
        .skip(1)
        .any(|a| st.files.get(a) == Some(&FileKind::Symlink))
    {
        true => Err(SysError::call(call, named, Errno::ELOOP)),
        false => Ok(()),
    }
}

/// What opening `at` itself `O_PATH` with `openat2(RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS)` would say about symlinks: its parent's answer, and
/// `ELOOP` for a symlink at `at` (errors name `named`).
pub(super) fn open_path_beneath(
    st: &State,
    call: Call,
    at: Beneath<'_>,
    named: &Path,
) -> Result<(), SysError> {
    parent_beneath(st, call, at, named)?;
    match st.files.get(&at.full()) == Some(&FileKind::Symlink) {
        true => Err(SysError::call(call, named, Errno::ELOOP)),
        false => Ok(()),
    }
}

/// What opening `at`'s parent with `openat2(RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS)` would say (mounts may be crossed), the error
/// naming `path` as the real calls do.
pub(super) fn parent_beneath(
    st: &State,
    call: Call,
    at: Beneath<'_>,
    path: &Path,
) -> Result<(), SysError> {
    st.walks.borrow_mut().push(at.base.to_owned());
    let Some(parent) = at.parent() else {
        return Ok(());
    };
    st.check_beneath(call, parent.base, parent.rel, true)
        .map_err(|e| match e.errno() {
            Some(errno) => SysError::call(call, path, errno),
            None => e,
        })
}
