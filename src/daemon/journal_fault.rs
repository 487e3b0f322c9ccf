//! What the driver says when the journal turns unwritable or writable
//! again (`Effect::JournalWritable`): one log line and one event, each
//! naming the journal's filesystem (the mount holding the journal dir, its
//! free space, read-only or not), so an operator sees at once which disk
//! to free. `/readyz` and the metrics read the journal's state themselves.

use std::path::Path;

use crate::health::{EventSink, VolumeEvent};
use crate::host::sys::Sys;
use crate::journal::Journal;

/// The event's reason when the journal cannot be written.
pub(super) const JOURNAL_UNWRITABLE: &str = "JournalUnwritable";
/// The event's reason when it can be again.
pub(super) const JOURNAL_WRITABLE: &str = "JournalWritable";

/// How many parent dirs are looked at for the mount holding the journal.
const MAX_DEPTH: usize = 64;

/// The mount holding `dir` and its space, as a phrase: "the filesystem
/// mounted at /var/lib/kubelet (device 259:1, read-only), 0 B free of
/// 20.0 GiB".
pub(super) fn describe_filesystem(sys: &dyn Sys, dir: &Path) -> String {
    // The nearest of `dir` and its parents that is a mount root: O(depth)
    // `statx` calls, never a read of the mount table; the first gives the
    // device.
    let (mut mount, mut device) = (None, None);
    for p in dir.ancestors().take(MAX_DEPTH) {
        let Ok(probe) = sys.mount_probe(p) else {
            continue;
        };
        device.get_or_insert(probe.dev);
        if probe.mount_root == Some(true) {
            mount = Some(p);
            break;
        }
    }
    let mount = mount.map_or_else(|| "?".to_owned(), |p| p.display().to_string());
    let device = device.map_or_else(|| "?".to_owned(), |d| format!("{}:{}", d.major, d.minor));
    match sys.statfs(dir) {
        Ok(u) => format!(
            "the filesystem mounted at {mount} (device {device}{}), {} free of {}",
            if u.read_only { ", read-only" } else { "" },
            bytes(u.blocks_available.saturating_mul(u.block_size)),
            bytes(u.blocks.saturating_mul(u.block_size)),
        ),
        Err(e) => format!("the filesystem mounted at {mount} (its usage unknown: {e})"),
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Logs the journal's new state and records it as an event (kept in
/// `/debug/events`; it names no pod, so none is sent to the API server).
pub(super) fn report(journal: &Journal, sys: &dyn Sys, sink: &dyn EventSink, writable: bool) {
    let place = describe_filesystem(sys, journal.dir());
    let (kind, reason, message) = if writable {
        tracing::info!(journal = %journal.dir().display(), filesystem = %place,
            "the journal can be written again: operations start again");
        let message = format!(
            "journal {} can be written again on {place}; what waited goes on",
            journal.dir().display()
        );
        ("Normal", JOURNAL_WRITABLE, message)
    } else {
        let why = journal.unwritable_reason().unwrap_or_default();
        tracing::error!(journal = %journal.dir().display(), filesystem = %place, error = %why,
            "the journal cannot be written: no operation starts, mounted volumes stay; retried with backoff");
        let message = format!(
            "journal {} cannot be written ({why}) on {place}: no volume operation starts until it can; mounted volumes stay",
            journal.dir().display()
        );
        ("Warning", JOURNAL_UNWRITABLE, message)
    };
    sink.emit(VolumeEvent {
        kind,
        reason,
        message,
        pod_uid: String::new(),
        namespace: None,
        pod: None,
        time: crate::health::report::rfc3339(std::time::SystemTime::now()),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_an_operator_writes_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(4096), "4.0 KiB");
        assert_eq!(bytes(20 << 30), "20.0 GiB");
    }
}
