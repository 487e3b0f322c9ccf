//! Tests of one static pod manifest → [`ParsedPod`].

use super::*;
use crate::model::{SubPath, VolumeMountSpec};

fn parse(yaml: &str) -> Result<ParsedPod, SourceError> {
    parse_pod(Path::new("/pods/p.yaml"), yaml.as_bytes(), "Node-1")
}

const POD: &str = "\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: c
    image: busybox
  volumes:
  - name: cache
    emptyDir:
      medium: Memory
      sizeLimit: 64Mi
  - name: scratch
    emptyDir: {}
  - name: data
    hostPath:
      path: /tmp/volumed-demo/data
      type: DirectoryOrCreate
  - name: claim
    persistentVolumeClaim:
      claimName: pvc1
";

#[test]
fn a_pod_parses_with_kubelet_names_and_every_supported_volume() {
    let p = parse(POD).unwrap();
    assert_eq!(p.name, "web-node-1", "<name>-<lowercase node>");
    assert_eq!(p.namespace, "default");
    assert_eq!(p.uid.as_str().len(), 32);
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(
        p.volumes,
        [
            ParsedVolume::Inline {
                name: "cache".into(),
                spec: VolumeSpec::EmptyDir {
                    medium: StorageMedium::Memory,
                    size_limit: Some(64 << 20)
                }
            },
            ParsedVolume::Inline {
                name: "scratch".into(),
                spec: VolumeSpec::EmptyDir {
                    medium: StorageMedium::Disk,
                    size_limit: None
                }
            },
            ParsedVolume::Inline {
                name: "data".into(),
                spec: VolumeSpec::HostPath {
                    path: "/tmp/volumed-demo/data".into(),
                    host_path_type: HostPathType::DirectoryOrCreate
                }
            },
            ParsedVolume::Claim {
                name: "claim".into(),
                claim_name: "pvc1".into(),
                read_only: false,
                ephemeral: false,
            },
        ]
    );
}

#[test]
fn a_claim_keeps_read_only_and_an_ephemeral_volume_is_the_pods_named_claim() {
    let yaml = POD.replace(
        "      claimName: pvc1\n",
        "      claimName: pvc1\n      readOnly: true\n  - name: scratch-eph\n    ephemeral:\n      volumeClaimTemplate:\n        spec:\n          accessModes: [ReadWriteOnce]\n          resources: {requests: {storage: 1Gi}}\n  - name: no-template\n    ephemeral: {}\n",
    );
    let p = parse(&yaml).unwrap();
    let claims: Vec<_> = p
        .volumes
        .iter()
        .filter(|v| matches!(v, ParsedVolume::Claim { .. }))
        .cloned()
        .collect();
    assert_eq!(
        claims,
        [
            ParsedVolume::Claim {
                name: "claim".into(),
                claim_name: "pvc1".into(),
                read_only: true,
                ephemeral: false,
            },
            ParsedVolume::Claim {
                name: "scratch-eph".into(),
                // `<pod name>-<volume name>`, the static pod's full name
                claim_name: "web-node-1-scratch-eph".into(),
                read_only: false,
                ephemeral: true,
            },
        ]
    );
    assert_eq!(
        p.errors,
        ["/pods/p.yaml: volume \"no-template\": ephemeral.volumeClaimTemplate is required"]
    );
}

