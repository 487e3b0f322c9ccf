//! `volumed dump`: the journal's records and the state they imply, as JSON
//! (a contract: docs/dump-json.md) or as a table for people.
//!
//! Pure: it renders a [`Replay`]; opening the journal (or asking the daemon) is the
//! binary's job. The state part uses the same snapshot types as the live ASW
//! (`state::StateSnapshot`), so `dump` and `/debug/state` agree by construction.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

mod damage;
pub use damage::{DamageJson, LostTailJson, MovedAsideJson};

use crate::journal::{Body, Entry, JournalState, OpResult, Record, Replay};
use crate::model::{MountState, SubpathBind, TargetParams, TargetRef, UniqueVolumeName};
use crate::state::{DeviceSnapshot, PodSnapshot, SeLinuxState, StateSnapshot, VolumeSnapshot};

/// The `dump --format json` document. Deserialize too: `dump` reads it back
/// from a running daemon's `GET /debug/journal` and prints it the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpDoc {
    /// the journal's schema version
    pub schema_version: u32,
    /// the boot id of the machine now
    pub boot_id: String,
    /// the node name in the journal's meta
    pub node_name: String,
    /// the checkpoint replay started from, if any
    pub checkpoint: Option<CheckpointJson>,
    /// where replay stopped on a bad value, if it did
    pub corruption: Option<CorruptionJson>,
    /// the records after the checkpoint
    pub records: Vec<RecordJson>,
    /// the state the journal implies
    pub state: StateSnapshot,
    /// what the journal keeps aside; absent when nothing
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_damage: Option<DamageJson>,
    /// the subPath binds the journal knows (schema 5 on); absent when none
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subpaths: Vec<SubpathJson>,
}

/// One subPath bind, in a record or in the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubpathJson {
    /// the pod volume (`volumeMounts[].name`)
    pub name: String,
    /// the container
    pub container: String,
    /// the mount's index in the container's `volumeMounts`
    pub index: u32,
    /// the subpath bound, relative to the volume (empty: found on the host
    /// with no record naming it)
    pub sub_path: String,
    /// its state (in the state part only; a pending bind is `uncertain`)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<MountState>,
    /// the volume (in the state part only)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// the pod (in the state part only)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

impl SubpathJson {
    fn of(b: &SubpathBind) -> Self {
        SubpathJson {
            name: b.key.name.clone(),
            container: b.key.container.clone(),
            index: b.key.index,
            sub_path: b.sub_path.clone(),
            state: None,
            volume: None,
            pod_uid: None,
        }
    }
}

/// The checkpoint in the dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointJson {
    /// last record folded in
    pub through_seq: u64,
    /// when written, ns since the epoch
    pub wall_time_ns: u64,
    /// targets in it
    pub entries: usize,
}

/// A replay-stopping bad value in the dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorruptionJson {
    /// its sequence number
    pub seq: u64,
    /// what was wrong
    pub reason: String,
}

/// One record in the dump. Paths are shown lossily (non-UTF-8 bytes as U+FFFD).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordJson {
    /// sequence number
    pub seq: u64,
    /// ns since the epoch
    pub wall_time_ns: u64,
    /// boot id when written
    pub boot_id: String,
    /// `intent`, `outcome`, `reconstructed` or `forget`
    #[serde(rename = "type")]
    pub kind: String,
    /// the operation, for intents and outcomes
    pub op: Option<String>,
    /// `single` or `multi`, for intents
    pub steps: Option<String>,
    /// the intent an outcome completes
    pub intent_seq: Option<u64>,
    /// `success`, `failed_final` or `failed_uncertain`, for outcomes
    pub result: Option<String>,
    /// the error text of a failed outcome
    pub error: Option<String>,
    /// the decided state, for reconstructed records
    pub state: Option<MountState>,
    /// the decision's reason, for reconstructed records
    pub reason: Option<String>,
    /// the volume (for outcomes, the intent's volume when known)
    pub volume: Option<String>,
    /// the pod, `null` for the device target
    pub pod_uid: Option<String>,
    /// the parameters, for intents and reconstructed records
    pub params: Option<ParamsJson>,
    /// the bind, for a subPath operation's intent
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subpath: Option<SubpathJson>,
}

