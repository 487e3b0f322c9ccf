//! The boxed fields change nothing a reader of the params sees: the
//! bytes bincode writes and JSON are frozen here from before the box.

use super::*;
use crate::model::{AccessMode, CsiLifecycle, ObjectVersion, PodUid, SecretRef};

/// Every field set.
fn full() -> TargetParams {
    TargetParams::at(
        UniqueVolumeName::from_raw("kubernetes.io/csi/d^h"),
        PluginName::Csi,
        "pv1".into(),
        TargetRef::Pod(PodUid::new("p1").unwrap()),
        TargetKind::Mount,
        Some("/r/pods/p1/v".into()),
    )
    .with_device_path(Some("/dev/loop3".into()))
    .with_device_mount_path(Some("/r/plugins/d".into()))
    .with_selinux(Some(
        SeLinuxContext::parse("system_u:object_r:container_file_t:s0:c5,c2").unwrap(),
    ))
    .with_mount_options(vec!["noatime".to_string(), "ro".to_string()].into())
    .with_fs_type(Some("ext4".into()))
    .with_csi(Some(Arc::new(CsiParams {
        driver: "d".into(),
        volume_handle: "h".into(),
        lifecycle: CsiLifecycle::Persistent,
        access_modes: vec![AccessMode::ReadWriteOnce],
        read_only: true,
        publish_context: [("a".to_owned(), "b".to_owned())].into(),
        volume_context: Default::default(),
        stage_secret: None,
        publish_secret: Some(SecretRef {
            namespace: "ns".into(),
            name: "s".into(),
        }),
        mount_group: Some("1000".into()),
        attachment_id: None,
    })))
    .with_payload(Some(Arc::new(PayloadVersion {
        hash: "abc".into(),
        objects: vec![ObjectVersion {
            kind: "Secret".into(),
            namespace: "ns".into(),
            name: "s".into(),
            uid: "u".into(),
            resource_version: "7".into(),
        }],
    })))
}

/// No boxed field set: a memory emptyDir's pod target.
fn bare() -> TargetParams {
    TargetParams::at(
        UniqueVolumeName::from_raw("kubernetes.io/empty-dir/p1-cache"),
        PluginName::EmptyDir,
        "cache".into(),
        TargetRef::Pod(PodUid::new("p1").unwrap()),
        TargetKind::Dir,
        Some("/r/pods/p1/volumes/kubernetes.io~empty-dir/cache".into()),
    )
}

