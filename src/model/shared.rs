//! Shared strings and paths (counted, behind a thin pointer): what several
//! states hold per volume is one allocation, and a clone is a count.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use arcstr::ArcStr;
use serde::{Deserialize, Serialize};
use triomphe::ThinArc;

/// A name shared by everything that holds it (a thin `ArcStr`, 8 bytes where
/// an `Arc<str>` is 16; an empty one allocates nothing): a volume's spec
/// name and a pod's outer volume name live in the DSW, the jobs, the
/// journal's state and the ASW, and a clone is a count. Reads as a `str`
/// (`Deref`); serialises, and shows in `Debug` and `Display`, as one.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedStr(ArcStr);

impl SharedStr {
    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `tmpfs`, one allocation for the whole process: the fs type of every
    /// memory emptyDir's parameters.
    pub fn tmpfs() -> Self {
        Self::fs_type(super::TMPFS)
    }

    /// A filesystem type, shared: the journal's state and the ASW keep one
    /// per mount, and a node's mounts have a handful of types. The types
    /// listed are one allocation each for the process; any other is its own.
    pub fn fs_type(name: &str) -> Self {
        const COMMON: [&str; 8] = [
            super::TMPFS,
            "ext4",
            "xfs",
            "btrfs",
            "ext3",
            "nfs",
            "nfs4",
            "overlay",
        ];
        static SHARED: std::sync::LazyLock<[SharedStr; 8]> =
            std::sync::LazyLock::new(|| COMMON.map(SharedStr::from));
        match COMMON.iter().position(|c| *c == name) {
            Some(i) => SHARED[i].clone(),
            None => SharedStr::from(name),
        }
    }
}

impl std::ops::Deref for SharedStr {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsRef<Path> for SharedStr {
    fn as_ref(&self) -> &Path {
        Path::new(&*self.0)
    }
}

impl std::borrow::Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for SharedStr {
    fn from(s: String) -> Self {
        Self(s.into())
    }
}

impl From<&str> for SharedStr {
    fn from(s: &str) -> Self {
        Self(s.into())
    }
}

impl From<&String> for SharedStr {
    fn from(s: &String) -> Self {
        Self(s.as_str().into())
    }
}

impl From<SharedStr> for String {
    fn from(s: SharedStr) -> Self {
        s.0.to_string()
    }
}

impl PartialEq<str> for SharedStr {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for SharedStr {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for SharedStr {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Serialize for SharedStr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedStr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Self::from)
    }
}

/// A path shared by everything that holds it (its bytes in a triomphe
/// `ThinArc`, 8 bytes where an `Arc<Path>` is 16): a pod target's path
/// lives in the job's parameters, the journal's state and the ASW, and a
/// clone is a count. Reads as a [`Path`] (`Deref`); compares, hashes,
/// serialises and shows in `Debug` as one.
#[derive(Clone)]
pub struct SharedPath(ThinArc<(), u8>);

impl SharedPath {
    /// `path`, with `/` (the root of every whole-filesystem mount) one
    /// allocation for the process.
    pub fn fs_root(path: &Path) -> Self {
        static ROOT: std::sync::LazyLock<SharedPath> =
            std::sync::LazyLock::new(|| SharedPath::from(Path::new("/")));
        match path == Path::new("/") {
            true => ROOT.clone(),
            false => SharedPath::from(path),
        }
    }
}

impl std::ops::Deref for SharedPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        Path::new(OsStr::from_bytes(&self.0.slice))
    }
}

impl AsRef<Path> for SharedPath {
    fn as_ref(&self) -> &Path {
        self
    }
}

impl std::borrow::Borrow<Path> for SharedPath {
    fn borrow(&self) -> &Path {
        self
    }
}

