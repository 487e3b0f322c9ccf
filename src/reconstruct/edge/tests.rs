//! Tests of the I/O edge against the `kubelet-node.txt` fixture: no mounts,
//! a journal in a temp dir, the root dir `/var/lib/kubelet` absent here (so
//! the pod-dir walk finds nothing on disk and everything comes from the table).

use std::path::{Path, PathBuf};

use super::input::build_input;
use super::*;
use crate::host::scan::scan_with_table;
use crate::journal::{Body, Journal, JournalConfig, OpResult};
use crate::model::{
    DevId, MountIdentity, MountState, Operation, PluginName, PodUid, Steps, TargetKind,
    TargetParams, TargetRef, UniqueVolumeName,
};
use crate::reconstruct::{HostObservation, Reason};
use crate::state::ActualStateOfWorld;

const BOOT: &str = "11111111-2222-3333-4444-555555555555";
const ROOT: &str = "/var/lib/kubelet";
const P1: &str = "6f1b2c3d-0a4e-4b5f-9c8d-1e2f3a4b5c6d";
const P2: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";

fn fixture_table() -> MountTable {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/mountinfo/kubelet-node.txt");
    MountTable::read(&path).unwrap()
}

fn local_params(target: TargetRef) -> TargetParams {
    let layout = Layout::new(ROOT);
    let pod_path = target.pod().map(|uid| {
        layout
            .pod_target_path(uid, PluginName::LocalVolume, "pv-local-1")
            .into()
    });
    TargetParams::at(
        UniqueVolumeName::shared(PluginName::LocalVolume, "pv-local-1"),
        PluginName::LocalVolume,
        "pv-local-1".into(),
        target,
        TargetKind::Mount,
        None,
    )
    .with_pod_mount_path(pod_path)
    .with_device_path(Some(PathBuf::from("/dev/loop0").into()))
    .with_device_mount_path(Some(layout.local_device_path("pv-local-1").into()))
    .with_fs_type(Some("ext4".into()))
}

fn ext4(read_only: bool) -> MountIdentity {
    MountIdentity {
        dev: DevId { major: 7, minor: 0 },
        root: "/".into(),
        fs_type: "ext4".into(),
        read_only,
        selinux: None,
    }
}

/// Mounted with P: the device and pod 1 as the fixture shows them; pod 2
/// recorded read-write while the fixture shows its bind read-only.
fn write_journal(j: &Journal) {
    let targets = [
        (Operation::MountDevice, TargetRef::Device, ext4(false)),
        (
            Operation::SetUp,
            TargetRef::Pod(PodUid::new(P1).unwrap()),
            ext4(false),
        ),
        (
            Operation::SetUp,
            TargetRef::Pod(PodUid::new(P2).unwrap()),
            ext4(false),
        ),
    ];
    for (op, target, seen) in targets {
        let intent_seq = j
            .append_record(Body::Intent {
                op,
                steps: Steps::Single,
                target: local_params(target).into(),
            })
            .unwrap();
        j.append_record(Body::Outcome {
            intent_seq,
            op,
            result: OpResult::Success,
            observed: Some(seen),
        })
        .unwrap();
    }
}

#[test]
fn journal_off_rebuilds_every_found_target_as_uncertain() {
    let table = fixture_table();
    let layout = Layout::new(ROOT);
    let boot = BootId::new(BOOT).unwrap();
    let host = HostInput {
        layout: &layout,
        table: &table,
        boot_id: &boot,
        sys: &crate::host::sys::LinuxSys,
    };
    let r = reconstruct(&host, JournalInput::Off);
    let d = &r.output.decisions;
    assert_eq!(d.len(), 4, "{d:#?}");
    assert!(d.iter().all(|d| d.result == MountState::Uncertain));
    assert!(d.iter().all(|d| d.reason == Reason::RebuiltFromHost));
    assert!(d.iter().any(|d| d.key.target == TargetRef::Device));
    // projected (no plugin), the CSI globalmount and pod mount (no vol_data.json here)
    assert_eq!(r.output.failed.len(), 3, "{:#?}", r.output.failed);
    assert_eq!(r.report().journal, "off");
}

