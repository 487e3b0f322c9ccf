//! [`RecordingSys`]: the recording fake of the syscall seam, for unit tests of
//! mount decisions and error paths (STYLE "Our house" 2 and 12).
//!
//! It records every call as a [`SysCall`] (plain comparable data, so tests
//! assert the exact list), keeps a small in-memory file tree and mount table
//! so idempotency logic sees the effect of earlier calls, and can be told to
//! fail the n-th call of a [`Call`] kind with a chosen errno.
//!
//! The model is deliberately simple: every path not under a fake mount lives
//! on one "disk" filesystem (device `8:1`); a tmpfs gets a fresh `0:N`; a
//! block device mount gets the device's number; a bind mount copies the
//! identity of what it binds. [`RecordingSys::read_mountinfo`] renders the
//! fake mounts as mountinfo text and parses it with the real parser.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::host::fake_host::{State, create};
use crate::host::mountinfo::{MountTable, escape};
use crate::host::sys::{
    Beneath, Call, DirEntry, DiskFormat, Errno, FileKind, FileStat, LIVE_MOUNTINFO, Listing,
    MntFlags, MsFlags, Sys, SysError,
};
use crate::model::DevId;

pub use crate::host::fake_host::FakeMount;
pub use crate::host::sys::SysCall;

/// The recording fake (see the module docs).
#[derive(Debug, Default)]
pub struct RecordingSys {
    state: Mutex<State>,
}

impl RecordingSys {
    /// An empty host: no files, no mounts.
    pub fn new() -> Self {
        let s = Self::default();
        {
            let mut st = s.lock();
            st.next_id = 100;
            st.next_anon = 50;
            st.files.insert(PathBuf::from("/"), FileKind::Dir);
        }
        s
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the `nth` (1-based, counted from now) call of `call` fail with `errno`.
    pub fn fail_nth(&self, call: Call, nth: usize, errno: Errno) {
        let mut st = self.lock();
        let seen = st.counts.get(&call).copied().unwrap_or(0);
        st.failures.push((call, seen + nth, errno));
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<SysCall> {
        self.lock().calls.clone()
    }

    /// The calls so far that change the host.
    pub fn mutations(&self) -> Vec<SysCall> {
        self.calls().into_iter().filter(SysCall::mutates).collect()
    }

    /// Forgets the recorded calls (the fake host stays as it is).
    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// Adds a regular file holding `bytes` (and its missing parent
    /// directories) without recording.
    pub fn add_file(&self, path: impl AsRef<Path>, bytes: impl Into<Vec<u8>>) {
        let path = path.as_ref();
        self.add(path, FileKind::File);
        self.lock().contents.insert(path.to_owned(), bytes.into());
    }

    /// Adds a path of `kind` (and its missing parent directories) without recording.
    pub fn add(&self, path: impl AsRef<Path>, kind: FileKind) {
        let mut st = self.lock();
        let path = path.as_ref();
        for a in path.ancestors().skip(1) {
            st.files.entry(a.to_owned()).or_insert(FileKind::Dir);
        }
        st.files.insert(path.to_owned(), kind);
    }

    /// Adds a block device node standing for `dev`, holding `format`.
    pub fn add_device(&self, path: impl AsRef<Path>, dev: DevId, format: DiskFormat) {
        let path = path.as_ref();
        self.add(path, FileKind::BlockDevice);
        let mut st = self.lock();
        st.devices.insert(path.to_owned(), dev);
        st.formats.insert(path.to_owned(), format);
    }

    /// Whether a path exists in the fake tree.
    pub fn exists(&self, path: impl AsRef<Path>) -> bool {
        self.lock().files.contains_key(path.as_ref())
    }

    /// The fake mounts, bottom first.
    pub fn mounts(&self) -> Vec<FakeMount> {
        self.lock().mounts.clone()
    }

    /// Mounts without recording (set up a host state before the test).
    pub fn preset_mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        self.lock().do_mount(source, target, fstype, flags, data)
    }

    /// Records a call and decides whether it fails by injection.
    fn enter(&self, call: SysCall, path: &Path) -> Result<MutexGuard<'_, State>, SysError> {
        let mut st = self.lock();
        let kind = call.kind();
        st.calls.push(call);
        let n = st.counts.entry(kind).or_insert(0);
        *n += 1;
        let n = *n;
        if let Some(i) = st
            .failures
            .iter()
            .position(|&(c, at, _)| c == kind && at == n)
        {
            let (_, _, errno) = st.failures.remove(i);
            return Err(SysError::call(kind, path, errno));
        }
        Ok(st)
    }
}

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
        if st
            .mounts
            .iter()
            .any(|m| m.target.starts_with(target) && m.target != target)
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

    fn create_file_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
        let path = &at.full();
        let call = SysCall::CreateFile {
            path: path.into(),
            mode,
        };
        let mut st = self.enter(call, path)?;
        parent_beneath(&st, Call::CreateFile, at, path)?;
        create(&mut st, Call::CreateFile, path, FileKind::File)
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
}