/// Target parameters in the dump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamsJson {
    /// plugin
    pub plugin: String,
    /// spec name
    pub spec_name: String,
    /// target kind
    pub kind: String,
    /// device path
    pub device_path: Option<String>,
    /// device mount path
    pub device_mount_path: Option<String>,
    /// pod mount path
    pub pod_mount_path: Option<String>,
    /// SELinux context
    pub selinux_context: Option<String>,
    /// mount options
    pub mount_options: Vec<String>,
    /// the target is mounted read-only (an `ro` option, or a CSI pod
    /// target published `readonly`)
    #[serde(default)]
    pub read_only: bool,
    /// fs type
    pub fs_type: Option<String>,
    /// a payload's hash and objects' versions (never its bytes)
    pub payload: Option<crate::model::PayloadVersion>,
}

fn lossy(p: Option<&Path>) -> Option<String> {
    p.map(|p| p.to_string_lossy().into_owned())
}

fn params_json(p: &TargetParams) -> ParamsJson {
    ParamsJson {
        plugin: p.plugin.as_str().to_owned(),
        spec_name: p.spec_name.to_string(),
        kind: p.kind.as_str().to_owned(),
        device_path: lossy(p.device_path()),
        device_mount_path: lossy(p.device_mount_path()),
        pod_mount_path: lossy(p.pod_mount_path.as_deref()),
        selinux_context: p.selinux().map(|c| c.as_str().to_owned()),
        mount_options: p.mount_options().to_vec(),
        read_only: p.read_only(),
        fs_type: p.fs_type.as_deref().map(str::to_owned),
        payload: p.payload().map(|v| v.as_ref().clone()),
    }
}

fn pod_of(t: &TargetRef) -> Option<String> {
    t.pod().map(|uid| uid.as_str().to_owned())
}

fn record_json(r: &Record, intents: &HashMap<u64, (String, Option<String>)>) -> RecordJson {
    let mut j = RecordJson {
        seq: r.seq,
        wall_time_ns: r.wall_time_ns,
        boot_id: r.boot_id.clone(),
        kind: "intent".to_owned(),
        op: None,
        steps: None,
        intent_seq: None,
        result: None,
        error: None,
        state: None,
        reason: None,
        volume: None,
        pod_uid: None,
        params: None,
        subpath: None,
    };
    match &r.body {
        Body::Intent { op, steps, target } => {
            j.op = Some(op.as_str().to_owned());
            j.steps = Some(
                match steps {
                    crate::model::Steps::Single => "single",
                    crate::model::Steps::Multi => "multi",
                }
                .to_owned(),
            );
            j.volume = Some(target.volume.as_str().to_owned());
            j.pod_uid = pod_of(&target.target);
            j.params = Some(params_json(target));
        }
        Body::Outcome {
            intent_seq,
            op,
            result,
            ..
        } => {
            j.kind = "outcome".to_owned();
            j.op = Some(op.as_str().to_owned());
            j.intent_seq = Some(*intent_seq);
            let (name, error) = match result {
                OpResult::Success => ("success", None),
                OpResult::FailedFinal(e) => ("failed_final", Some(e.clone())),
                OpResult::FailedUncertain(e) => ("failed_uncertain", Some(e.clone())),
            };
            j.result = Some(name.to_owned());
            j.error = error;
            if let Some((v, p)) = intents.get(intent_seq) {
                j.volume = Some(v.clone());
                j.pod_uid = p.clone();
            }
        }
        Body::Reconstructed {
            target,
            state,
            reason,
            ..
        } => {
            j.kind = "reconstructed".to_owned();
            j.state = Some(*state);
            j.reason = Some(reason.clone());
            j.volume = Some(target.volume.as_str().to_owned());
            j.pod_uid = pod_of(&target.target);
            j.params = Some(params_json(target));
        }
        Body::Forget { volume, target } => {
            j.kind = "forget".to_owned();
            j.volume = Some(volume.as_str().to_owned());
            j.pod_uid = pod_of(target);
        }
        Body::SubpathIntent { op, bind } => {
            j.op = Some(op.as_str().to_owned());
            j.steps = Some("single".to_owned());
            j.volume = Some(bind.volume.as_str().to_owned());
            j.pod_uid = Some(bind.key.pod.as_str().to_owned());
            j.subpath = Some(SubpathJson::of(bind));
        }
    }
    j
}

/// The subPath binds of the state, of volume `only` when given.
fn subpaths_json(state: &JournalState, only: Option<&UniqueVolumeName>) -> Vec<SubpathJson> {
    state
        .subpaths()
        .filter(|e| only.is_none_or(|v| *v == e.bind.volume))
        .map(|e| SubpathJson {
            state: Some(e.reported_state()),
            volume: Some(e.bind.volume.as_str().to_owned()),
            pod_uid: Some(e.bind.key.pod.as_str().to_owned()),
            ..SubpathJson::of(&e.bind)
        })
        .collect()
}

