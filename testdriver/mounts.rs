//! The driver's own mount syscalls and mount-table reads.
//!
//! Deliberately independent of volumed's `host` module: the test driver
//! stands in for a third-party driver, so a bug in volumed's mountinfo
//! parsing must not be mirrored here and hidden. New filesystems are
//! mounted with the new mount API (`fsopen`, `fsconfig`, `fsmount`,
//! `move_mount`), which nix does not wrap: the raw syscalls are here, each
//! unsafe block with its reason.

use std::ffi::CString;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// How many mounts sit exactly at `path` (stacked mounts count each); 0
/// when `path` does not exist.
pub(crate) fn mounts_at(path: &Path) -> io::Result<usize> {
    let path = match fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let table = fs::read("/proc/self/mountinfo")?;
    Ok(table
        .split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .filter(|field| unescape(field) == path)
        .count())
}

/// Whether something is mounted at `path`: asked of `statx`
/// (`STATX_ATTR_MOUNT_ROOT`, Linux 5.8), one call whatever the size of the
/// mount table, as a real driver's mount library asks it. The driver asks
/// at every call, and reading the table instead (megabytes on a node of
/// 10,000 volumes) made a mass start quadratic. A kernel that does not say
/// gets the table's answer.
pub(crate) fn is_mount_point(path: &Path) -> io::Result<bool> {
    match mount_root_attr(path) {
        Ok(Some(root)) => Ok(root),
        Ok(None) => Ok(mounts_at(path)? > 0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// `statx`'s answer to "is `path` (symlinks followed) the root of a
/// mount", `None` when the kernel does not give the attribute.
fn mount_root_attr(path: &Path) -> io::Result<Option<bool>> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and
    // `st` points to a writable `statx` buffer of the kernel's size.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            0,
            libc::STATX_BASIC_STATS,
            st.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the buffer was zeroed (a valid `statx`: plain integers) and
    // the call succeeded, filling it.
    let st = unsafe { st.assume_init() };
    let attr = u64::try_from(libc::STATX_ATTR_MOUNT_ROOT).unwrap_or(0);
    Ok((st.stx_attributes_mask & attr != 0).then_some(st.stx_attributes & attr != 0))
}

/// A mountinfo path field with its `\ooo` octal escapes (space, tab,
/// newline, backslash) decoded.
fn unescape(field: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// A new filesystem's mount options, sorted as mount(8) sorts them: the
/// per-mount flags it knows (`ro`, `noatime`, `nodev`, …) become mount
/// attributes; everything else — `size=`, `mode=`, `context="…"` — goes to
/// the filesystem, option by option.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct MountOptions {
    /// `MOUNT_ATTR_*` bits for `fsmount`.
    attrs: u64,
    /// What the filesystem parses: the option as written (for messages),
    /// its key and its value with one pair of enclosing double quotes
    /// removed (the new mount API takes values unquoted).
    fs: Vec<FsOption>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FsOption {
    text: String,
    key: String,
    value: Option<String>,
}

impl MountOptions {
    /// Parses CSI `mount_flags` as mount(8) parses `-o`: the entries joined
    /// by commas, then split at every comma outside double quotes, so
    /// `context="u:r:t:s0:c10,c20"` stays one option. `readonly` adds `ro`.
    pub(crate) fn parse(flags: &[String], readonly: bool) -> Self {
        let mut out = MountOptions::default();
        let joined = flags.join(",");
        let mut quoted = false;
        let mut pieces = Vec::new();
        let mut piece = String::new();
        for c in joined.chars() {
            match c {
                '"' => {
                    quoted = !quoted;
                    piece.push(c);
                }
                ',' if !quoted => pieces.push(std::mem::take(&mut piece)),
                _ => piece.push(c),
            }
        }
        pieces.push(piece);
        if readonly {
            pieces.push("ro".to_owned());
        }
        for p in pieces.into_iter().filter(|p| !p.is_empty()) {
            out.add(p);
        }
        out
    }

    /// Appends options of the driver's own (its fsGroup handling).
    pub(crate) fn with(mut self, extra: &[String]) -> Self {
        for p in extra {
            self.add(p.clone());
        }
        self
    }

    fn add(&mut self, text: String) {
        use libc::{
            MOUNT_ATTR__ATIME, MOUNT_ATTR_NODEV, MOUNT_ATTR_NODIRATIME, MOUNT_ATTR_NOEXEC,
            MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
        };
        let set_atime = |attrs: u64, a: u64| (attrs & !MOUNT_ATTR__ATIME) | a;
        match text.as_str() {
            // read-only: the mount, and the superblock too, as MS_RDONLY makes it
            "ro" => {
                self.attrs |= MOUNT_ATTR_RDONLY;
                self.fs.push(FsOption {
                    text: text.clone(),
                    key: text,
                    value: None,
                });
            }
            "noatime" => self.attrs = set_atime(self.attrs, libc::MOUNT_ATTR_NOATIME),
            "strictatime" => self.attrs = set_atime(self.attrs, libc::MOUNT_ATTR_STRICTATIME),
            "relatime" => self.attrs = set_atime(self.attrs, libc::MOUNT_ATTR_RELATIME),
            "nodiratime" => self.attrs |= MOUNT_ATTR_NODIRATIME,
            "nosuid" => self.attrs |= MOUNT_ATTR_NOSUID,
            "nodev" => self.attrs |= MOUNT_ATTR_NODEV,
            "noexec" => self.attrs |= MOUNT_ATTR_NOEXEC,
            // mount(8)'s defaults, nothing to set
            "rw" | "defaults" | "atime" | "diratime" | "suid" | "dev" | "exec" | "async" => {}
            _ => {
                let (key, value) = match text.split_once('=') {
                    Some((k, v)) => {
                        let v = v
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .unwrap_or(v);
                        (k.to_owned(), Some(v.to_owned()))
                    }
                    None => (text.clone(), None),
                };
                self.fs.push(FsOption { text, key, value });
            }
        }
    }
}

/// Why a new filesystem could not be mounted: the option the kernel
/// refused, or the step that failed, with the kernel's own words from the
/// filesystem context's log when it gave any.
#[derive(Debug)]
pub(crate) enum MountError {
    /// `fsconfig` refused this option.
    Option {
        /// The option as the caller wrote it.
        option: String,
        /// The errno.
        errno: nix::Error,
        /// The kernel's messages (`tmpfs: Unknown parameter 'context'`).
        kernel: String,
    },
    /// Another step (`fsopen`, creating the superblock, `fsmount`,
    /// `move_mount`) failed.
    Step {
        /// The step.
        step: &'static str,
        /// The errno.
        errno: nix::Error,
        /// The kernel's messages.
        kernel: String,
    },
}

impl std::fmt::Display for MountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let said = |k: &str| {
            if k.is_empty() {
                String::new()
            } else {
                format!(" (kernel: {k})")
            }
        };
        match self {
            MountError::Option {
                option,
                errno,
                kernel,
            } => write!(
                f,
                "mount option '{option}' rejected: {errno}{}",
                said(kernel)
            ),
            MountError::Step {
                step,
                errno,
                kernel,
            } => write!(f, "{step}: {errno}{}", said(kernel)),
        }
    }
}

/// Mounts a fresh tmpfs at `target` with `options`, through the new mount
/// API as util-linux 2.39's mount(8) does: each option is handed to the
/// filesystem on its own, so one the kernel refuses is named in the error.
pub(crate) fn mount_tmpfs(target: &Path, options: &MountOptions) -> Result<(), MountError> {
    let cstr = |s: &str| CString::new(s).map_err(|_| nix::Error::EINVAL);
    let step = |step: &'static str| {
        move |errno| MountError::Step {
            step,
            errno,
            kernel: String::new(),
        }
    };
    let fstype = c"tmpfs";
    // SAFETY: fsopen reads the NUL-terminated name and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), libc::FSOPEN_CLOEXEC) };
    let fs = owned(fd).map_err(step("fsopen tmpfs"))?;
    // the source mount(8) names, shown in the mount table ("none" without)
    let source = FsOption {
        text: "source=tmpfs".to_owned(),
        key: "source".to_owned(),
        value: Some("tmpfs".to_owned()),
    };
    for o in std::iter::once(&source).chain(&options.fs) {
        let refused = |errno| MountError::Option {
            option: o.text.clone(),
            errno,
            kernel: kernel_log(&fs),
        };
        let key = cstr(&o.key).map_err(refused)?;
        let value = o.value.as_deref().map(cstr).transpose().map_err(refused)?;
        let (cmd, value_ptr) = match &value {
            Some(v) => (libc::FSCONFIG_SET_STRING, v.as_ptr()),
            None => (libc::FSCONFIG_SET_FLAG, std::ptr::null()),
        };
        // SAFETY: key and value are NUL-terminated and outlive the call; a
        // flag takes a null value; fs is an open fs context.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                cmd,
                key.as_ptr(),
                value_ptr,
                0,
            )
        };
        nix::Error::result(r).map_err(refused)?;
    }
    let with_log = |step: &'static str| {
        let fs = &fs;
        move |errno| MountError::Step {
            step,
            errno,
            kernel: kernel_log(fs),
        }
    };
    // SAFETY: no pointers; fs is an open fs context.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            libc::FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    nix::Error::result(r).map_err(with_log("creating the tmpfs"))?;
    // SAFETY: no pointers; fs is a context with a created superblock.
    let m = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            libc::FSMOUNT_CLOEXEC,
            options.attrs,
        )
    };
    let mnt = owned(m).map_err(with_log("fsmount"))?;
    let to = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| step("the target path")(nix::Error::EINVAL))?;
    // SAFETY: both paths are NUL-terminated and outlive the call; mnt is
    // the detached mount fsmount returned.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    nix::Error::result(r).map_err(step("move_mount"))?;
    Ok(())
}

