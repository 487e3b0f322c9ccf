//! The fsGroup ownership walk (`plugins/ownership.rs`) on real files, each
//! test in its own private mount namespace: the kubelet's bits on files,
//! directories and symlinks; a symlink's target outside the volume left
//! untouched; a tmpfs and a same-filesystem bind below the volume left
//! alone; `OnRootMismatch` skipping a matching root and walking a
//! mismatching one; read-only bits; the progress reports.
//!
//! Needs root (chgrp to any group, mounts); as another user each test
//! prints what it skipped and passes.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use support::{Scratch, bind_mount, in_private_mount_ns, mount_tmpfs, require_root};
use volumed::host::sys::{Beneath, LinuxSys, Sys};
use volumed::journal::Permit;
use volumed::model::{FsGroup, FsGroupChangePolicy};
use volumed::plugins::ownership::{Progress, ProgressEvery, Walked, set_ownership};

const GID: u32 = 4242;

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn mode_gid(p: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.mode() & 0o7777, m.gid())
}

fn walk(root: &Path, vol: &str, policy: FsGroupChangePolicy, ro: bool) -> Walked {
    let dir = LinuxSys
        .open_dir_beneath(Beneath {
            base: root,
            rel: Path::new(vol),
        })
        .unwrap();
    let group = FsGroup { gid: GID, policy };
    set_ownership(
        &Permit::JournalOff,
        &LinuxSys,
        &dir,
        group,
        ro,
        ProgressEvery::KUBELET,
        &mut |_| {},
    )
    .unwrap()
}

/// Files get group rw (set-user-ID kept), directories setgid and search,
/// a symlink its own group and no mode change, its target (outside the
/// volume) nothing; the root is done too.
#[test]
fn the_walk_gives_the_kubelets_bits_and_never_follows_a_symlink() {
    if !require_root("chgrp to any group") {
        return;
    }
    in_private_mount_ns(|| {
        let s = Scratch::new("volumed-own-bits-");
        let root = s.path();
        let v = root.join("vol");
        fs::create_dir_all(v.join("a/b")).unwrap();
        fs::write(v.join("f"), b"x").unwrap();
        fs::write(v.join("a/b/g"), b"y").unwrap();
        fs::write(v.join("suid"), b"z").unwrap();
        fs::write(root.join("outside"), b"secret").unwrap();
        chmod(&root.join("outside"), 0o600);
        symlink(root.join("outside"), v.join("a/link")).unwrap();
        chmod(&v, 0o700);
        chmod(&v.join("a"), 0o755);
        chmod(&v.join("a/b"), 0o700);
        chmod(&v.join("f"), 0o600);
        chmod(&v.join("a/b/g"), 0o644);
        chmod(&v.join("suid"), 0o4755);
        let before_outside = mode_gid(&root.join("outside"));

        let w = walk(root, "vol", FsGroupChangePolicy::Always, false);
        assert!(!w.skipped);
        assert_eq!(w.entries, 7, "{w:?}");
        assert_eq!(w.failed, 0, "{w:?}");
        assert_eq!(w.changed, 7, "{w:?}");
        let table = [
            ("", 0o2770),
            ("a", 0o2775),
            ("a/b", 0o2770),
            ("f", 0o660),
            ("a/b/g", 0o664),
            ("suid", 0o4775),
        ];
        for (rel, want) in table {
            let p = if rel.is_empty() {
                v.clone()
            } else {
                v.join(rel)
            };
            assert_eq!(mode_gid(&p), (want, GID), "{rel}");
        }
        let link = fs::symlink_metadata(v.join("a/link")).unwrap();
        assert_eq!(link.gid(), GID, "the symlink itself gets the group");
        assert_eq!(
            mode_gid(&root.join("outside")),
            before_outside,
            "the symlink's target is never touched"
        );

        // a second walk changes nothing
        let again = walk(root, "vol", FsGroupChangePolicy::Always, false);
        assert_eq!((again.entries, again.changed), (7, 0), "{again:?}");
    });
}

