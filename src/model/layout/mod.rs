//! The kubelet's on-disk layout under the root dir: every path volumed
//! makes or reads there is built by [`Layout`], and every such path read
//! back (a mount point, a listed dir) is parsed by [`Layout::parse`] into a
//! [`KubeletPath`]. The layout's names are spelt only here (`tests/tidy.rs`
//! checks it).
//!
//! *Invariants:* a built path parses back to what built it, and
//! [`Layout::path_of`] builds it again; anything else — a `.`/`..`
//! component, a missing or extra component, a non-UTF-8 name, a bad pod
//! UID, a path outside the root — is a [`LayoutError`]. Parsing borrows from
//! the path and allocates nothing: reconstruction parses one path per
//! mount-table row.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

use super::{PluginName, PodUid};

mod path;

pub use path::{Area, KubeletPath, LayoutError, PodName};
use path::{RelParts, block_map, device, is_plain, pod_device_map, pod_plugin, pod_volume};

const PODS: &str = "pods";
const VOLUMES: &str = "volumes";
const VOLUME_SUBPATHS: &str = "volume-subpaths";
const PLUGINS: &str = "plugins";
const KUBERNETES_IO: &str = "kubernetes.io";
const LOCAL_MOUNTS: &str = "mounts";
const CSI_POD_MOUNT: &str = "mount";
const PLUGINS_REGISTRY: &str = "plugins_registry";
const CSI_GLOBAL_MOUNT: &str = "globalmount";
/// The kubelet's dir of raw block maps, in a pod dir and in a plugin's dir
/// (`DefaultKubeletVolumeDevicesDirName`).
const VOLUME_DEVICES: &str = "volumeDevices";
/// Under the CSI plugin's `volumeDevices`: the dir of each block volume's
/// NodeStage (`staging/<spec name>`).
const CSI_BLOCK_STAGING: &str = "staging";
/// Under the CSI plugin's `volumeDevices`: the files each pod's NodePublish
/// puts the device on (`publish/<spec name>/<uid>`).
const CSI_BLOCK_PUBLISH: &str = "publish";
/// In a CSI block volume's dir: the global map path, one bound file per pod.
const CSI_BLOCK_DEV: &str = "dev";
/// In a CSI block volume's dir: the dir of its `vol_data.json`.
const CSI_BLOCK_DATA: &str = "data";

/// The CSI metadata file beside a pod `mount` dir and a globalmount.
pub const VOL_DATA_FILE: &str = "vol_data.json";
/// The emptyDir marker file under `pods/<uid>/plugins/kubernetes.io~empty-dir/<vol>/`.
pub const READY_MARKER: &str = "ready";

/// In a configMap, secret, downwardAPI or projected volume dir: the symlink
/// to the current payload dir, which the user-visible names go through.
pub const PAYLOAD_DATA_LINK: &str = "..data";
/// The symlink made beside [`PAYLOAD_DATA_LINK`] and renamed over it.
pub const PAYLOAD_DATA_TMP: &str = "..data_tmp";
/// What every name the payload writer keeps to itself starts with (user
/// paths may not).
pub const PAYLOAD_PRIVATE_PREFIX: &str = "..";

/// Kubelet-compatible on-disk layout under the root dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
    /// whether `root` is spelt plainly, so a path below it splits as bytes
    plain: bool,
}

