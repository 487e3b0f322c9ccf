//! The passthrough: every FUSE request done on the backing tree through
//! the node's `O_PATH` descriptor (`*at` calls relative to it, or its
//! `/proc/self/fd` link to reopen it), the slow ones after the delay.
//!
//! Slow (sleep the delay, then do the work): write, fsync, fsyncdir,
//! flush, create, rename and a setattr that truncates — what a journal
//! waits for on a slow disk. Writes reach the server as the kernel's
//! writeback (`FUSE_WRITEBACK_CACHE`, when the kernel offers it): a
//! write(2) lands in the page cache and the wait comes with fsync, close
//! or the kernel's own flushing, as on a disk. Reads, lookups, getattr,
//! readdir, mknod, mkdir, unlink and statfs are not delayed: a real disk
//! serves most of them from the page cache, and a socket lookup must not
//! wait behind a flush.
//!
//! Not served: symlinks, hard links, xattrs (the journal dir has none) and
//! locks: without `FUSE_POSIX_LOCKS` or `FUSE_FLOCK_LOCKS` in the init
//! reply, the kernel keeps `flock` and `fcntl` locks itself, per kernel
//! inode, which is what sled's lock needs. Files are created by this
//! process (root); the caller's uid is not applied.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use fuser::{InitFlags, KernelConfig};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, FallocateFlags, OFlag, RenameFlags as NixRenameFlags};
use nix::sys::stat::{FchmodatFlags, FileStat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};

use crate::nodes::Nodes;

/// How long the kernel may keep an entry or attributes: every change goes
/// through this mount, so what it caches stays true.
const TTL: Duration = Duration::from_secs(1);

/// A directory listing taken at `opendir`: (backing inode, type, name).
type Listing = Vec<(u64, FileType, Vec<u8>)>;

/// The filesystem.
pub struct SlowFs {
    nodes: Nodes,
    /// open files, by handle
    files: Mutex<HashMap<u64, Arc<File>>>,
    /// open directories' listings, by handle
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_fh: AtomicU64,
    /// the delay in milliseconds (the delay file's watcher sets it)
    delay_ms: Arc<AtomicU64>,
    /// the kernel caches writes (`FUSE_WRITEBACK_CACHE`)
    writeback: bool,
}

/// The result of one request's work: a `nix` errno becomes the reply's.
type Res<T> = Result<T, Errno>;

fn fuse_err(e: Errno) -> fuser::Errno {
    fuser::Errno::from_i32(e as i32)
}

