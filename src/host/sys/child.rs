//! Child processes behind the seam: `mkfs.<fs>` and `blkid`, and reading
//! what `blkid` prints.

use std::path::Path;
use std::process::Command;

use super::{Call, DiskFormat, SysError};

/// Runs a child, returning its stdout on success.
pub(super) fn run(
    call: Call,
    path: &Path,
    program: &str,
    cmd: &mut Command,
) -> Result<String, SysError> {
    let fail = |status: String, stderr: String| SysError::Command {
        call,
        path: path.to_owned(),
        program: program.to_owned(),
        status,
        stderr,
    };
    let out = cmd
        .output()
        .map_err(|e| fail(format!("could not start: {e}"), String::new()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        return Err(fail(out.status.to_string(), stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads `blkid -o export` output (`TYPE=ext4`, `PTTYPE=dos` lines).
pub fn parse_blkid_export(out: &str) -> DiskFormat {
    let value = |key: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    match (value("TYPE"), value("PTTYPE")) {
        (Some(fs), _) => DiskFormat::Filesystem(fs),
        (None, Some(pt)) => DiskFormat::PartitionTable(pt),
        (None, None) => DiskFormat::Unformatted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkid_export_is_read_like_the_kubelet_does() {
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/loop0\nTYPE=ext4\n"),
            DiskFormat::Filesystem("ext4".into())
        );
        assert_eq!(
            parse_blkid_export("DEVNAME=/dev/sda\nPTTYPE=gpt\n"),
            DiskFormat::PartitionTable("gpt".into())
        );
        assert_eq!(parse_blkid_export(""), DiskFormat::Unformatted);
    }
}
