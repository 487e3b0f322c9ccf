//! The pure part of a native check: what was observed of a volume's
//! targets → the problems found, each with the `Pod.status.volumeHealth`
//! status, a CamelCase reason and a message; and two conditions → whether
//! the change is worth an event. No I/O, no clock.
//!
//! Thresholds (the kubelet has none for local storage; these are ours):
//! - **out of space**: no block left that a pod may write
//!   (`f_bavail == 0`). Filesystems volumed formats have no root reserve
//!   (`mkfs -m0`, as the kubelet), so this is the moment writes fail with
//!   `ENOSPC`; it clears as soon as one block is free again.
//! - **out of inodes**: the filesystem counts inodes (`f_files > 0`) and
//!   none is free (`f_ffree == 0`).
//! - **over `sizeLimit`**: an emptyDir uses more bytes than its
//!   `sizeLimit`: a memory emptyDir's tmpfs by its `statfs`; a disk
//!   emptyDir, which shares its filesystem with the node, by the blocks of
//!   its own files, walked as the kubelet's eviction manager measures it
//!   with `du` (the walk is bounded: one that stopped early still reports
//!   a limit it already passed, and says nothing otherwise).

use serde::Serialize;

use std::borrow::Cow;
use std::time::SystemTime;

use super::events::{ABNORMAL, NORMAL, VolumeEvent};
use super::{Condition, PodTarget, Source};
use crate::host::sys::FsUsage;

/// The `Pod.status.volumeHealth` status of a problem (Kubernetes 1.37).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Severity {
    /// the volume cannot be accessed
    Inaccessible,
    /// data loss has been detected
    DataLoss,
    /// the volume works with reduced capability
    Degraded,
}

impl Severity {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Inaccessible => "Inaccessible",
            Severity::DataLoss => "DataLoss",
            Severity::Degraded => "Degraded",
        }
    }
}

/// One problem found on a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// its category
    pub status: Severity,
    /// CamelCase, machine-parseable
    pub reason: &'static str,
    /// for people
    pub message: String,
}

/// What a mount target showed against the mount volumed made there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MountSeen {
    /// the same mount is there
    Same,
    /// no mount at the path any more
    Vanished,
    /// another mount (another mount id or device) is there
    Replaced,
}

/// What is gone from under a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gone {
    /// a local PV's block device (its path)
    Device(String),
    /// a hostPath's path
    Path(String),
}

/// Everything one native check observed of a volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Observation {
    /// per mount target: its path (for messages) and what was seen
    pub mounts: Vec<(String, MountSeen)>,
    /// `statfs` of the volume's data, when it answered
    pub usage: Option<FsUsage>,
    /// the volume is meant to be mounted read-only (`ro` in its options)
    pub expect_read_only: bool,
    /// ext4 `errors_count` when first seen and now
    pub fs_errors: Option<(u64, u64)>,
    /// the backing device or hostPath that is gone, if one is
    pub gone: Option<Gone>,
    /// an emptyDir's `sizeLimit` in bytes, judged against `walked` when
    /// there is one, else `usage`
    pub size_limit: Option<u64>,
    /// a disk emptyDir's own files, walked
    pub walked: Option<DirUsage>,
    /// a probe that failed outright (not "absent"): its error
    pub failed: Option<String>,
}

/// What a walk of a directory found: the disk space of every entry below
/// it (not crossing mounts, not following symlinks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DirUsage {
    /// bytes of disk space counted
    pub bytes: u64,
    /// the walk saw every entry (it stops at a bound)
    pub complete: bool,
}

/// The problems in `o`, most severe first (the order of the checks within a
/// severity is fixed, so the first finding is a stable summary).
pub(crate) fn findings(o: &Observation) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut add = |status, reason, message: String| {
        out.push(Finding {
            status,
            reason,
            message,
        })
    };
    match &o.gone {
        Some(Gone::Device(dev)) => add(
            Severity::Inaccessible,
            "BackingDeviceGone",
            format!("the device {dev} is gone"),
        ),
        Some(Gone::Path(path)) => add(
            Severity::Inaccessible,
            "HostPathGone",
            format!("the host path {path} is gone"),
        ),
        None => {}
    }
    for (path, seen) in &o.mounts {
        match seen {
            MountSeen::Same => {}
            MountSeen::Vanished => add(
                Severity::Inaccessible,
                "MountVanished",
                format!("{path} was unmounted outside volumed"),
            ),
            MountSeen::Replaced => add(
                Severity::Inaccessible,
                "MountReplaced",
                format!("{path} now holds another mount than the one volumed made"),
            ),
        }
    }
    if let Some(e) = &o.failed {
        add(Severity::Inaccessible, "ProbeFailed", e.clone());
    }
    if let Some((before, now)) = o.fs_errors
        && now > before
    {
        add(
            Severity::DataLoss,
            "FilesystemErrors",
            format!(
                "the filesystem reported {} new error(s) ({now} in all)",
                now - before
            ),
        );
    }
    if let (Some(limit), Some(w)) = (o.size_limit, o.walked)
        && w.bytes > limit
    {
        let at_least = if w.complete { "" } else { "at least " };
        add(
            Severity::Degraded,
            "SizeLimitExceeded",
            format!(
                "{at_least}{} bytes used, over the sizeLimit of {limit}",
                w.bytes
            ),
        );
    }
    let Some(u) = o.usage else {
        return out;
    };
    if u.read_only && !o.expect_read_only {
        add(
            Severity::Degraded,
            "ReadOnlyFilesystem",
            "the filesystem is read-only under a volume mounted read-write".to_owned(),
        );
    }
    if u.blocks > 0 && u.blocks_available == 0 {
        add(
            Severity::Degraded,
            "OutOfSpace",
            format!(
                "no space left: 0 of {} bytes available",
                u.blocks.saturating_mul(u.block_size)
            ),
        );
    }
    if u.files > 0 && u.files_free == 0 {
        add(
            Severity::Degraded,
            "OutOfInodes",
            format!("no inodes left: 0 of {} free", u.files),
        );
    }
    if let Some(limit) = o.size_limit.filter(|_| o.walked.is_none()) {
        let used = u
            .blocks
            .saturating_sub(u.blocks_free)
            .saturating_mul(u.block_size);
        if used > limit {
            add(
                Severity::Degraded,
                "SizeLimitExceeded",
                format!("{used} bytes used, over the sizeLimit of {limit}"),
            );
        }
    }
    out.sort_by_key(|f| f.status);
    out
}

