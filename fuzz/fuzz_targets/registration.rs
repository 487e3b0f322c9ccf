//! A registration socket's `GetInfo` answer (`csi::discovery::check_info`)
//! as protobuf bytes. Beyond "no panic": an accepted registration names a
//! CSIPlugin speaking CSI 1.x, an absolute endpoint, and a driver name that
//! is one path component: its globalmount lies under the root and parses
//! back to it.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use volumed::csi::discovery::{CSI_PLUGIN_TYPE, check_info, speaks_v1};
use volumed::csi::proto::pluginregistration::PluginInfo;
use volumed::model::{KubeletPath, Layout};

fuzz_target!(|data: &[u8]| {
    let Ok(info) = PluginInfo::decode(data) else {
        return;
    };
    let socket = Path::new("/var/lib/kubelet/plugins_registry/d-reg.sock");
    let Ok(reg) = check_info(&info, socket) else {
        return;
    };
    assert_eq!(info.r#type, CSI_PLUGIN_TYPE);
    assert!(speaks_v1(&info.supported_versions));
    assert!(reg.endpoint.is_absolute(), "{:?}", reg.endpoint);
    let layout = Layout::new("/var/lib/kubelet");
    let hash = Layout::csi_handle_hash("handle");
    let dev = layout.csi_device_path(&reg.name, &hash);
    assert_eq!(
        layout.parse(&dev),
        Ok(KubeletPath::CsiGlobalMount {
            driver: &reg.name,
            hash: &hash
        })
    );
});
