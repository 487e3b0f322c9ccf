//! HTTP: the only module that knows it (ARCHITECTURE.md). The daemon serves
//! `GET /healthz`, `/readyz`, `/metrics`, `/debug/state`, `/debug/journal`,
//! `/debug/events` and `/debug/health` (a contract: docs/http.md), and the
//! runtime API's
//! `/v1/pods/<uid>/volumes` ([`runtime_api`]).
//!
//! *Who may ask* (`Scope`): the TCP listener (`--listen`) serves only
//! `/healthz`, `/readyz` and `/metrics`, as the kubelet serves only its
//! health check unauthenticated; everything else is on the unix socket
//! `<journal-dir>/api.sock` ([`api_socket`], mode 0600: root), and on TCP
//! only on the lab listener `--debug-listen`. A TCP client is refused the
//! node's pods and paths, and never holds one of the socket's long-poll
//! slots (the debug listener has its own, the probes listener none).
//! `dump`, `health` and `reconstruct --dry-run` ask the socket through [`client`] when the
//! daemon holds the journal, checking [`daemon_file`] first; `wait-pod`
//! asks through [`api_client`].
//!
//! The server knows nothing of the journal or the ASW: it asks a
//! [`DebugProvider`], so tests drive it with a fake over a real loopback
//! socket and the daemon plugs the real thing in.
//!
//! Stack: hyper 1 (HTTP/1 only) on tokio, routing by one `match` on the
//! path; see the comment in Cargo.toml for why not axum. Provider calls run
//! on tokio's blocking pool, since reading the journal is sled I/O.
//!
//! *Invariant:* every connection has a header-read timeout, and shutdown
//! waits a bounded time for in-flight requests, so neither a silent client
//! nor a slow one keeps the daemon from exiting.

pub mod api_client;
pub mod api_socket;
pub mod client;
pub mod daemon_file;
pub mod runtime_api;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};

use crate::dump::DumpDoc;
use crate::state::StateSnapshot;

/// `volumed run`'s default `--listen` address, for the probes and the
/// metrics alone (`Scope::Probes`). The DaemonSet's probes and the
/// Grafana dashboard's scrape use it (`tests/deploy.rs` checks).
pub const DEFAULT_LISTEN: &str = "127.0.0.1:10264";
/// The liveness endpoint: 200 while the server answers at all.
pub const HEALTHZ: &str = "/healthz";
/// The readiness endpoint: 200 once reconstruction is done and every pod
/// source has been listed.
pub const READYZ: &str = "/readyz";
/// The Prometheus endpoint.
pub const METRICS: &str = "/metrics";

