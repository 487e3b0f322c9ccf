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

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::host::mountinfo::{MountTable, escape};
use crate::host::sys::{
    Call, DirEntry, DiskFormat, Errno, FileKind, FileStat, MntFlags, MsFlags, Sys, SysError,
};
use crate::model::DevId;

/// One recorded call, with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SysCall {
    /// `mount(2)`
    Mount {
        /// source
        source: Option<PathBuf>,
        /// target
        target: PathBuf,
        /// fs type
        fstype: Option<String>,
        /// flags
        flags: MsFlags,
        /// data string
        data: Option<String>,
    },
    /// `umount2(2)`
    Umount {
        /// target
        target: PathBuf,
        /// flags
        flags: MntFlags,
    },
    /// mount-root probe
    MountRoot {
        /// path
        path: PathBuf,
    },
    /// mount id probe
    MntId {
        /// path
        path: PathBuf,
    },
    /// `statx`
    Stat {
        /// path
        path: PathBuf,
        /// follow a last symlink
        follow: bool,
    },
    /// `mkdir`
    Mkdir {
        /// path
        path: PathBuf,
        /// mode
        mode: u32,
    },
    /// chmod of a directory
    ChmodDir {
        /// path
        path: PathBuf,
        /// mode
        mode: u32,
    },
    /// exclusive file creation
    CreateFile {
        /// path
        path: PathBuf,
        /// mode
        mode: u32,
    },
    /// rename without replacing
    Rename {
        /// from
        from: PathBuf,
        /// to
        to: PathBuf,
    },
    /// `rmdir`
    Rmdir {
        /// path
        path: PathBuf,
    },
    /// `unlink`
    Unlink {
        /// path
        path: PathBuf,
    },
    /// directory listing beneath a base
    ReadDirBeneath {
        /// base
        base: PathBuf,
        /// relative dir
        rel: PathBuf,
    },
    /// removal beneath a base
    RemoveBeneath {
        /// base
        base: PathBuf,
        /// relative entry
        rel: PathBuf,
        /// as a directory
        dir: bool,
    },
    /// `mkfs.<fs>`
    Mkfs {
        /// device
        device: PathBuf,
        /// fs type
        fstype: String,
    },
    /// `blkid -p`
    ProbeFs {
        /// device
        device: PathBuf,
    },
    /// mountinfo read
    ReadMountinfo,
}

impl SysCall {
    /// The kind of call.
    pub fn kind(&self) -> Call {
        match self {
            SysCall::Mount { .. } => Call::Mount,
            SysCall::Umount { .. } => Call::Umount,
            SysCall::MountRoot { .. } => Call::MountRoot,
            SysCall::MntId { .. } => Call::MntId,
            SysCall::Stat { .. } => Call::Stat,
            SysCall::Mkdir { .. } => Call::Mkdir,
            SysCall::ChmodDir { .. } => Call::ChmodDir,
            SysCall::CreateFile { .. } => Call::CreateFile,
            SysCall::Rename { .. } => Call::Rename,
            SysCall::Rmdir { .. } => Call::Rmdir,
            SysCall::Unlink { .. } => Call::Unlink,
            SysCall::ReadDirBeneath { .. } => Call::ReadDirBeneath,
            SysCall::RemoveBeneath { .. } => Call::RemoveBeneath,
            SysCall::Mkfs { .. } => Call::Mkfs,
            SysCall::ProbeFs { .. } => Call::ProbeFs,
            SysCall::ReadMountinfo => Call::ReadMountinfo,
        }
    }

    /// Whether the call changes the host (as opposed to looking at it).
    pub fn mutates(&self) -> bool {
        !matches!(
            self.kind(),
            Call::MountRoot
                | Call::MntId
                | Call::Stat
                | Call::ReadDirBeneath
                | Call::ProbeFs
                | Call::ReadMountinfo
        )
    }
}

/// A mount in the fake table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeMount {
    /// mount id
    pub id: u32,
    /// where
    pub target: PathBuf,
    /// filesystem type
    pub fstype: String,
    /// source as mountinfo shows it
    pub source: String,
    /// device number of the filesystem
    pub dev: DevId,
    /// root within the filesystem
    pub root: PathBuf,
    /// read-only mount
    pub read_only: bool,
    /// super-block options as mountinfo shows them
    pub super_options: String,
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<SysCall>,
    counts: HashMap<Call, usize>,
    failures: Vec<(Call, usize, Errno)>,
    files: BTreeMap<PathBuf, FileKind>,
    devices: BTreeMap<PathBuf, DevId>,
    formats: BTreeMap<PathBuf, DiskFormat>,
    mounts: Vec<FakeMount>,
    next_id: u32,
    next_anon: u32,
}