impl Layout {
    /// A layout rooted at `root` (the kubelet's `--root-dir`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let plain = is_plain(&root);
        Self { root, plain }
    }
    /// The root dir.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// `<root>/<parts>`, made in one allocation, where a chain of `join`s
    /// makes a new path at each step (every mount job builds several).
    fn rooted<'a>(&self, parts: impl Iterator<Item = &'a str> + Clone) -> PathBuf {
        let len = self.root.as_os_str().len() + parts.clone().map(|p| p.len() + 1).sum::<usize>();
        let mut path = PathBuf::with_capacity(len);
        path.push(&self.root);
        for part in parts {
            path.push(part);
        }
        path
    }
    /// `<root>/pods/<uid>/<parts>`
    fn in_pod<'a>(&self, pod: &'a PodUid, parts: impl Iterator<Item = &'a str> + Clone) -> PathBuf {
        self.rooted([PODS, pod.as_str()].into_iter().chain(parts))
    }
    /// `<root>/pods/<uid>/volumes/<plugin~escaped>/<spec name>[/<leaf>]`
    fn in_pod_volume(
        &self,
        pod: &PodUid,
        plugin: PluginName,
        spec_name: &str,
        leaf: Option<&str>,
    ) -> PathBuf {
        let dir = [VOLUMES, plugin.escaped(), spec_name];
        self.in_pod(pod, dir.into_iter().chain(leaf))
    }
    /// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>[/<leaf>]`
    fn in_csi_device(&self, driver: &str, handle_sha256_hex: &str, leaf: Option<&str>) -> PathBuf {
        let dir = [PluginName::Csi.short(), driver, handle_sha256_hex];
        self.in_plugins(dir.into_iter().chain(leaf))
    }
    /// `<root>/plugins/kubernetes.io/<parts>`
    fn in_plugins<'a>(&self, parts: impl Iterator<Item = &'a str> + Clone) -> PathBuf {
        self.rooted([PLUGINS, KUBERNETES_IO].into_iter().chain(parts))
    }
    /// `<root>/pods`
    pub fn pods_dir(&self) -> PathBuf {
        self.rooted([PODS].into_iter())
    }
    /// `<root>/pods/<uid>`
    pub fn pod_dir(&self, pod: &PodUid) -> PathBuf {
        self.in_pod(pod, std::iter::empty())
    }
    /// `<root>/pods/<uid>/volumes`
    pub fn pod_volumes_dir(&self, pod: &PodUid) -> PathBuf {
        self.in_pod(pod, [VOLUMES].into_iter())
    }
    /// `<root>/pods/<uid>/volumes/<plugin~escaped>`
    pub fn pod_volume_plugin_dir(&self, pod: &PodUid, plugin: PluginName) -> PathBuf {
        self.in_pod(pod, [VOLUMES, plugin.escaped()].into_iter())
    }
    /// `<root>/pods/<uid>/volumes/<plugin~escaped>/<spec name>`; CSI adds `/mount`.
    pub fn pod_volume_dir(&self, pod: &PodUid, plugin: PluginName, spec_name: &str) -> PathBuf {
        self.in_pod_volume(pod, plugin, spec_name, None)
    }
    /// The path the pod target is mounted at / set up in.
    pub fn pod_target_path(&self, pod: &PodUid, plugin: PluginName, spec_name: &str) -> PathBuf {
        let mount = (plugin == PluginName::Csi).then_some(CSI_POD_MOUNT);
        self.in_pod_volume(pod, plugin, spec_name, mount)
    }
    /// `<root>/pods/<uid>/volumes/kubernetes.io~csi/<spec name>/vol_data.json`
    pub fn csi_pod_vol_data(&self, pod: &PodUid, spec_name: &str) -> PathBuf {
        self.in_pod_volume(pod, PluginName::Csi, spec_name, Some(VOL_DATA_FILE))
    }
    /// `<root>/pods/<uid>/volume-subpaths`: the kubelet's subpath binds
    pub fn pod_subpaths_dir(&self, pod: &PodUid) -> PathBuf {
        self.in_pod(pod, [VOLUME_SUBPATHS].into_iter())
    }
    /// `<root>/pods/<uid>/volume-subpaths/<volume>`: one pod volume's
    /// subpath binds, by container
    pub fn pod_volume_subpaths_dir(&self, pod: &PodUid, volume: &str) -> PathBuf {
        self.in_pod(pod, [VOLUME_SUBPATHS, volume].into_iter())
    }
    /// `<root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`:
    /// the bind of the `index`-th volumeMount of `container` (its index in
    /// the container's `volumeMounts`, as the kubelet numbers them)
    pub fn subpath_target(
        &self,
        pod: &PodUid,
        volume: &str,
        container: &str,
        index: usize,
    ) -> PathBuf {
        let index = index.to_string();
        self.in_pod(
            pod,
            [VOLUME_SUBPATHS, volume, container, index.as_str()].into_iter(),
        )
    }
    /// `<root>/pods/<uid>/volumeDevices`: the pod's raw block maps, by plugin
    pub fn pod_volume_devices_dir(&self, pod: &PodUid) -> PathBuf {
        self.in_pod(pod, [VOLUME_DEVICES].into_iter())
    }
    /// `<root>/pods/<uid>/volumeDevices/<plugin~escaped>/<spec name>`: the
    /// pod target of a raw block volume, the symlink to the device its
    /// containers get
    pub fn pod_device_map_path(
        &self,
        pod: &PodUid,
        plugin: PluginName,
        spec_name: &str,
    ) -> PathBuf {
        self.in_pod(
            pod,
            [VOLUME_DEVICES, plugin.escaped(), spec_name].into_iter(),
        )
    }
    /// `<root>/pods/<uid>/volumeDevices/<plugin~escaped>`: the pod's raw
    /// block symlinks of one plugin are in it
    pub fn pod_device_maps_dir(&self, pod: &PodUid, plugin: PluginName) -> PathBuf {
        self.in_pod(pod, [VOLUME_DEVICES, plugin.escaped()].into_iter())
    }
    /// Local PV raw block device target (the global map path):
    /// `<root>/plugins/kubernetes.io~local-volume/volumeDevices/<pv>`. The
    /// kubelet builds it from the escaped plugin name, so it is not under
    /// `plugins/kubernetes.io/` as the filesystem device path is.
    pub fn local_block_map_dir(&self, pv_name: &str) -> PathBuf {
        let plugin = PluginName::LocalVolume.escaped();
        self.rooted([PLUGINS, plugin, VOLUME_DEVICES, pv_name].into_iter())
    }
    /// `<root>/plugins/kubernetes.io~local-volume/volumeDevices`: every
    /// local PV's global map dir is in it
    pub fn local_block_maps_dir(&self) -> PathBuf {
        let plugin = PluginName::LocalVolume.escaped();
        self.rooted([PLUGINS, plugin, VOLUME_DEVICES].into_iter())
    }
    /// `<local_block_map_dir>/<uid>`: the file the device is bound on for
    /// one pod that maps it
    pub fn local_block_pod_map(&self, pv_name: &str, pod: &PodUid) -> PathBuf {
        let plugin = PluginName::LocalVolume.escaped();
        let names = [PLUGINS, plugin, VOLUME_DEVICES, pv_name, pod.as_str()];
        self.rooted(names.into_iter())
    }
    /// `<global map path>/<uid>`: the file a raw block device is bound on
    /// for one pod, in any block plugin's global map path (the kubelet's
    /// `globalMapPath/podUID`)
    pub fn block_pod_map_in(global_map: &Path, pod: &PodUid) -> PathBuf {
        global_map.join(pod.as_str())
    }
    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/<parts>`: the CSI
    /// plugin's raw block dir (the kubelet's `GetVolumeDevicePluginDir`)
    fn in_csi_block<'a>(&self, parts: impl Iterator<Item = &'a str> + Clone) -> PathBuf {
        let dir = [PluginName::Csi.short(), VOLUME_DEVICES];
        self.in_plugins(dir.into_iter().chain(parts))
    }
    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/staging/<spec name>`:
    /// a CSI block volume's staging dir (NodeStage's `staging_target_path`),
    /// its device target
    pub fn csi_block_staging_path(&self, spec_name: &str) -> PathBuf {
        self.in_csi_block([CSI_BLOCK_STAGING, spec_name].into_iter())
    }
    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/publish/<spec name>`:
    /// the dir of a CSI block volume's publish files
    pub fn csi_block_publish_dir(&self, spec_name: &str) -> PathBuf {
        self.in_csi_block([CSI_BLOCK_PUBLISH, spec_name].into_iter())
    }
    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/publish/<spec name>/<uid>`:
    /// the file one pod's NodePublish puts the device on (its `target_path`)
    pub fn csi_block_publish_path(&self, spec_name: &str, pod: &PodUid) -> PathBuf {
        let names = [CSI_BLOCK_PUBLISH, spec_name, pod.as_str()];
        self.in_csi_block(names.into_iter())
    }
    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/<spec name>`: a CSI
    /// block volume's dir (its global map path and its volume data)
    pub fn csi_block_volume_dir(&self, spec_name: &str) -> PathBuf {
        self.in_csi_block([spec_name].into_iter())
    }
    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/<spec name>/dev`: a
    /// CSI block volume's global map path
    pub fn csi_block_map_dir(&self, spec_name: &str) -> PathBuf {
        self.in_csi_block([spec_name, CSI_BLOCK_DEV].into_iter())
    }
    /// `<csi_block_map_dir>/<uid>`: the file the published device is bound
    /// on for one pod
    pub fn csi_block_pod_map(&self, spec_name: &str, pod: &PodUid) -> PathBuf {
        let names = [spec_name, CSI_BLOCK_DEV, pod.as_str()];
        self.in_csi_block(names.into_iter())
    }
    /// [`Layout::csi_block_pod_map`] from the volume's staging dir (a
    /// device target's recorded path), for code without the layout:
    /// `None` for a path that is not a CSI block staging dir of `spec_name`
    pub fn csi_block_pod_map_beside(
        staging: &Path,
        spec_name: &str,
        pod: &PodUid,
    ) -> Option<PathBuf> {
        let dir = staging.parent()?;
        let ok = staging.file_name()? == spec_name
            && dir.file_name()? == CSI_BLOCK_STAGING
            && dir.parent()?.file_name()? == VOLUME_DEVICES;
        let base = dir.parent()?;
        ok.then(|| base.join(spec_name).join(CSI_BLOCK_DEV).join(pod.as_str()))
    }
    /// `<root>/plugins/kubernetes.io/csi/volumeDevices/<spec name>/data`
    pub fn csi_block_data_dir(&self, spec_name: &str) -> PathBuf {
        self.in_csi_block([spec_name, CSI_BLOCK_DATA].into_iter())
    }
    /// `<csi_block_data_dir>/vol_data.json`: what the kubelet reads back
    /// to reconstruct a CSI block volume
    pub fn csi_block_vol_data(&self, spec_name: &str) -> PathBuf {
        let names = [spec_name, CSI_BLOCK_DATA, VOL_DATA_FILE];
        self.in_csi_block(names.into_iter())
    }
    /// `<root>/pods/<uid>/plugins`
    pub fn pod_plugins_dir(&self, pod: &PodUid) -> PathBuf {
        self.in_pod(pod, [PLUGINS].into_iter())
    }
    /// `<root>/pods/<uid>/plugins/kubernetes.io~empty-dir/<vol>/ready`
    pub fn empty_dir_ready_marker(&self, pod: &PodUid, spec_name: &str) -> PathBuf {
        let escaped = PluginName::EmptyDir.escaped();
        self.in_pod(pod, [PLUGINS, escaped, spec_name, READY_MARKER].into_iter())
    }
    /// `<root>/plugins/kubernetes.io`
    pub fn plugins_dir(&self) -> PathBuf {
        self.in_plugins(std::iter::empty())
    }
    /// Local PV device target: `<root>/plugins/kubernetes.io/local-volume/mounts/<pv>`.
    pub fn local_device_path(&self, pv_name: &str) -> PathBuf {
        self.in_plugins([PluginName::LocalVolume.short(), LOCAL_MOUNTS, pv_name].into_iter())
    }
    /// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>`: the
    /// dir of a CSI device target and its `vol_data.json`.
    pub fn csi_device_dir(&self, driver: &str, handle_sha256_hex: &str) -> PathBuf {
        self.in_csi_device(driver, handle_sha256_hex, None)
    }
    /// CSI device target: `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`.
    pub fn csi_device_path(&self, driver: &str, handle_sha256_hex: &str) -> PathBuf {
        self.in_csi_device(driver, handle_sha256_hex, Some(CSI_GLOBAL_MOUNT))
    }
    /// `<root>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/vol_data.json`
    pub fn csi_device_vol_data(&self, driver: &str, handle_sha256_hex: &str) -> PathBuf {
        self.in_csi_device(driver, handle_sha256_hex, Some(VOL_DATA_FILE))
    }
    /// `<root>/plugins_registry`: where node-driver-registrar puts the
    /// registration socket of each plugin, as for the kubelet.
    pub fn plugins_registry_dir(&self) -> PathBuf {
        self.root.join(PLUGINS_REGISTRY)
    }
    /// The dir name of a CSI volume handle under `csi/<driver>/`: the hex
    /// SHA-256 of the handle, as the kubelet names it.
    pub fn csi_handle_hash(volume_handle: &str) -> String {
        sha256_hex("", volume_handle.as_bytes())
    }

    /// The path a parsed value names (the inverse of [`Layout::parse`]).
    pub fn path_of(&self, p: &KubeletPath<'_>) -> PathBuf {
        match *p {
            KubeletPath::PodVolume {
                pod,
                plugin,
                spec_name,
            } => self.pod_volume_dir(&pod.to_uid(), plugin, spec_name),
            KubeletPath::CsiPodMount { pod, spec_name } => {
                self.pod_target_path(&pod.to_uid(), PluginName::Csi, spec_name)
            }
            KubeletPath::CsiPodVolData { pod, spec_name } => {
                self.csi_pod_vol_data(&pod.to_uid(), spec_name)
            }
            KubeletPath::UnknownPodVolume {
                pod,
                plugin_dir,
                name,
            } => self
                .pod_volumes_dir(&pod.to_uid())
                .join(plugin_dir)
                .join(name),
            KubeletPath::EmptyDirReady { pod, spec_name } => {
                self.empty_dir_ready_marker(&pod.to_uid(), spec_name)
            }
            KubeletPath::LocalDevice { pv } => self.local_device_path(pv),
            KubeletPath::PodDeviceMap {
                pod,
                plugin,
                spec_name,
            } => self.pod_device_map_path(&pod.to_uid(), plugin, spec_name),
            KubeletPath::LocalBlockMap { pv } => self.local_block_map_dir(pv),
            KubeletPath::LocalBlockPodMap { pv, pod } => {
                self.local_block_pod_map(pv, &pod.to_uid())
            }
            KubeletPath::CsiBlockStaging { spec_name } => self.csi_block_staging_path(spec_name),
            KubeletPath::CsiBlockPublish { spec_name, pod } => {
                self.csi_block_publish_path(spec_name, &pod.to_uid())
            }
            KubeletPath::CsiBlockMap { spec_name } => self.csi_block_map_dir(spec_name),
            KubeletPath::CsiBlockPodMap { spec_name, pod } => {
                self.csi_block_pod_map(spec_name, &pod.to_uid())
            }
            KubeletPath::CsiBlockVolData { spec_name } => self.csi_block_vol_data(spec_name),
            KubeletPath::CsiGlobalMount { driver, hash } => self.csi_device_path(driver, hash),
            KubeletPath::CsiDeviceVolData { driver, hash } => {
                self.csi_device_vol_data(driver, hash)
            }
        }
    }

    /// Parses a path in any area of the layout.
    pub fn parse<'a>(&self, path: &'a Path) -> Result<KubeletPath<'a>, LayoutError> {
        self.parse_where(path, None, None)
    }

    /// Parses a path expected in `area`: a path in another area, or in none,
    /// is [`LayoutError::Elsewhere`] before any of its names is checked.
    pub fn parse_in<'a>(&self, area: Area, path: &'a Path) -> Result<KubeletPath<'a>, LayoutError> {
        self.parse_where(path, Some(area), None)
    }

    /// [`Layout::parse_in`] for one of a run of paths: a pod UID equal to
    /// `known` (a [`PodUid`], so valid) is not checked again. A sorted
    /// mount table lists a pod's paths together.
    pub fn parse_in_known<'a>(
        &self,
        area: Area,
        path: &'a Path,
        known: Option<&PodUid>,
    ) -> Result<KubeletPath<'a>, LayoutError> {
        self.parse_where(path, Some(area), known)
    }

    fn parse_where<'a>(
        &self,
        path: &'a Path,
        want: Option<Area>,
        known: Option<&PodUid>,
    ) -> Result<KubeletPath<'a>, LayoutError> {
        let (base, parts) =
            RelParts::of(path, &self.root, self.plain).ok_or(LayoutError::Outside)?;
        let area = parts.area(base).ok_or(LayoutError::Elsewhere)?;
        if want.is_some_and(|w| w != area) {
            return Err(LayoutError::Elsewhere);
        }
        match area {
            Area::PodVolumes => pod_volume(&parts, known),
            Area::PodPlugins => pod_plugin(&parts, known),
            Area::PodDevices => pod_device_map(&parts, known),
            Area::BlockMaps => block_map(&parts, known),
            Area::Devices => device(&parts, || {
                // deeper than any device path: every name below the root
                // is UTF-8 exactly when the rest of the path is
                path.strip_prefix(&self.root)
                    .map_or(true, |rest| rest.to_str().is_some())
            }),
        }
    }

    /// The device target a path ends in, whatever the root: for code that
    /// holds a device target's path but not the layout it came from. A
    /// local PV's raw block global map dir is one too
    /// ([`KubeletPath::LocalBlockMap`]).
    pub fn device_of(path: &Path) -> Option<KubeletPath<'_>> {
        // a CSI globalmount has six names from `plugins`, a local PV five,
        // a local PV's global map dir four
        const N: usize = 6;
        let mut tail = [OsStr::new(""); N];
        let mut n = 0;
        for c in path.components().rev().take(N) {
            let Component::Normal(name) = c else { break };
            n += 1;
            tail[N - n] = name;
        }
        [N, N - 1, N - 2]
            .into_iter()
            .filter(|&len| len <= n)
            .find_map(|len| match tail[N - len..] {
                [p, k, ref rest @ ..] if p == PLUGINS && k == KUBERNETES_IO => {
                    device(&RelParts::from_names(rest), || false).ok()
                }
                [p, k, d, pv]
                    if p == PLUGINS
                        && k == PluginName::LocalVolume.escaped()
                        && d == VOLUME_DEVICES =>
                {
                    Some(KubeletPath::LocalBlockMap { pv: pv.to_str()? })
                }
                _ => None,
            })
    }
}

