//! Journals written by every released format stay readable.
//!
//! `fixtures/journal/v1/journal` is a sled journal written by format v1 (the
//! first), `fixtures/journal/v2/journal` one written by format v2 (which adds
//! a CSI target's arguments), `fixtures/journal/v3/journal` one written by
//! format v3 (which adds a payload volume's hash and object versions),
//! `fixtures/journal/v4/journal` one written by format v4 (the checkpoint in
//! its own file, `checkpoint`, instead of sled's `checkpoint` tree),
//! `fixtures/journal/v5/journal` one written by format v5 (subPath binds, in
//! the records and in the checkpoint), `fixtures/journal/v6/journal` one
//! written by format v6 (a raw block volume's map steps and
//! NodeExpandVolume). The current build opens all six here: the older ones through `migrations/`
//! (and, for an inspection, as they are, unchanged). Each
//! `record-golden.hex` pins the exact bytes of one record envelope of its
//! format, so an accidental encoding change fails loudly.
//!
//! Regenerate the current format's fixture (only when adding a new format,
//! never to make a test pass):
//! `VOLUMED_WRITE_JOURNAL_FIXTURE=1 cargo test --test journal_formats`.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

use std::path::{Path, PathBuf};

use volumed::journal::SCHEMA_VERSION;
use volumed::journal::envelope::{self, Kind};
use volumed::journal::record::{self, RecordV1, RecordV2, RecordV3};
use volumed::journal::{Body, Journal, JournalConfig, OpResult, Record};
use volumed::model::{
    AccessMode, CsiLifecycle, CsiParams, DevId, MountIdentity, MountState, ObjectVersion,
    Operation, PayloadVersion, PluginName, PodUid, SeLinuxContext, SecretRef, Steps, SubpathBind,
    SubpathKey, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};

const BOOT: &str = "0b0b0b0b-1111-2222-3333-444444444444";
const VOLUME: &str = "kubernetes.io/local-volume/pv-local";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/journal/v1")
}

fn fixture_v2_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/journal/v2")
}

fn fixture_v3_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/journal/v3")
}

fn fixture_v4_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/journal/v4")
}

fn fixture_v5_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/journal/v5")
}

fn fixture_v6_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/journal/v6")
}

/// A subPath bind of pod-a's volume, for container `container`.
fn subpath_bind(container: &str, index: u32) -> SubpathBind {
    SubpathBind {
        key: SubpathKey::new(PodUid::new("pod-a").unwrap(), "data", container, index).unwrap(),
        volume: UniqueVolumeName::from_raw(VOLUME),
        sub_path: format!("logs/{container}"),
    }
}

const SECRET_VOLUME: &str = "kubernetes.io/secret/pod-d-creds";

/// A secret volume's pod target with the payload it wrote: a hash and the
/// Secret's uid and resourceVersion, never its bytes.
fn secret_pod(uid: &str) -> TargetParams {
    let payload = PayloadVersion {
        hash: "5e".repeat(32),
        objects: vec![ObjectVersion {
            kind: "Secret".into(),
            namespace: "ns".into(),
            name: "creds".into(),
            uid: "0f0f0f0f-aaaa-bbbb-cccc-dddddddddddd".into(),
            resource_version: "4711".into(),
        }],
    };
    TargetParams::at(
        UniqueVolumeName::from_raw(SECRET_VOLUME),
        PluginName::Secret,
        "creds".into(),
        TargetRef::Pod(PodUid::new(uid).unwrap()),
        TargetKind::Mount,
        Some(
            Path::new(&format!(
                "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~secret/creds"
            ))
            .into(),
        ),
    )
    .with_fs_type(Some("tmpfs".into()))
    .with_payload(Some(payload.into()))
}

const CSI_VOLUME: &str = "kubernetes.io/csi/hostpath.csi.k8s.io^vol-1";

