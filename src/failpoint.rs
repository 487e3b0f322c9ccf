//! Crash points (docs/crash-points.md).
//!
//! Built with the cargo feature `failpoints`, [`hit`] kills the process with
//! SIGKILL — no unwinding, no flush beyond what is already durable — the
//! n-th time the point named by `VOLUMED_CRASH_AT=<point>[:<n>]` is reached.
//! Without the feature it compiles to nothing.
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
    use std::sync::Mutex;
    use std::sync::OnceLock;

    fn target() -> &'static Option<(String, u64)> {
        static T: OnceLock<Option<(String, u64)>> = OnceLock::new();
        T.get_or_init(|| {
            let v = std::env::var("VOLUMED_CRASH_AT").ok()?;
            Some(match v.rsplit_once(':') {
                Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
                None => (v, 1),
            })
        })
    }

    pub(super) fn hit(point: &str) {
        static COUNT: Mutex<u64> = Mutex::new(0);
        let Some((want, n)) = target() else { return };
        if want != point {
            return;
        }
        let mut c = COUNT.lock().unwrap_or_else(|p| p.into_inner());
        *c += 1;
        if *c == *n {
            eprintln!("volumed: crash point {point} reached ({n}), killing myself");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            // SIGKILL cannot be caught; should raise fail, abort without unwinding.
            std::process::abort();
        }
    }
}
