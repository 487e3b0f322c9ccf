//! Reconstruction against a real kernel: a kubelet layout of real tmpfs,
//! ext4-on-loop and bind mounts in a private mount namespace, a real sled
//! journal whose records agree with some targets and disagree with others,
//! then one scan + merge (`reconstruct_and_record`) and every decision
//! asserted, with the journal's implied state afterwards equal to the
//! decisions; then the daemon's phase 1 (`read_and_reconstruct_ready`) on
//! the journal that now agrees and after a mount is taken away. Needs root;
//! as another user it says what it skipped.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use support::{
    LoopDevice, Scratch, bind_mount, in_private_mount_ns, mkdirs, mkfs_ext4, mount_device,
    mount_tmpfs, require_root, umount,
};
use volumed::host::boot::BootId;
use volumed::host::mountinfo::MountTable;
use volumed::journal::{Body, Journal, JournalConfig, OpResult};
use volumed::model::{
    Layout, MountIdentity, MountState, Operation, PluginName, PodUid, PodVolume, Steps,
    StorageMedium, TargetKind, TargetParams, TargetRef, UniqueVolumeName, VolumeSpec,
};
use volumed::reconstruct::apply_to_asw;
use volumed::reconstruct::edge::{
    HostInput, TableRead, read_and_reconstruct_ready, reconstruct_and_record,
};
use volumed::state::ActualStateOfWorld;

const BOOT: &str = "5a5a5a5a-0000-4000-8000-000000000001";

fn uid(s: &str) -> PodUid {
    PodUid::new(s).unwrap()
}

fn tmpfs_params(layout: &Layout, pod: &str, name: &str) -> TargetParams {
    let spec = VolumeSpec::EmptyDir {
        medium: StorageMedium::Memory,
        size_limit: None,
    };
    TargetParams::at(
        PodVolume::unique_name(&spec, &uid(pod), name),
        PluginName::EmptyDir,
        name.into(),
        TargetRef::Pod(uid(pod)),
        TargetKind::Mount,
        Some(
            layout
                .pod_target_path(&uid(pod), PluginName::EmptyDir, name)
                .into(),
        ),
    )
    .with_mount_options(vec!["size=1m".into()].into())
    .with_fs_type(Some("tmpfs".into()))
}

