//! Volume plugins: one file per volume type behind one trait,
//! [`VolumePlugin`].
//!
//! Every operation takes the [`TargetParams`] the journal records with its
//! intent (plus the spec where the operation needs more than that) and the
//! syscall seam as `&dyn Sys`, and is idempotent (docs/kubelet.md, "The
//! reconciler"): a
//! target already mounted with the intended identity completes without
//! mounting again; a target holding a *different* mount is unmounted and then
//! mounted, never adopted (k8s #117513). TearDown and UnmountDevice take no
//! spec: they must work from the journal alone after a restart.
//!
//! Results distinguish final errors (nothing changed; the state before the
//! operation holds) from uncertain ones (something changed before the
//! failure, or the failed call's effect is unknown), like the kubelet's
//! `UncertainProgressError`: see [`Certainty`].
//!
//! Formatting is its own step so the executor can journal it: a device
//! plugin answers [`VolumePlugin::needs_format`], then [`VolumePlugin::format`]
//! runs, then [`VolumePlugin::mount_device`] (which refuses an unformatted
//! device rather than formatting it silently).
//!
//! SELinux: when the params carry a label, `context="<label>"` is added to
//! the data of every *superblock* mount (tmpfs, device mount). Bind mounts
//! inherit the superblock's label and never carry one (`context=` belongs
//! to the superblock; a second mount of it with another label fails with
//! EINVAL).
//!
//! *Invariant:* plugins call the kernel only through [`Sys`]; they never use
//! `MNT_DETACH` (it hides a busy mount) and always unmount with
//! `UMOUNT_NOFOLLOW`.

use std::path::{Path, PathBuf};

use crate::host::sys::{Call, Errno, Sys, SysError};
use crate::journal::Permit;
use crate::model::{
    MountIdentity, Operation, PluginName, TargetKind, TargetParams, UniqueVolumeName, VolumeSpec,
};

mod block;
pub(crate) mod csi;
pub(crate) mod empty_dir;
mod forced;
pub(crate) mod host_path;
pub(crate) mod local;
mod mount_ops;
pub mod ownership;
pub mod payload;

pub use csi::CsiPlugin;
pub use empty_dir::EmptyDirPlugin;
pub use forced::force_unmount;
pub use host_path::HostPathPlugin;
pub use local::LocalPlugin;

/// What a successful operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// the operation changed the host
    Performed,
    /// the target was already as intended; nothing changed
    AlreadyInPlace,
    /// a tmpfs of the wrong size was remounted with the intended size
    Remounted,
    /// a different mount was unmounted and the intended one mounted
    Replaced,
}

/// The result of a successful operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// what was done
    pub action: Action,
    /// paths left on disk that the caller should report: nested mount points
    /// a teardown found and did not touch, a directory that was not empty
    pub left_behind: Vec<PathBuf>,
    /// the intended mount as the mount table shows it: read from the table
    /// when the operation read it, or known without it for a fresh tmpfs
    /// (a table read per mount would make a mass start quadratic); other
    /// fresh mounts leave it `None`. The journal's outcome records it for
    /// the next restart's merge
    pub seen: Option<MountIdentity>,
}

impl Outcome {
    /// An outcome with nothing left behind.
    pub fn of(action: Action) -> Self {
        Self {
            action,
            left_behind: Vec::new(),
            seen: None,
        }
    }

    /// An outcome with the mount it left (its `seen` field).
    pub fn seen(action: Action, seen: Option<MountIdentity>) -> Self {
        Self {
            seen,
            ..Self::of(action)
        }
    }
}

/// Whether a failed operation may have changed its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Certainty {
    /// nothing changed: the target is as it was before the operation
    Final,
    /// the target may be half-done: the state becomes uncertain and the
    /// operation must be re-run (idempotently) or undone
    Uncertain,
}

