//! fsGroup ownership, as the kubelet's `SetVolumeOwnership` gives it: which
//! volumes get it, and the mode each entry of a volume ends with. Pure; the
//! walk that applies it is `plugins/ownership.rs`.
//!
//! The kubelet's rules followed here: every entry gets the group (a symlink
//! itself, never what it points to); a file gets group (and owner) read and
//! write, or only read on a read-only volume; a directory also gets setgid
//! (so what is made in it later gets the group) and user and group search;
//! a symlink's mode is never changed (a chmod would reach its target).
//! `OnRootMismatch` skips the walk when the volume's root already has the
//! group, the bits and setgid.

use serde::{Deserialize, Serialize};

use super::{AccessMode, VolumeSpec};

/// Group read and write, with the owner's (the kubelet's `rwMask`).
pub const RW_BITS: u32 = 0o660;
/// Group read, with the owner's, on a read-only volume (`roMask`).
pub const RO_BITS: u32 = 0o440;
/// Search for owner and group, added to directories (`execMask`).
pub const EXEC_BITS: u32 = 0o110;
/// Set-group-ID, added to directories.
pub const SETGID_BIT: u32 = 0o2000;

/// `securityContext.fsGroupChangePolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FsGroupChangePolicy {
    /// `Always` (the default): every SetUp walks the volume.
    Always,
    /// `OnRootMismatch`: the walk is skipped when the root already matches.
    OnRootMismatch,
}

impl FsGroupChangePolicy {
    /// The policy of the field's value, `None` for a value the API does
    /// not know (the caller refuses it).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "Always" => Some(Self::Always),
            "OnRootMismatch" => Some(Self::OnRootMismatch),
            _ => None,
        }
    }

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::OnRootMismatch => "OnRootMismatch",
        }
    }
}

/// What one pod asks of a volume it mounts: the group and the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FsGroup {
    /// `securityContext.fsGroup`
    pub gid: u32,
    /// `securityContext.fsGroupChangePolicy`
    pub policy: FsGroupChangePolicy,
}

/// A CSIDriver's `spec.fsGroupPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsiFsGroupPolicy {
    /// `ReadWriteOnceWithFSType` (the default): only with an fsType and a
    /// single-node access mode
    ReadWriteOnceWithFsType,
    /// `File`: always
    File,
    /// `None`: never
    None,
}

impl CsiFsGroupPolicy {
    /// The policy of the CSIDriver's field (empty: the default); `None`
    /// for a value the API does not know.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "ReadWriteOnceWithFSType" => Some(Self::ReadWriteOnceWithFsType),
            "File" => Some(Self::File),
            "None" => Some(Self::None),
            _ => None,
        }
    }
}

/// Whether a volume of `spec` gets its files' group changed by the node
/// (the walk), as the kubelet's plugins decide: emptyDir always; a local
/// PV unless read-only; a CSI volume unless read-only, as its driver's
/// `policy` says (`ReadWriteOnceWithFSType`: an fsType, and an inline
/// volume or a PV with `ReadWriteOnce`). hostPath never; payload volumes
/// are written with their group (`plugins/payload/atomic.rs`), not walked.
/// `read_only` is the volume's as mounted for the pod. A CSI driver with
/// `VOLUME_MOUNT_GROUP` applies the group itself instead; that is known
/// only when the call is made (the executor asks the plugin).
pub fn ownership_applies(
    spec: &VolumeSpec,
    read_only: bool,
    csi_policy: Option<CsiFsGroupPolicy>,
) -> bool {
    match spec {
        VolumeSpec::EmptyDir { .. } => true,
        VolumeSpec::Local { .. } => !read_only,
        VolumeSpec::Csi(c) => {
            if read_only || c.read_only {
                return false;
            }
            match csi_policy.unwrap_or(CsiFsGroupPolicy::ReadWriteOnceWithFsType) {
                CsiFsGroupPolicy::None => false,
                CsiFsGroupPolicy::File => true,
                CsiFsGroupPolicy::ReadWriteOnceWithFsType => {
                    let fs_type = c.fs_type.as_deref().is_some_and(|t| !t.is_empty());
                    fs_type && (c.ephemeral || c.access_modes.contains(&AccessMode::ReadWriteOnce))
                }
            }
        }
        VolumeSpec::HostPath { .. } | VolumeSpec::Payload(_) => false,
    }
}

