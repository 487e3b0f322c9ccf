//! The paths of the kubelet layout as values: [`KubeletPath`] (what a
//! path under the root dir names) and the parsing behind [`Layout::parse`]
//! (split into components once, matched without allocating).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

use super::*;
use crate::model::{ModelError, PluginName, PodUid};

/// The areas of the layout [`Layout::parse`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Area {
    /// `pods/<uid>/volumes/…`
    PodVolumes,
    /// `pods/<uid>/plugins/…`
    PodPlugins,
    /// `plugins/kubernetes.io/…`
    Devices,
    /// `pods/<uid>/volumeDevices/…`: raw block pod targets
    PodDevices,
    /// `plugins/kubernetes.io~local-volume/volumeDevices/…`: a local PV's
    /// raw block global maps
    BlockMaps,
}

/// A pod UID read from a path: checked as [`PodUid::new`] checks it, and
/// borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodName<'a>(pub(super) &'a str);

impl<'a> PodName<'a> {
    /// The UID as a string.
    pub fn as_str(self) -> &'a str {
        self.0
    }
    /// The owned UID (no second check).
    pub fn to_uid(self) -> PodUid {
        PodUid::from_checked(self.0)
    }
}

impl<'a> From<&'a PodUid> for PodName<'a> {
    fn from(uid: &'a PodUid) -> Self {
        PodName(uid.as_str())
    }
}

/// A path of the layout, parsed; names borrow from the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletPath<'a> {
    /// `pods/<uid>/volumes/<plugin~escaped>/<spec name>` of a plugin volumed
    /// knows: the pod target, except for CSI (its `mount` is).
    PodVolume {
        /// the pod
        pod: PodName<'a>,
        /// the plugin
        plugin: PluginName,
        /// the spec name
        spec_name: &'a str,
    },
    /// `pods/<uid>/volumes/kubernetes.io~csi/<spec name>/mount`
    CsiPodMount {
        /// the pod
        pod: PodName<'a>,
        /// the spec name
        spec_name: &'a str,
    },
    /// `pods/<uid>/volumes/kubernetes.io~csi/<spec name>/vol_data.json`
    CsiPodVolData {
        /// the pod
        pod: PodName<'a>,
        /// the spec name
        spec_name: &'a str,
    },
    /// `pods/<uid>/volumes/<plugin dir>/<name>` of a plugin volumed does not
    /// know (secret, projected, …); the name is whatever is on disk.
    UnknownPodVolume {
        /// the pod
        pod: PodName<'a>,
        /// the plugin dir name (`kubernetes.io~secret`)
        plugin_dir: &'a str,
        /// the volume dir name
        name: &'a OsStr,
    },
    /// `pods/<uid>/plugins/kubernetes.io~empty-dir/<spec name>/ready`
    EmptyDirReady {
        /// the pod
        pod: PodName<'a>,
        /// the spec name
        spec_name: &'a str,
    },
    /// `pods/<uid>/volumeDevices/<plugin~escaped>/<spec name>`: a raw block
    /// volume's pod target (a symlink to the device)
    PodDeviceMap {
        /// the pod
        pod: PodName<'a>,
        /// the plugin
        plugin: PluginName,
        /// the spec name
        spec_name: &'a str,
    },
    /// `plugins/kubernetes.io~local-volume/volumeDevices/<pv>`: a local
    /// PV's raw block device target (its global map dir)
    LocalBlockMap {
        /// the PV name
        pv: &'a str,
    },
    /// `plugins/kubernetes.io~local-volume/volumeDevices/<pv>/<uid>`: the
    /// file one pod's map binds the device on
    LocalBlockPodMap {
        /// the PV name
        pv: &'a str,
        /// the pod
        pod: PodName<'a>,
    },
    /// `plugins/kubernetes.io/csi/volumeDevices/staging/<spec name>`: a CSI
    /// block volume's staging dir (its device target)
    CsiBlockStaging {
        /// the spec name
        spec_name: &'a str,
    },
    /// `plugins/kubernetes.io/csi/volumeDevices/publish/<spec name>/<uid>`:
    /// the file one pod's NodePublish puts the device on
    CsiBlockPublish {
        /// the spec name
        spec_name: &'a str,
        /// the pod
        pod: PodName<'a>,
    },
    /// `plugins/kubernetes.io/csi/volumeDevices/<spec name>/dev`: a CSI
    /// block volume's global map path
    CsiBlockMap {
        /// the spec name
        spec_name: &'a str,
    },
    /// `plugins/kubernetes.io/csi/volumeDevices/<spec name>/dev/<uid>`: the
    /// file one pod's map binds the published device on
    CsiBlockPodMap {
        /// the spec name
        spec_name: &'a str,
        /// the pod
        pod: PodName<'a>,
    },
    /// `plugins/kubernetes.io/csi/volumeDevices/<spec name>/data/vol_data.json`
    CsiBlockVolData {
        /// the spec name
        spec_name: &'a str,
    },
    /// `plugins/kubernetes.io/local-volume/mounts/<pv>`
    LocalDevice {
        /// the PV name
        pv: &'a str,
    },
    /// `plugins/kubernetes.io/csi/<driver>/<hash>/globalmount`
    CsiGlobalMount {
        /// the driver name
        driver: &'a str,
        /// the dir named by the SHA-256 of the volume handle
        hash: &'a str,
    },
    /// `plugins/kubernetes.io/csi/<driver>/<hash>/vol_data.json`
    CsiDeviceVolData {
        /// the driver name
        driver: &'a str,
        /// the dir named by the SHA-256 of the volume handle
        hash: &'a str,
    },
}