/// The fake mounts as mountinfo text, under a root mount of the disk.
fn mountinfo_text(st: &State) -> String {
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
fn stat_of(st: &State, path: &Path) -> Result<FileStat, SysError> {
    let kind = *st
        .files
        .get(path)
        .ok_or_else(|| SysError::call(Call::Stat, path, Errno::ENOENT))?;
    let rdev = st
        .devices
        .get(path)
        .copied()
        .unwrap_or(DevId { major: 0, minor: 0 });
    Ok(FileStat {
        kind,
        dev: st.identity_of(path).0,
        rdev,
        perm: 0o755,
    })
}

/// `ELOOP` (naming `named`) when a directory above `path` is a symlink in
/// the fake tree, as the real calls that resolve with `RESOLVE_NO_SYMLINKS`
/// from the start of the path refuse it.
fn no_symlink_above(st: &State, call: Call, path: &Path, named: &Path) -> Result<(), SysError> {
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
fn open_path_beneath(
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
fn parent_beneath(st: &State, call: Call, at: Beneath<'_>, path: &Path) -> Result<(), SysError> {
    let Some(parent) = at.parent() else {
        return Ok(());
    };
    st.check_beneath(call, parent.base, parent.rel, true)
        .map_err(|e| match e.errno() {
            Some(errno) => SysError::call(call, path, errno),
            None => e,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls a plugin makes on a target and its neighbours beneath the
    /// root refuse a symlink on the way as the kernel's
    /// `openat2(RESOLVE_NO_SYMLINKS)` does (`ELOOP`), and change nothing.
    #[test]
    fn beneath_and_removal_calls_refuse_a_symlink_on_the_way_and_change_nothing() {
        let sys = RecordingSys::new();
        sys.add("/k", FileKind::Dir);
        sys.add("/k/t", FileKind::Dir);
        sys.add("/k/link", FileKind::Symlink);
        let at = |p: &'static str| Beneath::split(Path::new("/k"), Path::new(p)).unwrap();
        let results: [(&str, Result<(), SysError>); 4] = [
            (
                "umount2",
                sys.umount2_beneath(at("/k/link/t"), MntFlags::empty()),
            ),
            ("chmod", sys.chmod_dir_beneath(at("/k/link/t"), 0o777)),
            (
                "create",
                sys.create_file_beneath(at("/k/link/ready"), 0o644),
            ),
            ("bind", sys.bind_beneath(at("/k/link/src"), at("/k/t"))),
        ];
        for (what, r) in results {
            assert_eq!(r.unwrap_err().errno(), Some(Errno::ELOOP), "{what}");
        }
        assert!(!sys.exists("/k/link/ready"));
        assert!(sys.mounts().is_empty());

        // removal refuses a symlink anywhere above what it acts on
        sys.add("/k/link/d", FileKind::Dir);
        sys.add("/k/link/f", FileKind::File);
        let removals: [(&str, Result<(), SysError>); 4] = [
            ("rmdir", sys.rmdir(Path::new("/k/link/d"))),
            ("unlink", sys.unlink(Path::new("/k/link/f"))),
            (
                "remove",
                sys.remove_beneath(Path::new("/k/link/d"), Path::new("x"), false),
            ),
            (
                "list",
                sys.read_dir_beneath(Path::new("/k/link/d"), Path::new(""))
                    .map(drop),
            ),
        ];
        for (what, r) in removals {
            assert_eq!(r.unwrap_err().errno(), Some(Errno::ELOOP), "{what}");
        }
        assert!(sys.exists("/k/link/d") && sys.exists("/k/link/f"));

        // the same calls on plain directories go through
        sys.add("/k/src", FileKind::Dir);
        sys.bind_beneath(at("/k/src"), at("/k/t")).unwrap();
        assert_eq!(sys.mounts().len(), 1);
        sys.umount2_beneath(at("/k/t"), MntFlags::empty()).unwrap();
        assert!(sys.mounts().is_empty());
        sys.chmod_dir_beneath(at("/k/t"), 0o777).unwrap();
        sys.create_file_beneath(at("/k/t/ready"), 0o644).unwrap();
        assert!(sys.exists("/k/t/ready"));
    }
}
