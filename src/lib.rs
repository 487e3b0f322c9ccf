//! volumed: a Kubernetes node volume manager with a write-ahead journal.
//!
//! See `ARCHITECTURE.md` at the repository root for the code map and the
//! invariants each module keeps.

pub mod apiserver;
pub mod civil;
pub mod csi;
pub mod daemon;
pub mod dump;
pub mod duration;
pub mod failpoint;
pub mod halves;
pub mod health;
pub mod host;
pub mod journal;
pub mod metrics;
pub mod model;
pub mod notify;
pub mod plugins;
pub mod reconciler;
pub mod reconstruct;
pub mod runtime;
pub mod selinux;
pub mod server;
pub mod sources;
pub mod state;

/// A duration in milliseconds to 0.1 ms, as the startup phase lines carry
/// it: `phase=<name> elapsed_ms=<n>`, the shape `benches/scale.rs` parses.
pub fn elapsed_ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}
