//! Table tests of the loop's core: events and times in, effects out; no
//! kernel, no thread, no journal.

use super::*;
use crate::model::PluginName;
use crate::model::{PodVolume, StorageMedium, VolumeSpec};
use crate::reconciler::admit::holders_first;
use crate::reconciler::jobs::AswUpdate;
use crate::reconciler::jobs::Job;
use crate::sources::SourceEvent;
use crate::state::ActualStateOfWorld;
use crate::state::{PodMount, SeLinuxState};

fn ms(t0: Instant, n: u64) -> Instant {
    t0 + Duration::from_millis(n)
}

fn uid(s: &str) -> PodUid {
    PodUid::new(s).unwrap()
}

/// A pod with one memory emptyDir (the loop tests use it too).
pub(crate) fn pod(u: &str) -> DesiredPod {
    let spec = VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: None,
    };
    DesiredPod {
        uid: uid(u),
        namespace: "default".into(),
        name: u.into(),
        file: format!("/pods/{u}.yaml").into(),
        volumes: vec![PodVolume {
            volume: PodVolume::unique_name(&spec, &uid(u), "cache"),
            spec_name: "cache".into(),
            outer_name: "cache".into(),
            spec: spec.into(),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        }],
        unresolved: Default::default(),
        errors: vec![],
        selinux: Default::default(),
        claims: Default::default(),
        containers: Vec::new(),
    }
}

/// Pod `u` with one volume of `spec` named `name`.
fn pod_with(u: &str, spec: VolumeSpec, name: &str) -> DesiredPod {
    let mut p = pod(u);
    p.volumes[0].volume = PodVolume::unique_name(&spec, &uid(u), name);
    p.volumes[0].spec = spec.into();
    p
}

fn core(checkpoint_every: u64) -> (Core, World) {
    let cfg = CoreConfig {
        layout: Layout::new("/r"),
        journal: true,
        resync: Duration::from_secs(30),
        checkpoint_every,
        selinux: Policy::disabled(),
        late_window: Duration::from_secs(10),
        republish_every: Duration::from_secs(60),
    };
    (Core::new(cfg, Vec::new(), 0), World::default())
}

fn added(pods: &[&str], ready: bool) -> Event {
    let mut evs: Vec<SourceEvent> = pods.iter().map(|p| SourceEvent::PodAdded(pod(p))).collect();
    if ready {
        evs.push(SourceEvent::SourcesReady);
    }
    Event::Sources(evs)
}

fn walked() -> Event {
    Event::Leftovers(Box::default(), Vec::new())
}

/// The effects, one word each: `mount:<pod>`, `teardown:<pod>`, `flush`,
/// `checkpoint`, `repack`, `forget`, `sweep`, `trim`.
fn names(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        // the counts a step makes are read by `counted`
        .filter(|e| !matches!(e, Effect::Count(_)))
        .map(|e| match e {
            Effect::Start {
                job: Job::Mount { want, .. },
                ..
            } => format!("mount:{}", want.pod),
            Effect::Start { job, .. } => format!("start:{:?}", job.key()),
            Effect::StartTearDown {
                action: Action::TearDown { pod, .. },
                ..
            } => format!("teardown:{pod}"),
            Effect::StartTearDown { .. } => "unmount-device".into(),
            Effect::Journal(JournalWork::Flush) => "flush".into(),
            Effect::Journal(JournalWork::Recover) => "recover".into(),
            Effect::JournalWritable(w) => format!("journal-writable:{w}"),
            Effect::Journal(JournalWork::Checkpoint) => "checkpoint".into(),
            Effect::Journal(JournalWork::Repack) => "repack".into(),
            Effect::Journal(JournalWork::ForgetVolume { .. }) => "forget".into(),
            Effect::Journal(JournalWork::ForgetTarget { .. }) => "forget-target".into(),
            Effect::Journal(JournalWork::ForgetNotMounted { targets, .. }) => {
                format!("forget-not-mounted:{}", targets.len())
            }
            Effect::Host(HostWork::Sweep { .. }) => "sweep".into(),
            Effect::Host(HostWork::Trim) => "trim".into(),
            Effect::Host(HostWork::CheckLate { paths }) => format!("check-late:{}", paths.len()),
            Effect::PodEvent(e) => format!("event:{}:{}", e.reason, e.pod),
            Effect::ReportInUse => "report-in-use".into(),
            Effect::RepackWorld => "repack-world".into(),
            Effect::Count(_) => unreachable!("filtered out above"),
        })
        .collect()
}

/// The counts among `effects`, in order.
fn counted(effects: &[Effect]) -> Vec<Counted> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Count(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

/// The report of a mount job that succeeded.
fn mounted(effects: &[Effect], pod: &str) -> Event {
    let want = effects
        .iter()
        .find_map(|e| match e {
            Effect::Start {
                job: Job::Mount { want, .. },
                ..
            } if want.pod.as_str() == pod => Some(want.clone()),
            _ => None,
        })
        .expect("a mount of that pod was started");
    Event::JobDone(JobReport {
        key: OpKey::for_mount(&want.volume, &want.pod, &want.spec),
        updates: vec![AswUpdate::PodMounted {
            volume: want.volume.clone(),
            plugin: want.plugin,
            spec_name: want.spec_name.clone(),
            spec: Some(want.spec.clone()),
            pod: want.pod.clone(),
            mount: PodMount {
                outer_name: want.outer_name.clone(),
                mount_path: format!("/r/pods/{pod}/volumes/x/cache").into(),
                kind: crate::model::TargetKind::Mount,
                selinux: SeLinuxState::Unknown,
            },
        }],
        error: None,
        ran: vec![Operation::SetUp],
        forced: false,
        late: None,
    })
}

/// The job of the TearDown `effects` start, with the fallback the ASW
/// gives it.
fn teardown_job(effects: &[Effect]) -> &Job {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::StartTearDown {
                fallback: Some(job),
                ..
            } => Some(job),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a TearDown with a fallback job: {:?}", names(effects)))
}

/// `job`'s TearDown done: `pod` removed from its volume in the ASW.
fn torn_down(job: &Job, pod: &str) -> Event {
    torn_down_by(job, pod, Operation::TearDown)
}

/// The report of `job` undoing `pod`'s target with `op` (a TearDown, or a
/// raw block map's `UnmapPodDevice`).
fn torn_down_by(job: &Job, pod: &str, op: Operation) -> Event {
    Event::JobDone(JobReport {
        key: job.key(),
        updates: vec![AswUpdate::PodRemoved {
            volume: job.key().volume.clone(),
            pod: uid(pod),
        }],
        error: None,
        ran: vec![op],
        forced: false,
        late: None,
    })
}

fn idle() -> Observed {
    Observed::default()
}

#[test]
fn the_phase_follows_sources_and_the_walk_and_readiness_waits_only_for_sources() {
    // (what, events in order) -> (phase, ready) after the last
    let cases: Vec<(&str, Vec<Event>, Phase, bool)> = vec![
        (
            "nothing yet",
            vec![],
            Phase::Listing { walked: false },
            false,
        ),
        (
            "a pod listed, not every source",
            vec![added(&["a"], false)],
            Phase::Listing { walked: false },
            false,
        ),
        (
            "walk first",
            vec![walked()],
            Phase::Listing { walked: true },
            false,
        ),
        (
            "every source listed, the walk still runs: ready",
            vec![added(&["a"], true)],
            Phase::Populated,
            true,
        ),
        (
            "listed, then walked",
            vec![added(&[], true), walked()],
            Phase::Settled,
            true,
        ),
        (
            "walked, then listed",
            vec![walked(), added(&[], true)],
            Phase::Settled,
            true,
        ),
        (
            "stop while listing",
            vec![Event::Stop],
            Phase::Stopping,
            false,
        ),
        (
            "stop once ready keeps readiness for the last requests",
            vec![added(&[], true), Event::Stop],
            Phase::Stopping,
            true,
        ),
    ];
    let t0 = Instant::now();
    for (what, events, phase, ready) in cases {
        let (mut c, mut w) = core(0);
        for (i, ev) in events.into_iter().enumerate() {
            c.step(&mut w, vec![ev], ms(t0, i as u64), idle());
        }
        assert_eq!((c.phase(), w.ready), (phase, ready), "{what}");
    }
}

#[test]
fn mounts_start_while_listing_and_a_succeeded_job_behind_a_queue_plans_nothing() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a", "b"], false)], t0, idle());
    assert_eq!(names(&first), ["mount:a", "mount:b"]);
    // a finished while b still waits for a worker: no pass, no flush yet
    let queued = Observed {
        queued_jobs: 1,
        ..idle()
    };
    let c_added = c.step(
        &mut w,
        vec![mounted(&first, "a"), added(&["c"], false)],
        ms(t0, 1),
        queued,
    );
    assert_eq!(names(&c_added), ["mount:c"], "a source change still plans");
    let quiet = c.step(&mut w, vec![mounted(&first, "b")], ms(t0, 2), queued);
    assert!(names(&quiet).is_empty(), "{:?}", names(&quiet));
}

/// A mass start goes in slices of `pass_budget`: a pass while the queue
/// holds jobs (a source change, a failure) starts another slice, and the
/// step that sees the queue drained starts the rest.
#[test]
fn a_mass_start_starts_its_mounts_in_slices_as_the_queue_drains() {
    use crate::reconciler::pending::STARTS_FLOOR;
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let uids: Vec<String> = (0..STARTS_FLOOR * 2 + 10)
        .map(|i| format!("p{i:05}"))
        .collect();
    let all: Vec<&str> = uids.iter().map(String::as_str).collect();
    let mounts = |e: &[Effect]| -> Vec<String> {
        names(e)
            .into_iter()
            .filter(|n| n.starts_with("mount:"))
            .collect()
    };
    let slice = |r: std::ops::Range<usize>| -> Vec<String> {
        all[r].iter().map(|p| format!("mount:{p}")).collect()
    };
    let queued = |n| Observed {
        queued_jobs: n,
        ..idle()
    };
    let first = c.step(&mut w, vec![added(&all, true)], t0, idle());
    assert_eq!(mounts(&first), slice(0..STARTS_FLOOR), "one slice");
    let mut done: Vec<Event> = all[..STARTS_FLOOR]
        .iter()
        .map(|p| mounted(&first, p))
        .collect();
    let last = done.pop().expect("a slice");
    let behind = c.step(&mut w, done, ms(t0, 1), queued(1));
    assert!(
        mounts(&behind).is_empty(),
        "no pass while the queue holds jobs"
    );
    let resync = c.step(&mut w, vec![], ms(t0, 2), queued(1));
    assert_eq!(
        mounts(&resync),
        slice(STARTS_FLOOR..STARTS_FLOOR * 2),
        "a pass while queued starts the next slice"
    );
    let drained = c.step(&mut w, vec![last], ms(t0, 3), queued(0));
    assert_eq!(
        mounts(&drained),
        slice(STARTS_FLOOR * 2..all.len()),
        "the rest, once drained"
    );
}

/// A pod with one CSI PV whose driver requires attaching.
fn attachable_pod(u: &str) -> DesiredPod {
    let spec = VolumeSpec::Csi(Box::new(crate::model::CsiSpec {
        driver: "d.example.com".into(),
        volume_handle: "h".into(),
        attachment: Some(("csi-1".into(), Default::default())),
        ..Default::default()
    }));
    pod_with(u, spec, "pv1")
}

