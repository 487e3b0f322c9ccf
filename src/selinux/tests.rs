//! Table tests: the label computation (the kubelet's `GetMountSELinuxLabel`)
//! and the kubelet's multi-pod truth table
//! (`Test_AddPodToVolume_SELinux_MultiplePods`),
//! run through [`volume_label`] and the real DSW.

use std::collections::BTreeMap;

use super::*;
use crate::model::{AccessMode, PodUid, PodVolume, SeLinuxContext, StorageMedium, VolumeSpec};
use crate::state::{DesiredStateOfWorld, StateError};

const VOL: &str = "data";

fn block_pv(modes: &[AccessMode]) -> VolumeSpec {
    VolumeSpec::Local {
        path: "/dev/loop7".into(),
        fs_type: Some("ext4".into()),
        access_modes: modes.to_vec(),
        mount_options: Default::default(),
        is_block: true,
        volume_mode: Default::default(),
    }
}

fn csi(selinux_mount: bool) -> VolumeSpec {
    VolumeSpec::Csi(Box::new(crate::model::CsiSpec {
        driver: "d.example.com".into(),
        volume_handle: "h".into(),
        fs_type: None,
        access_modes: vec![AccessMode::ReadWriteOncePod],
        mount_options: Default::default(),
        attributes: BTreeMap::new(),
        selinux_mount,
        ..Default::default()
    }))
}

fn level(l: &str) -> SeLinuxOptions {
    SeLinuxOptions {
        level: Some(l.into()),
        ..SeLinuxOptions::default()
    }
}

fn container(name: &str, options: Option<SeLinuxOptions>, volumes: &[&str]) -> ContainerSeLinux {
    ContainerSeLinux {
        name: name.into(),
        kind: ContainerKind::Regular,
        options,
        volumes: volumes.iter().map(|v| v.to_string()).collect(),
    }
}

/// A pod whose two containers mount [`VOL`] with levels `s0:c1,c2` and
/// `s0:c3,c4`, with `policy` as its change policy.
fn disagreeing(policy: Option<&str>) -> PodSeLinux {
    PodSeLinux {
        pod: None,
        change_policy: policy.map(str::to_owned),
        containers: vec![
            container("a", Some(level("s0:c1,c2")), &[VOL]),
            container("b", Some(level("s0:c3,c4")), &[VOL]),
        ],
    }
}

/// A pod whose one container mounts [`VOL`], with the pod-level level (if
/// any) and change policy.
fn pod(lvl: Option<&str>, policy: Option<&str>) -> PodSeLinux {
    PodSeLinux {
        pod: lvl.map(level),
        change_policy: policy.map(str::to_owned),
        containers: vec![container("c", None, &[VOL])],
    }
}

fn gates(rwop: bool, mount: bool, change_policy: bool) -> FeatureGates {
    FeatureGates {
        rwop,
        mount,
        change_policy,
    }
}

fn on(g: FeatureGates) -> Policy {
    Policy::enabled(g, FileDefaults::default())
}

/// Only a host that does SELinux, with the first wave's gate, labels
/// volumes; otherwise no volume gets a label, not even a pod's explicit one
/// (so no pod can be refused a volume for it).
#[test]
fn volumes_get_labels_only_on_a_selinux_host_with_the_rwop_gate() {
    let rwop = block_pv(&[AccessMode::ReadWriteOncePod]);
    let explicit = pod(Some("s0:c1,c2"), None);
    for (what, policy, labels) in [
        ("no SELinux", Policy::disabled(), false),
        ("gates on", on(FeatureGates::default()), true),
        ("rwop gate off", on(gates(false, false, false)), false),
    ] {
        assert_eq!(policy.labels_volumes(), labels, "{what}");
        let got = volume_label(&policy, &explicit, VOL, &rwop);
        assert_eq!(got.effective.is_some(), labels, "{what}: {got:?}");
    }
}

