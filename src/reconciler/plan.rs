//! What the reconciler should start now: a pure function of the DSW, the ASW
//! and which operations are already running or backing off.
//!
//! The kubelet's reconciler, in the order of KEP-3756's "Proposed
//! VolumeManager startup" (docs/kubelet.md):
//!
//! 1. **tear down** every pod target the ASW holds (mounted *or* uncertain)
//!    whose pod no longer wants it (or wants it with another SELinux label) —
//!    only once every pod source has been listed (`dsw.is_populated()`);
//! 2. **mount** every (volume, pod) the DSW wants and the ASW does not hold
//!    mounted: MountDevice first when the volume has a device target that is
//!    not mounted, then SetUp — started at once, populated or not; a volume
//!    whose pod targets are mounted but whose device target is known not to
//!    be (unmounted outside volumed) gets MountDevice alone;
//! 3. **unmount the device** of every volume with no pod target left whose
//!    device may be mounted and that no pod wants — again only once populated;
//!    a volume with nothing left is dropped from the ASW (`Forget`).
//!
//! *Invariant:* nothing is unmounted before the DSW is populated, and a pod
//! target that a desired pod still uses is never torn down.

use crate::model::{AccessMode, MountState, PodUid, UniqueVolumeName, VolumeSpec};
use crate::state::{ActualStateOfWorld, DesiredStateOfWorld, StateError, VolumeToMount};

use super::pending::OpKey;

/// One operation to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// MountDevice when `mount_device`, then SetUp, for one pod.
    Mount {
        /// what to mount
        want: Box<VolumeToMount>,
        /// whether the device target must be mounted first
        mount_device: bool,
    },
    /// MountDevice alone, for a volume whose pod targets are mounted but
    /// whose device target went away behind volumed's back (unmounted
    /// outside): the pods' binds keep the old superblock alive, and the next
    /// pod would bind an empty dir without it.
    MountDevice {
        /// the volume, as one of the pods that use it wants it
        want: Box<VolumeToMount>,
    },
    /// TearDown of one pod's target.
    TearDown {
        /// the volume
        volume: UniqueVolumeName,
        /// the pod
        pod: PodUid,
    },
    /// UnmountDevice of a volume no pod uses.
    UnmountDevice {
        /// the volume
        volume: UniqueVolumeName,
    },
    /// NodeExpandVolume of a mounted pod target whose claim grew beyond
    /// what the node expanded it to (online expansion).
    Expand {
        /// the volume, as the pod wants it
        want: Box<VolumeToMount>,
    },
    /// Drop a volume with no targets left from the ASW (no OS work).
    Forget {
        /// the volume
        volume: UniqueVolumeName,
    },
}

impl Action {
    /// The key that makes operations on one volume exclusive.
    pub(crate) fn key(&self) -> OpKey {
        match self {
            Action::Mount { want, .. } => OpKey::for_mount(&want.volume, &want.pod, &want.spec),
            Action::MountDevice { want } => OpKey::volume(&want.volume),
            // one expansion of a volume at a time, none beside its mounts
            Action::Expand { want } => OpKey::volume(&want.volume),
            Action::TearDown { volume, pod } => OpKey::pod(volume, pod),
            Action::UnmountDevice { volume } | Action::Forget { volume } => OpKey::volume(volume),
        }
    }
}

/// A pod whose volume cannot be mounted now, with the reason (for its errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocked {
    /// the pod
    pub pod: PodUid,
    /// the volume
    pub volume: UniqueVolumeName,
    /// why
    pub error: StateError,
}

/// The plan for one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// operations to start, in order
    pub actions: Vec<Action>,
    /// pods waiting on something (an SELinux label still mounted elsewhere)
    pub blocked: Vec<Blocked>,
}

