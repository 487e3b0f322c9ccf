//! The plugins and safe removal against a real kernel, each test in its own
//! private mount namespace (`support::in_private_mount_ns`): tmpfs emptyDir
//! setup / resize / teardown; a local PV on an ext4 loop device formatted by
//! the plugin and shared by two pods; removal that leaves a same-filesystem
//! bind mount (caught by `statx` alone, without the mount table) and a
//! symlink's target untouched; a disk emptyDir with a foreign tmpfs nested
//! in it left where it is, neither renamed nor emptied.
//!
//! Needs root (mounts, loop devices); as another user each test prints what
//! it skipped and passes. Loop devices are bound with autoclear and checked
//! unbound at the end.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use support::{
    LoopDevice, Scratch, bind_mount, in_private_mount_ns, mkdirs, mount_tmpfs, require_root,
};
use volumed::host::mountinfo::{MountInfo, MountTable};
use volumed::host::remove::remove_dir_one_fs;
use volumed::host::sys::{
    Beneath, Call, DirEntry, DirHandle, DiskFormat, FileKind, FileStat, LinuxSys, Listing,
    MntFlags, MsFlags, Sys, SysError,
};
use volumed::journal::Permit;
use volumed::model::{
    Layout, PluginName, PodUid, StorageMedium, TargetKind, TargetParams, TargetRef,
    UniqueVolumeName, VolumeSpec,
};
use volumed::plugins::{Action, EmptyDirPlugin, LocalPlugin, VolumePlugin};

const POD_A: &str = "5f1e2d3c-4b5a-4968-8776-655443322110";
const POD_B: &str = "0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d";

fn top(path: &Path) -> Option<MountInfo> {
    MountTable::read_self()
        .expect("read mountinfo")
        .top_at(path)
        .cloned()
}

fn size_option(m: &MountInfo) -> Option<String> {
    m.super_options
        .get("size")
        .flatten()
        .map(|v| v.to_string_lossy().into_owned())
}

fn empty_dir_params(layout: &Layout, pod: &str, kind: TargetKind) -> TargetParams {
    let pod = PodUid::new(pod).unwrap();
    let path = layout.pod_target_path(&pod, PluginName::EmptyDir, "cache");
    TargetParams::at(
        UniqueVolumeName::per_pod(PluginName::EmptyDir, &pod, "cache"),
        PluginName::EmptyDir,
        "cache".into(),
        TargetRef::Pod(pod),
        kind,
        Some(path.into()),
    )
}

fn memory(size: u64) -> VolumeSpec {
    VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: Some(size),
    }
}

const DISK: VolumeSpec = VolumeSpec::EmptyDir {
    medium: StorageMedium::Disk,
    size_limit: None,
};

#[test]
fn tmpfs_empty_dir_sets_up_resizes_in_place_and_tears_down() {
    if !require_root("mounts tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-plug-tmpfs-");
        let layout = Layout::new(scratch.path().join("kubelet"));
        mkdirs(layout.root()); // the daemon makes the root; targets are made beneath it
        let plugin = EmptyDirPlugin::new(layout.clone());
        let pa = empty_dir_params(&layout, POD_A, TargetKind::Mount);
        let target = pa.pod_mount_path.clone().unwrap();
        let marker = layout.empty_dir_ready_marker(&PodUid::new(POD_A).unwrap(), "cache");

        let out = plugin
            .setup(&Permit::JournalOff, &memory(1 << 20), &pa, &LinuxSys)
            .unwrap();
        assert_eq!(out.action, Action::Performed);
        let m = top(&target).expect("tmpfs mounted");
        assert_eq!(m.fs_type, "tmpfs");
        assert_eq!(size_option(&m).as_deref(), Some("1024k"));
        // known without reading the table, and exactly what the table shows:
        // the next restart's merge then finds the journal in agreement
        assert_eq!(out.seen, Some(m.identity()), "a fresh tmpfs's identity");
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o777);
        assert!(marker.exists());
        fs::write(target.join("data"), b"keep me").unwrap();

        let again = plugin
            .setup(&Permit::JournalOff, &memory(1 << 20), &pa, &LinuxSys)
            .unwrap();
        assert_eq!(again.action, Action::AlreadyInPlace);
        assert_eq!(again.seen, Some(m.identity()), "read from the table");

        let resized = plugin
            .setup(&Permit::JournalOff, &memory(2 << 20), &pa, &LinuxSys)
            .unwrap();
        assert_eq!(resized.action, Action::Remounted);
        let m2 = top(&target).expect("still mounted");
        assert_eq!(size_option(&m2).as_deref(), Some("2048k"));
        assert_eq!(m2.mount_id, m.mount_id, "remounted, not replaced");
        assert_eq!(fs::read(target.join("data")).unwrap(), b"keep me");

        let down = plugin
            .teardown(&Permit::JournalOff, &pa, &LinuxSys)
            .unwrap();
        assert_eq!(down.action, Action::Performed);
        assert!(down.left_behind.is_empty());
        assert!(top(&target).is_none());
        assert!(!target.exists());
        assert!(!marker.exists());
        assert_eq!(
            plugin
                .teardown(&Permit::JournalOff, &pa, &LinuxSys)
                .unwrap()
                .action,
            Action::AlreadyInPlace
        );
    });
}

/// A symlink planted where a memory emptyDir goes, pointing out of the pod
/// dir, is refused: nothing is mounted there or where it points.
#[test]
fn a_symlinked_tmpfs_target_is_refused_and_nothing_is_mounted_through_it() {
    if !require_root("mounts tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-plug-symlink-");
        let layout = Layout::new(scratch.path().join("kubelet"));
        mkdirs(layout.root()); // the daemon makes the root; targets are made beneath it
        let plugin = EmptyDirPlugin::new(layout.clone());
        let pa = empty_dir_params(&layout, POD_A, TargetKind::Mount);
        let target = pa.pod_mount_path.clone().unwrap();
        let outside = scratch.path().join("outside");
        mkdirs(&outside);
        mkdirs(target.parent().unwrap());
        symlink(&outside, &target).unwrap();

        let err = plugin
            .setup(&Permit::JournalOff, &memory(1 << 20), &pa, &LinuxSys)
            .unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        assert!(top(&outside).is_none(), "mounted through the symlink");
        assert!(top(&target).is_none());
        assert!(
            fs::symlink_metadata(&target)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    });
}

