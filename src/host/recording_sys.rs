//! [`RecordingSys`]: the recording fake of the syscall seam, for unit tests of
//! mount decisions and error paths: one syscall seam, and tests at the
//! least powerful layer that can show the behaviour (docs/testing.md).
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

mod calls;
mod links;
mod tree;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::host::fake_host::State;
use crate::host::sys::{
    Beneath, Call, DiskFormat, Errno, FileKind, FsUsage, MntFlags, MsFlags, Sys, SysError,
};
use crate::model::DevId;

pub(crate) use crate::host::fake_host::FakeMount;
pub(crate) use crate::host::sys::SysCall;

/// The recording fake (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct RecordingSys {
    state: Mutex<State>,
    /// calls on these paths sleep this long first, outside the lock, as a
    /// call stuck in the kernel (a dead NFS server) holds only its caller
    stalls: Mutex<Vec<(PathBuf, std::time::Duration)>>,
}

impl RecordingSys {
    /// An empty host: no files, no mounts.
    pub(crate) fn new() -> Self {
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
    pub(crate) fn fail_nth(&self, call: Call, nth: usize, errno: Errno) {
        let mut st = self.lock();
        let seen = st.counts.get(&call).copied().unwrap_or(0);
        st.failures.push((call, seen + nth, errno));
    }

    /// Makes the next call on `path` take `for_` before it does anything
    /// (other callers go on meanwhile).
    pub(crate) fn stall(&self, path: impl AsRef<Path>, for_: std::time::Duration) {
        let mut stalls = self.stalls.lock().unwrap_or_else(|p| p.into_inner());
        stalls.push((path.as_ref().to_path_buf(), for_));
    }

    /// Every call so far.
    pub(crate) fn calls(&self) -> Vec<SysCall> {
        self.lock().calls.clone()
    }

    /// How many `*_beneath` calls since the last clear walked their path from `base`
    /// (each is one path resolution from there in the real call).
    pub(crate) fn walks_from(&self, base: &Path) -> usize {
        let st = self.lock();
        let walks = st.walks.borrow();
        walks.iter().filter(|b| *b == base).count()
    }

    /// The calls so far that change the host.
    pub(crate) fn mutations(&self) -> Vec<SysCall> {
        self.calls().into_iter().filter(SysCall::mutates).collect()
    }

    /// Forgets the recorded calls (the fake host stays as it is).
    pub(crate) fn clear_calls(&self) {
        let mut st = self.lock();
        st.calls.clear();
        st.walks.get_mut().clear();
    }

    /// Adds a regular file holding `bytes` (and its missing parent
    /// directories) without recording.
    pub(crate) fn add_file(&self, path: impl AsRef<Path>, bytes: impl Into<Vec<u8>>) {
        let path = path.as_ref();
        self.add(path, FileKind::File);
        self.lock().contents.insert(path.to_owned(), bytes.into());
    }

    /// Adds a path of `kind` (and its missing parent directories) without recording.
    pub(crate) fn add(&self, path: impl AsRef<Path>, kind: FileKind) {
        let mut st = self.lock();
        let path = path.as_ref();
        for a in path.ancestors().skip(1) {
            st.files.entry(a.to_owned()).or_insert(FileKind::Dir);
        }
        st.files.insert(path.to_owned(), kind);
    }

    /// Adds a block device node standing for `dev`, holding `format`.
    pub(crate) fn add_device(&self, path: impl AsRef<Path>, dev: DevId, format: DiskFormat) {
        let path = path.as_ref();
        self.add(path, FileKind::BlockDevice);
        let mut st = self.lock();
        st.devices.insert(path.to_owned(), dev);
        st.formats.insert(path.to_owned(), format);
    }

    /// Makes `statfs` of any path on the filesystem `dev` answer `usage`.
    pub(crate) fn set_fs_usage(&self, dev: DevId, usage: FsUsage) {
        self.lock().usage.insert(dev, usage);
    }

    /// Whether a path exists in the fake tree.
    pub(crate) fn exists(&self, path: impl AsRef<Path>) -> bool {
        self.lock().files.contains_key(path.as_ref())
    }

    /// The bound fake loop devices (`/dev/loopN`) with their backing files.
    pub(crate) fn loops(&self) -> Vec<(PathBuf, PathBuf)> {
        let st = self.lock();
        st.loops
            .iter()
            .map(|(n, b)| (PathBuf::from(format!("/dev/loop{n}")), b.clone()))
            .collect()
    }

    /// Binds a fake loop device to `backing` without recording (a hold
    /// left by an earlier run).
    pub(crate) fn preset_loop(&self, backing: impl AsRef<Path>) {
        let mut st = self.lock();
        let n = (0..).find(|n| !st.loops.contains_key(n)).unwrap_or(0);
        st.loops.insert(n, backing.as_ref().to_owned());
    }

    /// The fake mounts, bottom first.
    pub(crate) fn mounts(&self) -> Vec<FakeMount> {
        self.lock().mounts.clone()
    }

    /// Mounts without recording (set up a host state before the test).
    pub(crate) fn preset_mount(
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
        let stall = {
            let mut stalls = self.stalls.lock().unwrap_or_else(|p| p.into_inner());
            let at = stalls.iter().position(|(p, _)| p == path);
            at.map(|i| stalls.remove(i).1)
        };
        if let Some(d) = stall {
            std::thread::sleep(d);
        }
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
                sys.create_file_beneath(at("/k/link/ready"), b"", 0o644),
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
        sys.create_file_beneath(at("/k/t/ready"), b"", 0o644)
            .unwrap();
        assert!(sys.exists("/k/t/ready"));
    }
}