/// With an API server, an attachable volume's mount waits for
/// `volumesInUse`: the publisher is woken once (not per pass), and the
/// report that lists it starts the mount.
#[test]
fn an_attachable_mount_asks_for_an_in_use_report_once_and_starts_on_it() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    w.dsw.set_in_use_gate(true);
    let add = Event::Sources(vec![SourceEvent::PodAdded(attachable_pod("a"))]);
    let first = c.step(&mut w, vec![add], t0, idle());
    assert_eq!(names(&first), ["report-in-use"]);
    let errors: Vec<_> = w.dsw.errors_of_pod(&uid("a")).collect();
    assert!(
        errors.iter().any(|e| e.contains("volumesInUse")),
        "{errors:?}"
    );
    let again = c.step(&mut w, vec![added(&["b"], false)], ms(t0, 1), idle());
    assert_eq!(names(&again), ["mount:b"], "asked once");
    let volume = attachable_pod("a").volumes[0].volume.clone();
    let other = UniqueVolumeName::from_raw("kubernetes.io/csi/other^x");
    let unrelated = c.step(
        &mut w,
        vec![Event::ReportedInUse(vec![other])],
        ms(t0, 2),
        idle(),
    );
    assert!(names(&unrelated).is_empty(), "{:?}", names(&unrelated));
    let reported = c.step(
        &mut w,
        vec![Event::ReportedInUse(vec![volume])],
        ms(t0, 3),
        idle(),
    );
    assert_eq!(names(&reported), ["mount:a"]);
}

#[test]
fn outcomes_are_flushed_when_idle_or_within_the_bound_and_one_flush_at_a_time() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a", "b"], true)], t0, idle());
    let wait = u64::try_from(FLUSH_WITHIN.as_millis()).unwrap();
    // (what, at, events) -> effects; b keeps running throughout the first rows
    let a_done = c.step(&mut w, vec![mounted(&first, "a")], ms(t0, 10), idle());
    assert!(!names(&a_done).contains(&"flush".into()), "b still runs");
    assert_eq!(c.next_wake(ms(t0, 10)), Duration::from_millis(wait));
    let early = c.step(&mut w, vec![], ms(t0, 10 + wait - 1), idle());
    assert!(!names(&early).contains(&"flush".into()), "within the bound");
    let due = c.step(&mut w, vec![], ms(t0, 10 + wait), idle());
    assert!(names(&due).contains(&"flush".into()), "the bound reached");
    let b_done = c.step(&mut w, vec![mounted(&first, "b")], ms(t0, 300), idle());
    assert!(
        !names(&b_done).contains(&"flush".into()),
        "one flush in flight at a time"
    );
    let next = c.step(
        &mut w,
        vec![Event::Done(Completion::Flushed(Ok(())))],
        ms(t0, 301),
        idle(),
    );
    assert!(
        names(&next).contains(&"flush".into()),
        "idle: at once after it"
    );
    let failed = c.step(
        &mut w,
        vec![Event::Done(Completion::Flushed(Err("eio".into())))],
        ms(t0, 302),
        idle(),
    );
    assert!(names(&failed).is_empty());
    assert_ne!(
        c.phase(),
        Phase::Stopping,
        "a failed flush does not stop the loop: the journal is recovered"
    );
}

/// The journal turns unwritable (a full disk): no pass starts anything,
/// the driver reports it once, a recovery is asked at once and then with
/// a doubling backoff; jobs in flight finish; once a recovery succeeds
/// the pass starts what waited, and the driver reports that too.
#[test]
fn an_unwritable_journal_starts_nothing_and_recovers_with_backoff() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a"], true), walked()], t0, idle());
    assert_eq!(names(&first), vec!["mount:a"]);
    let broken = Observed {
        journal_unwritable: true,
        ..idle()
    };
    // (ms, events, observed) -> effects
    let b = c.step(&mut w, vec![added(&["b"], false)], ms(t0, 1), broken);
    assert_eq!(names(&b), vec!["journal-writable:false", "recover"]);
    assert!(c.journal_unwritable());
    // a's mount was in flight: it finishes and is applied, no flush asked
    let a = c.step(&mut w, vec![mounted(&first, "a")], ms(t0, 2), broken);
    assert!(
        !names(&a)
            .iter()
            .any(|n| n.starts_with("mount") || n == "flush"),
        "{:?}",
        names(&a)
    );
    assert_eq!(w.asw.volume_count(), 1);
    // nothing more until the recovery ends; it fails: the next in 500 ms,
    // then 1 s
    let failed = Event::Done(Completion::Recovered(Err("ENOSPC".into())));
    assert!(c.step(&mut w, vec![failed], ms(t0, 3), broken).is_empty());
    assert_eq!(c.next_wake(ms(t0, 3)), RECOVER_FIRST);
    assert!(c.step(&mut w, vec![], ms(t0, 502), broken).is_empty());
    assert_eq!(
        names(&c.step(&mut w, vec![], ms(t0, 503), broken)),
        vec!["recover"]
    );
    let failed = Event::Done(Completion::Recovered(Err("ENOSPC".into())));
    c.step(&mut w, vec![failed], ms(t0, 504), broken);
    assert_eq!(c.next_wake(ms(t0, 504)), RECOVER_FIRST * 2);
    // the disk has room again: the recovery succeeds, b is mounted
    c.step(&mut w, vec![], ms(t0, 1504), broken);
    // (the orphan sweep a's end asked for is over too: none runs beside a job)
    let swept = Event::Done(Completion::Swept(Swept::default()));
    let ok = Event::Done(Completion::Recovered(Ok(true)));
    let after = c.step(&mut w, vec![swept, ok], ms(t0, 1505), idle());
    assert_eq!(names(&after), vec!["journal-writable:true", "mount:b"]);
    assert!(!c.journal_unwritable());
}

/// The backoff between recoveries doubles up to its ceiling.
#[test]
fn recoveries_back_off_to_the_ceiling() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
    let broken = Observed {
        journal_unwritable: true,
        ..idle()
    };
    let mut now = t0;
    let mut waits = Vec::new();
    for _ in 0..10 {
        let asked = c.step(&mut w, vec![], now, broken);
        assert!(
            names(&asked).contains(&"recover".into()),
            "{:?}",
            names(&asked)
        );
        let failed = Event::Done(Completion::Recovered(Err("EROFS".into())));
        c.step(&mut w, vec![failed], now, broken);
        let wait = c.next_wake(now);
        waits.push(wait.as_millis());
        now += wait;
    }
    assert_eq!(&waits[..4], &[500, 1000, 2000, 4000]);
    assert!(waits.iter().all(|w| *w <= RECOVER_MAX.as_millis()));
    assert_eq!(*waits.last().unwrap(), RECOVER_MAX.as_millis());
}

#[test]
fn trims_wait_for_idle_and_come_at_most_once_a_second() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a", "b"], false)], t0, idle());
    let a = c.step(&mut w, vec![mounted(&first, "a")], ms(t0, 1), idle());
    assert!(!names(&a).contains(&"trim".into()), "b still runs");
    let b = c.step(&mut w, vec![mounted(&first, "b")], ms(t0, 2), idle());
    assert!(names(&b).contains(&"trim".into()), "idle: trimmed");
    c.step(
        &mut w,
        vec![Event::Done(Completion::Trimmed)],
        ms(t0, 3),
        idle(),
    );
    let again = c.step(&mut w, vec![added(&["c"], false)], ms(t0, 4), idle());
    let again = c.step(&mut w, vec![mounted(&again, "c")], ms(t0, 5), idle());
    assert!(!names(&again).contains(&"trim".into()), "rate limited");
    let wake = c.next_wake(ms(t0, 5));
    assert!(wake <= TRIM_EVERY && wake > Duration::ZERO, "{wake:?}");
    let later = c.step(&mut w, vec![], ms(t0, 2 + 1000), idle());
    assert!(names(&later).contains(&"trim".into()));
    let (mut quiet, mut w) = core(0);
    for i in 0..3 {
        let e = quiet.step(&mut w, vec![], ms(t0, i * 5000), idle());
        assert!(names(&e).is_empty(), "an idle daemon never trims");
    }
}

#[test]
fn a_start_that_mounts_nothing_still_trims_once_settled_and_after_a_sweep() {
    // a restart's merge and listings are freed though no job ever ends
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let settled = c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
    assert_eq!(c.phase(), Phase::Settled);
    assert_eq!(names(&settled), ["sweep", "trim"]);
    let done = vec![
        Event::Done(Completion::Trimmed),
        Event::Done(Completion::Swept(Swept::default())),
    ];
    let after = c.step(&mut w, done, ms(t0, 1), idle());
    assert!(
        names(&after).is_empty(),
        "rate limited: {:?}",
        names(&after)
    );
    let later = c.step(&mut w, vec![], ms(t0, 1001), idle());
    assert_eq!(names(&later), ["trim"], "the sweep's set was freed");
}

#[test]
fn sweeps_start_once_settled_never_beside_a_job_and_hold_passes_back() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a"], true)], t0, idle());
    assert_eq!(
        names(&first),
        ["mount:a"],
        "populated, not walked: no sweep"
    );
    let walked_now = c.step(&mut w, vec![walked()], ms(t0, 1), idle());
    assert!(!names(&walked_now).contains(&"sweep".into()), "a job runs");
    let swept = c.step(&mut w, vec![mounted(&first, "a")], ms(t0, 2), idle());
    assert!(
        names(&swept).contains(&"sweep".into()),
        "{:?}",
        names(&swept)
    );
    // while it runs, a new pod is applied but not started
    let held = c.step(&mut w, vec![added(&["b"], false)], ms(t0, 3), idle());
    assert!(!names(&held).iter().any(|n| n.starts_with("mount")));
    assert!(w.dsw.volumes().any(|(_, v)| v.pods.contains_key(&uid("b"))));
    let after = c.step(
        &mut w,
        vec![Event::Done(Completion::Swept(Swept::default()))],
        ms(t0, 4),
        idle(),
    );
    assert_eq!(names(&after), ["mount:b"], "the pass held back");
    assert_eq!(
        c.timers.sweep_at,
        Some(ms(t0, 4) + SWEEP_IDLE),
        "from its end"
    );
    // a teardown asks for one at the rate limit
    c.sweep_wanted(ms(t0, 5));
    assert_eq!(c.timers.sweep_at, Some(ms(t0, 2) + SWEEP_EVERY));
}

#[test]
fn a_forgotten_volume_stays_busy_until_its_records_are_durable() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a"], true), walked()], t0, idle());
    let sweep = c.step(&mut w, vec![mounted(&first, "a")], ms(t0, 1), idle());
    assert_eq!(names(&sweep), ["flush", "sweep", "trim"]);
    let gone = Event::Sources(vec![SourceEvent::PodRemoved(uid("a"))]);
    let swept = Event::Done(Completion::Swept(Swept::default()));
    let down = c.step(&mut w, vec![gone, swept], ms(t0, 2), idle());
    assert!(names(&down).contains(&"teardown:a".into()));
    let job = teardown_job(&down);
    let torn = torn_down(job, "a");
    let forget = c.step(&mut w, vec![torn], ms(t0, 3), idle());
    assert!(
        names(&forget).contains(&"forget".into()),
        "{:?}",
        names(&forget)
    );
    assert_eq!(
        w.asw.volumes().count(),
        0,
        "the ASW forgets in memory at once"
    );
    assert_eq!(
        c.pending.running(),
        1,
        "the volume is busy until the write is done"
    );
    let Some(Effect::Journal(JournalWork::ForgetVolume { key, .. })) = forget
        .iter()
        .find(|e| matches!(e, Effect::Journal(JournalWork::ForgetVolume { .. })))
    else {
        unreachable!()
    };
    c.step(&mut w, vec![Event::Stop], ms(t0, 4), idle());
    assert!(!c.finished(), "the stop waits for the forget");
    let done = Completion::Forgotten {
        key: Some(key.clone()),
        ok: true,
    };
    let rest = [
        done,
        Completion::Flushed(Ok(())),
        Completion::Trimmed,
        Completion::Swept(Swept::default()),
    ];
    c.step(&mut w, rest.map(Event::Done).into(), ms(t0, 5), idle());
    assert!(c.finished(), "{:?}", c.in_flight);
}

