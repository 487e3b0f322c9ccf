//! The one place volumed calls a CSI driver: a typed client over the
//! generated `csi.v1` stubs, with the kubelet's timeout, its rule for which
//! gRPC statuses are final, and `csi_operations_seconds` around every call.
//!
//! *Invariant:* requests carry secrets; nothing here formats a request, and
//! an error carries only the method, the status code and the driver's
//! message.

use std::collections::BTreeMap;

use crate::util::chain::error_chain;
use std::time::{Duration, Instant};

use prometheus::HistogramVec;
use tonic::Code;
use tonic::transport::Channel;

use super::proto::csi_v1 as pb;
use super::proto::csi_v1::identity_client::IdentityClient;
use super::proto::csi_v1::node_client::NodeClient;
use crate::model::AccessMode;

/// The kubelet's timeout for every node RPC (`csiTimeout`, two minutes).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// A failed CSI call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{method} on driver {driver}: {code:?}: {message}")]
pub struct CsiError {
    /// the driver
    pub driver: String,
    /// the RPC, e.g. `NodeStageVolume`
    pub method: &'static str,
    /// the gRPC status
    pub code: Code,
    /// the driver's message (never a request's content)
    pub message: String,
}

impl CsiError {
    /// Whether the driver may still be working on the call, or may have
    /// done it: the kubelet's non-final statuses (`isFinalError`) — a
    /// timeout, Unavailable, Canceled, ResourceExhausted, Aborted. Anything
    /// else means the call did nothing, and the state before it holds.
    pub fn is_final(&self) -> bool {
        is_final(self.code)
    }

    /// Whether a NodeExpandVolume failure says the size can never be
    /// reached: INVALID_ARGUMENT or OUT_OF_RANGE (the CSI spec's
    /// "unsupported capacity").
    pub fn size_out_of_reach(&self) -> bool {
        matches!(self.code, Code::InvalidArgument | Code::OutOfRange)
    }
}

/// The kubelet's `isFinalError`, by status code.
pub fn is_final(code: Code) -> bool {
    !matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// What a driver's node service offers (`NodeGetCapabilities`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCaps {
    /// `STAGE_UNSTAGE_VOLUME`: volumes are staged before they are published
    pub stage_unstage: bool,
    /// `GET_VOLUME_STATS`
    pub volume_stats: bool,
    /// `VOLUME_CONDITION`
    pub volume_condition: bool,
    /// `SINGLE_NODE_MULTI_WRITER`: the v1.5 access modes
    pub single_node_multi_writer: bool,
    /// `VOLUME_MOUNT_GROUP`: the driver applies the fsGroup itself
    pub volume_mount_group: bool,
    /// `EXPAND_VOLUME`: the driver grows a volume's filesystem on the node
    /// (NodeExpandVolume)
    pub expand_volume: bool,
}

impl NodeCaps {
    /// What a `NodeGetCapabilities` answer offers; capabilities this build
    /// does not know are ignored.
    pub fn of(resp: &pb::NodeGetCapabilitiesResponse) -> Self {
        use pb::node_service_capability::rpc::Type;
        let mut caps = NodeCaps::default();
        for c in &resp.capabilities {
            let Some(pb::node_service_capability::Type::Rpc(rpc)) = &c.r#type else {
                continue;
            };
            match Type::try_from(rpc.r#type) {
                Ok(Type::StageUnstageVolume) => caps.stage_unstage = true,
                Ok(Type::GetVolumeStats) => caps.volume_stats = true,
                Ok(Type::VolumeCondition) => caps.volume_condition = true,
                Ok(Type::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                Ok(Type::VolumeMountGroup) => caps.volume_mount_group = true,
                Ok(Type::ExpandVolume) => caps.expand_volume = true,
                // UNKNOWN and values newer than this build
                _ => {}
            }
        }
        caps
    }
}