/// Every mount point below `dir`, in the live table.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let table = MountTable::read_self().expect("read mountinfo");
    table
        .entries()
        .iter()
        .map(|m| m.mount_point.clone())
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Every path below `dir` (sorted), symlinks not followed.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                todo.push(e.path());
            }
            out.push(e.path().strip_prefix(dir).unwrap().to_owned());
        }
    }
    out.sort();
    out
}

/// A symlink planted at any directory between the root dir and a target
/// (the pod dir, its `volumes`, the plugin's dir, or `plugins` where the
/// ready marker goes), pointing to a look-alike tree outside: SetUp of a
/// memory emptyDir, of a disk emptyDir and of a directory local PV,
/// TearDown of a disk emptyDir and of the local PV, and finishing pending
/// deletions all fail naming `ELOOP` where they pass the link, and the
/// outside tree is exactly as it was: nothing mounted, made, renamed or
/// deleted in it (an empty dir there would have been taken by a path-based
/// `rmdir`). Before targets were reached beneath the root, each of them
/// went through the link.
#[test]
fn a_symlinked_directory_on_the_way_to_a_target_is_never_followed() {
    if !require_root("mounts tmpfs and binds") {
        return;
    }
    in_private_mount_ns(|| {
        let pod = PodUid::new(POD_A).unwrap();
        // (what is replaced by a symlink, relative to the pod dir)
        let levels = [
            "",
            "volumes",
            "volumes/kubernetes.io~empty-dir",
            "volumes/kubernetes.io~local-volume",
            "plugins",
        ];
        for level in levels {
            let scratch = Scratch::new("volumed-plug-parent-link-");
            let layout = Layout::new(scratch.path().join("kubelet"));
            let pod_dir = layout.pod_dir(&pod);
            let outside = scratch.path().join("outside");
            // The look-alike: the whole pod tree, with data in the emptyDir.
            let look_alike = outside.join("pod");
            mkdirs(&look_alike.join("volumes/kubernetes.io~empty-dir/cache"));
            // an empty pv1 dir a teardown's rmdir would take, and a pending
            // deletion a sweep would finish, were they reached through the link
            mkdirs(&look_alike.join("volumes/kubernetes.io~local-volume/pv1"));
            mkdirs(&look_alike.join("volumes/kubernetes.io~empty-dir/old.deleting~5"));
            fs::write(
                look_alike.join("volumes/kubernetes.io~empty-dir/old.deleting~5/f"),
                b"",
            )
            .unwrap();
            mkdirs(&look_alike.join("plugins/kubernetes.io~empty-dir/cache"));
            fs::write(
                look_alike.join("plugins/kubernetes.io~empty-dir/cache/ready"),
                b"",
            )
            .unwrap();
            fs::write(
                look_alike.join("volumes/kubernetes.io~empty-dir/cache/data"),
                b"keep",
            )
            .unwrap();
            let pv_dir = scratch.path().join("pv");
            mkdirs(&pv_dir);
            mkdirs(&pod_dir);
            let link = pod_dir.join(level);
            let link = if level.is_empty() {
                pod_dir.clone()
            } else {
                link
            };
            if link.exists() {
                fs::remove_dir(&link).unwrap();
            }
            mkdirs(link.parent().unwrap());
            symlink(look_alike.join(level), &link).unwrap();
            let before = tree(&outside);

            let empty_dir = EmptyDirPlugin::new(layout.clone());
            let local = LocalPlugin::new(layout.clone());
            let mem = empty_dir_params(&layout, POD_A, TargetKind::Mount);
            let disk = empty_dir_params(&layout, POD_A, TargetKind::Dir);
            let mut pv = local_params(&layout, &pv_dir, TargetRef::Pod(pod.clone()));
            pv = pv.with_device_mount_path(None);
            let pv_spec = VolumeSpec::Local {
                path: pv_dir.clone().into(),
                fs_type: None,
                access_modes: Vec::new(),
                mount_options: Vec::new(),
                is_block: false,
                volume_mode: Default::default(),
            };
            // Which operations pass through the replaced level.
            let through = |what: &str| match level {
                "" | "volumes" => true,
                "volumes/kubernetes.io~local-volume" => what.starts_with("local"),
                "volumes/kubernetes.io~empty-dir" => !what.starts_with("local"),
                // the ready marker (written by SetUp, removed by TearDown)
                _ => what.starts_with("disk") || what == "memory setup",
            };
            let unmount_all_below = |dir: &Path| {
                for m in mounts_below(dir).into_iter().rev() {
                    nix::mount::umount2(&m, MntFlags::MNT_DETACH).unwrap();
                }
            };
            type Run<'a> = Box<dyn Fn() -> Result<(), String> + 'a>;
            let done = |r: volumed::plugins::PluginResult| r.map(drop).map_err(|e| e.to_string());
            let runs: [(&str, Run<'_>); 6] = [
                (
                    "memory setup",
                    Box::new(|| {
                        done(empty_dir.setup(
                            &Permit::JournalOff,
                            &memory(1 << 20),
                            &mem,
                            &LinuxSys,
                        ))
                    }),
                ),
                (
                    "disk setup",
                    Box::new(|| {
                        done(empty_dir.setup(&Permit::JournalOff, &DISK, &disk, &LinuxSys))
                    }),
                ),
                (
                    "disk teardown",
                    Box::new(|| done(empty_dir.teardown(&Permit::JournalOff, &disk, &LinuxSys))),
                ),
                (
                    "pending deletions",
                    Box::new(|| {
                        let r = empty_dir.finish_pending(&pod, &LinuxSys);
                        r.map(drop).map_err(|e| e.to_string())
                    }),
                ),
                (
                    "local setup",
                    Box::new(|| done(local.setup(&Permit::JournalOff, &pv_spec, &pv, &LinuxSys))),
                ),
                (
                    "local teardown",
                    Box::new(|| done(local.teardown(&Permit::JournalOff, &pv, &LinuxSys))),
                ),
            ];
            for (what, run) in runs {
                let r = run();
                if through(what) {
                    let e = r.expect_err(&format!("{what} through a symlink at {level:?}"));
                    // (a listing opens its last component O_NOFOLLOW |
                    // O_DIRECTORY: the kernel says ENOTDIR of a symlink there)
                    let listing = what == "pending deletions";
                    assert!(
                        e.contains("ELOOP") || (listing && e.contains("ENOTDIR")),
                        "{what} at {level:?}: {e}"
                    );
                }
                assert_eq!(
                    mounts_below(&outside),
                    Vec::<PathBuf>::new(),
                    "{what} mounted through the symlink at {level:?}"
                );
                // what a run did inside the pod dir is not the next one's business
                unmount_all_below(scratch.path());
            }
            assert_eq!(
                mounts_below(&outside),
                Vec::<PathBuf>::new(),
                "something was mounted through the symlink at {level:?}"
            );
            assert_eq!(
                tree(&outside),
                before,
                "the outside tree changed ({level:?})"
            );
            assert_eq!(
                fs::read(look_alike.join("volumes/kubernetes.io~empty-dir/cache/data")).unwrap(),
                b"keep"
            );
            assert!(
                fs::symlink_metadata(&link)
                    .unwrap()
                    .file_type()
                    .is_symlink(),
                "the link itself was replaced ({level:?})"
            );
        }
    });
}

fn local_params(layout: &Layout, device: &Path, target: TargetRef) -> TargetParams {
    let pod_mount_path = target.pod().map(|pod| {
        layout
            .pod_target_path(pod, PluginName::LocalVolume, "pv1")
            .into()
    });
    TargetParams::at(
        UniqueVolumeName::shared(PluginName::LocalVolume, "pv1"),
        PluginName::LocalVolume,
        "pv1".into(),
        target,
        TargetKind::Mount,
        None,
    )
    .with_device_path(Some(device.to_owned().into()))
    .with_device_mount_path(Some(layout.local_device_path("pv1").into()))
    .with_pod_mount_path(pod_mount_path)
    .with_fs_type(Some("ext4".into()))
}

#[test]
fn local_pv_on_a_loop_device_is_formatted_once_and_shared_by_two_pods() {
    if !require_root("loop devices, ext4 mounts") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-plug-local-");
        let image = scratch.path().join("disk.img");
        fs::File::create(&image)
            .and_then(|f| f.set_len(64 << 20))
            .unwrap();
        let lo = LoopDevice::attach(&image);
        let layout = Layout::new(scratch.path().join("kubelet"));
        mkdirs(layout.root()); // the daemon makes the root; targets are made beneath it
        let local = LocalPlugin::new(layout.clone());
        let spec = VolumeSpec::Local {
            path: lo.path().to_owned().into(),
            fs_type: Some("ext4".into()),
            access_modes: Vec::new(),
            mount_options: Vec::new(),
            is_block: true,
            volume_mode: Default::default(),
        };
        let dev = local_params(&layout, lo.path(), TargetRef::Device);
        let pod = |uid: &str| {
            local_params(
                &layout,
                lo.path(),
                TargetRef::Pod(PodUid::new(uid).unwrap()),
            )
        };
        let global = layout.local_device_path("pv1");

        assert_eq!(
            LinuxSys.probe_fs(lo.path()).unwrap(),
            DiskFormat::Unformatted
        );
        assert!(local.needs_format(&spec, &dev, &LinuxSys).unwrap());
        assert_eq!(
            local
                .format(&Permit::JournalOff, &spec, &dev, &LinuxSys)
                .unwrap()
                .action,
            Action::Performed
        );
        assert!(!local.needs_format(&spec, &dev, &LinuxSys).unwrap());
        assert_eq!(
            LinuxSys.probe_fs(lo.path()).unwrap(),
            DiskFormat::Filesystem("ext4".into())
        );

        assert_eq!(
            local
                .mount_device(&Permit::JournalOff, &spec, &dev, &LinuxSys)
                .unwrap()
                .action,
            Action::Performed
        );
        assert_eq!(
            local
                .mount_device(&Permit::JournalOff, &spec, &dev, &LinuxSys)
                .unwrap()
                .action,
            Action::AlreadyInPlace
        );
        let g = top(&global).expect("device mounted");
        assert_eq!(
            (g.fs_type.as_str(), g.dev.major, g.dev.minor),
            ("ext4", 7, lo.number())
        );

        for uid in [POD_A, POD_B] {
            let out = local
                .setup(&Permit::JournalOff, &spec, &pod(uid), &LinuxSys)
                .unwrap();
            assert_eq!(out.action, Action::Performed);
            let again = local
                .setup(&Permit::JournalOff, &spec, &pod(uid), &LinuxSys)
                .unwrap();
            assert_eq!(again.action, Action::AlreadyInPlace);
        }
        let a = pod(POD_A).pod_mount_path.unwrap();
        let b = pod(POD_B).pod_mount_path.unwrap();
        let (ma, mb) = (top(&a).unwrap(), top(&b).unwrap());
        assert_eq!(ma.dev, g.dev);
        assert_eq!(mb.dev, g.dev, "both pods share the device's major:minor");
        fs::write(a.join("hello"), b"from a").unwrap();
        assert_eq!(fs::read(b.join("hello")).unwrap(), b"from a");

        for uid in [POD_A, POD_B] {
            let out = local
                .teardown(&Permit::JournalOff, &pod(uid), &LinuxSys)
                .unwrap();
            assert_eq!(out.action, Action::Performed);
            assert!(out.left_behind.is_empty());
        }
        assert!(top(&a).is_none() && !a.exists());
        assert_eq!(
            local
                .unmount_device(&Permit::JournalOff, &dev, &LinuxSys)
                .unwrap()
                .action,
            Action::Performed
        );
        assert!(top(&global).is_none() && !global.exists());

        // Never reformatted: the data survives another format + mount.
        assert_eq!(
            local
                .format(&Permit::JournalOff, &spec, &dev, &LinuxSys)
                .unwrap()
                .action,
            Action::AlreadyInPlace
        );
        local
            .mount_device(&Permit::JournalOff, &spec, &dev, &LinuxSys)
            .unwrap();
        assert_eq!(fs::read(global.join("hello")).unwrap(), b"from a");
        local
            .unmount_device(&Permit::JournalOff, &dev, &LinuxSys)
            .unwrap();

        assert!(
            lo.close_and_wait_unbound(Duration::from_secs(10)),
            "loop device still bound"
        );
    });
}

