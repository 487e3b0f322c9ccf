//! Unit tests of the local PV plugin against the recording fake: format only
//! when there is no filesystem, exact mount calls, replace-never-adopt, and
//! certainty of injected failures.

use std::path::{Path, PathBuf};

use super::*;
use crate::host::recording_sys::{RecordingSys, SysCall};
use crate::host::sys::{Call, Errno, MntFlags};
use crate::model::{
    DevId, Layout, PodUid, SeLinuxContext, TargetKind, TargetRef, UniqueVolumeName,
};
use crate::plugins::Certainty;

const DEV: &str = "/dev/loop7";
const GLOBAL: &str = "/k/plugins/kubernetes.io/local-volume/mounts/pv1";

fn plugin() -> LocalPlugin {
    LocalPlugin::new(Layout::new("/k"))
}

fn p(s: &str) -> PathBuf {
    PathBuf::from(s)
}

fn pod_path(pod: &str) -> PathBuf {
    Layout::new("/k").pod_target_path(&PodUid::new(pod).unwrap(), PluginName::LocalVolume, "pv1")
}

fn host(format: DiskFormat) -> RecordingSys {
    let sys = RecordingSys::new();
    sys.add_device(DEV, DevId { major: 7, minor: 7 }, format);
    sys.add(
        "/k/plugins/kubernetes.io/local-volume/mounts",
        FileKind::Dir,
    );
    for pod in ["podA", "podB"] {
        sys.add(pod_path(pod).parent().unwrap(), FileKind::Dir);
    }
    sys
}

fn block_spec() -> VolumeSpec {
    VolumeSpec::Local {
        path: p(DEV).into(),
        fs_type: Some("ext4".into()),
        access_modes: Vec::new(),
        mount_options: Default::default(),
        is_block: true,
        volume_mode: Default::default(),
    }
}

fn dir_spec(path: &str) -> VolumeSpec {
    VolumeSpec::Local {
        path: p(path).into(),
        fs_type: None,
        access_modes: Vec::new(),
        mount_options: Default::default(),
        is_block: false,
        volume_mode: Default::default(),
    }
}

fn params(target: TargetRef, options: &[&str], selinux: Option<SeLinuxContext>) -> TargetParams {
    let pod_mount_path = target.pod().map(|pod| pod_path(pod.as_str()).into());
    TargetParams::at(
        UniqueVolumeName::shared(PluginName::LocalVolume, "pv1"),
        PluginName::LocalVolume,
        "pv1".into(),
        target,
        TargetKind::Mount,
        None,
    )
    .with_device_path(Some(p(DEV).into()))
    .with_device_mount_path(Some(p(GLOBAL).into()))
    .with_pod_mount_path(pod_mount_path)
    .with_selinux(selinux)
    .with_mount_options(options.iter().map(|s| s.to_string()).collect())
    .with_fs_type(Some("ext4".into()))
}

fn device() -> TargetParams {
    params(TargetRef::Device, &[], None)
}

fn pod(uid: &str) -> TargetParams {
    params(TargetRef::Pod(PodUid::new(uid).unwrap()), &[], None)
}

fn device_mount(flags: MsFlags, data: Option<&str>) -> SysCall {
    SysCall::Mount {
        source: Some(p(DEV)),
        target: p(GLOBAL),
        fstype: Some("ext4".into()),
        flags,
        data: data.map(str::to_owned),
    }
}

fn bind(to: PathBuf) -> SysCall {
    SysCall::Mount {
        source: Some(p(GLOBAL)),
        target: to,
        fstype: None,
        flags: MsFlags::MS_BIND,
        data: None,
    }
}

