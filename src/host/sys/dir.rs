//! The `*_in` calls on a [`DirHandle`] that holds a descriptor (the one
//! [`LinuxSys::open_dir_beneath`](super::LinuxSys) makes): a single name is
//! acted on with an `*at` call on the handle that never follows it; a
//! nested name's parent is opened from the handle with `openat2(
//! RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` first (see the module docs of
//! [`crate::host::sys`]). Also the directory listing both kinds of listing
//! share.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

use super::raw::{file_stat, mode, mount_root_attr, statx_at};
use super::{Beneath, Call, DirEntry, DirHandle, Errno, FileStat, LinuxSys, MsFlags, SysError};

/// Opens `at` as a handle: readable (a new directory's mode is set through
/// it) and never a symlink, itself included (`ELOOP` from
/// `RESOLVE_NO_SYMLINKS`; `O_NOFOLLOW` would make that `ENOTDIR`).
pub(super) fn open(at: Beneath<'_>) -> Result<DirHandle, SysError> {
    let path = at.full();
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
    let fd = LinuxSys::open_at_beneath(Call::OpenDir, at, flags, &path)?;
    Ok(DirHandle::with_fd(path, fd))
}

/// `mkdir -p` beneath `at.base` from handles: the base opened once, the
/// deepest level that exists found leaf first (the parent, usually) with
/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from it, then each
/// missing level made with `mkdirat` in the one above and opened the same
/// way (a symlink made there meanwhile is `ELOOP`, anything else but a
/// directory `ENOTDIR`). Where the per-level calls walked the whole path
/// from the base for each level and each failed try (a pod's first volume
/// and its marker: about 60 syscalls), this walks it once or a few times.
pub(super) fn mkdirs(at: Beneath<'_>, m: u32) -> Result<(), SysError> {
    let base = open_base(at)?;
    walk_making(base.as_fd(), &at.full(), at.rel, m, Walk::Parents).map(drop)
}

/// [`mkdirs`], then `at` itself opened as [`open`] does, from the handle
/// the walk ended on: a directory there already costs the open of the
/// base and one `openat2`, as [`open`] does.
pub(super) fn open_dirs(at: Beneath<'_>, m: u32) -> Result<DirHandle, SysError> {
    let base = open_base(at)?;
    match walk_making(base.as_fd(), &at.full(), at.rel, m, Walk::Leaf)? {
        (Some(fd), made) => Ok(DirHandle::with_fd(at.full(), fd).made(made)),
        (None, _) => open(at), // the base itself
    }
}

/// [`open_dirs`] of `rel` below the handle `dir` (`fd`); below a
/// directory the handle's call made, nothing is looked for first.
pub(super) fn open_dirs_in(
    dir: &DirHandle,
    fd: BorrowedFd<'_>,
    rel: &Path,
    m: u32,
) -> Result<DirHandle, SysError> {
    let full = dir.path().join(rel);
    let walk = if dir.was_made() {
        Walk::Fresh
    } else {
        Walk::Leaf
    };
    match walk_making(fd, &full, rel, m, walk)? {
        (Some(leaf), made) => Ok(DirHandle::with_fd(full, leaf).made(made)),
        (None, _) => Err(SysError::call(Call::Mkdir, &full, Errno::EINVAL)),
    }
}

/// `at.base` as the `O_PATH` start of a walk.
fn open_base(at: Beneath<'_>) -> Result<OwnedFd, SysError> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    nix::fcntl::open(at.base, flags, mode(0))
        .map_err(|e| SysError::call(Call::Mkdir, &at.full(), e))
}

/// What a [`walk_making`] looks for and returns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// the deepest existing parent looked for; no handle returned
    Parents,
    /// the leaf looked for first too, its handle returned
    Leaf,
    /// as `Leaf` in a directory just made: nothing looked for
    Fresh,
}

