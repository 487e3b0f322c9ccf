//! Tests of the sources as a whole: listing, diff, apply_event, polling.

use std::path::Path;

use super::load::PARALLEL_PARSE_FROM;
use super::*;
use crate::model::{StorageMedium, UniqueVolumeName, VolumeSpec};
use crate::state::DesiredStateOfWorld;

struct Dirs {
    _tmp: tempfile::TempDir,
    pods: PathBuf,
    objects: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let pods = tmp.path().join("pods");
    let objects = tmp.path().join("objects");
    std::fs::create_dir(&pods).unwrap();
    std::fs::create_dir(&objects).unwrap();
    Dirs {
        _tmp: tmp,
        pods,
        objects,
    }
}

fn sources(d: &Dirs) -> Sources {
    let mut c = SourcesConfig::new("node1");
    c.pods_dir = Some(d.pods.clone());
    c.objects_dir = Some(d.objects.clone());
    Sources::new(c)
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

fn pod(name: &str, uid: &str, volumes: &str) -> String {
    let uid = if uid.is_empty() {
        String::new()
    } else {
        format!(", uid: {uid}")
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}{uid}}}\nspec:\n  containers: []\n  volumes:\n{volumes}"
    )
}

const EMPTY_DIR: &str = "  - name: cache\n    emptyDir: {}\n";
const CLAIM: &str = "  - name: data\n    persistentVolumeClaim: {claimName: pvc1}\n";
const PV_PVC: &str = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv1}
spec: {claimRef: {namespace: default, name: pvc1}, local: {path: /mnt/pv1}}
---
apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: pvc1}\nspec: {volumeName: pv1}
";

fn uid(s: &str) -> PodUid {
    PodUid::new(s).unwrap()
}

fn names(pods: &BTreeMap<PodUid, DesiredPod>) -> Vec<&str> {
    pods.values().map(|p| p.name.as_str()).collect()
}

#[test]
fn listing_reads_every_name_but_dotfiles_and_skips_subdirs() {
    let d = dirs();
    write(&d.pods, "a.yaml", &pod("a", "", EMPTY_DIR));
    let json =
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b"},"spec":{"containers":[]}}"#;
    write(&d.pods, "b.json", json);
    write(&d.pods, "c.manifest", &pod("c", "", ""));
    write(&d.pods, ".d.yaml", &pod("d", "", ""));
    // any other name counts, as with the kubelet: a backup is a pod, a
    // README is an error naming it
    write(&d.pods, "a.yaml~", &pod("backup", "", ""));
    write(&d.pods, "f.conf", &pod("f", "", ""));
    write(&d.pods, "README.md", "# not a pod\n");
    std::fs::create_dir(d.pods.join("sub")).unwrap();
    write(&d.pods.join("sub"), "e.yaml", &pod("e", "", ""));
    let got = sources(&d).list();
    let errs: Vec<String> = got.file_errors.iter().map(ToString::to_string).collect();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].contains(&d.pods.join("README.md").display().to_string()),
        "{errs:?}"
    );
    let mut n = names(&got.pods);
    n.sort();
    assert_eq!(
        n,
        ["a-node1", "b-node1", "backup-node1", "c-node1", "f-node1"]
    );
}

#[test]
fn hostile_files_are_reported_and_the_good_pods_next_to_them_produced() {
    let d = dirs();
    write(&d.pods, "good.yaml", &pod("good", "", EMPTY_DIR));
    write(&d.pods, "bad.yaml", "kind: Pod\nmetadata: {name: [\n");
    write(&d.pods, "uid.yaml", &pod("evil", "\"../../x\"", EMPTY_DIR));
    write(
        &d.pods,
        "vol.yaml",
        &pod(
            "v",
            "",
            "  - name: ../etc\n    emptyDir: {}\n  - name: s\n    secret: {}\n",
        ),
    );
    let got = sources(&d).list();
    let mut errs: Vec<String> = got.file_errors.iter().map(ToString::to_string).collect();
    errs.sort();
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(errs[0].starts_with(&format!(
        "{}: invalid pod uid",
        d.pods.join("uid.yaml").display()
    )));
    assert!(errs[1].starts_with(&format!("parsing {}", d.pods.join("bad.yaml").display())));
    let mut n = names(&got.pods);
    n.sort();
    assert_eq!(n, ["good-node1", "v-node1"]);
    let v = got.pods.values().find(|p| p.name == "v-node1").unwrap();
    assert!(v.volumes.is_empty());
    assert_eq!(v.errors.len(), 2, "{:?}", v.errors);
    assert!(
        v.errors
            .iter()
            .all(|e| e.starts_with(&d.pods.join("vol.yaml").display().to_string()))
    );
}

#[test]
fn claims_resolve_through_the_objects_or_become_pod_errors() {
    let d = dirs();
    write(
        &d.pods,
        "p.yaml",
        &pod("p", "u1", &format!("{CLAIM}{EMPTY_DIR}")),
    );
    let mut s = sources(&d);
    let got = s.list();
    let p = &got.pods[&uid("u1")];
    assert_eq!(p.volumes.len(), 1, "the emptyDir still works");
    assert_eq!(p.unresolved.iter().collect::<Vec<_>>(), ["data"]);
    assert!(
        p.errors[0].contains("persistentVolumeClaim default/pvc1: not found"),
        "{:?}",
        p.errors
    );

    write(&d.objects, "o.yaml", PV_PVC);
    let got = s.list();
    let p = &got.pods[&uid("u1")];
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let data = p.volumes.iter().find(|v| v.outer_name == "data").unwrap();
    assert_eq!(data.volume.as_str(), "kubernetes.io/local-volume/pv1");
    assert_eq!(data.spec_name, "pv1");
}

