//! The conversions between the on-disk types and the model: every
//! field checked on the way in (a value the model refuses is a
//! [`RecordError`], never a panic), paths as raw bytes both ways.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::super::replay::{Body, Entry, JournalState, OpResult, Pending, Record, SubpathEntry};
use super::borrowed::{IdentityRef, TargetV1Ref};
use super::*;
use crate::model::{
    AccessMode, CsiLifecycle, CsiParams, MountIdentity, MountState, Operation, PluginName, PodUid,
    SecretRef, SharedParams, SharedStr, Steps, SubpathBind, SubpathKey, TargetKind, TargetParams,
    TargetRef, UniqueVolumeName, check_component,
};

fn path_bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

impl From<Operation> for OpV1 {
    fn from(op: Operation) -> Self {
        match op {
            Operation::FormatDevice => OpV1::FormatDevice,
            Operation::MountDevice => OpV1::MountDevice,
            Operation::SetUp => OpV1::SetUp,
            Operation::TearDown => OpV1::TearDown,
            Operation::UnmountDevice => OpV1::UnmountDevice,
            Operation::SetOwnership => OpV1::SetOwnership,
            Operation::BindSubpath => OpV1::BindSubpath,
            Operation::UnbindSubpath => OpV1::UnbindSubpath,
            Operation::MapDevice => OpV1::MapDevice,
            Operation::UnmapDevice => OpV1::UnmapDevice,
            Operation::MapPodDevice => OpV1::MapPodDevice,
            Operation::UnmapPodDevice => OpV1::UnmapPodDevice,
            Operation::ExpandVolume => OpV1::ExpandVolume,
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
            OpV1::SetOwnership => Operation::SetOwnership,
            OpV1::BindSubpath => Operation::BindSubpath,
            OpV1::UnbindSubpath => Operation::UnbindSubpath,
            OpV1::MapDevice => Operation::MapDevice,
            OpV1::UnmapDevice => Operation::UnmapDevice,
            OpV1::MapPodDevice => Operation::MapPodDevice,
            OpV1::UnmapPodDevice => Operation::UnmapPodDevice,
            OpV1::ExpandVolume => Operation::ExpandVolume,
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
            pod_uid: p.target.pod().map(|uid| uid.as_str().to_owned()),
            kind: match p.kind {
                TargetKind::Mount => 0,
                TargetKind::Dir => 1,
                TargetKind::None => 2,
                TargetKind::Block => 3,
            },
            device_path: p.device_path().map(path_bytes),
            device_mount_path: p.device_mount_path().map(path_bytes),
            pod_mount_path: p.pod_mount_path.as_deref().map(path_bytes),
            selinux_context: p.selinux().map(|c| c.as_str().to_owned()),
            mount_options: p.mount_options().to_vec(),
            fs_type: p.fs_type.as_deref().map(str::to_owned),
        }
    }
}

impl TryFrom<&TargetV1> for TargetParams {
    type Error = RecordError;
    fn try_from(t: &TargetV1) -> Result<Self, RecordError> {
        TargetParams::try_from(&TargetV1Ref::of(t))
    }
}

/// A format's target type: how the model's parameters are written in it and
/// read back from it. Records and checkpoints convert through it.
pub trait TargetFormat: Sized {
    /// The parameters as this format writes them (format v1 has no place
    /// for CSI arguments and drops them; only fixtures write v1).
    fn from_params(p: &TargetParams) -> Self;
    /// The parameters this value holds, every field checked.
    fn to_params(&self) -> Result<TargetParams, RecordError>;
}

impl TargetFormat for TargetV1 {
    fn from_params(p: &TargetParams) -> Self {
        p.into()
    }
    fn to_params(&self) -> Result<TargetParams, RecordError> {
        self.try_into()
    }
}

impl TargetFormat for TargetV2 {
    fn from_params(p: &TargetParams) -> Self {
        TargetV2 {
            base: p.into(),
            csi: p.csi().map(|c| CsiV2::from(c.as_ref())),
        }
    }
    fn to_params(&self) -> Result<TargetParams, RecordError> {
        let p = TargetParams::try_from(&self.base)?;
        with_csi(p, self.csi.as_ref(), &self.base.plugin)
    }
}

