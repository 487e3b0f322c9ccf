//! The current format's checkpoint decoded without a copy per field: its
//! strings and paths borrowed from the checkpoint's bytes, then converted
//! to model types once. Decoding a checkpoint is most of a restart's
//! journal open, and the owned types allocated (and freed) every string
//! of every entry before the model copied it again.
//!
//! These structs read the bytes [`CheckpointV3`](super::CheckpointV3)
//! and [`CheckpointV5`](super::CheckpointV5) write: the same fields in the same order, a `&[u8]` where it has a
//! `Vec<u8>` (bincode writes both as a length and the bytes). The owned
//! targets convert through them too ([`TargetV1Ref::of`]), so the checks
//! on the way in are written once.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::super::replay::JournalState;
use super::payload_v3::PayloadV3;
use super::{CsiV2, IdentityV1, OpV1, RecordError, StateV1, TargetV1, field_err};
use crate::model::{
    DevId, MountIdentity, PluginName, PodUid, SeLinuxContext, SharedStr, TargetKind, TargetParams,
    TargetRef, UniqueVolumeName,
};

/// [`TargetV1`], borrowed.
#[derive(Debug, Deserialize)]
pub(super) struct TargetV1Ref<'a> {
    volume: &'a str,
    plugin: &'a str,
    spec_name: &'a str,
    #[serde(borrow)]
    pod_uid: Option<&'a str>,
    kind: u8,
    #[serde(borrow)]
    device_path: Option<&'a [u8]>,
    #[serde(borrow)]
    device_mount_path: Option<&'a [u8]>,
    #[serde(borrow)]
    pod_mount_path: Option<&'a [u8]>,
    #[serde(borrow)]
    selinux_context: Option<&'a str>,
    #[serde(borrow)]
    mount_options: Vec<&'a str>,
    #[serde(borrow)]
    fs_type: Option<&'a str>,
}

impl<'a> TargetV1Ref<'a> {
    /// An owned target seen through the borrowed one.
    pub(super) fn of(t: &'a TargetV1) -> Self {
        TargetV1Ref {
            volume: &t.volume,
            plugin: &t.plugin,
            spec_name: &t.spec_name,
            pod_uid: t.pod_uid.as_deref(),
            kind: t.kind,
            device_path: t.device_path.as_deref(),
            device_mount_path: t.device_mount_path.as_deref(),
            pod_mount_path: t.pod_mount_path.as_deref(),
            selinux_context: t.selinux_context.as_deref(),
            mount_options: t.mount_options.iter().map(String::as_str).collect(),
            fs_type: t.fs_type.as_deref(),
        }
    }

    /// The plugin as written (for errors about the fields after it).
    pub(super) fn plugin(&self) -> &'a str {
        self.plugin
    }
}

fn path(b: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(b))
}

impl TryFrom<&TargetV1Ref<'_>> for TargetParams {
    type Error = RecordError;
    fn try_from(t: &TargetV1Ref<'_>) -> Result<Self, RecordError> {
        let plugin = PluginName::parse(t.plugin)
            .ok_or_else(|| field_err("plugin", t.plugin, "not a plugin volumed knows"))?;
        let target = match t.pod_uid {
            None => TargetRef::Device,
            Some(uid) => {
                TargetRef::Pod(PodUid::new(uid).map_err(|e| field_err("pod_uid", uid, e))?)
            }
        };
        let kind = match t.kind {
            0 => TargetKind::Mount,
            1 => TargetKind::Dir,
            2 => TargetKind::None,
            // format v6 on; no older build wrote it
            3 => TargetKind::Block,
            k => return Err(field_err("kind", &k.to_string(), "not 0, 1, 2 or 3")),
        };
        let selinux = t
            .selinux_context
            .map(|c| SeLinuxContext::parse(c).map_err(|e| field_err("selinux_context", c, e)))
            .transpose()?;
        // a target without device, label or options (most of a node's)
        // gets no box for them
        Ok(TargetParams::at(
            UniqueVolumeName::from_raw(t.volume),
            plugin,
            t.spec_name.into(),
            target,
            kind,
            None,
        )
        .with_pod_mount_path(t.pod_mount_path.map(|b| path(b).into()))
        .with_fs_type(t.fs_type.map(SharedStr::fs_type))
        .with_device_path(t.device_path.map(|b| path(b).into()))
        .with_device_mount_path(t.device_mount_path.map(|b| path(b).into()))
        .with_selinux(selinux)
        .with_mount_options(t.mount_options.iter().map(|o| (*o).to_owned()).collect()))
    }
}

/// [`super::TargetV2`], borrowed where it is v1's.
#[derive(Debug, Deserialize)]
struct TargetV2Ref<'a> {
    #[serde(borrow)]
    base: TargetV1Ref<'a>,
    csi: Option<CsiV2>,
}

/// [`super::payload_v3::TargetV3`], borrowed where it is v1's.
#[derive(Debug, Deserialize)]
struct TargetV3Ref<'a> {
    #[serde(borrow)]
    base: TargetV2Ref<'a>,
    payload: Option<PayloadV3>,
}

impl TargetV3Ref<'_> {
    fn to_params(&self) -> Result<TargetParams, RecordError> {
        let base = &self.base.base;
        let p = TargetParams::try_from(base)?;
        let p = super::convert::with_csi(p, self.base.csi.as_ref(), base.plugin())?;
        super::payload_v3::with_payload(p, self.payload.as_ref(), base.plugin())
    }
}

