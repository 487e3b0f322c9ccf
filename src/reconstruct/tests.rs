//! The merge table, row by row, through one `check` function; then the
//! findings, the journal records and the ASW the decisions become.

use std::path::PathBuf;

use super::merge::merge_checked_split;
use super::*;
use crate::journal::{Body, OpResult, Record};
use crate::model::{Operation, PodUid, Steps, TargetParams};
use crate::state::{ActualStateOfWorld, SeLinuxState};

const BOOT: &str = "boot-a";
const LABEL: &str = "system_u:object_r:container_file_t:s0:c10,c20";
const LABEL_REORDERED: &str = "system_u:object_r:container_file_t:s0:c20,c10";
const LABEL_OTHER: &str = "system_u:object_r:container_file_t:s0:c1,c2";
const ROOT: &str = "/var/lib/kubelet";

/// The targets the table exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vol {
    /// a local PV's device target (ext4 on /dev/loop3): `mount`
    LocalDevice,
    /// a local PV's pod target (a bind of the device mount): `mount`
    LocalPod,
    /// a memory emptyDir: `mount` (tmpfs)
    TmpfsPod,
    /// a disk emptyDir: `dir`
    DirPod,
    /// a hostPath: `none`
    HostPath,
    /// a CSI pod target whose driver published with a mount (a bind)
    CsiPod,
    /// a CSI pod target whose driver published without a mount
    CsiPodBare,
    /// a local PV's pod target for a pod whose claim is `readOnly` (`ro`)
    LocalPodRo,
    /// a CSI pod target published `readonly`
    CsiPodRo,
    /// a local PV's raw block device target: its global map dir (`block`)
    BlockDevice,
    /// a local PV's raw block pod target: the pod's symlink, the bind on
    /// the pod's file in the global map dir (`block`)
    BlockPod,
    /// a CSI raw block volume's pod target (its `volumeDevices` symlink):
    /// `block`
    CsiBlockPod,
    /// a CSI raw block volume's device target (its staging dir): `block`
    CsiBlockDevice,
}

/// What the journal holds for the target.
#[derive(Debug, Clone, Copy)]
enum Journal {
    Mounted,
    Unmounted,
    Uncertain,
    MountIntent(Steps),
    UnmountIntent(Steps),
    FormatIntent,
    FinalFailedMount,
    FinalFailedUnmount,
    Nothing,
    Off,
    NothingUnknownPlugin,
    NothingNoMetadata,
    OffUnknownPlugin,
}

/// What the host shows at the target's path.
#[derive(Debug, Clone, Copy)]
enum Seen {
    /// the mount volumed made (dir targets: the dir)
    Ours,
    /// another filesystem mounted there
    Other,
    /// our mount with this label
    Label(&'static str),
    /// nothing
    Absent,
    /// a directory and no mount
    Dir,
    /// our mount, but writable (a read-only target's `ro` gone)
    Writable,
    /// a pod's raw block map in part: its symlink, no bind
    Partial,
}

fn pod() -> PodUid {
    PodUid::new("pod1").expect("valid uid")
}

fn ctx(s: &str) -> SeLinuxContext {
    SeLinuxContext::parse(s).expect("valid context")
}

fn device_mount_path() -> PathBuf {
    PathBuf::from(format!(
        "{ROOT}/plugins/kubernetes.io/local-volume/mounts/pv1"
    ))
}

fn params(vol: Vol) -> TargetParams {
    let pod_path = |plugin: &str, name: &str| {
        Some(PathBuf::from(format!("{ROOT}/pods/pod1/volumes/{plugin}/{name}")).into())
    };
    let local = |target: TargetRef| {
        TargetParams::at(
            UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            PluginName::LocalVolume,
            "pv1".into(),
            target,
            TargetKind::Mount,
            None,
        )
        .with_device_path(Some("/dev/loop3".into()))
        .with_device_mount_path(Some(device_mount_path().into()))
        .with_selinux(Some(ctx(LABEL)))
        .with_fs_type(Some("ext4".into()))
    };
    // a pod target of pod1, labelled as the local volume is
    let on_pod = |volume: &str, plugin: PluginName, spec_name: &str, kind: TargetKind, path| {
        TargetParams::at(
            UniqueVolumeName::from_raw(volume),
            plugin,
            spec_name.into(),
            TargetRef::Pod(pod()),
            kind,
            path,
        )
        .with_selinux(Some(ctx(LABEL)))
    };
    match vol {
        Vol::LocalDevice => local(TargetRef::Device),
        Vol::LocalPod => local(TargetRef::Pod(pod()))
            .with_pod_mount_path(pod_path("kubernetes.io~local-volume", "pv1")),
        Vol::LocalPodRo => params(Vol::LocalPod).with_mount_options(vec!["ro".to_owned()].into()),
        Vol::CsiPodRo => {
            let p = params(Vol::CsiPod);
            let mut csi = p.csi().expect("csi").as_ref().clone();
            csi.read_only = true;
            p.with_csi(Some(std::sync::Arc::new(csi)))
        }
        Vol::TmpfsPod => on_pod(
            "kubernetes.io/empty-dir/pod1-cache",
            PluginName::EmptyDir,
            "cache",
            TargetKind::Mount,
            pod_path("kubernetes.io~empty-dir", "cache"),
        ),
        Vol::DirPod => on_pod(
            "kubernetes.io/empty-dir/pod1-scratch",
            PluginName::EmptyDir,
            "scratch",
            TargetKind::Dir,
            pod_path("kubernetes.io~empty-dir", "scratch"),
        ),
        Vol::CsiPod | Vol::CsiPodBare => {
            let name = if vol == Vol::CsiPod {
                "pv-csi"
            } else {
                "pv-bare"
            };
            on_pod(
                &format!("kubernetes.io/csi/d.example.com^{name}"),
                PluginName::Csi,
                name,
                TargetKind::Mount,
                Some(
                    PathBuf::from(format!(
                        "{ROOT}/pods/pod1/volumes/kubernetes.io~csi/{name}/mount"
                    ))
                    .into(),
                ),
            )
            // asked for; the test driver's mount (`ours`) has none, as a
            // driver that drops `context=` leaves it
            .with_selinux((vol == Vol::CsiPod).then(|| ctx(LABEL)))
            .with_csi(Some(std::sync::Arc::new(crate::model::CsiParams {
                driver: "d.example.com".into(),
                volume_handle: name.into(),
                lifecycle: crate::model::CsiLifecycle::Persistent,
                access_modes: Vec::new(),
                read_only: false,
                publish_context: Default::default(),
                volume_context: Default::default(),
                stage_secret: None,
                publish_secret: None,
                mount_group: None,
                attachment_id: None,
            })))
        }
        Vol::BlockDevice | Vol::BlockPod => {
            let target = match vol {
                Vol::BlockDevice => TargetRef::Device,
                _ => TargetRef::Pod(pod()),
            };
            let link = (vol == Vol::BlockPod).then(|| {
                PathBuf::from(format!(
                    "{ROOT}/pods/pod1/volumeDevices/kubernetes.io~local-volume/pv1"
                ))
                .into()
            });
            TargetParams::at(
                UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
                PluginName::LocalVolume,
                "pv1".into(),
                target,
                TargetKind::Block,
                None,
            )
            .with_device_path(Some("/dev/loop3".into()))
            .with_device_mount_path(Some(
                PathBuf::from(format!(
                    "{ROOT}/plugins/kubernetes.io~local-volume/volumeDevices/pv1"
                ))
                .into(),
            ))
            .with_pod_mount_path(link)
        }
        Vol::CsiBlockPod => on_pod(
            "kubernetes.io/csi/d.example.com^pv-raw",
            PluginName::Csi,
            "pv-raw",
            TargetKind::Block,
            Some(
                PathBuf::from(format!(
                    "{ROOT}/pods/pod1/volumeDevices/kubernetes.io~csi/pv-raw"
                ))
                .into(),
            ),
        )
        .with_selinux(None)
        .with_device_mount_path(Some(
            PathBuf::from(format!(
                "{ROOT}/plugins/kubernetes.io/csi/volumeDevices/staging/pv-raw"
            ))
            .into(),
        ))
        .with_csi(params(Vol::CsiPod).csi().cloned()),
        Vol::CsiBlockDevice => TargetParams::at(
            UniqueVolumeName::from_raw("kubernetes.io/csi/d.example.com^pv-raw"),
            PluginName::Csi,
            "pv-raw".into(),
            TargetRef::Device,
            TargetKind::Block,
            Some(
                PathBuf::from(format!(
                    "{ROOT}/plugins/kubernetes.io/csi/volumeDevices/staging/pv-raw"
                ))
                .into(),
            ),
        )
        .with_csi(params(Vol::CsiPod).csi().cloned()),
        Vol::HostPath => on_pod(
            "kubernetes.io/host-path/pod1-data",
            PluginName::HostPath,
            "data",
            TargetKind::None,
            pod_path("kubernetes.io~host-path", "data"),
        )
        .with_device_path(Some("/srv/data".into())),
    }
}

/// The identity of the mount volumed made for `vol`.
fn ours(vol: Vol) -> MountIdentity {
    let (dev, fs_type) = match vol {
        Vol::CsiPod | Vol::CsiPodBare | Vol::CsiPodRo => (
            DevId {
                major: 0,
                minor: 77,
            },
            "tmpfs",
        ),
        Vol::TmpfsPod => (
            DevId {
                major: 0,
                minor: 55,
            },
            "tmpfs",
        ),
        _ => (DevId { major: 7, minor: 3 }, "ext4"),
    };
    MountIdentity {
        dev,
        root: "/".into(),
        fs_type: fs_type.into(),
        read_only: matches!(vol, Vol::LocalPodRo | Vol::CsiPodRo),
        selinux: (!matches!(vol, Vol::CsiPod | Vol::CsiPodBare | Vol::CsiPodRo))
            .then(|| ctx(LABEL)),
    }
}

fn mounted(identity: MountIdentity, source: &str) -> HostObservation {
    HostObservation::Mounted(ObservedMount {
        identity,
        source: source.into(),
    })
}

fn observation(vol: Vol, seen: Seen) -> HostObservation {
    let source = match vol {
        Vol::TmpfsPod | Vol::CsiPod | Vol::CsiPodBare | Vol::CsiPodRo => "tmpfs",
        _ => "/dev/loop3",
    };
    let map = |link: Option<&str>, bound| {
        HostObservation::Mapped(BlockMap {
            link: link.map(PathBuf::from),
            bound,
        })
    };
    match (seen, params(vol).kind) {
        // a pod's raw block map: its symlink and its bind; the device's: a dir
        (Seen::Ours, TargetKind::Block) if vol == Vol::BlockPod => map(Some("/dev/loop3"), true),
        (Seen::Ours, TargetKind::Block) if vol == Vol::CsiBlockPod => map(
            Some("/k/plugins/kubernetes.io/csi/volumeDevices/publish/pv-raw/pod1"),
            true,
        ),
        (Seen::Other, TargetKind::Block) if vol == Vol::BlockPod => map(Some("/dev/sdb1"), true),
        (Seen::Partial, _) => map(Some("/dev/loop3"), false),
        (Seen::Ours, TargetKind::Block) => HostObservation::DirPresent,
        // the driver keeps it without a mount: its dir
        (Seen::Ours, _) if vol == Vol::CsiPodBare => HostObservation::DirPresent,
        (Seen::Ours, TargetKind::Dir) => HostObservation::DirPresent,
        (Seen::Ours, _) => mounted(ours(vol), source),
        (Seen::Other, _) => mounted(
            MountIdentity {
                dev: DevId { major: 8, minor: 1 },
                root: "/other".into(),
                fs_type: "xfs".into(),
                read_only: false,
                selinux: None,
            },
            "/dev/sdb1",
        ),
        (Seen::Label(label), _) => mounted(
            MountIdentity {
                selinux: Some(ctx(label)),
                ..ours(vol)
            },
            source,
        ),
        (Seen::Absent, _) => HostObservation::Absent,
        (Seen::Dir, _) => HostObservation::DirPresent,
        (Seen::Writable, _) => mounted(
            MountIdentity {
                read_only: false,
                ..ours(vol)
            },
            source,
        ),
    }
}

/// The merge input of `state` on the same boot, the host showing `seen`.
fn seeing<'s>(state: &'s JournalState, seen: &[(Vol, Seen)]) -> MergeInput<'s> {
    let mut input = MergeInput {
        journal: Some(state),
        current_boot_id: BOOT.into(),
        ..MergeInput::default()
    };
    observing(&mut input, seen);
    input
}

