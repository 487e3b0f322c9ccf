//! `volumed run`'s API-server flags: the cluster as a pod source.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use volumed::apiserver::{ApiConfig, Connection};

/// `volumed run`'s API-server flags.
#[derive(Args, Debug)]
pub(crate) struct ApiFlags {
    /// Take pods (this node's), PersistentVolumes, claims, CSIDrivers and
    /// VolumeAttachments from the API server this kubeconfig names (its
    /// current context), beside the static pods.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The same from the API server of the cluster volumed runs in as a
    /// pod (its service account token and CA, as every in-cluster client).
    #[arg(long, conflicts_with = "kubeconfig")]
    in_cluster: bool,
    /// How often the node's `status.volumesInUse`, its CSINode and the
    /// node id annotation are checked and, when changed, written (the
    /// kubelet's flag and default).
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    node_status_update_frequency: String,
    /// Test only: every watch's timeout (kube's 290 s), which also bounds
    /// how long a watch that went silent is believed.
    #[arg(long, hide = true, value_name = "DURATION", default_value = "290s")]
    api_watch_timeout: String,
}

impl ApiFlags {
    /// The API source's settings; `None` without either flag.
    pub(crate) fn config(&self) -> Result<Option<ApiConfig>> {
        let connection = match (&self.kubeconfig, self.in_cluster) {
            (Some(path), false) => {
                if !path.is_file() {
                    bail!("--kubeconfig {}: no such file", path.display());
                }
                Connection::Kubeconfig(path.clone())
            }
            (None, true) => Connection::InCluster,
            (None, false) => return Ok(None),
            (Some(_), true) => bail!("--kubeconfig and --in-cluster exclude each other"),
        };
        let every = volumed::util::duration::parse_duration(
            "--node-status-update-frequency",
            &self.node_status_update_frequency,
        )?;
        if every.is_zero() {
            bail!("--node-status-update-frequency must be more than zero");
        }
        let watch_timeout = volumed::util::duration::parse_duration(
            "--api-watch-timeout",
            &self.api_watch_timeout,
        )?;
        if watch_timeout < std::time::Duration::from_secs(1) {
            bail!("--api-watch-timeout must be at least 1s");
        }
        Ok(Some(ApiConfig {
            connection,
            node_status_every: every,
            watch_timeout,
        }))
    }
}
