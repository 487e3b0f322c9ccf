//! `volumed run`'s CSI flags: the drivers to call and how long a call may
//! take.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use prometheus::HistogramVec;

use volumed::daemon::CsiSetup;

/// `volumed run`'s CSI flags.
#[derive(Args, Debug)]
pub(crate) struct CsiFlags {
    /// A CSI driver by name and socket, `NAME=SOCKET` (repeatable): for a
    /// node without node-driver-registrar. Drivers that register through
    /// `<root-dir>/plugins_registry/` are found without it.
    #[arg(long = "csi-driver", value_name = "NAME=SOCKET")]
    csi_driver: Vec<String>,
    /// Timeout of every CSI call, in seconds (the kubelet's: 120).
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    csi_timeout: u64,
    /// The kubelet's pod sync period: how often a CSI driver whose
    /// CSIDriver says `requiresRepublish` gets NodePublishVolume again for
    /// each mounted volume (`60s`, `5m`, `500ms`; `0s`: never).
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    sync_frequency: String,
}

impl CsiFlags {
    /// The daemon's CSI settings; `seconds` is `csi_operations_seconds`.
    /// Discovery through `plugins_registry/` is always on, as in the kubelet.
    pub(crate) fn setup(&self, seconds: HistogramVec) -> Result<CsiSetup> {
        let drivers = volumed::csi::registry::Drivers::from_flags(
            &self.csi_driver,
            Duration::from_secs(self.csi_timeout.max(1)),
            Some(seconds),
        )?;
        Ok(CsiSetup {
            drivers: Arc::new(drivers),
            discover: true,
            // `0s`: never (the health flags refuse zero; this one means it)
            republish_every: volumed::util::duration::parse_duration(
                "--sync-frequency",
                &self.sync_frequency,
            )?,
        })
    }
}