/// Errors of the plugins. Each names the operation and the volume.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// a call to the kernel (or mkfs, blkid) failed
    #[error("{} {volume}: {cause}", .op.as_str())]
    Sys {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// whether the target may have changed
        certainty: Certainty,
        /// the failed call, naming its path and errno
        cause: Box<SysError>,
    },
    /// the target parameters lack something this operation needs
    #[error("{} {volume}: missing {what} in target parameters", .op.as_str())]
    MissingParam {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// what is missing
        what: &'static str,
    },
    /// the spec does not belong to this plugin or lacks something
    #[error("{} {volume}: spec not usable by {}: {why}", .op.as_str(), .plugin.as_str())]
    BadSpec {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the plugin
        plugin: PluginName,
        /// what is wrong
        why: &'static str,
    },
    /// a path is not of the type the spec requires
    #[error("{} {volume}: {path} is not a {expected}", .op.as_str())]
    WrongType {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the path checked
        path: PathBuf,
        /// what it should be
        expected: &'static str,
    },
    /// the device holds something else than the filesystem the spec asks for
    #[error("{} {volume}: {device} holds {found}, not {wanted}; refusing to touch it", .op.as_str())]
    FormatMismatch {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the device
        device: PathBuf,
        /// what blkid found
        found: String,
        /// what the spec wants
        wanted: String,
    },
    /// MountDevice found no filesystem: the executor must run (and journal) the format step first
    #[error("{} {volume}: {device} holds no filesystem; format it first", .op.as_str())]
    NotFormatted {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the device
        device: PathBuf,
    },
    /// SetUp of a device-backed volume found the device target not mounted
    #[error("{} {volume}: device target {path} is not mounted", .op.as_str())]
    DeviceNotMounted {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the device mount path
        path: PathBuf,
    },
    /// something stays mounted at the target after repeated unmounts
    #[error("{} {volume}: {path} is still mounted after {tries} unmounts", .op.as_str())]
    StillMounted {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the target
        path: PathBuf,
        /// how many unmounts were tried
        tries: usize,
        /// whether some unmount succeeded before giving up
        certainty: Certainty,
    },
    /// a directory target has something mounted on it; it is never deleted
    #[error("{} {volume}: {path} is a mount point; refusing to delete it", .op.as_str())]
    TargetIsMountPoint {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the target
        path: PathBuf,
    },
    /// mounts exist below a directory target: it is neither renamed (that
    /// would carry them along) nor emptied, and stays until they are gone
    #[error(
        "{} {volume}: {} mount(s) beneath {path} ({}); leaving it in place, neither renamed nor emptied, until they are unmounted",
        .op.as_str(),
        .mounts.len(),
        .mounts.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    MountsBeneath {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the target
        path: PathBuf,
        /// the mount points below it
        mounts: Vec<PathBuf>,
    },
    /// a device target a pod still uses (a mount under `pods/` shares its
    /// device): forced cleanup leaves it
    #[error("{} {volume}: {path} is in use by {user}; refusing to unmount it", .op.as_str())]
    DeviceInUse {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the device target
        path: PathBuf,
        /// a mount point that shares the device
        user: PathBuf,
    },
    /// a target path is not beneath the root dir (targets are reached from
    /// the root without following symlinks)
    #[error("{} {volume}: {path} is not beneath the root dir {root}; refusing to use it", .op.as_str())]
    OutsideRoot {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the target
        path: PathBuf,
        /// the root dir
        root: PathBuf,
    },
    /// a CSI call failed; certain when the driver's status is final and
    /// nothing changed before it (the kubelet's `isFinalError`)
    #[error("{} {volume}: {cause}", .op.as_str())]
    Csi {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// whether the target may have changed
        certainty: Certainty,
        /// the failed call
        cause: Box<crate::csi::CsiError>,
    },
    /// the driver answered INVALID_ARGUMENT to a stage or publish call
    /// with the block access type: it has no raw block volumes (CSI has no
    /// capability that says so; the kubelet too just calls). Final
    #[error(
        "{} {volume}: the PV's volumeMode is Block and the driver refused the block access type (does it support raw block volumes?): {cause}",
        .op.as_str()
    )]
    BlockRefused {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the refused call
        cause: Box<crate::csi::CsiError>,
    },
    /// after a driver's call succeeded, a path is not of the type the
    /// rest of the operation needs (a publish path without a block
    /// device): uncertain, so the call is undone or made again, never left
    /// done without a record
    #[error("{} {volume}: {path} is not a {expected} after the driver's call", .op.as_str())]
    WrongTypeAfterCall {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the path checked
        path: PathBuf,
        /// what it should be
        expected: &'static str,
    },
    /// the volume's CSI driver is not registered or not reachable: no call
    /// was made; retried with backoff until it is
    #[error("{} {volume}: {cause}", .op.as_str())]
    Driver {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// why the driver cannot be used
        cause: Box<crate::csi::registry::RegistryError>,
    },
    /// a Secret a CSI call needs cannot be read: no call was made
    #[error("{} {volume}: Secret {namespace}/{name}: {why}", .op.as_str())]
    Secret {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the Secret's namespace
        namespace: String,
        /// the Secret's name
        name: String,
        /// why
        why: String,
    },
    /// a configMap, secret, downwardAPI or projected payload cannot be
    /// built (a missing object or key, a path that would leave the volume)
    #[error("{} {volume}: {cause}", .op.as_str())]
    Payload {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// why
        cause: payload::PayloadError,
    },
    /// the objects changed between the intent (which recorded the
    /// payload's hash) and the write: nothing written; the next attempt
    /// records the new payload
    #[error("{} {volume}: the payload's objects changed since its intent was journaled; retrying", .op.as_str())]
    PayloadChanged {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
    },
    /// a NodeExpandVolume answer that cannot be believed (a capacity below
    /// the request): final, as the driver said it is done
    #[error("{} {volume}: {cause}", .op.as_str())]
    Expand {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// what is wrong with the answer
        cause: Box<crate::model::ExpandError>,
    },
    /// the plugin does not do this operation
    #[error("{} {volume}: not supported by {}", .op.as_str(), .plugin.as_str())]
    Unsupported {
        /// the operation
        op: Operation,
        /// the volume
        volume: UniqueVolumeName,
        /// the plugin
        plugin: PluginName,
    },
}

