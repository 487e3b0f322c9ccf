//! Pod sources: who tells volumed which pods exist. Today the two static
//! directories — `--static-pods` (Pod manifests, like the kubelet's
//! `staticPodPath`) and `--static-objects` (PersistentVolumes, claims,
//! CSIDrivers); an API-server source comes later.
//!
//! We follow the behaviour of Kubernetes **v1.37** (the newest API version
//! of k8s-openapi 0.29, feature `v1_37`): its types, the kubelet's file
//! source rules (`pkg/kubelet/config/file.go`) and its PVC checks
//! (`desired_state_of_world_populator.go`). Where volumed departs, the file
//! that does it says so.
//!
//! The flow, kube-runtime's shape (STYLE.md "Our house" 11):
//! 1. [`Sources::list`] reads both directories into a full desired set,
//!    [`DesiredPods`] (per file: `read.rs`, [`static_pods`],
//!    [`static_objects`]; claims resolved against the objects);
//! 2. [`diff`] turns the previous and the new set into [`SourceEvent`]s;
//! 3. [`apply_event`] is **the one function through which sources change the
//!    DSW**.
//!
//! **Change detection.** [`Sources::poll_changes`] lists both directories
//! and compares a signature of every entry (device, inode, size, mtime,
//! ctime, through symlinks; kept as a hash) with the last one; only when it
//! differs are files read again: the objects when their dir changed (then
//! every manifest too, as claims resolve against them), else only the
//! manifests whose own signature changed ([`Sources::poll_pods_changes`]
//! skips listing the objects dir when the caller knows it did not change).
//! *When* it is called is the daemon's `watch`: on an inotify event in a
//! source dir (or its parent), with a full re-read every 30 s as a safety
//! net, and polling every `--poll-ms` only where inotify cannot be set up.
//! A manifest written in place in two steps may be seen half-written; see
//! below.
//!
//! Which files count and how they are parsed is in `read.rs`: dotfiles and
//! subdirectories skipped, every other name read (as the kubelet does),
//! symlinks followed for reading, syntax sniffed from the content.
//!
//! Rules that keep mounts safe:
//! - `SourcesReady` is emitted exactly once, after the first poll in which
//!   every configured directory was listed completely (a missing directory is
//!   complete and empty, as in the kubelet; an unreadable one is not, and
//!   that poll changes nothing). Nothing is unmounted before it.
//! - A manifest that still exists but can no longer be read or parsed (a
//!   half-written edit) keeps the pod of its last good version: no event
//!   changes what the DSW has for it ([`DesiredPods::kept`]); the error is
//!   logged naming the file. **Departure:** the kubelet drops that pod; for volumed that
//!   would mean tearing down (and, for a disk emptyDir, deleting) a running
//!   pod's volumes because of a typo. Deleting the file removes the pod.
//! - A pod whose claim or volume cannot be resolved gets an error and keeps
//!   the DSW volumes it already had under that name ([`DesiredPod::unresolved`]).
//! - Two files with the same pod UID: the first (sorted by path) wins.
//! - Every file error, and every error of a pod when it appears or changes
//!   (a rejected volume name, an unresolved claim), is logged at error level
//!   naming the file, as the kubelet logs a manifest it cannot process.

use crate::host::sys::{FileKind, LinuxSys, Sys};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::model::{PodUid, PodVolume};

mod error;
mod events;
pub mod quantity;
pub mod read;
pub mod static_objects;
pub mod static_pods;

pub use error::{SourceError, SourceErrorCategory};
pub use events::{Applied, SourceEvent, apply_event, diff, diff_fingerprints};
use read::{EntrySignature, Listing, list_dir, read_file};
use static_objects::StaticObjects;
use static_pods::{ParsedPod, ParsedVolume, PodSeLinux, parse_pod};

/// How often the daemon should call [`Sources::poll_changes`] by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Which directories to read, for which node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcesConfig {
    /// `--static-pods`
    pub pods_dir: Option<PathBuf>,
    /// `--static-objects`
    pub objects_dir: Option<PathBuf>,
    /// `--node-name`: part of hashed UIDs and of static pod names
    pub node_name: String,
    /// how often the daemon polls
    pub poll_interval: Duration,
}

impl SourcesConfig {
    /// No directories yet, the default poll interval.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            pods_dir: None,
            objects_dir: None,
            node_name: node_name.into(),
            poll_interval: DEFAULT_POLL_INTERVAL,
        }
    }
}

