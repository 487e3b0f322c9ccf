//! `kubernetes.io/host-path`: a `none` target — nothing is mounted and
//! nothing on disk is tracked; the container runtime binds the path itself.
//!
//! SetUp does the kubelet's `type` checks (`pkg/volume/hostpath`), following
//! symlinks as the kubelet's `os.Stat` does:
//! - `DirectoryOrCreate`: creates the directory and missing parents with
//!   mode 0755 if nothing is there; otherwise it must be a directory.
//! - `FileOrCreate`: creates an empty file with mode 0644 (not its parent,
//!   as documented upstream) if nothing is there; otherwise it must be a file.
//! - `Directory`, `File`, `Socket`, `CharDevice`, `BlockDevice`: must exist
//!   with that type.
//! - unset: no check.
//!
//! TearDown does nothing: volumed never deletes a host path.

use std::path::Path;

use crate::host::sys::{Errno, FileKind, Sys, mkdir_all};
use crate::journal::Permit;
use crate::model::{HostPathType, Operation, PluginName, TargetParams, VolumeSpec};
use crate::plugins::{Action, Op, Outcome, PluginError, PluginResult, VolumePlugin};

/// The hostPath plugin.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostPathPlugin;

fn expected(kind: FileKind) -> &'static str {
    match kind {
        FileKind::Dir => "directory",
        FileKind::File => "file",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "character device",
        FileKind::BlockDevice => "block device",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
    }
}

/// The file type at `path` (following symlinks), `None` when nothing is there.
fn kind_at(op: &Op<'_>, path: &Path) -> Result<Option<FileKind>, PluginError> {
    match op.sys.stat(path, true) {
        Ok(st) => Ok(Some(st.kind)),
        Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(None),
        Err(e) => Err(op.sys_err(e, false)),
    }
}

fn check(op: &Op<'_>, path: &Path, want: FileKind) -> Result<Action, PluginError> {
    match kind_at(op, path)? {
        Some(k) if k == want => Ok(Action::AlreadyInPlace),
        _ => Err(op.wrong_type(path, expected(want))),
    }
}

impl VolumePlugin for HostPathPlugin {
    fn name(&self) -> PluginName {
        PluginName::HostPath
    }

    fn setup(
        &self,
        _permit: &Permit,
        spec: &VolumeSpec,
        params: &TargetParams,
        sys: &dyn Sys,
    ) -> PluginResult {
        let mut op = Op::new(sys, Operation::SetUp, params);
        let VolumeSpec::HostPath {
            path,
            host_path_type,
        } = spec
        else {
            return Err(op.bad_spec(self.name(), "not a hostPath"));
        };
        let action = match host_path_type {
            HostPathType::Unset => Action::AlreadyInPlace,
            HostPathType::Directory => check(&op, path, FileKind::Dir)?,
            HostPathType::File => check(&op, path, FileKind::File)?,
            HostPathType::Socket => check(&op, path, FileKind::Socket)?,
            HostPathType::CharDevice => check(&op, path, FileKind::CharDevice)?,
            HostPathType::BlockDevice => check(&op, path, FileKind::BlockDevice)?,
            HostPathType::DirectoryOrCreate => match kind_at(&op, path)? {
                None => {
                    op.act(mkdir_all(sys, path, 0o755))?;
                    Action::Performed
                }
                Some(_) => check(&op, path, FileKind::Dir)?,
            },
            HostPathType::FileOrCreate => match kind_at(&op, path)? {
                None => match sys.create_file(path, 0o644) {
                    // Created by someone else in between: check what it is.
                    Err(e) if e.errno() == Some(Errno::EEXIST) => check(&op, path, FileKind::File)?,
                    r => {
                        op.act(r)?;
                        Action::Performed
                    }
                },
                Some(_) => check(&op, path, FileKind::File)?,
            },
        };
        Ok(Outcome::of(action))
    }