// bincode::serialize of full() and bare() with every field in the struct
const FULL_BINCODE: &str = concat!(
    "15000000000000006b756265726e657465732e696f2f6373692f645e68030000",
    "000300000000000000707631010000000200000000000000703100000000010a",
    "000000000000002f6465762f6c6f6f7033010c000000000000002f722f706c75",
    "67696e732f64010c000000000000002f722f706f64732f70312f76012b000000",
    "0000000073797374656d5f753a6f626a6563745f723a636f6e7461696e65725f",
    "66696c655f743a73303a63322c6335020000000000000007000000000000006e",
    "6f6174696d650200000000000000726f01040000000000000065787434010100",
    "0000000000006401000000000000006800000000010000000000000001000000",
    "0101000000000000000100000000000000610100000000000000620000000000",
    "000000000102000000000000006e730100000000000000730104000000000000",
    "0031303030000103000000000000006162630100000000000000060000000000",
    "000053656372657402000000000000006e730100000000000000730100000000",
    "00000075010000000000000037",
);
const BARE_BINCODE: &str = concat!(
    "20000000000000006b756265726e657465732e696f2f656d7074792d6469722f",
    "70312d6361636865000000000500000000000000636163686501000000020000",
    "000000000070310100000000000130000000000000002f722f706f64732f7031",
    "2f766f6c756d65732f6b756265726e657465732e696f7e656d7074792d646972",
    "2f6361636865000000000000000000000000",
);
// the journal's target (format v3) of each, as records and checkpoints hold it
const FULL_V3: &str = concat!(
    "15000000000000006b756265726e657465732e696f2f6373692f645e68110000",
    "00000000006b756265726e657465732e696f2f63736903000000000000007076",
    "31010200000000000000703100010a000000000000002f6465762f6c6f6f7033",
    "010c000000000000002f722f706c7567696e732f64010c000000000000002f72",
    "2f706f64732f70312f76012b0000000000000073797374656d5f753a6f626a65",
    "63745f723a636f6e7461696e65725f66696c655f743a73303a63322c63350200",
    "00000000000007000000000000006e6f6174696d650200000000000000726f01",
    "0400000000000000657874340101000000000000006401000000000000006800",
    "0100000000000000010101000000000000000100000000000000610100000000",
    "000000620000000000000000000102000000000000006e730100000000000000",
    "7301040000000000000031303030000103000000000000006162630100000000",
    "000000060000000000000053656372657402000000000000006e730100000000",
    "00000073010000000000000075010000000000000037",
);
const BARE_V3: &str = concat!(
    "20000000000000006b756265726e657465732e696f2f656d7074792d6469722f",
    "70312d636163686517000000000000006b756265726e657465732e696f2f656d",
    "7074792d64697205000000000000006361636865010200000000000000703101",
    "00000130000000000000002f722f706f64732f70312f766f6c756d65732f6b75",
    "6265726e657465732e696f7e656d7074792d6469722f63616368650000000000",
    "00000000000000",
);
const FULL_JSON: &str = r#"{"volume":"kubernetes.io/csi/d^h","plugin":"Csi","spec_name":"pv1","target":{"Pod":"p1"},"kind":"mount","device_path":"/dev/loop3","device_mount_path":"/r/plugins/d","pod_mount_path":"/r/pods/p1/v","selinux":"system_u:object_r:container_file_t:s0:c2,c5","mount_options":["noatime","ro"],"fs_type":"ext4","csi":{"driver":"d","volume_handle":"h","lifecycle":"Persistent","access_modes":["ReadWriteOnce"],"read_only":true,"publish_context":{"a":"b"},"volume_context":{},"stage_secret":null,"publish_secret":{"namespace":"ns","name":"s"},"mount_group":"1000","attachment_id":null},"payload":{"hash":"abc","objects":[{"kind":"Secret","namespace":"ns","name":"s","uid":"u","resource_version":"7"}]}}"#;
const BARE_JSON: &str = r#"{"volume":"kubernetes.io/empty-dir/p1-cache","plugin":"EmptyDir","spec_name":"cache","target":{"Pod":"p1"},"kind":"dir","device_path":null,"device_mount_path":null,"pod_mount_path":"/r/pods/p1/volumes/kubernetes.io~empty-dir/cache","selinux":null,"mount_options":[],"fs_type":null,"csi":null,"payload":null}"#;
const FULL_DEBUG: &str = r#"TargetParams { volume: UniqueVolumeName("kubernetes.io/csi/d^h"), plugin: Csi, spec_name: "pv1", target: Pod(PodUid("p1")), kind: Mount, device_path: Some("/dev/loop3"), device_mount_path: Some("/r/plugins/d"), pod_mount_path: Some("/r/pods/p1/v"), selinux: Some(SeLinuxContext("system_u:object_r:container_file_t:s0:c2,c5")), mount_options: MountOptions(["noatime", "ro"]), fs_type: Some("ext4"), csi: Some(CsiParams { driver: "d", volume_handle: "h", lifecycle: Persistent, access_modes: [ReadWriteOnce], read_only: true, publish_context: {"a": "b"}, volume_context: {}, stage_secret: None, publish_secret: Some(SecretRef { namespace: "ns", name: "s" }), mount_group: Some("1000"), attachment_id: None }), payload: Some(PayloadVersion { hash: "abc", objects: [ObjectVersion { kind: "Secret", namespace: "ns", name: "s", uid: "u", resource_version: "7" }] }) }"#;
const BARE_DEBUG: &str = r#"TargetParams { volume: UniqueVolumeName("kubernetes.io/empty-dir/p1-cache"), plugin: EmptyDir, spec_name: "cache", target: Pod(PodUid("p1")), kind: Dir, device_path: None, device_mount_path: None, pod_mount_path: Some("/r/pods/p1/volumes/kubernetes.io~empty-dir/cache"), selinux: None, mount_options: MountOptions([]), fs_type: None, csi: None, payload: None }"#;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn the_params_encode_as_the_flat_struct_did() {
    for (p, bin, json) in [
        (full(), FULL_BINCODE, FULL_JSON),
        (bare(), BARE_BINCODE, BARE_JSON),
    ] {
        assert_eq!(hex(&bincode::serialize(&p).unwrap()), bin, "{p:?}");
        assert_eq!(serde_json::to_string(&p).unwrap(), json);
        let back: TargetParams = bincode::deserialize(&bincode::serialize(&p).unwrap()).unwrap();
        assert_eq!(back, p);
        let back: TargetParams = serde_json::from_str(json).unwrap();
        assert_eq!(back, p);
    }
    assert_eq!(format!("{:?}", bare()), BARE_DEBUG);
    assert_eq!(format!("{:?}", full()), FULL_DEBUG);
}

