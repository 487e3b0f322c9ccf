//! The atomic writer: a payload dir swapped in whole, so a reader never
//! sees a mix of old and new files (the kubelet's on-disk behaviour).
//!
//! In the volume dir:
//! - `..<UTC time>.<hash12>` — a payload dir, its files and nested dirs;
//!   the name ends with the first 12 hex digits of the payload's hash, so
//!   the dir `..data` points to says which payload is in place without
//!   reading a file;
//! - `..data` — a symlink to the current payload dir, replaced by renaming
//!   a fresh `..data_tmp` symlink over it (one `rename(2)`: a reader
//!   resolving `..data` gets the old dir or the new one);
//! - one symlink per top-level name of the payload, `<name>` →
//!   `..data/<name>`, so every user-visible path goes through `..data`.
//!
//! One write, step by step (each step a crash point):
//! 1. anything private (`..`-prefixed) but `..data` and the dir it points
//!    to is removed: a payload dir a crash left unswapped, a `..data_tmp`
//!    (rolling a torn write back);
//! 2. if the current dir's name ends with the wanted hash, nothing is
//!    written; else the new dir is written (`payload.after_dir`) and
//!    `..data` swapped to it (`payload.after_swap`);
//! 3. the visible links of new top-level names are made, those of names
//!    gone are removed (`payload.after_links`);
//! 4. the old payload dir is removed.
//!
//! A crash anywhere leaves `..data` pointing at a whole payload; running
//! the write again finishes it (new links, old dir gone) or, before the
//! swap, throws the half-written dir away and writes it again. A write
//! that fails in step 2's dir (`ENOSPC` on a file) removes that dir at
//! once and leaves the old payload in place.
//!
//! With an fsGroup every entry written gets that group and the kubelet's
//! read-only volume ownership bits (files `| 0440`, dirs `| 02550`).
//! The volume dir is opened once beneath the root (or handed over open by
//! the wrapped emptyDir's SetUp, which opened it to set its mode; a new one
//! is not listed either), and the payload dir once when made, both without
//! following a symlink; every entry is then
//! made, read or swapped through those handles ([`Sys`](crate::host::sys::Sys)'s `*_in` calls),
//! so nothing below the root dir is followed through a symlink and the
//! path is not walked again for each call. Rollback removals go by path
//! (`*_beneath`), as they are rare.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::host::remove::remove_dir_one_fs;
use crate::host::sys::{DirHandle, Errno, FileKind};
use crate::model::{PAYLOAD_DATA_LINK, PAYLOAD_DATA_TMP, PAYLOAD_PRIVATE_PREFIX};
use crate::plugins::mount_ops::beneath;
use crate::plugins::{Action, Op, PluginError};

use super::build::Payload;

/// Mode of a payload dir and its nested dirs (the kubelet's).
const PAYLOAD_DIR_MODE: u32 = 0o755;
/// Bits fsGroup ownership adds to a file of a read-only volume.
const GROUP_FILE_BITS: u32 = 0o440;
/// Bits fsGroup ownership adds to a dir: setgid, group read and search.
pub(crate) const GROUP_DIR_BITS: u32 = 0o2550;
/// Hex digits of the hash a payload dir's name ends with.
const NAME_HASH_LEN: usize = 12;

/// Where and how to write.
pub(crate) struct Target<'a> {
    /// the root dir (every path is reached beneath it)
    pub root: &'a Path,
    /// the volume dir
    pub dir: &'a Path,
    /// the pod's fsGroup
    pub fs_group: Option<u32>,
    /// the volume dir is new (just made, or a new tmpfs): empty, so not
    /// listed
    pub fresh: bool,
    /// the volume dir, when the SetUp holds it open already
    pub vol: Option<&'a DirHandle>,
}