/// A CSI pod target with every CSI argument set (secrets by reference only).
fn csi_pod(uid: &str) -> TargetParams {
    let csi = CsiParams {
        driver: "hostpath.csi.k8s.io".into(),
        volume_handle: "vol-1".into(),
        lifecycle: CsiLifecycle::Persistent,
        access_modes: vec![AccessMode::ReadWriteOnce, AccessMode::ReadOnlyMany],
        read_only: true,
        publish_context: [("lun".to_owned(), "3".to_owned())].into(),
        volume_context: [
            ("csi.storage.k8s.io/pod.name".to_owned(), "web-0".to_owned()),
            (
                "storage.kubernetes.io/csiProvisionerIdentity".to_owned(),
                "x".to_owned(),
            ),
        ]
        .into(),
        stage_secret: Some(SecretRef {
            namespace: "ns".into(),
            name: "stage".into(),
        }),
        publish_secret: None,
        mount_group: Some("2000".into()),
        attachment_id: Some("csi-0123".into()),
    };
    TargetParams::at(
        UniqueVolumeName::from_raw(CSI_VOLUME),
        PluginName::Csi,
        "pv-csi".into(),
        TargetRef::Pod(PodUid::new(uid).unwrap()),
        TargetKind::Mount,
        Some(format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/pv-csi/mount").into()),
    )
    .with_device_mount_path(Some(
        "/var/lib/kubelet/plugins/kubernetes.io/csi/hostpath.csi.k8s.io/abc/globalmount".into(),
    ))
    .with_mount_options(vec!["noatime".into()].into())
    .with_fs_type(Some("xfs".into()))
    .with_csi(Some(csi.into()))
}

fn device() -> TargetParams {
    TargetParams::at(
        UniqueVolumeName::from_raw(VOLUME),
        PluginName::LocalVolume,
        "pv-local".into(),
        TargetRef::Device,
        TargetKind::Mount,
        Some("/var/lib/kubelet/plugins/kubernetes.io/local-volume/mounts/pv-local".into()),
    )
    .with_device_path(Some("/dev/loop5".into()))
    .with_selinux(Some(
        SeLinuxContext::parse("system_u:object_r:container_file_t:s0:c7,c3").unwrap(),
    ))
    .with_mount_options(vec!["noatime".into()].into())
    .with_fs_type(Some("ext4".into()))
}

fn pod(uid: &str) -> TargetParams {
    let path = format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~local-volume/pv-local");
    let mut p = device().with_pod_mount_path(Some(path.into()));
    p.target = TargetRef::Pod(PodUid::new(uid).unwrap());
    p
}

const BLOCK_VOLUME: &str = "kubernetes.io/local-volume/pv-block";

/// A local PV with `volumeMode: Block`: its device target is the global
/// map, a pod's is its `volumeDevices` file.
fn block_device() -> TargetParams {
    TargetParams::at(
        UniqueVolumeName::from_raw(BLOCK_VOLUME),
        PluginName::LocalVolume,
        "pv-block".into(),
        TargetRef::Device,
        TargetKind::Block,
        Some("/var/lib/kubelet/plugins/kubernetes.io~local-volume/volumeDevices/pv-block".into()),
    )
    .with_device_path(Some("/dev/loop6".into()))
}

fn block_pod(uid: &str) -> TargetParams {
    let path =
        format!("/var/lib/kubelet/pods/{uid}/volumeDevices/kubernetes.io~local-volume/pv-block");
    let mut p = block_device().with_pod_mount_path(Some(path.into()));
    p.target = TargetRef::Pod(PodUid::new(uid).unwrap());
    p
}

fn observed() -> MountIdentity {
    MountIdentity {
        dev: DevId { major: 7, minor: 5 },
        root: "/".into(),
        fs_type: "ext4".into(),
        read_only: false,
        selinux: device().selinux().cloned(),
    }
}

/// The workload the fixtures hold: format, mount, two SetUps (one
/// finished), a checkpoint in the middle, then a TearDown intent with no
/// outcome; the v2 fixture then adds a CSI SetUp, done, after the checkpoint,
/// and the v3 fixture a secret volume's SetUp, done. The v4 fixture holds
/// the same records as v3's (only where the checkpoint lives changed). The
/// v5 fixture adds a subPath bind, done, before the checkpoint, and after
/// it another bind, done, and an unbind of the first with no outcome. The
/// v6 fixture then maps a block volume's device and one pod's device file,
/// both done, and starts an expansion of the CSI volume with no outcome.
fn write_current(dir: &Path) {
    let (j, _) = Journal::open(&JournalConfig::new(dir, "fixture-node", BOOT)).unwrap();
    let f = j
        .append_record(Body::Intent {
            op: Operation::FormatDevice,
            steps: Steps::Multi,
            target: device().into(),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: f,
        op: Operation::FormatDevice,
        result: OpResult::Success,
        observed: None,
    })
    .unwrap();
    let m = j
        .append_record(Body::Intent {
            op: Operation::MountDevice,
            steps: Steps::Single,
            target: device().into(),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: m,
        op: Operation::MountDevice,
        result: OpResult::Success,
        observed: Some(observed()),
    })
    .unwrap();
    let a = j
        .append_record(Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Single,
            target: pod("pod-a").into(),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: a,
        op: Operation::SetUp,
        result: OpResult::Success,
        observed: Some(observed()),
    })
    .unwrap();
    let s = j
        .append_record(Body::SubpathIntent {
            op: Operation::BindSubpath,
            bind: subpath_bind("app", 0),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: s,
        op: Operation::BindSubpath,
        result: OpResult::Success,
        observed: None,
    })
    .unwrap();
    j.checkpoint().unwrap();
    let b = j
        .append_record(Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Single,
            target: pod("pod-b").into(),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: b,
        op: Operation::SetUp,
        result: OpResult::FailedFinal("mount: exit 32".into()),
        observed: None,
    })
    .unwrap();
    j.append_record(Body::Intent {
        op: Operation::TearDown,
        steps: Steps::Single,
        target: pod("pod-a").into(),
    })
    .unwrap();
    let c = j
        .append_record(Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Multi,
            target: csi_pod("pod-c").into(),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: c,
        op: Operation::SetUp,
        result: OpResult::Success,
        observed: None,
    })
    .unwrap();
    let d = j
        .append_record(Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Multi,
            target: secret_pod("pod-d").into(),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: d,
        op: Operation::SetUp,
        result: OpResult::Success,
        observed: None,
    })
    .unwrap();
    let t = j
        .append_record(Body::SubpathIntent {
            op: Operation::BindSubpath,
            bind: subpath_bind("sidecar", 1),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: t,
        op: Operation::BindSubpath,
        result: OpResult::Success,
        observed: None,
    })
    .unwrap();
    j.append_record(Body::SubpathIntent {
        op: Operation::UnbindSubpath,
        bind: subpath_bind("app", 0),
    })
    .unwrap();
    for (op, target) in [
        (Operation::MapDevice, block_device()),
        (Operation::MapPodDevice, block_pod("pod-e")),
    ] {
        let i = j
            .append_record(Body::Intent {
                op,
                steps: Steps::Multi,
                target: target.into(),
            })
            .unwrap();
        j.append_record(Body::Outcome {
            intent_seq: i,
            op,
            result: OpResult::Success,
            observed: None,
        })
        .unwrap();
    }
    j.append_record(Body::Intent {
        op: Operation::ExpandVolume,
        steps: Steps::Multi,
        target: csi_pod("pod-c").into(),
    })
    .unwrap();
    j.close().unwrap();
}