impl PluginError {
    /// Whether the target may have changed (the kubelet's uncertain progress).
    pub fn certainty(&self) -> Certainty {
        match self {
            PluginError::Sys { certainty, .. }
            | PluginError::StillMounted { certainty, .. }
            | PluginError::Csi { certainty, .. } => *certainty,
            PluginError::WrongTypeAfterCall { .. } => Certainty::Uncertain,
            _ => Certainty::Final,
        }
    }
    /// Shorthand for `certainty() == Certainty::Uncertain`.
    pub fn is_uncertain(&self) -> bool {
        self.certainty() == Certainty::Uncertain
    }
    /// The failed kernel call, if that is what failed.
    #[cfg(test)]
    pub fn sys_error(&self) -> Option<&SysError> {
        match self {
            PluginError::Sys { cause, .. } => Some(cause),
            _ => None,
        }
    }
}

/// What every plugin's operation returns.
pub type PluginResult = Result<Outcome, PluginError>;

/// One volume type.
pub trait VolumePlugin: Send + Sync {
    /// The plugin's name.
    fn name(&self) -> PluginName;

    /// The kind of the device (global) target for `spec`, `None` when it has none.
    fn device_target_kind(&self, spec: &VolumeSpec) -> Option<TargetKind> {
        spec.device_target_kind()
    }

    /// The kind of the per-pod target for `spec`.
    fn pod_target_kind(&self, spec: &VolumeSpec) -> TargetKind {
        spec.pod_target_kind()
    }

    /// Whether the pod target `params` got the pod's fsGroup from the
    /// plugin's own call, so the node's walk is not needed: a CSI driver
    /// with `VOLUME_MOUNT_GROUP` given `volume_mount_group` (as the
    /// kubelet's CSI mounter decides). Others: no.
    fn group_applied_by_driver(&self, params: &TargetParams) -> bool {
        let _ = params;
        false
    }

    /// Whether the device must be formatted before MountDevice (never true
    /// for a device holding any filesystem or partition table).
    fn needs_format(
        &self,
        _spec: &VolumeSpec,
        _params: &TargetParams,
        _sys: &dyn Sys,
    ) -> Result<bool, PluginError> {
        Ok(false)
    }

    /// Formats the device; never reformats (a device holding a filesystem is
    /// [`Action::AlreadyInPlace`]).
    fn format(
        &self,
        _permit: &Permit,
        _spec: &VolumeSpec,
        params: &TargetParams,
        _sys: &dyn Sys,
    ) -> PluginResult {
        Err(unsupported(Operation::FormatDevice, params, self.name()))
    }