/// `LinuxSys` seen through a test's wrapper: optionally with an empty
/// mount table (only `statx` can see mount points), and optionally with a
/// hook run once, right before the first call of one kind reaches the
/// kernel. The hook stands in for a concurrent writer under the root dir
/// (a directory swapped for a symlink between a check and the call): no
/// real race can be timed reliably, and this is the moment one would hit.
#[derive(Default)]
struct Wrapped {
    empty_table: bool,
    hook: Mutex<Option<(Call, Hook)>>,
}

/// What [`Wrapped`] runs before a call.
type Hook = Box<dyn FnOnce() + Send>;

impl Wrapped {
    fn statx_only() -> Self {
        Self {
            empty_table: true,
            ..Self::default()
        }
    }
    fn before(call: Call, hook: impl FnOnce() + Send + 'static) -> Self {
        Self {
            hook: Mutex::new(Some((call, Box::new(hook)))),
            ..Self::default()
        }
    }
    fn fire(&self, call: Call) {
        let mut hook = self.hook.lock().unwrap();
        if hook.as_ref().is_some_and(|(c, _)| *c == call) {
            let (_, f) = hook.take().unwrap();
            drop(hook);
            f();
        }
    }
}

impl Sys for Wrapped {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        self.fire(Call::Mount);
        LinuxSys.mount(source, target, fstype, flags, data)
    }
    fn mount_beneath(
        &self,
        source: Option<&Path>,
        at: Beneath<'_>,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        self.fire(Call::Mount);
        LinuxSys.mount_beneath(source, at, fstype, flags, data)
    }
    fn bind_beneath(&self, source: Beneath<'_>, at: Beneath<'_>) -> Result<(), SysError> {
        self.fire(Call::Mount);
        LinuxSys.bind_beneath(source, at)
    }
    fn stat_within(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        LinuxSys.stat_within(at)
    }
    fn bind_within(
        &self,
        source: Beneath<'_>,
        at: Beneath<'_>,
        kind: FileKind,
    ) -> Result<(), SysError> {
        self.fire(Call::Mount);
        LinuxSys.bind_within(source, at, kind)
    }
    fn umount2_beneath(&self, at: Beneath<'_>, flags: MntFlags) -> Result<(), SysError> {
        self.fire(Call::Umount);
        LinuxSys.umount2_beneath(at, flags)
    }
    fn mount_root(&self, path: &Path) -> Result<bool, SysError> {
        self.fire(Call::MountRoot);
        LinuxSys.mount_root(path)
    }
    fn mnt_id(&self, path: &Path) -> Result<u64, SysError> {
        LinuxSys.mnt_id(path)
    }
    fn stat(&self, path: &Path, follow: bool) -> Result<FileStat, SysError> {
        self.fire(Call::Stat);
        LinuxSys.stat(path, follow)
    }
    fn stat_beneath(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        self.fire(Call::Stat);
        LinuxSys.stat_beneath(at)
    }
    fn mkdir(&self, path: &Path, mode: u32) -> Result<(), SysError> {
        self.fire(Call::Mkdir);
        LinuxSys.mkdir(path, mode)
    }
    fn mkdir_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
        self.fire(Call::Mkdir);
        LinuxSys.mkdir_beneath(at, mode)
    }
    fn chmod_dir_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
        self.fire(Call::ChmodDir);
        LinuxSys.chmod_dir_beneath(at, mode)
    }
    fn create_file(&self, path: &Path, mode: u32) -> Result<(), SysError> {
        self.fire(Call::CreateFile);
        LinuxSys.create_file(path, mode)
    }
    fn create_file_beneath(
        &self,
        at: Beneath<'_>,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), SysError> {
        self.fire(Call::CreateFile);
        LinuxSys.create_file_beneath(at, bytes, mode)
    }
    fn write_file_beneath(&self, at: Beneath<'_>, bytes: &[u8], mode: u32) -> Result<(), SysError> {
        self.fire(Call::WriteFile);
        LinuxSys.write_file_beneath(at, bytes, mode)
    }
    fn rename_beneath(&self, from: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError> {
        self.fire(Call::Rename);
        LinuxSys.rename_beneath(from, to_name)
    }
    fn replace_beneath(&self, from: Beneath<'_>, to_name: &OsStr) -> Result<(), SysError> {
        self.fire(Call::Replace);
        LinuxSys.replace_beneath(from, to_name)
    }
    fn symlink_beneath(&self, at: Beneath<'_>, target: &Path) -> Result<(), SysError> {
        self.fire(Call::Symlink);
        LinuxSys.symlink_beneath(at, target)
    }
    fn read_link_beneath(&self, at: Beneath<'_>) -> Result<std::path::PathBuf, SysError> {
        self.fire(Call::ReadLink);
        LinuxSys.read_link_beneath(at)
    }
    fn chgrp_beneath(&self, at: Beneath<'_>, gid: u32) -> Result<(), SysError> {
        self.fire(Call::Chgrp);
        LinuxSys.chgrp_beneath(at, gid)
    }
    fn rmdir_beneath(&self, at: Beneath<'_>) -> Result<(), SysError> {
        self.fire(Call::Rmdir);
        LinuxSys.rmdir_beneath(at)
    }
    fn rmdir(&self, path: &Path) -> Result<(), SysError> {
        self.fire(Call::Rmdir);
        LinuxSys.rmdir(path)
    }
    fn unlink(&self, path: &Path) -> Result<(), SysError> {
        LinuxSys.unlink(path)
    }
    fn read_dir_beneath(&self, base: &Path, rel: &Path) -> Result<Vec<DirEntry>, SysError> {
        self.fire(Call::ReadDirBeneath);
        LinuxSys.read_dir_beneath(base, rel)
    }
    fn remove_beneath(&self, base: &Path, rel: &Path, dir: bool) -> Result<(), SysError> {
        LinuxSys.remove_beneath(base, rel, dir)
    }
    fn mkfs(&self, device: &Path, fstype: &str) -> Result<(), SysError> {
        LinuxSys.mkfs(device, fstype)
    }
    fn probe_fs(&self, device: &Path) -> Result<DiskFormat, SysError> {
        LinuxSys.probe_fs(device)
    }
    fn read_mountinfo(&self) -> Result<MountTable, SysError> {
        if self.empty_table {
            Ok(MountTable::parse(b""))
        } else {
            LinuxSys.read_mountinfo()
        }
    }
    fn read_mountinfo_pieces(
        &self,
        piece: &mut dyn FnMut(Vec<u8>) -> bool,
    ) -> Result<(), SysError> {
        if self.empty_table {
            Ok(())
        } else {
            LinuxSys.read_mountinfo_pieces(piece)
        }
    }
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, SysError> {
        LinuxSys.canonicalize(path)
    }
    fn read_dir(&self, path: &Path) -> Result<Listing, SysError> {
        LinuxSys.read_dir(path)
    }
    fn read_file(&self, path: &Path, limit: u64, follow: bool) -> Result<Vec<u8>, SysError> {
        LinuxSys.read_file(path, limit, follow)
    }
    fn read_file_beneath(&self, at: Beneath<'_>, limit: u64) -> Result<Vec<u8>, SysError> {
        LinuxSys.read_file_beneath(at, limit)
    }
    fn statfs(&self, path: &Path) -> Result<volumed::host::sys::FsUsage, SysError> {
        LinuxSys.statfs(path)
    }
    fn loop_find_backing(&self, backing: &Path) -> Result<Vec<PathBuf>, SysError> {
        LinuxSys.loop_find_backing(backing)
    }
    fn loop_attach_beneath(&self, at: Beneath<'_>) -> Result<PathBuf, SysError> {
        LinuxSys.loop_attach_beneath(at)
    }
    fn loop_detach(&self, dev: &Path) -> Result<(), SysError> {
        LinuxSys.loop_detach(dev)
    }
    fn mount_probe(&self, path: &Path) -> Result<volumed::host::sys::MountProbe, SysError> {
        LinuxSys.mount_probe(path)
    }
    // The real handles (a descriptor each), so a hook runs between a
    // handle's open and the calls made through it, as a race would.
    fn open_dir_beneath(&self, at: Beneath<'_>) -> Result<DirHandle, SysError> {
        self.fire(Call::OpenDir);
        LinuxSys.open_dir_beneath(at)
    }
    fn open_dirs_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<DirHandle, SysError> {
        self.fire(Call::OpenDir);
        LinuxSys.open_dirs_beneath(at, mode)
    }
    fn open_dirs_in(&self, dir: &DirHandle, rel: &Path, mode: u32) -> Result<DirHandle, SysError> {
        self.fire(Call::OpenDir);
        LinuxSys.open_dirs_in(dir, rel, mode)
    }
    fn open_dir_in(&self, dir: &DirHandle, rel: &Path) -> Result<DirHandle, SysError> {
        self.fire(Call::OpenDir);
        LinuxSys.open_dir_in(dir, rel)
    }
    fn chmod_dir(&self, dir: &DirHandle, mode: u32) -> Result<(), SysError> {
        self.fire(Call::ChmodDir);
        LinuxSys.chmod_dir(dir, mode)
    }
    fn stat_in(&self, dir: &DirHandle, rel: &Path) -> Result<FileStat, SysError> {
        self.fire(Call::Stat);
        LinuxSys.stat_in(dir, rel)
    }
    fn mkdir_in(&self, dir: &DirHandle, rel: &Path, mode: u32) -> Result<(), SysError> {
        self.fire(Call::Mkdir);
        LinuxSys.mkdir_in(dir, rel, mode)
    }
    fn chmod_dir_in(&self, dir: &DirHandle, rel: &Path, mode: u32) -> Result<(), SysError> {
        self.fire(Call::ChmodDir);
        LinuxSys.chmod_dir_in(dir, rel, mode)
    }
    fn mount_in(
        &self,
        source: Option<&Path>,
        dir: &DirHandle,
        rel: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        self.fire(Call::Mount);
        LinuxSys.mount_in(source, dir, rel, fstype, flags, data)
    }
    fn create_file_in(
        &self,
        dir: &DirHandle,
        rel: &Path,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), SysError> {
        self.fire(Call::CreateFile);
        LinuxSys.create_file_in(dir, rel, bytes, mode)
    }
}

