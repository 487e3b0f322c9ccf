//! The atomic writer on real files (a temp dir, [`LinuxSys`]).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::*;
use crate::host::sys::LinuxSys;
use crate::model::{
    Operation, PayloadVersion, PluginName, PodUid, TargetKind, TargetParams, TargetRef,
    UniqueVolumeName,
};
use crate::plugins::payload::build::{PayloadFile, hash};

fn params() -> TargetParams {
    TargetParams::at(
        UniqueVolumeName::from_raw("kubernetes.io/configmap/p1-cm"),
        PluginName::EmptyDir,
        "cm".into(),
        TargetRef::Pod(PodUid::new("p1").unwrap()),
        TargetKind::Dir,
        None,
    )
}

fn payload(files: &[(&str, &str, u32)]) -> Payload {
    let files: BTreeMap<String, PayloadFile> = files
        .iter()
        .map(|(p, b, m)| {
            let f = PayloadFile {
                bytes: b.as_bytes().to_vec(),
                mode: *m,
            };
            (p.to_string(), f)
        })
        .collect();
    let version = PayloadVersion {
        hash: hash(&files),
        objects: Vec::new(),
    };
    Payload {
        files,
        version,
        immutable: false,
    }
}

/// A root dir with a volume dir in it.
fn volume() -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().canonicalize().unwrap();
    let dir = root.join("vol");
    std::fs::create_dir(&dir).unwrap();
    (d, dir)
}

/// The volume dir `/r/vol` of the recording fake's tests, as a SetUp
/// hands it over (`fresh`: just made or mounted).
fn fake_target(fresh: bool) -> Target<'static> {
    Target {
        root: Path::new("/r"),
        dir: Path::new("/r/vol"),
        fs_group: None,
        fresh,
        vol: None,
    }
}

fn run(dir: &Path, p: &Payload, fs_group: Option<u32>, at: u64) -> Action {
    let params = params();
    let mut op = Op::new(&LinuxSys, Operation::SetUp, &params);
    let root = dir.parent().unwrap();
    let t = Target {
        root,
        dir,
        fs_group,
        fresh: false,
        vol: None,
    };
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(at);
    write(&mut op, &t, p, now).unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_first_write_links_every_name_through_data() {
    let (_d, dir) = volume();
    let p = payload(&[("a", "A", 0o644), ("conf/b.yaml", "B", 0o400)]);
    assert_eq!(run(&dir, &p, None, 1_700_000_000), Action::Performed);
    let stamp = format!("..2023_11_14_22_13_20.000000000.{}", &p.version.hash[..12]);
    assert_eq!(names(&dir), [&stamp, "..data", "a", "conf"]);
    assert_eq!(
        std::fs::read_link(dir.join("..data")).unwrap(),
        Path::new(&stamp)
    );
    assert_eq!(
        std::fs::read_link(dir.join("conf")).unwrap(),
        Path::new("..data/conf")
    );
    assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"A");
    assert_eq!(std::fs::read(dir.join("conf/b.yaml")).unwrap(), b"B");
    let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("a"), 0o644);
    assert_eq!(mode("conf/b.yaml"), 0o400);
    assert_eq!(mode(&stamp), 0o755);
}

#[test]
fn a_mode_the_umask_would_cut_is_kept() {
    let (_d, dir) = volume();
    run(&dir, &payload(&[("open", "x", 0o666)]), None, 1);
    let mode = std::fs::metadata(dir.join("open"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o666);
}

#[test]
fn a_new_payload_replaces_the_old_and_its_names() {
    let (_d, dir) = volume();
    run(
        &dir,
        &payload(&[("a", "1", 0o644), ("old", "x", 0o644)]),
        None,
        1,
    );
    let p2 = payload(&[("a", "2", 0o644), ("new", "y", 0o644)]);
    assert_eq!(run(&dir, &p2, None, 2), Action::Performed);
    let stamp = format!("..1970_01_01_00_00_02.000000000.{}", &p2.version.hash[..12]);
    assert_eq!(names(&dir), [&stamp, "..data", "a", "new"]);
    assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"2");
}