/// [`mkdirs`]' walk of `rel` from `base`; with [`Walk::Leaf`] or
/// [`Walk::Fresh`] the leaf's handle, opened readable, is returned (`None`
/// when `rel` is empty), and whether the walk made it.
fn walk_making(
    base: BorrowedFd<'_>,
    full: &Path,
    rel: &Path,
    m: u32,
    walk: Walk,
) -> Result<(Option<OwnedFd>, bool), SysError> {
    let err = |e| SysError::call(Call::Mkdir, full, e);
    let names: Vec<&OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(err(Errno::EINVAL)),
        })
        .collect::<Result<_, _>>()?;
    if names.is_empty() {
        return Ok((None, false)); // the base itself, a directory
    }
    let leaf = walk != Walk::Parents;
    let resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
    let level = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(resolve);
    let last = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(resolve);
    let how = |n: usize| {
        if leaf && n == names.len() {
            last
        } else {
            level
        }
    };
    // the deepest existing level (among the parents only, for
    // `Parents`), and its handle
    let mut have = match walk {
        Walk::Parents => names.len() - 1,
        Walk::Leaf => names.len(),
        Walk::Fresh => 0,
    };
    let mut dir = loop {
        if have == 0 {
            break None;
        }
        let prefix: PathBuf = names[..have].iter().collect();
        match nix::fcntl::openat2(base, &prefix, how(have)) {
            Ok(fd) => break Some(fd),
            Err(Errno::ENOENT) => have -= 1,
            Err(e) => return Err(err(e)),
        }
    };
    let mut made = false;
    for (i, name) in names.iter().enumerate().skip(have) {
        let at_fd = dir.as_ref().map_or(base, |d| d.as_fd());
        made = match nix::sys::stat::mkdirat(at_fd, *name, mode(m)) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(err(e)),
        };
        if made && i + 1 == names.len() && !leaf {
            break; // the leaf just made needs no handle
        }
        // a level to go on from, or the leaf found there: a directory
        // itself (a symlink there, even to a directory, is `ELOOP`)
        dir = Some(nix::fcntl::openat2(at_fd, *name, how(i + 1)).map_err(err)?);
    }
    Ok((dir, made))
}