fn golden_record() -> Record {
    Record {
        seq: 42,
        wall_time_ns: 1_763_724_409_000_000_000,
        boot_id: BOOT.into(),
        body: Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Single,
            target: pod("pod-a").into(),
        },
    }
}

const GOLDEN_JOURNAL_ID: u64 = 0x5eed_0000_0000_0001;

fn hex(payload: &[u8]) -> String {
    envelope::seal(GOLDEN_JOURNAL_ID, Kind::Record, 42, payload)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn golden_hex() -> String {
    hex(&record::encode(&RecordV1::from(&golden_record())))
}

fn golden_v2_record() -> Record {
    Record {
        body: Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Multi,
            target: csi_pod("pod-c").into(),
        },
        ..golden_record()
    }
}

fn golden_v2_hex() -> String {
    hex(&record::encode(&RecordV2::from(&golden_v2_record())))
}

fn golden_v3_record() -> Record {
    Record {
        body: Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Multi,
            target: secret_pod("pod-d").into(),
        },
        ..golden_record()
    }
}

fn golden_v3_hex() -> String {
    hex(&record::encode(&RecordV3::from(&golden_v3_record())))
}

/// Format v5's new body: a subPath bind's intent.
fn golden_v5_record() -> Record {
    Record {
        body: Body::SubpathIntent {
            op: Operation::BindSubpath,
            bind: subpath_bind("app", 0),
        },
        ..golden_record()
    }
}