/// A write of the payload already in place changes nothing: same inodes,
/// same mtimes (what a restart relies on).
#[test]
fn the_same_payload_again_touches_nothing() {
    let (_d, dir) = volume();
    let p = payload(&[("a", "A", 0o644), ("d/b", "B", 0o644)]);
    run(&dir, &p, None, 1);
    let look = |p: &str| {
        let m = std::fs::symlink_metadata(dir.join(p)).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec())
    };
    let before: Vec<_> = ["a", "d", "..data", "d/b"]
        .iter()
        .map(|p| look(p))
        .collect();
    assert_eq!(run(&dir, &p, None, 5), Action::AlreadyInPlace);
    let after: Vec<_> = ["a", "d", "..data", "d/b"]
        .iter()
        .map(|p| look(p))
        .collect();
    assert_eq!(before, after);
}

/// After a power cut a payload dir's name may say the right hash while
/// its unsynced files came back empty or short: the content decides, and
/// such a payload is written again (a dir that holds it stays untouched,
/// above).
#[test]
fn a_payload_dir_whose_files_came_back_short_is_written_again() {
    let (_d, dir) = volume();
    let p = payload(&[("a", "whole", 0o644), ("d/b", "B", 0o644)]);
    run(&dir, &p, None, 1);
    let first = std::fs::read_link(dir.join("..data")).unwrap();
    for (at, (file, cut)) in [("a", ""), ("a", "who"), ("d/b", "")]
        .into_iter()
        .enumerate()
    {
        let old = std::fs::read_link(dir.join("..data")).unwrap();
        std::fs::write(dir.join("..data").join(file), cut).unwrap();
        let at = 2 + at as u64;
        assert_eq!(
            run(&dir, &p, None, at),
            Action::Performed,
            "{file} = {cut:?}"
        );
        let new = std::fs::read_link(dir.join("..data")).unwrap();
        assert_ne!(new, old, "a new payload dir");
        assert!(!dir.join(&old).exists(), "the damaged dir is gone");
        assert_eq!(std::fs::read_to_string(dir.join("a")).unwrap(), "whole");
        assert_eq!(std::fs::read_to_string(dir.join("d/b")).unwrap(), "B");
    }
    assert_ne!(first, std::fs::read_link(dir.join("..data")).unwrap());
}

/// A crash after each step of a write, simulated by putting the volume
/// dir in the state that step leaves; the next write makes it whole.
#[test]
fn a_write_cut_after_any_step_is_finished_or_rolled_back() {
    let old = payload(&[("a", "old", 0o644), ("gone", "g", 0o644)]);
    let new = payload(&[("a", "new", 0o644), ("b", "new", 0o644)]);
    let old_dir = format!(
        "..1970_01_01_00_00_01.000000000.{}",
        &old.version.hash[..12]
    );
    let new_dir = format!(
        "..1970_01_01_00_00_02.000000000.{}",
        &new.version.hash[..12]
    );
    let steps = [
        "after_dir",
        "after_dir_tmp_link",
        "after_swap",
        "after_links",
    ];
    for step in steps {
        let (_d, dir) = volume();
        run(&dir, &old, None, 1);
        let made = dir.join(&new_dir);
        std::fs::create_dir(&made).unwrap();
        std::fs::write(made.join("a"), "new").unwrap();
        if step != "after_dir" {
            // (the half-written dir has only some files: never seen)
            std::fs::write(made.join("b"), "new").unwrap();
        }
        match step {
            "after_dir_tmp_link" => {
                std::os::unix::fs::symlink(&new_dir, dir.join("..data_tmp")).unwrap();
            }
            "after_swap" | "after_links" => {
                std::os::unix::fs::symlink(&new_dir, dir.join("..data_tmp")).unwrap();
                std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
                if step == "after_links" {
                    std::os::unix::fs::symlink("..data/b", dir.join("b")).unwrap();
                    std::fs::remove_file(dir.join("gone")).unwrap();
                }
            }
            _ => {}
        }
        run(&dir, &new, None, 3);
        let data = std::fs::read_link(dir.join("..data")).unwrap();
        let listed = names(&dir);
        assert_eq!(listed.len(), 4, "{step}: {listed:?}");
        assert!(!listed.contains(&old_dir), "{step}: the old dir goes");
        assert_eq!(listed[0], data.to_string_lossy(), "{step}");
        assert_eq!(&listed[2..], ["a", "b"], "{step}");
        assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"new", "{step}");
        assert_eq!(std::fs::read(dir.join("b")).unwrap(), b"new", "{step}");
    }
}

