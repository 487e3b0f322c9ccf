//! Pod sources: who tells volumed which pods exist. The two static
//! directories — `--static-pods` (Pod manifests, like the kubelet's
//! `staticPodPath`) and `--static-objects` (PersistentVolumes, claims,
//! CSIDrivers, VolumeAttachments, Secrets, ConfigMaps) — and, with
//! `--kubeconfig`, the API server (`api*.rs` here; its client is in
//! `apiserver`).
//!
//! We follow the behaviour of Kubernetes **v1.37** (the newest API version
//! of k8s-openapi 0.29, feature `v1_37`): its types, the kubelet's file
//! source rules (`pkg/kubelet/config/file.go`) and its PVC checks
//! (`desired_state_of_world_populator.go`). Where volumed departs, the file
//! that does it says so.
//!
//! The flow, kube-runtime's shape (list, diff, one apply function):
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
//! source dir (or its parent), with a full re-read every 30 s (longer on a
//! big node: at most 0.1% of a core) as a safety net, and polling every `--poll-ms` only where inotify cannot be set up.
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

use crate::host::sys::{LinuxSys, Sys};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::model::{PodUid, PodVolume};
pub mod api;
mod api_refs;
mod api_secrets;
pub(crate) mod api_store;
pub(crate) mod csi_objects;
mod error;
mod events;
mod load;
pub mod manifest_cache;
pub(crate) mod payload_objects;
mod payload_volumes;
mod pod_memory;
pub mod quantity;
pub(crate) mod read;
mod resolve;
mod signature;
pub mod static_objects;
pub mod static_pods;

pub use error::{SourceError, SourceErrorCategory};
pub use events::{Applied, SourceEvent, apply_event, diff, diff_fingerprints, log_pod_errors};
use read::{Listing, list_dir};
pub use signature::fingerprint;
use signature::signature_hash;
use static_objects::StaticObjects;
use static_pods::PodSeLinux;

/// How far ahead a cache's due time may be and still count as due in
/// [`Sources::write_cache`].
const CACHE_DUE_SLACK: Duration = Duration::from_millis(20);

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
    /// where the Secrets of the objects dir are published (for CSI calls)
    pub secrets: static_objects::SecretStore,
    /// where the ConfigMaps and Secrets are published (for payload volumes)
    pub payload_objects: payload_objects::PayloadStore,
    /// the parsed-manifest cache's file (`manifest_cache.rs`); `None`: none
    pub manifest_cache: Option<PathBuf>,
    /// the objects dir's parsed-file cache (`manifest_cache.rs`,
    /// `ObjectsCache`); `None`: none
    pub objects_cache: Option<PathBuf>,
}

impl SourcesConfig {
    /// No directories yet, the default poll interval.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            pods_dir: None,
            objects_dir: None,
            node_name: node_name.into(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            secrets: Default::default(),
            payload_objects: Default::default(),
            manifest_cache: None,
            objects_cache: None,
        }
    }
}