/// Runs `act` on `rel`'s last component in its parent: the handle itself
/// for a single name, else the parent opened beneath the handle without
/// following any symlink (`ELOOP`). `rel` must be plain names (`EINVAL`).
fn in_parent<T>(
    base: &Path,
    fd: BorrowedFd<'_>,
    call: Call,
    rel: &Path,
    act: impl FnOnce(BorrowedFd<'_>, &OsStr) -> nix::Result<T>,
) -> Result<T, SysError> {
    // the full path only for an error: these calls are the mounts' hot path
    let err = |e| SysError::call(call, &base.join(rel), e);
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    let name = rel
        .file_name()
        .filter(|_| plain)
        .ok_or_else(|| err(Errno::EINVAL))?;
    match rel.parent().filter(|p| !p.as_os_str().is_empty()) {
        None => act(fd, name).map_err(err),
        Some(parent) => {
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
            let resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
            let how = OpenHow::new().flags(flags).resolve(resolve);
            let dir = nix::fcntl::openat2(fd, parent, how).map_err(err)?;
            act(dir.as_fd(), name).map_err(err)
        }
    }
}

/// `statx` of `rel` in the handle's directory, never following it.
pub(super) fn stat(base: &Path, fd: BorrowedFd<'_>, rel: &Path) -> Result<FileStat, SysError> {
    let st = in_parent(base, fd, Call::Stat, rel, |dir, name| {
        let name = CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        statx_at(
            dir.as_raw_fd(),
            &name,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
        )
    })?;
    file_stat(&st, Call::Stat, || base.join(rel))
}

/// `mkdirat` of `rel` (the umask applies, as for `mkdir_beneath`).
pub(super) fn mkdir(base: &Path, fd: BorrowedFd<'_>, rel: &Path, m: u32) -> Result<(), SysError> {
    in_parent(base, fd, Call::Mkdir, rel, |dir, name| {
        nix::sys::stat::mkdirat(dir, name, mode(m))
    })
}

/// `rel` opened beneath the handle without following any symlink, itself
/// included (`ELOOP`); `rel` must be plain names (`EINVAL`).
fn open_below(fd: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if !plain || rel.as_os_str().is_empty() {
        return Err(Errno::EINVAL);
    }
    let resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS;
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(resolve);
    nix::fcntl::openat2(fd, rel, how)
}

/// The directory `rel` (the root of a mount on it, if any) opened as
/// [`open_below`] says, readable, as a handle.
pub(super) fn open_in(base: &Path, fd: BorrowedFd<'_>, rel: &Path) -> Result<DirHandle, SysError> {
    let path = base.join(rel);
    match open_below(fd, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
        Ok(dir) => Ok(DirHandle::with_fd(path, dir)),
        Err(e) => Err(SysError::call(Call::OpenDir, &path, e)),
    }
}

/// The mode of the handle's own directory, set exactly.
pub(super) fn fchmod(path: &Path, fd: BorrowedFd<'_>, m: u32) -> Result<(), SysError> {
    nix::sys::stat::fchmod(fd, mode(m)).map_err(|e| SysError::call(Call::ChmodDir, path, e))
}

/// The directory `rel` (the root of a mount on it, if any) opened as
/// [`open_below`] says, and its mode set exactly through that descriptor.
pub(super) fn chmod_dir(
    base: &Path,
    fd: BorrowedFd<'_>,
    rel: &Path,
    m: u32,
) -> Result<(), SysError> {
    let err = |e| SysError::call(Call::ChmodDir, &base.join(rel), e);
    let dir = open_below(fd, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY).map_err(err)?;
    nix::sys::stat::fchmod(&dir, mode(m)).map_err(err)
}

/// `mount(2)` on `rel`, opened `O_PATH` as [`open_below`] says and named
/// by its `/proc/self/fd/N`, so nothing swapped in can redirect it.
pub(super) fn mount(
    source: Option<&Path>,
    base: &Path,
    fd: BorrowedFd<'_>,
    rel: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<(), SysError> {
    let err = |e| SysError::call(Call::Mount, &base.join(rel), e);
    let target = open_below(fd, rel, OFlag::O_PATH).map_err(err)?;
    let proc_path = format!("/proc/self/fd/{}", target.as_raw_fd());
    nix::mount::mount(source, proc_path.as_str(), fstype, flags, data).map_err(err)
}

/// `mkdirat`, then the new directory opened (never following it) and its
/// mode set exactly through that descriptor, which becomes the handle.
pub(super) fn make_dir(
    base: &Path,
    fd: BorrowedFd<'_>,
    rel: &Path,
    m: u32,
) -> Result<DirHandle, SysError> {
    let path = base.join(rel);
    let made = in_parent(base, fd, Call::Mkdir, rel, |dir, name| {
        nix::sys::stat::mkdirat(dir, name, mode(m))?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        nix::fcntl::openat(dir, name, flags, mode(0))
    })?;
    // exact, whatever the umask
    nix::sys::stat::fchmod(&made, mode(m)).map_err(|e| SysError::call(Call::ChmodDir, &path, e))?;
    Ok(DirHandle::with_fd(path, made))
}

/// A new file with `bytes` and exactly mode `m` (`O_EXCL`, never
/// following a symlink there).
pub(super) fn create_file(
    base: &Path,
    fd: BorrowedFd<'_>,
    rel: &Path,
    bytes: &[u8],
    m: u32,
) -> Result<(), SysError> {
    in_parent(base, fd, Call::CreateFile, rel, |dir, name| {
        create_in(dir, name, bytes, m)
    })
}

/// The file `name` in `dir`, created as [`create_file`] says (shared with
/// [`LinuxSys`]'s `create_file_beneath`).
pub(super) fn create_in(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    bytes: &[u8],
    m: u32,
) -> nix::Result<()> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir, name, flags, mode(m))?;
    let filled = (|| {
        // exact, whatever the umask (a payload's `defaultMode` may be 0666)
        nix::sys::stat::fchmod(&fd, mode(m))?;
        let mut file = std::fs::File::from(fd);
        std::io::Write::write_all(&mut file, bytes)
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
    })();
    if filled.is_err() {
        // the file is ours (`O_EXCL`): a part of it (a write cut short by a
        // full disk) is removed, so it is made whole or not at all and a
        // second try is not refused with `EEXIST`
        let _ = nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
    filled
}

pub(super) fn symlink(
    base: &Path,
    fd: BorrowedFd<'_>,
    rel: &Path,
    target: &Path,
) -> Result<(), SysError> {
    in_parent(base, fd, Call::Symlink, rel, |dir, name| {
        nix::unistd::symlinkat(target, dir, name)
    })
}

pub(super) fn read_link(base: &Path, fd: BorrowedFd<'_>, rel: &Path) -> Result<PathBuf, SysError> {
    in_parent(base, fd, Call::ReadLink, rel, |dir, name| {
        nix::fcntl::readlinkat(dir, name).map(PathBuf::from)
    })
}

pub(super) fn chgrp(base: &Path, fd: BorrowedFd<'_>, rel: &Path, gid: u32) -> Result<(), SysError> {
    in_parent(base, fd, Call::Chgrp, rel, |dir, name| {
        let gid = Some(nix::unistd::Gid::from_raw(gid));
        let flags = nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW;
        nix::unistd::fchownat(dir, name, None, gid, flags)
    })
}

/// `renameat` of two names of the handle's directory (single names only).
pub(super) fn replace(
    base: &Path,
    fd: BorrowedFd<'_>,
    from: &OsStr,
    to: &OsStr,
) -> Result<(), SysError> {
    in_parent(base, fd, Call::Replace, Path::new(from), |dir, name| {
        if Path::new(to).components().count() != 1 {
            return Err(Errno::EINVAL);
        }
        nix::fcntl::renameat(dir, name, dir, to)
    })
}

/// The handle's directory listed (a new descriptor of it, so the handle's
/// own stays unread).
pub(super) fn read_dir(base: &Path, fd: BorrowedFd<'_>) -> Result<Vec<DirEntry>, SysError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let own = nix::fcntl::openat(fd, ".", flags, mode(0))
        .map_err(|e| SysError::call(Call::ReadDirBeneath, base, e))?;
    list(own, base, Call::ReadDirBeneath)
}

/// The entries of the directory open at `fd` (at `path`), each classified
/// by `statx` without following it; an entry on another device than the
/// directory is a mount root.
pub(super) fn list(fd: OwnedFd, path: &Path, call: Call) -> Result<Vec<DirEntry>, SysError> {
    let err = |e| SysError::call(call, path, e);
    let dot = CString::from(c".");
    let own = statx_at(fd.as_raw_fd(), &dot, 0, libc::STATX_BASIC_STATS).map_err(err)?;
    let mut dir = nix::dir::Dir::from_fd(fd).map_err(err)?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(err)?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let os = OsString::from(OsStr::from_bytes(name.as_bytes()));
        let entry_path = || path.join(&os);
        let st = statx_at(
            dir.as_raw_fd(),
            &name,
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS,
        )
        .map_err(|e| SysError::call(Call::Stat, &entry_path(), e))?;
        let kind = file_stat(&st, Call::Stat, entry_path)?.kind;
        let other_dev =
            (st.stx_dev_major, st.stx_dev_minor) != (own.stx_dev_major, own.stx_dev_minor);
        let mount_root = mount_root_attr(&st).unwrap_or(other_dev) || other_dev;
        out.push(DirEntry {
            name: os,
            kind,
            mount_root,
            bytes: st.stx_blocks.saturating_mul(512),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, symlink};

    use super::*;
    use crate::host::sys::Sys;

    /// A root with `v/` in it, and `v` opened as a handle.
    fn opened() -> (tempfile::TempDir, PathBuf, DirHandle) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        std::fs::create_dir(root.join("v")).unwrap();
        let at = Beneath {
            base: &root,
            rel: Path::new("v"),
        };
        let h = LinuxSys.open_dir_beneath(at).unwrap();
        assert!(h.fd().is_some(), "the real handle holds a descriptor");
        (d, root, h)
    }

    #[test]
    fn a_handle_is_never_opened_through_a_symlink() {
        let (_d, root, _h) = opened();
        symlink("v", root.join("link")).unwrap();
        std::fs::create_dir(root.join("v/w")).unwrap();
        for rel in ["link", "link/w"] {
            let at = Beneath {
                base: &root,
                rel: Path::new(rel),
            };
            let e = LinuxSys.open_dir_beneath(at).unwrap_err();
            assert_eq!(e.errno(), Some(Errno::ELOOP), "{rel}");
        }
    }

    /// Through the handle: a new dir and a new file get their mode exactly
    /// (0777 and 0666, which any umask with group or other bits cuts), a
    /// nested name is reached below the handle, a symlink on the way is
    /// refused, `..` is refused, and a name taken is `EEXIST`.
    #[test]
    fn calls_through_a_handle_keep_modes_and_follow_no_symlink() {
        let (_d, root, h) = opened();
        let sys = LinuxSys;
        let sub = sys.make_dir_in(&h, Path::new("d"), 0o777).unwrap();
        assert_eq!(sub.path(), root.join("v/d"));
        sys.create_file_in(&h, Path::new("d/f"), b"x", 0o666)
            .unwrap();
        sys.create_file_in(&sub, Path::new("g"), b"y", 0o400)
            .unwrap();
        let mode = |p: &str| std::fs::symlink_metadata(root.join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("v/d"), 0o777);
        assert_eq!(mode("v/d/f"), 0o666);
        assert_eq!(mode("v/d/g"), 0o400);
        assert_eq!(std::fs::read(root.join("v/d/g")).unwrap(), b"y");
        let taken = sys.create_file_in(&h, Path::new("d/f"), b"", 0o644);
        assert_eq!(taken.unwrap_err().errno(), Some(Errno::EEXIST));
        // a symlink on the way: refused, nothing made where it points
        symlink("d", root.join("v/ln")).unwrap();
        let e = sys
            .create_file_in(&h, Path::new("ln/h"), b"", 0o644)
            .unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ELOOP));
        assert!(!root.join("v/d/h").exists());
        // a symlink at the name itself is never written through
        let e = sys
            .create_file_in(&h, Path::new("ln"), b"", 0o644)
            .unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EEXIST));
        for rel in ["../out", "d/../../out", ""] {
            let e = sys
                .symlink_in(&h, Path::new(rel), Path::new("x"))
                .unwrap_err();
            assert_eq!(e.errno(), Some(Errno::EINVAL), "{rel:?}");
        }
        assert!(!root.join("out").exists());
    }

    /// `mkdir -p` beneath a base from handles, as the per-level calls did:
    /// what exists is kept, missing levels are made with the mode (the
    /// umask may cut it), and a symlink (even to a directory) or a file on
    /// the way or at the end is refused.
    #[test]
    fn mkdirs_makes_missing_levels_and_refuses_symlinks_and_files() {
        let (_d, root, _h) = opened();
        std::fs::write(root.join("file"), b"").unwrap();
        symlink("v", root.join("to-v")).unwrap();
        let table: [(&str, Option<Errno>); 8] = [
            ("v", None),
            ("", None),
            ("v/a/b/c", None),
            ("v/a/b", None),
            ("new/x", None),
            ("to-v", Some(Errno::ELOOP)),
            ("to-v/a/z", Some(Errno::ELOOP)),
            ("file/below", Some(Errno::ENOTDIR)),
        ];
        for (rel, want) in table {
            let at = Beneath {
                base: &root,
                rel: Path::new(rel),
            };
            let got = LinuxSys
                .mkdirs_beneath(at, 0o750)
                .err()
                .and_then(|e| e.errno());
            assert_eq!(got, want, "{rel}");
            if want.is_none() {
                assert!(
                    std::fs::symlink_metadata(root.join(rel)).unwrap().is_dir(),
                    "{rel}"
                );
            }
        }
        assert!(
            !root.join("v/a/z").exists(),
            "nothing made through the symlink"
        );
        let mode = std::fs::metadata(root.join("v/a")).unwrap().mode();
        assert_eq!(mode & 0o777 & !0o750, 0, "new levels get at most the mode");
        let e = LinuxSys.mkdirs_beneath(
            Beneath {
                base: &root,
                rel: Path::new("file"),
            },
            0o750,
        );
        assert_eq!(e.unwrap_err().errno(), Some(Errno::ENOTDIR));
    }

    #[test]
    fn links_are_made_read_and_swapped_through_a_handle() {
        let (_d, root, h) = opened();
        let sys = LinuxSys;
        sys.symlink_in(&h, Path::new("a"), Path::new("one"))
            .unwrap();
        sys.symlink_in(&h, Path::new("tmp"), Path::new("two"))
            .unwrap();
        sys.replace_in(&h, OsStr::new("tmp"), OsStr::new("a"))
            .unwrap();
        assert_eq!(
            sys.read_link_in(&h, Path::new("a")).unwrap(),
            Path::new("two")
        );
        assert!(!root.join("v/tmp").exists());
        let gid = std::fs::symlink_metadata(root.join("v/a")).unwrap().gid();
        sys.chgrp_in(&h, Path::new("a"), gid).unwrap();
        let names: Vec<OsString> = sys
            .read_dir_in(&h)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, [OsString::from("a")]);
        let e = sys
            .replace_in(&h, OsStr::new("a"), OsStr::new("../b"))
            .unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EINVAL));
    }

    /// `open_dirs_beneath` makes what is missing and says so, opens what is
    /// there, and refuses a symlink or a file on the way or at the end;
    /// `open_dirs_in` does the same below a handle, and below one whose
    /// call made its dir makes every level without looking first (an entry
    /// planted there meanwhile is still never followed).
    #[test]
    fn open_dirs_makes_opens_and_follows_no_symlink() {
        let (_d, root, h) = opened();
        let sys = LinuxSys;
        std::fs::write(root.join("v/file"), b"").unwrap();
        symlink("v", root.join("to-v")).unwrap();
        let at = |rel: &'static str| Beneath {
            base: &root,
            rel: Path::new(rel),
        };
        let made = sys.open_dirs_beneath(at("n/a"), 0o750).unwrap();
        assert!(made.was_made() && made.fd().is_some());
        assert!(root.join("n/a").is_dir());
        assert!(!sys.open_dirs_beneath(at("n/a"), 0o750).unwrap().was_made());
        let deep = sys.open_dirs_in(&made, Path::new("b/c"), 0o750).unwrap();
        assert!(deep.was_made());
        assert_eq!(deep.path(), root.join("n/a/b/c"));
        sys.create_file_in(&deep, Path::new("f"), b"x", 0o644)
            .unwrap();
        assert!(root.join("n/a/b/c/f").is_file());
        let table = [
            ("to-v", Errno::ELOOP),
            ("to-v/x", Errno::ELOOP),
            ("v/file", Errno::ENOTDIR),
            ("v/file/x", Errno::ENOTDIR),
        ];
        for (rel, want) in table {
            let e = sys.open_dirs_beneath(at(rel), 0o750).unwrap_err();
            assert_eq!(e.errno(), Some(want), "{rel}");
        }
        symlink("..", root.join("v/up")).unwrap();
        symlink("..", root.join("n/a/up")).unwrap();
        for (dir, rel) in [(&h, "up"), (&h, "up/x"), (&made, "up/x")] {
            let e = sys.open_dirs_in(dir, Path::new(rel), 0o750).unwrap_err();
            assert_eq!(e.errno(), Some(Errno::ELOOP), "{rel}");
        }
        assert!(!root.join("x").exists() && !root.join("n/x").exists());
    }

    /// `stat_in`, `mkdir_in`, `chmod_dir_in`, `mount_in` and `open_dir_in`
    /// name an entry through the handle and follow no symlink, at the entry
    /// (but for `stat_in`, which reports it) or on the way; the mount is
    /// refused before it is tried.
    #[test]
    fn single_calls_through_a_handle_follow_no_symlink() {
        use crate::host::sys::{FileKind, MsFlags};
        let (_d, root, h) = opened();
        let sys = LinuxSys;
        let p = Path::new;
        sys.mkdir_in(&h, p("d"), 0o750).unwrap();
        assert_eq!(sys.stat_in(&h, p("d")).unwrap().kind, FileKind::Dir);
        sys.chmod_dir_in(&h, p("d"), 0o777).unwrap();
        let mode = || std::fs::metadata(root.join("v/d")).unwrap().mode() & 0o7777;
        assert_eq!(mode(), 0o777);
        symlink("d", root.join("v/ln")).unwrap();
        assert_eq!(sys.stat_in(&h, p("ln")).unwrap().kind, FileKind::Symlink);
        let e = sys.mkdir_in(&h, p("ln"), 0o750).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EEXIST));
        let tmpfs = Some(p("tmpfs"));
        for rel in ["ln", "ln/x"] {
            let calls = [
                sys.chmod_dir_in(&h, p(rel), 0o700),
                sys.mount_in(tmpfs, &h, p(rel), Some("tmpfs"), MsFlags::empty(), None),
            ];
            for r in calls {
                assert_eq!(r.unwrap_err().errno(), Some(Errno::ELOOP), "{rel}");
            }
        }
        // each error names the whole path it was about (made only then)
        let e = sys.stat_in(&h, p("ln/x")).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ELOOP));
        assert_eq!(e.path(), Some(&*root.join("v/ln/x")));
        let e = sys.mkdir_in(&h, p("ln/x"), 0o750).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ELOOP));
        assert_eq!(e.path(), Some(&*root.join("v/ln/x")));
        assert!(!root.join("v/d/x").exists());
        assert_eq!(mode(), 0o777, "nothing changed through the link");
        // a dir opened below the handle, and its own mode set through it
        let e = sys.open_dir_in(&h, p("ln")).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ELOOP));
        let d = sys.open_dir_in(&h, p("d")).unwrap();
        sys.chmod_dir(&d, 0o700).unwrap();
        assert_eq!(mode(), 0o700);
        for rel in ["", "../x", "d/../../x"] {
            let e = sys.chmod_dir_in(&h, p(rel), 0o700).unwrap_err();
            assert_eq!(e.errno(), Some(Errno::EINVAL), "{rel:?}");
            let e = sys.mkdir_in(&h, p(rel), 0o700).unwrap_err();
            assert_eq!(e.errno(), Some(Errno::EINVAL), "{rel:?}");
            assert_eq!(e.path(), Some(&*root.join("v").join(rel)), "{rel:?}");
        }
    }
}
