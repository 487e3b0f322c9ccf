//! Tests of the parsed-manifest cache on real files: what a restart takes
//! from it, what it refuses, and what is stored only once confirmed.

use std::thread::sleep;

use super::*;
use crate::sources::static_pods::parse_pod;
use crate::sources::{Sources, SourcesConfig};

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: []\n  volumes:\n  - name: cache\n    emptyDir: {{medium: Memory}}\n"
    )
}

struct Node {
    _tmp: tempfile::TempDir,
    pods: PathBuf,
    cache: PathBuf,
}

fn node() -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let pods = tmp.path().join("pods");
    std::fs::create_dir(&pods).unwrap();
    Node {
        cache: tmp.path().join(FILE_NAME),
        pods,
        _tmp: tmp,
    }
}

fn sources(n: &Node, node_name: &str, cache: bool) -> Sources {
    let mut c = SourcesConfig::new(node_name);
    c.pods_dir = Some(n.pods.clone());
    c.manifest_cache = cache.then(|| n.cache.clone());
    Sources::new(c)
}

/// Waits until the cache's write is due, then writes it.
fn write_when_due(s: &mut Sources) {
    let due = s.cache_due().expect("something was parsed: a write is due");
    sleep(due.saturating_duration_since(Instant::now()));
    s.write_cache();
}

#[test]
fn a_restart_takes_unchanged_manifests_from_the_cache_and_parses_changed_ones() {
    let n = node();
    for p in ["a", "b", "c"] {
        std::fs::write(n.pods.join(format!("{p}.yaml")), manifest(p)).unwrap();
    }
    let mut first = sources(&n, "node1", true);
    let listed = first.list();
    assert_eq!(listed.pods.len(), 3);
    assert_eq!(first.cache_hits(), 0, "no cache file yet");
    // the manifests were written just now: not stored before they settle
    let due = first.cache_due().unwrap();
    assert!(due > Instant::now() + SETTLED / 2, "a fresh file waits");
    write_when_due(&mut first);
    assert!(n.cache.exists());
    assert_eq!(first.cache_due(), None, "nothing left to write");

    // b changes while the daemon is down
    std::fs::write(n.pods.join("b.yaml"), manifest("bb")).unwrap();
    let mut second = sources(&n, "node1", true);
    let again = second.list();
    assert_eq!(second.cache_hits(), 2, "a and c from the cache, b parsed");
    let parsed = sources(&n, "node1", false).list();
    assert_eq!(
        again.pods, parsed.pods,
        "the cache gives what a parse gives"
    );
    assert!(again.pods.values().any(|p| p.name == "bb-node1"));
    // b is stored once settled; the cache then holds all three again
    write_when_due(&mut second);
    let mut third = sources(&n, "node1", true);
    assert_eq!(third.list().pods, parsed.pods);
    assert_eq!(third.cache_hits(), 3);
}

#[test]
fn a_damaged_or_foreign_cache_is_ignored_and_every_manifest_parsed() {
    let n = node();
    std::fs::write(n.pods.join("a.yaml"), manifest("a")).unwrap();
    let mut first = sources(&n, "node1", true);
    first.list();
    write_when_due(&mut first);
    let whole = std::fs::read(&n.cache).unwrap();

    // another node name: the entries are not for it
    let mut other = sources(&n, "node2", true);
    let listed = other.list();
    assert_eq!(other.cache_hits(), 0);
    assert_eq!(
        listed.pods.values().next().map(|p| p.name.as_str()),
        Some("a-node2")
    );

    // a flipped byte in the middle, then a torn file
    let mut flipped = whole.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    for bytes in [flipped, whole[..whole.len() - 3].to_vec(), b"junk".to_vec()] {
        std::fs::write(&n.cache, &bytes).unwrap();
        let mut s = sources(&n, "node1", true);
        let listed = s.list();
        assert_eq!(s.cache_hits(), 0, "a damaged cache is not used");
        assert_eq!(listed.pods.len(), 1, "the manifest is parsed instead");
    }
}

