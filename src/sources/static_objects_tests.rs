//! Tests of the static objects: multi-document files, lists, binding.

use super::*;

fn load(files: &[(&str, &str)]) -> (tempfile::TempDir, StaticObjects, Vec<String>) {
    let d = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (name, text) in files {
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        paths.push(p);
    }
    paths.sort();
    let (objects, errors) = StaticObjects::load(&paths);
    let errors = errors.iter().map(ToString::to_string).collect();
    (d, objects, errors)
}

const PV: &str = "\
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv1}
spec:
  accessModes: [ReadWriteOnce]
  mountOptions: [noatime]
  claimRef: {namespace: default, name: pvc1}
  local: {path: /mnt/disk1, fsType: ext4}
";

const PVC: &str = "\
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pvc1}
spec: {volumeName: pv1}
";

fn resolve(o: &StaticObjects, ns: &str, claim: &str) -> Result<(String, VolumeSpec), String> {
    o.resolve_claim(Path::new("/pods/p.yaml"), "data", ns, claim, "node-1")
        .map(|(pv, spec)| (pv, VolumeSpec::clone(&spec)))
        .map_err(|e| e.to_string())
}

#[test]
fn multi_document_files_and_lists_are_read() {
    let csi = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d.example.com}\nspec: {seLinuxMount: true}\n";
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}\n",
        serde_json::to_string(&parse_documents(Path::new("x"), PVC.as_bytes()).unwrap()[0])
            .unwrap()
    );
    let (_d, o, errors) = load(&[("a.yaml", &format!("{PV}---\n{csi}")), ("b.yaml", &list)]);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(o.pvs.len(), 1);
    assert!(o.pvcs.contains_key(&("default".into(), "pvc1".into())));
    assert!(o.csi_drivers["d.example.com"].se_linux_mount);
    let (pv, spec) = resolve(&o, "default", "pvc1").unwrap();
    assert_eq!(pv, "pv1");
    assert_eq!(
        spec,
        VolumeSpec::Local {
            path: "/mnt/disk1".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: vec!["noatime".into()],
            is_block: false,
            volume_mode: Default::default(),
        }
    );
}

#[test]
fn a_claim_resolves_to_its_pvs_own_spec() {
    let (_d, o, errors) = load(&[("a.yaml", PV), ("b.yaml", PVC)]);
    assert!(errors.is_empty(), "{errors:?}");
    let spec = || {
        let p = Path::new("/pods/p.yaml");
        o.resolve_claim(p, "data", "default", "pvc1", "node-1")
            .unwrap()
            .1
    };
    // one allocation for the PV however many pods claim it
    assert!(Arc::ptr_eq(&spec(), &spec()));
    assert!(matches!(&o.pvs["pv1"].spec, Ok(s) if Arc::ptr_eq(s, &spec())));
}

#[test]
fn csi_pvs_carry_driver_handle_and_attributes() {
    let pv = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv2}\nspec:
  accessModes: [ReadWriteOncePod]
  claimRef: {namespace: default, name: pvc1}
  csi: {driver: d.example.com, volumeHandle: h1, volumeAttributes: {a: b}}
";
    let no_attach = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d.example.com}\nspec: {attachRequired: false}\n";
    let (_d, o, errors) = load(&[
        ("a.yaml", pv),
        ("b.yaml", &PVC.replace("pv1", "pv2")),
        ("c.yaml", no_attach),
    ]);
    assert!(errors.is_empty(), "{errors:?}");
    let (_, spec) = resolve(&o, "default", "pvc1").unwrap();
    let VolumeSpec::Csi(c) = spec else {
        panic!("{spec:?}")
    };
    assert_eq!(
        (c.driver.as_str(), c.volume_handle.as_str()),
        ("d.example.com", "h1")
    );
    assert_eq!(c.attributes["a"], "b");
    assert_eq!(c.access_modes, [AccessMode::ReadWriteOncePod]);
}

#[test]
fn a_csi_volume_supports_selinux_mounts_only_when_its_csidriver_says_so() {
    let pv = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv2}\nspec:
  accessModes: [ReadWriteOncePod]
  claimRef: {namespace: default, name: pvc1}
  csi: {driver: d.example.com, volumeHandle: h1}
