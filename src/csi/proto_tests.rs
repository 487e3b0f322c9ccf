//! Wire checks for the generated CSI and plugin-registration code: messages
//! against bytes written out by hand from the protobuf encoding (a tag is
//! `field_number << 3 | wire_type`; wire type 0 is a varint, 2 a
//! length-delimited field), so a wrong field number fails here, and one
//! Identity round trip over a real unix socket.

use std::collections::HashMap;

use prost::Message;

use super::connect_unix;
use super::proto::csi_v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, NodePublishVolumeRequest, NodeStageVolumeRequest, ProbeRequest,
    ProbeResponse, VolumeCapability,
    identity_client::IdentityClient,
    identity_server::{Identity, IdentityServer},
    volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode},
};
use super::proto::pluginregistration::PluginInfo;

fn one(k: &str, v: &str) -> HashMap<String, String> {
    HashMap::from([(k.to_owned(), v.to_owned())])
}

/// A mount capability: ext4, `noatime`, single-node writer.
fn mount_capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec!["noatime".into()],
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// `mount_capability()` by hand, 21 bytes, fields in number order as prost
/// writes them (the oneof's mount (2) before access_mode (3)).
const CAPABILITY: &[u8] = &[
    0x12, 0x0f, // mount (2, LEN), 15 bytes
    0x0a, 0x04, b'e', b'x', b't', b'4', //   fs_type (1) "ext4"
    0x12, 0x07, b'n', b'o', b'a', b't', b'i', b'm', b'e', //   mount_flags (2) "noatime"
    0x1a, 0x02, // access_mode (3, LEN), 2 bytes
    0x08, 0x01, //   mode (1, VARINT) = SINGLE_NODE_WRITER
];

/// A map entry `{key (1): k, value (2): v}`, field `tag` of its message.
fn map_entry(tag: u8, k: &str, v: &str) -> Vec<u8> {
    let len = |n: usize| u8::try_from(n).expect("short test strings");
    let mut entry = vec![0x0a, len(k.len())];
    entry.extend_from_slice(k.as_bytes());
    entry.extend_from_slice(&[0x12, len(v.len())]);
    entry.extend_from_slice(v.as_bytes());
    let mut out = vec![tag, len(entry.len())];
    out.extend(entry);
    out
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Both directions: the message encodes to `bytes`, and `bytes` decode to
/// the message.
fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, bytes: &[u8]) {
    assert_eq!(msg.encode_to_vec(), bytes, "encoding of {msg:?}");
    assert_eq!(&M::decode(bytes).unwrap(), msg, "decoding");
}

#[test]
fn mount_capability_has_the_spec_field_numbers() {
    assert_wire(&mount_capability(), CAPABILITY);
}

#[test]
fn node_stage_volume_request_has_the_spec_field_numbers() {
    let req = NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        publish_context: HashMap::new(),
        staging_target_path: "/stage".into(),
        volume_capability: Some(mount_capability()),
        secrets: one("password", "s3cret"),
        volume_context: one("tier", "gold"),
    };
    let expected = cat(&[
        &[0x0a, 0x05], // volume_id (1, LEN)
        b"vol-1",
        &[0x1a, 0x06], // staging_target_path (3, LEN)
        b"/stage",
        &[0x22, 0x15], // volume_capability (4, LEN), 21 bytes
        CAPABILITY,
        &map_entry(0x2a, "password", "s3cret"), // secrets (5, LEN)
        &map_entry(0x32, "tier", "gold"),       // volume_context (6, LEN)
    ]);
    // the helper: entry tag, 18 entry bytes, key tag, 8 key bytes
    assert_eq!(
        map_entry(0x2a, "password", "s3cret")[..4],
        [0x2a, 0x12, 0x0a, 0x08]
    );
    assert_wire(&req, &expected);
}

