//! [`RecordingSys`]'s side of the [`Sys`] seam: each call recorded, then
//! checked against and applied to the fake file tree and mount table.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::host::fake_host::{State, create};
use crate::host::mountinfo::MountTable;
use crate::host::sys::{
    Beneath, Call, DirEntry, DirHandle, DiskFormat, Errno, FileKind, FileStat, FsUsage,
    LIVE_MOUNTINFO, Listing, MntFlags, MountProbe, MsFlags, Sys, SysError,
};

use super::RecordingSys;
use super::tree::{mountinfo_text, no_symlink_above, open_path_beneath, parent_beneath, stat_of};
use crate::host::sys::SysCall;

impl Sys for RecordingSys {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        let call = SysCall::Mount {
            source: source.map(Path::to_owned),
            target: target.to_owned(),
            fstype: fstype.map(str::to_owned),
            flags,
            data: data.map(str::to_owned),
        };
        self.enter(call, target)?
            .do_mount(source, target, fstype, flags, data)
    }

    /// Recorded as the [`SysCall::Mount`] of `base/rel`; a symlink at or
    /// above the target, below the base, fails it with `ELOOP`.
    fn mount_beneath(
        &self,
        source: Option<&Path>,
        at: Beneath<'_>,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        let target = at.full();
        let call = SysCall::Mount {
            source: source.map(Path::to_owned),
            target: target.clone(),
            fstype: fstype.map(str::to_owned),
            flags,
            data: data.map(str::to_owned),
        };
        let mut st = self.enter(call, &target)?;
        open_path_beneath(&st, Call::Mount, at, &target)?;
        st.do_mount(source, &target, fstype, flags, data)
    }

    /// Recorded as the [`SysCall::Mount`] (`MS_BIND`) of `source` on `at`,
    /// both full paths; a symlink at or above either end, below its base,
    /// fails it with `ELOOP`.
    fn bind_beneath(&self, source: Beneath<'_>, at: Beneath<'_>) -> Result<(), SysError> {
        let target = at.full();
        let from = source.full();
        let call = SysCall::Mount {
            source: Some(from.clone()),
            target: target.clone(),
            fstype: None,
            flags: MsFlags::MS_BIND,
            data: None,
        };
        let mut st = self.enter(call, &target)?;
        for end in [source, at] {
            open_path_beneath(&st, Call::Mount, end, &target)?;
        }
        st.do_mount(Some(&from), &target, None, MsFlags::MS_BIND, None)
    }

    /// As [`Sys::stat_beneath`]: the fake follows no symlink below the base
    /// (stricter than the real call, which follows one that stays beneath).
    fn stat_within(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        self.stat_beneath(at)
    }

    /// As [`Sys::bind_beneath`], after the kind check; the fake follows no
    /// symlink below either base.
    fn bind_within(
        &self,
        source: Beneath<'_>,
        at: Beneath<'_>,
        kind: FileKind,
    ) -> Result<(), SysError> {
        let found = stat_of(&self.lock(), &source.full())?.kind;
        if found != kind {
            return Err(SysError::call(Call::Mount, &at.full(), Errno::ESTALE));
        }
        self.bind_beneath(source, at)
    }

    /// Recorded as the [`SysCall::Umount`] of `base/rel` (with
    /// `UMOUNT_NOFOLLOW` added, as the real call does); a symlink above the
    /// target, below the base, fails it with `ELOOP`.
    fn umount2_beneath(&self, at: Beneath<'_>, flags: MntFlags) -> Result<(), SysError> {
        let full = at.full();
        let target = full.as_path();
        let call = SysCall::Umount {
            target: target.to_owned(),
            flags: flags | MntFlags::UMOUNT_NOFOLLOW,
        };
        let mut st = self.enter(call, target)?;
        parent_beneath(&st, Call::Umount, at, target)?;
        let i = st.mounts.iter().rposition(|m| m.target == target);
        let i = i.ok_or_else(|| SysError::call(Call::Umount, target, Errno::EINVAL))?;
        // a mount beneath, or a loop device holding the file open, keeps
        // the mount busy as the kernel's does
        if st
            .mounts
            .iter()
            .any(|m| m.target.starts_with(target) && m.target != target)
            || st.loops.values().any(|b| b == target)
        {
            return Err(SysError::call(Call::Umount, target, Errno::EBUSY));
        }
        st.mounts.remove(i);
        Ok(())
    }

    fn mount_root(&self, path: &Path) -> Result<bool, SysError> {
        let st = self.enter(SysCall::MountRoot { path: path.into() }, path)?;
        if !st.files.contains_key(path) {
            return Err(SysError::call(Call::MountRoot, path, Errno::ENOENT));
        }
        Ok(path == Path::new("/") || st.is_mount_point(path))
    }

    fn mnt_id(&self, path: &Path) -> Result<u64, SysError> {
        let st = self.enter(SysCall::MntId { path: path.into() }, path)?;
        let id = path.ancestors().find_map(|a| st.top(a)).map_or(1, |m| m.id);
        Ok(u64::from(id))
    }

    fn stat(&self, path: &Path, follow: bool) -> Result<FileStat, SysError> {
        let call = SysCall::Stat {
            path: path.into(),
            follow,
        };
        let st = self.enter(call, path)?;
        stat_of(&st, path)
    }

    fn mkdir(&self, path: &Path, mode: u32) -> Result<(), SysError> {
        let mut st = self.enter(
            SysCall::Mkdir {
                path: path.into(),
                mode,
            },
            path,
        )?;
        create(&mut st, Call::Mkdir, path, FileKind::Dir)
    }

    /// Recorded as the [`SysCall::Stat`] of `base/rel` (not following);
    /// a symlink above it, below the base, fails it with `ELOOP`.
    fn stat_beneath(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        let path = at.full();
        let call = SysCall::Stat {
            path: path.clone(),
            follow: false,
        };
        let st = self.enter(call, &path)?;
        parent_beneath(&st, Call::Stat, at, &path)?;
        stat_of(&st, &path)
    }

    fn open_dir_beneath(&self, at: Beneath<'_>) -> Result<DirHandle, SysError> {
        super::links::open_dir(self, at)
    }

    /// Recorded as the [`SysCall::Mkdir`] of `base/rel`; a symlink above
    /// it, below the base, fails it with `ELOOP`.
    fn mkdir_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
        let path = at.full();
        let call = SysCall::Mkdir {
            path: path.clone(),
            mode,
        };
        let mut st = self.enter(call, &path)?;
        parent_beneath(&st, Call::Mkdir, at, &path)?;
        create(&mut st, Call::Mkdir, &path, FileKind::Dir)
    }

    fn chmod_dir_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
        let path = &at.full();
        let call = SysCall::ChmodDir {
            path: path.into(),
            mode,
        };
        let st = self.enter(call, path)?;
        parent_beneath(&st, Call::ChmodDir, at, path)?;
        match st.files.get(path) {
            Some(FileKind::Dir) => Ok(()),
            Some(FileKind::Symlink) => Err(SysError::call(Call::ChmodDir, path, Errno::ELOOP)),
            Some(_) => Err(SysError::call(Call::ChmodDir, path, Errno::ENOTDIR)),
            None => Err(SysError::call(Call::ChmodDir, path, Errno::ENOENT)),
        }
    }

    fn create_file(&self, path: &Path, mode: u32) -> Result<(), SysError> {
        let call = SysCall::CreateFile {
            path: path.into(),
            mode,
        };
        let mut st = self.enter(call, path)?;
        create(&mut st, Call::CreateFile, path, FileKind::File)
    }

    fn write_file_beneath(&self, at: Beneath<'_>, bytes: &[u8], mode: u32) -> Result<(), SysError> {
        let path = &at.full();
        let call = SysCall::WriteFile {
            path: path.into(),
            mode,
        };
        let mut st = self.enter(call, path)?;
        parent_beneath(&st, Call::WriteFile, at, path)?;
        match st.files.get(path) {
            Some(FileKind::File) => {}
            Some(_) => return Err(SysError::call(Call::WriteFile, path, Errno::EISDIR)),
            None => create(&mut st, Call::WriteFile, path, FileKind::File)?,
        }
        st.contents.insert(path.to_owned(), bytes.to_vec());
        Ok(())
    }

    fn create_file_beneath(
        &self,
        at: Beneath<'_>,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), SysError> {
        let path = &at.full();
        let call = SysCall::CreateFile {
            path: path.into(),
            mode,
        };
        let mut st = self.enter(call, path)?;
        parent_beneath(&st, Call::CreateFile, at, path)?;
        create(&mut st, Call::CreateFile, path, FileKind::File)?;
        st.contents.insert(path.to_owned(), bytes.to_vec());
        Ok(())
    }

    /// Recorded as the [`SysCall::Rename`] of `base/rel`; a symlink above
    /// it, below the base, fails it with `ELOOP`.
    fn rename_beneath(&self, at: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError> {
        let from = &at.full();
        let to = &from.with_file_name(to_name);
        let call = SysCall::Rename {
            from: from.clone(),
            to: to.clone(),
        };
        let mut st = self.enter(call, from)?;
        let err = |e| SysError::call(Call::Rename, from, e);
        parent_beneath(&st, Call::Rename, at, from)?;
        if !st.files.contains_key(from) {
            return Err(err(Errno::ENOENT));
        }
        if st.files.contains_key(to) {
            return Err(err(Errno::EEXIST));
        }
        if st.is_mount_point(from) {
            return Err(err(Errno::EBUSY));
        }
        let moved: Vec<_> = st
            .files
            .keys()
            .filter(|p| p.starts_with(from))
            .cloned()
            .collect();
        for p in moved {
            let rel = p.strip_prefix(from).unwrap_or(Path::new("")).to_owned();
            if let Some(k) = st.files.remove(&p) {
                st.files.insert(to.join(rel), k);
            }
        }
        for m in st.mounts.iter_mut() {
            if let Ok(rel) = m.target.strip_prefix(from) {
                m.target = to.join(rel);
            }
        }
        Ok(())
    }

    fn replace_beneath(&self, at: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError> {
        super::links::replace(self, at, to_name)
    }

    fn symlink_beneath(&self, at: Beneath<'_>, target: &Path) -> Result<(), SysError> {
        super::links::symlink(self, at, target)
    }

    fn read_link_beneath(&self, at: Beneath<'_>) -> Result<PathBuf, SysError> {
        super::links::read_link(self, at)
    }

    fn chgrp_beneath(&self, at: Beneath<'_>, gid: u32) -> Result<(), SysError> {
        super::links::chgrp(self, at, gid)
    }

    /// Recorded as the [`SysCall::Rmdir`] of `base/rel`; a symlink above
    /// it, below the base, fails it with `ELOOP`.
    fn rmdir_beneath(&self, at: Beneath<'_>) -> Result<(), SysError> {
        let path = at.full();
        let mut st = self.enter(SysCall::Rmdir { path: path.clone() }, &path)?;
        parent_beneath(&st, Call::Rmdir, at, &path)?;
        st.remove(Call::Rmdir, &path, true)
    }

    /// A symlink above `path` fails it with `ELOOP`, as in the real call.
    fn rmdir(&self, path: &Path) -> Result<(), SysError> {
        let mut st = self.enter(SysCall::Rmdir { path: path.into() }, path)?;
        no_symlink_above(&st, Call::Rmdir, path, path)?;
        st.remove(Call::Rmdir, path, true)
    }

    /// A symlink above `path` fails it with `ELOOP`, as in the real call.
    fn unlink(&self, path: &Path) -> Result<(), SysError> {
        let mut st = self.enter(SysCall::Unlink { path: path.into() }, path)?;
        no_symlink_above(&st, Call::Unlink, path, path)?;
        st.remove(Call::Unlink, path, false)
    }

    fn read_dir_beneath(&self, base: &Path, rel: &Path) -> Result<Vec<DirEntry>, SysError> {
        let call = SysCall::ReadDirBeneath {
            base: base.into(),
            rel: rel.into(),
        };
        let st = self.enter(call, &base.join(rel))?;
        no_symlink_above(&st, Call::ReadDirBeneath, base, &base.join(rel))?;
        st.check_beneath(Call::ReadDirBeneath, base, rel, false)?;
        let dir = base.join(rel);
        Ok(st
            .children(&dir)
            .into_iter()
            .map(|(p, kind)| DirEntry {
                name: p.file_name().map(OsString::from).unwrap_or_default(),
                kind,
                mount_root: st.is_mount_point(&p),
                // a file's bytes, as if every byte took disk space
                bytes: st.contents.get(&p).map_or(0, |c| c.len() as u64),
            })
            .collect())
    }

    fn remove_beneath(&self, base: &Path, rel: &Path, dir: bool) -> Result<(), SysError> {
        let call = SysCall::RemoveBeneath {
            base: base.into(),
            rel: rel.into(),
            dir,
        };
        let mut st = self.enter(call, &base.join(rel))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        no_symlink_above(&st, Call::RemoveBeneath, base, &base.join(rel))?;
        st.check_beneath(Call::RemoveBeneath, base, parent, false)?;
        st.remove(Call::RemoveBeneath, &base.join(rel), dir)
    }

    fn mkfs(&self, device: &Path, fstype: &str) -> Result<(), SysError> {
        let call = SysCall::Mkfs {
            device: device.into(),
            fstype: fstype.into(),
        };
        let mut st = self.enter(call, device)?;
        if !st.devices.contains_key(device) {
            return Err(SysError::call(Call::Mkfs, device, Errno::ENOENT));
        }
        st.formats
            .insert(device.to_owned(), DiskFormat::Filesystem(fstype.to_owned()));
        Ok(())
    }

    fn probe_fs(&self, device: &Path) -> Result<DiskFormat, SysError> {
        let st = self.enter(
            SysCall::ProbeFs {
                device: device.into(),
            },
            device,
        )?;
        st.formats
            .get(device)
            .cloned()
            .ok_or_else(|| SysError::call(Call::ProbeFs, device, Errno::ENOENT))
    }

    fn read_mountinfo(&self) -> Result<MountTable, SysError> {
        let st = self.enter(SysCall::ReadMountinfo, Path::new(LIVE_MOUNTINFO))?;
        Ok(MountTable::parse(mountinfo_text(&st).as_bytes()))
    }

    /// Recorded as one [`SysCall::ReadMountinfo`]; the text comes in pieces
    /// cut mid-line, as a real read's may be.
    fn read_mountinfo_pieces(
        &self,
        piece: &mut dyn FnMut(Vec<u8>) -> bool,
    ) -> Result<(), SysError> {
        let text = {
            let st = self.enter(SysCall::ReadMountinfo, Path::new(LIVE_MOUNTINFO))?;
            mountinfo_text(&st).into_bytes()
        };
        for chunk in text.chunks(97) {
            if !piece(chunk.to_vec()) {
                break;
            }
        }
        Ok(())
    }

    /// The path itself when it exists with no symlink on the way (the fake
    /// keeps no link targets).
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, SysError> {
        let st = self.enter(SysCall::Canonicalize { path: path.into() }, path)?;
        no_symlink_above(&st, Call::Canonicalize, path, path)?;
        match st.files.get(path) {
            Some(FileKind::Symlink) => Err(SysError::call(Call::Canonicalize, path, Errno::ELOOP)),
            Some(_) => Ok(path.to_owned()),
            None => Err(SysError::call(Call::Canonicalize, path, Errno::ENOENT)),
        }
    }

    fn read_dir(&self, path: &Path) -> Result<Listing, SysError> {
        let st = self.enter(SysCall::ReadDir { path: path.into() }, path)?;
        match st.files.get(path) {
            Some(FileKind::Dir) => {}
            Some(_) => return Err(SysError::call(Call::ReadDir, path, Errno::ENOTDIR)),
            None => return Err(SysError::call(Call::ReadDir, path, Errno::ENOENT)),
        }
        Ok(st
            .children(path)
            .into_iter()
            .map(|(p, kind)| {
                (
                    p.file_name().map(OsString::from).unwrap_or_default(),
                    Ok(kind),
                )
            })
            .collect())
    }

    fn read_file(&self, path: &Path, limit: u64, follow: bool) -> Result<Vec<u8>, SysError> {
        let st = self.enter(SysCall::ReadFile { path: path.into() }, path)?;
        file_bytes(&st, path, limit, follow)
    }

    /// Recorded as the [`SysCall::ReadFile`] of `base/rel`; a symlink on
    /// the way or at the file fails it with `ELOOP`.
    fn read_file_beneath(&self, at: Beneath<'_>, limit: u64) -> Result<Vec<u8>, SysError> {
        let path = &at.full();
        let st = self.enter(SysCall::ReadFile { path: path.into() }, path)?;
        parent_beneath(&st, Call::ReadFile, at, path)?;
        file_bytes(&st, path, limit, false)
    }

    /// What [`RecordingSys::set_fs_usage`] gave the filesystem `path`
    /// shows (found by its device), else an empty, writable filesystem.
    fn statfs(&self, path: &Path) -> Result<FsUsage, SysError> {
        let st = self.enter(SysCall::Statfs { path: path.into() }, path)?;
        if !st.files.contains_key(path) {
            return Err(SysError::call(Call::Statfs, path, Errno::ENOENT));
        }
        let dev = st.identity_of(path).0;
        Ok(st.usage.get(&dev).copied().unwrap_or(FsUsage {
            block_size: 4096,
            blocks: 1 << 20,
            blocks_free: 1 << 20,
            blocks_available: 1 << 20,
            files: 1 << 16,
            files_free: 1 << 16,
            read_only: false,
        }))
    }

    fn loop_find_backing(&self, backing: &Path) -> Result<Vec<PathBuf>, SysError> {
        let call = SysCall::LoopFind {
            backing: backing.into(),
        };
        let st = self.enter(call, backing)?;
        Ok(st
            .loops
            .iter()
            .filter(|(_, b)| b.as_path() == backing)
            .map(|(n, _)| PathBuf::from(format!("/dev/loop{n}")))
            .collect())
    }

    fn loop_attach_beneath(&self, at: Beneath<'_>) -> Result<PathBuf, SysError> {
        let full = at.full();
        let call = SysCall::LoopAttach {
            backing: full.clone(),
        };
        let mut st = self.enter(call, &full)?;
        parent_beneath(&st, Call::LoopAttach, at, &full)?;
        let errno = match st.files.get(&full) {
            Some(FileKind::File | FileKind::BlockDevice) => None,
            Some(FileKind::Symlink) => Some(Errno::ELOOP),
            Some(FileKind::Dir) => Some(Errno::EISDIR),
            Some(_) => Some(Errno::EINVAL),
            None => Some(Errno::ENOENT),
        };
        if let Some(errno) = errno {
            return Err(SysError::call(Call::LoopAttach, &full, errno));
        }
        // the lowest free number, as LOOP_CTL_GET_FREE answers
        let n = (0..).find(|n| !st.loops.contains_key(n)).unwrap_or(0);
        st.loops.insert(n, full);
        Ok(PathBuf::from(format!("/dev/loop{n}")))
    }

    fn loop_detach(&self, dev: &Path) -> Result<(), SysError> {
        let call = SysCall::LoopDetach { dev: dev.into() };
        let mut st = self.enter(call, dev)?;
        let n = dev
            .to_str()
            .and_then(|d| d.strip_prefix("/dev/loop"))
            .and_then(|n| n.parse::<u32>().ok());
        let n = n.ok_or_else(|| SysError::call(Call::LoopDetach, dev, Errno::EINVAL))?;
        match st.loops.remove(&n) {
            Some(_) => Ok(()),
            None => Err(SysError::call(Call::LoopDetach, dev, Errno::ENXIO)),
        }
    }

    fn mount_probe(&self, path: &Path) -> Result<MountProbe, SysError> {
        let st = self.enter(SysCall::MountProbe { path: path.into() }, path)?;
        if !st.files.contains_key(path) {
            return Err(SysError::call(Call::MountProbe, path, Errno::ENOENT));
        }
        let mnt_id = path.ancestors().find_map(|a| st.top(a)).map_or(1, |m| m.id);
        Ok(MountProbe {
            mnt_id: u64::from(mnt_id),
            dev: st.identity_of(path).0,
            mount_root: Some(path == Path::new("/") || st.is_mount_point(path)),
        })
    }
}

/// The content of the fake file `path`, as [`Sys::read_file`] reads it.
fn file_bytes(st: &State, path: &Path, limit: u64, follow: bool) -> Result<Vec<u8>, SysError> {
    let err = |e| SysError::call(Call::ReadFile, path, e);
    match st.files.get(path) {
        Some(FileKind::File) => {}
        Some(FileKind::Symlink) if !follow => return Err(err(Errno::ELOOP)),
        Some(_) => return Err(err(Errno::EINVAL)),
        None => return Err(err(Errno::ENOENT)),
    }
    let bytes = st.contents.get(path).cloned().unwrap_or_default();
    if bytes.len() as u64 > limit {
        return Err(err(Errno::EFBIG));
    }
    Ok(bytes)
}
