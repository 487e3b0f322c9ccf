//! The parameters the journal records with every intent: everything needed
//! to redo or undo an operation on one target without an API server.
//!
//! The journal's state holds one per target for the process's life, so the
//! fields most targets leave empty (a memory emptyDir's pod target sets
//! none of them) live in one box that such a target does without.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    CsiParams, PayloadVersion, PluginName, SeLinuxContext, SharedPath, SharedStr, TargetKind,
    TargetRef, UniqueVolumeName,
};

/// Everything needed to redo or undo an operation on one target without an
/// API server: what the journal records with every intent.
///
/// Built with [`TargetParams::at`] and the `with_*` methods; the fields
/// most targets leave empty are read through methods of their names.
/// Serialises, and shows in `Debug`, as one flat struct of all thirteen
/// fields in the order they have always had (`Flat` below).
#[derive(Clone)]
pub struct TargetParams {
    /// The unique volume name.
    pub volume: UniqueVolumeName,
    /// The plugin.
    pub plugin: PluginName,
    /// The spec name (pod volume name, or PV name for PVC-backed volumes),
    /// shared with the DSW, the ASW and the journal's state.
    pub spec_name: SharedStr,
    /// Which target.
    pub target: TargetRef,
    /// What the target is on disk.
    pub kind: TargetKind,
    /// The per-pod path, for pod targets (shared with the ASW's pod target
    /// and the journal's state: a clone is a count).
    pub pod_mount_path: Option<SharedPath>,
    /// The filesystem type, if known (shared: every memory emptyDir's is
    /// the one [`SharedStr::tmpfs`]).
    pub fs_type: Option<SharedStr>,
    /// The rest; `None` when every one of them is empty, never a box of
    /// empty ones (so a target without them costs a pointer).
    rare: Option<Box<Rare>>,
}

/// The fields of [`TargetParams`] that most targets leave empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Rare {
    /// The device (block device, or the source dir for a bind or hostPath).
    device_path: Option<SharedPath>,
    /// The device (global) mount path.
    device_mount_path: Option<SharedPath>,
    /// The SELinux label mounted with.
    selinux: Option<SeLinuxContext>,
    /// Mount options (without the context option).
    mount_options: MountOptions,
    /// The CSI arguments, for CSI targets only.
    csi: Option<Arc<CsiParams>>,
    /// A payload volume's pod target's payload.
    payload: Option<Arc<PayloadVersion>>,
}

/// What a target without a box reads.
static NONE: Rare = Rare {
    device_path: None,
    device_mount_path: None,
    selinux: None,
    mount_options: MountOptions(Vec::new()),
    csi: None,
    payload: None,
};

/// Mount options as a PersistentVolume gives them (`ro`, `noatime`,
/// `size=…`), without the SELinux context option; a slice of strings to
/// read, with the questions the daemon asks of them answered here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MountOptions(Vec<String>);

impl MountOptions {
    /// Whether `ro` is among them: the plugins turn `ro` into `MS_RDONLY`
    /// and drop `rw` (the default), so any `ro` makes the mount read-only.
    pub fn is_read_only(&self) -> bool {
        self.0.iter().any(|o| o == "ro")
    }
}

impl std::ops::Deref for MountOptions {
    type Target = [String];
    fn deref(&self) -> &[String] {
        &self.0
    }
}

impl From<Vec<String>> for MountOptions {
    fn from(v: Vec<String>) -> Self {
        MountOptions(v)
    }
}

impl FromIterator<String> for MountOptions {
    fn from_iter<I: IntoIterator<Item = String>>(iter: I) -> Self {
        MountOptions(iter.into_iter().collect())
    }
}

/// One target's parameters, shared (`Arc`): the journal's state holds them
/// once for an entry and its pending intent, and reconstruction's decisions
/// share the entry's instead of copying them.
pub type SharedParams = Arc<TargetParams>;