#[test]
fn formats_only_a_device_with_no_filesystem_and_never_reformats() {
    let sys = host(DiskFormat::Unformatted);
    assert!(
        plugin()
            .needs_format(&block_spec(), &device(), &sys)
            .unwrap()
    );
    let out = plugin()
        .format(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap();
    assert_eq!(out.action, Action::Performed);
    assert_eq!(
        sys.mutations(),
        vec![SysCall::Mkfs {
            device: p(DEV),
            fstype: "ext4".into()
        }]
    );
    sys.clear_calls();
    assert!(
        !plugin()
            .needs_format(&block_spec(), &device(), &sys)
            .unwrap()
    );
    let out = plugin()
        .format(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap();
    assert_eq!(out.action, Action::AlreadyInPlace);
    assert!(sys.mutations().is_empty());

    let sys = host(DiskFormat::PartitionTable("gpt".into()));
    assert!(
        !plugin()
            .needs_format(&block_spec(), &device(), &sys)
            .unwrap()
    );
    let e = plugin()
        .format(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap_err();
    assert!(matches!(e, PluginError::FormatMismatch { .. }), "{e}");
    assert!(sys.mutations().is_empty());
}

#[test]
fn mount_device_refuses_an_unformatted_or_foreign_filesystem() {
    let sys = host(DiskFormat::Unformatted);
    let e = plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap_err();
    assert!(matches!(e, PluginError::NotFormatted { .. }), "{e}");
    assert_eq!(e.certainty(), Certainty::Final);
    let sys = host(DiskFormat::Filesystem("xfs".into()));
    let e = plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "mount_device kubernetes.io/local-volume/pv1: /dev/loop7 holds xfs, not ext4; refusing to touch it"
    );
    assert!(sys.mutations().is_empty());
}

#[test]
fn mount_device_passes_options_and_context_and_is_idempotent() {
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    let label = SeLinuxContext::parse("system_u:object_r:container_file_t:s0:c9,c2").unwrap();
    let pa = params(TargetRef::Device, &["noatime", "discard"], Some(label));
    let out = plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &pa, &sys)
        .unwrap();
    assert_eq!(out.action, Action::Performed);
    assert_eq!(
        sys.mutations(),
        vec![
            SysCall::Mkdir {
                path: p(GLOBAL),
                mode: 0o750
            },
            device_mount(
                MsFlags::MS_NOATIME,
                Some("discard,context=\"system_u:object_r:container_file_t:s0:c2,c9\"")
            ),
        ]
    );
    sys.clear_calls();
    let out = plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &pa, &sys)
        .unwrap();
    assert_eq!(out.action, Action::AlreadyInPlace);
    assert!(sys.mutations().is_empty(), "already mounted: no mount call");
}

#[test]
fn a_foreign_mount_at_the_device_target_is_unmounted_then_the_device_mounted() {
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    sys.add(GLOBAL, FileKind::Dir);
    sys.preset_mount(
        None,
        Path::new(GLOBAL),
        Some("tmpfs"),
        MsFlags::empty(),
        None,
    )
    .unwrap();
    let out = plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap();
    assert_eq!(out.action, Action::Replaced);
    assert_eq!(
        sys.mutations(),
        vec![
            SysCall::Umount {
                target: p(GLOBAL),
                flags: MntFlags::UMOUNT_NOFOLLOW
            },
            device_mount(MsFlags::empty(), None),
        ]
    );
}

#[test]
fn a_failed_mount_after_replacing_a_foreign_one_is_uncertain() {
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    sys.add(GLOBAL, FileKind::Dir);
    sys.preset_mount(
        None,
        Path::new(GLOBAL),
        Some("tmpfs"),
        MsFlags::empty(),
        None,
    )
    .unwrap();
    sys.fail_nth(Call::Mount, 1, Errno::EINVAL);
    let e = plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap_err();
    assert_eq!(e.certainty(), Certainty::Uncertain);
    assert_eq!(
        e.to_string(),
        format!(
            "mount_device kubernetes.io/local-volume/pv1: mount {GLOBAL}: EINVAL: Invalid argument"
        )
    );
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    sys.fail_nth(Call::Mount, 1, Errno::EINVAL);
    let e = plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap_err();
    assert_eq!(e.certainty(), Certainty::Final, "nothing changed: {e}");
}

