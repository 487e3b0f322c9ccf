//! The binary's node conventions: `--log-format` (text
//! for a terminal, JSON lines for a log pipeline) and the glue between
//! `volumed run` and the service manager's notify protocol
//! ([`volumed::notify`]).

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::ValueEnum;

use volumed::daemon::notify::{self, Heartbeat, Notifier, Service};

/// How log lines are written to stderr.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Default)]
pub(crate) enum LogFormat {
    /// human-readable lines (coloured on a terminal)
    #[default]
    Text,
    /// one JSON object per line: `timestamp`, `level`, `target`, `fields`
    /// (`message` and the event's fields), for journald/Loki/Elasticsearch
    Json,
}

/// Installs the global subscriber: `VOLUMED_LOG` (tracing's env-filter
/// syntax, default `info`) in the chosen format, on stderr.
pub(crate) fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VOLUMED_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // no span lists: the daemon logs events, and a flat line per event
        // is what log pipelines index
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
    }
}

/// The binary's last word on a failure: in JSON mode through the log, so
/// a pipeline that reads JSON lines gets it as one; plain on stderr
/// otherwise, as it always was.
pub(crate) fn report_failure(format: LogFormat, e: &anyhow::Error) {
    match format {
        LogFormat::Json => tracing::error!("{e:#}"),
        LogFormat::Text => eprintln!("volumed: {e:#}"),
    }
}

/// The service manager's view of `volumed run`, from `$NOTIFY_SOCKET`
/// (nothing is sent without it). A set but unusable `$NOTIFY_SOCKET` is a
/// startup error: under `Type=notify` the unit would otherwise sit in
/// "activating" until its start timeout with no word of why.
pub(crate) fn service() -> Result<Arc<Service>> {
    let notifier = Notifier::from_env().context("the service manager's notify socket")?;
    Ok(Arc::new(Service::new(notifier)))
}

/// Starts the notify thread once the HTTP server serves: it sends
/// `READY=1` when the loop is ready (so `/readyz` already answers 200) and
/// then, with `$WATCHDOG_USEC` set for this process, pings the watchdog
/// while the reconciler loop beats.
pub(crate) fn watch(service: &Arc<Service>, heartbeat: Arc<Heartbeat>, listen: &str) -> Result<()> {
    let env = |k| std::env::var(k).ok();
    let watchdog = notify::watchdog_period(
        env(notify::WATCHDOG_USEC).as_deref(),
        env(notify::WATCHDOG_PID).as_deref(),
        std::process::id(),
    );
    if let Some(period) = watchdog {
        tracing::info!(
            ?period,
            "watchdog on: pinging while the reconciler loop beats"
        );
    }
    let text = format!("ready: volumes reconstructed, pod sources listed; serving {listen}");
    service
        .spawn(heartbeat, watchdog, text)
        .context("start the volumed-notify thread")?;
    Ok(())
}