#[test]
fn uid_is_metadata_uid_when_set_else_a_stable_hash_of_pod_node_and_path() {
    let with_uid = POD.replace("  name: web\n", "  name: web\n  uid: 0f3c-given\n");
    assert_eq!(parse(&with_uid).unwrap().uid.as_str(), "0f3c-given");

    let a = parse(POD).unwrap().uid;
    assert_eq!(parse(POD).unwrap().uid, a, "stable across runs");
    assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
    let other_node = parse_pod(Path::new("/pods/p.yaml"), POD.as_bytes(), "node-2").unwrap();
    assert_ne!(other_node.uid, a, "changes with the node name");
    let other_path = parse_pod(Path::new("/pods/q.yaml"), POD.as_bytes(), "Node-1").unwrap();
    assert_ne!(other_path.uid, a, "changes with the path");
    let changed = parse(&POD.replace("64Mi", "65Mi")).unwrap();
    assert_ne!(changed.uid, a, "changes with the pod");
    let comment = parse(&format!("# a comment\n{POD}")).unwrap();
    assert_eq!(comment.uid, a, "formatting does not count");
    // the same pod as JSON hashes the same: the hash is over the parsed pod
    let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{
        "containers":[{"name":"c","image":"busybox"}],"volumes":[
        {"name":"cache","emptyDir":{"medium":"Memory","sizeLimit":"64Mi"}},
        {"name":"scratch","emptyDir":{}},
        {"name":"data","hostPath":{"path":"/tmp/volumed-demo/data","type":"DirectoryOrCreate"}},
        {"name":"claim","persistentVolumeClaim":{"claimName":"pvc1"}}]}}"#;
    assert_eq!(parse(json).unwrap().uid, a);
    // golden: if this changes (a k8s-openapi upgrade serialising differently,
    // a changed hash input), every static pod without metadata.uid gets a new
    // UID after an upgrade, and its volumes are torn down and set up again
    assert_eq!(a.as_str(), "06f678c41a5d02838d11d764ece7293b");
}

#[test]
fn hostile_uids_and_kinds_are_refused_naming_the_file() {
    for uid in ["../../x", "a/b", "..", "x y"] {
        let y = POD.replace("  name: web\n", &format!("  name: web\n  uid: {uid:?}\n"));
        let e = parse(&y).unwrap_err();
        assert!(matches!(e, SourceError::InvalidPodUid { .. }), "{uid}: {e}");
        assert!(e.to_string().starts_with("/pods/p.yaml: "), "{e}");
    }
    let e = parse(&POD.replace("kind: Pod", "kind: Service")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/pods/p.yaml: kind \"Service\" where Pod was expected"
    );
    let e = parse(&POD.replace("  name: web\n", "  labels: {}\n")).unwrap_err();
    assert_eq!(e.to_string(), "/pods/p.yaml: metadata.name is missing");
    let e = parse(&format!("{POD}---\n{POD}")).unwrap_err();
    assert!(e.to_string().contains("more than one document"), "{e}");
    let e = parse("kind: Pod\nmetadata: [unclosed\n").unwrap_err();
    assert!(
        e.to_string().starts_with("parsing /pods/p.yaml: YAML"),
        "{e}"
    );
    let e = parse("").unwrap_err();
    assert!(e.to_string().contains("no document"), "{e}");
    let e = parse(&POD.replace("apiVersion: v1", "apiVersion: v2")).unwrap_err();
    assert!(e.to_string().starts_with("decoding /pods/p.yaml"), "{e}");
}

fn one_volume(volume: &str) -> ParsedPod {
    parse(&format!(
        "kind: Pod\napiVersion: v1\nmetadata: {{name: p}}\nspec:\n  containers: []\n  volumes:\n{volume}"
    ))
    .unwrap()
}

