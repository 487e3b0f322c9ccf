//! The CSI Node service, with real mounts: a tmpfs per staged volume (or
//! ext4 on a loop device when its context asks, `ext4.rs`),
//! bind-mounted into each publish target; for the block access type, a
//! loop device per staged volume over a sparse file in its staging dir,
//! the device node bind-mounted on each publish file (`--no-stage`: a loop
//! device per publish over a file in the state dir; `--no-block`: the
//! block access type is INVALID_ARGUMENT, as from a driver without raw
//! block volumes). NodeExpandVolume grows a block volume's backing file
//! and has its loop device re-read the size (`LOOP_SET_CAPACITY`), so the
//! device every publish file shows grows.
//!
//! The mount flags of the volume capability go where a real driver puts
//! them: on the mount that makes the superblock (the tmpfs at NodeStage, or
//! at NodePublish without staging), so `context="…"` labels the volume. A
//! publish after staging is a plain bind: a bind cannot take `context=`
//! (the kernel ignores it) and shows the staged superblock's label.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tonic::{Request, Response, Status};

use volumed::csi::proto::csi_v1::{
    NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, VolumeCapability, VolumeCondition,
    VolumeUsage, node_server::Node, node_service_capability, volume_capability::AccessType,
    volume_usage::Unit,
};

use crate::driver::Driver;
use crate::{ext4, loopdev, mounts};

/// The volume context key the kubelet sets on inline ephemeral volumes.
const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";

/// The Node service.
pub(crate) struct NodeService(pub Arc<Driver>);

/// INVALID_ARGUMENT unless `value` is set.
fn require(value: &str, field: &str) -> Result<(), Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(())
}

/// The access type asked: `Ok(true)` for block, `Ok(false)` for mount;
/// INVALID_ARGUMENT when the capability or its access type is missing, or
/// for block with `--no-block`.
fn access_type(driver: &Driver, cap: Option<&VolumeCapability>) -> Result<bool, Status> {
    match cap.and_then(|c| c.access_type.as_ref()) {
        None if cap.is_none() => Err(Status::invalid_argument("volume_capability is required")),
        None => Err(Status::invalid_argument(
            "volume_capability.access_type is required",
        )),
        Some(AccessType::Block(_)) if !driver.block => Err(Status::invalid_argument(
            "block volumes are not supported by this driver",
        )),
        Some(AccessType::Block(_)) => Ok(true),
        Some(AccessType::Mount(_)) => Ok(false),
    }
}

/// The sparse file behind a staged block volume's loop device.
const BACKING_FILE: &str = "volume.img";
/// Its size: small, and sparse, so it costs no disk.
const BACKING_BYTES: u64 = 16 << 20;
/// How long NodeUnstage waits for the kernel to unbind a released device.
const DETACH_TIMEOUT: Duration = Duration::from_secs(5);

/// NodeStage of a block volume: the backing file (made once, sparse) and a
/// loop device over it, held by the driver.
fn stage_block(driver: &Driver, staging: &str) -> Result<NodeStageVolumeResponse, Status> {
    create_dir(staging)?;
    let mut loops = driver.loops.lock().unwrap_or_else(|p| p.into_inner());
    let key = PathBuf::from(staging);
    if loops
        .get(&key)
        .is_some_and(|l| loopdev::bound_to(l.number, &l.backing))
    {
        return Ok(NodeStageVolumeResponse {});
    }
    let lo = take_back_or_attach(&key.join(BACKING_FILE))?;
    loops.insert(key, lo);
    Ok(NodeStageVolumeResponse {})
}

/// The loop device of a staged volume's backing file: the one still bound
/// to it (a former driver process bound it, an opener kept it) taken
/// back, else a new one. One device per file, so every publish file of a
/// volume shows the same device whatever driver restarts came between.
fn take_back_or_attach(backing: &Path) -> Result<loopdev::Loop, Status> {
    if backing.exists() {
        let found = loopdev::Loop::adopt(backing).map_err(|e| {
            internal(
                "looking for the loop device of",
                &backing.to_string_lossy(),
                e,
            )
        })?;
        if let Some(lo) = found {
            return Ok(lo);
        }
    }
    attach_backing(backing)
}

