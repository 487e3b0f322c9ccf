//! Hashes the sources keep between polls: of a listing's or a manifest's
//! signature, and a pod's fingerprint.

use std::ffi::OsStr;
use std::path::Path;

use super::DesiredPod;
use super::read::EntrySignature;

/// One file's part of a listing signature: (device, inode, size, mtime,
/// ctime).
pub(super) type FileSignature = (u64, u64, u64, i64, i64);

pub(super) fn file_signature(e: &EntrySignature) -> FileSignature {
    (e.1, e.2, e.3, e.4, e.5)
}

/// A hash of one file's signature, as `last_good` keeps it (equal
/// signatures, equal hashes).
pub(super) fn file_signature_hash(sig: &FileSignature) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    sig.hash(&mut h);
    h.finish()
}

/// The `last_good` key of a manifest: its file name (a path without one,
/// which a listing never yields, is keyed by the whole path).
pub(super) fn manifest_key(file: &Path) -> &OsStr {
    file.file_name().unwrap_or(file.as_os_str())
}

/// A hash of a listing's signature (equal signatures, equal hashes). A
/// path counts by its bytes: a listing spells its paths alike, and
/// `Path`'s own hash parses their components.
pub(super) fn signature_hash(sig: &[EntrySignature]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    h.write_usize(sig.len());
    for (path, dev, ino, size, mtime, ctime) in sig {
        path.as_os_str().as_encoded_bytes().hash(&mut h);
        (dev, ino, size, mtime, ctime).hash(&mut h);
    }
    h.finish()
}

/// A fingerprint of everything a pod tells the DSW (its bincode form
/// hashed, serde's derive, so every field counts, new ones included):
/// equal pods, equal fingerprints. Every map in a pod is ordered, so equal
/// pods serialize alike. Encoded first and hashed at once: the hasher
/// takes one long write for less than many short ones.
pub fn fingerprint(pod: &DesiredPod) -> u64 {
    use std::hash::Hasher;
    let mut bytes = Vec::with_capacity(512);
    // Writing into a Vec cannot fail, nor can these types' serializers.
    let _ = bincode::serialize_into(&mut bytes, pod);
    let mut h = std::hash::DefaultHasher::new();
    h.write(&bytes);
    h.finish()
}
