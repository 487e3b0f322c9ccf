//! The node's memory from `/proc/meminfo`: `MemTotal`, which stands for the
//! node's allocatable memory when `--node-allocatable-memory` is not given
//! (a memory emptyDir is never sized past it, as the kubelet caps it).

use std::path::Path;

/// Where the kernel publishes it.
pub const MEMINFO_PATH: &str = "/proc/meminfo";

/// `MemTotal` in bytes from the text of `/proc/meminfo`; `None` when the
/// line is missing or malformed (the kernel gives it in kB, 1024 bytes).
pub fn mem_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// `MemTotal` read from `path` (`/proc/meminfo` but in tests).
pub fn read_mem_total(path: &Path) -> std::io::Result<Option<u64>> {
    std::fs::read_to_string(path).map(|t| mem_total(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let cases = [
            (
                "MemTotal:       16318152 kB\nMemFree: 1 kB\n",
                Some(16_318_152 * 1024),
            ),
            ("MemFree: 1 kB\nMemTotal: 4 kB\n", Some(4096)),
            ("MemTotal: 4096\n", Some(4096)),
            ("MemTotal: lots kB\n", None),
            ("MemTotal: 4 MB\n", None),
            ("MemFree: 1 kB\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(mem_total(text), want, "{text:?}");
        }
    }

    #[test]
    fn this_host_has_some_memory() {
        let got = read_mem_total(Path::new(MEMINFO_PATH)).unwrap();
        assert!(got.is_some_and(|n| n > 0), "{got:?}");
    }
}