/// fsGroup: every entry gets the group, files the read bits, dirs setgid.
#[test]
fn an_fs_group_owns_the_payload() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: chgrp to another group needs root");
        return;
    }
    let (_d, dir) = volume();
    run(
        &dir,
        &payload(&[("a", "A", 0o600), ("d/b", "B", 0o600)]),
        Some(4321),
        1,
    );
    for p in ["a", "d/b", "d", "..data"] {
        let m = std::fs::metadata(dir.join(p)).unwrap();
        assert_eq!(m.gid(), 4321, "{p}");
    }
    let m = std::fs::symlink_metadata(dir.join("a")).unwrap();
    assert_eq!(m.gid(), 4321, "the link itself");
    let mode = |p: &str| std::fs::metadata(dir.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("a"), 0o640);
    assert_eq!(mode("d"), 0o2755);
}

/// A reader looping over two files while the payload changes always sees
/// both from the same payload.
#[test]
fn a_reader_never_sees_a_mix_of_two_payloads() {
    let (_d, dir) = volume();
    run(
        &dir,
        &payload(&[("a", "0", 0o644), ("b", "0", 0o644)]),
        None,
        1,
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = {
        let (dir, stop, count) = (dir.clone(), stop.clone(), count.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // one resolution of `..data` for both, as a reader of a
                // consistent snapshot does it
                let Ok(data) = std::fs::canonicalize(dir.join("..data")) else {
                    continue;
                };
                let (Ok(a), Ok(b)) = (std::fs::read(data.join("a")), std::fs::read(data.join("b")))
                else {
                    continue; // the old dir was removed under us: read again
                };
                assert_eq!(a, b, "a mix of two payloads");
                reads += 1;
                count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            reads
        })
    };
    for i in 1..200u64 {
        let v = i.to_string();
        run(
            &dir,
            &payload(&[("a", &v, 0o644), ("b", &v, 0o644)]),
            None,
            i + 1,
        );
    }
    // (on a loaded machine the reader may not have run yet: give it time)
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while count.load(std::sync::atomic::Ordering::Relaxed) == 0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.join().unwrap();
    assert!(reads > 0, "the reader read");
    assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"199");
}

#[test]
fn the_stamp_is_the_kubelets_utc_format() {
    let t = SystemTime::UNIX_EPOCH + Duration::new(951_782_400 + 3661, 5);
    assert_eq!(utc_stamp(t), "2000_02_29_01_01_01.000000005");
    assert_eq!(
        utc_stamp(SystemTime::UNIX_EPOCH),
        "1970_01_01_00_00_00.000000000"
    );
}

/// A `..data` whose dir is gone, or a visible name linked elsewhere, is
/// not a payload in place: the write repairs both.
#[test]
fn a_dangling_data_link_or_a_foreign_link_is_repaired() {
    let (_d, dir) = volume();
    let p = payload(&[("a", "A", 0o644)]);
    run(&dir, &p, None, 1);
    let data = std::fs::read_link(dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join(&data)).unwrap();
    assert_eq!(run(&dir, &p, None, 2), Action::Performed);
    assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"A");

    std::fs::remove_file(dir.join("a")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", dir.join("a")).unwrap();
    assert_eq!(run(&dir, &p, None, 3), Action::Performed);
    assert_eq!(
        std::fs::read_link(dir.join("a")).unwrap(),
        Path::new("..data/a")
    );
}