#[test]
fn a_checkpoint_follows_every_n_durable_records_one_at_a_time() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(10);
    let at = |synced_through| Observed {
        synced_through,
        ..idle()
    };
    // (synced through, completion before) -> checkpoint?
    let rows: Vec<(u64, Option<Completion>, bool)> = vec![
        (9, None, false),
        (10, None, true),
        (25, None, false),
        (25, Some(Completion::Checkpointed(Ok(25))), false),
        (34, None, false),
        (35, None, true),
        (50, Some(Completion::Checkpointed(Err("eio".into()))), true),
    ];
    for (i, (synced, done, want)) in rows.into_iter().enumerate() {
        let evs = done.map(Event::Done).into_iter().collect();
        let e = c.step(&mut w, evs, ms(t0, i as u64), at(synced));
        assert_eq!(names(&e).contains(&"checkpoint".into()), want, "row {i}");
    }
}

#[test]
fn a_long_tail_at_start_is_folded_into_a_checkpoint_once_settled_and_idle() {
    let t0 = Instant::now();
    let checkpoints = |every: u64, tail: u64| {
        let (c, mut w) = core(every);
        let mut c = c.with_tail(tail);
        let mut seen = Vec::new();
        // listing with a pod to mount; listed and walked (settled) while
        // it mounts; its mount done (idle); then a quiet pass
        let first = c.step(&mut w, vec![added(&["a"], false)], t0, idle());
        let steps = vec![
            vec![added(&[], true), walked()],
            vec![mounted(&first, "a")],
            vec![Event::Done(Completion::Checkpointed(Ok(1)))],
            vec![],
        ];
        for (i, evs) in steps.into_iter().enumerate() {
            let e = c.step(&mut w, evs, ms(t0, 1 + i as u64), idle());
            seen.push(names(&e).contains(&"checkpoint".into()));
        }
        seen
    };
    // `Journal::long_tail` decides which tail is worth folding (it hands
    // over that tail or 0): the core folds whatever it is given
    let long = crate::journal::LONG_TAIL_FROM;
    // (checkpoint_every, tail) -> a checkpoint at each step after the first
    let rows = [
        (10_000, long, [false, true, false, false]),
        (10_000, 1, [false, true, false, false]),
        (10_000, 0, [false; 4]),
        (0, long, [false; 4]),
    ];
    for (every, tail, want) in rows {
        assert_eq!(checkpoints(every, tail), want, "every {every}, tail {tail}");
    }

    // idle from the start: the fold still waits for the start to settle
    let (c, mut w) = core(10_000);
    let mut c = c.with_tail(long);
    let steps = [added(&[], false), added(&[], true), walked()];
    let seen: Vec<bool> = (0..)
        .zip(steps)
        .map(|(i, ev)| {
            let e = c.step(&mut w, vec![ev], ms(t0, i), idle());
            names(&e).contains(&"checkpoint".into())
        })
        .collect();
    assert_eq!(seen, [false, false, true], "listing, listed, walked");
}

#[test]
fn a_burst_is_folded_into_a_checkpoint_once_settled_and_idle() {
    let t0 = Instant::now();
    let long = crate::journal::LONG_TAIL_FROM;
    let (mut c, mut w) = core(10_000);
    let at = |synced_through| Observed {
        synced_through,
        ..idle()
    };
    let mut i = 0;
    let mut step = |c: &mut Core, w: &mut World, evs: Vec<Event>, synced: u64| {
        i += 1;
        let e = c.step(w, evs, ms(t0, i), at(synced));
        (names(&e).contains(&"checkpoint".into()), e)
    };
    // a pod mounting while the sources list; listed and walked with a
    // long tail durable: settled, but its job still runs
    let (_, first) = step(&mut c, &mut w, vec![added(&["a"], false)], 0);
    let (folded, _) = step(&mut c, &mut w, vec![added(&[], true), walked()], long);
    assert!(!folded, "a job running");
    // (synced through, event) -> checkpoint?
    let done = |through| vec![Event::Done(Completion::Checkpointed(Ok(through)))];
    let rows: Vec<(u64, Vec<Event>, bool)> = vec![
        (long, vec![mounted(&first, "a")], true),
        (long + 5, vec![], false),
        (long + 5, done(long), false),
        (2 * long - 1, vec![], false),
        (2 * long, vec![], true),
        (2 * long, done(2 * long), false),
    ];
    for (row, (synced, evs, want)) in rows.into_iter().enumerate() {
        assert_eq!(step(&mut c, &mut w, evs, synced).0, want, "row {row}");
    }
}

#[test]
fn the_stop_ends_the_loop_once_nothing_is_in_flight() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a"], false)], t0, idle());
    let stop = c.step(
        &mut w,
        vec![Event::Stop, added(&["b"], false)],
        ms(t0, 1),
        idle(),
    );
    assert!(stop.is_empty(), "nothing new starts: {:?}", names(&stop));
    assert!(!c.finished(), "a runs");
    assert_eq!(
        c.next_wake(ms(t0, 1)),
        Duration::from_secs(30),
        "no deadline"
    );
    c.step(&mut w, vec![mounted(&first, "a")], ms(t0, 2), idle());
    assert!(c.finished());
}

fn order(events: &[SourceEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            SourceEvent::PodAdded(p) => format!("+{}", p.uid),
            SourceEvent::PodUpdated(p) => format!("~{}", p.uid),
            SourceEvent::PodRemoved(u) => format!("-{u}"),
            SourceEvent::SourcesReady => "ready".into(),
        })
        .collect()
}

/// The pods' entries kept for the reports share their namespace with the
/// pod before them when it is the same (a listing comes grouped by
/// namespace), and a pod that names no claim keeps no claim map.
#[test]
fn pod_entries_share_their_namespace_and_keep_claims_only_when_named() {
    let (mut c, mut w) = core(0);
    let mut other = pod("c");
    other.namespace = "kube-system".into();
    let mut claimed = pod("d");
    claimed.claims.insert("cache".into(), "pvc-1".into());
    let mut evs: Vec<SourceEvent> = ["a", "b"].map(|p| SourceEvent::PodAdded(pod(p))).into();
    evs.extend([other, claimed].map(SourceEvent::PodAdded));
    c.step(&mut w, vec![Event::Sources(evs)], Instant::now(), idle());
    let ns = |u: &str| w.pods[&uid(u)].pod.namespace.clone();
    assert_eq!(
        (ns("a").as_str(), ns("c").as_str()),
        ("default", "kube-system")
    );
    assert!(
        std::ptr::eq(ns("a").as_ptr(), ns("b").as_ptr()),
        "one allocation"
    );
    assert_eq!(ns("d").as_str(), "default");
    assert_eq!(&*w.pods[&uid("a")].pod.name, "a");
    assert!(w.pods[&uid("a")].claims.is_none());
    assert_eq!(
        w.pods[&uid("d")].claim("cache").map(String::as_str),
        Some("pvc-1")
    );
    assert_eq!(w.pods[&uid("a")].claim("cache"), None);
}

#[test]
fn pods_holding_targets_are_applied_before_newcomers() {
    let mut asw = ActualStateOfWorld::new();
    let v = UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1");
    asw.add_volume(v.clone(), PluginName::LocalVolume, "pv1", None, None);
    asw.mark_volume_uncertain(
        &v,
        &uid("b-holder"),
        PodMount {
            outer_name: "data".into(),
            mount_path: "/r/pods/b-holder/v".into(),
            kind: crate::model::TargetKind::Mount,
            selinux: SeLinuxState::Unknown,
        },
    )
    .unwrap();
    let events = vec![
        SourceEvent::PodRemoved(uid("gone")),
        SourceEvent::PodAdded(pod("a-new")),
        SourceEvent::PodAdded(pod("b-holder")),
        SourceEvent::PodUpdated(pod("c-new")),
        SourceEvent::SourcesReady,
    ];
    assert_eq!(
        order(&holders_first(events, &asw)),
        ["-gone", "+b-holder", "+a-new", "~c-new", "ready"]
    );
}

/// A NodeStage that ended uncertain: its staging path watched, as
/// `core::late` describes.
fn stage_gave_up(path: &str) -> Event {
    let volume = UniqueVolumeName::from_raw("kubernetes.io/csi/d^h");
    let params = crate::model::TargetParams::at(
        volume.clone(),
        PluginName::Csi,
        "pv".into(),
        crate::model::TargetRef::Device,
        crate::model::TargetKind::Mount,
        Some(std::path::Path::new(path).into()),
    );
    let uncertain = AswUpdate::DeviceUncertain {
        volume: volume.clone(),
        plugin: PluginName::Csi,
        spec_name: "pv".into(),
        mount: crate::state::DeviceMount {
            device_path: None,
            mount_path: path.into(),
            selinux: None,
        },
    };
    Event::JobDone(JobReport {
        key: OpKey::volume(&volume),
        updates: vec![uncertain.clone()],
        error: Some(crate::reconciler::jobs::JobError::Plugin {
            message: "DeadlineExceeded".into(),
            uncertain: true,
        }),
        ran: vec![Operation::MountDevice],
        forced: false,
        late: Some(Box::new(crate::reconciler::jobs::LateWatch {
            path: std::path::Path::new(path).into(),
            uncertain,
            undo: Job::UnmountDevice {
                params: params.into(),
            },
        })),
    })
}

#[test]
fn a_late_mount_after_the_undo_is_put_back_and_undone_when_no_pod_wants_it() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
    let volume = UniqueVolumeName::from_raw("kubernetes.io/csi/d^h");
    c.step(&mut w, vec![stage_gave_up("/r/g")], ms(t0, 10), idle());
    // the undo the plan started ran and the volume was forgotten
    w.asw.delete_volume(&volume).unwrap();
    c.pending.finish(&OpKey::volume(&volume), true, ms(t0, 20));
    let at = c.next_wake(ms(t0, 20));
    assert!(
        at <= LATE_CHECK_EVERY,
        "a check is due within a second: {at:?}"
    );
    let fx = c.step(&mut w, vec![], ms(t0, 1_010), idle());
    assert!(
        names(&fx).contains(&"check-late:1".to_owned()),
        "{:?}",
        names(&fx)
    );
    // nothing mounted yet: nothing done, still watched
    let fx = c.step(
        &mut w,
        vec![Event::Done(Completion::LateChecked { mounted: vec![] })],
        ms(t0, 1_020),
        idle(),
    );
    assert!(
        !names(&fx).iter().any(|n| n.starts_with("start")),
        "{:?}",
        names(&fx)
    );
    assert!(w.asw.volume(&volume).is_none());
    // the late NodeStage mounted: back in the ASW as uncertain, unstaged
    let fx = c.step(&mut w, vec![], ms(t0, 2_020), idle());
    assert!(
        names(&fx).contains(&"check-late:1".to_owned()),
        "{:?}",
        names(&fx)
    );
    let found = Event::Done(Completion::LateChecked {
        mounted: vec![std::path::Path::new("/r/g").into()],
    });
    let fx = c.step(&mut w, vec![found], ms(t0, 2_030), idle());
    let started: Vec<_> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Start {
                job: Job::UnmountDevice { params },
                ..
            } => Some(params.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 1, "{:?}", names(&fx));
    assert_eq!(
        started[0].device_mount_path(),
        Some(std::path::Path::new("/r/g"))
    );
    let dev = w
        .asw
        .volume(&volume)
        .and_then(|v| v.device.as_ref())
        .expect("device back");
    assert_eq!(dev.state, crate::model::MountState::Uncertain);
    // watched no longer than the window
    let fx = c.step(&mut w, vec![], ms(t0, 11_000), idle());
    assert!(
        !names(&fx).iter().any(|n| n.starts_with("check-late")),
        "{:?}",
        names(&fx)
    );
}