/// A claim's `readOnly` reaches the pod's volume; a generic ephemeral
/// volume resolves its claim `<pod>-<volume>` only when the pod controls
/// it, else the pod gets the kubelet's error for that volume alone.
#[test]
fn a_read_only_claim_and_an_owned_ephemeral_claim_resolve_per_pod() {
    let d = dirs();
    let volumes = "  - name: data\n    persistentVolumeClaim: {claimName: pvc1, readOnly: true}
  - name: scratch\n    ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce]}}}\n";
    write(&d.pods, "p.yaml", &pod("p", "u1", volumes));
    let eph = |owner: &str| {
        format!(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {{name: pv-eph}}
spec: {{claimRef: {{namespace: default, name: p-node1-scratch}}, local: {{path: /mnt/eph}}}}
---
apiVersion: v1\nkind: PersistentVolumeClaim
metadata:
  name: p-node1-scratch
  ownerReferences:
  - {{apiVersion: v1, kind: Pod, name: p-node1, uid: {owner}, controller: true}}
spec: {{volumeName: pv-eph}}
"
        )
    };
    write(&d.objects, "o.yaml", PV_PVC);
    write(&d.objects, "eph.yaml", &eph("someone-else"));
    let mut s = sources(&d);
    let got = s.list();
    let p = &got.pods[&uid("u1")];
    let data = p.volumes.iter().find(|v| v.outer_name == "data").unwrap();
    assert!(data.read_only, "the claim's readOnly is the pod's");
    assert_eq!(p.unresolved.iter().collect::<Vec<_>>(), ["scratch"]);
    assert_eq!(
        p.errors,
        [format!(
            "{}: volume \"scratch\": persistentVolumeClaim default/p-node1-scratch: \
             PVC default/p-node1-scratch was not created for pod default/p-node1 (pod is not owner)",
            d.pods.join("p.yaml").display()
        )]
    );

    write(&d.objects, "eph.yaml", &eph("u1"));
    let got = s.list();
    let p = &got.pods[&uid("u1")];
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let scratch = p
        .volumes
        .iter()
        .find(|v| v.outer_name == "scratch")
        .unwrap();
    assert_eq!(scratch.volume.as_str(), "kubernetes.io/local-volume/pv-eph");
    assert!(!scratch.read_only);
}

#[test]
fn duplicate_uids_keep_the_first_file() {
    let d = dirs();
    write(&d.pods, "a.yaml", &pod("a", "same", ""));
    write(&d.pods, "b.yaml", &pod("b", "same", ""));
    let got = sources(&d).list();
    assert_eq!(names(&got.pods), ["a-node1"]);
    assert!(got.file_errors[0].to_string().contains("already used by"));
}

/// UIDs whose order is not their files': each UID goes to its first file,
/// and every later file is an error naming the winner, in path order.
#[test]
fn duplicates_are_reported_in_path_order_whatever_their_uids() {
    let d = dirs();
    for (file, u) in [
        ("a", "u2"),
        ("b", "u1"),
        ("c", "u2"),
        ("d", "u1"),
        ("e", "u2"),
    ] {
        write(&d.pods, &format!("{file}.yaml"), &pod(file, u, ""));
    }
    let got = sources(&d).list();
    assert_eq!(names(&got.pods), ["b-node1", "a-node1"]);
    let lost: Vec<(String, &str, String)> = (got.file_errors.iter())
        .map(|e| match e {
            SourceError::DuplicatePod { file, uid, other } => (
                file.file_name().unwrap().to_string_lossy().into_owned(),
                uid.as_str(),
                other.file_name().unwrap().to_string_lossy().into_owned(),
            ),
            e => panic!("{e}"),
        })
        .collect();
    let want = [("c", "u2", "a"), ("d", "u1", "b"), ("e", "u2", "a")]
        .map(|(f, u, o)| (format!("{f}.yaml"), u, format!("{o}.yaml")));
    assert_eq!(lost, want);
}

/// Enough manifests to be parsed on two threads: every pod comes out once,
/// a bad file in either half is named, and a UID used in both halves keeps
/// the first file's pod, as with one thread.
#[test]
fn many_manifests_parsed_on_two_threads_give_what_one_would() {
    let n = 2 * PARALLEL_PARSE_FROM + 3;
    let d = dirs();
    for i in 0..n {
        write(
            &d.pods,
            &format!("p{i:03}.yaml"),
            &pod(&format!("p{i}"), "", EMPTY_DIR),
        );
    }
    write(&d.pods, "a-bad.yaml", "kind: Pod\nmetadata: {name: [\n");
    write(&d.pods, "z-bad.yaml", "kind: Pod\nmetadata: {name: [\n");
    write(&d.pods, "a-dup.yaml", &pod("first", "same", EMPTY_DIR));
    write(&d.pods, "z-dup.yaml", &pod("second", "same", EMPTY_DIR));
    let got = sources(&d).list();
    assert_eq!(got.pods.len(), n + 1, "{:?}", names(&got.pods));
    assert_eq!(got.pods[&uid("same")].name, "first-node1");
    let errs: Vec<String> = got.file_errors.iter().map(ToString::to_string).collect();
    assert_eq!(errs.len(), 3, "{errs:?}");
    for bad in ["a-bad.yaml", "z-bad.yaml"] {
        let file = d.pods.join(bad).display().to_string();
        assert!(errs.iter().any(|e| e.contains(&file)), "{bad}: {errs:?}");
    }
    assert!(
        errs.iter().any(|e| e.contains("already used by")),
        "{errs:?}"
    );
}