/// What the host shows at each target's path, into `input.observe`.
fn observing(input: &mut MergeInput<'_>, seen: &[(Vol, Seen)]) {
    for &(vol, s) in seen {
        let p = params(vol);
        input
            .observe
            .insert(p.path().expect("path").to_path_buf(), observation(vol, s));
    }
}

/// Builds journal records the way the executor writes them.
struct Writer {
    seq: u64,
    records: Vec<Record>,
}

impl Writer {
    fn new() -> Self {
        Self {
            seq: 0,
            records: vec![],
        }
    }
    fn push(&mut self, body: Body) -> u64 {
        self.seq += 1;
        self.records.push(Record {
            seq: self.seq,
            wall_time_ns: self.seq,
            boot_id: BOOT.into(),
            body,
        });
        self.seq
    }
    fn intent(&mut self, op: Operation, steps: Steps, target: &TargetParams) -> u64 {
        self.push(Body::Intent {
            op,
            steps,
            target: target.clone().into(),
        })
    }
    fn outcome(&mut self, intent_seq: u64, op: Operation, result: OpResult, vol: Vol) {
        let observed = (result == OpResult::Success
            && op.success_state() == Some(MountState::Mounted)
            && params(vol).kind == TargetKind::Mount
            && vol != Vol::CsiPodBare)
            .then(|| ours(vol));
        self.push(Body::Outcome {
            intent_seq,
            op,
            result,
            observed,
        });
    }
    fn run(&mut self, op: Operation, vol: Vol, result: OpResult) {
        let i = self.intent(op, Steps::Single, &params(vol));
        self.outcome(i, op, result, vol);
    }
    fn state(&self) -> JournalState {
        let mut s = JournalState::default();
        for r in &self.records {
            s.apply(r);
        }
        s
    }
}

fn ops(vol: Vol) -> (Operation, Operation) {
    match vol {
        Vol::LocalDevice => (Operation::MountDevice, Operation::UnmountDevice),
        Vol::BlockDevice | Vol::CsiBlockDevice => (Operation::MapDevice, Operation::UnmapDevice),
        Vol::BlockPod => (Operation::MapPodDevice, Operation::UnmapPodDevice),
        Vol::CsiBlockPod => (Operation::MapPodDevice, Operation::UnmapPodDevice),
        _ => (Operation::SetUp, Operation::TearDown),
    }
}

/// Writes what `journal` says about `vol`.
fn write(w: &mut Writer, vol: Vol, journal: Journal) {
    let (mount, unmount) = ops(vol);
    let p = params(vol);
    let fail = || OpResult::FailedFinal("boom".into());
    match journal {
        Journal::Mounted => w.run(mount, vol, OpResult::Success),
        Journal::Unmounted => {
            w.run(mount, vol, OpResult::Success);
            w.run(unmount, vol, OpResult::Success);
        }
        Journal::Uncertain => w.run(mount, vol, OpResult::FailedUncertain("timeout".into())),
        Journal::MountIntent(steps) => {
            w.intent(mount, steps, &p);
        }
        Journal::UnmountIntent(steps) => {
            w.run(mount, vol, OpResult::Success);
            w.intent(unmount, steps, &p);
        }
        Journal::FormatIntent => {
            w.intent(Operation::FormatDevice, Steps::Single, &p);
        }
        Journal::FinalFailedMount => w.run(mount, vol, fail()),
        Journal::FinalFailedUnmount => {
            w.run(mount, vol, OpResult::Success);
            w.run(unmount, vol, fail());
        }
        Journal::Nothing
        | Journal::Off
        | Journal::NothingUnknownPlugin
        | Journal::NothingNoMetadata
        | Journal::OffUnknownPlugin => {}
    }
}

/// The host target the pod-dir / mount-table scan would report for `vol`.
fn host_target(vol: Vol, seen: Seen, journal: Journal) -> HostTarget {
    let p = params(vol);
    let (plugin_name, plugin) = match journal {
        Journal::NothingUnknownPlugin | Journal::OffUnknownPlugin => {
            ("kubernetes.io/secret".to_owned(), None)
        }
        _ => (p.plugin.as_str().to_owned(), Some(p.plugin)),
    };
    let rebuild = match journal {
        Journal::NothingNoMetadata => Rebuild::MissingMetadata {
            what: "vol_data.json: no such file".into(),
        },
        _ => Rebuild::Ready {
            volume: p.volume.clone(),
            selinux: None,
            csi: p.csi().cloned(),
        },
    };
    HostTarget {
        path: p.path().expect("test targets have paths").to_path_buf(),
        target: p.target.clone(),
        plugin_name: plugin_name.into(),
        plugin,
        spec_name: p.spec_name.to_string(),
        kind: p.kind,
        observation: observation(vol, seen),
        rebuild,
    }
}