#[test]
fn reconstruct_and_record_appends_one_record_per_changed_decision() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("journal");
    let cfg = JournalConfig::new(&dir, "node-a", BOOT);
    let (journal, _) = Journal::open(&cfg).unwrap();
    write_journal(&journal);
    let before = journal.state().last_seq();

    let table = fixture_table();
    let layout = Layout::new(ROOT);
    let boot = BootId::new(BOOT).unwrap();
    let host = HostInput {
        layout: &layout,
        table: &table,
        boot_id: &boot,
        sys: &crate::host::sys::LinuxSys,
    };
    let mut asw = ActualStateOfWorld::new();
    let outcome = reconstruct_and_record(&journal, None, &host, &mut asw).unwrap();
    let out = &outcome.reconstruction.output;
    assert!(outcome.asw_errors.is_empty(), "{:?}", outcome.asw_errors);
    assert_eq!(
        outcome.appended.len() + outcome.unchanged,
        out.decisions.len()
    );
    assert_eq!(out.decisions.len(), 4, "3 journal targets and the emptyDir");
    let reason = |t: &TargetRef| {
        out.decisions
            .iter()
            .find(|d| &d.key.target == t)
            .unwrap()
            .reason
    };
    assert_eq!(reason(&TargetRef::Device), Reason::MountedMatches);
    assert_eq!(
        reason(&TargetRef::Pod(PodUid::new(P1).unwrap())),
        Reason::MountedMatches
    );
    assert_eq!(
        reason(&TargetRef::Pod(PodUid::new(P2).unwrap())),
        Reason::MountedDiffers
    );
    drop(journal);

    // Replayed from disk, the journal reports exactly the decided states.
    let (journal, _) = Journal::open(&cfg).unwrap();
    let replayed = journal.state();
    assert_eq!(replayed.last_seq(), before + outcome.appended.len() as u64);
    for d in &out.decisions {
        let entry = replayed
            .get(&d.key)
            .expect("every decided target is tracked");
        assert_eq!(entry.reported_state(), d.result, "{:?}", d.key);
        assert!(
            crate::reconstruct::journal_agrees(d, &replayed, BOOT),
            "the journal does not imply {:?}",
            d.key
        );
    }
    let volume = UniqueVolumeName::shared(PluginName::LocalVolume, "pv-local-1");
    assert!(asw.volume_exists(&volume));
    drop(journal);
}

#[test]
fn an_unreadable_journal_rebuilds_from_the_host_alone() {
    let table = fixture_table();
    let layout = Layout::new(ROOT);
    let boot = BootId::new(BOOT).unwrap();
    let host = HostInput {
        layout: &layout,
        table: &table,
        boot_id: &boot,
        sys: &crate::host::sys::LinuxSys,
    };
    let r = reconstruct(&host, JournalInput::Unreadable { reason: "checksum" });
    assert_eq!(r.report().journal, "unreadable");
    assert_eq!(r.report().journal_note.as_deref(), Some("checksum"));
    assert!(
        r.output
            .decisions
            .iter()
            .all(|d| d.journal_says == crate::reconstruct::JournalSays::Off)
    );
}

#[test]
fn journal_dirs_without_a_mount_are_observed_present() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let uid = PodUid::new(P1).unwrap();
    let layout = Layout::new(root);
    let pod_path = layout.pod_target_path(&uid, PluginName::LocalVolume, "pv-local-1");
    std::fs::create_dir_all(&pod_path).unwrap();
    let mut params = local_params(TargetRef::Pod(uid));
    params.pod_mount_path = Some(pod_path.as_path().into());
    params = params.with_device_path(Some(root.join("no-such-device").into()));
    let state = crate::journal::JournalState::from_entries(
        1,
        [crate::journal::Entry {
            params: params.into(),
            state: MountState::Mounted,
            pending: None,
            observed: None,
            last_seq: 1,
            boot_id: std::sync::Arc::new(BOOT.into()),
            reason: None,
        }],
    );
    let table = MountTable::parse(b"");
    let view = scan_with_table(
        &crate::host::sys::LinuxSys,
        &table,
        &layout,
        BootId::new(BOOT).unwrap(),
    );
    let input = build_input(&crate::host::sys::LinuxSys, &table, &view, Some(&state));
    assert_eq!(input.observation(&pod_path), &HostObservation::DirPresent);
    assert!(input.device_ids.is_empty());
}