/// Why a path is not one [`KubeletPath`] names. Names are checked left to
/// right, each area's fixed names first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// not below the root, or with a `.`/`..` component on the way
    #[error("not a plain path below the root dir")]
    Outside,
    /// below the root, but not in the area asked for, or in none
    /// (`pods/<uid>/etc-hosts`, `pods/<uid>/volume-subpaths/…`)
    #[error("not in the part of the kubelet layout asked for")]
    Elsewhere,
    /// a name that is not UTF-8
    #[error("a name is not utf-8")]
    NonUtf8,
    /// `pods/<name>` where the name is not a pod UID
    #[error(transparent)]
    InvalidPodUid(ModelError),
    /// in an area of the layout, but not a path the kubelet makes there
    #[error("not a path of the kubelet layout")]
    Unrecognised,
}

/// Absolute, not `/`, no empty, `.` or `..` component, no trailing `/`.
pub(super) fn is_plain(root: &Path) -> bool {
    let b = root.as_os_str().as_bytes();
    b.len() > 1
        && b.starts_with(b"/")
        && b[1..]
            .split(|&c| c == b'/')
            .all(|n| !matches!(n, b"" | b"." | b".."))
}

/// Where a path's names are counted from: the dir of its area.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Base {
    /// `<root>/pods`
    Pods,
    /// `<root>/plugins/kubernetes.io`
    Devices,
    /// `<root>`: no area
    Root,
}

impl Base {
    /// The names from the root to the base.
    pub(super) fn names(self) -> &'static [&'static str] {
        match self {
            Base::Pods => &[PODS],
            Base::Devices => &[PLUGINS, KUBERNETES_IO],
            Base::Root => &[],
        }
    }
}

/// More names than any path of the layout has below its base
/// (`<uid>/volumes/<plugin>/<name>/mount`, `csi/<driver>/<hash>/globalmount`).
pub(super) const MAX_PARTS: usize = 6;

/// A path's names below its [`Base`]: the first [`MAX_PARTS`] of them and
/// how many there are, without an allocation.
pub(super) struct RelParts<'a> {
    parts: [&'a OsStr; MAX_PARTS],
    pub(super) len: usize,
}

impl<'a> RelParts<'a> {
    /// Mount points as the kernel prints them are plain (`root/`, then the
    /// base, then names separated by single slashes): those are split as
    /// bytes; anything else goes through [`Path::components`], and both
    /// agree on every path.
    pub(super) fn of(path: &'a Path, root: &Path, root_plain: bool) -> Option<(Base, Self)> {
        let below_root = root_plain
            .then(|| {
                path.as_os_str()
                    .as_bytes()
                    .strip_prefix(root.as_os_str().as_bytes())?
                    .strip_prefix(b"/")
            })
            .flatten();
        let fast = below_root.and_then(|rest| {
            let (base, rest) = [Base::Pods, Base::Devices]
                .into_iter()
                .find_map(|base| Some((base, strip_names(rest, base.names())?)))
                .unwrap_or((Base::Root, rest));
            let mut out = Self::from_names(&[]);
            for name in rest.split(|&b| b == b'/') {
                if matches!(name, b"" | b"." | b"..") {
                    return None;
                }
                out.push(OsStr::from_bytes(name));
            }
            Some((base, out))
        });
        if fast.is_some() {
            return fast;
        }
        let names = path
            .strip_prefix(root)
            .ok()?
            .components()
            .map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        let base = [Base::Pods, Base::Devices]
            .into_iter()
            .find(|b| {
                let fixed = b.names();
                fixed.len() < names.len() && fixed.iter().zip(&names).all(|(f, n)| n == f)
            })
            .unwrap_or(Base::Root);
        let rest = names.get(base.names().len()..).unwrap_or_default();
        Some((base, Self::from_names(rest)))
    }