    /// Mounts the device (global) target.
    fn mount_device(
        &self,
        _permit: &Permit,
        _spec: &VolumeSpec,
        params: &TargetParams,
        _sys: &dyn Sys,
    ) -> PluginResult {
        Err(unsupported(Operation::MountDevice, params, self.name()))
    }

    /// Sets up the per-pod target.
    fn setup(
        &self,
        _permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult;

    /// Tears down the per-pod target, from the journal's params alone.
    fn teardown(&self, _permit: &Permit, params: &TargetParams, sys: &dyn Sys) -> PluginResult;

    /// Unmounts the device (global) target, from the journal's params alone.
    fn unmount_device(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        _sys: &dyn Sys,
    ) -> PluginResult {
        Err(unsupported(Operation::UnmountDevice, params, self.name()))
    }

    /// Maps a raw block volume's device target (its global map), as
    /// MountDevice is to a filesystem volume.
    fn map_device(
        &self,
        _permit: &Permit,
        _spec: &VolumeSpec,
        params: &TargetParams,
        _sys: &dyn Sys,
    ) -> PluginResult {
        Err(unsupported(Operation::MapDevice, params, self.name()))
    }

    /// Maps a raw block volume into one pod (its device file), as SetUp is
    /// to a filesystem volume.
    fn map_pod_device(
        &self,
        _permit: &Permit,
        _spec: &VolumeSpec,
        params: &TargetParams,
        _sys: &dyn Sys,
    ) -> PluginResult {
        Err(unsupported(Operation::MapPodDevice, params, self.name()))
    }

    /// Undoes [`VolumePlugin::map_pod_device`], from the journal's params
    /// alone.
    fn unmap_pod_device(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        _sys: &dyn Sys,
    ) -> PluginResult {
        Err(unsupported(Operation::UnmapPodDevice, params, self.name()))
    }

    /// Undoes [`VolumePlugin::map_device`], from the journal's params alone.
    fn unmap_device(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        _sys: &dyn Sys,
    ) -> PluginResult {
        Err(unsupported(Operation::UnmapDevice, params, self.name()))
    }

    /// Whether [`VolumePlugin::expand`] can grow `params`' volume (a CSI
    /// driver with the node `EXPAND_VOLUME` capability).
    fn can_expand(&self, params: &TargetParams) -> bool {
        let _ = params;
        false
    }

    /// Grows the mounted (or mapped) pod target `params`' volume as
    /// `call` says (NodeExpandVolume); the capacity the plugin reports (0:
    /// not said). Idempotent: a volume already that big is left as it is.
    fn expand(
        &self,
        _permit: &Permit,
        params: &TargetParams,
        _call: &ExpandCall<'_>,
        _sys: &dyn Sys,
    ) -> Result<u64, PluginError> {
        Err(unsupported(Operation::ExpandVolume, params, self.name()))
    }
}

/// One node expansion as [`VolumePlugin::expand`] is asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandCall<'a> {
    /// the size to reach, in bytes (`capacity_range.required_bytes`)
    pub required: u64,
    /// a raw block volume: the block capability, the publish file
    pub block: bool,
    /// the PV's `nodeExpandSecretRef`, read when the call is made
    pub secret: Option<&'a crate::model::SecretRef>,
}

fn unsupported(op: Operation, params: &TargetParams, plugin: PluginName) -> PluginError {
    PluginError::Unsupported {
        op,
        volume: params.volume.clone(),
        plugin,
    }
}

/// One operation in progress: turns [`SysError`]s into [`PluginError`]s with
/// the right [`Certainty`], tracking whether anything changed yet.
pub(crate) struct Op<'a> {
    pub(crate) sys: &'a dyn Sys,
    pub(crate) op: Operation,
    pub(crate) volume: &'a UniqueVolumeName,
    /// a state-changing call already succeeded
    pub(crate) changed: bool,
}

impl<'a> Op<'a> {
    pub(crate) fn new(sys: &'a dyn Sys, op: Operation, params: &'a TargetParams) -> Self {
        Self {
            sys,
            op,
            volume: &params.volume,
            changed: false,
        }
    }

    fn certainty(&self, e: &SysError, mutating: bool) -> Certainty {
        let unknown_effect = mutating
            && (e.kind() == Call::Mkfs
                || matches!(
                    e.errno(),
                    Some(Errno::EINTR | Errno::ETIMEDOUT | Errno::EIO)
                ));
        if self.changed || unknown_effect {
            Certainty::Uncertain
        } else {
            Certainty::Final
        }
    }

