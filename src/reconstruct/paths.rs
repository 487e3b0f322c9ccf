//! Matching targets by path: path bytes for hashing, their plain spelling,
//! and the host's observations keyed by it.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use fxhash::FxHashMap;

use super::{HostObservation, PathMap};

/// A path's bytes, for hashing: host-found paths are spelt plainly (the
/// mount table's, or joined from it), so equal paths have equal bytes.
pub(super) fn path_bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_encoded_bytes()
}

/// The host target at `path`, equal as paths are equal (`//`, `/./` and a
/// trailing `/` do not count): by bytes, and for a path spelt otherwise, by
/// its plain spelling.
pub(super) fn by_path(map: &FxHashMap<&[u8], usize>, path: &Path) -> Option<usize> {
    let b = path_bytes(path);
    if let Some(i) = map.get(b) {
        return Some(*i);
    }
    if is_plain(b) {
        return None;
    }
    map.get(plain_bytes(path).as_ref()).copied()
}

/// Whether `b` is a path spelt plainly: no empty or `.` component, no
/// trailing `/` (a lone `/` is plain). Such a spelling is the one
/// [`Path::components`] gives back, so two plain paths are equal as paths
/// exactly when their bytes are.
pub(super) fn is_plain(b: &[u8]) -> bool {
    let n = b.len();
    if n > 1 && b[n - 1] == b'/' {
        return false;
    }
    let mut i = 0;
    while let Some(off) = b
        .get(i..)
        .and_then(|rest| rest.iter().position(|&c| c == b'/'))
    {
        let after = i + off + 1;
        match (b.get(after), b.get(after + 1)) {
            (Some(b'/'), _) => return false,
            (Some(b'.'), None | Some(b'/')) => return false,
            _ => {}
        }
        i = after;
    }
    true
}

/// A path's bytes in its plain spelling (see [`is_plain`]).
pub(super) fn plain_bytes(path: &Path) -> Cow<'_, [u8]> {
    let b = path_bytes(path);
    if is_plain(b) {
        return Cow::Borrowed(b);
    }
    let respelt: PathBuf = path.components().collect();
    Cow::Owned(respelt.into_os_string().into_encoded_bytes())
}

/// [`MergeInput::observe`] keyed by plain path bytes: a lookup hashes the
/// bytes once, where `Path`'s hash walks components — the same answers,
/// as paths are equal exactly when their plain spellings are.
pub(super) struct ObserveByBytes<'i> {
    map: FxHashMap<Cow<'i, [u8]>, &'i HostObservation>,
}

impl<'i> ObserveByBytes<'i> {
    pub(super) fn new(observe: &'i PathMap<HostObservation>) -> Self {
        let map = observe
            .iter()
            .map(|(p, seen)| (plain_bytes(p), seen))
            .collect();
        ObserveByBytes { map }
    }

    pub(super) fn get(&self, path: &Path) -> Option<&'i HostObservation> {
        if self.map.is_empty() {
            return None;
        }
        let b = path_bytes(path);
        if let Some(seen) = self.map.get(b) {
            return Some(*seen);
        }
        if is_plain(b) {
            return None;
        }
        self.map.get(plain_bytes(path).as_ref()).copied()
    }
}
