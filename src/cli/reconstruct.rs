//! `volumed reconstruct --dry-run`: what a restart would decide now, per
//! target, from the journal (or a copy of it) and one read of the mount
//! table; nothing is changed.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use volumed::host::boot::read_boot_id;
use volumed::host::sys::LIVE_MOUNTINFO;
use volumed::model::Layout;
use volumed::reconstruct::edge::{self, HostInput, JournalInput};
use volumed::reconstruct::inspect::{InspectedJournal, inspect_journal};
use volumed::reconstruct::report::render_table;

use crate::{DEFAULT_ROOT, Format, OnOff, absolute};

#[derive(Args, Debug)]
pub(crate) struct ReconstructArgs {
    /// Required: only report what a restart would decide; change no mount
    /// and no journal record. (The real reconstruction runs inside `volumed run`.)
    #[arg(long)]
    dry_run: bool,
    /// The kubelet root dir (pods/ and plugins/ live under it).
    #[arg(long, default_value = DEFAULT_ROOT)]
    root_dir: PathBuf,
    /// The journal dir [default: <root-dir>/volumed]. Read without changing
    /// its records; when a running daemon holds it, a copy is read.
    #[arg(long)]
    journal_dir: Option<PathBuf>,
    /// `off` ignores the journal, as `run --journal off` does (KEP-3756).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    journal: OnOff,
    /// Replay a captured mount table instead of /proc/self/mountinfo
    /// (directories and vol_data.json are still read under --root-dir).
    #[arg(long)]
    mountinfo: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Test only: read the boot id from this file.
    #[arg(long, hide = true)]
    boot_id_file: Option<PathBuf>,
}

/// `reconstruct --dry-run`: the merge over the journal (read, or a copy of
/// it) and one read of the mount table, printed; nothing is changed.
pub(crate) fn reconstruct(mut args: ReconstructArgs) -> Result<()> {
    args.root_dir = absolute("--root-dir", &args.root_dir)?;
    if !args.dry_run {
        bail!(
            "reconstruction runs inside `volumed run` at startup; `volumed reconstruct` only shows what it would decide: add --dry-run"
        );
    }
    let boot = read_boot_id(args.boot_id_file.as_deref()).context("reconstruct --dry-run")?;
    let journal_dir = args
        .journal_dir
        .unwrap_or_else(|| args.root_dir.join("volumed"));
    let mountinfo = args
        .mountinfo
        .unwrap_or_else(|| PathBuf::from(LIVE_MOUNTINFO));
    let table = edge::read_mount_table(&mountinfo).context("reconstruct --dry-run")?;
    let inspected = match args.journal {
        OnOff::On => Some(inspect_journal(&journal_dir, boot.as_str())),
        OnOff::Off => None,
    };
    let input = inspected
        .as_ref()
        .map_or(JournalInput::Off, InspectedJournal::input);
    let layout = Layout::new(&args.root_dir);
    let host = HostInput {
        layout: &layout,
        table: &table,
        boot_id: &boot,
        sys: &volumed::host::sys::LinuxSys,
    };
    let mut report = edge::reconstruct(&host, input).report();
    if let Some(note) = inspected.as_ref().and_then(|i| i.note(&journal_dir)) {
        report.journal_note = Some(note);
    }
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Table => print!("{}", render_table(&report)),
    }
    Ok(())
}