fn golden_v5_hex() -> String {
    hex(&record::encode(&RecordV3::from(&golden_v5_record())))
}

/// Format v6's new operation and target kind: a pod's device map.
fn golden_v6_record() -> Record {
    Record {
        body: Body::Intent {
            op: Operation::MapPodDevice,
            steps: Steps::Multi,
            target: block_pod("pod-e").into(),
        },
        ..golden_record()
    }
}

fn golden_v6_hex() -> String {
    hex(&record::encode(&RecordV3::from(&golden_v6_record())))
}

fn unhex(s: &str) -> Vec<u8> {
    let s = s.trim();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn schema_of(dir: &Path) -> u32 {
    let db = sled::open(dir).unwrap();
    let v = db
        .open_tree("meta")
        .unwrap()
        .get("schema_version")
        .unwrap()
        .unwrap();
    u32::from_le_bytes(v.as_ref().try_into().unwrap())
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

#[test]
fn write_fixtures_when_asked() {
    if std::env::var_os("VOLUMED_WRITE_JOURNAL_FIXTURE").is_none() {
        return;
    }
    let dir = fixture_v6_dir();
    let _ = std::fs::remove_dir_all(dir.join("journal"));
    write_current(&dir.join("journal"));
    // what a start needs, as the older fixtures keep it: sled's snapshot
    // and the clean-close marker are derived, and its log segment's
    // trailing zeros are no messages
    let db = dir.join("journal/db");
    let mut bytes = std::fs::read(&db).unwrap();
    bytes.truncate(bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1));
    std::fs::write(&db, bytes).unwrap();
    for e in std::fs::read_dir(dir.join("journal")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("snap.") || name == "clean-close" {
            std::fs::remove_file(p).unwrap();
        } else if name == "blobs" {
            std::fs::remove_dir(p).unwrap();
        }
    }
    std::fs::write(dir.join("record-golden.hex"), golden_v6_hex() + "\n").unwrap();
}

#[test]
fn the_v1_journal_opens_and_replays() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_dir().join("journal"), &copy);
    // A later boot: the fixture was written on another machine.
    let (j, replay) = Journal::open(&JournalConfig::new(
        &copy,
        "other-node",
        "ffffffff-0000-0000-0000-000000000000",
    ))
    .unwrap();
    assert!(replay.corruption.is_none());
    assert_eq!(
        replay.schema_version, SCHEMA_VERSION,
        "the daemon migrates a v1 journal"
    );
    assert_eq!(replay.node_name, "fixture-node");
    assert_eq!(replay.checkpoint.as_ref().map(|c| c.through_seq), Some(6));
    assert_eq!(
        replay.tail.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![7, 8, 9]
    );
    let snap = volumed::dump::journal_snapshot(&j.state(), None);
    assert_eq!(snap.volumes.len(), 1);
    let v = &snap.volumes[0];
    assert_eq!(v.volume.as_str(), VOLUME);
    let d = v.device.as_ref().unwrap();
    assert_eq!(d.state, MountState::Mounted);
    assert_eq!(d.device_path.as_deref(), Some(Path::new("/dev/loop5")));
    let states: Vec<_> = v
        .pods
        .iter()
        .map(|p| (p.pod_uid.as_str(), p.state))
        .collect();
    assert_eq!(
        states,
        vec![
            ("pod-a", MountState::Uncertain),
            ("pod-b", MountState::NotMounted)
        ]
    );
    let state = j.state();
    let dev_entry = state
        .entries()
        .find(|(k, _)| k.target == TargetRef::Device)
        .unwrap()
        .1;
    assert_eq!(
        dev_entry.observed,
        Some(Box::new(observed())),
        "the observed identity survives the checkpoint"
    );
    // The old journal accepts new records after the checkpointed ones.
    assert_eq!(
        j.append_record(Body::Forget {
            volume: UniqueVolumeName::from_raw(VOLUME),
            target: TargetRef::Device
        })
        .unwrap(),
        10
    );
    j.close().unwrap();
    // Opened again, migrated, it replays to the same state plus the Forget.
    let (_, again) = Journal::open(&JournalConfig::new(&copy, "other-node", BOOT)).unwrap();
    assert!(again.corruption.is_none());
    assert_eq!(
        again.tail.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![7, 8, 9, 10]
    );
}