/// The prometheus text exposition format's content type.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4";
/// How long a client may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for requests in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause after a failed `accept` (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What the server shows. `Send + Sync`: one instance serves every request.
/// Methods may block (they run on tokio's blocking pool).
pub trait DebugProvider: Send + Sync {
    /// `Ok` when reconstruction is done and the DSW is fully populated;
    /// otherwise why not, in one line.
    fn ready(&self) -> Result<(), String>;
    /// The metrics in prometheus text exposition format.
    fn metrics_text(&self) -> String;
    /// The live ASW.
    fn state(&self) -> StateSnapshot;
    /// The `dump` document, only records and state of `volume` when given.
    fn journal(&self, volume: Option<&str>) -> Result<DumpDoc, String>;
    /// Recent volume events, newest last (`/debug/events`).
    fn events(&self) -> Vec<crate::health::VolumeEvent> {
        Vec::new()
    }
    /// Every checked volume, or `volume` alone (`/debug/health[?volume=]`),
    /// after a pass over every volume asked for now when `fresh`; `None`
    /// when health checks are off.
    fn health(
        &self,
        fresh: bool,
        volume: Option<&str>,
    ) -> Option<crate::health::report::HealthDoc> {
        let _ = (fresh, volume);
        None
    }
    /// The runtime API's answer for `pod` now; `None`: no source knows it.
    fn pod_volumes(&self, pod: &crate::model::PodUid) -> Option<crate::runtime::PodVolumes> {
        let _ = pod;
        None
    }
    /// Whether none of `pod`'s targets is mounted now (`?unmounted=1`);
    /// `None`: this provider does not offer it (404).
    fn pod_unmounted(&self, pod: &crate::model::PodUid) -> Option<crate::runtime::PodUnmounted> {
        let _ = pod;
        None
    }
    /// One container's mounts (`/v1/pods/<uid>/containers/<name>/mounts`),
    /// its subpaths bound; `None`: no source knows the pod; `Err`: the pod
    /// has no such container (why, in one line).
    fn container_mounts(
        &self,
        pod: &crate::model::PodUid,
        container: &str,
    ) -> Option<Result<crate::runtime::ContainerMounts, String>> {
        let _ = (pod, container);
        None
    }
    /// A receiver that changes whenever `pod_volumes` may answer
    /// differently; `None`: no long-poll (a `wait` answers at once).
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
    /// The long-polls waiting now, told before each `metrics_text` and
    /// once more when the server has stopped (then none should be).
    fn long_polls_waiting(&self, waiting: LongPollsWaiting) {
        let _ = waiting;
    }
}

/// How many long-polls hold a slot now, per listener
/// (`volumed_runtime_api_long_polls`): read from the slots themselves, so
/// a slot never given back shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LongPollsWaiting {
    /// on the unix socket
    pub socket: usize,
    /// on `--debug-listen`
    pub debug: usize,
}

/// Where the server accepts: the TCP listener (probes and metrics), the
/// unix socket when there is one, and the debug listener when asked for.
#[derive(Debug)]
pub struct Listeners {
    /// `--listen`: `Scope::Probes`
    pub tcp: TcpListener,
    /// `<journal-dir>/api.sock` (its file goes when `serve` returns):
    /// `Scope::Full`
    pub unix: Option<api_socket::ApiSocket>,
    /// `--debug-listen`, a lab setting: `Scope::Full` over TCP, with
    /// long-poll slots of its own
    pub debug: Option<TcpListener>,
}

impl From<TcpListener> for Listeners {
    fn from(tcp: TcpListener) -> Self {
        Self {
            tcp,
            unix: None,
            debug: None,
        }
    }
}

/// What a listener serves; each knows every listener's long-poll slots
/// (for `/metrics`).
#[derive(Debug, Clone)]
enum Scope {
    /// `/healthz`, `/readyz`, `/metrics`: what a probe or a scraper on the
    /// node's network needs, and nothing about its pods; no long-poll
    /// slots, as none of these waits
    Probes(Slots),
    /// every endpoint, with the listener's own long-poll slots
    Full(Arc<runtime_api::LongPolls>, Slots),
}

/// Every listener's long-poll slots.
#[derive(Debug, Clone)]
struct Slots {
    socket: Arc<runtime_api::LongPolls>,
    debug: Arc<runtime_api::LongPolls>,
}

impl Slots {
    /// The long-polls waiting now.
    fn waiting(&self) -> LongPollsWaiting {
        LongPollsWaiting {
            socket: self.socket.waiting(),
            debug: self.debug.waiting(),
        }
    }
}

impl Scope {
    /// Whether a client of this scope may ask for `path`.
    fn serves(&self, path: &str) -> bool {
        match self {
            Scope::Full(..) => true,
            Scope::Probes(_) => matches!(path, HEALTHZ | READYZ | METRICS),
        }
    }

    fn slots(&self) -> &Slots {
        match self {
            Scope::Probes(s) | Scope::Full(_, s) => s,
        }
    }
}

