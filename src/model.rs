//! Plain data shared by every module: unique volume names, pod UIDs, volume
//! specs, target kinds, mount identity, SELinux contexts and mount states.
//!
//! Nothing here does I/O. Names that end up in paths (pod UIDs, volume and PV
//! names, plugin names) are validated when they are constructed, so a hostile
//! manifest cannot smuggle `..` or `/` into a path built from them.
//!
//! *Invariant:* model types are not the journal's on-disk types; the journal
//! converts to and from them explicitly (`journal::record`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Errors from validating names and labels.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    /// a name that becomes a path component is empty, too long, or contains `/`, NUL, or is `.`/`..`
    #[error("invalid {what} {value:?}: {why}")]
    InvalidName {
        /// which kind of name (pod uid, volume name, …)
        what: &'static str,
        /// the offending value
        value: String,
        /// why it was refused
        why: &'static str,
    },
    /// an SELinux context that is not `user:role:type[:level]`
    #[error("invalid SELinux context {0:?}: expected user:role:type[:level]")]
    InvalidSeLinuxContext(String),
}

/// The [`ModelError::InvalidName`] for `value`.
fn invalid_name(what: &'static str, value: &str, why: &'static str) -> Result<(), ModelError> {
    Err(ModelError::InvalidName {
        what,
        value: value.to_owned(),
        why,
    })
}

/// Checks a string that will become exactly one path component.
pub fn check_component(what: &'static str, value: &str) -> Result<(), ModelError> {
    let bad = |why| invalid_name(what, value, why);
    if value.is_empty() {
        return bad("empty");
    }
    if value.len() > 253 {
        return bad("longer than 253 bytes");
    }
    if value == "." || value == ".." {
        return bad("is a relative path component");
    }
    if value.contains('/') {
        return bad("contains '/'");
    }
    if value.contains('\0') {
        return bad("contains NUL");
    }
    if value.chars().any(|c| c.is_control()) {
        return bad("contains a control character");
    }
    Ok(())
}

/// Checks a name the API server validates as a DNS-1123 label (a pod's
/// volume names): 1 to 63 of `a-z`, `0-9` and `-`, starting and ending with
/// a letter or digit. Such a name can never look like one of volumed's own
/// dir names (`<name>.deleting~<n>`), which matters: those are deleted.
pub fn check_dns1123_label(what: &'static str, value: &str) -> Result<(), ModelError> {
    let bad = |why| invalid_name(what, value, why);
    if value.is_empty() {
        return bad("empty");
    }
    if value.len() > 63 {
        return bad("longer than 63 characters (not a DNS-1123 label)");
    }
    let ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !value.bytes().all(|c| ok(c) || c == b'-') {
        return bad("not a DNS-1123 label: only a-z, 0-9 and '-' are allowed");
    }
    let b = value.as_bytes();
    if !ok(b[0]) || !ok(b[b.len() - 1]) {
        return bad("not a DNS-1123 label: must start and end with a-z or 0-9");
    }
    Ok(())
}

/// A pod's UID as the kubelet uses it for `pods/<uid>`.
///
/// Shared (`Arc<str>`): reconstruction and the states copy a UID into every
/// key and record of the pod's targets, and a clone is a count.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodUid(Arc<str>);

impl Serialize for PodUid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for PodUid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Self(s.into()))
    }
}

impl PodUid {
    /// Validates a UID: one path component of `[A-Za-z0-9-_.]`.
    pub fn new(uid: impl Into<String>) -> Result<Self, ModelError> {
        let uid = uid.into();
        // the usual shape passes every check below at once
        let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
        if (1..=253).contains(&uid.len()) && uid != "." && uid != ".." && uid.bytes().all(plain) {
            return Ok(Self(uid.into()));
        }
        check_component("pod uid", &uid)?;
        if !uid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(ModelError::InvalidName {
                what: "pod uid",
                value: uid,
                why: "only ASCII letters, digits, '-', '_' and '.' are allowed",
            });
        }
        Ok(Self(uid.into()))
    }
    /// The UID as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A volume plugin's qualified name, e.g. `kubernetes.io/empty-dir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PluginName {
    /// `kubernetes.io/empty-dir`
    EmptyDir,
    /// `kubernetes.io/host-path`
    HostPath,
    /// `kubernetes.io/local-volume`
    LocalVolume,
    /// `kubernetes.io/csi`
    Csi,
}

