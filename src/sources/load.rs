//! Loading the sources: the objects when their dir changed, the manifests
//! that changed read and parsed, and their claims resolved into pods.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::read::{Listing, read_file};
use super::signature::{
    FileSignature, file_signature, file_signature_hash, manifest_key, signature_hash,
};
use super::static_objects::StaticObjects;
use super::static_pods::{ParsedPod, ParsedVolume, parse_pod};
use super::{DesiredPod, DesiredPods, SourceError, Sources, listing};
use crate::host::sys::{FileKind, Sys};
use crate::model::{CsiPodInfo, PodUid, PodVolume, VolumeSpec};

/// One manifest's pod: parsed now, or kept as the DSW has it (the
/// file is unchanged, or cannot be read now).
enum Got {
    Parsed(Box<ParsedPod>),
    Kept(PodUid),
}

/// What [`Sources::load`] gathers from one listing of the pods dir.
#[derive(Default)]
struct Gathered<'p> {
    /// per manifest, the hash of its signature and the UID of its last
    /// good version: what `last_good` becomes after a complete listing.
    // Borrowed keys: `last_good` is updated in place below, so a poll
    // that adds one manifest allocates for that one, not for all.
    good: BTreeMap<&'p OsStr, (u64, PodUid)>,
    /// each manifest's pod, parsed or kept
    got: Vec<(PathBuf, Got)>,
}

/// The objects' part of a load ([`Sources::load_objects`]).
struct ObjectsLoaded {
    /// the objects dir's listing was complete (or its last complete one
    /// was reused)
    complete: bool,
    /// a hash of its signature
    hash: u64,
    /// the signature is the one the objects were last loaded with: they
    /// were not read again
    unchanged: bool,
}