fn desired(name: &str, u: &str, volumes: Vec<PodVolume>) -> DesiredPod {
    DesiredPod {
        uid: uid(u),
        namespace: "default".into(),
        name: name.into(),
        file: PathBuf::from(format!("/p/{name}")),
        volumes,
        unresolved: BTreeSet::new(),
        errors: vec![],
        selinux: PodSeLinux::default(),
        claims: Default::default(),
        containers: Vec::new(),
    }
}

fn empty_dir(u: &str, name: &str) -> PodVolume {
    let spec = VolumeSpec::EmptyDir {
        medium: StorageMedium::Disk,
        size_limit: None,
    };
    PodVolume {
        volume: PodVolume::unique_name(&spec, &uid(u), name),
        spec_name: name.into(),
        outer_name: name.into(),
        spec: spec.into(),
        selinux: None,
        csi_pod: None,
        read_only: false,
        fs_group: None,
        supplemental_gid: None,
    }
}

#[test]
fn diff_reports_adds_updates_and_removes() {
    let map = |pods: Vec<DesiredPod>| pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
    let a = desired("a", "a", vec![]);
    let b = desired("b", "b", vec![]);
    let b2 = desired("b", "b", vec![empty_dir("b", "x")]);
    let c = desired("c", "c", vec![]);
    let old = map(vec![a.clone(), b]);
    let new = map(vec![b2.clone(), c.clone()]);
    assert_eq!(
        diff(&old, &new),
        [
            SourceEvent::PodRemoved(uid("a")),
            SourceEvent::PodUpdated(b2),
            SourceEvent::PodAdded(c)
        ]
    );
    assert!(diff(&new, &new).is_empty());
}

/// What the static source keeps between polls (fingerprints) moves with
/// the events: a kept pod (its manifest unreadable now) is neither
/// removed nor updated, and a second advance to the same pods says nothing.
#[test]
fn advance_moves_pods_into_events_and_keeps_fingerprints_current() {
    let map = |pods: Vec<DesiredPod>| -> BTreeMap<PodUid, DesiredPod> {
        pods.into_iter().map(|p| (p.uid.clone(), p)).collect()
    };
    let prints = |m: &BTreeMap<PodUid, DesiredPod>| -> Vec<u64> {
        m.values().map(signature::fingerprint).collect()
    };
    let (a, b, c, k) = (
        desired("a", "a", vec![]),
        desired("b", "b", vec![]),
        desired("c", "c", vec![]),
        desired("k", "k", vec![]),
    );
    let b2 = desired("b", "b", vec![empty_dir("b", "x")]);
    let before = map(vec![a, b, k]);
    let mut current: BTreeMap<PodUid, u64> = before.keys().cloned().zip(prints(&before)).collect();
    let kept: BTreeSet<PodUid> = [uid("k")].into();
    let new = map(vec![b2.clone(), c.clone()]);
    let now = prints(&new);
    let events = events::advance(&mut current, new.clone(), &now, &kept);
    assert_eq!(
        events,
        [
            SourceEvent::PodRemoved(uid("a")),
            SourceEvent::PodUpdated(b2),
            SourceEvent::PodAdded(c)
        ]
    );
    let mut want: BTreeMap<PodUid, u64> = new.keys().cloned().zip(now.clone()).collect();
    want.insert(uid("k"), current[&uid("k")]);
    assert_eq!(current, want, "kept k keeps its fingerprint; a is gone");
    assert!(events::advance(&mut current, new.clone(), &now, &kept).is_empty());
    // gone after the last new pod: removed too, kept k still kept
    let (first, _) = new.iter().next().map(|(u, p)| (u.clone(), p)).unwrap();
    let only_b: BTreeMap<PodUid, DesiredPod> =
        new.into_iter().filter(|(u, _)| *u == first).collect();
    let events = events::advance(&mut current, only_b, &now[..1], &kept);
    assert_eq!(events, [SourceEvent::PodRemoved(uid("c"))]);
    assert_eq!(current.keys().collect::<Vec<_>>(), [&uid("b"), &uid("k")]);
}

#[test]
fn apply_event_keeps_a_pods_volumes_when_its_claim_stops_resolving() {
    let d = dirs();
    write(&d.objects, "o.yaml", PV_PVC);
    write(
        &d.pods,
        "p.yaml",
        &pod("p", "u1", &format!("{CLAIM}{EMPTY_DIR}")),
    );
    let mut s = sources(&d);
    let mut dsw = DesiredStateOfWorld::new();
    for e in s.poll_changes().unwrap() {
        apply_event(&mut dsw, e, &crate::selinux::Policy::disabled());
    }
    let pv = UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1");
    let cache = UniqueVolumeName::from_raw("kubernetes.io/empty-dir/u1-cache");
    assert_eq!(dsw.volumes_of_pod(&uid("u1")), [cache.clone(), pv.clone()]);
    assert!(dsw.is_populated());

    // the PV's claimRef now names another claim: error, mounts kept
    let other = PV_PVC.replace("name: pvc1}, local", "name: other}, local");
    write(&d.objects, "o.yaml", &other);
    let events = s.poll_changes().unwrap();
    assert!(
        matches!(events[..], [SourceEvent::PodUpdated(_)]),
        "{events:?}"
    );
    for e in events {
        apply_event(&mut dsw, e, &crate::selinux::Policy::disabled());
    }
    assert_eq!(dsw.volumes_of_pod(&uid("u1")), [cache.clone(), pv.clone()]);
    let errors = dsw.pop_pod_errors(&uid("u1"));
    assert!(
        errors[0].contains("has claimRef default/other"),
        "{errors:?}"
    );

    // the volume removed from the manifest: now it goes
    write(&d.pods, "p.yaml", &pod("p", "u1", EMPTY_DIR));
    for e in s.poll_changes().unwrap() {
        apply_event(&mut dsw, e, &crate::selinux::Policy::disabled());
    }
    assert_eq!(dsw.volumes_of_pod(&uid("u1")), [cache]);

    // the file deleted: the pod goes
    std::fs::remove_file(d.pods.join("p.yaml")).unwrap();
    let events = s.poll_changes().unwrap();
    assert_eq!(events, [SourceEvent::PodRemoved(uid("u1"))]);
    for e in events {
        apply_event(&mut dsw, e, &crate::selinux::Policy::disabled());
    }
    assert!(dsw.volumes_to_mount().is_empty());
}

