//! A fake Kubernetes API server for tests: real HTTP/1.1 (plain http) on
//! 127.0.0.1, driven by the real `kube` client, on its own thread with its
//! own tokio runtime so synchronous tests can use it too.
//!
//! [`FakeApiServer::start`] binds a free port; [`write_kubeconfig`] writes a
//! kubeconfig (server URL, a bearer token the fake insists on, a current
//! context) for `kube::Config` or a `--kubeconfig` flag, and
//! [`client`](FakeApiServer::client) builds a `kube::Client` from it
//! ([`kube_client`] also has deadline-bound watcher helpers). Tests seed and
//! change objects with [`put`] and [`delete`] (which emit watch events like
//! any write), read them back with [`get`] and [`list`], inspect every
//! request with [`requests`], and break things: [`set_down`] (503 for every
//! request, open watches ended), [`stop`]/[`restart`] (connection refused,
//! then the same port again, state kept), [`cut_watches`] (connections
//! dropped mid-stream), [`compact`] (older resourceVersions answer 410),
//! and per request with [`faults`] rules (an error status, a watch that
//! hangs after its headers, a watch answered 410 round after round).
//!
//! # What it does as a real server does
//!
//! - Resources: core/v1 pods, nodes, persistentvolumes,
//!   persistentvolumeclaims, secrets, configmaps, events, serviceaccounts;
//!   storage.k8s.io/v1 csidrivers, csinodes, volumeattachments;
//!   events.k8s.io/v1 events. `/version`, `/api`, `/apis`, `/api/v1` and
//!   `/apis/<group>/v1` answer minimal discovery documents (kube's `Api<T>`
//!   and watcher never ask for them; its discovery module would).
//! - One global resourceVersion counter; lists in etcd key order; `limit`
//!   and `continue` paginate over a consistent snapshot at the first page's
//!   resourceVersion (rebuilt from the event history); `remainingItemCount`
//!   when no selector is given; `resourceVersion`/`resourceVersionMatch`
//!   validated and honoured (Exact reads the past, NotOlderThan and unset
//!   read now, and so does a version without a match, except on a
//!   paginated list, where it is read exactly, the legacy rule; a too-large
//!   version is 504, one before the compaction point 410 Expired for Exact
//!   and for a `continue` token). NotOlderThan with a compacted version is
//!   served, as the real server serves it.
//! - `fieldSelector` with `=`, `==`, `!=` on the field labels the real
//!   server supports per resource (unknown labels are 400), `labelSelector`
//!   with `=`, `==`, `!=`, `in`, `notin`, exists, `!`, `>`, `<`.
//! - Watches: newline-separated JSON events in a chunked response; events
//!   after the given resourceVersion replayed from the history; synthetic
//!   ADDED events for an unset or "0" version; `sendInitialEvents` (with
//!   the `k8s.io/initial-events-end` bookmark, and the real server's
//!   parameter checks); periodic BOOKMARKs when `allowWatchBookmarks`; an
//!   object leaving a watch's selector is DELETED to it (old state, new
//!   resourceVersion), one entering is ADDED; a version before the
//!   compaction point gets 200 and one ERROR event (Status 410 Expired),
//!   which is what makes kube's watcher relist; `timeoutSeconds` ends the
//!   stream cleanly.
//! - TokenRequest (`serviceaccounts/{sa}/token`, create only): a token
//!   distinct per request, bound to a pod that must exist (see `token.rs`
//!   for what it does not check).
//! - Writes: POST (409 AlreadyExists, `generateName`), PUT (409 Conflict on
//!   a stale `metadata.resourceVersion`), PATCH as JSON merge patch, JSON
//!   patch (RFC 6902), strategic merge and apply (see below), DELETE with
//!   uid/resourceVersion preconditions. A write to the object keeps the old
//!   `status` of a resource with a status subresource; a write to `/status`
//!   changes only `status`. uid, creationTimestamp, name and namespace
//!   cannot be changed. A write that changes nothing keeps the
//!   resourceVersion and sends no event. Errors are `Status` objects with
//!   the real reasons and codes.
//!
//! # What it does NOT reproduce
//!
//! - No admission, defaulting, validation or conversion: any JSON object is
//!   stored as given (a pod without containers, unknown fields, a node's
//!   status set on create). No `metadata.generation`, `managedFields`,
//!   owner-reference garbage collection or namespace lifecycle (namespaces
//!   need not exist). core/v1 and events.k8s.io/v1 events are separate
//!   stores, not two views of one.
//! - Authentication is one bearer token; no authorization (RBAC), no
//!   impersonation, no TLS, no HTTP/2, no protobuf, no compression, no
//!   CBOR, no `Table` output, no `fieldValidation`, no dry run.
//! - Deletion is immediate: no grace period (a pod is never seen with
//!   `deletionTimestamp` unless a test puts it there), no finalizers, no
//!   `propagationPolicy`; DELETE answers a Success Status, not the object.
//!   No DELETE of a collection.
//! - Strategic merge patch is applied as a JSON merge patch: a real server
//!   merges lists with a patch-merge key (containers by name, conditions by
//!   type) and understands `$patch`/`$retainKeys` directives; here every
//!   list is replaced. For plain lists without a merge key (a node's
//!   `status.volumesInUse`) both replace the list, so they agree. Apply
//!   (server-side apply) is the same merge plus create-if-missing and the
//!   `fieldManager` check: no field ownership, no conflicts, no removal of
//!   fields a manager stops applying.
//! - PUT on a missing object is 404 (some real resources create on update).
//! - No priority and fairness: never 429, no `Retry-After` on a 503, no
//!   request timeouts. (kube 5's client retries 429, 503 and 504 itself, up
//!   to 15 times from 5 ms backoff, so a short [`set_down`] is invisible to
//!   its callers; build the client without retries to see the 503s.)
//! - Bookmarks come every [`set_bookmark_interval`] (1 s by default) rather
//!   than the real server's roughly once a minute, and not at timeout.
//!   The default watch timeout is 30 min, not a random 30–60 min. A list
//!   or watch at a resourceVersion newer than the newest is 504 at once; a
//!   real server first waits up to 3 s for it to arrive.
//! - The event history grows until [`compact`]: a real server forgets
//!   events on its own (etcd compaction, a watch cache of bounded size), so
//!   a real watcher can see 410 without anyone asking for it.
//! - Pages are not capped by the server, and `limit` is honoured even with
//!   `resourceVersion=0` (older real servers ignore it there).
//!
//! [`write_kubeconfig`]: FakeApiServer::write_kubeconfig
//! [`put`]: FakeApiServer::put
//! [`delete`]: FakeApiServer::delete
//! [`get`]: FakeApiServer::get
//! [`list`]: FakeApiServer::list
//! [`requests`]: FakeApiServer::requests
//! [`set_down`]: FakeApiServer::set_down
//! [`stop`]: FakeApiServer::stop
//! [`restart`]: FakeApiServer::restart
//! [`cut_watches`]: FakeApiServer::cut_watches
//! [`compact`]: FakeApiServer::compact
//! [`set_bookmark_interval`]: FakeApiServer::set_bookmark_interval

