//! What starting or stopping the daemon can fail with, by step.

use std::path::PathBuf;
use std::sync::Arc;

use super::startup::name_mounts;
use crate::journal::Journal;

/// What failed while starting or stopping, by step.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// the API server cannot be used (its kubeconfig, the in-cluster
    /// configuration)
    #[error("API server: {0}")]
    Api(crate::apiserver::ApiError),
    /// the CSI plugin registration watcher could not start
    #[error("start the CSI plugin registration watcher: {0}")]
    Csi(std::io::Error),
    /// creating the root dir failed
    #[error("create root dir {path}: {cause}")]
    RootDir {
        /// the dir
        path: PathBuf,
        /// the cause (printed inline, once: not a `source`)
        cause: std::io::Error,
    },
    /// making the root dir a shared mount failed
    #[error("make root dir {path} a shared mount: {cause}")]
    SharedRoot {
        /// the dir
        path: PathBuf,
        /// the cause (printed inline, once: not a `source`)
        cause: Box<crate::host::sys::SysError>,
    },
    /// the root dir is not a mount point, the mount holding it is not
    /// shared, and mounts exist beneath it: binding the root onto itself
    /// would hide or duplicate them
    #[error(
        "make root dir {path} a shared mount: it is not a mount point, the mount holding it ({holder}) is not shared, and {} mount(s) exist beneath it ({}); binding the root onto itself would hide or duplicate them. Make the holding mount shared (`mount --make-rshared {holder}`), or unmount them, then start volumed again",
        .mounts.len(),
        name_mounts(.mounts)
    )]
    MountsBeneathRoot {
        /// the root dir
        path: PathBuf,
        /// the mount point of the mount holding it
        holder: PathBuf,
        /// the mount points beneath it
        mounts: Vec<PathBuf>,
    },
    /// reconstruction failed (the journal refused its records)
    #[error("reconstruct")]
    Reconstruct(#[from] crate::reconstruct::ReconstructError),
    /// a thread could not be started
    #[error("start the {what} thread: {cause}")]
    Thread {
        /// which thread
        what: &'static str,
        /// the cause (printed inline, once: not a `source`)
        cause: std::io::Error,
    },
    /// the metrics could not be registered
    #[error("register the metrics")]
    Metrics(#[from] crate::metrics::MetricsError),
    /// the journal could not be opened
    /// ([`Daemon::start_opening`](super::Daemon::start_opening)): the
    /// opener's error, which names the step, kept whole as the source (the
    /// binary tells a journal the host refused from one moved aside)
    #[error("the journal could not be opened")]
    JournalOpen(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// What [`Daemon::start_opening`](super::Daemon::start_opening) gets from
/// its journal opener: the journal
/// (`None` with `--journal off`) and, when a fresh journal stands in for
/// one moved aside, why.
pub type OpenedJournal = (Option<Arc<Journal>>, Option<String>);
