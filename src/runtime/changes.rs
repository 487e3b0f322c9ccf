//! [`Changes`]: a counter the reconciler loop bumps after every step that
//! held the world lock, so the runtime API's waiters sleep until the DSW or
//! the ASW may have changed instead of polling the lock. Blocking waiters
//! use a condvar; async ones (the HTTP long-poll) a tokio `watch`.
//!
//! *Invariant:* a waiter reads the counter *before* it takes its snapshot
//! of the world and then waits for a value past it, so a change made
//! between the snapshot and the wait is never missed.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

use tokio::sync::watch;

/// The change counter; closed once the daemon stops.
#[derive(Debug)]
pub struct Changes {
    /// (count, closed)
    state: Mutex<(u64, bool)>,
    bumped: Condvar,
    tx: watch::Sender<u64>,
}

impl Default for Changes {
    fn default() -> Self {
        Self::new()
    }
}

impl Changes {
    /// A counter at 0, open.
    pub fn new() -> Self {
        Self {
            state: Mutex::new((0, false)),
            bumped: Condvar::new(),
            tx: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, bool)> {
        // two plain integers: a panic elsewhere cannot leave them half set
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The world may have changed: wakes every waiter.
    pub fn bump(&self) {
        let n = {
            let mut s = self.lock();
            s.0 = s.0.wrapping_add(1);
            s.0
        };
        self.bumped.notify_all();
        self.tx.send_replace(n);
    }

    /// The daemon stops: wakes every waiter for good.
    pub fn close(&self) {
        self.lock().1 = true;
        self.bumped.notify_all();
        self.tx.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether [`Changes::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().1
    }

    /// The count now: what a waiter passes to [`Changes::wait_past`].
    pub fn seen(&self) -> u64 {
        self.lock().0
    }

    /// Blocks until the count is past `seen`, the deadline passes or the
    /// counter is closed. `false` only when closed.
    pub fn wait_past(&self, seen: u64, deadline: Instant) -> bool {
        let mut s = self.lock();
        loop {
            if s.1 {
                return false;
            }
            if s.0 != seen {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return true;
            };
            s = self
                .bumped
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A receiver that sees every later bump (and the close).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_bump_wakes_a_blocked_waiter_at_once() {
        let c = Arc::new(Changes::new());
        let seen = c.seen();
        let bumper = {
            let c = c.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                c.bump();
            })
        };
        let start = Instant::now();
        assert!(c.wait_past(seen, start + Duration::from_secs(30)));
        assert!(start.elapsed() < Duration::from_secs(10));
        assert_ne!(c.seen(), seen);
        bumper.join().unwrap();
    }

    #[test]
    fn a_bump_before_the_wait_is_not_missed_and_close_ends_waits() {
        let c = Changes::new();
        let seen = c.seen();
        c.bump();
        assert!(c.wait_past(seen, Instant::now() + Duration::from_secs(30)));
        c.close();
        assert!(!c.wait_past(c.seen(), Instant::now() + Duration::from_secs(30)));
        assert!(c.is_closed());
    }

    #[test]
    fn a_wait_with_nothing_happening_ends_at_its_deadline() {
        let c = Changes::new();
        let start = Instant::now();
        assert!(c.wait_past(c.seen(), start + Duration::from_millis(30)));
        assert!(start.elapsed() >= Duration::from_millis(30));
    }
}
