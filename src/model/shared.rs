//! Shared (`Arc`) strings and paths: what several states hold per volume
//! is one allocation, and a clone is a count.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A name shared by everything that holds it (`Arc<str>`): a volume's spec
/// name and a pod's outer volume name live in the DSW, the jobs, the
/// journal's state and the ASW, and a clone is a count. Reads as a `str`
/// (`Deref`); serialises, and shows in `Debug` and `Display`, as one.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedStr(Arc<str>);

impl SharedStr {
    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `tmpfs`, one allocation for the whole process: the fs type of every
    /// memory emptyDir's parameters.
    pub fn tmpfs() -> Self {
        static TMPFS: std::sync::LazyLock<SharedStr> =
            std::sync::LazyLock::new(|| SharedStr::from(super::TMPFS));
        TMPFS.clone()
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

/// A path shared by everything that holds it (`Arc<Path>`): a pod target's
/// path lives in the job's parameters, the journal's state and the ASW, and
/// a clone is a count. Reads as a [`Path`] (`Deref`); serialises, and shows
/// in `Debug`, as one.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedPath(Arc<Path>);

impl std::ops::Deref for SharedPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for SharedPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl std::borrow::Borrow<Path> for SharedPath {
    fn borrow(&self) -> &Path {
        &self.0
    }
}

impl fmt::Debug for SharedPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<PathBuf> for SharedPath {
    fn from(p: PathBuf) -> Self {
        Self(p.into())
    }
}

impl From<&Path> for SharedPath {
    fn from(p: &Path) -> Self {
        Self(p.into())
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
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for SharedPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        PathBuf::deserialize(d).map(Self::from)
    }
}
