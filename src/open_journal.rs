//! The daemon's journal open: an inspection's lock waited for, a corrupt
//! journal (moved aside by `Journal::open`) replaced by a fresh one.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use volumed::journal::{Category, Journal, JournalConfig};

/// Opens the journal; a corrupt one has been moved aside by `open`, so the
/// daemon says so loudly and starts a fresh journal (host-only reconstruction).
/// Returns it with, when a fresh journal replaced a corrupt one, why.
/// `locked` runs once sled holds the journal's lock (`Journal::open_then`).
pub(crate) fn open(
    dir: &Path,
    node: &str,
    boot: &str,
    locked: &dyn Fn(),
) -> Result<(Journal, Option<String>)> {
    let cfg = JournalConfig::new(dir, node, boot);
    // An inspection tool (`dump`, `reconstruct --dry-run`) may hold sled's
    // lock for a moment; wait for it rather than fail the start.
    let started = Instant::now();
    let mut opened = Journal::open_then(&cfg, locked);
    let deadline = Instant::now() + Duration::from_secs(10);
    while matches!(&opened, Err(e) if e.category() == Category::Busy) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        opened = Journal::open_then(&cfg, locked);
    }
    match opened {
        Ok((j, replay)) => {
            tracing::info!(
                phase = "journal_open",
                elapsed_ms = volumed::elapsed_ms(started.elapsed()),
                records = replay.tail.len(),
                targets = j.with_state(|s| s.len()),
                checkpoint = ?replay.checkpoint.as_ref().map(|c| c.through_seq),
                "journal opened"
            );
            if let Some(c) = &replay.corruption {
                tracing::error!(seq = c.seq, reason = %c.reason, quarantined = replay.quarantined.len(),
                    "journal replay stopped at a bad record; later records were quarantined");
            }
            Ok((j, None))
        }
        Err(e) if e.category() == Category::Corruption => {
            tracing::error!("{e}; reconstructing from the host alone with a fresh journal");
            let (j, _) = Journal::open(&cfg)
                .context("open a fresh journal after moving the old one aside")?;
            Ok((j, Some(e.to_string())))
        }
        Err(e) => Err(e).context("open the journal"),
    }
}