";
    let pvc = PVC.replace("pv1", "pv2");
    let driver = |se: &str| {
        format!(
            "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: d.example.com}}\nspec: {{attachRequired: false{se}}}\n"
        )
    };
    let selinux_mount = |files: &[(&str, &str)]| {
        let (_d, o, errors) = load(files);
        assert!(errors.is_empty(), "{errors:?}");
        match resolve(&o, "default", "pvc1").unwrap().1 {
            VolumeSpec::Csi(c) => c.selinux_mount,
            other => panic!("{other:?}"),
        }
    };
    let attached = attachment("node-1", true).replace("pv-csi", "pv2");
    assert!(
        !selinux_mount(&[("a.yaml", pv), ("b.yaml", &pvc), ("d.yaml", &attached)]),
        "no CSIDriver"
    );
    let off = driver(", seLinuxMount: false");
    assert!(!selinux_mount(&[
        ("a.yaml", pv),
        ("b.yaml", &pvc),
        ("c.yaml", &off)
    ]));
    let unset = driver("");
    assert!(!selinux_mount(&[
        ("a.yaml", pv),
        ("b.yaml", &pvc),
        ("c.yaml", &unset)
    ]));
    let on = driver(", seLinuxMount: true");
    assert!(selinux_mount(&[
        ("a.yaml", pv),
        ("b.yaml", &pvc),
        ("c.yaml", &on)
    ]));
}

#[test]
fn binding_failures_name_the_claim_pv_and_files() {
    // missing PVC
    let (_d, o, _) = load(&[("pv.yaml", PV)]);
    assert_eq!(
        resolve(&o, "default", "pvc1").unwrap_err(),
        "/pods/p.yaml: volume \"data\": persistentVolumeClaim default/pvc1: not found in the static objects"
    );
    // missing PV
    let (d, o, _) = load(&[("pvc.yaml", PVC)]);
    let e = resolve(&o, "default", "pvc1").unwrap_err();
    assert!(
        e.contains("PersistentVolume \"pv1\", which is not in the static objects"),
        "{e}"
    );
    assert!(
        e.contains(&d.path().join("pvc.yaml").display().to_string()),
        "{e}"
    );
    // claimRef mismatch: other name, other namespace
    for other in [
        "{namespace: default, name: other}",
        "{namespace: prod, name: pvc1}",
    ] {
        let pv = PV.replace("{namespace: default, name: pvc1}", other);
        let (_d, o, _) = load(&[("pv.yaml", &pv), ("pvc.yaml", PVC)]);
        let e = resolve(&o, "default", "pvc1").unwrap_err();
        assert!(e.contains("has claimRef"), "{e}");
        assert!(e.contains("not the claim default/pvc1"), "{e}");
        assert!(e.contains("pv.yaml") && e.contains("pvc.yaml"), "{e}");
    }
    // no claimRef
    let pv = PV.replace("  claimRef: {namespace: default, name: pvc1}\n", "");
    let (_d, o, _) = load(&[("pv.yaml", &pv), ("pvc.yaml", PVC)]);
    assert!(
        resolve(&o, "default", "pvc1")
            .unwrap_err()
            .contains("has no claimRef")
    );
    // unbound claim
    let (_d, o, _) = load(&[
        ("pv.yaml", PV),
        (
            "pvc.yaml",
            &PVC.replace("volumeName: pv1", "volumeName: \"\""),
        ),
    ]);
    assert!(
        resolve(&o, "default", "pvc1")
            .unwrap_err()
            .contains("not bound")
    );
    // uid mismatch when both sides carry one
    let pv = PV.replace("name: pvc1}", "name: pvc1, uid: u1}");
    let pvc = PVC.replace("{name: pvc1}", "{name: pvc1, uid: u2}");
    let (_d, o, _) = load(&[("pv.yaml", &pv), ("pvc.yaml", &pvc)]);
    assert!(
        resolve(&o, "default", "pvc1")
            .unwrap_err()
            .contains("with another uid")
    );
}

#[test]
fn unsupported_and_bad_objects_are_reported_and_the_rest_is_kept() {
    let nfs = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: nfs1}\nspec:
  claimRef: {namespace: default, name: pvc1}
  nfs: {server: s, path: /x}