/// Plans one pass. `busy` says whether an operation with a conflicting key is
/// running or backing off; such work is left for a later pass. So is work
/// past the first `limit` actions: it is not copied, yet every blocked pod is
/// still reported (a mount waiting for `volumesInUse` asks for the report at
/// once, however long the queue before it).
pub(crate) fn plan(
    dsw: &DesiredStateOfWorld,
    asw: &ActualStateOfWorld,
    busy: &dyn Fn(&OpKey) -> bool,
    limit: usize,
) -> Plan {
    let mut out = Plan::default();
    let populated = dsw.is_populated();
    let push = |out: &mut Plan, a: Action| {
        if out.actions.len() < limit && !busy(&a.key()) {
            out.actions.push(a);
        }
    };

    // Both states are walked borrowed; only what is acted on is copied (a
    // pass runs after every batch of finished jobs, so a copy of every
    // target per pass would be O(n) allocations per job at a mass start).
    if populated {
        for (volume, pod, actual) in asw.possibly_mounted_iter() {
            if out.actions.len() >= limit {
                break;
            }
            let wanted_label = dsw
                .volume(volume)
                .and_then(|v| v.effective_selinux.as_ref());
            let still_wanted = dsw.pod_exists_in_volume(pod, volume)
                && !actual.selinux_conflicts_with(wanted_label);
            // A pod with a volume that cannot be resolved keeps its mounts.
            if !still_wanted && !dsw.pod_has_unresolved(pod) {
                push(
                    &mut out,
                    Action::TearDown {
                        volume: volume.clone(),
                        pod: pod.clone(),
                    },
                );
            }
        }
    }

    for (name, uid, v, p) in dsw.volumes_to_mount_iter() {
        let presence = asw.pod_exists_in_volume(name, uid, v.effective_selinux.as_ref());
        // a mounted claim that grew beyond what the node expanded it to
        // (the kubelet's online expansion)
        if matches!(&presence, Ok(pr) if pr.mounted)
            && !device_lost(asw, name, &v.spec)
            && expansion_due(asw, name, &v.spec, p.read_only)
        {
            let want = DesiredStateOfWorld::volume_to_mount(name, uid, v, p);
            push(
                &mut out,
                Action::Expand {
                    want: Box::new(want),
                },
            );
            continue;
        }
        let skip = match &presence {
            Ok(p) if p.mounted => !device_lost(asw, name, &v.spec) || busy(&OpKey::volume(name)),
            // running or backing off: left for a later pass, uncopied
            Ok(_) | Err(StateError::VolumeNotAttached { .. }) => {
                busy(&OpKey::for_mount(name, uid, &v.spec))
            }
            Err(_) => false,
        };
        if skip {
            continue;
        }
        // a mount that is still to happen waits for volumesInUse; one that
        // happened (device lost) is repaired without waiting
        let mounted = matches!(&presence, Ok(p) if p.mounted);
        if !mounted && dsw.waits_for_in_use_report(v) {
            out.blocked.push(Blocked {
                pod: uid.clone(),
                volume: name.clone(),
                error: StateError::NotReportedInUse {
                    volume: name.clone(),
                    pod: uid.clone(),
                },
            });
            continue;
        }
        let presence = match presence {
            Ok(p) => Some(p),
            Err(StateError::VolumeNotAttached { .. }) => None,
            Err(error) => {
                out.blocked.push(Blocked {
                    pod: uid.clone(),
                    volume: name.clone(),
                    error,
                });
                continue;
            }
        };
        if presence.as_ref().is_none_or(|p| !p.mounted)
            && rwop_held_elsewhere(asw, name, uid, &v.spec)
        {
            out.blocked.push(Blocked {
                pod: uid.clone(),
                volume: name.clone(),
                error: StateError::ReadWriteOncePodInUse {
                    volume: name.clone(),
                    spec_name: p.spec_name.clone(),
                    pod: uid.clone(),
                },
            });
            continue;
        }
        if out.actions.len() >= limit {
            continue;
        }
        let want = DesiredStateOfWorld::volume_to_mount(name, uid, v, p);
        let device_needed = want.spec.device_target_kind().is_some();
        match presence {
            Some(p) if p.mounted => push(
                &mut out,
                Action::MountDevice {
                    want: Box::new(want),
                },
            ),
            Some(_) => {
                let device_mounted = asw
                    .volume(&want.volume)
                    .and_then(|v| v.device.as_ref())
                    .is_some_and(|d| d.state == crate::model::MountState::Mounted);
                push(
                    &mut out,
                    Action::Mount {
                        mount_device: device_needed && !device_mounted,
                        want: Box::new(want),
                    },
                );
            }
            None => push(
                &mut out,
                Action::Mount {
                    mount_device: device_needed,
                    want: Box::new(want),
                },
            ),
        }
    }

    if populated && out.actions.len() < limit {
        for (name, v) in asw.get_unmounted_volumes() {
            let wanted = dsw
                .volume(&name)
                .is_some_and(|d| !v.selinux_conflicts_with(d.effective_selinux.as_ref()));
            if wanted {
                continue;
            }
            match &v.device {
                Some(d) if d.may_be_mounted() => {
                    push(&mut out, Action::UnmountDevice { volume: name })
                }
                _ => push(&mut out, Action::Forget { volume: name }),
            }
        }
    }
    out
}

