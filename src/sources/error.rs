//! [`SourceError`]: every problem a static source can have, each naming the
//! file and, where there is one, the volume or object.
//!
//! Messages include their cause (`…: permission denied`), unlike errors that
//! only chain it: they are stored as strings in the DSW's pod errors, where
//! the chain would be lost.

use std::path::PathBuf;

use crate::model::{ModelError, PodUid};

/// What kind of failure a [`SourceError`] is, for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceErrorCategory {
    /// Reading a directory or file failed; retrying may help.
    Io,
    /// The content is malformed or breaks a rule.
    Invalid,
    /// Well-formed, but volumed does not handle it (a secret volume, an NFS PV).
    Unsupported,
    /// A claim does not lead to a usable PersistentVolume.
    Unresolved,
    /// Two files define the same pod or object.
    Conflict,
}

/// Errors of the static sources.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// listing a source directory failed
    #[error("listing {dir}: {cause}")]
    ListDir {
        /// the directory
        dir: PathBuf,
        /// the I/O error
        cause: std::io::Error,
    },
    /// `stat`, opening or reading a manifest failed
    #[error("reading {file}: {cause}")]
    ReadFile {
        /// the file
        file: PathBuf,
        /// the I/O error
        cause: std::io::Error,
    },
    /// an entry is neither a regular file nor a directory (FIFO, socket, device)
    #[error("{file} is not a regular file")]
    NotRegularFile {
        /// the entry
        file: PathBuf,
    },
    /// a manifest is larger than the cap
    #[error("{file} is larger than {limit} bytes")]
    TooLarge {
        /// the file
        file: PathBuf,
        /// the cap
        limit: u64,
    },
    /// not valid YAML / JSON, or the wrong number of documents
    #[error("parsing {file}: {message}")]
    Parse {
        /// the file
        file: PathBuf,
        /// what the parser said
        message: String,
    },
    /// the document does not fit the Kubernetes type of its kind
    #[error("decoding {file}: {message}")]
    Decode {
        /// the file
        file: PathBuf,
        /// what the decoder said
        message: String,
    },
    /// a pods-dir file holds something other than a Pod
    #[error("{file}: kind {kind:?} where {expected} was expected")]
    WrongKind {
        /// the file
        file: PathBuf,
        /// the kind found
        kind: String,
        /// the kind wanted
        expected: &'static str,
    },
    /// an objects-dir document of a kind volumed does not read
    #[error(
        "{file}: unsupported kind {kind:?} (PersistentVolume, PersistentVolumeClaim, \
         CSIDriver or a List of them)"
    )]
    UnsupportedKind {
        /// the file
        file: PathBuf,
        /// the kind found
        kind: String,
    },
    /// a required field is missing or empty
    #[error("{file}: {field} is missing")]
    MissingField {
        /// the file
        file: PathBuf,
        /// the field, as a path (`metadata.name`)
        field: &'static str,
    },
    /// `metadata.uid` is not a safe pod UID
    #[error("{file}: {cause}")]
    InvalidPodUid {
        /// the file
        file: PathBuf,
        /// why
        cause: ModelError,
    },
    /// two manifests produce the same pod UID; the first file (sorted) wins
    #[error("{file}: pod uid {uid} is already used by {other}")]
    DuplicatePod {
        /// the file that lost
        file: PathBuf,
        /// the UID
        uid: PodUid,
        /// the file that won
        other: PathBuf,
    },
    /// two documents define the same object; the first (sorted by file) wins
    #[error("{file}: {kind} {name:?} is already defined in {other}")]
    DuplicateObject {
        /// the file that lost
        file: PathBuf,
        /// the kind
        kind: &'static str,
        /// the name (`namespace/name` for claims)
        name: String,
        /// the file that won
        other: PathBuf,
    },
    /// a pod volume breaks a rule (unsafe name, bad quantity, relative hostPath)
    #[error("{file}: volume {volume:?}: {reason}")]
    InvalidVolume {
        /// the pod manifest
        file: PathBuf,
        /// the pod's volume name
        volume: String,
        /// why
        reason: String,
    },
    /// a container field naming volumes breaks a rule (a `volumeDevices`
    /// entry that is not a volume of the pod); the volumes are still served
    #[error("{file}: pod {pod}: {reason}")]
    InvalidContainer {
        /// the pod manifest
        file: PathBuf,
        /// `namespace/name`
        pod: String,
        /// why, naming the container and the entry
        reason: String,
    },
    /// a pod volume of a type volumed has no plugin for
    #[error("{file}: volume {volume:?}: unsupported volume type {volume_type}")]
    UnsupportedVolume {
        /// the pod manifest
        file: PathBuf,
        /// the pod's volume name
        volume: String,
        /// the API name of its type (`secret`, `configMap`, …)
        volume_type: String,
    },
    /// a `persistentVolumeClaim` volume does not lead to a usable PV
    #[error("{file}: volume {volume:?}: persistentVolumeClaim {claim}: {reason}")]
    Claim {
        /// the pod manifest
        file: PathBuf,
        /// the pod's volume name
        volume: String,
        /// `namespace/claimName`
        claim: String,
        /// why, naming the PV and object files involved
        reason: String,
    },
    /// a PersistentVolume breaks a rule (relative local path, unknown access mode)
    #[error("{file}: PersistentVolume {pv:?}: {reason}")]
    InvalidPv {
        /// the objects file
        file: PathBuf,
        /// the PV's name
        pv: String,
        /// why
        reason: String,
    },
    /// a PersistentVolume of a type volumed has no plugin for
    #[error("{file}: PersistentVolume {pv:?}: unsupported volume type {volume_type}")]
    UnsupportedPv {
        /// the objects file
        file: PathBuf,
        /// the PV's name
        pv: String,
        /// the API name of its type (`nfs`, `hostPath`, …)
        volume_type: String,
    },
    /// writing the parsed-manifest cache (`manifest_cache.rs`) failed: a
    /// full disk, a read-only one; the file as it was is kept
    #[error("parsed-manifest cache: {step} {file}: {cause}")]
    WriteCache {
        /// `encode`, `write`, `rename into place`
        step: &'static str,
        /// the file the step failed on (the temp file, or the cache)
        file: PathBuf,
        /// the I/O error
        cause: std::io::Error,
    },
}

impl SourceError {
    /// The category, for callers to branch on.
    pub fn category(&self) -> SourceErrorCategory {
        match self {
            SourceError::ListDir { .. }
            | SourceError::ReadFile { .. }
            | SourceError::WriteCache { .. } => SourceErrorCategory::Io,
            SourceError::NotRegularFile { .. }
            | SourceError::TooLarge { .. }
            | SourceError::Parse { .. }
            | SourceError::Decode { .. }
            | SourceError::WrongKind { .. }
            | SourceError::MissingField { .. }
            | SourceError::InvalidPodUid { .. }
            | SourceError::InvalidVolume { .. }
            | SourceError::InvalidContainer { .. }
            | SourceError::InvalidPv { .. } => SourceErrorCategory::Invalid,
            SourceError::UnsupportedKind { .. }
            | SourceError::UnsupportedVolume { .. }
            | SourceError::UnsupportedPv { .. } => SourceErrorCategory::Unsupported,
            SourceError::Claim { .. } => SourceErrorCategory::Unresolved,
            SourceError::DuplicatePod { .. } | SourceError::DuplicateObject { .. } => {
                SourceErrorCategory::Conflict
            }
        }
    }
}