#[test]
fn the_journal_writes_the_params_as_it_did() {
    use crate::journal::record::{TargetFormat, TargetV3};
    for (p, v3) in [(full(), FULL_V3), (bare(), BARE_V3)] {
        let written = bincode::serialize(&TargetV3::from_params(&p)).unwrap();
        assert_eq!(hex(&written), v3, "{p:?}");
    }
    // what the journal reads back (a CSI target carries no payload, so the
    // full one reads back without it)
    let back: TargetV3 = bincode::deserialize(&hex_bytes(BARE_V3)).unwrap();
    assert_eq!(back.to_params().unwrap(), bare());
    assert!(back.to_params().unwrap().rare.is_none());
}

fn hex_bytes(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn a_target_without_the_rare_fields_has_no_box() {
    assert!(
        size_of::<TargetParams>() <= 64,
        "{}",
        size_of::<TargetParams>()
    );
    assert!(bare().rare.is_none());
    let back: TargetParams = serde_json::from_str(BARE_JSON).unwrap();
    assert!(back.rare.is_none(), "decoding boxes nothing");
    assert!(full().rare.is_some());
}

#[test]
fn emptying_every_rare_field_drops_the_box_and_compares_equal() {
    let label = SeLinuxContext::parse("system_u:object_r:container_file_t:s0").unwrap();
    let set_then_cleared = [
        bare().with_selinux(Some(label)).with_selinux(None),
        bare()
            .with_mount_options(vec!["ro".to_string()].into())
            .with_mount_options(MountOptions::default()),
        bare()
            .with_device_path(Some("/d".into()))
            .with_device_path(None),
        bare().with_mount_options(MountOptions::default()),
        bare()
            .with_csi(None)
            .with_payload(None)
            .with_device_mount_path(None),
    ];
    for p in set_then_cleared {
        assert!(p.rare.is_none(), "{p:?}");
        assert_eq!(p, bare());
    }
    // one field cleared, another kept: the box stays, and equality sees it
    let p = full().with_csi(None);
    assert!(p.csi().is_none() && p.selinux().is_some());
    assert_ne!(p, full());
    assert_ne!(bare().with_device_path(Some("/d".into())), bare());
}

#[test]
fn mount_options_say_whether_they_mount_read_only() {
    let opts = |o: &[&str]| o.iter().map(|s| s.to_string()).collect::<MountOptions>();
    assert!(opts(&["noatime", "ro"]).is_read_only());
    assert!(
        opts(&["ro", "rw"]).is_read_only(),
        "as the plugins mount it"
    );
    assert!(!opts(&["rw", "size=1m", "rootcontext=ro"]).is_read_only());
    assert!(!MountOptions::default().is_read_only());
}

#[test]
fn a_target_at_a_path_puts_it_where_its_kind_of_target_keeps_it() {
    let at = |target: TargetRef| {
        TargetParams::at(
            UniqueVolumeName::from_raw("v"),
            PluginName::LocalVolume,
            "pv1".into(),
            target,
            TargetKind::Mount,
            Some(Path::new("/r/x").into()),
        )
    };
    let device = at(TargetRef::Device);
    assert_eq!(device.path(), Some(Path::new("/r/x")));
    assert_eq!(device.pod_mount_path, None);
    let pod = at(TargetRef::Pod(PodUid::new("p1").unwrap()));
    assert_eq!(pod.path(), Some(Path::new("/r/x")));
    assert_eq!(pod.device_mount_path(), None);
    assert!(pod.device_path().is_none() && pod.selinux().is_none() && pod.fs_type.is_none());
    assert!(pod.rare.is_none());
}
