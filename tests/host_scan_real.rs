//! The host scan against a real kernel: a kubelet layout built from real
//! tmpfs, ext4-on-loop and bind mounts (including names with a space, a tab
//! and a non-UTF-8 byte) in a private mount namespace, scanned through
//! `/proc/self/mountinfo`; and our mountinfo parser checked line by line
//! against procfs's on the same live table.
//!
//! Needs root (mounts, loop devices); as another user each test prints what
//! it skipped and passes.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use support::{
    LoopDevice, Scratch, bind_mount, in_private_mount_ns, mkdirs, mkfs_ext4, mount_device,
    mount_tmpfs, require_root, umount,
};
use volumed::host::mountinfo::{MountTable, escape};
use volumed::host::scan::{DeviceName, Observed, ObservedMount, PodTarget, ScanProblem, scan_host};
use volumed::model::{Layout, PluginName, PodUid};

const POD_A: &str = "0b6c9a1e-3f2d-4e5a-8b7c-1d2e3f4a5b6c";
const POD_B: &str = "7e8f9a0b-1c2d-4e3f-9a8b-7c6d5e4f3a2b";
/// An emptyDir whose mount point holds a space and a tab (escaped by the kernel).
const SPACE_TAB: &str = "sp ace\ttab";
/// An emptyDir whose mount point is not UTF-8.
const NON_UTF8: &[u8] = b"bad\xffname";

fn mounted(t: &PodTarget) -> &ObservedMount {
    match &t.observed {
        Observed::Mounted(m) => m,
        Observed::DirPresent => panic!("{} is not mounted", t.path.display()),
    }
}

fn find<'a>(targets: &'a [PodTarget], path: &Path) -> &'a PodTarget {
    targets
        .iter()
        .find(|t| t.path == path)
        .unwrap_or_else(|| panic!("no target at {} in {targets:#?}", path.display()))
}

