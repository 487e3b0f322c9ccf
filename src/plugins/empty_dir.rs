//! `kubernetes.io/empty-dir`.
//!
//! - `medium: ""` (disk): a `dir` target. SetUp creates the directory with
//!   mode 0777 (chmod after mkdir, so the umask does not matter — the
//!   kubelet's `setupDir`) and writes the
//!   `pods/<uid>/plugins/kubernetes.io~empty-dir/<vol>/ready` marker. A
//!   directory with its marker is already set up.
//! - `medium: Memory`: a `mount` target, a tmpfs with `size=` as the
//!   kubelet sizes it: the spec's size (the smaller of the pod's memory
//!   limit and `sizeLimit`, `sources::pod_memory`), capped by the node's
//!   allocatable memory ([`EmptyDirPlugin::with_node_memory`]); with
//!   neither known, the kernel's default (half the RAM). A tmpfs already there is already set up (its
//!   identity is being a tmpfs); one of a different size is *remounted* with
//!   the intended size, never replaced, which would destroy the pod's data.
//!   Any other mount there is unmounted and the tmpfs mounted (never adopted).
//!
//! TearDown works from the journal's params alone (the target kind says the
//! medium): a tmpfs is unmounted and its directory removed; a disk emptyDir
//! is first renamed to `<vol>.deleting~<seq>` (so a re-added pod never sees a
//! half-emptied dir), then deleted on its own filesystem, stopping at any
//! mount root that appeared since the check (returned as left behind); then
//! the ready marker goes. A disk emptyDir with a mount beneath it is neither
//! renamed (the mount would move along) nor emptied: the TearDown fails
//! with [`PluginError::MountsBeneath`] and is retried until the mount is
//! gone. [`EmptyDirPlugin::finish_pending`] completes deletions a crash
//! interrupted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::host::mountinfo::MountInfo;
use crate::host::remove::{
    Removal, finish_pending_deletions, remove_dir_one_fs, rename_for_deletion,
};
use crate::host::sys::{Beneath, Call, DirHandle, Errno, FileKind, MsFlags, Sys, SysError};
use crate::journal::Permit;
use crate::model::{
    Layout, MountIdentity, Operation, PluginName, PodUid, SharedPath, SharedStr, StorageMedium,
    TMPFS, TargetKind, TargetParams, TargetRef, VolumeSpec,
};
use crate::plugins::mount_ops::{
    TARGET_DIR_MODE, beneath, data_string, ensure_mounted_found, page_round, parse_size,
    split_options, unmount_and_remove_dir,
};
use crate::plugins::{Action, Op, Outcome, PluginError, PluginResult, VolumePlugin};

/// How many sequence numbers to try when a `.deleting~<seq>` name is taken.
const RENAME_TRIES: usize = 8;

/// The plugins whose pod volume dirs a disk TearDown renames to
/// `.deleting~<seq>`: a disk emptyDir's, and a configMap's (its payload
/// sits in a wrapped disk emptyDir; secret, downwardAPI and projected
/// volumes are tmpfs mounts, unmounted and never renamed).
pub(crate) const RENAMED_IN: [PluginName; 2] = [PluginName::EmptyDir, PluginName::ConfigMap];

/// What an emptyDir SetUp leaves for the payload writer that wraps it.
#[derive(Debug)]
pub(crate) struct VolumeDir {
    /// the volume dir, opened (beneath the root, no symlink followed) when
    /// the SetUp set its mode
    pub handle: Option<DirHandle>,
    /// made, or a new tmpfs mounted on it: empty, nothing to list
    pub fresh: bool,
}

/// The emptyDir plugin.
#[derive(Debug)]
pub struct EmptyDirPlugin {
    layout: Layout,
    seq: AtomicU64,
    /// the node's allocatable memory in bytes, the most a tmpfs gets
    node_memory: Option<u64>,
}

