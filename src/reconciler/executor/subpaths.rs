//! SubPath binds, journaled: made for the runtime API's container answer,
//! unmounted and removed before their volume's TearDown and for a pod
//! that is gone (`host::subpath` does the syscalls). Each bind and each
//! unbind is an intent, the host call, then its outcome, like every
//! operation on a target; the journal keeps one entry per bind
//! (`journal::replay`), so `dump` shows them and a restart knows them.
//!
//! A volume being torn down gets no new bind: a TearDown marks its (pod,
//! volume) closing before it cleans the binds and until it has finished,
//! and the runtime API, which looks at the pod and binds under the same
//! lock, refuses a bind into a closing volume (a TearDown may run while
//! the pod stays, for a volume remounted with another SELinux label).
//! Orphan cleanup marks a whole pod so. The lock is held only to mark and
//! to bind, never across a cleanup's unmounts: one stuck unmount holds
//! its own volume, not every container start on the node.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::host::subpath::{self, Cleaned, FoundBind, SubpathAt, SubpathError};
use crate::host::sys::Sys;
use crate::journal::{DurableIntent, Journal, OpResult};
use crate::model::{
    Layout, MountState, Operation, PodUid, SubpathBind, SubpathKey, UniqueVolumeName,
};

/// The journaled subPath binds of a daemon (module doc).
pub(crate) struct Subpaths {
    journal: Option<Arc<Journal>>,
    sys: Arc<dyn Sys>,
    layout: Layout,
    lock: Mutex<Closing>,
}

/// What is being cleaned now: no bind is made into it.
#[derive(Debug, Default)]
struct Closing {
    volumes: HashSet<(PodUid, UniqueVolumeName)>,
    pods: HashSet<PodUid>,
}

/// A volume (or a whole pod) marked closing; unmarked when dropped.
pub(crate) struct ClosingMark<'a> {
    subpaths: &'a Subpaths,
    pod: PodUid,
    volume: Option<UniqueVolumeName>,
}

impl Drop for ClosingMark<'_> {
    fn drop(&mut self) {
        let mut c = self.subpaths.locked();
        match self.volume.take() {
            Some(v) => c.volumes.remove(&(self.pod.clone(), v)),
            None => c.pods.remove(&self.pod),
        };
    }
}

impl std::fmt::Debug for Subpaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subpaths").finish_non_exhaustive()
    }
}

/// The lock held: binds may be made.
pub(crate) struct Held<'a> {
    subpaths: &'a Subpaths,
    closing: MutexGuard<'a, Closing>,
}

impl Subpaths {
    /// Over the journal (`None`: journal off), the seam and the layout.
    pub(crate) fn new(journal: Option<Arc<Journal>>, sys: Arc<dyn Sys>, layout: Layout) -> Self {
        Self {
            journal,
            sys,
            layout,
            lock: Mutex::new(Closing::default()),
        }
    }