impl PluginName {
    /// Every plugin volumed knows.
    pub const ALL: [PluginName; 4] = [
        PluginName::EmptyDir,
        PluginName::HostPath,
        PluginName::LocalVolume,
        PluginName::Csi,
    ];

    /// The qualified name, `kubernetes.io/<short>`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginName::EmptyDir => "kubernetes.io/empty-dir",
            PluginName::HostPath => "kubernetes.io/host-path",
            PluginName::LocalVolume => "kubernetes.io/local-volume",
            PluginName::Csi => "kubernetes.io/csi",
        }
    }

    /// The part after `kubernetes.io/`, as used under `plugins/kubernetes.io/`.
    pub fn short(self) -> &'static str {
        &self.as_str()["kubernetes.io/".len()..]
    }

    /// The directory name under `pods/<uid>/volumes/`: `/` escaped as `~`.
    pub fn escaped(self) -> String {
        self.as_str().replace('/', "~")
    }

    /// Parses a qualified name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Parses a pod-dir plugin name (`kubernetes.io~empty-dir`).
    pub fn from_escaped(s: &str) -> Option<Self> {
        // `parse(&s.replace('~', "/"))` without building the string
        let unescaped = || s.bytes().map(|b| if b == b'~' { b'/' } else { b });
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().len() == s.len() && unescaped().eq(p.as_str().bytes()))
    }

    /// Whether volumes of this plugin have a device (global) target at all.
    /// Some volumes of a device-mountable plugin may still have none (a local
    /// PV that is a directory); see [`VolumeSpec::device_target_kind`].
    pub fn is_device_mountable(self) -> bool {
        matches!(self, PluginName::LocalVolume | PluginName::Csi)
    }
}

impl fmt::Display for PluginName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kubelet's unique volume name.
///
/// - device-mountable or attachable plugins: `<plugin>/<volume name>` where the
///   volume name is the plugin's (`kubernetes.io/local-volume/pv-local`,
///   `kubernetes.io/csi/<driver>^<handle>`);
/// - others: `<plugin>/<pod uid>-<spec name>`
///   (`kubernetes.io/empty-dir/1234-cache`).
///
/// Shared (`Arc<str>`), as [`PodUid`]: a clone is a count.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UniqueVolumeName(Arc<str>);

impl Serialize for UniqueVolumeName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for UniqueVolumeName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Self(s.into()))
    }
}

impl UniqueVolumeName {
    /// A name shared by every pod using the volume.
    pub fn shared(plugin: PluginName, volume_name: &str) -> Self {
        Self(format!("{}/{}", plugin.as_str(), volume_name).into())
    }
    /// A name private to one pod.
    pub fn per_pod(plugin: PluginName, pod: &PodUid, spec_name: &str) -> Self {
        Self(format!("{}/{}-{}", plugin.as_str(), pod, spec_name).into())
    }
    /// Wraps a name read back from the journal or a command line.
    pub fn from_raw(s: impl Into<String>) -> Self {
        Self(s.into().into())
    }
    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The plugin named by the prefix, if it is one volumed knows.
    pub fn plugin(&self) -> Option<PluginName> {
        PluginName::ALL.into_iter().find(|p| {
            self.0
                .strip_prefix(p.as_str())
                .is_some_and(|r| r.starts_with('/'))
        })
    }
}

/// A name shared by everything that holds it (`Arc<str>`): a volume's spec
/// name and a pod's outer volume name live in the DSW, the jobs, the
/// journal's state and the ASW, and a clone is a count. Reads as a `str`
/// (`Deref`); serialises, and shows in `Debug` and `Display`, as one.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedStr(Arc<str>);

impl SharedStr {
    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `tmpfs`, one allocation for the whole process: the fs type of every
    /// memory emptyDir's parameters.
    pub fn tmpfs() -> Self {
        static TMPFS: std::sync::LazyLock<SharedStr> =
            std::sync::LazyLock::new(|| SharedStr::from("tmpfs"));
        TMPFS.clone()
    }
}