#[test]
fn a_failed_mkfs_is_uncertain() {
    let sys = host(DiskFormat::Unformatted);
    sys.fail_nth(Call::Mkfs, 1, Errno::EIO);
    let e = plugin()
        .format(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap_err();
    assert_eq!(e.certainty(), Certainty::Uncertain);
    assert_eq!(e.sys_error().and_then(|s| s.path()), Some(Path::new(DEV)));
}

#[test]
fn setup_binds_the_device_mount_into_each_pod_once() {
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap();
    sys.clear_calls();
    for uid in ["podA", "podB"] {
        let out = plugin()
            .setup(&Permit::JournalOff, &block_spec(), &pod(uid), &sys)
            .unwrap();
        assert_eq!(out.action, Action::Performed);
    }
    assert_eq!(
        sys.mutations(),
        vec![
            SysCall::Mkdir {
                path: pod_path("podA"),
                mode: 0o750
            },
            bind(pod_path("podA")),
            SysCall::Mkdir {
                path: pod_path("podB"),
                mode: 0o750
            },
            bind(pod_path("podB")),
        ]
    );
    sys.clear_calls();
    let out = plugin()
        .setup(&Permit::JournalOff, &block_spec(), &pod("podA"), &sys)
        .unwrap();
    assert_eq!(out.action, Action::AlreadyInPlace);
    assert!(sys.mutations().is_empty());
    let table = sys.read_mountinfo().unwrap();
    let dev = |path: &Path| table.top_at(path).map(|m| m.dev);
    assert_eq!(dev(&pod_path("podA")), Some(DevId { major: 7, minor: 7 }));
    assert_eq!(dev(&pod_path("podA")), dev(&pod_path("podB")));
}

#[test]
fn a_read_only_setup_binds_then_remounts_read_only() {
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap();
    sys.clear_calls();
    let pa = params(TargetRef::Pod(PodUid::new("podA").unwrap()), &["ro"], None);
    plugin()
        .setup(&Permit::JournalOff, &block_spec(), &pa, &sys)
        .unwrap();
    assert_eq!(
        sys.mutations()[1..],
        [
            bind(pod_path("podA")),
            SysCall::Mount {
                source: None,
                target: pod_path("podA"),
                fstype: None,
                flags: MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
                data: None,
            },
        ]
    );
    sys.clear_calls();
    assert_eq!(
        plugin()
            .setup(&Permit::JournalOff, &block_spec(), &pa, &sys)
            .unwrap()
            .action,
        Action::AlreadyInPlace
    );
    // The same target wanted read-write is a different identity: replaced.
    let out = plugin()
        .setup(&Permit::JournalOff, &block_spec(), &pod("podA"), &sys)
        .unwrap();
    assert_eq!(out.action, Action::Replaced);
}

#[test]
fn setup_needs_the_device_target_mounted() {
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    let e = plugin()
        .setup(&Permit::JournalOff, &block_spec(), &pod("podA"), &sys)
        .unwrap_err();
    assert!(matches!(e, PluginError::DeviceNotMounted { .. }), "{e}");
    assert!(sys.mutations().is_empty());
}

#[test]
fn a_directory_pv_is_bind_mounted_and_has_no_device_target() {
    let sys = host(DiskFormat::Unformatted);
    sys.add("/mnt/disks/vol1", FileKind::Dir);
    let spec = dir_spec("/mnt/disks/vol1");
    assert_eq!(plugin().device_target_kind(&spec), None);
    assert!(
        plugin()
            .mount_device(&Permit::JournalOff, &spec, &device(), &sys)
            .is_err()
    );
    let out = plugin()
        .setup(&Permit::JournalOff, &spec, &pod("podA"), &sys)
        .unwrap();
    assert_eq!(out.action, Action::Performed);
    assert_eq!(
        sys.mutations()[1],
        SysCall::Mount {
            source: Some(p("/mnt/disks/vol1")),
            target: pod_path("podA"),
            fstype: None,
            flags: MsFlags::MS_BIND,
            data: None,
        }
    );
    sys.clear_calls();
    assert_eq!(
        plugin()
            .setup(&Permit::JournalOff, &spec, &pod("podA"), &sys)
            .unwrap()
            .action,
        Action::AlreadyInPlace
    );
    assert!(sys.mutations().is_empty());
}

#[test]
fn teardown_and_unmount_device_unmount_then_remove_the_dir_and_repeat_harmlessly() {
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap();
    plugin()
        .setup(&Permit::JournalOff, &block_spec(), &pod("podA"), &sys)
        .unwrap();
    sys.clear_calls();
    assert_eq!(
        plugin()
            .teardown(&Permit::JournalOff, &pod("podA"), &sys)
            .unwrap()
            .action,
        Action::Performed
    );
    assert_eq!(
        plugin()
            .unmount_device(&Permit::JournalOff, &device(), &sys)
            .unwrap()
            .action,
        Action::Performed
    );
    assert_eq!(
        sys.mutations(),
        vec![
            SysCall::Umount {
                target: pod_path("podA"),
                flags: MntFlags::UMOUNT_NOFOLLOW
            },
            SysCall::Rmdir {
                path: pod_path("podA")
            },
            SysCall::Umount {
                target: p(GLOBAL),
                flags: MntFlags::UMOUNT_NOFOLLOW
            },
            SysCall::Rmdir { path: p(GLOBAL) },
        ]
    );
    sys.clear_calls();
    assert_eq!(
        plugin()
            .teardown(&Permit::JournalOff, &pod("podA"), &sys)
            .unwrap()
            .action,
        Action::AlreadyInPlace
    );
    assert_eq!(
        plugin()
            .unmount_device(&Permit::JournalOff, &device(), &sys)
            .unwrap()
            .action,
        Action::AlreadyInPlace
    );
    assert!(sys.mutations().is_empty());
}

#[test]
fn a_busy_unmount_is_final_and_names_the_path() {
    let sys = host(DiskFormat::Filesystem("ext4".into()));
    plugin()
        .mount_device(&Permit::JournalOff, &block_spec(), &device(), &sys)
        .unwrap();
    sys.fail_nth(Call::Umount, 1, Errno::EBUSY);
    let e = plugin()
        .unmount_device(&Permit::JournalOff, &device(), &sys)
        .unwrap_err();
    assert_eq!(e.certainty(), Certainty::Final);
    assert_eq!(
        e.to_string(),
        format!(
            "unmount_device kubernetes.io/local-volume/pv1: umount2 {GLOBAL}: EBUSY: Device or resource busy"
        )
    );
}

/// A target outside the root dir (a journal written under another root,
/// say) is refused before anything is unmounted: the mount found there is
/// left as it is, on every retry, and the error names the root.
#[test]
fn a_target_outside_the_root_is_refused_before_anything_is_unmounted() {
    let sys = host(DiskFormat::Unformatted);
    let outside = p("/elsewhere/pods/podA/volumes/kubernetes.io~local-volume/pv1");
    sys.add(&outside, FileKind::Dir);
    sys.preset_mount(None, &outside, Some("tmpfs"), MsFlags::empty(), None)
        .unwrap();
    let mut params = pod("podA");
    params.pod_mount_path = Some(outside.clone().into());
    for _ in 0..2 {
        let err = plugin()
            .teardown(&Permit::JournalOff, &params, &sys)
            .unwrap_err();
        assert!(matches!(err, PluginError::OutsideRoot { .. }), "{err}");
        assert!(err.to_string().contains("/k"), "{err}");
        assert_eq!(sys.mounts().len(), 1, "nothing unmounted");
        assert!(sys.mutations().is_empty(), "{:?}", sys.mutations());
    }
}

fn raw_spec() -> VolumeSpec {
    VolumeSpec::Local {
        path: p(DEV).into(),
        fs_type: None,
        access_modes: Vec::new(),
        mount_options: Default::default(),
        is_block: true,
        volume_mode: crate::model::VolumeMode::Block,
    }
}

/// The params of a raw block target of `pv1`, at the kubelet's paths.
fn raw(target: TargetRef) -> TargetParams {
    let l = Layout::new("/k");
    let link = target.pod().map(|pod| {
        l.pod_device_map_path(pod, PluginName::LocalVolume, "pv1")
            .into()
    });
    TargetParams::at(
        UniqueVolumeName::shared(PluginName::LocalVolume, "pv1"),
        PluginName::LocalVolume,
        "pv1".into(),
        target,
        TargetKind::Block,
        None,
    )
    .with_device_path(Some(p(DEV).into()))
    .with_device_mount_path(Some(l.local_block_map_dir("pv1").into()))
    .with_pod_mount_path(link)
}

/// A block PV is mapped as the kubelet's volume path handler maps it: the
/// global map dir, the device bound on the pod's file in it, the pod's
/// symlink to the device; never a format nor a filesystem mount. The
/// unmaps undo them in reverse, the symlink first.
#[test]
fn a_block_pv_is_mapped_and_unmapped_at_the_kubelet_s_paths() {
    let sys = host(DiskFormat::Unformatted);
    let uid = PodUid::new("podA").unwrap();
    let l = Layout::new("/k");
    let map_dir = l.local_block_map_dir("pv1");
    let file = l.local_block_pod_map("pv1", &uid);
    let link = l.pod_device_map_path(&uid, PluginName::LocalVolume, "pv1");
    let (dev, pod) = (raw(TargetRef::Device), raw(TargetRef::Pod(uid.clone())));
    let permit = Permit::JournalOff;

    let out = plugin()
        .map_device(&permit, &raw_spec(), &dev, &sys)
        .unwrap();
    assert_eq!(out.action, Action::Performed);
    assert!(
        sys.mutations()
            .iter()
            .any(|c| matches!(c, SysCall::Mkdir { path, .. } if *path == map_dir)),
        "{:?}",
        sys.mutations()
    );
    sys.clear_calls();

    plugin()
        .map_pod_device(&permit, &raw_spec(), &pod, &sys)
        .unwrap();
    let m = sys.mutations();
    let at = |want: &dyn Fn(&SysCall) -> bool| m.iter().position(want);
    let created = at(&|c| matches!(c, SysCall::CreateFile { path, .. } if *path == file));
    let bound = at(&|c| {
        matches!(c, SysCall::Mount { source: Some(s), target, flags, .. }
            if *s == p(DEV) && *target == file && *flags == MsFlags::MS_BIND)
    });
    let linked = at(
        &|c| matches!(c, SysCall::Symlink { path, target } if *path == link && *target == p(DEV)),
    );
    assert!(
        created.is_some() && created < bound && bound < linked,
        "file, bind, then link: {m:?}"
    );
    assert!(
        !m.iter().any(|c| matches!(c, SysCall::Mkfs { .. })),
        "never formatted: {m:?}"
    );
    // the hold last: a loop device backed by the pod's file
    let held = at(&|c| matches!(c, SysCall::LoopAttach { backing } if *backing == file));
    assert!(linked < held, "link, then hold: {m:?}");
    assert_eq!(sys.loops(), [(p("/dev/loop0"), file.clone())]);
    sys.clear_calls();

    plugin().unmap_pod_device(&permit, &pod, &sys).unwrap();
    let m = sys.mutations();
    let at = |want: &dyn Fn(&SysCall) -> bool| m.iter().position(want);
    let released = at(&|c| matches!(c, SysCall::LoopDetach { dev } if *dev == p("/dev/loop0")));
    assert!(
        released.is_some() && released < at(&|c| matches!(c, SysCall::RemoveBeneath { .. })),
        "the hold goes first: {m:?}"
    );
    assert!(sys.loops().is_empty(), "{:?}", sys.loops());
    let unlinked = at(
        &|c| matches!(c, SysCall::RemoveBeneath { base, rel, dir: false } if base.join(rel) == link),
    );
    let unbound = at(&|c| matches!(c, SysCall::Umount { target, .. } if *target == file));
    let removed = at(
        &|c| matches!(c, SysCall::RemoveBeneath { base, rel, dir: false } if base.join(rel) == file),
    );
    assert!(
        unlinked.is_some() && unlinked < unbound && unbound < removed,
        "link, bind, then file: {m:?}"
    );
    sys.clear_calls();

    plugin().unmap_device(&permit, &dev, &sys).unwrap();
    assert!(
        sys.mutations().iter().any(|c| matches!(c,
            SysCall::RemoveBeneath { base, rel, dir: true } if base.join(rel) == map_dir)),
        "{:?}",
        sys.mutations()
    );
}

/// A path that is not a block device is refused before anything is made;
/// anything but a symlink at the pod's path is refused, never removed.
#[test]
fn a_block_map_refuses_what_is_not_a_device_or_not_its_symlink() {
    let sys = RecordingSys::new();
    sys.add("/srv/dir", FileKind::Dir);
    let uid = PodUid::new("podA").unwrap();
    let mut spec = raw_spec();
    if let VolumeSpec::Local { path, .. } = &mut spec {
        *path = p("/srv/dir").into();
    }
    let dev = raw(TargetRef::Device).with_device_path(Some(p("/srv/dir").into()));
    let e = plugin()
        .map_device(&Permit::JournalOff, &spec, &dev, &sys)
        .unwrap_err();
    assert!(e.to_string().contains("block device"), "{e}");
    assert!(sys.mutations().is_empty());

    let sys = host(DiskFormat::Unformatted);
    let link = Layout::new("/k").pod_device_map_path(&uid, PluginName::LocalVolume, "pv1");
    sys.add(&link, FileKind::Dir);
    let pod = raw(TargetRef::Pod(uid));
    let e = plugin()
        .map_pod_device(&Permit::JournalOff, &raw_spec(), &pod, &sys)
        .unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
    let e = plugin()
        .unmap_pod_device(&Permit::JournalOff, &pod, &sys)
        .unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
    assert!(
        !sys.mutations().iter().any(
            |c| matches!(c, SysCall::RemoveBeneath { base, rel, .. } if base.join(rel) == link)
        ),
        "{:?}",
        sys.mutations()
    );
}

/// The hold is taken once per pod's file: a MapPodDevice run again (an
/// uncertain outcome, a restart) finds the loop device already backed by
/// the pod's file and attaches no second one; its undo detaches every one
/// backed by it and, with none left (a run cut after the detach), goes on
/// with the unmaps. A pod's bind held by a loop device cannot be
/// unmounted, so the hold is released before the unbind.
#[test]
fn a_block_map_holds_the_device_once_and_the_unmap_releases_it_first() {
    let sys = host(DiskFormat::Unformatted);
    let uid = PodUid::new("podA").unwrap();
    let file = Layout::new("/k").local_block_pod_map("pv1", &uid);
    let (dev, pod) = (raw(TargetRef::Device), raw(TargetRef::Pod(uid)));
    let permit = Permit::JournalOff;
    plugin()
        .map_device(&permit, &raw_spec(), &dev, &sys)
        .unwrap();
    plugin()
        .map_pod_device(&permit, &raw_spec(), &pod, &sys)
        .unwrap();
    sys.clear_calls();

    // run again: everything in place, the same single hold
    let out = plugin()
        .map_pod_device(&permit, &raw_spec(), &pod, &sys)
        .unwrap();
    assert!(sys.mutations().is_empty(), "{:?}", sys.mutations());
    assert_eq!(out.action, Action::AlreadyInPlace);
    assert_eq!(sys.loops(), [(p("/dev/loop0"), file.clone())]);

    // the kernel refuses to unmount a bind its loop device holds open
    let e = block_unbind_while_held(&sys, &file);
    assert_eq!(e, Some(Errno::EBUSY));

    // two holds on the same file (one left by an earlier run): both go
    sys.preset_loop(&file);
    plugin().unmap_pod_device(&permit, &pod, &sys).unwrap();
    assert!(sys.loops().is_empty(), "{:?}", sys.loops());
    assert!(!sys.exists(&file), "the pod's file is gone");

    // a run cut after the detach: no hold left is a warning, the unmaps go on
    plugin()
        .map_pod_device(&permit, &raw_spec(), &pod, &sys)
        .unwrap();
    sys.loop_detach(Path::new("/dev/loop0")).unwrap();
    sys.clear_calls();
    plugin().unmap_pod_device(&permit, &pod, &sys).unwrap();
    assert!(
        !sys.calls()
            .iter()
            .any(|c| matches!(c, SysCall::LoopDetach { .. })),
        "{:?}",
        sys.calls()
    );
    assert!(!sys.exists(&file), "the pod's file is gone");
}

/// What an unmount of the pod's bound file answers while it is held.
fn block_unbind_while_held(sys: &RecordingSys, file: &Path) -> Option<Errno> {
    let at = crate::host::sys::Beneath::split(Path::new("/k"), file)?;
    sys.umount2_beneath(at, MntFlags::empty()).err()?.errno()
}
