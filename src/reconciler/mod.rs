//! The reconciler: decides which volume operations to start (`plan`), keeps
//! operations on one volume exclusive and failed ones backing off
//! (`pending`). The event loop and the executor that journals and runs the
//! operations arrive with the daemon (issue "The node daemon").
//!
//! *Invariant:* the planning is pure; it reads the DSW and ASW and returns
//! actions. Only the executor touches the journal and the plugins.

pub mod pending;
pub mod plan;
