//! On-disk record types and their conversion to and from `model`.
//!
//! These structs are what bincode 1.3.3 encodes inside an envelope
//! (`envelope.rs`). They are deliberately not the model types: strings and
//! raw path bytes only, so a change to the model never silently changes the
//! format. A change here is a new format version with a migration in
//! `migrations/` (see `docs/journal-format.md`).
//!
//! Records, bodies and checkpoints are generic over the target type: format
//! v1 is them with [`TargetV1`], format v2 with [`TargetV2`], which adds the
//! CSI arguments, and format v3 with [`TargetV3`], which adds a payload
//! volume's hash and object versions (`payload_v3.rs`). Formats v4 to v6
//! keep v3's target: v4 moved the checkpoint to a file, v5 added subPath
//! binds, v6 (the current one) raw block map steps, NodeExpandVolume and
//! the `block` target kind.
//! bincode writes no type names, so `RecordOf<TargetV1>` encodes exactly as
//! v1 always did, and `RecordOf<TargetV2>` as v2.

use serde::{Deserialize, Serialize};

mod borrowed;
mod convert;
mod payload_v3;

pub use convert::TargetFormat;
pub use payload_v3::{ObjectV3, PayloadV3, TargetV3};

use super::replay::{JournalState, Record};

/// One journal record as stored, generic over the format's target type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordOf<T> {
    /// Sequence number, strictly increasing per journal.
    pub seq: u64,
    /// Wall time, nanoseconds since the Unix epoch.
    pub wall_time_ns: u64,
    /// Boot id of the machine when the record was written.
    pub boot_id: String,
    /// What happened.
    pub body: BodyOf<T>,
}

/// A record of format v1.
pub type RecordV1 = RecordOf<TargetV1>;
/// A record of format v2.
pub type RecordV2 = RecordOf<TargetV2>;
/// A record of format v3, which the current format v4 keeps.
pub type RecordV3 = RecordOf<TargetV3>;

/// The body of a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BodyOf<T> {
    /// An operation is about to touch the OS.
    Intent {
        /// the operation
        op: OpV1,
        /// one syscall or several steps
        multi_step: bool,
        /// the target and its parameters
        target: T,
    },
    /// The operation whose intent is `intent_seq` finished.
    Outcome {
        /// the intent this completes
        intent_seq: u64,
        /// the operation (repeated for readers)
        op: OpV1,
        /// how it ended
        result: ResultV1,
        /// what the host showed after a successful mount, if observed
        observed: Option<IdentityV1>,
    },
    /// Reconstruction decided the state of a target.
    Reconstructed {
        /// the target and its parameters
        target: T,
        /// the decided state
        state: StateV1,
        /// why (one reason per row of the merge table)
        reason: String,
        /// what the host showed, if mounted
        observed: Option<IdentityV1>,
    },
    /// A target is fully cleaned up and no longer tracked.
    Forget {
        /// unique volume name
        volume: String,
        /// pod uid, `None` for the device target
        pod_uid: Option<String>,
    },
    /// (format v5 on) A subPath bind or unbind is about to touch the OS;
    /// its outcome is an `Outcome`.
    SubpathIntent {
        /// `BindSubpath` or `UnbindSubpath`
        op: OpV1,
        /// the bind
        bind: SubpathV5,
    },
}

/// Operation (format v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum OpV1 {
    FormatDevice,
    MountDevice,
    SetUp,
    TearDown,
    UnmountDevice,
    /// Appended (bincode encodes the variant's index, so the five before it
    /// read as they always did): the fsGroup walk after a SetUp.
    SetOwnership,
    /// (format v5 on) a subPath bind
    BindSubpath,
    /// (format v5 on) a subPath bind unmounted and removed
    UnbindSubpath,
    /// (format v6 on) a block volume's device mapped at its global map path
    MapDevice,
    /// (format v6 on) the global map undone
    UnmapDevice,
    /// (format v6 on) the device mapped into one pod
    MapPodDevice,
    /// (format v6 on) a pod's device map undone
    UnmapPodDevice,
    /// (format v6 on) NodeExpandVolume
    ExpandVolume,
}

/// A subPath bind (format v5): its key's fields, the unique volume name
/// and the subpath (from the pod's spec: never a secret's bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct SubpathV5 {
    pub pod_uid: String,
    pub name: String,
    pub container: String,
    pub index: u32,
    pub volume: String,
    pub sub_path: String,
}