/// The decisions and failures of `r`, order-free, for comparing phases.
fn summary(r: &Reconstruction) -> (Vec<String>, Vec<String>, usize) {
    let mut d: Vec<String> = r
        .output
        .decisions
        .iter()
        .map(|d| format!("{:?} {:?} {:?} {:?}", d.key, d.result, d.reason, d.params))
        .collect();
    let mut f: Vec<String> = r.output.failed.iter().map(|f| format!("{f:?}")).collect();
    d.sort();
    f.sort();
    (d, f, r.output.orphan_leftovers.len())
}

#[test]
fn ready_then_leftovers_decide_what_one_pass_decides() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let layout = Layout::new(&root);
    let (u1, u2) = (PodUid::new(P1).unwrap(), PodUid::new(P2).unwrap());
    // journaled and present: a local PV pod dir with nothing mounted
    let journaled = layout.pod_target_path(&u1, PluginName::LocalVolume, "pv-local-1");
    // host only: a kubelet-era disk emptyDir, a local PV dir with no mount,
    // and an nfs volume (no volumed plugin)
    let bare = layout.pod_target_path(&u2, PluginName::EmptyDir, "scratch");
    let leftover = layout.pod_target_path(&u2, PluginName::LocalVolume, "pv-gone");
    let secret = root.join(format!("pods/{P2}/volumes/kubernetes.io~nfs/tok"));
    for d in [&journaled, &bare, &leftover, &secret] {
        std::fs::create_dir_all(d).unwrap();
    }
    let mut params = local_params(TargetRef::Pod(u1));
    params.pod_mount_path = Some(journaled.as_path().into());
    params = params.with_device_mount_path(Some(layout.local_device_path("pv-local-1").into()));
    let state = crate::journal::JournalState::from_entries(
        2,
        [crate::journal::Entry {
            params: params.into(),
            state: MountState::Mounted,
            pending: None,
            observed: Some(Box::new(ext4(false))),
            last_seq: 2,
            boot_id: std::sync::Arc::new(BOOT.into()),
            reason: None,
        }],
    );
    let table = MountTable::parse(b"1 0 0:1 / / rw - ext4 /dev/a rw\n");
    let boot = BootId::new(BOOT).unwrap();
    let host = HostInput {
        layout: &layout,
        table: &table,
        boot_id: &boot,
        sys: &crate::host::sys::LinuxSys,
    };
    for journal in [JournalInput::Replayed(&state), JournalInput::Off] {
        let one = reconstruct(&host, journal);
        let ready = reconstruct_ready(&host, journal);
        // phase 1 decides the journal target from its own lstat, walks nothing
        assert_eq!(
            ready.output.decisions.len(),
            usize::from(journal.state().is_some())
        );
        let left = reconstruct_leftovers(&host, journal, &ready);
        let both = Reconstruction::combine(ready, left, BOOT, journal);
        assert_eq!(summary(&both), summary(&one), "{}", journal.as_str());
        assert_eq!(both.report().targets.len(), one.report().targets.len());
        assert_eq!(one.output.failed.len(), 1, "the secret");
    }
    let one = reconstruct(&host, JournalInput::Replayed(&state));
    let reason = |p: &Path| {
        one.output
            .decisions
            .iter()
            .find(|d| d.params.path() == Some(p))
            .map(|d| d.reason)
    };
    assert_eq!(reason(&journaled), Some(Reason::UnmountedOutside));
    assert_eq!(reason(&bare), Some(Reason::FoundDir));
    assert_eq!(reason(&leftover), Some(Reason::HostLeftover));
}

