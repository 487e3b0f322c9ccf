//! volumed: a Kubernetes node volume manager with a write-ahead journal.
//!
//! See `ARCHITECTURE.md` at the repository root for the code map and the
//! invariants each module keeps.
//!
//! What is `pub` is what the binary, the tests, the benches and an embedder
//! use; the rest is `pub(crate)` or narrower (`unreachable_pub` holds it so).

#![warn(unreachable_pub)]

pub mod apiserver;
pub mod csi;
pub mod daemon;
pub mod dump;
pub mod failpoint;
pub mod health;
pub mod host;
pub mod journal;
pub mod metrics;
pub mod model;
pub mod plugins;
pub mod reconciler;
pub mod reconstruct;
pub mod runtime;
pub mod selinux;
pub mod server;
pub mod sources;
pub mod state;
pub mod util;
