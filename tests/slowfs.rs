//! `volumed-slowfs`, the soak's slow journal disk, on the real kernel's
//! FUSE: it carries everything a journal dir holds and does (a sled
//! journal written and reopened, a unix socket bound and connected,
//! renames, a dir moved aside, locks), its delay really makes fsync slow,
//! a process killed in a slow write still goes, and the real daemon runs
//! with its journal on it. As root only, each test in its own private
//! mount namespace.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::daemon::{Env, unix_get};
use support::slowfs::{DELAY_TAKES, SlowFs, unavailable};
use support::{Scratch, in_private_mount_ns};
use volumed::journal::{Body, Journal, JournalConfig};
use volumed::model::{
    Operation, PluginName, PodUid, Steps, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};

const BOOT: &str = "11111111-2222-3333-4444-555555555555";

/// Runs `f` as root in a private mount namespace, where FUSE is; else
/// says why it was skipped.
fn real(what: &str, f: impl FnOnce()) {
    if !support::require_root(what) {
        return;
    }
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why} ({what})");
        return;
    }
    in_private_mount_ns(f);
}

/// A slowfs of `scratch/backing` on `scratch/disk`.
fn slowfs(scratch: &Scratch) -> SlowFs {
    let p = scratch.path();
    SlowFs::mount(&p.join("backing"), &p.join("disk"), &p.join("delay"))
}

fn intent(i: u64) -> Body {
    let pod = PodUid::new(format!("pod-{i}")).unwrap();
    Body::Intent {
        op: Operation::SetUp,
        steps: Steps::Single,
        target: TargetParams::at(
            UniqueVolumeName::from_raw(format!("kubernetes.io/empty-dir/pod-{i}-v")),
            PluginName::EmptyDir,
            "v".into(),
            TargetRef::Pod(pod.clone()),
            TargetKind::Mount,
            Some(format!("/r/pods/{pod}/volumes/kubernetes.io~empty-dir/v").into()),
        )
        .into(),
    }
}

fn fsync_took(path: &Path) -> Duration {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(b"x").unwrap();
    let began = Instant::now();
    f.sync_all().unwrap();
    began.elapsed()
}