fn selinux_of(e: &Entry) -> SeLinuxState {
    match e.reported_state() {
        MountState::NotMounted => SeLinuxState::Unknown,
        _ => SeLinuxState::mounted_with(e.current_params().selinux().cloned()),
    }
}

/// The state the journal implies, shaped like the live ASW's snapshot.
pub fn journal_snapshot(state: &JournalState, only: Option<&UniqueVolumeName>) -> StateSnapshot {
    let mut volumes: BTreeMap<&UniqueVolumeName, VolumeSnapshot> = BTreeMap::new();
    for (key, e) in state.entries() {
        if only.is_some_and(|v| v != &key.volume) {
            continue;
        }
        let v = volumes
            .entry(&key.volume)
            .or_insert_with(|| VolumeSnapshot {
                volume: key.volume.clone(),
                device: None,
                pods: Vec::new(),
                health: None,
            });
        let p = e.current_params();
        match &key.target {
            TargetRef::Device => {
                v.device = Some(DeviceSnapshot {
                    state: e.reported_state(),
                    device_path: p.device_path().map(Path::to_path_buf),
                    mount_path: p.device_mount_path().map(Path::to_path_buf),
                    selinux_context: selinux_of(e),
                })
            }
            TargetRef::Pod(uid) => v.pods.push(PodSnapshot {
                pod_uid: uid.clone(),
                mount_path: p
                    .pod_mount_path
                    .as_deref()
                    .map(Path::to_path_buf)
                    .unwrap_or_default(),
                kind: p.kind,
                state: e.reported_state(),
                selinux_context: selinux_of(e),
            }),
        }
    }
    StateSnapshot {
        volumes: volumes.into_values().collect(),
        pod_errors: Default::default(),
        unmounted_outside: Vec::new(),
        pod_volume_health: Default::default(),
        journal_damage: None,
    }
}

/// Builds the dump document from a replay and the state it implies.
pub fn document(
    replay: &Replay,
    state: &JournalState,
    boot_id: &str,
    only: Option<&UniqueVolumeName>,
) -> DumpDoc {
    // Outcomes name only their intent; find the intent's target from the
    // tail, or from the pending intents the checkpoint carried.
    let mut intents: HashMap<u64, (String, Option<String>)> = HashMap::new();
    for (key, e) in state.entries() {
        if let Some(p) = &e.pending {
            intents.insert(
                p.intent_seq,
                (key.volume.as_str().to_owned(), pod_of(&key.target)),
            );
        }
    }
    for e in state.subpaths() {
        if let Some((_, seq, bind)) = &e.pending {
            intents.insert(
                *seq,
                (
                    bind.volume.as_str().to_owned(),
                    Some(bind.key.pod.as_str().to_owned()),
                ),
            );
        }
    }
    for r in &replay.tail {
        match &r.body {
            Body::Intent { target, .. } => {
                intents.insert(
                    r.seq,
                    (target.volume.as_str().to_owned(), pod_of(&target.target)),
                );
            }
            Body::SubpathIntent { bind, .. } => {
                intents.insert(
                    r.seq,
                    (
                        bind.volume.as_str().to_owned(),
                        Some(bind.key.pod.as_str().to_owned()),
                    ),
                );
            }
            _ => {}
        }
    }
    let records = replay
        .tail
        .iter()
        .map(|r| record_json(r, &intents))
        .filter(|j| only.is_none_or(|v| j.volume.as_deref() == Some(v.as_str())))
        .collect();
    DumpDoc {
        schema_version: replay.schema_version,
        boot_id: boot_id.to_owned(),
        node_name: replay.node_name.clone(),
        checkpoint: replay.checkpoint.as_ref().map(|c| CheckpointJson {
            through_seq: c.through_seq,
            wall_time_ns: c.wall_time_ns,
            entries: c.entries,
        }),
        corruption: replay.corruption.as_ref().map(|c| CorruptionJson {
            seq: c.seq,
            reason: c.reason.clone(),
        }),
        records,
        state: journal_snapshot(state, only),
        journal_damage: DamageJson::of(&replay.damage),
        subpaths: subpaths_json(state, only),
    }
}

