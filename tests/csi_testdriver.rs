//! The test CSI driver (`volumed-testdriver`) against a real kernel, each
//! test in its own private mount namespace, the driver a real child
//! process driven over its unix socket with the generated tonic clients:
//! stage / publish / unpublish / unstage with the mounts they make and
//! remove, validation, an injected error that does no work, a delay the
//! caller gives up on while the work completes, a death after the work and
//! an idempotent retry on a restarted driver, stacked publishes with
//! `--stack`, `--no-stage` and volume health, mount flags on the mount that
//! makes the superblock (a refused one named in the status), the
//! registration socket, and a restarted driver taking back the loop
//! device of a staged block volume.
//!
//! Needs root (mounts); as another user each test prints what it skipped
//! and passes.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::HashMap;
use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use tonic::Code;

use support::csi_driver::{DriverOpts, TestDriver, read_outcomes};
use support::{Scratch, in_private_mount_ns, require_root};
use volumed::csi::connect_unix;
use volumed::csi::proto::csi_v1::{
    GetPluginInfoRequest, NodeGetCapabilitiesRequest, NodeGetInfoRequest,
    NodeGetVolumeStatsRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, ProbeRequest, VolumeCapability,
    identity_client::IdentityClient,
    node_client::NodeClient,
    node_service_capability,
    volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode},
    volume_usage::Unit,
};
use volumed::csi::proto::pluginregistration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use volumed::host::mountinfo::{MountInfo, MountTable};

const DRIVER: &str = "test.csi.volumed.dev";
const VOL: &str = "vol-1";

/// Runs `body` as root in a private mount namespace on a current-thread
/// runtime; as another user, skips.
fn in_ns<F, Fut>(what: &str, body: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    if !require_root(what) {
        return;
    }
    in_private_mount_ns(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
            .block_on(body());
    });
}

/// The mounts stacked exactly at `path`, bottom first.
fn mounts_at(path: &Path) -> Vec<MountInfo> {
    MountTable::read_self()
        .expect("read mountinfo")
        .entries()
        .iter()
        .filter(|m| m.mount_point == path)
        .cloned()
        .collect()
}

fn capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec!["noatime".into()],
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn stage_req(staging: &Path) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: VOL.into(),
        publish_context: map(&[("attached", "yes")]),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability()),
        secrets: map(&[("password", "s3cret")]),
        volume_context: map(&[("tier", "gold")]),
    }
}

fn publish_req(staging: &Path, target: &Path, readonly: bool) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: VOL.into(),
        publish_context: HashMap::new(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability()),
        readonly,
        secrets: map(&[("token", "t0k")]),
        volume_context: map(&[("tier", "gold")]),
    }
}

fn unpublish_req(target: &Path) -> NodeUnpublishVolumeRequest {
    NodeUnpublishVolumeRequest {
        volume_id: VOL.into(),
        target_path: target.display().to_string(),
    }
}

fn unstage_req(staging: &Path) -> NodeUnstageVolumeRequest {
    NodeUnstageVolumeRequest {
        volume_id: VOL.into(),
        staging_target_path: staging.display().to_string(),
    }
}

async fn node(driver: &TestDriver) -> NodeClient<tonic::transport::Channel> {
    NodeClient::new(connect_unix(driver.endpoint()).await.expect("connect"))
}

/// A scratch dir with the driver's socket and state in `driver/`, the
/// staging path and a target below it (neither created).
fn layout(prefix: &str) -> (Scratch, DriverOpts, PathBuf, PathBuf) {
    let scratch = Scratch::new(prefix);
    let opts = DriverOpts::in_dir(DRIVER, &scratch.path().join("driver"));
    let staging = scratch.path().join("staging").join(VOL);
    let target = scratch.path().join("pod").join("mount");
    (scratch, opts, staging, target)
}