/// Runs `body` in a private mount namespace, as root (skipped otherwise).
fn real(what: &str, body: impl FnOnce()) {
    if require_root(what) {
        in_private_mount_ns(body);
    }
}

/// The layout of a root dir in `scratch`, made (as the daemon makes it).
fn made_root(scratch: &Scratch) -> Layout {
    let layout = Layout::new(fs::canonicalize(scratch.path()).unwrap().join("kubelet"));
    mkdirs(layout.root());
    layout
}

/// Renames `dir` aside and puts a symlink to `to` in its place.
fn swap_for_symlink(dir: &Path, to: &Path) {
    fs::rename(dir, dir.with_extension("aside")).unwrap();
    symlink(to, dir).unwrap();
}

/// `LinuxSys` with `dir` swapped for a symlink to `to` right before the
/// first `call`.
fn swapped_before(call: Call, dir: PathBuf, to: PathBuf) -> Wrapped {
    Wrapped::before(call, move || swap_for_symlink(&dir, &to))
}

/// The plugin dir a pod target sits in (`…/volumes/<plugin>`).
fn plugin_dir_of(params: &TargetParams) -> PathBuf {
    let target = params.pod_mount_path.as_deref().unwrap();
    target.parent().unwrap().to_owned()
}

/// Writes `x` to `dir/rel`, making the directories on the way.
fn plant(dir: &Path, rel: &str) {
    let file = dir.join(rel);
    mkdirs(file.parent().unwrap());
    fs::write(file, b"x").unwrap();
}

