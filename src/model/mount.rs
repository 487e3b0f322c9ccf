//! What a mount is: SELinux contexts with normalised categories, device
//! numbers, and the identity that makes an observed mount the intended one.

use super::shared::{SharedPath, SharedStr};
use std::fmt;

use arcstr::ArcStr;
use serde::{Deserialize, Serialize};

use super::ModelError;

/// The fs type of a memory emptyDir (and of any tmpfs in the mount table).
pub const TMPFS: &str = "tmpfs";

/// An SELinux context `user:role:type[:level]`, with the MCS categories of
/// the level normalised (sorted, so `s0:c20,c10` equals `s0:c10,c20`).
///
/// Shared: a volume's label is held by the DSW (twice), each pod's record,
/// the ASW (twice) and the journal's parameters, and a clone is a count.
/// A thin `ArcStr`, not an `Arc<str>`, on purpose: an `Option` of it is 8
/// bytes and the ASW's three-way `SeLinuxState` 16 (with SELinux off every
/// one of them is empty, yet a wide pointer made each record holding them
/// a malloc size class larger). Serialises as a string.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeLinuxContext(ArcStr);

impl Serialize for SeLinuxContext {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SeLinuxContext {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(|s| Self(s.into()))
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
        Ok(Self(out.into()))
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

/// What makes a mount "the same mount" (docs/merge-table.md):
/// compared instead of path strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MountIdentity {
    /// The filesystem's device number. For tmpfs this differs on every mount,
    /// so tmpfs identity ignores it (see [`MountIdentity::matches`]).
    pub dev: DevId,
    /// The root of the mount within its filesystem (`/` for a whole fs).
    /// Shared: every whole-fs mount's is [`SharedPath::fs_root`].
    pub root: SharedPath,
    /// The filesystem type (`ext4`, `tmpfs`, …). Shared: a common type is
    /// one allocation for the process ([`SharedStr::fs_type`]).
    pub fs_type: SharedStr,
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
        if self.fs_type == TMPFS {
            return true;
        }
        self.dev == observed.dev && self.root == observed.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
