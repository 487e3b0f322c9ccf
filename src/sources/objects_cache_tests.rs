//! Tests of the objects dir's cache on real files: a restart decodes the
//! unchanged files and gets what a parse gets; a changed, torn or foreign
//! cache is never trusted; a file with a Secret or an error is never stored.

use std::thread::sleep;

use super::*;
use crate::model::VolumeSpec;
use crate::sources::{Sources, SourcesConfig};

/// A `kind: List` with PV `pv-<i>` (CSI, handle `vol-<i>`) and the claim
/// `claim-<i>` bound to it, as JSON.
fn pv_and_claim(i: usize, handle: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": format!("pv-{i}")},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"namespace": "default", "name": format!("claim-{i}")},
                    "csi": {"driver": "d.example.com", "volumeHandle": handle}
                }
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("claim-{i}"), "namespace": "default"},
                "spec": {"volumeName": format!("pv-{i}")}
            }
        ]
    })
    .to_string()
}

const DRIVER: &str = "apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d.example.com}\nspec: {attachRequired: false}\n";

/// Pod `i`, claiming `claim-<i>`.
fn pod(i: usize) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, uid: 00000000-0000-4000-8000-00000000000{i}}}\nspec:\n  containers: []\n  volumes:\n  - name: data\n    persistentVolumeClaim: {{claimName: claim-{i}}}\n"
    )
}

struct Node {
    _tmp: tempfile::TempDir,
    pods: PathBuf,
    objects: PathBuf,
    journal: PathBuf,
}

impl Node {
    fn cache(&self) -> PathBuf {
        self.journal.join(OBJECTS_FILE_NAME)
    }
}

/// A node with pods 1-3, each claiming its own PV, and the driver.
fn node() -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let (pods, objects, journal) = (
        tmp.path().join("pods"),
        tmp.path().join("objects"),
        tmp.path().join("journal"),
    );
    for d in [&pods, &objects, &journal] {
        std::fs::create_dir(d).unwrap();
    }
    for i in 1..=3 {
        std::fs::write(pods.join(format!("p{i}.yaml")), pod(i)).unwrap();
        std::fs::write(
            objects.join(format!("o{i}.json")),
            pv_and_claim(i, &format!("vol-{i}")),
        )
        .unwrap();
    }
    std::fs::write(objects.join("driver.yaml"), DRIVER).unwrap();
    Node {
        _tmp: tmp,
        pods,
        objects,
        journal,
    }
}

fn sources(n: &Node, cache: bool) -> Sources {
    let mut c = SourcesConfig::new("node1");
    c.pods_dir = Some(n.pods.clone());
    c.objects_dir = Some(n.objects.clone());
    c.objects_cache = cache.then(|| n.cache());
    Sources::new(c)
}

/// Waits until a cache's write is due, then writes what is due.
fn write_when_due(s: &mut Sources) {
    let due = s.cache_due().expect("something was parsed: a write is due");
    sleep(due.saturating_duration_since(Instant::now()));
    s.write_cache();
}

/// A first start's sources, its objects cache written.
fn cached(n: &Node) -> Sources {
    let mut first = sources(n, true);
    first.list();
    assert_eq!(first.objects_cache_hits(), 0, "no cache file yet");
    write_when_due(&mut first);
    assert!(n.cache().exists());
    first
}

#[test]
fn a_restart_decodes_unchanged_objects_files_and_parses_changed_ones() {
    let n = node();
    let first = cached(&n);
    assert_eq!(first.cache_due(), None, "nothing left to write");

    // o2 changes while the daemon is down: another handle
    std::fs::write(n.objects.join("o2.json"), pv_and_claim(2, "vol-2b")).unwrap();
    let mut second = sources(&n, true);
    let listed = second.list();
    assert_eq!(second.objects_cache_hits(), 3, "o1, o3, driver.yaml");
    let mut plain = sources(&n, false);
    let parsed = plain.list();
    assert_eq!(
        second.objects(),
        plain.objects(),
        "the cache gives what a parse gives"
    );
    assert_eq!(listed.pods, parsed.pods);
    assert!(listed.file_errors.is_empty(), "{:?}", listed.file_errors);
    let spec = &second.objects().pvs["pv-2"].spec;
    assert!(
        matches!(spec.as_deref(), Ok(VolumeSpec::Csi(c)) if c.volume_handle == "vol-2b"),
        "the changed file was parsed: {spec:?}"
    );
    // o2 is stored once settled; the cache then holds all four again
    write_when_due(&mut second);
    let mut third = sources(&n, true);
    third.list();
    assert_eq!(third.objects_cache_hits(), 4);
    assert_eq!(third.objects(), plain.objects());
}