/// The CSI access mode the kubelet sends for a PV's first access mode
/// (`ReadWriteOnce` when it has none), depending on whether the driver
/// knows the v1.5 single-node modes.
pub fn access_mode(
    modes: &[AccessMode],
    caps: NodeCaps,
) -> pb::volume_capability::access_mode::Mode {
    use pb::volume_capability::access_mode::Mode;
    match (
        modes.first().copied().unwrap_or(AccessMode::ReadWriteOnce),
        caps.single_node_multi_writer,
    ) {
        (AccessMode::ReadWriteOnce, true) => Mode::SingleNodeMultiWriter,
        (AccessMode::ReadWriteOncePod, true) => Mode::SingleNodeSingleWriter,
        (AccessMode::ReadWriteOnce | AccessMode::ReadWriteOncePod, false) => Mode::SingleNodeWriter,
        (AccessMode::ReadOnlyMany, _) => Mode::MultiNodeReaderOnly,
        (AccessMode::ReadWriteMany, _) => Mode::MultiNodeMultiWriter,
    }
}

/// A mount volume capability.
pub fn mount_capability(
    fs_type: Option<&str>,
    mount_flags: &[String],
    mount_group: Option<&str>,
    mode: pb::volume_capability::access_mode::Mode,
) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_type: Some(pb::volume_capability::AccessType::Mount(
            pb::volume_capability::MountVolume {
                fs_type: fs_type.unwrap_or_default().to_owned(),
                mount_flags: mount_flags.to_vec(),
                volume_mount_group: mount_group.unwrap_or_default().to_owned(),
            },
        )),
        access_mode: Some(pb::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

/// A block volume capability (`volumeMode: Block`).
pub fn block_capability(mode: pb::volume_capability::access_mode::Mode) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_type: Some(pb::volume_capability::AccessType::Block(
            pb::volume_capability::BlockVolume {},
        )),
        access_mode: Some(pb::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

/// What a NodeExpandVolume call is given, as the kubelet fills it: the
/// volume path (the pod's publish dir for a filesystem volume, the
/// device path for a block one), the staging path only when the driver
/// stages, `capacity_range.required_bytes` the PV's new capacity and the
/// volume's capability (its `fsType` and the PV's `mountOptions`, or
/// `block`), with the PV's first access mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandArgs<'a> {
    /// the volume handle
    pub volume_id: &'a str,
    /// `volume_path`
    pub volume_path: &'a str,
    /// `staging_target_path`, for a driver with `STAGE_UNSTAGE_VOLUME`
    pub staging_path: Option<&'a str>,
    /// `capacity_range.required_bytes`
    pub required_bytes: u64,
    /// the capability sent
    pub capability: pb::VolumeCapability,
    /// the `nodeExpandSecretRef`'s data (empty without one)
    pub secrets: std::collections::BTreeMap<String, String>,
}

/// The NodeExpandVolume request of `args`.
pub fn expand_request(args: &ExpandArgs<'_>) -> pb::NodeExpandVolumeRequest {
    pb::NodeExpandVolumeRequest {
        volume_id: args.volume_id.to_owned(),
        volume_path: args.volume_path.to_owned(),
        capacity_range: Some(pb::CapacityRange {
            // a size above i64::MAX cannot be asked for: the wire type is
            // signed (a quantity parses to at most i64::MAX anyway)
            required_bytes: i64::try_from(args.required_bytes).unwrap_or(i64::MAX),
            limit_bytes: 0,
        }),
        staging_target_path: args.staging_path.unwrap_or_default().to_owned(),
        volume_capability: Some(args.capability.clone()),
        secrets: args.secrets.clone().into_iter().collect(),
    }
}

/// Usage of one volume (`NodeGetVolumeStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeStats {
    /// bytes: (available, total, used)
    pub bytes: Option<(i64, i64, i64)>,
    /// inodes: (free, total, used)
    pub inodes: Option<(i64, i64, i64)>,
    /// `volume_condition`: (abnormal, message)
    pub condition: Option<(bool, String)>,
}