#[test]
fn sources_ready_is_emitted_once_after_the_first_complete_listing() {
    let d = dirs();
    write(&d.pods, "a.yaml", &pod("a", "ua", EMPTY_DIR));
    let mut s = sources(&d);
    let first = s.poll_changes().unwrap();
    assert!(matches!(
        first[..],
        [SourceEvent::PodAdded(_), SourceEvent::SourcesReady]
    ));
    assert_eq!(s.poll_changes(), None, "nothing changed");
    write(&d.pods, "b.yaml", &pod("b", "ub", ""));
    let second = s.poll_changes().unwrap();
    assert!(!second.contains(&SourceEvent::SourcesReady));

    // no source configured: ready at once
    let mut none = Sources::new(SourcesConfig::new("n"));
    assert_eq!(none.poll_changes(), Some(vec![SourceEvent::SourcesReady]));
    assert_eq!(none.poll_changes(), None);

    // a pods dir that cannot be listed: no events, not ready, retried
    let file = d.objects.join("not-a-dir");
    write(&d.objects, "not-a-dir", "");
    let mut c = SourcesConfig::new("n");
    c.pods_dir = Some(file.clone());
    let mut broken = Sources::new(c);
    assert_eq!(broken.poll_changes(), None);
    assert_eq!(broken.poll_changes(), None);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(
        broken.poll_changes(),
        Some(vec![SourceEvent::SourcesReady]),
        "missing = empty"
    );
}

#[test]
fn polling_notices_new_changed_and_deleted_files() {
    let d = dirs();
    let mut s = sources(&d);
    assert_eq!(s.poll_changes(), Some(vec![SourceEvent::SourcesReady]));
    write(&d.pods, "a.yaml", &pod("a", "ua", ""));
    let added = s.poll_changes().unwrap();
    assert!(matches!(&added[..], [SourceEvent::PodAdded(p)] if p.uid == uid("ua")));
    write(&d.pods, "a.yaml", &pod("a", "ua", EMPTY_DIR));
    let changed = s.poll_changes().unwrap();
    assert!(matches!(&changed[..], [SourceEvent::PodUpdated(p)] if p.volumes.len() == 1));
    std::fs::remove_file(d.pods.join("a.yaml")).unwrap();
    assert_eq!(
        s.poll_changes(),
        Some(vec![SourceEvent::PodRemoved(uid("ua"))])
    );
    assert_eq!(s.poll_changes(), None);
}

#[test]
fn a_half_written_manifest_keeps_the_pod_of_its_last_good_version() {
    let d = dirs();
    write(&d.pods, "a.yaml", &pod("a", "ua", EMPTY_DIR));
    let mut s = sources(&d);
    let mut dsw = DesiredStateOfWorld::new();
    for e in s.poll_changes().unwrap() {
        apply_event(&mut dsw, e, &crate::selinux::Policy::disabled());
    }
    write(
        &d.pods,
        "a.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: [",
    );
    // The pod keeps what the DSW has (its last good version): no event
    // removes or changes it; the error is logged naming the file.
    assert_eq!(s.poll_changes(), None);
    assert!(s.list().kept.contains(&uid("ua")));
    assert_eq!(dsw.volumes_of_pod(&uid("ua")).len(), 1);
    // Fixed again, with the same content: nothing to tell the DSW.
    write(&d.pods, "a.yaml", &pod("a", "ua", EMPTY_DIR));
    assert_eq!(s.poll_changes(), None);
    // Deleted: removed.
    std::fs::remove_file(d.pods.join("a.yaml")).unwrap();
    assert_eq!(
        s.poll_changes(),
        Some(vec![SourceEvent::PodRemoved(uid("ua"))])
    );
}

#[test]
fn the_example_fixtures_load_without_errors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut c = SourcesConfig::new("demo");
    c.pods_dir = Some(root.join("pods"));
    let got = Sources::new(c).list();
    assert!(
        got.complete && got.file_errors.is_empty(),
        "{:?}",
        got.file_errors
    );
    let mut n: Vec<_> = names(&got.pods);
    n.sort();
    assert_eq!(n, ["demo-emptydirs-demo", "demo-hostpath-demo"]);
    let kinds: BTreeSet<_> = got
        .pods
        .values()
        .flat_map(|p| p.volumes.iter().map(|v| v.spec.pod_target_kind().as_str()))
        .collect();
    assert_eq!(kinds, BTreeSet::from(["dir", "mount", "none"]));
    assert!(got.pods.values().all(|p| p.errors.is_empty()));

    let mut c = SourcesConfig::new("demo");
    c.pods_dir = Some(root.join("pods-local-pv"));
    c.objects_dir = Some(root.join("objects"));
    let got = Sources::new(c).list();
    assert!(
        got.complete && got.file_errors.is_empty(),
        "{:?}",
        got.file_errors
    );
    let p = got.pods.values().next().unwrap();
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    assert_eq!(
        p.volumes[0].volume.as_str(),
        "kubernetes.io/local-volume/pv-local"
    );
}