/// A subPath bind in a checkpoint (format v5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct SubpathEntryV5 {
    pub bind: SubpathV5,
    pub state: StateV1,
    /// the pending operation, its intent's seq and the bind it named
    pub pending: Option<(OpV1, u64, SubpathV5)>,
    pub last_seq: u64,
}

/// Outcome (format v1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResultV1 {
    /// The operation completed.
    Success,
    /// The operation failed and did not change the target: the state before holds.
    FailedFinal {
        /// error text
        error: String,
    },
    /// The operation failed and may have changed the target.
    FailedUncertain {
        /// error text
        error: String,
    },
}

/// Target state (format v1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum StateV1 {
    Mounted,
    Uncertain,
    NotMounted,
}

/// Target parameters (format v1); paths as raw bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct TargetV1 {
    pub volume: String,
    pub plugin: String,
    pub spec_name: String,
    /// `None` for the device target.
    pub pod_uid: Option<String>,
    /// 0 mount, 1 dir, 2 none
    pub kind: u8,
    pub device_path: Option<Vec<u8>>,
    pub device_mount_path: Option<Vec<u8>>,
    pub pod_mount_path: Option<Vec<u8>>,
    pub selinux_context: Option<String>,
    pub mount_options: Vec<String>,
    pub fs_type: Option<String>,
}

/// Target parameters (format v2): v1's, then the CSI arguments of a CSI
/// target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetV2 {
    /// every field of format v1, in v1's order
    pub base: TargetV1,
    /// the CSI arguments, `None` for other plugins
    pub csi: Option<CsiV2>,
}

/// A secret reference (format v2): namespace and name, never the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct SecretRefV2 {
    pub namespace: String,
    pub name: String,
}

/// The CSI arguments of a target (format v2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct CsiV2 {
    pub driver: String,
    pub volume_handle: String,
    /// 0 persistent, 1 ephemeral
    pub lifecycle: u8,
    /// 0 ReadWriteOncePod, 1 ReadWriteOnce, 2 ReadOnlyMany, 3 ReadWriteMany
    pub access_modes: Vec<u8>,
    pub read_only: bool,
    /// sorted by key
    pub publish_context: Vec<(String, String)>,
    /// sorted by key
    pub volume_context: Vec<(String, String)>,
    pub stage_secret: Option<SecretRefV2>,
    pub publish_secret: Option<SecretRefV2>,
    pub mount_group: Option<String>,
    pub attachment_id: Option<String>,
}

/// Mount identity (format v1, unchanged in v2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct IdentityV1 {
    pub major: u32,
    pub minor: u32,
    pub root: Vec<u8>,
    pub fs_type: String,
    pub read_only: bool,
    pub selinux_context: Option<String>,
}

/// A stored value that decodes but does not make sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// bincode could not decode the payload
    #[error("payload does not decode: {0}")]
    Decode(String),
    /// a field holds a value the model refuses
    #[error("field {field} holds {value:?}: {why}")]
    Field {
        /// the field
        field: &'static str,
        /// the value
        value: String,
        /// why it is refused
        why: String,
    },
}

pub(super) fn field_err(field: &'static str, value: &str, why: impl ToString) -> RecordError {
    RecordError::Field {
        field,
        value: value.to_owned(),
        why: why.to_string(),
    }
}

/// Verifies the envelope of a stored record value and decodes it into a
/// model-level [`Record`]; the error says what failed (envelope, payload or
/// a field). The one decode path for replay, `current` and `dump`.
pub fn open_record(journal_id: u64, seq: u64, value: &[u8]) -> Result<Record, String> {
    open_record_of(super::SCHEMA_VERSION, journal_id, seq, value)
}

/// [`open_record`] for a journal of schema `schema`: an inspection reads an
/// old journal as it is, without migrating it.
pub fn open_record_of(
    schema: u32,
    journal_id: u64,
    seq: u64,
    value: &[u8],
) -> Result<Record, String> {
    let payload = super::envelope::open(journal_id, super::envelope::Kind::Record, seq, value)
        .map_err(|e| e.to_string())?;
    let record = match schema {
        1 => decode::<RecordV1>(payload).and_then(|r| Record::try_from(&r)),
        2 => decode::<RecordV2>(payload).and_then(|r| Record::try_from(&r)),
        _ => decode::<RecordV3>(payload).and_then(|r| Record::try_from(&r)),
    };
    let record = record.map_err(|e| e.to_string())?;
    // The payload names its own sequence number: one that disagrees with
    // the key it is stored under would let two records share a number,
    // and replay pairs an outcome with its intent by that number (the
    // fuzzer found a state that a checkpoint could not hold that way).
    if record.seq != seq {
        return Err(format!(
            "record stored as seq {seq} says it is seq {}",
            record.seq
        ));
    }
    Ok(record)
}