/// `p` with the CSI arguments of its v2 target, if any (`plugin`, as
/// written, names it in an error).
pub(super) fn with_csi(
    p: TargetParams,
    csi: Option<&CsiV2>,
    plugin: &str,
) -> Result<TargetParams, RecordError> {
    let Some(c) = csi else {
        return Ok(p);
    };
    if p.plugin != PluginName::Csi {
        return Err(field_err(
            "csi",
            plugin,
            "CSI arguments on a non-CSI target",
        ));
    }
    Ok(p.with_csi(Some(Arc::new(CsiParams::try_from(c)?))))
}

impl From<TargetV1> for TargetV2 {
    fn from(base: TargetV1) -> Self {
        TargetV2 { base, csi: None }
    }
}

fn access_mode_code(m: AccessMode) -> u8 {
    match m {
        AccessMode::ReadWriteOncePod => 0,
        AccessMode::ReadWriteOnce => 1,
        AccessMode::ReadOnlyMany => 2,
        AccessMode::ReadWriteMany => 3,
    }
}

fn secret_v2(s: &SecretRef) -> SecretRefV2 {
    SecretRefV2 {
        namespace: s.namespace.clone(),
        name: s.name.clone(),
    }
}

fn secret_ref(s: &SecretRefV2) -> SecretRef {
    SecretRef {
        namespace: s.namespace.clone(),
        name: s.name.clone(),
    }
}

impl From<&CsiParams> for CsiV2 {
    fn from(c: &CsiParams) -> Self {
        let pairs =
            |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        CsiV2 {
            driver: c.driver.clone(),
            volume_handle: c.volume_handle.clone(),
            lifecycle: match c.lifecycle {
                CsiLifecycle::Persistent => 0,
                CsiLifecycle::Ephemeral => 1,
            },
            access_modes: c
                .access_modes
                .iter()
                .map(|m| access_mode_code(*m))
                .collect(),
            read_only: c.read_only,
            publish_context: pairs(&c.publish_context),
            volume_context: pairs(&c.volume_context),
            stage_secret: c.stage_secret.as_ref().map(secret_v2),
            publish_secret: c.publish_secret.as_ref().map(secret_v2),
            mount_group: c.mount_group.clone(),
            attachment_id: c.attachment_id.clone(),
        }
    }
}

impl TryFrom<&CsiV2> for CsiParams {
    type Error = RecordError;
    fn try_from(c: &CsiV2) -> Result<Self, RecordError> {
        check_component("csi driver", &c.driver)
            .map_err(|e| field_err("csi.driver", &c.driver, e))?;
        if c.volume_handle.is_empty() {
            return Err(field_err("csi.volume_handle", "", "empty"));
        }
        let lifecycle = match c.lifecycle {
            0 => CsiLifecycle::Persistent,
            1 => CsiLifecycle::Ephemeral,
            n => return Err(field_err("csi.lifecycle", &n.to_string(), "not 0 or 1")),
        };
        let access_modes = c
            .access_modes
            .iter()
            .map(|m| match m {
                0 => Ok(AccessMode::ReadWriteOncePod),
                1 => Ok(AccessMode::ReadWriteOnce),
                2 => Ok(AccessMode::ReadOnlyMany),
                3 => Ok(AccessMode::ReadWriteMany),
                n => Err(field_err("csi.access_modes", &n.to_string(), "not 0 to 3")),
            })
            .collect::<Result<_, _>>()?;
        Ok(CsiParams {
            driver: c.driver.clone(),
            volume_handle: c.volume_handle.clone(),
            lifecycle,
            access_modes,
            read_only: c.read_only,
            publish_context: c.publish_context.iter().cloned().collect(),
            volume_context: c.volume_context.iter().cloned().collect(),
            stage_secret: c.stage_secret.as_ref().map(secret_ref),
            publish_secret: c.publish_secret.as_ref().map(secret_ref),
            mount_group: c.mount_group.clone(),
            attachment_id: c.attachment_id.clone(),
        })
    }
}

impl From<&MountIdentity> for IdentityV1 {
    fn from(i: &MountIdentity) -> Self {
        IdentityV1 {
            major: i.dev.major,
            minor: i.dev.minor,
            root: path_bytes(&i.root),
            fs_type: i.fs_type.to_string(),
            read_only: i.read_only,
            selinux_context: i.selinux.as_ref().map(|c| c.as_str().to_owned()),
        }
    }
}

