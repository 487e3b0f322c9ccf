//! When to re-read the pod sources: on an inotify event in a source dir (or
//! its parent, so a dir that appears later is noticed; a queue overflow is
//! an event too, so it also means a full re-read), and otherwise every
//! [`RESYNC`] as a safety net (the kubelet's file source re-lists every
//! 20 s), stretched on a big node so that the net costs at most
//! 1/[`RESYNC_COST_SHARE`] of a core: a re-list that found nothing changed
//! and took d makes the next wait `max(RESYNC, d × RESYNC_COST_SHARE)` (at
//! 10,000 manifests a re-list costs ~40–70 ms, so about a minute). inotify
//! still reports every change in a source dir at once; the net is for
//! what it cannot see (a symlinked manifest's target changed). Stat-ing
//! every manifest once a second costs CPU linear in the number of files
//! (measured: ~3.5 µs a file, 5.7% of a core at 10,000 volumes); waiting on
//! inotify costs nothing while nothing changes. Where inotify cannot be set
//! up, it falls back to polling at the configured interval. A [`Stopper`]
//! wakes a wait at once (a byte on a socket pair polled beside inotify), so
//! a stop never waits for a poll period.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};

/// Full re-read interval while inotify reports nothing (the shortest).
pub(crate) const RESYNC: Duration = Duration::from_secs(30);

/// A re-list's cost times this is the longest the next one waits beyond
/// [`RESYNC`]: the safety net uses at most 0.1% of a core.
pub(crate) const RESYNC_COST_SHARE: u32 = 1000;

/// Waits for the next reason to re-read the sources.
pub(crate) struct Watcher {
    inotify: Option<Inotify>,
    dirs: Vec<PathBuf>,
    fallback: Duration,
    last_full: Instant,
    /// the safety net's period: [`RESYNC`], stretched by
    /// [`Watcher::relisted_unchanged`]
    resync: Duration,
    /// what each watch is for: `None` a source dir (every event counts),
    /// `Some(names)` a parent watched only for these children appearing,
    /// going or being replaced (a busy parent — a log file beside the
    /// source dirs — must not re-list the sources on every write)
    watches: BTreeMap<WatchDescriptor, Option<Vec<OsString>>>,
    /// which source dirs (indexes into `dirs`) each watch's events concern:
    /// (`None`, i) every event, (`Some(name)`, i) events naming `name`
    concerns: BTreeMap<WatchDescriptor, Vec<(Option<OsString>, usize)>>,
    /// readable once [`Stopper::stop`] was called (`None`: no socket pair
    /// could be made; the stop is then seen after the current wait)
    stop_rx: Option<UnixStream>,
    stopped: Arc<AtomicBool>,
    stop_tx: Option<Arc<UnixStream>>,
}

/// Ends a [`Watcher`]'s waits: the current one returns at once, later
/// ones immediately.
#[derive(Debug, Clone)]
pub(crate) struct Stopper {
    stopped: Arc<AtomicBool>,
    tx: Option<Arc<UnixStream>>,
}

impl Stopper {
    /// Stops the watcher.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        if let Some(tx) = &self.tx {
            // A full socket buffer already wakes the waiter.
            let _ = (&**tx).write(&[1]);
        }
    }
}

/// Which source dirs a wake concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Changed {
    /// all of them (a resync, a queue overflow, polling without inotify)
    All,
    /// these (indexes into the dirs given to [`Watcher::new`])
    Dirs(BTreeSet<usize>),
}

impl Changed {
    /// Whether the dir at `index` may have changed.
    pub(crate) fn includes(&self, index: usize) -> bool {
        match self {
            Changed::All => true,
            Changed::Dirs(d) => d.contains(&index),
        }
    }
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("dirs", &self.dirs)
            .field("inotify", &self.inotify.is_some())
            .finish()
    }
}

fn flags() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
}