pub mod faults;
mod http;
pub mod kube_client;
mod objects;
mod patch;
mod resources;
mod select;
mod store;
pub mod token;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use self::http::{Shared, lock};
use self::store::{State, new_uid, now_rfc3339};

/// One request as the fake saw it, with the status it answered (200 for a
/// watch, whose body is still streaming).
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// The raw query string, still percent-encoded.
    pub query: String,
    pub content_type: String,
    pub body: String,
    pub status: u16,
}

impl Recorded {
    /// One query parameter, decoded.
    pub fn param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }

    /// Whether this is a `watch=true` request.
    pub fn is_watch(&self) -> bool {
        self.param("watch").is_some_and(|w| w == "true" || w == "1")
    }

    /// Whether this is a list (a GET on a collection that is not a watch).
    pub fn is_list(&self) -> bool {
        self.method == "GET"
            && !self.is_watch()
            && matches!(
                resources::route(&self.path),
                resources::Route::Object { name: None, .. }
            )
    }
}

/// The running accept loop: how to stop it and learn that it stopped.
struct Serving {
    stop: oneshot::Sender<()>,
    stopped: std_mpsc::Receiver<()>,
}

/// The fake API server (see the module doc). Dropping it stops it.
pub struct FakeApiServer {
    shared: Shared,
    rt: Option<Runtime>,
    addr: SocketAddr,
    serving: Mutex<Option<Serving>>,
}