/// Gives the tmpfs mounted at `target` a new `size=` of `bytes`, through
/// its superblock (`fspick` then a reconfigure), as `mount -o
/// remount,size=` does for the filesystem but without touching the
/// mount's own flags: a read-only bind of the volume stays read-only.
pub(crate) fn remount_tmpfs_size(target: &Path, bytes: u64) -> nix::Result<()> {
    // the uapi values (linux/mount.h), which this libc does not export
    const FSPICK_CLOEXEC: libc::c_uint = 1;
    const FSPICK_SYMLINK_NOFOLLOW: libc::c_uint = 2;
    const FSCONFIG_CMD_RECONFIGURE: libc::c_uint = 7;
    let path = CString::new(target.as_os_str().as_bytes()).map_err(|_| nix::Error::EINVAL)?;
    // SAFETY: the path is NUL-terminated and outlives the call; fspick
    // returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_fspick,
            libc::AT_FDCWD,
            path.as_ptr(),
            FSPICK_CLOEXEC | FSPICK_SYMLINK_NOFOLLOW,
        )
    };
    let fs = owned(fd)?;
    let value = CString::new(bytes.to_string()).map_err(|_| nix::Error::EINVAL)?;
    // SAFETY: key and value are NUL-terminated and outlive the call; fs is
    // an open fs context.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            libc::FSCONFIG_SET_STRING,
            c"size".as_ptr(),
            value.as_ptr(),
            0,
        )
    };
    nix::Error::result(r)?;
    // SAFETY: no pointers; fs is an open fs context.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_RECONFIGURE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    nix::Error::result(r).map(drop)
}

