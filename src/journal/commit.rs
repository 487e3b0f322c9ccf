//! Group commit by a synced-through watermark.
//!
//! Appenders insert their record, then wait until the synced-through
//! watermark passes their sequence number. Whoever finds no flush running
//! becomes the leader: it reads how far records have been inserted, flushes
//! once outside the lock, raises the watermark to that point and wakes
//! everyone. Every record inserted before a flush starts is covered by it, so
//! N concurrent appenders share far fewer than N flushes.
//!
//! A failed flush is kept: every waiting and later appender gets it, and
//! no flush is tried again on the same files (after a failed write-back
//! Linux may have marked the pages clean; a second `fdatasync` would
//! "succeed" with data lost). Only [`GroupCommit::recover`] clears it,
//! with the journal's files reopened and every record not yet durable
//! written again (`super::recover`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct SyncState {
    synced_through: u64,
    flushing: bool,
    failed: Option<String>,
}

/// The watermark and the flush counter.
#[derive(Debug, Default)]
pub(crate) struct GroupCommit {
    state: Mutex<SyncState>,
    cv: Condvar,
    flushes: AtomicU64,
    /// `state.failed.is_some()`, read without the lock by every insert
    failed: AtomicBool,
}

impl GroupCommit {
    /// Starts with everything up to `synced_through` durable (after replay).
    pub(crate) fn new(synced_through: u64) -> Self {
        Self {
            state: Mutex::new(SyncState {
                synced_through,
                ..SyncState::default()
            }),
            cv: Condvar::new(),
            flushes: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SyncState> {
        // A panic while holding this lock leaves plain integers behind; the
        // state is still meaningful, so recover it rather than propagate.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many flushes have run (for tests and metrics).
    pub(crate) fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// The highest sequence number known durable.
    pub(crate) fn synced_through(&self) -> u64 {
        self.lock().synced_through
    }

    /// The kept failure, if a flush or write failed and no recovery has
    /// succeeded since.
    pub(crate) fn failure(&self) -> Option<String> {
        if !self.is_failed() {
            return None;
        }
        self.lock().failed.clone()
    }

    /// Whether a failure is kept (no lock: an insert asks every time).
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Marks the journal unwritable after a write or a flush outside the
    /// group commit failed.
    pub(crate) fn fail(&self, reason: String) {
        let mut st = self.lock();
        st.failed.get_or_insert(reason);
        self.failed.store(true, Ordering::SeqCst);
        self.cv.notify_all();
    }

    /// Runs `rewrite` (which makes every record inserted durable again and
    /// returns the last one) in place of a flush, once no flush runs, when
    /// a failure is kept: on success the failure is cleared and the
    /// watermark raised, and waiters go on. `Ok(false)`: nothing had failed.
    pub(crate) fn recover(
        &self,
        rewrite: impl FnOnce() -> Result<u64, String>,
    ) -> Result<bool, String> {
        let mut st = self.lock();
        while st.flushing {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.failed.is_none() {
            return Ok(false);
        }
        st.flushing = true;
        drop(st);
        let result = rewrite();
        let mut st = self.lock();
        st.flushing = false;
        let out = match result {
            Ok(through) => {
                st.synced_through = st.synced_through.max(through);
                st.failed = None;
                self.failed.store(false, Ordering::SeqCst);
                Ok(true)
            }
            Err(e) => {
                st.failed = Some(e.clone());
                self.failed.store(true, Ordering::SeqCst);
                Err(e)
            }
        };
        self.cv.notify_all();
        out
    }

    /// Returns once `seq` is durable. `inserted_through` reads the highest
    /// sequence number whose record (and every one before it) is inserted;
    /// `flush` makes everything inserted so far durable and returns the error
    /// text on failure.
    pub(crate) fn wait_durable(
        &self,
        seq: u64,
        inserted_through: impl Fn() -> u64,
        flush: impl Fn(u64) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut st = self.lock();
        loop {
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            if st.synced_through >= seq {
                return Ok(());
            }
            if st.flushing {
                st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            st.flushing = true;
            let target = inserted_through();
            drop(st);
            self.flushes.fetch_add(1, Ordering::Relaxed);
            let result = flush(target);
            st = self.lock();
            st.flushing = false;
            match result {
                Ok(()) => st.synced_through = st.synced_through.max(target),
                Err(e) => {
                    st.failed = Some(e);
                    self.failed.store(true, Ordering::SeqCst);
                }
            }
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    use std::time::Duration;

    #[test]
    fn a_single_appender_flushes_once_per_record() {
        let gc = GroupCommit::new(0);
        for seq in 1..=5 {
            gc.wait_durable(seq, || seq, |_| Ok(())).unwrap();
        }
        assert_eq!(gc.flush_count(), 5);
        assert_eq!(gc.synced_through(), 5);
    }

    #[test]
    fn concurrent_appenders_share_flushes() {
        let gc = Arc::new(GroupCommit::new(0));
        let inserted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..32)
            .map(|_| {
                let gc = gc.clone();
                let inserted = inserted.clone();
                std::thread::spawn(move || {
                    let seq = inserted.fetch_add(1, Ordering::SeqCst) + 1;
                    gc.wait_durable(
                        seq,
                        || inserted.load(Ordering::SeqCst),
                        |_| {
                            std::thread::sleep(Duration::from_millis(20));
                            Ok(())
                        },
                    )
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        assert_eq!(gc.synced_through(), 32);
        assert!(
            gc.flush_count() < 16,
            "32 appenders used {} flushes",
            gc.flush_count()
        );
    }

    #[test]
    fn a_failed_flush_holds_for_everyone_after_until_a_recovery() {
        let gc = GroupCommit::new(0);
        let err = gc
            .wait_durable(1, || 1, |_| Err("eio".to_owned()))
            .unwrap_err();
        assert_eq!(err, "eio");
        assert_eq!(gc.wait_durable(2, || 2, |_| Ok(())).unwrap_err(), "eio");
        assert_eq!(gc.flush_count(), 1, "a failed flush is never retried");
        assert_eq!(gc.failure().as_deref(), Some("eio"));
        // a recovery that fails keeps the journal unwritable, with its reason
        assert_eq!(gc.recover(|| Err("enospc".into())), Err("enospc".into()));
        assert_eq!(gc.failure().as_deref(), Some("enospc"));
        assert_eq!(gc.wait_durable(2, || 2, |_| Ok(())).unwrap_err(), "enospc");
        // one that rewrites through 2 makes 1 and 2 durable
        assert_eq!(gc.recover(|| Ok(2)), Ok(true));
        assert_eq!((gc.failure(), gc.synced_through()), (None, 2));
        gc.wait_durable(2, || 2, |_| panic!("2 is durable: no flush"))
            .unwrap();
        gc.wait_durable(3, || 3, |_| Ok(())).unwrap();
        assert_eq!(gc.synced_through(), 3);
        // with nothing failed there is nothing to recover
        assert_eq!(gc.recover(|| panic!("not called")), Ok(false));
    }
}
