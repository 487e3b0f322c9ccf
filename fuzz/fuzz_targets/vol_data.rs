//! A CSI `vol_data.json` (`host::pod_dirs::VolData`) on arbitrary bytes.
//! Beyond "no panic": the CSI arguments it gives name a driver that is one
//! path component, so the globalmount built from them lies under the root
//! and parses back to that driver and handle hash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use volumed::host::pod_dirs::VolData;
use volumed::model::{KubeletPath, Layout};

fuzz_target!(|data: &[u8]| {
    let Ok(vd) = VolData::parse(data) else { return };
    let Ok(params) = vd.csi_params() else { return };
    assert!(!params.volume_handle.is_empty());
    let layout = Layout::new("/var/lib/kubelet");
    let hash = Layout::csi_handle_hash(&params.volume_handle);
    let dev = layout.csi_device_path(&params.driver, &hash);
    assert_eq!(
        layout.parse(&dev),
        Ok(KubeletPath::CsiGlobalMount {
            driver: &params.driver,
            hash: &hash
        })
    );
});