    pub(super) fn from_names(names: &[&'a OsStr]) -> Self {
        let mut out = RelParts {
            parts: [OsStr::new(""); MAX_PARTS],
            len: 0,
        };
        names.iter().for_each(|n| out.push(n));
        out
    }

    fn push(&mut self, name: &'a OsStr) {
        if let Some(slot) = self.parts.get_mut(self.len) {
            *slot = name;
        }
        self.len += 1;
    }

    /// The `i`-th name, if there is one.
    pub(super) fn get(&self, i: usize) -> Option<&'a OsStr> {
        (i < self.len).then(|| self.parts.get(i).copied()).flatten()
    }

    /// Whether the `i`-th name is `want`.
    fn is(&self, i: usize, want: &str) -> bool {
        self.get(i).is_some_and(|n| n == want)
    }

    /// The names, `None` if more than [`MAX_PARTS`].
    fn all(&self) -> Option<&[&'a OsStr]> {
        self.parts.get(..self.len)
    }

    /// The area, by the base and the fixed names alone.
    pub(super) fn area(&self, base: Base) -> Option<Area> {
        match base {
            Base::Pods if self.is(1, VOLUMES) => Some(Area::PodVolumes),
            Base::Pods if self.is(1, PLUGINS) => Some(Area::PodPlugins),
            Base::Pods if self.is(1, VOLUME_DEVICES) => Some(Area::PodDevices),
            Base::Root
                if self.is(0, PLUGINS)
                    && self.is(1, PluginName::LocalVolume.escaped())
                    && self.is(2, VOLUME_DEVICES) =>
            {
                Some(Area::BlockMaps)
            }
            Base::Devices if self.len > 0 => Some(Area::Devices),
            _ => None,
        }
    }
}

/// `rest` after `names`, each followed by a `/`.
fn strip_names<'r>(mut rest: &'r [u8], names: &[&str]) -> Option<&'r [u8]> {
    for n in names {
        rest = rest.strip_prefix(n.as_bytes())?.strip_prefix(b"/")?;
    }
    Some(rest)
}

fn utf8(name: &OsStr) -> Result<&str, LayoutError> {
    name.to_str().ok_or(LayoutError::NonUtf8)
}

/// `pods/<uid>/…`: the UID, checked.
pub(super) fn pod_name<'a>(
    parts: &RelParts<'a>,
    known: Option<&PodUid>,
) -> Result<PodName<'a>, LayoutError> {
    let name = utf8(parts.get(0).ok_or(LayoutError::Unrecognised)?)?;
    if known.is_none_or(|k| k.as_str() != name) {
        PodUid::check(name).map_err(LayoutError::InvalidPodUid)?;
    }
    Ok(PodName(name))
}

/// `pods/<uid>/volumes/…`
pub(super) fn pod_volume<'a>(
    parts: &RelParts<'a>,
    known: Option<&PodUid>,
) -> Result<KubeletPath<'a>, LayoutError> {
    let pod = pod_name(parts, known)?;
    let (Some(plugin_dir), Some(name)) = (parts.get(2), parts.get(3)) else {
        return Err(LayoutError::Unrecognised);
    };
    let plugin_dir = utf8(plugin_dir)?;
    let Some(plugin) = PluginName::from_escaped(plugin_dir) else {
        return match parts.len {
            4 => Ok(KubeletPath::UnknownPodVolume {
                pod,
                plugin_dir,
                name,
            }),
            _ => Err(LayoutError::Unrecognised),
        };
    };
    let csi = plugin == PluginName::Csi;
    match parts.len {
        4 => Ok(KubeletPath::PodVolume {
            pod,
            plugin,
            spec_name: utf8(name)?,
        }),
        5 if csi && parts.is(4, CSI_POD_MOUNT) => Ok(KubeletPath::CsiPodMount {
            pod,
            spec_name: utf8(name)?,
        }),
        5 if csi && parts.is(4, VOL_DATA_FILE) => Ok(KubeletPath::CsiPodVolData {
            pod,
            spec_name: utf8(name)?,
        }),
        _ => Err(LayoutError::Unrecognised),
    }
}

/// `pods/<uid>/plugins/…`
pub(super) fn pod_plugin<'a>(
    parts: &RelParts<'a>,
    known: Option<&PodUid>,
) -> Result<KubeletPath<'a>, LayoutError> {
    let pod = pod_name(parts, known)?;
    let empty_dir = parts
        .get(2)
        .and_then(OsStr::to_str)
        .and_then(PluginName::from_escaped)
        == Some(PluginName::EmptyDir);
    match (parts.len, parts.get(3)) {
        (5, Some(name)) if empty_dir && parts.is(4, READY_MARKER) => {
            Ok(KubeletPath::EmptyDirReady {
                pod,
                spec_name: utf8(name)?,
            })
        }
        _ => Err(LayoutError::Unrecognised),
    }
}