/// The recording fake (see the module docs).
#[derive(Debug, Default)]
pub struct RecordingSys {
    state: Mutex<State>,
}

/// The device number of the fake "disk" holding every unmounted path.
pub const DISK_DEV: DevId = DevId { major: 8, minor: 1 };

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

impl State {
    fn top(&self, path: &Path) -> Option<&FakeMount> {
        self.mounts.iter().rev().find(|m| m.target == path)
    }

    /// (dev, root) of what `path` shows: a mount at or above it, else the disk.
    fn identity_of(&self, path: &Path) -> (DevId, PathBuf) {
        for a in path.ancestors() {
            if let Some(m) = self.top(a) {
                let rel = path.strip_prefix(a).unwrap_or(Path::new(""));
                let root = if rel.as_os_str().is_empty() {
                    m.root.clone()
                } else {
                    m.root.join(rel)
                };
                return (m.dev, root);
            }
        }
        (DISK_DEV, path.to_owned())
    }

    fn do_mount(
        &mut self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        let err = |e| SysError::call(Call::Mount, target, e);
        if self.files.get(target) != Some(&FileKind::Dir) {
            return Err(err(Errno::ENOENT));
        }
        let ro = flags.contains(MsFlags::MS_RDONLY);
        if flags.contains(MsFlags::MS_REMOUNT) {
            let top = self.mounts.iter_mut().rev().find(|m| m.target == target);
            let m = top.ok_or_else(|| err(Errno::EINVAL))?;
            m.read_only = ro;
            if !flags.contains(MsFlags::MS_BIND) {
                m.super_options = super_options(ro, data);
            }
            return Ok(());
        }
        let id = self.next_id;
        self.next_id += 1;
        let mount = if flags.contains(MsFlags::MS_BIND) {
            let src = source.ok_or_else(|| err(Errno::EINVAL))?;
            if !self.files.contains_key(src) {
                return Err(err(Errno::ENOENT));
            }
            let (dev, root) = self.identity_of(src);
            let like = src
                .ancestors()
                .find_map(|a| self.top(a).cloned())
                .map(|m| (m.fstype, m.source, m.super_options));
            let (fstype, source, super_options) =
                like.unwrap_or(("ext4".into(), "/dev/sda1".into(), "rw".into()));
            FakeMount {
                id,
                target: target.to_owned(),
                fstype,
                source,
                dev,
                root,
                read_only: ro,
                super_options,
            }
        } else {
            let fstype = fstype.ok_or_else(|| err(Errno::EINVAL))?.to_owned();
            let (dev, source) = if fstype == "tmpfs" {
                self.next_anon += 1;
                (
                    DevId {
                        major: 0,
                        minor: self.next_anon,
                    },
                    "tmpfs".to_owned(),
                )
            } else {
                let src = source.ok_or_else(|| err(Errno::EINVAL))?;
                let dev = *self.devices.get(src).ok_or_else(|| err(Errno::ENOTBLK))?;
                match self.formats.get(src) {
                    Some(DiskFormat::Filesystem(f)) if *f == fstype => {}
                    _ => return Err(err(Errno::EINVAL)),
                }
                (dev, src.to_string_lossy().into_owned())
            };
            FakeMount {
                id,
                target: target.to_owned(),
                fstype,
                source,
                dev,
                root: PathBuf::from("/"),
                read_only: ro,
                super_options: super_options(ro, data),
            }
        };
        self.mounts.push(mount);
        Ok(())
    }

    fn is_mount_point(&self, path: &Path) -> bool {
        self.top(path).is_some()
    }