#[test]
fn an_inspection_reads_a_v1_journal_without_migrating_it() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_dir().join("journal"), &copy);
    let (j, replay) = Journal::open(&JournalConfig::inspect(&copy, BOOT)).unwrap();
    assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
    assert_eq!(replay.schema_version, 1);
    assert_eq!(replay.tail.len(), 3);
    assert_eq!(j.into_state().entries().count(), 3);
    drop(replay);
    assert_eq!(schema_of(&copy), 1, "an inspection changes nothing");
}

#[test]
fn the_v2_journal_opens_with_its_csi_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_v2_dir().join("journal"), &copy);
    let (j, replay) = Journal::open(&JournalConfig::new(&copy, "n", BOOT)).unwrap();
    assert!(replay.corruption.is_none());
    assert_eq!(replay.schema_version, SCHEMA_VERSION, "migrated");
    let state = j.state();
    let csi = state
        .entries()
        .find(|(k, _)| k.volume.as_str() == CSI_VOLUME)
        .expect("the CSI target")
        .1;
    assert_eq!(csi.state, MountState::Mounted);
    assert_eq!(*csi.params, csi_pod("pod-c"));
}

#[test]
fn an_inspection_reads_a_v2_journal_without_migrating_it() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_v2_dir().join("journal"), &copy);
    let (j, replay) = Journal::open(&JournalConfig::inspect(&copy, BOOT)).unwrap();
    assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
    assert_eq!(replay.schema_version, 2);
    let state = j.into_state();
    let csi = state
        .entries()
        .find(|(k, _)| k.volume.as_str() == CSI_VOLUME)
        .expect("the CSI target")
        .1;
    assert_eq!(*csi.params, csi_pod("pod-c"));
    drop(replay);
    assert_eq!(schema_of(&copy), 2, "an inspection changes nothing");
}

#[test]
fn the_v3_journal_opens_with_its_payload() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_v3_dir().join("journal"), &copy);
    let (j, replay) = Journal::open(&JournalConfig::new(&copy, "n", BOOT)).unwrap();
    assert!(replay.corruption.is_none());
    assert_eq!(replay.schema_version, SCHEMA_VERSION, "migrated");
    let state = j.state();
    let secret = state
        .entries()
        .find(|(k, _)| k.volume.as_str() == SECRET_VOLUME)
        .expect("the secret target")
        .1;
    assert_eq!(secret.state, MountState::Mounted);
    assert_eq!(*secret.params, secret_pod("pod-d"));
}

