//! Unit tests of the emptyDir plugin against the recording fake: the exact
//! syscalls for each case, idempotency, and certainty of injected failures.

use std::path::{Path, PathBuf};

use super::*;
use crate::host::recording_sys::{RecordingSys, SysCall};
use crate::host::sys::{Call, MntFlags};
use crate::model::{SeLinuxContext, UniqueVolumeName};
use crate::plugins::Certainty;

const TARGET: &str = "/k/pods/pod1/volumes/kubernetes.io~empty-dir/cache";
const MARKER_DIR: &str = "/k/pods/pod1/plugins/kubernetes.io~empty-dir/cache";
const MARKER: &str = "/k/pods/pod1/plugins/kubernetes.io~empty-dir/cache/ready";

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn plugin() -> EmptyDirPlugin {
    EmptyDirPlugin::with_seq_start(Layout::new("/k"), 7)
}

fn host() -> RecordingSys {
    let sys = RecordingSys::new();
    sys.add(
        "/k/pods/pod1/volumes/kubernetes.io~empty-dir",
        FileKind::Dir,
    );
    sys.add(
        "/k/pods/pod1/plugins/kubernetes.io~empty-dir",
        FileKind::Dir,
    );
    sys
}

fn params(kind: TargetKind, selinux: Option<SeLinuxContext>) -> TargetParams {
    let pod = PodUid::new("pod1").unwrap();
    TargetParams::at(
        UniqueVolumeName::per_pod(PluginName::EmptyDir, &pod, "cache"),
        PluginName::EmptyDir,
        "cache".into(),
        TargetRef::Pod(pod),
        kind,
        Some(p(TARGET).into()),
    )
    .with_selinux(selinux)
}

fn disk() -> VolumeSpec {
    VolumeSpec::EmptyDir {
        medium: StorageMedium::Disk,
        size_limit: None,
    }
}

fn memory(size: Option<u64>) -> VolumeSpec {
    VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: size,
    }
}

fn label() -> SeLinuxContext {
    SeLinuxContext::parse("system_u:object_r:container_file_t:s0:c5,c1").unwrap()
}

fn marker_calls() -> Vec<SysCall> {
    vec![
        SysCall::Mkdir {
            path: p(MARKER_DIR),
            mode: 0o750,
        },
        SysCall::CreateFile {
            path: p(MARKER),
            mode: 0o644,
        },
    ]
}

#[test]
fn disk_setup_makes_a_0777_dir_and_the_ready_marker_then_is_in_place() {
    let sys = host();
    let pa = params(TargetKind::Dir, None);
    let out = plugin()
        .setup(&Permit::JournalOff, &disk(), &pa, &sys)
        .unwrap();
    assert_eq!(out.action, Action::Performed);
    let mut want = vec![
        SysCall::Mkdir {
            path: p(TARGET),
            mode: 0o777,
        },
        SysCall::ChmodDir {
            path: p(TARGET),
            mode: 0o777,
        },
    ];
    want.extend(marker_calls());
    assert_eq!(sys.mutations(), want);
    sys.clear_calls();
    let out = plugin()
        .setup(&Permit::JournalOff, &disk(), &pa, &sys)
        .unwrap();
    assert_eq!(out.action, Action::AlreadyInPlace);
    assert!(sys.mutations().is_empty());
}

#[test]
fn disk_dir_without_marker_is_finished_not_recreated() {
    let sys = host();
    sys.add(TARGET, FileKind::Dir);
    let out = plugin()
        .setup(
            &Permit::JournalOff,
            &disk(),
            &params(TargetKind::Dir, None),
            &sys,
        )
        .unwrap();
    assert_eq!(out.action, Action::Performed);
    let mut want = vec![SysCall::ChmodDir {
        path: p(TARGET),
        mode: 0o777,
    }];
    want.extend(marker_calls());
    assert_eq!(sys.mutations(), want);
}