";
    let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n";
    let (d, o, errors) = load(&[
        ("a.yaml", &format!("{nfs}---\n{svc}")),
        ("b.yaml", "kind: [broken\n"),
        ("c.yaml", PV),
        ("d.yaml", PV),
        ("e.yaml", &PVC.replace("pv1", "nfs1")),
    ]);
    let file = |n: &str| d.path().join(n).display().to_string();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].starts_with(&format!("{}: unsupported kind \"Service\"", file("a.yaml"))));
    assert!(errors[1].starts_with(&format!("parsing {}", file("b.yaml"))));
    assert_eq!(
        errors[2],
        format!(
            "{}: PersistentVolume \"pv1\" is already defined in {}",
            file("d.yaml"),
            file("c.yaml")
        )
    );
    assert_eq!(
        o.pvs["pv1"].file,
        d.path().join("c.yaml"),
        "first file wins"
    );
    let e = resolve(&o, "default", "pvc1").unwrap_err();
    assert!(
        e.ends_with(&format!(
            "{}: PersistentVolume \"nfs1\": unsupported volume type nfs",
            file("a.yaml")
        )),
        "{e}"
    );
    let raw = PV.replace("  local:", "  volumeMode: Raw\n  local:");
    let rel = PV.replace("/mnt/disk1", "mnt/disk1");
    for (pv, want) in [
        (
            raw,
            "PersistentVolume \"pv1\": volumeMode \"Raw\" is neither",
        ),
        (rel, "is not absolute"),
    ] {
        let (_d, o, _) = load(&[("pv.yaml", &pv), ("pvc.yaml", PVC)]);
        let e = resolve(&o, "default", "pvc1").unwrap_err();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn a_local_or_csi_pv_carries_its_volume_mode() {
    let no_attach = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d.example.com}\nspec: {attachRequired: false}\n";
    let mode = |pv: &str, claim: &str| {
        let files = [("pv.yaml", pv), ("pvc.yaml", claim), ("d.yaml", no_attach)];
        let (_d, o, errors) = load(&files);
        assert!(errors.is_empty(), "{errors:?}");
        resolve(&o, "default", "pvc1").unwrap().1.volume_mode()
    };
    let with = |pv: &str, m: &str| pv.replace("spec:\n", &format!("spec:\n  volumeMode: {m}\n"));
    let cases = [
        (PV.to_owned(), PVC, VolumeMode::Filesystem),
        (with(PV, "Filesystem"), PVC, VolumeMode::Filesystem),
        (with(PV, "Block"), PVC, VolumeMode::Block),
        (CSI_PV.to_owned(), CSI_PVC, VolumeMode::Filesystem),
        (with(CSI_PV, "Block"), CSI_PVC, VolumeMode::Block),
    ];
    for (pv, claim, want) in cases {
        assert_eq!(mode(&pv, claim), want, "{pv}");
    }
}

const CSI_PV: &str = "\
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-csi}
spec:
  accessModes: [ReadWriteMany]
  claimRef: {namespace: default, name: pvc1}
  csi:
    driver: d.example.com
    volumeHandle: vol-1
    readOnly: true
    nodeStageSecretRef: {name: stage, namespace: ns1}
    nodePublishSecretRef: {name: pub}
    nodeExpandSecretRef: {name: grow, namespace: ns2}
";

const CSI_PVC: &str = "\
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pvc1}
spec: {volumeName: pv-csi}
";

fn attachment(node: &str, attached: bool) -> String {
    format!(
        "apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {{name: csi-abc}}
spec:
  attacher: d.example.com
  nodeName: {node}
  source: {{persistentVolumeName: pv-csi}}
status:
  attached: {attached}
  attachmentMetadata: {{lun: '3'}}
"
    )
}

fn csi_of(spec: VolumeSpec) -> CsiSpec {
    match spec {
        VolumeSpec::Csi(c) => *c,
        other => panic!("not CSI: {other:?}"),
    }
}

#[test]
fn a_csi_pv_carries_its_secret_references_and_read_only() {
    let no_attach = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d.example.com}\nspec: {attachRequired: false, podInfoOnMount: true}\n";
    let (_d, o, errors) = load(&[
        ("a.yaml", CSI_PV),
        ("b.yaml", CSI_PVC),
        ("c.yaml", no_attach),
    ]);
    assert!(errors.is_empty(), "{errors:?}");
    let d = &o.csi_drivers["d.example.com"];
    assert!(!d.attach_required && d.pod_info_on_mount && !d.requires_republish);
    assert_eq!(
        d.fs_group_policy, "ReadWriteOnceWithFSType",
        "the API default"
    );
    let c = csi_of(resolve(&o, "default", "pvc1").unwrap().1);
    assert!(c.read_only);
    assert_eq!(
        c.stage_secret,
        Some(SecretRef {
            namespace: "ns1".into(),
            name: "stage".into()
        })
    );
    assert_eq!(
        c.publish_secret.map(|s| s.namespace),
        Some("default".into())
    );
    assert_eq!(
        c.expand_secret,
        Some(SecretRef {
            namespace: "ns2".into(),
            name: "grow".into()
        })
    );
    assert_eq!(
        c.attachment, None,
        "attachRequired: false needs no VolumeAttachment"
    );
}

