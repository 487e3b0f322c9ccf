//! `volumed-testdriver`: a CSI node plugin for integration tests that
//! behaves like a real one — real tmpfs and bind mounts (or ext4 on a
//! loop device, `ext4.rs`), a real loop device per raw block volume
//! (`loopdev.rs`), the spec's
//! validation and idempotency — run as a child process that tests can
//! SIGKILL and restart.
//!
//! It serves CSI Identity and Node on `--endpoint` and, with
//! `--registration-dir`, the kubelet registration API on
//! `<dir>/<name>-reg.sock` (as node-driver-registrar would). Every RPC is
//! appended to `<state>/calls.jsonl` before it does anything (and its
//! answer's code to `<state>/outcomes.jsonl` before it goes out), and
//! `<state>/faults.json` injects delays, errors, abnormal volumes,
//! hangs, undecodable replies and deaths (see `state.rs`). It prints `ready` once both sockets listen, and
//! on SIGTERM or SIGINT removes its sockets and exits 0.
//!
//! Not a product: it is built with the package so tests can find it
//! through `CARGO_BIN_EXE_volumed-testdriver`.

mod driver;
mod ext4;
mod identity;
mod loopdev;
mod mounts;
mod node;
mod state;

use std::convert::Infallible;
use std::fs;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use http_body_util::BodyExt;
use nix::sys::signal::{SigSet, Signal};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::tokio_stream::Stream;
use tonic::codegen::{BoxFuture, Service, http};

use volumed::csi::proto::csi_v1::{identity_server::IdentityServer, node_server::NodeServer};
use volumed::csi::proto::pluginregistration::registration_server::RegistrationServer;

use driver::{Caps, Driver};
use identity::{IdentityService, RegistrationService};
use node::NodeService;
use state::State;

/// How long shutdown waits for open connections before exiting anyway.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Parser, Debug)]
#[command(
    name = "volumed-testdriver",
    about = "A CSI node plugin with real tmpfs mounts, a call log and fault injection, for tests"
)]
struct Args {
    /// The driver name (GetPluginInfo, GetInfo).
    #[arg(long)]
    name: String,
    /// The CSI socket to serve (a path or `unix://PATH`).
    #[arg(long)]
    endpoint: String,
    /// Also serve the kubelet registration API on `DIR/<name>-reg.sock`.
    #[arg(long)]
    registration_dir: Option<PathBuf>,
    /// Where to keep the call log (`calls.jsonl`) and read faults
    /// (`faults.json`); none without it.
    #[arg(long)]
    state: Option<PathBuf>,
    /// The node id NodeGetInfo reports (default: the hostname).
    #[arg(long)]
    node_id: Option<String>,
    /// Do not advertise STAGE_UNSTAGE_VOLUME: NodePublish mounts a fresh
    /// tmpfs at the target.
    #[arg(long)]
    no_stage: bool,
    /// The node capabilities to advertise besides STAGE_UNSTAGE_VOLUME,
    /// comma-separated, among GET_VOLUME_STATS, VOLUME_CONDITION,
    /// VOLUME_MOUNT_GROUP (empty: none).
    #[arg(long, default_value = "GET_VOLUME_STATS,VOLUME_CONDITION", value_parser = Caps::parse)]
    caps: Caps,
    /// NodePublish on a target that is already a mount point mounts again
    /// on top (as some real drivers do) instead of answering OK.
    #[arg(long)]
    stack: bool,
    /// Refuse the block access type with INVALID_ARGUMENT, as a driver
    /// without raw block volumes does.
    #[arg(long)]
    no_block: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    // Before any thread exists: every thread inherits the mask, and only
    // the sigwait in `run` takes SIGTERM and SIGINT.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block().context("block SIGTERM and SIGINT")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let outcome = runtime.block_on(run(args, signals));
    // wait neither for handler tasks sleeping in a delay fault nor for the
    // signal waiter, still blocked in sigwait when a server failed
    runtime.shutdown_background();
    outcome
}

