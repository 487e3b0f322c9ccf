//! How the daemon runs: its settings, with the defaults of a kubelet node.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::host::boot::BootId;
use crate::model::Layout;

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// the kubelet layout (`--root-dir`)
    pub layout: Layout,
    /// `--node-name`
    pub node_name: String,
    /// `--static-pods`
    pub static_pods: Option<PathBuf>,
    /// `--static-objects`
    pub static_objects: Option<PathBuf>,
    /// the boot id now
    pub boot_id: BootId,
    /// worker threads for operations
    pub workers: usize,
    /// how often the sources are polled
    pub poll_interval: Duration,
    /// the loop's safety-net resync
    pub resync: Duration,
    /// journal records between checkpoints (0: never)
    pub checkpoint_every: u64,
    /// the SELinux label rules (`--selinux`, `--feature-gates`)
    pub selinux: crate::selinux::Policy,
    /// CSI: the driver registry (`--csi-driver`, and `plugins_registry/`
    /// when `discover` is set) and where Secrets come from; `None`: no CSI
    pub csi: Option<CsiSetup>,
    /// the Secrets of the static objects, which CSI calls read
    pub secrets: crate::sources::static_objects::SecretStore,
    /// the ConfigMaps and Secrets of the static objects, which payload
    /// volumes (configMap, secret, projected) read
    pub payload_objects: crate::sources::payload_objects::PayloadStore,
    /// the volume health monitor; `None`: no checks
    pub health: Option<crate::health::HealthConfig>,
    /// the API server as a pod source (`--kubeconfig`, `--in-cluster`)
    pub api: Option<crate::apiserver::ApiConfig>,
    /// the node's allocatable memory in bytes (`--node-allocatable-memory`,
    /// else `/proc/meminfo`'s MemTotal): the most a memory emptyDir gets;
    /// `None`: the kernel's tmpfs default for a pod without a limit
    pub node_memory: Option<u64>,
}

/// The daemon's CSI settings.
#[derive(Debug, Clone)]
pub struct CsiSetup {
    /// the drivers
    pub drivers: Arc<crate::csi::registry::Drivers>,
    /// watch `<root>/plugins_registry/` for registration sockets
    pub discover: bool,
    /// `--sync-frequency`: `requiresRepublish` volumes are published again
    /// this often (zero: never)
    pub republish_every: Duration,
}

impl DaemonConfig {
    /// Defaults for everything but the layout, node and boot id.
    pub fn new(layout: Layout, node_name: &str, boot_id: BootId) -> Self {
        Self {
            layout,
            node_name: node_name.to_owned(),
            static_pods: None,
            static_objects: None,
            boot_id,
            workers: 16,
            poll_interval: Duration::from_secs(1),
            resync: Duration::from_secs(30),
            checkpoint_every: 10_000,
            selinux: crate::selinux::Policy::disabled(),
            csi: None,
            secrets: Default::default(),
            payload_objects: Default::default(),
            node_memory: None,
            health: None,
            api: None,
        }
    }
}

impl DaemonConfig {
    /// The core's settings, made once from the daemon's: the one config
    /// that reaches the loop's core (`journal`: the journal is on; `csi`:
    /// the CSI plugin, whose call timeout bounds how long an uncertain
    /// call's path is watched for a late mount).
    pub(super) fn core_config(
        &self,
        journal: bool,
        csi: Option<&crate::plugins::CsiPlugin>,
    ) -> crate::reconciler::core::CoreConfig {
        use crate::reconciler::core::LATE_WINDOW_FLOOR;
        crate::reconciler::core::CoreConfig {
            layout: self.layout.clone(),
            journal,
            resync: self.resync,
            checkpoint_every: self.checkpoint_every,
            selinux: self.selinux.clone(),
            late_window: csi.map_or(Duration::ZERO, |c| {
                c.rpc_timeout().saturating_mul(4).max(LATE_WINDOW_FLOOR)
            }),
            republish_every: self
                .csi
                .as_ref()
                .map_or(Duration::ZERO, |c| c.republish_every),
        }
    }
}
