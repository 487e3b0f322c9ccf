//! The lookups of a [`MountTable`]: by id, by path, under a prefix, by
//! device, and the mounts stacked at one point.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{LineError, MountInfo, MountTable};
use crate::model::{DevId, MountIdentity};

impl MountTable {
    /// Every parsed entry, in table order.
    pub fn entries(&self) -> &[MountInfo] {
        &self.entries
    }

    /// Lines that could not be parsed and were left out.
    pub fn errors(&self) -> &[LineError] {
        &self.errors
    }

    /// Lines that were kept with a part ignored (an unparseable label).
    pub fn warnings(&self) -> &[LineError] {
        &self.warnings
    }

    /// Number of parsed entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no line parsed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry with this mount id.
    pub fn by_id(&self, mount_id: u32) -> Option<&MountInfo> {
        self.entries.iter().find(|m| m.mount_id == mount_id)
    }

    /// Every mount at exactly `path`, bottom first (table order). Several
    /// mounts can be stacked on one path.
    pub fn at(&self, path: &Path) -> impl Iterator<Item = &MountInfo> {
        self.stack_at(path).iter().map(|&i| &self.entries[i])
    }

    /// Indices (into `entries`) of the mounts at exactly `path`, table order.
    fn stack_at(&self, path: &Path) -> &[usize] {
        let key = normalise(path);
        let lo = self.by_path.partition_point(|&i| self.key(i) < key);
        let len = self.by_path[lo..].partition_point(|&i| self.key(i) == key);
        &self.by_path[lo..lo + len]
    }

    /// The visible mount at `path`: of the mounts stacked there, the one no
    /// other mount at that path sits on (the last in table order if the
    /// parent links do not decide it).
    pub fn top_at(&self, path: &Path) -> Option<&MountInfo> {
        self.top_of(self.stack_at(path))
    }

    /// The identity `path` shows as a bind source: the visible mount holding
    /// it (longest prefix), with the root extended by the path below that
    /// mount point. What a bind of a directory (a local PV that is one)
    /// must show at its target.
    pub fn identity_at(&self, path: &Path) -> Option<MountIdentity> {
        path.ancestors().find_map(|a| {
            let m = self.top_at(a)?;
            let mut id = m.identity();
            let rel = path.strip_prefix(a).ok()?;
            if !rel.as_os_str().is_empty() {
                id.root = id.root.join(rel).into();
            }
            Some(id)
        })
    }

    /// The top of one stack of indices (see [`MountTable::top_at`]).
    fn top_of(&self, stack: &[usize]) -> Option<&MountInfo> {
        let m = |i: usize| &self.entries[i];
        if let [only] = stack {
            return Some(m(*only));
        }
        stack
            .iter()
            .rev()
            .map(|&i| m(i))
            .find(|top| !stack.iter().any(|&o| m(o).parent_id == top.mount_id))
            .or_else(|| stack.last().map(|&i| m(i)))
    }

    /// Every distinct mount point strictly below `prefix` (component-wise),
    /// sorted by mount point, each once as its [`MountStack`]: what
    /// [`MountTable::under`] yields, grouped by mount point, without a
    /// lookup per mount point.
    pub fn stacks_under(&self, prefix: &Path) -> impl Iterator<Item = MountStack<'_>> {
        let range = self.under_range(prefix);
        let mut rest = &self.by_path[range];
        std::iter::from_fn(move || {
            let (&first, _) = rest.split_first()?;
            let key = self.key(first);
            let len = rest.iter().take_while(|&&i| self.key(i) == key).count();
            let (stack, tail) = rest.split_at(len);
            rest = tail;
            Some(MountStack { table: self, stack })
        })
    }

    /// Whether something is mounted at exactly `path`.
    pub fn is_mount_point(&self, path: &Path) -> bool {
        self.at(path).next().is_some()
    }

    /// Every mount strictly below `prefix` (component-wise: `/a/bc` is not
    /// below `/a/b`), sorted by mount point, table order for ties.
    pub fn under(&self, prefix: &Path) -> impl Iterator<Item = &MountInfo> {
        self.by_path[self.under_range(prefix)]
            .iter()
            .map(|&i| &self.entries[i])
    }

    /// The range of `by_path` strictly below `prefix`.
    fn under_range(&self, prefix: &Path) -> std::ops::Range<usize> {
        let mut key = normalise(prefix).to_vec();
        if key.last() != Some(&b'/') {
            key.push(b'/');
        }
        let lo = self
            .by_path
            .partition_point(|&i| self.key(i) < key.as_slice());
        let len = self.by_path[lo..].partition_point(|&i| self.key(i).starts_with(&key));
        // `prefix/` itself (only for `/`) is not strictly below
        let skip = self.by_path[lo..lo + len]
            .iter()
            .take_while(|&&i| self.key(i).len() <= key.len())
            .count();
        lo + skip..lo + len
    }

    /// Every mount of the filesystem with this device number.
    pub fn by_dev(&self, dev: DevId) -> impl Iterator<Item = &MountInfo> {
        self.entries.iter().filter(move |m| m.dev == dev)
    }

    fn key(&self, i: usize) -> &[u8] {
        self.entries[i].mount_point.as_os_str().as_bytes()
    }
}

/// The bytes of a path with trailing slashes removed (except for `/`).
fn normalise(path: &Path) -> &[u8] {
    let mut b = path.as_os_str().as_bytes();
    while b.len() > 1
        && let Some(rest) = b.strip_suffix(b"/")
    {
        b = rest;
    }
    b
}

/// The mounts stacked at one mount point, bottom first (table order), as
/// [`MountTable::stacks_under`] yields them.
#[derive(Debug, Clone, Copy)]
pub struct MountStack<'a> {
    table: &'a MountTable,
    /// never empty
    stack: &'a [usize],
}

impl<'a> MountStack<'a> {
    /// The visible mount, as [`MountTable::top_at`] picks it.
    pub fn top(&self) -> &'a MountInfo {
        self.table
            .top_of(self.stack)
            .expect("a stack is never empty")
    }

    /// How many mounts are stacked here (1 normally).
    pub fn len(&self) -> usize {
        self.stack.len()
    }

    /// Never: a stack holds at least one mount.
    pub fn is_empty(&self) -> bool {
        self.stack.is_empty()
    }

    /// The mount point.
    pub fn mount_point(&self) -> &'a Path {
        &self.top().mount_point
    }
}