impl TryFrom<&IdentityV1> for MountIdentity {
    type Error = RecordError;
    fn try_from(i: &IdentityV1) -> Result<Self, RecordError> {
        MountIdentity::try_from(&IdentityRef::of(i))
    }
}

pub(super) fn steps_of(multi_step: bool) -> Steps {
    if multi_step {
        Steps::Multi
    } else {
        Steps::Single
    }
}

impl<T: TargetFormat> From<&Record> for RecordOf<T> {
    fn from(r: &Record) -> Self {
        let body = match &r.body {
            Body::Intent { op, steps, target } => BodyOf::Intent {
                op: (*op).into(),
                multi_step: (*steps).into(),
                target: T::from_params(target),
            },
            Body::Outcome {
                intent_seq,
                op,
                result,
                observed,
            } => BodyOf::Outcome {
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
            } => BodyOf::Reconstructed {
                target: T::from_params(target),
                state: (*state).into(),
                reason: reason.clone(),
                observed: observed.as_ref().map(IdentityV1::from),
            },
            Body::Forget { volume, target } => BodyOf::Forget {
                volume: volume.as_str().to_owned(),
                pod_uid: target.pod().map(|uid| uid.as_str().to_owned()),
            },
            Body::SubpathIntent { op, bind } => BodyOf::SubpathIntent {
                op: (*op).into(),
                bind: SubpathV5::from(bind),
            },
        };
        RecordOf {
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

impl<T: TargetFormat> TryFrom<&RecordOf<T>> for Record {
    type Error = RecordError;
    fn try_from(r: &RecordOf<T>) -> Result<Self, RecordError> {
        let body = match &r.body {
            BodyOf::Intent {
                op,
                multi_step,
                target,
            } => Body::Intent {
                op: (*op).into(),
                steps: steps_of(*multi_step),
                target: SharedParams::new(target.to_params()?),
            },
            BodyOf::Outcome {
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
            BodyOf::Reconstructed {
                target,
                state,
                reason,
                observed,
            } => Body::Reconstructed {
                target: SharedParams::new(target.to_params()?),
                state: (*state).into(),
                reason: reason.clone(),
                observed: identity(observed)?,
            },
            BodyOf::Forget { volume, pod_uid } => Body::Forget {
                volume: UniqueVolumeName::from_raw(volume.clone()),
                target: match pod_uid {
                    None => TargetRef::Device,
                    Some(uid) => {
                        TargetRef::Pod(PodUid::new(uid).map_err(|e| field_err("pod_uid", uid, e))?)
                    }
                },
            },
            BodyOf::SubpathIntent { op, bind } => {
                let op = Operation::from(*op);
                if !op.is_subpath_op() {
                    return Err(field_err("op", op.as_str(), "not a subpath operation"));
                }
                Body::SubpathIntent {
                    op,
                    bind: SubpathBind::try_from(bind)?,
                }
            }
        };
        Ok(Record {
            seq: r.seq,
            wall_time_ns: r.wall_time_ns,
            boot_id: r.boot_id.clone(),
            body,
        })
    }
}

impl From<&SubpathBind> for SubpathV5 {
    fn from(b: &SubpathBind) -> Self {
        SubpathV5 {
            pod_uid: b.key.pod.as_str().to_owned(),
            name: b.key.name.clone(),
            container: b.key.container.clone(),
            index: b.key.index,
            volume: b.volume.as_str().to_owned(),
            sub_path: b.sub_path.clone(),
        }
    }
}

impl TryFrom<&SubpathV5> for SubpathBind {
    type Error = RecordError;
    fn try_from(b: &SubpathV5) -> Result<Self, RecordError> {
        let pod = PodUid::new(&b.pod_uid).map_err(|e| field_err("pod_uid", &b.pod_uid, e))?;
        let key = SubpathKey::new(pod, &b.name, &b.container, b.index)
            .map_err(|e| field_err("subpath", &format!("{}/{}", b.name, b.container), e))?;
        Ok(SubpathBind {
            key,
            volume: UniqueVolumeName::from_raw(b.volume.clone()),
            sub_path: b.sub_path.clone(),
        })
    }
}

impl From<&SubpathEntry> for SubpathEntryV5 {
    fn from(e: &SubpathEntry) -> Self {
        SubpathEntryV5 {
            bind: SubpathV5::from(&e.bind),
            state: e.state.into(),
            pending: e
                .pending
                .as_ref()
                .map(|(op, seq, bind)| ((*op).into(), *seq, SubpathV5::from(bind))),
            last_seq: e.last_seq,
        }
    }
}

/// A checkpointed subPath bind as the state keeps it.
pub(super) fn subpath_entry(e: &SubpathEntryV5) -> Result<SubpathEntry, RecordError> {
    let pending = match &e.pending {
        None => None,
        Some((op, seq, bind)) => {
            let op = Operation::from(*op);
            if !op.is_subpath_op() {
                return Err(field_err("op", op.as_str(), "not a subpath operation"));
            }
            Some((op, *seq, SubpathBind::try_from(bind)?))
        }
    };
    Ok(SubpathEntry {
        bind: SubpathBind::try_from(&e.bind)?,
        state: e.state.into(),
        pending,
        last_seq: e.last_seq,
    })
}

impl CheckpointV5 {
    /// The checkpoint of a state.
    pub fn of(state: &JournalState, wall_time_ns: u64) -> Self {
        CheckpointV5 {
            through_seq: state.last_seq(),
            wall_time_ns,
            entries: state.entries().map(|(_, e)| EntryOf::from(e)).collect(),
            subpaths: state.subpaths().map(SubpathEntryV5::from).collect(),
        }
    }
}

impl<T: TargetFormat> From<&Entry> for EntryOf<T> {
    fn from(e: &Entry) -> Self {
        EntryOf {
            target: T::from_params(&e.params),
            state: e.state.into(),
            pending: e.pending.as_ref().map(|p| PendingOf {
                op: p.op.into(),
                intent_seq: p.intent_seq,
                multi_step: p.steps.into(),
                target: T::from_params(&p.params),
            }),
            observed: e.observed.as_deref().map(IdentityV1::from),
            last_seq: e.last_seq,
            boot_id: e.boot_id.to_string(),
            reason: e.reason.as_deref().map(str::to_owned),
        }
    }
}

impl<T: TargetFormat> TryFrom<&EntryOf<T>> for Entry {
    type Error = RecordError;
    fn try_from(e: &EntryOf<T>) -> Result<Self, RecordError> {
        let pending = e
            .pending
            .as_ref()
            .map(|p| {
                p.target
                    .to_params()
                    .map(|t| (p.op, p.intent_seq, p.multi_step, t))
            })
            .transpose()?;
        Ok(entry(
            e.target.to_params()?,
            e.state,
            pending,
            identity(&e.observed)?,
            e.last_seq,
            Arc::new(e.boot_id.clone()),
            e.reason.as_deref(),
        ))
    }
}

/// An entry as the state keeps it, from a checkpoint entry's converted
/// parts (`pending`: the intent's operation, sequence number, whether it
/// has several steps, and its target).
pub(super) fn entry(
    params: TargetParams,
    state: StateV1,
    pending: Option<(OpV1, u64, bool, TargetParams)>,
    observed: Option<MountIdentity>,
    last_seq: u64,
    boot_id: Arc<String>,
    reason: Option<&str>,
) -> Entry {
    Entry {
        params: SharedParams::new(params),
        state: state.into(),
        pending: pending.map(|(op, intent_seq, multi_step, params)| {
            Box::new(Pending {
                op: op.into(),
                intent_seq,
                steps: steps_of(multi_step),
                params: SharedParams::new(params),
            })
        }),
        observed: observed.map(Box::new),
        last_seq,
        boot_id,
        reason: reason.map(SharedStr::from),
    }
}

impl<T: TargetFormat> CheckpointOf<T> {
    /// The checkpoint of a state.
    pub fn of(state: &JournalState, wall_time_ns: u64) -> Self {
        CheckpointOf {
            through_seq: state.last_seq(),
            wall_time_ns,
            entries: state.entries().map(|(_, e)| EntryOf::from(e)).collect(),
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