#[test]
fn scan_finds_every_real_target() {
    if !require_root("mounts tmpfs, ext4 on a loop device and binds") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-scan-");
        let root = scratch.path().join("kubelet");
        let layout = Layout::new(&root);
        let a = PodUid::new(POD_A).unwrap();
        let b = PodUid::new(POD_B).unwrap();
        let mut mounts: Vec<PathBuf> = Vec::new(); // in mount order

        // tmpfs emptyDir (medium: Memory)
        let cache = layout.pod_target_path(&a, PluginName::EmptyDir, "cache");
        mkdirs(&cache);
        mount_tmpfs(&cache, "size=1m");
        mounts.push(cache.clone());
        // disk emptyDir: a bare directory
        let disk = layout.pod_target_path(&a, PluginName::EmptyDir, "scratch");
        mkdirs(&disk);

        // local PV on a block device: ext4 on a loop device, bound into two pods
        let image = scratch.path().join("pv1.img");
        mkfs_ext4(&image, 16);
        let lo = LoopDevice::attach(&image);
        let dev_target = layout.local_device_path("pv1");
        mkdirs(&dev_target);
        mount_device(lo.path(), &dev_target, "ext4");
        mounts.push(dev_target.clone());
        let pv1_a = layout.pod_target_path(&a, PluginName::LocalVolume, "pv1");
        let pv1_b = layout.pod_target_path(&b, PluginName::LocalVolume, "pv1");
        for t in [&pv1_a, &pv1_b] {
            mkdirs(t);
            bind_mount(&dev_target, t);
            mounts.push(t.clone());
        }

        // local PV that is a directory: a sub-directory of a host filesystem
        let host = scratch.path().join("host-disk");
        mkdirs(&host);
        mount_tmpfs(&host, "size=1m");
        mounts.push(host.clone());
        let host_sub = host.join("vols/pv-dir");
        mkdirs(&host_sub);
        let pv_dir = layout.pod_target_path(&b, PluginName::LocalVolume, "pv-dir");
        mkdirs(&pv_dir);
        bind_mount(&host_sub, &pv_dir);
        mounts.push(pv_dir.clone());

        // names the kernel escapes, and one that is not UTF-8
        let odd = layout.pod_target_path(&b, PluginName::EmptyDir, SPACE_TAB);
        mkdirs(&odd);
        mount_tmpfs(&odd, "size=1m");
        mounts.push(odd.clone());
        let empty_dirs = layout.pod_volume_dir(&b, PluginName::EmptyDir, "x");
        let bad = empty_dirs.with_file_name(OsStr::from_bytes(NON_UTF8));
        mkdirs(&bad);
        mount_tmpfs(&bad, "size=1m");
        mounts.push(bad.clone());

        let view = scan_host(
            &volumed::host::sys::LinuxSys,
            &layout,
            Path::new("/proc/self/mountinfo"),
            None,
        )
        .unwrap();

        // the device target
        assert_eq!(view.device_targets.len(), 1, "{:#?}", view.device_targets);
        let dev = &view.device_targets[0];
        assert_eq!(dev.path, dev_target);
        assert_eq!(dev.plugin, PluginName::LocalVolume);
        assert_eq!(dev.name, DeviceName::Local { pv: "pv1".into() });
        assert_eq!(dev.mount.identity.fs_type, "ext4");
        assert_eq!(&*dev.mount.identity.root, Path::new("/"));
        assert_eq!(dev.mount.source, lo.path().as_os_str());
        assert_eq!(dev.mount.stacked, 1);

        // every pod target, with plugin, pod and spec name
        let got: BTreeSet<(String, PluginName, String)> = view
            .pod_targets
            .iter()
            .map(|t| (t.pod_uid.to_string(), t.plugin, t.spec_name.clone()))
            .collect();
        let want: BTreeSet<(String, PluginName, String)> = [
            (POD_A, PluginName::EmptyDir, "cache"),
            (POD_A, PluginName::LocalVolume, "pv1"),
            (POD_B, PluginName::LocalVolume, "pv1"),
            (POD_B, PluginName::LocalVolume, "pv-dir"),
            (POD_B, PluginName::EmptyDir, SPACE_TAB),
        ]
        .into_iter()
        .map(|(u, p, s)| (u.to_owned(), p, s.to_owned()))
        .collect();
        assert_eq!(got, want);
        assert_eq!(view.pod_targets.len(), want.len());

        assert_eq!(
            mounted(find(&view.pod_targets, &cache)).identity.fs_type,
            "tmpfs"
        );
        assert_eq!(
            mounted(find(&view.pod_targets, &odd)).identity.fs_type,
            "tmpfs"
        );
        // both pod binds are the device's filesystem, whole (root /)
        for t in [&pv1_a, &pv1_b] {
            let m = mounted(find(&view.pod_targets, t));
            assert_eq!(m.identity.dev, dev.mount.identity.dev, "{}", t.display());
            assert_eq!(m.identity.root, dev.mount.identity.root, "{}", t.display());
            assert_eq!(m.identity.fs_type, "ext4");
            assert_eq!(m.source, lo.path().as_os_str());
        }
        // the directory PV is a bind of a sub-directory: its root says which
        let m = mounted(find(&view.pod_targets, &pv_dir));
        assert_ne!(&*m.identity.root, Path::new("/"));
        assert_eq!(&*m.identity.root, Path::new("/vols/pv-dir"));
        assert_eq!(m.identity.fs_type, "tmpfs");

        // the disk emptyDir is a found dir
        let d = find(&view.found_dirs, &disk);
        assert_eq!(
            (d.plugin, d.spec_name.as_str(), &d.observed),
            (PluginName::EmptyDir, "scratch", &Observed::DirPresent)
        );
        assert!(
            view.found_dirs.iter().all(|t| t.path != bad),
            "the non-UTF-8 mount is not a found dir"
        );

        // the non-UTF-8 mount is reported, and did not blind the scan (all
        // of the above was found); no mountinfo line was dropped
        assert!(
            view.problems
                .iter()
                .any(|p| matches!(p, ScanProblem::NonUtf8Name { path } if *path == bad)),
            "{:#?}",
            view.problems
        );
        for p in &view.problems {
            assert!(
                matches!(p, ScanProblem::NonUtf8Name { path } if *path == bad),
                "unexpected problem {p}"
            );
        }
        let table = MountTable::read_self().unwrap();
        assert!(table.errors().is_empty(), "{:?}", table.errors());
        assert!(table.is_mount_point(&bad));
        assert!(table.is_mount_point(&odd));

        // tear down: unmount newest first, then the loop device goes by autoclear
        for m in mounts.iter().rev() {
            umount(m);
        }
        assert_eq!(scratch.mounts_below(), Vec::<PathBuf>::new());
        assert!(
            lo.close_and_wait_unbound(Duration::from_secs(5)),
            "loop device still bound after unmount and close"
        );
    });
}

