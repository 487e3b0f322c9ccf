//! Loading the sources: the objects when their dir changed, the manifests
//! that changed read and parsed, and their claims resolved into pods.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::manifest_cache::bytes_hash;
use super::read::{EntrySignature, Listing, read_file};
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

/// A manifest's `last_good` entry: the hash of its signature and the UID
/// of its last good version.
type Good<'p> = (&'p OsStr, (u64, PodUid));

/// What [`Sources::load`] gathers from one listing of the pods dir.
struct Gathered<'p> {
    /// per manifest, its `last_good` entry: what `last_good` becomes after
    /// a complete listing. Pushed in path order by each step in turn, and
    /// sorted by name before use.
    // Borrowed keys: `last_good` is rebuilt from these moving its own
    // keys, so a poll that adds one manifest allocates for that one.
    good: Vec<Good<'p>>,
    /// each manifest's pod, parsed or kept
    got: Vec<(&'p PathBuf, Got)>,
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

/// A manifest still to be parsed: its path, its `last_good` key
/// ([`manifest_key`], taken once), its signature and the signature's hash.
type ToParse<'p> = (&'p PathBuf, &'p OsStr, FileSignature, u64);

impl Sources {
    /// `objects: None`: the objects dir is known not to have changed since
    /// its last complete listing, which is reused without listing it again.
    /// `pods_hash`: [`signature_hash`] of `pods`' signature, when the
    /// caller has it already.
    pub(super) fn load(
        &mut self,
        pods: Listing,
        pods_hash: Option<u64>,
        objects: Option<Listing>,
    ) -> (DesiredPods, (u64, u64)) {
        let mut file_errors = pods.errors;
        let objects = self.load_objects(objects, &mut file_errors);
        let complete = pods.complete && objects.complete;
        let sigs = signatures_of(&pods.files, &pods.signature);
        let mut gathered = Gathered {
            good: Vec::with_capacity(pods.files.len()),
            got: Vec::with_capacity(pods.files.len()),
        };
        let to_parse = self.keep_unchanged(&pods.files, &sigs, objects.unchanged, &mut gathered);
        let to_parse = self.take_cached(to_parse, &mut gathered);
        self.parse_changed(to_parse, pods.started, &mut gathered, &mut file_errors);
        // each step pushed in path order: a merge of sorted runs
        gathered.good.sort_by(|a, b| a.0.cmp(b.0));
        if complete {
            self.keep_unstatted(&pods.signature, &mut gathered);
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
        let pods_hash = pods_hash.unwrap_or_else(|| signature_hash(&pods.signature));
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
                    let sigs = signatures_of(&objects.files, &objects.signature);
                    // Only a run's first complete listing uses the cache:
                    // a later change of the dir parses every file again
                    // (as without a cache), and a file changed while the
                    // daemon runs is stored at its next start. So a busy
                    // objects dir never has the whole cache rewritten.
                    let cache = self.objects_cache.as_mut().filter(|c| !c.was_listed());
                    let (objs, errs) =
                        StaticObjects::load_cached(&objects.files, &sigs, cache, objects.started);
                    if objects.complete
                        && let Some(c) = &mut self.objects_cache
                    {
                        c.listed();
                    }
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

    /// Keeps the pod of every manifest of `files` (whose signatures are
    /// `sigs`, in the same order) that is unchanged since it was last
    /// parsed (when the objects are unchanged too); returns the others to
    /// be parsed.
    fn keep_unchanged<'p>(
        &self,
        files: &'p [PathBuf],
        sigs: &[FileSignature],
        objects_unchanged: bool,
        gathered: &mut Gathered<'p>,
    ) -> Vec<ToParse<'p>> {
        let mut to_parse = Vec::new();
        for (file, &sig) in files.iter().zip(sigs) {
            // Unchanged since it was last parsed, and so are the objects its
            // claims resolve against: the DSW already has its pod.
            let sig_hash = file_signature_hash(&sig);
            let name = manifest_key(file);
            if objects_unchanged
                && let Some((before, uid)) = self.last_good.get(name)
                && *before == sig_hash
                && sig != FileSignature::default()
            {
                gathered.good.push((name, (sig_hash, uid.clone())));
                gathered.got.push((file, Got::Kept(uid.clone())));
                continue;
            }
            to_parse.push((file, name, sig, sig_hash));
        }
        to_parse
    }

    /// Takes the manifests of `to_parse` that the parsed-manifest cache
    /// has for their signature (only before the first complete listing);
    /// returns the others.
    fn take_cached<'p>(
        &mut self,
        to_parse: Vec<ToParse<'p>>,
        gathered: &mut Gathered<'p>,
    ) -> Vec<ToParse<'p>> {
        let Some(cache) = &mut self.cache else {
            return to_parse;
        };
        let mut rest = Vec::new();
        for (file, name, sig, sig_hash) in to_parse {
            let cached = cache.lookup(name, &sig).filter(|p| p.file == *file);
            match cached {
                Some(p) => {
                    gathered.good.push((name, (sig_hash, p.uid.clone())));
                    gathered.got.push((file, Got::Parsed(Box::new(p))));
                }
                None => rest.push((file, name, sig, sig_hash)),
            }
        }
        rest
    }

    /// Reads and parses the manifests of `to_parse` (the parsed-manifest
    /// cache told of each); one that fails keeps the pod of its last good
    /// version (if it had one), and its error goes to `file_errors`.
    fn parse_changed<'p>(
        &mut self,
        to_parse: Vec<ToParse<'p>>,
        listed_at: Option<std::time::SystemTime>,
        gathered: &mut Gathered<'p>,
        file_errors: &mut Vec<SourceError>,
    ) {
        let node = self.config.node_name.as_str();
        let parsed = read_and_parse_all(to_parse.iter().map(|(f, ..)| f.as_path()), node);
        for ((file, name, sig, sig_hash), result) in to_parse.into_iter().zip(parsed) {
            match result {
                Ok((p, bytes)) => {
                    if let (Some(cache), Some(at)) = (&mut self.cache, listed_at) {
                        cache.parsed(name, sig, bytes, &p, at);
                    }
                    gathered.good.push((name, (sig_hash, p.uid.clone())));
                    gathered.got.push((file, Got::Parsed(Box::new(p))));
                }
                Err(e) => {
                    if let Some((before, prev)) = self.last_good.get(name) {
                        gathered.good.push((name, (*before, prev.clone())));
                        gathered.got.push((file, Got::Kept(prev.clone())));
                    }
                    file_errors.push(e);
                }
            }
        }
    }

    /// After a complete listing: an entry that failed its stat but still
    /// exists keeps its pod too. `gathered.good` is sorted by name, and
    /// stays so.
    fn keep_unstatted<'p>(&self, listed: &'p [EntrySignature], gathered: &mut Gathered<'p>) {
        let mut kept = Vec::new();
        let mut good = gathered.good.iter().map(|g| g.0).peekable();
        // both in name order: one walk
        for (file, ..) in listed {
            let name = manifest_key(file);
            while good.next_if(|g| *g < name).is_some() {}
            if good.peek() == Some(&name) {
                continue;
            }
            if let Some(prev) = self.last_good.get(name) {
                kept.push((name, prev.clone()));
                gathered.got.push((file, Got::Kept(prev.1.clone())));
            }
        }
        if !kept.is_empty() {
            gathered.good.extend(kept);
            gathered.good.sort_by(|a, b| a.0.cmp(b.0));
        }
    }

    /// After a complete listing, `last_good` becomes `good` (sorted by
    /// name): built in one pass, a manifest it had keeping its key, so
    /// only a new manifest allocates one.
    fn update_last_good(&mut self, good: Vec<Good<'_>>) {
        let mut before = std::mem::take(&mut self.last_good).into_iter().peekable();
        self.last_good = good
            .into_iter()
            .map(|(name, v)| {
                while before.next_if(|(k, _)| &**k < name).is_some() {}
                match before.next_if(|(k, _)| &**k == name) {
                    Some((k, _)) => (k, v),
                    None => (name.into(), v),
                }
            })
            .collect();
    }

    /// The pods of `got` in path order, the first manifest of a UID
    /// winning (each later one is a `DuplicatePod` error, in path order):
    /// parsed ones resolved, kept ones by UID.
    fn resolve_unique(
        &self,
        mut got: Vec<(&PathBuf, Got)>,
        file_errors: &mut Vec<SourceError>,
    ) -> (BTreeMap<PodUid, DesiredPod>, BTreeSet<PodUid>) {
        got.sort_by(|a, b| a.0.as_os_str().cmp(b.0.as_os_str()));
        let uid_of = |g: &Got| match g {
            Got::Parsed(p) => p.uid.clone(),
            Got::Kept(uid) => uid.clone(),
        };
        // by UID, each UID's manifests in path order, the first its owner:
        // sorted once rather than looked up per manifest, and the maps
        // returned are then built from sorted runs
        let mut by_uid: Vec<(PodUid, usize)> = got
            .iter()
            .enumerate()
            .map(|(i, (_, g))| (uid_of(g), i))
            .collect();
        by_uid.sort_unstable();
        let mut duplicates = Vec::new();
        by_uid.dedup_by(|later, owner| {
            let same = later.0 == owner.0;
            if same {
                duplicates.push((later.1, owner.1));
            }
            same
        });
        duplicates.sort_unstable();
        let mut got: Vec<Option<(&PathBuf, Got)>> = got.into_iter().map(Some).collect();
        for (i, owner) in duplicates {
            let other = got[owner].as_ref().map(|(f, _)| (*f).clone());
            if let (Some((file, g)), Some(other)) = (got[i].take(), other) {
                file_errors.push(SourceError::DuplicatePod {
                    file: file.clone(),
                    uid: uid_of(&g),
                    other,
                });
            }
        }
        let parsed = got
            .iter()
            .filter(|g| matches!(g, Some((_, Got::Parsed(_)))))
            .count();
        let mut out = Vec::with_capacity(parsed);
        let mut kept = Vec::new();
        for (uid, i) in by_uid {
            match got[i].take() {
                Some((_, Got::Parsed(p))) => out.push((uid, self.resolver().resolve(*p))),
                Some((_, Got::Kept(_))) => kept.push(uid),
                None => {}
            }
        }
        (out.into_iter().collect(), kept.into_iter().collect())
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
    let (mut out, rest) = crate::util::halves::in_two_halves("volumed-parse", &files, at, all);
    out.extend(rest);
    out
}