/// Whether `volume`'s only access mode is ReadWriteOncePod and the ASW
/// holds a pod target of it for a pod other than `pod` that is mounted or
/// may be (uncertain): the kubelet's MountVolume check
/// (`IsVolumeMountedElsewhere`, and only when RWOP is the one mode, since
/// with several the pod's intent is unknown). Two pods that want it in
/// one pass do not both get it: a mount of a PV is keyed by volume
/// (`OpKey::for_mount`), so the second waits for the first and then finds
/// it here.
fn rwop_held_elsewhere(
    asw: &ActualStateOfWorld,
    volume: &UniqueVolumeName,
    pod: &PodUid,
    spec: &VolumeSpec,
) -> bool {
    spec.access_modes() == [AccessMode::ReadWriteOncePod]
        && asw.volume(volume).is_some_and(|v| {
            v.pods
                .iter()
                .any(|(other, t)| other != pod && t.state != MountState::NotMounted)
        })
}

/// Whether a mounted (or, raw block, mapped) CSI claim's volume waits for
/// a node expansion to a size the node has not expanded it to since it
/// was mounted
/// (`model::decide_expansion`; whether the driver can is the executor's
/// to find out, and it records that too). A pod that mounts it read-only
/// is never the one that expands it.
fn expansion_due(
    asw: &ActualStateOfWorld,
    volume: &UniqueVolumeName,
    spec: &VolumeSpec,
    pod_read_only: bool,
) -> bool {
    let VolumeSpec::Csi(c) = spec else {
        return false;
    };
    let Some(claim) = &c.claim else {
        return false;
    };
    let read_only = pod_read_only || c.read_only || c.mount_options.iter().any(|o| o == "ro");
    let case = crate::model::ExpandCase {
        pod: "",
        volume: "",
        claim: "",
        pv: "",
        pv_capacity: claim.pv_capacity,
        size: &claim.size,
        read_only,
        block: c.volume_mode == crate::model::VolumeMode::Block,
        driver_expands: true,
    };
    let Ok(crate::model::ExpandDecision::Expand { to, .. }) = crate::model::decide_expansion(&case)
    else {
        return false;
    };
    let done = (asw.volume(volume))
        .and_then(|v| v.device.as_ref())
        .and_then(|d| d.expanded_to);
    done.is_none_or(|d| d < to)
}

