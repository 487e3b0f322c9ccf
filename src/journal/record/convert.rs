//! The conversions between the on-disk v1 types and the model: every
//! field checked on the way in (a value the model refuses is a
//! [`RecordError`], never a panic), paths as raw bytes both ways.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::super::replay::{Body, Entry, JournalState, OpResult, Pending, Record};
use super::*;
use crate::model::{
    DevId, MountIdentity, MountState, Operation, PluginName, PodUid, SeLinuxContext, SharedParams,
    SharedStr, Steps, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};

fn path_bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

fn bytes_path(b: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(b))
}

impl From<Operation> for OpV1 {
    fn from(op: Operation) -> Self {
        match op {
            Operation::FormatDevice => OpV1::FormatDevice,
            Operation::MountDevice => OpV1::MountDevice,
            Operation::SetUp => OpV1::SetUp,
            Operation::TearDown => OpV1::TearDown,
            Operation::UnmountDevice => OpV1::UnmountDevice,
        }
    }
}

impl From<OpV1> for Operation {
    fn from(op: OpV1) -> Self {
        match op {
            OpV1::FormatDevice => Operation::FormatDevice,
            OpV1::MountDevice => Operation::MountDevice,
            OpV1::SetUp => Operation::SetUp,
            OpV1::TearDown => Operation::TearDown,
            OpV1::UnmountDevice => Operation::UnmountDevice,
        }
    }
}

impl From<MountState> for StateV1 {
    fn from(s: MountState) -> Self {
        match s {
            MountState::Mounted => StateV1::Mounted,
            MountState::Uncertain => StateV1::Uncertain,
            MountState::NotMounted => StateV1::NotMounted,
        }
    }
}

impl From<StateV1> for MountState {
    fn from(s: StateV1) -> Self {
        match s {
            StateV1::Mounted => MountState::Mounted,
            StateV1::Uncertain => MountState::Uncertain,
            StateV1::NotMounted => MountState::NotMounted,
        }
    }
}

impl From<Steps> for bool {
    fn from(s: Steps) -> Self {
        s == Steps::Multi
    }
}

impl From<&TargetParams> for TargetV1 {
    fn from(p: &TargetParams) -> Self {
        TargetV1 {
            volume: p.volume.as_str().to_owned(),
            plugin: p.plugin.as_str().to_owned(),
            spec_name: p.spec_name.to_string(),
            pod_uid: match &p.target {
                TargetRef::Device => None,
                TargetRef::Pod(uid) => Some(uid.as_str().to_owned()),
            },
            kind: match p.kind {
                TargetKind::Mount => 0,
                TargetKind::Dir => 1,
                TargetKind::None => 2,
            },
            device_path: p.device_path.as_deref().map(path_bytes),
            device_mount_path: p.device_mount_path.as_deref().map(path_bytes),
            pod_mount_path: p.pod_mount_path.as_deref().map(path_bytes),
            selinux_context: p.selinux.as_ref().map(|c| c.as_str().to_owned()),
            mount_options: p.mount_options.to_vec(),
            fs_type: p.fs_type.as_deref().map(str::to_owned),
        }
    }
}

impl TryFrom<&TargetV1> for TargetParams {
    type Error = RecordError;
    fn try_from(t: &TargetV1) -> Result<Self, RecordError> {
        let plugin = PluginName::parse(&t.plugin)
            .ok_or_else(|| field_err("plugin", &t.plugin, "not a plugin volumed knows"))?;
        let target = match &t.pod_uid {
            None => TargetRef::Device,
            Some(uid) => {
                TargetRef::Pod(PodUid::new(uid).map_err(|e| field_err("pod_uid", uid, e))?)
            }
        };
        let kind = match t.kind {
            0 => TargetKind::Mount,
            1 => TargetKind::Dir,
            2 => TargetKind::None,
            k => return Err(field_err("kind", &k.to_string(), "not 0, 1 or 2")),
        };
        let selinux = t
            .selinux_context
            .as_deref()
            .map(|c| SeLinuxContext::parse(c).map_err(|e| field_err("selinux_context", c, e)))
            .transpose()?;
        Ok(TargetParams {
            volume: UniqueVolumeName::from_raw(t.volume.clone()),
            plugin,
            spec_name: t.spec_name.as_str().into(),
            target,
            kind,
            device_path: t.device_path.as_deref().map(|b| bytes_path(b).into()),
            device_mount_path: t.device_mount_path.as_deref().map(|b| bytes_path(b).into()),
            pod_mount_path: t.pod_mount_path.as_deref().map(|b| bytes_path(b).into()),
            selinux,
            mount_options: t.mount_options.clone().into(),
            fs_type: t.fs_type.as_deref().map(SharedStr::from),
        })
    }
}

impl From<&MountIdentity> for IdentityV1 {
    fn from(i: &MountIdentity) -> Self {
        IdentityV1 {
            major: i.dev.major,
            minor: i.dev.minor,
            root: path_bytes(&i.root),
            fs_type: i.fs_type.clone(),
            read_only: i.read_only,
            selinux_context: i.selinux.as_ref().map(|c| c.as_str().to_owned()),
        }
    }
}

impl TryFrom<&IdentityV1> for MountIdentity {
    type Error = RecordError;
    fn try_from(i: &IdentityV1) -> Result<Self, RecordError> {
        let selinux = i
            .selinux_context
            .as_deref()
            .map(|c| SeLinuxContext::parse(c).map_err(|e| field_err("observed.selinux", c, e)))
            .transpose()?;
        Ok(MountIdentity {
            dev: DevId {
                major: i.major,
                minor: i.minor,
            },
            root: bytes_path(&i.root),
            fs_type: i.fs_type.clone(),
            read_only: i.read_only,
            selinux,
        })
    }
}

