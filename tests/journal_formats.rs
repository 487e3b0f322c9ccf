//! Journals written by every released format stay readable.
//!
//! `fixtures/journal/v1/journal` is a sled journal written by format v1 (the
//! first). It is opened by the current build here; when the format changes,
//! the new build must still open it (through `migrations/`), and a `v2`
//! fixture is added beside it. `record-golden.hex` pins the exact bytes of
//! one v1 record envelope, so an accidental encoding change fails loudly.
//!
//! Regenerate (only when adding a new format's fixture, never to make a test
//! pass): `VOLUMED_WRITE_JOURNAL_FIXTURE=1 cargo test --test journal_formats`.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

use std::path::{Path, PathBuf};

use volumed::journal::envelope::{self, Kind};
use volumed::journal::record::{self, RecordV1};
use volumed::journal::{Body, Journal, JournalConfig, OpResult, Record};
use volumed::model::{
    DevId, MountIdentity, MountState, Operation, PluginName, PodUid, SeLinuxContext, Steps,
    TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};

const BOOT: &str = "0b0b0b0b-1111-2222-3333-444444444444";
const VOLUME: &str = "kubernetes.io/local-volume/pv-local";

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/journal/v1")
}

fn device() -> TargetParams {
    TargetParams {
        volume: UniqueVolumeName::from_raw(VOLUME),
        plugin: PluginName::LocalVolume,
        spec_name: "pv-local".into(),
        target: TargetRef::Device,
        kind: TargetKind::Mount,
        device_path: Some("/dev/loop5".into()),
        device_mount_path: Some(
            "/var/lib/kubelet/plugins/kubernetes.io/local-volume/mounts/pv-local".into(),
        ),
        pod_mount_path: None,
        selinux: Some(
            SeLinuxContext::parse("system_u:object_r:container_file_t:s0:c7,c3").unwrap(),
        ),
        mount_options: vec!["noatime".into()].into(),
        fs_type: Some("ext4".into()),
    }
}

fn pod(uid: &str) -> TargetParams {
    TargetParams {
        target: TargetRef::Pod(PodUid::new(uid).unwrap()),
        pod_mount_path: Some(
            format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~local-volume/pv-local")
                .into(),
        ),
        ..device()
    }
}

fn observed() -> MountIdentity {
    MountIdentity {
        dev: DevId { major: 7, minor: 5 },
        root: "/".into(),
        fs_type: "ext4".into(),
        read_only: false,
        selinux: device().selinux,
    }
}

/// The workload the v1 fixture holds: format, mount, two SetUps (one
/// finished), a checkpoint in the middle, then a TearDown intent with no outcome.
fn write_v1(dir: &Path) {
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

fn golden_hex() -> String {
    let payload = record::encode(&RecordV1::from(&golden_record()));
    envelope::seal(GOLDEN_JOURNAL_ID, Kind::Record, 42, &payload)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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
    let dir = fixture_dir();
    let _ = std::fs::remove_dir_all(dir.join("journal"));
    write_v1(&dir.join("journal"));
    std::fs::write(dir.join("record-golden.hex"), golden_hex() + "\n").unwrap();
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
    assert_eq!(replay.schema_version, 1);
    assert_eq!(replay.node_name, "fixture-node");
    assert_eq!(replay.checkpoint.as_ref().map(|c| c.through_seq), Some(6));
    assert_eq!(
        replay.tail.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![7, 8, 9]
    );
    let snap = volumed::dump::journal_snapshot(&replay.state, None);
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
    let dev_entry = replay
        .state
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