#[test]
fn a_late_mount_a_pod_still_wants_is_put_back_for_the_plan_not_undone() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
    let volume = UniqueVolumeName::from_raw("kubernetes.io/csi/d^h");
    c.step(&mut w, vec![stage_gave_up("/r/g")], ms(t0, 10), idle());
    w.asw.delete_volume(&volume).unwrap();
    c.pending.finish(&OpKey::volume(&volume), true, ms(t0, 20));
    // held by the ASW (the plan's retry staged it): nothing to do
    let held = stage_gave_up("/r/g");
    let Event::JobDone(r) = &held else {
        unreachable!()
    };
    crate::reconciler::jobs::apply_update(&mut w.asw, &r.updates[0]).unwrap();
    let found = || {
        Event::Done(Completion::LateChecked {
            mounted: vec![std::path::Path::new("/r/g").into()],
        })
    };
    c.step(&mut w, vec![], ms(t0, 1_010), idle());
    let fx = c.step(&mut w, vec![found()], ms(t0, 1_020), idle());
    assert!(
        !names(&fx).iter().any(|n| n.starts_with("start")),
        "{:?}",
        names(&fx)
    );
    // a pod wants the volume: put back, and left to the plan (which, for
    // a volume the DSW has, would stage it again — idempotent at the driver)
    w.asw.delete_volume(&volume).unwrap();
    c.step(&mut w, vec![], ms(t0, 2_010), idle());
    let mut wanting = pod("a");
    wanting.volumes[0].volume = volume.clone();
    c.apply_sources(
        &mut w,
        vec![SourceEvent::PodAdded(wanting)],
        &mut Vec::new(),
    );
    assert!(w.dsw.volume(&volume).is_some());
    let fx = c.step(&mut w, vec![found()], ms(t0, 2_020), idle());
    assert!(!fx.iter().any(|e| matches!(
        e,
        Effect::Start {
            job: Job::UnmountDevice { .. },
            ..
        }
    )));
    assert!(w.asw.volume(&volume).is_some(), "put back as uncertain");
}

/// Pod `u` with one inline CSI volume whose driver asks (or not) for
/// republishing.
fn csi_pod(u: &str, republish: bool) -> DesiredPod {
    let spec = VolumeSpec::Csi(Box::new(crate::model::CsiSpec {
        driver: "d.example.com".into(),
        volume_handle: format!("csi-{u}"),
        ephemeral: true,
        republish,
        ..Default::default()
    }));
    pod_with(u, spec, "cache")
}

#[test]
fn requires_republish_volumes_are_set_up_again_each_sync_period_and_only_they() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let pods = vec![
        SourceEvent::PodAdded(csi_pod("a", true)),
        SourceEvent::PodAdded(csi_pod("b", false)),
        SourceEvent::PodAdded(csi_pod("c", true)),
        SourceEvent::SourcesReady,
    ];
    let fx = c.step(&mut w, vec![Event::Sources(pods), walked()], t0, idle());
    assert_eq!(
        names(&fx)
            .iter()
            .filter(|n| n.starts_with("mount:"))
            .count(),
        3
    );
    // a and b mounted; c's mount still runs
    let done = vec![mounted(&fx, "a"), mounted(&fx, "b")];
    let fx = c.step(&mut w, done, ms(t0, 10), idle());
    assert!(
        !names(&fx).iter().any(|n| n.starts_with("mount:")),
        "{:?}",
        names(&fx)
    );
    assert!(c.next_wake(ms(t0, 10)) <= Duration::from_secs(60));
    // not before the period
    let fx = c.step(&mut w, vec![], ms(t0, 30_000), idle());
    assert!(
        !names(&fx).iter().any(|n| n.starts_with("mount:")),
        "{:?}",
        names(&fx)
    );
    // a only: b's driver does not ask, c is busy
    let fx = c.step(&mut w, vec![], ms(t0, 60_000), idle());
    let mounts: Vec<_> = names(&fx)
        .into_iter()
        .filter(|n| n.starts_with("mount:"))
        .collect();
    assert_eq!(mounts, ["mount:a"]);
    let Some(Effect::Start {
        job: Job::Mount { device, .. },
        ..
    }) = fx.iter().find(|e| matches!(e, Effect::Start { .. }))
    else {
        panic!("a Mount job");
    };
    assert!(device.is_none(), "SetUp only: NodePublish, never NodeStage");
    // and again a period later, once it finished
    let again = mounted(&fx, "a");
    c.step(&mut w, vec![again], ms(t0, 60_010), idle());
    let fx = c.step(&mut w, vec![], ms(t0, 120_010), idle());
    assert!(
        names(&fx).contains(&"mount:a".to_owned()),
        "{:?}",
        names(&fx)
    );
}

/// Pod `u` with one configMap volume whose objects make the payload
/// `hash` (`immutable`: every object read is).
fn payload_pod(u: &str, hash: &str, immutable: bool) -> DesiredPod {
    let spec = VolumeSpec::Payload(Box::new(crate::model::PayloadSpec {
        kind: crate::model::PayloadKind::ConfigMap,
        namespace: "ns".into(),
        default_mode: 0o644,
        sources: Vec::new(),
        fs_group: None,
        pod_fields: Default::default(),
        version: Some(std::sync::Arc::new(crate::model::PayloadVersion {
            hash: hash.into(),
            objects: Vec::new(),
        })),
        immutable,
    }));
    pod_with(u, spec, "cache")
}

/// A changed ConfigMap (a new payload hash in the DSW's spec) is written
/// again at the next sync period; an unchanged or immutable one is not.
#[test]
fn a_changed_payload_is_set_up_again_within_a_sync_period() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let pods = vec![
        SourceEvent::PodAdded(payload_pod("a", "h1", false)),
        SourceEvent::PodAdded(payload_pod("b", "h1", true)),
        SourceEvent::SourcesReady,
    ];
    let fx = c.step(&mut w, vec![Event::Sources(pods), walked()], t0, idle());
    let done = vec![mounted(&fx, "a"), mounted(&fx, "b")];
    c.step(&mut w, done, ms(t0, 10), idle());
    // (an orphan sweep in flight holds every job back: let it finish)
    let swept = || Event::Done(Completion::Swept(Swept::default()));
    c.step(&mut w, vec![swept()], ms(t0, 20), idle());
    let fx = c.step(&mut w, vec![], ms(t0, 60_000), idle());
    assert!(
        !names(&fx).iter().any(|n| n.starts_with("mount:")),
        "the payloads written are the ones wanted: {:?}",
        names(&fx)
    );
    c.step(&mut w, vec![swept()], ms(t0, 60_001), idle());
    let changed = vec![
        SourceEvent::PodUpdated(payload_pod("a", "h2", false)),
        SourceEvent::PodUpdated(payload_pod("b", "h2", true)),
    ];
    c.apply_sources(&mut w, changed, &mut Vec::new());
    let fx = c.step(&mut w, vec![], ms(t0, 60_010), idle());
    assert!(
        !names(&fx).iter().any(|n| n.starts_with("mount:")),
        "not before the period: {:?}",
        names(&fx)
    );
    c.step(&mut w, vec![swept()], ms(t0, 60_020), idle());
    let fx = c.step(&mut w, vec![], ms(t0, 120_000), idle());
    let mounts: Vec<_> = names(&fx)
        .into_iter()
        .filter(|n| n.starts_with("mount:"))
        .collect();
    assert_eq!(
        mounts,
        ["mount:a"],
        "b is immutable: read once: {:?}",
        names(&fx)
    );
    let again = mounted(&fx, "a");
    c.step(&mut w, vec![again], ms(t0, 120_010), idle());
    c.step(&mut w, vec![swept()], ms(t0, 120_020), idle());
    let fx = c.step(&mut w, vec![], ms(t0, 180_010), idle());
    assert!(
        !names(&fx).iter().any(|n| n.starts_with("mount:")),
        "written once: {:?}",
        names(&fx)
    );
}

/// A failed operation of a pod's target is an event on the pod with the
/// kubelet's reason: the way in `FailedMount`, the way out `FailedUnMount`.
#[test]
fn a_failed_operation_is_an_event_on_its_pod_with_the_kubelets_reason() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
    let volume = UniqueVolumeName::from_raw("kubernetes.io/empty-dir/p1-data");
    let pod = PodUid::new("p1").unwrap();
    let failed = |op: Operation| {
        Event::JobDone(JobReport {
            key: OpKey {
                volume: volume.clone(),
                pod: Some(pod.clone()),
            },
            updates: vec![],
            error: Some(crate::reconciler::jobs::JobError::Plugin {
                message: "mount: permission denied".into(),
                uncertain: false,
            }),
            ran: vec![op],
            forced: false,
            late: None,
        })
    };
    // (the operation that failed, the event's reason)
    let rows = [
        (Operation::SetUp, "FailedMount"),
        (Operation::MountDevice, "FailedMount"),
        (Operation::TearDown, "FailedUnMount"),
    ];
    for (i, (op, reason)) in rows.into_iter().enumerate() {
        let fx = c.step(
            &mut w,
            vec![failed(op)],
            ms(t0, 10 * (i as u64 + 1)),
            idle(),
        );
        let events: Vec<&Effect> = fx
            .iter()
            .filter(|e| matches!(e, Effect::PodEvent(_)))
            .collect();
        assert_eq!(events.len(), 1, "{op:?}: {:?}", names(&fx));
        let Effect::PodEvent(PodEvent {
            pod: p,
            reason: r,
            message,
            ..
        }) = events[0]
        else {
            unreachable!()
        };
        assert_eq!((p, *r), (&pod, reason), "{op:?}");
        assert!(
            message.contains("permission denied") && message.contains(volume.as_str()),
            "names the volume and the cause: {message}"
        );
    }
}