#[test]
fn bad_and_unsupported_volumes_become_pod_errors_naming_file_and_volume() {
    let table = [
        (
            "  - name: ../etc\n    emptyDir: {}\n",
            "/pods/p.yaml: volume \"../etc\": invalid volume name \"../etc\": not a DNS-1123 label: only a-z, 0-9 and '-' are allowed",
        ),
        (
            // a name shaped like volumed's own interrupted-deletion dirs,
            // which orphan cleanup finishes deleting
            "  - name: data.deleting~1
    emptyDir: {}
",
            "/pods/p.yaml: volume \"data.deleting~1\": invalid volume name \"data.deleting~1\": not a DNS-1123 label: only a-z, 0-9 and '-' are allowed",
        ),
        (
            "  - name: -data
    emptyDir: {}
",
            "/pods/p.yaml: volume \"-data\": invalid volume name \"-data\": not a DNS-1123 label: must start and end with a-z or 0-9",
        ),
        (
            "  - name: Data
    emptyDir: {}
",
            "/pods/p.yaml: volume \"Data\": invalid volume name \"Data\": not a DNS-1123 label: only a-z, 0-9 and '-' are allowed",
        ),
        (
            "  - name: s\n    secret: {}\n",
            "/pods/p.yaml: volume \"s\": secret volume without secretName",
        ),
        (
            "  - name: cm\n    configMap: {name: x, defaultMode: 4096}\n",
            "/pods/p.yaml: volume \"cm\": mode 4096 is not between 0 and 0777",
        ),
        (
            "  - name: pr\n    nfs: {server: x, path: /}\n",
            "/pods/p.yaml: volume \"pr\": unsupported volume type nfs",
        ),
        (
            "  - name: e\n    emptyDir: {sizeLimit: 1Zi}\n",
            "/pods/p.yaml: volume \"e\": invalid quantity \"1Zi\": unknown suffix",
        ),
        (
            "  - name: h\n    emptyDir: {medium: HugePages}\n",
            "/pods/p.yaml: volume \"h\": unsupported volume type emptyDir with medium HugePages",
        ),
        (
            "  - name: r\n    hostPath: {path: rel/dir}\n",
            "/pods/p.yaml: volume \"r\": hostPath \"rel/dir\" must be absolute without '..'",
        ),
        (
            "  - name: r\n    hostPath: {path: /a/../etc}\n",
            "/pods/p.yaml: volume \"r\": hostPath \"/a/../etc\" must be absolute without '..'",
        ),
        (
            "  - name: t\n    hostPath: {path: /a, type: Weird}\n",
            "/pods/p.yaml: volume \"t\": unknown hostPath type \"Weird\"",
        ),
        (
            "  - name: two\n    emptyDir: {}\n    hostPath: {path: /a}\n",
            "/pods/p.yaml: volume \"two\": more than one volume type: emptyDir, hostPath",
        ),
        (
            "  - name: none\n",
            "/pods/p.yaml: volume \"none\": unsupported volume type none",
        ),
    ];
    for (volume, want) in table {
        let good = "  - name: good\n    emptyDir: {}\n";
        let p = one_volume(&format!("{volume}{good}"));
        assert_eq!(p.errors, [want], "{volume}");
        assert_eq!(p.volumes.len(), 1, "the good volume next to it stays");
    }
    let dup = one_volume("  - name: a\n    emptyDir: {}\n  - name: a\n    emptyDir: {}\n");
    assert_eq!(
        dup.errors,
        ["/pods/p.yaml: volume \"a\": duplicate volume name"]
    );
    assert!(dup.failed_volumes.contains("a"));
}

#[test]
fn numeric_size_limits_and_zero_limits_follow_kubernetes() {
    let p = one_volume(
        "  - name: e\n    emptyDir: {sizeLimit: 1000}\n  - name: z\n    emptyDir: {sizeLimit: \"0\"}\n",
    );
    let limits: Vec<_> = p
        .volumes
        .iter()
        .map(|v| match v {
            ParsedVolume::Inline {
                spec: VolumeSpec::EmptyDir { size_limit, .. },
                ..
            } => *size_limit,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(limits, [Some(1000), None]);
}

#[test]
fn selinux_options_and_change_policy_are_carried() {
    let p = parse(
        "kind: Pod\napiVersion: v1\nmetadata: {name: p}\nspec:
  securityContext:
    seLinuxChangePolicy: MountOption
    seLinuxOptions: {level: 's0:c1,c2'}
  initContainers:
  - name: i
    securityContext: {seLinuxOptions: {type: init_t}}
    volumeMounts: [{name: a, mountPath: /a}]
  containers:
  - name: unmounted
    securityContext: {seLinuxOptions: {level: 's0:c9'}}
  - name: plain
    volumeMounts: [{name: a, mountPath: /a}, {name: b, mountPath: /b}]
  - name: c
    securityContext: {seLinuxOptions: {user: u, role: r, type: t, level: s0}}
    volumeMounts: [{name: b, mountPath: /b}]
",
    )
    .unwrap();
    let s = &p.selinux;
    assert_eq!(s.change_policy.as_deref(), Some("MountOption"));
    assert_eq!(
        s.pod.as_ref().and_then(|o| o.level.as_deref()),
        Some("s0:c1,c2")
    );
    let names: Vec<_> = s
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.kind))
        .collect();
    assert_eq!(
        names,
        [
            ("i", ContainerKind::Init),
            ("plain", ContainerKind::Regular),
            ("c", ContainerKind::Regular)
        ],
        "every container that mounts a volume, none that mounts nothing"
    );
    assert_eq!(s.containers[0].volumes, ["a"]);
    assert_eq!(s.containers[1].volumes, ["a", "b"]);
    assert_eq!(s.containers[1].options, None);
    assert_eq!(
        s.containers[2]
            .options
            .as_ref()
            .and_then(|o| o.type_.as_deref()),
        Some("t")
    );
    let for_b: Vec<_> = s
        .options_for("b")
        .map(|(c, o)| (c.name.as_str(), o.and_then(|o| o.level.as_deref())))
        .collect();
    assert_eq!(
        for_b,
        [("plain", Some("s0:c1,c2")), ("c", Some("s0"))],
        "a container's options replace the pod's"
    );
}