/// The mode an entry with the permission bits `perm` ends with (never
/// called for a symlink): `perm` with the group's bits added, never any
/// taken away.
pub fn owned_mode(perm: u32, is_dir: bool, read_only: bool) -> u32 {
    let mut mask = if read_only { RO_BITS } else { RW_BITS };
    if is_dir {
        mask |= SETGID_BIT | EXEC_BITS;
    }
    (perm & 0o7777) | mask
}

/// Whether `OnRootMismatch` may skip the walk: the root is a directory with
/// the group, every bit the walk would give a directory, and setgid.
pub fn root_matches(gid: u32, perm: u32, is_dir: bool, want: u32, read_only: bool) -> bool {
    if gid != want || !is_dir {
        return false;
    }
    let bits = if read_only { RO_BITS } else { RW_BITS } | EXEC_BITS | SETGID_BIT;
    perm & bits == bits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CsiSpec, HostPathType, StorageMedium};

    #[test]
    fn policies_parse_only_the_api_spellings() {
        let table = [
            ("Always", Some(FsGroupChangePolicy::Always)),
            ("OnRootMismatch", Some(FsGroupChangePolicy::OnRootMismatch)),
            ("onrootmismatch", None),
            ("", None),
            ("Never", None),
        ];
        for (s, want) in table {
            assert_eq!(FsGroupChangePolicy::parse(s), want, "{s:?}");
            if let Some(p) = want {
                assert_eq!(p.as_str(), s);
            }
        }
        let table = [
            ("", Some(CsiFsGroupPolicy::ReadWriteOnceWithFsType)),
            (
                "ReadWriteOnceWithFSType",
                Some(CsiFsGroupPolicy::ReadWriteOnceWithFsType),
            ),
            ("File", Some(CsiFsGroupPolicy::File)),
            ("None", Some(CsiFsGroupPolicy::None)),
            ("file", None),
        ];
        for (s, want) in table {
            assert_eq!(CsiFsGroupPolicy::parse(s), want, "{s:?}");
        }
    }

    /// The kubelet's masks: files rw (ro on a read-only volume), dirs also
    /// setgid and owner and group search; bits already there are kept.
    #[test]
    fn owned_modes_add_the_group_bits_and_take_none_away() {
        let table = [
            // perm, dir, read-only, want
            (0o600, false, false, 0o660),
            (0o644, false, false, 0o664),
            (0o755, false, false, 0o775),
            (0o4755, false, false, 0o4775),
            (0o000, false, true, 0o440),
            (0o600, false, true, 0o640),
            (0o700, true, false, 0o2770),
            (0o755, true, false, 0o2775),
            (0o1777, true, false, 0o3777),
            (0o500, true, true, 0o2550),
        ];
        for (perm, dir, ro, want) in table {
            assert_eq!(
                owned_mode(perm, dir, ro),
                want,
                "{perm:o} dir={dir} ro={ro}"
            );
        }
    }

    #[test]
    fn a_root_matches_only_with_the_group_the_bits_and_setgid() {
        let table = [
            // gid, perm, dir, want gid, ro, matches
            (2000, 0o2770, true, 2000, false, true),
            (2000, 0o2775, true, 2000, false, true),
            (2000, 0o2750, true, 2000, false, false),
            (2000, 0o0770, true, 2000, false, false),
            (0, 0o2770, true, 2000, false, false),
            (2000, 0o2770, false, 2000, false, false),
            (2000, 0o2550, true, 2000, true, true),
            (2000, 0o2550, true, 2000, false, false),
        ];
        for (gid, perm, dir, want, ro, m) in table {
            assert_eq!(
                root_matches(gid, perm, dir, want, ro),
                m,
                "{gid} {perm:o} dir={dir} want={want} ro={ro}"
            );
        }
    }

    fn csi(fs_type: Option<&str>, modes: &[AccessMode], ephemeral: bool, ro: bool) -> VolumeSpec {
        VolumeSpec::Csi(Box::new(CsiSpec {
            driver: "d".into(),
            volume_handle: "h".into(),
            fs_type: fs_type.map(str::to_owned),
            access_modes: modes.to_vec(),
            ephemeral,
            read_only: ro,
            ..CsiSpec::default()
        }))
    }

    #[test]
    fn which_volumes_get_the_walk() {
        use AccessMode::*;
        use CsiFsGroupPolicy as P;
        let empty = |medium| VolumeSpec::EmptyDir {
            medium,
            size_limit: None,
        };
        let local = VolumeSpec::Local {
            path: "/mnt/disks/a".into(),
            fs_type: None,
            access_modes: vec![ReadWriteOnce],
            mount_options: vec![],
            is_block: false,
            volume_mode: Default::default(),
        };
        let host = VolumeSpec::HostPath {
            path: "/var/log".into(),
            host_path_type: HostPathType::Unset,
        };
        let rwo = csi(Some("ext4"), &[ReadWriteOnce], false, false);
        let table: Vec<(&str, VolumeSpec, bool, Option<P>, bool)> = vec![
            (
                "disk emptyDir",
                empty(StorageMedium::Disk),
                false,
                None,
                true,
            ),
            (
                "memory emptyDir",
                empty(StorageMedium::Memory),
                false,
                None,
                true,
            ),
            ("local PV", local.clone(), false, None, true),
            ("read-only local PV", local, true, None, false),
            ("hostPath", host, false, None, false),
            (
                "CSI default policy, fsType, RWO",
                rwo.clone(),
                false,
                None,
                true,
            ),
            (
                "CSI RWOWithFSType",
                rwo.clone(),
                false,
                Some(P::ReadWriteOnceWithFsType),
                true,
            ),
            ("CSI policy None", rwo.clone(), false, Some(P::None), false),
            ("CSI read-only", rwo.clone(), true, Some(P::File), false),
            (
                "CSI PV readOnly",
                csi(Some("ext4"), &[ReadWriteOnce], false, true),
                false,
                Some(P::File),
                false,
            ),
            (
                "CSI no fsType",
                csi(None, &[ReadWriteOnce], false, false),
                false,
                None,
                false,
            ),
            (
                "CSI empty fsType",
                csi(Some(""), &[ReadWriteOnce], false, false),
                false,
                None,
                false,
            ),
            (
                "CSI RWX",
                csi(Some("ext4"), &[ReadWriteMany], false, false),
                false,
                None,
                false,
            ),
            (
                "CSI RWOP only",
                csi(Some("ext4"), &[ReadWriteOncePod], false, false),
                false,
                None,
                false,
            ),
            (
                "CSI RWX, File",
                csi(Some("ext4"), &[ReadWriteMany], false, false),
                false,
                Some(P::File),
                true,
            ),
            (
                "CSI no fsType, File",
                csi(None, &[], false, false),
                false,
                Some(P::File),
                true,
            ),
            (
                "CSI inline with fsType",
                csi(Some("ext4"), &[], true, false),
                false,
                None,
                true,
            ),
            (
                "CSI inline without fsType",
                csi(None, &[], true, false),
                false,
                None,
                false,
            ),
        ];
        for (what, spec, ro, policy, want) in table {
            assert_eq!(ownership_applies(&spec, ro, policy), want, "{what}");
        }
    }
}