/// One pod as the sources want it, claims resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPod {
    /// the UID
    pub uid: PodUid,
    /// the namespace
    pub namespace: String,
    /// the name (`<metadata.name>-<node>`)
    pub name: String,
    /// the manifest it came from
    pub file: PathBuf,
    /// the volumes to mount, in spec order
    pub volumes: Vec<PodVolume>,
    /// names of the pod's volumes that could not be resolved: their DSW
    /// entries, if any, are kept
    pub unresolved: BTreeSet<String>,
    /// the pod's errors, as messages naming the file and volume
    pub errors: Vec<String>,
    /// SELinux inputs
    pub selinux: PodSeLinux,
}

/// The full desired set of one listing.
#[derive(Debug, Default)]
pub struct DesiredPods {
    /// pods by UID
    pub pods: BTreeMap<PodUid, DesiredPod>,
    /// pods whose manifest still exists but can no longer be read or parsed:
    /// they keep what the DSW has for them (their last good version), and
    /// no event changes them
    pub kept: BTreeSet<PodUid>,
    /// problems not tied to a pod that was produced (bad files, objects)
    pub file_errors: Vec<SourceError>,
    /// whether every configured directory was listed completely
    pub complete: bool,
}

/// The static sources with their change detection.
///
/// Memory: what is kept between polls is only what diffing needs — per
/// manifest the UID of its last good version, per pod a fingerprint of what
/// the DSW was last told ([`fingerprint`]), hashes of the listings — never
/// parsed or resolved pods (the DSW holds what is wanted).
pub struct Sources {
    config: SourcesConfig,
    /// how a local PV's path is looked at (is it a block device?)
    sys: Arc<dyn Sys>,
    /// per pod manifest, the UID of its last version that parsed and a
    /// hash of the file's signature then (an unchanged file is not read
    /// again while the objects are unchanged too). Keyed by file name (the
    /// manifests are the pods dir's direct children) and hashed, as the
    /// listings' signatures are: one entry per pod, so its size is memory
    /// per volume (a full path and a 40-byte signature were twice this)
    last_good: BTreeMap<Box<OsStr>, (u64, PodUid)>,
    /// the pods the DSW was last told about, by fingerprint
    current: BTreeMap<PodUid, u64>,
    objects: StaticObjects,
    /// a hash of the objects dir's signature when `objects` was loaded: an
    /// unchanged one is not read again when only the pods dir changed
    objects_signature: Option<u64>,
    /// hashes of both listings' signatures at the last complete poll
    signature: Option<(u64, u64)>,
    ready_sent: bool,
}

/// One file's part of a listing signature: (device, inode, size, mtime,
/// ctime).
type FileSignature = (u64, u64, u64, i64, i64);

fn file_signature(e: &EntrySignature) -> FileSignature {
    (e.1, e.2, e.3, e.4, e.5)
}

/// A hash of one file's signature, as `last_good` keeps it (equal
/// signatures, equal hashes).
fn file_signature_hash(sig: &FileSignature) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    sig.hash(&mut h);
    h.finish()
}

/// The `last_good` key of a manifest: its file name (a path without one,
/// which a listing never yields, is keyed by the whole path).
fn manifest_key(file: &Path) -> &OsStr {
    file.file_name().unwrap_or(file.as_os_str())
}

/// A hash of a listing's signature (equal signatures, equal hashes).
fn signature_hash(sig: &[EntrySignature]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    sig.hash(&mut h);
    h.finish()
}