#[test]
fn objects_are_read_again_only_when_their_dir_changed() {
    let d = dirs();
    write(&d.objects, "o.yaml", PV_PVC);
    write(&d.pods, "p.yaml", &pod("p", "u1", CLAIM));
    let mut s = sources(&d);
    let path_of = |events: &[SourceEvent], u: &str| {
        events
            .iter()
            .find_map(|e| match e {
                SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) if p.uid == uid(u) => {
                    match &*p.volumes[0].spec {
                        VolumeSpec::Local { path, .. } => Some(path.clone()),
                        _ => None,
                    }
                }
                _ => None,
            })
            .unwrap()
    };
    let first = s.poll_changes().unwrap();
    assert_eq!(path_of(&first, "u1"), Path::new("/mnt/pv1").into());
    // A pods-only change: the cached objects still resolve the claim.
    write(&d.pods, "q.yaml", &pod("q", "u2", CLAIM));
    let added = s.poll_changes().unwrap();
    assert_eq!(path_of(&added, "u2"), Path::new("/mnt/pv1").into());
    // An object edited in place is read again.
    write(
        &d.objects,
        "o.yaml",
        &PV_PVC.replace("/mnt/pv1", "/mnt/pv1-moved"),
    );
    let changed = s.poll_changes().unwrap();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert_eq!(path_of(&changed, "u1"), Path::new("/mnt/pv1-moved").into());
}