/// A pod that arrives with errors is told with one event per error, once
/// per change, not once per pass: `FailedAttachVolume` for a volume that
/// waits for its VolumeAttachment, `FailedMount` for the others.
#[test]
fn a_pod_error_from_its_source_is_one_failed_mount_event_per_change() {
    use crate::sources::csi_objects::ATTACH_WAIT;
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let mut p = pod("p1");
    p.errors = vec![
        format!("volume \"data\": driver d {ATTACH_WAIT}: waiting for a VolumeAttachment"),
        "volume \"logs\": claim apps/logs not found".into(),
    ];
    let fx = c.step(
        &mut w,
        vec![
            Event::Sources(vec![SourceEvent::PodAdded(p), SourceEvent::SourcesReady]),
            walked(),
        ],
        t0,
        idle(),
    );
    let events: Vec<&PodEvent> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::PodEvent(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(events.len(), 2, "{:?}", names(&fx));
    let of = |reason: &str| events.iter().find(|e| e.reason == reason).copied();
    let attach = of("FailedAttachVolume").expect("a FailedAttachVolume event");
    assert!(attach.message.contains("VolumeAttachment"), "{attach:?}");
    let mount = of("FailedMount").expect("a FailedMount event");
    assert!(mount.message.contains("claim apps/logs"), "{mount:?}");
    assert_eq!(events[0].names.as_ref().map(|n| &*n.name), Some("p1"));
    // later passes do not repeat it
    let fx = c.step(&mut w, vec![], ms(t0, 40_000), idle());
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::PodEvent(_))),
        "{:?}",
        names(&fx)
    );
}

/// ReadWriteOncePod held by one pod: the second pod is refused with the
/// kubelet's message, one `FailedMount` event (not one per pass) and the
/// error in its pod errors (the runtime API's); once the holder is gone,
/// the second pod's mount starts.
#[test]
fn a_read_write_once_pod_volume_goes_to_the_second_pod_once_the_first_is_gone() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let spec = VolumeSpec::Local {
        path: "/srv/pv1".into(),
        fs_type: None,
        access_modes: vec![crate::model::AccessMode::ReadWriteOncePod],
        mount_options: vec![],
        is_block: false,
        volume_mode: Default::default(),
    };
    let claim = |u: &str| {
        let mut p = pod_with(u, spec.clone(), "pv1");
        p.volumes[0].spec_name = "pv1".into();
        p.volumes[0].outer_name = "data".into();
        p
    };
    let v = claim("p1").volumes[0].volume.clone();
    w.asw.add_volume(
        v.clone(),
        PluginName::LocalVolume,
        "pv1",
        Some(spec.clone().into()),
        None,
    );
    let m = PodMount {
        outer_name: "data".into(),
        mount_path: "/r/pods/p1/volumes/kubernetes.io~local-volume/pv1".into(),
        kind: crate::model::TargetKind::Mount,
        selinux: SeLinuxState::WithoutContext,
    };
    w.asw.mark_volume_mounted(&v, &uid("p1"), m).unwrap();
    let fx = c.step(
        &mut w,
        vec![
            Event::Sources(vec![
                SourceEvent::PodAdded(claim("p1")),
                SourceEvent::PodAdded(claim("p2")),
                SourceEvent::SourcesReady,
            ]),
            walked(),
        ],
        t0,
        idle(),
    );
    let shown = names(&fx);
    assert!(
        shown.contains(&"event:FailedMount:p2".to_owned())
            && !shown.iter().any(|n| n.starts_with("mount:")),
        "{shown:?}"
    );
    let message = "MountVolume.SetUp failed for volume \"pv1\" : volume uses the \
                   ReadWriteOncePod access mode and is already in use by another pod";
    assert_eq!(
        w.dsw.errors_of_pod(&uid("p2")).collect::<Vec<_>>(),
        [message]
    );
    let swept = || Event::Done(Completion::Swept(Swept::default()));
    let fx = c.step(&mut w, vec![swept()], ms(t0, 40_000), idle());
    assert!(
        !fx.iter()
            .any(|e| matches!(e, Effect::PodEvent(_) | Effect::Start { .. })),
        "still held, told once: {:?}",
        names(&fx)
    );
    // the holder's pod goes and its target with it
    w.asw.delete_pod_from_volume(&v, &uid("p1")).unwrap();
    let fx = c.step(
        &mut w,
        vec![Event::Sources(vec![SourceEvent::PodRemoved(uid("p1"))])],
        ms(t0, 41_000),
        idle(),
    );
    // the ASW lacks the gone pod's target: the journal forgets what it may
    // hold of it first, the volume's key busy until then (core/unheld.rs)
    let (targets, keys) = not_mounted_forget(&fx).expect("a forget of p1's target");
    let done = Completion::NotMountedForgotten {
        targets,
        keys,
        ok: true,
    };
    let fx = c.step(&mut w, vec![Event::Done(done)], ms(t0, 41_001), idle());
    assert!(
        names(&fx).contains(&"mount:p2".to_owned()),
        "{:?}",
        names(&fx)
    );
    assert_eq!(
        w.dsw.errors_of_pod(&uid("p2")).count(),
        0,
        "the lifted refusal leaves the pod's errors"
    );
}

/// The pods each sweep is told to finish interrupted deletions in.
fn finish_of(effects: &[Effect]) -> Option<Finish> {
    effects.iter().find_map(|e| match e {
        Effect::Host(HostWork::Sweep { finish, .. }) => Some(finish.clone()),
        _ => None,
    })
}

/// The report of a job on pod `p`'s target that ran `op` (`ok` or not).
fn ran_on(p: &str, op: Operation, ok: bool) -> Event {
    let spec = VolumeSpec::EmptyDir {
        medium: StorageMedium::Disk,
        size_limit: None,
    };
    Event::JobDone(JobReport {
        key: OpKey::pod(&PodVolume::unique_name(&spec, &uid(p), "scratch"), &uid(p)),
        updates: vec![],
        error: (!ok).then_some(crate::reconciler::jobs::JobError::NotStarted("failed")),
        ran: vec![op],
        forced: false,
        late: None,
    })
}

fn set(pods: &[&str]) -> Finish {
    Finish::Pods(pods.iter().map(|p| uid(p)).collect())
}

#[test]
fn each_sweep_finishes_deletions_exactly_where_a_teardown_ran_and_all_after_a_start() {
    use Operation::{SetUp, TearDown};
    // (what the first sweep left unfinished, the jobs that ran after it,
    // what the second sweep must carry)
    let rows: Vec<(&str, Finish, Vec<Event>, Finish)> = vec![
        ("settled, nothing ran", set(&[]), vec![], set(&[])),
        (
            "a teardown",
            set(&[]),
            vec![ran_on("a", TearDown, true)],
            set(&["a"]),
        ),
        (
            "a block pod's unmap",
            set(&[]),
            vec![ran_on("a", Operation::UnmapPodDevice, true)],
            set(&["a"]),
        ),
        (
            "a teardown that failed after its rename",
            set(&[]),
            vec![ran_on("a", TearDown, false)],
            set(&["a"]),
        ),
        (
            "two teardowns and a setup",
            set(&[]),
            vec![
                ran_on("a", TearDown, true),
                ran_on("b", SetUp, true),
                ran_on("c", TearDown, true),
            ],
            set(&["a", "c"]),
        ),
        (
            "left unfinished, plus a teardown",
            set(&["x"]),
            vec![ran_on("a", TearDown, true)],
            set(&["a", "x"]),
        ),
        (
            "the start's sweep stopped first",
            Finish::All,
            vec![ran_on("a", TearDown, true)],
            Finish::All,
        ),
    ];
    for (name, unfinished, jobs, want) in rows {
        let t0 = Instant::now();
        let (mut c, mut w) = core(0);
        let first = c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
        assert_eq!(
            finish_of(&first),
            Some(Finish::All),
            "{name}: every pod after a start"
        );
        let swept = Swept {
            unfinished,
            ..Swept::default()
        };
        let none = c.step(
            &mut w,
            vec![Event::Done(Completion::Swept(swept))],
            ms(t0, 1),
            idle(),
        );
        assert_eq!(finish_of(&none), None, "{name}");
        c.step(&mut w, jobs, ms(t0, 2), idle());
        let later = t0 + SWEEP_IDLE + Duration::from_millis(1);
        let second = c.step(&mut w, vec![], later, idle());
        assert_eq!(finish_of(&second), Some(want), "{name}");
        assert_eq!(c.finish, Finish::default(), "{name}: handed over");
    }
}

#[test]
fn a_pod_removed_has_its_dir_finished_by_the_sweep_its_teardown_asks_for() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a", "b"], true), walked()], t0, idle());
    let up = vec![mounted(&first, "a"), mounted(&first, "b")];
    let sweep = c.step(&mut w, up, ms(t0, 1), idle());
    assert_eq!(finish_of(&sweep), Some(Finish::All));
    let gone = Event::Sources(vec![SourceEvent::PodRemoved(uid("a"))]);
    let done = Event::Done(Completion::Swept(Swept::default()));
    let down = c.step(&mut w, vec![gone, done], ms(t0, 2), idle());
    let job = teardown_job(&down);
    let torn = torn_down(job, "a");
    let forget = c.step(&mut w, vec![torn], ms(t0, 3), idle());
    let Some(Effect::Journal(JournalWork::ForgetVolume { key, .. })) = forget
        .iter()
        .find(|e| matches!(e, Effect::Journal(JournalWork::ForgetVolume { .. })))
    else {
        panic!("a forget: {:?}", names(&forget));
    };
    assert_eq!(finish_of(&forget), None, "not beside the forget");
    let forgotten = Completion::Forgotten {
        key: Some(key.clone()),
        ok: true,
    };
    let next = c.step(
        &mut w,
        vec![Event::Done(forgotten)],
        ms(t0, 1) + SWEEP_EVERY,
        idle(),
    );
    assert_eq!(finish_of(&next), Some(set(&["a"])), "{:?}", names(&next));
}

#[test]
fn an_idle_sweep_that_changed_nothing_waits_a_thousand_times_its_cost() {
    // (took, changed, the wait before the next idle sweep)
    let s = Duration::from_secs;
    let rows = [
        (Duration::from_millis(5), false, SWEEP_IDLE),
        (Duration::from_millis(120), false, SWEEP_IDLE),
        (Duration::from_millis(400), false, s(400)),
        (Duration::from_millis(2270), false, s(2270)),
        (Duration::from_millis(2270), true, SWEEP_IDLE),
    ];
    for (took, changed, want) in rows {
        if !changed {
            assert_eq!(idle_sweep_wait(took), want, "{took:?}");
        }
        let t0 = Instant::now();
        let (mut c, mut w) = core(0);
        c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
        let swept = Swept {
            took,
            changed,
            ..Swept::default()
        };
        c.step(
            &mut w,
            vec![Event::Done(Completion::Swept(swept))],
            ms(t0, 1),
            idle(),
        );
        assert_eq!(
            c.timers.sweep_at,
            Some(ms(t0, 1) + want),
            "{took:?} {changed}"
        );
        assert_eq!(
            c.next_wake(ms(t0, 1)),
            Duration::from_secs(30),
            "the resync, not a spin"
        );
        // a teardown still asks for one at the rate limit
        c.torn_down(Some(&uid("a")), ms(t0, 2));
        assert_eq!(c.timers.sweep_at, Some(t0 + SWEEP_EVERY), "{took:?}");
    }
}

/// A core started before reconstruction's phase 1 is over, with `policy`.
fn core_reconstructing(policy: Policy) -> (Core, World) {
    let (c, w) = core(0);
    let cfg = CoreConfig {
        selinux: policy,
        ..c.cfg.clone()
    };
    (Core::reconstructing(cfg, 0), w)
}

/// Reconstruction's hand-over with pod `holder`'s volume mounted.
fn reconstructed_with(holder: &str) -> Event {
    let mut asw = ActualStateOfWorld::new();
    let v = pod(holder).volumes[0].clone();
    asw.add_volume(v.volume.clone(), PluginName::EmptyDir, "cache", None, None);
    asw.mark_volume_mounted(
        &v.volume,
        &uid(holder),
        PodMount {
            outer_name: "cache".into(),
            mount_path: format!("/r/pods/{holder}/volumes/kubernetes.io~empty-dir/cache").into(),
            kind: crate::model::TargetKind::Mount,
            selinux: SeLinuxState::Unknown,
        },
    )
    .unwrap();
    Event::Reconstructed(Box::new(Reconstructed {
        asw,
        ..Reconstructed::default()
    }))
}

