//! The answers volumed reads from a CSI driver (`csi::client`): the first
//! byte picks the message, the rest is its protobuf encoding. Beyond "no
//! panic": a message that decodes re-encodes to one that decodes equal, and
//! what volumed takes from it agrees with the message (a capability is
//! offered only if listed; usage comes from a listed unit).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use volumed::csi::NodeCaps;
use volumed::csi::client::{VolumeStats, plugin_services};
use volumed::csi::proto::csi_v1 as pb;

/// Decodes `bytes` as `M`; a message that decodes must round-trip.
fn decoded<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Option<M> {
    let m = M::decode(bytes).ok()?;
    let again = M::decode(m.encode_to_vec().as_slice()).expect("re-encoded message decodes");
    assert_eq!(again, m);
    Some(m)
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => {
            if let Some(r) = decoded::<pb::NodeGetCapabilitiesResponse>(bytes) {
                let caps = NodeCaps::of(&r);
                let listed = |t: pb::node_service_capability::rpc::Type| {
                    r.capabilities.iter().any(|c| {
                        matches!(&c.r#type, Some(pb::node_service_capability::Type::Rpc(rpc)) if rpc.r#type == t as i32)
                    })
                };
                use pb::node_service_capability::rpc::Type;
                assert_eq!(caps.stage_unstage, listed(Type::StageUnstageVolume));
                assert_eq!(caps.volume_stats, listed(Type::GetVolumeStats));
                assert_eq!(caps.volume_condition, listed(Type::VolumeCondition));
                assert_eq!(
                    caps.single_node_multi_writer,
                    listed(Type::SingleNodeMultiWriter)
                );
                assert_eq!(caps.volume_mount_group, listed(Type::VolumeMountGroup));
            }
        }
        1 => {
            if let Some(r) = decoded::<pb::NodeGetVolumeStatsResponse>(bytes) {
                let units: Vec<i32> = r.usage.iter().map(|u| u.unit).collect();
                let has_condition = r.volume_condition.is_some();
                let stats = VolumeStats::of(r);
                assert_eq!(
                    stats.bytes.is_some(),
                    units.contains(&(pb::volume_usage::Unit::Bytes as i32))
                );
                assert_eq!(
                    stats.inodes.is_some(),
                    units.contains(&(pb::volume_usage::Unit::Inodes as i32))
                );
                assert_eq!(stats.condition.is_some(), has_condition);
            }
        }
        2 => {
            if let Some(r) = decoded::<pb::GetPluginCapabilitiesResponse>(bytes) {
                let services = plugin_services(&r);
                assert!(services.len() <= r.capabilities.len());
            }
        }
        3 => {
            let _ = decoded::<pb::GetPluginInfoResponse>(bytes);
        }
        4 => {
            let _ = decoded::<pb::ProbeResponse>(bytes);
        }
        _ => {
            let _ = decoded::<pb::NodeGetInfoResponse>(bytes);
        }
    }
});
