//! The driven loop end to end: channels in, the worker pool, the journal
//! and host threads, and the recording fake underneath (no kernel). Each
//! wait is bounded, so a deadlock fails the test instead of hanging it.

use crate::reconciler::core::tests::pod;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Provider;
use super::event_loop::{CoreConfig, Event, LoopConfig, LoopParts, World, spawn_loop};
use crate::host::mountinfo::MountTable;
use crate::host::recording_sys::RecordingSys;
use crate::host::sys::{
    Beneath, DirEntry, DiskFormat, FileKind, FileStat, Listing, MntFlags, MsFlags, Sys, SysError,
};
use crate::journal::{Journal, JournalConfig};
use crate::metrics::Metrics;
use crate::model::{Layout, PodUid};
use crate::server::DebugProvider;
use crate::sources::SourceEvent;

/// Generous: only a hang (or a deadlock) comes near it.
const PATIENCE: Duration = Duration::from_secs(20);

/// The recording fake, with every tmpfs mount of a pod whose UID starts
/// with `hung` held until the test releases it (one permit per mount).
struct Gated {
    inner: Arc<RecordingSys>,
    release: Mutex<Receiver<()>>,
    entered: Mutex<Sender<()>>,
}

impl Gated {
    fn hold(&self, at: &Path) {
        if at.to_string_lossy().contains("/hung") {
            let _ = self.entered.lock().unwrap().send(());
            let _ = self.release.lock().unwrap().recv();
        }
    }
}