/// Waits (up to `timeout`) until `cond` holds.
async fn eventually(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn stage_publish_unpublish_unstage_mount_and_unmount_for_real() {
    in_ns("mounts tmpfs and binds", || async {
        let (scratch, mut opts, staging, target) = layout("csi-td-life-");
        opts.node_id = Some("node-a".into());
        let mut driver = TestDriver::spawn(opts);
        let channel = connect_unix(driver.endpoint()).await.unwrap();
        let mut identity = IdentityClient::new(channel.clone());
        let mut client = NodeClient::new(channel);

        let info = identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, DRIVER);
        assert!(!info.vendor_version.is_empty());
        let probe = identity.probe(ProbeRequest {}).await.unwrap().into_inner();
        assert_eq!(probe.ready, Some(true));
        let node_info = client
            .node_get_info(NodeGetInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(node_info.node_id, "node-a");
        assert_eq!(node_info.max_volumes_per_node, 0);
        let caps: Vec<i32> = client
            .node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| {
                c.r#type
                    .map(|node_service_capability::Type::Rpc(r)| r.r#type)
            })
            .collect();
        use node_service_capability::rpc::Type;
        assert_eq!(
            caps,
            [
                Type::StageUnstageVolume as i32,
                Type::GetVolumeStats as i32,
                Type::VolumeCondition as i32
            ]
        );

        // validation: missing fields, publish before stage
        let mut bad = stage_req(&staging);
        bad.volume_id.clear();
        let err = client.node_stage_volume(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let mut bad = stage_req(&staging);
        bad.volume_capability = None;
        let err = client.node_stage_volume(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        let err = client
            .node_publish_volume(publish_req(&staging, &target, false))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
        assert!(mounts_at(&target).is_empty());

        // stage: the staging dir is created and gets a tmpfs; again: no-op
        client.node_stage_volume(stage_req(&staging)).await.unwrap();
        let staged = mounts_at(&staging);
        assert_eq!(staged.len(), 1, "{staged:?}");
        assert_eq!(
            (staged[0].fs_type.as_str(), staged[0].source.to_str()),
            ("tmpfs", Some("tmpfs"))
        );
        assert_eq!(staged[0].fs_type, "tmpfs");
        client.node_stage_volume(stage_req(&staging)).await.unwrap();
        assert_eq!(mounts_at(&staging).len(), 1);

        // publish: a bind of the staged tmpfs, created target dir
        client
            .node_publish_volume(publish_req(&staging, &target, false))
            .await
            .unwrap();
        let published = mounts_at(&target);
        assert_eq!(published.len(), 1, "{published:?}");
        assert_eq!(published[0].dev, staged[0].dev, "a bind of the staged fs");
        assert!(!published[0].is_read_only());
        std::fs::write(target.join("hello"), b"through the target").unwrap();
        assert_eq!(
            std::fs::read(staging.join("hello")).unwrap(),
            b"through the target"
        );
        // publish again without --stack: OK, nothing stacked
        client
            .node_publish_volume(publish_req(&staging, &target, false))
            .await
            .unwrap();
        assert_eq!(mounts_at(&target).len(), 1);

        // a read-only publish elsewhere is a read-only bind
        let ro_target = scratch.path().join("pod-ro").join("mount");
        client
            .node_publish_volume(publish_req(&staging, &ro_target, true))
            .await
            .unwrap();
        let ro = mounts_at(&ro_target);
        assert_eq!(ro.len(), 1);
        assert!(ro[0].is_read_only(), "{:?}", ro[0].mount_options);
        assert_eq!(std::fs::read(ro_target.join("hello")).unwrap().len(), 18);
        let err = std::fs::write(ro_target.join("nope"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");

        // stats: bytes and inodes of the tmpfs, condition ok
        let stats = client
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: VOL.into(),
                volume_path: target.display().to_string(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        let units: Vec<i32> = stats.usage.iter().map(|u| u.unit).collect();
        assert_eq!(units, [Unit::Bytes as i32, Unit::Inodes as i32]);
        assert!(stats.usage.iter().all(|u| u.total > 0 && u.used > 0));
        let condition = stats.volume_condition.expect("VOLUME_CONDITION advertised");
        assert!(!condition.abnormal);
        assert_eq!(condition.message, "ok");
        let err = client
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: VOL.into(),
                volume_path: scratch.path().join("nowhere").display().to_string(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{err}");

        // unpublish: unmounted and the target dir removed; again: OK
        for t in [&target, &ro_target] {
            client
                .node_unpublish_volume(unpublish_req(t))
                .await
                .unwrap();
            assert!(mounts_at(t).is_empty());
            assert!(!t.exists(), "the SP removes the target");
        }
        client
            .node_unpublish_volume(unpublish_req(&target))
            .await
            .unwrap();
        assert_eq!(std::fs::read(staging.join("hello")).unwrap().len(), 18);

        // unstage: unmounted, the staging dir stays (the CO's); again: OK
        client
            .node_unstage_volume(unstage_req(&staging))
            .await
            .unwrap();
        assert!(mounts_at(&staging).is_empty());
        assert!(staging.is_dir() && !staging.join("hello").exists());
        client
            .node_unstage_volume(unstage_req(&staging))
            .await
            .unwrap();
        assert!(scratch.mounts_below().is_empty());

        // every call logged, invalid ones too, with its arguments
        for (method, n) in [
            ("GetPluginInfo", 1),
            ("Probe", 1),
            ("NodeGetInfo", 1),
            ("NodeGetCapabilities", 1),
            ("NodeStageVolume", 4),
            ("NodePublishVolume", 4),
            ("NodeGetVolumeStats", 2),
            ("NodeUnpublishVolume", 3),
            ("NodeUnstageVolume", 2),
        ] {
            assert_eq!(driver.count(method), n, "{method}");
        }
        assert_eq!(driver.calls().len(), 19);
        let calls = driver.calls();
        let stage = calls
            .iter()
            .rfind(|c| c["method"] == "NodeStageVolume")
            .unwrap();
        assert_eq!(stage["staging_target_path"], staging.display().to_string());
        assert_eq!(stage["secrets"], json!({"password": "s3cret"}));
        assert_eq!(stage["volume_context"], json!({"tier": "gold"}));
        assert_eq!(stage["publish_context"], json!({"attached": "yes"}));
        assert_eq!(stage["fs_type"], "ext4");
        assert_eq!(stage["mount_flags"], json!(["noatime"]));
        assert_eq!(stage["access_mode"], Mode::SingleNodeWriter as i32);
        let ro_publish = calls
            .iter()
            .find(|c| c["method"] == "NodePublishVolume" && c["readonly"] == true)
            .unwrap();
        assert_eq!(ro_publish["target_path"], ro_target.display().to_string());
        assert_eq!(ro_publish["secrets"], json!({"token": "t0k"}));

        // SIGTERM: exit 0, socket removed
        let endpoint = driver.endpoint().to_owned();
        let status = driver.stop().expect("exit status");
        assert_eq!(status.code(), Some(0), "{status}");
        assert!(!endpoint.exists(), "socket removed on SIGTERM");
    });
}

#[test]
fn an_error_fault_answers_the_code_and_does_no_work() {
    in_ns("mounts tmpfs", || async {
        let (scratch, opts, staging, _) = layout("csi-td-code-");
        let driver = TestDriver::spawn(opts);
        let mut client = node(&driver).await;
        driver.set_faults(json!([
            {"method": "NodeStageVolume", "volume_id": "other-vol", "code": "Internal"},
            {"method": "NodeStageVolume", "code": "Unavailable", "message": "not yet", "times": 1},
        ]));

        let err = client
            .node_stage_volume(stage_req(&staging))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
        assert_eq!(err.message(), "not yet");
        assert!(
            !staging.exists(),
            "no work: the staging dir is not even created"
        );
        assert!(scratch.mounts_below().is_empty());
        assert_eq!(driver.faults()[1]["times"], 0, "the use is counted down");
        assert_eq!(driver.faults()[0]["code"], "Internal", "other rules kept");

        // the rule is used up: the retry works
        client.node_stage_volume(stage_req(&staging)).await.unwrap();
        assert_eq!(mounts_at(&staging).len(), 1);
        assert_eq!(driver.count("NodeStageVolume"), 2);
        // each answer's code in the outcome log, named as its call is
        let calls = driver.calls_timed();
        let outcomes = read_outcomes(&driver.opts().state);
        let codes: Vec<_> = outcomes.iter().map(|o| o["code"].clone()).collect();
        assert_eq!(codes, [json!("Unavailable"), json!("OK")], "{outcomes:?}");
        for (c, o) in calls.iter().zip(&outcomes) {
            for k in ["method", "pid", "at_ms", "staging_target_path"] {
                assert_eq!(c[k], o[k], "{k}: {c} / {o}");
            }
        }

        // a fault file that does not parse fails loudly
        driver.set_faults(json!([{"method": "NodeUnstageVolume", "cod": "Internal"}]));
        let err = client
            .node_unstage_volume(unstage_req(&staging))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{err}");
        assert!(err.message().contains("faults.json"), "{err}");
        assert_eq!(mounts_at(&staging).len(), 1);

        driver.clear_faults();
        client
            .node_unstage_volume(unstage_req(&staging))
            .await
            .unwrap();
        assert!(scratch.mounts_below().is_empty());
    });
}

#[test]
fn a_delayed_call_times_out_at_the_caller_and_still_completes() {
    in_ns("mounts tmpfs", || async {
        let (scratch, opts, staging, _) = layout("csi-td-delay-");
        let driver = TestDriver::spawn(opts);
        let mut client = node(&driver).await;
        driver.set_faults(json!([
            {"method": "NodeStageVolume", "delay_ms": 1500, "times": 1},
        ]));

        let start = Instant::now();
        let mut req = tonic::Request::new(stage_req(&staging));
        req.set_timeout(Duration::from_millis(300));
        let err = client.node_stage_volume(req).await.unwrap_err();
        // tonic 0.14 reports its own deadline (the `grpc-timeout` it sent)
        // as CANCELLED "Timeout expired", where a Go client says
        // DEADLINE_EXCEEDED: a CSI caller must take both as "outcome unknown"
        assert!(
            err.code() == Code::DeadlineExceeded
                || (err.code() == Code::Cancelled && err.message() == "Timeout expired"),
            "{err:?}"
        );
        assert!(
            start.elapsed() < Duration::from_millis(1200),
            "{:?}",
            start.elapsed()
        );
        assert!(mounts_at(&staging).is_empty(), "not yet: still sleeping");

        eventually(
            Duration::from_secs(10),
            "the delayed stage to mount",
            || mounts_at(&staging).len() == 1,
        )
        .await;
        assert!(start.elapsed() >= Duration::from_millis(1500));
        assert_eq!(driver.count("NodeStageVolume"), 1);

        // the retry finds it staged
        client.node_stage_volume(stage_req(&staging)).await.unwrap();
        assert_eq!(mounts_at(&staging).len(), 1);
        client
            .node_unstage_volume(unstage_req(&staging))
            .await
            .unwrap();
        assert!(scratch.mounts_below().is_empty());
    });
}

#[test]
fn a_driver_that_dies_after_the_work_is_retried_idempotently() {
    in_ns("mounts tmpfs", || async {
        let (scratch, opts, staging, _) = layout("csi-td-die-");
        let mut driver = TestDriver::spawn(opts);
        driver.set_faults(json!([
            {"method": "NodeStageVolume", "die_after_work": true, "times": 1},
        ]));
        let mut client = node(&driver).await;

        let err = client
            .node_stage_volume(stage_req(&staging))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err.code(),
                Code::Unavailable | Code::Unknown | Code::Internal
            ),
            "no reply, a broken connection (tonic: UNKNOWN \"transport error\"): {err:?}"
        );
        let status = driver.wait_exit(Duration::from_secs(10));
        assert_eq!(status.signal(), Some(9), "killed, not exited: {status}");
        assert_eq!(mounts_at(&staging).len(), 1, "the work was done");
        assert!(
            driver.endpoint().exists(),
            "a dead driver leaves its socket"
        );

        // restarted on the same state: stale socket replaced, rule used up
        let mut driver = TestDriver::spawn(driver.opts().clone());
        assert_eq!(driver.faults()[0]["times"], 0);
        let mut client = node(&driver).await;
        client.node_stage_volume(stage_req(&staging)).await.unwrap();
        assert_eq!(mounts_at(&staging).len(), 1, "idempotent: no second tmpfs");
        assert_eq!(
            driver.count("NodeStageVolume"),
            2,
            "the log survives restarts"
        );
        let pids: Vec<_> = driver.calls().iter().map(|c| c["pid"].clone()).collect();
        assert_ne!(pids[0], pids[1], "the calls came to two processes");

        client
            .node_unstage_volume(unstage_req(&staging))
            .await
            .unwrap();
        assert!(scratch.mounts_below().is_empty());
        assert!(driver.kill().is_some());
    });
}

#[test]
fn stack_mounts_a_second_publish_on_top_and_the_default_does_not() {
    in_ns("mounts tmpfs and binds", || async {
        for stack in [true, false] {
            let (scratch, mut opts, staging, target) = layout("csi-td-stack-");
            opts.stack = stack;
            let driver = TestDriver::spawn(opts);
            let mut client = node(&driver).await;
            client.node_stage_volume(stage_req(&staging)).await.unwrap();
            for _ in 0..2 {
                client
                    .node_publish_volume(publish_req(&staging, &target, false))
                    .await
                    .unwrap();
            }
            let expected = if stack { 2 } else { 1 };
            assert_eq!(mounts_at(&target).len(), expected, "--stack {stack}");
            assert_eq!(driver.count("NodePublishVolume"), 2);

            if stack {
                // one unmount leaves the lower bind: the unpublish fails, as
                // Kubernetes' CleanupMountPoint does; the next one finishes
                let err = client
                    .node_unpublish_volume(unpublish_req(&target))
                    .await
                    .unwrap_err();
                assert_eq!(err.code(), Code::Internal, "{err}");
                assert_eq!(mounts_at(&target).len(), 1);
            }
            client
                .node_unpublish_volume(unpublish_req(&target))
                .await
                .unwrap();
            assert!(mounts_at(&target).is_empty() && !target.exists());
            client
                .node_unstage_volume(unstage_req(&staging))
                .await
                .unwrap();
            assert!(scratch.mounts_below().is_empty());
        }
    });
}

#[test]
fn without_stage_publish_mounts_its_own_tmpfs_and_health_follows_faults() {
    in_ns("mounts tmpfs", || async {
        let (scratch, mut opts, staging, target) = layout("csi-td-nostage-");
        opts.no_stage = true;
        opts.caps = Some("GET_VOLUME_STATS,VOLUME_CONDITION,VOLUME_MOUNT_GROUP".into());
        let driver = TestDriver::spawn(opts);
        let mut client = node(&driver).await;
        let caps = client
            .node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await
            .unwrap()
            .into_inner()
            .capabilities;
        assert_eq!(caps.len(), 3, "no STAGE_UNSTAGE_VOLUME: {caps:?}");
        let err = client
            .node_stage_volume(stage_req(&staging))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented, "{err}");

        let mut req = publish_req(Path::new(""), &target, true);
        if let Some(AccessType::Mount(m)) = req
            .volume_capability
            .as_mut()
            .and_then(|c| c.access_type.as_mut())
        {
            m.volume_mount_group = "1234".into();
            m.mount_flags = vec!["size=3m".into()];
        }
        client.node_publish_volume(req).await.unwrap();
        let mounted = mounts_at(&target);
        assert_eq!(mounted.len(), 1);
        assert_eq!(mounted[0].fs_type, "tmpfs");
        assert!(mounted[0].is_read_only());
        assert!(
            mounted[0]
                .super_options_raw
                .to_string_lossy()
                .contains("gid=1234")
        );
        assert!(
            mounted[0]
                .super_options_raw
                .to_string_lossy()
                .split(',')
                .any(|o| o == "size=3072k"),
            "without staging the publish's flags make the tmpfs: {:?}",
            mounted[0].super_options_raw
        );
        assert_eq!(driver.calls().last().unwrap()["volume_mount_group"], "1234");

        driver.set_faults(json!([
            {"method": "NodeGetVolumeStats", "abnormal": "disk on fire", "times": 1},
        ]));
        let stats_req = NodeGetVolumeStatsRequest {
            volume_id: VOL.into(),
            volume_path: target.display().to_string(),
            staging_target_path: String::new(),
        };
        let sick = client
            .node_get_volume_stats(stats_req.clone())
            .await
            .unwrap()
            .into_inner()
            .volume_condition
            .unwrap();
        assert!(sick.abnormal);
        assert_eq!(sick.message, "disk on fire");
        let well = client
            .node_get_volume_stats(stats_req)
            .await
            .unwrap()
            .into_inner()
            .volume_condition
            .unwrap();
        assert!(!well.abnormal);

        client
            .node_unpublish_volume(unpublish_req(&target))
            .await
            .unwrap();
        assert!(scratch.mounts_below().is_empty() && !target.exists());
    });
}

/// `capability()` with `flags` as its mount flags.
fn capability_with(flags: &[&str]) -> VolumeCapability {
    let mut cap = capability();
    if let Some(AccessType::Mount(m)) = cap.access_type.as_mut() {
        m.mount_flags = flags.iter().map(|f| (*f).to_owned()).collect();
    }
    cap
}

/// Whether this kernel runs SELinux (its filesystem is mounted): then it
/// takes `context=`; otherwise tmpfs refuses it as an unknown parameter.
fn selinux_active() -> bool {
    Path::new("/sys/fs/selinux/enforce").exists()
}

#[test]
fn mount_flags_reach_the_new_tmpfs_and_a_refused_one_is_named() {
    in_ns("mounts tmpfs and binds", || async {
        let (scratch, opts, staging, target) = layout("csi-td-flags-");
        let driver = TestDriver::spawn(opts);
        let mut client = node(&driver).await;

        // the superblock takes the filesystem's options, the mount the
        // per-mount flags mount(8) knows; one entry may hold several
        let flags = ["size=2m,mode=0710", "nodev", "noatime"];
        let mut req = stage_req(&staging);
        req.volume_capability = Some(capability_with(&flags));
        client.node_stage_volume(req).await.unwrap();
        let staged = mounts_at(&staging);
        assert_eq!(staged.len(), 1, "{staged:?}");
        assert_eq!(
            (staged[0].fs_type.as_str(), staged[0].source.to_str()),
            ("tmpfs", Some("tmpfs"))
        );
        let sb = staged[0].super_options_raw.to_string_lossy().into_owned();
        assert!(
            sb.split(',').any(|o| o == "size=2048k") && sb.split(',').any(|o| o == "mode=710"),
            "super options {sb:?}"
        );
        let per_mount = &staged[0].mount_options;
        assert!(
            per_mount.iter().any(|o| o == "nodev") && per_mount.iter().any(|o| o == "noatime"),
            "mount options {per_mount:?}"
        );
        let logged = driver.calls();
        let stage = logged
            .iter()
            .find(|c| c["method"] == "NodeStageVolume")
            .unwrap();
        assert_eq!(stage["mount_flags"], json!(flags));

        // the publish is a plain bind of the staged superblock: its options
        // are the stage's, whatever flags the publish carries
        let mut req = publish_req(&staging, &target, false);
        req.volume_capability = Some(capability_with(&["size=9m"]));
        client.node_publish_volume(req).await.unwrap();
        let published = mounts_at(&target);
        assert_eq!(published.len(), 1, "{published:?}");
        assert_eq!(published[0].dev, staged[0].dev);
        assert_eq!(published[0].super_options_raw, staged[0].super_options_raw);

        // an option the kernel refuses fails the call, named, and leaves
        // nothing mounted
        let other = scratch.path().join("staging").join("vol-2");
        let mut req = stage_req(&other);
        req.volume_capability = Some(capability_with(&["size=1m", "bogus_option=1"]));
        let err = client.node_stage_volume(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err}");
        assert!(
            err.message().contains("'bogus_option=1'")
                && err.message().contains("Unknown parameter 'bogus_option'"),
            "{err}"
        );
        assert!(mounts_at(&other).is_empty());

        // an SELinux label, quoted as the kernel wants it: applied where
        // SELinux runs, refused by name where it does not (as on this host)
        let label = r#"context="system_u:object_r:container_file_t:s0:c10,c20""#;
        let labelled = scratch.path().join("staging").join("vol-3");
        let mut req = stage_req(&labelled);
        req.volume_capability = Some(capability_with(&[label]));
        let res = client.node_stage_volume(req).await;
        if selinux_active() {
            res.unwrap();
            let sb = mounts_at(&labelled)[0].super_options_raw.clone();
            assert!(sb.to_string_lossy().contains(label), "{sb:?}");
            client
                .node_unstage_volume(unstage_req(&labelled))
                .await
                .unwrap();
        } else {
            let err = res.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{err}");
            assert!(
                err.message().contains(&format!("'{label}'"))
                    && err.message().contains("tmpfs: Unknown parameter 'context'"),
                "{err}"
            );
            assert!(mounts_at(&labelled).is_empty());
        }

        client
            .node_unpublish_volume(unpublish_req(&target))
            .await
            .unwrap();
        client
            .node_unstage_volume(unstage_req(&staging))
            .await
            .unwrap();
        assert!(scratch.mounts_below().is_empty());
    });
}

#[test]
fn the_registration_socket_describes_the_driver_and_logs_the_status() {
    in_ns("runs the driver in a mount namespace", || async {
        let (scratch, mut opts, _, _) = layout("csi-td-reg-");
        opts.registration_dir = Some(scratch.path().join("plugins_registry"));
        let reg_socket = opts.registration_socket().unwrap();
        let mut driver = TestDriver::spawn(opts);
        assert!(reg_socket.exists());
        let mut reg = RegistrationClient::new(connect_unix(&reg_socket).await.unwrap());

        let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, DRIVER);
        assert_eq!(info.endpoint, driver.endpoint().display().to_string());
        assert!(
            info.supported_versions.iter().any(|v| v.starts_with("1.")),
            "{info:?}"
        );
        reg.notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "version mismatch".into(),
        })
        .await
        .unwrap();
        reg.notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();

        let calls = driver.calls();
        let methods: Vec<&str> = calls.iter().filter_map(|c| c["method"].as_str()).collect();
        assert_eq!(
            methods,
            [
                "GetInfo",
                "NotifyRegistrationStatus",
                "NotifyRegistrationStatus"
            ]
        );
        assert_eq!(calls[1]["plugin_registered"], false);
        assert_eq!(calls[1]["error"], "version mismatch");
        assert_eq!(calls[2]["plugin_registered"], true);

        let endpoint = driver.endpoint().to_owned();
        assert_eq!(driver.stop().and_then(|s| s.code()), Some(0));
        assert!(
            !endpoint.exists() && !reg_socket.exists(),
            "sockets removed"
        );
    });
}

/// volumed's own client (`CsiClient`, what the daemon calls through) against
/// the real driver: every Identity and Node call it offers, the metric it
/// records, and a driver's status as a final or not-final error.
#[test]
fn volumeds_client_makes_every_call_and_counts_it() {
    in_ns("mounts tmpfs and binds", || async {
        let (scratch, opts, staging, target) = layout("csi-td-client-");
        let driver = TestDriver::spawn(opts);
        let registry = prometheus::Registry::new();
        let seconds = prometheus::HistogramVec::new(
            prometheus::HistogramOpts::new("csi_operations_seconds", "test"),
            &["driver_name", "method_name", "grpc_status_code", "migrated"],
        )
        .unwrap();
        registry.register(Box::new(seconds.clone())).unwrap();
        let channel = connect_unix(driver.endpoint()).await.expect("connect");
        let client = volumed::csi::CsiClient::new(
            DRIVER,
            channel,
            Duration::from_secs(10),
            Some(seconds.clone()),
        );
        let (name, _version) = client.plugin_info().await.unwrap();
        assert_eq!(name, DRIVER);
        let services = client.plugin_capabilities().await.unwrap();
        assert!(!services.iter().any(|s| s == "UNKNOWN"), "{services:?}");
        assert!(client.probe().await.unwrap(), "ready");
        assert!(!client.node_info().await.unwrap().is_empty());
        let caps = client.node_caps().await.unwrap();
        assert!(caps.stage_unstage && caps.volume_stats && caps.volume_condition);

        client.stage(stage_req(&staging)).await.unwrap();
        client
            .publish(publish_req(&staging, &target, false))
            .await
            .unwrap();
        let stats = client
            .volume_stats(VOL, target.to_str().unwrap(), staging.to_str())
            .await
            .unwrap();
        let (available, total, used) = stats.bytes.expect("byte usage");
        assert!(total > 0 && available <= total && used >= 0, "{stats:?}");
        assert!(stats.inodes.is_some(), "{stats:?}");
        assert_eq!(stats.condition.map(|c| c.0), Some(false), "healthy");
        client
            .unpublish(VOL, target.to_str().unwrap())
            .await
            .unwrap();
        client
            .unstage(VOL, staging.to_str().unwrap())
            .await
            .unwrap();
        assert!(mounts_at(&staging).is_empty() && mounts_at(&target).is_empty());

        driver.set_faults(json!([
            {"method": "NodeStageVolume", "code": "Unavailable", "times": 1},
            {"method": "NodeStageVolume", "code": "InvalidArgument", "times": 1}
        ]));
        let e = client.stage(stage_req(&staging)).await.unwrap_err();
        assert!(!e.is_final(), "Unavailable is not final: {e}");
        let e = client.stage(stage_req(&staging)).await.unwrap_err();
        assert!(e.is_final(), "InvalidArgument is final: {e}");
        assert!(e.to_string().contains("NodeStageVolume") && e.to_string().contains(DRIVER));

        let stage_calls = |code: &str| {
            seconds
                .with_label_values(&[DRIVER, "/csi.v1.Node/NodeStageVolume", code, "false"])
                .get_sample_count()
        };
        assert_eq!(stage_calls("OK"), 1);
        assert_eq!(stage_calls("Unavailable"), 1);
        assert_eq!(stage_calls("InvalidArgument"), 1);
        drop(scratch);
    });
}

/// statvfs's size of the filesystem at `path`, in bytes.
fn fs_bytes(path: &Path) -> u64 {
    let vfs = nix::sys::statvfs::statvfs(path).expect("statvfs");
    vfs.blocks() * vfs.fragment_size()
}

#[test]
fn expand_volume_grows_the_tmpfs_for_real_and_faults_refuse_or_understate() {
    in_ns("mounts and grows tmpfs", || async {
        use volumed::csi::client::{ExpandArgs, expand_request, mount_capability};
        const MI: u64 = 1 << 20;
        let (scratch, mut opts, staging, target) = layout("csi-td-expand-");
        opts.caps = Some("GET_VOLUME_STATS,EXPAND_VOLUME".into());
        let driver = TestDriver::spawn(opts);
        let channel = connect_unix(driver.endpoint()).await.expect("connect");
        let client = volumed::csi::CsiClient::new(DRIVER, channel, Duration::from_secs(10), None);
        assert!(client.node_caps().await.unwrap().expand_volume);

        let mut stage = stage_req(&staging);
        stage.volume_capability = Some(capability_with(&["size=1m"]));
        client.stage(stage).await.unwrap();
        // a read-only publish: growing the volume must not make it writable
        client
            .publish(publish_req(&staging, &target, true))
            .await
            .unwrap();
        assert_eq!(fs_bytes(&target), MI);

        let target_s = target.display().to_string();
        let staging_s = staging.display().to_string();
        let args = |bytes| ExpandArgs {
            volume_id: VOL,
            volume_path: &target_s,
            staging_path: Some(&staging_s),
            required_bytes: bytes,
            capability: mount_capability(Some("ext4"), &[], None, Mode::SingleNodeWriter),
            secrets: Default::default(),
        };
        let got = client.expand(expand_request(&args(4 * MI))).await.unwrap();
        assert_eq!(got, 4 * MI, "the driver answers the size it reached");
        assert_eq!(fs_bytes(&target), 4 * MI, "the pod's view grew");
        assert_eq!(fs_bytes(&staging), 4 * MI, "one superblock");
        let ro = mounts_at(&target);
        assert!(ro[0].mount_options.iter().any(|o| o == "ro"), "{ro:?}");
        // idempotent: asking again (or for less) changes nothing
        assert_eq!(
            client.expand(expand_request(&args(4 * MI))).await.unwrap(),
            4 * MI
        );
        assert_eq!(
            client.expand(expand_request(&args(2 * MI))).await.unwrap(),
            4 * MI
        );
        assert_eq!(fs_bytes(&target), 4 * MI);

        let call = driver
            .calls()
            .into_iter()
            .find(|c| c["method"] == "NodeExpandVolume")
            .expect("logged");
        assert_eq!(call["volume_path"], target_s.as_str());
        assert_eq!(call["staging_target_path"], staging_s.as_str());
        assert_eq!(call["required_bytes"], 4 * MI);
        assert_eq!(call["access_type"], "mount");

        // a refusal does no work and is final; an understated answer is
        // passed on as the driver said it
        driver.set_faults(json!([
            {"method": "NodeExpandVolume", "code": "OutOfRange", "message": "too big", "times": 1},
            {"method": "NodeExpandVolume", "capacity_bytes": 1024, "times": 1},
        ]));
        let e = client
            .expand(expand_request(&args(8 * MI)))
            .await
            .unwrap_err();
        assert!(e.is_final() && e.message == "too big", "{e}");
        assert_eq!(fs_bytes(&target), 4 * MI, "no work on a refusal");
        let got = client.expand(expand_request(&args(8 * MI))).await.unwrap();
        assert_eq!(got, 1024, "the fault's answer");
        assert_eq!(fs_bytes(&target), 8 * MI, "the work was done");

        client.unpublish(VOL, &target_s).await.unwrap();
        client.unstage(VOL, &staging_s).await.unwrap();
        assert!(scratch.mounts_below().is_empty());
    });
}

/// A block capability (raw block: no filesystem).
fn block_capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// The loop devices bound to the file `volume.img` in `staging` (the
/// driver's device of a staged block volume).
fn driver_loops(staging: &Path) -> Vec<PathBuf> {
    support::holds::loops_below(&staging.join("volume.img"))
}

#[test]
fn a_restarted_driver_takes_back_the_device_of_a_staged_block_volume() {
    in_ns("attaches loop devices", || async {
        let (scratch, opts, staging, _) = layout("csi-td-block-restart-");
        let _sweep = support::holds::LoopSweep(scratch.path().to_owned());
        let publish = |n: &str| {
            let target = scratch.path().join("publish").join(n);
            let mut req = publish_req(&staging, &target, false);
            req.volume_capability = Some(block_capability());
            std::fs::create_dir_all(target.parent().unwrap()).unwrap();
            (req, target)
        };
        let mut stage = stage_req(&staging);
        stage.volume_capability = Some(block_capability());
        let mut driver = TestDriver::spawn(opts.clone());
        let mut client = node(&driver).await;
        client.node_stage_volume(stage.clone()).await.unwrap();
        let (req_a, a) = publish("a");
        client.node_publish_volume(req_a).await.unwrap();
        let lo = driver_loops(&staging);
        assert_eq!(lo.len(), 1, "one device staged: {lo:?}");
        let rdev = |p: &Path| std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(p).unwrap());
        let magic = b"volumed testdriver: the same volume";
        {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new().write(true).open(&a).unwrap();
            f.write_all(magic).unwrap();
            f.sync_all().unwrap();
        }
        // an opener other than the driver (volumed's hold) keeps the
        // device bound while the driver dies
        let hold = std::fs::File::open(&a).unwrap();
        assert!(driver.kill().is_some());
        assert_eq!(driver_loops(&staging), lo, "kept bound by the hold");

        // restarted: a publish and a repeated stage use that device
        let mut driver = TestDriver::spawn(opts.clone());
        let mut client = node(&driver).await;
        let (req_b, b) = publish("b");
        client.node_publish_volume(req_b).await.unwrap();
        client.node_stage_volume(stage.clone()).await.unwrap();
        assert_eq!(driver_loops(&staging), lo, "no second device");
        assert_eq!(rdev(&b), rdev(&lo[0]), "b shows the staged device");
        assert_eq!(rdev(&a), rdev(&b));
        let mut back = vec![0; magic.len()];
        std::io::Read::read_exact(&mut std::fs::File::open(&b).unwrap(), &mut back).unwrap();
        assert_eq!(back, magic);

        // killed again with no other opener: autoclear lets the device go,
        // and the next publish binds a new one to the same file
        drop(hold);
        assert!(driver.kill().is_some());
        let mut gone = false;
        for _ in 0..250 {
            gone = driver_loops(&staging).is_empty();
            if gone {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "autoclear unbinds the device of a dead driver");
        let mut driver = TestDriver::spawn(opts);
        let mut client = node(&driver).await;
        let (req_c, c) = publish("c");
        client.node_publish_volume(req_c).await.unwrap();
        assert_eq!(driver_loops(&staging).len(), 1, "bound again");
        let mut back = vec![0; magic.len()];
        std::io::Read::read_exact(&mut std::fs::File::open(&c).unwrap(), &mut back).unwrap();
        assert_eq!(back, magic, "the same file behind the new device");

        for t in [&a, &b, &c] {
            client
                .node_unpublish_volume(unpublish_req(t))
                .await
                .unwrap();
        }
        client
            .node_unstage_volume(unstage_req(&staging))
            .await
            .unwrap();
        assert!(driver_loops(&staging).is_empty(), "released at unstage");
        assert!(scratch.mounts_below().is_empty());
        assert!(driver.kill().is_some());
    });
}

/// A reader racing the driver's append may see the last line in part:
/// only whole lines are calls (the rest is read next time). No root.
#[test]
fn a_call_log_line_still_being_written_is_not_read_yet() {
    let scratch = Scratch::new("csi-td-partial-");
    let state = scratch.path();
    std::fs::write(
        state.join("calls.jsonl"),
        "{\"method\":\"NodeStageVolume\",\"at_ms\":1}\n{\"method\":\"NodePub",
    )
    .unwrap();
    let calls = support::csi_driver::read_calls_timed(state);
    assert_eq!(calls, [json!({"method": "NodeStageVolume", "at_ms": 1})]);
    std::fs::write(
        state.join("outcomes.jsonl"),
        "{\"code\":\"OK\"}\n{\"code\":\"Unavail",
    )
    .unwrap();
    assert_eq!(read_outcomes(state), [json!({"code": "OK"})]);
}
