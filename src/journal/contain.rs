//! sled calls made safe to fail: sled 0.34 has assertions on paths that
//! read its files, so damage could surface as a panic rather than an
//! error, and a journal that cannot be read must be moved aside, not crash
//! the daemon at every start.

use std::panic::{AssertUnwindSafe, catch_unwind};

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_owned())
}

/// Runs a sled call, turning a panic into an error text.
pub(super) fn contain<T>(f: impl FnOnce() -> Result<T, sled::Error>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(p) => Err(format!("sled panicked: {}", panic_text(p.as_ref()))),
    }
}
