//! A file of the static objects dir (PVs, PVCs, CSIDrivers,
//! VolumeAttachments, Secrets, `*List`s of them; YAML or JSON) on arbitrary
//! bytes. Beyond "no panic": every object name that becomes a path names a
//! path under the root that parses back to it (a local PV's device target,
//! a CSI PV's globalmount), and a local PV's path is absolute.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use volumed::model::{KubeletPath, Layout, VolumeSpec};
use volumed::sources::static_objects::StaticObjects;

fuzz_target!(|data: &[u8]| {
    let mut objects = StaticObjects::default();
    let mut errors = Vec::new();
    objects.add_file(Path::new("/etc/volumed/objects/o.yaml"), data, &mut errors);
    let layout = Layout::new("/var/lib/kubelet");
    for (name, pv) in &objects.pvs {
        let Ok(spec) = &pv.spec else { continue };
        match &**spec {
            VolumeSpec::Local { path, .. } => {
                let path: &Path = path.as_ref();
                assert!(path.is_absolute(), "{path:?}");
                let dev = layout.local_device_path(name);
                assert_eq!(
                    layout.parse(&dev),
                    Ok(KubeletPath::LocalDevice { pv: name })
                );
            }
            VolumeSpec::Csi(c) => {
                let hash = Layout::csi_handle_hash(&c.volume_handle);
                let dev = layout.csi_device_path(&c.driver, &hash);
                assert_eq!(
                    layout.parse(&dev),
                    Ok(KubeletPath::CsiGlobalMount {
                        driver: &c.driver,
                        hash: &hash
                    })
                );
            }
            _ => {}
        }
    }
    for driver in objects.csi_drivers.keys() {
        let hash = Layout::csi_handle_hash("h");
        let dev = layout.csi_device_path(driver, &hash);
        assert!(
            matches!(layout.parse(&dev), Ok(KubeletPath::CsiGlobalMount { .. })),
            "{dev:?}"
        );
    }
});