#[test]
fn memory_setup_mounts_a_sized_labelled_tmpfs_and_a_second_setup_mounts_nothing() {
    let sys = host();
    let pa = params(TargetKind::Mount, Some(label()));
    let out = plugin()
        .setup(&Permit::JournalOff, &memory(Some(1 << 20)), &pa, &sys)
        .unwrap();
    assert_eq!(out.action, Action::Performed);
    let table = sys.read_mountinfo().unwrap();
    let shown = table.top_at(Path::new(TARGET)).unwrap().identity();
    assert_eq!(shown.selinux, Some(label()));
    assert_eq!(out.seen, Some(shown), "the identity the table shows");
    let mut want = vec![
        SysCall::Mkdir {
            path: p(TARGET),
            mode: 0o750,
        },
        SysCall::Mount {
            source: Some(p("tmpfs")),
            target: p(TARGET),
            fstype: Some("tmpfs".into()),
            flags: MsFlags::empty(),
            data: Some(
                "size=1048576,context=\"system_u:object_r:container_file_t:s0:c1,c5\"".into(),
            ),
        },
        SysCall::ChmodDir {
            path: p(TARGET),
            mode: 0o777,
        },
    ];
    want.extend(marker_calls());
    assert_eq!(sys.mutations(), want);

    sys.clear_calls();
    let out = plugin()
        .setup(&Permit::JournalOff, &memory(Some(1 << 20)), &pa, &sys)
        .unwrap();
    assert_eq!(out.action, Action::AlreadyInPlace);
    assert!(sys.mutations().is_empty(), "{:?}", sys.mutations());
}

#[test]
fn a_tmpfs_of_another_size_is_remounted_never_replaced() {
    let sys = host();
    sys.add(TARGET, FileKind::Dir);
    sys.add(MARKER, FileKind::File);
    sys.preset_mount(
        None,
        Path::new(TARGET),
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=1024k"),
    )
    .unwrap();
    let out = plugin()
        .setup(
            &Permit::JournalOff,
            &memory(Some(2 << 20)),
            &params(TargetKind::Mount, None),
            &sys,
        )
        .unwrap();
    assert_eq!(out.action, Action::Remounted);
    assert_eq!(
        sys.mutations(),
        vec![SysCall::Mount {
            source: None,
            target: p(TARGET),
            fstype: Some("tmpfs".into()),
            flags: MsFlags::MS_REMOUNT,
            data: Some("size=2097152".into()),
        }]
    );
    assert_eq!(sys.mounts().len(), 1, "still the same tmpfs");
}

/// A symlink where the tmpfs goes is refused, naming the path, and
/// nothing is mounted: mounting through it would put the volume wherever
/// it points.
#[test]
fn a_symlink_at_a_memory_target_is_refused_not_mounted_through() {
    let sys = host();
    sys.add(TARGET, FileKind::Symlink);
    let err = plugin()
        .setup(
            &Permit::JournalOff,
            &memory(None),
            &params(TargetKind::Mount, None),
            &sys,
        )
        .unwrap_err();
    assert!(err.to_string().contains(TARGET), "{err}");
    assert!(err.to_string().contains("symlink"), "{err}");
    assert!(
        !sys.mutations()
            .iter()
            .any(|c| matches!(c, SysCall::Mount { .. })),
        "{:?}",
        sys.mutations()
    );
}

/// A symlink at any level between the root and the target or marker:
/// SetUp (disk or memory) and TearDown fail with `ELOOP`, and no mount,
/// dir, rename or marker goes through it (the fake refuses a symlink on the
/// way of a `*_beneath` call as `openat2(RESOLVE_NO_SYMLINKS)` does; the
/// real kernel is tested in tests/plugins_real.rs).
#[test]
fn a_symlink_on_the_way_to_a_target_or_marker_is_refused() {
    let levels = [
        "/k/pods",
        "/k/pods/pod1",
        "/k/pods/pod1/volumes",
        "/k/pods/pod1/volumes/kubernetes.io~empty-dir",
        "/k/pods/pod1/plugins",
        "/k/pods/pod1/plugins/kubernetes.io~empty-dir",
    ];
    for link in levels {
        for (kind, spec) in [(TargetKind::Dir, disk()), (TargetKind::Mount, memory(None))] {
            let sys = RecordingSys::new();
            sys.add("/k", FileKind::Dir);
            sys.add(link, FileKind::Symlink);
            let pa = params(kind, None);
            let err = plugin()
                .setup(&Permit::JournalOff, &spec, &pa, &sys)
                .unwrap_err();
            assert!(err.to_string().contains("ELOOP"), "{link}: {err}");
            let nothing_through = |when: &str| {
                for path in [TARGET, MARKER_DIR, MARKER] {
                    if Path::new(path).starts_with(link) {
                        assert!(!sys.exists(path), "{when} {link} {kind:?}: {path} made");
                    }
                }
                let mounted: Vec<_> = sys.mounts().into_iter().map(|m| m.target).collect();
                assert!(
                    mounted.iter().all(|m| !m.starts_with(link)),
                    "{when} {link} {kind:?}: {mounted:?}"
                );
            };
            nothing_through("setup");
            // A teardown of what the journal says is there finds nothing
            // (the fake's link leads nowhere) or refuses; it never goes through.
            if let Err(e) = plugin().teardown(&Permit::JournalOff, &pa, &sys) {
                assert!(e.to_string().contains("ELOOP"), "{link} {kind:?}: {e}");
            }
            nothing_through("teardown");
        }
    }
}