#[test]
fn the_label_comes_from_the_containers_that_mount_the_volume_with_blanks_from_the_host() {
    let all = on(FeatureGates::default());
    let rwop = block_pv(&[AccessMode::ReadWriteOncePod]);
    let staff = SeLinuxOptions {
        user: Some("staff_u".into()),
        role: Some("staff_r".into()),
        type_: Some("spc_t".into()),
        level: Some("s0:c20,c10".into()),
    };
    struct Row {
        what: &'static str,
        pod: PodSeLinux,
        want: Option<&'static str>,
        problem: Option<(ProblemKind, bool)>,
    }
    let rows = [
        Row {
            what: "pod level, container without options",
            pod: pod(Some("s0:c1,c2"), None),
            want: Some("system_u:object_r:container_file_t:s0:c1,c2"),
            problem: None,
        },
        Row {
            what: "no options anywhere: no label (KEP-1710, the kubelet's \"\")",
            pod: pod(None, None),
            want: None,
            problem: None,
        },
        Row {
            what: "user, role and type without a level: no label",
            pod: PodSeLinux {
                pod: Some(SeLinuxOptions {
                    level: None,
                    ..staff.clone()
                }),
                change_policy: None,
                containers: vec![container("c", None, &[VOL])],
            },
            want: None,
            problem: None,
        },
        Row {
            what: "container options without a level replace a pod level: no label",
            pod: PodSeLinux {
                pod: Some(level("s0:c1,c2")),
                change_policy: None,
                containers: vec![container(
                    "c",
                    Some(SeLinuxOptions {
                        user: Some("staff_u".into()),
                        ..SeLinuxOptions::default()
                    }),
                    &[VOL],
                )],
            },
            want: None,
            problem: None,
        },
        Row {
            what: "one container without a level, one with: two labels, the pod context mismatch",
            pod: PodSeLinux {
                pod: None,
                change_policy: None,
                containers: vec![
                    container("a", None, &[VOL]),
                    container("b", Some(level("s0:c3,c4")), &[VOL]),
                ],
            },
            want: None,
            problem: Some((ProblemKind::PodContextMismatch, true)),
        },
        Row {
            what: "container options replace the pod's as a whole; user and level kept, role and type name the process",
            pod: PodSeLinux {
                pod: Some(level("s0:c1,c2")),
                change_policy: None,
                containers: vec![container("c", Some(staff.clone()), &[VOL])],
            },
            want: Some("staff_u:object_r:container_file_t:s0:c10,c20"),
            problem: None,
        },
        Row {
            what: "categories are normalised, so c20,c10 and c10,c20 agree",
            pod: PodSeLinux {
                pod: None,
                change_policy: None,
                containers: vec![
                    container("a", Some(level("s0:c20,c10")), &[VOL]),
                    container("b", Some(level("s0:c10,c20")), &["other", VOL]),
                ],
            },
            want: Some("system_u:object_r:container_file_t:s0:c10,c20"),
            problem: None,
        },
        Row {
            what: "a container that does not mount the volume does not count",
            pod: PodSeLinux {
                pod: None,
                change_policy: None,
                containers: vec![
                    container("a", Some(level("s0:c1,c2")), &[VOL]),
                    container("b", Some(level("s0:c3,c4")), &["other"]),
                ],
            },
            want: Some("system_u:object_r:container_file_t:s0:c1,c2"),
            problem: None,
        },
        Row {
            what: "no container mounts it: no label",
            pod: PodSeLinux {
                pod: Some(level("s0:c1,c2")),
                change_policy: None,
                containers: vec![container("a", None, &["other"])],
            },
            want: None,
            problem: None,
        },
        Row {
            what: "two containers, two labels: the pod context mismatch, fatal on RWOP",
            pod: PodSeLinux {
                pod: Some(level("s0:c1,c2")),
                change_policy: None,
                containers: vec![
                    container("a", None, &[VOL]),
                    container("b", Some(level("s0:c3,c4")), &[VOL]),
                ],
            },
            want: None,
            problem: Some((ProblemKind::PodContextMismatch, true)),
        },
        Row {
            what: "a level that makes no label: a translation error",
            pod: pod(Some("s0:c1 c2\""), None),
            want: None,
            problem: Some((ProblemKind::Translation, true)),
        },
        Row {
            what: "Recursive opts out",
            pod: pod(Some("s0:c1,c2"), Some("Recursive")),
            want: None,
            problem: None,
        },
        Row {
            what: "Recursive does not excuse containers that disagree",
            pod: disagreeing(Some("Recursive")),
            want: None,
            problem: Some((ProblemKind::PodContextMismatch, true)),
        },
        Row {
            what: "MountOption is the default",
            pod: pod(Some("s0:c1,c2"), Some("MountOption")),
            want: Some("system_u:object_r:container_file_t:s0:c1,c2"),
            problem: None,
        },
    ];
    for r in rows {
        let got = volume_label(&all, &r.pod, VOL, &rwop);
        assert_eq!(
            got.effective.as_ref().map(SeLinuxContext::as_str),
            r.want,
            "{}",
            r.what
        );
        assert_eq!(got.check.original, got.effective, "{}", r.what);
        assert!(got.check.strict, "{}: RWOP is strict", r.what);
        assert_eq!(
            got.problem.as_ref().map(|p| (p.kind, p.fatal)),
            r.problem,
            "{}: {:?}",
            r.what,
            got.problem
        );
    }
    let mismatch = volume_label(&all, &disagreeing(None), VOL, &rwop);
    let msg = mismatch.problem.unwrap().message;
    assert!(
        msg.contains("multiple SELinux labels found: system_u:object_r:container_file_t:s0:c1,c2,system_u:object_r:container_file_t:s0:c3,c4"),
        "{msg}"
    );
}