impl Sys for Gated {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        self.inner.mount(source, target, fstype, flags, data)
    }
    fn mount_beneath(
        &self,
        source: Option<&Path>,
        at: Beneath<'_>,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> Result<(), SysError> {
        self.hold(&at.full());
        self.inner.mount_beneath(source, at, fstype, flags, data)
    }
    fn bind_beneath(&self, source: Beneath<'_>, at: Beneath<'_>) -> Result<(), SysError> {
        self.inner.bind_beneath(source, at)
    }
    fn stat_within(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        self.inner.stat_within(at)
    }
    fn bind_within(
        &self,
        source: Beneath<'_>,
        at: Beneath<'_>,
        kind: FileKind,
    ) -> Result<(), SysError> {
        self.inner.bind_within(source, at, kind)
    }
    fn umount2_beneath(&self, at: Beneath<'_>, flags: MntFlags) -> Result<(), SysError> {
        self.inner.umount2_beneath(at, flags)
    }
    fn mount_root(&self, path: &Path) -> Result<bool, SysError> {
        self.inner.mount_root(path)
    }
    fn mnt_id(&self, path: &Path) -> Result<u64, SysError> {
        self.inner.mnt_id(path)
    }
    fn stat(&self, path: &Path, follow: bool) -> Result<FileStat, SysError> {
        self.inner.stat(path, follow)
    }
    fn stat_beneath(&self, at: Beneath<'_>) -> Result<FileStat, SysError> {
        self.inner.stat_beneath(at)
    }
    fn mkdir(&self, path: &Path, mode: u32) -> Result<(), SysError> {
        self.inner.mkdir(path, mode)
    }
    fn mkdir_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
        self.inner.mkdir_beneath(at, mode)
    }
    fn chmod_dir_beneath(&self, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
        self.inner.chmod_dir_beneath(at, mode)
    }
    fn create_file(&self, path: &Path, mode: u32) -> Result<(), SysError> {
        self.inner.create_file(path, mode)
    }
    fn create_file_beneath(
        &self,
        at: Beneath<'_>,
        bytes: &[u8],
        mode: u32,
    ) -> Result<(), SysError> {
        self.inner.create_file_beneath(at, bytes, mode)
    }
    fn write_file_beneath(&self, at: Beneath<'_>, bytes: &[u8], mode: u32) -> Result<(), SysError> {
        self.inner.write_file_beneath(at, bytes, mode)
    }
    fn rename_beneath(&self, from: Beneath<'_>, to_name: &std::ffi::OsStr) -> Result<(), SysError> {
        self.inner.rename_beneath(from, to_name)
    }
    fn replace_beneath(
        &self,
        from: Beneath<'_>,
        to_name: &std::ffi::OsStr,
    ) -> Result<(), SysError> {
        self.inner.replace_beneath(from, to_name)
    }
    fn symlink_beneath(&self, at: Beneath<'_>, target: &Path) -> Result<(), SysError> {
        self.inner.symlink_beneath(at, target)
    }
    fn read_link_beneath(&self, at: Beneath<'_>) -> Result<std::path::PathBuf, SysError> {
        self.inner.read_link_beneath(at)
    }
    fn chgrp_beneath(&self, at: Beneath<'_>, gid: u32) -> Result<(), SysError> {
        self.inner.chgrp_beneath(at, gid)
    }
    fn rmdir(&self, path: &Path) -> Result<(), SysError> {
        self.inner.rmdir(path)
    }
    fn rmdir_beneath(&self, at: Beneath<'_>) -> Result<(), SysError> {
        self.inner.rmdir_beneath(at)
    }
    fn unlink(&self, path: &Path) -> Result<(), SysError> {
        self.inner.unlink(path)
    }
    fn read_dir_beneath(&self, base: &Path, rel: &Path) -> Result<Vec<DirEntry>, SysError> {
        self.inner.read_dir_beneath(base, rel)
    }
    fn remove_beneath(&self, base: &Path, rel: &Path, dir: bool) -> Result<(), SysError> {
        self.inner.remove_beneath(base, rel, dir)
    }
    fn mkfs(&self, device: &Path, fstype: &str) -> Result<(), SysError> {
        self.inner.mkfs(device, fstype)
    }
    fn probe_fs(&self, device: &Path) -> Result<DiskFormat, SysError> {
        self.inner.probe_fs(device)
    }
    fn read_mountinfo(&self) -> Result<MountTable, SysError> {
        self.inner.read_mountinfo()
    }
    fn read_mountinfo_pieces(
        &self,
        piece: &mut dyn FnMut(Vec<u8>) -> bool,
    ) -> Result<(), SysError> {
        self.inner.read_mountinfo_pieces(piece)
    }
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, SysError> {
        self.inner.canonicalize(path)
    }
    fn read_dir(&self, path: &Path) -> Result<Listing, SysError> {
        self.inner.read_dir(path)
    }
    fn read_file(&self, path: &Path, limit: u64, follow: bool) -> Result<Vec<u8>, SysError> {
        self.inner.read_file(path, limit, follow)
    }
    fn read_file_beneath(&self, at: Beneath<'_>, limit: u64) -> Result<Vec<u8>, SysError> {
        self.inner.read_file_beneath(at, limit)
    }
    fn statfs(&self, path: &Path) -> Result<crate::host::sys::FsUsage, SysError> {
        self.inner.statfs(path)
    }
    fn loop_find_backing(&self, backing: &Path) -> Result<Vec<PathBuf>, SysError> {
        self.inner.loop_find_backing(backing)
    }
    fn loop_attach_beneath(&self, at: Beneath<'_>) -> Result<PathBuf, SysError> {
        self.inner.loop_attach_beneath(at)
    }
    fn loop_detach(&self, dev: &Path) -> Result<(), SysError> {
        self.inner.loop_detach(dev)
    }
    fn mount_probe(&self, path: &Path) -> Result<crate::host::sys::MountProbe, SysError> {
        self.inner.mount_probe(path)
    }
}

/// A running loop over the gated fake and a real journal in a temp dir.
struct Rig {
    _dir: tempfile::TempDir,
    fake: Arc<RecordingSys>,
    /// one send lets one held mount go on
    release: Sender<()>,
    /// one message per mount that reached the gate
    entered: Receiver<()>,
    events: Sender<Event>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    provider: Provider,
    heartbeat: Arc<crate::daemon::notify::Heartbeat>,
}