/// Whether `volume` needs a device target that the ASW holds as surely not
/// mounted (or not at all) while a pod target of it is mounted.
fn device_lost(asw: &ActualStateOfWorld, volume: &UniqueVolumeName, spec: &VolumeSpec) -> bool {
    spec.device_target_kind().is_some()
        && asw
            .volume(volume)
            .is_some_and(|v| v.device.as_ref().is_none_or(|d| !d.may_be_mounted()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PodVolume, StorageMedium, TargetKind};
    use crate::state::{DeviceMount, LabelCheck, PodMount, SeLinuxState};

    fn uid(s: &str) -> PodUid {
        PodUid::new(s).unwrap()
    }

    fn local() -> VolumeSpec {
        VolumeSpec::Local {
            path: "/dev/loop0".into(),
            fs_type: Some("ext4".into()),
            access_modes: vec![AccessMode::ReadWriteOnce],
            mount_options: Default::default(),
            is_block: true,
            volume_mode: Default::default(),
        }
    }

    fn tmpfs() -> VolumeSpec {
        VolumeSpec::EmptyDir {
            medium: StorageMedium::Memory,
            size_limit: None,
        }
    }

    fn want(
        dsw: &mut DesiredStateOfWorld,
        pod: &str,
        spec: VolumeSpec,
        name: &str,
    ) -> UniqueVolumeName {
        let p = uid(pod);
        let volume = PodVolume::unique_name(&spec, &p, name);
        let pv = PodVolume {
            volume: volume.clone(),
            spec_name: name.into(),
            outer_name: name.into(),
            spec: spec.into(),
            selinux: None,
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        };
        dsw.add_pod_to_volume(&p, pv, LabelCheck::default())
            .unwrap();
        volume
    }

    fn mounted_pod(
        asw: &mut ActualStateOfWorld,
        volume: &UniqueVolumeName,
        pod: &str,
        state: MountState,
    ) {
        let m = PodMount {
            outer_name: "v".into(),
            mount_path: format!("/r/pods/{pod}/v").into(),
            kind: TargetKind::Mount,
            selinux: SeLinuxState::WithoutContext,
        };
        match state {
            MountState::Mounted => asw.mark_volume_mounted(volume, &uid(pod), m).unwrap(),
            _ => asw.mark_volume_uncertain(volume, &uid(pod), m).unwrap(),
        }
    }

    fn add_local(
        asw: &mut ActualStateOfWorld,
        volume: &UniqueVolumeName,
        device: Option<MountState>,
    ) {
        asw.add_volume(
            volume.clone(),
            crate::model::PluginName::LocalVolume,
            "pv1",
            Some(local().into()),
            None,
        );
        let dm = DeviceMount {
            device_path: Some("/dev/loop0".into()),
            mount_path: "/r/plugins/kubernetes.io/local-volume/mounts/pv1".into(),
            selinux: None,
        };
        match device {
            Some(MountState::Mounted) => asw.mark_device_mounted(volume, dm).unwrap(),
            Some(MountState::Uncertain) => asw.mark_device_uncertain(volume, dm).unwrap(),
            _ => {}
        }
    }

    fn names(p: &Plan) -> Vec<String> {
        p.actions
            .iter()
            .map(|a| match a {
                Action::Mount { want, mount_device } => {
                    format!(
                        "mount {} {}{}",
                        want.volume,
                        want.pod,
                        if *mount_device { " +device" } else { "" }
                    )
                }
                Action::MountDevice { want } => format!("mount_device {}", want.volume),
                Action::TearDown { volume, pod } => format!("teardown {volume} {pod}"),
                Action::UnmountDevice { volume } => format!("unmount_device {volume}"),
                Action::Forget { volume } => format!("forget {volume}"),
                Action::Expand { want } => format!("expand {} {}", want.volume, want.pod),
            })
            .collect()
    }

    const PV: &str = "kubernetes.io/local-volume/pv1";

    #[test]
    fn plan_table() {
        struct Row {
            name: &'static str,
            populated: bool,
            setup: fn(&mut DesiredStateOfWorld, &mut ActualStateOfWorld),
            want: Vec<String>,
        }
        let rows = vec![
            Row {
                name: "new local PV: device then setup",
                populated: false,
                setup: |d, _| {
                    want(d, "a", local(), "pv1");
                },
                want: vec![format!("mount {PV} a +device")],
            },
            Row {
                name: "device mounted: setup only",
                populated: false,
                setup: |d, a| {
                    let v = want(d, "a", local(), "pv1");
                    add_local(a, &v, Some(MountState::Mounted));
                },
                want: vec![format!("mount {PV} a")],
            },
            Row {
                name: "device uncertain: mount device again",
                populated: false,
                setup: |d, a| {
                    let v = want(d, "a", local(), "pv1");
                    add_local(a, &v, Some(MountState::Uncertain));
                },
                want: vec![format!("mount {PV} a +device")],
            },
            Row {
                name: "already mounted: nothing",
                populated: true,
                setup: |d, a| {
                    let v = want(d, "a", local(), "pv1");
                    add_local(a, &v, Some(MountState::Mounted));
                    mounted_pod(a, &v, "a", MountState::Mounted);
                },
                want: vec![],
            },
            Row {
                name: "pod mounted, device unmounted outside: device alone",
                populated: false,
                setup: |d, a| {
                    let v = want(d, "a", local(), "pv1");
                    add_local(a, &v, None);
                    mounted_pod(a, &v, "a", MountState::Mounted);
                },
                want: vec![format!("mount_device {PV}")],
            },
            Row {
                name: "pod mounted, device uncertain: left as it is",
                populated: true,
                setup: |d, a| {
                    let v = want(d, "a", local(), "pv1");
                    add_local(a, &v, Some(MountState::Uncertain));
                    mounted_pod(a, &v, "a", MountState::Mounted);
                },
                want: vec![],
            },
            Row {
                name: "uncertain pod target: set up again",
                populated: true,
                setup: |d, a| {
                    let v = want(d, "a", local(), "pv1");
                    add_local(a, &v, Some(MountState::Mounted));
                    mounted_pod(a, &v, "a", MountState::Uncertain);
                },
                want: vec![format!("mount {PV} a")],
            },
            Row {
                name: "tmpfs emptyDir has no device target",
                populated: false,
                setup: |d, _| {
                    want(d, "a", tmpfs(), "cache");
                },
                want: vec!["mount kubernetes.io/empty-dir/a-cache a".into()],
            },
            Row {
                name: "unwanted pod target is kept until populated",
                populated: false,
                setup: |_, a| {
                    add_local(
                        a,
                        &UniqueVolumeName::from_raw(PV),
                        Some(MountState::Mounted),
                    );
                    mounted_pod(
                        a,
                        &UniqueVolumeName::from_raw(PV),
                        "gone",
                        MountState::Mounted,
                    );
                },
                want: vec![],
            },
            Row {
                name: "unwanted pod target torn down once populated",
                populated: true,
                setup: |_, a| {
                    add_local(
                        a,
                        &UniqueVolumeName::from_raw(PV),
                        Some(MountState::Mounted),
                    );
                    mounted_pod(
                        a,
                        &UniqueVolumeName::from_raw(PV),
                        "gone",
                        MountState::Uncertain,
                    );
                },
                want: vec![format!("teardown {PV} gone")],
            },
            Row {
                name: "shared device stays while another pod uses it",
                populated: true,
                setup: |d, a| {
                    let v = want(d, "b", local(), "pv1");
                    add_local(a, &v, Some(MountState::Mounted));
                    mounted_pod(a, &v, "gone", MountState::Mounted);
                    mounted_pod(a, &v, "b", MountState::Mounted);
                },
                want: vec![format!("teardown {PV} gone")],
            },
            Row {
                name: "a pod whose claim does not resolve keeps its mounts",
                populated: true,
                setup: |d, a| {
                    d.set_pod_unresolved(&uid("gone"), true);
                    add_local(
                        a,
                        &UniqueVolumeName::from_raw(PV),
                        Some(MountState::Mounted),
                    );
                    mounted_pod(
                        a,
                        &UniqueVolumeName::from_raw(PV),
                        "gone",
                        MountState::Mounted,
                    );
                },
                want: vec![],
            },
            Row {
                name: "device with no pods and no want: unmounted",
                populated: true,
                setup: |_, a| {
                    add_local(
                        a,
                        &UniqueVolumeName::from_raw(PV),
                        Some(MountState::Mounted),
                    )
                },
                want: vec![format!("unmount_device {PV}")],
            },
            Row {
                name: "device with no pods kept before populated (k8s #85476 is after)",
                populated: false,
                setup: |_, a| {
                    add_local(
                        a,
                        &UniqueVolumeName::from_raw(PV),
                        Some(MountState::Mounted),
                    )
                },
                want: vec![],
            },
            Row {
                name: "device with no pods but wanted: kept, pod mounted",
                populated: true,
                setup: |d, a| {
                    let v = want(d, "a", local(), "pv1");
                    add_local(a, &v, Some(MountState::Mounted));
                },
                want: vec![format!("mount {PV} a")],
            },
            Row {
                name: "nothing left: forget",
                populated: true,
                setup: |_, a| add_local(a, &UniqueVolumeName::from_raw(PV), None),
                want: vec![format!("forget {PV}")],
            },
        ];
        for row in rows {
            let mut d = DesiredStateOfWorld::new();
            let mut a = ActualStateOfWorld::new();
            (row.setup)(&mut d, &mut a);
            if row.populated {
                d.mark_sources_ready();
            }
            let p = plan(&d, &a, &|_| false, usize::MAX);
            assert_eq!(names(&p), row.want, "{}", row.name);
        }
    }

    /// A CSI claim of 1 GiB whose PV says `pv` bytes and whose resize
    /// status is the node's turn.
    fn claim_spec(pv: u64) -> VolumeSpec {
        use crate::model::{ClaimSize, ClaimState, CsiSpec, ResizeStatus};
        VolumeSpec::Csi(Box::new(CsiSpec {
            driver: "d.example.com".into(),
            volume_handle: "h1".into(),
            claim: Some(std::sync::Arc::new(ClaimState {
                pv_capacity: Some(pv),
                size: ClaimSize {
                    status_capacity: Some(1 << 30),
                    allocated: true,
                    resize_status: Some(ResizeStatus::NodeResizePending),
                },
                ..ClaimState::default()
            })),
            ..CsiSpec::default()
        }))
    }

    /// Online expansion: a mounted claim whose PV grew is expanded once
    /// per size; not while the volume is busy, not for a read-only pod,
    /// not when nothing is pending, never for a pod still to mount.
    #[test]
    fn a_mounted_claim_that_grew_is_expanded_once_per_size() {
        const GI: u64 = 1 << 30;
        let setup_as =
            |spec: VolumeSpec, read_only: bool, expanded: Option<u64>, pod_state: MountState| {
                let mut d = DesiredStateOfWorld::new();
                let mut a = ActualStateOfWorld::new();
                let p = uid("a");
                let volume = PodVolume::unique_name(&spec, &p, "pv1");
                let pv_ = PodVolume {
                    volume: volume.clone(),
                    spec_name: "pv1".into(),
                    outer_name: "data".into(),
                    spec: spec.clone().into(),
                    selinux: None,
                    csi_pod: None,
                    read_only,
                    fs_group: None,
                    supplemental_gid: None,
                };
                d.add_pod_to_volume(&p, pv_, LabelCheck::default()).unwrap();
                a.add_volume(
                    volume.clone(),
                    crate::model::PluginName::Csi,
                    "pv1",
                    Some(spec.into()),
                    None,
                );
                let dm = DeviceMount {
                    device_path: None,
                    mount_path: "/r/plugins/kubernetes.io/csi/d/x/globalmount".into(),
                    selinux: None,
                };
                a.mark_device_mounted(&volume, dm).unwrap();
                mounted_pod(&mut a, &volume, "a", pod_state);
                if let Some(n) = expanded {
                    a.mark_expanded(&volume, n);
                }
                (d, a, volume)
            };
        let setup = |pv: u64, read_only: bool, expanded: Option<u64>, pod_state: MountState| {
            setup_as(claim_spec(pv), read_only, expanded, pod_state)
        };
        let expand = |v: &UniqueVolumeName| vec![format!("expand {v} a")];
        type Row = (&'static str, u64, bool, Option<u64>, MountState, bool);
        #[rustfmt::skip]
        let table: [Row; 6] = [
            ("grew, never expanded", 2 * GI, false, None, MountState::Mounted, true),
            ("grew beyond the last expansion", 3 * GI, false, Some(2 * GI), MountState::Mounted, true),
            ("expanded to that size already", 2 * GI, false, Some(2 * GI), MountState::Mounted, false),
            ("nothing pending", GI, false, None, MountState::Mounted, false),
            ("a read-only pod", 2 * GI, true, None, MountState::Mounted, false),
            ("not mounted yet: the mount expands it", 2 * GI, false, None, MountState::Uncertain, false),
        ];
        for (what, pv, ro, expanded, state, due) in table {
            let (d, a, volume) = setup(pv, ro, expanded, state);
            let p = plan(&d, &a, &|_| false, usize::MAX);
            let got: Vec<String> = names(&p)
                .into_iter()
                .filter(|n| n.starts_with("expand"))
                .collect();
            let want: Vec<String> = if due { expand(&volume) } else { vec![] };
            assert_eq!(got, want, "{what}");
        }
        // busy (a mount or an expansion of the volume running): later
        let (d, a, volume) = setup(2 * GI, false, None, MountState::Mounted);
        let p = plan(&d, &a, &|k| k.volume == volume, usize::MAX);
        assert!(names(&p).is_empty(), "{:?}", names(&p));
        // a raw block claim mapped into its pod grows as a filesystem one
        let block = match claim_spec(2 * GI) {
            VolumeSpec::Csi(mut c) => {
                c.volume_mode = crate::model::VolumeMode::Block;
                VolumeSpec::Csi(c)
            }
            other => other,
        };
        let (d, a, volume) = setup_as(block, false, None, MountState::Mounted);
        let p = plan(&d, &a, &|_| false, usize::MAX);
        assert_eq!(names(&p), expand(&volume), "a mapped block claim");
    }

    #[test]
    fn busy_keys_are_left_for_later() {
        let mut d = DesiredStateOfWorld::new();
        let a = ActualStateOfWorld::new();
        want(&mut d, "a", local(), "pv1");
        want(&mut d, "b", tmpfs(), "cache");
        let p = plan(&d, &a, &|k| k.volume.as_str() == PV, usize::MAX);
        assert_eq!(
            names(&p),
            vec!["mount kubernetes.io/empty-dir/b-cache b".to_owned()]
        );
    }

    /// ReadWriteOncePod, as the kubelet's MountVolume checks it: refused
    /// while another pod's target is mounted or uncertain and RWOP is the
    /// volume's only mode; mounted once the holder is gone.
    #[test]
    fn a_read_write_once_pod_volume_held_by_another_pod_blocks_the_new_one() {
        use AccessMode::{ReadWriteOnce as Rwo, ReadWriteOncePod as Rwop};
        type Row = (&'static str, Vec<AccessMode>, Option<MountState>, bool);
        let table: Vec<Row> = vec![
            ("held, mounted", vec![Rwop], Some(MountState::Mounted), true),
            (
                "held, uncertain",
                vec![Rwop],
                Some(MountState::Uncertain),
                true,
            ),
            ("the holder is gone", vec![Rwop], None, false),
            (
                "RWOP among others",
                vec![Rwop, Rwo],
                Some(MountState::Mounted),
                false,
            ),
            ("RWO only", vec![Rwo], Some(MountState::Mounted), false),
        ];
        for (what, modes, holder, refused) in table {
            let spec = VolumeSpec::Local {
                path: "/srv/pv".into(),
                fs_type: None,
                access_modes: modes,
                mount_options: Default::default(),
                is_block: false,
                volume_mode: Default::default(),
            };
            let mut d = DesiredStateOfWorld::new();
            let mut a = ActualStateOfWorld::new();
            let v = want(&mut d, "second", spec.clone(), "pv1");
            if let Some(state) = holder {
                a.add_volume(v.clone(), spec.plugin(), "pv1", Some(spec.into()), None);
                mounted_pod(&mut a, &v, "first", state);
            }
            let p = plan(&d, &a, &|_| false, usize::MAX);
            if refused {
                assert!(p.actions.is_empty(), "{what}: {:?}", names(&p));
                assert_eq!(p.blocked.len(), 1, "{what}");
                assert_eq!(p.blocked[0].pod, uid("second"), "{what}");
                assert_eq!(
                    p.blocked[0].error.to_string(),
                    "MountVolume.SetUp failed for volume \"pv1\" : volume uses the \
                     ReadWriteOncePod access mode and is already in use by another pod",
                    "{what}"
                );
            } else {
                assert!(p.blocked.is_empty(), "{what}: {:?}", p.blocked);
                assert_eq!(names(&p), [format!("mount {v} second")], "{what}");
            }
        }
    }

    /// A DSW where pod `new` wants the local PV with label `wanted` (a
    /// strict check), and an ASW where its device is mounted with `mounted`.
    fn relabel_world(
        wanted: &crate::model::SeLinuxContext,
        mounted: &crate::model::SeLinuxContext,
    ) -> (DesiredStateOfWorld, ActualStateOfWorld, UniqueVolumeName) {
        let mut d = DesiredStateOfWorld::new();
        let mut a = ActualStateOfWorld::new();
        let v = UniqueVolumeName::from_raw(PV);
        let pv = PodVolume {
            volume: v.clone(),
            spec_name: "pv1".into(),
            outer_name: "data".into(),
            spec: local().into(),
            selinux: Some(wanted.clone()),
            csi_pod: None,
            read_only: false,
            fs_group: None,
            supplemental_gid: None,
        };
        let check = LabelCheck {
            original: Some(wanted.clone()),
            strict: true,
        };
        d.add_pod_to_volume(&uid("new"), pv, check).unwrap();
        add_local(&mut a, &v, None);
        a.mark_device_mounted(
            &v,
            DeviceMount {
                device_path: Some("/dev/loop0".into()),
                mount_path: "/r/m".into(),
                selinux: Some(mounted.clone()),
            },
        )
        .unwrap();
        (d, a, v)
    }

    #[test]
    fn a_label_still_mounted_blocks_the_new_pod() {
        use crate::model::SeLinuxContext;
        let (d, a, _) = relabel_world(
            &SeLinuxContext::parse("u:r:t:s0:c1,c2").unwrap(),
            &SeLinuxContext::parse("u:r:t:s0:c3,c4").unwrap(),
        );
        let p = plan(&d, &a, &|_| false, usize::MAX);
        assert!(p.actions.is_empty(), "{:?}", names(&p));
        assert_eq!(p.blocked.len(), 1);
        assert!(
            p.blocked[0]
                .error
                .to_string()
                .contains("different SELinux label"),
            "{}",
            p.blocked[0].error
        );
    }

    /// Issue #6: a volume mounted with the old pod's label, wanted by a new
    /// pod with another: the old pod's target goes, then the device, then
    /// the volume is forgotten, and only then mounted with the new label.
    #[test]
    fn a_new_label_remounts_the_volume_once_the_old_pod_is_gone() {
        use crate::model::SeLinuxContext;
        let (old, new) = (
            SeLinuxContext::parse("u:r:t:s0:c3,c4").unwrap(),
            SeLinuxContext::parse("u:r:t:s0:c1,c2").unwrap(),
        );
        let (mut d, mut a, v) = relabel_world(&new, &old);
        d.mark_sources_ready();
        a.mark_volume_mounted(
            &v,
            &uid("old"),
            PodMount {
                outer_name: "data".into(),
                mount_path: "/r/pods/old/v".into(),
                kind: TargetKind::Mount,
                selinux: SeLinuxState::Context(old),
            },
        )
        .unwrap();
        let p = plan(&d, &a, &|_| false, usize::MAX);
        assert_eq!(names(&p), [format!("teardown {PV} old")]);
        assert_eq!(p.blocked.len(), 1, "the new pod waits");
        a.delete_pod_from_volume(&v, &uid("old")).unwrap();
        let p = plan(&d, &a, &|_| false, usize::MAX);
        assert_eq!(names(&p), [format!("unmount_device {PV}")]);
        a.mark_device_unmounted(&v).unwrap();
        let p = plan(&d, &a, &|_| false, usize::MAX);
        assert_eq!(names(&p), [format!("forget {PV}")]);
        a.delete_volume(&v).unwrap();
        let p = plan(&d, &a, &|_| false, usize::MAX);
        assert_eq!(names(&p), [format!("mount {PV} new +device")]);
        let Action::Mount { want, .. } = &p.actions[0] else {
            unreachable!()
        };
        assert_eq!(
            want.selinux.as_ref().map(SeLinuxContext::as_str),
            Some("u:r:t:s0:c1,c2")
        );
    }

    /// A pass's limit keeps the plan's first actions, in its order, and
    /// leaves the rest for a later pass; a blocked pod is reported wherever
    /// it stands, even past the limit.
    #[test]
    fn a_limit_keeps_the_first_actions_and_every_blocked_pod() {
        use crate::model::SeLinuxContext;
        let old = SeLinuxContext::parse("u:r:t:s0:c3,c4").unwrap();
        let new = SeLinuxContext::parse("u:r:t:s0:c1,c2").unwrap();
        let (mut d, mut a, v) = relabel_world(&new, &old);
        d.mark_sources_ready();
        mounted_pod(&mut a, &v, "old", MountState::Mounted);
        for pod in ["a", "b", "c"] {
            want(&mut d, pod, tmpfs(), "cache");
        }
        let all = plan(&d, &a, &|_| false, usize::MAX);
        assert_eq!(
            names(&all),
            [
                format!("teardown {PV} old"),
                "mount kubernetes.io/empty-dir/a-cache a".into(),
                "mount kubernetes.io/empty-dir/b-cache b".into(),
                "mount kubernetes.io/empty-dir/c-cache c".into(),
            ]
        );
        assert_eq!(all.blocked.len(), 1, "the new pod waits for the label");
        for limit in 0..=all.actions.len() {
            let p = plan(&d, &a, &|_| false, limit);
            assert_eq!(names(&p), names(&all)[..limit], "limit {limit}");
            assert_eq!(p.blocked, all.blocked, "limit {limit}");
        }
    }

    fn attachable(attached: bool) -> VolumeSpec {
        VolumeSpec::Csi(Box::new(crate::model::CsiSpec {
            driver: "d.example.com".into(),
            volume_handle: "h".into(),
            attachment: attached.then(|| ("csi-123".to_owned(), Default::default())),
            ..Default::default()
        }))
    }

    /// The kubelet mounts an attachable volume only once a node status
    /// update listed it in `volumesInUse`; with the gate off (no API
    /// server) and for volumes nobody attaches, nothing waits.
    #[test]
    fn an_attachable_volume_waits_for_its_in_use_report() {
        struct Row {
            name: &'static str,
            gate: bool,
            attached: bool,
            reported: bool,
            mounts: bool,
        }
        let rows = [
            Row {
                name: "gate on, unreported: waits",
                gate: true,
                attached: true,
                reported: false,
                mounts: false,
            },
            Row {
                name: "gate on, reported: mounts",
                gate: true,
                attached: true,
                reported: true,
                mounts: true,
            },
            Row {
                name: "gate off: mounts",
                gate: false,
                attached: true,
                reported: false,
                mounts: true,
            },
            Row {
                name: "not attachable: mounts",
                gate: true,
                attached: false,
                reported: false,
                mounts: true,
            },
        ];
        for r in rows {
            let mut d = DesiredStateOfWorld::new();
            d.set_in_use_gate(r.gate);
            let v = want(&mut d, "a", attachable(r.attached), "pv1");
            if r.reported {
                assert_eq!(d.mark_reported_in_use(std::slice::from_ref(&v)), 1);
            }
            let p = plan(&d, &ActualStateOfWorld::new(), &|_| false, usize::MAX);
            assert_eq!(p.actions.len(), usize::from(r.mounts), "{}", r.name);
            assert_eq!(p.blocked.len(), usize::from(!r.mounts), "{}", r.name);
            if let Some(b) = p.blocked.first() {
                assert!(
                    matches!(b.error, StateError::NotReportedInUse { .. }),
                    "{}: {}",
                    r.name,
                    b.error
                );
                assert!(b.error.to_string().contains("volumesInUse"), "{}", r.name);
            }
        }
    }

    /// Asked once per volume (the publisher is woken once), and a report
    /// names only what it lists.
    #[test]
    fn an_in_use_report_is_requested_once_and_marks_what_it_lists() {
        let mut d = DesiredStateOfWorld::new();
        d.set_in_use_gate(true);
        let v = want(&mut d, "a", attachable(true), "pv1");
        assert!(d.request_in_use_report(&v));
        assert!(!d.request_in_use_report(&v), "asked twice");
        let other = UniqueVolumeName::from_raw("kubernetes.io/csi/d^other");
        assert_eq!(d.mark_reported_in_use(std::slice::from_ref(&other)), 0);
        assert!(d.volume(&v).is_some_and(|x| d.waits_for_in_use_report(x)));
        assert_eq!(d.mark_reported_in_use(&[v.clone(), other]), 1);
        assert!(d.volume(&v).is_some_and(|x| !d.waits_for_in_use_report(x)));
        assert!(!d.request_in_use_report(&v), "reported: nothing to ask");
    }
}