/// A client of one driver's Identity and Node services.
#[derive(Debug, Clone)]
pub struct CsiClient {
    driver: String,
    channel: Channel,
    timeout: Duration,
    seconds: Option<HistogramVec>,
}

impl CsiClient {
    /// A client on `channel` (see [`super::connect_unix`]); `seconds` is
    /// `csi_operations_seconds`, when metrics are kept.
    pub fn new(
        driver: impl Into<String>,
        channel: Channel,
        timeout: Duration,
        seconds: Option<HistogramVec>,
    ) -> Self {
        Self {
            driver: driver.into(),
            channel,
            timeout,
            seconds,
        }
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.timeout);
        r
    }

    async fn timed<T>(
        &self,
        method: &'static str,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CsiError> {
        let start = Instant::now();
        // The client-side deadline as well: a driver that never answers must
        // not hold a worker past the timeout.
        let res = match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(
                "no answer within the timeout",
            )),
        };
        let res = res.map_err(as_grpc_go_reports);
        let code = match &res {
            Ok(_) => Code::Ok,
            Err(s) => s.code(),
        };
        if let Some(h) = &self.seconds {
            h.with_label_values(&[self.driver.as_str(), method, code_label(code), "false"])
                .observe(start.elapsed().as_secs_f64());
        }
        res.map(tonic::Response::into_inner).map_err(|s| CsiError {
            driver: self.driver.clone(),
            method,
            code: s.code(),
            message: s.message().to_owned(),
        })
    }

    /// `GetPluginInfo`: the driver's name and version.
    pub async fn plugin_info(&self) -> Result<(String, String), CsiError> {
        let mut c = IdentityClient::new(self.channel.clone());
        let r = self
            .timed(
                "/csi.v1.Identity/GetPluginInfo",
                c.get_plugin_info(self.request(pb::GetPluginInfoRequest {})),
            )
            .await?;
        Ok((r.name, r.vendor_version))
    }

    /// `GetPluginCapabilities`: the plugin services the driver offers
    /// (`CONTROLLER_SERVICE`, …; values newer than this build by number).
    pub async fn plugin_capabilities(&self) -> Result<Vec<String>, CsiError> {
        let mut c = IdentityClient::new(self.channel.clone());
        let r = self
            .timed(
                "/csi.v1.Identity/GetPluginCapabilities",
                c.get_plugin_capabilities(self.request(pb::GetPluginCapabilitiesRequest {})),
            )
            .await?;
        Ok(plugin_services(&r))
    }

    /// `Probe`: whether the driver is ready (an unset answer means ready).
    pub async fn probe(&self) -> Result<bool, CsiError> {
        let mut c = IdentityClient::new(self.channel.clone());
        let r = self
            .timed(
                "/csi.v1.Identity/Probe",
                c.probe(self.request(pb::ProbeRequest {})),
            )
            .await?;
        Ok(r.ready.unwrap_or(true))
    }

    /// `NodeGetInfo`: the driver's id for this node.
    pub async fn node_info(&self) -> Result<String, CsiError> {
        let mut c = NodeClient::new(self.channel.clone());
        let r = self
            .timed(
                "/csi.v1.Node/NodeGetInfo",
                c.node_get_info(self.request(pb::NodeGetInfoRequest {})),
            )
            .await?;
        Ok(r.node_id)
    }

    /// `NodeGetCapabilities`.
    pub async fn node_caps(&self) -> Result<NodeCaps, CsiError> {
        let mut c = NodeClient::new(self.channel.clone());
        let r = self
            .timed(
                "/csi.v1.Node/NodeGetCapabilities",
                c.node_get_capabilities(self.request(pb::NodeGetCapabilitiesRequest {})),
            )
            .await?;
        Ok(NodeCaps::of(&r))
    }

    /// `NodeStageVolume`.
    pub async fn stage(&self, req: pb::NodeStageVolumeRequest) -> Result<(), CsiError> {
        let mut c = NodeClient::new(self.channel.clone());
        self.timed(
            "/csi.v1.Node/NodeStageVolume",
            c.node_stage_volume(self.request(req)),
        )
        .await
        .map(drop)
    }

    /// `NodeUnstageVolume`.
    pub async fn unstage(&self, volume_id: &str, staging_path: &str) -> Result<(), CsiError> {
        let mut c = NodeClient::new(self.channel.clone());
        let req = pb::NodeUnstageVolumeRequest {
            volume_id: volume_id.to_owned(),
            staging_target_path: staging_path.to_owned(),
        };
        self.timed(
            "/csi.v1.Node/NodeUnstageVolume",
            c.node_unstage_volume(self.request(req)),
        )
        .await
        .map(drop)
    }

    /// `NodePublishVolume`.
    pub async fn publish(&self, req: pb::NodePublishVolumeRequest) -> Result<(), CsiError> {
        let mut c = NodeClient::new(self.channel.clone());
        self.timed(
            "/csi.v1.Node/NodePublishVolume",
            c.node_publish_volume(self.request(req)),
        )
        .await
        .map(drop)
    }

    /// `NodeUnpublishVolume`.
    pub async fn unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), CsiError> {
        let mut c = NodeClient::new(self.channel.clone());
        let req = pb::NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_owned(),
            target_path: target_path.to_owned(),
        };
        self.timed(
            "/csi.v1.Node/NodeUnpublishVolume",
            c.node_unpublish_volume(self.request(req)),
        )
        .await
        .map(drop)
    }

    /// `NodeExpandVolume`: the capacity the driver answers, in bytes (0:
    /// it did not say; a negative answer is read as 0).
    pub async fn expand(&self, req: pb::NodeExpandVolumeRequest) -> Result<u64, CsiError> {
        let mut c = NodeClient::new(self.channel.clone());
        let r = self
            .timed(
                "/csi.v1.Node/NodeExpandVolume",
                c.node_expand_volume(self.request(req)),
            )
            .await?;
        Ok(u64::try_from(r.capacity_bytes).unwrap_or(0))
    }

    /// `NodeGetVolumeStats` of a published volume.
    pub async fn volume_stats(
        &self,
        volume_id: &str,
        volume_path: &str,
        staging_path: Option<&str>,
    ) -> Result<VolumeStats, CsiError> {
        let mut c = NodeClient::new(self.channel.clone());
        let req = pb::NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_owned(),
            volume_path: volume_path.to_owned(),
            staging_target_path: staging_path.unwrap_or_default().to_owned(),
        };
        let r = self
            .timed(
                "/csi.v1.Node/NodeGetVolumeStats",
                c.node_get_volume_stats(self.request(req)),
            )
            .await?;
        Ok(VolumeStats::of(r))
    }
}

