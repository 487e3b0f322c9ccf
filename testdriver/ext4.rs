//! Volumes backed by a real ext4 on a loop device, for the tests that need
//! a filesystem `resize2fs` grows (a tmpfs is grown by a remount, which
//! proves less).
//!
//! A volume asks for it in its volume context (the PV's
//! `volumeAttributes`): `volumed.test/backing: ext4`, with
//! `volumed.test/size-mib` (default 16). Its image is a sparse file in the
//! driver's state dir, `images/<volume id in hex>.img`, formatted on the
//! first NodeStageVolume and kept across unstage, as a disk keeps its data.
//! NodeStage mounts it with `mount -o loop` (util-linux sets the loop
//! device's autoclear flag, so the device goes when the mount does, even
//! when a test's mount namespace is torn down without an unstage);
//! NodeExpandVolume grows the image, tells the loop device its new
//! capacity (`losetup -c`) and grows the mounted filesystem online
//! (`resize2fs`).
//!
//! NodeExpandVolume carries no volume context: the image's existence is
//! what says a volume is ext4-backed.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use tonic::Status;

/// The volume context key that picks the backing.
pub(crate) const BACKING: &str = "volumed.test/backing";
/// The volume context key with the image's first size, in MiB.
pub(crate) const SIZE_MIB: &str = "volumed.test/size-mib";
/// The size of an image whose context gives none.
const DEFAULT_MIB: u64 = 16;

/// The image's size when `context` asks for an ext4 backing, else `None`.
pub(crate) fn wanted(context: &HashMap<String, String>) -> Result<Option<u64>, Status> {
    match context.get(BACKING).map(String::as_str) {
        None | Some("tmpfs") => Ok(None),
        Some("ext4") => {
            let mib = match context.get(SIZE_MIB) {
                None => DEFAULT_MIB,
                Some(text) => text.parse::<u64>().map_err(|e| {
                    Status::invalid_argument(format!("volume_context {SIZE_MIB} {text:?}: {e}"))
                })?,
            };
            Ok(Some(mib << 20))
        }
        Some(other) => Err(Status::invalid_argument(format!(
            "volume_context {BACKING} {other:?}: want tmpfs or ext4"
        ))),
    }
}

/// Where volume `id`'s image lives in the state dir `dir`.
pub(crate) fn image(dir: &Path, id: &str) -> PathBuf {
    let hex: String = id.bytes().map(|b| format!("{b:02x}")).collect();
    dir.join("images").join(format!("{hex}.img"))
}

/// Makes the image (formatted, `bytes` long) unless it exists, then
/// mounts it at `staging` through a loop device.
pub(crate) fn stage(image: &Path, bytes: u64, staging: &str) -> Result<(), Status> {
    if !image.exists() {
        let dir = image.parent().unwrap_or(Path::new("/"));
        fs::create_dir_all(dir).map_err(|e| failed("creating", dir, e))?;
        // formatted under a temporary name, so a crash mid-mkfs never
        // leaves an image that looks ready
        let fresh = image.with_extension("new");
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&fresh)
            .map_err(|e| failed("creating", &fresh, e))?;
        f.set_len(bytes).map_err(|e| failed("sizing", &fresh, e))?;
        drop(f);
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&fresh))?;
        fs::rename(&fresh, image).map_err(|e| failed("renaming", &fresh, e))?;
    }
    run(Command::new("mount")
        .args(["-t", "ext4", "-o", "loop"])
        .arg(image)
        .arg(staging))
}

/// Grows volume `id`'s image to `bytes` and the filesystem on it, online;
/// `None` when the volume has no image (a tmpfs volume). Answers the
/// device's size. Idempotent: an image already that big is only checked.
pub(crate) fn expand(image: &Path, bytes: u64) -> Result<Option<u64>, Status> {
    let len = match fs::metadata(image) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failed("stat", image, e)),
    };
    let device = loop_of(image)?.ok_or_else(|| {
        Status::failed_precondition(format!(
            "the image {} is not on a loop device: is the volume staged?",
            image.display()
        ))
    })?;
    if bytes > len {
        let f = OpenOptions::new()
            .write(true)
            .open(image)
            .map_err(|e| failed("opening", image, e))?;
        f.set_len(bytes).map_err(|e| failed("growing", image, e))?;
    }
    run(Command::new("losetup").arg("-c").arg(&device))?;
    run(Command::new("resize2fs").arg(&device))?;
    Ok(Some(bytes.max(len)))
}

/// The loop device `image` is attached to, if any.
fn loop_of(image: &Path) -> Result<Option<String>, Status> {
    let out = Command::new("losetup")
        .args(["-n", "-O", "NAME", "-j"])
        .arg(image)
        .output()
        .map_err(|e| Status::internal(format!("running losetup: {e}")))?;
    if !out.status.success() {
        return Err(Status::internal(format!(
            "losetup -j {}: {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().map(|l| l.trim().to_owned()))
}

/// Runs a tool; INTERNAL with its words when it fails.
fn run(cmd: &mut Command) -> Result<(), Status> {
    let out = cmd
        .output()
        .map_err(|e| Status::internal(format!("running {cmd:?}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Status::internal(format!(
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

fn failed(what: &str, path: &Path, e: io::Error) -> Status {
    Status::internal(format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_context_picks_the_backing_and_its_size() {
        let ctx = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(wanted(&ctx(&[])).ok(), Some(None));
        assert_eq!(wanted(&ctx(&[(BACKING, "tmpfs")])).ok(), Some(None));
        assert_eq!(
            wanted(&ctx(&[(BACKING, "ext4")])).ok(),
            Some(Some(16 << 20))
        );
        assert_eq!(
            wanted(&ctx(&[(BACKING, "ext4"), (SIZE_MIB, "64")])).ok(),
            Some(Some(64 << 20))
        );
        let bad = wanted(&ctx(&[(BACKING, "xfs")])).expect_err("xfs is not offered");
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(bad.message().contains("\"xfs\""), "{}", bad.message());
        let bad = wanted(&ctx(&[(BACKING, "ext4"), (SIZE_MIB, "big")])).expect_err("not a number");
        assert!(bad.message().contains(SIZE_MIB), "{}", bad.message());
    }

    #[test]
    fn an_image_name_cannot_leave_its_dir() {
        let p = image(Path::new("/state"), "../vol/1");
        assert_eq!(p, Path::new("/state/images/2e2e2f766f6c2f31.img"));
    }
}