/// One pod as the sources want it, claims resolved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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
    /// per pod volume name, the claim it names (namespace: the pod's), for
    /// the `kubelet_volume_stats_*` labels
    pub claims: BTreeMap<String, String>,
    /// every container's mounts (`static_pods::containers_of`)
    pub containers: Vec<crate::model::ContainerSpec>,
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
    /// per volume (a full path and a 40-byte signature were more than twice
    /// this)
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
    /// what the manifests parsed to in earlier runs, and since
    cache: Option<manifest_cache::ManifestCache>,
    /// what the objects files parsed to in earlier runs, and since
    objects_cache: Option<manifest_cache::ObjectsCache>,
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
        let cache = match (&config.manifest_cache, &config.pods_dir) {
            (Some(file), Some(dir)) => Some(manifest_cache::ManifestCache::new(
                file.clone(),
                dir,
                &config.node_name,
            )),
            _ => None,
        };
        let objects_cache = match (&config.objects_cache, &config.objects_dir) {
            (Some(file), Some(dir)) => Some(manifest_cache::ObjectsCache::new(
                file.clone(),
                dir,
                &config.node_name,
            )),
            _ => None,
        };
        Self {
            cache,
            objects_cache,
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
        self.load(pods, None, Some(objects)).0
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

    /// How many manifests the parsed-manifest cache gave instead of a parse.
    pub fn cache_hits(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.hits())
    }

    /// How many objects files the objects cache gave instead of a parse.
    pub fn objects_cache_hits(&self) -> usize {
        self.objects_cache.as_ref().map_or(0, |c| c.hits())
    }

    /// When [`Sources::write_cache`] has work, if ever: the sooner of the
    /// two caches.
    pub fn cache_due(&self) -> Option<std::time::Instant> {
        let pods = self.cache.as_ref().and_then(|c| c.due());
        let objects = self.objects_cache.as_ref().and_then(|c| c.due());
        pods.into_iter().chain(objects).min()
    }

    /// Writes each cache whose write is due ([`Sources::cache_due`]): what
    /// was parsed since its last write and has settled, with the file's
    /// entries still current. Best effort: a failure is logged (see
    /// [`Sources::try_write_cache`]).
    pub fn write_cache(&mut self) {
        // a due time is recomputed from the clocks at each ask: one asked
        // for a moment ago may now lie a hair ahead
        let now = std::time::Instant::now() + CACHE_DUE_SLACK;
        let due = |d: Option<std::time::Instant>| d.is_some_and(|d| d <= now);
        let written = [
            due(self.cache.as_ref().and_then(|c| c.due())).then(|| self.write_pods_cache()),
            due(self.objects_cache.as_ref().and_then(|c| c.due()))
                .then(|| self.write_objects_cache()),
        ];
        for e in written.into_iter().flatten().filter_map(Result::err) {
            tracing::warn!(error = %e, "parsed-file cache not written; the next write tries again");
        }
    }

    /// Writes both caches now, saying why a write failed (naming the
    /// file); the cache on disk is then as it was (the other one is still
    /// written).
    pub fn try_write_cache(&mut self) -> Result<(), SourceError> {
        let pods = self.write_pods_cache();
        let objects = self.write_objects_cache();
        pods.and(objects)
    }

    fn write_pods_cache(&mut self) -> Result<(), SourceError> {
        let last_good = &self.last_good;
        match &mut self.cache {
            Some(c) => c.write(|name| last_good.get(name).map(|(sig, _)| *sig)),
            None => Ok(()),
        }
    }

    /// The objects cache keeps an entry only for a file whose signature is
    /// the one a listing shows now: nothing per file is held between loads
    /// for it, and a write is rare (`manifest_cache::WRITE_EVERY`), so it
    /// lists the dir again (one `stat` per file).
    fn write_objects_cache(&mut self) -> Result<(), SourceError> {
        let Some(c) = &mut self.objects_cache else {
            return Ok(());
        };
        let now = listing(self.config.objects_dir.as_ref());
        let current: BTreeMap<&OsStr, u64> = now
            .signature
            .iter()
            .map(|e| {
                let sig = signature::file_signature(e);
                (
                    signature::manifest_key(&e.0),
                    signature::file_signature_hash(&sig),
                )
            })
            .collect();
        c.write(|name| current.get(name).copied())
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
        let (desired, signature) = self.load(pods, Some(now.0), objects);
        // Errors, as the kubelet logs a manifest it cannot process: every
        // message names its file.
        for e in &desired.file_errors {
            tracing::error!(error = %e, "static source");
        }
        if !desired.complete {
            return None;
        }
        self.signature = Some(signature);
        let fingerprints: Vec<u64> = desired.pods.values().map(fingerprint).collect();
        // kept pods keep their fingerprint, gone ones go
        let mut events = events::advance(
            &mut self.current,
            desired.pods,
            &fingerprints,
            &desired.kept,
        );
        log_pod_errors(&events, "static");
        if !self.ready_sent {
            self.ready_sent = true;
            events.push(SourceEvent::SourcesReady);
        }
        (!events.is_empty()).then_some(events)
    }
}

#[cfg(test)]
mod tests;