/// A journaled raw block pod target is observed as its map: the pod's
/// symlink (where it points, read without following it) and the bind on
/// the pod's file in the global map dir, whole, in part or not at all;
/// the global map dir as a dir. A map no journal knows is found by its
/// bind, with its map dir.
#[test]
fn raw_block_maps_are_observed_as_their_symlink_and_bind() {
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::{Beneath, FileKind, Sys};
    use crate::reconstruct::BlockMap;
    let layout = Layout::new(ROOT);
    let uid = PodUid::new(P1).unwrap();
    let plugin = PluginName::LocalVolume;
    let link = layout.pod_device_map_path(&uid, plugin, "pv-raw");
    let map_dir = layout.local_block_map_dir("pv-raw");
    let file = layout.local_block_pod_map("pv-raw", &uid);
    let params = |target: TargetRef| {
        let pod = target.pod().is_some();
        TargetParams::at(
            UniqueVolumeName::shared(plugin, "pv-raw"),
            plugin,
            "pv-raw".into(),
            target,
            TargetKind::Block,
            None,
        )
        .with_pod_mount_path(pod.then(|| link.as_path().into()))
        .with_device_path(Some(PathBuf::from("/dev/loop3").into()))
        .with_device_mount_path(Some(map_dir.as_path().into()))
    };
    let entry = |target| crate::journal::Entry {
        params: params(target).into(),
        state: MountState::Mounted,
        pending: None,
        observed: None,
        last_seq: 1,
        boot_id: std::sync::Arc::new(BOOT.into()),
        reason: None,
    };
    let state = crate::journal::JournalState::from_entries(
        2,
        [entry(TargetRef::Device), entry(TargetRef::Pod(uid.clone()))],
    );
    let bind = format!(
        "1 0 0:1 / / rw - ext4 /dev/a rw\n20 1 0:5 /loop3 {} rw - devtmpfs udev rw\n",
        file.display()
    );
    let sys = RecordingSys::new();
    sys.add(&map_dir, FileKind::Dir);
    sys.add(link.parent().unwrap(), FileKind::Dir);
    let observe = |table: &MountTable, journal| {
        let view = scan_with_table(&sys, table, &layout, BootId::new(BOOT).unwrap());
        let input = build_input(&sys, table, &view, journal);
        let seen = input.observation(&link).clone();
        let found: Vec<(PathBuf, TargetKind, HostObservation)> = input
            .host_targets
            .iter()
            .map(|h| (h.path.clone(), h.kind, h.observation.clone()))
            .collect();
        (seen, input.observation(&map_dir).clone(), found)
    };
    let mapped = |link: Option<&str>, bound| {
        HostObservation::Mapped(BlockMap {
            link: link.map(PathBuf::from),
            bound,
        })
    };

    // nothing of the pod's map: absent; the map dir: a dir
    let (pod, dir, _) = observe(
        &MountTable::parse(b"1 0 0:1 / / rw - ext4 /dev/a rw\n"),
        Some(&state),
    );
    assert_eq!(pod, HostObservation::Absent);
    assert_eq!(dir, HostObservation::DirPresent);

    // the bind alone, then the symlink too
    let table = MountTable::parse(bind.as_bytes());
    let (pod, ..) = observe(&table, Some(&state));
    assert_eq!(pod, mapped(None, true));
    let at = Beneath::split(Path::new(ROOT), &link).unwrap();
    sys.symlink_beneath(at, Path::new("/dev/loop3")).unwrap();
    let (pod, _, found) = observe(&table, Some(&state));
    assert_eq!(pod, mapped(Some("/dev/loop3"), true));

    // found without a journal: the pod's map and its volume's map dir
    let whole = mapped(Some("/dev/loop3"), true);
    let want = vec![
        (
            map_dir.clone(),
            TargetKind::Block,
            HostObservation::DirPresent,
        ),
        (link.clone(), TargetKind::Block, whole.clone()),
    ];
    assert_eq!(found, want);
    let (_, _, found) = observe(&table, None);
    assert_eq!(found, want);

    // the symlink alone: in part; found by the pod-dir walk without a journal
    let (_, _, found) = observe(
        &MountTable::parse(b"1 0 0:1 / / rw - ext4 /dev/a rw\n"),
        None,
    );
    let part = mapped(Some("/dev/loop3"), false);
    assert_eq!(
        found,
        [
            (
                map_dir.clone(),
                TargetKind::Block,
                HostObservation::DirPresent
            ),
            (link.clone(), TargetKind::Block, part.clone()),
        ]
    );
    let (pod, ..) = observe(
        &MountTable::parse(b"1 0 0:1 / / rw - ext4 /dev/a rw\n"),
        Some(&state),
    );
    assert_eq!(pod, part);
}