/// The fd a syscall returned (or its errno), owned.
fn owned(r: libc::c_long) -> nix::Result<OwnedFd> {
    let fd = i32::try_from(nix::Error::result(r)?).map_err(|_| nix::Error::EBADF)?;
    // SAFETY: the syscall just returned this fd, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The messages the kernel left in a filesystem context's log, one per
/// read until it is empty, without their `e `/`w `/`i ` severity, joined
/// by `; `.
fn kernel_log(fs: &OwnedFd) -> String {
    let mut said = Vec::new();
    let mut buf = [0u8; 1024];
    // the log holds at most 8 messages
    for _ in 0..8 {
        match nix::unistd::read(fs, &mut buf) {
            Ok(n) if n > 0 => {
                let line = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
                let text = ["e ", "w ", "i "]
                    .iter()
                    .find_map(|p| line.strip_prefix(p))
                    .unwrap_or(&line);
                said.push(text.to_owned());
            }
            _ => break,
        }
    }
    said.join("; ")
}

/// Bind-mounts `source` on `target` (not recursive), then makes the bind
/// read-only if asked (a bind ignores `MS_RDONLY` until remounted).
pub(crate) fn bind(source: &Path, target: &Path, readonly: bool) -> nix::Result<()> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    if readonly {
        let remount = mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        );
        if let Err(e) = remount {
            // do not leave a writable bind behind a failed read-only publish
            let _ = umount2(target, MntFlags::UMOUNT_NOFOLLOW);
            return Err(e);
        }
    }
    Ok(())
}