#[test]
fn a_sled_journal_is_written_and_reopened_through_the_mount() {
    real("a FUSE mount", || {
        let scratch = Scratch::new("volumed-slowfs-journal");
        let fs = slowfs(&scratch);
        let dir = fs.mountpoint.join("journal");
        let cfg = JournalConfig::new(&dir, "node-a", BOOT);
        let (j, replay) = Journal::open(&cfg).unwrap();
        assert!(replay.created);
        for i in 1..=50 {
            assert_eq!(j.append_record(intent(i)).unwrap(), i);
        }
        let before = j.state();
        j.close().unwrap();
        let (j, replay) = Journal::open(&cfg).unwrap();
        assert!(!replay.created);
        assert_eq!(j.state(), before, "every record back through the mount");
        assert_eq!(j.append_record(intent(51)).unwrap(), 51);
        j.close().unwrap();
        // the bytes are on the backing dir, under the same names
        let through: Vec<_> = names(&dir);
        let backing: Vec<_> = names(&fs.backing.join("journal"));
        assert!(!through.is_empty());
        assert_eq!(through, backing);
        for n in &through {
            let (a, b) = (dir.join(n), fs.backing.join("journal").join(n));
            if a.is_file() {
                assert_eq!(fs::read(&a).unwrap(), fs::read(&b).unwrap(), "{n}");
            }
        }
        // a damaged journal is moved aside to a sibling: a rename of a
        // dir on the mount, its files following
        fs::rename(&dir, fs.mountpoint.join("journal.corrupt-1")).unwrap();
        assert!(fs.backing.join("journal.corrupt-1").is_dir());
        assert_eq!(names(&fs.mountpoint.join("journal.corrupt-1")), through);
    });
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// sled's lock: the kernel keeps `flock` locks itself on a FUSE inode
/// whose server does not take them, so a second holder is refused.
#[test]
fn an_exclusive_flock_is_held_against_a_second_open() {
    use nix::fcntl::{Flock, FlockArg};
    real("a FUSE mount", || {
        let scratch = Scratch::new("volumed-slowfs-flock");
        let fs = slowfs(&scratch);
        let path = fs.mountpoint.join("conf");
        fs::write(&path, b"x").unwrap();
        let open = || {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let held = Flock::lock(open(), FlockArg::LockExclusiveNonblock).unwrap();
        let refused = Flock::lock(open(), FlockArg::LockExclusiveNonblock);
        assert!(
            refused.is_err(),
            "a second exclusive lock while the first is held"
        );
        drop(held);
        Flock::lock(open(), FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .expect("free once the first is released");
    });
}

#[test]
fn a_unix_socket_is_bound_renamed_and_connected_through_the_mount() {
    real("a FUSE mount", || {
        let scratch = Scratch::new("volumed-slowfs-socket");
        let fs = slowfs(&scratch);
        // as the daemon's api.sock: bound at a temporary name, renamed
        let (tmp, sock) = (
            fs.mountpoint.join(".api.sock.tmp"),
            fs.mountpoint.join("api.sock"),
        );
        let listener = UnixListener::bind(&tmp).unwrap();
        fs::rename(&tmp, &sock).unwrap();
        assert!(
            fs::metadata(fs.backing.join("api.sock"))
                .unwrap()
                .file_type()
                .is_socket(),
            "the backing dir holds the socket node"
        );
        for i in 0..3 {
            // later connects look the path up again: the same node each time
            std::thread::sleep(Duration::from_millis(if i == 2 { 1200 } else { 0 }));
            let mut client = UnixStream::connect(&sock).unwrap();
            let (mut server, _) = listener.accept().unwrap();
            client.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            server.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"ping", "connect {i}");
        }
        drop(listener);
        fs::remove_file(&sock).unwrap();
        assert!(!fs.backing.join("api.sock").exists());
    });
}

#[test]
fn fsync_waits_the_delay_written_and_not_once_it_is_zero_again() {
    real("a FUSE mount", || {
        let scratch = Scratch::new("volumed-slowfs-delay");
        let fs = slowfs(&scratch);
        let file = fs.mountpoint.join("f");
        let fast = fsync_took(&file);
        fs.set_delay(200);
        std::thread::sleep(DELAY_TAKES);
        let slow = fsync_took(&file);
        assert!(
            slow >= Duration::from_millis(200),
            "fsync took {slow:?} with a 200 ms delay (without: {fast:?})"
        );
        fs.set_delay(0);
        std::thread::sleep(DELAY_TAKES);
        fsync_took(&file);
        assert_eq!(fs::read(fs.backing.join("f")).unwrap(), b"xxx");
        eprintln!("fsync: {fast:?} without a delay, {slow:?} with 200 ms");
    });
}

/// A request read by the FUSE server is waited for even by a SIGKILLed
/// caller (the kernel abandons only one not yet read), and its exit's
/// close sends a flush it waits for too: the killed writer goes once
/// those delays are over (about 3 s here), and the mount serves on.
#[test]
fn a_process_killed_in_a_slow_write_exits_and_the_mount_serves_on() {
    real("a FUSE mount", || {
        let scratch = Scratch::new("volumed-slowfs-kill");
        let mut fs = slowfs(&scratch);
        fs.set_delay(1_500);
        std::thread::sleep(DELAY_TAKES);
        let mut writer = Command::new("dd")
            .args(["if=/dev/zero", "bs=4096", "count=4", "conv=fsync"])
            .arg(format!("of={}", fs.mountpoint.join("w").display()))
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        writer.kill().unwrap();
        let began = Instant::now();
        let status = writer.wait().unwrap();
        eprintln!(
            "the killed writer exited {:?} after the kill",
            began.elapsed()
        );
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{status:?}"
        );
        fs.set_delay(0);
        std::thread::sleep(DELAY_TAKES);
        fs::write(fs.mountpoint.join("after"), b"served").unwrap();
        assert_eq!(fs::read(fs.backing.join("after")).unwrap(), b"served");
        // SIGTERM unmounts and exits 0
        let status = fs.stop().expect("exits on SIGTERM");
        assert!(status.success(), "{status:?}");
        assert!(scratch.mounts_below().is_empty(), "unmounted");
    });
}

#[test]
fn a_lazy_unmount_ends_the_process() {
    real("a FUSE mount", || {
        let scratch = Scratch::new("volumed-slowfs-umount");
        let mut fs = slowfs(&scratch);
        fs::write(fs.mountpoint.join("f"), b"x").unwrap();
        nix::mount::umount2(&fs.mountpoint, nix::mount::MntFlags::MNT_DETACH).unwrap();
        let status = fs
            .wait_exit(Duration::from_secs(10))
            .expect("exits once unmounted");
        assert!(status.success(), "{status:?}");
    });
}

/// The real daemon with `--journal-dir` on the slow disk: a pod mounts,
/// the runtime API answers on `api.sock` there, `dump` reads the journal
/// (from the daemon, then from sled's files once it stopped).
#[test]
fn the_daemon_runs_with_its_journal_on_the_slow_disk() {
    real("the daemon mounts tmpfs", || {
        let mut env = Env::new("volumed-slowfs-daemon");
        let fs = slowfs(&env.scratch);
        env.journal = fs.mountpoint.join("journal");
        fs.set_delay(30);
        std::thread::sleep(DELAY_TAKES);
        let uid = "slowfs-pod";
        env.write_pod(
            "p.json",
            &serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": uid, "namespace": "default", "uid": uid},
                "spec": {"containers": [{"name": "c", "image": "busybox"}],
                    "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory"}}]},
            })
            .to_string(),
        );
        let daemon = env.start();
        let socket = env.journal.join("api.sock");
        daemon.wait_until("the pod ready on api.sock", || {
            unix_get(
                &socket,
                &format!("/v1/pods/{uid}/volumes"),
                Duration::from_secs(5),
            )
            .ok()
            .filter(|(s, _)| *s == 200)
            .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
            .is_some_and(|doc| doc["ready"] == true)
        });
        let target = env.pod_volume(uid, "kubernetes.io~empty-dir", "tmp");
        let table = volumed::host::mountinfo::MountTable::read_self().unwrap();
        assert!(
            table.entries().iter().any(|m| m.mount_point == target),
            "{} mounted",
            target.display()
        );
        let mounted = |dump: &serde_json::Value| {
            support::daemon::targets(&dump["state"])
                .get(&target)
                .is_some_and(|(_, s)| s == "mounted")
        };
        let live = env.dump();
        assert!(mounted(&live), "dump from the daemon: {live:#}");
        assert!(fs.backing.join("journal/daemon.json").is_file());
        daemon.stop();
        let kept = env.dump();
        assert!(mounted(&kept), "dump of the journal's files: {kept:#}");
        assert!(fs.backing.join("journal/db").is_file());
    });
}