fn io_err(e: &std::io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

/// `/proc/self/fd/N` of `fd`: reopens or names its file, whatever path it
/// has now.
fn proc_path(fd: &impl AsRawFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

fn key(st: &FileStat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

fn kind(mode: u32) -> FileType {
    match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => FileType::Directory,
        SFlag::S_IFLNK => FileType::Symlink,
        SFlag::S_IFSOCK => FileType::Socket,
        SFlag::S_IFIFO => FileType::NamedPipe,
        SFlag::S_IFCHR => FileType::CharDevice,
        SFlag::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    let nanos = u32::try_from(nsec).unwrap_or(0);
    match u64::try_from(sec) {
        Ok(s) => UNIX_EPOCH + Duration::new(s, nanos),
        Err(_) => UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()),
    }
}

fn attr(ino: INodeNo, st: &FileStat) -> FileAttr {
    FileAttr {
        ino,
        size: u64::try_from(st.st_size).unwrap_or(0),
        blocks: u64::try_from(st.st_blocks).unwrap_or(0),
        atime: time(st.st_atime, st.st_atime_nsec),
        mtime: time(st.st_mtime, st.st_mtime_nsec),
        ctime: time(st.st_ctime, st.st_ctime_nsec),
        crtime: time(st.st_ctime, st.st_ctime_nsec),
        kind: kind(st.st_mode),
        perm: u16::try_from(st.st_mode & 0o7777).unwrap_or(0),
        nlink: u32::try_from(st.st_nlink).unwrap_or(u32::MAX),
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: u32::try_from(st.st_rdev).unwrap_or(0),
        blksize: u32::try_from(st.st_blksize).unwrap_or(4096),
        flags: 0,
    }
}

fn timespec(t: TimeOrNow) -> TimeSpec {
    match t {
        TimeOrNow::Now => TimeSpec::UTIME_NOW,
        TimeOrNow::SpecificTime(t) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            TimeSpec::from_duration(d)
        }
    }
}

/// The flags to reopen a file with: the kernel's open flags without those
/// that only mean something at creation, and without `O_APPEND` (the
/// kernel sends each write's offset, the file's end for an appending
/// writer). With the kernel caching writes, a write-only file is opened
/// for reading too: the kernel reads a page before writing part of it.
fn reopen_flags(flags: i32, writeback: bool) -> OFlag {
    let strip = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOCTTY | OFlag::O_TRUNC | OFlag::O_APPEND;
    let mut f = (OFlag::from_bits_truncate(flags) - strip) | OFlag::O_CLOEXEC;
    if writeback && f & OFlag::O_ACCMODE == OFlag::O_WRONLY {
        f = (f - OFlag::O_WRONLY) | OFlag::O_RDWR;
    }
    f
}

impl SlowFs {
    /// Serves the tree at `backing`, slowed by `delay_ms`.
    pub fn new(backing: &Path, delay_ms: Arc<AtomicU64>) -> Res<SlowFs> {
        let root = nix::fcntl::open(
            backing,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let st = nix::sys::stat::fstat(&root)?;
        Ok(SlowFs {
            nodes: Nodes::new(root, key(&st)),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            delay_ms,
            writeback: false,
        })
    }

    /// Sleeps the current delay: the slow disk.
    fn slow(&self) {
        let ms = self.delay_ms.load(Ordering::Relaxed);
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
    }

    fn file(&self, fh: FileHandle) -> Res<Arc<File>> {
        let files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        files.get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// The entry `name` in `parent`, remembered (its lookup counted).
    fn entry(&self, parent: INodeNo, name: &OsStr) -> Res<FileAttr> {
        let dir = self.nodes.fd(parent)?;
        let fd = nix::fcntl::openat(
            dir.as_fd(),
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        self.remembered(fd)
    }

    /// `fd` (an `O_PATH` descriptor) as a node, its lookup counted.
    fn remembered(&self, fd: OwnedFd) -> Res<FileAttr> {
        let st = nix::sys::stat::fstat(&fd)?;
        let ino = self.nodes.remember(fd, key(&st));
        Ok(attr(ino, &st))
    }

    fn getattr_of(&self, ino: INodeNo) -> Res<FileAttr> {
        let fd = self.nodes.fd(ino)?;
        let st = nix::sys::stat::fstat(fd.as_fd())?;
        Ok(attr(ino, &st))
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr_of(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        fh: Option<FileHandle>,
    ) -> Res<FileAttr> {
        let fd = self.nodes.fd(ino)?;
        let path = proc_path(&*fd);
        if let Some(size) = size {
            self.slow();
            let len = i64::try_from(size).map_err(|_| Errno::EFBIG)?;
            match fh.map(|fh| self.file(fh)) {
                Some(Ok(f)) => nix::unistd::ftruncate(f.as_fd(), len)?,
                _ => nix::unistd::truncate(path.as_str(), len)?,
            }
        }
        if let Some(mode) = mode {
            let mode = Mode::from_bits_truncate(mode & 0o7777);
            nix::sys::stat::fchmodat(
                nix::fcntl::AT_FDCWD,
                path.as_str(),
                mode,
                FchmodatFlags::FollowSymlink,
            )?;
        }
        if uid.is_some() || gid.is_some() {
            nix::unistd::fchownat(
                fd.as_fd(),
                "",
                uid.map(Uid::from_raw),
                gid.map(Gid::from_raw),
                AtFlags::AT_EMPTY_PATH,
            )?;
        }
        if atime.is_some() || mtime.is_some() {
            let keep = TimeSpec::UTIME_OMIT;
            nix::sys::stat::utimensat(
                nix::fcntl::AT_FDCWD,
                path.as_str(),
                &atime.map_or(keep, timespec),
                &mtime.map_or(keep, timespec),
                UtimensatFlags::FollowSymlink,
            )?;
        }
        self.getattr_of(ino)
    }

    fn open_file(&self, ino: INodeNo, flags: i32) -> Res<u64> {
        let fd = self.nodes.fd(ino)?;
        let file = nix::fcntl::open(
            proc_path(&*fd).as_str(),
            reopen_flags(flags, self.writeback),
            Mode::empty(),
        )?;
        let fh = self.new_fh();
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fh, Arc::new(File::from(file)));
        Ok(fh)
    }

    fn create_file(
        &self,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Res<(FileAttr, u64)> {
        self.slow();
        let dir = self.nodes.fd(parent)?;
        let flags = reopen_flags(flags, self.writeback)
            | OFlag::O_CREAT
            | (OFlag::from_bits_truncate(flags) & OFlag::O_EXCL);
        let mode = Mode::from_bits_truncate(mode & !umask & 0o7777);
        let file = File::from(nix::fcntl::openat(dir.as_fd(), name, flags, mode)?);
        // the node from the open file itself: the same inode whatever
        // renames come between
        let node = nix::fcntl::open(
            proc_path(&file).as_str(),
            OFlag::O_PATH | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let attr = self.remembered(node)?;
        let fh = self.new_fh();
        self.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(fh, Arc::new(file));
        Ok((attr, fh))
    }

    fn read_at(&self, fh: FileHandle, offset: u64, size: u32) -> Res<Vec<u8>> {
        let file = self.file(fh)?;
        let mut buf = vec![0u8; usize::try_from(size).map_err(|_| Errno::EINVAL)?];
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&e)),
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    fn write_at(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Res<u32> {
        self.slow();
        let file = self.file(fh)?;
        file.write_all_at(data, offset).map_err(|e| io_err(&e))?;
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    fn fsync_file(&self, fh: FileHandle, datasync: bool) -> Res<()> {
        self.slow();
        let file = self.file(fh)?;
        match datasync {
            true => nix::unistd::fdatasync(file.as_fd()),
            false => nix::unistd::fsync(file.as_fd()),
        }
    }

    fn list(&self, ino: INodeNo) -> Res<Listing> {
        let fd = self.nodes.fd(ino)?;
        let dir = std::fs::read_dir(proc_path(&*fd)).map_err(|e| io_err(&e))?;
        let st = nix::sys::stat::fstat(fd.as_fd())?;
        let mut out: Listing = vec![
            (st.st_ino, FileType::Directory, b".".to_vec()),
            (st.st_ino, FileType::Directory, b"..".to_vec()),
        ];
        for e in dir {
            let e = e.map_err(|e| io_err(&e))?;
            let ft = e.file_type().map_err(|e| io_err(&e))?;
            let kind = FileType::from_std(ft).unwrap_or(FileType::RegularFile);
            use std::os::unix::fs::DirEntryExt;
            out.push((e.ino(), kind, e.file_name().as_bytes().to_vec()));
        }
        Ok(out)
    }

    fn fsync_dir(&self, ino: INodeNo) -> Res<()> {
        self.slow();
        let fd = self.nodes.fd(ino)?;
        let dir = nix::fcntl::open(
            proc_path(&*fd).as_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        nix::unistd::fsync(dir)
    }

    fn make_node(
        &self,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Res<FileAttr> {
        let dir = self.nodes.fd(parent)?;
        let kind = SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits());
        let perm = Mode::from_bits_truncate(mode & !umask & 0o7777);
        nix::sys::stat::mknodat(dir.as_fd(), name, kind, perm, u64::from(rdev))?;
        self.entry(parent, name)
    }

    fn make_dir(&self, parent: INodeNo, name: &OsStr, mode: u32, umask: u32) -> Res<FileAttr> {
        let dir = self.nodes.fd(parent)?;
        let perm = Mode::from_bits_truncate(mode & !umask & 0o7777);
        nix::sys::stat::mkdirat(dir.as_fd(), name, perm)?;
        self.entry(parent, name)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, how: UnlinkatFlags) -> Res<()> {
        let dir = self.nodes.fd(parent)?;
        nix::unistd::unlinkat(dir.as_fd(), name, how)
    }

    fn rename_entry(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
    ) -> Res<()> {
        self.slow();
        let from = self.nodes.fd(parent)?;
        let to = self.nodes.fd(newparent)?;
        let flags = NixRenameFlags::from_bits(flags.bits()).ok_or(Errno::EINVAL)?;
        nix::fcntl::renameat2(from.as_fd(), name, to.as_fd(), newname, flags)
    }

    fn statfs_of(&self, ino: INodeNo) -> Res<nix::sys::statvfs::Statvfs> {
        let fd = self.nodes.fd(ino)?;
        nix::sys::statvfs::statvfs(proc_path(&*fd).as_str())
    }

    fn allocate(&self, fh: FileHandle, offset: u64, length: u64, mode: i32) -> Res<()> {
        self.slow();
        let file = self.file(fh)?;
        let offset = i64::try_from(offset).map_err(|_| Errno::EFBIG)?;
        let length = i64::try_from(length).map_err(|_| Errno::EFBIG)?;
        nix::fcntl::fallocate(
            file.as_fd(),
            FallocateFlags::from_bits_truncate(mode),
            offset,
            length,
        )
    }
}

impl Filesystem for SlowFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Writes go to the kernel's page cache and reach this server as
        // writeback, in large requests, on fsync, close or when the kernel
        // flushes: as on a disk, a buffered write does not wait for the
        // device, a sync does. Without it every write(2) would wait the
        // delay (sled's reopen alone makes some 250 small writes).
        self.writeback = config
            .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
            .is_ok();
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.entry(parent, name) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.nodes.forget(ino, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.getattr_of(ino) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        match self.setattr_of(ino, mode, uid, gid, size, atime, mtime, fh) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        match self.make_node(parent, name, mode, umask, rdev) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.make_dir(parent, name, mode, umask) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self.rename_entry(parent, name, newparent, newname, flags) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.open_file(ino, flags.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.read_at(fh, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.write_at(fh, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // nothing is buffered here: a close on a slow disk only waits
        self.slow();
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        files.remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fsync_file(fh, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.list(ino) {
            Ok(listing) => {
                let fh = self.new_fh();
                let mut dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
                dirs.insert(fh, Arc::new(listing));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listing = {
            let dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
            dirs.get(&fh.0).cloned()
        };
        let Some(listing) = listing else {
            reply.error(fuser::Errno::EBADF);
            return;
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, kind, name)) in listing.iter().enumerate().skip(start) {
            // the offset handed back is where the next call starts
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let mut dirs = self.dirs.lock().unwrap_or_else(PoisonError::into_inner);
        dirs.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fsync_dir(ino) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        match self.statfs_of(ino) {
            Ok(s) => reply.statfs(
                s.blocks(),
                s.blocks_free(),
                s.blocks_available(),
                s.files(),
                s.files_free(),
                u32::try_from(s.block_size()).unwrap_or(4096),
                u32::try_from(s.name_max()).unwrap_or(255),
                u32::try_from(s.fragment_size()).unwrap_or(4096),
            ),
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.create_file(parent, name, mode, umask, flags) {
            Ok((a, fh)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::empty())
            }
            Err(e) => reply.error(fuse_err(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.allocate(fh, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fuse_err(e)),
        }
    }
}