    /// The lock (plain data: still consistent after a panic).
    fn locked(&self) -> MutexGuard<'_, Closing> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the lock to look at a pod and make its binds.
    pub(crate) fn hold(&self) -> Held<'_> {
        Held {
            subpaths: self,
            closing: self.locked(),
        }
    }

    /// Marks volume `volume` of pod `pod` closing until the mark is
    /// dropped: a TearDown holds it from before its cleanup to its end.
    /// Taken once no bind of it is being made (the lock).
    pub(crate) fn closing(&self, pod: &PodUid, volume: &UniqueVolumeName) -> ClosingMark<'_> {
        self.locked().volumes.insert((pod.clone(), volume.clone()));
        ClosingMark {
            subpaths: self,
            pod: pod.clone(),
            volume: Some(volume.clone()),
        }
    }

    fn begin(&self, op: Operation, bind: &SubpathBind) -> Result<Option<DurableIntent>, String> {
        match &self.journal {
            None => Ok(None),
            Some(j) => j
                .begin_subpath(op, bind)
                .map(Some)
                .map_err(|e| format!("journal the {}: {e}", op.as_str())),
        }
    }

    fn finish(&self, intent: Option<DurableIntent>, result: OpResult) {
        if let (Some(j), Some(intent)) = (&self.journal, intent)
            && let Err(e) = j.finish(intent, result, None)
        {
            // the intent stays without an outcome: uncertain, settled by
            // the next cleanup from the host
            tracing::warn!(error = %e, "a subpath operation's outcome was not journaled");
        }
    }

    /// Unmounts and removes every bind of pod volume `name` of pod `pod`
    /// (volume `volume`) before its TearDown: those on the host and those
    /// the journal knows, each journaled. A bind that will not go fails
    /// the whole (its volume must not be torn down under it). The caller
    /// holds the volume's [`Subpaths::closing`] mark.
    pub(crate) fn clean_volume(
        &self,
        pod: &PodUid,
        name: &str,
        volume: &UniqueVolumeName,
    ) -> Result<Cleaned, SubpathError> {
        let mut around =
            |found: &FoundBind, remove: &mut dyn FnMut() -> Result<(), SubpathError>| {
                self.around(pod, Some(volume), found, remove)
            };
        let cleaned =
            subpath::clean_volume(self.sys.as_ref(), &self.layout, pod, name, &mut around)?;
        self.forget_gone(pod, Some(name));
        Ok(cleaned)
    }

    /// The pod volume names the journal knows binds of, for volume
    /// `volume` of pod `pod`: a TearDown's, when the ASW does not know
    /// the name (a target rebuilt from the host alone).
    pub(crate) fn names_of(&self, pod: &PodUid, volume: &UniqueVolumeName) -> Vec<String> {
        let Some(j) = &self.journal else {
            return Vec::new();
        };
        let mut names: Vec<String> = j.with_state(|s| {
            s.subpaths_of_pod(pod)
                .filter(|e| e.bind.volume == *volume)
                .map(|e| e.bind.key.name.clone())
                .collect()
        });
        names.dedup();
        names
    }

    /// Every bind of pod `pod` (orphan cleanup: no volume is known), each
    /// journaled.
    pub(crate) fn clean_pod(&self, pod: &PodUid) -> Result<Cleaned, SubpathError> {
        self.locked().pods.insert(pod.clone());
        let _mark = ClosingMark {
            subpaths: self,
            pod: pod.clone(),
            volume: None,
        };
        let mut around =
            |found: &FoundBind, remove: &mut dyn FnMut() -> Result<(), SubpathError>| {
                self.around(pod, None, found, remove)
            };
        let cleaned = subpath::clean_pod(self.sys.as_ref(), &self.layout, pod, &mut around)?;
        self.forget_gone(pod, None);
        Ok(cleaned)
    }

    /// One entry's removal, journaled when it sits where a bind goes: the
    /// journal's own record of it when there is one, else (a bind no
    /// record names, a kubelet's) one made from its path.
    fn around(
        &self,
        pod: &PodUid,
        volume: Option<&UniqueVolumeName>,
        found: &FoundBind,
        remove: &mut dyn FnMut() -> Result<(), SubpathError>,
    ) -> Result<(), SubpathError> {
        let bind = found.key_parts().and_then(|(name, container, index)| {
            let key = SubpathKey::new(pod.clone(), name, container, index).ok()?;
            let known = self.journal.as_ref().and_then(|j| {
                j.with_state(|s| {
                    s.subpaths_of(pod, name)
                        .find(|e| e.bind.key == key)
                        .map(|e| e.bind.clone())
                })
            });
            known.or_else(|| {
                Some(SubpathBind {
                    key,
                    // unknown to an orphan's cleanup
                    volume: volume
                        .cloned()
                        .unwrap_or_else(|| UniqueVolumeName::from_raw(String::new())),
                    sub_path: String::new(),
                })
            })
        });
        let Some(bind) = bind else {
            return remove();
        };
        let intent = self
            .begin(Operation::UnbindSubpath, &bind)
            .map_err(SubpathError::Declined)?;
        let done = remove();
        self.finish(
            intent,
            match &done {
                Ok(()) => OpResult::Success,
                Err(e) => OpResult::FailedUncertain(e.to_string()),
            },
        );
        done
    }

    /// Drops the binds the journal still knows under `pod` (of pod volume
    /// `name` when given) once the host has none left there: an unbind
    /// with nothing to undo (a reboot took the mounts), so the journal
    /// keeps no entry for a bind that is gone.
    fn forget_gone(&self, pod: &PodUid, name: Option<&str>) {
        let Some(j) = &self.journal else {
            return;
        };
        let left: Vec<SubpathBind> = j.with_state(|s| match name {
            Some(n) => s.subpaths_of(pod, n).map(|e| e.bind.clone()).collect(),
            None => s.subpaths_of_pod(pod).map(|e| e.bind.clone()).collect(),
        });
        for bind in left {
            let path = self.path_of(&bind.key);
            // gone, or there and not a mount: nothing to undo; a path that
            // cannot be looked at is left for the next cleanup
            let mounted = match self.sys.mount_root(&path) {
                Err(e) if e.errno() == Some(crate::host::sys::Errno::ENOENT) => false,
                other => other.unwrap_or(true),
            };
            if mounted {
                continue;
            }
            if let Ok(intent) = self.begin(Operation::UnbindSubpath, &bind) {
                self.finish(intent, OpResult::Success);
            }
        }
    }

    /// After a restart, before any bind or cleanup: each bind the journal
    /// knows is settled from the host. One the host still has is kept
    /// (recorded as a bind found in place when its last record was not a
    /// finished bind); one the host lost (a reboot, or cut before the
    /// mount) is dropped. O(the binds the journal knows).
    pub(crate) fn settle_at_start(&self) {
        let Some(j) = &self.journal else {
            return;
        };
        let known: Vec<(SubpathBind, bool)> = j.with_state(|s| {
            s.subpaths()
                .map(|e| {
                    let settled = e.pending.is_none() && e.state == MountState::Mounted;
                    (e.bind.clone(), settled)
                })
                .collect()
        });
        for (bind, settled) in known {
            let mounted = match self.sys.mount_root(&self.path_of(&bind.key)) {
                Err(e) if e.errno() == Some(crate::host::sys::Errno::ENOENT) => false,
                // cannot tell: left for the next bind or cleanup
                Err(_) => continue,
                Ok(m) => m,
            };
            let op = match (mounted, settled) {
                (true, true) => continue,
                (true, false) => Operation::BindSubpath,
                (false, _) => Operation::UnbindSubpath,
            };
            if let Ok(intent) = self.begin(op, &bind) {
                self.finish(intent, OpResult::Success);
            }
        }
    }

    fn path_of(&self, key: &SubpathKey) -> PathBuf {
        let index = usize::try_from(key.index).unwrap_or(usize::MAX);
        self.layout
            .subpath_target(&key.pod, &key.name, &key.container, index)
    }
}