#[test]
fn a_foreign_mount_at_a_memory_target_is_unmounted_then_the_tmpfs_mounted() {
    let sys = host();
    sys.add(TARGET, FileKind::Dir);
    sys.add("/elsewhere", FileKind::Dir);
    sys.preset_mount(
        Some(Path::new("/elsewhere")),
        Path::new(TARGET),
        None,
        MsFlags::MS_BIND,
        None,
    )
    .unwrap();
    let out = plugin()
        .setup(
            &Permit::JournalOff,
            &memory(None),
            &params(TargetKind::Mount, None),
            &sys,
        )
        .unwrap();
    assert_eq!(out.action, Action::Replaced);
    let mut want = vec![
        SysCall::Umount {
            target: p(TARGET),
            flags: MntFlags::UMOUNT_NOFOLLOW,
        },
        SysCall::Mount {
            source: Some(p("tmpfs")),
            target: p(TARGET),
            fstype: Some("tmpfs".into()),
            flags: MsFlags::empty(),
            data: None,
        },
        SysCall::ChmodDir {
            path: p(TARGET),
            mode: 0o777,
        },
    ];
    want.extend(marker_calls());
    assert_eq!(sys.mutations(), want);
}

#[test]
fn tmpfs_teardown_unmounts_then_removes_the_dir_and_the_marker() {
    let sys = host();
    let pa = params(TargetKind::Mount, None);
    plugin()
        .setup(&Permit::JournalOff, &memory(None), &pa, &sys)
        .unwrap();
    sys.clear_calls();
    let out = plugin().teardown(&Permit::JournalOff, &pa, &sys).unwrap();
    assert_eq!(out.action, Action::Performed);
    assert_eq!(
        sys.mutations(),
        vec![
            SysCall::Umount {
                target: p(TARGET),
                flags: MntFlags::UMOUNT_NOFOLLOW
            },
            SysCall::Rmdir { path: p(TARGET) },
            // the marker and its dir, beneath the pod dir
            SysCall::RemoveBeneath {
                base: p("/k/pods/pod1"),
                rel: p("plugins/kubernetes.io~empty-dir/cache/ready"),
                dir: false,
            },
            SysCall::RemoveBeneath {
                base: p("/k/pods/pod1"),
                rel: p("plugins/kubernetes.io~empty-dir/cache"),
                dir: true,
            },
        ]
    );
    sys.clear_calls();
    assert_eq!(
        plugin()
            .teardown(&Permit::JournalOff, &pa, &sys)
            .unwrap()
            .action,
        Action::AlreadyInPlace
    );
    assert!(sys.mutations().is_empty());
}

#[test]
fn disk_teardown_renames_then_deletes() {
    let sys = host();
    let pa = params(TargetKind::Dir, None);
    plugin()
        .setup(&Permit::JournalOff, &disk(), &pa, &sys)
        .unwrap();
    sys.add(format!("{TARGET}/data/file"), FileKind::File);
    sys.clear_calls();
    let out = plugin().teardown(&Permit::JournalOff, &pa, &sys).unwrap();
    let deleting = format!("{TARGET}.deleting~7");
    assert_eq!(out.action, Action::Performed);
    assert!(out.left_behind.is_empty());
    assert_eq!(
        sys.mutations()[0],
        SysCall::Rename {
            from: p(TARGET),
            to: p(&deleting)
        }
    );
    assert!(!sys.exists(TARGET));
    assert!(!sys.exists(&deleting));
    assert!(!sys.exists(MARKER));
}