impl Watcher {
    /// Watches `dirs` (and their parents); `fallback` is the poll interval
    /// used when inotify is unavailable.
    pub(crate) fn new(dirs: Vec<PathBuf>, fallback: Duration) -> Self {
        let inotify = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(i) => Some(i),
            Err(e) => {
                tracing::warn!(error = %e, "inotify unavailable: polling the pod sources every {fallback:?}");
                None
            }
        };
        let (stop_rx, stop_tx) = match UnixStream::pair() {
            Ok((rx, tx)) if rx.set_nonblocking(true).is_ok() => (Some(rx), Some(Arc::new(tx))),
            Ok(_) | Err(_) => {
                tracing::warn!(
                    "no socket pair for the watcher's stop: a stop waits for the current wait"
                );
                (None, None)
            }
        };
        let mut w = Self {
            inotify,
            dirs,
            fallback,
            last_full: Instant::now(),
            resync: RESYNC,
            watches: BTreeMap::new(),
            concerns: BTreeMap::new(),
            stop_rx,
            stopped: Arc::new(AtomicBool::new(false)),
            stop_tx,
        };
        w.add_watches();
        w
    }

    /// What stops this watcher's waits.
    pub(crate) fn stopper(&self) -> Stopper {
        Stopper {
            stopped: self.stopped.clone(),
            tx: self.stop_tx.clone(),
        }
    }

    /// Whether [`Stopper::stop`] was called.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Waits up to `timeout` for one of `fds` to become readable, or a stop
    /// (the stop socket is polled beside them); false when stopped or timed
    /// out.
    fn poll_or_stop<'a>(&'a self, fds: &mut Vec<PollFd<'a>>, timeout: Duration) -> bool {
        if self.is_stopped() {
            return false;
        }
        let watched = fds.len();
        if let Some(rx) = &self.stop_rx {
            fds.push(PollFd::new(rx.as_fd(), PollFlags::POLLIN));
        }
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let ready = matches!(poll(fds, PollTimeout::from(ms)), Ok(n) if n > 0);
        if self.is_stopped() {
            if let Some(mut rx) = self.stop_rx.as_ref() {
                let _ = rx.read(&mut [0; 8]);
            }
            return false;
        }
        ready
            && fds[..watched]
                .iter()
                .any(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
    }

    /// (Re-)adds watches; a dir that did not exist yet is watched once it does.
    fn add_watches(&mut self) {
        let Some(ino) = &self.inotify else { return };
        let mut watches: BTreeMap<WatchDescriptor, Option<Vec<OsString>>> = BTreeMap::new();
        let mut concerns: BTreeMap<WatchDescriptor, Vec<(Option<OsString>, usize)>> =
            BTreeMap::new();
        for (i, d) in self.dirs.iter().enumerate() {
            // Adding an existing watch again is harmless (same descriptor).
            if let Ok(wd) = ino.add_watch(d.as_path(), flags()) {
                watches.insert(wd, None);
                concerns.entry(wd).or_default().push((None, i));
            }
            if let Some(parent) = d.parent()
                && let Ok(wd) = ino.add_watch(parent, flags())
            {
                match d.file_name() {
                    // a parent that is also a source dir keeps `None`: every event counts
                    Some(name) => {
                        if let Some(names) = watches.entry(wd).or_insert_with(|| Some(Vec::new())) {
                            names.push(name.to_owned());
                        }
                        concerns
                            .entry(wd)
                            .or_default()
                            .push((Some(name.to_owned()), i));
                    }
                    // a path ending in `..` names no child: every event counts
                    None => {
                        watches.insert(wd, None);
                        concerns.entry(wd).or_default().push((None, i));
                    }
                }
            }
        }
        self.watches = watches;
        self.concerns = concerns;
    }

    /// Whether an event can change what the sources list.
    fn relevant(&self, e: &InotifyEvent) -> bool {
        if e.mask.intersects(
            AddWatchFlags::IN_Q_OVERFLOW
                | AddWatchFlags::IN_IGNORED
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF,
        ) {
            return true;
        }
        match self.watches.get(&e.wd) {
            Some(None) | None => true,
            Some(Some(names)) => e.name.as_ref().is_some_and(|n| names.contains(n)),
        }
    }

    /// The source dirs a relevant event concerns; every dir when the event
    /// is not about one entry of a watched dir (overflow, a watch gone).
    fn concerned(&self, e: &InotifyEvent, out: &mut Changed) {
        let Changed::Dirs(dirs) = out else { return };
        let whole = e.mask.intersects(
            AddWatchFlags::IN_Q_OVERFLOW
                | AddWatchFlags::IN_IGNORED
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF,
        );
        let Some(concerns) = self.concerns.get(&e.wd).filter(|_| !whole) else {
            *out = Changed::All;
            return;
        };
        for (name, i) in concerns {
            if name.is_none() || name.as_ref() == e.name.as_ref() {
                dirs.insert(*i);
            }
        }
    }

    #[cfg(test)]
    /// Blocks up to `max` for a change; `true` when the sources should be
    /// re-read now (something changed, or the resync is due).
    pub(crate) fn wait(&mut self, max: Duration) -> bool {
        self.wait_changed(max).is_some()
    }

    /// A full re-list that found nothing changed took `took`: the safety
    /// net waits `max(RESYNC, took × RESYNC_COST_SHARE)` from now on.
    pub(crate) fn relisted_unchanged(&mut self, took: Duration) {
        self.resync = RESYNC.max(took.saturating_mul(RESYNC_COST_SHARE));
    }

    /// The safety net's period now.
    pub(crate) fn resync(&self) -> Duration {
        self.resync
    }

    /// Like [`wait`](Self::wait), saying which source dirs the change
    /// concerns (a resync or polling without inotify: all).
    pub(crate) fn wait_changed(&mut self, max: Duration) -> Option<Changed> {
        let now = Instant::now();
        let Some(ino) = &self.inotify else {
            self.poll_or_stop(&mut Vec::new(), self.fallback.min(max));
            return (!self.is_stopped()).then_some(Changed::All);
        };
        if self.is_stopped() {
            return None;
        }
        if now.saturating_duration_since(self.last_full) >= self.resync {
            self.last_full = now;
            return Some(Changed::All);
        }
        let timeout = max.min(
            self.resync
                .saturating_sub(now.saturating_duration_since(self.last_full)),
        );
        let mut fds = vec![PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
        if !self.poll_or_stop(&mut fds, timeout) {
            return None;
        }
        // Drain everything queued: one re-read serves them all.
        let mut relevant = false;
        let mut changed = Changed::Dirs(BTreeSet::new());
        while let Ok(evs) = ino.read_events() {
            if evs.is_empty() {
                break;
            }
            for e in evs.iter().filter(|e| self.relevant(e)) {
                relevant = true;
                self.concerned(e, &mut changed);
            }
        }
        if relevant {
            self.add_watches();
        }
        relevant.then_some(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_wakes_the_watcher_and_silence_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        std::fs::create_dir(&pods).unwrap();
        let mut w = Watcher::new(vec![pods.clone()], Duration::from_millis(50));
        assert!(!w.wait(Duration::from_millis(100)), "nothing changed");
        std::fs::write(pods.join("p.yaml"), "x").unwrap();
        assert!(w.wait(Duration::from_secs(5)), "a new manifest wakes it");
        assert!(!w.wait(Duration::from_millis(100)), "drained");
    }

    #[test]
    fn a_wake_names_the_source_dirs_it_concerns() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        let objects = dir.path().join("objects");
        std::fs::create_dir(&objects).unwrap();
        let mut w = Watcher::new(
            vec![pods.clone(), objects.clone()],
            Duration::from_millis(50),
        );
        let staged = dir.path().join("staged");
        std::fs::create_dir(&staged).unwrap();
        std::fs::rename(&staged, &pods).unwrap();
        assert_eq!(
            w.wait_changed(Duration::from_secs(5)),
            Some(Changed::Dirs([0].into())),
            "the pods dir renamed in"
        );
        std::fs::write(pods.join("p.yaml"), "x").unwrap();
        assert_eq!(
            w.wait_changed(Duration::from_secs(5)),
            Some(Changed::Dirs([0].into()))
        );
        std::fs::write(objects.join("pv.yaml"), "x").unwrap();
        assert_eq!(
            w.wait_changed(Duration::from_secs(5)),
            Some(Changed::Dirs([1].into()))
        );
        assert!(Changed::All.includes(1));
    }

    #[test]
    fn the_safety_net_waits_longer_where_a_relist_costs_more() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Watcher::new(vec![dir.path().to_owned()], RESYNC);
        w.relisted_unchanged(Duration::from_millis(10));
        assert_eq!(
            w.resync(),
            RESYNC,
            "a cheap re-list: the kubelet-like period"
        );
        w.relisted_unchanged(Duration::from_millis(60));
        assert_eq!(w.resync(), Duration::from_secs(60), "0.1% of a core");
        // 45 s since the last full re-list: due at 30 s, not at 60 s
        w.last_full = Instant::now() - Duration::from_secs(45);
        assert_eq!(w.wait_changed(Duration::from_millis(20)), None);
        w.relisted_unchanged(Duration::from_millis(1));
        assert_eq!(
            w.wait_changed(Duration::from_millis(20)),
            Some(Changed::All)
        );
    }

    #[test]
    fn a_source_dir_that_appears_later_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        let mut w = Watcher::new(vec![pods.clone()], Duration::from_millis(50));
        let staged = dir.path().join("staged");
        std::fs::create_dir(&staged).unwrap();
        while w.wait(Duration::from_millis(50)) {}
        std::fs::rename(&staged, &pods).unwrap();
        assert!(
            w.wait(Duration::from_secs(5)),
            "the renamed-in dir wakes it"
        );
        std::fs::write(dir.path().join("volumed.log"), "a log line").unwrap();
        assert!(
            !w.wait(Duration::from_millis(200)),
            "a file beside the source dir does not"
        );
        std::fs::write(pods.join("p.yaml"), "x").unwrap();
        assert!(
            w.wait(Duration::from_secs(5)),
            "and is watched from then on"
        );
    }

    #[test]
    fn a_stop_wakes_a_wait_at_once_instead_of_after_its_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        std::fs::create_dir(&pods).unwrap();
        for inotify in [true, false] {
            let mut w = Watcher::new(vec![pods.clone()], RESYNC);
            if !inotify {
                // the fallback: a sleep of the poll interval, woken all the same
                w.inotify = None;
            }
            let stopper = w.stopper();
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = std::thread::spawn(move || {
                let woke = w.wait_changed(RESYNC);
                tx.send((woke, w.is_stopped())).unwrap();
            });
            std::thread::sleep(Duration::from_millis(50));
            stopper.stop();
            // far below the 30 s the wait was given
            let got = rx.recv_timeout(Duration::from_secs(10));
            assert_eq!(got, Ok((None, true)), "inotify: {inotify}");
            waiter.join().unwrap();
        }
    }
}