/// A loop device over `backing`, made (sparse) if missing.
fn attach_backing(backing: &Path) -> Result<loopdev::Loop, Status> {
    let name = backing.to_string_lossy();
    if let Some(dir) = backing.parent() {
        fs::create_dir_all(dir).map_err(|e| internal("creating", &name, e))?;
    }
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(backing)
        .map_err(|e| internal("creating", &name, e))?;
    // never shrunk: a volume NodeExpandVolume grew keeps its size
    let len = file
        .metadata()
        .map_err(|e| internal("sizing", &name, e))?
        .len();
    if len < BACKING_BYTES {
        file.set_len(BACKING_BYTES)
            .map_err(|e| internal("sizing", &name, e))?;
    }
    loopdev::Loop::attach(backing).map_err(|e| internal("attaching a loop device to", &name, e))
}

/// NodeUnstage of a block volume: the loop device released (and gone
/// before the answer), then the backing file removed.
fn unstage_block(driver: &Driver, staging: &str) -> Result<NodeUnstageVolumeResponse, Status> {
    let key = PathBuf::from(staging);
    let mut held = driver
        .loops
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key);
    // staged by a former driver process: its device, if still bound, is
    // released as ours would be (never the file removed under an opener)
    let backing = key.join(BACKING_FILE);
    if held.is_none() && backing.exists() {
        held = loopdev::Loop::adopt(&backing).map_err(|e| {
            internal(
                "looking for the loop device of",
                &backing.to_string_lossy(),
                e,
            )
        })?;
    }
    if let Some(lo) = held {
        let path = lo.path.display().to_string();
        if !lo.detach(DETACH_TIMEOUT) {
            return Err(Status::failed_precondition(format!(
                "loop device {path} of {staging} is still open elsewhere"
            )));
        }
    }
    match fs::remove_file(&backing) {
        Ok(()) => Ok(NodeUnstageVolumeResponse {}),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(NodeUnstageVolumeResponse {}),
        Err(e) => Err(internal("removing", &backing.to_string_lossy(), e)),
    }
}

/// NodePublish of a block volume: the staged loop device's node bound on
/// the publish file (made here, its dir the CO's). Without staging
/// (`--no-stage`) the publish attaches a loop device of its own, over the
/// volume's file in the state dir (`block/<volume id in hex>.img`, kept
/// as a disk keeps its data), released at NodeUnpublish.
fn publish_block(
    driver: &Driver,
    req: &NodePublishVolumeRequest,
) -> Result<NodePublishVolumeResponse, Status> {
    let mut loops = driver.loops.lock().unwrap_or_else(|p| p.into_inner());
    let key = match driver.stage {
        true => {
            require(&req.staging_target_path, "staging_target_path")?;
            PathBuf::from(&req.staging_target_path)
        }
        false => PathBuf::from(&req.target_path),
    };
    // staged by a former driver process (the file in the staging dir is
    // the staged state): its device taken back, as a real driver does
    if driver.stage && !loops.contains_key(&key) && key.join(BACKING_FILE).exists() {
        let lo = take_back_or_attach(&key.join(BACKING_FILE))?;
        loops.insert(key.clone(), lo);
    }
    if !driver.stage && !loops.contains_key(&key) {
        let hex: String = req.volume_id.bytes().map(|b| format!("{b:02x}")).collect();
        let backing = state_dir(driver)?.join("block").join(format!("{hex}.img"));
        let lo = attach_backing(&backing)?;
        loops.insert(key.clone(), lo);
    }
    let Some(lo) = loops.get(&key) else {
        return Err(Status::failed_precondition(format!(
            "volume {} is not staged at {}",
            req.volume_id, req.staging_target_path
        )));
    };
    let target = &req.target_path;
    match fs::metadata(target) {
        Ok(m) if m.file_type().is_block_device() && m.rdev() == lo.rdev => {
            return Ok(NodePublishVolumeResponse {});
        }
        Ok(_) if is_mount_point(target)? => {
            return Err(Status::failed_precondition(format!(
                "{target} holds another mount"
            )));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::File::create(target).map_err(|e| internal("creating", target, e))?;
        }
        Err(e) => return Err(internal("stat", target, e)),
    }
    mounts::bind(&lo.path, Path::new(target), req.readonly)
        .map_err(|e| internal("bind-mounting the loop device at", target, e))?;
    Ok(NodePublishVolumeResponse {})
}

fn internal(what: &str, path: &str, e: impl std::fmt::Display) -> Status {
    Status::internal(format!("{what} {path}: {e}"))
}

fn is_mount_point(path: &str) -> Result<bool, Status> {
    mounts::is_mount_point(Path::new(path)).map_err(|e| internal("reading mounts at", path, e))
}