impl EmptyDirPlugin {
    /// A plugin for the layout under `layout`; deletion sequence numbers start
    /// from the wall clock, so they do not repeat across restarts.
    pub fn new(layout: Layout) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self::with_seq_start(layout, now)
    }

    /// A plugin whose deletion sequence numbers start at `seq` (for tests).
    pub fn with_seq_start(layout: Layout, seq: u64) -> Self {
        Self {
            layout,
            seq: AtomicU64::new(seq),
            node_memory: None,
        }
    }

    /// The same plugin sizing every tmpfs at most `bytes`, the node's
    /// allocatable memory (the kubelet's cap: no pod may use more).
    #[must_use]
    pub fn with_node_memory(mut self, bytes: Option<u64>) -> Self {
        self.node_memory = bytes.filter(|&b| b > 0);
        self
    }

    /// A memory emptyDir's tmpfs size: the spec's, capped by the node's.
    fn tmpfs_size(&self, size_limit: Option<u64>) -> Option<u64> {
        [size_limit, self.node_memory].into_iter().flatten().min()
    }

    /// Finishes the deletions of this pod's disk emptyDirs that a crash cut
    /// short: its own and a configMap's wrapped one (`RENAMED_IN`).
    pub fn finish_pending(
        &self,
        pod: &PodUid,
        sys: &dyn Sys,
    ) -> Result<Vec<(PathBuf, Removal)>, SysError> {
        // listed beneath the pod dir: a symlinked `volumes` fails the listing
        let pod_dir = self.layout.pod_dir(pod);
        let mut done = Vec::new();
        for plugin in RENAMED_IN {
            let dir = self.layout.pod_volume_plugin_dir(pod, plugin);
            let at = Beneath::split(&pod_dir, &dir)
                .ok_or_else(|| SysError::call(Call::ReadDirBeneath, &dir, Errno::EXDEV))?;
            done.extend(finish_pending_deletions(at, sys)?);
        }
        Ok(done)
    }

    fn marker(&self, op: &Op<'_>, params: &TargetParams) -> Result<PathBuf, PluginError> {
        match &params.target {
            TargetRef::Pod(pod) => Ok(self.layout.empty_dir_ready_marker(pod, &params.spec_name)),
            TargetRef::Device => Err(op.missing("pod uid")),
        }
    }

    /// A disk emptyDir's dir `name` in `vols` (its parent, opened);
    /// already in place only with its marker, which then needs no look.
    fn setup_disk(
        &self,
        op: &mut Op<'_>,
        vols: &DirHandle,
        name: &Path,
        target: &Path,
        marker: &Path,
    ) -> Result<(Action, bool), PluginError> {
        // (in a dir just made, nothing is there to look for)
        let found = match vols.was_made() {
            true => Err(SysError::call(Call::Stat, target, Errno::ENOENT)),
            false => op.sys.stat_in(vols, name),
        };
        let exists = match found {
            Ok(st) if st.kind == FileKind::Dir => true,
            Ok(_) => return Err(op.wrong_type(target, "directory")),
            Err(e) if e.errno() == Some(Errno::ENOENT) => false,
            Err(e) => return Err(op.sys_err(e, false)),
        };
        if exists && present(op, beneath(op, self.layout.root(), marker)?)? {
            return Ok((Action::AlreadyInPlace, false));
        }
        let made = !exists
            && match op.sys.mkdir_in(vols, name, 0o777) {
                Err(e) if e.errno() == Some(Errno::EEXIST) => false,
                r => op.act(r).map(|()| true)?,
            };
        // A directory without its marker: a setup cut short; finish it.
        Ok((Action::Performed, made))
    }

    /// A memory emptyDir's tmpfs on `name` in `vols` (its parent, opened),
    /// and whether a new (empty) one was mounted. A target that is not
    /// there is made and mounted through the handle (no mount table read:
    /// nothing can be mounted on a path that did not exist); anything there
    /// takes [`ensure_mounted_found`]'s careful path.
    fn setup_memory(
        &self,
        op: &mut Op<'_>,
        params: &TargetParams,
        (vols, name): (&DirHandle, &Path),
        target: &Path,
        size_limit: Option<u64>,
    ) -> Result<(Action, Option<MountIdentity>, bool), PluginError> {
        let (flags, mut opts) = split_options(params.mount_options());
        opts.retain(|o| !o.starts_with("size="));
        let size_opts: Vec<String> = opts
            .iter()
            .cloned()
            .chain(size_limit.map(|s| format!("size={s}")))
            .collect();
        let data = data_string(&size_opts, params.selinux());
        let read_only = flags.contains(MsFlags::MS_RDONLY);
        let wanted = |m: &MountInfo| {
            m.fs_type == TMPFS
                && m.is_read_only() == read_only
                && m.super_options.selinux.context.as_ref() == params.selinux()
        };
        let mut mount = |op: &mut Op<'_>, _: Beneath<'_>| {
            let tmpfs = Some(Path::new(TMPFS));
            let r = op
                .sys
                .mount_in(tmpfs, vols, name, Some(TMPFS), flags, data.as_deref());
            op.act(r)
        };
        let root = self.layout.root();
        let at = beneath(op, root, target)?;
        // (in a dir just made, nothing is there to look for)
        let found = (!vols.was_made()).then(|| op.sys.stat_in(vols, name));
        let missing = match &found {
            None => true,
            Some(r) => r.as_ref().is_err_and(|e| e.errno() == Some(Errno::ENOENT)),
        };
        let made = missing
            && match op.sys.mkdir_in(vols, name, TARGET_DIR_MODE) {
                Ok(()) => true,
                // made meanwhile: the careful path looks at it
                Err(e) if e.errno() == Some(Errno::EEXIST) => false,
                Err(e) => return Err(op.sys_err(e, false)),
            };
        let (action, existing) = match (made, found) {
            (true, _) => {
                mount(op, at)?;
                (Action::Performed, None)
            }
            (false, Some(found)) if !missing => {
                ensure_mounted_found(op, at, found, &wanted, &mut mount)?
            }
            (false, _) => {
                let found = op.sys.stat_in(vols, name);
                ensure_mounted_found(op, at, found, &wanted, &mut mount)?
            }
        };
        let Some(m) = existing else {
            let seen = fresh_tmpfs(op, vols, name, read_only, params);
            return Ok((action, seen, true));
        };
        let seen = Some(m.identity());
        let Some(limit) = size_limit else {
            return Ok((action, seen, false));
        };
        let observed = m
            .super_options
            .get("size")
            .flatten()
            .and_then(|v| parse_size(&v.to_string_lossy()));
        if observed == Some(page_round(limit)) {
            return Ok((action, seen, false));
        }
        // Data safety: fix the size in place. The label cannot change on a
        // remount, so it is not passed again.
        let data = data_string(&size_opts, None);
        let r = op.sys.mount_beneath(
            None,
            at,
            Some(TMPFS),
            MsFlags::MS_REMOUNT | flags,
            data.as_deref(),
        );
        op.act(r)?;
        Ok((Action::Remounted, seen, false))
    }

    /// [`VolumePlugin::setup`], and the volume dir as a payload writer can
    /// use it ([`VolumeDir`]).
    pub(crate) fn set_up(
        &self,
        _permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> Result<(Outcome, VolumeDir), PluginError> {
        let mut op = Op::new(sys, Operation::SetUp, params);
        let VolumeSpec::EmptyDir { medium, size_limit } = spec else {
            return Err(op.bad_spec(self.name(), "not an emptyDir"));
        };
        let target = pod_target(&op, params)?;
        let TargetRef::Pod(pod) = &params.target else {
            return Err(op.missing("pod uid"));
        };
        let marker = self.layout.empty_dir_ready_marker(pod, &params.spec_name);
        let root = self.layout.root();
        // The pod dir is opened once beneath the root (made when missing),
        // the target's and the marker's dirs through it, each without
        // following any symlink; everything in them is then named through
        // those handles: one path walk per dir rather than one per call.
        let pod_dir = self.layout.pod_dir(pod);
        let pod_at = beneath(&op, root, &pod_dir)?;
        let pod_h = op.look(op.sys.open_dirs_beneath(pod_at, TARGET_DIR_MODE))?;
        let (vols, name) = open_parent(&op, root, &pod_h, target)?;
        let (action, seen, fresh) = match medium {
            StorageMedium::Disk => {
                let (action, made) = self.setup_disk(&mut op, &vols, name, target, &marker)?;
                (action, None, made)
            }
            StorageMedium::Memory => {
                let size = self.tmpfs_size(*size_limit);
                self.setup_memory(&mut op, params, (&vols, name), target, size)?
            }
        };
        let handle = match action {
            Action::Performed | Action::Replaced => {
                // The kubelet's setupDir: the volume root is world-writable.
                let vol = op.look(op.sys.open_dir_in(&vols, name))?;
                let r = op.sys.chmod_dir(&vol, 0o777);
                op.act(r)?;
                Some(vol)
            }
            _ => None,
        };
        // A disk dir in place was found with its marker.
        let known = matches!(medium, StorageMedium::Disk) && action == Action::AlreadyInPlace;
        if !known {
            let (dir, ready) = open_parent(&op, root, &pod_h, &marker)?;
            // (in a dir just made, nothing is there to look for)
            if dir.was_made() || !present_in(&op, &dir, ready)? {
                let r = op.sys.create_file_in(&dir, ready, b"", 0o644);
                op.act_or(r, Errno::EEXIST)?;
            }
        }
        Ok((Outcome::seen(action, seen), VolumeDir { handle, fresh }))
    }

    fn teardown_disk(&self, op: &mut Op<'_>, target: &Path) -> Result<Vec<PathBuf>, PluginError> {
        let at = beneath(op, self.layout.root(), target)?;
        match op.sys.stat_beneath(at) {
            Err(e) if e.errno() == Some(Errno::ENOENT) => return Ok(Vec::new()),
            Err(e) => return Err(op.sys_err(e, false)),
            Ok(_) => {}
        }
        let table = op.look(op.sys.read_mountinfo())?;
        if table.is_mount_point(target) || op.look(op.sys.mount_root(target))? {
            return Err(PluginError::TargetIsMountPoint {
                op: op.op,
                volume: op.volume.clone(),
                path: target.to_owned(),
            });
        }
        // A mount below the dir would be carried along by the rename to the
        // `.deleting~` path (someone else's mount, moved where nobody looks
        // for it). The dir stays, and the TearDown fails, final (nothing
        // changed): the volume stays in the ASW as mounted, the pod carries
        // the error, and the reconciler retries with backoff until the mounts
        // are gone. A success would claim the data was deleted.
        let nested: Vec<PathBuf> = table
            .stacks_under(target)
            .map(|s| s.mount_point().to_owned())
            .collect();
        if !nested.is_empty() {
            return Err(PluginError::MountsBeneath {
                op: op.op,
                volume: op.volume.clone(),
                path: target.to_owned(),
                mounts: nested,
            });
        }
        let mut renamed = None;
        for _ in 0..RENAME_TRIES {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            match rename_for_deletion(at, seq, op.sys) {
                Err(e) if e.errno() == Some(Errno::EEXIST) => continue,
                r => {
                    renamed = Some(op.act(r)?);
                    break;
                }
            }
        }
        let Some(renamed) = renamed else {
            return Err(op.sys_err(SysError::call(Call::Rename, target, Errno::EEXIST), true));
        };
        // Crash point: renamed for deletion, contents not yet deleted (a
        // restart finishes it: `finish_pending`).
        crate::failpoint::hit("teardown.mid_delete");
        let removal = remove_dir_one_fs(&renamed, op.sys);
        Ok(op.act(removal)?.kept_mounts)
    }
}