/// A directory outside the root, next to it in the scratch dir.
fn outside(scratch: &Scratch, name: &str) -> PathBuf {
    let o = fs::canonicalize(scratch.path())
        .unwrap()
        .join("outside")
        .join(name);
    mkdirs(&o);
    o
}

/// Pod A's teardown unmounts by a handle on its target's parent: a plugin
/// dir swapped for a symlink to pod B's right before the unmount fails it
/// (`ELOOP`) instead of unmounting pod B's tmpfs, which a running pod uses.
#[test]
fn an_unmount_never_follows_a_directory_swapped_for_a_symlink_to_another_pods() {
    real("race: unmount", || {
        let scratch = Scratch::new("volumed-race-umount-");
        let layout = made_root(&scratch);
        let plugin = EmptyDirPlugin::new(layout.clone());
        let a = empty_dir_params(&layout, POD_A, TargetKind::Mount);
        let b = empty_dir_params(&layout, POD_B, TargetKind::Mount);
        plugin
            .setup(&Permit::JournalOff, &memory(0), &a, &LinuxSys)
            .unwrap();
        plugin
            .setup(&Permit::JournalOff, &memory(0), &b, &LinuxSys)
            .unwrap();
        let target_b = b.pod_mount_path.clone().unwrap();
        fs::write(target_b.join("data"), b"pod B").unwrap();
        let sys = swapped_before(Call::Umount, plugin_dir_of(&a), plugin_dir_of(&b));
        let err = plugin
            .teardown(&Permit::JournalOff, &a, &sys)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ELOOP"), "{err}");
        assert!(top(&target_b).is_some(), "pod B's tmpfs is still mounted");
        assert_eq!(fs::read(target_b.join("data")).unwrap(), b"pod B");
    });
}

