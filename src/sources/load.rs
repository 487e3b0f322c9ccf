//! Loading the sources: the objects when their dir changed, the manifests
//! that changed read and parsed, and their claims resolved into pods.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::manifest_cache::bytes_hash;
use super::read::{Listing, read_file};
use super::resolve::Resolver;
use super::signature::{
    FileSignature, file_signature, file_signature_hash, manifest_key, signature_hash,
};
use super::static_objects::StaticObjects;
use super::static_pods::{ParsedPod, parse_pod};
use super::{DesiredPod, DesiredPods, SourceError, Sources, listing};
use crate::model::PodUid;

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
        let to_parse = self.take_cached(to_parse, &sig_of, &mut gathered);
        self.parse_changed(
            to_parse,
            &sig_of,
            pods.started,
            &mut gathered,
            &mut file_errors,
        );
        if complete {
            self.keep_unstatted(&sig_of, &mut gathered);
            self.update_last_good(gathered.good);
            if let Some(c) = &mut self.cache {
                c.listed();
            }
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

    /// Takes the manifests of `to_parse` that the parsed-manifest cache
    /// has for their signature (only before the first complete listing);
    /// returns the others.
    fn take_cached<'p>(
        &mut self,
        to_parse: Vec<(&'p PathBuf, u64)>,
        sig_of: &SignatureOf<'p>,
        gathered: &mut Gathered<'p>,
    ) -> Vec<(&'p PathBuf, u64)> {
        let Some(cache) = &mut self.cache else {
            return to_parse;
        };
        let mut rest = Vec::new();
        for (file, sig_hash) in to_parse {
            let cached = sig_of
                .get(file.as_os_str())
                .and_then(|(_, sig)| cache.lookup(manifest_key(file), sig))
                .filter(|p| p.file == *file);
            match cached {
                Some(p) => {
                    gathered
                        .good
                        .insert(manifest_key(file), (sig_hash, p.uid.clone()));
                    gathered.got.push((file.clone(), Got::Parsed(Box::new(p))));
                }
                None => rest.push((file, sig_hash)),
            }
        }
        rest
    }

    /// Reads and parses the manifests of `to_parse` (the parsed-manifest
    /// cache told of each); one that fails keeps the pod of its last good
    /// version (if it had one), and its error goes to `file_errors`.
    fn parse_changed<'p>(
        &mut self,
        to_parse: Vec<(&'p PathBuf, u64)>,
        sig_of: &SignatureOf<'p>,
        listed_at: Option<std::time::SystemTime>,
        gathered: &mut Gathered<'p>,
        file_errors: &mut Vec<SourceError>,
    ) {
        let node = self.config.node_name.as_str();
        let parsed = read_and_parse_all(to_parse.iter().map(|(f, _)| f.as_path()), node);
        for ((file, sig_hash), result) in to_parse.into_iter().zip(parsed) {
            match result {
                Ok((p, bytes)) => {
                    if let (Some(cache), Some((_, sig)), Some(at)) =
                        (&mut self.cache, sig_of.get(file.as_os_str()), listed_at)
                    {
                        cache.parsed(manifest_key(file), *sig, bytes, &p, at);
                    }
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

/// Manifests from which [`read_and_parse_all`] uses a second thread.
pub(super) const PARALLEL_PARSE_FROM: usize = 32;

/// Reads and parses each manifest of `files` (in order, one result each,
/// with a hash of the bytes parsed). Each file is read and parsed on its
/// own, the costly part of a mass start (YAML, then the Pod type), so many
/// files are split in two halves and the second half is read and parsed on
/// a second thread meanwhile.
fn read_and_parse_all<'f>(
    files: impl Iterator<Item = &'f Path>,
    node: &str,
) -> Vec<Result<(ParsedPod, u64), SourceError>> {
    let files: Vec<&Path> = files.collect();
    let one = |file: &Path| {
        read_file(file).and_then(|b| parse_pod(file, &b, node).map(|p| (p, bytes_hash(&b))))
    };
    let all = |files: &[&Path]| files.iter().map(|f| one(f)).collect::<Vec<_>>();
    let at = match files.len() >= PARALLEL_PARSE_FROM {
        true => files.len() / 2,
        false => files.len(),
    };
    let (mut out, rest) = crate::halves::in_two_halves("volumed-parse", &files, at, all);
    out.extend(rest);
    out
}