/// `prefix` followed by the lowercase hex SHA-256 of `data`: how the
/// kubelet names a CSI handle's dir, an inline volume's handle (`csi-…`)
/// and a VolumeAttachment (`csi-…`).
pub fn sha256_hex(prefix: &str, data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let digest = Sha256::digest(data);
    digest.iter().fold(String::from(prefix), |mut s, b| {
        // writing to a String cannot fail
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use super::path::{Base, MAX_PARTS};
    use super::*;

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
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
        assert_eq!(
            l.csi_pod_vol_data(&pod, "pv"),
            PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv/vol_data.json")
        );
        assert_eq!(
            l.csi_device_vol_data("d", "h"),
            PathBuf::from("/var/lib/kubelet/plugins/kubernetes.io/csi/d/h/vol_data.json")
        );
        assert_eq!(
            l.pod_device_map_path(&pod, PluginName::LocalVolume, "pv-raw"),
            PathBuf::from(
                "/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~local-volume/pv-raw"
            )
        );
        assert_eq!(
            l.local_block_pod_map("pv-raw", &pod),
            PathBuf::from(
                "/var/lib/kubelet/plugins/kubernetes.io~local-volume/volumeDevices/pv-raw/u1"
            )
        );
        let csi_block = "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices";
        let table = [
            (l.csi_block_staging_path("pv-raw"), "staging/pv-raw"),
            (l.csi_block_publish_dir("pv-raw"), "publish/pv-raw"),
            (
                l.csi_block_publish_path("pv-raw", &pod),
                "publish/pv-raw/u1",
            ),
            (l.csi_block_volume_dir("pv-raw"), "pv-raw"),
            (l.csi_block_map_dir("pv-raw"), "pv-raw/dev"),
            (l.csi_block_pod_map("pv-raw", &pod), "pv-raw/dev/u1"),
            (l.csi_block_data_dir("pv-raw"), "pv-raw/data"),
            (l.csi_block_vol_data("pv-raw"), "pv-raw/data/vol_data.json"),
        ];
        for (built, rel) in table {
            assert_eq!(built, Path::new(csi_block).join(rel));
        }
        let staging = l.csi_block_staging_path("pv-raw");
        assert_eq!(
            Layout::csi_block_pod_map_beside(&staging, "pv-raw", &pod),
            Some(l.csi_block_pod_map("pv-raw", &pod))
        );
        assert_eq!(
            Layout::csi_block_pod_map_beside(&staging, "other", &pod),
            None
        );
        let globalmount = l.csi_device_path("d", "h");
        assert_eq!(
            Layout::csi_block_pod_map_beside(&globalmount, "h", &pod),
            None
        );
        assert_eq!(
            l.pod_volume_devices_dir(&pod),
            PathBuf::from("/var/lib/kubelet/pods/u1/volumeDevices")
        );
        assert_eq!(
            l.pod_device_map_path(&pod, PluginName::Csi, "pv-raw"),
            PathBuf::from("/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~csi/pv-raw")
        );
        assert_eq!(
            Layout::csi_handle_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    /// Every path a builder makes, and the value it parses back to.
    fn built<'h>(l: &Layout, pod: &PodUid, hash: &'h str) -> Vec<(PathBuf, KubeletPath<'h>)> {
        let p = PodName("u-1");
        assert_eq!(PodName::from(pod), p);
        let mut out = Vec::new();
        for plugin in PluginName::ALL {
            out.push((
                l.pod_volume_dir(pod, plugin, "vol"),
                KubeletPath::PodVolume {
                    pod: p,
                    plugin,
                    spec_name: "vol",
                },
            ));
            if plugin != PluginName::Csi {
                assert_eq!(
                    l.pod_target_path(pod, plugin, "vol"),
                    l.pod_volume_dir(pod, plugin, "vol")
                );
            }
        }
        out.extend([
            (
                l.pod_target_path(pod, PluginName::Csi, "pv"),
                KubeletPath::CsiPodMount {
                    pod: p,
                    spec_name: "pv",
                },
            ),
            (
                l.csi_pod_vol_data(pod, "pv"),
                KubeletPath::CsiPodVolData {
                    pod: p,
                    spec_name: "pv",
                },
            ),
            (
                l.pod_volumes_dir(pod).join("kubernetes.io~nfs").join("tok"),
                KubeletPath::UnknownPodVolume {
                    pod: p,
                    plugin_dir: "kubernetes.io~nfs",
                    name: OsStr::new("tok"),
                },
            ),
            (
                l.empty_dir_ready_marker(pod, "cache"),
                KubeletPath::EmptyDirReady {
                    pod: p,
                    spec_name: "cache",
                },
            ),
            (
                l.local_device_path("pv-local"),
                KubeletPath::LocalDevice { pv: "pv-local" },
            ),
            (
                l.pod_device_map_path(pod, PluginName::LocalVolume, "pv-raw"),
                KubeletPath::PodDeviceMap {
                    pod: p,
                    plugin: PluginName::LocalVolume,
                    spec_name: "pv-raw",
                },
            ),
            (
                l.pod_device_map_path(pod, PluginName::Csi, "pv-raw"),
                KubeletPath::PodDeviceMap {
                    pod: p,
                    plugin: PluginName::Csi,
                    spec_name: "pv-raw",
                },
            ),
            (
                l.local_block_map_dir("pv-raw"),
                KubeletPath::LocalBlockMap { pv: "pv-raw" },
            ),
            (
                l.local_block_pod_map("pv-raw", pod),
                KubeletPath::LocalBlockPodMap {
                    pv: "pv-raw",
                    pod: p,
                },
            ),
            (
                l.csi_block_staging_path("pv-raw"),
                KubeletPath::CsiBlockStaging {
                    spec_name: "pv-raw",
                },
            ),
            (
                l.csi_block_publish_path("pv-raw", pod),
                KubeletPath::CsiBlockPublish {
                    spec_name: "pv-raw",
                    pod: p,
                },
            ),
            (
                l.csi_block_map_dir("pv-raw"),
                KubeletPath::CsiBlockMap {
                    spec_name: "pv-raw",
                },
            ),
            (
                l.csi_block_pod_map("pv-raw", pod),
                KubeletPath::CsiBlockPodMap {
                    spec_name: "pv-raw",
                    pod: p,
                },
            ),
            (
                l.csi_block_vol_data("pv-raw"),
                KubeletPath::CsiBlockVolData {
                    spec_name: "pv-raw",
                },
            ),
            (
                l.csi_device_path("d.example.com", hash),
                KubeletPath::CsiGlobalMount {
                    driver: "d.example.com",
                    hash,
                },
            ),
            (
                l.csi_device_vol_data("d.example.com", hash),
                KubeletPath::CsiDeviceVolData {
                    driver: "d.example.com",
                    hash,
                },
            ),
        ]);
        out
    }

    #[test]
    fn every_built_path_parses_back_to_what_built_it() {
        for root in ["/var/lib/kubelet", "/", "/k//x/", "relative/root"] {
            let l = Layout::new(root);
            let pod = uid("u-1");
            let hash = Layout::csi_handle_hash("handle-1");
            for (path, want) in built(&l, &pod, &hash) {
                assert_eq!(l.parse(&path), Ok(want), "{root}: {}", path.display());
                assert_eq!(l.path_of(&want), path, "{root}");
                let area = match want {
                    KubeletPath::EmptyDirReady { .. } => Area::PodPlugins,
                    KubeletPath::PodDeviceMap { .. } => Area::PodDevices,
                    KubeletPath::LocalBlockMap { .. } | KubeletPath::LocalBlockPodMap { .. } => {
                        Area::BlockMaps
                    }
                    KubeletPath::LocalDevice { .. }
                    | KubeletPath::CsiGlobalMount { .. }
                    | KubeletPath::CsiDeviceVolData { .. }
                    | KubeletPath::CsiBlockStaging { .. }
                    | KubeletPath::CsiBlockPublish { .. }
                    | KubeletPath::CsiBlockMap { .. }
                    | KubeletPath::CsiBlockPodMap { .. }
                    | KubeletPath::CsiBlockVolData { .. } => Area::Devices,
                    _ => Area::PodVolumes,
                };
                assert_eq!(l.parse_in(area, &path), Ok(want));
                let areas = [
                    Area::PodVolumes,
                    Area::PodPlugins,
                    Area::Devices,
                    Area::PodDevices,
                    Area::BlockMaps,
                ];
                for other in areas {
                    if other != area {
                        assert_eq!(l.parse_in(other, &path), Err(LayoutError::Elsewhere));
                    }
                }
                // a device target's tail parses alone, and a local PV's
                // global map dir; the CSI block paths seven names deep from
                // `plugins` are no device target
                let deep = matches!(
                    want,
                    KubeletPath::CsiBlockPublish { .. }
                        | KubeletPath::CsiBlockPodMap { .. }
                        | KubeletPath::CsiBlockVolData { .. }
                );
                let tail = Layout::device_of(&path);
                let device = (area == Area::Devices && !deep)
                    || matches!(want, KubeletPath::LocalBlockMap { .. });
                assert_eq!(tail, device.then_some(want));
            }
        }
    }

    #[test]
    fn malformed_and_hostile_paths_do_not_parse() {
        use LayoutError::*;
        let l = Layout::new("/k");
        let table: &[(&str, LayoutError)] = &[
            (
                "/elsewhere/pods/u/volumes/kubernetes.io~empty-dir/v",
                Outside,
            ),
            ("/kx/pods/u/volumes/kubernetes.io~empty-dir/v", Outside),
            ("/k/pods/u/volumes/kubernetes.io~empty-dir/../v", Outside),
            (
                "/k/pods/../pods/u/volumes/kubernetes.io~empty-dir/v",
                Outside,
            ),
            ("/k/pods/u/volumes/kubernetes.io~empty-dir/..", Outside),
            (
                "/k/plugins/kubernetes.io/../kubernetes.io/local-volume/mounts/pv",
                Outside,
            ),
            ("/k", Elsewhere),
            ("/k/pods", Elsewhere),
            ("/k/pods/u", Elsewhere),
            ("/k/pods/u/etc-hosts", Elsewhere),
            ("/k/pods/u/volume-subpaths/v/c/0", Elsewhere),
            ("/k/plugins", Elsewhere),
            ("/k/plugins/other.io/x", Elsewhere),
            ("/k/plugins_registry/x", Elsewhere),
            (
                "/k/pods/bad uid/volumes/kubernetes.io~empty-dir/v",
                InvalidPodUid(PodUid::new("bad uid").unwrap_err()),
            ),
            ("/k/pods/u/volumes", Unrecognised),
            ("/k/pods/u/volumes/kubernetes.io~empty-dir", Unrecognised),
            (
                "/k/pods/u/volumes/kubernetes.io~empty-dir/v/extra",
                Unrecognised,
            ),
            ("/k/pods/u/volumes/kubernetes.io~csi/v/other", Unrecognised),
            (
                "/k/pods/u/volumes/kubernetes.io~csi/v/mount/extra",
                Unrecognised,
            ),
            (
                "/k/pods/u/volumes/kubernetes.io~empty-dir/v/mount",
                Unrecognised,
            ),
            ("/k/pods/u/volumes/kubernetes.io~nfs/v/extra", Unrecognised),
            ("/k/pods/u/plugins/kubernetes.io~empty-dir/v", Unrecognised),
            (
                "/k/pods/u/plugins/kubernetes.io~empty-dir/v/other",
                Unrecognised,
            ),
            ("/k/pods/u/plugins/kubernetes.io~csi/v/ready", Unrecognised),
            ("/k/plugins/kubernetes.io/csi/d/h", Unrecognised),
            (
                "/k/plugins/kubernetes.io/csi/d/h/globalmount/x",
                Unrecognised,
            ),
            ("/k/plugins/kubernetes.io/local-volume/mounts", Unrecognised),
            (
                "/k/pods/u/volumeDevices/kubernetes.io~local-volume",
                Unrecognised,
            ),
            ("/k/pods/u/volumeDevices/kubernetes.io~nfs/v", Unrecognised),
            (
                "/k/pods/u/volumeDevices/kubernetes.io~csi/v/extra",
                Unrecognised,
            ),
            ("/k/pods/u/volumeDevices/kubernetes.io~csi/../../x", Outside),
            (
                "/k/plugins/kubernetes.io~local-volume/volumeDevices",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io~local-volume/volumeDevices/pv/u/x",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io~local-volume/volumeDevices/pv/bad uid",
                InvalidPodUid(PodUid::new("bad uid").unwrap_err()),
            ),
            ("/k/plugins/kubernetes.io~local-volume/mounts/pv", Elsewhere),
            (
                "/k/plugins/kubernetes.io/local-volume/other/pv",
                Unrecognised,
            ),
            ("/k/plugins/kubernetes.io/empty-dir/mounts/pv", Unrecognised),
            ("/k/plugins/kubernetes.io/csi/a/b/c/d/e/f/g", Unrecognised),
            ("/k/plugins/kubernetes.io/csi/volumeDevices", Unrecognised),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/pv",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/staging",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/staging/pv/x",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv/bad uid",
                InvalidPodUid(PodUid::new("bad uid").unwrap_err()),
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/pv/dev/bad uid",
                InvalidPodUid(PodUid::new("bad uid").unwrap_err()),
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/pv/dev/u/x",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/pv/data",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/pv/data/other",
                Unrecognised,
            ),
            (
                "/k/plugins/kubernetes.io/csi/volumeDevices/h/globalmount",
                Unrecognised,
            ),
        ];
        for (path, want) in table {
            assert_eq!(l.parse(Path::new(path)).as_ref(), Err(want), "{path}");
        }
        let bad = |s: &str| {
            let mut b = s.as_bytes().to_vec();
            b.extend_from_slice(b"\xff");
            PathBuf::from(OsStr::from_bytes(&b))
        };
        for path in [
            bad("/k/pods/u").join("volumes/kubernetes.io~empty-dir/v"),
            bad("/k/pods/u/volumes/kubernetes.io~empty-dir/v"),
            bad("/k/pods/u/volumes/kubernetes.io~csi/v").join("mount"),
            bad("/k/pods/u/volumes/kubernetes.io~empty-dir").join("v"),
            bad("/k/pods/u/plugins/kubernetes.io~empty-dir/v").join("ready"),
            bad("/k/plugins/kubernetes.io/local-volume/mounts/pv"),
            bad("/k/plugins/kubernetes.io/csi/d/h/globalmount/a/b/c"),
            bad("/k/plugins/kubernetes.io/x").join("y"),
        ] {
            assert_eq!(l.parse(&path), Err(NonUtf8), "{}", path.display());
        }
        // an unknown plugin's volume name may be any bytes
        let odd = bad("/k/pods/u/volumes/kubernetes.io~nfs/v");
        assert!(matches!(
            l.parse(&odd),
            Ok(KubeletPath::UnknownPodVolume { .. })
        ));
        for tail in [
            "/x/plugins/kubernetes.io/csi/d/h/other",
            "plugins/kubernetes.io/csi/d/globalmount",
            "/kubernetes.io/csi/d/h/globalmount",
            "/x/plugins/kubernetes.io/csi/d/../h/globalmount",
            "/x/plugins/kubernetes.io~local-volume/volumeDevices/pv/uid",
            "/x/plugins/kubernetes.io~local-volume/mounts/pv",
            "/x/plugins/kubernetes.io/local-volume/volumeDevices/pv",
        ] {
            assert_eq!(Layout::device_of(Path::new(tail)), None, "{tail}");
        }
    }

    #[test]
    fn paths_split_as_bytes_as_by_components() {
        for root in ["/k", "/k/", "/k//x", "/", "k", "/k/./x", "/k/pods"] {
            let base = Path::new(root);
            for path in [
                "/k/pods/u/volumes/p~n/x",
                "/k/pods/u//volumes/./p/x/",
                "/k/pods/u/../x",
                "/k/x/pods",
                "/k/pods",
                "/k/pods/",
                "/k/podsx/u",
                "/kx/pods/u",
                "/k/pods/1/2/3/4/5/6/7/8",
                "/k/pods/u/.hidden/x.",
                "/k/plugins/kubernetes.io",
                "/k/plugins/kubernetes.io/csi/d/h/globalmount",
                "/k/plugins//kubernetes.io/csi",
                "/k/plugins/kubernetes.io/a/b/c/d/e/f/g",
                "/k/pods/pods/x",
            ] {
                let p = Path::new(path);
                let fast = RelParts::of(p, base, is_plain(base));
                let slow = RelParts::of(p, base, false);
                let view = |r: Option<(Base, RelParts<'_>)>| {
                    r.map(|(b, parts)| {
                        let names: Vec<String> = (0..MAX_PARTS)
                            .filter_map(|i| parts.get(i))
                            .map(|n| n.to_string_lossy().into_owned())
                            .collect();
                        (b.names(), parts.len, names)
                    })
                };
                assert_eq!(view(fast), view(slow), "{root} {path}");
            }
        }
    }
}