    pub(crate) fn sys_err(&self, cause: SysError, mutating: bool) -> PluginError {
        PluginError::Sys {
            op: self.op,
            volume: self.volume.clone(),
            certainty: self.certainty(&cause, mutating),
            cause: Box::new(cause),
        }
    }

    /// The outcome of an operation that left `left_behind`: performed when
    /// anything changed, else already in place.
    pub(crate) fn finished(&self, left_behind: Vec<std::path::PathBuf>) -> Outcome {
        let action = if self.changed {
            Action::Performed
        } else {
            Action::AlreadyInPlace
        };
        Outcome {
            action,
            left_behind,
            seen: None,
        }
    }

    /// A call that only looks.
    pub(crate) fn look<T>(&self, r: Result<T, SysError>) -> Result<T, PluginError> {
        r.map_err(|e| self.sys_err(e, false))
    }

    /// A call that changes the host: success marks the operation as changed.
    pub(crate) fn act<T>(&mut self, r: Result<T, SysError>) -> Result<T, PluginError> {
        match r {
            Ok(v) => {
                self.changed = true;
                Ok(v)
            }
            Err(e) => Err(self.sys_err(e, true)),
        }
    }

    /// Like [`Op::act`], but `ok_errno` (e.g. `EEXIST`, `ENOENT`) counts as done.
    pub(crate) fn act_or(
        &mut self,
        r: Result<(), SysError>,
        ok_errno: Errno,
    ) -> Result<(), PluginError> {
        match r {
            Err(e) if e.errno() == Some(ok_errno) => Ok(()),
            other => self.act(other),
        }
    }

    pub(crate) fn missing(&self, what: &'static str) -> PluginError {
        PluginError::MissingParam {
            op: self.op,
            volume: self.volume.clone(),
            what,
        }
    }

    pub(crate) fn bad_spec(&self, plugin: PluginName, why: &'static str) -> PluginError {
        PluginError::BadSpec {
            op: self.op,
            volume: self.volume.clone(),
            plugin,
            why,
        }
    }

    pub(crate) fn wrong_type(&self, path: &Path, expected: &'static str) -> PluginError {
        PluginError::WrongType {
            op: self.op,
            volume: self.volume.clone(),
            path: path.to_owned(),
            expected,
        }
    }
}

/// The volume types volumed has a plugin for ([`all`] makes one of each).
/// Anything else found on the host (nfs, iscsi, …; CSI, whose plugin the
/// daemon adds with its driver registry) is never torn down by volumed
/// from the host alone: it is left and reported (docs/layout.md, "Removal
/// rules").
pub const NAMES: [crate::model::PluginName; 7] = [
    crate::model::PluginName::EmptyDir,
    crate::model::PluginName::HostPath,
    crate::model::PluginName::LocalVolume,
    crate::model::PluginName::ConfigMap,
    crate::model::PluginName::Secret,
    crate::model::PluginName::DownwardApi,
    crate::model::PluginName::Projected,
];

/// Whether volumed has a plugin for `name`.
pub fn has(name: crate::model::PluginName) -> bool {
    NAMES.contains(&name)
}

/// Every plugin volumed has, ready to use; the payload plugins read no
/// objects (the daemon gives them its stores: `Executor::with_plugin`).
pub fn all(layout: &crate::model::Layout) -> Vec<Box<dyn VolumePlugin>> {
    let mut v: Vec<Box<dyn VolumePlugin>> = vec![
        Box::new(EmptyDirPlugin::new(layout.clone())),
        Box::new(HostPathPlugin),
        Box::new(LocalPlugin::new(layout.clone())),
    ];
    let none: std::sync::Arc<dyn payload::ObjectStore> =
        std::sync::Arc::new(payload::ObjectStores::default());
    v.extend(payload::PayloadPlugin::all(layout, &none));
    v
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    #[test]
    fn names_lists_exactly_the_plugins_all_makes() {
        let layout = crate::model::Layout::new("/r");
        let made: Vec<_> = all(&layout).iter().map(|p| p.name()).collect();
        assert_eq!(made, NAMES);
        assert!(
            !has(crate::model::PluginName::Csi),
            "no CSI node plugin yet"
        );
    }
}