#[test]
fn node_publish_volume_request_has_the_spec_field_numbers() {
    let req = NodePublishVolumeRequest {
        volume_id: "vol-1".into(),
        publish_context: HashMap::new(),
        staging_target_path: "/stage".into(),
        target_path: "/target".into(),
        volume_capability: Some(mount_capability()),
        readonly: true,
        secrets: one("password", "s3cret"),
        volume_context: one("tier", "gold"),
    };
    let expected = cat(&[
        &[0x0a, 0x05], // volume_id (1, LEN)
        b"vol-1",
        &[0x1a, 0x06], // staging_target_path (3, LEN)
        b"/stage",
        &[0x22, 0x07], // target_path (4, LEN)
        b"/target",
        &[0x2a, 0x15], // volume_capability (5, LEN), 21 bytes
        CAPABILITY,
        &[0x30, 0x01],                          // readonly (6, VARINT) = true
        &map_entry(0x3a, "password", "s3cret"), // secrets (7, LEN)
        &map_entry(0x42, "tier", "gold"),       // volume_context (8, LEN)
    ]);
    assert_wire(&req, &expected);
}

#[test]
fn plugin_info_has_the_kubelet_field_numbers() {
    let info = PluginInfo {
        r#type: "CSIPlugin".into(),
        name: "hostpath.csi.k8s.io".into(),
        endpoint: "/csi/csi.sock".into(),
        supported_versions: vec!["1.0.0".into()],
    };
    let expected = cat(&[
        &[0x0a, 0x09], // type (1, LEN)
        b"CSIPlugin",
        &[0x12, 0x13], // name (2, LEN), 19 bytes
        b"hostpath.csi.k8s.io",
        &[0x1a, 0x0d], // endpoint (3, LEN), 13 bytes
        b"/csi/csi.sock",
        &[0x22, 0x05], // supported_versions (4, LEN)
        b"1.0.0",
    ]);
    assert_wire(&info, &expected);
}

#[test]
fn probe_response_tells_not_ready_from_unset() {
    // ready (1, LEN) holding an empty BoolValue: its value false is the
    // default, so it has no bytes of its own
    let not_ready = ProbeResponse::decode(&[0x0a, 0x00][..]).unwrap();
    assert_eq!(not_ready.ready, Some(false));
    // ready holding BoolValue{value (1, VARINT) = true}
    let ready = ProbeResponse::decode(&[0x0a, 0x02, 0x08, 0x01][..]).unwrap();
    assert_eq!(ready.ready, Some(true));
    // no field at all: the spec says to take the plugin as ready
    assert_eq!(ProbeResponse::decode(&[][..]).unwrap().ready, None);
}

/// An Identity service that names itself and is still starting.
struct FakeIdentity;

#[tonic::async_trait]
impl Identity for FakeIdentity {
    async fn get_plugin_info(
        &self,
        _: tonic::Request<GetPluginInfoRequest>,
    ) -> Result<tonic::Response<GetPluginInfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(GetPluginInfoResponse {
            name: "fake.csi.volumed.dev".into(),
            vendor_version: "0.1.0".into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: tonic::Request<GetPluginCapabilitiesRequest>,
    ) -> Result<tonic::Response<GetPluginCapabilitiesResponse>, tonic::Status> {
        Ok(tonic::Response::new(
            GetPluginCapabilitiesResponse::default(),
        ))
    }

    async fn probe(
        &self,
        _: tonic::Request<ProbeRequest>,
    ) -> Result<tonic::Response<ProbeResponse>, tonic::Status> {
        Ok(tonic::Response::new(ProbeResponse { ready: Some(false) }))
    }
}

#[tokio::test]
async fn identity_answers_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder().serve_with_incoming_shutdown(
            IdentityServer::new(FakeIdentity),
            incoming,
            async {
                let _ = stopped.await;
            },
        ),
    );

    let channel = connect_unix(&sock).await.unwrap();
    let mut client = IdentityClient::new(channel);
    let info = client
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "fake.csi.volumed.dev");
    let probe = client.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(false));

    drop(client);
    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_missing_socket_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nobody.sock");
    let err = connect_unix(&missing).await.unwrap_err();
    assert!(err.to_string().contains("nobody.sock"), "{err}");
}
