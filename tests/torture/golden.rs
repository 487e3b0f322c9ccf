//! The one real journal the torture tests damage: written through the
//! daemon's own writer API (`begin`/`announce`/`confirm`/`finish`/
//! `withdraw`/`forget`/`record_reconstruction`/`checkpoint`) with a mix of
//! what a node does: emptyDir and local-PV mounts, CSI stage and publish
//! with their arguments, failures, teardowns, forgotten targets,
//! reconstruction decisions, a checkpoint in the middle and intents left
//! pending at the end.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use volumed::journal::{Decided, Journal, JournalConfig, OpResult, TargetKey};
use volumed::model::{
    AccessMode, CsiLifecycle, CsiParams, DevId, MountIdentity, MountState, Operation, PluginName,
    PodUid, SecretRef, SharedParams, Steps, TargetKind, TargetParams, TargetRef, UniqueVolumeName,
};

/// The boot id the journal is written and (mostly) reopened under.
pub const BOOT: &str = "70270270-1111-2222-3333-444444444444";
/// The node name in meta.
pub const NODE: &str = "torture-node";

fn uid(i: usize) -> PodUid {
    PodUid::new(format!("0000000{i}-aaaa-bbbb-cccc-{i:012}")).unwrap()
}

fn empty_dir(i: usize) -> TargetParams {
    let pod = uid(i);
    TargetParams::at(
        UniqueVolumeName::from_raw(format!("kubernetes.io/empty-dir/{pod}-cache")),
        PluginName::EmptyDir,
        "cache".into(),
        TargetRef::Pod(pod.clone()),
        TargetKind::Mount,
        Some(format!("/var/lib/kubelet/pods/{pod}/volumes/kubernetes.io~empty-dir/cache").into()),
    )
    .with_mount_options(vec![format!("size={}k", 64 * (i + 1))].into())
    .with_fs_type(Some("tmpfs".into()))
}

fn local_device(i: usize) -> TargetParams {
    TargetParams::at(
        UniqueVolumeName::from_raw(format!("kubernetes.io/local-volume/pv-local-{i}")),
        PluginName::LocalVolume,
        format!("pv-local-{i}").into(),
        TargetRef::Device,
        TargetKind::Mount,
        Some(
            format!("/var/lib/kubelet/plugins/kubernetes.io/local-volume/mounts/pv-local-{i}")
                .into(),
        ),
    )
    .with_device_path(Some(format!("/dev/loop{i}").into()))
    .with_mount_options(vec!["noatime".into()].into())
    .with_fs_type(Some("ext4".into()))
}

fn on_pod(device: &TargetParams, i: usize, plugin_dir: &str, leaf: &str) -> TargetParams {
    let pod = uid(i);
    let path = format!(
        "/var/lib/kubelet/pods/{pod}/volumes/{plugin_dir}/{}{leaf}",
        device.spec_name
    );
    let mut p = device.clone().with_pod_mount_path(Some(path.into()));
    p.target = TargetRef::Pod(pod);
    p
}

fn csi_device(i: usize) -> TargetParams {
    let csi = CsiParams {
        driver: "hostpath.csi.k8s.io".into(),
        volume_handle: format!("vol-{i}"),
        lifecycle: CsiLifecycle::Persistent,
        access_modes: vec![AccessMode::ReadWriteOnce],
        read_only: i.is_multiple_of(2),
        publish_context: [("lun".to_owned(), i.to_string())].into(),
        volume_context: [(
            "storage.kubernetes.io/csiProvisionerIdentity".to_owned(),
            "x".into(),
        )]
        .into(),
        stage_secret: Some(SecretRef {
            namespace: "ns".into(),
            name: format!("stage-{i}"),
        }),
        publish_secret: None,
        mount_group: Some("2000".into()),
        attachment_id: Some(format!("csi-{i:04}")),
    };
    let driver = "hostpath.csi.k8s.io";
    let volume = UniqueVolumeName::from_raw(format!("kubernetes.io/csi/{driver}^vol-{i}"));
    let global =
        format!("/var/lib/kubelet/plugins/kubernetes.io/csi/{driver}/{i:064x}/globalmount");
    TargetParams::at(
        volume,
        PluginName::Csi,
        format!("pv-csi-{i}").into(),
        TargetRef::Device,
        TargetKind::Mount,
        Some(global.into()),
    )
    .with_fs_type(Some("xfs".into()))
    .with_csi(Some(Arc::new(csi)))
}

fn seen(fs: &str, minor: u32) -> Option<MountIdentity> {
    Some(MountIdentity {
        dev: DevId { major: 7, minor },
        root: "/".into(),
        fs_type: fs.into(),
        read_only: false,
        selinux: None,
    })
}

/// What was written: every target ever named (nothing outside it may
/// appear in a replay) and the highest sequence number acknowledged.
pub struct Written {
    /// every target a record names
    pub keys: BTreeSet<TargetKey>,
    /// the last acknowledged record
    pub acked: u64,
}