#[test]
fn a_driver_that_needs_attaching_waits_for_an_attached_volume_attachment() {
    // No CSIDriver: attaching is required, as the kubelet assumes.
    let (_d, o, _) = load(&[("a.yaml", CSI_PV), ("b.yaml", CSI_PVC)]);
    let err = resolve(&o, "default", "pvc1").unwrap_err();
    assert!(
        err.contains("requires attaching") && err.contains("pv-csi"),
        "{err}"
    );

    let (_d, o, _) = load(&[
        ("a.yaml", CSI_PV),
        ("b.yaml", CSI_PVC),
        ("c.yaml", &attachment("node-1", false)),
    ]);
    let err = resolve(&o, "default", "pvc1").unwrap_err();
    assert!(
        err.contains("csi-abc") && err.contains("not attached yet"),
        "{err}"
    );

    let (_d, o, _) = load(&[
        ("a.yaml", CSI_PV),
        ("b.yaml", CSI_PVC),
        ("c.yaml", &attachment("other-node", true)),
    ]);
    assert!(
        resolve(&o, "default", "pvc1").is_err(),
        "another node's attachment"
    );

    let (_d, o, errors) = load(&[
        ("a.yaml", CSI_PV),
        ("b.yaml", CSI_PVC),
        ("c.yaml", &attachment("node-1", true)),
    ]);
    assert!(errors.is_empty(), "{errors:?}");
    let c = csi_of(resolve(&o, "default", "pvc1").unwrap().1);
    let (name, meta) = c.attachment.unwrap();
    assert_eq!(name, "csi-abc");
    assert_eq!(meta.get("lun").map(String::as_str), Some("3"));
}

#[test]
fn secrets_reach_the_store_decoded_and_never_their_debug_output() {
    use crate::plugins::csi::SecretSource;
    let secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: stage, namespace: ns1}\ndata: {password: aHVudGVyMg==}\nstringData: {user: admin}\n";
    let (_d, o, errors) = load(&[("s.yaml", secret)]);
    assert!(errors.is_empty(), "{errors:?}");
    let store = SecretStore::default();
    o.publish_secrets(&store);
    let r = SecretRef {
        namespace: "ns1".into(),
        name: "stage".into(),
    };
    let data = store.secret(&r).unwrap();
    assert_eq!(data.get("password").map(String::as_str), Some("hunter2"));
    assert_eq!(data.get("user").map(String::as_str), Some("admin"));
    let shown = format!("{o:?}");
    assert!(
        shown.contains("password") && !shown.contains("hunter2"),
        "{shown}"
    );
    let missing = SecretRef {
        namespace: "ns1".into(),
        name: "nope".into(),
    };
    assert!(store.secret(&missing).unwrap_err().contains("not found"));
}

#[test]
fn a_csi_claim_carries_its_size_resize_status_and_conditions_for_expansion() {
    use crate::model::{ClaimCondition, ResizeStatus};
    let no_attach = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d.example.com}\nspec: {attachRequired: false}\n";
    let pv = CSI_PV.replace(
        "  accessModes:",
        "  capacity: {storage: 2Gi}\n  accessModes:",
    );
    let pvc = "\
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pvc1, resourceVersion: '17'}
spec: {volumeName: pv-csi}
status:
  capacity: {storage: 1Gi}
  allocatedResources: {storage: 2Gi}
  allocatedResourceStatuses: {storage: NodeResizePending}
  conditions:
  - {type: FileSystemResizePending, status: 'True', message: waiting, lastTransitionTime: '2026-01-01T00:00:00Z'}
";
    let (_d, o, errors) = load(&[("a.yaml", &pv), ("b.yaml", pvc), ("c.yaml", no_attach)]);
    assert!(errors.is_empty(), "{errors:?}");
    let c = csi_of(resolve(&o, "default", "pvc1").unwrap().1);
    let claim = c.claim.expect("a claim's state");
    assert_eq!(
        (claim.namespace.as_str(), claim.name.as_str()),
        ("default", "pvc1")
    );
    assert_eq!(claim.resource_version.as_deref(), Some("17"));
    assert_eq!(claim.pv_capacity, Some(2 << 30));
    assert_eq!(claim.pv_capacity_text.as_deref(), Some("2Gi"));
    assert_eq!(claim.size.status_capacity, Some(1 << 30));
    assert!(claim.size.allocated);
    assert_eq!(
        claim.size.resize_status,
        Some(ResizeStatus::NodeResizePending)
    );
    assert_eq!(
        claim.conditions,
        vec![ClaimCondition {
            kind: "FileSystemResizePending".into(),
            status: "True".into(),
            message: Some("waiting".into()),
            last_transition_time: Some("2026-01-01T00:00:00Z".into()),
            ..ClaimCondition::default()
        }]
    );
    // a claim without status, a PV without capacity: nothing to compare
    let (_d, o, _) = load(&[
        ("a.yaml", CSI_PV),
        ("b.yaml", CSI_PVC),
        ("c.yaml", no_attach),
    ]);
    let claim = csi_of(resolve(&o, "default", "pvc1").unwrap().1)
        .claim
        .unwrap();
    assert_eq!(
        (claim.pv_capacity, claim.size.status_capacity),
        (None, None)
    );
    assert!(claim.conditions.is_empty() && !claim.size.allocated);
}