/// The signature of each manifest-named entry of a listing, by path.
type SignatureOf<'p> = BTreeMap<&'p OsStr, (&'p PathBuf, FileSignature)>;

impl Sources {
    /// `objects: None`: the objects dir is known not to have changed since
    /// its last complete listing, which is reused without listing it again.
    pub(super) fn load(
        &mut self,
        pods: Listing,
        objects: Option<Listing>,
    ) -> (DesiredPods, (u64, u64)) {
        let mut file_errors = pods.errors;
        let objects = self.load_objects(objects, &mut file_errors);
        let complete = pods.complete && objects.complete;
        // Keyed and sorted by the path's bytes: every manifest is a child
        // of the one pods dir, so that is the order of their paths, without
        // a component-wise comparison per step.
        let sig_of: SignatureOf<'_> = pods
            .signature
            .iter()
            .map(|e| (e.0.as_os_str(), (&e.0, file_signature(e))))
            .collect();
        let mut gathered = Gathered::default();
        let to_parse = self.keep_unchanged(&pods.files, &sig_of, objects.unchanged, &mut gathered);
        self.parse_changed(to_parse, &mut gathered, &mut file_errors);
        if complete {
            self.keep_unstatted(&sig_of, &mut gathered);
            self.update_last_good(gathered.good);
        }
        let (out, kept) = self.resolve_unique(gathered.got, &mut file_errors);
        let desired = DesiredPods {
            pods: out,
            kept,
            file_errors,
            complete,
        };
        let pods_hash = signature_hash(&pods.signature);
        (desired, (pods_hash, objects.hash))
    }

    /// Objects are read again only when their dir changed (same
    /// signature rule as `poll_changes`): a pods-only change, the common
    /// one, then costs no re-parse of every PV and claim. Their errors
    /// were logged when they were read.
    fn load_objects(
        &mut self,
        objects: Option<Listing>,
        file_errors: &mut Vec<SourceError>,
    ) -> ObjectsLoaded {
        match (objects, self.objects_signature) {
            (None, Some(hash)) => ObjectsLoaded {
                complete: true,
                hash,
                unchanged: true,
            },
            (objects, _) => {
                let objects = objects.unwrap_or_else(|| listing(self.config.objects_dir.as_ref()));
                file_errors.extend(objects.errors);
                let hash = signature_hash(&objects.signature);
                let unchanged = objects.complete && self.objects_signature == Some(hash);
                if !unchanged {
                    let (objs, errs) = StaticObjects::load(&objects.files);
                    objs.publish_secrets(&self.config.secrets);
                    objs.payload.publish(&self.config.payload_objects);
                    self.objects = objs;
                    file_errors.extend(errs);
                    self.objects_signature = objects.complete.then_some(hash);
                }
                ObjectsLoaded {
                    complete: objects.complete,
                    hash,
                    unchanged,
                }
            }
        }
    }

    /// Keeps the pod of every manifest of `files` that is unchanged since
    /// it was last parsed (when the objects are unchanged too); returns the
    /// others, with the hash of their signature, to be parsed.
    fn keep_unchanged<'p>(
        &self,
        files: &'p [PathBuf],
        sig_of: &SignatureOf<'p>,
        objects_unchanged: bool,
        gathered: &mut Gathered<'p>,
    ) -> Vec<(&'p PathBuf, u64)> {
        let mut to_parse: Vec<(&PathBuf, u64)> = Vec::new();
        for file in files {
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
                gathered
                    .good
                    .insert(manifest_key(file), (sig_hash, uid.clone()));
                gathered.got.push((file.clone(), Got::Kept(uid.clone())));
                continue;
            }
            to_parse.push((file, sig_hash));
        }
        to_parse
    }

    /// Reads and parses the manifests of `to_parse`; one that fails keeps
    /// the pod of its last good version (if it had one), and its error goes
    /// to `file_errors`.
    fn parse_changed<'p>(
        &self,
        to_parse: Vec<(&'p PathBuf, u64)>,
        gathered: &mut Gathered<'p>,
        file_errors: &mut Vec<SourceError>,
    ) {
        let node = self.config.node_name.as_str();
        let parsed = read_and_parse_all(to_parse.iter().map(|(f, _)| f.as_path()), node);
        for ((file, sig_hash), result) in to_parse.into_iter().zip(parsed) {
            match result {
                Ok(p) => {
                    gathered
                        .good
                        .insert(manifest_key(file), (sig_hash, p.uid.clone()));
                    gathered.got.push((file.clone(), Got::Parsed(Box::new(p))));
                }
                Err(e) => {
                    if let Some((before, prev)) = self.last_good.get(manifest_key(file)) {
                        gathered
                            .good
                            .insert(manifest_key(file), (*before, prev.clone()));
                        gathered.got.push((file.clone(), Got::Kept(prev.clone())));
                    }
                    file_errors.push(e);
                }
            }
        }
    }

    /// After a complete listing: an entry that failed its stat but still
    /// exists keeps its pod too.
    fn keep_unstatted<'p>(&self, sig_of: &SignatureOf<'p>, gathered: &mut Gathered<'p>) {
        for &(file, _) in sig_of.values() {
            let name = manifest_key(file);
            if gathered.good.contains_key(name) {
                continue;
            }
            if let Some(prev) = self.last_good.get(name) {
                gathered.good.insert(name, prev.clone());
                gathered.got.push((file.clone(), Got::Kept(prev.1.clone())));
            }
        }
    }

    /// After a complete listing, `last_good` becomes `good` (updated in
    /// place: only a new manifest allocates its key).
    fn update_last_good(&mut self, good: BTreeMap<&OsStr, (u64, PodUid)>) {
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

    /// The pods of `got` in path order, the first manifest of a UID
    /// winning (each later one is a `DuplicatePod` error): parsed ones
    /// resolved, kept ones by UID.
    fn resolve_unique(
        &self,
        mut got: Vec<(PathBuf, Got)>,
        file_errors: &mut Vec<SourceError>,
    ) -> (BTreeMap<PodUid, DesiredPod>, BTreeSet<PodUid>) {
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
                    out.insert(uid, self.resolver().resolve(*p));
                }
                Got::Kept(uid) => {
                    kept.insert(uid);
                }
            }
        }
        (out, kept)
    }

    /// How this source's pods resolve their claims and CSI volumes.
    pub(super) fn resolver(&self) -> Resolver<'_> {
        Resolver {
            objects: &self.objects,
            payload: &self.objects.payload,
            sys: self.sys.as_ref(),
            node_name: &self.config.node_name,
        }
    }
}

/// Resolves a parsed pod's claims and CSI volumes against one source's
/// objects: the static objects dir, or what the API server sent.
pub(crate) struct Resolver<'a> {
    /// the PVs, claims and CSIDrivers
    pub(crate) objects: &'a StaticObjects,
    /// the ConfigMaps, Secrets and tokens payload volumes read
    pub(crate) payload: &'a dyn crate::plugins::payload::ObjectStore,
    /// how a local PV's path is looked at
    pub(crate) sys: &'a dyn Sys,
    /// the node (a claim's PV must allow it)
    pub(crate) node_name: &'a str,
}

