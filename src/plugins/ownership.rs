//! The fsGroup ownership walk (the kubelet's `SetVolumeOwnership`): the
//! volume's files get the pod's group and the group's bits
//! (`model::owned_mode`), a directory's children before the directory,
//! its root last — so a walk cut short leaves the root unchanged, and
//! `OnRootMismatch` walks again after it.
//!
//! Safety: every directory is opened from its parent's descriptor with
//! `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)` and every entry acted on
//! by name in it without following it (`Sys::owner_*`): a symlink gets its
//! own group and keeps its mode, its target is never reached; an entry that
//! is the root of another mount (a bind, a tmpfs below the volume) is left
//! alone with all below it. A volume nested deeper than [`MAX_DEPTH`] is
//! refused (each level holds a descriptor).
//!
//! As the kubelet does, a failed change of one entry (`EPERM` on a file a
//! filesystem will not give away, `EROFS`) is logged and the walk goes on;
//! a directory that cannot be listed or opened ends it with an error.

use std::ffi::CStr;
use std::time::{Duration, Instant};

use crate::host::sys::{DirHandle, Errno, FileKind, OwnerEntry, Sys, SysError};
use crate::journal::Permit;
use crate::model::{FsGroup, FsGroupChangePolicy, owned_mode, root_matches};

/// The deepest directory the walk enters below the volume's root.
pub const MAX_DEPTH: usize = 256;

/// When the walk first reports that it is slow (the kubelet's 30 s), and
/// how often after that it says how far it got (the kubelet's 60 s).
#[derive(Debug, Clone, Copy)]
pub struct ProgressEvery {
    /// the first report
    pub first: Duration,
    /// each one after it
    pub then: Duration,
}

impl ProgressEvery {
    /// The kubelet's: 30 s, then every 60 s.
    pub const KUBELET: ProgressEvery = ProgressEvery {
        first: Duration::from_secs(30),
        then: Duration::from_secs(60),
    };
}

/// A report of a walk still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// the walk has run past the first period
    Slow,
    /// how many entries it has seen so far (each period after the first)
    Processed(u64),
}

/// What a walk did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walked {
    /// `OnRootMismatch` found the root as wanted: nothing walked
    pub skipped: bool,
    /// entries seen, the root included
    pub entries: u64,
    /// entries whose group or mode was changed
    pub changed: u64,
    /// changes that failed (logged; the walk went on)
    pub failed: u64,
    /// mount roots below the volume, left alone
    pub mounts: Vec<std::path::PathBuf>,
}

/// How many entries go by between two looks at the clock.
const CLOCK_EVERY: u64 = 256;

struct Walk<'a> {
    sys: &'a dyn Sys,
    gid: u32,
    read_only: bool,
    out: Walked,
    started: Instant,
    next_report: Duration,
    every: ProgressEvery,
    progress: &'a mut dyn FnMut(Progress),
}

impl Walk<'_> {
    fn tick(&mut self) {
        self.out.entries += 1;
        if !self.out.entries.is_multiple_of(CLOCK_EVERY) {
            return;
        }
        let elapsed = self.started.elapsed();
        if elapsed < self.next_report {
            return;
        }
        let note = match self.next_report == self.every.first {
            true => Progress::Slow,
            false => Progress::Processed(self.out.entries),
        };
        self.next_report = elapsed + self.every.then;
        (self.progress)(note);
    }

    /// A failed change: logged (the first few), counted, not fatal.
    fn failed(&mut self, e: &SysError) {
        self.out.failed += 1;
        if self.out.failed <= 8 {
            tracing::warn!(error = %e, "fsGroup: an entry's group or mode could not be set");
        }
    }

    /// Gives the entry `name` of `dir` (empty: `dir` itself) the group and
    /// bits, from what its `statx` said (`e`).
    fn own(&mut self, dir: &DirHandle, name: &CStr, e: &OwnerEntry) {
        let mut changed = false;
        let mut chowned = false;
        if e.gid != self.gid {
            match self.sys.owner_chgrp(dir, name, self.gid) {
                Ok(()) => (changed, chowned) = (true, true),
                Err(err) if err.errno() == Some(Errno::ENOENT) => return,
                Err(err) => self.failed(&err),
            }
        }
        // a symlink's mode means nothing, and a chmod would reach its target
        if e.kind != FileKind::Symlink {
            let mode = owned_mode(e.perm, e.kind == FileKind::Dir, self.read_only);
            // a chgrp clears a file's set-user-ID bit; setting the mode read
            // before it puts it back, as the kubelet's chmod does
            if mode != e.perm || chowned {
                match self.sys.owner_chmod(dir, name, mode) {
                    Ok(()) => changed = true,
                    Err(err) if err.errno() == Some(Errno::ENOENT) => {}
                    Err(err) => self.failed(&err),
                }
            }
        }
        self.out.changed += u64::from(changed);
        if changed {
            // a kill here leaves a volume walked in part (docs/crash-points.md)
            crate::failpoint::hit("set_ownership.mid");
        }
    }

    /// Walks the directory `dir` (whose own entry is not changed here).
    fn walk(&mut self, dir: &DirHandle, depth: usize) -> Result<(), SysError> {
        if depth > MAX_DEPTH {
            return Err(SysError::call(
                crate::host::sys::Call::OpenDir,
                dir.path(),
                Errno::ELOOP,
            ));
        }
        for e in self.sys.owner_list(dir)? {
            if e.mount_root {
                let name: &std::ffi::OsStr =
                    std::os::unix::ffi::OsStrExt::from_bytes(e.name.as_bytes());
                self.out.mounts.push(dir.path().join(name));
                continue;
            }
            self.tick();
            if e.kind == FileKind::Dir {
                let sub = match self.sys.owner_open(dir, &e.name) {
                    Ok(sub) => sub,
                    // gone, swapped for a symlink or mounted over since the
                    // listing: not ours to enter now
                    Err(err)
                        if matches!(
                            err.errno(),
                            Some(Errno::ENOENT | Errno::ELOOP | Errno::EXDEV | Errno::ENOTDIR)
                        ) =>
                    {
                        continue;
                    }
                    Err(err) => return Err(err),
                };
                self.walk(&sub, depth + 1)?;
                // through the opened directory itself: the name may point
                // elsewhere by now
                self.own(&sub, c"", &e);
            } else {
                self.own(dir, &e.name, &e);
            }
        }
        Ok(())
    }
}

/// Sets the ownership of the volume whose root is the directory `root`
/// to `group`, as the kubelet does (module docs). `progress` hears of a
/// walk that runs long ([`ProgressEvery`]). A failed listing or open is
/// the error; the walk may have changed part of the volume then.
pub fn set_ownership(
    _permit: &Permit,
    sys: &dyn Sys,
    root: &DirHandle,
    group: FsGroup,
    read_only: bool,
    every: ProgressEvery,
    progress: &mut dyn FnMut(Progress),
) -> Result<Walked, SysError> {
    let top = sys.owner_stat(root)?;
    if group.policy == FsGroupChangePolicy::OnRootMismatch
        && root_matches(
            top.gid,
            top.perm,
            top.kind == FileKind::Dir,
            group.gid,
            read_only,
        )
    {
        return Ok(Walked {
            skipped: true,
            ..Walked::default()
        });
    }
    let mut w = Walk {
        sys,
        gid: group.gid,
        read_only,
        out: Walked::default(),
        started: Instant::now(),
        next_report: every.first,
        every,
        progress,
    };
    if top.kind == FileKind::Dir {
        w.walk(root, 1)?;
    }
    w.tick();
    w.own(root, c"", &top);
    Ok(w.out)
}