impl std::ops::Deref for SharedStr {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<Path> for SharedStr {
    fn as_ref(&self) -> &Path {
        Path::new(&*self.0)
    }
}

impl std::borrow::Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for SharedStr {
    fn from(s: String) -> Self {
        Self(s.into())
    }
}

impl From<&str> for SharedStr {
    fn from(s: &str) -> Self {
        Self(s.into())
    }
}

impl From<&String> for SharedStr {
    fn from(s: &String) -> Self {
        Self(s.as_str().into())
    }
}

impl From<SharedStr> for String {
    fn from(s: SharedStr) -> Self {
        s.0.to_string()
    }
}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for SharedStr {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Serialize for SharedStr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedStr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::from)
    }
}

/// A path shared by everything that holds it (`Arc<Path>`): a pod target's
/// path lives in the job's parameters, the journal's state and the ASW, and
/// a clone is a count. Reads as a [`Path`] (`Deref`); serialises, and shows
/// in `Debug`, as one.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedPath(Arc<Path>);

impl std::ops::Deref for SharedPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for SharedPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl fmt::Debug for SharedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<PathBuf> for SharedPath {
    fn from(p: PathBuf) -> Self {
        Self(p.into())
    }
}

impl From<&Path> for SharedPath {
    fn from(p: &Path) -> Self {
        Self(p.into())
    }
}

impl From<String> for SharedPath {
    fn from(s: String) -> Self {
        PathBuf::from(s).into()
    }
}

impl From<&str> for SharedPath {
    fn from(s: &str) -> Self {
        Path::new(s).into()
    }
}

impl Serialize for SharedPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for SharedPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PathBuf::deserialize(d).map(Self::from)
    }
}

impl fmt::Display for UniqueVolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a target is on disk (DESIGN.md "Targets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    /// A mount point (tmpfs emptyDir, local PV device mount and bind).
    Mount,
    /// A directory and its contents (disk emptyDir).
    Dir,
    /// Nothing on disk to track (hostPath).
    None,
}

impl TargetKind {
    /// The JSON / table spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Mount => "mount",
            TargetKind::Dir => "dir",
            TargetKind::None => "none",
        }
    }
}

/// The state of one target (device or pod), as `dump` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MountState {
    /// Known to be mounted (or, for `dir` targets, set up).
    Mounted,
    /// May or may not be mounted; the next operation must be idempotent.
    Uncertain,
    /// Known not to be mounted.
    NotMounted,
}

impl MountState {
    /// The JSON / table spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MountState::Mounted => "mounted",
            MountState::Uncertain => "uncertain",
            MountState::NotMounted => "not_mounted",
        }
    }
}

/// An SELinux context `user:role:type[:level]`, with the MCS categories of
/// the level normalised (sorted, so `s0:c20,c10` equals `s0:c10,c20`).
///
/// Shared: a volume's label is held by the DSW (twice), each pod's record,
/// the ASW (twice) and the journal's parameters, and a clone is a count.
/// An `Arc<String>`, not an `Arc<str>`, on purpose: a thin pointer, so an
/// `Option` of it is 8 bytes and the ASW's three-way `SeLinuxState` 16
/// (with SELinux off every one of them is empty, yet a wide pointer made
/// each record holding them a malloc size class larger). Serialises as a
/// string.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeLinuxContext(Arc<String>);

impl Serialize for SeLinuxContext {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SeLinuxContext {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Self(Arc::new(s)))
    }
}