#[test]
fn a_file_with_a_secret_or_an_error_is_never_stored_and_parsed_at_every_start() {
    let n = node();
    let secret = "apiVersion: v1\nkind: Secret\nmetadata: {name: creds, namespace: default}\nstringData: {password: hunter2-not-in-the-cache}\n---\n";
    std::fs::write(
        n.objects.join("o1.json"),
        // YAML holds JSON: the Secret, then o1's list
        format!("{secret}{}", pv_and_claim(1, "vol-1")),
    )
    .unwrap();
    std::fs::write(
        n.objects.join("odd.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n",
    )
    .unwrap();
    let first = cached(&n);
    drop(first);
    let bytes = std::fs::read(n.cache()).unwrap();
    assert!(
        !bytes.windows(7).any(|w| w == b"hunter2"),
        "no Secret's bytes in the cache"
    );
    let mut second = sources(&n, true);
    let listed = second.list();
    assert_eq!(
        second.objects_cache_hits(),
        3,
        "o2, o3 and driver.yaml; o1 (a Secret) and odd.yaml (an error) parsed"
    );
    assert!(
        second
            .objects()
            .secrets
            .contains_key(&("default".into(), "creds".into()))
    );
    assert!(second.objects().pvs.contains_key("pv-1"));
    let errors: Vec<String> = listed.file_errors.iter().map(ToString::to_string).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("odd.yaml") && e.contains("Service")),
        "the error is reported again: {errors:?}"
    );
}

#[test]
fn a_name_defined_twice_keeps_the_first_file_whether_cached_or_parsed() {
    let n = node();
    drop(cached(&n));
    // o0 sorts first and defines pv-2 again: o2's, from the cache, loses
    std::fs::write(n.objects.join("o0.json"), pv_and_claim(2, "vol-first")).unwrap();
    let mut s = sources(&n, true);
    let listed = s.list();
    assert_eq!(s.objects_cache_hits(), 4);
    let mut plain = sources(&n, false);
    let parsed = plain.list();
    assert_eq!(s.objects(), plain.objects());
    let text = |e: &[SourceError]| e.iter().map(ToString::to_string).collect::<Vec<_>>();
    assert_eq!(text(&listed.file_errors), text(&parsed.file_errors));
    assert!(
        text(&listed.file_errors)
            .iter()
            .any(|e| e.contains("o2.json")),
        "{:?}",
        listed.file_errors
    );
    let spec = &s.objects().pvs["pv-2"].spec;
    assert!(matches!(spec.as_deref(), Ok(VolumeSpec::Csi(c)) if c.volume_handle == "vol-first"));
}

#[test]
fn a_torn_or_foreign_objects_cache_is_ignored_and_every_file_parsed() {
    let n = node();
    drop(cached(&n));
    let whole = std::fs::read(n.cache()).unwrap();
    let mut plain = sources(&n, false);
    plain.list();
    // the pods cache's file, with its own magic, is foreign here
    let mut pods_cache = ManifestCache::new(n.journal.join(FILE_NAME), &n.pods, "node1");
    let file = n.pods.join("p1.yaml");
    let pod = crate::sources::static_pods::parse_pod(&file, pod(1).as_bytes(), "node1").unwrap();
    let sig = signature_now(&file).unwrap();
    pods_cache.parsed(
        OsStr::new("p1.yaml"),
        sig,
        0,
        &pod,
        SystemTime::now() + SETTLED * 2,
    );
    pods_cache
        .write(|_| Some(file_signature_hash(&sig)))
        .unwrap();
    let foreign = std::fs::read(n.journal.join(FILE_NAME)).unwrap();
    let mut flipped = whole.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    for bytes in [flipped, whole[..whole.len() - 3].to_vec(), foreign] {
        std::fs::write(n.cache(), &bytes).unwrap();
        let mut s = sources(&n, true);
        s.list();
        assert_eq!(
            s.objects_cache_hits(),
            0,
            "a damaged or foreign cache is not used"
        );
        assert_eq!(s.objects(), plain.objects(), "every file is parsed instead");
    }
}

#[test]
fn an_objects_file_whose_signature_moved_is_parsed_again() {
    let n = node();
    drop(cached(&n));
    // same size, new content: only the times and ctime move
    std::fs::write(n.objects.join("o3.json"), pv_and_claim(3, "vol-x")).unwrap();
    let mut s = sources(&n, true);
    s.list();
    assert_eq!(s.objects_cache_hits(), 3);
    let spec = &s.objects().pvs["pv-3"].spec;
    assert!(matches!(spec.as_deref(), Ok(VolumeSpec::Csi(c)) if c.volume_handle == "vol-x"));
}

#[test]
fn a_change_while_running_is_parsed_and_stored_at_the_next_start() {
    let n = node();
    let mut running = cached(&n);
    // the poller's first poll after the listing: nothing changed
    running.poll_changes();
    std::fs::write(n.objects.join("o1.json"), pv_and_claim(1, "vol-1b")).unwrap();
    assert!(running.poll_changes().is_some(), "the change is seen");
    let spec = &running.objects().pvs["pv-1"].spec;
    assert!(matches!(spec.as_deref(), Ok(VolumeSpec::Csi(c)) if c.volume_handle == "vol-1b"));
    assert_eq!(
        running.cache_due(),
        None,
        "a later load leaves the cache alone: nothing to write"
    );
    drop(running);
    let mut next = sources(&n, true);
    next.list();
    assert_eq!(
        next.objects_cache_hits(),
        3,
        "o1 is parsed at the next start"
    );
    write_when_due(&mut next);
    let mut after = sources(&n, true);
    after.list();
    assert_eq!(after.objects_cache_hits(), 4, "and stored then");
}
