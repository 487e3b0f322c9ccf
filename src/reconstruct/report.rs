//! The dry run's document: per target what the journal says, what the host
//! says, the decision and the reason (docs/cli.md, `volumed
//! reconstruct --dry-run`), as JSON or as a table for people.
//!
//! JSON shape (fields may be added, never renamed):
//! `{"boot_id", "journal": "on"|"off"|"unreadable", "journal_note",
//! "targets": [{"volume", "target": "device"|"pod", "pod_uid", "kind",
//! "path", "journal_says", "host_says", "boot": "same"|"rebooted",
//! "decision": "mounted"|"uncertain"|"not_mounted", "reason", "observed"}],
//! "failed": [{"path", "target", "pod_uid", "plugin", "spec_name",
//! "host_says", "reason", "cause"}], "unmounted_outside": [{"volume",
//! "target", "pod_uid", "path"}], "orphan_leftovers": [{"volume", "target",
//! "pod_uid", "path", "dir_present"}], "problems": [string]}`.
//!
//! Pure: renders a [`MergeOutput`].

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::journal::TargetKey;
use crate::model::{MountIdentity, TargetRef};

use super::edge::JournalInput;
use super::{Boot, HostObservation, MergeOutput, RebuildFailure};

/// The dry run's document.
#[derive(Debug, Clone, Serialize)]
pub struct ReconstructReport {
    /// the boot id now
    pub boot_id: String,
    /// `on`, `off` or `unreadable`
    pub journal: &'static str,
    /// why the journal is unreadable, or that it was read from a copy
    pub journal_note: Option<String>,
    /// one row per decided target
    pub targets: Vec<TargetRow>,
    /// host-found targets that could not be rebuilt (forced cleanup later)
    pub failed: Vec<FailedRow>,
    /// targets unmounted outside volumed during this boot
    pub unmounted_outside: Vec<KeyRow>,
    /// not-mounted `mount` targets whose dirs go to orphan cleanup
    pub orphan_leftovers: Vec<LeftoverRow>,
    /// what the host scan skipped, and why
    pub problems: Vec<String>,
}

/// One decided target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetRow {
    /// the unique volume name
    pub volume: String,
    /// `device` or `pod`
    pub target: &'static str,
    /// the pod, `null` for the device target
    pub pod_uid: Option<String>,
    /// `mount`, `dir` or `none`
    pub kind: &'static str,
    /// the target's path (lossy UTF-8)
    pub path: Option<String>,
    /// what the journal says (`mounted`, `intent setup (single step)`, `nothing`, `off`, …)
    pub journal_says: String,
    /// what the host shows compared with it (`matches`, `differs`, `absent`, …)
    pub host_says: &'static str,
    /// `same` or `rebooted`
    pub boot: &'static str,
    /// `mounted`, `uncertain` or `not_mounted`
    pub decision: &'static str,
    /// the merge-table row (`Reason::as_str`)
    pub reason: &'static str,
    /// the mount the host shows, `major:minor root fstype ro|rw [context]`
    pub observed: Option<String>,
}

/// A host-found target that could not be rebuilt.
#[derive(Debug, Clone, Serialize)]
pub struct FailedRow {
    /// its path
    pub path: String,
    /// `device` or `pod`
    pub target: &'static str,
    /// the pod, `null` for a device target
    pub pod_uid: Option<String>,
    /// the plugin as found
    pub plugin: String,
    /// the spec name from the path
    pub spec_name: String,
    /// `mounted`, `dir_present`, `absent`, or for a raw block pod map
    /// `mapped` (its symlink and its bind) or `partly_mapped`
    pub host_says: &'static str,
    /// always `rebuild_failed`
    pub reason: &'static str,
    /// why
    pub cause: String,
}

/// A target named by its key.
#[derive(Debug, Clone, Serialize)]
pub struct KeyRow {
    /// the unique volume name
    pub volume: String,
    /// `device` or `pod`
    pub target: &'static str,
    /// the pod, `null` for the device target
    pub pod_uid: Option<String>,
    /// its path, when the decision names one
    pub path: Option<String>,
}