impl SeLinuxContext {
    /// Parses and normalises a context.
    pub fn parse(s: &str) -> Result<Self, ModelError> {
        let bad = || ModelError::InvalidSeLinuxContext(s.to_owned());
        let mut parts = s.splitn(4, ':');
        let (user, role, ty) = (
            parts.next().ok_or_else(bad)?,
            parts.next().ok_or_else(bad)?,
            parts.next().ok_or_else(bad)?,
        );
        let level = parts.next();
        let ok = |p: &str| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
        };
        if !ok(user) || !ok(role) || !ok(ty) {
            return Err(bad());
        }
        let mut out = format!("{user}:{role}:{ty}");
        if let Some(level) = level {
            out.push(':');
            out.push_str(&normalise_level(level).ok_or_else(bad)?);
        }
        Ok(Self(Arc::new(out)))
    }
    /// The normalised context.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The mount option as the kernel needs it: quoted, because an MCS level
    /// with two categories contains a comma.
    pub fn mount_option(&self) -> String {
        format!("context=\"{}\"", self.0)
    }
}

impl fmt::Display for SeLinuxContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Normalises an MLS/MCS level: `s0:c20,c10` → `s0:c10,c20`; ranges
/// `s0-s0:c0.c1023` are kept as written per side but categories sorted.
fn normalise_level(level: &str) -> Option<String> {
    if level.is_empty() || level.contains(char::is_whitespace) || level.contains('"') {
        return None;
    }
    let side = |s: &str| -> Option<String> {
        match s.split_once(':') {
            None => Some(s.to_owned()),
            Some((sens, cats)) => {
                let mut cats: Vec<&str> = cats.split(',').collect();
                if cats.iter().any(|c| c.is_empty()) {
                    return None;
                }
                cats.sort_by_key(|c| category_key(c));
                cats.dedup();
                Some(format!("{sens}:{}", cats.join(",")))
            }
        }
    };
    match level.split_once('-') {
        None => side(level),
        Some((lo, hi)) => Some(format!("{}-{}", side(lo)?, side(hi)?)),
    }
}

/// Sort key for a category `c10` or range `c0.c1023`: numerically by first number.
fn category_key(c: &str) -> (u32, String) {
    let first = c.split('.').next().unwrap_or(c);
    let n = first
        .trim_start_matches('c')
        .parse::<u32>()
        .unwrap_or(u32::MAX);
    (n, c.to_owned())
}

/// A device number as mountinfo's `major:minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DevId {
    /// major number
    pub major: u32,
    /// minor number
    pub minor: u32,
}

impl fmt::Display for DevId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// What makes a mount "the same mount" (DESIGN.md "Reconstruction"):
/// compared instead of path strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MountIdentity {
    /// The filesystem's device number. For tmpfs this differs on every mount,
    /// so tmpfs identity ignores it (see [`MountIdentity::matches`]).
    pub dev: DevId,
    /// The root of the mount within its filesystem (`/` for a whole fs).
    pub root: PathBuf,
    /// The filesystem type (`ext4`, `tmpfs`, …).
    pub fs_type: String,
    /// Whether this mount (the per-mount flags, not the superblock) is read-only.
    pub read_only: bool,
    /// The `context=` label of the superblock; `None` when mounted without one.
    pub selinux: Option<SeLinuxContext>,
}

impl MountIdentity {
    /// Whether an observed mount is the mount we intended. tmpfs: being a
    /// tmpfs at that place is the identity (a new tmpfs gets a new device
    /// number on every mount, and size differences are fixed by a remount).
    pub fn matches(&self, observed: &MountIdentity) -> bool {
        if self.fs_type != observed.fs_type
            || self.read_only != observed.read_only
            || self.selinux != observed.selinux
        {
            return false;
        }
        if self.fs_type == "tmpfs" {
            return true;
        }
        self.dev == observed.dev && self.root == observed.root
    }
}

/// emptyDir storage medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageMedium {
    /// The node's disk: a plain directory.
    Disk,
    /// `medium: Memory`: a tmpfs.
    Memory,
}

/// hostPath `type` checks, as the kubelet does them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HostPathType {
    /// `""`: no check.
    Unset,
    /// `DirectoryOrCreate`
    DirectoryOrCreate,
    /// `Directory`
    Directory,
    /// `FileOrCreate`
    FileOrCreate,
    /// `File`
    File,
    /// `Socket`
    Socket,
    /// `CharDevice`
    CharDevice,
    /// `BlockDevice`
    BlockDevice,
}