/// `pods/<uid>/volumeDevices/<plugin~escaped>/<spec name>` of a plugin
/// volumed knows
pub(super) fn pod_device_map<'a>(
    parts: &RelParts<'a>,
    known: Option<&PodUid>,
) -> Result<KubeletPath<'a>, LayoutError> {
    let pod = pod_name(parts, known)?;
    match (parts.len, parts.get(2), parts.get(3)) {
        (4, Some(plugin_dir), Some(name)) => {
            let plugin = PluginName::from_escaped(utf8(plugin_dir)?);
            let plugin = plugin.ok_or(LayoutError::Unrecognised)?;
            Ok(KubeletPath::PodDeviceMap {
                pod,
                plugin,
                spec_name: utf8(name)?,
            })
        }
        _ => Err(LayoutError::Unrecognised),
    }
}

/// `plugins/kubernetes.io~local-volume/volumeDevices/<pv>[/<uid>]`
pub(super) fn block_map<'a>(
    parts: &RelParts<'a>,
    known: Option<&PodUid>,
) -> Result<KubeletPath<'a>, LayoutError> {
    let pv = parts.get(3).ok_or(LayoutError::Unrecognised);
    match parts.len {
        4 => Ok(KubeletPath::LocalBlockMap { pv: utf8(pv?)? }),
        5 => {
            let pv = utf8(pv?)?;
            let uid = RelParts::from_names(parts.get(4).as_slice());
            Ok(KubeletPath::LocalBlockPodMap {
                pv,
                pod: pod_name(&uid, known)?,
            })
        }
        _ => Err(LayoutError::Unrecognised),
    }
}

/// `plugins/kubernetes.io/…`. `deep_names_utf8` says, for a path deeper
/// than any device path, whether all its names are UTF-8.
pub(super) fn device<'a>(
    parts: &RelParts<'a>,
    deep_names_utf8: impl FnOnce() -> bool,
) -> Result<KubeletPath<'a>, LayoutError> {
    let Some(all) = parts.all() else {
        return Err(match deep_names_utf8() {
            true => LayoutError::Unrecognised,
            false => LayoutError::NonUtf8,
        });
    };
    let mut names = [""; MAX_PARTS];
    for (slot, p) in names.iter_mut().zip(all) {
        *slot = utf8(p)?;
    }
    let local = PluginName::LocalVolume.short();
    let csi = PluginName::Csi.short();
    let uid = |i: usize| pod_name(&RelParts::from_names(parts.get(i).as_slice()), None);
    // The CSI plugin's raw block dir comes first: `volumeDevices` is no
    // driver name the kubelet would make a dir for, the kubelet's own
    // layout sharing `csi/` between the two
    match names.get(..all.len()).unwrap_or_default() {
        [p, VOLUME_DEVICES, CSI_BLOCK_STAGING, spec_name] if *p == csi => {
            Ok(KubeletPath::CsiBlockStaging { spec_name })
        }
        [p, VOLUME_DEVICES, CSI_BLOCK_PUBLISH, spec_name, _] if *p == csi => {
            Ok(KubeletPath::CsiBlockPublish {
                spec_name,
                pod: uid(4)?,
            })
        }
        [p, VOLUME_DEVICES, spec_name, CSI_BLOCK_DEV] if *p == csi => {
            Ok(KubeletPath::CsiBlockMap { spec_name })
        }
        [p, VOLUME_DEVICES, spec_name, CSI_BLOCK_DEV, _] if *p == csi => {
            Ok(KubeletPath::CsiBlockPodMap {
                spec_name,
                pod: uid(4)?,
            })
        }
        [p, VOLUME_DEVICES, spec_name, CSI_BLOCK_DATA, VOL_DATA_FILE] if *p == csi => {
            Ok(KubeletPath::CsiBlockVolData { spec_name })
        }
        [p, VOLUME_DEVICES, ..] if *p == csi => Err(LayoutError::Unrecognised),
        [p, LOCAL_MOUNTS, pv] if *p == local => Ok(KubeletPath::LocalDevice { pv }),
        [p, driver, hash, CSI_GLOBAL_MOUNT] if *p == csi => {
            Ok(KubeletPath::CsiGlobalMount { driver, hash })
        }
        [p, driver, hash, VOL_DATA_FILE] if *p == csi => {
            Ok(KubeletPath::CsiDeviceVolData { driver, hash })
        }
        _ => Err(LayoutError::Unrecognised),
    }
}