/// The signature of each of `files` (in its order) out of `listed`: both
/// sorted by path, and every file has an entry (zeros if it had none).
fn signatures_of(files: &[PathBuf], listed: &[EntrySignature]) -> Vec<FileSignature> {
    let mut listed = listed.iter().peekable();
    files
        .iter()
        .map(|f| {
            let f = f.as_os_str();
            while listed.next_if(|e| e.0.as_os_str() < f).is_some() {}
            listed
                .next_if(|e| e.0.as_os_str() == f)
                .map(file_signature)
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_file_gets_its_own_entrys_signature() {
        let e = |name: &str, ino: u64| (PathBuf::from(format!("/p/{name}")), 1, ino, 0, 0, 0);
        let files = |names: &[&str]| -> Vec<PathBuf> {
            names
                .iter()
                .map(|n| PathBuf::from(format!("/p/{n}")))
                .collect()
        };
        let listed = [e("a", 1), e("b", 2), e("c", 3), e("d", 4)];
        let sig = |ino| (1, ino, 0, 0, 0);
        // (files, listed, want): files are a sorted subset of the listing;
        // one missing from it (never from a listing) gets zeros
        let cases: &[(&[&str], &[EntrySignature], Vec<FileSignature>)] = &[
            (
                &["a", "b", "c", "d"],
                &listed,
                vec![sig(1), sig(2), sig(3), sig(4)],
            ),
            (&["b", "d"], &listed, vec![sig(2), sig(4)]),
            (&["a", "x"], &listed, vec![sig(1), FileSignature::default()]),
            (&["a"], &[], vec![FileSignature::default()]),
            (&[], &listed, vec![]),
        ];
        for (names, listed, want) in cases {
            assert_eq!(&signatures_of(&files(names), listed), want, "{names:?}");
        }
    }
}
