//! Crash points (docs/crash-points.md).
//!
//! Built with the cargo feature `failpoints`, [`hit`] kills the process with
//! SIGKILL — no unwinding, no flush beyond what is already durable — the
//! n-th time the point named by `VOLUMED_CRASH_AT=<point>[:<n>]` is reached.
//! Without the feature it compiles to nothing.
//!
//! `VOLUMED_HOLD_AT=<point>[:<n>]` with `VOLUMED_HOLD_DIR=<dir>` holds the
//! thread that reaches the point instead: it creates `<dir>/held` (holding
//! the point's name), waits until `<dir>/go` exists, and goes on. The test
//! changes the host at that very moment: the crash suite's `full-*`
//! fixtures fill the journal's disk to its last byte there, so the writes
//! after the point meet a full disk (`tests/crash/full.rs`). `<dir>` must be
//! on another filesystem than the one made full. Both variables may be set;
//! each counts its own hits.
//!
//! Besides the ten contract points (`<op>.after_intent` and `<op>.after_op`
//! for the four mount operations, `checkpoint.mid`, `orphan_cleanup.mid`),
//! `format_device.after_intent` / `format_device.after_op` (the executor's journaled format step) and
//! `teardown.mid_delete` (a disk emptyDir or a configMap volume renamed
//! to `.deleting~N`, its contents not yet deleted) exist. `tests/crash` reaches every one of them
//! through the real binary. The payload writer's `payload.after_dir`,
//! `payload.after_swap` and `payload.after_links` (a configMap or secret
//! volume's new payload dir written, `..data` swapped, links updated) are
//! reached by the `secret-payload-*` fixtures, and at the library level by
//! `plugins/payload/atomic_tests.rs`, which puts the dir in each step's
//! state.

/// Marks a crash point named `<operation>.<moment>`.
#[inline]
pub fn hit(point: &str) {
    #[cfg(feature = "failpoints")]
    imp::hit(point);
    #[cfg(not(feature = "failpoints"))]
    let _ = point;
}

#[cfg(feature = "failpoints")]
mod imp {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::sync::OnceLock;
    use std::time::Duration;

    fn target() -> &'static Option<(String, u64)> {
        static T: OnceLock<Option<(String, u64)>> = OnceLock::new();
        T.get_or_init(|| parse("VOLUMED_CRASH_AT"))
    }

    /// `<point>[:<n>]` from `var`, read once per variable by the caller.
    fn parse(var: &str) -> Option<(String, u64)> {
        let v = std::env::var(var).ok()?;
        Some(match v.rsplit_once(':') {
            Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
            None => (v, 1),
        })
    }

    fn hold_target() -> &'static Option<(String, u64, PathBuf)> {
        static T: OnceLock<Option<(String, u64, PathBuf)>> = OnceLock::new();
        T.get_or_init(|| {
            let (p, n) = parse("VOLUMED_HOLD_AT")?;
            let dir = std::env::var_os("VOLUMED_HOLD_DIR")?;
            Some((p, n, PathBuf::from(dir)))
        })
    }

    /// Whether this is the `n`-th hit of the point `counter` counts.
    fn nth(counter: &Mutex<u64>, n: u64) -> bool {
        let mut c = counter.lock().unwrap_or_else(|p| p.into_inner());
        *c += 1;
        *c == n
    }

    pub(super) fn hit(point: &str) {
        static HOLDS: Mutex<u64> = Mutex::new(0);
        static COUNT: Mutex<u64> = Mutex::new(0);
        if let Some((want, n, dir)) = hold_target()
            && want == point
            && nth(&HOLDS, *n)
        {
            hold(point, *n, dir);
        }
        let Some((want, n)) = target() else { return };
        if want != point {
            return;
        }
        if nth(&COUNT, *n) {
            eprintln!("volumed: crash point {point} reached ({n}), killing myself");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            // SIGKILL cannot be caught; should raise fail, abort without unwinding.
            std::process::abort();
        }
    }

    /// Says the point is reached (`<dir>/held`) and waits for `<dir>/go`.
    /// A marker that cannot be written is a broken test setup: abort.
    fn hold(point: &str, n: u64, dir: &Path) {
        eprintln!(
            "volumed: crash point {point} reached ({n}), holding until {} exists",
            dir.join("go").display()
        );
        if let Err(e) = std::fs::write(dir.join("held"), point) {
            eprintln!("volumed: write {}: {e}", dir.join("held").display());
            std::process::abort();
        }
        while !dir.join("go").exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("volumed: crash point {point} released");
    }
}
