//! A static Pod manifest (YAML or JSON, `sources::static_pods::parse_pod`,
//! through `sources::read::parse_documents`) on arbitrary bytes. Beyond
//! "no panic": a pod that parses has a UID and volume names that are single
//! path components — every target path built from them lies in the pod's
//! own dir under the root and parses back to the same pod and volume — and
//! a hostPath is absolute with no `..`.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;
use volumed::model::{KubeletPath, Layout, PluginName, VolumeSpec};
use volumed::sources::static_pods::{ParsedVolume, parse_pod};

fuzz_target!(|data: &[u8]| {
    let file = Path::new("/etc/kubernetes/manifests/pod.yaml");
    let Ok(pod) = parse_pod(file, data, "node-1") else {
        return;
    };
    let layout = Layout::new("/var/lib/kubelet");
    let pod_dir = layout.pod_dir(&pod.uid);
    assert_eq!(pod_dir.parent(), Some(layout.pods_dir().as_path()));
    for v in &pod.volumes {
        let (name, plugin) = match v {
            ParsedVolume::Inline { name, spec } => {
                let plugin = match spec {
                    VolumeSpec::EmptyDir { .. } => PluginName::EmptyDir,
                    VolumeSpec::HostPath { path, .. } => {
                        let path: &Path = path.as_ref();
                        assert!(path.is_absolute(), "{path:?}");
                        assert!(
                            !path.components().any(|c| c == Component::ParentDir),
                            "{path:?}"
                        );
                        PluginName::HostPath
                    }
                    VolumeSpec::Local { .. } => PluginName::LocalVolume,
                    VolumeSpec::Csi(_) => PluginName::Csi,
                    // (item paths are checked when the payload is built)
                    VolumeSpec::Payload(p) => p.kind.plugin(),
                };
                (name, plugin)
            }
            ParsedVolume::Claim { name, .. } => (name, PluginName::LocalVolume),
        };
        let target = layout.pod_target_path(&pod.uid, plugin, name);
        assert!(target.starts_with(&pod_dir), "{target:?}");
        let dir = layout.pod_volume_dir(&pod.uid, plugin, name);
        match layout.parse(&dir) {
            Ok(KubeletPath::PodVolume {
                pod: p,
                plugin: pl,
                spec_name,
            }) => {
                assert_eq!(
                    (p.as_str(), pl, spec_name),
                    (pod.uid.as_str(), plugin, name.as_str())
                );
            }
            other => panic!("{dir:?} parses as {other:?}"),
        }
    }
});
