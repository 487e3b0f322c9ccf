//! The kubelet's on-disk names (`model::layout`: pod-dir paths, pod UIDs,
//! escaped plugin names) on arbitrary bytes, as a path below the root and
//! as given. Beyond "no panic": a path that parses is below the root, and
//! `Layout::path_of` builds a path that parses back to the same value; a
//! pod UID that is accepted is one path component; a plugin name accepted
//! as escaped is the plugin's name with every `~` read as `/`.
#![no_main]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use volumed::model::{Area, Layout, PluginName, PodUid, check_component};

fuzz_target!(|data: &[u8]| {
    let layout = Layout::new("/var/lib/kubelet");
    let below = layout.root().join(OsStr::from_bytes(data));
    for path in [Path::new(OsStr::from_bytes(data)), below.as_path()] {
        if let Ok(kp) = layout.parse(path) {
            let built = layout.path_of(&kp);
            assert!(built.starts_with(layout.root()), "{built:?}");
            assert_eq!(layout.parse(&built), Ok(kp), "{path:?} -> {built:?}");
        }
        for area in [Area::PodVolumes, Area::PodPlugins, Area::Devices] {
            if let Ok(kp) = layout.parse_in(area, path) {
                assert_eq!(layout.parse(path), Ok(kp));
            }
        }
        if let Some(kp) = Layout::device_of(path) {
            let built = layout.path_of(&kp);
            assert_eq!(layout.parse(&built), Ok(kp), "{path:?} -> {built:?}");
        }
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(uid) = PodUid::new(s) {
            assert!(check_component("pod uid", uid.as_str()).is_ok());
            let dir = layout.pod_dir(&uid);
            assert_eq!(dir.parent(), Some(layout.pods_dir().as_path()));
        }
        // as the kubelet's unescaping: every `~` read as `/` (so the name
        // itself, slashes and all, is accepted too)
        if let Some(p) = PluginName::from_escaped(s) {
            assert_eq!(p.as_str(), s.replace('~', "/"));
        }
    }
});
