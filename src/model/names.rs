//! Names that become path components or keys: pod UIDs, plugin names,
//! unique volume names, and the checks that keep `/`, NUL and `..` out of
//! them.

use std::fmt;

use arcstr::ArcStr;
use serde::{Deserialize, Serialize};

use super::intern;

/// Errors from validating names and labels.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
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
/// Shared (a thin `ArcStr`, 8 bytes): reconstruction and the states copy a
/// UID into every key and record of the pod's targets, and a clone is a
/// count.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodUid(ArcStr);

impl Serialize for PodUid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for PodUid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // from the input's str where it lends one: one allocation (the
        // Arc's), not a String's first (a cached pod's UID at a restart)
        struct Uid;
        impl serde::de::Visitor<'_> for Uid {
            type Value = PodUid;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a pod UID")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<PodUid, E> {
                Ok(PodUid(intern::name(s)))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<PodUid, E> {
                Ok(PodUid(intern::name(&s)))
            }
        }
        d.deserialize_str(Uid)
    }
}

impl PodUid {
    /// Validates a UID: one path component of `[A-Za-z0-9-_.]`.
    pub fn new(uid: impl Into<String>) -> Result<Self, ModelError> {
        let uid = uid.into();
        Self::check(&uid)?;
        Ok(Self(intern::name(&uid)))
    }
    /// The checks of [`PodUid::new`], without making one.
    pub(super) fn check(uid: &str) -> Result<(), ModelError> {
        // the usual shape passes every check below at once
        let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
        if (1..=253).contains(&uid.len()) && uid != "." && uid != ".." && uid.bytes().all(plain) {
            return Ok(());
        }
        check_component("pod uid", uid)?;
        if !uid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return invalid_name(
                "pod uid",
                uid,
                "only ASCII letters, digits, '-', '_' and '.' are allowed",
            );
        }
        Ok(())
    }
    /// A UID that passed [`PodUid::check`].
    pub(super) fn from_checked(uid: &str) -> Self {
        Self(intern::name(uid))
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
    /// `kubernetes.io/configmap`
    ConfigMap,
    /// `kubernetes.io/secret`
    Secret,
    /// `kubernetes.io/downward-api`
    DownwardApi,
    /// `kubernetes.io/projected`
    Projected,
}

impl PluginName {
    /// Every plugin volumed knows.
    pub const ALL: [PluginName; 8] = [
        PluginName::EmptyDir,
        PluginName::HostPath,
        PluginName::LocalVolume,
        PluginName::Csi,
        PluginName::ConfigMap,
        PluginName::Secret,
        PluginName::DownwardApi,
        PluginName::Projected,
    ];

    /// The qualified name, `kubernetes.io/<short>`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginName::EmptyDir => "kubernetes.io/empty-dir",
            PluginName::HostPath => "kubernetes.io/host-path",
            PluginName::LocalVolume => "kubernetes.io/local-volume",
            PluginName::Csi => "kubernetes.io/csi",
            PluginName::ConfigMap => "kubernetes.io/configmap",
            PluginName::Secret => "kubernetes.io/secret",
            PluginName::DownwardApi => "kubernetes.io/downward-api",
            PluginName::Projected => "kubernetes.io/projected",
        }
    }

    /// The part after `kubernetes.io/`, as used under `plugins/kubernetes.io/`.
    pub fn short(self) -> &'static str {
        &self.as_str()["kubernetes.io/".len()..]
    }

    /// The directory name under `pods/<uid>/volumes/`: `/` escaped as `~`.
    /// Made once per plugin: every pod path names one.
    pub fn escaped(self) -> &'static str {
        static ESCAPED: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
            PluginName::ALL
                .iter()
                .map(|p| p.as_str().replace('/', "~"))
                .collect()
        });
        // `ALL` lists the plugins in declaration order (a test checks it)
        &ESCAPED[self as usize]
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
    /// PV that is a directory); see [`crate::model::VolumeSpec::device_target_kind`].
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
/// Shared (a thin `ArcStr`), as [`PodUid`]: a clone is a count.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UniqueVolumeName(ArcStr);

impl Serialize for UniqueVolumeName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for UniqueVolumeName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Self(intern::name(&s)))
    }
}

impl UniqueVolumeName {
    /// A name shared by every pod using the volume.
    pub fn shared(plugin: PluginName, volume_name: &str) -> Self {
        Self(intern::name(&format!(
            "{}/{}",
            plugin.as_str(),
            volume_name
        )))
    }
    /// A name private to one pod.
    pub fn per_pod(plugin: PluginName, pod: &PodUid, spec_name: &str) -> Self {
        // concatenated, not formatted: one per pod volume at every listing
        Self(intern::name(
            &[plugin.as_str(), "/", pod.as_str(), "-", spec_name].concat(),
        ))
    }
    /// Wraps a name read back from the journal or a command line.
    pub fn from_raw(s: impl Into<String>) -> Self {
        Self(intern::name(&s.into()))
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

impl fmt::Display for UniqueVolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
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
    fn plugin_names_escape_and_parse() {
        for (i, p) in PluginName::ALL.into_iter().enumerate() {
            assert_eq!(p as usize, i, "ALL in declaration order");
            assert_eq!(p.escaped(), p.as_str().replace('/', "~"));
            assert_eq!(PluginName::from_escaped(p.escaped()), Some(p));
            assert_eq!(PluginName::parse(p.as_str()), Some(p));
        }
        assert_eq!(PluginName::EmptyDir.escaped(), "kubernetes.io~empty-dir");
        assert_eq!(PluginName::from_escaped("kubernetes.io~nfs"), None);
        // as `parse` of the name with every `~` made a `/`
        assert_eq!(
            PluginName::from_escaped("kubernetes.io/empty-dir"),
            Some(PluginName::EmptyDir)
        );
        assert_eq!(PluginName::from_escaped("kubernetes.io~empty-di"), None);
        assert_eq!(PluginName::from_escaped(""), None);
    }
}
