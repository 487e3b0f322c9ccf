//! `volumed dump`: the journal's records and the state they imply, read
//! from the journal or, while a daemon holds it, asked of the daemon.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use volumed::model::UniqueVolumeName;
use volumed::server::client::{self, JournalSource};

use crate::{Format, boot_id};

#[derive(Args, Debug)]
pub(crate) struct DumpArgs {
    /// The journal dir.
    #[arg(long, default_value = "/var/lib/kubelet/volumed")]
    journal_dir: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Only this unique volume name (exact).
    #[arg(long)]
    volume: Option<String>,
    /// Test only: read the boot id from this file.
    #[arg(long, hide = true)]
    boot_id_file: Option<PathBuf>,
}

pub(crate) fn dump(args: DumpArgs) -> Result<()> {
    let boot = boot_id(args.boot_id_file.as_deref())?;
    // A running daemon holds sled's lock: then the same document comes from
    // its GET /debug/journal.
    let source = client::open_or_ask(
        &args.journal_dir,
        &boot,
        args.volume.as_deref(),
        client::DEFAULT_TIMEOUT,
    )
    .context("dump")?;
    let doc = match source {
        JournalSource::Local(replay, state) => {
            let only = args.volume.map(UniqueVolumeName::from_raw);
            volumed::dump::document(&replay, &state, &boot, only.as_ref())
        }
        JournalSource::Daemon { doc, daemon } => {
            tracing::debug!(pid = daemon.pid, listen = %daemon.listen, "read the journal from the running daemon");
            doc
        }
    };
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&doc)?),
        Format::Table => print!("{}", volumed::dump::render_table(&doc, &args.journal_dir)),
    }
    Ok(())
}