async fn run(args: Args, signals: SigSet) -> Result<()> {
    let node_id = match args.node_id {
        Some(id) => id,
        None => nix::unistd::gethostname()
            .context("hostname for the node id")?
            .to_string_lossy()
            .into_owned(),
    };
    let endpoint = args
        .endpoint
        .strip_prefix("unix://")
        .unwrap_or(&args.endpoint)
        .to_owned();
    let state = State::new(args.state.clone()).context("create the state dir")?;
    let driver = Arc::new(Driver {
        name: args.name.clone(),
        node_id,
        endpoint: endpoint.clone(),
        stage: !args.no_stage,
        caps: args.caps,
        stack: args.stack,
        block: !args.no_block,
        loops: Mutex::new(Default::default()),
        state,
        work_lock: Mutex::new(()),
    });

    let (stop, stopped) = watch::channel(false);
    let mut sockets = vec![PathBuf::from(&endpoint)];
    let csi = CsiServices {
        identity: IdentityServer::new(IdentityService(Arc::clone(&driver))),
        node: NodeServer::new(NodeService(Arc::clone(&driver))),
    };
    let mut servers = vec![serve(csi, listen(Path::new(&endpoint))?, stopped.clone())];
    if let Some(dir) = &args.registration_dir {
        fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let path = dir.join(format!("{}-reg.sock", args.name));
        let reg = RegistrationServer::new(RegistrationService(Arc::clone(&driver)));
        servers.push(serve(reg, listen(&path)?, stopped.clone()));
        sockets.push(path);
    }
    println!("ready");

    let waiter = tokio::task::spawn_blocking(move || signals.wait());
    let mut first_exit = Box::pin(futures_first(&mut servers));
    let outcome = tokio::select! {
        sig = waiter => {
            let sig = sig.context("signal waiter")?.context("sigwait")?;
            eprintln!("volumed-testdriver: {sig}, stopping");
            Ok(())
        }
        res = &mut first_exit => Err(anyhow!("a server stopped on its own: {res}")),
    };
    drop(first_exit);
    for s in &sockets {
        let _ = fs::remove_file(s);
    }
    let _ = stop.send(true);
    for server in servers {
        let _ = tokio::time::timeout(STOP_TIMEOUT, server).await;
    }
    outcome
}

/// Binds `path`, first removing a stale socket left by a killed driver.
fn listen(path: &Path) -> Result<UnixListener> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove stale {}", path.display())),
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("listen on {}", path.display()))
}

type ServerTask = tokio::task::JoinHandle<String>;

/// Serves `svc` on `listener` until `stopped` turns true; the task's
/// output says how the server ended.
fn serve<S>(svc: S, listener: UnixListener, mut stopped: watch::Receiver<bool>) -> ServerTask
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let incoming = Incoming(listener);
    tokio::spawn(async move {
        let res = tonic::transport::Server::builder()
            .serve_with_incoming_shutdown(svc, incoming, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
        match res {
            Ok(()) => "stopped".to_owned(),
            Err(e) => format!("failed: {e}"),
        }
    })
}

/// The connections a listener accepts, as the stream tonic serves (the
/// `tokio-stream` wrapper is a dev-dependency only).
struct Incoming(UnixListener);

impl Stream for Incoming {
    type Item = io::Result<UnixStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        self.0
            .poll_accept(cx)
            .map(|r| Some(r.map(|(stream, _)| stream)))
    }
}

/// The first server task to end, with what it said.
async fn futures_first(servers: &mut [ServerTask]) -> String {
    std::future::poll_fn(|cx| {
        for s in servers.iter_mut() {
            if let Poll::Ready(r) = Pin::new(s).poll(cx) {
                return Poll::Ready(r.unwrap_or_else(|e| format!("panicked: {e}")));
            }
        }
        Poll::Pending
    })
    .await
}

/// Identity and Node on one socket: tonic without its `router` feature
/// serves one service, so this dispatches on the gRPC path's service name.
#[derive(Clone)]
struct CsiServices {
    identity: IdentityServer<IdentityService>,
    node: NodeServer<NodeService>,
}

impl Service<http::Request<Body>> for CsiServices {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        // both generated servers are always ready
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let answer = if req.uri().path().starts_with("/csi.v1.Identity/") {
            self.identity.call(req)
        } else {
            self.node.call(req)
        };
        Box::pin(async move {
            let resp = answer.await?;
            if resp.extensions().get::<driver::GarbageReply>().is_none() {
                return Ok(resp);
            }
            Ok(garbage(resp))
        })
    }
}

/// `resp` with its body replaced by one well-framed gRPC message (not
/// compressed, its length right) whose bytes are not protobuf: a varint
/// longer than ten bytes, which every decoder refuses.
fn garbage(resp: http::Response<Body>) -> http::Response<Body> {
    const JUNK: [u8; 11] = [0xff; 11];
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(JUNK.len()).unwrap_or(0).to_be_bytes());
    frame.extend_from_slice(&JUNK);
    let (parts, _) = resp.into_parts();
    let body = http_body_util::Full::new(tonic::codegen::Bytes::from(frame))
        .map_err(|never| match never {});
    http::Response::from_parts(parts, Body::new(body))
}