/// The plugin services a `GetPluginCapabilities` answer names
/// (`CONTROLLER_SERVICE`, …; values newer than this build by number).
pub fn plugin_services(r: &pb::GetPluginCapabilitiesResponse) -> Vec<String> {
    use pb::plugin_capability::{Type, service};
    r.capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Service(s)) => Some(match service::Type::try_from(s.r#type) {
                Ok(t) => t.as_str_name().to_owned(),
                Err(_) => s.r#type.to_string(),
            }),
            _ => None,
        })
        .collect()
}

impl VolumeStats {
    /// What a `NodeGetVolumeStats` answer says; usage in units this build
    /// does not know is ignored, the last of a unit wins.
    pub fn of(r: pb::NodeGetVolumeStatsResponse) -> Self {
        let mut stats = VolumeStats {
            condition: r.volume_condition.map(|c| (c.abnormal, c.message)),
            ..VolumeStats::default()
        };
        for u in r.usage {
            let triple = Some((u.available, u.total, u.used));
            match pb::volume_usage::Unit::try_from(u.unit) {
                Ok(pb::volume_usage::Unit::Bytes) => stats.bytes = triple,
                Ok(pb::volume_usage::Unit::Inodes) => stats.inodes = triple,
                _ => {}
            }
        }
        stats
    }
}