/// The identity the mount table will show for the tmpfs just mounted on
/// `name` in `vols`, without reading the table (O(mounts) per mount would
/// make a mass start quadratic): a new tmpfs is the whole filesystem (root
/// `/`), with the per-mount `ro` and the label it was given, on the device
/// `stat` finds there. Recorded in the outcome, it spares the next restart a
/// `Reconstructed` record per volume. Were anything else on top by now, the
/// merge sees a different mount than the one recorded, as it should.
fn fresh_tmpfs(
    op: &Op<'_>,
    vols: &DirHandle,
    name: &Path,
    read_only: bool,
    params: &TargetParams,
) -> Option<MountIdentity> {
    // not knowing the device is no failure of a SetUp that mounted
    let st = op.sys.stat_in(vols, name).ok()?;
    Some(MountIdentity {
        dev: st.dev,
        root: SharedPath::fs_root(Path::new("/")),
        fs_type: SharedStr::tmpfs(),
        read_only,
        selinux: params.selinux().cloned(),
    })
}

/// Whether `at` exists (not following it, nor any symlink on the way).
fn present(op: &Op<'_>, at: Beneath<'_>) -> Result<bool, PluginError> {
    match op.sys.stat_beneath(at) {
        Ok(_) => Ok(true),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
        Err(e) => Err(op.sys_err(e, false)),
    }
}

