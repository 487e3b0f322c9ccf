//! The monitor thread: a pass each period or on demand. A pass copies the
//! mounted volumes (`subjects`, which takes the daemon's lock for the copy
//! only), runs the checks in order on a prober thread, and applies the
//! results: conditions, events, gauges.
//!
//! The per-check timeout without a thread hop per check: the prober writes
//! each result into a shared slot and notes which check it is on and since
//! when; the monitor sleeps until the pass ends or a check outlives the
//! timeout. Then that check is counted as timed out, its prober abandoned
//! (still stuck in its call; when the call returns it only clears the
//! volume's hung mark), and a fresh prober goes on from the next volume. A
//! volume marked hung is left out of later passes until its call returns,
//! so a dead server costs one stuck thread, not one per pass.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::csi::{self, CsiChecked};
use super::decide::{Finding, Transition, csi_condition, native_condition, pod_events, transition};
use super::events::EventSink;
use super::probe::{self, Baselines, TableGate};
use super::store::{Judged, Store, share};
use super::{HealthConfig, Subject, Usage};
use crate::csi::registry::Drivers;
use crate::host::sys::Sys;
use crate::model::{PluginName, UniqueVolumeName};

pub use crate::metrics::HealthMetrics;

/// What the monitor is built from.
pub struct MonitorParts {
    /// period, timeout, gate
    pub config: HealthConfig,
    /// the host
    pub sys: Arc<dyn Sys>,
    /// the CSI drivers, when CSI is on
    pub drivers: Option<Arc<Drivers>>,
    /// the mounted volumes now (the daemon copies them under its lock)
    pub subjects: Box<dyn Fn() -> Vec<Subject> + Send + Sync>,
    /// where events go
    pub sink: Arc<dyn EventSink>,
    /// the gauges and counters, when metrics are kept
    pub metrics: Option<HealthMetrics>,
}

/// The result of one volume's check.
#[derive(Debug, Clone)]
enum Checked {
    Native(Vec<Finding>, Option<Usage>),
    Csi(CsiChecked),
    TimedOut,
}

enum Msg {
    Check(Option<Sender<()>>),
    Stop,
}

/// Shared between the monitor thread, its probers and the readers.
struct Shared {
    store: Mutex<Store>,
    /// volumes whose check hangs in a call that has not returned; also
    /// the lock under which a prober moves on and the monitor gives up
    hung: Mutex<HashSet<UniqueVolumeName>>,
    /// set by [`Monitor::stop`]: a prober starts no further check, so a
    /// stop waits for the check in progress, not the rest of a pass (on a
    /// node of 10,000 CSI volumes, a NodeGetVolumeStats each: seconds)
    stopping: AtomicBool,
}