/// The table's input: a target, what the journal holds, whether the machine
/// rebooted since, what the host shows.
type Input = (Vol, Journal, Boot, Seen);
/// The expected decision; `None`: listed as a failed reconstruction.
type Expected = (Option<MountState>, Reason);

fn check(name: &str, (vol, journal, boot, seen): Input, (want, reason): Expected) {
    let mut w = Writer::new();
    write(&mut w, vol, journal);
    let state = w.state();
    let journal_off = matches!(journal, Journal::Off | Journal::OffUnknownPlugin);
    let journal_knows = !matches!(
        journal,
        Journal::Nothing
            | Journal::Off
            | Journal::NothingUnknownPlugin
            | Journal::NothingNoMetadata
            | Journal::OffUnknownPlugin
    );
    let p = params(vol);
    let mut input = MergeInput {
        journal: (!journal_off).then_some(&state),
        current_boot_id: match boot {
            Boot::Same => BOOT.into(),
            Boot::Rebooted => "boot-b".into(),
        },
        ..MergeInput::default()
    };
    if journal_knows {
        let path = p.path().expect("path").to_path_buf();
        input.observe.insert(path, observation(vol, seen));
    } else {
        input.host_targets.push(host_target(vol, seen, journal));
    }
    let out = merge(&input);
    // the flags of `merge_checked` say what `changed_journal_records` finds
    let (checked, agrees) = merge_checked(&input);
    assert_eq!(checked, out, "{name}");
    // decided on a second thread (the split a large journal gets), the same
    assert_eq!(
        merge_checked_split(&input, 0),
        (checked, agrees.clone()),
        "{name}: split"
    );
    let changed: Vec<&TargetKey> = changed_journal_records(&out, &state, &input.current_boot_id)
        .into_iter()
        .map(|(d, _)| &d.key)
        .collect();
    let flagged: Vec<&TargetKey> = out
        .decisions
        .iter()
        .zip(&agrees)
        .filter(|(_, a)| !**a)
        .map(|(d, _)| &d.key)
        .collect();
    assert_eq!(changed, flagged, "{name}");
    let key = TargetKey::of(&p);
    let Some(want) = want else {
        assert_eq!(out.failed.len(), 1, "{name}: {out:#?}");
        assert_eq!(out.failed[0].reason(), reason, "{name}");
        assert!(out.decisions.is_empty(), "{name}: {out:#?}");
        return;
    };
    let d = out
        .decision(&key)
        .unwrap_or_else(|| panic!("{name}: no decision: {out:#?}"));
    assert_eq!((d.result, d.reason), (want, reason), "{name}: {d:#?}");
    assert_eq!(out.decisions.len(), 1, "{name}");
    assert!(out.failed.is_empty(), "{name}");
    assert_eq!(
        out.unmounted_outside.contains(&key),
        reason == Reason::UnmountedOutside,
        "{name}: unmounted outside"
    );
    let leftover = out.orphan_leftovers.iter().find(|l| l.key == key);
    assert_eq!(
        leftover.is_some(),
        want == MountState::NotMounted && p.kind == TargetKind::Mount,
        "{name}: leftovers {:?}",
        out.orphan_leftovers
    );
    if let Some(l) = leftover {
        assert_eq!(l.dir_present, matches!(seen, Seen::Dir), "{name}");
    }
    assert!(out.needs_device_path_from_node_status.is_empty());
}