/// The capability's fields for the call log.
fn capability_fields(entry: &mut Value, cap: Option<&VolumeCapability>) {
    let Some(cap) = cap else { return };
    if let Some(mode) = &cap.access_mode {
        entry["access_mode"] = json!(mode.mode);
    }
    match &cap.access_type {
        Some(AccessType::Mount(m)) => {
            entry["access_type"] = json!("mount");
            entry["fs_type"] = json!(m.fs_type);
            entry["mount_flags"] = json!(m.mount_flags);
            entry["volume_mount_group"] = json!(m.volume_mount_group);
        }
        Some(AccessType::Block(_)) => entry["access_type"] = json!("block"),
        None => {}
    }
}

/// The options of a new tmpfs: the caller's mount flags (and `ro` when
/// asked), plus its group when VOLUME_MOUNT_GROUP is advertised and the CO
/// passed one (the pod's fsGroup).
fn tmpfs_options(
    driver: &Driver,
    cap: Option<&VolumeCapability>,
    readonly: bool,
) -> mounts::MountOptions {
    let Some(AccessType::Mount(m)) = cap.and_then(|c| c.access_type.as_ref()) else {
        return mounts::MountOptions::parse(&[], readonly);
    };
    let options = mounts::MountOptions::parse(&m.mount_flags, readonly);
    let group = m.volume_mount_group.parse::<u32>().ok();
    match group {
        Some(gid) if driver.caps.mount_group => {
            options.with(&["mode=2775".to_owned(), format!("gid={gid}")])
        }
        _ => options,
    }
}

/// Mounts the tmpfs that is a new volume at `path`; an option the kernel
/// refuses is INVALID_ARGUMENT naming it (a final error: the CO must not
/// retry the same call), anything else INTERNAL.
fn mount_new_tmpfs(path: &str, options: &mounts::MountOptions) -> Result<(), Status> {
    mounts::mount_tmpfs(Path::new(path), options).map_err(|e| {
        let message = format!("mounting tmpfs at {path}: {e}");
        match e {
            mounts::MountError::Option { .. } => Status::invalid_argument(message),
            mounts::MountError::Step { .. } => Status::internal(message),
        }
    })
}

/// The state dir, which an ext4-backed volume's image needs.
fn state_dir(driver: &Driver) -> Result<&Path, Status> {
    driver.state.dir().ok_or_else(|| {
        Status::failed_precondition(format!(
            "volume images (volume_context {}: ext4, or a raw block volume \
             published without staging) live in the state dir; start with --state",
            ext4::BACKING
        ))
    })
}

fn create_dir(path: &str) -> Result<(), Status> {
    fs::create_dir_all(path).map_err(|e| internal("creating", path, e))
}

/// Unmounts the top mount at `path`; FAILED if something is still mounted
/// there afterwards (stacked mounts), as Kubernetes' `CleanupMountPoint`
/// does for most drivers.
fn unmount_once(path: &str) -> Result<(), Status> {
    mounts::unmount(Path::new(path)).map_err(|e| internal("unmounting", path, e))?;
    if is_mount_point(path)? {
        return Err(Status::internal(format!(
            "failed to unmount path {path}: still a mount point"
        )));
    }
    Ok(())
}

fn stage(driver: &Driver, req: &NodeStageVolumeRequest) -> Result<NodeStageVolumeResponse, Status> {
    require(&req.volume_id, "volume_id")?;
    require(&req.staging_target_path, "staging_target_path")?;
    let block = access_type(driver, req.volume_capability.as_ref())?;
    if !driver.stage {
        return Err(Status::unimplemented(
            "STAGE_UNSTAGE_VOLUME is not advertised (--no-stage)",
        ));
    }
    if block {
        return stage_block(driver, &req.staging_target_path);
    }
    let path = &req.staging_target_path;
    create_dir(path)?;
    if is_mount_point(path)? {
        return Ok(NodeStageVolumeResponse {});
    }
    if let Some(bytes) = ext4::wanted(&req.volume_context)? {
        let image = ext4::image(state_dir(driver)?, &req.volume_id);
        ext4::stage(&image, bytes, path)?;
        return Ok(NodeStageVolumeResponse {});
    }
    let options = tmpfs_options(driver, req.volume_capability.as_ref(), false);
    mount_new_tmpfs(path, &options)?;
    Ok(NodeStageVolumeResponse {})
}

