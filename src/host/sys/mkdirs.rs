//! `mkdir -p`, by path and beneath a base: the leaf first and its parents
//! only on `ENOENT`, as `mkdir -p` does.

use std::path::Path;

use super::{Beneath, Call, Errno, FileKind, Sys, SysError};

/// Creates `path` and any missing parents with `mode` (like `mkdir -p`,
/// following symlinks like it); an existing directory is fine, anything
/// else there is `ENOTDIR`.
///
/// `mkdir` comes first and the parents only on `ENOENT`, as `mkdir -p`
/// does: a target whose parent exists (the common case: a pod's second
/// volume, a marker beside its volume) costs one `mkdir`, where asking
/// `stat` first cost a `stat` per missing level and one more for the
/// parent that exists. Only an existing entry costs a `stat`, to tell a
/// directory (or a symlink to one) from anything else.
pub fn mkdir_all(sys: &dyn Sys, path: &Path, mode: u32) -> Result<(), SysError> {
    leaf_first(
        path,
        &|p| sys.mkdir(p, mode),
        &|p| p.parent().filter(|p| !p.as_os_str().is_empty()),
        &|p| existing_dir(sys, p),
    )
}

/// Like [`mkdir_all`] for `at.rel` beneath `at.base`, with no symlink
/// followed anywhere below the base: every level is made with
/// [`Sys::mkdir_beneath`], and an existing entry must be a directory
/// itself (a symlink there, even to a directory, is `ELOOP`).
///
/// [`Sys::mkdirs_beneath`] does it: by default with one
/// [`Sys::mkdir_beneath`] per level (a fake's),
/// [`LinuxSys`](super::LinuxSys) from one handle on the deepest level
/// that exists.
pub fn mkdir_all_beneath(sys: &dyn Sys, at: Beneath<'_>, mode: u32) -> Result<(), SysError> {
    sys.mkdirs_beneath(at, mode)
}

/// [`mkdir_all_beneath`] by [`Sys::mkdir_beneath`] and
/// [`Sys::stat_beneath`] calls, in `mkdir -p`'s order.
pub(super) fn mkdirs_by_calls<S: Sys + ?Sized>(
    sys: &S,
    at: Beneath<'_>,
    mode: u32,
) -> Result<(), SysError> {
    leaf_first(
        at,
        &|b| sys.mkdir_beneath(b, mode),
        &|b| b.parent().filter(|b| !b.rel.as_os_str().is_empty()),
        &|b| {
            let full = b.full();
            match sys.stat_beneath(b)?.kind {
                FileKind::Dir => Ok(()),
                FileKind::Symlink => Err(SysError::call(Call::Mkdir, &full, Errno::ELOOP)),
                _ => Err(SysError::call(Call::Mkdir, &full, Errno::ENOTDIR)),
            }
        },
    )
}

/// `mkdir -p`'s order: the leaf first, its parents only on `ENOENT`, and
/// an existing entry checked by `existing`.
fn leaf_first<P: Copy>(
    p: P,
    mkdir: &dyn Fn(P) -> Result<(), SysError>,
    parent: &dyn Fn(P) -> Option<P>,
    existing: &dyn Fn(P) -> Result<(), SysError>,
) -> Result<(), SysError> {
    match mkdir(p) {
        Err(e) if e.errno() == Some(Errno::ENOENT) => {
            if let Some(up) = parent(p) {
                leaf_first(up, mkdir, parent, existing)?;
            }
            match mkdir(p) {
                // created by someone else in between
                Err(e) if e.errno() == Some(Errno::EEXIST) => existing(p),
                other => other,
            }
        }
        Err(e) if e.errno() == Some(Errno::EEXIST) => existing(p),
        other => other,
    }
}

/// `Ok` when `path`, which exists, is a directory or a symlink to one.
fn existing_dir(sys: &dyn Sys, path: &Path) -> Result<(), SysError> {
    match sys.stat(path, true) {
        Ok(st) if st.kind == FileKind::Dir => Ok(()),
        Ok(_) => Err(SysError::call(Call::Mkdir, path, Errno::ENOTDIR)),
        Err(e) => Err(e),
    }
}