#[test]
fn no_label_without_host_support_gate_or_a_plugin_that_can_mount_with_a_context() {
    let labelled = pod(Some("s0:c1,c2"), None);
    let rwop = block_pv(&[AccessMode::ReadWriteOncePod]);
    let dir_pv = VolumeSpec::Local {
        path: "/mnt/disks/d1".into(),
        fs_type: None,
        access_modes: vec![AccessMode::ReadWriteOncePod],
        mount_options: Default::default(),
        is_block: false,
        volume_mode: Default::default(),
    };
    let tmpfs = VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: None,
    };
    let rows: Vec<(&str, Policy, VolumeSpec, bool)> = vec![
        (
            "host without SELinux",
            Policy::disabled(),
            rwop.clone(),
            false,
        ),
        (
            "RWOP gate off",
            on(FeatureGates::all_off()),
            rwop.clone(),
            false,
        ),
        ("block local PV", on(FeatureGates::default()), rwop, true),
        (
            "directory local PV",
            on(FeatureGates::default()),
            dir_pv,
            false,
        ),
        ("tmpfs emptyDir", on(FeatureGates::default()), tmpfs, false),
        (
            "CSI, seLinuxMount: true",
            on(FeatureGates::default()),
            csi(true),
            true,
        ),
        (
            "CSI without seLinuxMount",
            on(FeatureGates::default()),
            csi(false),
            false,
        ),
    ];
    for (what, policy, spec, labelled_mount) in rows {
        let got = volume_label(&policy, &labelled, VOL, &spec);
        assert_eq!(got.effective.is_some(), labelled_mount, "{what}");
        if !labelled_mount {
            assert_eq!(got, VolumeLabel::default(), "{what}: no check either");
        }
    }
    // The kubelet checks a pod's own containers whatever the plugin: on an
    // RWOP directory PV (a plugin without context mounts) they are an error.
    let two = disagreeing(None);
    let dir_rwop = VolumeSpec::Local {
        path: "/mnt/disks/d2".into(),
        fs_type: None,
        access_modes: vec![AccessMode::ReadWriteOncePod],
        mount_options: Default::default(),
        is_block: false,
        volume_mode: Default::default(),
    };
    let got = volume_label(&on(FeatureGates::default()), &two, VOL, &dir_rwop);
    let p = got.problem.expect("a problem");
    assert_eq!((p.kind, p.fatal), (ProblemKind::PodContextMismatch, true));
    assert!(
        !got.check.strict,
        "no comparison between pods without plugin support"
    );
}

#[test]
fn metric_labels_rank_access_modes_as_the_kubelet_does() {
    use AccessMode::*;
    let rows: &[(&[AccessMode], &str)] = &[
        (&[ReadWriteOncePod], "RWOP"),
        (&[ReadWriteOnce], "RWO"),
        (&[ReadWriteOnce, ReadWriteOncePod], "RWO"),
        (&[ReadOnlyMany, ReadWriteOnce], "ROX"),
        (&[ReadWriteMany, ReadOnlyMany], "RWX"),
        (&[], ""),
    ];
    for (modes, want) in rows {
        assert_eq!(access_mode_label(&block_pv(modes)), *want, "{modes:?}");
    }
    let tmpfs = VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: None,
    };
    assert_eq!(access_mode_label(&tmpfs), "inline");
    assert_eq!(volume_plugin_label(&tmpfs), "kubernetes.io/empty-dir");
    assert_eq!(
        volume_plugin_label(&csi(true)),
        "kubernetes.io/csi/d.example.com"
    );
    assert_eq!(
        volume_plugin_label(&block_pv(&[])),
        "kubernetes.io/local-volume"
    );
}

/// What happened to each pod, and the label the volume is mounted with.
#[derive(Debug, PartialEq, Eq)]
enum Added {
    Ok,
    Warning,
    Error,
}

