//! The driver's own mount syscalls and mount-table reads.
//!
//! Deliberately independent of volumed's `host` module: the test driver
//! stands in for a third-party driver, so a bug in volumed's mountinfo
//! parsing must not be mirrored here and hidden.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// How many mounts sit exactly at `path` (stacked mounts count each); 0
/// when `path` does not exist.
pub fn mounts_at(path: &Path) -> io::Result<usize> {
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

/// Whether something is mounted at `path`.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    Ok(mounts_at(path)? > 0)
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

/// Mounts a fresh tmpfs at `target` (`data`: tmpfs options, if any).
pub fn mount_tmpfs(target: &Path, readonly: bool, data: Option<&str>) -> nix::Result<()> {
    let flags = if readonly {
        MsFlags::MS_RDONLY
    } else {
        MsFlags::empty()
    };
    mount(Some("tmpfs"), target, Some("tmpfs"), flags, data)
}

/// Bind-mounts `source` on `target` (not recursive), then makes the bind
/// read-only if asked (a bind ignores `MS_RDONLY` until remounted).
pub fn bind(source: &Path, target: &Path, readonly: bool) -> nix::Result<()> {
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
pub fn unmount(target: &Path) -> nix::Result<()> {
    umount2(target, MntFlags::UMOUNT_NOFOLLOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_decodes_octal_and_keeps_the_rest() {
        assert_eq!(unescape(br"/a\040b\134c"), PathBuf::from(r"/a b\c"));
        assert_eq!(unescape(br"/x\9"), PathBuf::from(r"/x\9"));
        assert_eq!(unescape(br"/end\04"), PathBuf::from(r"/end\04"));
    }
}