/// [`present`] of `name` in `dir`.
fn present_in(op: &Op<'_>, dir: &DirHandle, name: &Path) -> Result<bool, PluginError> {
    match op.sys.stat_in(dir, name) {
        Ok(_) => Ok(true),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(false),
        Err(e) => Err(op.sys_err(e, false)),
    }
}

/// The dir of `path` opened (made when missing) through `pod`, the pod
/// dir's handle, when it lies below it, else beneath `root`; and `path`'s
/// last name.
fn open_parent<'p>(
    op: &Op<'_>,
    root: &'p Path,
    pod: &DirHandle,
    path: &'p Path,
) -> Result<(DirHandle, &'p Path), PluginError> {
    let at = beneath(op, root, path)?;
    let (Some(parent), Some(name)) = (at.parent(), at.rel.file_name()) else {
        return Err(op.wrong_type(path, "path below the root dir"));
    };
    let below_pod = path.parent().and_then(|p| p.strip_prefix(pod.path()).ok());
    let opened = match below_pod.filter(|rel| !rel.as_os_str().is_empty()) {
        Some(rel) => op.sys.open_dirs_in(pod, rel, TARGET_DIR_MODE),
        None => op.sys.open_dirs_beneath(parent, TARGET_DIR_MODE),
    };
    Ok((op.look(opened)?, Path::new(name)))
}