#[test]
fn a_pods_only_poll_reuses_the_objects_listing_and_a_full_one_lists_it_again() {
    let d = dirs();
    write(&d.objects, "o.yaml", PV_PVC);
    let mut s = sources(&d);
    assert_eq!(
        s.poll_pods_changes(),
        Some(vec![SourceEvent::SourcesReady]),
        "with no complete objects listing known, the objects dir is listed"
    );
    write(&d.pods, "p.yaml", &pod("p", "u1", CLAIM));
    // An object edited at the same time: a pods-only poll does not see it.
    write(
        &d.objects,
        "o.yaml",
        &PV_PVC.replace("/mnt/pv1", "/mnt/pv1-moved"),
    );
    let spec_path = |events: &[SourceEvent]| match events {
        [SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p)] => match &*p.volumes[0].spec {
            VolumeSpec::Local { path, .. } => path.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let added = s.poll_pods_changes().unwrap();
    assert_eq!(spec_path(&added), Path::new("/mnt/pv1").into());
    assert_eq!(s.poll_pods_changes(), None, "nothing new in the pods dir");
    let moved = s.poll_changes().unwrap();
    assert_eq!(spec_path(&moved), Path::new("/mnt/pv1-moved").into());
    assert_eq!(s.poll_changes(), None);
}

/// Issue #6 through `apply_event`: the first pod fixes the label of an RWOP
/// block PV (admitted), a second pod with another label is refused with the
/// kubelet's message and counted, and a pod whose own containers disagree
/// is refused with the pod-context error.
#[test]
fn apply_event_refuses_a_second_label_on_an_rwop_volume_and_counts_it() {
    use crate::model::AccessMode;
    use crate::selinux::{
        ContainerKind, ContainerSeLinux, Counter, FeatureGates, FileDefaults, Policy,
        SeLinuxOptions,
    };
    let policy = Policy::enabled(FeatureGates::default(), FileDefaults::default());
    let spec = VolumeSpec::Local {
        path: "/dev/loop3".into(),
        fs_type: Some("ext4".into()),
        access_modes: vec![AccessMode::ReadWriteOncePod],
        mount_options: Default::default(),
        is_block: true,
        volume_mode: Default::default(),
    };
    let container = |level: &str| ContainerSeLinux {
        name: format!("c{level}"),
        kind: ContainerKind::Regular,
        options: Some(SeLinuxOptions {
            level: Some(level.into()),
            ..SeLinuxOptions::default()
        }),
        volumes: vec!["data".into()],
    };
    let pod = |u: &str, levels: &[&str]| {
        let volume = PodVolume {
            volume: PodVolume::unique_name(&spec, &uid(u), "pv1"),
            spec_name: "pv1".into(),
            outer_name: "data".into(),
            spec: spec.clone().into(),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        };
        let mut p = desired(u, u, vec![volume]);
        p.selinux.containers = levels.iter().map(|l| container(l)).collect();
        p
    };
    let mut dsw = DesiredStateOfWorld::new();
    let counters = |a: &crate::sources::Applied| -> Vec<Counter> {
        a.metrics.iter().map(|m| m.counter).collect()
    };

    let a = apply_event(
        &mut dsw,
        SourceEvent::PodAdded(pod("a", &["s0:c1,c2"])),
        &policy,
    );
    assert!(!a.refused);
    assert_eq!(counters(&a), [Counter::VolumesAdmitted]);
    assert_eq!(a.metrics[0].access_mode, "RWOP");
    let name = UniqueVolumeName::shared(crate::model::PluginName::LocalVolume, "pv1");
    assert_eq!(
        dsw.volume(&name)
            .and_then(|v| v.effective_selinux.as_ref())
            .map(|c| c.as_str()),
        Some("system_u:object_r:container_file_t:s0:c1,c2")
    );

    let b = apply_event(
        &mut dsw,
        SourceEvent::PodAdded(pod("b", &["s0:c3,c4"])),
        &policy,
    );
    assert!(b.refused);
    assert_eq!(counters(&b), [Counter::VolumeContextMismatchErrors]);
    assert_eq!(b.metrics[0].volume_plugin, "kubernetes.io/local-volume");
    assert!(!dsw.pod_exists_in_volume(&uid("b"), &name));
    let errors = dsw.pop_pod_errors(&uid("b"));
    assert!(
        errors[0].contains(
            "conflicting SELinux labels of volume pv1: \"system_u:object_r:container_file_t:s0:c1,c2\" and \"system_u:object_r:container_file_t:s0:c3,c4\""
        ),
        "{errors:?}"
    );

    let c = apply_event(
        &mut dsw,
        SourceEvent::PodAdded(pod("c", &["s0:c1,c2", "s0:c5"])),
        &policy,
    );
    assert!(c.refused);
    assert_eq!(counters(&c), [Counter::PodContextMismatchErrors]);
    assert!(dsw.pop_pod_errors(&uid("c"))[0].contains("multiple SELinux labels found"));

    // once pod a is gone, b gets the volume with its own label
    apply_event(&mut dsw, SourceEvent::PodRemoved(uid("a")), &policy);
    let b = apply_event(
        &mut dsw,
        SourceEvent::PodUpdated(pod("b", &["s0:c3,c4"])),
        &policy,
    );
    assert!(!b.refused);
    assert_eq!(counters(&b), [Counter::VolumesAdmitted]);
    assert!(dsw.pod_exists_in_volume(&uid("b"), &name));
}

#[test]
fn a_local_pv_on_a_block_device_is_known_through_the_seam() {
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::DiskFormat;
    use crate::model::{DevId, VolumeSpec};
    let d = dirs();
    write(&d.pods, "p.yaml", &pod("p", "u1", CLAIM));
    write(&d.objects, "o.yaml", PV_PVC);
    let is_block = |s: &mut Sources| {
        let got = s.list();
        let v = &got.pods[&uid("u1")].volumes[0];
        matches!(&*v.spec, VolumeSpec::Local { is_block: true, .. })
    };
    // /mnt/pv1 is no block device here; on the fake it is one
    assert!(!is_block(&mut sources(&d)));
    let fake = Arc::new(RecordingSys::new());
    fake.add_device(
        "/mnt/pv1",
        DevId { major: 7, minor: 1 },
        DiskFormat::Unformatted,
    );
    let mut c = SourcesConfig::new("node1");
    c.pods_dir = Some(d.pods.clone());
    c.objects_dir = Some(d.objects.clone());
    assert!(is_block(&mut Sources::with_sys(c, fake)));
}

#[test]
fn inline_csi_volumes_and_pod_info_follow_the_kubelet() {
    let d = dirs();
    let driver = |spec: &str| {
        format!(
            "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {{name: d.example.com}}\nspec: {{{spec}}}\n"
        )
    };
    let inline = "  - name: scratch\n    csi: {driver: d.example.com, volumeAttributes: {size: 1Gi}, nodePublishSecretRef: {name: creds}}\n";
    let manifest = |ns: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, uid: u1{ns}}}\nspec:\n  serviceAccountName: builder\n  securityContext: {{fsGroup: 2000}}\n  containers: []\n  volumes:\n{inline}"
        )
    };
    write(&d.pods, "p.yaml", &manifest(", namespace: team"));
    write(
        &d.objects,
        "d.yaml",
        &driver(
            "attachRequired: false, podInfoOnMount: true, seLinuxMount: true, volumeLifecycleModes: [Ephemeral]",
        ),
    );
    let got = sources(&d).list();
    let p = &got.pods[&uid("u1")];
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let v = &p.volumes[0];
    assert_eq!(v.volume.as_str(), "kubernetes.io/csi/u1-scratch");
    let VolumeSpec::Csi(c) = &*v.spec else {
        panic!("{:?}", v.spec)
    };
    assert!(c.ephemeral && c.selinux_mount);
    assert_eq!(
        c.volume_handle,
        super::static_pods::ephemeral_handle(&uid("u1"), "scratch")
    );
    assert!(c.volume_handle.starts_with("csi-") && c.volume_handle.len() == 4 + 64);
    assert_eq!(
        c.publish_secret
            .as_ref()
            .map(|s| (s.namespace.as_str(), s.name.as_str())),
        Some(("team", "creds")),
        "an inline volume's secret is in the pod's namespace"
    );
    let info = v.csi_pod.as_deref().expect("pod info");
    let key = |k: &str| {
        info.volume_context
            .get(&format!("csi.storage.k8s.io/{k}"))
            .cloned()
    };
    assert_eq!(key("pod.name").as_deref(), Some("web-node1"));
    assert_eq!(key("pod.namespace").as_deref(), Some("team"));
    assert_eq!(key("pod.uid").as_deref(), Some("u1"));
    assert_eq!(key("serviceAccount.name").as_deref(), Some("builder"));
    assert_eq!(key("ephemeral").as_deref(), Some("true"));
    assert_eq!(info.mount_group.as_deref(), Some("2000"));

    // no podInfoOnMount, fsGroupPolicy None: the pod adds nothing
    write(
        &d.objects,
        "d.yaml",
        &driver("attachRequired: false, fsGroupPolicy: None, volumeLifecycleModes: [Ephemeral]"),
    );
    let got = sources(&d).list();
    assert_eq!(got.pods[&uid("u1")].volumes[0].csi_pod, None);

    // a driver that does not list Ephemeral (the default: Persistent only)
    // or has no CSIDriver at all: the inline volume is refused, naming it
    for objects in [Some(driver("attachRequired: false")), None] {
        match &objects {
            Some(o) => write(&d.objects, "d.yaml", o),
            None => std::fs::remove_file(d.objects.join("d.yaml")).unwrap(),
        }
        let got = sources(&d).list();
        let p = &got.pods[&uid("u1")];
        assert!(p.volumes.is_empty(), "{:?}", p.volumes);
        assert!(p.unresolved.contains("scratch"), "{:?}", p.unresolved);
        assert!(
            p.errors
                .iter()
                .any(|e| e.contains("d.example.com") && e.contains("Ephemeral")),
            "{:?}",
            p.errors
        );
    }
}

