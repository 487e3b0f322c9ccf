//! The static sources' parsed-file caches: what each manifest parsed to,
//! kept in `<journal-dir>/static-pods.cache`, and what each file of the
//! objects dir parsed to, in `<journal-dir>/static-objects.cache`
//! ([`ObjectsCache`]), so that a restart reads and parses again only the
//! files that changed. Parsing (YAML or JSON, then the API type) is the
//! costly part of listing a big pods or objects dir; with the cache, a
//! restart over unchanged files costs the listing (one `stat` each) and the
//! cache's decode. The kubelet parses every manifest at every start (and
//! has no objects dir: its objects come from the API server).
//!
//! One [`ParsedFileCache`] type serves both ([`ManifestCache`] and
//! [`ObjectsCache`]), over what a file parses to ([`Cached`]: a
//! [`ParsedPod`], or an objects file's [`CachedObjects`]); each kind of
//! file has its own magic, so neither reads the other's file.
//!
//! The cache is a shortcut, never a source. Its rules:
//! - an entry is used only for a file whose signature (device, inode, size,
//!   mtime, ctime, through symlinks) is the one it was stored with, by the
//!   same executable (its own signature is in the header: another volumed
//!   may parse differently), for the same pods dir and node name (both go
//!   into a pod's name and hashed UID);
//! - an entry is stored only when no change of the file can have left that
//!   signature as it was: its ctime is at least [`SETTLED`] older than the
//!   read it was parsed from (a write in the same clock tick as the one
//!   before it could otherwise keep size and times). A file changed more
//!   recently is confirmed first, once it has settled: read again, and
//!   stored only if its bytes hash as the parsed ones did and its signature
//!   did not move;
//! - the file ends with a CRC-32C of the rest, and is replaced by rename: a
//!   torn, foreign or stale file is ignored (and logged), and every manifest
//!   is parsed as without a cache. It is not synced: losing it costs a
//!   parse, never a wrong pod. A write that fails (a full disk) leaves the
//!   file as it was, removes its temp file (`static-pods.cache.tmp`, never
//!   read) and keeps what it would have stored for the next write.
//!
//! Memory: the file's entries are held only until the first complete
//! listing used them; after that, only the entries parsed since the last
//! write, encoded, until the next write. A write merges them into the
//! file's entries (a pass over every manifest, so it runs at most every
//! [`WRITE_EVERY`] after the first, and only when something was parsed).
//! Static pods carry no Secret data (Secrets are objects, resolved later):
//! nothing secret is written. An objects file is stored only when every
//! object in it is a PersistentVolume, a claim, a CSIDriver or a
//! VolumeAttachment and it parsed without an error
//! (`StaticObjects::parse_file`): a file with a Secret or a ConfigMap is
//! parsed at every start, so no Secret's bytes reach the journal dir.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::marker::PhantomData;
use std::ops::Range;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::SourceError;
use super::read::{read_file, signature_of};
use super::signature::{FileSignature, file_signature, file_signature_hash};
pub use super::static_objects::CachedObjects;
use super::static_pods::ParsedPod;

/// The static-pod cache's file name in the journal dir.
pub const FILE_NAME: &str = "static-pods.cache";

/// The objects cache's file name in the journal dir.
pub const OBJECTS_FILE_NAME: &str = "static-objects.cache";

/// What one file parses to, as a cache keeps it.
pub trait Cached: Serialize + DeserializeOwned {
    /// The first bytes of the cache's file: one per kind of file and
    /// format, so a cache never reads another's file.
    const MAGIC: &'static [u8; 8];
}

impl Cached for ParsedPod {
    // format 1
    const MAGIC: &'static [u8; 8] = b"vdmcach1";
}

impl Cached for CachedObjects {
    // format 1
    const MAGIC: &'static [u8; 8] = b"vdocach1";
}

/// The static-pod source's parsed-manifest cache.
pub type ManifestCache = ParsedFileCache<ParsedPod>;

/// The objects dir's cache.
pub type ObjectsCache = ParsedFileCache<CachedObjects>;

/// How much older than the read it was parsed from a file's ctime must be
/// for its entry to be stored as is. File times come from the kernel's
/// coarse clock, which moves in ticks of 1–10 ms (kernels with multigrain
/// times give a change after a `stat` a newer time at once): a write that
/// keeps the ctime falls within one tick of the one before it, so a file
/// whose ctime is many ticks older than the read cannot have been
/// rewritten unseen after it.
pub const SETTLED: Duration = Duration::from_millis(100);

/// At most one write in this long, after the first. A write after a mass
/// change costs ~0.1 s of CPU at 10,000 manifests (a second read of each
/// file changed just before its parse, and the whole file rewritten); a
/// restart in between parses what changed since, as without a cache.
pub const WRITE_EVERY: Duration = Duration::from_secs(300);