/// PV access modes, ordered as the kubelet's SELinux metrics rank them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AccessMode {
    /// ReadWriteOncePod
    ReadWriteOncePod,
    /// ReadWriteOnce
    ReadWriteOnce,
    /// ReadOnlyMany
    ReadOnlyMany,
    /// ReadWriteMany
    ReadWriteMany,
}

/// What a volume is, with everything a plugin needs to mount and unmount it
/// without an API server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeSpec {
    /// An emptyDir.
    EmptyDir {
        /// disk or memory
        medium: StorageMedium,
        /// `sizeLimit` in bytes
        size_limit: Option<u64>,
    },
    /// A hostPath.
    HostPath {
        /// the host path (shared with the parameters of its targets)
        path: SharedPath,
        /// the type check
        host_path_type: HostPathType,
    },
    /// A local PersistentVolume.
    Local {
        /// `spec.local.path`: a block device or a directory (shared with
        /// the parameters of its targets, where it is the device path)
        path: SharedPath,
        /// `spec.local.fsType` (for block devices), e.g. `ext4`
        fs_type: Option<String>,
        /// the PV's access modes
        access_modes: Vec<AccessMode>,
        /// the PV's `mountOptions`
        mount_options: Vec<String>,
        /// whether the path is a block device (decided when the spec is resolved)
        is_block: bool,
    },
    /// A CSI persistent volume (modelled now, mounted when the CSI plugin
    /// lands). Boxed: its fields would make every spec half as large again.
    Csi(Box<CsiSpec>),
}

/// The fields of [`VolumeSpec::Csi`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsiSpec {
    /// the driver name
    pub driver: String,
    /// the volume handle
    pub volume_handle: String,
    /// the fs type
    pub fs_type: Option<String>,
    /// the PV's access modes
    pub access_modes: Vec<AccessMode>,
    /// the PV's `mountOptions`
    pub mount_options: Vec<String>,
    /// volume attributes
    pub attributes: BTreeMap<String, String>,
    /// the driver's CSIDriver says `seLinuxMount: true` (filled in when the
    /// claim is resolved; false without a CSIDriver, as the kubelet does)
    #[serde(default)]
    pub selinux_mount: bool,
}

impl VolumeSpec {
    /// The plugin that owns this spec.
    pub fn plugin(&self) -> PluginName {
        match self {
            VolumeSpec::EmptyDir { .. } => PluginName::EmptyDir,
            VolumeSpec::HostPath { .. } => PluginName::HostPath,
            VolumeSpec::Local { .. } => PluginName::LocalVolume,
            VolumeSpec::Csi { .. } => PluginName::Csi,
        }
    }

    /// The kind of the device (global) target, or `None` when the volume has no
    /// device target.
    pub fn device_target_kind(&self) -> Option<TargetKind> {
        match self {
            VolumeSpec::Local { is_block: true, .. } | VolumeSpec::Csi(_) => {
                Some(TargetKind::Mount)
            }
            _ => None,
        }
    }

    /// The kind of the per-pod target.
    pub fn pod_target_kind(&self) -> TargetKind {
        match self {
            VolumeSpec::EmptyDir {
                medium: StorageMedium::Memory,
                ..
            } => TargetKind::Mount,
            VolumeSpec::EmptyDir { .. } => TargetKind::Dir,
            VolumeSpec::HostPath { .. } => TargetKind::None,
            VolumeSpec::Local { .. } | VolumeSpec::Csi(_) => TargetKind::Mount,
        }
    }

    /// The access modes, empty for inline volumes.
    pub fn access_modes(&self) -> &[AccessMode] {
        match self {
            VolumeSpec::Local { access_modes, .. } => access_modes,
            VolumeSpec::Csi(c) => &c.access_modes,
            _ => &[],
        }
    }
}

/// A volume as one pod wants it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodVolume {
    /// the unique volume name
    pub volume: UniqueVolumeName,
    /// the spec name: the pod's volume name for inline volumes, the PV name for PVC-backed ones
    pub spec_name: String,
    /// `pod.spec.volumes[x].name`
    pub outer_name: String,
    /// the spec (shared: a claim's is its PersistentVolume's, as the
    /// static objects hold it, and the DSW keeps this `Arc`)
    pub spec: Arc<VolumeSpec>,
    /// the SELinux label to mount with, if any
    pub selinux: Option<SeLinuxContext>,
}