/// Writes `payload` into the volume dir (see the module docs); returns
/// [`Action::AlreadyInPlace`] when the payload was there whole already.
pub(crate) fn write(
    op: &mut Op<'_>,
    t: &Target<'_>,
    payload: &Payload,
    now: SystemTime,
) -> Result<Action, PluginError> {
    let sys = op.sys;
    let path = |name: &str| t.dir.join(name);
    // The volume dir, opened once beneath the root without following any
    // symlink; every entry of it is then named through this handle (one
    // path walk for the whole write, not one per call). Opened without
    // `RESOLVE_NO_XDEV`: the volume's tmpfs is a mount below the root.
    let opened;
    let vol = match t.vol {
        Some(vol) => vol,
        None => {
            opened = op.look(sys.open_dir_beneath(beneath(op, t.root, t.dir)?))?;
            &opened
        }
    };
    let entries = match t.fresh {
        true => Vec::new(),
        false => op.look(sys.read_dir_in(vol))?,
    };
    // `..data` is read only when the listing shows one (not on a first write)
    let listed = |name: &str| entries.iter().any(|e| e.name == std::ffi::OsStr::new(name));
    let current = match listed(PAYLOAD_DATA_LINK) {
        true => current_in(op, vol)?,
        false => None,
    };

    // 1. roll back what a crash left beside the current payload
    for e in entries.iter().filter(|e| is_private(&e.name)) {
        if e.name == PAYLOAD_DATA_LINK || Some(&e.name) == current.as_ref() {
            continue;
        }
        remove_entry(op, t.root, &t.dir.join(&e.name), e.kind)?;
    }

    // 2. the new payload dir, and the swap
    let wanted = name_hash(&payload.version.hash);
    let named = current
        .as_ref()
        .is_some_and(|c| named_for(c, &payload.version.hash));
    // (a `..data` left dangling, its dir removed behind our back, is no
    // payload in place, nor is one whose files differ: see `holds`)
    let in_place = match current.as_ref().filter(|_| named) {
        Some(c) => holds(op, t, &t.dir.join(c), payload)?,
        None => false,
    };
    if !in_place {
        let name = format!("{PAYLOAD_PRIVATE_PREFIX}{}.{wanted}", utc_stamp(now));
        if let Err(e) = write_dir(op, t, vol, &name, payload) {
            // A dir not written whole (a full disk) is never swapped in,
            // and the next write's step 1 would remove it; removed now, it
            // gives back the space it took (the root's disk holds the
            // journal too). Its removal failing changes nothing: `e` is
            // what the caller must hear.
            let _ = remove_dir_one_fs(&t.dir.join(&name), sys);
            return Err(e);
        }
        crate::failpoint::hit("payload.after_dir");
        let tmp = Path::new(PAYLOAD_DATA_TMP);
        let r = sys.symlink_in(vol, tmp, Path::new(&name));
        op.act(r)?;
        group_in(op, t, vol, tmp)?;
        let r = sys.replace_in(vol, tmp.as_os_str(), PAYLOAD_DATA_LINK.as_ref());
        op.act(r)?;
        crate::failpoint::hit("payload.after_swap");
    }

    // 3. the visible names: new ones linked, gone ones unlinked
    let top: BTreeSet<&str> = payload
        .files
        .keys()
        .map(|p| p.split('/').next().unwrap_or(p))
        .collect();
    for name in &top {
        let link = path(name);
        let to = Path::new(PAYLOAD_DATA_LINK).join(name);
        // a name the listing did not show is made without a look (a first
        // write's every name)
        match listed(name).then(|| sys.read_link_in(vol, Path::new(name))) {
            None => {}
            Some(Ok(points)) if points == to => continue,
            // a link elsewhere: the name must go through `..data`
            Some(Ok(_)) => remove_entry(op, t.root, &link, FileKind::Symlink)?,
            Some(Err(e)) if e.errno() == Some(Errno::ENOENT) => {}
            Some(Err(e)) if e.errno() == Some(Errno::EINVAL) => {
                return Err(op.wrong_type(&link, "symlink"));
            }
            Some(Err(e)) => return Err(op.sys_err(e, false)),
        }
        let r = sys.symlink_in(vol, Path::new(name), &to);
        op.act(r)?;
        group_in(op, t, vol, Path::new(name))?;
    }
    for e in entries.iter().filter(|e| !is_private(&e.name)) {
        let gone = e.name.to_str().is_none_or(|n| !top.contains(n));
        if gone && e.kind == FileKind::Symlink {
            remove_entry(op, t.root, &t.dir.join(&e.name), e.kind)?;
        }
    }
    crate::failpoint::hit("payload.after_links");

    // 4. the old payload dir
    if let (false, Some(old)) = (in_place, &current) {
        remove_entry(op, t.root, &t.dir.join(old), FileKind::Dir)?;
    }
    Ok(if op.changed {
        Action::Performed
    } else {
        Action::AlreadyInPlace
    })
}