/// The emptyDir's `chmod 0777` and its ready marker are made through
/// handles on their dirs, opened beneath the root without following any
/// symlink (a symlink there before the open fails it, `ELOOP`: see
/// `a_symlinked_directory_on_the_way_to_a_target_is_never_followed`). A
/// directory swapped for a symlink out of the root right before either
/// call redirects nothing: the call acts in the directory the handle
/// holds (moved aside), and nothing outside changes.
#[test]
fn chmod_and_the_ready_marker_never_follow_a_directory_swapped_for_a_symlink() {
    real("race: chmod and marker", || {
        use std::os::unix::fs::PermissionsExt;
        let scratch = Scratch::new("volumed-race-chmod-");
        let layout = made_root(&scratch);
        let plugin = EmptyDirPlugin::new(layout.clone());

        let out = outside(&scratch, "volumes");
        mkdirs(&out.join("cache"));
        fs::set_permissions(out.join("cache"), fs::Permissions::from_mode(0o700)).unwrap();
        let a = empty_dir_params(&layout, POD_A, TargetKind::Dir);
        let swapped = plugin_dir_of(&a);
        let sys = swapped_before(Call::ChmodDir, swapped.clone(), out.clone());
        plugin.setup(&Permit::JournalOff, &DISK, &a, &sys).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(
            mode(&out.join("cache")),
            0o700,
            "the dir outside the root keeps its mode"
        );
        assert_eq!(mode(&swapped.with_extension("aside").join("cache")), 0o777);

        let out = outside(&scratch, "plugins");
        mkdirs(&out.join("cache"));
        let b = empty_dir_params(&layout, POD_B, TargetKind::Dir);
        let marker = layout.empty_dir_ready_marker(&PodUid::new(POD_B).unwrap(), "cache");
        let dir = marker.parent().unwrap().parent().unwrap().to_owned();
        let sys = swapped_before(Call::CreateFile, dir.clone(), out.clone());
        plugin.setup(&Permit::JournalOff, &DISK, &b, &sys).unwrap();
        assert!(
            !out.join("cache/ready").exists(),
            "no marker outside the root"
        );
        assert!(dir.with_extension("aside").join("cache/ready").exists());
    });
}

/// A pending emptyDir deletion (`cache.deleting~7`) is finished by a walk
/// that reaches every directory without following a symlink anywhere in its
/// path: the plugin dir swapped for a symlink out of the root after the
/// listing fails the walk, and the tree of the same name outside is kept.
/// Then the same deletion, undisturbed, removes the whole tree.
#[test]
fn a_deletion_walk_never_follows_a_directory_swapped_for_a_symlink() {
    real("race: deletion walk", || {
        let scratch = Scratch::new("volumed-race-delete-");
        let layout = made_root(&scratch);
        let out = outside(&scratch, "empty-dir");
        plant(&out, "cache.deleting~7/deep/precious");
        let pod = PodUid::new(POD_A).unwrap();
        let plugin_dir = layout
            .pod_dir(&pod)
            .join("volumes")
            .join(PluginName::EmptyDir.escaped());
        plant(&plugin_dir, "cache.deleting~7/deep/f");
        let plugin = EmptyDirPlugin::new(layout.clone());

        let sys = swapped_before(Call::Stat, plugin_dir.clone(), out.clone());
        let err = plugin.finish_pending(&pod, &sys).unwrap_err().to_string();
        assert!(err.contains("ELOOP"), "{err}");
        assert!(out.join("cache.deleting~7/deep/precious").exists());

        fs::remove_file(&plugin_dir).unwrap();
        fs::rename(plugin_dir.with_extension("aside"), &plugin_dir).unwrap();
        let done = plugin.finish_pending(&pod, &LinuxSys).unwrap();
        assert_eq!(done.len(), 1);
        assert!(done[0].1.complete(), "{done:?}");
        assert!(!plugin_dir.join("cache.deleting~7").exists());
        assert!(out.join("cache.deleting~7/deep/precious").exists());
    });
}