impl PodVolume {
    /// Builds the unique name the kubelet would give this volume for `pod`.
    pub fn unique_name(spec: &VolumeSpec, pod: &PodUid, spec_name: &str) -> UniqueVolumeName {
        let plugin = spec.plugin();
        match spec {
            VolumeSpec::Local { .. } => UniqueVolumeName::shared(plugin, spec_name),
            VolumeSpec::Csi(c) => {
                UniqueVolumeName::shared(plugin, &format!("{}^{}", c.driver, c.volume_handle))
            }
            _ => UniqueVolumeName::per_pod(plugin, pod, spec_name),
        }
    }
}

/// Which of a volume's two targets an operation acts on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TargetRef {
    /// The device (global) target, shared by every pod.
    Device,
    /// The per-pod target.
    Pod(PodUid),
}

/// The four journaled volume operations, plus formatting as its own step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// Creating a filesystem on a device before its first MountDevice.
    FormatDevice,
    /// Mounting the device (global) target.
    MountDevice,
    /// Setting up the per-pod target.
    SetUp,
    /// Tearing down the per-pod target.
    TearDown,
    /// Unmounting the device (global) target.
    UnmountDevice,
}

impl Operation {
    /// Every operation.
    pub const ALL: [Operation; 5] = [
        Operation::FormatDevice,
        Operation::MountDevice,
        Operation::SetUp,
        Operation::TearDown,
        Operation::UnmountDevice,
    ];
    /// The snake_case name used in records, crash points and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::FormatDevice => "format_device",
            Operation::MountDevice => "mount_device",
            Operation::SetUp => "setup",
            Operation::TearDown => "teardown",
            Operation::UnmountDevice => "unmount_device",
        }
    }
    /// Whether the operation acts on the device target.
    pub fn is_device_op(self) -> bool {
        matches!(
            self,
            Operation::FormatDevice | Operation::MountDevice | Operation::UnmountDevice
        )
    }
    /// The state a successful run leaves its target in, if it changes it
    /// (formatting leaves the device unmounted).
    pub fn success_state(self) -> Option<MountState> {
        match self {
            Operation::FormatDevice => None,
            Operation::MountDevice | Operation::SetUp => Some(MountState::Mounted),
            Operation::TearDown | Operation::UnmountDevice => Some(MountState::NotMounted),
        }
    }
}

/// Whether an operation is one syscall (a mount or an umount, whose effect
/// the host shows completely) or several steps (format then mount, tmpfs then
/// ownership, CSI calls) that a crash can cut in the middle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Steps {
    /// One mount(2) or umount2(2).
    Single,
    /// More than one step.
    Multi,
}

/// Everything needed to redo or undo an operation on one target without an
/// API server: what the journal records with every intent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// The device (block device, or the source dir for a bind), if any
    /// (shared: one allocation however many targets name it).
    pub device_path: Option<SharedPath>,
    /// The device (global) mount path, if the volume has one.
    pub device_mount_path: Option<SharedPath>,
    /// The per-pod path, for pod targets (shared with the ASW's pod target
    /// and the journal's state: a clone is a count).
    pub pod_mount_path: Option<SharedPath>,
    /// The SELinux label mounted with; `None` for none.
    pub selinux: Option<SeLinuxContext>,
    /// Mount options (without the context option).
    pub mount_options: Vec<String>,
    /// The filesystem type, if known (shared: every memory emptyDir's is
    /// the one [`SharedStr::tmpfs`]).
    pub fs_type: Option<SharedStr>,
}

/// One target's parameters, shared (`Arc`): the journal's state holds them
/// once for an entry and its pending intent, and reconstruction's decisions
/// share the entry's instead of copying them.
pub type SharedParams = Arc<TargetParams>;

impl TargetParams {
    /// The path of this target: the pod path for pod targets, the device mount
    /// path for the device target.
    pub fn path(&self) -> Option<&Path> {
        match self.target {
            TargetRef::Device => self.device_mount_path.as_deref(),
            TargetRef::Pod(_) => self.pod_mount_path.as_deref(),
        }
    }
}