impl Resolver<'_> {
    /// A CSI volume as this pod publishes it: an inline volume takes its
    /// CSIDriver's `seLinuxMount`; the pod adds the `csi.storage.k8s.io/`
    /// keys when the CSIDriver has `podInfoOnMount` (as the kubelet's
    /// `getPodInfoAttrs`), and its fsGroup unless `fsGroupPolicy` is `None`.
    fn csi_for_pod(
        &self,
        p: &ParsedPod,
        mut spec: Arc<VolumeSpec>,
    ) -> (Arc<VolumeSpec>, Option<Arc<CsiPodInfo>>) {
        let VolumeSpec::Csi(c) = &*spec else {
            return (spec, None);
        };
        let driver = self.objects.csi_drivers.get(&c.driver);
        let ephemeral = c.ephemeral;
        let selinux_mount = ephemeral && driver.is_some_and(|d| d.se_linux_mount);
        // (a claim's spec got it when the claim was resolved)
        let republish = ephemeral && driver.is_some_and(|d| d.requires_republish);
        if (selinux_mount || republish)
            && let VolumeSpec::Csi(c) = Arc::make_mut(&mut spec)
        {
            c.selinux_mount |= selinux_mount;
            c.republish |= republish;
        }
        let mut info = CsiPodInfo::default();
        if driver.is_some_and(|d| d.pod_info_on_mount) {
            let key = |k: &str| format!("csi.storage.k8s.io/{k}");
            info.volume_context = [
                (key("pod.name"), p.name.clone()),
                (key("pod.namespace"), p.namespace.clone()),
                (key("pod.uid"), p.uid.as_str().to_owned()),
                (key("serviceAccount.name"), p.service_account.clone()),
                (key("ephemeral"), ephemeral.to_string()),
            ]
            .into();
        }
        if driver.is_none_or(|d| d.fs_group_policy != "None") {
            info.mount_group = p.fs_group.map(|g| g.to_string());
        }
        let info = (info != CsiPodInfo::default()).then(|| Arc::new(info));
        (spec, info)
    }

    /// A payload volume's spec with the version of the payload its
    /// objects make now (the intent will record it); other specs as they
    /// are. A missing object or key, or a hostile path, is the volume's
    /// error.
    fn payload_version(
        &self,
        mut spec: Arc<VolumeSpec>,
    ) -> Result<Arc<VolumeSpec>, crate::plugins::payload::PayloadError> {
        if let VolumeSpec::Payload(p) = &*spec {
            let built = crate::plugins::payload::build::build(p, self.payload)?;
            if let VolumeSpec::Payload(p) = Arc::make_mut(&mut spec) {
                p.version = Some(Arc::new(built.version));
                p.immutable = built.immutable;
            }
        }
        Ok(spec)
    }

    /// The pod with its claims resolved (or their errors).
    pub(crate) fn resolve(&self, mut p: ParsedPod) -> DesiredPod {
        let mut errors = std::mem::take(&mut p.errors);
        let mut unresolved = std::mem::take(&mut p.failed_volumes);
        // exactly as many as the pod has: a pushed-to Vec reserves four
        let mut volumes = Vec::with_capacity(p.volumes.len());
        let mut claims = BTreeMap::new();
        for v in std::mem::take(&mut p.volumes) {
            let (outer, spec_name, spec) = match v {
                ParsedVolume::Inline { name, spec } => (name.clone(), name, Arc::new(spec)),
                ParsedVolume::Claim { name, claim_name } => {
                    match self.objects.resolve_claim(
                        &p.file,
                        &name,
                        &p.namespace,
                        &claim_name,
                        self.node_name,
                    ) {
                        Ok((pv, mut spec)) => {
                            mark_block_device(self.sys, &mut spec);
                            claims.insert(name.clone(), claim_name);
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
            let spec = match self.payload_version(spec) {
                Ok(spec) => spec,
                Err(e) => {
                    errors.push(format!("volume {outer:?}: {e}"));
                    unresolved.insert(outer);
                    continue;
                }
            };
            if let VolumeSpec::Csi(c) = &*spec
                && let Err(e) = super::csi_objects::check_lifecycle(
                    &c.driver,
                    self.objects.csi_drivers.get(&c.driver),
                    c.ephemeral,
                )
            {
                errors.push(format!("volume {outer:?}: {e}"));
                unresolved.insert(outer);
                continue;
            }
            let (spec, csi_pod) = self.csi_for_pod(&p, spec);
            volumes.push(PodVolume {
                volume: PodVolume::unique_name(&spec, &p.uid, &spec_name),
                spec_name,
                outer_name: outer,
                spec,
                selinux: None,
                csi_pod,
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
            claims,
        }
    }
}

/// Manifests from which [`read_and_parse_all`] uses a second thread.
pub(super) const PARALLEL_PARSE_FROM: usize = 32;

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