#[test]
fn mount_table_agrees_with_procfs() {
    if !require_root("mounts tmpfs and binds") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-procfs-");
        let base = scratch.path();
        let plain = base.join("plain");
        let spaced = base.join("with space\tand tab");
        let sub = plain.join("a/b");
        let bound = base.join("bound");
        for d in [&plain, &spaced, &bound] {
            mkdirs(d);
        }
        mount_tmpfs(&plain, "size=1m,mode=0750");
        mkdirs(&sub);
        mount_tmpfs(&spaced, "");
        bind_mount(&sub, &bound);

        let ours = MountTable::read_self().unwrap();
        let theirs = procfs::process::Process::myself()
            .unwrap()
            .mountinfo()
            .unwrap();
        assert!(ours.errors().is_empty(), "{:?}", ours.errors());
        assert_eq!(ours.len(), theirs.0.len());

        let mut compared = 0;
        let mut escaped = 0;
        for t in &theirs {
            let o = u32::try_from(t.mnt_id)
                .ok()
                .and_then(|id| ours.by_id(id))
                .unwrap_or_else(|| panic!("mount id {} missing from our table", t.mnt_id));
            let raw_point = t.mount_point.as_os_str().as_bytes();
            let source = t.mount_source.as_deref().unwrap_or("none");
            let has_escape = [raw_point, t.root.as_bytes(), source.as_bytes()]
                .iter()
                .any(|f| f.contains(&b'\\'));
            if has_escape {
                // procfs leaves escapes in place; ours undoes them
                assert_eq!(escape(o.mount_point.as_os_str().as_bytes()), raw_point);
                escaped += 1;
                continue;
            }
            assert_eq!(i64::from(o.parent_id), i64::from(t.pid), "{t:?}");
            assert_eq!(o.dev.to_string(), t.majmin, "{t:?}");
            assert_eq!(o.root, Path::new(&t.root), "{t:?}");
            assert_eq!(o.mount_point, t.mount_point, "{t:?}");
            assert_eq!(o.fs_type, t.fs_type, "{t:?}");
            if t.mount_source.is_some() {
                assert_eq!(o.source, OsStr::new(source), "{t:?}");
            }
            let theirs_opts: BTreeSet<String> = t
                .mount_options
                .iter()
                .map(|(k, v)| v.as_ref().map_or_else(|| k.clone(), |v| format!("{k}={v}")))
                .collect();
            let ours_opts: BTreeSet<String> = o.mount_options.iter().cloned().collect();
            assert_eq!(ours_opts, theirs_opts, "{t:?}");
            compared += 1;
        }
        assert!(compared > 3, "compared only {compared} lines");
        assert!(escaped >= 1, "the escaped mount point was not seen");
        let m = ours.top_at(&bound).unwrap();
        assert_eq!(m.root, Path::new("/a/b"));

        for m in [&bound, &spaced, &plain] {
            umount(m);
        }
        assert_eq!(scratch.mounts_below(), Vec::<PathBuf>::new());
    });
}

/// The harness itself: the closure runs in another mount namespace than the
/// test process that spawned it, and a mount made there is invisible to it.
#[test]
fn harness_isolates_mounts() {
    if !require_root("enters a mount namespace") {
        return;
    }
    in_private_mount_ns(|| {
        let parent = nix::unistd::getppid();
        let parent_ns = fs::read_link(format!("/proc/{parent}/ns/mnt")).unwrap();
        assert_ne!(fs::read_link("/proc/self/ns/mnt").unwrap(), parent_ns);
        let scratch = Scratch::new("volumed-iso-");
        let target = scratch.path().join("t");
        mkdirs(&target);
        mount_tmpfs(&target, "size=1m");
        assert!(MountTable::read_self().unwrap().is_mount_point(&target));
        let theirs = MountTable::read(Path::new(&format!("/proc/{parent}/mountinfo"))).unwrap();
        assert!(
            !theirs.is_mount_point(&target),
            "a mount made in the namespace is visible to the parent test process"
        );
        // left mounted on purpose: Scratch's drop (or the namespace's end) takes it
    });
}