/// Whether the payload dir `at` holds every file of `payload` with its
/// bytes. The payload's files are written unsynced (nobody sees them before
/// the `..data` swap, and a process killed after the swap leaves them whole
/// in the page cache), so after a power cut a dir whose name says the right
/// hash may hold empty or partial files: its content, not its name, is
/// what counts, as the kubelet's writer compares the files it finds.
fn holds(
    op: &mut Op<'_>,
    t: &Target<'_>,
    at: &Path,
    payload: &Payload,
) -> Result<bool, PluginError> {
    let sys = op.sys;
    let st = sys.stat_beneath(beneath(op, t.root, at)?);
    if !st.is_ok_and(|st| st.kind == FileKind::Dir) {
        return Ok(false);
    }
    for (rel, file) in &payload.files {
        let got =
            sys.read_file_beneath(beneath(op, t.root, &at.join(rel))?, file.bytes.len() as u64);
        if got.as_deref().ok() != Some(&file.bytes[..]) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The name of the payload dir `..data` points to, `None` when there is
/// no `..data` (a first write), read through the volume dir's handle.
fn current_in(op: &Op<'_>, vol: &DirHandle) -> Result<Option<OsString>, PluginError> {
    match op.sys.read_link_in(vol, Path::new(PAYLOAD_DATA_LINK)) {
        Ok(to) => Ok(to.file_name().map(|n| n.to_owned())),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(None),
        Err(e) => Err(op.sys_err(e, false)),
    }
}

/// The part of `hash` a payload dir's name ends with.
fn name_hash(hash: &str) -> &str {
    hash.get(..NAME_HASH_LEN).unwrap_or(hash)
}

/// Whether the payload dir named `name` is the one written for the
/// payload of `hash`: a private name ending with `.<the hash's first 12
/// digits>`.
pub(crate) fn named_for(name: &std::ffi::OsStr, hash: &str) -> bool {
    name.to_str().is_some_and(|n| {
        n.starts_with(PAYLOAD_PRIVATE_PREFIX) && n.ends_with(&format!(".{}", name_hash(hash)))
    })
}

/// Whether `name` is one of the writer's own (`..`-prefixed; compared as
/// bytes, so a non-UTF-8 name is judged the same way).
fn is_private(name: &std::ffi::OsStr) -> bool {
    use std::os::unix::ffi::OsStrExt;
    name.as_bytes()
        .starts_with(PAYLOAD_PRIVATE_PREFIX.as_bytes())
}

/// Writes every file of `payload` under the new dir `name` of the volume
/// dir: the dir is made with its exact mode and opened once; its files and
/// nested dirs are made through that handle.
fn write_dir(
    op: &mut Op<'_>,
    t: &Target<'_>,
    vol: &DirHandle,
    name: &str,
    payload: &Payload,
) -> Result<(), PluginError> {
    let sys = op.sys;
    let r = sys.make_dir_in(vol, Path::new(name), PAYLOAD_DIR_MODE);
    let dir = op.act(r)?;
    // nested dirs made so far: the payload dir is new, so each is made
    // once, parents first, and none can be there before
    let mut nested: BTreeSet<PathBuf> = BTreeSet::new();
    for (rel, file) in &payload.files {
        let rel = Path::new(rel);
        let ups: Vec<&Path> = rel
            .ancestors()
            .skip(1)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        for up in ups.into_iter().rev() {
            if nested.insert(up.to_owned()) {
                let r = sys.make_dir_in(&dir, up, PAYLOAD_DIR_MODE).map(drop);
                op.act(r)?;
            }
        }
        let mode = match t.fs_group {
            Some(_) => file.mode | GROUP_FILE_BITS,
            None => file.mode,
        };
        // unsynced: see `holds`
        let r = sys.create_file_in(&dir, rel, &file.bytes, mode);
        op.act(r)?;
        group_in(op, t, &dir, rel)?;
    }
    if t.fs_group.is_some() {
        // the group, then the bits (set after the group, as a chgrp may
        // clear setgid); without an fsGroup the mode was exact from the
        // mkdir
        let at = dir.path();
        for d in std::iter::once(at.to_owned()).chain(nested.iter().map(|n| at.join(n))) {
            group(op, t, &d, Some(PAYLOAD_DIR_MODE | GROUP_DIR_BITS))?;
        }
    }
    Ok(())
}

/// With an fsGroup, gives the entry `rel` of `dir` the group.
fn group_in(
    op: &mut Op<'_>,
    t: &Target<'_>,
    dir: &DirHandle,
    rel: &Path,
) -> Result<(), PluginError> {
    if let Some(gid) = t.fs_group {
        let r = op.sys.chgrp_in(dir, rel, gid);
        op.act(r)?;
    }
    Ok(())
}

/// With an fsGroup, gives `path` the group (and a dir `dir_mode`); with
/// none, only sets a dir's mode exactly (the umask may have cut it).
pub(crate) fn group(
    op: &mut Op<'_>,
    t: &Target<'_>,
    path: &Path,
    dir_mode: Option<u32>,
) -> Result<(), PluginError> {
    let at = beneath(op, t.root, path)?;
    if let Some(gid) = t.fs_group {
        let r = op.sys.chgrp_beneath(at, gid);
        op.act(r)?;
    }
    if let Some(mode) = dir_mode {
        let r = op.sys.chmod_dir_beneath(at, mode);
        op.act(r)?;
    }
    Ok(())
}

/// Removes a link, a file or a whole dir (on its own filesystem, never
/// through a symlink); already gone is fine.
fn remove_entry(
    op: &mut Op<'_>,
    root: &Path,
    path: &Path,
    kind: FileKind,
) -> Result<(), PluginError> {
    let at = beneath(op, root, path)?;
    let (parent, name): (PathBuf, &Path) = match (at.parent(), at.rel.file_name()) {
        (Some(p), Some(n)) => (p.full(), Path::new(n)),
        _ => return Err(op.wrong_type(path, "entry of a volume dir")),
    };
    if kind == FileKind::Dir {
        let r = remove_dir_one_fs(path, op.sys).map(drop);
        return op.act(r);
    }
    let r = op.sys.remove_beneath(&parent, name, false);
    op.act_or(r, Errno::ENOENT)
}

/// `YYYY_MM_DD_HH_MM_SS.nnnnnnnnn` in UTC, the kubelet's stamp.
fn utc_stamp(now: SystemTime) -> String {
    let d = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let (y, m, day, h, mi, s) = crate::util::time::utc(d.as_secs());
    format!(
        "{y:04}_{m:02}_{day:02}_{h:02}_{mi:02}_{s:02}.{:09}",
        d.subsec_nanos()
    )
}

#[cfg(test)]
#[path = "atomic_tests.rs"]
mod tests;
