//! [`RecordingSys`]'s symlinks, rename-over, group changes and dir handles
//! (the payload writer's calls): a symlink's target is kept as its content.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::host::fake_host::create;
use crate::host::sys::{Beneath, Call, DirHandle, Errno, FileKind, SysCall, SysError};

use super::RecordingSys;
use super::tree::parent_beneath;

/// Recorded as the [`SysCall::OpenDir`]; a path-only handle, so the `*_in`
/// calls through it are recorded as their `*_beneath` calls with the
/// handle's dir as their base.
pub(super) fn open_dir(sys: &RecordingSys, at: Beneath<'_>) -> Result<DirHandle, SysError> {
    let path = at.full();
    let st = sys.enter(SysCall::OpenDir { path: path.clone() }, &path)?;
    parent_beneath(&st, Call::OpenDir, at, &path)?;
    let err = |e| SysError::call(Call::OpenDir, &path, e);
    match st.files.get(&path) {
        Some(FileKind::Dir) => Ok(DirHandle::by_path(path.clone())),
        Some(FileKind::Symlink) => Err(err(Errno::ELOOP)),
        Some(_) => Err(err(Errno::ENOTDIR)),
        None => Err(err(Errno::ENOENT)),
    }
}

/// Recorded as the [`SysCall::Replace`]; a file or symlink at the
/// destination goes (a directory there is `EISDIR`, kept simple).
pub(super) fn replace(
    sys: &RecordingSys,
    at: Beneath<'_>,
    to_name: &OsStr,
) -> Result<(), SysError> {
    let from = &at.full();
    let to = &from.with_file_name(to_name);
    let call = SysCall::Replace {
        from: from.clone(),
        to: to.clone(),
    };
    let mut st = sys.enter(call, from)?;
    let err = |e| SysError::call(Call::Replace, from, e);
    parent_beneath(&st, Call::Replace, at, from)?;
    let Some(kind) = st.files.get(from).copied() else {
        return Err(err(Errno::ENOENT));
    };
    match st.files.get(to) {
        Some(FileKind::Dir) => return Err(err(Errno::EISDIR)),
        Some(_) => {
            st.files.remove(to);
            st.contents.remove(to);
        }
        None => {}
    }
    if kind == FileKind::Dir {
        return Err(err(Errno::EISDIR));
    }
    st.files.remove(from);
    st.files.insert(to.clone(), kind);
    if let Some(c) = st.contents.remove(from) {
        st.contents.insert(to.clone(), c);
    }
    Ok(())
}

/// Recorded as the [`SysCall::Symlink`]; the target is kept as the
/// link's content.
pub(super) fn symlink(sys: &RecordingSys, at: Beneath<'_>, target: &Path) -> Result<(), SysError> {
    let path = &at.full();
    let call = SysCall::Symlink {
        path: path.clone(),
        target: target.to_owned(),
    };
    let mut st = sys.enter(call, path)?;
    parent_beneath(&st, Call::Symlink, at, path)?;
    create(&mut st, Call::Symlink, path, FileKind::Symlink)?;
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str()).to_vec();
    st.contents.insert(path.clone(), bytes);
    Ok(())
}

pub(super) fn read_link(sys: &RecordingSys, at: Beneath<'_>) -> Result<PathBuf, SysError> {
    let path = &at.full();
    let st = sys.enter(SysCall::ReadLink { path: path.clone() }, path)?;
    parent_beneath(&st, Call::ReadLink, at, path)?;
    match st.files.get(path) {
        None => Err(SysError::call(Call::ReadLink, path, Errno::ENOENT)),
        Some(FileKind::Symlink) => {
            let bytes = st.contents.get(path).cloned().unwrap_or_default();
            Ok(PathBuf::from(
                <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&bytes),
            ))
        }
        Some(_) => Err(SysError::call(Call::ReadLink, path, Errno::EINVAL)),
    }
}

pub(super) fn chgrp(sys: &RecordingSys, at: Beneath<'_>, gid: u32) -> Result<(), SysError> {
    let path = &at.full();
    let st = sys.enter(
        SysCall::Chgrp {
            path: path.clone(),
            gid,
        },
        path,
    )?;
    parent_beneath(&st, Call::Chgrp, at, path)?;
    match st.files.contains_key(path) {
        true => Ok(()),
        false => Err(SysError::call(Call::Chgrp, path, Errno::ENOENT)),
    }
}

#[cfg(test)]
mod tests {
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::{Beneath, Errno, FileKind, Sys};
    use std::path::Path;

    #[test]
    fn a_link_reads_back_and_is_replaced_by_rename() {
        let sys = RecordingSys::new();
        sys.add("/r/v", FileKind::Dir);
        let at = |rel: &'static str| Beneath {
            base: Path::new("/r"),
            rel: Path::new(rel),
        };
        sys.symlink_beneath(at("v/..data"), Path::new("..old"))
            .unwrap();
        sys.symlink_beneath(at("v/..data_tmp"), Path::new("..new"))
            .unwrap();
        let taken = sys.symlink_beneath(at("v/..data"), Path::new("x"));
        assert_eq!(taken.unwrap_err().errno(), Some(Errno::EEXIST));
        sys.replace_beneath(at("v/..data_tmp"), "..data".as_ref())
            .unwrap();
        assert_eq!(
            sys.read_link_beneath(at("v/..data")).unwrap(),
            Path::new("..new")
        );
        assert!(!sys.exists("/r/v/..data_tmp"));
        let not_a_link = sys.read_link_beneath(at("v"));
        assert_eq!(not_a_link.unwrap_err().errno(), Some(Errno::EINVAL));
        sys.chgrp_beneath(at("v/..data"), 7).unwrap();
        let gone = sys.chgrp_beneath(at("v/gone"), 7);
        assert_eq!(gone.unwrap_err().errno(), Some(Errno::ENOENT));
    }
}