fn steps_of(multi_step: bool) -> Steps {
    if multi_step {
        Steps::Multi
    } else {
        Steps::Single
    }
}

impl From<&Record> for RecordV1 {
    fn from(r: &Record) -> Self {
        let body = match &r.body {
            Body::Intent { op, steps, target } => BodyV1::Intent {
                op: (*op).into(),
                multi_step: (*steps).into(),
                target: (&**target).into(),
            },
            Body::Outcome {
                intent_seq,
                op,
                result,
                observed,
            } => BodyV1::Outcome {
                intent_seq: *intent_seq,
                op: (*op).into(),
                result: match result {
                    OpResult::Success => ResultV1::Success,
                    OpResult::FailedFinal(e) => ResultV1::FailedFinal { error: e.clone() },
                    OpResult::FailedUncertain(e) => ResultV1::FailedUncertain { error: e.clone() },
                },
                observed: observed.as_ref().map(IdentityV1::from),
            },
            Body::Reconstructed {
                target,
                state,
                reason,
                observed,
            } => BodyV1::Reconstructed {
                target: (&**target).into(),
                state: (*state).into(),
                reason: reason.clone(),
                observed: observed.as_ref().map(IdentityV1::from),
            },
            Body::Forget { volume, target } => BodyV1::Forget {
                volume: volume.as_str().to_owned(),
                pod_uid: match target {
                    TargetRef::Device => None,
                    TargetRef::Pod(uid) => Some(uid.as_str().to_owned()),
                },
            },
        };
        RecordV1 {
            seq: r.seq,
            wall_time_ns: r.wall_time_ns,
            boot_id: r.boot_id.clone(),
            body,
        }
    }
}

fn identity(o: &Option<IdentityV1>) -> Result<Option<MountIdentity>, RecordError> {
    o.as_ref().map(MountIdentity::try_from).transpose()
}

impl TryFrom<&RecordV1> for Record {
    type Error = RecordError;
    fn try_from(r: &RecordV1) -> Result<Self, RecordError> {
        let body = match &r.body {
            BodyV1::Intent {
                op,
                multi_step,
                target,
            } => Body::Intent {
                op: (*op).into(),
                steps: steps_of(*multi_step),
                target: SharedParams::new(target.try_into()?),
            },
            BodyV1::Outcome {
                intent_seq,
                op,
                result,
                observed,
            } => Body::Outcome {
                intent_seq: *intent_seq,
                op: (*op).into(),
                result: match result {
                    ResultV1::Success => OpResult::Success,
                    ResultV1::FailedFinal { error } => OpResult::FailedFinal(error.clone()),
                    ResultV1::FailedUncertain { error } => OpResult::FailedUncertain(error.clone()),
                },
                observed: identity(observed)?,
            },
            BodyV1::Reconstructed {
                target,
                state,
                reason,
                observed,
            } => Body::Reconstructed {
                target: SharedParams::new(target.try_into()?),
                state: (*state).into(),
                reason: reason.clone(),
                observed: identity(observed)?,
            },
            BodyV1::Forget { volume, pod_uid } => Body::Forget {
                volume: UniqueVolumeName::from_raw(volume.clone()),
                target: match pod_uid {
                    None => TargetRef::Device,
                    Some(uid) => {
                        TargetRef::Pod(PodUid::new(uid).map_err(|e| field_err("pod_uid", uid, e))?)
                    }
                },
            },
        };
        Ok(Record {
            seq: r.seq,
            wall_time_ns: r.wall_time_ns,
            boot_id: r.boot_id.clone(),
            body,
        })
    }
}

impl From<&Entry> for EntryV1 {
    fn from(e: &Entry) -> Self {
        EntryV1 {
            target: (&*e.params).into(),
            state: e.state.into(),
            pending: e.pending.as_ref().map(|p| PendingV1 {
                op: p.op.into(),
                intent_seq: p.intent_seq,
                multi_step: p.steps.into(),
                target: (&*p.params).into(),
            }),
            observed: e.observed.as_deref().map(IdentityV1::from),
            last_seq: e.last_seq,
            boot_id: e.boot_id.to_string(),
            reason: e.reason.as_deref().map(str::to_owned),
        }
    }
}

impl TryFrom<&EntryV1> for Entry {
    type Error = RecordError;
    fn try_from(e: &EntryV1) -> Result<Self, RecordError> {
        Ok(Entry {
            params: SharedParams::new((&e.target).try_into()?),
            state: e.state.into(),
            pending: e
                .pending
                .as_ref()
                .map(|p| -> Result<Box<Pending>, RecordError> {
                    Ok(Box::new(Pending {
                        op: p.op.into(),
                        intent_seq: p.intent_seq,
                        steps: steps_of(p.multi_step),
                        params: SharedParams::new((&p.target).try_into()?),
                    }))
                })
                .transpose()?,
            observed: identity(&e.observed)?.map(Box::new),
            last_seq: e.last_seq,
            boot_id: e.boot_id.as_str().into(),
            reason: e.reason.as_deref().map(SharedStr::from),
        })
    }
}

impl CheckpointV1 {
    /// The checkpoint of a state.
    pub fn of(state: &JournalState, wall_time_ns: u64) -> Self {
        CheckpointV1 {
            through_seq: state.last_seq(),
            wall_time_ns,
            entries: state.entries().map(|(_, e)| EntryV1::from(e)).collect(),
        }
    }
    /// The state it holds.
    pub fn to_state(&self) -> Result<JournalState, RecordError> {
        let entries = self
            .entries
            .iter()
            .map(Entry::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(JournalState::from_entries(self.through_seq, entries))
    }
}