/// fsGroup and its change policy, from a manifest: the volumes that take
/// the walk get them (emptyDir; not hostPath, not a payload volume); a
/// negative fsGroup or an unknown policy refuses exactly those volumes
/// with an error naming the pod, the volume and the field, and the others
/// still mount.
#[test]
fn fs_group_and_its_policy_reach_the_volumes_that_take_the_walk() {
    use crate::model::{FsGroup, FsGroupChangePolicy};
    let d = dirs();
    let manifest = |ctx: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: team, uid: u1}}\nspec:\n  securityContext: {{{ctx}}}\n  containers: []\n  volumes:\n  - {{name: data, emptyDir: {{}}}}\n  - {{name: cache, emptyDir: {{medium: Memory}}}}\n  - {{name: logs, hostPath: {{path: /var/log}}}}\n"
        )
    };
    let table: [(&str, Result<Option<FsGroup>, &str>); 5] = [
        ("", Ok(None)),
        (
            "fsGroup: 2000",
            Ok(Some(FsGroup {
                gid: 2000,
                policy: FsGroupChangePolicy::Always,
            })),
        ),
        (
            "fsGroup: 2000, fsGroupChangePolicy: OnRootMismatch",
            Ok(Some(FsGroup {
                gid: 2000,
                policy: FsGroupChangePolicy::OnRootMismatch,
            })),
        ),
        (
            "fsGroup: -5",
            Err("spec.securityContext.fsGroup: -5 is negative"),
        ),
        (
            "fsGroup: 2000, fsGroupChangePolicy: Sometimes",
            Err("spec.securityContext.fsGroupChangePolicy: unknown policy \"Sometimes\""),
        ),
    ];
    for (ctx, want) in table {
        write(&d.pods, "p.yaml", &manifest(ctx));
        let got = sources(&d).list();
        let p = &got.pods[&uid("u1")];
        let by_name = |n: &str| p.volumes.iter().find(|v| v.outer_name == n);
        let logs = by_name("logs").expect("hostPath always mounts");
        assert_eq!(logs.fs_group, None, "{ctx}: hostPath takes no walk");
        match want {
            Ok(g) => {
                assert!(p.errors.is_empty(), "{ctx}: {:?}", p.errors);
                for n in ["data", "cache"] {
                    assert_eq!(by_name(n).expect(n).fs_group, g, "{ctx}: {n}");
                }
            }
            Err(field) => {
                for n in ["data", "cache"] {
                    assert!(by_name(n).is_none(), "{ctx}: {n} refused");
                    assert!(p.unresolved.contains(n), "{ctx}: {:?}", p.unresolved);
                    let named = format!("pod team/web-node1: volume \"{n}\": {field}");
                    assert!(
                        p.errors.iter().any(|e| e.starts_with(&named)),
                        "{ctx}: {named} in {:?}",
                        p.errors
                    );
                }
            }
        }
    }
}

/// A claim's PV `pv.beta.kubernetes.io/gid` reaches the pod's volume as
/// its supplemental group, unless the pod's `supplementalGroups` lists it
/// or the annotation is no group id.
#[test]
fn a_pv_gid_annotation_is_a_supplemental_group_unless_the_pod_has_it() {
    let d = dirs();
    let table = [
        ("\"2500\"", "", Some(2500)),
        (
            "\"2500\"",
            "  securityContext: {supplementalGroups: [2500]}\n",
            None,
        ),
        (
            "\"2500\"",
            "  securityContext: {supplementalGroups: [7]}\n",
            Some(2500),
        ),
        ("\"staff\"", "", None),
    ];
    for (gid, ctx, want) in table {
        let pv = PV_PVC.replacen(
            "metadata: {name: pv1}",
            &format!("metadata: {{name: pv1, annotations: {{pv.beta.kubernetes.io/gid: {gid}}}}}"),
            1,
        );
        write(&d.objects, "pv.yaml", &pv);
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: a, uid: u1}}\nspec:\n{ctx}  containers: []\n  volumes:\n{CLAIM}"
        );
        write(&d.pods, "a.yaml", &manifest);
        let got = sources(&d).list();
        let p = &got.pods[&uid("u1")];
        assert!(p.errors.is_empty(), "{gid} {ctx}: {:?}", p.errors);
        assert_eq!(p.volumes[0].supplemental_gid, want, "{gid} {ctx}");
    }
}