/// What the cache's entries are valid for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    /// the running executable's signature
    exe: FileSignature,
    /// the dir of the files (the pods dir, or the objects dir)
    pods_dir: PathBuf,
    /// the node name
    node: String,
}

/// One file: its name, signature and what it parsed to (bincode, decoded
/// only when used; the field keeps the name it had when only pods were
/// cached, as the encoding does not depend on it).
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    name: Vec<u8>,
    sig: FileSignature,
    pod: Vec<u8>,
}

#[derive(Serialize)]
struct Stored {
    stamp: Stamp,
    entries: Vec<Entry>,
}

/// An [`Entry`] as read, borrowed from the file's bytes. Bincode encodes a
/// `Vec<u8>` and a byte slice alike, and reads a slice at once where a
/// `Vec<u8>` takes a step per byte.
#[derive(Deserialize)]
struct EntryRef<'a> {
    name: &'a [u8],
    sig: FileSignature,
    pod: &'a [u8],
}

/// [`Stored`] as read.
#[derive(Deserialize)]
struct StoredRef<'a> {
    stamp: Stamp,
    #[serde(borrow)]
    entries: Vec<EntryRef<'a>>,
}

/// Where one entry's parts lie in the file's bytes.
struct Span {
    name: Range<usize>,
    sig: FileSignature,
    pod: Range<usize>,
}

/// The file's entries: its bytes, and each entry's [`Span`] in them,
/// sorted by name (as written). A pod is decoded only when looked up.
#[derive(Default)]
struct Loaded {
    bytes: Vec<u8>,
    entries: Vec<Span>,
    /// where the next lookup looks first: a listing asks in name order
    next: usize,
}

impl Loaded {
    fn name(&self, e: &Span) -> &[u8] {
        &self.bytes[e.name.clone()]
    }

    /// The signature and encoded pod of the entry named `name`, if any.
    fn find(&mut self, name: &[u8]) -> Option<(FileSignature, &[u8])> {
        let at = match self.entries.get(self.next) {
            Some(e) if self.name(e) == name => self.next,
            _ => self
                .entries
                .binary_search_by(|e| self.name(e).cmp(name))
                .ok()?,
        };
        self.next = at + 1;
        let e = self.entries.get(at)?;
        Some((e.sig, &self.bytes[e.pod.clone()]))
    }

    fn into_entries(self) -> Vec<Entry> {
        self.entries
            .iter()
            .map(|e| Entry {
                name: self.bytes[e.name.clone()].to_vec(),
                sig: e.sig,
                pod: self.bytes[e.pod.clone()].to_vec(),
            })
            .collect()
    }
}

/// Where `part`, a slice of `whole`, lies in it.
fn span_in(whole: &[u8], part: &[u8]) -> Range<usize> {
    let start = (part.as_ptr() as usize).saturating_sub(whole.as_ptr() as usize);
    start..start + part.len()
}

/// A pod parsed since the last write.
struct Pending {
    sig: FileSignature,
    /// a hash of the bytes it was parsed from
    bytes: u64,
    /// the encoded parsed file
    pod: Vec<u8>,
    /// its ctime was [`SETTLED`] before the read: storable as is
    settled: bool,
}

/// The cache of one static source's dir, for files that parse to `T`.
pub struct ParsedFileCache<T: Cached> {
    path: PathBuf,
    pods_dir: PathBuf,
    /// `None` when the executable could not be looked at: no cache
    stamp: Option<Stamp>,
    /// the file's entries, until the first complete listing
    loaded: Option<Loaded>,
    pending: BTreeMap<OsString, Pending>,
    /// when `pending` last went from empty to not
    pending_since: Option<Instant>,
    /// the newest ctime of a pending entry not settled yet (so that
    /// [`Self::due`], asked at every wake of the poller, costs O(1))
    newest_unsettled: Option<i64>,
    last_write: Option<Instant>,
    /// manifests taken from the file instead of parsed
    hits: usize,
    /// [`Self::listed`] was called
    listed: bool,
    kind: PhantomData<fn() -> T>,
}

