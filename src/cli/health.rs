//! The binary's health flags and the `volumed health` command.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use volumed::health::{self, HealthConfig};
use volumed::server::client;

/// `volumed run`'s health flags.
#[derive(Args, Debug)]
pub(crate) struct HealthFlags {
    /// How often every mounted volume is checked (the kubelet's volume
    /// stats period): `60s`, `5m`, `500ms`.
    #[arg(long, default_value = "60s")]
    health_period: String,
    /// How long one volume's check may take before it is abandoned and
    /// counted (`volumed_health_check_timeouts_total`).
    #[arg(long, default_value = "10s")]
    health_check_timeout: String,
    /// `off` runs no health checks.
    #[arg(long, value_parser = ["on", "off"], default_value = "on")]
    health: String,
}

impl HealthFlags {
    /// The monitor's settings, taking `CSIVolumeHealth` out of the gates.
    pub(crate) fn config(&self, gates: &mut Vec<String>) -> Result<Option<HealthConfig>> {
        let csi_condition = health::take_gate(gates)?;
        if self.health == "off" {
            return Ok(None);
        }
        Ok(Some(HealthConfig {
            period: health::parse_duration("--health-period", &self.health_period)?,
            timeout: health::parse_duration("--health-check-timeout", &self.health_check_timeout)?,
            csi_condition,
        }))
    }
}

/// `volumed health`.
#[derive(Args, Debug)]
pub(crate) struct HealthArgs {
    /// The journal dir of the running daemon (its daemon.json names it).
    #[arg(long, default_value = "/var/lib/kubelet/volumed")]
    journal_dir: PathBuf,
    /// Output format: `table` or `json`.
    #[arg(long, value_parser = ["table", "json"], default_value = "table")]
    format: String,
    /// Report the last pass instead of asking for one now.
    #[arg(long)]
    cached: bool,
    /// Report this volume alone (its unique name, as `dump` shows it); a
    /// pass asked for now still checks every volume.
    #[arg(long)]
    volume: Option<String>,
}

/// Asks the running daemon and prints every volume's condition and usage.
pub(crate) fn run(args: HealthArgs) -> Result<()> {
    // a fresh pass waits for the slowest check; leave it room
    let doc = client::ask_health(
        &args.journal_dir,
        !args.cached,
        args.volume.as_deref(),
        Duration::from_secs(60),
    )
    .context("ask the running daemon for volume health")?;
    if args.format == "json" {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", health::report::render_table(&doc));
    }
    Ok(())
}