/// A tmpfs and a same-filesystem bind below the volume are left alone,
/// with everything in them; the rest is walked.
#[test]
fn the_walk_never_enters_another_mount_below_the_volume() {
    if !require_root("mounts") {
        return;
    }
    in_private_mount_ns(|| {
        let s = Scratch::new("volumed-own-mounts-");
        let root = s.path();
        let v = root.join("vol");
        fs::create_dir_all(v.join("tmp")).unwrap();
        fs::create_dir_all(v.join("bound")).unwrap();
        fs::create_dir_all(root.join("elsewhere")).unwrap();
        fs::write(root.join("elsewhere/e"), b"e").unwrap();
        chmod(&root.join("elsewhere/e"), 0o600);
        fs::write(v.join("mine"), b"m").unwrap();
        mount_tmpfs(&v.join("tmp"), "size=1m,mode=0700");
        fs::write(v.join("tmp/t"), b"t").unwrap();
        chmod(&v.join("tmp/t"), 0o600);
        bind_mount(&root.join("elsewhere"), &v.join("bound"));
        let tmp_before = (mode_gid(&v.join("tmp")), mode_gid(&v.join("tmp/t")));
        let bound_before = (mode_gid(&v.join("bound")), mode_gid(&v.join("bound/e")));

        let w = walk(root, "vol", FsGroupChangePolicy::Always, false);
        let mut mounts = w.mounts.clone();
        mounts.sort();
        assert_eq!(mounts, vec![v.join("bound"), v.join("tmp")], "{w:?}");
        assert_eq!(mode_gid(&v.join("mine")).1, GID);
        assert_eq!(
            (mode_gid(&v.join("tmp")), mode_gid(&v.join("tmp/t"))),
            tmp_before,
            "the tmpfs below is not touched"
        );
        assert_eq!(
            (mode_gid(&v.join("bound")), mode_gid(&v.join("bound/e"))),
            bound_before,
            "the bind below is not touched"
        );
    });
}

/// `OnRootMismatch`: a root with the group, the bits and setgid skips the
/// walk (a file below keeps its group); one without them is walked. A
/// read-only volume gets read bits only.
#[test]
fn on_root_mismatch_skips_a_matching_root_and_read_only_gets_read_bits() {
    if !require_root("chgrp to any group") {
        return;
    }
    in_private_mount_ns(|| {
        let s = Scratch::new("volumed-own-policy-");
        let root = s.path();
        let v = root.join("vol");
        fs::create_dir_all(&v).unwrap();
        fs::write(v.join("f"), b"x").unwrap();
        chmod(&v.join("f"), 0o600);
        std::os::unix::fs::chown(&v, None, Some(GID)).unwrap();
        chmod(&v, 0o2770);
        let w = walk(root, "vol", FsGroupChangePolicy::OnRootMismatch, false);
        assert!(w.skipped, "{w:?}");
        assert_eq!(mode_gid(&v.join("f")), (0o600, 0), "not walked");

        chmod(&v, 0o770); // setgid gone: a mismatch
        let w = walk(root, "vol", FsGroupChangePolicy::OnRootMismatch, false);
        assert!(!w.skipped, "{w:?}");
        assert_eq!(mode_gid(&v.join("f")), (0o660, GID));
        assert_eq!(mode_gid(&v), (0o2770, GID));

        let r = root.join("ro");
        fs::create_dir_all(&r).unwrap();
        fs::write(r.join("f"), b"x").unwrap();
        chmod(&r.join("f"), 0o600);
        chmod(&r, 0o700);
        walk(root, "ro", FsGroupChangePolicy::Always, true);
        assert_eq!(mode_gid(&r.join("f")), (0o640, GID));
        assert_eq!(mode_gid(&r), (0o2750, GID));
    });
}

/// A walk past the first period reports it is slow, then how many
/// entries it saw, once per period (periods of zero here: every look at
/// the clock, each 256 entries).
#[test]
fn a_long_walk_reports_its_progress() {
    if !require_root("chgrp to any group") {
        return;
    }
    in_private_mount_ns(|| {
        let s = Scratch::new("volumed-own-progress-");
        let root = s.path();
        let v = root.join("vol");
        fs::create_dir_all(&v).unwrap();
        for i in 0..600 {
            fs::write(v.join(format!("f{i}")), b"").unwrap();
        }
        let dir = LinuxSys
            .open_dir_beneath(Beneath {
                base: root,
                rel: Path::new("vol"),
            })
            .unwrap();
        let mut seen = Vec::new();
        let every = ProgressEvery {
            first: std::time::Duration::ZERO,
            then: std::time::Duration::ZERO,
        };
        let group = FsGroup {
            gid: GID,
            policy: FsGroupChangePolicy::Always,
        };
        let w = set_ownership(
            &Permit::JournalOff,
            &LinuxSys,
            &dir,
            group,
            false,
            every,
            &mut |p| seen.push(p),
        )
        .unwrap();
        assert_eq!(w.entries, 601);
        assert_eq!(seen, vec![Progress::Slow, Progress::Processed(512)]);
    });
}