/// Kubelet-compatible on-disk layout under the root dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// A layout rooted at `root` (the kubelet's `--root-dir`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
    /// The root dir.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// `<root>/pods`
    pub fn pods_dir(&self) -> PathBuf {
        self.root.join("pods")
    }
    /// `<root>/pods/<uid>`
    pub fn pod_dir(&self, pod: &PodUid) -> PathBuf {
        self.pods_dir().join(pod.as_str())
    }
    /// `<root>/pods/<uid>/volumes/<plugin~escaped>/<spec name>`; CSI adds `/mount`.
    pub fn pod_volume_dir(&self, pod: &PodUid, plugin: PluginName, spec_name: &str) -> PathBuf {
        self.pod_dir(pod)
            .join("volumes")
            .join(plugin.escaped())
            .join(spec_name)
    }
    /// The path the pod target is mounted at / set up in.
    pub fn pod_target_path(&self, pod: &PodUid, plugin: PluginName, spec_name: &str) -> PathBuf {
        let dir = self.pod_volume_dir(pod, plugin, spec_name);
        if plugin == PluginName::Csi {
            dir.join("mount")
        } else {
            dir
        }
    }
    /// `<root>/pods/<uid>/plugins/kubernetes.io~empty-dir/<vol>/ready`
    pub fn empty_dir_ready_marker(&self, pod: &PodUid, spec_name: &str) -> PathBuf {
        self.pod_dir(pod)
            .join("plugins")
            .join(PluginName::EmptyDir.escaped())
            .join(spec_name)
            .join("ready")
    }
    /// `<root>/plugins/kubernetes.io`
    pub fn plugins_dir(&self) -> PathBuf {
        self.root.join("plugins").join("kubernetes.io")
    }
    /// Local PV device target: `<root>/plugins/kubernetes.io/local-volume/mounts/<pv>`.
    pub fn local_device_path(&self, pv_name: &str) -> PathBuf {
        self.plugins_dir()
            .join(PluginName::LocalVolume.short())
            .join("mounts")
            .join(pv_name)
    }
    /// CSI device target: `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
    pub fn csi_device_path(&self, driver: &str, handle_sha256_hex: &str) -> PathBuf {
        self.plugins_dir()
            .join(PluginName::Csi.short())
            .join(driver)
            .join(handle_sha256_hex)
            .join("globalmount")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uid_refuses_traversal_and_slashes() {
        for bad in ["", ".", "..", "a/b", "../etc", "a\0b", "x y", "é"] {
            assert!(PodUid::new(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(PodUid::new("0f3c-9a_b.1").unwrap().as_str(), "0f3c-9a_b.1");
    }

    #[test]
    fn unique_names_follow_the_kubelet() {
        let pod = PodUid::new("uid1").unwrap();
        let ed = VolumeSpec::EmptyDir {
            medium: StorageMedium::Disk,
            size_limit: None,
        };
        assert_eq!(
            PodVolume::unique_name(&ed, &pod, "cache").as_str(),
            "kubernetes.io/empty-dir/uid1-cache"
        );
        let local = VolumeSpec::Local {
            path: "/dev/loop0".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: vec![],
            is_block: true,
        };
        let name = PodVolume::unique_name(&local, &pod, "pv-local");
        assert_eq!(name.as_str(), "kubernetes.io/local-volume/pv-local");
        assert_eq!(name.plugin(), Some(PluginName::LocalVolume));
        let csi = VolumeSpec::Csi(Box::new(CsiSpec {
            driver: "d.example.com".into(),
            volume_handle: "h1".into(),
            fs_type: None,
            access_modes: vec![],
            mount_options: vec![],
            attributes: BTreeMap::new(),
            selinux_mount: false,
        }));
        assert_eq!(
            PodVolume::unique_name(&csi, &pod, "pv1").as_str(),
            "kubernetes.io/csi/d.example.com^h1"
        );
    }

    #[test]
    fn plugin_names_escape_and_parse() {
        for p in PluginName::ALL {
            assert_eq!(PluginName::from_escaped(&p.escaped()), Some(p));
            assert_eq!(PluginName::parse(p.as_str()), Some(p));
        }
        assert_eq!(PluginName::EmptyDir.escaped(), "kubernetes.io~empty-dir");
        assert_eq!(PluginName::from_escaped("kubernetes.io~secret"), None);
        // as `parse` of the name with every `~` made a `/`
        assert_eq!(
            PluginName::from_escaped("kubernetes.io/empty-dir"),
            Some(PluginName::EmptyDir)
        );
        assert_eq!(PluginName::from_escaped("kubernetes.io~empty-di"), None);
        assert_eq!(PluginName::from_escaped(""), None);
    }

    #[test]
    fn selinux_levels_normalise_categories() {
        let table = [
            (
                "system_u:object_r:container_file_t:s0:c20,c10",
                "system_u:object_r:container_file_t:s0:c10,c20",
            ),
            (
                "system_u:object_r:container_file_t:s0:c10,c20",
                "system_u:object_r:container_file_t:s0:c10,c20",
            ),
            (
                "system_u:object_r:container_file_t:s0:c2,c10",
                "system_u:object_r:container_file_t:s0:c2,c10",
            ),
            (
                "system_u:object_r:container_file_t:s0",
                "system_u:object_r:container_file_t:s0",
            ),
            ("u:r:t", "u:r:t"),
            ("u:r:t:s0-s0:c5,c1", "u:r:t:s0-s0:c1,c5"),
        ];
        for (input, want) in table {
            assert_eq!(
                SeLinuxContext::parse(input).unwrap().as_str(),
                want,
                "{input}"
            );
        }
        for bad in [
            "",
            "a:b",
            "a::c",
            "u:r:t:",
            "u:r:t:s0:c1,,c2",
            "u:r:t:s0\"x",
        ] {
            assert!(SeLinuxContext::parse(bad).is_err(), "{bad:?} accepted");
        }
        let c = SeLinuxContext::parse("u:r:t:s0:c1,c2").unwrap();
        assert_eq!(c.mount_option(), "context=\"u:r:t:s0:c1,c2\"");
    }

    #[test]
    fn identity_compares_device_root_type_flags_and_label() {
        let base = MountIdentity {
            dev: DevId { major: 7, minor: 0 },
            root: "/".into(),
            fs_type: "ext4".into(),
            read_only: false,
            selinux: None,
        };
        assert!(base.matches(&base.clone()));
        let mut other = base.clone();
        other.dev.minor = 1;
        assert!(!base.matches(&other));
        let mut other = base.clone();
        other.root = "/sub".into();
        assert!(!base.matches(&other));
        let mut other = base.clone();
        other.read_only = true;
        assert!(!base.matches(&other));
        let mut tmpfs = base.clone();
        tmpfs.fs_type = "tmpfs".into();
        let mut tmpfs2 = tmpfs.clone();
        tmpfs2.dev.minor = 99;
        assert!(
            tmpfs.matches(&tmpfs2),
            "a tmpfs's identity is being a tmpfs"
        );
        tmpfs2.selinux = Some(SeLinuxContext::parse("u:r:t:s0").unwrap());
        assert!(!tmpfs.matches(&tmpfs2));
    }

    #[test]
    fn layout_is_kubelet_compatible() {
        let l = Layout::new("/var/lib/kubelet");
        let pod = PodUid::new("u1").unwrap();
        assert_eq!(
            l.pod_target_path(&pod, PluginName::LocalVolume, "pv-local"),
            PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~local-volume/pv-local")
        );
        assert_eq!(
            l.pod_target_path(&pod, PluginName::Csi, "pv1"),
            PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv1/mount")
        );
        assert_eq!(
            l.local_device_path("pv-local"),
            PathBuf::from("/var/lib/kubelet/plugins/kubernetes.io/local-volume/mounts/pv-local")
        );
        assert_eq!(
            l.empty_dir_ready_marker(&pod, "c"),
            PathBuf::from("/var/lib/kubelet/pods/u1/plugins/kubernetes.io~empty-dir/c/ready")
        );
    }
}
