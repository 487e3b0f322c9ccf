//! The runtime API's long-polls on `/metrics`:
//! `volumed_runtime_api_long_polls{listener}`, the long-polls holding a
//! slot now (`listener`: `socket`, the unix socket, or `debug`,
//! `--debug-listen`), read from the server's slots when `/metrics` is
//! scraped. Each listener has `MAX_LONG_POLLS` (256) slots
//! (`server/runtime_api.rs`); one that never comes back shows here.
//! Both series exist at zero from the start.

use prometheus::{IntGaugeVec, Opts};

use super::{MetricsError, Registrar, register};

const LONG_POLLS: &str = "volumed_runtime_api_long_polls";
const LISTENERS: [&str; 2] = ["socket", "debug"];

/// The runtime API's series.
#[derive(Debug, Clone)]
pub struct RuntimeApiMetrics {
    long_polls: IntGaugeVec,
}

impl RuntimeApiMetrics {
    pub(super) fn new(r: &Registrar) -> Result<Self, MetricsError> {
        let long_polls = register(r, LONG_POLLS, || {
            IntGaugeVec::new(
                Opts::new(
                    LONG_POLLS,
                    "Runtime API long-polls waiting now (each holds one of its listener's slots).",
                ),
                &["listener"],
            )
        })?;
        for l in LISTENERS {
            long_polls.with_label_values(&[l]).set(0);
        }
        Ok(Self { long_polls })
    }

    /// Sets the long-polls waiting on the unix socket and on the debug
    /// listener.
    pub fn observe_long_polls(&self, socket: usize, debug: usize) {
        for (l, n) in LISTENERS.into_iter().zip([socket, debug]) {
            self.long_polls
                .with_label_values(&[l])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}