/// Adds `pods` to one volume in order, as `sources::apply_event` does.
fn add_all(
    policy: &Policy,
    spec: &VolumeSpec,
    pods: &[PodSeLinux],
) -> (Vec<Added>, Option<String>) {
    let mut dsw = DesiredStateOfWorld::new();
    let mut results = vec![];
    let mut volume = None;
    for (i, p) in pods.iter().enumerate() {
        let uid = PodUid::new(format!("pod-{i}")).unwrap();
        let label = volume_label(policy, p, VOL, spec);
        assert_eq!(label.problem, None, "the table's pods are consistent");
        let name = PodVolume::unique_name(spec, &uid, "pv1");
        let pv = PodVolume {
            volume: name.clone(),
            spec_name: "pv1".into(),
            outer_name: VOL.into(),
            spec: spec.clone().into(),
            selinux: label.effective,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        };
        volume = Some(name);
        results.push(match dsw.add_pod_to_volume(&uid, pv, label.check) {
            Ok(a) if a.conflict.is_some() => Added::Warning,
            Ok(_) => Added::Ok,
            Err(StateError::AddPodToVolume { conflict, .. }) => {
                let msg = conflict.to_string();
                assert!(
                    msg.starts_with("conflicting SELinux labels of volume pv1: \""),
                    "{msg}"
                );
                Added::Error
            }
            Err(e) => panic!("unexpected {e}"),
        });
    }
    let label = volume
        .and_then(|v| dsw.volume(&v).and_then(|v| v.effective_selinux.clone()))
        .map(|c| c.as_str().to_owned());
    (results, label)
}

#[test]
fn the_kubelets_multiple_pods_truth_table() {
    use Added::*;
    let rwop = block_pv(&[AccessMode::ReadWriteOncePod]);
    let rwx = block_pv(&[AccessMode::ReadWriteMany]);
    let l1 = "system_u:object_r:container_file_t:s0:c1,c2";
    let p = |lvl: &str, policy: Option<&str>| pod(Some(lvl), policy);
    let (a, b) = ("s0:c1,c2", "s0:c3,c4");
    let only_rwop = on(gates(true, false, false));
    let with_change = on(gates(true, false, true));
    let all = on(gates(true, true, true));
    type Case<'a> = (
        &'a str,
        &'a Policy,
        &'a VolumeSpec,
        Vec<PodSeLinux>,
        Vec<Added>,
        Option<&'a str>,
    );
    let mut rows: Vec<Case> = vec![
        (
            "RWOP, same label",
            &only_rwop,
            &rwop,
            vec![p(a, None), p(a, None)],
            vec![Ok, Ok],
            Some(l1),
        ),
        (
            "RWOP, different label",
            &only_rwop,
            &rwop,
            vec![p(a, None), p(b, None)],
            vec![Ok, Error],
            Some(l1),
        ),
        (
            "RWX with only the RWOP gate: a warning, no label",
            &only_rwop,
            &rwx,
            vec![p(a, None), p(b, None)],
            vec![Ok, Warning],
            None,
        ),
        (
            "RWOP, ChangePolicy: Recursive + Recursive",
            &with_change,
            &rwop,
            vec![p(a, Some("Recursive")), p(b, Some("Recursive"))],
            vec![Ok, Ok],
            None,
        ),
        (
            "RWOP, ChangePolicy: Recursive vs nil",
            &with_change,
            &rwop,
            vec![p(a, Some("Recursive")), p(a, None)],
            vec![Ok, Error],
            None,
        ),
        (
            "RWX, ChangePolicy without SELinuxMount: labels differ",
            &with_change,
            &rwx,
            vec![p(a, None), p(b, None)],
            vec![Ok, Warning],
            None,
        ),
        (
            "RWX, ChangePolicy without SELinuxMount: MountOption vs Recursive",
            &with_change,
            &rwx,
            vec![p(a, Some("MountOption")), p(a, Some("Recursive"))],
            vec![Ok, Warning],
            None,
        ),
        (
            "RWX, all gates: MountOption + MountOption, same label",
            &all,
            &rwx,
            vec![p(a, Some("MountOption")), p(a, Some("MountOption"))],
            vec![Ok, Ok],
            Some(l1),
        ),
        (
            "RWX, all gates: nil + MountOption",
            &all,
            &rwx,
            vec![p(a, None), p(a, Some("MountOption"))],
            vec![Ok, Ok],
            Some(l1),
        ),
        (
            "RWX, all gates: MountOption vs Recursive",
            &all,
            &rwx,
            vec![p(a, Some("MountOption")), p(a, Some("Recursive"))],
            vec![Ok, Error],
            Some(l1),
        ),
        (
            "RWX, all gates: Recursive + Recursive, different labels",
            &all,
            &rwx,
            vec![p(a, Some("Recursive")), p(b, Some("Recursive"))],
            vec![Ok, Ok],
            None,
        ),
        (
            "RWX, all gates: MountOption + MountOption, different labels",
            &all,
            &rwx,
            vec![p(a, Some("MountOption")), p(b, Some("MountOption"))],
            vec![Ok, Error],
            Some(l1),
        ),
    ];
    // Not in the kubelet's table, but its rule: a pod without a level has
    // the label "", which differs from any other.
    let no_level = || pod(None, None);
    rows.extend([
        (
            "RWOP: no level, then a level",
            &only_rwop,
            &rwop,
            vec![no_level(), p(a, None)],
            vec![Ok, Error],
            None,
        ),
        (
            "RWOP: a level, then no level",
            &only_rwop,
            &rwop,
            vec![p(a, None), no_level()],
            vec![Ok, Error],
            Some(l1),
        ),
        (
            "RWOP: no level twice",
            &only_rwop,
            &rwop,
            vec![no_level(), no_level()],
            vec![Ok, Ok],
            None,
        ),
        (
            "RWX with only the RWOP gate: no level, then a level, a warning",
            &only_rwop,
            &rwx,
            vec![no_level(), p(a, None)],
            vec![Ok, Warning],
            None,
        ),
    ]);
    for (what, policy, spec, pods, want, label) in rows {
        let (got, got_label) = add_all(policy, spec, &pods);
        assert_eq!(got, want, "{what}");
        assert_eq!(got_label.as_deref(), label, "{what}");
    }
}