/// What a change of a volume's condition is worth telling the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    /// nothing new
    None,
    /// it became abnormal, or abnormal for another reason
    Abnormal,
    /// it was abnormal and is normal again
    Recovered,
}

/// The transition from `before` (abnormal, reason; `None`: never judged)
/// to `now`.
pub(crate) fn transition(before: Option<(bool, &str)>, now: (bool, &str)) -> Transition {
    match (before, now) {
        (Some((true, r0)), (true, r1)) if r0 == r1 => Transition::None,
        (_, (true, _)) => Transition::Abnormal,
        (Some((true, _)), (false, _)) => Transition::Recovered,
        _ => Transition::None,
    }
}

/// A native check's findings as the volume's condition.
pub(super) fn native_condition(findings: Vec<Finding>, now: SystemTime) -> Condition {
    let abnormal = !findings.is_empty();
    let reason = findings.first().map_or("Healthy", |f| f.reason);
    let message = if abnormal {
        Cow::Owned(
            findings
                .iter()
                .map(|f| f.message.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        )
    } else {
        Cow::Borrowed("no problem found")
    };
    Condition {
        abnormal,
        reason,
        message,
        since: now,
        source: Source::Native,
        findings,
    }
}

/// A driver's `volume_condition` as the volume's condition. CSI v1.12's
/// condition has no category: an abnormal one is reported `Degraded`.
pub(super) fn csi_condition(abnormal: bool, message: String, now: SystemTime) -> Condition {
    let (reason, findings) = if abnormal {
        (
            ABNORMAL,
            vec![Finding {
                status: Severity::Degraded,
                reason: ABNORMAL,
                message: message.clone(),
            }],
        )
    } else {
        (NORMAL, Vec::new())
    };
    Condition {
        abnormal,
        reason,
        message: Cow::Owned(message),
        since: now,
        source: Source::Csi,
        findings,
    }
}

/// One event per pod using the volume.
pub(super) fn pod_events(
    pods: &[PodTarget],
    c: &Condition,
    t: Transition,
    now: SystemTime,
) -> Vec<VolumeEvent> {
    let (kind, reason) = match t {
        Transition::Recovered => ("Normal", NORMAL),
        _ => ("Warning", ABNORMAL),
    };
    let time = super::report::rfc3339(now);
    pods.iter()
        .map(|p| VolumeEvent {
            kind,
            reason,
            message: format!("Volume {}: {}", p.outer_name, c.message),
            pod_uid: p.uid.as_str().to_owned(),
            namespace: p.pod.as_ref().map(|r| r.namespace.to_string()),
            pod: p.pod.as_ref().map(|r| r.name.to_string()),
            time: time.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs(avail: u64, files_free: u64, ro: bool) -> FsUsage {
        FsUsage {
            block_size: 4096,
            blocks: 100,
            blocks_free: avail,
            blocks_available: avail,
            files: 50,
            files_free,
            read_only: ro,
        }
    }

    fn reasons(o: &Observation) -> Vec<(&'static str, Severity)> {
        findings(o).iter().map(|f| (f.reason, f.status)).collect()
    }

    /// One row per rule of the module doc, plus their order.
    #[test]
    fn observations_become_findings_most_severe_first() {
        use Severity::*;
        let healthy = Observation {
            mounts: vec![("/t".into(), MountSeen::Same)],
            usage: Some(fs(10, 10, false)),
            ..Default::default()
        };
        let rows: Vec<(Observation, Vec<(&str, Severity)>)> = vec![
            (healthy.clone(), vec![]),
            (Observation::default(), vec![]),
            (
                Observation {
                    mounts: vec![("/t".into(), MountSeen::Vanished)],
                    ..healthy.clone()
                },
                vec![("MountVanished", Inaccessible)],
            ),
            (
                Observation {
                    mounts: vec![("/t".into(), MountSeen::Replaced)],
                    ..healthy.clone()
                },
                vec![("MountReplaced", Inaccessible)],
            ),
            (
                Observation {
                    gone: Some(Gone::Device("/dev/sdz".into())),
                    ..healthy.clone()
                },
                vec![("BackingDeviceGone", Inaccessible)],
            ),
            (
                Observation {
                    gone: Some(Gone::Path("/srv/data".into())),
                    ..healthy.clone()
                },
                vec![("HostPathGone", Inaccessible)],
            ),
            (
                Observation {
                    fs_errors: Some((2, 2)),
                    ..healthy.clone()
                },
                vec![],
            ),
            (
                Observation {
                    fs_errors: Some((2, 3)),
                    ..healthy.clone()
                },
                vec![("FilesystemErrors", DataLoss)],
            ),
            (
                Observation {
                    usage: Some(fs(10, 10, true)),
                    ..healthy.clone()
                },
                vec![("ReadOnlyFilesystem", Degraded)],
            ),
            (
                Observation {
                    usage: Some(fs(10, 10, true)),
                    expect_read_only: true,
                    ..healthy.clone()
                },
                vec![],
            ),
            (
                Observation {
                    usage: Some(fs(0, 10, false)),
                    ..healthy.clone()
                },
                vec![("OutOfSpace", Degraded)],
            ),
            (
                Observation {
                    usage: Some(fs(1, 10, false)),
                    ..healthy.clone()
                },
                vec![],
            ),
            (
                Observation {
                    usage: Some(fs(10, 0, false)),
                    ..healthy.clone()
                },
                vec![("OutOfInodes", Degraded)],
            ),
            (
                Observation {
                    usage: Some(FsUsage {
                        files: 0,
                        files_free: 0,
                        ..fs(10, 0, false)
                    }),
                    ..healthy.clone()
                },
                vec![],
            ),
            (
                Observation {
                    size_limit: Some(90 * 4096),
                    usage: Some(fs(5, 10, false)),
                    ..healthy.clone()
                },
                vec![("SizeLimitExceeded", Degraded)],
            ),
            (
                Observation {
                    size_limit: Some(95 * 4096),
                    usage: Some(fs(5, 10, false)),
                    ..healthy.clone()
                },
                vec![],
            ),
            (
                // a disk emptyDir: its own files, not the node's filesystem
                Observation {
                    size_limit: Some(1000),
                    walked: Some(DirUsage {
                        bytes: 1001,
                        complete: true,
                    }),
                    usage: Some(fs(50, 10, false)),
                    ..healthy.clone()
                },
                vec![("SizeLimitExceeded", Degraded)],
            ),
            (
                Observation {
                    size_limit: Some(1000),
                    // the node's filesystem is 95% used: not the volume's
                    walked: Some(DirUsage {
                        bytes: 1000,
                        complete: true,
                    }),
                    usage: Some(fs(5, 10, false)),
                    ..healthy.clone()
                },
                vec![],
            ),
            (
                // a walk stopped at its bound, already past the limit
                Observation {
                    size_limit: Some(1000),
                    walked: Some(DirUsage {
                        bytes: 5000,
                        complete: false,
                    }),
                    ..healthy.clone()
                },
                vec![("SizeLimitExceeded", Degraded)],
            ),
            (
                Observation {
                    failed: Some("statfs /t: EIO".into()),
                    usage: None,
                    ..healthy.clone()
                },
                vec![("ProbeFailed", Inaccessible)],
            ),
            (
                Observation {
                    mounts: vec![("/t".into(), MountSeen::Vanished)],
                    fs_errors: Some((0, 1)),
                    usage: Some(fs(0, 10, true)),
                    ..healthy.clone()
                },
                vec![
                    ("MountVanished", Inaccessible),
                    ("FilesystemErrors", DataLoss),
                    ("ReadOnlyFilesystem", Degraded),
                    ("OutOfSpace", Degraded),
                ],
            ),
        ];
        for (i, (o, want)) in rows.iter().enumerate() {
            assert_eq!(&reasons(o), want, "row {i}: {o:?}");
        }
    }

    #[test]
    fn only_a_change_of_state_or_reason_is_a_transition() {
        use Transition::{Abnormal, Recovered};
        let rows = [
            (None, (false, "Healthy"), Transition::None),
            (None, (true, "OutOfSpace"), Abnormal),
            (Some((false, "Healthy")), (true, "OutOfSpace"), Abnormal),
            (
                Some((true, "OutOfSpace")),
                (true, "OutOfSpace"),
                Transition::None,
            ),
            (
                Some((true, "OutOfSpace")),
                (true, "MountVanished"),
                Abnormal,
            ),
            (Some((true, "OutOfSpace")), (false, "Healthy"), Recovered),
            (
                Some((false, "Healthy")),
                (false, "Healthy"),
                Transition::None,
            ),
        ];
        for (before, now, want) in rows {
            assert_eq!(transition(before, now), want, "{before:?} → {now:?}");
        }
    }
}