impl TargetParams {
    /// A target at `path` (a pod target's pod path, the device target's
    /// mount path) with nothing else known — no device, label, options or
    /// fs type; callers add what they know with the `with_*` methods.
    pub fn at(
        volume: UniqueVolumeName,
        plugin: PluginName,
        spec_name: SharedStr,
        target: TargetRef,
        kind: TargetKind,
        path: Option<SharedPath>,
    ) -> Self {
        let is_device = target == TargetRef::Device;
        let p = TargetParams {
            volume,
            plugin,
            spec_name,
            target,
            kind,
            pod_mount_path: None,
            fs_type: None,
            rare: None,
        };
        match is_device {
            true => p.with_device_mount_path(path),
            false => p.with_pod_mount_path(path),
        }
    }

    /// The path of this target: the pod path for pod targets, the device mount
    /// path for the device target.
    pub fn path(&self) -> Option<&Path> {
        match self.target {
            TargetRef::Device => self.device_mount_path(),
            TargetRef::Pod(_) => self.pod_mount_path.as_deref(),
        }
    }

    fn rare(&self) -> &Rare {
        self.rare.as_deref().unwrap_or(&NONE)
    }

    /// Sets a boxed field with `set`; `empty` says whether the value set is
    /// the empty one, which needs no box, and a box left with only empty
    /// fields is dropped.
    fn set_rare(&mut self, empty: bool, set: impl FnOnce(&mut Rare)) {
        if empty && self.rare.is_none() {
            return;
        }
        let rare = self.rare.get_or_insert_with(Box::default);
        set(rare);
        if **rare == NONE {
            self.rare = None;
        }
    }

    /// The device (block device, or the source dir for a bind or hostPath),
    /// if any.
    pub fn device_path(&self) -> Option<&Path> {
        self.rare().device_path.as_deref()
    }

    /// The device (global) mount path, if the volume has one.
    pub fn device_mount_path(&self) -> Option<&Path> {
        self.rare().device_mount_path.as_deref()
    }

    /// The SELinux label mounted with; `None` for none.
    pub fn selinux(&self) -> Option<&SeLinuxContext> {
        self.rare().selinux.as_ref()
    }

    /// Mount options (without the context option).
    pub fn mount_options(&self) -> &MountOptions {
        &self.rare().mount_options
    }

    /// The CSI arguments, for CSI targets only (shared: a clone is a count).
    pub fn csi(&self) -> Option<&Arc<CsiParams>> {
        self.rare().csi.as_ref()
    }

    /// For a payload volume's pod target: the payload the write is for
    /// (its hash and the objects' versions — never their bytes; shared).
    pub fn payload(&self) -> Option<&Arc<PayloadVersion>> {
        self.rare().payload.as_ref()
    }

    /// Whether the target is mounted read-only: an `ro` among its mount
    /// options, or a CSI pod target published `readonly` (the driver
    /// mounts it so; a device target is staged as its options say).
    pub fn read_only(&self) -> bool {
        self.mount_options().is_read_only()
            || (matches!(self.target, TargetRef::Pod(_)) && self.csi().is_some_and(|c| c.read_only))
    }

    /// With `path` as the per-pod path.
    pub fn with_pod_mount_path(mut self, path: Option<SharedPath>) -> Self {
        self.pod_mount_path = path;
        self
    }

    /// With `fs_type` as the filesystem type.
    pub fn with_fs_type(mut self, fs_type: Option<SharedStr>) -> Self {
        self.fs_type = fs_type;
        self
    }

    /// With `path` as the device.
    pub fn with_device_path(mut self, path: Option<SharedPath>) -> Self {
        self.set_rare(path.is_none(), |r| r.device_path = path);
        self
    }

    /// With `path` as the device (global) mount path.
    pub fn with_device_mount_path(mut self, path: Option<SharedPath>) -> Self {
        self.set_rare(path.is_none(), |r| r.device_mount_path = path);
        self
    }

    /// With `label` as the SELinux label mounted with.
    pub fn with_selinux(mut self, label: Option<SeLinuxContext>) -> Self {
        self.set_rare(label.is_none(), |r| r.selinux = label);
        self
    }

    /// With `options` as the mount options.
    pub fn with_mount_options(mut self, options: MountOptions) -> Self {
        self.set_rare(options.is_empty(), |r| r.mount_options = options);
        self
    }

