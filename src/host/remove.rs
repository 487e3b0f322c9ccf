//! Safe removal (docs/layout.md, "Removal rules"). A symlink swapped in
//! between a check and the removal must redirect nothing: the lesson of
//! CVE-2021-25741.
//!
//! [`remove_dir_one_fs`] is `rm -rf --one-file-system` made strict:
//! - it never deletes a directory that is, or contains, a mount point: every
//!   entry is checked against the mount table *and* by `statx`
//!   `STATX_ATTR_MOUNT_ROOT` (which, unlike the kubelet's `st_dev` heuristic,
//!   catches a bind mount from the same filesystem); a mount root is left
//!   alone with everything under it, and so are its ancestors;
//! - it never follows a symlink: a symlink is unlinked as a link; the walk
//!   starts from the parent of the directory being removed, opened with no
//!   symlink anywhere in its path, and every directory from there down
//!   (the removed one included) is opened beneath it with
//!   `RESOLVE_NO_SYMLINKS`, so a symlink swapped in during the walk fails
//!   the call instead of leading out of the tree;
//! - it never crosses into another filesystem: those directories are opened
//!   with `RESOLVE_NO_XDEV`, so even a mount that appeared after the check,
//!   on the removed directory itself or below it, is refused by the kernel
//!   (`EXDEV`) and kept.
//!
//! What is left behind is returned ([`Removal::kept_mounts`]), not hidden:
//! the caller reports it.
//!
//! [`rename_for_deletion`] and [`finish_pending_deletions`] implement the
//! emptyDir rule: rename the directory to `<name>.deleting~<seq>` first (so a
//! re-added pod never sees a half-emptied dir), delete after, and let a
//! restart finish any deletion a crash cut short.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::host::mountinfo::MountTable;
use crate::host::sys::{Beneath, Call, Errno, FileKind, Sys, SysError};

/// The marker between a directory's name and its deletion sequence number.
pub const DELETING_INFIX: &str = ".deleting~";

/// What [`remove_dir_one_fs`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    /// how many entries (files, links, directories, the top included) were removed
    pub removed: usize,
    /// mount points found and left alone, with everything under them and their ancestors
    pub kept_mounts: Vec<PathBuf>,
}

impl Removal {
    /// Whether the whole tree is gone.
    pub fn complete(&self) -> bool {
        self.kept_mounts.is_empty()
    }
}

/// Removes `path` and everything under it on its own filesystem (see the
/// module docs). A missing `path` is success with nothing removed; a
/// symlink or other non-directory at `path` is unlinked itself.
pub fn remove_dir_one_fs(path: &Path, sys: &dyn Sys) -> Result<Removal, SysError> {
    let mut out = Removal::default();
    let kind = match sys.stat(path, false) {
        Ok(st) => st.kind,
        Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(out),
        Err(e) => return Err(e),
    };
    let table = sys.read_mountinfo()?;
    if table.is_mount_point(path) || sys.mount_root(path)? {
        out.kept_mounts.push(path.to_owned());
        return Ok(out);
    }
    if kind != FileKind::Dir {
        ignore_enoent(sys.unlink(path))?;
        out.removed += 1;
        return Ok(out);
    }
    // Walked from its parent, so the kernel also refuses (EXDEV) a mount
    // that lands on `path` itself after the check above.
    let (base, rel) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => (parent, Path::new(name)),
        _ => (path, Path::new("")),
    };
    if walk(sys, &table, base, rel, &mut out)? {
        ignore_enoent(sys.rmdir(path))?;
        out.removed += 1;
    }
    Ok(out)
}