#[test]
fn problems_are_warnings_where_the_volume_does_not_support_selinux_mounts() {
    let two = disagreeing(None);
    let rwx = block_pv(&[AccessMode::ReadWriteMany]);
    let got = volume_label(&on(gates(true, false, true)), &two, VOL, &rwx);
    let p = got.problem.expect("a warning");
    assert_eq!((p.kind, p.fatal), (ProblemKind::PodContextMismatch, false));
    assert_eq!(got.effective, None);
    assert_eq!(
        got.check.original, None,
        "the warning case adds the volume with no label"
    );
    assert_eq!(
        Counter::for_problem(&p),
        Counter::PodContextMismatchWarnings
    );
    let bad = pod(Some("s0:c1,c2 x"), None);
    let got = volume_label(&on(gates(true, false, true)), &bad, VOL, &rwx);
    assert_eq!(
        got.problem.map(|p| Counter::for_problem(&p)),
        Some(Counter::ContainerWarnings)
    );
    let got = volume_label(&on(FeatureGates::default()), &bad, VOL, &rwx);
    assert_eq!(
        got.problem.map(|p| Counter::for_problem(&p)),
        Some(Counter::ContainerErrors),
        "with SELinuxMount every access mode is strict"
    );
}

#[test]
fn file_label_needs_a_level_and_fills_other_blanks_from_the_defaults() {
    let d = FileDefaults::default();
    assert_eq!(file_label(None, &d), Ok(None), "no options: no label");
    let no_level = SeLinuxOptions {
        user: Some("staff_u".into()),
        role: Some("staff_r".into()),
        type_: Some("spc_t".into()),
        level: None,
    };
    assert_eq!(
        file_label(Some(&no_level), &d),
        Ok(None),
        "no level: no label"
    );
    assert_eq!(
        file_label(Some(&level("s0:c1,c2")), &d)
            .unwrap()
            .map(|l| l.as_str().to_owned())
            .as_deref(),
        Some("system_u:object_r:container_file_t:s0:c1,c2")
    );
    let custom = FileDefaults {
        user: "u".into(),
        role: "r".into(),
        type_: "t".into(),
        level: "s0:c0".into(),
        source: "test".into(),
    };
    assert_eq!(
        file_label(Some(&level("s0:c5")), &custom)
            .unwrap()
            .map(|l| l.as_str().to_owned())
            .as_deref(),
        Some("u:r:t:s0:c5")
    );
    let e = file_label(Some(&level("s0:c1\",c2")), &d).unwrap_err();
    assert!(e.contains("failed to construct SELinux label"), "{e}");
}