/// The running monitor.
pub struct Monitor {
    shared: Arc<Shared>,
    trigger: Mutex<Sender<Msg>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Monitor {
    /// Starts the monitor thread; the first pass runs at once.
    pub fn start(parts: MonitorParts) -> std::io::Result<Monitor> {
        let m = Self::start_when_asked(parts)?;
        m.ask();
        Ok(m)
    }

    /// Starts the monitor thread; the first pass runs when asked (the daemon:
    /// once ready, not competing with a restart for the CPU it needs).
    pub fn start_when_asked(parts: MonitorParts) -> std::io::Result<Monitor> {
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            hung: Mutex::new(HashSet::new()),
            stopping: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel::<Msg>();
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("volumed-health".into())
            .spawn(move || {
                let runner = Runner {
                    parts,
                    shared: s,
                    baselines: Mutex::new(Baselines::default()),
                    table: Mutex::new(TableGate::default()),
                };
                let mut waiters = Vec::new();
                match rx.recv() {
                    Ok(Msg::Check(w)) => waiters.extend(w),
                    Ok(Msg::Stop) | Err(_) => return,
                }
                loop {
                    runner.pass();
                    for w in waiters.drain(..) {
                        let _: Result<(), _> = Sender::send(&w, ());
                    }
                    match rx.recv_timeout(runner.parts.config.period) {
                        Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                        Ok(Msg::Check(w)) => waiters.extend(w),
                        Err(RecvTimeoutError::Timeout) => {}
                    }
                    // coalesce every request that came during the pass
                    while let Ok(m) = rx.try_recv() {
                        match m {
                            Msg::Stop => return,
                            Msg::Check(w) => waiters.extend(w),
                        }
                    }
                }
            })?;
        Ok(Monitor {
            shared,
            trigger: Mutex::new(tx),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Asks for a pass now, without waiting (none once stopped).
    pub fn ask(&self) {
        let _ = lock(&self.trigger).send(Msg::Check(None));
    }

    /// Asks for a pass now and waits up to `wait` for it to end; false when
    /// it did not in time.
    pub fn check_now(&self, wait: Duration) -> bool {
        let (tx, rx) = mpsc::channel();
        if lock(&self.trigger).send(Msg::Check(Some(tx))).is_err() {
            return false;
        }
        rx.recv_timeout(wait).is_ok()
    }

    /// Reads the store.
    pub fn read<T>(&self, f: impl FnOnce(&Store) -> T) -> T {
        f(&lock(&self.shared.store))
    }

    /// Stops the thread: a pass in progress ends after the check it is
    /// in (the checks not run keep what they had); a hung prober is left
    /// behind.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        let _ = lock(&self.trigger).send(Msg::Stop);
        if let Some(t) = lock(&self.thread).take()
            && t.join().is_err()
        {
            tracing::error!("the health monitor thread panicked");
        }
    }
}

struct Runner {
    parts: MonitorParts,
    shared: Arc<Shared>,
    /// what each mount target showed first (the monitor's alone; a pass
    /// lends the probers a shared copy)
    baselines: Mutex<Baselines>,
    table: Mutex<TableGate>,
}

/// What a prober shares with the monitor.
struct Progress {
    /// the check it is on
    at: AtomicUsize,
    /// when that check started, in ns since the pass started
    since_ns: AtomicU64,
    /// set by the monitor when it gives up on this prober
    abandoned: AtomicBool,
}

impl Runner {
    fn pass(&self) {
        let started = Instant::now();
        // asked before the table is read for new targets: a change after
        // this is seen by this pass's read or the next pass's question
        let unchanged = lock(&self.table).unchanged(self.parts.sys.as_ref());
        let all = (self.parts.subjects)();
        let hung = lock(&self.shared.hung).clone();
        let baselines = {
            let native: Vec<&Subject> =
                all.iter().filter(|s| s.plugin != PluginName::Csi).collect();
            let mut b = std::mem::take(&mut *lock(&self.baselines));
            probe::prune(&native, &mut b);
            probe::learn(self.parts.sys.as_ref(), &native, &mut b);
            Arc::new(b)
        };
        // moved, not copied: a pass copies each subject once, under the
        // daemon's lock (a copy per step made a pass at 10,000 volumes
        // cost half again as much as its syscalls)
        let work: Vec<Subject> = all
            .into_iter()
            .filter(|s| !hung.contains(&s.volume))
            .collect();
        let results = self.run(Arc::new(work), started, &baselines, unchanged);
        // a hung prober may still hold the pass's copy
        *lock(&self.baselines) = Arc::try_unwrap(baselines).unwrap_or_else(|b| (*b).clone());
        self.apply(&hung, results);
        if let Some(m) = &self.parts.metrics {
            m.pass_seconds.set(started.elapsed().as_secs_f64());
        }
        // the pass's copy of every subject and its results are freed by
        // now; glibc keeps what was freed below the top of its heap
        crate::host::sys::trim_malloc();
    }

    /// Runs every check of `work`, in order, on prober threads.
    fn run(
        &self,
        work: Arc<Vec<Subject>>,
        started: Instant,
        baselines: &Arc<Baselines>,
        unchanged: bool,
    ) -> impl Iterator<Item = (Subject, Option<Checked>)> + use<> {
        let n = work.len();
        let slots: Arc<Mutex<Vec<Option<Checked>>>> = Arc::new(Mutex::new(vec![None; n]));
        let timeout = self.parts.config.timeout;
        let mut from = 0;
        while from < n {
            let progress = Arc::new(Progress {
                at: AtomicUsize::new(from),
                since_ns: AtomicU64::new(ns(started)),
                abandoned: AtomicBool::new(false),
            });
            let (done_tx, done_rx) = mpsc::channel::<()>();
            let ctx = ProbeCtx {
                sys: self.parts.sys.clone(),
                drivers: self.parts.drivers.clone(),
                gate: self.parts.config.csi_condition,
                timeout,
                shared: self.shared.clone(),
                baselines: baselines.clone(),
                unchanged,
            };
            let (w, sl, p) = (work.clone(), slots.clone(), progress.clone());
            let spawned = std::thread::Builder::new()
                .name("volumed-probe".into())
                .spawn(move || ctx.probe_from(&w, from, &sl, &p, started, &done_tx));
            if let Err(e) = spawned {
                tracing::error!("health: start a prober: {e}");
                break;
            }
            loop {
                match done_rx.recv_timeout(timeout) {
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                        from = n;
                        break;
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        // under the lock the prober moves on with: `at`
                        // is the check it is in, and stays so
                        let mut hung = lock(&self.shared.hung);
                        let at = progress.at.load(Ordering::Acquire);
                        let since = Duration::from_nanos(progress.since_ns.load(Ordering::Acquire));
                        if at >= n || started.elapsed().saturating_sub(since) < timeout {
                            continue;
                        }
                        progress.abandoned.store(true, Ordering::Release);
                        if let Some(s) = work.get(at) {
                            hung.insert(s.volume.clone());
                            tracing::warn!(volume = %s.volume, ?timeout, "health: a check hangs; abandoned, the pass goes on");
                        }
                        drop(hung);
                        if let Some(slot) = lock(&slots).get_mut(at) {
                            *slot = Some(Checked::TimedOut);
                        }
                        if let Some(m) = &self.parts.metrics {
                            m.timeouts.inc();
                        }
                        from = at + 1;
                        break;
                    }
                }
            }
        }
        let slots = std::mem::take(&mut *lock(&slots));
        // a prober abandoned in a hung call still holds `work`
        let work = Arc::try_unwrap(work).unwrap_or_else(|w| (*w).clone());
        // zipped as applied, not collected: a third vector as long as the
        // pass would be the largest thing it holds
        work.into_iter().zip(slots)
    }

    /// Applies the results (every subject of the pass; `None`: its check
    /// did not run): conditions, events, gauges. A record is updated in
    /// place and stamped with the pass; those left unstamped are no longer
    /// mounted and forgotten, but hung ones keep what they had.
    fn apply(
        &self,
        hung: &HashSet<UniqueVolumeName>,
        results: impl Iterator<Item = (Subject, Option<Checked>)>,
    ) {
        let now = SystemTime::now();
        let mut events = Vec::new();
        let mut store = lock(&self.shared.store);
        let this_pass = store.passes + 1;
        let mut added = false;
        let mut last = None;
        for (subject, checked) in results {
            let Some(checked) = checked else {
                if let Some(r) = store.volumes.get_mut(&subject.volume) {
                    r.pass = this_pass;
                }
                continue;
            };
            let (mut condition, mut usage) = store
                .volumes
                .get_mut(&subject.volume)
                .map(|r| (r.condition.take(), r.usage()))
                .unwrap_or((None, None));
            let judged = match checked {
                Checked::Native(findings, u) => {
                    usage = u;
                    Some(native_condition(findings, now))
                }
                Checked::Csi(CsiChecked::Answered(u, c)) => {
                    usage = u;
                    c.map(|(abnormal, message)| csi_condition(abnormal, message, now))
                }
                Checked::Csi(CsiChecked::NotAsked) => {
                    usage = None;
                    None
                }
                Checked::Csi(CsiChecked::Failed(why, timed_out)) => {
                    tracing::warn!(volume = %subject.volume, "health: {why}; the last condition stays");
                    if let Some(m) = &self.parts.metrics {
                        m.error("csi");
                        if timed_out {
                            m.timeouts.inc();
                        }
                    }
                    None
                }
                Checked::TimedOut => None,
            };
            if let Some(mut new) = judged {
                let before = condition.as_ref().map(|c| (c.abnormal, c.reason));
                let t = transition(before, (new.abnormal, new.reason));
                match (&condition, t) {
                    (Some(old), Transition::None) if old.abnormal == new.abnormal => {
                        new.since = old.since;
                    }
                    _ => {}
                }
                if t != Transition::None {
                    events.extend(pod_events(&subject.pods, &new, t, now));
                }
                condition = Some(share(condition, new, &mut last));
            }
            added |= store.put(
                subject,
                Judged {
                    condition,
                    usage,
                    checked: now,
                    pass: this_pass,
                },
            );
        }
        let gone = store.end_pass(this_pass, hung, added);
        if let Some(m) = &self.parts.metrics {
            for r in &gone {
                if let Some(c) = &r.claim {
                    m.forget(&c.namespace, &c.name);
                }
            }
            for r in store.volumes.values() {
                let Some(c) = &r.claim else {
                    continue;
                };
                let f = r.usage().map_or([None; 6], |u| {
                    [
                        Some(u.capacity_bytes),
                        Some(u.available_bytes),
                        Some(u.used_bytes),
                        u.inodes,
                        u.inodes_free,
                        u.inodes_used,
                    ]
                });
                m.set(
                    &c.namespace,
                    &c.name,
                    &f,
                    r.condition.as_ref().map(|c| c.abnormal),
                );
            }
        }
        drop(store);
        for e in events {
            self.parts.sink.emit(e);
        }
    }
}

fn ns(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// What a prober needs.
struct ProbeCtx {
    sys: Arc<dyn Sys>,
    drivers: Option<Arc<Drivers>>,
    gate: bool,
    timeout: Duration,
    shared: Arc<Shared>,
    baselines: Arc<Baselines>,
    /// the mount table is as the last pass saw it (see `TableGate`)
    unchanged: bool,
}

impl ProbeCtx {
    fn check(&self, s: &Subject) -> Checked {
        if s.plugin == PluginName::Csi {
            return Checked::Csi(match &self.drivers {
                Some(d) => csi::check(d, s, self.gate, self.timeout),
                None => CsiChecked::NotAsked,
            });
        }
        let (f, u) = probe::check(self.sys.as_ref(), s, &self.baselines, self.unchanged);
        Checked::Native(f, u)
    }

    fn probe_from(
        &self,
        work: &[Subject],
        from: usize,
        slots: &Mutex<Vec<Option<Checked>>>,
        p: &Progress,
        started: Instant,
        done: &Sender<()>,
    ) {
        for (i, s) in work.iter().enumerate().skip(from) {
            if self.shared.stopping.load(Ordering::Acquire) {
                break;
            }
            let r = self.check(s);
            {
                let mut hung = lock(&self.shared.hung);
                if p.abandoned.load(Ordering::Acquire) {
                    // the monitor gave up on this check and marked it
                    hung.remove(&s.volume);
                    return;
                }
                p.since_ns.store(ns(started), Ordering::Release);
                p.at.store(i + 1, Ordering::Release);
            }
            if let Some(slot) = lock(slots).get_mut(i) {
                *slot = Some(r);
            }
        }
        let _ = done.send(());
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::health::{PodTarget, RecentEvents};
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::{FileKind, MsFlags};
    use crate::model::{PodUid, StorageMedium, TargetKind, VolumeSpec};

    fn tmpfs(sys: &RecordingSys, name: &str) -> Subject {
        let path = format!("/k/pods/{name}/volumes/kubernetes.io~empty-dir/cache");
        sys.add(&path, FileKind::Dir);
        sys.preset_mount(
            None,
            Path::new(&path),
            Some("tmpfs"),
            MsFlags::empty(),
            None,
        )
        .unwrap();
        Subject {
            volume: UniqueVolumeName::from_raw(format!("kubernetes.io/empty-dir/{name}-cache")),
            plugin: PluginName::EmptyDir,
            spec: Some(Arc::new(VolumeSpec::EmptyDir {
                medium: StorageMedium::Memory,
                size_limit: None,
            })),
            device: None,
            pods: vec![PodTarget {
                uid: PodUid::new(name).unwrap(),
                outer_name: "cache".into(),
                path: path.into(),
                kind: TargetKind::Mount,
                pod: None,
                read_only: false,
            }],
            claim: None,
        }
    }

    /// The `statfs` calls on `s`'s target that got past their stall.
    fn statfs_calls(sys: &RecordingSys, s: &Subject) -> usize {
        let path: &Path = &s.pods[0].path;
        sys.calls()
            .iter()
            .filter(|c| matches!(c, SysCall::Statfs { path: p } if p == path))
            .count()
    }

    /// The calls on `s`'s target that got past their stall.
    fn calls_on(sys: &RecordingSys, s: &Subject) -> usize {
        let path: &Path = &s.pods[0].path;
        sys.calls()
            .iter()
            .filter(|c| match c {
                SysCall::Statfs { path: p } | SysCall::MountProbe { path: p } => p == path,
                _ => false,
            })
            .count()
    }

    /// A check stuck in a call (here one that takes 4 s) is given up
    /// at the per-check timeout: the pass goes on to the volumes after it
    /// and ends long before the call returns, the timeout is counted, and
    /// the next pass leaves the stuck volume out instead of adding a second
    /// stuck thread; once the call returns, the volume is checked again.
    /// The daemon's monitor probes nothing until asked (the node ready),
    /// then passes as usual.
    #[test]
    fn a_monitor_started_when_asked_probes_nothing_until_asked() {
        let sys = Arc::new(RecordingSys::new());
        let subject = tmpfs(&sys, "a");
        let listed = vec![subject.clone()];
        let monitor = Monitor::start_when_asked(MonitorParts {
            config: HealthConfig {
                period: Duration::from_millis(20),
                ..HealthConfig::default()
            },
            sys: sys.clone(),
            drivers: None,
            subjects: Box::new(move || listed.clone()),
            sink: Arc::new(RecentEvents::default()),
            metrics: None,
        })
        .unwrap();
        // ten periods: a monitor that started at once would have passed
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(statfs_calls(&sys, &subject), 0, "{:?}", sys.calls());
        assert!(monitor.read(|s| !s.volumes.contains_key(&subject.volume)));
        monitor.ask();
        let t0 = Instant::now();
        while statfs_calls(&sys, &subject) == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(statfs_calls(&sys, &subject) > 0, "asked: a pass ran");
        monitor.stop();
    }

    /// A monitor whose passes run only when asked (an hour's period) over
    /// `subjects`, each check bounded by `timeout`.
    fn on_demand(
        sys: &Arc<RecordingSys>,
        subjects: &[Subject],
        timeout: Duration,
        metrics: Option<HealthMetrics>,
    ) -> Monitor {
        let listed = subjects.to_vec();
        Monitor::start(MonitorParts {
            config: HealthConfig {
                period: Duration::from_secs(3600),
                timeout,
                csi_condition: true,
            },
            sys: sys.clone(),
            drivers: None,
            subjects: Box::new(move || listed.clone()),
            sink: Arc::new(RecentEvents::default()),
            metrics,
        })
        .unwrap()
    }

    #[test]
    fn a_hung_check_is_abandoned_at_its_timeout_and_skipped_while_it_hangs() {
        let sys = Arc::new(RecordingSys::new());
        let subjects = vec![tmpfs(&sys, "a"), tmpfs(&sys, "b"), tmpfs(&sys, "c")];
        let stuck = subjects[1].clone();
        sys.stall(&stuck.pods[0].path, Duration::from_secs(4));
        let metrics = crate::metrics::Metrics::new().unwrap().health.clone();
        // far above a fake call, even on a loaded machine
        let timeout = Duration::from_millis(500);
        let monitor = on_demand(&sys, &subjects, timeout, Some(metrics.clone()));
        let t0 = Instant::now();
        assert!(monitor.check_now(Duration::from_secs(10)));
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert_eq!(metrics.timeouts.get(), 1);
        let judged = |name: &UniqueVolumeName| {
            monitor.read(|s| s.volumes.get(name).is_some_and(|r| r.condition.is_some()))
        };
        assert!(judged(&subjects[0].volume) && judged(&subjects[2].volume));
        assert!(
            !judged(&stuck.volume),
            "no condition from a check that hung"
        );

        let before = statfs_calls(&sys, &subjects[2]);
        assert!(monitor.check_now(Duration::from_secs(10)));
        assert_eq!(calls_on(&sys, &stuck), 0, "still in its first call");
        assert!(
            statfs_calls(&sys, &subjects[2]) > before,
            "the others checked"
        );
        assert_eq!(metrics.timeouts.get(), 1, "left out, not timed out again");

        std::thread::sleep(Duration::from_secs(4).saturating_sub(t0.elapsed()));
        let returned = Instant::now();
        loop {
            assert!(monitor.check_now(Duration::from_secs(10)));
            // the abandoned prober's statfs, then a pass's own
            if statfs_calls(&sys, &stuck) == 2 {
                break;
            }
            assert!(
                returned.elapsed() < Duration::from_secs(10),
                "never checked again"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        monitor.stop();
    }

    /// A stop during a pass waits for the check in progress, not for the
    /// rest of the pass: here 40 checks of 100 ms each, stopped after
    /// about three.
    #[test]
    fn a_stop_ends_a_pass_after_the_check_in_progress() {
        let sys = Arc::new(RecordingSys::new());
        let subjects: Vec<Subject> = (0..40).map(|i| tmpfs(&sys, &format!("p{i}"))).collect();
        for s in &subjects {
            sys.stall(&s.pods[0].path, Duration::from_millis(100));
        }
        let monitor = on_demand(&sys, &subjects, Duration::from_secs(30), None);
        std::thread::sleep(Duration::from_millis(300));
        let asked = Instant::now();
        monitor.stop();
        let took = asked.elapsed();
        let checked = subjects.iter().filter(|s| calls_on(&sys, s) > 0).count();
        assert!(
            took < Duration::from_secs(2),
            "the stop waited {took:?}: a whole pass takes 4 s"
        );
        assert!(
            (1..subjects.len()).contains(&checked),
            "{checked} of {} volumes checked",
            subjects.len()
        );
    }
}