/// A pod's read-only claim takes no fsGroup walk (the kubelet never
/// changes a read-only volume); the same claim read-write does.
#[test]
fn a_read_only_claim_takes_no_fs_group() {
    let d = dirs();
    write(&d.objects, "pv.yaml", PV_PVC);
    for (ro, want) in [("true", None), ("false", Some(2000))] {
        let manifest = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: a, uid: u1}}\nspec:\n  securityContext: {{fsGroup: 2000}}\n  containers: []\n  volumes:\n  - name: data\n    persistentVolumeClaim: {{claimName: pvc1, readOnly: {ro}}}\n"
        );
        write(&d.pods, "a.yaml", &manifest);
        let got = sources(&d).list();
        let p = &got.pods[&uid("u1")];
        assert!(p.errors.is_empty(), "{ro}: {:?}", p.errors);
        assert_eq!(p.volumes[0].fs_group.map(|g| g.gid), want, "readOnly {ro}");
    }
}

/// A volume's mode must match how the containers use it (the kubelet's
/// message, with the pod); a `volumeDevices` name that is not a volume of
/// the pod is an error on the pod naming the container and entry. The
/// pod's other volumes are served either way.
#[test]
fn volume_modes_and_volume_devices_are_checked_per_pod() {
    let d = dirs();
    let block_pv = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv-raw}
spec: {volumeMode: Block, claimRef: {namespace: default, name: raw}, local: {path: /dev/raw0}}
---
apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: raw}\nspec: {volumeName: pv-raw, volumeMode: Block}
";
    write(&d.objects, "o.yaml", PV_PVC);
    write(&d.objects, "raw.yaml", block_pv);
    let manifest = |containers: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, uid: u1}}\nspec:\n  containers:\n{containers}  volumes:
  - name: data\n    persistentVolumeClaim: {{claimName: pvc1}}
  - name: raw\n    persistentVolumeClaim: {{claimName: raw}}
{EMPTY_DIR}"
        )
    };
    let file = d.pods.join("p.yaml");
    let at = |e: &str| format!("{}: pod default/p-node1: {e}", file.display());
    let cases: [(&str, &[&str], Vec<String>); 3] = [
        (
            // a filesystem claim as a device, a block claim as a mount
            "  - name: app
    volumeMounts: [{name: raw, mountPath: /raw}, {name: cache, mountPath: /c}]
    volumeDevices: [{name: data, devicePath: /dev/xvda}]\n",
            &["data", "raw"],
            vec![
                at("volume data has volumeMode Filesystem, but is specified in volumeDevices"),
                at("volume raw has volumeMode Block, but is specified in volumeMounts"),
            ],
        ),
        (
            "  - name: app\n    volumeDevices: [{name: nope, devicePath: /dev/xvda}]\n",
            &[],
            vec![at(
                "container \"app\": volumeDevices[0]: name \"nope\" is not a volume of the pod",
            )],
        ),
        (
            "  - name: app\n    volumeDevices: [{name: cache, devicePath: /dev/xvda}]\n",
            &["cache"],
            vec![at(
                "volume cache has volumeMode Filesystem, but is specified in volumeDevices",
            )],
        ),
    ];
    for (containers, unresolved, errors) in cases {
        write(&d.pods, "p.yaml", &manifest(containers));
        let got = sources(&d).list();
        let p = &got.pods[&uid("u1")];
        assert_eq!(
            p.unresolved.iter().collect::<Vec<_>>(),
            unresolved,
            "{containers}"
        );
        assert_eq!(p.errors, errors, "{containers}");
        let served: Vec<&str> = p.volumes.iter().map(|v| v.outer_name.as_str()).collect();
        assert!(
            served.iter().all(|v| !unresolved.contains(v)) && served.len() + unresolved.len() == 3,
            "{served:?}"
        );
    }
}

/// A CSI PV in `Block` mode is resolved as the kubelet's CSI block mapper
/// takes it (a block spec, mapped into the pod), not refused; used as a
/// mount it gets the kubelet's mode error like any block claim.
#[test]
fn a_csi_block_claim_is_resolved_for_volume_devices_only() {
    let d = dirs();
    let block_pv = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv-craw}
spec: {volumeMode: Block, claimRef: {namespace: default, name: craw}, csi: {driver: d.example.com, volumeHandle: h1}}
---
apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: craw}\nspec: {volumeName: pv-craw, volumeMode: Block}
---
apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d.example.com}\nspec: {attachRequired: false}
";
    write(&d.objects, "raw.yaml", block_pv);
    let manifest = |use_: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, uid: u1}}\nspec:\n  containers:\n  - name: app\n{use_}  volumes:
  - name: raw\n    persistentVolumeClaim: {{claimName: craw}}\n"
        )
    };
    write(
        &d.pods,
        "p.yaml",
        &manifest("    volumeDevices: [{name: raw, devicePath: /dev/xvda}]\n"),
    );
    let got = sources(&d).list();
    let p = &got.pods[&uid("u1")];
    assert!(p.errors.is_empty(), "{:?}", p.errors);
    let v = &p.volumes[0];
    assert!(
        matches!(&*v.spec, VolumeSpec::Csi(c) if c.volume_mode == crate::model::VolumeMode::Block),
        "{:?}",
        v.spec
    );
    assert_eq!(v.spec.pod_target_kind(), crate::model::TargetKind::Block);
    assert_eq!(
        v.spec.device_target_kind(),
        Some(crate::model::TargetKind::Block)
    );

    write(
        &d.pods,
        "p.yaml",
        &manifest("    volumeMounts: [{name: raw, mountPath: /raw}]\n"),
    );
    let got = sources(&d).list();
    let p = &got.pods[&uid("u1")];
    assert_eq!(p.unresolved.iter().collect::<Vec<_>>(), ["raw"]);
    assert!(
        p.errors[0].ends_with("volume raw has volumeMode Block, but is specified in volumeMounts"),
        "{:?}",
        p.errors
    );
}
