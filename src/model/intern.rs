//! One allocation per name while the daemon starts. On a restart the
//! journal's decode (whose names the journal's state and the ASW keep) and
//! the pod sources (whose names the DSW and the sources keep) each make
//! every volume name and pod UID of the node, on two threads at once;
//! without sharing, the daemon holds both copies for the life of each
//! volume. While sharing is on (while a [`Sharing`] from [`begin`] lives:
//! the daemon's start until `/readyz`), every [`PodUid`](super::PodUid) and
//! [`UniqueVolumeName`](super::UniqueVolumeName) made goes through one
//! table, and an equal name made before is handed out instead. Off (the
//! CLI, and the daemon once ready), a name is its own allocation.
//!
//! Names compare by content either way: sharing changes memory, never
//! meaning, so a name made outside the window (or past the cap) is no
//! less correct.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use arcstr::ArcStr;
use fxhash::FxHashSet;

/// Whether the table is on: read before taking a lock, so that names
/// made once the daemon is ready cost no lock.
static ON: AtomicBool = AtomicBool::new(false);

/// How many [`Sharing`]s are alive: sharing is on while any is (two
/// daemons in one process, as tests run them, each keep it on for their
/// own start).
static USERS: Mutex<usize> = Mutex::new(0);

/// The table, in shards by the name's hash: the two threads that make
/// most names at a restart seldom wait for each other.
static TABLE: [Mutex<Option<Names>>; SHARDS] = [const { Mutex::new(None) }; SHARDS];
const SHARDS: usize = 16;

/// The most names a shard holds. The table keeps every name it met alive
/// while it is on; a daemon that never becomes ready (a source that never
/// lists) keeps at most `SHARDS` times this many (524,288; a node of
/// 50,000 pods of one volume each has 100,000 names).
const CAP: usize = 1 << 15;

/// The names met, each once.
#[derive(Default)]
struct Names {
    set: FxHashSet<ArcStr>,
}

impl Names {
    /// An equal name met before, else `s` made and remembered (while
    /// fewer than `cap` are).
    fn get(&mut self, s: &str, cap: usize) -> ArcStr {
        if let Some(known) = self.set.get(s) {
            return known.clone();
        }
        let made = ArcStr::from(s);
        if self.set.len() < cap {
            self.set.insert(made.clone());
        }
        made
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sharing is on while this lives ([`begin`]); the last one dropped lets
/// go of the table (the names stay with their holders).
#[must_use = "sharing ends when this is dropped"]
#[derive(Debug)]
pub(crate) struct Sharing(());

/// Turns sharing on until the [`Sharing`] returned (and every other one
/// alive) is dropped.
pub(crate) fn begin() -> Sharing {
    let mut users = lock(&USERS);
    if *users == 0 {
        for shard in &TABLE {
            lock(shard).get_or_insert_with(Names::default);
        }
        ON.store(true, Ordering::Release);
    }
    *users += 1;
    Sharing(())
}

impl Drop for Sharing {
    fn drop(&mut self) {
        let mut users = lock(&USERS);
        *users -= 1;
        if *users == 0 {
            ON.store(false, Ordering::Release);
            for shard in &TABLE {
                let dropped = lock(shard).take();
                drop(dropped);
            }
        }
    }
}

/// `s` as a shared name: an equal one met while sharing is on, else a new
/// allocation (remembered while sharing is on).
pub(super) fn name(s: &str) -> ArcStr {
    if !ON.load(Ordering::Acquire) {
        return ArcStr::from(s);
    }
    let i = fxhash::hash(s) % SHARDS;
    match lock(&TABLE[i]).as_mut() {
        Some(names) => names.get(s, CAP),
        None => ArcStr::from(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_are_one_allocation_up_to_the_cap() {
        let mut n = Names::default();
        let (a, b, c) = (n.get("uid-1", 2), n.get("uid-1", 2), n.get("uid-2", 2));
        assert_eq!((&*a, &*c), ("uid-1", "uid-2"));
        assert!(ArcStr::ptr_eq(&a, &b), "an equal name made twice");
        assert!(!ArcStr::ptr_eq(&a, &c));
        assert!(ArcStr::ptr_eq(&c, &n.get("uid-2", 2)));
        // full: a new name is made, not remembered
        let (d, e) = (n.get("uid-3", 2), n.get("uid-3", 2));
        assert_eq!((&*d, &*e), ("uid-3", "uid-3"));
        assert!(!ArcStr::ptr_eq(&d, &e), "remembered past the cap");
        assert_eq!(n.set.len(), 2);
    }

    /// Sharing is on while any `Sharing` lives: dropping one of two keeps
    /// it on for the other. (Off once the last goes cannot be asserted
    /// here: other tests' daemons hold theirs in this process.)
    #[test]
    fn names_are_shared_while_a_sharing_lives_whoever_else_ends() {
        let first = begin();
        let second = begin();
        let (a, b) = (name("uid-intern-a"), name("uid-intern-a"));
        assert!(ArcStr::ptr_eq(&a, &b));
        drop(first);
        let (c, d) = (name("uid-intern-b"), name("uid-intern-b"));
        assert!(ArcStr::ptr_eq(&c, &d), "ended by the other's drop");
        assert!(ArcStr::ptr_eq(&a, &name("uid-intern-a")));
        drop(second);
    }
}