/// A leftover mount-point dir.
#[derive(Debug, Clone, Serialize)]
pub struct LeftoverRow {
    /// the unique volume name
    pub volume: String,
    /// `device` or `pod`
    pub target: &'static str,
    /// the pod, `null` for the device target
    pub pod_uid: Option<String>,
    /// the dir
    pub path: String,
    /// whether the host showed it
    pub dir_present: bool,
}

fn target_of(t: &TargetRef) -> (&'static str, Option<String>) {
    match t {
        TargetRef::Device => ("device", None),
        TargetRef::Pod(uid) => ("pod", Some(uid.as_str().to_owned())),
    }
}

fn lossy(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// `7:0 / ext4 rw` (plus the label when there is one).
fn identity_text(i: &MountIdentity) -> String {
    let mut s = format!(
        "{} {} {} {}",
        i.dev,
        i.root.display(),
        i.fs_type,
        if i.read_only { "ro" } else { "rw" }
    );
    if let Some(c) = &i.selinux {
        let _ = write!(s, " {c}");
    }
    s
}

fn observation_text(o: &HostObservation) -> &'static str {
    match o {
        HostObservation::Absent => "absent",
        HostObservation::DirPresent => "dir_present",
        HostObservation::Mounted(_) => "mounted",
        HostObservation::Mapped(super::BlockMap {
            link: Some(_),
            bound: true,
        }) => "mapped",
        HostObservation::Mapped(_) => "partly_mapped",
    }
}

/// Builds the document from the merge's output.
pub fn report(
    out: &MergeOutput,
    boot_id: &str,
    journal: JournalInput<'_>,
    problems: Vec<String>,
) -> ReconstructReport {
    let note = match journal {
        JournalInput::Unreadable { reason } => Some(reason.to_owned()),
        JournalInput::Off | JournalInput::Replayed(_) => None,
    };
    report_with(out, boot_id, journal.as_str(), note, problems)
}

/// [`report`] with the journal input already reduced to its name and note.
pub(super) fn report_with(
    out: &MergeOutput,
    boot_id: &str,
    journal: &'static str,
    journal_note: Option<String>,
    problems: Vec<String>,
) -> ReconstructReport {
    let path_of = |key: &TargetKey| out.decision(key).and_then(|d| d.params.path()).map(lossy);
    let targets = out
        .decisions
        .iter()
        .map(|d| {
            let (target, pod_uid) = target_of(&d.key.target);
            TargetRow {
                volume: d.key.volume.as_str().to_owned(),
                target,
                pod_uid,
                kind: d.kind.as_str(),
                path: d.params.path().map(lossy),
                journal_says: d.journal_says.to_string(),
                host_says: d.host_says.as_str(),
                boot: match d.boot {
                    Boot::Same => "same",
                    Boot::Rebooted => "rebooted",
                },
                decision: d.result.as_str(),
                reason: d.reason.as_str(),
                observed: d.observed.as_ref().map(identity_text),
            }
        })
        .collect();
    let failed = out
        .failed
        .iter()
        .map(|f| {
            let (target, pod_uid) = target_of(&f.target);
            FailedRow {
                path: lossy(&f.path),
                target,
                pod_uid,
                plugin: f.plugin_name.clone(),
                spec_name: f.spec_name.clone(),
                host_says: observation_text(&f.observation),
                reason: f.reason().as_str(),
                cause: match &f.cause {
                    RebuildFailure::UnknownPlugin => "no volumed plugin for it".to_owned(),
                    RebuildFailure::MissingMetadata(what) => what.clone(),
                },
            }
        })
        .collect();
    let unmounted_outside = out
        .unmounted_outside
        .iter()
        .map(|k| {
            let (target, pod_uid) = target_of(&k.target);
            KeyRow {
                volume: k.volume.as_str().to_owned(),
                target,
                pod_uid,
                path: path_of(k),
            }
        })
        .collect();
    let orphan_leftovers = out
        .orphan_leftovers
        .iter()
        .map(|l| {
            let (target, pod_uid) = target_of(&l.key.target);
            LeftoverRow {
                volume: l.key.volume.as_str().to_owned(),
                target,
                pod_uid,
                path: lossy(&l.path),
                dir_present: l.dir_present,
            }
        })
        .collect();
    ReconstructReport {
        boot_id: boot_id.to_owned(),
        journal,
        journal_note,
        targets,
        failed,
        unmounted_outside,
        orphan_leftovers,
        problems,
    }
}

