//! The kubelet's on-disk layout under the root dir.

use std::path::{Path, PathBuf};

use super::{PluginName, PodUid};

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
