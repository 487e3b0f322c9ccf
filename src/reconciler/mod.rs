//! The reconciler: every decision of the loop, and the running of one
//! operation. The loop's pure step (`core`: `(state, events, now) →
//! effects`; its vocabulary in `effects`) admits pods (`admit`), decides
//! which volume operations to start (`plan`), keeps operations on one
//! volume exclusive and failed ones backing off (`pending`), turns actions
//! into jobs and finished jobs into ASW changes (`jobs`), and decides the
//! one-time forced cleanup (`forced`); `executor` runs a job: intent,
//! plugin call, outcome.
//!
//! *Invariant:* everything here but the executor is pure: it reads the DSW
//! and ASW and returns effects or actions, with no journal, syscall, thread
//! or clock. Only the executor touches the journal and the plugins; the
//! daemon's driver performs the effects.

mod admit;
pub(crate) mod core;
pub(crate) mod effects;
pub(crate) mod executor;
pub(crate) mod forced;
pub(crate) mod jobs;
pub(crate) mod params;
pub(crate) mod pending;
pub(crate) mod plan;