    fn teardown(&self, _permit: &Permit, _params: &TargetParams, _sys: &dyn Sys) -> PluginResult {
        Ok(Outcome::of(Action::AlreadyInPlace))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::host::recording_sys::{RecordingSys, SysCall};
    use crate::host::sys::Call;
    use crate::model::{PodUid, TargetKind, TargetRef, UniqueVolumeName};
    use crate::plugins::Certainty;

    fn params() -> TargetParams {
        let pod = PodUid::new("pod1").unwrap();
        TargetParams::at(
            UniqueVolumeName::per_pod(PluginName::HostPath, &pod, "h"),
            PluginName::HostPath,
            "h".into(),
            TargetRef::Pod(pod),
            TargetKind::None,
            None,
        )
    }

    fn spec(path: &str, t: HostPathType) -> VolumeSpec {
        VolumeSpec::HostPath {
            path: PathBuf::from(path).into(),
            host_path_type: t,
        }
    }

    #[test]
    fn directory_or_create_creates_with_0755_and_then_is_in_place() {
        let sys = RecordingSys::new();
        sys.add("/data", FileKind::Dir);
        let s = spec("/data/a/b", HostPathType::DirectoryOrCreate);
        let out = HostPathPlugin
            .setup(&Permit::JournalOff, &s, &params(), &sys)
            .unwrap();
        assert_eq!(out.action, Action::Performed);
        // as `mkdir -p`: the leaf first (ENOENT: `/data/a` is missing),
        // then each missing level downwards
        assert_eq!(
            sys.mutations(),
            vec![
                SysCall::Mkdir {
                    path: "/data/a/b".into(),
                    mode: 0o755
                },
                SysCall::Mkdir {
                    path: "/data/a".into(),
                    mode: 0o755
                },
                SysCall::Mkdir {
                    path: "/data/a/b".into(),
                    mode: 0o755
                },
            ]
        );
        sys.clear_calls();
        let out = HostPathPlugin
            .setup(&Permit::JournalOff, &s, &params(), &sys)
            .unwrap();
        assert_eq!(out.action, Action::AlreadyInPlace);
        assert!(sys.mutations().is_empty());
    }

    #[test]
    fn file_or_create_creates_0644_but_not_the_parent() {
        let sys = RecordingSys::new();
        sys.add("/etc", FileKind::Dir);
        let out = HostPathPlugin
            .setup(
                &Permit::JournalOff,
                &spec("/etc/f", HostPathType::FileOrCreate),
                &params(),
                &sys,
            )
            .unwrap();
        assert_eq!(out.action, Action::Performed);
        assert_eq!(
            sys.mutations(),
            vec![SysCall::CreateFile {
                path: "/etc/f".into(),
                mode: 0o644
            }]
        );
        let e = HostPathPlugin
            .setup(
                &Permit::JournalOff,
                &spec("/nope/f", HostPathType::FileOrCreate),
                &params(),
                &sys,
            )
            .unwrap_err();
        assert_eq!(e.sys_error().map(|e| e.kind()), Some(Call::CreateFile));
        assert_eq!(e.certainty(), Certainty::Final);
    }

    #[test]
    fn type_checks_refuse_the_wrong_type() {
        let sys = RecordingSys::new();
        sys.add("/run/s", FileKind::Socket);
        sys.add("/dev/sda", FileKind::BlockDevice);
        let p = params();
        let ok = |s| {
            HostPathPlugin
                .setup(&Permit::JournalOff, &s, &p, &sys)
                .map(|o| o.action)
                .ok()
        };
        assert_eq!(
            ok(spec("/run/s", HostPathType::Socket)),
            Some(Action::AlreadyInPlace)
        );
        assert_eq!(
            ok(spec("/dev/sda", HostPathType::BlockDevice)),
            Some(Action::AlreadyInPlace)
        );
        assert_eq!(ok(spec("/dev/sda", HostPathType::CharDevice)), None);
        assert_eq!(ok(spec("/run/s", HostPathType::Directory)), None);
        assert_eq!(ok(spec("/missing", HostPathType::File)), None);
        assert_eq!(
            ok(spec("/missing", HostPathType::Unset)),
            Some(Action::AlreadyInPlace)
        );
        let e = HostPathPlugin
            .setup(
                &Permit::JournalOff,
                &spec("/run/s", HostPathType::DirectoryOrCreate),
                &p,
                &sys,
            )
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "setup kubernetes.io/host-path/pod1-h: /run/s is not a directory"
        );
        assert!(sys.mutations().is_empty());
    }
}