/// Decodes a checkpoint payload of schema `schema` into its state and the
/// figures the replay reports (`through_seq`, wall time, entry count).
pub fn decode_checkpoint(
    schema: u32,
    payload: &[u8],
) -> Result<(JournalState, u64, u64, usize), RecordError> {
    fn of<T: TargetFormat + for<'de> Deserialize<'de>>(
        payload: &[u8],
    ) -> Result<(JournalState, u64, u64, usize), RecordError> {
        let ck: CheckpointOf<T> = decode(payload)?;
        Ok((
            ck.to_state()?,
            ck.through_seq,
            ck.wall_time_ns,
            ck.entries.len(),
        ))
    }
    match schema {
        1 => of::<TargetV1>(payload),
        2 => of::<TargetV2>(payload),
        3 | 4 => borrowed::decode_checkpoint_v3(payload),
        _ => borrowed::decode_checkpoint_v5(payload),
    }
}

/// A checkpoint's last sequence number, wall time and number of entries,
/// read from its first bytes without decoding the entries (every format
/// starts with the two `u64`s and the entries' `u64` count).
pub fn checkpoint_head(payload: &[u8]) -> Option<(u64, u64, usize)> {
    let (through, wall, n): (u64, u64, u64) = decode(payload).ok()?;
    Some((through, wall, usize::try_from(n).ok()?))
}

/// Encodes a value with bincode 1.3.3's default options.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Serializing plain structs of strings, integers and byte vectors into a
    // Vec cannot fail; an empty payload would fail to decode loudly anyway.
    bincode::serialize(value).unwrap_or_default()
}

/// Decodes a value, with the length limit enforced by the envelope already.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, RecordError> {
    bincode::deserialize(bytes).map_err(|e| RecordError::Decode(e.to_string()))
}

/// A checkpoint as stored: the state implied by every record up to and
/// including `through_seq`, pending intents included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOf<T> {
    /// the last record folded in
    pub through_seq: u64,
    /// wall time of the checkpoint, ns since the Unix epoch
    pub wall_time_ns: u64,
    /// every tracked target
    pub entries: Vec<EntryOf<T>>,
}

/// A checkpoint of format v1.
pub type CheckpointV1 = CheckpointOf<TargetV1>;
/// A checkpoint of format v2.
pub type CheckpointV2 = CheckpointOf<TargetV2>;
/// A checkpoint of format v3, which format v4 keeps.
pub type CheckpointV3 = CheckpointOf<TargetV3>;

/// A checkpoint of format v5 and v6 (the current one): v3's, then the subPath
/// binds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointV5 {
    /// the last record folded in
    pub through_seq: u64,
    /// wall time of the checkpoint, ns since the Unix epoch
    pub wall_time_ns: u64,
    /// every tracked target
    pub entries: Vec<EntryOf<TargetV3>>,
    /// every subPath bind
    pub subpaths: Vec<SubpathEntryV5>,
}

/// One target in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct EntryOf<T> {
    pub target: T,
    pub state: StateV1,
    pub pending: Option<PendingOf<T>>,
    pub observed: Option<IdentityV1>,
    pub last_seq: u64,
    pub boot_id: String,
    pub reason: Option<String>,
}

/// A pending intent in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct PendingOf<T> {
    pub op: OpV1,
    pub intent_seq: u64,
    pub multi_step: bool,
    pub target: T,
}

impl<T> RecordOf<T> {
    /// The same record with its targets converted (a migration's step).
    pub fn map_target<U>(self, f: impl Fn(T) -> U) -> RecordOf<U> {
        let body = match self.body {
            BodyOf::Intent {
                op,
                multi_step,
                target,
            } => BodyOf::Intent {
                op,
                multi_step,
                target: f(target),
            },
            BodyOf::Outcome {
                intent_seq,
                op,
                result,
                observed,
            } => BodyOf::Outcome {
                intent_seq,
                op,
                result,
                observed,
            },
            BodyOf::Reconstructed {
                target,
                state,
                reason,
                observed,
            } => BodyOf::Reconstructed {
                target: f(target),
                state,
                reason,
                observed,
            },
            BodyOf::Forget { volume, pod_uid } => BodyOf::Forget { volume, pod_uid },
            BodyOf::SubpathIntent { op, bind } => BodyOf::SubpathIntent { op, bind },
        };
        RecordOf {
            seq: self.seq,
            wall_time_ns: self.wall_time_ns,
            boot_id: self.boot_id,
            body,
        }
    }
}