#[test]
fn a_fresh_file_is_stored_only_when_a_second_read_gives_the_parsed_bytes() {
    let n = node();
    let (kept, changed) = (n.pods.join("kept.yaml"), n.pods.join("changed.yaml"));
    let mut cache = ManifestCache::new(n.cache.clone(), &n.pods, "node1");
    let mut sigs = BTreeMap::new();
    let written = Instant::now();
    // the reads below began before the files were written, so however
    // long the machine takes, no entry has settled when it is parsed
    let read_at = SystemTime::now();
    for (file, name) in [(&kept, "kept"), (&changed, "changed")] {
        let text = manifest(name);
        std::fs::write(file, &text).unwrap();
        let sig = signature_now(file).unwrap();
        let pod = parse_pod(file, text.as_bytes(), "node1").unwrap();
        // `changed` stands for a file rewritten in the tick of its listing
        // with its signature intact: what was parsed is not what it holds
        let hashed = match name {
            "kept" => bytes_hash(text.as_bytes()),
            _ => bytes_hash(manifest("before").as_bytes()),
        };
        let key = file.file_name().unwrap().to_owned();
        cache.parsed(&key, sig, hashed, &pod, read_at);
        sigs.insert(key, file_signature_hash(&sig));
    }
    let current = |name: &OsStr| sigs.get(name).copied();
    // not settled yet: a write now stores neither. Whether they have
    // settled is the wall clock's to say: on a loaded machine SETTLED may
    // have passed already, and then there is nothing to check here
    cache.write(current).unwrap();
    if written.elapsed() < SETTLED {
        let mut look = ManifestCache::new(n.cache.clone(), &n.pods, "node1");
        assert!(
            look.lookup(OsStr::new("kept.yaml"), &signature_now(&kept).unwrap())
                .is_none()
        );
    }
    sleep(
        cache
            .due()
            .unwrap()
            .saturating_duration_since(Instant::now()),
    );
    cache.write(current).unwrap();
    let mut look = ManifestCache::new(n.cache.clone(), &n.pods, "node1");
    let got = look.lookup(OsStr::new("kept.yaml"), &signature_now(&kept).unwrap());
    assert_eq!(got.map(|p| p.name), Some("kept-node1".to_owned()));
    assert!(
        look.lookup(
            OsStr::new("changed.yaml"),
            &signature_now(&changed).unwrap()
        )
        .is_none(),
        "bytes other than the parsed ones are never stored"
    );
}

#[test]
fn a_manifest_whose_signature_moved_is_not_taken_from_the_cache() {
    let n = node();
    let file = n.pods.join("a.yaml");
    std::fs::write(&file, manifest("a")).unwrap();
    let mut first = sources(&n, "node1", true);
    first.list();
    write_when_due(&mut first);
    // same size, new content: only the times and ctime move
    std::fs::write(&file, manifest("b")).unwrap();
    let mut s = sources(&n, "node1", true);
    let listed = s.list();
    assert_eq!(s.cache_hits(), 0);
    assert_eq!(
        listed.pods.values().next().map(|p| p.name.as_str()),
        Some("b-node1")
    );
}

/// The file is read borrowing its bytes, and written from owned entries:
/// both are the same encoding, so a file written before reads the same.
#[test]
fn entries_read_borrowed_are_the_ones_written_owned() {
    let stored = Stored {
        stamp: Stamp {
            exe: (1, 2, 3, 4, 5),
            pods_dir: "/pods".into(),
            node: "n1".into(),
        },
        entries: vec![
            Entry {
                name: b"a.yaml".to_vec(),
                sig: (6, 7, 8, 9, 10),
                pod: vec![0, 1, 255, 3],
            },
            Entry {
                name: b"b.yaml".to_vec(),
                sig: (11, 12, 13, 14, 15),
                pod: vec![],
            },
        ],
    };
    let bytes = bincode::serialize(&stored).unwrap();
    let read: StoredRef<'_> = bincode::deserialize(&bytes).unwrap();
    assert_eq!(read.stamp, stored.stamp);
    let read: Vec<(&[u8], FileSignature, &[u8])> = read
        .entries
        .iter()
        .map(|e| (e.name, e.sig, e.pod))
        .collect();
    let want: Vec<(&[u8], FileSignature, &[u8])> = (stored.entries.iter())
        .map(|e| (e.name.as_slice(), e.sig, e.pod.as_slice()))
        .collect();
    assert_eq!(read, want);
}

/// Lookups in name order take the next entry; any other order, or a name
/// the file lacks, falls back to a search and finds the same.
#[test]
fn entries_are_found_in_any_order() {
    let names = ["a.yaml", "b.yaml", "d.yaml"];
    let mut loaded = Loaded::default();
    for (i, n) in names.iter().enumerate() {
        let at = loaded.bytes.len();
        loaded.bytes.extend_from_slice(n.as_bytes());
        loaded.bytes.push(u8::try_from(i).unwrap());
        loaded.entries.push(Span {
            name: at..at + n.len(),
            sig: (i as u64, 0, 0, 0, 0),
            pod: at + n.len()..at + n.len() + 1,
        });
    }
    let found = |l: &mut Loaded, n: &str| l.find(n.as_bytes()).map(|(s, p)| (s.0, p.to_vec()));
    for (name, want) in [
        ("a.yaml", Some((0, vec![0]))),
        ("b.yaml", Some((1, vec![1]))),
        ("c.yaml", None),
        ("d.yaml", Some((2, vec![2]))),
        ("a.yaml", Some((0, vec![0]))),
        ("z.yaml", None),
        ("b.yaml", Some((1, vec![1]))),
        ("", None),
    ] {
        assert_eq!(found(&mut loaded, name), want, "{name}");
    }
}