fn unstage(
    driver: &Driver,
    req: &NodeUnstageVolumeRequest,
) -> Result<NodeUnstageVolumeResponse, Status> {
    require(&req.volume_id, "volume_id")?;
    require(&req.staging_target_path, "staging_target_path")?;
    if !driver.stage {
        return Err(Status::unimplemented(
            "STAGE_UNSTAGE_VOLUME is not advertised (--no-stage)",
        ));
    }
    let key = Path::new(&req.staging_target_path);
    let staged_block = driver
        .loops
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(key);
    if staged_block || key.join(BACKING_FILE).exists() {
        return unstage_block(driver, &req.staging_target_path);
    }
    if is_mount_point(&req.staging_target_path)? {
        unmount_once(&req.staging_target_path)?;
    }
    Ok(NodeUnstageVolumeResponse {})
}

fn publish(
    driver: &Driver,
    req: &NodePublishVolumeRequest,
) -> Result<NodePublishVolumeResponse, Status> {
    require(&req.volume_id, "volume_id")?;
    require(&req.target_path, "target_path")?;
    if access_type(driver, req.volume_capability.as_ref())? {
        return publish_block(driver, req);
    }
    let ephemeral = req
        .volume_context
        .get(EPHEMERAL)
        .is_some_and(|v| v == "true");
    let staged = driver.stage && !ephemeral;
    if staged {
        require(&req.staging_target_path, "staging_target_path")?;
        if !is_mount_point(&req.staging_target_path)? {
            return Err(Status::failed_precondition(format!(
                "volume {} is not staged at {}",
                req.volume_id, req.staging_target_path
            )));
        }
    }
    let target = &req.target_path;
    create_dir(target)?;
    if is_mount_point(target)? && !driver.stack {
        return Ok(NodePublishVolumeResponse {});
    }
    if staged {
        mounts::bind(
            Path::new(&req.staging_target_path),
            Path::new(target),
            req.readonly,
        )
        .map_err(|e| internal("bind-mounting the staged volume at", target, e))?;
    } else {
        if ext4::wanted(&req.volume_context)?.is_some() {
            return Err(Status::invalid_argument(format!(
                "volume_context {}: an ext4 volume is made at NodeStageVolume, \
                 and this driver does not stage",
                ext4::BACKING
            )));
        }
        let options = tmpfs_options(driver, req.volume_capability.as_ref(), req.readonly);
        mount_new_tmpfs(target, &options)?;
    }
    Ok(NodePublishVolumeResponse {})
}

fn unpublish(
    driver: &Driver,
    req: &NodeUnpublishVolumeRequest,
) -> Result<NodeUnpublishVolumeResponse, Status> {
    require(&req.volume_id, "volume_id")?;
    require(&req.target_path, "target_path")?;
    let target = &req.target_path;
    if is_mount_point(target)? {
        unmount_once(target)?;
    }
    // a block volume published without staging holds its own device
    let held = driver
        .loops
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(Path::new(target));
    if let Some(lo) = held {
        let path = lo.path.display().to_string();
        if !lo.detach(DETACH_TIMEOUT) {
            return Err(Status::failed_precondition(format!(
                "loop device {path} of {target} is still open elsewhere"
            )));
        }
    }
    // the SP removes the target it created (CSI spec, NodeUnpublishVolume):
    // a block volume's file, a mount volume's dir
    let is_file = fs::symlink_metadata(target).is_ok_and(|m| !m.is_dir());
    let removed = match is_file {
        true => fs::remove_file(target),
        false => fs::remove_dir(target),
    };
    match removed {
        Ok(()) => Ok(NodeUnpublishVolumeResponse {}),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(NodeUnpublishVolumeResponse {}),
        Err(e) => Err(internal("removing", target, e)),
    }
}