/// A fingerprint of everything a pod tells the DSW (its `Debug` form
/// hashed, so every field counts, new ones included): equal pods, equal
/// fingerprints.
pub fn fingerprint(pod: &DesiredPod) -> u64 {
    use std::hash::Hasher;
    use std::io::Write;
    struct H(std::hash::DefaultHasher);
    impl Write for H {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.write(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = H(std::hash::DefaultHasher::new());
    // Writing into a hasher cannot fail.
    let _ = write!(h, "{pod:?}");
    h.0.finish()
}

fn listing(dir: Option<&PathBuf>) -> Listing {
    match dir {
        Some(d) => list_dir(d),
        None => Listing {
            complete: true,
            ..Listing::default()
        },
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("config", &self.config)
            .field("pod_count", &self.current.len())
            .finish_non_exhaustive()
    }
}

impl Sources {
    /// Sources that have read nothing yet.
    pub fn new(config: SourcesConfig) -> Self {
        Self::with_sys(config, Arc::new(LinuxSys))
    }

    /// Sources that look at the host through `sys`.
    pub fn with_sys(config: SourcesConfig, sys: Arc<dyn Sys>) -> Self {
        Self {
            config,
            sys,
            last_good: BTreeMap::new(),
            current: BTreeMap::new(),
            objects: StaticObjects::default(),
            objects_signature: None,
            signature: None,
            ready_sent: false,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SourcesConfig {
        &self.config
    }

    /// The objects of the last listing.
    pub fn objects(&self) -> &StaticObjects {
        &self.objects
    }

    /// The pods the DSW was last told about (by [`Sources::poll_changes`]),
    /// by [`fingerprint`].
    pub fn current(&self) -> &BTreeMap<PodUid, u64> {
        &self.current
    }

    /// Whether [`SourceEvent::SourcesReady`] has been emitted: every
    /// configured directory was listed completely once.
    pub fn ready_sent(&self) -> bool {
        self.ready_sent
    }

    /// Lists both directories now and returns the full desired set. Updates
    /// the objects and the last good version of each manifest.
    pub fn list(&mut self) -> DesiredPods {
        let pods = listing(self.config.pods_dir.as_ref());
        let objects = listing(self.config.objects_dir.as_ref());
        self.load(pods, Some(objects)).0
    }

    /// `objects: None`: the objects dir is known not to have changed since
    /// its last complete listing, which is reused without listing it again.
    fn load(&mut self, pods: Listing, objects: Option<Listing>) -> (DesiredPods, (u64, u64)) {
        let mut file_errors = pods.errors;
        // Objects are read again only when their dir changed (same
        // signature rule as `poll_changes`): a pods-only change, the common
        // one, then costs no re-parse of every PV and claim. Their errors
        // were logged when they were read.
        let (objects_complete, objects_hash, objects_unchanged) =
            match (objects, self.objects_signature) {
                (None, Some(hash)) => (true, hash, true),
                (objects, _) => {
                    let objects =
                        objects.unwrap_or_else(|| listing(self.config.objects_dir.as_ref()));
                    file_errors.extend(objects.errors);
                    let hash = signature_hash(&objects.signature);
                    let unchanged = objects.complete && self.objects_signature == Some(hash);
                    if !unchanged {
                        let (objs, errs) = StaticObjects::load(&objects.files);
                        self.objects = objs;
                        file_errors.extend(errs);
                        self.objects_signature = objects.complete.then_some(hash);
                    }
                    (objects.complete, hash, unchanged)
                }
            };
        let complete = pods.complete && objects_complete;
        // Keyed and sorted by the path's bytes: every manifest is a child
        // of the one pods dir, so that is the order of their paths, without
        // a component-wise comparison per step.
        let sig_of: BTreeMap<&OsStr, (&PathBuf, FileSignature)> = pods
            .signature
            .iter()
            .map(|e| (e.0.as_os_str(), (&e.0, file_signature(e))))
            .collect();
        /// One manifest's pod: parsed now, or kept as the DSW has it (the
        /// file is unchanged, or cannot be read now).
        enum Got {
            Parsed(Box<ParsedPod>),
            Kept(PodUid),
        }
        // Borrowed keys: `last_good` is updated in place below, so a poll
        // that adds one manifest allocates for that one, not for all.
        let mut good: BTreeMap<&OsStr, (u64, PodUid)> = BTreeMap::new();
        let mut got: Vec<(PathBuf, Got)> = Vec::new();
        let mut to_parse: Vec<(&PathBuf, u64)> = Vec::new();
        for file in &pods.files {
            let sig = sig_of
                .get(file.as_os_str())
                .map(|(_, s)| *s)
                .unwrap_or_default();
            // Unchanged since it was last parsed, and so are the objects its
            // claims resolve against: the DSW already has its pod.
            let sig_hash = file_signature_hash(&sig);
            if objects_unchanged
                && let Some((before, uid)) = self.last_good.get(manifest_key(file))
                && *before == sig_hash
                && sig != FileSignature::default()
            {
                good.insert(manifest_key(file), (sig_hash, uid.clone()));
                got.push((file.clone(), Got::Kept(uid.clone())));
                continue;
            }
            to_parse.push((file, sig_hash));
        }
        let node = self.config.node_name.as_str();
        let parsed = read_and_parse_all(to_parse.iter().map(|(f, _)| f.as_path()), node);
        for ((file, sig_hash), result) in to_parse.into_iter().zip(parsed) {
            match result {
                Ok(p) => {
                    good.insert(manifest_key(file), (sig_hash, p.uid.clone()));
                    got.push((file.clone(), Got::Parsed(Box::new(p))));
                }
                Err(e) => {
                    if let Some((before, prev)) = self.last_good.get(manifest_key(file)) {
                        good.insert(manifest_key(file), (*before, prev.clone()));
                        got.push((file.clone(), Got::Kept(prev.clone())));
                    }
                    file_errors.push(e);
                }
            }
        }
        // an entry that failed its stat but still exists keeps its pod too
        if complete {
            for (file, _) in sig_of.values() {
                let name = manifest_key(file);
                if good.contains_key(name) {
                    continue;
                }
                if let Some(prev) = self.last_good.get(name) {
                    good.insert(name, prev.clone());
                    got.push(((*file).clone(), Got::Kept(prev.1.clone())));
                }
            }
        }
        if complete {
            self.last_good.retain(|f, _| good.contains_key(&**f));
            for (name, v) in good {
                match self.last_good.get_mut(name) {
                    Some(e) => *e = v,
                    None => {
                        self.last_good.insert(name.into(), v);
                    }
                }
            }
        }
        let mut out: BTreeMap<PodUid, DesiredPod> = BTreeMap::new();
        let mut kept = BTreeSet::new();
        let mut owner: BTreeMap<PodUid, PathBuf> = BTreeMap::new();
        got.sort_by(|a, b| a.0.as_os_str().cmp(b.0.as_os_str()));
        for (file, g) in got {
            let uid = match &g {
                Got::Parsed(p) => p.uid.clone(),
                Got::Kept(uid) => uid.clone(),
            };
            if let Some(other) = owner.get(&uid) {
                file_errors.push(SourceError::DuplicatePod {
                    file,
                    uid,
                    other: other.clone(),
                });
                continue;
            }
            owner.insert(uid.clone(), file);
            match g {
                Got::Parsed(p) => {
                    out.insert(uid, self.resolve(*p));
                }
                Got::Kept(uid) => {
                    kept.insert(uid);
                }
            }
        }
        let desired = DesiredPods {
            pods: out,
            kept,
            file_errors,
            complete,
        };
        let pods_hash = signature_hash(&pods.signature);
        (desired, (pods_hash, objects_hash))
    }

    fn resolve(&self, p: ParsedPod) -> DesiredPod {
        let mut errors = p.errors;
        let mut unresolved = p.failed_volumes;
        // exactly as many as the pod has: a pushed-to Vec reserves four
        let mut volumes = Vec::with_capacity(p.volumes.len());
        for v in p.volumes {
            let (outer, spec_name, spec) = match v {
                ParsedVolume::Inline { name, spec } => (name.clone(), name, Arc::new(spec)),
                ParsedVolume::Claim { name, claim_name } => {
                    match self
                        .objects
                        .resolve_claim(&p.file, &name, &p.namespace, &claim_name)
                    {
                        Ok((pv, mut spec)) => {
                            mark_block_device(self.sys.as_ref(), &mut spec);
                            (name, pv, spec)
                        }
                        Err(e) => {
                            errors.push(e.to_string());
                            unresolved.insert(name);
                            continue;
                        }
                    }
                }
            };
            volumes.push(PodVolume {
                volume: PodVolume::unique_name(&spec, &p.uid, &spec_name),
                spec_name,
                outer_name: outer,
                spec,
                selinux: None,
            });
        }
        DesiredPod {
            uid: p.uid,
            namespace: p.namespace,
            name: p.name,
            file: p.file,
            volumes,
            unresolved,
            errors,
            selinux: p.selinux,
        }
    }

    /// Checks both directories; returns the events since the last call, or
    /// `None` when nothing changed (or a listing was incomplete: retried on
    /// the next call). The first complete listing ends with
    /// [`SourceEvent::SourcesReady`], exactly once.
    pub fn poll_changes(&mut self) -> Option<Vec<SourceEvent>> {
        self.poll(true)
    }

    /// [`poll_changes`](Self::poll_changes) for a caller that knows the
    /// objects dir has not changed since the last poll (inotify reported
    /// events in the pods dir only): the objects dir is not listed again
    /// (a `stat` per object file) unless no complete listing of it is
    /// known yet.
    pub fn poll_pods_changes(&mut self) -> Option<Vec<SourceEvent>> {
        self.poll(false)
    }

    fn poll(&mut self, list_objects: bool) -> Option<Vec<SourceEvent>> {
        let pods = listing(self.config.pods_dir.as_ref());
        let known_objects = self
            .signature
            .map(|(_, o)| o)
            .filter(|o| !list_objects && self.objects_signature == Some(*o));
        let objects = match known_objects {
            Some(_) => None,
            None => Some(listing(self.config.objects_dir.as_ref())),
        };
        let now = (
            signature_hash(&pods.signature),
            match (&objects, known_objects) {
                (Some(l), _) => signature_hash(&l.signature),
                (None, o) => o.unwrap_or_default(),
            },
        );
        if self.signature == Some(now) && self.ready_sent {
            return None;
        }
        let (desired, signature) = self.load(pods, objects);
        // Errors, as the kubelet logs a manifest it cannot process: every
        // message names its file.
        for e in &desired.file_errors {
            tracing::error!(error = %e, "static source");
        }
        if !desired.complete {
            return None;
        }
        self.signature = Some(signature);
        let mut events = diff_fingerprints(&self.current, &desired.pods, &desired.kept);
        // A pod's own errors (a rejected volume, an unresolved claim) are
        // logged when the pod appears or changes, not on every poll.
        for ev in &events {
            if let SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p) = ev {
                for e in &p.errors {
                    tracing::error!(pod = %p.uid, file = %p.file.display(), error = %e, "static pod");
                }
            }
        }
        // In place: kept pods keep their fingerprint, gone ones go.
        self.current
            .retain(|uid, _| desired.pods.contains_key(uid) || desired.kept.contains(uid));
        for (uid, p) in &desired.pods {
            let f = fingerprint(p);
            match self.current.get_mut(uid) {
                Some(e) => *e = f,
                None => {
                    self.current.insert(uid.clone(), f);
                }
            }
        }
        if !self.ready_sent {
            self.ready_sent = true;
            events.push(SourceEvent::SourcesReady);
        }
        (!events.is_empty()).then_some(events)
    }
}

/// Manifests from which [`read_and_parse_all`] uses a second thread.
const PARALLEL_PARSE_FROM: usize = 32;

/// Reads and parses each manifest of `files` (in order, one result each).
/// Each file is read and parsed on its own, the costly part of a mass start
/// (YAML, then the Pod type), so many files are split in two halves and the
/// second half is read and parsed on a second thread meanwhile.
fn read_and_parse_all<'f>(
    files: impl Iterator<Item = &'f Path>,
    node: &str,
) -> Vec<Result<ParsedPod, SourceError>> {
    let files: Vec<&Path> = files.collect();
    let one = |file: &Path| read_file(file).and_then(|b| parse_pod(file, &b, node));
    let all = |files: &[&Path]| files.iter().map(|f| one(f)).collect::<Vec<_>>();
    let at = match files.len() >= PARALLEL_PARSE_FROM {
        true => files.len() / 2,
        false => files.len(),
    };
    let (mut out, rest) = crate::halves::in_two_halves("volumed-parse", &files, at, all);
    out.extend(rest);
    out
}

/// Decides `is_block` of a local PV by `stat` (through symlinks, so
/// `/dev/disk/by-id/…` counts) when its claim is resolved: a block device
/// gets a device target (format, MountDevice, bind), anything else is bound
/// as a directory. Decided again whenever the pod's manifest or the objects
/// change; a device that appears later is seen on the next such change.
/// The spec stays the PV's own (shared) unless this changes it.
fn mark_block_device(sys: &dyn Sys, spec: &mut Arc<crate::model::VolumeSpec>) {
    use crate::model::VolumeSpec;
    if let VolumeSpec::Local { path, is_block, .. } = &**spec {
        let block = sys
            .stat(path, true)
            .is_ok_and(|st| st.kind == FileKind::BlockDevice);
        if block != *is_block
            && let VolumeSpec::Local { is_block, .. } = Arc::make_mut(spec)
        {
            *is_block = block;
        }
    }
}

#[cfg(test)]
mod tests;