/// A first write makes each visible link without reading it first (the
/// listing showed none); a second write reads each once, and makes none.
#[test]
fn a_first_write_makes_its_links_without_a_look_and_a_second_only_looks() {
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::FileKind;
    let sys = RecordingSys::new();
    sys.add("/r/vol", FileKind::Dir);
    let p = payload(&[("a", "A", 0o644), ("d/b", "B", 0o644)]);
    let params = params();
    let t = fake_target(false);
    let write_at = |secs| {
        let mut op = Op::new(&sys, Operation::SetUp, &params);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        write(&mut op, &t, &p, now).unwrap()
    };
    let links = |calls: &[SysCall]| {
        let reads = calls
            .iter()
            .filter(|c| matches!(c, SysCall::ReadLink { path } if !path.ends_with("..data")))
            .count();
        let made = calls
            .iter()
            .filter(|c| matches!(c, SysCall::Symlink { path, .. } if !path.ends_with("..data_tmp")))
            .count();
        (reads, made)
    };
    assert_eq!(write_at(1), Action::Performed);
    assert_eq!(links(&sys.calls()), (0, 2), "{:#?}", sys.calls());
    sys.clear_calls();
    assert_eq!(write_at(2), Action::AlreadyInPlace);
    assert_eq!(links(&sys.calls()), (2, 0), "{:#?}", sys.calls());
}

/// A first write of a projected-like payload (three files) makes each
/// entry through a handle: the volume dir is the one path walked from the
/// root, the payload dir gets its exact mode when made (no chmod pass at
/// the end), and `..data` is not read when the listing shows none. Before
/// the handles, the same write walked from the root 12 times, each walk a
/// `openat2` of the whole path (about 5 syscalls a call, 140 a volume).
#[test]
fn a_first_write_walks_from_the_root_once_and_acts_through_handles() {
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::{Call, FileKind};
    let sys = RecordingSys::new();
    sys.add("/r/vol", FileKind::Dir);
    let p = payload(&[
        ("ca.crt", "C", 0o644),
        ("namespace", "N", 0o644),
        ("token", "T", 0o600),
    ]);
    let params = params();
    let t = fake_target(false);
    let mut op = Op::new(&sys, Operation::SetUp, &params);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
    assert_eq!(write(&mut op, &t, &p, now).unwrap(), Action::Performed);
    let calls = sys.calls();
    let kinds: Vec<Call> = calls.iter().map(SysCall::kind).collect();
    use Call::*;
    let want = [
        OpenDir,
        ReadDirBeneath,
        Mkdir,
        ChmodDir,
        CreateFile,
        CreateFile,
        CreateFile,
        Symlink,
        Replace,
        Symlink,
        Symlink,
        Symlink,
    ];
    assert_eq!(kinds, want, "{calls:#?}");
    assert_eq!(sys.walks_from(Path::new("/r")), 1, "{calls:#?}");
    let stamp = format!("..1970_01_01_00_00_01.000000000.{}", &p.version.hash[..12]);
    assert!(
        calls.contains(&SysCall::ChmodDir {
            path: Path::new("/r/vol").join(&stamp),
            mode: 0o755
        }),
        "{calls:#?}"
    );
}

/// A volume dir the SetUp just made or mounted (`fresh`) is empty, so the
/// first write does not list it: one call fewer than the write above, and
/// the same payload on disk.
#[test]
fn a_write_into_a_fresh_volume_dir_does_not_list_it() {
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::{Call, FileKind};
    let sys = RecordingSys::new();
    sys.add("/r/vol", FileKind::Dir);
    let p = payload(&[("ca.crt", "C", 0o644), ("token", "T", 0o600)]);
    let params = params();
    let t = fake_target(true);
    let mut op = Op::new(&sys, Operation::SetUp, &params);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1);
    assert_eq!(write(&mut op, &t, &p, now).unwrap(), Action::Performed);
    let calls = sys.calls();
    let kinds: Vec<Call> = calls.iter().map(SysCall::kind).collect();
    assert_eq!(kinds[0], Call::OpenDir, "{calls:#?}");
    assert!(!kinds.contains(&Call::ReadDirBeneath), "{calls:#?}");
    assert!(sys.exists("/r/vol/..data") && sys.exists("/r/vol/token"));
}