/// A hash of a manifest's bytes (what a confirmation compares).
pub fn bytes_hash(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// A file's signature by `stat` through symlinks, as a listing takes it
/// (the same conversion, `read::signature_of`).
fn signature_now(file: &Path) -> Option<FileSignature> {
    let st = nix::sys::stat::stat(file).ok()?;
    Some(file_signature(&signature_of(PathBuf::new(), Some(&st))))
}

fn nanos_since_epoch(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Whether a file with `sig` read at or after `read_at` is storable as is.
fn settled(sig: &FileSignature, read_at: SystemTime) -> bool {
    let margin = i64::try_from(SETTLED.as_nanos()).unwrap_or(i64::MAX);
    sig.4.saturating_add(margin) < nanos_since_epoch(read_at)
}

impl<T: Cached> ParsedFileCache<T> {
    /// The cache at `path` for the files of `pods_dir` on `node`. Reads
    /// nothing yet.
    pub fn new(path: PathBuf, pods_dir: &Path, node: &str) -> Self {
        let stamp = signature_now(Path::new("/proc/self/exe")).map(|exe| Stamp {
            exe,
            pods_dir: pods_dir.to_owned(),
            node: node.to_owned(),
        });
        Self {
            path,
            pods_dir: pods_dir.to_owned(),
            stamp,
            loaded: None,
            pending: BTreeMap::new(),
            pending_since: None,
            newest_unsettled: None,
            last_write: None,
            hits: 0,
            listed: false,
            kind: PhantomData,
        }
    }

    /// The file's entries, or why they cannot be used.
    fn read_stored(&self) -> Result<Loaded, String> {
        let Some(stamp) = &self.stamp else {
            return Err("the running executable cannot be looked at".into());
        };
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::default()),
            Err(e) => return Err(e.to_string()),
        };
        let body = bytes
            .strip_prefix(T::MAGIC.as_slice())
            .filter(|b| b.len() >= 4)
            .ok_or("not a volumed cache of this kind")?;
        let (body, crc) = body.split_at(body.len() - 4);
        let crc = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32c::crc32c(body) != crc {
            return Err("checksum mismatch (a torn write)".into());
        }
        let stored: StoredRef<'_> = bincode::deserialize(body).map_err(|e| e.to_string())?;
        if &stored.stamp != stamp {
            // another binary, dir or node: silently stale, not damaged
            return Ok(Loaded::default());
        }
        let mut entries: Vec<Span> = (stored.entries.iter())
            .map(|e| Span {
                name: span_in(&bytes, e.name),
                sig: e.sig,
                pod: span_in(&bytes, e.pod),
            })
            .collect();
        // written sorted; a stable sort of sorted entries is one pass
        entries.sort_by(|a, b| bytes[a.name.clone()].cmp(&bytes[b.name.clone()]));
        Ok(Loaded {
            bytes,
            entries,
            next: 0,
        })
    }

    /// What `name` parsed to when its file had `sig`, if the cache has it.
    /// The file is read on the first call; after [`Self::listed`], never.
    pub fn lookup(&mut self, name: &OsStr, sig: &FileSignature) -> Option<T> {
        if self.loaded.is_none() {
            let loaded = self.read_stored().unwrap_or_else(|why| {
                tracing::warn!(file = %self.path.display(), why, "parsed-file cache not used: every file is parsed");
                Loaded::default()
            });
            self.loaded = Some(loaded);
        }
        let loaded = self.loaded.as_mut()?;
        let (stored, pod) = loaded.find(name.as_bytes())?;
        if stored != *sig {
            return None;
        }
        let pod = bincode::deserialize(pod).ok()?;
        self.hits += 1;
        Some(pod)
    }

    /// How many manifests were taken from the file instead of parsed.
    pub fn hits(&self) -> usize {
        self.hits
    }

    /// The first complete listing is done: the file's entries are let go.
    pub fn listed(&mut self) {
        self.loaded = Some(Loaded::default());
        self.listed = true;
    }

    /// Whether the first complete listing is done ([`Self::listed`]).
    pub fn was_listed(&self) -> bool {
        self.listed
    }

    /// `pod` was parsed from `name`'s bytes (hashing to `bytes`) in a read
    /// that began at or after `read_at`, with the file's signature `sig`.
    pub fn parsed(
        &mut self,
        name: &OsStr,
        sig: FileSignature,
        bytes: u64,
        pod: &T,
        read_at: SystemTime,
    ) {
        if self.stamp.is_none() {
            return;
        }
        let Ok(encoded) = bincode::serialize(pod) else {
            return;
        };
        if self.pending.is_empty() {
            self.pending_since = Some(Instant::now());
        }
        let settled = settled(&sig, read_at);
        if !settled {
            self.newest_unsettled = self.newest_unsettled.max(Some(sig.4));
        }
        self.pending.insert(
            name.to_owned(),
            Pending {
                sig,
                bytes,
                pod: encoded,
                settled,
            },
        );
    }

    /// When [`Self::write`] has something to do, if ever.
    pub fn due(&self) -> Option<Instant> {
        if self.pending.is_empty() {
            return None;
        }
        let now = Instant::now();
        let wall = nanos_since_epoch(SystemTime::now());
        let margin = i64::try_from(SETTLED.as_nanos()).unwrap_or(i64::MAX);
        // a write waits for every pending file to settle (a mass start's
        // manifests are then written at once), but not past WRITE_EVERY
        // after the first was parsed (a file that never stops changing
        // holds up no other)
        let settles = self.newest_unsettled.map_or(now, |ctime| {
            let ns = ctime.saturating_add(margin).saturating_sub(wall);
            now + Duration::from_nanos(u64::try_from(ns.max(0)).unwrap_or(0))
        });
        let settles = match self.pending_since {
            Some(since) => settles.min(since + WRITE_EVERY),
            None => settles,
        };
        Some(match self.last_write {
            Some(at) => settles.max(at + WRITE_EVERY),
            None => settles,
        })
    }

    /// Confirms the pending entries that settled, merges them into the
    /// file's entries and writes the file; `current(name)` is the hash of
    /// the signature the source last saw for a manifest (`None`: gone), and
    /// only entries matching it are kept. A failure leaves the file as it
    /// was and the entries pending, for the next write ([`Self::due`]: not
    /// before [`WRITE_EVERY`], so a full disk is not retried in a loop).
    pub fn write(&mut self, current: impl Fn(&OsStr) -> Option<u64>) -> Result<(), SourceError> {
        let Some(stamp) = self.stamp.clone() else {
            return Ok(());
        };
        let now = SystemTime::now();
        // each pending entry: stored (settled, or confirmed by a second
        // read), dropped (its file moved on), or kept for a later write
        let mut ready: Vec<(OsString, Pending)> = Vec::new();
        for (name, p) in std::mem::take(&mut self.pending) {
            if current(&name) != Some(file_signature_hash(&p.sig)) {
                continue;
            }
            if !p.settled && !settled(&p.sig, now) {
                self.pending.insert(name, p);
                continue;
            }
            // read again now that a change would move its ctime: kept only
            // if the bytes are the parsed ones and nothing moved
            let file = self.pods_dir.join(&name);
            if p.settled
                || (read_file(&file).is_ok_and(|b| bytes_hash(&b) == p.bytes)
                    && signature_now(&file) == Some(p.sig))
            {
                ready.push((name, p));
            }
        }
        self.newest_unsettled = self
            .pending
            .values()
            .filter(|p| !p.settled)
            .map(|p| p.sig.4)
            .max();
        if self.pending.is_empty() {
            self.pending_since = None;
        }
        if ready.is_empty() {
            // nothing settled (or everything moved): the file stays as is
            return Ok(());
        }
        let mut entries: BTreeMap<Vec<u8>, Entry> = self
            .read_stored()
            .map(Loaded::into_entries)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| current(OsStr::from_bytes(&e.name)) == Some(file_signature_hash(&e.sig)))
            .map(|e| (e.name.clone(), e))
            .collect();
        // what this write adds (name → bytes' hash), pending again if it fails
        let mut added: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for (name, p) in ready {
            let name = name.into_vec();
            added.insert(name.clone(), p.bytes);
            entries.insert(
                name.clone(),
                Entry {
                    name,
                    sig: p.sig,
                    pod: p.pod,
                },
            );
        }
        self.last_write = Some(Instant::now());
        let stored = Stored {
            stamp,
            entries: entries.into_values().collect(),
        };
        let written = self.replace_file(&stored);
        if written.is_err() {
            // kept for the next write, settled or confirmed as they are
            for e in stored.entries {
                if let Some(bytes) = added.remove(&e.name) {
                    let pending = Pending {
                        sig: e.sig,
                        bytes,
                        pod: e.pod,
                        settled: true,
                    };
                    self.pending.insert(OsString::from_vec(e.name), pending);
                }
            }
        }
        if !self.pending.is_empty() {
            self.pending_since = Some(Instant::now());
        }
        written
    }

    /// Writes `stored` to a temp file renamed over the cache. A failure
    /// removes the temp file: cut short by a full disk, it is never read
    /// (only [`FILE_NAME`] is) but holds space the disk lacks.
    fn replace_file(&self, stored: &Stored) -> Result<(), SourceError> {
        let fail = |step, file: &Path| {
            let file = file.to_owned();
            move |cause| SourceError::WriteCache { step, file, cause }
        };
        let body = bincode::serialize(stored)
            .map_err(std::io::Error::other)
            .map_err(fail("encode", &self.path))?;
        let mut bytes = Vec::with_capacity(T::MAGIC.len() + body.len() + 4);
        bytes.extend_from_slice(T::MAGIC);
        bytes.extend_from_slice(&body);
        bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let written = std::fs::write(&tmp, &bytes)
            .map_err(fail("write", &tmp))
            .and_then(|()| {
                std::fs::rename(&tmp, &self.path).map_err(fail("rename into place", &self.path))
            });
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

#[cfg(test)]
#[path = "manifest_cache_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "objects_cache_tests.rs"]
mod objects_tests;