/// A mount anywhere below a disk emptyDir: the rename would carry it to
/// the `.deleting~` path. The dir is left where it is, untouched, and the
/// TearDown fails (final) naming the mount, to be retried once it is gone.
#[test]
fn a_disk_teardown_with_a_mount_beneath_leaves_everything_where_it_is() {
    let sys = host();
    let pa = params(TargetKind::Dir, None);
    plugin()
        .setup(&Permit::JournalOff, &disk(), &pa, &sys)
        .unwrap();
    sys.add(format!("{TARGET}/data/file"), FileKind::File);
    sys.add(format!("{TARGET}/x/mnt/inside"), FileKind::File);
    let nested = p(TARGET).join("x/mnt");
    sys.preset_mount(None, &nested, Some("tmpfs"), MsFlags::empty(), None)
        .unwrap();
    sys.clear_calls();
    let e = plugin()
        .teardown(&Permit::JournalOff, &pa, &sys)
        .unwrap_err();
    assert!(
        matches!(&e, PluginError::MountsBeneath { path, mounts, .. }
            if path == Path::new(TARGET) && mounts == std::slice::from_ref(&nested)),
        "{e}"
    );
    assert_eq!(e.certainty(), Certainty::Final);
    let msg = e.to_string();
    assert!(msg.contains(&format!("{TARGET}/x/mnt")), "{msg}");
    assert_eq!(
        sys.mutations(),
        vec![],
        "nothing renamed, deleted or unmounted"
    );
    assert!(sys.exists(format!("{TARGET}/data/file")));
    assert!(sys.exists(MARKER));
    assert_eq!(
        sys.mounts()
            .iter()
            .map(|m| m.target.clone())
            .collect::<Vec<_>>(),
        vec![nested.clone()],
        "the mount is where it was"
    );

    // once it is unmounted, the retry deletes the dir
    sys.umount2_beneath(
        Beneath::split(Path::new("/k"), &nested).unwrap(),
        MntFlags::empty(),
    )
    .unwrap();
    plugin().teardown(&Permit::JournalOff, &pa, &sys).unwrap();
    assert!(!sys.exists(TARGET));
}

#[test]
fn a_disk_target_with_something_mounted_on_it_is_never_deleted() {
    let sys = host();
    sys.add(TARGET, FileKind::Dir);
    sys.preset_mount(
        None,
        Path::new(TARGET),
        Some("tmpfs"),
        MsFlags::empty(),
        None,
    )
    .unwrap();
    let e = plugin()
        .teardown(&Permit::JournalOff, &params(TargetKind::Dir, None), &sys)
        .unwrap_err();
    assert!(matches!(e, PluginError::TargetIsMountPoint { .. }), "{e}");
    assert_eq!(e.certainty(), Certainty::Final);
    assert!(sys.mutations().is_empty());
}

#[test]
fn pending_deletions_of_a_pod_are_finished() {
    let sys = host();
    let pa = params(TargetKind::Dir, None);
    plugin()
        .setup(&Permit::JournalOff, &disk(), &pa, &sys)
        .unwrap();
    sys.add(format!("{TARGET}/f"), FileKind::File);
    sys.fail_nth(Call::RemoveBeneath, 1, Errno::EINTR);
    let e = plugin()
        .teardown(&Permit::JournalOff, &pa, &sys)
        .unwrap_err();
    assert_eq!(e.certainty(), Certainty::Uncertain, "renamed already: {e}");
    assert!(sys.exists(format!("{TARGET}.deleting~7/f")));
    let done = plugin()
        .finish_pending(&PodUid::new("pod1").unwrap(), &sys)
        .unwrap();
    assert_eq!(done.len(), 1);
    assert!(!sys.exists(format!("{TARGET}.deleting~7")));
}

#[test]
fn injected_failures_name_the_call_and_path_and_say_final_or_uncertain() {
    let pa = params(TargetKind::Mount, None);

    let sys = host();
    sys.fail_nth(Call::Mount, 1, Errno::ENOMEM);
    let e = plugin()
        .setup(&Permit::JournalOff, &memory(None), &pa, &sys)
        .unwrap_err();
    assert_eq!(e.certainty(), Certainty::Final);
    assert_eq!(
        e.to_string(),
        format!("setup kubernetes.io/empty-dir/pod1-cache: mount {TARGET}: ENOMEM: Out of memory")
    );

    let sys = host();
    sys.fail_nth(Call::ChmodDir, 1, Errno::EPERM);
    let e = plugin()
        .setup(&Permit::JournalOff, &memory(None), &pa, &sys)
        .unwrap_err();
    assert_eq!(
        e.certainty(),
        Certainty::Uncertain,
        "the tmpfs is mounted: {e}"
    );
    assert_eq!(e.sys_error().map(|s| s.kind()), Some(Call::ChmodDir));

    let sys = host();
    plugin()
        .setup(&Permit::JournalOff, &memory(None), &pa, &sys)
        .unwrap();
    sys.fail_nth(Call::Umount, 1, Errno::EBUSY);
    let e = plugin()
        .teardown(&Permit::JournalOff, &pa, &sys)
        .unwrap_err();
    assert_eq!(e.certainty(), Certainty::Final);
    assert_eq!(
        e.sys_error().and_then(|s| s.path()),
        Some(Path::new(TARGET))
    );
}