/// The health monitor's gate: the watch says a mount, an unmount and a
/// remount each changed the table (once), and says nothing when nothing
/// happened, directories made and renamed included.
#[test]
fn the_mount_table_watch_sees_each_change_once() {
    if !require_root("mounts tmpfs") {
        return;
    }
    in_private_mount_ns(|| {
        use volumed::host::sys::{LinuxSys, Sys};
        let scratch = Scratch::new("volumed-watch-");
        let dir = scratch.path().join("a");
        mkdirs(&dir);
        let mut w = LinuxSys.watch_mount_table().expect("a watch on Linux");
        assert!(!w.changed(), "nothing happened since it was made");
        mount_tmpfs(&dir, "size=1m");
        assert!(w.changed(), "a mount");
        assert!(!w.changed(), "told once");
        fs::create_dir(scratch.path().join("b")).unwrap();
        fs::rename(scratch.path().join("b"), scratch.path().join("c")).unwrap();
        assert!(!w.changed(), "directories are no change of the table");
        nix::mount::mount(
            None::<&str>,
            &dir,
            None::<&str>,
            nix::mount::MsFlags::MS_REMOUNT | nix::mount::MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .unwrap();
        assert!(w.changed(), "a remount read-only");
        umount(&dir);
        assert!(w.changed(), "an unmount");
        assert!(!w.changed());
    });
}

/// What an operation records after it mounted, asked of the one mount
/// (`statmount(2)` on this kernel), equals what the whole table says of
/// it: a tmpfs with options, a bind of a subdir (its own root), a
/// read-only bind, a mount stacked on another, ext4 on a loop device; a
/// plain directory is no mount. And whether a path beneath a base is a
/// mount root, asked without following a symlink.
#[test]
fn one_mounts_identity_is_the_tables() {
    if !require_root("mounts tmpfs, ext4 on a loop device") {
        return;
    }
    in_private_mount_ns(|| {
        use volumed::host::sys::{LinuxSys, Sys};
        let scratch = Scratch::new("volumed-identity-");
        let at = |name: &str| {
            let p = scratch.path().join(name);
            mkdirs(&p);
            p
        };
        let tmpfs = at("tmpfs");
        mount_tmpfs(&tmpfs, "size=2m,mode=0750");
        mkdirs(&tmpfs.join("sub"));
        let sub = at("sub");
        bind_mount(&tmpfs.join("sub"), &sub);
        let ro = at("ro");
        bind_mount(&tmpfs, &ro);
        nix::mount::mount(
            None::<&str>,
            &ro,
            None::<&str>,
            nix::mount::MsFlags::MS_REMOUNT
                | nix::mount::MsFlags::MS_BIND
                | nix::mount::MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .unwrap();
        let stacked = at("stacked");
        mount_tmpfs(&stacked, "size=1m");
        mount_tmpfs(&stacked, "size=3m");
        let image = scratch.path().join("disk.img");
        mkfs_ext4(&image, 16);
        let lo = LoopDevice::attach(&image);
        let ext4 = at("ext4");
        mount_device(lo.path(), &ext4, "ext4");
        let plain = at("plain");

        let table = MountTable::read_self().unwrap();
        for p in [&tmpfs, &sub, &ro, &stacked, &ext4] {
            let one = LinuxSys.mount_identity(p).unwrap();
            assert!(one.is_some(), "{} is a mount", p.display());
            assert_eq!(one, table.identity_at(p), "{}", p.display());
        }
        let sub_id = LinuxSys.mount_identity(&sub).unwrap().unwrap();
        assert_eq!(&*sub_id.root, Path::new("/sub"));
        assert!(LinuxSys.mount_identity(&ro).unwrap().unwrap().read_only);
        assert_eq!(LinuxSys.mount_identity(&plain).unwrap(), None);
        // the same question asked beneath a base, following no symlink
        use volumed::host::sys::Beneath;
        std::os::unix::fs::symlink(&tmpfs, scratch.path().join("link")).unwrap();
        let beneath = |rel: &'static str| {
            LinuxSys.mount_root_beneath(Beneath {
                base: scratch.path(),
                rel: Path::new(rel),
            })
        };
        assert!(beneath("tmpfs").unwrap());
        assert!(beneath("stacked").unwrap());
        assert!(!beneath("plain").unwrap());
        assert!(!beneath("link").unwrap(), "a symlink is no mount");
        let through = beneath("link/sub").unwrap_err();
        assert_eq!(through.errno(), Some(nix::errno::Errno::ELOOP));
        for p in [&ext4, &stacked, &stacked, &ro, &sub, &tmpfs] {
            umount(p);
        }
    });
}