    /// With `csi` as the CSI arguments.
    pub fn with_csi(mut self, csi: Option<Arc<CsiParams>>) -> Self {
        self.set_rare(csi.is_none(), |r| r.csi = csi);
        self
    }

    /// With `payload` as the payload written.
    pub fn with_payload(mut self, payload: Option<Arc<PayloadVersion>>) -> Self {
        self.set_rare(payload.is_none(), |r| r.payload = payload);
        self
    }
}

impl PartialEq for TargetParams {
    fn eq(&self, other: &Self) -> bool {
        self.volume == other.volume
            && self.plugin == other.plugin
            && self.spec_name == other.spec_name
            && self.target == other.target
            && self.kind == other.kind
            && self.pod_mount_path == other.pod_mount_path
            && self.fs_type == other.fs_type
            && self.rare() == other.rare()
    }
}

impl Eq for TargetParams {}

/// [`TargetParams`] as one flat struct, its fields in the order serde and
/// `Debug` have always had them: bincode writes no names, so the order is
/// the journal's and the checkpoint's byte layout. In a module of its own
/// so that it can bear the name its derived `Debug` prints.
mod flat {
    use super::*;

    #[derive(Serialize, Debug)]
    pub(super) struct TargetParams<'a> {
        pub(super) volume: &'a UniqueVolumeName,
        pub(super) plugin: &'a PluginName,
        pub(super) spec_name: &'a SharedStr,
        pub(super) target: &'a TargetRef,
        pub(super) kind: &'a TargetKind,
        pub(super) device_path: &'a Option<SharedPath>,
        pub(super) device_mount_path: &'a Option<SharedPath>,
        pub(super) pod_mount_path: &'a Option<SharedPath>,
        pub(super) selinux: &'a Option<SeLinuxContext>,
        pub(super) mount_options: &'a MountOptions,
        pub(super) fs_type: &'a Option<SharedStr>,
        pub(super) csi: &'a Option<Arc<CsiParams>>,
        pub(super) payload: &'a Option<Arc<PayloadVersion>>,
    }
}
use flat::TargetParams as Flat;

/// `Flat`, owned, to read.
#[derive(Deserialize)]
#[serde(rename = "TargetParams")]
struct FlatOwned {
    volume: UniqueVolumeName,
    plugin: PluginName,
    spec_name: SharedStr,
    target: TargetRef,
    kind: TargetKind,
    device_path: Option<SharedPath>,
    device_mount_path: Option<SharedPath>,
    pod_mount_path: Option<SharedPath>,
    selinux: Option<SeLinuxContext>,
    mount_options: MountOptions,
    fs_type: Option<SharedStr>,
    csi: Option<Arc<CsiParams>>,
    payload: Option<Arc<PayloadVersion>>,
}

impl TargetParams {
    fn flat(&self) -> Flat<'_> {
        let rare = self.rare();
        Flat {
            volume: &self.volume,
            plugin: &self.plugin,
            spec_name: &self.spec_name,
            target: &self.target,
            kind: &self.kind,
            device_path: &rare.device_path,
            device_mount_path: &rare.device_mount_path,
            pod_mount_path: &self.pod_mount_path,
            selinux: &rare.selinux,
            mount_options: &rare.mount_options,
            fs_type: &self.fs_type,
            csi: &rare.csi,
            payload: &rare.payload,
        }
    }
}

impl Serialize for TargetParams {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.flat().serialize(s)
    }
}

impl<'de> Deserialize<'de> for TargetParams {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = FlatOwned::deserialize(d)?;
        Ok(
            TargetParams::at(f.volume, f.plugin, f.spec_name, f.target, f.kind, None)
                .with_pod_mount_path(f.pod_mount_path)
                .with_fs_type(f.fs_type)
                .with_device_path(f.device_path)
                .with_device_mount_path(f.device_mount_path)
                .with_selinux(f.selinux)
                .with_mount_options(f.mount_options)
                .with_csi(f.csi)
                .with_payload(f.payload),
        )
    }
}

impl fmt::Debug for TargetParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.flat().fmt(f)
    }
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