// As a `Path` does (component-wise), so that a map keyed by it can be asked
// with a `&Path` (`Borrow`).
impl PartialEq for SharedPath {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SharedPath {}

impl PartialOrd for SharedPath {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for SharedPath {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}

impl std::hash::Hash for SharedPath {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (**self).hash(h)
    }
}

impl fmt::Debug for SharedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl From<PathBuf> for SharedPath {
    fn from(p: PathBuf) -> Self {
        p.as_path().into()
    }
}

impl From<&Path> for SharedPath {
    fn from(p: &Path) -> Self {
        Self(ThinArc::from_header_and_slice((), p.as_os_str().as_bytes()))
    }
}

impl From<String> for SharedPath {
    fn from(s: String) -> Self {
        PathBuf::from(s).into()
    }
}

impl From<&str> for SharedPath {
    fn from(s: &str) -> Self {
        Path::new(s).into()
    }
}

impl Serialize for SharedPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for SharedPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PathBuf::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_fs_types_and_the_fs_root_are_one_allocation_each() {
        let same = |a: &str, b: &str| std::ptr::eq(a.as_ptr(), b.as_ptr());
        for t in ["tmpfs", "ext4", "xfs", "nfs4"] {
            let (a, b) = (SharedStr::fs_type(t), SharedStr::fs_type(t));
            assert_eq!(a, t);
            assert!(same(&a, &b), "{t} allocated twice");
        }
        assert!(same(&SharedStr::fs_type("tmpfs"), &SharedStr::tmpfs()));
        let (a, b) = (SharedStr::fs_type("zfs"), SharedStr::fs_type("zfs"));
        assert_eq!((a.as_str(), b.as_str()), ("zfs", "zfs"));
        assert!(!same(&a, &b), "an uncommon type is its own");

        let (a, b) = (
            SharedPath::fs_root(Path::new("/")),
            SharedPath::fs_root(Path::new("/")),
        );
        let bytes = |p: &SharedPath| p.as_os_str().as_encoded_bytes().as_ptr();
        assert_eq!(&*a, Path::new("/"));
        assert_eq!(bytes(&a), bytes(&b), "/ allocated twice");
        let sub = SharedPath::fs_root(Path::new("/sub"));
        assert_eq!(&*sub, Path::new("/sub"));
    }

    /// Thin: 8 bytes, and an `Option` of one too. A path reads back byte
    /// for byte (UTF-8 or not), and compares, orders and hashes as a `Path`
    /// does (component-wise), so a map keyed by shared paths answers a
    /// `&Path`.
    #[test]
    fn shared_names_and_paths_are_thin_and_a_path_behaves_as_one() {
        use crate::model::{PodUid, SeLinuxContext, UniqueVolumeName};
        use std::collections::{BTreeSet, HashSet};
        assert_eq!(size_of::<Option<SharedStr>>(), 8);
        assert_eq!(size_of::<Option<SharedPath>>(), 8);
        assert_eq!(size_of::<Option<PodUid>>(), 8);
        assert_eq!(size_of::<Option<UniqueVolumeName>>(), 8);
        assert_eq!(size_of::<Option<SeLinuxContext>>(), 8);

        let odd = Path::new(OsStr::from_bytes(b"/var/lib/kubelet/pods/p/\xff\xfe"));
        assert_eq!(
            SharedPath::from(odd).as_os_str().as_bytes(),
            odd.as_os_str().as_bytes()
        );
        assert!(SharedPath::from("").as_os_str().is_empty());

        let (a, b) = (SharedPath::from("/a//b/"), SharedPath::from("/a/b"));
        assert_eq!(a, b, "component-wise, as Path");
        assert_eq!(a.as_os_str().as_bytes(), b"/a//b/", "bytes as given");
        let hashed: HashSet<SharedPath> = [a.clone()].into();
        assert!(hashed.contains(Path::new("/a/b")));
        // by bytes `/a-b` sorts before `/a/b` ('-' < '/'); by components
        // `a` < `a-b`, so `/a/b` comes first
        let sorted: BTreeSet<SharedPath> =
            ["/b", "/a-b", "/a/b", "/a"].map(SharedPath::from).into();
        let order: Vec<&Path> = sorted.iter().map(|p| &**p).collect();
        let want = ["/a", "/a/b", "/a-b", "/b"].map(Path::new);
        assert_eq!(order, want);
        assert!(sorted.contains(Path::new("/a//b")));
    }
}