/// [`IdentityV1`], borrowed.
#[derive(Debug, Deserialize)]
pub(super) struct IdentityRef<'a> {
    major: u32,
    minor: u32,
    root: &'a [u8],
    fs_type: &'a str,
    read_only: bool,
    #[serde(borrow)]
    selinux_context: Option<&'a str>,
}

impl<'a> IdentityRef<'a> {
    /// An owned identity seen through the borrowed one.
    pub(super) fn of(i: &'a IdentityV1) -> Self {
        IdentityRef {
            major: i.major,
            minor: i.minor,
            root: &i.root,
            fs_type: &i.fs_type,
            read_only: i.read_only,
            selinux_context: i.selinux_context.as_deref(),
        }
    }
}

impl TryFrom<&IdentityRef<'_>> for MountIdentity {
    type Error = RecordError;
    fn try_from(i: &IdentityRef<'_>) -> Result<Self, RecordError> {
        let selinux = i
            .selinux_context
            .map(|c| SeLinuxContext::parse(c).map_err(|e| field_err("observed.selinux", c, e)))
            .transpose()?;
        Ok(MountIdentity {
            dev: DevId {
                major: i.major,
                minor: i.minor,
            },
            root: crate::model::SharedPath::fs_root(Path::new(OsStr::from_bytes(i.root))),
            fs_type: crate::model::SharedStr::fs_type(i.fs_type),
            read_only: i.read_only,
            selinux,
        })
    }
}

/// [`super::PendingOf`], borrowed.
#[derive(Debug, Deserialize)]
struct PendingRef<'a> {
    op: OpV1,
    intent_seq: u64,
    multi_step: bool,
    #[serde(borrow)]
    target: TargetV3Ref<'a>,
}

/// [`super::EntryOf`], borrowed.
#[derive(Debug, Deserialize)]
struct EntryRef<'a> {
    #[serde(borrow)]
    target: TargetV3Ref<'a>,
    state: StateV1,
    #[serde(borrow)]
    pending: Option<PendingRef<'a>>,
    #[serde(borrow)]
    observed: Option<IdentityRef<'a>>,
    last_seq: u64,
    boot_id: &'a str,
    #[serde(borrow)]
    reason: Option<&'a str>,
}

/// [`super::CheckpointV3`], borrowed.
#[derive(Debug, Deserialize)]
struct CheckpointV3Ref<'a> {
    through_seq: u64,
    wall_time_ns: u64,
    #[serde(borrow)]
    entries: Vec<EntryRef<'a>>,
}

/// [`super::CheckpointV5`], borrowed: v3's, then the subPath binds
/// (owned: few).
#[derive(Debug, Deserialize)]
struct CheckpointV5Ref<'a> {
    through_seq: u64,
    wall_time_ns: u64,
    #[serde(borrow)]
    entries: Vec<EntryRef<'a>>,
    subpaths: Vec<super::SubpathEntryV5>,
}

/// A checkpoint of format v3 or v4: the state, its last sequence number,
/// its wall time and its number of entries.
pub(super) fn decode_checkpoint_v3(
    payload: &[u8],
) -> Result<(JournalState, u64, u64, usize), RecordError> {
    let ck: CheckpointV3Ref<'_> =
        bincode::deserialize(payload).map_err(|e| RecordError::Decode(e.to_string()))?;
    let state = state_of(ck.through_seq, &ck.entries)?;
    Ok((state, ck.through_seq, ck.wall_time_ns, ck.entries.len()))
}

/// A checkpoint of the current format (v5), as [`decode_checkpoint_v3`].
pub(super) fn decode_checkpoint_v5(
    payload: &[u8],
) -> Result<(JournalState, u64, u64, usize), RecordError> {
    let ck: CheckpointV5Ref<'_> =
        bincode::deserialize(payload).map_err(|e| RecordError::Decode(e.to_string()))?;
    let binds = ck
        .subpaths
        .iter()
        .map(super::convert::subpath_entry)
        .collect::<Result<Vec<_>, _>>()?;
    let state = state_of(ck.through_seq, &ck.entries)?.with_subpaths(binds);
    Ok((state, ck.through_seq, ck.wall_time_ns, ck.entries.len()))
}

fn state_of(through_seq: u64, checkpointed: &[EntryRef<'_>]) -> Result<JournalState, RecordError> {
    let n = checkpointed.len();
    let mut entries = Vec::with_capacity(n);
    // the spec name met last, shared by the next equal ones: a node's
    // volumes repeat a handful of pod volume names, and the state keeps
    // one per target for the process's life
    let mut spec_name = SharedStr::default();
    let mut to_params = |t: &TargetV3Ref<'_>| {
        t.to_params().map(|mut p| {
            match *p.spec_name == *spec_name {
                true => p.spec_name = spec_name.clone(),
                false => spec_name = p.spec_name.clone(),
            }
            p
        })
    };
    // the boot id met last, shared alike (one per boot the node has had)
    let mut boot = Arc::new(String::new());
    for e in checkpointed {
        if *boot != e.boot_id {
            boot = Arc::new(e.boot_id.to_owned());
        }
        let pending = e
            .pending
            .as_ref()
            .map(|p| to_params(&p.target).map(|t| (p.op, p.intent_seq, p.multi_step, t)))
            .transpose()?;
        entries.push(super::convert::entry(
            to_params(&e.target)?,
            e.state,
            pending,
            e.observed
                .as_ref()
                .map(MountIdentity::try_from)
                .transpose()?,
            e.last_seq,
            boot.clone(),
            e.reason,
        ));
    }
    Ok(JournalState::from_entries(through_seq, entries))
}
