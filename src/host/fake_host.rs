//! The fake host behind [`crate::host::recording_sys::RecordingSys`]: an
//! in-memory file tree and mount table with just enough kernel behaviour for
//! the plugins' decisions (`EBUSY` on a mount point, `ENOTEMPTY`, `EXDEV`
//! and `ELOOP` for the beneath-walk, `EINVAL` on an unmounted target).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::host::sys::{Call, DiskFormat, Errno, FileKind, FsUsage, MsFlags, SysCall, SysError};
use crate::model::DevId;

/// The device number of the fake "disk" holding every unmounted path.
pub(crate) const DISK_DEV: DevId = DevId { major: 8, minor: 1 };

/// A mount in the fake table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FakeMount {
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
    /// a shared mount (`shared:<id>` in mountinfo)
    pub shared: bool,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) calls: Vec<SysCall>,
    pub(crate) counts: HashMap<Call, usize>,
    pub(crate) failures: Vec<(Call, usize, Errno)>,
    pub(crate) files: BTreeMap<PathBuf, FileKind>,
    /// what the regular files among `files` hold (empty when absent)
    pub(crate) contents: BTreeMap<PathBuf, Vec<u8>>,
    pub(crate) devices: BTreeMap<PathBuf, DevId>,
    pub(crate) formats: BTreeMap<PathBuf, DiskFormat>,
    pub(crate) mounts: Vec<FakeMount>,
    pub(crate) next_id: u32,
    pub(crate) next_anon: u32,
    /// `statfs` answers by filesystem (device)
    pub(crate) usage: BTreeMap<DevId, FsUsage>,
    /// the bound loop devices: number → the backing file's path
    pub(crate) loops: BTreeMap<u32, PathBuf>,
    /// the base every `*_beneath` call walked its path from, in order (a
    /// `*_in` call through a handle walks from the handle's dir); a cell,
    /// as the checks that note it look at the state without changing it
    pub(crate) walks: std::cell::RefCell<Vec<PathBuf>>,
}

impl State {
    pub(crate) fn top(&self, path: &Path) -> Option<&FakeMount> {
        self.mounts.iter().rev().find(|m| m.target == path)
    }

    /// (dev, root) of what `path` shows: a mount at or above it, else the disk.
    pub(crate) fn identity_of(&self, path: &Path) -> (DevId, PathBuf) {
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

    pub(crate) fn do_mount(
        &mut self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        let err = |e| SysError::call(Call::Mount, target, e);
        // a bind may land on a file, as the kernel binds a device node on
        // the file a raw block map makes; anything else needs a directory
        let on_file = flags.contains(MsFlags::MS_BIND)
            && !flags.contains(MsFlags::MS_REMOUNT)
            && self.files.get(target) == Some(&FileKind::File);
        if self.files.get(target) != Some(&FileKind::Dir) && !on_file {
            return Err(err(Errno::ENOENT));
        }
        let propagation =
            MsFlags::MS_SHARED | MsFlags::MS_PRIVATE | MsFlags::MS_SLAVE | MsFlags::MS_UNBINDABLE;
        if flags.intersects(propagation) {
            // As the kernel: only a mount point's propagation can change.
            if !self.is_mount_point(target) {
                return Err(err(Errno::EINVAL));
            }
            let rec = flags.contains(MsFlags::MS_REC);
            for m in &mut self.mounts {
                if m.target == target || (rec && m.target.starts_with(target)) {
                    m.shared = flags.contains(MsFlags::MS_SHARED);
                }
            }
            return Ok(());
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
                shared: false,
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
                shared: false,
            }
        };
        // A recursive bind clones every mount below its source onto the
        // same place below the target (bound onto itself: each one twice).
        let below: Vec<FakeMount> = match source {
            Some(src) if flags.contains(MsFlags::MS_BIND | MsFlags::MS_REC) => self
                .mounts
                .iter()
                .filter_map(|m| {
                    let rel = m.target.strip_prefix(src).ok()?;
                    (!rel.as_os_str().is_empty()).then(|| FakeMount {
                        target: target.join(rel),
                        ..m.clone()
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        self.mounts.push(mount);
        for mut m in below {
            m.id = self.next_id;
            self.next_id += 1;
            self.mounts.push(m);
        }
        Ok(())
    }

    pub(crate) fn is_mount_point(&self, path: &Path) -> bool {
        self.top(path).is_some()
    }

    pub(crate) fn children(&self, dir: &Path) -> Vec<(PathBuf, FileKind)> {
        self.files
            .range(dir.to_owned()..)
            .skip_while(|(p, _)| *p == dir)
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, k)| (p.clone(), *k))
            .collect()
    }

    pub(crate) fn remove(&mut self, call: Call, path: &Path, dir: bool) -> Result<(), SysError> {
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

    /// What `openat2(RESOLVE_BENEATH|NO_SYMLINKS)` would say of `base/rel`
    /// (with `NO_XDEV` too unless `cross_mounts`).
    pub(crate) fn check_beneath(
        &self,
        call: Call,
        base: &Path,
        rel: &Path,
        cross_mounts: bool,
    ) -> Result<(), SysError> {
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
                Some(FileKind::Dir) if !cross_mounts && self.is_mount_point(&p) => {
                    return Err(err(Errno::EXDEV));
                }
                Some(FileKind::Dir) => {}
                Some(_) => return Err(err(Errno::ENOTDIR)),
            }
        }
        Ok(())
    }
}

pub(crate) fn super_options(ro: bool, data: Option<&str>) -> String {
    let mut s = String::from(if ro { "ro" } else { "rw" });
    if let Some(d) = data.filter(|d| !d.is_empty()) {
        s.push(',');
        s.push_str(d);
    }
    s
}

pub(crate) fn create(
    st: &mut State,
    call: Call,
    path: &Path,
    kind: FileKind,
) -> Result<(), SysError> {
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