impl FakeApiServer {
    /// Starts a server on a free port of 127.0.0.1.
    pub fn start() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-apiserver")
            .enable_all()
            .build()
            .expect("build the fake API server's runtime");
        let listener = StdListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener
            .local_addr()
            .expect("local address of the fake API server");
        let token = format!("fake-token-{}", new_uid());
        let server = FakeApiServer {
            shared: Arc::new(Mutex::new(State::new(token))),
            rt: Some(rt),
            addr,
            serving: Mutex::new(None),
        };
        server.serve(listener);
        server
    }

    fn serve(&self, listener: StdListener) {
        listener
            .set_nonblocking(true)
            .expect("set the listener non-blocking");
        let rt = self
            .rt
            .as_ref()
            .expect("the runtime lives as long as the server");
        let listener = {
            let _guard = rt.enter();
            TcpListener::from_std(listener).expect("register the listener with tokio")
        };
        let (stop, stop_rx) = oneshot::channel();
        let (stopped_tx, stopped) = std_mpsc::channel();
        rt.spawn(accept_loop(
            listener,
            self.shared.clone(),
            self.url(),
            stop_rx,
            stopped_tx,
        ));
        *self
            .serving
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Serving { stop, stopped });
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bearer token every request must carry.
    pub fn token(&self) -> String {
        lock(&self.shared).token.clone()
    }

    /// Writes a kubeconfig with one cluster (this server), one user (its
    /// token) and a current context joining them.
    pub fn write_kubeconfig(&self, path: &Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\n\
             users:\n- name: fake\n  user:\n    token: {token}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n",
            url = self.url(),
            token = self.token(),
        );
        std::fs::write(path, text)
            .unwrap_or_else(|e| panic!("write kubeconfig {}: {e}", path.display()));
    }

    /// Creates or replaces an object, found by its `apiVersion`, `kind`,
    /// `metadata.namespace` (default "default" for namespaced kinds) and
    /// `metadata.name`. Keeps (or assigns) uid and creationTimestamp, sets
    /// the next resourceVersion, emits ADDED or MODIFIED to matching
    /// watches, and returns the stored object. Panics on a kind the fake
    /// does not serve.
    pub fn put(&self, mut obj: Value) -> Value {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_owned();
        let kind = obj["kind"].as_str().unwrap_or_default().to_owned();
        let res = resources::by_kind(&api_version, &kind)
            .unwrap_or_else(|| panic!("the fake API server does not serve {api_version} {kind}"));
        let r = &resources::RESOURCES[res];
        assert!(
            obj["metadata"].is_object(),
            "put: metadata must be an object"
        );
        let name = obj["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .expect("put: metadata.name")
            .to_owned();
        let namespace = if r.namespaced {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .filter(|n| !n.is_empty())
                .unwrap_or("default")
                .to_owned();
            obj["metadata"]["namespace"] = json!(ns);
            Some(ns)
        } else {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("namespace");
            }
            None
        };
        let k = objects::key(res, namespace.as_deref(), &name);
        let mut st = lock(&self.shared);
        let old = st
            .get(&k)
            .map(|o| o["metadata"].clone())
            .unwrap_or_default();
        for (field, fresh) in [("uid", new_uid()), ("creationTimestamp", now_rfc3339())] {
            if obj["metadata"][field].as_str().is_none_or(str::is_empty) {
                obj["metadata"][field] = old.get(field).cloned().unwrap_or(json!(fresh));
            }
        }
        st.commit(k, Some(obj))
    }

    /// Deletes an object, emitting DELETED; false if there was none.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> bool {
        let Some(res) = resources::by_kind(api_version, kind) else {
            return false;
        };
        let k = objects::key(res, namespace, name);
        let mut st = lock(&self.shared);
        if st.get(&k).is_none() {
            return false;
        }
        st.commit(k, None);
        true
    }

    /// One stored object.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let res = resources::by_kind(api_version, kind)?;
        lock(&self.shared)
            .get(&objects::key(res, namespace, name))
            .cloned()
    }

    /// Every stored object of a kind, in every namespace, in key order.
    pub fn list(&self, api_version: &str, kind: &str) -> Vec<Value> {
        resources::by_kind(api_version, kind)
            .map(|res| lock(&self.shared).all(res))
            .unwrap_or_default()
    }

    /// The current (newest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared).rv
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared).requests.clone()
    }

    pub fn clear_requests(&self) {
        lock(&self.shared).requests.clear();
    }

    /// While down, every request is answered 503 with a Status; going down
    /// ends every open watch (cleanly, as a server shutting down does).
    /// kube's default client retries the 503s for minutes before giving up
    /// (see [`kube_client`]).
    pub fn set_down(&self, down: bool) {
        let mut st = lock(&self.shared);
        st.down = down;
        if down {
            st.end_watches(false);
        }
    }

    /// How often an open watch that allows bookmarks gets one (for watches
    /// opened from now on).
    pub fn set_bookmark_interval(&self, every: Duration) {
        lock(&self.shared).bookmark_every = every;
    }

    /// Closes the listener and every open connection (watches break
    /// mid-stream); new connections are refused until [`restart`](Self::restart).
    pub fn stop(&self) {
        let serving = self
            .serving
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(s) = serving {
            let _ = s.stop.send(());
            // The accept loop acknowledges once the listener is closed and
            // every connection task is gone.
            let _ = s.stopped.recv_timeout(Duration::from_secs(10));
        }
        lock(&self.shared).end_watches(true);
    }

    /// Listens again on the same port, with the same state.
    pub fn restart(&self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match StdListener::bind(self.addr) {
                Ok(l) => break l,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("re-bind {}: {e}", self.addr),
            }
        };
        self.serve(listener);
    }

    /// Breaks every open watch mid-stream: the connection closes without
    /// the chunked body's end and without a final event.
    pub fn cut_watches(&self) {
        lock(&self.shared).end_watches(true);
    }

    /// Forgets the event history: a watch from an older resourceVersion
    /// gets a 410 ERROR event, an Exact list or a continue token 410 Gone.
    pub fn compact(&self) {
        lock(&self.shared).compact();
    }

    /// How many watches are open.
    pub fn open_watches(&self) -> usize {
        lock(&self.shared).open_watches()
    }

    /// How many watches of the resource `plural` (`configmaps`) are open.
    pub fn open_watches_of(&self, plural: &str) -> usize {
        lock(&self.shared).open_watches_of(plural)
    }

    /// Polls until `n` watches are open; false if `timeout` passes first.
    pub fn wait_for_watches(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.open_watches() < n {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(s) = self
            .serving
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = s.stop.send(());
        }
        // Allowed inside another runtime, unlike dropping a Runtime there.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Accepts connections until told to stop; then closes the listener and
/// every connection, and says so on `stopped`.
async fn accept_loop(
    listener: TcpListener,
    shared: Shared,
    url: String,
    mut stop: oneshot::Receiver<()>,
    stopped: std_mpsc::Sender<()>,
) {
    let addr = url.trim_start_matches("http://").to_owned();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                let addr = addr.clone();
                conns.spawn(async move {
                    let service = hyper::service::service_fn(move |req| http::handle(shared.clone(), addr.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
    let _ = stopped.send(());
}