/// The payload spec of the only volume of a pod (with `metadata` and
/// `securityContext` as given).
fn payload_of(volume: &str) -> crate::model::PayloadSpec {
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: ns, uid: u1, labels: {{app: web, tier: \"1\"}}}}\nspec:\n  securityContext: {{fsGroup: 2000}}\n  containers: [{{name: c, image: busybox}}]\n  volumes:\n{volume}"
    );
    let p = parse(&yaml).unwrap();
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    match &p.volumes[..] {
        [
            ParsedVolume::Inline {
                spec: VolumeSpec::Payload(s),
                ..
            },
        ] => (**s).clone(),
        other => panic!("not one payload volume: {other:?}"),
    }
}

#[test]
fn payload_volumes_parse_with_items_modes_and_the_pods_fields() {
    use crate::model::{KeyToPath, PayloadKind, PayloadSource};
    let s = payload_of(
        "  - name: cfg\n    configMap:\n      name: app\n      defaultMode: 0440\n      optional: true\n      items: [{key: a, path: dir/a, mode: 0600}]\n",
    );
    assert_eq!(s.kind, PayloadKind::ConfigMap);
    assert_eq!((s.namespace.as_str(), s.default_mode), ("ns", 0o440));
    assert_eq!(s.fs_group, Some(2000));
    assert_eq!(
        s.sources,
        [PayloadSource::ConfigMap {
            name: "app".into(),
            items: Some(vec![KeyToPath {
                key: "a".into(),
                path: "dir/a".into(),
                mode: Some(0o600)
            }]),
            optional: true,
        }]
    );
    assert_eq!(s.pod_fields["metadata.labels"], "app=\"web\"\ntier=\"1\"");
    assert_eq!(s.pod_fields["metadata.labels['app']"], "web");

    let s = payload_of("  - name: creds\n    secret: {secretName: db}\n");
    assert_eq!((s.kind, s.default_mode), (PayloadKind::Secret, 0o644));

    let s = payload_of(
        "  - name: all\n    projected:\n      sources:\n      - configMap: {name: app}\n      - secret: {name: db, optional: true}\n      - downwardAPI: {items: [{path: name, fieldRef: {fieldPath: metadata.name}}]}\n      - serviceAccountToken: {path: token}\n",
    );
    assert_eq!(s.kind, PayloadKind::Projected);
    assert_eq!(s.sources.len(), 4);
    assert_eq!(
        s.sources[3],
        PayloadSource::ServiceAccountToken {
            path: "token".into(),
            audience: None,
            expiration_seconds: 3600,
        },
        "expirationSeconds defaults to an hour"
    );
    let s = payload_of(
        "  - name: t\n    projected:\n      sources:\n      - serviceAccountToken: {path: t, audience: vault, expirationSeconds: 600}\n",
    );
    assert_eq!(
        s.sources[0],
        PayloadSource::ServiceAccountToken {
            path: "t".into(),
            audience: Some("vault".into()),
            expiration_seconds: 600,
        },
        "the least lifetime is accepted"
    );
}

#[test]
fn payload_volumes_the_api_would_refuse_are_errors_naming_the_volume() {
    let cases = [
        (
            "  - name: d\n    downwardAPI: {items: [{path: cpu, resourceFieldRef: {resource: limits.cpu}}]}\n",
            "/pods/p.yaml: volume \"d\": downwardAPI item \"cpu\": only fieldRef is supported (resourceFieldRef needs a container)",
        ),
        (
            "  - name: s\n    secret: {secretName: x, items: [{key: k, path: p, mode: -1}]}\n",
            "/pods/p.yaml: volume \"s\": mode -1 is not between 0 and 0777",
        ),
        (
            "  - name: pr\n    projected: {sources: [{clusterTrustBundle: {path: b}}]}\n",
            "/pods/p.yaml: volume \"pr\": a projected source volumed does not support (clusterTrustBundle, podCertificate)",
        ),
        (
            "  - name: t\n    projected: {sources: [{serviceAccountToken: {path: token, expirationSeconds: 599}}]}\n",
            "/pods/p.yaml: volume \"t\": serviceAccountToken \"token\": expirationSeconds 599 is not between 600 and 4294967296",
        ),
    ];
    for (volume, want) in cases {
        let p = one_volume(volume);
        assert_eq!(p.errors, [want], "{volume}");
    }
}

#[test]
fn every_container_s_mounts_env_and_privilege_are_parsed() {
    let p = parse(
        "\
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: shop
spec:
  initContainers:
  - name: init
    image: busybox
    volumeMounts:
    - {name: data, mountPath: /init}
  containers:
  - name: app
    image: busybox
    securityContext: {privileged: true}
    env:
    - {name: BASE, value: logs}
    - {name: DIR, value: $(BASE)/$(UNKNOWN)}
    - name: POD
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    - name: NS
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    - name: KEY
      valueFrom: {secretKeyRef: {name: s, key: k}}
    volumeMounts:
    - {name: data, mountPath: /data, readOnly: true, mountPropagation: Bidirectional}
    - {name: data, mountPath: /logs, subPathExpr: $(DIR)/$(POD)}
    - {name: cfg, mountPath: /etc/app.conf, subPath: app.conf}
  - name: plain
    image: busybox
    env:
    - {name: X, value: x1}
  volumes:
  - name: data
    emptyDir: {}
  - name: cfg
    emptyDir: {}
",
    )
    .unwrap();
    let names: Vec<&str> = p.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["init", "app", "plain"]);
    let app = &p.containers[1];
    assert!(app.privileged && !p.containers[0].privileged);
    assert_eq!(
        app.mounts[0],
        VolumeMountSpec {
            name: "data".into(),
            mount_path: "/data".into(),
            read_only: true,
            sub_path: SubPath::None,
            propagation: Some("Bidirectional".into()),
        }
    );
    assert_eq!(
        app.mounts[1].sub_path,
        SubPath::Expr("$(DIR)/$(POD)".into())
    );
    assert_eq!(app.mounts[2].sub_path, SubPath::Path("app.conf".into()));
    let env: Vec<(&str, Option<&str>)> = app
        .env
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    assert_eq!(
        env,
        [
            ("BASE", Some("logs")),
            ("DIR", Some("logs/$(UNKNOWN)")),
            ("POD", Some("web-node-1")),
            ("NS", Some("shop")),
            ("KEY", None),
        ]
    );
    // no subPathExpr: the env is not kept
    assert!(p.containers[2].env.is_empty() && p.containers[2].mounts.is_empty());
}

#[test]
fn an_api_pod_s_containers_are_parsed_the_same_way() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-api-1"},
        "spec": {
            "nodeName": "node-1",
            "containers": [{
                "name": "app",
                "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "volumeMounts": [{"name": "data", "mountPath": "/logs", "subPathExpr": "$(NODE)"}]
            }],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }
    }))
    .unwrap();
    let p = parse_pod_object(Path::new("/api/pods/shop/web-0"), &pod, Origin::Api).unwrap();
    assert_eq!(p.name, "web-0", "an API pod keeps its name");
    let app = &p.containers[0];
    assert_eq!(app.mounts[0].sub_path, SubPath::Expr("$(NODE)".into()));
    assert_eq!(app.env[0].value.as_deref(), Some("node-1"));
}
