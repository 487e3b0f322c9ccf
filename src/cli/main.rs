//! The `volumed` binary: the command line and its edges (logging, signals,
//! exit codes, the service manager). One file per command (`run`, `dump`,
//! `reconstruct`, `health`, `wait_pod`, `mounts`), the flag groups of `run` in
//! `flags`, logging and the notify protocol's glue in `service`.
//! Everything else lives in the library.

mod dump;
mod flags;
mod health;
mod mounts;
mod reconstruct;
mod run;
mod service;
mod wait_pod;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use volumed::host::boot::read_boot_id;

/// Where the kubelet keeps its state: volumed's root by default.
const DEFAULT_ROOT: &str = "/var/lib/kubelet";
/// glibc malloc arenas for the whole process (`limit_malloc_arenas`): one.
/// A second arena fills with per-volume records too, so RSS per volume
/// grows with the threads; allocation is not what the threads contend on.
/// The daemon's own allocations go to jemalloc (one arena as well, see
/// `host::sys::malloc`); glibc's serves C code, or all of it when built
/// without the `jemalloc` feature.
const MALLOC_ARENAS: i32 = 1;

/// The process allocator (`host::sys::malloc` says why jemalloc).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its options from this symbol (its `malloc_conf`, under
/// the prefix its -sys crate builds it with) at the first allocation,
/// before `main`.
// SAFETY: the name is the one tikv-jemalloc-sys builds jemalloc to read
// (its `_rjem_` prefix), no other item exports it, and the type is that
// of jemalloc's `const char *malloc_conf`: a nullable pointer to a
// `'static` NUL-terminated string.
#[cfg(feature = "jemalloc")]
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_MALLOC_CONF: Option<&std::ffi::c_char> = volumed::host::sys::JEMALLOC_MALLOC_CONF;

#[derive(Parser, Debug)]
#[command(
    name = "volumed",
    version,
    about = "A Kubernetes node volume manager that journals every mount and knows exactly what is mounted after a restart"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written to stderr (`VOLUMED_LOG` sets the level).
    #[arg(long, value_enum, global = true, default_value_t = service::LogFormat::Text)]
    log_format: service::LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon.
    Run(Box<run::RunArgs>),
    /// Print the journal's records and the state they imply.
    Dump(dump::DumpArgs),
    /// Show what a restart would decide right now, per target (`--dry-run`).
    Reconstruct(reconstruct::ReconstructArgs),
    /// Every mounted volume's condition and usage, from the running daemon.
    Health(health::HealthArgs),
    /// Wait until a pod's volumes are mounted (asks the running daemon):
    /// exit 0 ready, 1 not ready or unknown pod, 2 no daemon to ask.
    WaitPod(wait_pod::WaitPodArgs),
    /// One container's mounts, its subpaths bound (asks the running
    /// daemon): exit 0 ready, 1 not ready or unknown pod or container, 2
    /// no daemon to ask.
    Mounts(mounts::MountsArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(crate) enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(crate) enum Format {
    Table,
    Json,
}

fn boot_id(file: Option<&Path>) -> Result<String> {
    Ok(read_boot_id(file)
        .context("read the boot id")?
        .as_str()
        .to_owned())
}

/// `path` made absolute against the working directory, without resolving
/// symlinks (`std::path::absolute`). Every path volumed is given becomes
/// absolute once at startup: the root is compared with the mount table's
/// absolute mount points, and a static pod's UID hashes its manifest's path,
/// so `--static-pods pods` and `--static-pods /abs/pods` must be the same
/// pods (a changed UID would tear down and delete the old pod's emptyDirs).
fn absolute(flag: &str, path: &Path) -> Result<PathBuf> {
    std::path::absolute(path)
        .with_context(|| format!("{flag} {}: make it absolute", path.display()))
}

fn main() -> ExitCode {
    // Before any thread starts: one malloc arena per busy thread costs RSS
    // per volume (see the function's docs); one is enough, as allocation
    // is not what the threads contend on (`MALLOC_ARENAS`).
    volumed::host::sys::limit_malloc_arenas(MALLOC_ARENAS);
    let cli = Cli::parse();
    service::init_logging(cli.log_format);
    let result = match cli.command {
        Command::Run(a) => run::run(*a),
        Command::Dump(a) => dump::dump(a),
        Command::Reconstruct(a) => reconstruct::reconstruct(a),
        Command::Health(a) => health::run(a),
        Command::WaitPod(a) => return wait_pod::main(a),
        Command::Mounts(a) => return mounts::main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            service::report_failure(cli.log_format, &e);
            match journal_refused(cli.log_format, &e) {
                Some(code) => code,
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// A failure the host caused (no space, a read-only or failing disk, no
/// descriptors), met by the journal or by another file under the root:
/// the journal is never moved aside for it nor a record dropped, so the
/// exit says so and uses `EX_TEMPFAIL` (75): a supervisor's restart loop
/// loses nothing, and the start that finds the disk writable again goes on
/// from the journal as it was. Mounted volumes are never touched by a
/// failing start.
fn journal_refused(format: service::LogFormat, e: &anyhow::Error) -> Option<ExitCode> {
    use volumed::journal::{Category, JournalError, environmental};
    const EX_TEMPFAIL: u8 = 75;
    let by_host = e.chain().any(|c| {
        c.downcast_ref::<JournalError>()
            .is_some_and(|j| j.category() == Category::Io)
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(environmental)
    });
    if !by_host {
        return None;
    }
    let note = "the host refused a write (above); the journal is intact and nothing was moved aside or lost: free space or repair the disk and start volumed again";
    match format {
        service::LogFormat::Json => tracing::error!("{note}"),
        service::LogFormat::Text => eprintln!("volumed: {note}"),
    }
    Some(ExitCode::from(EX_TEMPFAIL))
}