/// A disk emptyDir's TearDown deletes on one filesystem: a tmpfs mounted
/// on the renamed dir itself after the mount checks, right before the walk
/// lists it, is refused by the kernel (`EXDEV`), kept and reported, and the
/// file on it survives.
#[test]
fn a_mount_that_lands_on_the_dir_being_deleted_after_the_check_is_not_entered() {
    real("race: mount on the deleted dir", || {
        let scratch = Scratch::new("volumed-race-xdev-");
        let layout = made_root(&scratch);
        let plugin = EmptyDirPlugin::new(layout.clone());
        let a = empty_dir_params(&layout, POD_A, TargetKind::Dir);
        plugin
            .setup(&Permit::JournalOff, &DISK, &a, &LinuxSys)
            .unwrap();
        let target = a.pod_mount_path.clone().unwrap();
        fs::write(target.join("data"), b"pod A").unwrap();
        let plugin_dir = target.parent().unwrap().to_owned();
        let sys = Wrapped::before(Call::ReadDirBeneath, move || {
            let renamed = fs::read_dir(&plugin_dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.to_string_lossy().contains(".deleting~"))
                .expect("the renamed dir");
            mount_tmpfs(&renamed, "");
            fs::write(renamed.join("precious"), b"x").unwrap();
        });
        let out = plugin.teardown(&Permit::JournalOff, &a, &sys).unwrap();
        let kept = &out.left_behind;
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(kept[0].to_string_lossy().contains(".deleting~"), "{kept:?}");
        assert_eq!(fs::read(kept[0].join("precious")).unwrap(), b"x");
        assert!(top(&kept[0]).is_some(), "the tmpfs is left mounted");
    });
}

/// A block local PV's SetUp binds the device mount from beneath the root:
/// its `mounts` dir swapped for a symlink out of the root right before the
/// bind fails it, and the pod never sees the directory outside.
#[test]
fn a_bind_from_the_device_mount_never_follows_a_directory_swapped_for_a_symlink() {
    real("race: bind source", || {
        let scratch = Scratch::new("volumed-race-bind-");
        let layout = made_root(&scratch);
        let out = outside(&scratch, "mounts");
        plant(&out, "pv1/host-secret");
        let global = layout.local_device_path("pv1");
        mkdirs(&global);
        mount_tmpfs(&global, ""); // stands in for the device's mount
        let pod = PodUid::new(POD_A).unwrap();
        let path = layout.pod_target_path(&pod, PluginName::LocalVolume, "pv1");
        let params = TargetParams::at(
            UniqueVolumeName::shared(PluginName::LocalVolume, "pv1"),
            PluginName::LocalVolume,
            "pv1".into(),
            TargetRef::Pod(pod),
            TargetKind::Mount,
            Some(path.into()),
        )
        .with_device_path(Some(PathBuf::from("/dev/null").into()))
        .with_device_mount_path(Some(global.clone().into()))
        .with_fs_type(Some("ext4".into()));
        let spec = VolumeSpec::Local {
            path: PathBuf::from("/dev/null").into(),
            fs_type: Some("ext4".into()),
            access_modes: Vec::new(),
            mount_options: Vec::new(),
            is_block: true,
            volume_mode: Default::default(),
        };
        let mounts = global.parent().unwrap().to_owned();
        let sys = swapped_before(Call::Mount, mounts, out.clone());
        let plugin = LocalPlugin::new(layout.clone());
        let err = plugin
            .setup(&Permit::JournalOff, &spec, &params, &sys)
            .unwrap_err()
            .to_string();
        assert!(err.contains("ELOOP"), "{err}");
        let target = params.pod_mount_path.as_deref().unwrap();
        assert!(top(target).is_none(), "nothing mounted at the pod target");
        assert!(!target.join("host-secret").exists());
    });
}

#[test]
fn removal_leaves_a_same_filesystem_bind_and_everything_under_it() {
    if !require_root("bind mounts") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-plug-bind-");
        let src = scratch.path().join("src");
        mkdirs(&src.join("deep"));
        fs::write(src.join("deep/precious"), b"x").unwrap();
        for (sys, name) in [
            (&LinuxSys as &dyn Sys, "with-table"),
            (&Wrapped::statx_only(), "statx-only"),
        ] {
            let d = scratch.path().join(name);
            let m = d.join("keep/m");
            mkdirs(&m);
            mkdirs(&d.join("a/b"));
            fs::write(d.join("a/b/file"), b"y").unwrap();
            bind_mount(&src, &m);
            assert_eq!(
                fs::metadata(&m).unwrap().dev(),
                fs::metadata(d.join("keep")).unwrap().dev(),
                "the bind is on the same filesystem: st_dev cannot see it"
            );
            assert!(LinuxSys.mount_root(&m).unwrap());

            let r = remove_dir_one_fs(&d, sys).unwrap();
            assert_eq!(r.kept_mounts, vec![m.clone()], "{name}");
            assert!(!d.join("a").exists(), "{name}");
            assert!(m.join("deep/precious").exists(), "{name}");
            assert!(src.join("deep/precious").exists(), "{name}");
            assert!(top(&m).is_some(), "{name}: the bind is still mounted");
        }
    });
}

