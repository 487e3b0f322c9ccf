//! `volumed run`: its flags, the SELinux policy they select, the journal's
//! opening (an inspection's lock waited for, a corrupt journal replaced by
//! a fresh one), the daemon's start, the HTTP server, and the stop on
//! SIGTERM or SIGINT.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use volumed::daemon::{Daemon, DaemonConfig};
use volumed::host::sys::LinuxSys;
use volumed::journal::{Category, Journal, JournalConfig};
use volumed::model::Layout;
use volumed::selinux;
use volumed::server;
use volumed::server::DEFAULT_LISTEN;
use volumed::server::daemon_file::DaemonFile;

use crate::flags::{api, csi};
use crate::{DEFAULT_ROOT, OnOff, absolute, boot_id, health, service};

/// How long shutdown waits for the HTTP server, then for its tasks.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(10);
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub(crate) enum SeLinuxMode {
    Auto,
    Enabled,
    Disabled,
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
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
    /// A folder of PersistentVolume, PersistentVolumeClaim, CSIDriver,
    /// VolumeAttachment, Secret and ConfigMap objects.
    #[arg(long)]
    static_objects: Option<PathBuf>,
    /// Address for /metrics, /healthz and /readyz only; every endpoint is on
    /// <journal-dir>/api.sock (root only).
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: String,
    /// A lab setting: also serve every endpoint (/debug/*, /v1/*), without
    /// authentication, on this TCP address.
    #[arg(long, value_name = "ADDR:PORT")]
    debug_listen: Option<String>,
    /// The node's allocatable memory (a quantity, e.g. `15Gi`): the most a
    /// memory emptyDir gets [default: MemTotal in /proc/meminfo].
    #[arg(long, value_name = "QUANTITY", value_parser = parse_memory)]
    node_allocatable_memory: Option<u64>,
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
    csi: csi::CsiFlags,
    #[command(flatten)]
    api: api::ApiFlags,
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
    health: health::HealthFlags,
}

/// `--node-allocatable-memory`: a quantity of bytes above zero.
fn parse_memory(s: &str) -> Result<u64, String> {
    match volumed::sources::quantity::parse_bytes(s)? {
        0 => Err("must be above zero".to_owned()),
        n => Ok(n),
    }
}

/// The node's allocatable memory: the flag, else MemTotal; none (the
/// kernel's tmpfs default) when neither can be had, said once.
fn node_memory(flag: Option<u64>) -> Option<u64> {
    use volumed::host::meminfo::{MEMINFO_PATH, read_mem_total};
    if flag.is_some() {
        return flag;
    }
    match read_mem_total(Path::new(MEMINFO_PATH)) {
        Ok(Some(n)) => Some(n),
        Ok(None) => {
            tracing::warn!(
                path = MEMINFO_PATH,
                "no MemTotal: memory emptyDirs without a limit get the kernel's tmpfs size"
            );
            None
        }
        Err(e) => {
            tracing::warn!(path = MEMINFO_PATH, error = %e, "memory emptyDirs without a limit get the kernel's tmpfs size");
            None
        }
    }
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

pub(crate) fn run(mut args: RunArgs) -> Result<()> {
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

    let service = service::service()?;
    let boot_id = volumed::host::boot::BootId::new(&boot)
        .with_context(|| format!("boot id {boot:?} is not a valid boot id"))?;
    let mut cfg = DaemonConfig::new(Layout::new(&args.root_dir), &node_name, boot_id);
    cfg.static_pods = args.static_pods.clone();
    cfg.static_objects = args.static_objects.clone();
    cfg.checkpoint_every = args.checkpoint_every;
    cfg.node_memory = node_memory(args.node_allocatable_memory);
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
            let (j, replaced) = open_journal(&journal_dir, &node_name, &boot, locked)
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
    let debug = match &args.debug_listen {
        None => None,
        Some(addr) => {
            let (l, at) = rt.block_on(server::bind(addr)).context("--debug-listen")?;
            tracing::warn!(debug_listen = %at,
                "every endpoint, the node's pods and paths included, is served without authentication on the debug listener: a lab setting");
            Some((l, at))
        }
    };
    let daemon = DaemonFile::for_this_process(&bound.to_string(), &boot)
        .with_debug_listen(debug.as_ref().map(|(_, at)| at.to_string()));
    let debug = debug.map(|(l, _)| l);
    daemon.write(&journal_dir)?;
    let provider = volumes.provider();
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let listeners = server::Listeners { tcp, unix, debug };
    let server = rt.spawn(server::serve(listeners, provider, async {
        let _ = server_stopped.await;
    }));
    service::watch(&service, volumes.heartbeat(), &bound.to_string())?;
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

/// Opens the journal; a corrupt one has been moved aside by `open`, so the
/// daemon says so loudly and starts a fresh journal (host-only reconstruction).
/// Returns it with, when a fresh journal replaced a corrupt one, why.
/// `locked` runs once sled holds the journal's lock (`Journal::open_then`).
fn open_journal(
    dir: &Path,
    node: &str,
    boot: &str,
    locked: &dyn Fn(),
) -> Result<(Journal, Option<String>)> {
    // An inspection tool (`dump`, `reconstruct --dry-run`) may hold sled's
    // lock for a moment: the open waits for it (`JournalConfig::lock_wait`)
    // rather than fail the start.
    let cfg = JournalConfig::new(dir, node, boot);
    let started = Instant::now();
    match Journal::open_then(&cfg, locked) {
        Ok((j, replay)) => {
            tracing::info!(
                phase = "journal_open",
                elapsed_ms = volumed::util::time::elapsed_ms(started.elapsed()),
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