/// statvfs figures as i64, saturating (they never come near).
fn figure(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn stats(
    driver: &Driver,
    req: &NodeGetVolumeStatsRequest,
    abnormal: Option<&str>,
) -> Result<NodeGetVolumeStatsResponse, Status> {
    require(&req.volume_id, "volume_id")?;
    require(&req.volume_path, "volume_path")?;
    let path = &req.volume_path;
    match fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Status::not_found(format!(
                "volume path {path} does not exist"
            )));
        }
        Err(e) => return Err(internal("stat", path, e)),
    }
    let vfs =
        nix::sys::statvfs::statvfs(Path::new(path)).map_err(|e| internal("statvfs", path, e))?;
    // all u64 on 64-bit Linux, the only target this test double runs on
    let frsize = vfs.fragment_size();
    let blocks = vfs.blocks();
    let (free, avail) = (vfs.blocks_free(), vfs.blocks_available());
    let (files, files_free) = (vfs.files(), vfs.files_free());
    let usage = vec![
        VolumeUsage {
            available: figure(avail.saturating_mul(frsize)),
            total: figure(blocks.saturating_mul(frsize)),
            used: figure(blocks.saturating_sub(free).saturating_mul(frsize)),
            unit: Unit::Bytes as i32,
        },
        VolumeUsage {
            available: figure(files_free),
            total: figure(files),
            used: figure(files.saturating_sub(files_free)),
            unit: Unit::Inodes as i32,
        },
    ];
    let volume_condition = driver.caps.condition.then(|| match abnormal {
        Some(message) => VolumeCondition {
            abnormal: true,
            message: message.to_owned(),
        },
        None => VolumeCondition {
            abnormal: false,
            message: "ok".to_owned(),
        },
    });
    Ok(NodeGetVolumeStatsResponse {
        usage,
        volume_condition,
    })
}

/// Grows the volume's tmpfs to `required_bytes` by remounting it with a
/// new `size=` (a remount reaches the superblock, so the staging mount
/// and every bind of it see the new size), and answers the size statvfs
/// then shows, or `answer` (a fault). A tmpfs already that big is left as
/// it is: the call is idempotent.
fn expand(
    driver: &Driver,
    req: &NodeExpandVolumeRequest,
    answer: Option<i64>,
) -> Result<NodeExpandVolumeResponse, Status> {
    require(&req.volume_id, "volume_id")?;
    require(&req.volume_path, "volume_path")?;
    if !driver.caps.expand {
        return Err(Status::unimplemented("EXPAND_VOLUME is not advertised"));
    }
    let required = req.capacity_range.as_ref().map_or(0, |r| r.required_bytes);
    let Ok(required) = u64::try_from(required) else {
        return Err(Status::invalid_argument(format!(
            "capacity_range.required_bytes {required} is negative"
        )));
    };
    // the capability is optional here: none reads as mount
    let cap = req.volume_capability.as_ref();
    if cap.is_some_and(|c| c.access_type.is_some()) && access_type(driver, cap)? {
        return expand_block(driver, req, required, answer);
    }
    let path = &req.volume_path;
    if !is_mount_point(path)? {
        return Err(Status::not_found(format!(
            "volume {} is not mounted at {path}",
            req.volume_id
        )));
    }
    let image = driver.state.dir().map(|d| ext4::image(d, &req.volume_id));
    if let Some(bytes) = image
        .map(|i| ext4::expand(&i, required))
        .transpose()?
        .flatten()
    {
        let capacity_bytes = answer.unwrap_or_else(|| figure(bytes));
        return Ok(NodeExpandVolumeResponse { capacity_bytes });
    }
    let size = |p: &str| -> Result<u64, Status> {
        let vfs =
            nix::sys::statvfs::statvfs(Path::new(p)).map_err(|e| internal("statvfs", p, e))?;
        Ok(vfs.blocks().saturating_mul(vfs.fragment_size()))
    };
    if required > 0 && size(path)? < required {
        mounts::remount_tmpfs_size(Path::new(path), required)
            .map_err(|e| internal("remounting the tmpfs bigger at", path, e))?;
    }
    let capacity_bytes = match answer {
        Some(n) => n,
        None => figure(size(path)?),
    };
    Ok(NodeExpandVolumeResponse { capacity_bytes })
}