/// A foreign tmpfs mounted inside a disk emptyDir: the TearDown neither
/// renames the dir (the rename would carry the mount to `.deleting~`) nor
/// empties it; it fails naming the mount, which stays at its path. Once the
/// mount is gone, the retry deletes the dir.
#[test]
fn disk_empty_dir_teardown_leaves_a_dir_with_a_nested_foreign_tmpfs_in_place() {
    if !require_root("mounts tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-plug-nested-");
        let layout = Layout::new(scratch.path().join("kubelet"));
        mkdirs(layout.root()); // the daemon makes the root; targets are made beneath it
        let plugin = EmptyDirPlugin::with_seq_start(layout.clone(), 41);
        let pa = empty_dir_params(&layout, POD_A, TargetKind::Dir);
        let target = pa.pod_mount_path.clone().unwrap();
        assert_eq!(
            plugin
                .setup(&Permit::JournalOff, &DISK, &pa, &LinuxSys)
                .unwrap()
                .action,
            Action::Performed
        );
        assert_eq!(fs::metadata(&target).unwrap().mode() & 0o7777, 0o777);
        mkdirs(&target.join("x/y"));
        fs::write(target.join("x/y/f"), b"z").unwrap();
        let nested = target.join("x/foreign");
        mkdirs(&nested);
        mount_tmpfs(&nested, "size=1m");
        fs::write(nested.join("data"), b"not ours").unwrap();
        let marker = layout.empty_dir_ready_marker(&PodUid::new(POD_A).unwrap(), "cache");

        let err = plugin
            .teardown(&Permit::JournalOff, &pa, &LinuxSys)
            .unwrap_err();
        assert!(!err.is_uncertain(), "nothing changed: {err}");
        let msg = err.to_string();
        assert!(msg.contains(&nested.display().to_string()), "{msg}");
        let renamed = PathBuf::from(format!("{}.deleting~41", target.display()));
        assert!(!renamed.exists(), "not renamed");
        let foreign = top(&nested).expect("the tmpfs is still mounted at its path");
        assert_eq!(foreign.fs_type, "tmpfs");
        assert_eq!(fs::read(nested.join("data")).unwrap(), b"not ours");
        assert_eq!(fs::read(target.join("x/y/f")).unwrap(), b"z", "not emptied");
        assert!(marker.exists(), "the volume is not torn down");
        let below = mounts_below(layout.root());
        assert_eq!(below, vec![nested.clone()], "nothing else mounted or moved");

        support::umount(&nested);
        plugin
            .teardown(&Permit::JournalOff, &pa, &LinuxSys)
            .unwrap();
        assert!(!target.exists());
        assert!(!renamed.exists());
        assert!(!marker.exists());
    });
}

#[test]
fn a_symlink_out_of_the_pod_dir_is_removed_as_a_link_and_its_target_kept() {
    if !require_root("same namespace as the other real tests") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-plug-link-");
        let outside = scratch.path().join("outside");
        mkdirs(&outside.join("dir"));
        fs::write(outside.join("precious"), b"p").unwrap();
        fs::write(outside.join("dir/also"), b"a").unwrap();
        let layout = Layout::new(scratch.path().join("kubelet"));
        mkdirs(layout.root()); // the daemon makes the root; targets are made beneath it
        let plugin = EmptyDirPlugin::new(layout.clone());
        let pa = empty_dir_params(&layout, POD_A, TargetKind::Dir);
        let target = pa.pod_mount_path.clone().unwrap();
        plugin
            .setup(&Permit::JournalOff, &DISK, &pa, &LinuxSys)
            .unwrap();
        symlink(outside.join("dir"), target.join("to-dir")).unwrap();
        symlink(outside.join("precious"), target.join("to-file")).unwrap();
        symlink("/", target.join("to-root")).unwrap();

        let out = plugin
            .teardown(&Permit::JournalOff, &pa, &LinuxSys)
            .unwrap();
        assert!(out.left_behind.is_empty());
        assert!(!target.exists());
        assert_eq!(fs::read(outside.join("precious")).unwrap(), b"p");
        assert_eq!(fs::read(outside.join("dir/also")).unwrap(), b"a");

        // A symlink given as the path to remove is unlinked, never followed.
        let link = scratch.path().join("link");
        symlink(&outside, &link).unwrap();
        let r = remove_dir_one_fs(&link, &LinuxSys).unwrap();
        assert_eq!(r.removed, 1);
        assert!(fs::symlink_metadata(&link).is_err());
        assert!(outside.join("precious").exists());
    });
}

/// Detaches the loop devices a test attached, whatever it asserted.
struct Detach(Vec<PathBuf>);

impl Drop for Detach {
    fn drop(&mut self) {
        for dev in &self.0 {
            // already detached is fine: the test detaches them itself
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(dev)
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The hold's lookup (`loop_find_backing`): it finds the loop device
/// `LinuxSys` bound to a file and no other file's, and none once the
/// device is detached, by `LinuxSys` or by another process behind its
/// back (the lookup's index is checked against sysfs at each answer).
#[test]
fn a_loop_hold_is_found_while_bound_and_never_after_a_detach() {
    if !require_root("loop devices") {
        return;
    }
    let scratch = Scratch::new("volumed-plug-loophold-");
    let base = fs::canonicalize(scratch.path()).unwrap();
    for name in ["a.img", "b.img"] {
        fs::File::create(base.join(name))
            .and_then(|f| f.set_len(1 << 20))
            .unwrap();
    }
    let at = |name: &'static str| Beneath {
        base: &base,
        rel: Path::new(name),
    };
    let (a, b) = (base.join("a.img"), base.join("b.img"));
    let sys = LinuxSys;
    let mut cleanup = Detach(Vec::new());

    let first = sys.loop_attach_beneath(at("a.img")).unwrap();
    cleanup.0.push(first.clone());
    assert_eq!(
        sys.loop_find_backing(&a).unwrap(),
        std::slice::from_ref(&first)
    );
    assert_eq!(sys.loop_find_backing(&b).unwrap(), Vec::<PathBuf>::new());

    // another process detaches it: no longer found
    let out = std::process::Command::new("losetup")
        .arg("-d")
        .arg(&first)
        .output()
        .unwrap();
    assert!(out.status.success(), "losetup -d: {out:?}");
    assert_eq!(sys.loop_find_backing(&a).unwrap(), Vec::<PathBuf>::new());

    // bound again, then detached by LinuxSys itself: not found either
    let second = sys.loop_attach_beneath(at("a.img")).unwrap();
    cleanup.0.push(second.clone());
    assert_eq!(
        sys.loop_find_backing(&a).unwrap(),
        std::slice::from_ref(&second)
    );
    sys.loop_detach(&second).unwrap();
    assert_eq!(sys.loop_find_backing(&a).unwrap(), Vec::<PathBuf>::new());
}