/// UTC `YYYY-MM-DDTHH:MM:SS.mmmZ` from ns since the epoch.
pub fn format_time(ns: u64) -> String {
    let (y, m, d, h, mi, s) = crate::util::time::utc(ns / 1_000_000_000);
    let ms = (ns / 1_000_000) % 1000;
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

fn opt(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("-")
}

fn selinux_text(s: &SeLinuxState) -> String {
    match s {
        SeLinuxState::Unknown => "?".to_owned(),
        SeLinuxState::WithoutContext => "-".to_owned(),
        SeLinuxState::Context(c) => c.as_str().to_owned(),
    }
}

/// The table `dump` prints by default.
pub fn render_table(doc: &DumpDoc, dir: &Path) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "journal {}  schema {}  node {}  boot {}",
        dir.display(),
        doc.schema_version,
        if doc.node_name.is_empty() {
            "?"
        } else {
            &doc.node_name
        },
        doc.boot_id
    );
    match &doc.checkpoint {
        Some(c) => {
            let _ = writeln!(
                out,
                "checkpoint through seq {} ({} targets, {})",
                c.through_seq,
                c.entries,
                format_time(c.wall_time_ns)
            );
        }
        None => out.push_str("no checkpoint\n"),
    }
    if let Some(c) = &doc.corruption {
        let _ = writeln!(out, "REPLAY STOPPED at seq {}: {}", c.seq, c.reason);
    }
    damage::render(doc.journal_damage.as_ref(), &mut out);
    let _ = writeln!(out, "\nrecords ({}):", doc.records.len());
    let mut rows = vec![cells([
        "SEQ", "TIME", "TYPE", "OP", "VOLUME", "POD", "DETAIL",
    ])];
    for r in &doc.records {
        let detail = match (r.kind.as_str(), &r.subpath) {
            ("intent", Some(b)) => format!(
                "container {} mount {} ({}) subPath {:?}",
                b.container, b.index, b.name, b.sub_path
            ),
            ("intent", None) => format!("{} step", r.steps.as_deref().unwrap_or("?")),
            ("outcome", _) => format!(
                "intent {} {}{}",
                r.intent_seq.unwrap_or(0),
                r.result.as_deref().unwrap_or("?"),
                r.error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
            ("reconstructed", _) => format!(
                "{} ({})",
                r.state.map_or("?", MountState::as_str),
                opt(&r.reason)
            ),
            _ => String::new(),
        };
        rows.push(vec![
            r.seq.to_string(),
            format_time(r.wall_time_ns),
            r.kind.clone(),
            r.op.clone().unwrap_or_else(|| "-".into()),
            opt(&r.volume).to_owned(),
            opt(&r.pod_uid).to_owned(),
            detail,
        ]);
    }
    out.push_str(&columns(&rows));
    let _ = writeln!(out, "\nstate ({} volumes):", doc.state.volumes.len());
    let mut rows = vec![cells([
        "VOLUME", "TARGET", "KIND", "STATE", "SELINUX", "PATH",
    ])];
    let shown = |p: Option<&Path>| p.map_or("-".into(), |p| p.display().to_string());
    for v in &doc.state.volumes {
        if let Some(d) = &v.device {
            rows.push(vec![
                v.volume.as_str().to_owned(),
                "device".into(),
                "mount".into(),
                d.state.as_str().to_owned(),
                selinux_text(&d.selinux_context),
                format!(
                    "{} (device {})",
                    shown(d.mount_path.as_deref()),
                    shown(d.device_path.as_deref())
                ),
            ]);
        }
        for p in &v.pods {
            rows.push(vec![
                v.volume.as_str().to_owned(),
                p.pod_uid.as_str().to_owned(),
                p.kind.as_str().to_owned(),
                p.state.as_str().to_owned(),
                selinux_text(&p.selinux_context),
                p.mount_path.display().to_string(),
            ]);
        }
    }
    out.push_str(&columns(&rows));
    if !doc.subpaths.is_empty() {
        let _ = writeln!(out, "\nsubPath binds ({}):", doc.subpaths.len());
        let mut rows = vec![cells([
            "VOLUME",
            "POD",
            "CONTAINER",
            "MOUNT",
            "STATE",
            "SUBPATH",
        ])];
        for b in &doc.subpaths {
            rows.push(vec![
                opt(&b.volume).to_owned(),
                opt(&b.pod_uid).to_owned(),
                b.container.clone(),
                format!("{} ({})", b.index, b.name),
                b.state.map_or("?", MountState::as_str).to_owned(),
                format!("{:?}", b.sub_path),
            ]);
        }
        out.push_str(&columns(&rows));
    }
    out
}