/// The answer to `path` asked on a listener that does not serve it.
fn not_served(path: &str) -> Resp {
    text(
        StatusCode::FORBIDDEN,
        format!(
            "{path} is not served on this listener: ask the unix socket <journal-dir>/{} (root only), or a daemon run with --debug-listen\n",
            api_socket::API_SOCKET
        ),
    )
}

/// What went wrong, by step.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// binding the listen address failed
    #[error("bind {addr}: {cause}")]
    Bind {
        /// the address as given
        addr: String,
        /// the cause
        cause: std::io::Error,
    },
    /// reading back the bound address failed
    #[error("read the bound address of {addr}: {cause}")]
    LocalAddr {
        /// the address as given
        addr: String,
        /// the cause
        cause: std::io::Error,
    },
}

/// Binds `addr` (`ADDR:PORT`; port 0 picks a free one) and returns the
/// listener with the address it is bound to.
pub async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), ServerError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|cause| ServerError::Bind {
            addr: addr.to_owned(),
            cause,
        })?;
    let bound = listener
        .local_addr()
        .map_err(|cause| ServerError::LocalAddr {
            addr: addr.to_owned(),
            cause,
        })?;
    Ok((listener, bound))
}

/// The next connection on the unix socket; never, without one.
async fn accept_unix(unix: Option<&UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match unix {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// The next connection on the debug listener; never, without one.
async fn accept_tcp(debug: Option<&TcpListener>) -> std::io::Result<tokio::net::TcpStream> {
    match debug {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Serves until `shutdown` resolves, then stops accepting, answers every
/// long-poll with what is true then, lets requests in flight finish for a
/// bounded time, and returns.
pub async fn serve(
    listeners: impl Into<Listeners>,
    provider: Arc<dyn DebugProvider>,
    shutdown: impl Future<Output = ()>,
) {
    let Listeners { tcp, unix, debug } = listeners.into();
    let graceful = GracefulShutdown::new();
    let (stop_polls, stopping) = tokio::sync::watch::channel(false);
    // The socket's slots are its own: no TCP client can take one.
    let socket_polls = Arc::new(runtime_api::LongPolls::new(stopping.clone()));
    let debug_polls = Arc::new(runtime_api::LongPolls::new(stopping));
    let slots = Slots {
        socket: Arc::clone(&socket_polls),
        debug: Arc::clone(&debug_polls),
    };
    let socket = Scope::Full(socket_polls, slots.clone());
    let debug_scope = Scope::Full(debug_polls, slots.clone());
    let probes = Scope::Probes(slots.clone());
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            a = tcp.accept() => a.map(|(s, _)| {
                spawn_conn(s, probes.clone(), &provider, &graceful);
            }),
            a = accept_unix(unix.as_ref().map(|u| &u.listener)) => a.map(|s| {
                spawn_conn(s, socket.clone(), &provider, &graceful);
            }),
            a = accept_tcp(debug.as_ref()) => a.map(|s| {
                spawn_conn(s, debug_scope.clone(), &provider, &graceful);
            }),
        };
        if let Err(e) = accepted {
            tracing::warn!(error = %e, "http accept failed");
            tokio::time::sleep(ACCEPT_BACKOFF).await;
        }
    }
    drop(tcp);
    drop(unix);
    drop(debug);
    let _ = stop_polls.send(true);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            timeout = ?DRAIN_TIMEOUT,
            "http requests still in flight at shutdown were cut"
        );
    }
    provider.long_polls_waiting(slots.waiting());
}