/// NodeExpandVolume of a block volume: `volume_path` must be the device
/// the driver published (its loop device's node), found by the staging
/// path (or, with `--no-stage`, by itself); its backing file grows to
/// `required_bytes` and the loop device is told (`LOOP_SET_CAPACITY`),
/// so the device every bind of it shows grows. Idempotent: a device
/// already that big is left as it is.
fn expand_block(
    driver: &Driver,
    req: &NodeExpandVolumeRequest,
    required: u64,
    answer: Option<i64>,
) -> Result<NodeExpandVolumeResponse, Status> {
    let key = match driver.stage {
        true => {
            require(&req.staging_target_path, "staging_target_path")?;
            PathBuf::from(&req.staging_target_path)
        }
        false => PathBuf::from(&req.volume_path),
    };
    let loops = driver.loops.lock().unwrap_or_else(|p| p.into_inner());
    let Some(lo) = loops.get(&key) else {
        return Err(Status::not_found(format!(
            "volume {} has no device at {}",
            req.volume_id,
            key.display()
        )));
    };
    let path = &req.volume_path;
    match fs::metadata(path) {
        Ok(m) if m.file_type().is_block_device() && m.rdev() == lo.rdev => {}
        Ok(_) => {
            return Err(Status::not_found(format!(
                "{path} is not the device of volume {}",
                req.volume_id
            )));
        }
        Err(e) => return Err(Status::not_found(format!("{path}: {e}"))),
    }
    let bytes = match lo.bytes() {
        Ok(n) if n >= required => n,
        _ => lo
            .grow(required)
            .map_err(|e| internal("growing the loop device of", path, e))?,
    };
    let capacity_bytes = answer.unwrap_or_else(|| figure(bytes));
    Ok(NodeExpandVolumeResponse { capacity_bytes })
}

fn rpc_capability(t: node_service_capability::rpc::Type) -> NodeServiceCapability {
    NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

fn map(m: &HashMap<String, String>) -> Value {
    json!(m)
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut entry = json!({
            "method": "NodeStageVolume",
            "volume_id": req.volume_id,
            "staging_target_path": req.staging_target_path,
            "volume_context": map(&req.volume_context),
            "publish_context": map(&req.publish_context),
            "secrets": map(&req.secrets),
        });
        capability_fields(&mut entry, req.volume_capability.as_ref());
        self.0.call(entry, move |d, _| stage(d, &req)).await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = request.into_inner();
        let entry = json!({
            "method": "NodeUnstageVolume",
            "volume_id": req.volume_id,
            "staging_target_path": req.staging_target_path,
        });
        self.0.call(entry, move |d, _| unstage(d, &req)).await
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut entry = json!({
            "method": "NodePublishVolume",
            "volume_id": req.volume_id,
            "target_path": req.target_path,
            "staging_target_path": req.staging_target_path,
            "readonly": req.readonly,
            "volume_context": map(&req.volume_context),
            "publish_context": map(&req.publish_context),
            "secrets": map(&req.secrets),
        });
        capability_fields(&mut entry, req.volume_capability.as_ref());
        self.0.call(entry, move |d, _| publish(d, &req)).await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = request.into_inner();
        let entry = json!({
            "method": "NodeUnpublishVolume",
            "volume_id": req.volume_id,
            "target_path": req.target_path,
        });
        self.0.call(entry, move |d, _| unpublish(d, &req)).await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = request.into_inner();
        let entry = json!({
            "method": "NodeGetVolumeStats",
            "volume_id": req.volume_id,
            "volume_path": req.volume_path,
            "staging_target_path": req.staging_target_path,
        });
        self.0
            .call(entry, move |d, fault| {
                stats(d, &req, fault.abnormal.as_deref())
            })
            .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        let mut entry = json!({
            "method": "NodeExpandVolume",
            "volume_id": req.volume_id,
            "volume_path": req.volume_path,
            "staging_target_path": req.staging_target_path,
            "required_bytes": req.capacity_range.as_ref().map(|r| r.required_bytes),
            "secrets": map(&req.secrets),
        });
        capability_fields(&mut entry, req.volume_capability.as_ref());
        self.0
            .call(entry, move |d, fault| expand(d, &req, fault.capacity_bytes))
            .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        let entry = json!({"method": "NodeGetCapabilities"});
        self.0
            .call(entry, |d, _| {
                let wanted = [
                    (d.stage, Type::StageUnstageVolume),
                    (d.caps.stats, Type::GetVolumeStats),
                    (d.caps.condition, Type::VolumeCondition),
                    (d.caps.mount_group, Type::VolumeMountGroup),
                    (d.caps.expand, Type::ExpandVolume),
                ];
                let capabilities = wanted
                    .into_iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, t)| rpc_capability(t))
                    .collect();
                Ok(NodeGetCapabilitiesResponse { capabilities })
            })
            .await
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let entry = json!({"method": "NodeGetInfo"});
        self.0
            .call(entry, |d, _| {
                Ok(NodeGetInfoResponse {
                    node_id: d.node_id.clone(),
                    max_volumes_per_node: 0,
                    accessible_topology: None,
                })
            })
            .await
    }
}
