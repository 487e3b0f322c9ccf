//! The `volumed` binary: argument parsing and the edges (logging, signals,
//! exit codes). Everything else lives in the library.

mod api_flags;
mod conventions;
mod csi_flags;
mod health_cmd;
mod open_journal;
mod wait_pod;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use volumed::daemon::{Daemon, DaemonConfig};
use volumed::host::boot::read_boot_id;
use volumed::host::sys::LIVE_MOUNTINFO;
use volumed::host::sys::LinuxSys;
use volumed::model::{Layout, UniqueVolumeName};
use volumed::reconstruct::edge::{self, HostInput, JournalInput};
use volumed::reconstruct::inspect::{InspectedJournal, inspect_journal};
use volumed::reconstruct::report::render_table;
use volumed::selinux;
use volumed::server;
use volumed::server::DEFAULT_LISTEN;
use volumed::server::client::{self, JournalSource};
use volumed::server::daemon_file::DaemonFile;

const DEFAULT_ROOT: &str = "/var/lib/kubelet";
/// How long shutdown waits for the HTTP server, then for its tasks.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(10);
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
    #[arg(long, value_enum, global = true, default_value_t = conventions::LogFormat::Text)]
    log_format: conventions::LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon.
    Run(Box<RunArgs>),
    /// Print the journal's records and the state they imply.
    Dump(DumpArgs),
    /// Show what a restart would decide right now, per target (`--dry-run`).
    Reconstruct(ReconstructArgs),
    /// Every mounted volume's condition and usage, from the running daemon.
    Health(health_cmd::HealthArgs),
    /// Wait until a pod's volumes are mounted (asks the running daemon):
    /// exit 0 ready, 1 not ready or unknown pod, 2 no daemon to ask.
    WaitPod(wait_pod::WaitPodArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum SeLinuxMode {
    Auto,
    Enabled,
    Disabled,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Format {
    Table,
    Json,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The kubelet root dir (pods/ and plugins/ live under it).
    #[arg(long, default_value = DEFAULT_ROOT)]
    root_dir: PathBuf,
    /// The journal dir [default: <root-dir>/volumed].
    #[arg(long)]
    journal_dir: Option<PathBuf>,
    /// The node name [default: the hostname].
    #[arg(long)]
    node_name: Option<String>,
    /// A folder of Pod manifests (YAML or JSON), like the kubelet's staticPodPath.
    #[arg(long)]
    static_pods: Option<PathBuf>,
    /// A folder of PersistentVolume, PersistentVolumeClaim and CSIDriver objects.
    #[arg(long)]
    static_objects: Option<PathBuf>,
    /// Address for /metrics, /healthz, /readyz, /debug/*, /v1/* (also on <journal-dir>/api.sock).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: String,
    /// `off` ignores the journal and reconstructs like the kubelet (KEP-3756).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    journal: OnOff,
    /// SELinux mount support: `auto` detects it as /bin/mount does.
    #[arg(long, value_enum, default_value_t = SeLinuxMode::Auto)]
    selinux: SeLinuxMode,
    /// Feature gates, `Name=true|false,...`, with the kubelet's names.
    #[arg(long, value_delimiter = ',')]
    feature_gates: Vec<String>,
    #[command(flatten)]
    csi: csi_flags::CsiFlags,
    #[command(flatten)]
    api: api_flags::ApiFlags,
    /// Test only: read the boot id from this file.
    #[arg(long, hide = true)]
    boot_id_file: Option<PathBuf>,
    /// Test only: checkpoint the journal every N records (0: never).
    #[arg(long, hide = true, default_value_t = 10_000)]
    checkpoint_every: u64,
    /// Test only: how often the pod sources are polled, in milliseconds.
    #[arg(long, hide = true, default_value_t = 1000)]
    poll_ms: u64,
    /// Test only: worker threads for volume operations (0: the default).
    #[arg(long, hide = true, default_value_t = 0)]
    workers: usize,
    #[command(flatten)]
    health: health_cmd::HealthFlags,
}

#[derive(Args, Debug)]
struct DumpArgs {
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

#[derive(Args, Debug)]
struct ReconstructArgs {
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

fn boot_id(file: Option<&Path>) -> Result<String> {
    Ok(read_boot_id(file)
        .context("read the boot id")?
        .as_str()
        .to_owned())
}

/// `--selinux` and `--feature-gates` against what the host offers: a
/// startup error, never a stream of failing mounts.
fn selinux_policy(mode: SeLinuxMode, gates: &[String]) -> Result<selinux::Policy> {
    use selinux::host::{ETC_SELINUX, FileDefaults, HostFacts, decide};
    let gates = selinux::FeatureGates::parse(gates)?;
    let mode = match mode {
        SeLinuxMode::Auto => selinux::SeLinuxMode::Auto,
        SeLinuxMode::Enabled => selinux::SeLinuxMode::Enabled,
        SeLinuxMode::Disabled => selinux::SeLinuxMode::Disabled,
    };
    let facts = HostFacts::probe(Path::new(ETC_SELINUX));
    let policy = if decide(mode, &facts)? {
        let defaults = FileDefaults::read(Path::new(ETC_SELINUX));
        tracing::info!(
            ?gates,
            defaults = %defaults.source,
            kubernetes = selinux::gates::KUBERNETES_VERSION,
            "SELinux on: volumes that support it are mounted with -o context"
        );
        selinux::Policy::enabled(gates, defaults)
    } else {
        tracing::info!(
            ?mode,
            host = facts.missing().as_deref().unwrap_or("supports SELinux"),
            "SELinux mount labels off: no context= option is ever used"
        );
        selinux::Policy { gates, host: None }
    };
    Ok(policy)
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

fn run(mut args: RunArgs) -> Result<()> {
    args.root_dir = absolute("--root-dir", &args.root_dir)?;
    for (flag, p) in [
        ("--static-pods", &mut args.static_pods),
        ("--static-objects", &mut args.static_objects),
        ("--journal-dir", &mut args.journal_dir),
    ] {
        if let Some(p) = p {
            *p = absolute(flag, p)?;
        }
    }
    let api = args.api.config()?;
    let node_name = match args.node_name {
        Some(n) => n,
        None => nix::unistd::gethostname()
            .context("read the hostname for --node-name")?
            .to_string_lossy()
            .into_owned(),
    };
    let journal_dir = args
        .journal_dir
        .unwrap_or_else(|| args.root_dir.join("volumed"));
    let health = args.health.config(&mut args.feature_gates)?;
    let selinux = selinux_policy(args.selinux, &args.feature_gates)?;
    let boot = boot_id(args.boot_id_file.as_deref())?;
    std::fs::create_dir_all(&args.root_dir)
        .with_context(|| format!("create root dir {}", args.root_dir.display()))?;

    // Block the stop signals before any thread starts (tokio's included), so
    // every thread inherits the mask and only the main thread's sigwait
    // receives them.
    let mut stop = nix::sys::signal::SigSet::empty();
    stop.add(nix::sys::signal::Signal::SIGTERM);
    stop.add(nix::sys::signal::Signal::SIGINT);
    stop.thread_block().context("block SIGTERM and SIGINT")?;

    let service = conventions::service()?;
    let boot_id = volumed::host::boot::BootId::new(&boot)
        .with_context(|| format!("boot id {boot:?} is not a valid boot id"))?;
    let mut cfg = DaemonConfig::new(Layout::new(&args.root_dir), &node_name, boot_id);
    cfg.static_pods = args.static_pods.clone();
    cfg.static_objects = args.static_objects.clone();
    cfg.checkpoint_every = args.checkpoint_every;
    cfg.poll_interval = Duration::from_millis(args.poll_ms.max(10));
    if args.workers > 0 {
        cfg.workers = args.workers;
    }
    cfg.selinux = selinux;
    cfg.health = health;
    cfg.api = api;
    let metrics = Arc::new(volumed::metrics::Metrics::new()?);
    cfg.csi = Some(args.csi.setup(metrics.ops.csi_seconds.clone())?);
    service.status("opening the journal, listing the pod sources");
    // first: the manifest cache and the runtime API socket live there
    std::fs::create_dir_all(&journal_dir)
        .with_context(|| format!("create journal dir {}", journal_dir.display()))?;
    // opened while the sources list (a restart's two longest steps); an
    // error keeps its whole chain (the cause says what to do)
    let on = args.journal == OnOff::On;
    let open = |locked: &dyn Fn()| match on {
        false => {
            tracing::info!("journal off: reconstructing from the host alone, as the kubelet does");
            Ok((None, None))
        }
        true => {
            let (j, replaced) = open_journal::open(&journal_dir, &node_name, &boot, locked)
                .map_err(|e| volumed::daemon::DaemonError::JournalOpen(e.into()))?;
            service.status("reconstructing: the journal and one read of the mount table");
            Ok((Some(Arc::new(j)), replaced))
        }
    };
    let volumes = Daemon::start_opening(
        cfg,
        on.then(|| journal_dir.clone()),
        open,
        Arc::new(LinuxSys),
        metrics,
    )
    .context("start the daemon")?;
    let journal = volumes.journal();
    service.status("reconstructed; starting the HTTP server");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("volumed-http")
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let (tcp, bound) = rt.block_on(server::bind(&args.listen))?;
    let unix = rt.block_on(async { server::api_socket::bind(&journal_dir) });
    let unix = Some(unix.context("serve the runtime API socket")?);
    let daemon = DaemonFile::for_this_process(&bound.to_string(), &boot);
    daemon.write(&journal_dir)?;
    let provider = volumes.provider();
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let listeners = server::Listeners { tcp, unix };
    let server = rt.spawn(server::serve(listeners, provider, async {
        let _ = server_stopped.await;
    }));
    conventions::watch(&service, volumes.heartbeat(), &bound.to_string())?;
    tracing::info!(
        root = %args.root_dir.display(),
        journal = %journal_dir.display(),
        node = %node_name,
        listen = %bound,
        "volumed running; SIGTERM or SIGINT stops it"
    );

    let sig = stop.wait().context("wait for a stop signal")?;
    tracing::info!(signal = ?sig, "stopping: HTTP server, daemon.json, then the journal");
    service.stopping("stopping: finishing in-flight operations, flushing the journal");
    let _ = stop_server.send(());
    let stopped = rt.block_on(async { tokio::time::timeout(SERVER_STOP_TIMEOUT, server).await });
    if stopped.is_err() {
        tracing::warn!(timeout = ?SERVER_STOP_TIMEOUT, "the HTTP server did not stop in time");
    }
    // Drops every task still holding the provider (and so the journal).
    rt.shutdown_timeout(SERVER_STOP_TIMEOUT);
    // In-flight operations finish; nothing new starts.
    volumes.stop();
    if let Err(e) = daemon.remove(&journal_dir) {
        tracing::warn!("{e}");
    }
    if let Some(j) = journal {
        let j = Arc::try_unwrap(j).map_err(|_| {
            anyhow::anyhow!(
                "the journal is still in use by an HTTP request at shutdown; every acknowledged record is already durable"
            )
        })?;
        j.close().context("flush the journal on shutdown")?;
    }
    Ok(())
}

fn dump(args: DumpArgs) -> Result<()> {
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

/// `reconstruct --dry-run`: the merge over the journal (read, or a copy of
/// it) and one read of the mount table, printed; nothing is changed.
fn reconstruct(mut args: ReconstructArgs) -> Result<()> {
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

fn main() -> ExitCode {
    // Before any thread starts: one malloc arena per busy thread costs RSS
    // per volume (see the function's docs); two keep contention low.
    volumed::host::sys::limit_malloc_arenas(MALLOC_ARENAS);
    let cli = Cli::parse();
    conventions::init_logging(cli.log_format);
    let result = match cli.command {
        Command::Run(a) => run(*a),
        Command::Dump(a) => dump(a),
        Command::Reconstruct(a) => reconstruct(a),
        Command::Health(a) => health_cmd::run(a),
        Command::WaitPod(a) => return wait_pod::main(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            conventions::report_failure(cli.log_format, &e);
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
fn journal_refused(format: conventions::LogFormat, e: &anyhow::Error) -> Option<ExitCode> {
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
        conventions::LogFormat::Json => tracing::error!("{note}"),
        conventions::LogFormat::Text => eprintln!("volumed: {note}"),
    }
    Some(ExitCode::from(EX_TEMPFAIL))
}