/// A SetUp walks from the root once, to open the pod dir; the target's dir
/// and the marker's dir are opened through that handle, and the target,
/// its mount, its mode and the marker are named through theirs. (Path by
/// path, a tmpfs SetUp of a new pod walked from the root for each of its 8
/// calls: 58 syscalls on Linux, 34 through the handles.)
#[test]
fn a_setup_walks_from_the_root_once_and_acts_through_handles() {
    use Call::*;
    // (the marker's dir is opened, made and opened again: the fake's
    // `open_dirs_in`; Linux makes and opens it in one walk)
    let marker = [OpenDir, ChmodDir, OpenDir, Mkdir, OpenDir, CreateFile];
    let cases = [
        (
            TargetKind::Mount,
            memory(None),
            &[Stat, Mkdir, Mount, Stat][..],
        ),
        (TargetKind::Dir, disk(), &[Stat, Mkdir][..]),
    ];
    for (kind, spec, target) in cases {
        let sys = host();
        plugin()
            .setup(&Permit::JournalOff, &spec, &params(kind, None), &sys)
            .unwrap();
        let calls = sys.calls();
        let kinds: Vec<Call> = calls.iter().map(SysCall::kind).collect();
        let want: Vec<Call> = [OpenDir, OpenDir]
            .iter()
            .chain(target)
            .chain(&marker)
            .copied()
            .collect();
        assert_eq!(kinds, want, "{kind:?}: {calls:#?}");
        assert_eq!(sys.walks_from(Path::new("/k")), 1, "{kind:?}: {calls:#?}");
        assert!(sys.exists(MARKER), "{kind:?}");
    }
}

/// In a pod dir the SetUp made, nothing is looked for before it is made:
/// every level below is new, so no `stat` of the target or the marker.
#[test]
fn a_new_pod_dir_is_filled_without_looking() {
    let sys = RecordingSys::new();
    sys.add("/k/pods", FileKind::Dir);
    let pa = params(TargetKind::Mount, None);
    let out = plugin()
        .setup(&Permit::JournalOff, &memory(None), &pa, &sys)
        .unwrap();
    assert_eq!(out.action, Action::Performed);
    let calls = sys.calls();
    let stats = calls
        .iter()
        .filter(|c| matches!(c, SysCall::Stat { path, .. } if path != Path::new(TARGET)))
        .count();
    assert_eq!(stats, 0, "{calls:#?}");
    assert!(sys.exists(MARKER));
    assert_eq!(sys.mounts().len(), 1);
}

/// `set_up` says when the volume dir is new (made, or a new tmpfs on it),
/// so a payload writer need not list it; a SetUp that finds the volume in
/// place says it is not.
#[test]
fn set_up_says_whether_the_volume_dir_is_new() {
    for (kind, spec) in [(TargetKind::Dir, disk()), (TargetKind::Mount, memory(None))] {
        let sys = host();
        let pa = params(kind, None);
        let (out, dir) = plugin()
            .set_up(&Permit::JournalOff, &spec, &pa, &sys)
            .unwrap();
        assert_eq!(
            (out.action, dir.fresh),
            (Action::Performed, true),
            "{kind:?}"
        );
        let vol = dir.handle.expect("the volume dir, opened for its mode");
        assert_eq!(vol.path(), Path::new(TARGET));
        let (out, dir) = plugin()
            .set_up(&Permit::JournalOff, &spec, &pa, &sys)
            .unwrap();
        assert_eq!(
            (out.action, dir.fresh),
            (Action::AlreadyInPlace, false),
            "{kind:?}"
        );
        assert!(dir.handle.is_none(), "{kind:?}");
    }
}

/// The kubelet's size for a memory emptyDir: the spec's (the pod's limit
/// or `sizeLimit`, whichever is smaller) capped by the node's allocatable
/// memory, which is also the size when the spec gives none.
#[test]
fn a_tmpfs_is_capped_by_the_node_s_allocatable_memory() {
    let node = 8u64 << 20;
    // (spec size, node memory) -> the size= mounted
    let cases = [
        (None, None, None),
        (None, Some(node), Some(node)),
        (Some(1 << 20), Some(node), Some(1 << 20)),
        (Some(16 << 20), Some(node), Some(node)),
        (Some(1 << 20), None, Some(1 << 20)),
    ];
    for (spec, node_memory, want) in cases {
        let sys = host();
        let pa = params(TargetKind::Mount, None);
        plugin()
            .with_node_memory(node_memory)
            .setup(&Permit::JournalOff, &memory(spec), &pa, &sys)
            .unwrap();
        let data = sys.mutations().into_iter().find_map(|c| match c {
            SysCall::Mount { data, .. } => Some(data),
            _ => None,
        });
        let want = want.map(|n| format!("size={n}"));
        assert_eq!(data, Some(want), "{spec:?} {node_memory:?}");
    }
}