/// The table `reconstruct --dry-run` prints by default: one line per target.
pub fn render_table(r: &ReconstructReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "boot {}  journal {}", r.boot_id, r.journal);
    if let Some(note) = &r.journal_note {
        let _ = writeln!(out, "note: {note}");
    }
    // sized to the content: an emptyDir's unique name carries its pod UID
    let mut rows = vec![crate::util::table::cells([
        "DECISION", "REASON", "VOLUME", "TARGET", "POD", "KIND", "JOURNAL", "HOST", "BOOT", "PATH",
    ])];
    for t in &r.targets {
        rows.push(vec![
            t.decision.to_string(),
            t.reason.to_string(),
            t.volume.to_string(),
            t.target.to_string(),
            t.pod_uid.as_deref().unwrap_or("-").to_owned(),
            t.kind.to_string(),
            t.journal_says.to_string(),
            t.host_says.to_string(),
            t.boot.to_string(),
            t.path.as_deref().unwrap_or("-").to_owned(),
        ]);
    }
    out.push('\n');
    out.push_str(&crate::util::table::columns(&rows));
    if !r.failed.is_empty() {
        let _ = writeln!(out, "\nfailed to rebuild ({}):", r.failed.len());
        for f in &r.failed {
            let _ = writeln!(
                out,
                "  {:<6}  {:<36}  {:<24}  {:<11}  {}  ({})",
                f.target,
                f.pod_uid.as_deref().unwrap_or("-"),
                f.plugin,
                f.host_says,
                f.path,
                f.cause
            );
        }
    }
    if !r.unmounted_outside.is_empty() {
        let _ = writeln!(
            out,
            "\nunmounted outside volumed ({}):",
            r.unmounted_outside.len()
        );
        for k in &r.unmounted_outside {
            let _ = writeln!(
                out,
                "  {}  {}  {}",
                k.volume,
                k.pod_uid.as_deref().unwrap_or(k.target),
                k.path.as_deref().unwrap_or("-")
            );
        }
    }
    if !r.orphan_leftovers.is_empty() {
        let _ = writeln!(out, "\norphan leftovers ({}):", r.orphan_leftovers.len());
        for l in &r.orphan_leftovers {
            let _ = writeln!(
                out,
                "  {}  {}  {}{}",
                l.volume,
                l.pod_uid.as_deref().unwrap_or(l.target),
                l.path,
                if l.dir_present { "" } else { "  (gone)" }
            );
        }
    }
    if !r.problems.is_empty() {
        let _ = writeln!(out, "\nscan problems ({}):", r.problems.len());
        for p in &r.problems {
            let _ = writeln!(out, "  {p}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(volume: &str, pod: Option<&str>) -> TargetRow {
        TargetRow {
            volume: volume.into(),
            target: if pod.is_some() { "pod" } else { "device" },
            pod_uid: pod.map(str::to_owned),
            kind: "mount",
            path: Some(format!("/r/{volume}")),
            journal_says: "mounted".into(),
            host_says: "matches",
            boot: "same",
            decision: "mounted",
            reason: "journal_and_host_agree",
            observed: None,
        }
    }

    #[test]
    fn the_table_lines_up_whatever_the_names_length() {
        let long = "kubernetes.io/empty-dir/0f3a9c1e-5b7d-4e2a-9c8b-1d2e3f4a5b6c-cache";
        let r = ReconstructReport {
            boot_id: "b".into(),
            journal: "on",
            journal_note: None,
            targets: vec![row("pv1", None), row(long, Some("0f3a9c1e"))],
            failed: vec![],
            unmounted_outside: vec![],
            orphan_leftovers: vec![],
            problems: vec![],
        };
        let t = render_table(&r);
        let mut lines = t.lines().skip_while(|l| !l.starts_with("DECISION"));
        let head = lines.next().unwrap_or_else(|| panic!("no header in\n{t}"));
        let path_at = head.find("PATH").unwrap();
        let host_at = head.find("HOST").unwrap();
        for line in lines.take(2) {
            assert_eq!(line.find("/r/"), Some(path_at), "{t}");
            assert_eq!(line.find("matches"), Some(host_at), "{t}");
        }
        assert!(t.contains(long), "{t}");
    }
}