#[test]
fn the_v3_record_encoding_is_pinned() {
    let want = std::fs::read_to_string(fixture_v3_dir().join("record-golden.hex")).unwrap();
    assert_eq!(
        golden_v3_hex(),
        want.trim(),
        "the v3 record bytes changed: that is a new format version"
    );
    let bytes = unhex(&want);
    let payload = envelope::open(GOLDEN_JOURNAL_ID, Kind::Record, 42, &bytes).unwrap();
    let rec: RecordV3 = record::decode(payload).unwrap();
    assert_eq!(Record::try_from(&rec).unwrap(), golden_v3_record());
}

#[test]
fn the_v2_record_encoding_is_pinned() {
    let want = std::fs::read_to_string(fixture_v2_dir().join("record-golden.hex")).unwrap();
    assert_eq!(
        golden_v2_hex(),
        want.trim(),
        "the v2 record bytes changed: that is a new format version"
    );
    let bytes = unhex(&want);
    let payload = envelope::open(GOLDEN_JOURNAL_ID, Kind::Record, 42, &bytes).unwrap();
    let rec: RecordV2 = record::decode(payload).unwrap();
    assert_eq!(Record::try_from(&rec).unwrap(), golden_v2_record());
}

#[test]
fn the_v1_record_encoding_is_pinned() {
    let want = std::fs::read_to_string(fixture_dir().join("record-golden.hex")).unwrap();
    assert_eq!(
        golden_hex(),
        want.trim(),
        "the v1 record bytes changed: that is a new format version"
    );
    let bytes: Vec<u8> = (0..want.trim().len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&want.trim()[i..i + 2], 16).unwrap())
        .collect();
    let payload = envelope::open(GOLDEN_JOURNAL_ID, Kind::Record, 42, &bytes).unwrap();
    let rec: RecordV1 = record::decode(payload).unwrap();
    assert_eq!(Record::try_from(&rec).unwrap(), golden_record());
}

/// sled, opened directly: a journal just closed holds its lock a moment.
fn sled_retrying(dir: &Path) -> sled::Db {
    for _ in 0..500 {
        if let Ok(db) = sled::open(dir) {
            return db;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    sled::open(dir).unwrap()
}

/// The v3 checkpoint left in sled, if any.
fn sled_checkpoint(dir: &Path) -> Option<Vec<u8>> {
    let db = sled_retrying(dir);
    let tree = db.open_tree("checkpoint").unwrap();
    tree.get("current").unwrap().map(|v| v.to_vec())
}

/// The checkpoint file's (through_seq, entries), after verifying it.
fn checkpoint_file_of(dir: &Path, journal_id: u64) -> (u64, usize) {
    let bytes = std::fs::read(dir.join(volumed::journal::CHECKPOINT_FILE)).unwrap();
    let seq = envelope::claimed_seq(&bytes).unwrap();
    let payload = envelope::open(journal_id, Kind::Checkpoint, seq, &bytes).unwrap();
    let (state, through, _, entries) = record::decode_checkpoint(SCHEMA_VERSION, payload).unwrap();
    assert_eq!(state.len(), entries);
    (through, entries)
}

#[test]
fn the_v4_journal_opens_with_its_checkpoint_file() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_v4_dir().join("journal"), &copy);
    // An inspection reads it and changes nothing.
    let before = std::fs::read(copy.join(volumed::journal::CHECKPOINT_FILE)).unwrap();
    let (j, replay) = Journal::open(&JournalConfig::inspect(&copy, BOOT)).unwrap();
    assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
    assert_eq!(replay.schema_version, 4);
    let inspected = j.into_state();
    assert_eq!(
        std::fs::read(copy.join(volumed::journal::CHECKPOINT_FILE)).unwrap(),
        before,
        "an inspection changes nothing"
    );
    let (j, replay) = Journal::open(&JournalConfig::new(&copy, "n", BOOT)).unwrap();
    assert!(replay.corruption.is_none());
    assert_eq!(replay.schema_version, SCHEMA_VERSION, "migrated");
    assert_eq!(replay.checkpoint.as_ref().map(|c| c.through_seq), Some(6));
    assert_eq!(replay.tail.len(), 7);
    let state = j.state();
    assert_eq!(state, inspected, "v4 → v5 changes no state");
    assert_eq!(state.subpaths().count(), 0);
    let secret = state
        .entries()
        .find(|(k, _)| k.volume.as_str() == SECRET_VOLUME)
        .expect("the secret target")
        .1;
    assert_eq!(*secret.params, secret_pod("pod-d"));
    // The v4 records are v3's.
    let want = std::fs::read_to_string(fixture_v4_dir().join("record-golden.hex")).unwrap();
    assert_eq!(golden_v3_hex(), want.trim());
}