/// `--journal off` over a CSI raw block map (a real tree, the mount table
/// as text): the pod's map is found by our bind on its file in the
/// volume's global map path, its volume named by the block
/// `vol_data.json` (driver and handle), and rebuilt uncertain with its
/// staging dir, as the kubelet's reconstruction marks a block volume's
/// pods and device. The symlink left alone (its bind gone) is found by
/// the pod-dir walk; without `vol_data.json` the map cannot be rebuilt.
#[test]
fn journal_off_rebuilds_a_csi_block_map_from_its_bind_and_vol_data() {
    use crate::host::sys::LinuxSys;
    use crate::reconstruct::BlockMap;
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap().join("kubelet");
    let layout = Layout::new(&root);
    let uid = PodUid::new(P1).unwrap();
    let link = layout.pod_device_map_path(&uid, PluginName::Csi, "pv-c");
    let staging = layout.csi_block_staging_path("pv-c");
    let publish = layout.csi_block_publish_path("pv-c", &uid);
    let file = layout.csi_block_pod_map("pv-c", &uid);
    let vol_data = layout.csi_block_vol_data("pv-c");
    for d in [&staging, &layout.csi_block_map_dir("pv-c")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::create_dir_all(publish.parent().unwrap()).unwrap();
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::fs::create_dir_all(vol_data.parent().unwrap()).unwrap();
    std::fs::write(&publish, b"").unwrap();
    std::fs::write(&file, b"").unwrap();
    std::os::unix::fs::symlink(&publish, &link).unwrap();
    std::fs::write(
        &vol_data,
        br#"{"specVolID":"pv-c","volumeHandle":"h-1","driverName":"d.example.com","nodeName":"n1","attachmentID":"csi-1"}"#,
    )
    .unwrap();
    let boot = BootId::new(BOOT).unwrap();
    let bound = MountTable::parse(
        format!(
            "1 0 0:1 / / rw - ext4 /dev/a rw\n20 1 0:5 /loop7 {} rw - devtmpfs udev rw\n21 1 0:5 /loop7 {} rw - devtmpfs udev rw\n",
            publish.display(),
            file.display()
        )
        .as_bytes(),
    );
    let host = |table| HostInput {
        layout: &layout,
        table,
        boot_id: &boot,
        sys: &LinuxSys,
    };
    let volume = "kubernetes.io/csi/d.example.com^h-1";
    let r = reconstruct(&host(&bound), JournalInput::Off);
    let d = &r.output.decisions;
    assert_eq!(d.len(), 2, "{d:#?}");
    assert!(r.output.failed.is_empty(), "{:#?}", r.output.failed);
    for d in d {
        assert_eq!(d.result, MountState::Uncertain, "{d:?}");
        assert_eq!(d.reason, Reason::RebuiltFromHost, "{d:?}");
        assert_eq!(d.params.volume.as_str(), volume);
        assert_eq!(d.params.kind, TargetKind::Block);
        let csi = d.params.csi().expect("the driver and handle to unmap with");
        assert_eq!(
            (csi.driver.as_str(), csi.volume_handle.as_str()),
            ("d.example.com", "h-1")
        );
    }
    let device = d
        .iter()
        .find(|d| d.key.target == TargetRef::Device)
        .unwrap();
    assert_eq!(device.params.path(), Some(staging.as_path()));
    let pod = d
        .iter()
        .find(|d| d.key.target == TargetRef::Pod(uid.clone()))
        .unwrap();
    assert_eq!(pod.params.path(), Some(link.as_path()));
    assert_eq!(
        pod.params.device_path(),
        Some(publish.as_path()),
        "the symlink's target"
    );

    // the binds gone (a reboot): the symlink alone, found by the walk
    let bare = MountTable::parse(b"1 0 0:1 / / rw - ext4 /dev/a rw\n");
    let view = super::phases::walk_all_leftovers(&host(&bare));
    let found: Vec<_> = view
        .block_maps
        .iter()
        .map(|m| {
            (
                m.link.as_path(),
                m.map_dir.as_path(),
                m.bound,
                m.vol_data.is_some(),
            )
        })
        .collect();
    assert_eq!(found, [(link.as_path(), staging.as_path(), false, true)]);
    let input = build_input(&LinuxSys, &bare, &view, None);
    let part = HostObservation::Mapped(BlockMap {
        link: Some(publish.clone()),
        bound: false,
    });
    assert!(
        input
            .host_targets
            .iter()
            .any(|h| h.path == link && h.observation == part),
        "{:#?}",
        input.host_targets
    );

    // no vol_data.json: the map is listed as failed, never named by guess
    std::fs::remove_file(&vol_data).unwrap();
    let r = reconstruct(&host(&bound), JournalInput::Off);
    assert!(r.output.decisions.is_empty(), "{:#?}", r.output.decisions);
    assert_eq!(r.output.failed.len(), 2, "{:#?}", r.output.failed);
}

/// The pod-dir walk decides a leftover dir no journal knows; an operation
/// takes its target before the walk's records are appended (the loop runs
/// meanwhile). That decision is neither journaled nor applied: the
/// journal keeps the operation's intent. Without the operation it is both.
#[test]
fn a_walk_decision_an_operation_took_meanwhile_is_left_to_it() {
    use super::phases::walk_all_leftovers;
    use super::record::{decide_walked, record_decided_walk};
    for taken in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap().join("root");
        let layout = Layout::new(&root);
        let uid = PodUid::new(P2).unwrap();
        let bare = layout.pod_target_path(&uid, PluginName::EmptyDir, "scratch");
        std::fs::create_dir_all(&bare).unwrap();
        let (j, _) =
            Journal::open(&JournalConfig::new(tmp.path().join("journal"), "n", BOOT)).unwrap();
        let table = MountTable::parse(b"1 0 0:1 / / rw - ext4 /dev/a rw\n");
        let boot = BootId::new(BOOT).unwrap();
        let host = HostInput {
            layout: &layout,
            table: &table,
            boot_id: &boot,
            sys: &crate::host::sys::LinuxSys,
        };
        let state = j.state();
        let ready = reconstruct_ready(&host, JournalInput::Replayed(&state));
        let walked = decide_walked(&j, None, &host, &ready, walk_all_leftovers(&host));
        let decision = walked.reconstruction.output.decisions.first().cloned();
        let decision = decision.expect("the bare dir is decided");
        assert_eq!(decision.params.path(), Some(bare.as_path()));
        let _intent = taken.then(|| {
            j.announce(Operation::SetUp, Steps::Single, &decision.params)
                .unwrap()
        });
        let mut asw = ActualStateOfWorld::new();
        let out = record_decided_walk(&j, walked, &mut asw).unwrap();
        let entry = j.state().get(&decision.key).cloned();
        let entry = entry.expect("an entry either way");
        if taken {
            assert!(out.reconstruction.output.decisions.is_empty());
            assert!(out.appended.is_empty(), "nothing journaled");
            assert!(entry.pending.is_some(), "the operation's intent stays last");
        } else {
            assert_eq!(out.reconstruction.output.decisions.len(), 1);
            assert_eq!(out.appended.len(), 1);
            assert!(entry.pending.is_none());
        }
        let target = decision.key.target.pod().cloned().expect("a pod target");
        assert_eq!(asw.pod(&decision.key.volume, &target).is_some(), !taken);
    }
}