fn local_params(layout: &Layout, device: &Path, target: TargetRef) -> TargetParams {
    let pod_path = target.pod().map(|p| {
        layout
            .pod_target_path(p, PluginName::LocalVolume, "pv1")
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
    .with_pod_mount_path(pod_path)
    .with_device_path(Some(device.to_owned().into()))
    .with_device_mount_path(Some(layout.local_device_path("pv1").into()))
    .with_fs_type(Some("ext4".into()))
}

/// Journals a completed operation (intent + success outcome).
fn done(j: &Journal, op: Operation, p: &TargetParams, observed: Option<MountIdentity>) {
    let i = j
        .append_record(Body::Intent {
            op,
            steps: Steps::Single,
            target: p.clone().into(),
        })
        .unwrap();
    j.append_record(Body::Outcome {
        intent_seq: i,
        op,
        result: OpResult::Success,
        observed,
    })
    .unwrap();
}

fn identity_at(path: &Path) -> MountIdentity {
    let table = MountTable::read_self().unwrap();
    table
        .top_at(path)
        .unwrap_or_else(|| panic!("nothing mounted at {}", path.display()))
        .identity()
}

#[test]
fn real_mounts_merge_with_agreeing_and_disagreeing_journal_records() {
    if !require_root("mounts tmpfs, ext4 on a loop device and binds") {
        return;
    }
    in_private_mount_ns(|| {
        let scratch = Scratch::new("volumed-recon-");
        let layout = Layout::new(scratch.path().join("kubelet"));
        let (j, _) = Journal::open(&JournalConfig::new(
            scratch.path().join("journal"),
            "n",
            BOOT,
        ))
        .unwrap();

        // ext4 on a loop device at the device target, bound into pods a and b.
        let image = scratch.path().join("pv1.img");
        mkfs_ext4(&image, 16);
        let lo = LoopDevice::attach(&image);
        let dev = local_params(&layout, lo.path(), TargetRef::Device);
        let dev_path = layout.local_device_path("pv1");
        mkdirs(&dev_path);
        mount_device(lo.path(), &dev_path, "ext4");
        let dev_identity = identity_at(&dev_path);
        done(&j, Operation::MountDevice, &dev, Some(dev_identity.clone()));
        for pod in ["a", "b"] {
            let p = local_params(&layout, lo.path(), TargetRef::Pod(uid(pod)));
            let path = p.pod_mount_path.clone().unwrap();
            mkdirs(&path);
            bind_mount(&dev_path, &path);
            done(&j, Operation::SetUp, &p, Some(identity_at(&path)));
        }
        // pod b's bind is replaced behind volumed's back by a foreign tmpfs
        // (k8s #117513): same path, another mount.
        let b_path = layout.pod_target_path(&uid("b"), PluginName::LocalVolume, "pv1");
        umount(&b_path);
        mount_tmpfs(&b_path, "size=1m");

        // tmpfs emptyDirs in every state the journal can know.
        let mount_tmpfs_for = |p: &TargetParams| {
            let path = p.pod_mount_path.clone().unwrap();
            mkdirs(&path);
            mount_tmpfs(&path, "size=1m");
        };
        let matching = tmpfs_params(&layout, "c", "cache");
        mount_tmpfs_for(&matching);
        done(
            &j,
            Operation::SetUp,
            &matching,
            Some(identity_at(matching.pod_mount_path.as_ref().unwrap())),
        );

        let outside = tmpfs_params(&layout, "d", "cache");
        mount_tmpfs_for(&outside);
        done(
            &j,
            Operation::SetUp,
            &outside,
            Some(identity_at(outside.pod_mount_path.as_ref().unwrap())),
        );
        umount(outside.pod_mount_path.as_ref().unwrap()); // unmounted outside volumed

        let intent_done = tmpfs_params(&layout, "e", "cache");
        j.append_record(Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Single,
            target: intent_done.clone().into(),
        })
        .unwrap();
        mount_tmpfs_for(&intent_done); // the mount happened, the outcome never got written

        let intent_not_done = tmpfs_params(&layout, "f", "cache");
        mkdirs(intent_not_done.pod_mount_path.as_ref().unwrap());
        j.append_record(Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Single,
            target: intent_not_done.clone().into(),
        })
        .unwrap();

        let multi = tmpfs_params(&layout, "g", "cache");
        j.append_record(Body::Intent {
            op: Operation::SetUp,
            steps: Steps::Multi,
            target: multi.clone().into(),
        })
        .unwrap();
        mount_tmpfs_for(&multi); // tmpfs mounted, ownership step may not have run

        let torn_down = tmpfs_params(&layout, "h", "cache");
        mount_tmpfs_for(&torn_down);
        done(&j, Operation::SetUp, &torn_down, None);
        j.append_record(Body::Intent {
            op: Operation::TearDown,
            steps: Steps::Single,
            target: torn_down.clone().into(),
        })
        .unwrap();
        umount(torn_down.pod_mount_path.as_ref().unwrap()); // the umount happened, no outcome

        let unknown = tmpfs_params(&layout, "i", "cache"); // never journaled: a kubelet-era mount
        mount_tmpfs_for(&unknown);

        // Scan once and merge.
        let table = MountTable::read_self().unwrap();
        let boot = BootId::new(BOOT).unwrap();
        let host = HostInput {
            layout: &layout,
            table: &table,
            boot_id: &boot,
            sys: &volumed::host::sys::LinuxSys,
        };
        let mut asw = ActualStateOfWorld::new();
        let outcome = reconstruct_and_record(&j, None, &host, &mut asw).unwrap();
        let out = &outcome.reconstruction.output;

        let decided: BTreeMap<(String, Option<String>), (MountState, &str)> = out
            .decisions
            .iter()
            .map(|d| {
                let pod = d.key.target.pod().map(|p| p.as_str().to_owned());
                (
                    (d.key.volume.as_str().to_owned(), pod),
                    (d.result, d.reason.as_str()),
                )
            })
            .collect();
        let get = |p: &TargetParams| {
            let pod = p.target.pod().map(|u| u.as_str().to_owned());
            *decided
                .get(&(p.volume.as_str().to_owned(), pod))
                .unwrap_or_else(|| {
                    panic!("no decision for {} {:?}: {decided:#?}", p.volume, p.target)
                })
        };
        use MountState::*;
        let pv_a = local_params(&layout, lo.path(), TargetRef::Pod(uid("a")));
        let pv_b = local_params(&layout, lo.path(), TargetRef::Pod(uid("b")));
        let table_rows: Vec<(&str, &TargetParams, (MountState, &str))> = vec![
            (
                "ext4 device mount as journaled",
                &dev,
                (Mounted, "mounted_matches"),
            ),
            (
                "bind into pod a as journaled",
                &pv_a,
                (Mounted, "mounted_matches"),
            ),
            (
                "foreign tmpfs on pod b's bind: replaced, not adopted",
                &pv_b,
                (Uncertain, "mounted_differs"),
            ),
            (
                "tmpfs as journaled",
                &matching,
                (Mounted, "mounted_matches"),
            ),
            (
                "tmpfs unmounted outside volumed",
                &outside,
                (NotMounted, "unmounted_outside"),
            ),
            (
                "single-step SetUp intent, host shows it done",
                &intent_done,
                (Mounted, "single_step_done"),
            ),
            (
                "single-step SetUp intent, host shows it not done",
                &intent_not_done,
                (NotMounted, "single_step_not_done"),
            ),
            (
                "multi-step SetUp intent",
                &multi,
                (Uncertain, "multi_step_intent"),
            ),
            (
                "single-step TearDown intent, host shows it done",
                &torn_down,
                (NotMounted, "single_step_done"),
            ),
            (
                "a mount the journal never knew",
                &unknown,
                (Uncertain, "rebuilt_from_host"),
            ),
        ];
        for (name, p, want) in &table_rows {
            assert_eq!(get(p), *want, "{name}");
        }
        assert_eq!(
            out.unmounted_outside.len(),
            1,
            "{:?}",
            out.unmounted_outside
        );
        assert!(outcome.asw_errors.is_empty(), "{:?}", outcome.asw_errors);
        // A record per decision the journal does not already imply: the
        // device, pod a's bind and the matching tmpfs agree with it.
        assert_eq!(
            outcome.unchanged, 3,
            "decisions the journal already implied"
        );
        assert_eq!(
            outcome.appended.len() + outcome.unchanged,
            out.decisions.len(),
            "one record per changed decision"
        );

        // The journal now implies exactly the decided states (dump shows the live state).
        let snap = volumed::dump::journal_snapshot(&j.state(), None);
        for (name, p, (state, _)) in &table_rows {
            let v = snap
                .volumes
                .iter()
                .find(|v| v.volume == p.volume)
                .unwrap_or_else(|| panic!("{name}: not in dump"));
            let reported = match &p.target {
                TargetRef::Device => v.device.as_ref().unwrap().state,
                TargetRef::Pod(u) => v.pods.iter().find(|x| &x.pod_uid == u).unwrap().state,
            };
            assert_eq!(reported, *state, "{name}: dump disagrees with the decision");
        }
        // The ASW holds the mounted pod targets as mounted and the uncertain ones as uncertain.
        let asw_snap = asw.snapshot();
        let pod_state = |p: &TargetParams| {
            let TargetRef::Pod(u) = &p.target else {
                unreachable!()
            };
            asw_snap
                .volumes
                .iter()
                .find(|v| v.volume == p.volume)
                .and_then(|v| v.pods.iter().find(|x| &x.pod_uid == u))
                .map(|x| x.state)
        };
        assert_eq!(pod_state(&pv_a), Some(Mounted));
        assert_eq!(pod_state(&pv_b), Some(Uncertain));
        assert_eq!(pod_state(&intent_done), Some(Mounted));
        assert_eq!(pod_state(&unknown), Some(Uncertain));
        assert_eq!(
            pod_state(&outside),
            None,
            "not-mounted pod targets are not in the ASW"
        );

        // A restart now, phase 1 as the daemon runs it: the journal agrees
        // with every target, so the ASW filled from the journal while the
        // table was read is kept, and it is the ASW the decisions fill.
        let again = read_and_reconstruct_ready(
            &j,
            None,
            &volumed::host::sys::LinuxSys,
            &layout,
            &boot,
            None,
        )
        .unwrap();
        let out = &again.outcome.reconstruction.output;
        assert!(again.asw_from_journal, "{out:#?}");
        assert!(again.outcome.appended.is_empty());
        assert_eq!(again.outcome.unchanged, out.decisions.len());
        let mut from_decisions = ActualStateOfWorld::new();
        assert!(apply_to_asw(out, &mut from_decisions).is_empty());
        assert_eq!(again.asw.snapshot(), from_decisions.snapshot());
        assert_eq!(
            again.asw.snapshot().volumes.len(),
            asw_snap.volumes.len(),
            "the volumes of the first reconstruction"
        );
        // The table read started early, as the daemon starts it once it
        // holds the journal's lock: the same decisions and ASW.
        let read_early = || {
            let sys = std::sync::Arc::new(volumed::host::sys::LinuxSys);
            read_and_reconstruct_ready(
                &j,
                None,
                sys.as_ref(),
                &layout,
                &boot,
                TableRead::start(sys.clone()),
            )
            .unwrap()
        };
        let early = read_early();
        assert_eq!(early.outcome.reconstruction.output.decisions, out.decisions);
        assert!(early.asw_from_journal);
        assert_eq!(early.asw.snapshot(), again.asw.snapshot());

        // The matching tmpfs is unmounted outside volumed: the merge
        // disagrees with its entry, so the ASW is filled from the decisions.
        umount(matching.pod_mount_path.as_ref().unwrap());
        // read early (after the unmount, as the daemon's read comes after
        // anything the lock's last holder did)
        let after = read_early();
        let out = &after.outcome.reconstruction.output;
        assert!(!after.asw_from_journal);
        let d = out
            .decisions
            .iter()
            .find(|d| d.key.volume == matching.volume)
            .unwrap();
        assert_eq!(
            (d.result, d.reason.as_str()),
            (NotMounted, "unmounted_outside")
        );
        assert_eq!(after.outcome.appended.len(), 1, "one changed decision");
        let mut from_decisions = ActualStateOfWorld::new();
        assert!(apply_to_asw(out, &mut from_decisions).is_empty());
        assert_eq!(after.asw.snapshot(), from_decisions.snapshot());
        assert!(
            !after
                .asw
                .snapshot()
                .volumes
                .iter()
                .any(|v| v.volume == matching.volume),
            "not mounted: not in the ASW"
        );

        let _: PathBuf = scratch.path().to_owned();
        drop(j);
        // Scratch's Drop unmounts everything below it; the loop device autoclears.
    });
}