/// Empties `base/rel`; true when everything in it was removed.
fn walk(
    sys: &dyn Sys,
    table: &MountTable,
    base: &Path,
    rel: &Path,
    out: &mut Removal,
) -> Result<bool, SysError> {
    let entries = match sys.read_dir_beneath(base, rel) {
        Ok(entries) => entries,
        // A mount appeared on the way after we looked: the kernel refused to cross it.
        Err(e) if e.errno() == Some(Errno::EXDEV) => {
            out.kept_mounts.push(base.join(rel));
            return Ok(false);
        }
        Err(e) => return Err(e),
    };
    let mut all = true;
    for entry in entries {
        let child = rel.join(&entry.name);
        let full = base.join(&child);
        if entry.mount_root || table.is_mount_point(&full) {
            out.kept_mounts.push(full);
            all = false;
            continue;
        }
        let dir = entry.kind == FileKind::Dir;
        if dir && !walk(sys, table, base, &child, out)? {
            all = false;
            continue;
        }
        match sys.remove_beneath(base, &child, dir) {
            Ok(()) => out.removed += 1,
            Err(e) if e.errno() == Some(Errno::ENOENT) => {}
            // Mounted on since we listed it.
            Err(e) if e.errno() == Some(Errno::EBUSY) => {
                out.kept_mounts.push(full);
                all = false;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(all)
}

fn ignore_enoent(r: Result<(), SysError>) -> Result<(), SysError> {
    match r {
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(()),
        other => other,
    }
}

/// The name `dir` is renamed to before deletion: `<name>.deleting~<seq>`.
pub fn deletion_name(dir: &Path, seq: u64) -> Option<PathBuf> {
    let mut name = OsString::from(dir.file_name()?);
    name.push(format!("{DELETING_INFIX}{seq}"));
    Some(dir.with_file_name(name))
}

/// Whether a directory entry name is one [`rename_for_deletion`] made.
pub fn is_pending_deletion(name: &OsStr) -> bool {
    let bytes = name.as_encoded_bytes();
    let infix = DELETING_INFIX.as_bytes();
    bytes
        .windows(infix.len())
        .rposition(|w| w == infix)
        .is_some_and(|i| {
            let seq = &bytes[i + infix.len()..];
            i > 0 && !seq.is_empty() && seq.iter().all(u8::is_ascii_digit)
        })
}

/// Renames `dir` to `<name>.deleting~<seq>` (never replacing anything there,
/// never through a symlink below its base) and returns the new path.
pub fn rename_for_deletion(dir: Beneath<'_>, seq: u64, sys: &dyn Sys) -> Result<PathBuf, SysError> {
    let from = dir.full();
    let to = deletion_name(&from, seq)
        .ok_or_else(|| SysError::call(Call::Rename, &from, Errno::EINVAL))?;
    let name = to.file_name().unwrap_or_default();
    sys.rename_beneath(dir, name)?;
    Ok(to)
}

/// Finishes deletions a crash cut short: removes every `*.deleting~<seq>`
/// entry of `parent` with [`remove_dir_one_fs`]. `parent` is listed beneath
/// its base (a symlink on the way fails the listing, so nothing at the
/// link's destination is deleted). A missing `parent` is fine.
pub fn finish_pending_deletions(
    parent: Beneath<'_>,
    sys: &dyn Sys,
) -> Result<Vec<(PathBuf, Removal)>, SysError> {
    let entries = match sys.read_dir_beneath(parent.base, parent.rel) {
        Ok(e) => e,
        Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut done = Vec::new();
    let parent = parent.full();
    for entry in entries.into_iter().filter(|e| is_pending_deletion(&e.name)) {
        let path = parent.join(&entry.name);
        let removal = remove_dir_one_fs(&path, sys)?;
        done.push((path, removal));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::MsFlags;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn removes_a_plain_tree_and_unlinks_symlinks_without_following_them() {
        let sys = RecordingSys::new();
        sys.add("/r/d/a/file", FileKind::File);
        sys.add("/r/d/link", FileKind::Symlink);
        sys.add("/outside/precious", FileKind::File);
        let r = remove_dir_one_fs(Path::new("/r/d"), &sys).unwrap();
        assert!(r.complete());
        assert_eq!(r.removed, 4);
        assert!(!sys.exists("/r/d"));
        assert!(sys.exists("/outside/precious"));
        let removes: Vec<_> = sys
            .mutations()
            .into_iter()
            .filter(|c| matches!(c, SysCall::RemoveBeneath { .. } | SysCall::Rmdir { .. }))
            .collect();
        assert_eq!(
            removes,
            vec![
                // walked from the parent, so a mount on /r/d itself is refused
                SysCall::RemoveBeneath {
                    base: p("/r"),
                    rel: p("d/a/file"),
                    dir: false
                },
                SysCall::RemoveBeneath {
                    base: p("/r"),
                    rel: p("d/a"),
                    dir: true
                },
                SysCall::RemoveBeneath {
                    base: p("/r"),
                    rel: p("d/link"),
                    dir: false
                },
                SysCall::Rmdir { path: p("/r/d") },
            ]
        );
    }

    #[test]
    fn a_nested_mount_and_its_ancestors_are_kept_and_not_entered() {
        let sys = RecordingSys::new();
        sys.add("/r/d/keep/m/inside", FileKind::File);
        sys.add("/r/d/gone", FileKind::File);
        sys.add("/src", FileKind::Dir);
        sys.preset_mount(
            Some(Path::new("/src")),
            Path::new("/r/d/keep/m"),
            None,
            MsFlags::MS_BIND,
            None,
        )
        .unwrap();
        let r = remove_dir_one_fs(Path::new("/r/d"), &sys).unwrap();
        assert_eq!(r.kept_mounts, vec![p("/r/d/keep/m")]);
        assert!(sys.exists("/r/d/keep/m/inside"));
        assert!(!sys.exists("/r/d/gone"));
        assert!(sys.exists("/r/d/keep"));
        assert!(!sys.calls().iter().any(|c| matches!(c,
            SysCall::ReadDirBeneath { rel, .. } if rel.starts_with("keep/m"))));
    }

    #[test]
    fn a_mount_point_itself_is_never_removed() {
        let sys = RecordingSys::new();
        sys.add("/r/t/x", FileKind::File);
        sys.preset_mount(
            None,
            Path::new("/r/t"),
            Some("tmpfs"),
            MsFlags::empty(),
            None,
        )
        .unwrap();
        let r = remove_dir_one_fs(Path::new("/r/t"), &sys).unwrap();
        assert_eq!(r.kept_mounts, vec![p("/r/t")]);
        assert!(sys.mutations().is_empty());
    }

    #[test]
    fn an_injected_failure_names_the_call_and_the_path() {
        let sys = RecordingSys::new();
        sys.add("/r/d/f", FileKind::File);
        sys.fail_nth(Call::RemoveBeneath, 1, Errno::EACCES);
        let e = remove_dir_one_fs(Path::new("/r/d"), &sys).unwrap_err();
        assert_eq!(e.to_string(), "remove /r/d/f: EACCES: Permission denied");
    }

    #[test]
    fn pending_deletions_are_named_renamed_and_finished() {
        assert!(is_pending_deletion(OsStr::new("cache.deleting~12")));
        assert!(!is_pending_deletion(OsStr::new("cache.deleting~")));
        assert!(!is_pending_deletion(OsStr::new(".deleting~3")));
        assert!(!is_pending_deletion(OsStr::new("cache")));
        let sys = RecordingSys::new();
        sys.add("/v/cache/f", FileKind::File);
        sys.add("/v/other/f", FileKind::File);
        let at = Beneath::split(Path::new("/v"), Path::new("/v/cache")).unwrap();
        let to = rename_for_deletion(at, 7, &sys).unwrap();
        assert_eq!(to, p("/v/cache.deleting~7"));
        let v = Beneath::split(Path::new("/v"), Path::new("/v")).unwrap();
        let done = finish_pending_deletions(v, &sys).unwrap();
        assert_eq!(done.len(), 1);
        assert!(done[0].1.complete());
        assert!(!sys.exists("/v/cache.deleting~7"));
        assert!(sys.exists("/v/other/f"));
        assert!(
            finish_pending_deletions(
                Beneath::split(Path::new("/v"), Path::new("/v/nope")).unwrap(),
                &sys
            )
            .unwrap()
            .is_empty()
        );
    }
}