#[test]
fn before_the_asw_the_sources_fill_the_dsw_and_nothing_is_planned() {
    let t0 = Instant::now();
    let (mut c, mut w) = core_reconstructing(Policy::disabled());
    assert_eq!(c.phase(), Phase::Reconstructing);
    let effects = c.step(&mut w, vec![added(&["a", "b"], true)], t0, idle());
    assert!(effects.is_empty(), "nothing planned: {:?}", names(&effects));
    assert_eq!((c.phase(), w.ready), (Phase::Reconstructing, false));
    assert!(w.dsw.pod_volume_names(&uid("a")).is_some());
    assert!(w.dsw.pod_volume_names(&uid("b")).is_some());
    assert!(w.dsw.is_populated());
    // a resync while reconstructing plans nothing either
    assert!(c.step(&mut w, vec![], ms(t0, 1), idle()).is_empty());

    let effects = c.step(&mut w, vec![reconstructed_with("a")], ms(t0, 2), idle());
    assert_eq!((c.phase(), w.ready), (Phase::Populated, true));
    assert_eq!(names(&effects), ["mount:b"], "a is mounted already");
}

#[test]
fn with_labels_the_sources_wait_for_the_asw_then_apply_holders_first() {
    let t0 = Instant::now();
    let policy = Policy::enabled(
        crate::selinux::FeatureGates::default(),
        crate::selinux::FileDefaults::default(),
    );
    assert!(policy.labels_volumes());
    let (mut c, mut w) = core_reconstructing(policy);
    let effects = c.step(&mut w, vec![added(&["a", "b"], true)], t0, idle());
    assert!(effects.is_empty(), "{:?}", names(&effects));
    assert!(
        w.dsw.pod_volume_names(&uid("a")).is_none(),
        "waits for the ASW"
    );
    assert!(!w.dsw.is_populated());

    let effects = c.step(&mut w, vec![reconstructed_with("a")], ms(t0, 1), idle());
    assert_eq!((c.phase(), w.ready), (Phase::Populated, true));
    assert!(w.dsw.pod_volume_names(&uid("a")).is_some());
    assert_eq!(names(&effects), ["mount:b"]);
}

#[test]
fn a_stop_while_reconstructing_ends_the_loop_and_a_second_hand_over_is_ignored() {
    let t0 = Instant::now();
    let (mut c, mut w) = core_reconstructing(Policy::disabled());
    c.step(&mut w, vec![Event::Stop], t0, idle());
    assert!(c.finished());
    assert!(!w.ready);

    let (mut c, mut w) = core_reconstructing(Policy::disabled());
    c.step(&mut w, vec![reconstructed_with("a")], t0, idle());
    assert_eq!(c.phase(), Phase::Listing { walked: false });
    c.step(
        &mut w,
        vec![Event::Reconstructed(Box::default())],
        ms(t0, 1),
        idle(),
    );
    assert!(
        w.asw.volume_exists(&pod("a").volumes[0].volume),
        "the first ASW stays"
    );
}

#[test]
fn what_reads_or_changes_the_asw_waits_for_it() {
    let labels = Policy::enabled(
        crate::selinux::FeatureGates::default(),
        crate::selinux::FileDefaults::default(),
    );
    // (event, waits without labels, waits with labels)
    let cases: Vec<(Event, bool, bool)> = vec![
        (added(&["a"], false), false, true),
        (Event::Stop, false, false),
        (Event::Reconstructed(Box::default()), false, false),
        (Event::ReportedInUse(vec![]), false, false),
        (walked(), true, true),
        (Event::NodeDevicePaths(vec![]), true, true),
        (Event::Done(Completion::Flushed(Ok(()))), true, true),
    ];
    let (plain, _) = core_reconstructing(Policy::disabled());
    let (labelled, _) = core_reconstructing(labels);
    for (ev, without, with) in cases {
        assert_eq!(
            (plain.waits_for_asw(&ev), labelled.waits_for_asw(&ev)),
            (without, with),
            "{ev:?}"
        );
    }
}

#[test]
fn the_world_is_repacked_once_settled_and_idle_each_time_it_doubles() {
    use super::housekeeping::REPACK_FROM;
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let mut next = 0;
    // `n` more pods without volumes (no job): one World entry each
    let mut more = |n: usize, ready: bool| {
        let names: Vec<String> = (next..next + n).map(|i| format!("p{i:05}")).collect();
        next += n;
        let mut ev = added(&names.iter().map(String::as_str).collect::<Vec<_>>(), ready);
        if let Event::Sources(evs) = &mut ev {
            for e in evs {
                if let SourceEvent::PodAdded(p) = e {
                    p.volumes.clear();
                }
            }
        }
        ev
    };
    // however large and idle, not before the start has settled
    let (mut early, mut ew) = core(0);
    let e = early.step(&mut ew, vec![more(2 * REPACK_FROM, true)], t0, idle());
    assert_ne!(early.phase(), Phase::Settled);
    assert!(!names(&e).contains(&"repack".into()), "not settled");
    early.step(&mut ew, vec![walked()], ms(t0, 1), idle());
    assert_eq!(early.repacked_at, ew.size(), "settled");

    let half = REPACK_FROM / 2 + 1;
    c.step(&mut w, vec![more(half, true), walked()], t0, idle());
    assert_eq!(c.phase(), Phase::Settled);
    assert_eq!(c.repacked_at, 0, "too small to repack");
    // the first sweep ends (no job starts beside a sweep)
    let swept = Event::Done(Completion::Swept(Swept::default()));
    let e = c.step(&mut w, vec![swept, more(half, false)], ms(t0, 1), idle());
    assert_eq!(c.repacked_at, 2 * half, "from REPACK_FROM on");
    assert!(names(&e).contains(&"repack-world".into()));
    assert!(names(&e).contains(&"repack".into()), "the journal's too");
    let e = c.step(&mut w, vec![more(2 * half - 1, false)], ms(t0, 2), idle());
    assert_eq!(c.repacked_at, 2 * half, "not doubled yet");
    assert!(!names(&e).contains(&"repack".into()));
    c.step(&mut w, vec![more(1, false)], ms(t0, 3), idle());
    assert_eq!(c.repacked_at, 4 * half, "doubled");
    // doubled again, but a job runs: after it
    let mut ev = more(4 * half, false);
    if let Event::Sources(evs) = &mut ev {
        evs.push(SourceEvent::PodAdded(pod("with-a-volume")));
    }
    let started = c.step(&mut w, vec![ev], ms(t0, 4), idle());
    assert_eq!(c.repacked_at, 4 * half, "a job runs");
    c.step(
        &mut w,
        vec![mounted(&started, "with-a-volume")],
        ms(t0, 5),
        idle(),
    );
    assert_eq!(c.repacked_at, w.size(), "idle again");
    assert_eq!(w.size(), 8 * half + 1 + 2, "its pod, volume and record");
}

/// The step counts its metrics as effects (the driver applies them): each
/// pass the volumes wanted and mounted per plugin, in place of the last.
#[test]
fn a_pass_counts_the_volumes_wanted_and_mounted_as_an_effect() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a", "b"], true), walked()], t0, idle());
    let wanted = |effects: &[Effect]| -> Vec<(PluginName, &'static str, usize)> {
        counted(effects)
            .into_iter()
            .find_map(|k| match k {
                Counted::TotalVolumes(v) => Some(v),
                _ => None,
            })
            .expect("the pass counted the volumes")
    };
    assert_eq!(
        wanted(&first),
        vec![(PluginName::EmptyDir, "desired_state_of_world", 2)]
    );
    let a = c.step(&mut w, vec![mounted(&first, "a")], ms(t0, 1), idle());
    assert_eq!(
        wanted(&a),
        vec![
            (PluginName::EmptyDir, "actual_state_of_world", 1),
            (PluginName::EmptyDir, "desired_state_of_world", 2)
        ]
    );
}

/// The kubelet's `MarkDeviceAsUncertain` after a failed UnmountDevice: the
/// executor reports the device uncertain, and the next pod of the volume
/// gets MountDevice (NodeStage) again before SetUp, not SetUp alone.
#[test]
fn after_a_failed_unmount_device_the_next_pod_mounts_the_device_again() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let spec = VolumeSpec::Local {
        path: "/dev/loop9".into(),
        fs_type: Some("ext4".into()),
        access_modes: vec![crate::model::AccessMode::ReadWriteOnce],
        mount_options: Default::default(),
        is_block: true,
        volume_mode: Default::default(),
    };
    let b = pod_with("b", spec.clone(), "pv1");
    let volume = b.volumes[0].volume.clone();
    // the device is staged and no pod holds it any more
    let staged = crate::state::DeviceMount {
        device_path: Some("/dev/loop9".into()),
        mount_path: "/r/plugins/kubernetes.io/local-volume/mounts/pv1".into(),
        selinux: None,
    };
    w.asw.add_volume(
        volume.clone(),
        PluginName::LocalVolume,
        "pv1",
        Some(spec.into()),
        None,
    );
    w.asw.mark_device_mounted(&volume, staged.clone()).unwrap();
    let fx = c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
    assert!(
        names(&fx).contains(&"unmount-device".to_owned()),
        "{:?}",
        names(&fx)
    );
    let failed = Event::JobDone(JobReport {
        key: OpKey::volume(&volume),
        updates: vec![AswUpdate::DeviceUncertain {
            volume: volume.clone(),
            plugin: PluginName::LocalVolume,
            spec_name: "pv1".into(),
            mount: staged,
        }],
        error: Some(crate::reconciler::jobs::JobError::Plugin {
            message: "umount: EBUSY".into(),
            uncertain: false,
        }),
        ran: vec![Operation::UnmountDevice],
        forced: false,
        late: None,
    });
    c.step(&mut w, vec![failed], ms(t0, 10), idle());
    let device = w.asw.volume(&volume).and_then(|v| v.device.clone());
    assert_eq!(
        device.map(|d| d.state),
        Some(crate::model::MountState::Uncertain)
    );
    let fx = c.step(
        &mut w,
        vec![
            Event::Done(Completion::Swept(Swept::default())),
            Event::Sources(vec![SourceEvent::PodAdded(b)]),
        ],
        ms(t0, 2_000),
        idle(),
    );
    let device = fx.iter().find_map(|e| match e {
        Effect::Start {
            job: Job::Mount { want, device, .. },
            ..
        } if want.pod.as_str() == "b" => Some(device.is_some()),
        _ => None,
    });
    assert_eq!(device, Some(true), "{:?}", names(&fx));
}

/// A pod target torn down from a volume another pod still holds: the
/// journal forgets that target at once (else it kept a not-mounted target
/// per pod that ever used the volume, as the nemesis soak found), its key
/// busy until the forget is durable, so the same pod cannot mount again
/// before. The last pod's teardown leaves it to the volume's forget. The
/// same for a raw block map undone (`UnmapPodDevice`: the soak found its
/// targets kept once raw block volumes were in the mix).
#[test]
fn a_torn_down_target_of_a_volume_still_held_is_forgotten_at_once() {
    for op in [Operation::TearDown, Operation::UnmapPodDevice] {
        torn_down_target_of_a_volume_still_held_is_forgotten(op);
    }
}

