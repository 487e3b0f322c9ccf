//! The binary's API-server flags (kept apart from `main.rs`, as the CSI
//! and health flags are).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;

use volumed::apiserver::{ApiConfig, Connection};

/// `volumed run`'s API-server flags.
#[derive(Args, Debug)]
pub struct ApiFlags {
    /// Take pods (this node's), PersistentVolumes, claims, CSIDrivers and
    /// VolumeAttachments from the API server this kubeconfig names (its
    /// current context), beside the static pods.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The same from the API server of the cluster volumed runs in as a
    /// pod (its service account token and CA, as every in-cluster client).
    #[arg(long, conflicts_with = "kubeconfig")]
    in_cluster: bool,
}

impl ApiFlags {
    /// The API source's settings; `None` without either flag.
    pub fn config(&self) -> Result<Option<ApiConfig>> {
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
        Ok(Some(ApiConfig { connection }))
    }
}