/// Serves one connection on its own task, watched for shutdown.
fn spawn_conn<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: S,
    scope: Scope,
    provider: &Arc<dyn DebugProvider>,
    graceful: &GracefulShutdown,
) {
    let provider = Arc::clone(provider);
    let service = service_fn(move |req| {
        let (provider, scope) = (Arc::clone(&provider), scope.clone());
        async move { Ok::<_, Infallible>(route(provider, &scope, &req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    let conn = graceful.watch(conn);
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "http connection ended with an error");
        }
    });
}

type Resp = Response<Full<Bytes>>;

fn respond(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn text(status: StatusCode, body: impl Into<String>) -> Resp {
    respond(status, "text/plain; charset=utf-8", body.into())
}

/// One line, whatever the provider said: `/readyz` and errors are read by
/// probes and people.
fn one_line(s: &str) -> String {
    s.replace(['\r', '\n'], " ")
}

fn json(value: &impl serde::Serialize) -> Resp {
    match serde_json::to_vec_pretty(value) {
        Ok(mut body) => {
            body.push(b'\n');
            respond(StatusCode::OK, "application/json", body)
        }
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encode json: {e}\n"),
        ),
    }
}

/// The `volume` query parameter, percent-decoded; the first one wins.
fn volume_param(req: &Request<Incoming>) -> Option<String> {
    query_param(req, "volume")
}

fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    let query = req.uri().query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// Runs a provider call on the blocking pool.
async fn blocking<T: Send + 'static>(
    provider: Arc<dyn DebugProvider>,
    f: impl FnOnce(&dyn DebugProvider) -> T + Send + 'static,
) -> Result<T, Resp> {
    tokio::task::spawn_blocking(move || f(provider.as_ref()))
        .await
        .map_err(|e| {
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("provider failed: {}\n", one_line(&e.to_string())),
            )
        })
}

async fn route(provider: Arc<dyn DebugProvider>, scope: &Scope, req: &Request<Incoming>) -> Resp {
    let path = req.uri().path();
    let known = matches!(
        path,
        HEALTHZ
            | READYZ
            | METRICS
            | "/debug/state"
            | "/debug/journal"
            | "/debug/events"
            | "/debug/health"
    ) || runtime_api::is_pod_volumes(path)
        || runtime_api::is_container_mounts(path);
    if !known {
        return text(StatusCode::NOT_FOUND, format!("no such endpoint: {path}\n"));
    }
    if !scope.serves(path) {
        return not_served(path);
    }
    if req.method() != Method::GET {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    let result = match path {
        HEALTHZ => Ok(text(StatusCode::OK, "ok")),
        READYZ => blocking(provider, |p| p.ready()).await.map(|r| match r {
            Ok(()) => text(StatusCode::OK, "ok"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {}\n", one_line(&why)),
            ),
        }),
        METRICS => {
            let waiting = scope.slots().waiting();
            blocking(provider, move |p| {
                p.long_polls_waiting(waiting);
                p.metrics_text()
            })
            .await
        }
        .map(|m| respond(StatusCode::OK, METRICS_CONTENT_TYPE, m)),
        "/debug/state" => blocking(provider, |p| p.state()).await.map(|s| json(&s)),
        "/debug/events" => blocking(provider, |p| p.events()).await.map(|e| json(&e)),
        "/debug/health" => {
            let fresh = query_param(req, "fresh").is_some_and(|v| v == "1" || v == "true");
            let volume = volume_param(req);
            blocking(provider, move |p| p.health(fresh, volume.as_deref()))
                .await
                .map(|h| match h {
                    Some(doc) => json(&doc),
                    None => text(StatusCode::NOT_FOUND, "health checks are off\n"),
                })
        }
        "/debug/journal" => {
            let volume = volume_param(req);
            blocking(provider, move |p| p.journal(volume.as_deref()))
                .await
                .map(|r| match r {
                    Ok(doc) => json(&doc),
                    Err(e) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("read the journal: {}\n", one_line(&e)),
                    ),
                })
        }
        _ => match scope {
            Scope::Probes(_) => Ok(not_served(path)),
            Scope::Full(polls, _) if runtime_api::is_container_mounts(path) => {
                runtime_api::container_mounts(provider, req, polls).await
            }
            Scope::Full(polls, _) => runtime_api::pod_volumes(provider, req, polls).await,
        },
    };
    result.unwrap_or_else(|r| r)
}

#[cfg(test)]
mod tests;