fn torn_down_target_of_a_volume_still_held_is_forgotten(op: Operation) {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let spec = VolumeSpec::Local {
        path: "/srv/pv1".into(),
        fs_type: None,
        access_modes: vec![crate::model::AccessMode::ReadWriteOnce],
        mount_options: vec![],
        is_block: false,
        volume_mode: Default::default(),
    };
    let claim = |u: &str| pod_with(u, spec.clone(), "pv1");
    let v = claim("p1").volumes[0].volume.clone();
    w.asw.add_volume(
        v.clone(),
        PluginName::LocalVolume,
        "pv1",
        Some(spec.clone().into()),
        None,
    );
    for p in ["p1", "p2"] {
        let m = PodMount {
            outer_name: "pv1".into(),
            mount_path: format!("/r/pods/{p}/volumes/kubernetes.io~local-volume/pv1").into(),
            kind: crate::model::TargetKind::Mount,
            selinux: SeLinuxState::WithoutContext,
        };
        w.asw.mark_volume_mounted(&v, &uid(p), m).unwrap();
    }
    let fx = c.step(
        &mut w,
        vec![
            Event::Sources(vec![
                SourceEvent::PodAdded(claim("p2")),
                SourceEvent::SourcesReady,
            ]),
            walked(),
        ],
        t0,
        idle(),
    );
    assert!(
        names(&fx).contains(&"teardown:p1".into()),
        "{:?}",
        names(&fx)
    );
    let torn = torn_down_by(teardown_job(&fx), "p1", op);
    let fx = c.step(&mut w, vec![torn], ms(t0, 1), idle());
    let forgets: Vec<_> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Journal(JournalWork::ForgetTarget {
                volume,
                target,
                key,
            }) => Some((volume.clone(), target.clone(), key.clone())),
            _ => None,
        })
        .collect();
    let key = OpKey::pod(&v, &uid("p1"));
    assert_eq!(
        forgets,
        [(v.clone(), TargetRef::Pod(uid("p1")), Some(key.clone()))],
        "{:?}",
        names(&fx)
    );
    assert!(
        c.pending.busy(&key, ms(t0, 2)),
        "busy until the forget is durable"
    );
    let done = Completion::Forgotten {
        key: Some(key.clone()),
        ok: true,
    };
    c.step(&mut w, vec![Event::Done(done)], ms(t0, 3), idle());
    assert!(!c.pending.busy(&key, ms(t0, 4)), "then free");

    // the last pod: the volume leaves the ASW and forgets its targets
    let gone = Event::Sources(vec![SourceEvent::PodRemoved(uid("p2"))]);
    let swept = Event::Done(Completion::Swept(Swept::default()));
    let fx = c.step(&mut w, vec![gone, swept], ms(t0, 5), idle());
    let torn = torn_down_by(teardown_job(&fx), "p2", op);
    let fx = c.step(&mut w, vec![torn], ms(t0, 6), idle());
    assert!(
        !names(&fx).contains(&"forget-target".into()) && names(&fx).contains(&"forget".into()),
        "{:?}",
        names(&fx)
    );
}

/// A decision of the pod-dir walk, which read the start's mount table:
/// pod `u`'s emptyDir target found half there (uncertain).
fn walk_found(u: &str) -> crate::reconstruct::Decision {
    use crate::reconstruct::{Boot, Decision, HostSays, JournalSays, Reason};
    let volume = pod(u).volumes[0].volume.clone();
    let target = crate::model::TargetRef::Pod(uid(u));
    Decision {
        key: crate::journal::TargetKey {
            volume: volume.clone(),
            target: target.clone(),
        },
        kind: crate::model::TargetKind::Mount,
        journal_says: JournalSays::Nothing,
        host_says: HostSays::Absent,
        boot: Boot::Same,
        result: crate::model::MountState::Uncertain,
        reason: Reason::RebuiltFromHost,
        params: crate::model::TargetParams::at(
            volume,
            PluginName::EmptyDir,
            "cache".into(),
            target,
            crate::model::TargetKind::Mount,
            None,
        )
        .with_pod_mount_path(Some(
            format!("/r/pods/{u}/volumes/kubernetes.io~empty-dir/cache").into(),
        ))
        .into(),
        observed: None,
    }
}

#[test]
fn the_walk_s_older_view_never_overrides_a_target_the_loop_worked_on() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let first = c.step(&mut w, vec![added(&["a", "b"], true)], t0, idle());
    // a's mount done, b's still running, c untouched since the start
    c.step(&mut w, vec![mounted(&first, "a")], ms(t0, 5), idle());
    let output = crate::reconstruct::MergeOutput {
        decisions: vec![walk_found("a"), walk_found("b"), walk_found("c")],
        ..Default::default()
    };
    c.step(
        &mut w,
        vec![Event::Leftovers(Box::new(output), Vec::new())],
        ms(t0, 10),
        idle(),
    );
    let state = |u: &str| {
        w.asw
            .pod(&pod(u).volumes[0].volume, &uid(u))
            .map(|m| m.state)
    };
    use crate::model::MountState;
    assert_eq!(
        state("a"),
        Some(MountState::Mounted),
        "held: kept as the loop made it"
    );
    assert_eq!(state("b"), None, "in flight: left to its job");
    assert_eq!(
        state("c"),
        Some(MountState::Uncertain),
        "untouched: the walk's"
    );
}

// ------------------------------------------------ reconstruction's not-mounted targets

fn pod_key(volume: &UniqueVolumeName, pod: &str) -> crate::journal::TargetKey {
    crate::journal::TargetKey {
        volume: volume.clone(),
        target: TargetRef::Pod(uid(pod)),
    }
}

fn device_key(volume: &UniqueVolumeName) -> crate::journal::TargetKey {
    crate::journal::TargetKey {
        volume: volume.clone(),
        target: TargetRef::Device,
    }
}

/// The one `ForgetNotMounted` among `effects`: (targets, keys).
fn not_mounted_forget(effects: &[Effect]) -> Option<(Vec<crate::journal::TargetKey>, Vec<OpKey>)> {
    let mut found = effects.iter().filter_map(|e| match e {
        Effect::Journal(JournalWork::ForgetNotMounted { targets, keys }) => {
            Some((targets.clone(), keys.clone()))
        }
        _ => None,
    });
    let one = found.next();
    assert!(found.next().is_none(), "one batch: {:?}", names(effects));
    one
}

/// Which journal targets the ASW lacks are forgotten: those no pod wants
/// and the ASW does not hold; one whose operation runs waits for it.
#[test]
fn not_mounted_targets_are_forgotten_when_no_pod_wants_them_and_the_asw_lacks_them() {
    use super::unheld::to_forget;
    let shared = UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1");
    let lone = UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv2");
    let own = |u: &str| pod(u).volumes[0].volume.clone();
    // the DSW: "live" wants its own volume and the shared one
    let mut dsw = crate::state::DesiredStateOfWorld::new();
    let mut use_of = |u: &str, volume: &UniqueVolumeName| {
        let mut v = pod(u).volumes[0].clone();
        v.volume = volume.clone();
        dsw.add_pod_to_volume(&uid(u), v, Default::default())
            .unwrap();
    };
    use_of("live", &own("live"));
    use_of("live", &shared);
    // the ASW: "mounted" holds its own volume (mounted since the start)
    let mut asw = ActualStateOfWorld::new();
    asw.add_volume(own("mounted"), PluginName::EmptyDir, "cache", None, None);
    asw.mark_volume_mounted(
        &own("mounted"),
        &uid("mounted"),
        PodMount {
            outer_name: "cache".into(),
            mount_path: "/r/pods/mounted/volumes/kubernetes.io~empty-dir/cache".into(),
            kind: crate::model::TargetKind::Mount,
            selinux: SeLinuxState::Unknown,
        },
    )
    .unwrap();
    let busy_pod = OpKey::pod(&own("busy"), &uid("busy"));
    // (what, the target, forgotten)
    let rows = [
        ("a pod that wants it", pod_key(&own("live"), "live"), false),
        (
            "a deleted pod's own volume",
            pod_key(&own("gone"), "gone"),
            true,
        ),
        (
            "a deleted pod's target of a volume another pod wants",
            pod_key(&shared, "gone"),
            true,
        ),
        (
            "a target the ASW holds",
            pod_key(&own("mounted"), "mounted"),
            false,
        ),
        (
            "an operation on it running",
            pod_key(&own("busy"), "busy"),
            false,
        ),
        ("a device a pod wants", device_key(&shared), false),
        (
            "a device of a volume the ASW holds",
            device_key(&own("mounted")),
            false,
        ),
        ("a device no one wants", device_key(&lone), true),
        (
            "a pod target of that volume: under the device's key",
            pod_key(&lone, "gone"),
            true,
        ),
    ];
    for (what, key, forgotten) in &rows {
        let got = to_forget(vec![key.clone()], &dsw, &asw, &|k| *k == busy_pod);
        assert_eq!(!got.targets.is_empty(), *forgotten, "{what}");
    }
    let all: Vec<_> = rows.iter().map(|(_, k, _)| k.clone()).collect();
    let got = to_forget(all, &dsw, &asw, &|k| *k == busy_pod);
    assert_eq!(
        got.deferred,
        [pod_key(&own("busy"), "busy")],
        "waits for it"
    );
    let want: Vec<_> = rows
        .iter()
        .filter(|(_, _, f)| *f)
        .map(|(_, k, _)| k.clone())
        .collect();
    assert_eq!(got.targets, want, "in the order given");
    assert_eq!(
        got.keys,
        [
            OpKey::pod(&own("gone"), &uid("gone")),
            OpKey::pod(&shared, &uid("gone")),
            OpKey::volume(&lone),
        ]
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>(),
        "the device's volume-wide key stands for its pod's"
    );
}

/// The soak's finding: two pods' memory emptyDirs gone while volumed was
/// down, one pod deleted before the restart. Once every source listed and
/// the walk reported, the deleted pod's target is forgotten (once, its key
/// busy until durable); the other is mounted again.
#[test]
fn a_deleted_pod_s_target_reconstruction_found_not_mounted_is_forgotten_once_settled() {
    let t0 = Instant::now();
    let (mut c, mut w) = core_reconstructing(Policy::disabled());
    let (a, b) = (
        pod("a").volumes[0].volume.clone(),
        pod("b").volumes[0].volume.clone(),
    );
    let handed = Reconstructed {
        not_mounted: vec![pod_key(&a, "a"), pod_key(&b, "b")],
        ..Reconstructed::default()
    };
    c.step(
        &mut w,
        vec![Event::Reconstructed(Box::new(handed))],
        t0,
        idle(),
    );
    let fx = c.step(&mut w, vec![added(&["b"], true)], ms(t0, 1), idle());
    assert_eq!(names(&fx), ["mount:b"], "not before the walk reported");
    let fx = c.step(&mut w, vec![walked()], ms(t0, 2), idle());
    let (targets, keys) = not_mounted_forget(&fx).expect("a forget once settled");
    assert_eq!(targets, [pod_key(&a, "a")], "only the deleted pod's");
    let key = OpKey::pod(&a, &uid("a"));
    assert_eq!(keys, std::slice::from_ref(&key));
    assert!(c.pending.busy(&key, ms(t0, 3)), "busy until durable");
    assert!(!c.finished());
    let done = Completion::NotMountedForgotten {
        targets,
        keys: keys.clone(),
        ok: true,
    };
    let fx = c.step(&mut w, vec![Event::Done(done)], ms(t0, 4), idle());
    assert!(!c.pending.busy(&key, ms(t0, 5)), "then free");
    assert!(not_mounted_forget(&fx).is_none(), "once");
    let fx = c.step(&mut w, vec![], ms(t0, 6), idle());
    assert!(not_mounted_forget(&fx).is_none(), "once");
}