fn rig(workers: usize) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&JournalConfig::new(dir.path().join("j"), "n", "b")).unwrap();
    let journal = Arc::new(j);
    let fake = Arc::new(RecordingSys::new());
    fake.add("/r", FileKind::Dir);
    let (release, release_rx) = mpsc::channel();
    let (entered_tx, entered) = mpsc::channel();
    let sys = Arc::new(Gated {
        inner: fake.clone(),
        release: Mutex::new(release_rx),
        entered: Mutex::new(entered_tx),
    });
    let world = Arc::new(Mutex::new(World::default()));
    let metrics = Arc::new(Metrics::new().unwrap());
    let (events, events_rx) = mpsc::channel();
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let changes = Arc::new(crate::runtime::Changes::new());
    let sink: Arc<dyn crate::health::EventSink> = Arc::new(crate::health::RecentEvents::default());
    let heartbeat = Arc::new(crate::daemon::notify::Heartbeat::default());
    let subpaths = Arc::new(crate::reconciler::executor::subpaths::Subpaths::new(
        Some(journal.clone()),
        sys.clone(),
        Layout::new("/r"),
    ));
    let threads = spawn_loop(LoopParts {
        cfg: LoopConfig {
            core: CoreConfig {
                layout: Layout::new("/r"),
                journal: true,
                // long: every wake below is an event, never a resync
                resync: Duration::from_secs(3600),
                checkpoint_every: 0,
                selinux: crate::selinux::Policy::disabled(),
                late_window: Duration::ZERO,
                republish_every: Duration::ZERO,
            },
            workers,
            started: std::time::Instant::now(),
            csi: None,
            payload_objects: Arc::new(crate::plugins::payload::ObjectStores::default()),
            node_memory: None,
            in_use_wake: None,
        },
        world: world.clone(),
        journal: Some(journal.clone()),
        sys: sys.clone(),
        subpaths: subpaths.clone(),
        metrics: metrics.clone(),
        failed: Some(Vec::new()),
        events: (events.clone(), events_rx),
        stopping: stopping.clone(),
        on_ready: Vec::new(),
        changes: changes.clone(),
        sink,
        heartbeat: heartbeat.clone(),
        claims: None,
    })
    .unwrap();
    let provider = Provider {
        runtime: crate::runtime::VolumeManagerHandle::new(world.clone(), changes),
        world,
        metrics,
        journal: Some(journal),
        node_name: "n".into(),
        boot_id: "b".into(),
        monitor: None,
        sink: Default::default(),
        subpaths,
    };
    Rig {
        _dir: dir,
        fake,
        release,
        entered,
        events,
        stopping,
        threads,
        provider,
        heartbeat,
    }
}

impl Rig {
    fn send(&self, evs: Vec<SourceEvent>) {
        self.events.send(Event::Sources(evs)).unwrap();
    }

    /// Whether the fake has a mount below `pods/<uid>/`.
    fn mounted(&self, uid: &str) -> bool {
        let dir = format!("/r/pods/{uid}/");
        self.fake
            .mounts()
            .iter()
            .any(|m| m.target.to_string_lossy().starts_with(&dir))
    }

    fn wait_until(&self, what: &str, cond: impl Fn(&Rig) -> bool) {
        let deadline = std::time::Instant::now() + PATIENCE;
        while !cond(self) {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Runs `f` on the provider on another thread; its answer, or a
    /// failure when it does not come within [`PATIENCE`].
    fn ask<T: Send + 'static>(&self, f: impl FnOnce(&Provider) -> T + Send + 'static) -> T {
        let p = Provider {
            runtime: self.provider.runtime.clone(),
            world: self.provider.world.clone(),
            metrics: self.provider.metrics.clone(),
            journal: self.provider.journal.clone(),
            node_name: "n".into(),
            boot_id: "b".into(),
            monitor: None,
            sink: Default::default(),
            subpaths: self.provider.subpaths.clone(),
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f(&p));
        });
        rx.recv_timeout(PATIENCE)
            .expect("the provider answers while a job hangs")
    }

    /// Stops as the daemon does and joins every thread, within [`PATIENCE`].
    fn stop(self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // the loop may have ended already on an earlier stop (the joins
        // below are what this checks)
        let _ = self.events.send(Event::Stop);
        let (tx, rx) = mpsc::channel();
        let threads = self.threads;
        std::thread::spawn(move || {
            for t in threads {
                t.join().unwrap();
            }
            let _ = tx.send(());
        });
        rx.recv_timeout(PATIENCE)
            .expect("every loop thread ends after the stop");
    }
}

