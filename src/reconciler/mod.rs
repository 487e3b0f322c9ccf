//! The reconciler: decides which volume operations to start (`plan`), keeps
//! operations on one volume exclusive and failed ones backing off
//! (`pending`), turns actions into jobs and finished jobs into ASW changes
//! (`jobs`), and runs jobs: intent, plugin call, outcome (`executor`).
//!
//! *Invariant:* the planning is pure; it reads the DSW and ASW and returns
//! actions. Only the executor touches the journal and the plugins.

pub mod executor;
pub mod jobs;
pub mod params;
pub mod pending;
pub mod plan;