/// Writes the journal into `dir` (created) and closes it.
pub fn write(dir: &Path) -> Written {
    let (j, _) = Journal::open(&JournalConfig::new(dir, NODE, BOOT)).unwrap();
    let mut keys = BTreeSet::new();
    let mut remember = |p: &SharedParams| {
        keys.insert(TargetKey::of(p));
    };
    // One operation, begun and finished.
    let done = |j: &Journal,
                op: Operation,
                steps: Steps,
                p: &SharedParams,
                r: OpResult,
                obs: Option<MountIdentity>| {
        let d = j.begin(op, steps, p).unwrap();
        j.finish(d, r, obs).unwrap();
    };
    for round in 0..2 {
        for i in (round * 6)..(round * 6 + 6) {
            let ed: SharedParams = Arc::new(empty_dir(i));
            remember(&ed);
            done(
                &j,
                Operation::SetUp,
                Steps::Single,
                &ed,
                OpResult::Success,
                seen("tmpfs", 50),
            );

            let dev: SharedParams = Arc::new(local_device(i));
            remember(&dev);
            done(
                &j,
                Operation::FormatDevice,
                Steps::Multi,
                &dev,
                OpResult::Success,
                None,
            );
            done(
                &j,
                Operation::MountDevice,
                Steps::Single,
                &dev,
                OpResult::Success,
                seen("ext4", 5),
            );
            let pod: SharedParams = Arc::new(on_pod(&dev, i, "kubernetes.io~local-volume", ""));
            remember(&pod);
            // Announced with others, confirmed, then done.
            let a = j.announce(Operation::SetUp, Steps::Single, &pod).unwrap();
            let d = j.confirm(a).unwrap();
            let result = match i % 4 {
                3 => OpResult::FailedUncertain("mount: timed out".into()),
                _ => OpResult::Success,
            };
            j.finish(d, result, seen("ext4", 5)).unwrap();

            let csi: SharedParams = Arc::new(csi_device(i));
            remember(&csi);
            done(
                &j,
                Operation::MountDevice,
                Steps::Multi,
                &csi,
                OpResult::Success,
                None,
            );
            let cpod: SharedParams = Arc::new(on_pod(&csi, i, "kubernetes.io~csi", "/mount"));
            remember(&cpod);
            if i % 5 == 4 {
                // Admission refused it after announcing: withdrawn.
                let a = j.announce(Operation::SetUp, Steps::Multi, &cpod).unwrap();
                j.withdraw(a, "selinux label conflict".into()).unwrap();
            } else {
                done(
                    &j,
                    Operation::SetUp,
                    Steps::Multi,
                    &cpod,
                    OpResult::Success,
                    seen("xfs", 9),
                );
            }
        }
        if round == 0 {
            j.checkpoint().unwrap();
        }
    }
    // Teardowns, then forgetting what is fully cleaned up.
    for i in [1usize, 2, 7] {
        let ed: SharedParams = Arc::new(empty_dir(i));
        done(
            &j,
            Operation::TearDown,
            Steps::Single,
            &ed,
            OpResult::Success,
            None,
        );
        j.forget(&ed.volume, vec![ed.target.clone()]).unwrap();
        let dev: SharedParams = Arc::new(local_device(i));
        let pod: SharedParams = Arc::new(on_pod(&dev, i, "kubernetes.io~local-volume", ""));
        done(
            &j,
            Operation::TearDown,
            Steps::Single,
            &pod,
            OpResult::Success,
            None,
        );
        done(
            &j,
            Operation::UnmountDevice,
            Steps::Single,
            &dev,
            OpResult::Success,
            None,
        );
        j.forget(&dev.volume, vec![pod.target.clone(), TargetRef::Device])
            .unwrap();
        let csi: SharedParams = Arc::new(csi_device(i));
        let failed = OpResult::FailedFinal("rpc error: code = Internal".into());
        done(
            &j,
            Operation::UnmountDevice,
            Steps::Multi,
            &csi,
            failed,
            None,
        );
    }
    // What a restart's reconstruction writes.
    let decided = (3..5)
        .map(|i| Decided {
            target: Arc::new(empty_dir(i)),
            state: if i == 3 {
                MountState::Mounted
            } else {
                MountState::Uncertain
            },
            reason: "journal_mounted_host_mounted".into(),
            observed: seen("tmpfs", 51),
        })
        .collect();
    j.record_reconstruction(decided).unwrap();
    // In flight at the end: intents with no outcome.
    let ed: SharedParams = Arc::new(empty_dir(20));
    remember(&ed);
    let _pending = j.begin(Operation::SetUp, Steps::Single, &ed).unwrap();
    let csi: SharedParams = Arc::new(csi_device(5));
    let _pending = j
        .begin(Operation::UnmountDevice, Steps::Multi, &csi)
        .unwrap();
    let acked = j.synced_through();
    j.close().unwrap();
    Written { keys, acked }
}