impl Held<'_> {
    /// Binds `bind`'s subpath of the volume at `volume_path` (journaled:
    /// intent, bind, outcome) and returns the bind's path. `is_mount`: the
    /// volume's pod target is a mount point, and must still be one (the
    /// ASW may not show yet that a TearDown unmounted it). A refusal (the
    /// subpath escapes, names a socket or a device) is a final failure,
    /// as is a journal that cannot take the intent; a host call that
    /// failed midway may have left a bind, and is uncertain.
    pub(crate) fn bind(
        &self,
        bind: &SubpathBind,
        volume_path: &Path,
        is_mount: bool,
    ) -> Result<PathBuf, String> {
        let s = self.subpaths;
        let pod = &bind.key.pod;
        if self.closing.pods.contains(pod)
            || self
                .closing
                .volumes
                .contains(&(pod.clone(), bind.volume.clone()))
        {
            return Err(format!(
                "volume {:?} is being unmounted for this pod; ask again once it is mounted",
                bind.key.name
            ));
        }
        if is_mount && !s.sys.mount_root(volume_path).unwrap_or(false) {
            return Err(format!(
                "volume {:?} is not mounted at {} now; ask again once it is",
                bind.key.name,
                volume_path.display()
            ));
        }
        let intent = s.begin(Operation::BindSubpath, bind)?;
        let index = usize::try_from(bind.key.index).unwrap_or(usize::MAX);
        let at = SubpathAt {
            pod: &bind.key.pod,
            volume: &bind.key.name,
            container: &bind.key.container,
            index,
        };
        let made = subpath::bind(s.sys.as_ref(), &s.layout, at, volume_path, &bind.sub_path);
        s.finish(
            intent,
            match &made {
                Ok(_) => OpResult::Success,
                Err(e @ SubpathError::Sys(_)) => OpResult::FailedUncertain(e.to_string()),
                Err(e) => OpResult::FailedFinal(e.to_string()),
            },
        );
        made.map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::{FileKind, MsFlags};
    use crate::journal::{Body, JournalConfig};
    use crate::model::MountState;

    struct Fixture {
        _dir: tempfile::TempDir,
        journal: Arc<Journal>,
        sys: Arc<RecordingSys>,
        subpaths: Subpaths,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let (j, _) = Journal::open(&JournalConfig::new(dir.path().join("j"), "n", "b")).unwrap();
        let journal = Arc::new(j);
        let sys = Arc::new(RecordingSys::new());
        sys.add("/r", FileKind::Dir);
        sys.add("/v/logs", FileKind::Dir);
        let subpaths = Subpaths::new(Some(journal.clone()), sys.clone(), Layout::new("/r"));
        Fixture {
            _dir: dir,
            journal,
            sys,
            subpaths,
        }
    }

    fn bind(container: &str, sub_path: &str) -> SubpathBind {
        SubpathBind {
            key: SubpathKey::new(PodUid::new("p1").unwrap(), "data", container, 0).unwrap(),
            volume: UniqueVolumeName::from_raw("kubernetes.io/empty-dir/p1-data"),
            sub_path: sub_path.to_owned(),
        }
    }

    /// (op, "intent" | the outcome's result) of every subpath record.
    fn subpath_records(j: &Journal) -> Vec<(Operation, String)> {
        j.current("n")
            .unwrap()
            .tail
            .iter()
            .filter_map(|r| match &r.body {
                Body::SubpathIntent { op, .. } => Some((*op, "intent".to_owned())),
                Body::Outcome { op, result, .. } if op.is_subpath_op() => {
                    Some((*op, format!("{result:?}")))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_bind_is_journaled_and_its_cleanup_before_a_teardown_forgets_it() {
        use Operation::*;
        let f = fixture();
        let pod = PodUid::new("p1").unwrap();
        let made = f
            .subpaths
            .hold()
            .bind(&bind("app", "logs"), Path::new("/v"), false);
        let path = made.unwrap();
        assert_eq!(path, Path::new("/r/pods/p1/volume-subpaths/data/app/0"));
        assert!(f.sys.mounts().iter().any(|m| m.target == path));
        let state = f.journal.state();
        let known: Vec<_> = state.subpaths_of(&pod, "data").collect();
        assert_eq!(known.len(), 1);
        assert_eq!(
            (known[0].state, known[0].bind.sub_path.as_str()),
            (MountState::Mounted, "logs")
        );
        let volume = UniqueVolumeName::from_raw("kubernetes.io/empty-dir/p1-data");
        assert_eq!(f.subpaths.names_of(&pod, &volume), vec!["data".to_owned()]);

        let cleaned = f.subpaths.clean_volume(&pod, "data", &volume).unwrap();
        assert_eq!(cleaned.unmounted, vec![path.clone()]);
        assert!(!f.sys.exists(&path));
        assert_eq!(f.journal.state().subpaths().count(), 0, "forgotten");
        assert_eq!(
            subpath_records(&f.journal),
            vec![
                (BindSubpath, "intent".into()),
                (BindSubpath, "Success".into()),
                (UnbindSubpath, "intent".into()),
                (UnbindSubpath, "Success".into()),
            ]
        );
    }

    /// A bind no record names (a kubelet's, or one made before the
    /// journal knew binds) is unbound journaled, with an empty subpath; a
    /// bind the journal knows that the host lost (a reboot) is dropped.
    #[test]
    fn the_host_s_unknown_binds_and_the_journal_s_lost_ones_are_settled() {
        let f = fixture();
        let pod = PodUid::new("p1").unwrap();
        // on the host, not in the journal
        let foreign = Path::new("/r/pods/p1/volume-subpaths/data/side/3");
        f.sys.add(foreign, FileKind::Dir);
        f.sys
            .preset_mount(
                Some(Path::new("/v/logs")),
                foreign,
                None,
                MsFlags::MS_BIND,
                None,
            )
            .unwrap();
        // in the journal, not on the host
        let lost = bind("app", "logs");
        let intent = f
            .journal
            .begin_subpath(Operation::BindSubpath, &lost)
            .unwrap();
        f.journal.finish(intent, OpResult::Success, None).unwrap();

        f.subpaths.clean_pod(&pod).unwrap();
        assert!(!f.sys.exists(foreign));
        assert!(f.sys.mounts().iter().all(|m| m.target != foreign));
        assert_eq!(f.journal.state().subpaths().count(), 0);
        let unbinds: Vec<(String, u32, String)> = f
            .journal
            .current("n")
            .unwrap()
            .tail
            .iter()
            .filter_map(|r| match &r.body {
                Body::SubpathIntent {
                    op: Operation::UnbindSubpath,
                    bind,
                } => Some((
                    bind.key.container.clone(),
                    bind.key.index,
                    bind.sub_path.clone(),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            unbinds,
            vec![
                ("side".into(), 3, String::new()),
                ("app".into(), 0, "logs".into())
            ]
        );
    }

    #[test]
    fn a_refused_subpath_is_a_final_failure_and_leaves_no_bind() {
        let f = fixture();
        f.sys.add("/v/s.sock", FileKind::Socket);
        let e = f
            .subpaths
            .hold()
            .bind(&bind("app", "s.sock"), Path::new("/v"), false)
            .unwrap_err();
        assert!(e.contains("socket"), "{e}");
        let records = subpath_records(&f.journal);
        assert_eq!(records.len(), 2);
        assert!(records[1].1.starts_with("FailedFinal"), "{records:?}");
        assert_eq!(f.journal.state().subpaths().count(), 0, "nothing kept");
    }

    /// A TearDown's mark refuses binds into its volume (another volume of
    /// the pod still binds) until it is dropped; a volume whose target is
    /// a mount is bound only while it is one.
    #[test]
    fn no_bind_into_a_closing_volume_nor_a_target_no_longer_mounted() {
        let f = fixture();
        let pod = PodUid::new("p1").unwrap();
        let b = bind("app", "logs");
        let mark = f.subpaths.closing(&pod, &b.volume);
        let e = f
            .subpaths
            .hold()
            .bind(&b, Path::new("/v"), false)
            .unwrap_err();
        assert!(e.contains("being unmounted"), "{e}");
        let other = SubpathBind {
            volume: UniqueVolumeName::from_raw("kubernetes.io/empty-dir/p1-other"),
            ..bind("side", "logs")
        };
        assert!(
            f.subpaths
                .hold()
                .bind(&other, Path::new("/v"), false)
                .is_ok()
        );
        drop(mark);
        // a mount target found not mounted (a TearDown the ASW does not
        // show yet): refused, nothing journaled for it
        let before = subpath_records(&f.journal).len();
        let e = f
            .subpaths
            .hold()
            .bind(&b, Path::new("/v"), true)
            .unwrap_err();
        assert!(e.contains("is not mounted"), "{e}");
        assert_eq!(subpath_records(&f.journal).len(), before);
        assert!(f.subpaths.hold().bind(&b, Path::new("/v"), false).is_ok());
    }

    /// After a restart: a bind the host kept stays (a pending one is
    /// recorded as found in place), one the host lost is dropped.
    #[test]
    fn a_restart_settles_the_journal_s_binds_from_the_host() {
        let f = fixture();
        let pod = PodUid::new("p1").unwrap();
        let kept = f
            .subpaths
            .hold()
            .bind(&bind("app", "logs"), Path::new("/v"), false)
            .unwrap();
        // cut after its intent: the bind is there, no outcome
        let cut = SubpathBind {
            key: SubpathKey::new(pod.clone(), "data", "cut", 0).unwrap(),
            ..bind("app", "logs")
        };
        let at = f.subpaths.path_of(&cut.key);
        f.sys.add(&at, FileKind::Dir);
        f.sys
            .preset_mount(
                Some(Path::new("/v/logs")),
                &at,
                None,
                MsFlags::MS_BIND,
                None,
            )
            .unwrap();
        let _pending = f
            .journal
            .begin_subpath(Operation::BindSubpath, &cut)
            .unwrap();
        // journaled as mounted, gone from the host (a reboot)
        let lost = bind("gone", "logs");
        let i = f
            .journal
            .begin_subpath(Operation::BindSubpath, &lost)
            .unwrap();
        f.journal.finish(i, OpResult::Success, None).unwrap();

        let before = subpath_records(&f.journal).len();
        f.subpaths.settle_at_start();
        let state = f.journal.state();
        let now: Vec<(String, MountState, bool)> = state
            .subpaths()
            .map(|e| (e.bind.key.container.clone(), e.state, e.pending.is_some()))
            .collect();
        assert_eq!(
            now,
            vec![
                ("app".into(), MountState::Mounted, false),
                ("cut".into(), MountState::Mounted, false),
            ]
        );
        assert!(f.sys.mounts().iter().any(|m| m.target == kept));
        // the kept one wrote nothing; the cut one a bind, the lost one an
        // unbind
        assert_eq!(subpath_records(&f.journal).len(), before + 4);
    }
}