#[test]
fn merge_table() {
    use Boot::{Rebooted, Same};
    use Journal as J;
    use MountState::{Mounted, NotMounted, Uncertain};
    use Reason as R;
    use Seen as S;
    use Steps::{Multi, Single};
    use Vol::*;
    #[rustfmt::skip]
    let table: Vec<(&str, Input, Expected)> = vec![
        // mounted with P, host matches: mounted, no plugin call
        ("device mounted, matches", (LocalDevice, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("pod bind mounted, matches", (LocalPod, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("tmpfs mounted, matches", (TmpfsPod, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("dir set up, present", (DirPod, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("device mounted, matches after reboot (fstab)", (LocalDevice, J::Mounted, Rebooted, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("dir survives a reboot", (DirPod, J::Mounted, Rebooted, S::Ours), (Some(Mounted), R::MountedMatches)),
        // mounted with P, identity differs: uncertain, replaced later
        ("device mounted, differs", (LocalDevice, J::Mounted, Same, S::Other), (Some(Uncertain), R::MountedDiffers)),
        ("pod bind mounted, differs", (LocalPod, J::Mounted, Same, S::Other), (Some(Uncertain), R::MountedDiffers)),
        ("tmpfs mounted, something else there", (TmpfsPod, J::Mounted, Same, S::Other), (Some(Uncertain), R::MountedDiffers)),
        ("dir set up, a mount over it", (DirPod, J::Mounted, Same, S::Other), (Some(Uncertain), R::MountedDiffers)),
        ("device mounted, differs after reboot", (LocalDevice, J::Mounted, Rebooted, S::Other), (Some(Uncertain), R::MountedDiffers)),
        // mounted, absent, same boot: unmounted outside volumed
        ("device unmounted outside", (LocalDevice, J::Mounted, Same, S::Absent), (Some(NotMounted), R::UnmountedOutside)),
        ("device unmounted outside, dir left", (LocalDevice, J::Mounted, Same, S::Dir), (Some(NotMounted), R::UnmountedOutside)),
        ("pod bind unmounted outside", (LocalPod, J::Mounted, Same, S::Absent), (Some(NotMounted), R::UnmountedOutside)),
        ("tmpfs unmounted outside", (TmpfsPod, J::Mounted, Same, S::Absent), (Some(NotMounted), R::UnmountedOutside)),
        ("dir deleted outside", (DirPod, J::Mounted, Same, S::Absent), (Some(NotMounted), R::UnmountedOutside)),
        // mounted, absent after a reboot
        ("device gone after reboot", (LocalDevice, J::Mounted, Rebooted, S::Absent), (Some(NotMounted), R::GoneAfterReboot)),
        ("device gone after reboot, dir left", (LocalDevice, J::Mounted, Rebooted, S::Dir), (Some(NotMounted), R::GoneAfterReboot)),
        ("tmpfs gone after reboot", (TmpfsPod, J::Mounted, Rebooted, S::Absent), (Some(NotMounted), R::GoneAfterReboot)),
        ("dir gone after reboot", (DirPod, J::Mounted, Rebooted, S::Absent), (Some(NotMounted), R::GoneAfterReboot)),
        // single-step intents settled from the host: mounts
        ("mount_device intent, done", (LocalDevice, J::MountIntent(Single), Same, S::Ours), (Some(Mounted), R::SingleStepDone)),
        ("mount_device intent, not done", (LocalDevice, J::MountIntent(Single), Same, S::Absent), (Some(NotMounted), R::SingleStepNotDone)),
        ("mount_device intent, another mount", (LocalDevice, J::MountIntent(Single), Same, S::Other), (Some(Uncertain), R::SingleStepDiffers)),
        ("setup bind intent, done", (LocalPod, J::MountIntent(Single), Same, S::Ours), (Some(Mounted), R::SingleStepDone)),
        ("setup bind intent, not done", (LocalPod, J::MountIntent(Single), Same, S::Absent), (Some(NotMounted), R::SingleStepNotDone)),
        ("setup tmpfs intent, done", (TmpfsPod, J::MountIntent(Single), Same, S::Ours), (Some(Mounted), R::SingleStepDone)),
        ("setup tmpfs intent, not done", (TmpfsPod, J::MountIntent(Single), Same, S::Absent), (Some(NotMounted), R::SingleStepNotDone)),
        ("setup dir intent, done", (DirPod, J::MountIntent(Single), Same, S::Ours), (Some(Mounted), R::SingleStepDone)),
        ("setup dir intent, not done", (DirPod, J::MountIntent(Single), Same, S::Absent), (Some(NotMounted), R::SingleStepNotDone)),
        ("mount_device intent, done, after reboot", (LocalDevice, J::MountIntent(Single), Rebooted, S::Ours), (Some(Mounted), R::SingleStepDone)),
        ("mount_device intent, not done, after reboot", (LocalDevice, J::MountIntent(Single), Rebooted, S::Absent), (Some(NotMounted), R::SingleStepNotDone)),
        // single-step intents settled from the host: unmounts
        ("unmount_device intent, done", (LocalDevice, J::UnmountIntent(Single), Same, S::Absent), (Some(NotMounted), R::SingleStepDone)),
        ("unmount_device intent, not done", (LocalDevice, J::UnmountIntent(Single), Same, S::Ours), (Some(Mounted), R::SingleStepNotDone)),
        ("unmount_device intent, another mount", (LocalDevice, J::UnmountIntent(Single), Same, S::Other), (Some(Uncertain), R::SingleStepDiffers)),
        ("teardown bind intent, done", (LocalPod, J::UnmountIntent(Single), Same, S::Absent), (Some(NotMounted), R::SingleStepDone)),
        ("teardown bind intent, not done", (LocalPod, J::UnmountIntent(Single), Same, S::Ours), (Some(Mounted), R::SingleStepNotDone)),
        ("teardown tmpfs intent, done", (TmpfsPod, J::UnmountIntent(Single), Same, S::Absent), (Some(NotMounted), R::SingleStepDone)),
        ("teardown dir intent, done", (DirPod, J::UnmountIntent(Single), Same, S::Absent), (Some(NotMounted), R::SingleStepDone)),
        ("teardown dir intent, not done", (DirPod, J::UnmountIntent(Single), Same, S::Ours), (Some(Mounted), R::SingleStepNotDone)),
        ("unmount_device intent, done by the reboot", (LocalDevice, J::UnmountIntent(Single), Rebooted, S::Absent), (Some(NotMounted), R::SingleStepDone)),
        // multi-step intents: uncertain, re-run idempotently
        ("multi-step mount_device, mounted", (LocalDevice, J::MountIntent(Multi), Same, S::Ours), (Some(Uncertain), R::MultiStepIntent)),
        ("multi-step mount_device, absent", (LocalDevice, J::MountIntent(Multi), Same, S::Absent), (Some(Uncertain), R::MultiStepIntent)),
        ("multi-step mount_device, other", (LocalDevice, J::MountIntent(Multi), Same, S::Other), (Some(Uncertain), R::MultiStepIntent)),
        ("multi-step unmount_device, absent", (LocalDevice, J::UnmountIntent(Multi), Same, S::Absent), (Some(Uncertain), R::MultiStepIntent)),
        ("multi-step tmpfs setup (tmpfs then ownership)", (TmpfsPod, J::MountIntent(Multi), Same, S::Ours), (Some(Uncertain), R::MultiStepIntent)),
        ("multi-step dir setup", (DirPod, J::MountIntent(Multi), Same, S::Ours), (Some(Uncertain), R::MultiStepIntent)),
        ("formatting is never single-step", (LocalDevice, J::FormatIntent, Same, S::Absent), (Some(Uncertain), R::MultiStepIntent)),
        ("multi-step mount_device, mounted after reboot", (LocalDevice, J::MountIntent(Multi), Rebooted, S::Ours), (Some(Uncertain), R::MultiStepIntent)),
        ("multi-step mount_device, gone after reboot", (LocalDevice, J::MountIntent(Multi), Rebooted, S::Absent), (Some(NotMounted), R::GoneAfterReboot)),
        ("multi-step dir setup, absent after reboot", (DirPod, J::MountIntent(Multi), Rebooted, S::Absent), (Some(Uncertain), R::MultiStepIntent)),
        // uncertain in the journal
        ("uncertain, mounted", (LocalDevice, J::Uncertain, Same, S::Ours), (Some(Uncertain), R::JournalUncertain)),
        ("uncertain, absent", (LocalDevice, J::Uncertain, Same, S::Absent), (Some(Uncertain), R::JournalUncertain)),
        ("uncertain, gone after reboot", (LocalDevice, J::Uncertain, Rebooted, S::Absent), (Some(NotMounted), R::GoneAfterReboot)),
        ("uncertain dir, present after reboot", (DirPod, J::Uncertain, Rebooted, S::Ours), (Some(Uncertain), R::JournalUncertain)),
        // unmounted + mounted: uncertain
        ("device unmounted, mounted again", (LocalDevice, J::Unmounted, Same, S::Ours), (Some(Uncertain), R::UnmountedButMounted)),
        ("device unmounted, other mount", (LocalDevice, J::Unmounted, Same, S::Other), (Some(Uncertain), R::UnmountedButMounted)),
        ("pod bind torn down, mounted again", (LocalPod, J::Unmounted, Same, S::Ours), (Some(Uncertain), R::UnmountedButMounted)),
        ("dir torn down, present again", (DirPod, J::Unmounted, Same, S::Ours), (Some(Uncertain), R::UnmountedButMounted)),
        ("device unmounted, mounted after reboot", (LocalDevice, J::Unmounted, Rebooted, S::Ours), (Some(Uncertain), R::UnmountedButMounted)),
        // unmounted + absent: not mounted, leftovers to orphan cleanup
        ("device unmounted, absent", (LocalDevice, J::Unmounted, Same, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        ("device unmounted, dir left", (LocalDevice, J::Unmounted, Same, S::Dir), (Some(NotMounted), R::UnmountedAbsent)),
        ("pod bind torn down, dir left", (LocalPod, J::Unmounted, Same, S::Dir), (Some(NotMounted), R::UnmountedAbsent)),
        ("tmpfs torn down, absent after reboot", (TmpfsPod, J::Unmounted, Rebooted, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        ("dir torn down, absent", (DirPod, J::Unmounted, Same, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        // nothing + mounted in the kubelet layout: rebuilt from the host, uncertain
        ("found device mount", (LocalDevice, J::Nothing, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("found pod bind", (LocalPod, J::Nothing, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("found tmpfs", (TmpfsPod, J::Nothing, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("found hostPath dir", (HostPath, J::Nothing, Same, S::Dir), (Some(Uncertain), R::RebuiltFromHost)),
        // nothing + a bare volume dir: a found dir target
        ("found kubelet-era emptyDir", (DirPod, J::Nothing, Same, S::Dir), (Some(Mounted), R::FoundDir)),
        ("found mount-point dir without a mount", (LocalPod, J::Nothing, Same, S::Dir), (Some(NotMounted), R::HostLeftover)),
        // nothing, rebuild fails
        ("found, unknown plugin", (LocalPod, J::NothingUnknownPlugin, Same, S::Ours), (None, R::RebuildFailed)),
        ("found, missing metadata", (LocalPod, J::NothingNoMetadata, Same, S::Ours), (None, R::RebuildFailed)),
        // a final failure outcome: the state before the op
        ("failed mount_device: not mounted before", (LocalDevice, J::FinalFailedMount, Same, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        ("failed unmount_device: still mounted", (LocalDevice, J::FinalFailedUnmount, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("failed teardown of a dir: still set up", (DirPod, J::FinalFailedUnmount, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        // none targets: no observation, the journal stands
        ("hostPath set up", (HostPath, J::Mounted, Same, S::Absent), (Some(Mounted), R::JournalStands)),
        ("hostPath set up, after reboot", (HostPath, J::Mounted, Rebooted, S::Absent), (Some(Mounted), R::JournalStands)),
        ("hostPath torn down", (HostPath, J::Unmounted, Same, S::Absent), (Some(NotMounted), R::JournalStands)),
        ("hostPath setup intent", (HostPath, J::MountIntent(Single), Same, S::Absent), (Some(Uncertain), R::JournalStands)),
        // SELinux
        ("label agrees, categories reordered", (LocalDevice, J::Mounted, Same, S::Label(LABEL_REORDERED)), (Some(Mounted), R::MountedMatches)),
        ("label disagrees", (LocalDevice, J::Mounted, Same, S::Label(LABEL_OTHER)), (Some(Uncertain), R::SelinuxLabelDiffers)),
        ("pod label disagrees", (LocalPod, J::Mounted, Same, S::Label(LABEL_OTHER)), (Some(Uncertain), R::SelinuxLabelDiffers)),
        ("tmpfs label disagrees", (TmpfsPod, J::Mounted, Same, S::Label(LABEL_OTHER)), (Some(Uncertain), R::SelinuxLabelDiffers)),
        ("mount intent, label agrees reordered", (LocalDevice, J::MountIntent(Single), Same, S::Label(LABEL_REORDERED)), (Some(Mounted), R::SingleStepDone)),
        ("mount intent, label disagrees", (LocalDevice, J::MountIntent(Single), Same, S::Label(LABEL_OTHER)), (Some(Uncertain), R::SelinuxLabelDiffers)),
        // journal off: the KEP-3756 baseline
        ("off: device mount found", (LocalDevice, J::Off, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("off: pod bind found", (LocalPod, J::Off, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("off: tmpfs found", (TmpfsPod, J::Off, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("off: mount-point dir without a mount", (LocalPod, J::Off, Same, S::Dir), (Some(Uncertain), R::RebuiltFromHost)),
        ("off: emptyDir dir found: uncertain too (KEP-3756)", (DirPod, J::Off, Same, S::Dir), (Some(Uncertain), R::RebuiltFromHost)),
        ("off: unknown plugin", (LocalPod, J::OffUnknownPlugin, Same, S::Ours), (None, R::RebuildFailed)),
        // CSI: the host against what the call's outcome recorded at the path
        ("csi published with a mount, still there", (CsiPod, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("csi recorded mount gone, dir left", (CsiPod, J::Mounted, Same, S::Dir), (Some(NotMounted), R::UnmountedOutside)),
        ("csi path missing", (CsiPod, J::Mounted, Same, S::Absent), (Some(Uncertain), R::CsiPathMissing)),
        ("csi a different mount", (CsiPod, J::Mounted, Same, S::Other), (Some(Uncertain), R::MountedDiffers)),
        ("csi after a reboot, mount there", (CsiPod, J::Mounted, Rebooted, S::Ours), (Some(Uncertain), R::CsiAfterReboot)),
        ("csi after a reboot, gone", (CsiPod, J::Mounted, Rebooted, S::Absent), (Some(Uncertain), R::CsiAfterReboot)),
        ("csi published without a mount, dir there", (CsiPodBare, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("csi recorded no mount, a mount there", (CsiPodBare, J::Mounted, Same, S::Other), (Some(Uncertain), R::MountedDiffers)),
        ("csi recorded no mount, path missing", (CsiPodBare, J::Mounted, Same, S::Absent), (Some(Uncertain), R::CsiPathMissing)),
        ("csi publish intent without outcome", (CsiPod, J::MountIntent(Multi), Same, S::Ours), (Some(Uncertain), R::MultiStepIntent)),
        ("csi unpublished, gone", (CsiPod, J::Unmounted, Same, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        ("csi off: found mounted", (CsiPod, J::Off, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        // a read-only claim: the journal says `ro`, a writable mount there is not it
        ("read-only bind, still ro", (LocalPodRo, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("read-only bind found writable", (LocalPodRo, J::Mounted, Same, S::Writable), (Some(Uncertain), R::MountedDiffers)),
        ("read-only bind intent, done", (LocalPodRo, J::MountIntent(Single), Same, S::Ours), (Some(Mounted), R::SingleStepDone)),
        ("read-only bind intent, found writable", (LocalPodRo, J::MountIntent(Single), Same, S::Writable), (Some(Uncertain), R::SingleStepDiffers)),
        ("csi published readonly, still ro", (CsiPodRo, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        // raw block maps: the device's global map dir, a pod's symlink and bind
        ("block map dir there", (BlockDevice, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("block map dir removed outside", (BlockDevice, J::Mounted, Same, S::Absent), (Some(NotMounted), R::UnmountedOutside)),
        ("block map dir removed, found again", (BlockDevice, J::Unmounted, Same, S::Dir), (Some(Uncertain), R::UnmountedButMounted)),
        ("block map dir removed, gone", (BlockDevice, J::Unmounted, Same, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        ("pod block map whole", (BlockPod, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("pod block map whole after a reboot (a static bind)", (BlockPod, J::Mounted, Rebooted, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("pod block map lost outside", (BlockPod, J::Mounted, Same, S::Absent), (Some(NotMounted), R::UnmountedOutside)),
        ("pod block map gone after a reboot", (BlockPod, J::Mounted, Rebooted, S::Absent), (Some(NotMounted), R::GoneAfterReboot)),
        ("pod block map partly lost outside", (BlockPod, J::Mounted, Same, S::Partial), (Some(Uncertain), R::MountedDiffers)),
        ("pod block map after a reboot: the link left, no bind", (BlockPod, J::Mounted, Rebooted, S::Partial), (Some(Uncertain), R::MountedDiffers)),
        ("pod block map links another device", (BlockPod, J::Mounted, Same, S::Other), (Some(Uncertain), R::MountedDiffers)),
        ("pod block map: a dir at the link", (BlockPod, J::Mounted, Same, S::Dir), (Some(Uncertain), R::MountedDiffers)),
        ("pod block map intent, in part", (BlockPod, J::MountIntent(Multi), Same, S::Partial), (Some(Uncertain), R::MultiStepIntent)),
        ("pod block unmapped, map there again", (BlockPod, J::Unmounted, Same, S::Ours), (Some(Uncertain), R::UnmountedButMounted)),
        ("pod block unmapped, a link left", (BlockPod, J::Unmounted, Same, S::Partial), (Some(Uncertain), R::UnmountedButMounted)),
        ("pod block unmapped, gone", (BlockPod, J::Unmounted, Same, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        ("found pod block map", (BlockPod, J::Nothing, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("found pod block map in part", (BlockPod, J::Nothing, Same, S::Partial), (Some(Uncertain), R::RebuiltFromHost)),
        ("found block map dir", (BlockDevice, J::Nothing, Same, S::Dir), (Some(Mounted), R::FoundDir)),
        ("off: pod block map found", (BlockPod, J::Off, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("off: block map dir found", (BlockDevice, J::Off, Same, S::Dir), (Some(Uncertain), R::RebuiltFromHost)),
        // a CSI block pod target follows the block rows, not the CSI ones:
        // its map is its symlink (to the publish file) and the bind on its
        // file in the CSI global map path
        ("csi block map whole", (CsiBlockPod, J::Mounted, Same, S::Ours), (Some(Mounted), R::MountedMatches)),
        ("csi block map lost outside", (CsiBlockPod, J::Mounted, Same, S::Absent), (Some(NotMounted), R::UnmountedOutside)),
        ("csi block map in part", (CsiBlockPod, J::Mounted, Same, S::Partial), (Some(Uncertain), R::MountedDiffers)),
        ("csi block unmapped, gone", (CsiBlockPod, J::Unmounted, Same, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        ("csi block staging dir there", (CsiBlockDevice, J::Mounted, Same, S::Dir), (Some(Mounted), R::MountedMatches)),
        ("csi block stage intent", (CsiBlockDevice, J::MountIntent(Multi), Same, S::Dir), (Some(Uncertain), R::MultiStepIntent)),
        // after a reboot the driver may have lost what it staged, whatever
        // dir is left: staged again, as a filesystem volume's staging is
        ("csi block staging dir after a reboot", (CsiBlockDevice, J::Mounted, Rebooted, S::Dir), (Some(Uncertain), R::CsiAfterReboot)),
        ("csi block staging dir gone after a reboot", (CsiBlockDevice, J::Mounted, Rebooted, S::Absent), (Some(Uncertain), R::CsiAfterReboot)),
        ("csi block unstaged, after a reboot", (CsiBlockDevice, J::Unmounted, Rebooted, S::Absent), (Some(NotMounted), R::UnmountedAbsent)),
        ("csi block map after a reboot: the link left, no bind", (CsiBlockPod, J::Mounted, Rebooted, S::Partial), (Some(Uncertain), R::MountedDiffers)),
        // a CSI block map no journal knows (`--journal off`, a kubelet's),
        // found by our bind on the pod's file: rebuilt from the host with
        // its staging dir, named by its `vol_data.json`
        ("off: csi block map found", (CsiBlockPod, J::Off, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("off: csi block map found in part", (CsiBlockPod, J::Off, Same, S::Partial), (Some(Uncertain), R::RebuiltFromHost)),
        ("off: csi block staging dir found", (CsiBlockDevice, J::Off, Same, S::Dir), (Some(Uncertain), R::RebuiltFromHost)),
        ("found csi block map", (CsiBlockPod, J::Nothing, Same, S::Ours), (Some(Uncertain), R::RebuiltFromHost)),
        ("found csi block staging dir", (CsiBlockDevice, J::Nothing, Same, S::Dir), (Some(Mounted), R::FoundDir)),
        ("found csi block map without vol_data.json", (CsiBlockPod, J::NothingNoMetadata, Same, S::Ours), (None, R::RebuildFailed)),
        ("found csi block map in part without vol_data.json", (CsiBlockPod, J::NothingNoMetadata, Same, S::Partial), (None, R::RebuildFailed)),
        ("csi published readonly, found writable", (CsiPodRo, J::Mounted, Same, S::Writable), (Some(Uncertain), R::MountedDiffers)),
    ];
    for (name, input, expected) in table {
        check(name, input, expected);
    }
}

/// A device target unmounted outside while pod binds of the same
/// major:minor remain: the pods stay mounted.
#[test]
fn device_absent_while_pod_binds_remain() {
    let mut w = Writer::new();
    write(&mut w, Vol::LocalDevice, Journal::Mounted);
    write(&mut w, Vol::LocalPod, Journal::Mounted);
    let mut other_pod = params(Vol::LocalPod);
    other_pod.target = TargetRef::Pod(PodUid::new("pod2").expect("uid"));
    other_pod.pod_mount_path =
        Some(format!("{ROOT}/pods/pod2/volumes/kubernetes.io~local-volume/pv1").into());
    // The second pod's SetUp crashed after its bind: no observed identity.
    w.intent(Operation::SetUp, Steps::Single, &other_pod);
    let state = w.state();
    let mut input = MergeInput {
        journal: Some(&state),
        current_boot_id: BOOT.into(),
        ..MergeInput::default()
    };
    for p in [params(Vol::LocalPod), other_pod.clone()] {
        let path = p.path().expect("path").to_path_buf();
        input
            .observe
            .insert(path, observation(Vol::LocalPod, Seen::Ours));
    }
    let out = merge(&input);
    let result = |p: &TargetParams| {
        let d = out.decision(&TargetKey::of(p)).expect("decided");
        (d.result, d.reason)
    };
    assert_eq!(
        result(&params(Vol::LocalDevice)),
        (MountState::NotMounted, Reason::UnmountedOutside)
    );
    assert_eq!(
        result(&params(Vol::LocalPod)),
        (MountState::Mounted, Reason::MountedMatches)
    );
    assert_eq!(
        result(&other_pod),
        (MountState::Mounted, Reason::SingleStepDone)
    );
    assert_eq!(
        out.unmounted_outside,
        vec![TargetKey::of(&params(Vol::LocalDevice))]
    );
}

/// Without a recorded identity, a pod bind is compared with the mount at
/// the device mount path (major:minor and root), not with path strings.
#[test]
fn setup_intent_compares_the_bind_with_the_device_mount() {
    let mut w = Writer::new();
    write(&mut w, Vol::LocalDevice, Journal::Mounted);
    let mut p = params(Vol::LocalPod);
    p = p.with_device_path(Some("/dev/disk/by-id/wwn-0x5000".into()));
    w.intent(Operation::SetUp, Steps::Single, &p);
    let state = w.state();
    let pod_path = p.path().expect("path").to_path_buf();
    let run = |device_seen: Seen, pod_root: &str| {
        let mut input = MergeInput {
            journal: Some(&state),
            current_boot_id: BOOT.into(),
            ..MergeInput::default()
        };
        input.observe.insert(
            device_mount_path(),
            observation(Vol::LocalDevice, device_seen),
        );
        let bind = MountIdentity {
            root: pod_root.into(),
            ..ours(Vol::LocalPod)
        };
        input
            .observe
            .insert(pod_path.clone(), mounted(bind, "/dev/loop3"));
        let out = merge(&input);
        let d = out.decision(&TargetKey::of(&p)).expect("decided");
        (d.result, d.reason)
    };
    assert_eq!(
        run(Seen::Ours, "/"),
        (MountState::Mounted, Reason::SingleStepDone)
    );
    assert_eq!(
        run(Seen::Ours, "/sub"),
        (MountState::Uncertain, Reason::SingleStepDiffers)
    );
    // Device mount gone and the by-id path unresolved: cannot confirm, never adopt.
    assert_eq!(
        run(Seen::Absent, "/"),
        (MountState::Uncertain, Reason::SingleStepDiffers)
    );
}

/// A device path the caller resolved to major:minor (a `/dev/disk/by-*`
/// link) is compared by number.
#[test]
fn mount_intent_resolves_device_links_through_device_ids() {
    let mut w = Writer::new();
    let mut p = params(Vol::LocalDevice);
    p = p.with_device_path(Some("/dev/disk/by-id/wwn-0x5000".into()));
    w.intent(Operation::MountDevice, Steps::Single, &p);
    let state = w.state();
    let mut input = MergeInput {
        journal: Some(&state),
        current_boot_id: BOOT.into(),
        ..MergeInput::default()
    };
    input.observe.insert(
        device_mount_path(),
        observation(Vol::LocalDevice, Seen::Ours),
    );
    let key = TargetKey::of(&p);
    let unresolved = merge(&input);
    assert_eq!(
        unresolved.decision(&key).map(|d| d.reason),
        Some(Reason::SingleStepDiffers)
    );
    input.device_ids.insert(
        "/dev/disk/by-id/wwn-0x5000".into(),
        DevId { major: 7, minor: 3 },
    );
    let resolved = merge(&input);
    assert_eq!(
        resolved.decision(&key).map(|d| (d.result, d.reason)),
        Some((MountState::Mounted, Reason::SingleStepDone))
    );
}

/// A local PV that is a directory is bound straight into the pod (no
/// device target). The daemon's SetUp outcome records no identity, so the
/// bind is compared with what a bind of that directory shows
/// (`bind_sources`: the filesystem holding it, and its root there), never
/// with the mount's source string (the filesystem's device).
#[test]
fn a_directory_pv_bind_is_compared_with_the_directory_it_binds() {
    const DIR: &str = "/mnt/disks/pv1";
    let mut p = params(Vol::LocalPod);
    p = p.with_device_path(Some(DIR.into()));
    p = p.with_device_mount_path(None);
    // a PV's fsType means nothing for a directory: not compared
    p.fs_type = Some("xfs".into());
    p = p.with_selinux(None);
    let mut w = Writer::new();
    let i = w.intent(Operation::SetUp, Steps::Single, &p);
    w.push(Body::Outcome {
        intent_seq: i,
        op: Operation::SetUp,
        result: OpResult::Success,
        observed: None,
    });
    let state = w.state();
    let vda1 = DevId { major: 8, minor: 1 };
    let fs = |root: &str| MountIdentity {
        dev: vda1,
        root: root.into(),
        fs_type: "ext4".into(),
        read_only: false,
        selinux: None,
    };
    let run = |source: Option<MountIdentity>, seen_root: &str| {
        let mut input = MergeInput {
            journal: Some(&state),
            current_boot_id: BOOT.into(),
            ..MergeInput::default()
        };
        input.observe.insert(
            p.pod_mount_path.clone().unwrap().to_path_buf(),
            mounted(fs(seen_root), "/dev/vda1"),
        );
        if let Some(id) = source {
            input.bind_sources.insert(DIR.into(), id);
        }
        let out = merge(&input);
        let d = out.decision(&TargetKey::of(&p)).expect("decided");
        (d.result, d.reason)
    };
    let cases = [
        (
            "the bind of the dir",
            Some(fs(DIR)),
            DIR,
            MountState::Mounted,
            Reason::MountedMatches,
        ),
        (
            "another dir of that filesystem",
            Some(fs(DIR)),
            "/mnt/other",
            MountState::Uncertain,
            Reason::MountedDiffers,
        ),
        (
            "the dir not found in the table: unconfirmed",
            None,
            DIR,
            MountState::Uncertain,
            Reason::MountedDiffers,
        ),
    ];
    for (what, source, seen_root, result, reason) in cases {
        assert_eq!(run(source, seen_root), (result, reason), "{what}");
    }
}

/// A host-found target at a journal target's path is the same target: the
/// journal decides, with the host target's observation.
#[test]
fn host_target_at_a_journal_path_is_the_journal_target() {
    let mut w = Writer::new();
    write(&mut w, Vol::LocalPod, Journal::Mounted);
    let state = w.state();
    let mut found = host_target(Vol::LocalPod, Seen::Ours, Journal::Nothing);
    found.rebuild = Rebuild::MissingMetadata {
        what: "irrelevant".into(),
    };
    let input = MergeInput {
        journal: Some(&state),
        current_boot_id: BOOT.into(),
        host_targets: vec![found],
        ..MergeInput::default()
    };
    let out = merge(&input);
    assert!(out.failed.is_empty());
    assert_eq!(out.decisions.len(), 1);
    assert_eq!(out.decisions[0].reason, Reason::MountedMatches);
}

#[test]
fn reasons_are_distinct_snake_case() {
    let names: std::collections::BTreeSet<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(names.len(), Reason::ALL.len());
    for n in names {
        assert!(n.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{n}");
    }
}

/// A journal holding one target of every journal row, on one boot.
fn busy_journal(w: &mut Writer) -> Vec<(Vol, Seen)> {
    // One target per volume: devices and pods of distinct volumes.
    write(w, Vol::LocalDevice, Journal::MountIntent(Steps::Multi));
    write(w, Vol::LocalPod, Journal::Mounted);
    write(w, Vol::TmpfsPod, Journal::UnmountIntent(Steps::Single));
    write(w, Vol::DirPod, Journal::Mounted);
    write(w, Vol::HostPath, Journal::Unmounted);
    vec![
        (Vol::LocalDevice, Seen::Ours),
        (Vol::LocalPod, Seen::Ours),
        (Vol::TmpfsPod, Seen::Absent),
        (Vol::DirPod, Seen::Ours),
        (Vol::HostPath, Seen::Absent),
    ]
}

/// Reconstruction writes its decisions; replaying them yields exactly the
/// decided states.
#[test]
fn journal_records_replay_to_the_decisions() {
    let mut w = Writer::new();
    let seen = busy_journal(&mut w);
    let state = w.state();
    let found = HostTarget {
        path: format!("{ROOT}/pods/pod9/volumes/kubernetes.io~empty-dir/old").into(),
        target: TargetRef::Pod(PodUid::new("pod9").expect("uid")),
        plugin_name: "kubernetes.io/empty-dir".into(),
        plugin: Some(PluginName::EmptyDir),
        spec_name: "old".into(),
        kind: TargetKind::Dir,
        observation: HostObservation::DirPresent,
        rebuild: Rebuild::Ready {
            volume: UniqueVolumeName::from_raw("kubernetes.io/empty-dir/pod9-old"),
            selinux: None,
            csi: None,
        },
    };
    let mut input = MergeInput {
        journal: Some(&state),
        current_boot_id: "boot-b".into(),
        host_targets: vec![found],
        ..MergeInput::default()
    };
    observing(&mut input, &seen);
    let out = merge(&input);
    assert_eq!(out.decisions.len(), 6);
    let records = to_journal_records(&out);
    assert_eq!(records.len(), out.decisions.len());
    let mut replayed = state.clone();
    let first = replayed.last_seq() + 1;
    for (seq, body) in (first..).zip(records) {
        replayed.apply(&Record {
            seq,
            wall_time_ns: seq,
            boot_id: "boot-b".into(),
            body: body.into(),
        });
    }
    assert!(
        replayed.anomalies().is_empty(),
        "{:?}",
        replayed.anomalies()
    );
    for d in &out.decisions {
        let e = replayed.get(&d.key).expect("recorded");
        assert_eq!(e.reported_state(), d.result, "{:?}", d.key);
        assert_eq!(e.reason.as_deref(), Some(d.reason.as_str()));
        assert_eq!(&*e.boot_id, "boot-b");
    }
    // Merging again on the same boot changes nothing.
    let again = merge(&MergeInput {
        journal: Some(&replayed),
        ..input.clone()
    });
    for d in &again.decisions {
        let before = out.decision(&d.key).expect("same targets");
        assert_eq!(d.result, before.result, "{:?}: {:?}", d.key, d.reason);
    }
}

/// A journal decided in two halves on two threads gives the decisions,
/// findings and flags of one pass, in the same order.
#[test]
fn a_journal_decided_in_halves_is_decided_as_in_one_pass() {
    let mut w = Writer::new();
    let seen = busy_journal(&mut w);
    let state = w.state();
    // Found by the scan at journal targets' paths, the first and the last
    // in key order, and not to be rebuilt: claimed by their entries,
    // whichever half decides them (unclaimed, each would be a failed
    // reconstruction).
    let found = |vol| HostTarget {
        rebuild: Rebuild::MissingMetadata {
            what: "irrelevant".into(),
        },
        ..host_target(vol, Seen::Ours, Journal::Nothing)
    };
    let mut input = MergeInput {
        journal: Some(&state),
        current_boot_id: BOOT.into(),
        host_targets: vec![found(Vol::TmpfsPod), found(Vol::LocalPod)],
        ..MergeInput::default()
    };
    observing(&mut input, &seen);
    let one_pass = merge_checked_split(&input, usize::MAX);
    assert!(one_pass.0.failed.is_empty(), "{:#?}", one_pass.0.failed);
    assert_eq!(one_pass.0.decisions.len(), 5, "{:#?}", one_pass.0);
    assert!(
        !one_pass.0.orphan_leftovers.is_empty() && one_pass.1.contains(&false),
        "the input exercises findings and flags: {:#?}",
        one_pass
    );
    let keys: Vec<String> = one_pass
        .0
        .decisions
        .iter()
        .map(|d| d.key.volume.as_str().to_owned())
        .collect();
    assert!(
        keys.first().is_some_and(|k| k.contains("pod1-cache"))
            && keys.last().is_some_and(|k| k.contains("local-volume")),
        "the host targets' entries are first and last: {keys:?}"
    );
    for split_at in 0..=5 {
        assert_eq!(
            merge_checked_split(&input, split_at),
            one_pass,
            "second thread from entry {split_at}"
        );
    }
}

/// The ASW filled from a journal the merge agrees with is the ASW the
/// decisions fill; a journal with an operation in flight or from another
/// boot gives none.
#[test]
fn the_asw_as_the_journal_says_is_the_decisions_asw_when_they_agree() {
    let mut w = Writer::new();
    write(&mut w, Vol::LocalDevice, Journal::Mounted);
    write(&mut w, Vol::LocalPod, Journal::Mounted);
    write(&mut w, Vol::TmpfsPod, Journal::Mounted);
    write(&mut w, Vol::DirPod, Journal::Unmounted);
    write(&mut w, Vol::HostPath, Journal::Mounted);
    let state = w.state();
    let input = seeing(
        &state,
        &[
            (Vol::LocalDevice, Seen::Ours),
            (Vol::LocalPod, Seen::Ours),
            (Vol::TmpfsPod, Seen::Ours),
            (Vol::DirPod, Seen::Absent),
            // a hostPath is the host's own dir, never a mount of volumed's
            (Vol::HostPath, Seen::Dir),
        ],
    );
    let (out, agrees) = merge_checked(&input);
    assert_eq!(agrees, [true; 5], "{out:#?}");
    let mut asw = ActualStateOfWorld::new();
    assert!(apply_to_asw(&out, &mut asw).is_empty());
    let (said, errors) = asw_as_journal_says(&state, BOOT).expect("every entry settled");
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(said.snapshot(), asw.snapshot());
    assert_eq!(said.snapshot().volumes.len(), 3, "{:#?}", said.snapshot());
    for v in asw.snapshot().volumes {
        for p in v.pods {
            assert_eq!(
                said.is_volume_reconstructed(&v.volume, &p.pod_uid),
                asw.is_volume_reconstructed(&v.volume, &p.pod_uid)
            );
        }
    }

    assert!(asw_as_journal_says(&state, "boot-b").is_none(), "rebooted");
    write(&mut w, Vol::TmpfsPod, Journal::UnmountIntent(Steps::Single));
    assert!(
        asw_as_journal_says(&w.state(), BOOT).is_none(),
        "an operation in flight"
    );
}

#[test]
fn apply_fills_the_asw() {
    let mut w = Writer::new();
    write(&mut w, Vol::LocalDevice, Journal::Mounted);
    write(&mut w, Vol::LocalPod, Journal::Mounted);
    write(&mut w, Vol::TmpfsPod, Journal::MountIntent(Steps::Multi));
    write(&mut w, Vol::DirPod, Journal::Unmounted);
    let state = w.state();
    let input = seeing(
        &state,
        &[
            (Vol::LocalDevice, Seen::Ours),
            (Vol::LocalPod, Seen::Ours),
            (Vol::TmpfsPod, Seen::Ours),
            (Vol::DirPod, Seen::Absent),
        ],
    );
    let out = merge(&input);
    let mut asw = ActualStateOfWorld::new();
    let errors = apply_to_asw(&out, &mut asw);
    assert!(errors.is_empty(), "{errors:?}");
    let snap = asw.snapshot();
    let names: Vec<&str> = snap.volumes.iter().map(|v| v.volume.as_str()).collect();
    assert_eq!(
        names,
        [
            "kubernetes.io/empty-dir/pod1-cache",
            "kubernetes.io/local-volume/pv1"
        ],
        "not-mounted targets are not recorded"
    );
    let tmpfs = &snap.volumes[0];
    assert!(tmpfs.device.is_none());
    assert_eq!(tmpfs.pods.len(), 1);
    assert_eq!(tmpfs.pods[0].state, MountState::Uncertain);
    assert_eq!(tmpfs.pods[0].kind, TargetKind::Mount);
    assert_eq!(
        tmpfs.pods[0].selinux_context,
        SeLinuxState::Context(ctx(LABEL)),
        "uncertain with a mount seen: the label seen"
    );
    let pod = pod();
    assert!(asw.is_volume_reconstructed(&tmpfs.volume, &pod));
    let local = &snap.volumes[1];
    let device = local.device.as_ref().expect("device target");
    assert_eq!(device.state, MountState::Mounted);
    assert_eq!(
        device.device_path.as_deref(),
        Some(std::path::Path::new("/dev/loop3"))
    );
    assert_eq!(device.mount_path, Some(device_mount_path()));
    assert_eq!(device.selinux_context, SeLinuxState::Context(ctx(LABEL)));
    assert_eq!(local.pods.len(), 1);
    assert_eq!(local.pods[0].pod_uid, pod);
    assert_eq!(local.pods[0].state, MountState::Mounted);
    assert_eq!(
        Some(local.pods[0].mount_path.as_path()),
        params(Vol::LocalPod).path()
    );
}

/// A device target decided not mounted is kept in the ASW, with its paths,
/// when its volume still has a pod there.
#[test]
fn apply_keeps_an_unmounted_device_of_a_volume_in_use() {
    let mut w = Writer::new();
    write(&mut w, Vol::LocalDevice, Journal::Mounted);
    write(&mut w, Vol::LocalPod, Journal::Mounted);
    let state = w.state();
    let mut input = MergeInput {
        journal: Some(&state),
        current_boot_id: BOOT.into(),
        ..MergeInput::default()
    };
    let pod_path = params(Vol::LocalPod).path().expect("path").to_path_buf();
    input
        .observe
        .insert(pod_path, observation(Vol::LocalPod, Seen::Ours));
    let out = merge(&input);
    let mut asw = ActualStateOfWorld::new();
    assert!(apply_to_asw(&out, &mut asw).is_empty());
    let snap = asw.snapshot();
    let device = snap.volumes[0].device.as_ref().expect("device");
    assert_eq!(device.state, MountState::NotMounted);
    assert_eq!(device.mount_path, Some(device_mount_path()));
    assert_eq!(snap.volumes[0].pods[0].state, MountState::Mounted);
}

/// The same when the pod target is host-only (decided after every journal
/// target, in a run of its own): the device's run adds no volume, and its
/// not-mounted device is recorded once the host-only run has added it.
#[test]
fn apply_keeps_an_unmounted_device_of_a_volume_a_host_only_pod_uses() {
    let mut w = Writer::new();
    write(&mut w, Vol::LocalDevice, Journal::Mounted);
    let state = w.state();
    let input = MergeInput {
        journal: Some(&state),
        current_boot_id: BOOT.into(),
        host_targets: vec![host_target(Vol::LocalPod, Seen::Ours, Journal::Nothing)],
        ..MergeInput::default()
    };
    let out = merge(&input);
    let results: Vec<_> = out
        .decisions
        .iter()
        .map(|d| (d.target_label(), d.result))
        .collect();
    assert_eq!(
        results,
        [
            ("device", MountState::NotMounted),
            ("pod", MountState::Uncertain)
        ]
    );
    let mut asw = ActualStateOfWorld::new();
    assert!(apply_to_asw(&out, &mut asw).is_empty());
    let snap = asw.snapshot();
    assert_eq!(snap.volumes.len(), 1);
    let device = snap.volumes[0].device.as_ref().expect("device");
    assert_eq!(device.state, MountState::NotMounted);
    assert_eq!(device.mount_path, Some(device_mount_path()));
    assert_eq!(snap.volumes[0].pods[0].state, MountState::Uncertain);
}

/// A host-found target with a journal target's key under another path is
/// not decided twice: the journal's decision stands.
#[test]
fn host_target_with_a_journal_key_elsewhere_is_not_decided_twice() {
    let mut w = Writer::new();
    write(&mut w, Vol::LocalDevice, Journal::Mounted);
    let state = w.state();
    let mut found = host_target(Vol::LocalDevice, Seen::Ours, Journal::Nothing);
    found.path = "/elsewhere/globalmount".into();
    let mut input = MergeInput {
        journal: Some(&state),
        current_boot_id: BOOT.into(),
        host_targets: vec![found],
        ..MergeInput::default()
    };
    input.observe.insert(
        device_mount_path(),
        observation(Vol::LocalDevice, Seen::Ours),
    );
    let out = merge(&input);
    assert_eq!(out.decisions.len(), 1);
    let d = &out.decisions[0];
    assert_eq!(
        (d.result, d.reason),
        (MountState::Mounted, Reason::MountedMatches)
    );
    assert_eq!(d.target_label(), "device");
    assert_eq!(d.journal_says.to_string(), "mounted");
    assert_eq!(d.host_says.as_str(), "matches");
}

#[test]
fn journal_says_reads_well() {
    let table = [
        (
            JournalSays::IntentSingleStep(Operation::SetUp),
            "intent setup (single step)",
        ),
        (
            JournalSays::IntentMultiStep(Operation::MountDevice),
            "intent mount_device (multi step)",
        ),
        (JournalSays::Off, "off"),
    ];
    for (says, want) in table {
        assert_eq!(says.to_string(), want);
    }
}

#[test]
fn plain_spellings_compare_as_paths_do() {
    let spellings = [
        "/a/b", "/a//b", "/a/./b", "/a/b/", "/a/b/.", "//a/b", "/a/b//", "a/b", "./a/b", ".", "/",
        "/.", "/a/..", "/a/../b", "/a/.b", "/a/b.",
    ];
    for x in spellings {
        let (px, bx) = (Path::new(x), super::paths::plain_bytes(Path::new(x)));
        assert_eq!(
            super::paths::is_plain(x.as_bytes()),
            px.components()
                .collect::<PathBuf>()
                .as_os_str()
                .as_encoded_bytes()
                == x.as_bytes(),
            "{x}"
        );
        for y in spellings {
            let by = super::paths::plain_bytes(Path::new(y));
            assert_eq!(px == Path::new(y), bx == by, "{x} vs {y}");
        }
    }
}

#[test]
fn observe_by_bytes_answers_as_the_path_map() {
    let mut observe = PathMap::default();
    observe.insert(PathBuf::from("/k/pods/a/"), HostObservation::DirPresent);
    observe.insert(PathBuf::from("/k/plugins/x"), HostObservation::Absent);
    let by_bytes = super::paths::ObserveByBytes::new(&observe);
    for q in [
        "/k/pods/a",
        "/k/pods/a/",
        "/k//pods/./a",
        "/k/plugins/x",
        "/k/plugins/x/.",
        "/k/pods/b",
        "/k/plugins",
    ] {
        assert_eq!(by_bytes.get(Path::new(q)), observe.get(Path::new(q)), "{q}");
    }
}

#[test]
fn a_csi_mount_without_the_label_asked_for_keeps_that_label_in_the_asw() {
    let mut w = Writer::new();
    write(&mut w, Vol::CsiPod, Journal::Mounted);
    let state = w.state();
    let out = merge(&seeing(&state, &[(Vol::CsiPod, Seen::Ours)]));
    let mut asw = ActualStateOfWorld::new();
    let errors = apply_to_asw(&out, &mut asw);
    assert!(errors.is_empty(), "{errors:?}");
    let snap = asw.snapshot();
    let pod = &snap.volumes[0].pods[0];
    assert_eq!(pod.state, MountState::Mounted);
    assert_eq!(
        pod.selinux_context,
        SeLinuxState::Context(ctx(LABEL)),
        "the label asked for, not the driver's bare mount: no remount for it at every restart"
    );
}