    fn children(&self, dir: &Path) -> Vec<(PathBuf, FileKind)> {
        self.files
            .range(dir.to_owned()..)
            .skip_while(|(p, _)| *p == dir)
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, k)| (p.clone(), *k))
            .collect()
    }

    fn remove(&mut self, call: Call, path: &Path, dir: bool) -> Result<(), SysError> {
        let err = |e| SysError::call(call, path, e);
        match self.files.get(path) {
            None => Err(err(Errno::ENOENT)),
            Some(FileKind::Dir) if !dir => Err(err(Errno::EISDIR)),
            Some(k) if dir && *k != FileKind::Dir => Err(err(Errno::ENOTDIR)),
            _ if self.is_mount_point(path) => Err(err(Errno::EBUSY)),
            Some(FileKind::Dir) if !self.children(path).is_empty() => Err(err(Errno::ENOTEMPTY)),
            _ => {
                self.files.remove(path);
                Ok(())
            }
        }
    }

    /// What `openat2(RESOLVE_BENEATH|NO_XDEV|NO_SYMLINKS)` would say of `base/rel`.
    fn check_beneath(&self, call: Call, base: &Path, rel: &Path) -> Result<(), SysError> {
        let full = base.join(rel);
        let err = |e| SysError::call(call, &full, e);
        match self.files.get(base) {
            Some(FileKind::Dir) => {}
            Some(FileKind::Symlink) => return Err(err(Errno::ELOOP)),
            Some(_) => return Err(err(Errno::ENOTDIR)),
            None => return Err(err(Errno::ENOENT)),
        }
        let mut p = base.to_owned();
        for c in rel.components() {
            p.push(c);
            match self.files.get(&p) {
                None => return Err(err(Errno::ENOENT)),
                Some(FileKind::Symlink) => return Err(err(Errno::ELOOP)),
                Some(FileKind::Dir) if self.is_mount_point(&p) => return Err(err(Errno::EXDEV)),
                Some(FileKind::Dir) => {}
                Some(_) => return Err(err(Errno::ENOTDIR)),
            }
        }
        Ok(())
    }
}

fn super_options(ro: bool, data: Option<&str>) -> String {
    let mut s = String::from(if ro { "ro" } else { "rw" });
    if let Some(d) = data.filter(|d| !d.is_empty()) {
        s.push(',');
        s.push_str(d);
    }
    s
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

    fn umount2(&self, target: &Path, flags: MntFlags) -> Result<(), SysError> {
        let call = SysCall::Umount {
            target: target.to_owned(),
            flags,
        };
        let mut st = self.enter(call, target)?;
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

    fn chmod_dir(&self, path: &Path, mode: u32) -> Result<(), SysError> {
        let call = SysCall::ChmodDir {
            path: path.into(),
            mode,
        };
        let st = self.enter(call, path)?;
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

    fn rename(&self, from: &Path, to: &Path) -> Result<(), SysError> {
        let call = SysCall::Rename {
            from: from.into(),
            to: to.into(),
        };
        let mut st = self.enter(call, from)?;
        let err = |e| SysError::call(Call::Rename, from, e);
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

    fn rmdir(&self, path: &Path) -> Result<(), SysError> {
        let mut st = self.enter(SysCall::Rmdir { path: path.into() }, path)?;
        st.remove(Call::Rmdir, path, true)
    }

    fn unlink(&self, path: &Path) -> Result<(), SysError> {
        let mut st = self.enter(SysCall::Unlink { path: path.into() }, path)?;
        st.remove(Call::Unlink, path, false)
    }

    fn read_dir_beneath(&self, base: &Path, rel: &Path) -> Result<Vec<DirEntry>, SysError> {
        let call = SysCall::ReadDirBeneath {
            base: base.into(),
            rel: rel.into(),
        };
        let st = self.enter(call, &base.join(rel))?;
        st.check_beneath(Call::ReadDirBeneath, base, rel)?;
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
        st.check_beneath(Call::RemoveBeneath, base, parent)?;
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
        let st = self.enter(SysCall::ReadMountinfo, Path::new("/proc/self/mountinfo"))?;
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
            text.push_str(&format!(
                "{} {} {} {} {} {} - {} {} {}\n",
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
        Ok(MountTable::parse(text.as_bytes()))
    }
}

fn create(st: &mut State, call: Call, path: &Path, kind: FileKind) -> Result<(), SysError> {
    if st.files.contains_key(path) {
        return Err(SysError::call(call, path, Errno::EEXIST));
    }
    match path.parent().and_then(|p| st.files.get(p)) {
        Some(FileKind::Dir) => {
            st.files.insert(path.to_owned(), kind);
            Ok(())
        }
        Some(_) => Err(SysError::call(call, path, Errno::ENOTDIR)),
        None => Err(SysError::call(call, path, Errno::ENOENT)),
    }
}