impl<T> CheckpointOf<T> {
    /// The same checkpoint with its targets converted (a migration's step).
    pub fn map_target<U>(self, f: impl Fn(T) -> U) -> CheckpointOf<U> {
        CheckpointOf {
            through_seq: self.through_seq,
            wall_time_ns: self.wall_time_ns,
            entries: self
                .entries
                .into_iter()
                .map(|e| EntryOf {
                    target: f(e.target),
                    state: e.state,
                    pending: e.pending.map(|p| PendingOf {
                        op: p.op,
                        intent_seq: p.intent_seq,
                        multi_step: p.multi_step,
                        target: f(p.target),
                    }),
                    observed: e.observed,
                    last_seq: e.last_seq,
                    boot_id: e.boot_id,
                    reason: e.reason,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;

    use super::*;
    use crate::journal::replay::{Body, JournalState, OpResult};
    use crate::model::{
        DevId, MountIdentity, MountState, Operation, PluginName, PodUid, SeLinuxContext, Steps,
        TargetKind, TargetParams, TargetRef, UniqueVolumeName,
    };

    fn target(pod: Option<&str>) -> TargetParams {
        TargetParams::at(
            UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            PluginName::LocalVolume,
            "pv1".into(),
            pod.map_or(TargetRef::Device, |p| {
                TargetRef::Pod(PodUid::new(p).unwrap())
            }),
            TargetKind::Mount,
            None,
        )
        .with_device_path(Some("/dev/loop3".into()))
        .with_device_mount_path(Some(
            PathBuf::from(OsStr::from_bytes(b"/r/plugins/x\xff y")).into(),
        ))
        .with_pod_mount_path(pod.map(|p| {
            PathBuf::from(format!(
                "/r/pods/{p}/volumes/kubernetes.io~local-volume/pv1"
            ))
            .into()
        }))
        .with_selinux(Some(
            SeLinuxContext::parse("system_u:object_r:container_file_t:s0:c5,c2").unwrap(),
        ))
        .with_mount_options(vec!["noatime".into()].into())
        .with_fs_type(Some("ext4".into()))
    }

    fn observed() -> MountIdentity {
        MountIdentity {
            dev: DevId { major: 7, minor: 3 },
            root: "/".into(),
            fs_type: "ext4".into(),
            read_only: false,
            selinux: None,
        }
    }

    /// Every body variant, every operation and every result.
    pub(crate) fn every_record() -> Vec<Record> {
        let mut bodies = Vec::new();
        for op in Operation::ALL {
            let pod = if op.is_device_op() {
                None
            } else {
                Some("pod-a")
            };
            bodies.push(Body::Intent {
                op,
                steps: Steps::Multi,
                target: target(pod).into(),
            });
            bodies.push(Body::Intent {
                op,
                steps: Steps::Single,
                target: target(pod).into(),
            });
            for result in [
                OpResult::Success,
                OpResult::FailedFinal("exit 32".into()),
                OpResult::FailedUncertain("timeout".into()),
            ] {
                bodies.push(Body::Outcome {
                    intent_seq: 9,
                    op,
                    result,
                    observed: Some(observed()),
                });
            }
        }
        for state in [
            MountState::Mounted,
            MountState::Uncertain,
            MountState::NotMounted,
        ] {
            bodies.push(Body::Reconstructed {
                target: target(Some("p")).into(),
                state,
                reason: "r".into(),
                observed: None,
            });
        }
        bodies.push(Body::Forget {
            volume: UniqueVolumeName::from_raw("v"),
            target: TargetRef::Device,
        });
        bodies.push(Body::Forget {
            volume: UniqueVolumeName::from_raw("v"),
            target: TargetRef::Pod(PodUid::new("p").unwrap()),
        });
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Record {
                seq: i as u64 + 1,
                wall_time_ns: 1_700_000_000_000_000_000,
                boot_id: "boot".into(),
                body,
            })
            .collect()
    }

    fn csi_target() -> TargetParams {
        let mut p =
            target(Some("p")).with_csi(Some(std::sync::Arc::new(crate::model::CsiParams {
                driver: "d.example.com".into(),
                volume_handle: "h".into(),
                lifecycle: crate::model::CsiLifecycle::Ephemeral,
                access_modes: vec![crate::model::AccessMode::ReadWriteMany],
                read_only: false,
                publish_context: [("a".to_owned(), "b".to_owned())].into(),
                volume_context: [("c".to_owned(), "d".to_owned())].into(),
                stage_secret: None,
                publish_secret: Some(crate::model::SecretRef {
                    namespace: "ns".into(),
                    name: "s".into(),
                }),
                mount_group: None,
                attachment_id: None,
            })));
        p.volume = UniqueVolumeName::from_raw("kubernetes.io/csi/d.example.com^h");
        p.plugin = PluginName::Csi;
        p
    }

    #[test]
    fn every_record_type_round_trips_through_bincode() {
        for r in every_record() {
            let bytes = encode(&RecordV2::from(&r));
            let back: RecordV2 = decode(&bytes).unwrap();
            assert_eq!(Record::try_from(&back).unwrap(), r);
            // format v1 writes the same bodies (without CSI arguments)
            let back: RecordV1 = decode(&encode(&RecordV1::from(&r))).unwrap();
            assert_eq!(Record::try_from(&back).unwrap(), r);
        }
        let csi = Record {
            body: Body::Intent {
                op: Operation::SetUp,
                steps: Steps::Multi,
                target: csi_target().into(),
            },
            ..every_record()[0].clone()
        };
        let back: RecordV2 = decode(&encode(&RecordV2::from(&csi))).unwrap();
        assert_eq!(
            Record::try_from(&back).unwrap(),
            csi,
            "CSI arguments survive v2"
        );
    }

    fn subpath_bind(container: &str) -> crate::model::SubpathBind {
        crate::model::SubpathBind {
            key: crate::model::SubpathKey {
                pod: PodUid::new("pod-a").unwrap(),
                name: "data".into(),
                container: container.into(),
                index: 2,
            },
            volume: UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            sub_path: "logs/app".into(),
        }
    }

    #[test]
    fn subpath_records_round_trip_and_a_checkpoint_keeps_its_binds() {
        let intent = Record {
            seq: 7,
            wall_time_ns: 7,
            boot_id: "b".into(),
            body: Body::SubpathIntent {
                op: Operation::BindSubpath,
                bind: subpath_bind("app"),
            },
        };
        let back: RecordV3 = decode(&encode(&RecordV3::from(&intent))).unwrap();
        assert_eq!(Record::try_from(&back).unwrap(), intent);
        let done = Record {
            seq: 8,
            wall_time_ns: 8,
            boot_id: "b".into(),
            body: Body::Outcome {
                intent_seq: 7,
                op: Operation::BindSubpath,
                result: OpResult::Success,
                observed: None,
            },
        };
        let pending = Record {
            seq: 9,
            body: Body::SubpathIntent {
                op: Operation::UnbindSubpath,
                bind: subpath_bind("sidecar"),
            },
            ..intent.clone()
        };
        let mut s = JournalState::default();
        for r in [&intent, &done, &pending] {
            s.apply(r);
        }
        let bytes = encode(&CheckpointV5::of(&s, 5));
        let (state, through, _, _) = decode_checkpoint(5, &bytes).unwrap();
        assert_eq!(through, 9);
        assert_eq!(state, s, "both binds, the pending one too");
        assert_eq!(state.subpaths().count(), 2);
        // the pending unbind's outcome still finds its intent after the
        // checkpoint
        let mut state = state;
        state.apply(&Record {
            seq: 10,
            body: Body::Outcome {
                intent_seq: 9,
                op: Operation::UnbindSubpath,
                result: OpResult::Success,
                observed: None,
            },
            ..done
        });
        assert_eq!(state.subpaths().count(), 1);
        assert!(state.anomalies().is_empty(), "{:?}", state.anomalies());
    }

    #[test]
    fn a_v4_checkpoint_becomes_v5_with_no_binds_and_again_the_same() {
        const ID: u64 = 0x5eed;
        use super::super::envelope::{Kind, seal};
        let mut s = JournalState::default();
        for r in every_record() {
            s.apply(&r);
        }
        let v4 = seal(
            ID,
            Kind::Checkpoint,
            s.last_seq(),
            &encode(&CheckpointV3::of(&s, 5)),
        );
        let v5 = crate::journal::migrations::checkpoint_v4_to_v5(ID, &v4).unwrap();
        let payload =
            super::super::envelope::open(ID, Kind::Checkpoint, s.last_seq(), &v5).unwrap();
        assert_eq!(decode_checkpoint(5, payload).unwrap().0, s);
        // cut short and run again: the same bytes
        assert_eq!(
            crate::journal::migrations::checkpoint_v4_to_v5(ID, &v5),
            Some(v5)
        );
    }

    #[test]
    fn a_subpath_record_with_a_hostile_name_or_a_foreign_op_is_refused() {
        let mut bad = RecordV3::from(&Record {
            seq: 1,
            wall_time_ns: 1,
            boot_id: "b".into(),
            body: Body::SubpathIntent {
                op: Operation::BindSubpath,
                bind: subpath_bind("app"),
            },
        });
        if let BodyOf::SubpathIntent { bind, .. } = &mut bad.body {
            bind.container = "../../etc".into();
        }
        let e = Record::try_from(&bad).unwrap_err().to_string();
        assert!(e.contains("subpath") && e.contains("container"), "{e}");
        if let BodyOf::SubpathIntent { bind, op } = &mut bad.body {
            bind.container = "app".into();
            *op = OpV1::SetUp;
        }
        let e = Record::try_from(&bad).unwrap_err().to_string();
        assert!(e.contains("not a subpath operation"), "{e}");
    }

    /// Found by the `journal_record` fuzz target: a sealed record whose
    /// payload claims another sequence number than its key let two
    /// intents share seq 42, and replay built a state no checkpoint holds.
    #[test]
    fn a_record_whose_payload_names_another_seq_does_not_open() {
        const ID: u64 = 0x5eed;
        let r = every_record()[0].clone();
        let sealed = |key: u64| {
            let bytes = encode(&RecordV3::from(&r));
            super::super::envelope::seal(ID, super::super::envelope::Kind::Record, key, &bytes)
        };
        assert_eq!(open_record(ID, r.seq, &sealed(r.seq)), Ok(r.clone()));
        let e = open_record(ID, r.seq + 1, &sealed(r.seq + 1)).unwrap_err();
        assert!(
            e.contains(&format!("stored as seq {}", r.seq + 1))
                && e.contains(&format!("says it is seq {}", r.seq)),
            "{e}"
        );
    }

    #[test]
    fn a_v1_record_migrates_to_the_same_v2_record() {
        for r in every_record() {
            let v2 = RecordV1::from(&r).map_target(TargetV2::from);
            assert_eq!(v2, RecordV2::from(&r));
        }
    }

    #[test]
    fn hostile_csi_fields_are_refused_with_their_name() {
        let mut t = TargetV2::from_params(&csi_target());
        if let Some(c) = t.csi.as_mut() {
            c.driver = "../x".into();
        }
        assert!(
            t.to_params()
                .unwrap_err()
                .to_string()
                .contains("csi.driver")
        );
        let mut t = TargetV2::from_params(&csi_target());
        if let Some(c) = t.csi.as_mut() {
            c.lifecycle = 9;
        }
        assert!(
            t.to_params()
                .unwrap_err()
                .to_string()
                .contains("csi.lifecycle")
        );
        let mut t = TargetV2::from_params(&csi_target());
        t.base.plugin = "kubernetes.io/empty-dir".into();
        assert!(t.to_params().unwrap_err().to_string().contains("non-CSI"));
    }

    #[test]
    fn checkpoint_round_trips_with_pending_intents() {
        let mut s = JournalState::default();
        for r in every_record().iter().take(4) {
            s.apply(r);
        }
        let ck = CheckpointV2::of(&s, 5);
        let back: CheckpointV2 = decode(&encode(&ck)).unwrap();
        assert_eq!(
            back.to_state().unwrap(),
            JournalState::from_entries(s.last_seq(), s.entries().map(|(_, e)| e.clone()))
        );
        assert!(back.entries.iter().any(|e| e.pending.is_some()));
    }

    /// The borrowed decode of the current checkpoint reads the bytes the
    /// owned types write into the same state (every record type, a CSI
    /// target, pending intents, observed identities), and a cut checkpoint
    /// is an error.
    #[test]
    fn a_v3_checkpoint_decodes_borrowed_into_the_owned_decodes_state() {
        let all = every_record();
        let state_of = |records: &[Record]| {
            let mut s = JournalState::default();
            for r in records {
                s.apply(r);
            }
            s
        };
        let csi_pending = Record {
            seq: 1,
            wall_time_ns: 1,
            boot_id: "b".into(),
            body: Body::Intent {
                op: Operation::SetUp,
                steps: Steps::Single,
                target: csi_target().into(),
            },
        };
        let seen = Record {
            seq: 2,
            wall_time_ns: 2,
            boot_id: "b".into(),
            body: Body::Reconstructed {
                target: target(Some("pod-b")).into(),
                state: MountState::Mounted,
                reason: "mounted_agrees".into(),
                observed: Some(MountIdentity {
                    selinux: Some(SeLinuxContext::parse("u:r:t:s0:c1,c2").unwrap()),
                    ..observed()
                }),
            },
        };
        let (mut pending, mut observed, mut csi) = (false, false, false);
        for s in [
            state_of(&all[..4]),
            state_of(&all),
            state_of(&[csi_pending, seen]),
        ] {
            let ck = CheckpointV3::of(&s, 5);
            pending |= ck.entries.iter().any(|e| e.pending.is_some());
            observed |= ck.entries.iter().any(|e| e.observed.is_some());
            csi |= ck.entries.iter().any(|e| {
                e.pending
                    .as_ref()
                    .is_some_and(|p| p.target.base.csi.is_some())
            });
            let bytes = encode(&ck);
            let owned: CheckpointV3 = decode(&bytes).unwrap();
            let (state, through, wall, n) = decode_checkpoint(3, &bytes).unwrap();
            assert_eq!(state, owned.to_state().unwrap());
            assert_eq!((through, wall, n), (s.last_seq(), 5, ck.entries.len()));
            assert_eq!(checkpoint_head(&bytes), Some((through, wall, n)));
            assert!(decode_checkpoint(3, &bytes[..bytes.len() - 3]).is_err());
        }
        assert!(pending && observed && csi, "{pending} {observed} {csi}");
    }

    /// The decoded state keeps one spec name, fs type, root and boot id
    /// for the targets that repeat them, not one allocation per target.
    #[test]
    fn a_decoded_checkpoint_shares_repeated_names_roots_and_boot_ids() {
        let mut s = JournalState::default();
        for (seq, pod) in [(1, "pod-a"), (2, "pod-b"), (3, "pod-c")] {
            s.apply(&Record {
                seq,
                wall_time_ns: seq,
                boot_id: "b".into(),
                body: Body::Reconstructed {
                    target: target(Some(pod)).into(),
                    state: MountState::Mounted,
                    reason: "mounted_agrees".into(),
                    observed: Some(observed()),
                },
            });
        }
        let bytes = encode(&CheckpointV3::of(&s, 5));
        let (state, ..) = decode_checkpoint(3, &bytes).unwrap();
        let at = |f: fn(&crate::journal::replay::Entry) -> *const u8| {
            state.entries().map(|(_, e)| f(e)).collect::<Vec<_>>()
        };
        let spec = at(|e| e.params.spec_name.as_ptr());
        let fs = at(|e| e.params.fs_type.as_deref().unwrap().as_ptr());
        let root = at(|e| {
            e.observed
                .as_ref()
                .unwrap()
                .root
                .as_os_str()
                .as_encoded_bytes()
                .as_ptr()
        });
        let boot = at(|e| e.boot_id.as_ptr());
        let shared = [
            ("spec name", spec),
            ("fs type", fs),
            ("root", root),
            ("boot id", boot),
        ];
        for (what, ptrs) in shared {
            assert_eq!(ptrs.len(), 3, "{what}");
            assert!(ptrs.iter().all(|p| *p == ptrs[0]), "{what}: {ptrs:?}");
        }
    }

    #[test]
    fn hostile_fields_are_refused_with_their_name() {
        let mut t = TargetV1::from(&target(Some("p")));
        t.pod_uid = Some("../../etc".into());
        let err = TargetParams::try_from(&t).unwrap_err();
        assert!(err.to_string().contains("pod_uid"), "{err}");
        let mut t = TargetV1::from(&target(None));
        t.plugin = "kubernetes.io/nfs".into();
        assert!(
            TargetParams::try_from(&t)
                .unwrap_err()
                .to_string()
                .contains("plugin")
        );
        assert!(decode::<RecordV1>(b"\x01\x02").is_err());
    }
}