#[test]
fn a_hung_mount_delays_neither_another_volume_nor_the_provider() {
    let r = rig(4);
    r.send(vec![SourceEvent::PodAdded(pod("hung-1"))]);
    r.entered
        .recv_timeout(PATIENCE)
        .expect("the hung pod's mount reached the gate");
    r.send(vec![
        SourceEvent::PodAdded(pod("quick-1")),
        SourceEvent::SourcesReady,
    ]);
    r.wait_until("the other pod's volume is mounted", |r| {
        r.mounted("quick-1")
    });
    assert!(!r.mounted("hung-1"), "still held");
    assert_eq!(r.ask(|p| p.ready()), Ok(()));
    // the fake's mount comes before the job's report reaches the ASW
    r.wait_until("/debug/state shows the mounted volume", |r| {
        let state = r.ask(|p| p.state());
        serde_json::to_string(&state).unwrap().contains("quick-1")
    });
    assert!(
        r.ask(|p| p.metrics_text())
            .contains("volume_manager_total_volumes")
    );
    r.release.send(()).unwrap();
    r.wait_until("the held mount finishes", |r| r.mounted("hung-1"));
    r.stop();
}

#[test]
fn a_saturated_worker_pool_neither_blocks_events_nor_the_stop() {
    // One worker, held by a hung mount; more jobs queue behind it.
    let r = rig(1);
    let pods: Vec<SourceEvent> = (0..20)
        .map(|i| SourceEvent::PodAdded(pod(&format!("hung-{i}"))))
        .collect();
    r.send(pods);
    r.entered.recv_timeout(PATIENCE).expect("one mount is held");
    // The loop still applies events and answers the provider.
    r.send(vec![
        SourceEvent::PodRemoved(PodUid::new("hung-19").unwrap()),
        SourceEvent::SourcesReady,
    ]);
    r.wait_until("the loop applied the later events", |r| {
        r.ask(|p| p.ready()).is_ok()
    });
    // Stop while the queue is full: the queued jobs are not started, the
    // held one finishes, and every thread ends.
    r.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    r.events.send(Event::Stop).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    r.release.send(()).unwrap();
    let fake = r.fake.clone();
    r.stop();
    let mounted = fake
        .mounts()
        .iter()
        .filter(|m| m.target.to_string_lossy().contains("/hung-"))
        .count();
    assert_eq!(mounted, 1, "only the job in flight ran");
}

#[test]
fn an_idle_loop_stops_on_the_event_not_a_timer() {
    // The resync is an hour: only the stop event can end the wait.
    let r = rig(2);
    r.send(vec![SourceEvent::SourcesReady]);
    r.wait_until("ready", |r| r.ask(|p| p.ready()).is_ok());
    let started = std::time::Instant::now();
    r.stop();
    assert!(started.elapsed() < PATIENCE);
}

/// What `READY=1` and the watchdog read: ready exactly when the provider
/// is, alive while a worker's mount hangs (that is not the loop's), and
/// ended once the loop has stopped.
#[test]
fn the_heartbeat_is_ready_with_readyz_alive_beside_a_hung_mount_and_ends_at_the_stop() {
    let r = rig(2);
    assert!(
        !r.heartbeat.wait_ready(Duration::from_millis(50)),
        "not ready before the sources listed"
    );
    r.send(vec![SourceEvent::PodAdded(pod("hung-1"))]);
    r.entered
        .recv_timeout(PATIENCE)
        .expect("the hung pod's mount reached the gate");
    r.send(vec![SourceEvent::SourcesReady]);
    assert!(r.heartbeat.wait_ready(PATIENCE), "ready once listed");
    assert_eq!(r.ask(|p| p.ready()), Ok(()), "/readyz is 200 by then");
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        r.heartbeat
            .alive(std::time::Instant::now(), Duration::from_secs(1)),
        "a hung mount holds a worker, not the loop"
    );
    r.release.send(()).unwrap();
    r.wait_until("the held mount finishes", |r| r.mounted("hung-1"));
    let beat = r.heartbeat.clone();
    r.stop();
    assert!(
        !beat.alive(std::time::Instant::now(), Duration::from_secs(3600)),
        "a loop that ended beats no more"
    );
}