#[test]
fn the_v5_journal_opens_with_its_subpath_binds() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_v5_dir().join("journal"), &copy);
    let (j, replay) = Journal::open(&JournalConfig::new(&copy, "n", BOOT)).unwrap();
    assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
    assert_eq!(replay.schema_version, SCHEMA_VERSION, "migrated");
    // the first bind came from the checkpoint, the second from the tail
    assert_eq!(replay.checkpoint.as_ref().map(|c| c.through_seq), Some(8));
    let state = j.state();
    let binds: Vec<(String, MountState, bool)> = state
        .subpaths()
        .map(|e| {
            (
                e.bind.key.container.clone(),
                e.state,
                e.pending
                    .as_ref()
                    .is_some_and(|(op, _, _)| *op == Operation::UnbindSubpath),
            )
        })
        .collect();
    assert_eq!(
        binds,
        vec![
            ("app".into(), MountState::Mounted, true),
            ("sidecar".into(), MountState::Mounted, false),
        ]
    );
    assert_eq!(
        state.subpaths().next().unwrap().bind,
        subpath_bind("app", 0)
    );
    let want = std::fs::read_to_string(fixture_v5_dir().join("record-golden.hex")).unwrap();
    assert_eq!(golden_v5_hex(), want.trim());
    let payload = unhex(&want);
    let opened = record::open_record(GOLDEN_JOURNAL_ID, 42, &payload).unwrap();
    assert_eq!(opened, golden_v5_record());
}

#[test]
fn the_v6_journal_opens_with_its_block_maps_and_expansion() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_v6_dir().join("journal"), &copy);
    let (j, replay) = Journal::open(&JournalConfig::new(&copy, "n", BOOT)).unwrap();
    assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
    assert_eq!(replay.schema_version, 6);
    let state = j.state();
    let block: Vec<(String, TargetKind, MountState)> = state
        .entries()
        .filter(|(k, _)| k.volume.as_str() == BLOCK_VOLUME)
        .map(|(k, e)| {
            let who = k.target.pod().map_or("device", |p| p.as_str()).to_owned();
            (who, e.params.kind, e.state)
        })
        .collect();
    assert_eq!(
        block,
        vec![
            ("device".into(), TargetKind::Block, MountState::Mounted),
            ("pod-e".into(), TargetKind::Block, MountState::Mounted),
        ]
    );
    // the expansion has no outcome: it is pending, the volume still mounted
    let csi = state
        .entries()
        .find(|(k, _)| k.volume.as_str() == CSI_VOLUME)
        .expect("the CSI target")
        .1;
    assert_eq!(csi.state, MountState::Mounted);
    assert_eq!(
        csi.pending.as_ref().map(|p| p.op),
        Some(Operation::ExpandVolume)
    );
    let want = std::fs::read_to_string(fixture_v6_dir().join("record-golden.hex")).unwrap();
    assert_eq!(golden_v6_hex(), want.trim());
    let opened = record::open_record(GOLDEN_JOURNAL_ID, 42, &unhex(&want)).unwrap();
    assert_eq!(opened, golden_v6_record());
}