fn pod_target<'p>(op: &Op<'_>, params: &'p TargetParams) -> Result<&'p Path, PluginError> {
    params
        .pod_mount_path
        .as_deref()
        .ok_or_else(|| op.missing("pod mount path"))
}

impl VolumePlugin for EmptyDirPlugin {
    fn name(&self) -> PluginName {
        PluginName::EmptyDir
    }

    fn setup(
        &self,
        permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        self.set_up(permit, spec, params, sys).map(|(out, _)| out)
    }

    fn teardown(&self, _permit: &Permit, params: &TargetParams, sys: &dyn Sys) -> PluginResult {
        let mut op = Op::new(sys, Operation::TearDown, params);
        let target = pod_target(&op, params)?;
        let marker = self.marker(&op, params)?;
        let left_behind = match params.kind {
            TargetKind::Mount => unmount_and_remove_dir(&mut op, self.layout.root(), target)?,
            TargetKind::Dir => self.teardown_disk(&mut op, target)?,
            TargetKind::None => return Err(op.bad_spec(self.name(), "target kind none")),
            TargetKind::Block => return Err(op.bad_spec(self.name(), "target kind block")),
        };
        if present(&op, beneath(&op, self.layout.root(), &marker)?)? {
            // beneath the pod dir: a symlink on the way fails the call
            let TargetRef::Pod(pod) = &params.target else {
                return Err(op.missing("pod uid"));
            };
            let pod_dir = self.layout.pod_dir(pod);
            let rel = marker.strip_prefix(&pod_dir).unwrap_or(&marker);
            let r = op.sys.remove_beneath(&pod_dir, rel, false);
            op.act_or(r, Errno::ENOENT)?;
            if let Some(dir) = rel.parent() {
                match op.sys.remove_beneath(&pod_dir, dir, true) {
                    Err(e) if matches!(e.errno(), Some(Errno::ENOENT | Errno::ENOTEMPTY)) => {}
                    r => op.act(r)?,
                }
            }
        }
        Ok(op.finished(left_behind))
    }
}

#[cfg(test)]
#[path = "empty_dir_tests.rs"]
mod tests;