/// A forget whose journal write failed is tried again once
/// `FORGET_RETRY` has passed, not before (the loop wakes for it), on the
/// targets still no pod wants then: one wanted meanwhile is kept.
#[test]
fn a_failed_forget_is_tried_again_later_on_what_no_pod_wants_then() {
    use super::unheld::FORGET_RETRY;
    let t0 = Instant::now();
    let (mut c, mut w) = core_reconstructing(Policy::disabled());
    let (a, b) = (
        pod("a").volumes[0].volume.clone(),
        pod("b").volumes[0].volume.clone(),
    );
    let handed = Reconstructed {
        not_mounted: vec![pod_key(&a, "a"), pod_key(&b, "b")],
        ..Reconstructed::default()
    };
    c.step(
        &mut w,
        vec![Event::Reconstructed(Box::new(handed))],
        t0,
        idle(),
    );
    c.step(&mut w, vec![added(&[], true)], ms(t0, 1), idle());
    let fx = c.step(&mut w, vec![walked()], ms(t0, 2), idle());
    let (targets, keys) = not_mounted_forget(&fx).expect("a forget once settled");
    assert_eq!(targets, [pod_key(&a, "a"), pod_key(&b, "b")]);
    let failed = Completion::NotMountedForgotten {
        targets,
        keys,
        ok: false,
    };
    let fx = c.step(&mut w, vec![Event::Done(failed)], ms(t0, 3), idle());
    assert!(not_mounted_forget(&fx).is_none(), "not at once");
    let wait = FORGET_RETRY - Duration::from_millis(3);
    assert!(
        c.next_wake(ms(t0, 6)) <= wait,
        "the loop wakes for the retry"
    );
    // pod b is wanted meanwhile: its target is no candidate any more
    let fx = c.step(&mut w, vec![added(&["b"], true)], ms(t0, 10), idle());
    assert!(not_mounted_forget(&fx).is_none(), "{:?}", names(&fx));
    let due = t0 + Duration::from_millis(3) + FORGET_RETRY;
    let fx = c.step(&mut w, vec![], due - Duration::from_millis(1), idle());
    assert!(not_mounted_forget(&fx).is_none(), "not before the retry");
    let fx = c.step(&mut w, vec![], due, idle());
    let (targets, _) = not_mounted_forget(&fx).expect("tried again");
    assert_eq!(targets, [pod_key(&a, "a")], "only what no pod wants");
    let fx = c.step(&mut w, vec![], due + FORGET_RETRY, idle());
    assert!(not_mounted_forget(&fx).is_none(), "in flight: not again");
}

/// Phase 2's not-mounted decisions (a leftover dir it recorded) count too;
/// with the journal off nothing is forgotten.
#[test]
fn the_walk_s_not_mounted_targets_are_forgotten_too_and_none_with_the_journal_off() {
    let t0 = Instant::now();
    let v = pod("gone").volumes[0].volume.clone();
    let decision = crate::reconstruct::Decision {
        key: pod_key(&v, "gone"),
        kind: crate::model::TargetKind::Mount,
        journal_says: crate::reconstruct::JournalSays::Nothing,
        host_says: crate::reconstruct::HostSays::DirPresent,
        boot: crate::reconstruct::Boot::Same,
        result: crate::model::MountState::NotMounted,
        reason: crate::reconstruct::Reason::HostLeftover,
        params: crate::model::TargetParams::at(
            v.clone(),
            PluginName::EmptyDir,
            "cache".into(),
            TargetRef::Pod(uid("gone")),
            crate::model::TargetKind::Mount,
            None,
        )
        .into(),
        observed: None,
    };
    let output = crate::reconstruct::MergeOutput {
        decisions: vec![decision],
        ..Default::default()
    };
    for journal in [true, false] {
        let (mut c, mut w) = core(0);
        c.cfg.journal = journal;
        let fx = c.step(
            &mut w,
            vec![
                added(&[], true),
                Event::Leftovers(Box::new(output.clone()), Vec::new()),
            ],
            t0,
            idle(),
        );
        let got = not_mounted_forget(&fx).map(|(t, _)| t);
        let want = journal.then(|| vec![pod_key(&v, "gone")]);
        assert_eq!(got, want, "journal {journal}");
    }
}

/// The soak's third finding (seed 1234, the journal on the slow disk):
/// the walk journals a deleted pod's leftover target as not mounted, but
/// when its report reaches the loop an operation runs on that volume
/// (another pod's, volume-wide) and the loop drops the decision as stale.
/// Dropped, it is still a candidate: forgotten once that operation ends.
#[test]
fn a_walk_s_not_mounted_target_dropped_as_stale_is_forgotten_once_its_volume_is_free() {
    let t0 = Instant::now();
    let v = pod("gone").volumes[0].volume.clone();
    let decision = crate::reconstruct::Decision {
        key: pod_key(&v, "gone"),
        kind: crate::model::TargetKind::Mount,
        journal_says: crate::reconstruct::JournalSays::Nothing,
        host_says: crate::reconstruct::HostSays::Absent,
        boot: crate::reconstruct::Boot::Same,
        result: crate::model::MountState::NotMounted,
        reason: crate::reconstruct::Reason::HostLeftover,
        params: crate::model::TargetParams::at(
            v.clone(),
            PluginName::EmptyDir,
            "cache".into(),
            TargetRef::Pod(uid("gone")),
            crate::model::TargetKind::Mount,
            None,
        )
        .into(),
        observed: None,
    };
    let output = crate::reconstruct::MergeOutput {
        decisions: vec![decision],
        ..Default::default()
    };
    let (mut c, mut w) = core(0);
    c.step(&mut w, vec![added(&[], true)], t0, idle());
    let volume_wide = OpKey::volume(&v);
    c.pending.take_over(&volume_wide);
    let fx = c.step(
        &mut w,
        vec![Event::Leftovers(Box::new(output), Vec::new())],
        ms(t0, 1),
        idle(),
    );
    assert!(
        not_mounted_forget(&fx).is_none(),
        "not while an operation on its volume runs: {:?}",
        names(&fx)
    );
    let ended = Event::JobDone(JobReport {
        key: volume_wide,
        updates: vec![],
        error: None,
        ran: vec![Operation::MountDevice],
        forced: false,
        late: None,
    });
    let fx = c.step(&mut w, vec![ended], ms(t0, 2), idle());
    let (targets, _) = not_mounted_forget(&fx).expect("forgotten once the operation ended");
    assert_eq!(targets, [pod_key(&v, "gone")]);
}

/// The report of pod `u`'s memory emptyDir mount that failed, final.
fn mount_failed(u: &str) -> Event {
    Event::JobDone(JobReport {
        key: OpKey::pod(&pod(u).volumes[0].volume, &uid(u)),
        updates: vec![],
        error: Some(crate::reconciler::jobs::JobError::Plugin {
            message: "refused".into(),
            uncertain: false,
        }),
        ran: vec![Operation::SetUp],
        forced: false,
        late: None,
    })
}

/// A pod whose mount failed (final) leaves a not-mounted journal target
/// the ASW never held: when the pod goes, it is forgotten, its failed
/// mount's backoff taken over. Removed while its mount still runs, it
/// waits for the mount's end.
#[test]
fn a_gone_pod_s_target_the_asw_never_held_is_forgotten_after_its_mount_ends() {
    let t0 = Instant::now();
    let v = pod("a").volumes[0].volume.clone();
    let key = OpKey::pod(&v, &uid("a"));
    let gone = || Event::Sources(vec![SourceEvent::PodRemoved(uid("a"))]);
    // failed, then removed
    let (mut c, mut w) = core(0);
    let fx = c.step(&mut w, vec![added(&["a"], true), walked()], t0, idle());
    assert_eq!(names(&fx), ["mount:a"]);
    let fx = c.step(&mut w, vec![mount_failed("a")], ms(t0, 1), idle());
    assert!(not_mounted_forget(&fx).is_none(), "a wanted pod's: kept");
    assert!(c.pending.busy(&key, ms(t0, 2)), "backing off");
    let fx = c.step(&mut w, vec![gone()], ms(t0, 2), idle());
    let (targets, keys) = not_mounted_forget(&fx).expect("forgotten once gone");
    assert_eq!(targets, [pod_key(&v, "a"), device_key(&v)]);
    assert_eq!(
        keys,
        [OpKey::volume(&v)],
        "the volume-wide key stands for both"
    );
    // removed while its mount runs: forgotten once the mount failed
    let (mut c, mut w) = core(0);
    c.step(&mut w, vec![added(&["a"], true), walked()], t0, idle());
    let fx = c.step(&mut w, vec![gone()], ms(t0, 1), idle());
    assert!(not_mounted_forget(&fx).is_none(), "{:?}", names(&fx));
    let fx = c.step(&mut w, vec![mount_failed("a")], ms(t0, 2), idle());
    let (targets, _) = not_mounted_forget(&fx).expect("forgotten once the mount ended");
    assert_eq!(targets, [pod_key(&v, "a"), device_key(&v)]);
    // a pod whose volumes the ASW holds: nothing to forget at its removal
    let (mut c, mut w) = core(0);
    let fx = c.step(&mut w, vec![added(&["a"], true), walked()], t0, idle());
    c.step(&mut w, vec![mounted(&fx, "a")], ms(t0, 1), idle());
    let fx = c.step(&mut w, vec![gone()], ms(t0, 2), idle());
    assert!(not_mounted_forget(&fx).is_none(), "{:?}", names(&fx));
}

/// The last pod's target torn down from a volume whose device is still
/// mounted is forgotten at once too: the volume leaves the ASW only after
/// its UnmountDevice, and a pod that wants it before then keeps it, so
/// the volume's forget may never come (the long soak found a CSI pod
/// target kept so).
#[test]
fn the_last_pod_s_target_of_a_volume_with_its_device_mounted_is_forgotten_at_once() {
    let t0 = Instant::now();
    let (mut c, mut w) = core(0);
    let v = UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1");
    w.asw
        .add_volume(v.clone(), PluginName::LocalVolume, "pv1", None, None);
    w.asw
        .mark_device_mounted(
            &v,
            crate::state::DeviceMount {
                device_path: Some("/dev/loop3".into()),
                mount_path: "/r/plugins/kubernetes.io/local-volume/mounts/pv1".into(),
                selinux: None,
            },
        )
        .unwrap();
    let m = PodMount {
        outer_name: "pv1".into(),
        mount_path: "/r/pods/p1/volumes/kubernetes.io~local-volume/pv1".into(),
        kind: crate::model::TargetKind::Mount,
        selinux: SeLinuxState::WithoutContext,
    };
    w.asw.mark_volume_mounted(&v, &uid("p1"), m).unwrap();
    let fx = c.step(&mut w, vec![added(&[], true), walked()], t0, idle());
    let torn = torn_down(teardown_job(&fx), "p1");
    let fx = c.step(&mut w, vec![torn], ms(t0, 1), idle());
    assert!(
        names(&fx).contains(&"forget-target".into()),
        "{:?}",
        names(&fx)
    );
}
