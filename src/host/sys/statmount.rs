//! `statmount(2)` (Linux 6.8): one mount's identity by its id, without
//! reading the whole mount table. A caller that has just mounted one path
//! learns what the kernel made of it in O(1), where `/proc/self/mountinfo`
//! costs O(every mount on the node) and made a mass start quadratic.
//!
//! The ABI is `include/uapi/linux/mount.h`: a request of
//! `{u32 size, u32 spare, u64 mnt_id, u64 param}` and a reply of a fixed
//! 512-byte header whose `[str]` fields are offsets into the strings that
//! follow it. Only the fields below are read; every caller falls back to
//! the table when the kernel lacks the call or a field.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use nix::errno::Errno;

use crate::model::DevId;

/// `__NR_statmount`: 457 wherever the syscall table is the shared one
/// (every architecture since Linux 5.1 but alpha and MIPS, which take the
/// table instead).
#[cfg(not(any(target_arch = "mips", target_arch = "mips64", target_arch = "mips32r6")))]
const SYS_STATMOUNT: Option<libc::c_long> = Some(457);
#[cfg(any(target_arch = "mips", target_arch = "mips64", target_arch = "mips32r6"))]
const SYS_STATMOUNT: Option<libc::c_long> = None;
/// `MNT_ID_REQ_SIZE_VER0`.
const REQ_SIZE_VER0: u32 = 24;

const SB_BASIC: u64 = 0x01;
const MNT_BASIC: u64 = 0x02;
const MNT_ROOT: u64 = 0x08;
const FS_TYPE: u64 = 0x20;
const MNT_OPTS: u64 = 0x80;
/// `MOUNT_ATTR_RDONLY` in `mnt_attr`: the per-mount `ro`.
const MOUNT_ATTR_RDONLY: u64 = 0x01;

/// `sizeof(struct statmount)`: the strings start here.
const HEADER: usize = 512;
// byte offsets of the header's fields
const OFF_MASK: usize = 8;
const OFF_SB_DEV_MAJOR: usize = 16;
const OFF_SB_DEV_MINOR: usize = 20;
const OFF_MNT_OPTS: usize = 4;
const OFF_FS_TYPE: usize = 36;
const OFF_MNT_ATTR: usize = 64;
const OFF_MNT_ROOT: usize = 104;

/// What `statmount` says of one mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MountStat {
    /// the super block's device (`sb_dev_major:sb_dev_minor`)
    pub dev: DevId,
    /// the mount's root within its filesystem
    pub root: OsString,
    /// the filesystem type (without a FUSE subtype)
    pub fs_type: String,
    /// the per-mount read-only flag
    pub read_only: bool,
    /// the super block's options, security ones (`context=`) included, as
    /// mountinfo's last field spells them after its `rw`/`ro`; `None` when
    /// there are none, or the kernel cannot say ([`reports_options`])
    pub options: Option<Vec<u8>>,
}

#[repr(C)]
struct MntIdReq {
    size: u32,
    spare: u32,
    mnt_id: u64,
    param: u64,
}

/// `statmount` of the mount with the unique id `mnt_id`
/// (`STATX_MNT_ID_UNIQUE`) in this process's mount namespace. `Err` when
/// the kernel has no such call, no such mount, or did not fill a field
/// asked for (the options alone may be missing).
pub(super) fn statmount(mnt_id: u64) -> Result<MountStat, Errno> {
    let nr = SYS_STATMOUNT.ok_or(Errno::ENOSYS)?;
    let want = SB_BASIC | MNT_BASIC | MNT_ROOT | FS_TYPE | MNT_OPTS;
    let req = MntIdReq {
        size: REQ_SIZE_VER0,
        spare: 0,
        mnt_id,
        param: want,
    };
    let mut buf = vec![0u8; 4096];
    loop {
        // SAFETY: `req` is a live `mnt_id_req` of the size it declares,
        // and `buf` is writable for the length passed; the kernel writes
        // no more than that (EOVERFLOW instead).
        let rc = unsafe { libc::syscall(nr, &raw const req, buf.as_mut_ptr(), buf.len(), 0u32) };
        if rc == 0 {
            break;
        }
        match Errno::last() {
            // long options: a larger buffer, within reason
            Errno::EOVERFLOW if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            e => return Err(e),
        }
    }
    parse(&buf, want)
}

/// The reply's fields; `Err(EINVAL)` when one asked for is missing.
fn parse(buf: &[u8], want: u64) -> Result<MountStat, Errno> {
    let got = u64_at(buf, OFF_MASK)?;
    let needed = want & !MNT_OPTS;
    if got & needed != needed {
        return Err(Errno::EINVAL);
    }
    Ok(MountStat {
        dev: DevId {
            major: u32_at(buf, OFF_SB_DEV_MAJOR)?,
            minor: u32_at(buf, OFF_SB_DEV_MINOR)?,
        },
        root: OsString::from_vec(str_at(buf, OFF_MNT_ROOT)?.to_vec()),
        fs_type: String::from_utf8_lossy(str_at(buf, OFF_FS_TYPE)?).into_owned(),
        read_only: u64_at(buf, OFF_MNT_ATTR)? & MOUNT_ATTR_RDONLY != 0,
        options: if got & MNT_OPTS != 0 {
            Some(str_at(buf, OFF_MNT_OPTS)?.to_vec())
        } else {
            None
        },
    })
}

fn u32_at(buf: &[u8], off: usize) -> Result<u32, Errno> {
    buf.get(off..off + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or(Errno::EINVAL)
}

fn u64_at(buf: &[u8], off: usize) -> Result<u64, Errno> {
    buf.get(off..off + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_ne_bytes)
        .ok_or(Errno::EINVAL)
}

/// The NUL-terminated string the `[str]` field at `off` points to.
fn str_at(buf: &[u8], off: usize) -> Result<&[u8], Errno> {
    let start = HEADER + usize::try_from(u32_at(buf, off)?).map_err(|_| Errno::EINVAL)?;
    let rest = buf.get(start..).ok_or(Errno::EINVAL)?;
    let end = rest.iter().position(|&b| b == 0).ok_or(Errno::EINVAL)?;
    Ok(&rest[..end])
}

/// Whether the kernel reports a mount's options (`STATMOUNT_MNT_OPTS`,
/// Linux 6.11): it leaves the field out both when a mount has none and
/// when it cannot tell, and only the release says which. A kernel that
/// got the call by a backport is taken as older: the table then decides.
pub(super) fn reports_options() -> bool {
    static OPTIONS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OPTIONS.get_or_init(|| {
        let uts = nix::sys::utsname::uname();
        uts.is_ok_and(|u| release_at_least(&u.release().to_string_lossy(), (6, 11)))
    })
}

/// Whether a kernel release (`6.18.44-fc-v857`) is at least `want`.
fn release_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release.split(['.', '-']).map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= want,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_compared_by_major_then_minor() {
        for (release, at_least) in [
            ("6.18.44-fc-v857", true),
            ("6.11.0", true),
            ("6.10.14-arch1", false),
            ("5.19.0", false),
            ("7.0", true),
            ("6", false),
            ("garbage", false),
        ] {
            assert_eq!(release_at_least(release, (6, 11)), at_least, "{release}");
        }
    }
}