/// The `grpc_status_code` label: the code's name as gRPC spells it.
/// A failed call's status as grpc-go reports it to the kubelet, whose
/// rule for final errors is written for grpc-go's codes:
///
/// - tonic reports its own expired deadline as Cancelled "Timeout
///   expired"; grpc-go says DeadlineExceeded;
/// - a call the transport lost — the connection reset or closed under
///   it, the driver killed mid-call — is Unknown "transport error" in
///   tonic, final by that rule, though the driver may have done the work
///   (a NodeStage that mounted, then died before answering: its pod gone
///   meanwhile, the mount would be leaked); grpc-go says UNAVAILABLE, not
///   final. tonic's is told apart by the local error it carries as its
///   source: an Unknown a driver answers comes off the wire with none.
fn as_grpc_go_reports(s: tonic::Status) -> tonic::Status {
    use std::error::Error as _;
    if s.code() == Code::Cancelled && s.message() == "Timeout expired" {
        return tonic::Status::deadline_exceeded("no answer within the timeout");
    }
    match s.source() {
        // the source's own words, whose first is the message
        Some(lost) if s.code() == Code::Unknown => tonic::Status::unavailable(error_chain(lost)),
        _ => s,
    }
}

fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Sorted key/value pairs as the proto's map type.
pub fn proto_map(m: &BTreeMap<String, String>) -> std::collections::HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_lost_in_transport_is_unavailable_as_grpc_go_reports_it() {
        // what tonic makes of a connection reset under a call
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let lost = tonic::Status::from_error(Box::new(reset));
        assert_eq!(lost.code(), Code::Unknown, "tonic's own code for it");
        let seen = as_grpc_go_reports(lost);
        assert_eq!(seen.code(), Code::Unavailable);
        assert!(!is_final(seen.code()), "the driver may have done the work");
        assert!(
            seen.message().contains("connection reset"),
            "{}",
            seen.message()
        );
        // a driver's own Unknown stays final
        let answered = as_grpc_go_reports(tonic::Status::unknown("driver: no idea"));
        assert_eq!(answered.code(), Code::Unknown);
        assert_eq!(answered.message(), "driver: no idea");
        // tonic's expired deadline
        let expired = as_grpc_go_reports(tonic::Status::cancelled("Timeout expired"));
        assert_eq!(expired.code(), Code::DeadlineExceeded);
        // other statuses pass as they are, a decode failure included
        let garbled = tonic::Status::internal("failed to decode Protobuf message");
        assert_eq!(as_grpc_go_reports(garbled).code(), Code::Internal);
    }

    #[test]
    fn only_the_kubelets_non_final_codes_make_a_call_uncertain() {
        let table = [
            (Code::DeadlineExceeded, false),
            (Code::Unavailable, false),
            (Code::Cancelled, false),
            (Code::ResourceExhausted, false),
            (Code::Aborted, false),
            (Code::Internal, true),
            (Code::InvalidArgument, true),
            (Code::NotFound, true),
            (Code::FailedPrecondition, true),
            (Code::Unknown, true),
        ];
        for (code, fin) in table {
            assert_eq!(is_final(code), fin, "{code:?}");
        }
    }

    #[test]
    fn access_modes_follow_the_kubelet_with_and_without_single_node_multi_writer() {
        use pb::volume_capability::access_mode::Mode;
        let old = NodeCaps::default();
        let new = NodeCaps {
            single_node_multi_writer: true,
            ..old
        };
        let table = [
            (vec![], old, Mode::SingleNodeWriter),
            (vec![AccessMode::ReadWriteOnce], old, Mode::SingleNodeWriter),
            (
                vec![AccessMode::ReadWriteOncePod],
                old,
                Mode::SingleNodeWriter,
            ),
            (
                vec![AccessMode::ReadWriteOnce],
                new,
                Mode::SingleNodeMultiWriter,
            ),
            (
                vec![AccessMode::ReadWriteOncePod],
                new,
                Mode::SingleNodeSingleWriter,
            ),
            (
                vec![AccessMode::ReadOnlyMany, AccessMode::ReadWriteOnce],
                new,
                Mode::MultiNodeReaderOnly,
            ),
            (
                vec![AccessMode::ReadWriteMany],
                old,
                Mode::MultiNodeMultiWriter,
            ),
        ];
        for (modes, caps, want) in table {
            assert_eq!(access_mode(&modes, caps), want, "{modes:?} {caps:?}");
        }
    }

    #[test]
    fn capabilities_are_read_from_the_rpc_list_and_unknown_ones_ignored() {
        use pb::node_service_capability::{Type, rpc};
        let cap = |t: i32| pb::NodeServiceCapability {
            r#type: Some(Type::Rpc(pb::node_service_capability::Rpc { r#type: t })),
        };
        let resp = pb::NodeGetCapabilitiesResponse {
            capabilities: vec![
                cap(rpc::Type::StageUnstageVolume as i32),
                cap(rpc::Type::VolumeMountGroup as i32),
                cap(rpc::Type::ExpandVolume as i32),
                cap(99),
                pb::NodeServiceCapability { r#type: None },
            ],
        };
        let caps = NodeCaps::of(&resp);
        assert!(caps.stage_unstage && caps.volume_mount_group && caps.expand_volume);
        assert!(!caps.volume_stats && !caps.volume_condition && !caps.single_node_multi_writer);
    }

    #[test]
    fn an_expand_request_carries_what_the_kubelet_passes() {
        use pb::volume_capability::AccessType;
        use pb::volume_capability::access_mode::Mode;
        let fs = mount_capability(
            Some("ext4"),
            &["noatime".into()],
            None,
            Mode::SingleNodeWriter,
        );
        let staged = ExpandArgs {
            volume_id: "vol-1",
            volume_path: "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv-1/mount",
            staging_path: Some("/var/lib/kubelet/plugins/kubernetes.io/csi/d/abc/globalmount"),
            required_bytes: 2 << 30,
            capability: fs.clone(),
            secrets: Default::default(),
        };
        let r = expand_request(&staged);
        assert_eq!(r.volume_id, "vol-1");
        assert_eq!(r.volume_path, staged.volume_path);
        assert_eq!(r.staging_target_path, staged.staging_path.unwrap());
        let range = r.capacity_range.unwrap();
        assert_eq!((range.required_bytes, range.limit_bytes), (2 << 30, 0));
        assert_eq!(r.volume_capability, Some(fs));
        assert!(r.secrets.is_empty());
        // a driver without staging: no staging path
        let unstaged = ExpandArgs {
            staging_path: None,
            ..staged.clone()
        };
        assert_eq!(expand_request(&unstaged).staging_target_path, "");
        // the nodeExpandSecretRef's data, as given
        let secrets: std::collections::BTreeMap<String, String> =
            [("user".to_owned(), "admin".to_owned())].into();
        let with_secret = ExpandArgs {
            secrets: secrets.clone(),
            ..staged.clone()
        };
        let sent: std::collections::BTreeMap<String, String> =
            expand_request(&with_secret).secrets.into_iter().collect();
        assert_eq!(sent, secrets);
        // a block volume: the block capability, the publish file
        let block = ExpandArgs {
            volume_path: "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/u1",
            capability: block_capability(Mode::SingleNodeWriter),
            ..staged
        };
        let cap = expand_request(&block).volume_capability.unwrap();
        assert!(matches!(cap.access_type, Some(AccessType::Block(_))));
        assert_eq!(
            cap.access_mode.map(|m| m.mode),
            Some(Mode::SingleNodeWriter as i32)
        );
        // a size beyond the wire type is capped, not wrapped
        let huge = ExpandArgs {
            required_bytes: u64::MAX,
            ..unstaged
        };
        let range = expand_request(&huge).capacity_range.unwrap();
        assert_eq!(range.required_bytes, i64::MAX);
    }
}