/// Unmounts the top mount at `target`; no lazy detach.
pub(crate) fn unmount(target: &Path) -> nix::Result<()> {
    umount2(target, MntFlags::UMOUNT_NOFOLLOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `statx`'s answer is the mount table's, for mount points, plain
    /// dirs, a symlink to a mount point and a missing path.
    #[test]
    fn statx_says_what_the_mount_table_says() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("to-proc");
        std::os::unix::fs::symlink("/proc", &link).unwrap();
        let missing = dir.path().join("missing");
        let paths = [
            Path::new("/"),
            Path::new("/proc"),
            dir.path(),
            &link,
            &missing,
        ];
        for p in paths {
            assert_eq!(
                is_mount_point(p).unwrap(),
                mounts_at(p).unwrap() > 0,
                "{}",
                p.display()
            );
        }
        assert!(is_mount_point(Path::new("/proc")).unwrap());
        assert!(!is_mount_point(&missing).unwrap());
    }

    #[test]
    fn unescape_decodes_octal_and_keeps_the_rest() {
        assert_eq!(unescape(br"/a\040b\134c"), PathBuf::from(r"/a b\c"));
        assert_eq!(unescape(br"/x\9"), PathBuf::from(r"/x\9"));
        assert_eq!(unescape(br"/end\04"), PathBuf::from(r"/end\04"));
    }

    fn fs_keys(o: &MountOptions) -> Vec<(&str, Option<&str>)> {
        o.fs.iter()
            .map(|f| (f.key.as_str(), f.value.as_deref()))
            .collect()
    }

    #[test]
    fn options_split_at_commas_outside_quotes_and_values_lose_their_quotes() {
        let flags = [
            r#"context="system_u:object_r:container_file_t:s0:c10,c20""#.to_owned(),
            "size=1m,mode=0750".to_owned(),
            "noatime".to_owned(),
        ];
        let o = MountOptions::parse(&flags, false);
        assert_eq!(
            fs_keys(&o),
            [
                (
                    "context",
                    Some("system_u:object_r:container_file_t:s0:c10,c20")
                ),
                ("size", Some("1m")),
                ("mode", Some("0750")),
            ]
        );
        assert_eq!(
            o.fs[0].text,
            r#"context="system_u:object_r:container_file_t:s0:c10,c20""#
        );
        assert_eq!(o.attrs, libc::MOUNT_ATTR_NOATIME);
    }

    #[test]
    fn per_mount_flags_become_attributes_and_ro_reaches_the_superblock_too() {
        let flags = ["nodev,nosuid".to_owned(), "strictatime".to_owned()];
        let o = MountOptions::parse(&flags, true);
        assert_eq!(
            o.attrs,
            libc::MOUNT_ATTR_NODEV
                | libc::MOUNT_ATTR_NOSUID
                | libc::MOUNT_ATTR_STRICTATIME
                | libc::MOUNT_ATTR_RDONLY
        );
        assert_eq!(fs_keys(&o), [("ro", None)]);
        let o = MountOptions::parse(&["noatime,relatime".to_owned()], false);
        assert_eq!(
            o.attrs,
            libc::MOUNT_ATTR_RELATIME,
            "the last atime mode wins"
        );
        assert_eq!(MountOptions::parse(&[], false), MountOptions::default());
        let extra = MountOptions::parse(&[], false).with(&["gid=5".to_owned()]);
        assert_eq!(fs_keys(&extra), [("gid", Some("5"))]);
    }
}