#[test]
fn an_inspection_reads_a_v3_journal_without_moving_its_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_v3_dir().join("journal"), &copy);
    let (j, replay) = Journal::open(&JournalConfig::inspect(&copy, BOOT)).unwrap();
    assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
    assert_eq!(replay.schema_version, 3);
    assert_eq!(replay.checkpoint.as_ref().map(|c| c.through_seq), Some(6));
    drop(j);
    drop(replay);
    assert_eq!(schema_of(&copy), 3, "an inspection changes nothing");
    assert!(sled_checkpoint(&copy).is_some());
    assert!(!copy.join(volumed::journal::CHECKPOINT_FILE).exists());
}

/// v3 → v4 moves the checkpoint out of sled; checkpointed again and
/// reopened, the journal has the same state.
#[test]
fn a_v3_journal_migrated_then_checkpointed_reopens_to_the_same_state() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join("journal");
    copy_dir(&fixture_v3_dir().join("journal"), &copy);
    assert!(
        sled_checkpoint(&copy).is_some(),
        "the v3 fixture has a checkpoint"
    );
    let inspected = Journal::open(&JournalConfig::inspect(&copy, BOOT))
        .unwrap()
        .0
        .into_state();
    let cfg = JournalConfig::new(&copy, "n", BOOT);
    let (j, replay) = Journal::open(&cfg).unwrap();
    assert_eq!(replay.schema_version, SCHEMA_VERSION);
    assert_eq!(replay.checkpoint.as_ref().map(|c| c.through_seq), Some(6));
    assert_eq!(j.state(), inspected, "the migrations change no state");
    let migrated = j.state();
    let last = replay.tail.last().unwrap().seq;
    let report = j.checkpoint().unwrap();
    assert_eq!(report.through_seq, last);
    assert_eq!(j.state(), migrated);
    let id = j.journal_id();
    j.close().unwrap();
    // After a checkpoint: nothing in sled's tree, the file verifies.
    assert_eq!(sled_checkpoint(&copy), None);
    assert_eq!(schema_of(&copy), SCHEMA_VERSION);
    assert_eq!(checkpoint_file_of(&copy, id), (last, migrated.len()));
    let (j, replay) = Journal::open(&cfg).unwrap();
    assert!(replay.corruption.is_none());
    assert!(replay.tail.is_empty());
    assert_eq!(
        replay.checkpoint.as_ref().map(|c| c.through_seq),
        Some(last)
    );
    assert_eq!(j.state(), migrated);
}

/// A migration to v4 cut short: after the file was written (the key still
/// in sled), or after the key was removed too, before the schema bump.
/// Either opens to the state a whole migration gives.
#[test]
fn a_v3_to_v4_migration_cut_short_opens_again() {
    let whole = {
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("journal");
        copy_dir(&fixture_v3_dir().join("journal"), &copy);
        Journal::open(&JournalConfig::new(&copy, "n", BOOT))
            .unwrap()
            .0
            .into_state()
    };
    for key_removed in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("journal");
        copy_dir(&fixture_v3_dir().join("journal"), &copy);
        {
            let db = sled_retrying(&copy);
            let tree = db.open_tree("checkpoint").unwrap();
            let v = tree.get("current").unwrap().unwrap();
            std::fs::write(copy.join(volumed::journal::CHECKPOINT_FILE), &v).unwrap();
            if key_removed {
                tree.remove("current").unwrap();
            }
            db.flush().unwrap();
        }
        // An inspection of it (still schema 3) finds the checkpoint.
        let (j, replay) = Journal::open(&JournalConfig::inspect(&copy, BOOT)).unwrap();
        assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
        assert_eq!(replay.schema_version, 3);
        assert_eq!(
            j.into_state(),
            whole,
            "inspected, key removed: {key_removed}"
        );
        let (j, replay) = Journal::open(&JournalConfig::new(&copy, "n", BOOT)).unwrap();
        assert!(replay.corruption.is_none(), "{:?}", replay.corruption);
        assert_eq!(replay.schema_version, SCHEMA_VERSION);
        assert_eq!(replay.checkpoint.as_ref().map(|c| c.through_seq), Some(6));
        assert_eq!(j.into_state(), whole, "key removed: {key_removed}");
        assert_eq!(sled_checkpoint(&copy), None);
    }
}
