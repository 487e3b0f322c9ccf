//! The loop devices a raw block map leaves behind: volumed's hold over a
//! pod's map file (and, for CSI, the test driver's device behind it) has no
//! autoclear, as the kubelet's has none, so a test that dies before its
//! unmaps would leak it on the host. [`loops_below`] finds them by their
//! backing file in sysfs; [`LoopSweep`] detaches them however a test ends.

use std::fs;
use std::path::{Path, PathBuf};

/// The loop devices (`/dev/loopN`) bound to `path` or to a file below it,
/// as sysfs names their backing files. `path` may be gone: it is resolved
/// from its nearest ancestor still there, as the kernel names a file that
/// was unlinked after it was attached. Empty when sysfs cannot be read.
pub fn loops_below(path: &Path) -> Vec<PathBuf> {
    let Some(real) = path.ancestors().find_map(|a| {
        let base = fs::canonicalize(a).ok()?;
        Some(base.join(path.strip_prefix(a).ok()?))
    }) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(b) = fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        if Path::new(b.trim_end_matches('\n')).starts_with(&real) {
            out.push(Path::new("/dev").join(name));
        }
    }
    out.sort();
    out
}

/// Detaches, when dropped, every loop device still bound to a file below
/// its dir. Declare it after the test's env (so it runs before the env's
/// dir goes) and before the daemon and driver (so it runs after they are
/// gone, the holds no longer taken again).
pub struct LoopSweep(pub PathBuf);

impl Drop for LoopSweep {
    fn drop(&mut self) {
        for lo in loops_below(&self.0) {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(&lo)
                .status();
        }
    }
}