use crate::util::table::{cells, columns};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Record;
    use crate::model::{Operation, PluginName, PodUid, SeLinuxContext, Steps, TargetKind};

    fn params(target: TargetRef, selinux: Option<&str>) -> TargetParams {
        let pod_path = target
            .pod()
            .map(|u| format!("/r/pods/{u}/volumes/kubernetes.io~local-volume/pv1").into());
        TargetParams::at(
            UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            PluginName::LocalVolume,
            "pv1".into(),
            target,
            TargetKind::Mount,
            None,
        )
        .with_pod_mount_path(pod_path)
        .with_device_path(Some("/dev/loop3".into()))
        .with_device_mount_path(Some(
            "/r/plugins/kubernetes.io/local-volume/mounts/pv1".into(),
        ))
        .with_selinux(selinux.map(|s| SeLinuxContext::parse(s).unwrap()))
        .with_fs_type(Some("ext4".into()))
    }

    /// A replay of `records` and the state they imply.
    fn replay(records: Vec<Record>) -> (Replay, JournalState) {
        let mut state = JournalState::default();
        for r in &records {
            state.apply(r);
        }
        let replay = Replay {
            tail: records,
            checkpoint: None,
            corruption: None,
            quarantined: vec![],
            lost_tail: None,
            created: false,
            node_name: "n1".into(),
            schema_version: 1,
            damage: Default::default(),
        };
        (replay, state)
    }

    fn doc_of(
        (replay, state): &(Replay, JournalState),
        boot_id: &str,
        only: Option<&UniqueVolumeName>,
    ) -> DumpDoc {
        document(replay, state, boot_id, only)
    }

    fn rec(seq: u64, body: Body) -> Record {
        Record {
            seq,
            wall_time_ns: 1_763_724_409_123_000_000,
            boot_id: "b1".into(),
            body,
        }
    }

    fn sample() -> (Replay, JournalState) {
        let pod = TargetRef::Pod(PodUid::new("p1").unwrap());
        replay(vec![
            rec(
                1,
                Body::Intent {
                    op: Operation::MountDevice,
                    steps: Steps::Single,
                    target: params(TargetRef::Device, None).into(),
                },
            ),
            rec(
                2,
                Body::Outcome {
                    intent_seq: 1,
                    op: Operation::MountDevice,
                    result: OpResult::Success,
                    observed: None,
                },
            ),
            rec(
                3,
                Body::Intent {
                    op: Operation::SetUp,
                    steps: Steps::Single,
                    target: params(pod, Some("u:r:t:s0:c2,c1")).into(),
                },
            ),
        ])
    }

    #[test]
    fn json_follows_the_design_contract() {
        let doc = doc_of(&sample(), "boot-now", None);
        let v = serde_json::to_value(&doc).unwrap();
        assert_eq!(v["schema_version"], 1);
        assert_eq!(v["boot_id"], "boot-now");
        assert_eq!(v["records"].as_array().unwrap().len(), 3);
        assert_eq!(v["records"][1]["type"], "outcome");
        assert_eq!(
            v["records"][1]["volume"], "kubernetes.io/local-volume/pv1",
            "outcome names its intent's volume"
        );
        let vol = &v["state"]["volumes"][0];
        assert_eq!(vol["volume"], "kubernetes.io/local-volume/pv1");
        assert_eq!(vol["device"]["state"], "mounted");
        assert_eq!(vol["device"]["device_path"], "/dev/loop3");
        assert_eq!(
            vol["device"]["mount_path"],
            "/r/plugins/kubernetes.io/local-volume/mounts/pv1"
        );
        assert_eq!(
            vol["device"]["selinux_context"], "",
            "mounted without a context is \"\""
        );
        let pod = &vol["pods"][0];
        assert_eq!(pod["pod_uid"], "p1");
        assert_eq!(pod["state"], "uncertain", "a pending SetUp is uncertain");
        assert_eq!(pod["kind"], "mount");
        assert_eq!(pod["selinux_context"], "u:r:t:s0:c1,c2");
    }

    #[test]
    fn volume_filter_keeps_only_that_volume() {
        let doc = doc_of(
            &sample(),
            "b",
            Some(&UniqueVolumeName::from_raw("kubernetes.io/other")),
        );
        assert!(doc.records.is_empty());
        assert!(doc.state.volumes.is_empty());
        let doc = doc_of(
            &sample(),
            "b",
            Some(&UniqueVolumeName::from_raw(
                "kubernetes.io/local-volume/pv1",
            )),
        );
        assert_eq!(doc.records.len(), 3);
    }

    #[test]
    fn table_shows_records_and_state() {
        let doc = doc_of(&sample(), "b", None);
        let t = render_table(&doc, Path::new("/j"));
        assert!(t.contains("records (3):"), "{t}");
        assert!(t.contains("intent 1 success"), "{t}");
        assert!(t.contains("uncertain"), "{t}");
        assert!(t.contains("2025-11-21T11:26:49.123Z"), "{t}");
    }

    /// Where each column of a rendered table line starts: the first
    /// character and each one after a gap of two or more spaces.
    fn column_starts(line: &str) -> Vec<usize> {
        let b = line.as_bytes();
        (0..b.len())
            .filter(|&i| {
                b[i] != b' ' && (i == 0 || (i >= 2 && b[i - 1] == b' ' && b[i - 2] == b' '))
            })
            .collect()
    }

    #[test]
    fn table_columns_line_up_with_a_long_volume_name() {
        // An emptyDir's unique name carries the pod UID: 61 characters here.
        let uid = "0b4d1c9e-2f8a-4c7b-9e1d-5a6f7b8c9d0e";
        let mut long = params(TargetRef::Pod(PodUid::new(uid).unwrap()), None);
        long.volume = UniqueVolumeName::from_raw(format!("kubernetes.io/empty-dir/{uid}-scratch"));
        long.plugin = PluginName::EmptyDir;
        long.kind = TargetKind::Dir;
        let mut records = sample().0.tail;
        records.push(rec(
            4,
            Body::Intent {
                op: Operation::SetUp,
                steps: Steps::Single,
                target: long.into(),
            },
        ));
        let doc = doc_of(&replay(records), "b", None);
        let t = render_table(&doc, Path::new("/j"));
        for (header, rows) in [("SEQ", 4), ("VOLUME", 3)] {
            let mut lines = t
                .lines()
                .skip_while(|l| !l.trim_start().starts_with(header));
            let head = lines
                .next()
                .unwrap_or_else(|| panic!("no {header} line in\n{t}"));
            // the first column's own alignment aside
            let want = column_starts(head).split_off(1);
            let body: Vec<&str> = lines.take(rows).collect();
            assert_eq!(body.len(), rows, "{t}");
            for line in body {
                let got = column_starts(line);
                assert!(
                    want.iter().all(|c| got.contains(c)),
                    "a column of {line:?} does not start at the header's offsets {want:?}\n{t}"
                );
            }
        }
        assert!(t.contains(uid), "{t}");
    }

    #[test]
    fn subpath_binds_show_in_the_records_the_state_and_the_table() {
        let bind = SubpathBind {
            key: crate::model::SubpathKey::new(PodUid::new("pod-a").unwrap(), "data", "app", 1)
                .unwrap(),
            volume: UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            sub_path: "logs".into(),
        };
        let rec = |seq, body| Record {
            seq,
            wall_time_ns: seq,
            boot_id: "b".into(),
            body,
        };
        let r = replay(vec![
            rec(
                1,
                Body::SubpathIntent {
                    op: Operation::BindSubpath,
                    bind: bind.clone(),
                },
            ),
            rec(
                2,
                Body::Outcome {
                    intent_seq: 1,
                    op: Operation::BindSubpath,
                    result: OpResult::Success,
                    observed: None,
                },
            ),
        ]);
        let doc = doc_of(&r, "b", None);
        let v = serde_json::to_value(&doc).unwrap();
        assert_eq!(v["records"][0]["op"], "bind_subpath");
        assert_eq!(v["records"][0]["subpath"]["container"], "app");
        assert_eq!(v["records"][0]["subpath"]["sub_path"], "logs");
        // the outcome names its intent's volume and pod
        assert_eq!(v["records"][1]["pod_uid"], "pod-a");
        assert_eq!(v["subpaths"][0]["state"], "mounted");
        assert_eq!(v["subpaths"][0]["index"], 1);
        assert_eq!(v["state"]["volumes"], serde_json::json!([]), "not a target");
        let table = render_table(&doc, Path::new("/j"));
        assert!(table.contains("subPath binds (1):"), "{table}");
        assert!(table.contains("container app mount 1 (data)"), "{table}");
        // filtered to another volume: none
        let other = UniqueVolumeName::from_raw("x");
        assert!(doc_of(&r, "b", Some(&other)).subpaths.is_empty());
    }

    #[test]
    fn time_formatting() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_time(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
