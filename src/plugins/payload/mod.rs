//! `kubernetes.io/configmap`, `kubernetes.io/secret`,
//! `kubernetes.io/downward-api` and `kubernetes.io/projected`: volumes
//! whose content volumed writes (a payload) rather than mounts.
//!
//! `build` turns a spec and the objects it names into files; `atomic`
//! writes them so a reader never sees a mix of two payloads.

pub mod atomic;
pub mod build;

pub use build::{KubeObject, ObjectStore, ObjectStores, Payload, PayloadError, PayloadFile};
