//! Device paths named by the journal → the major:minor the mount table
//! shows ([`MergeInput::device_ids`](super::MergeInput::device_ids)).
//!
//! The merge compares mounts by identity, not path strings, so a journal
//! that recorded `/dev/disk/by-uuid/…` or `/dev/loop3` must resolve to the
//! `7:3` in mountinfo's third field. `stat` follows the `/dev/disk/by-*`
//! symlinks for us; a block device's `st_rdev` is its number. A regular
//! file recorded as a device path (a local PV backed by an image file) is
//! resolved through the loop device the kernel attached it to
//! (`/sys/block/loop*/loop/backing_file`). Anything else — a directory
//! (the source of a bind), a missing path, a character device — is left out
//! of the map, and the merge falls back to comparing the mount source
//! lexically, where "unconfirmed" means "differs".
//!
//! *Invariant:* read-only: `stat`, `readlink`-free, reads of sysfs files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::host::sys::{FileKind, Sys};
use crate::model::DevId;

/// Where the kernel lists block devices.
const SYS_BLOCK: &str = "/sys/block";

/// Largest sysfs attribute read (a path or a `major:minor`).
const MAX_SYSFS_BYTES: u64 = 4096;

/// The device number `path` stands for: a block device's own number
/// (following symlinks), or the loop device backed by a regular file.
/// `None` when it is neither, or cannot be `stat`ed.
pub(crate) fn device_id(sys: &dyn Sys, path: &Path) -> Option<DevId> {
    device_id_in(sys, path, Path::new(SYS_BLOCK))
}

fn device_id_in(sys: &dyn Sys, path: &Path, sys_block: &Path) -> Option<DevId> {
    let st = sys.stat(path, true).ok()?;
    match st.kind {
        FileKind::BlockDevice => Some(st.rdev),
        FileKind::File => loop_backed_by(sys, &sys.canonicalize(path).ok()?, sys_block),
        _ => None,
    }
}

/// A sysfs attribute as text, without its trailing newline.
fn sysfs_attr(sys: &dyn Sys, path: &Path) -> Option<String> {
    let bytes = sys.read_file(path, MAX_SYSFS_BYTES, true).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    Some(text.trim_end_matches('\n').to_owned())
}

/// The loop device whose backing file is `file` (canonical), from sysfs.
fn loop_backed_by(sys: &dyn Sys, file: &Path, sys_block: &Path) -> Option<DevId> {
    for (name, _) in sys.read_dir(sys_block).ok()? {
        if !name.to_string_lossy().starts_with("loop") {
            continue;
        }
        let dir = sys_block.join(&name);
        let Some(backing) = sysfs_attr(sys, &dir.join("loop").join("backing_file")) else {
            continue;
        };
        if Path::new(&backing) != file {
            continue;
        }
        return sysfs_attr(sys, &dir.join("dev")).and_then(|s| parse_major_minor(s.trim()));
    }
    None
}

/// `"7:3"` → 7:3.
fn parse_major_minor(s: &str) -> Option<DevId> {
    let (major, minor) = s.split_once(':')?;
    Some(DevId {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
    })
}

/// Resolves every path in `paths`; unresolved ones are absent.
pub(crate) fn device_ids<'a>(
    sys: &dyn Sys,
    paths: impl IntoIterator<Item = &'a Path>,
) -> BTreeMap<PathBuf, DevId> {
    paths
        .into_iter()
        .filter_map(|p| device_id(sys, p).map(|id| (p.to_path_buf(), id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::FileTypeExt;

    use super::*;
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::{LinuxSys, Sys};

    #[test]
    fn missing_dirs_and_char_devices_are_unresolved() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(device_id(&LinuxSys, &tmp.path().join("absent")), None);
        assert_eq!(device_id(&LinuxSys, tmp.path()), None);
        assert_eq!(device_id(&LinuxSys, Path::new("/dev/null")), None);
    }

    #[test]
    fn a_symlink_to_a_block_device_resolves_to_its_number() {
        // A /dev/disk/by-* link, made in a temp dir; skipped where the
        // sandbox exposes no block device.
        let Some(dev) = ["/dev/loop0", "/dev/vda", "/dev/sda", "/dev/nvme0n1"]
            .into_iter()
            .map(Path::new)
            .find(|p| fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()))
        else {
            eprintln!("skipped: no block device visible in /dev");
            return;
        };
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("by-uuid-1234");
        std::os::unix::fs::symlink(dev, &link).unwrap();
        let want = LinuxSys.stat(dev, true).unwrap().rdev;
        assert_eq!(device_id(&LinuxSys, &link), Some(want));
    }

    #[test]
    fn an_image_file_resolves_through_its_loop_device() {
        let tmp = tempfile::tempdir().unwrap();
        let image = tmp.path().join("disk.img");
        fs::write(&image, b"").unwrap();
        let canonical = fs::canonicalize(&image).unwrap();
        let sys = tmp.path().join("sys-block");
        for (name, backing, dev) in [
            ("loop0", "/elsewhere.img\n", "7:0\n"),
            ("loop3", &*format!("{}\n", canonical.display()), "7:3\n"),
        ] {
            fs::create_dir_all(sys.join(name).join("loop")).unwrap();
            fs::write(sys.join(name).join("loop/backing_file"), backing).unwrap();
            fs::write(sys.join(name).join("dev"), dev).unwrap();
        }
        fs::create_dir_all(sys.join("sda")).unwrap();
        assert_eq!(
            loop_backed_by(&LinuxSys, &canonical, &sys),
            Some(DevId { major: 7, minor: 3 })
        );
        assert_eq!(
            device_id_in(&LinuxSys, &image, &sys),
            Some(DevId { major: 7, minor: 3 })
        );
        assert_eq!(parse_major_minor("x:1"), None);
    }

    #[test]
    fn the_fake_host_resolves_devices_and_loop_images() {
        let fake = RecordingSys::new();
        let sda = DevId { major: 8, minor: 0 };
        fake.add_device("/dev/sda", sda, crate::host::sys::DiskFormat::Unformatted);
        fake.add_file("/images/disk.img", "");
        fake.add_file("/sys/block/loop3/loop/backing_file", "/images/disk.img\n");
        fake.add_file("/sys/block/loop3/dev", "7:3\n");
        assert_eq!(device_id(&fake, Path::new("/dev/sda")), Some(sda));
        assert_eq!(
            device_id(&fake, Path::new("/images/disk.img")),
            Some(DevId { major: 7, minor: 3 })
        );
        assert_eq!(device_id(&fake, Path::new("/images")), None);
    }
}
