//! The HTTP side: one hyper service per connection that checks the bearer
//! token and the "down" switch, routes, runs the verb against the state,
//! records the request, and streams watches from their own task (events,
//! periodic bookmarks, `timeoutSeconds`, ends and cuts).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Recorded;
use super::objects::{self, Reply, key, parse_rv, status};
use super::resources::{RESOURCES, Route, route};
use super::select::Filter;
use super::store::{State, WatchFrom, WatchMsg, bookmark, line};

/// The state, shared by the connections, the watch tasks and the test.
pub type Shared = Arc<Mutex<State>>;

/// Locks the state, ignoring poisoning (a panicking test thread must not
/// take the server down with it).
pub fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A response body: a whole JSON document, or a watch stream fed by the
/// watch's task (an `Err` item breaks the connection mid-body).
pub enum Body {
    Full(Option<Bytes>),
    Stream(mpsc::UnboundedReceiver<Result<Bytes, io::Error>>),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match self.get_mut() {
            Body::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Body::Full(None) => SizeHint::with_exact(0),
            Body::Stream(_) => SizeHint::default(),
        }
    }
}

fn json_response(code: u16, body: &Value) -> Response<Body> {
    let mut resp = Response::new(Body::Full(Some(Bytes::from(body.to_string()))));
    *resp.status_mut() =
        hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Serves one request.
pub async fn handle(
    shared: Shared,
    addr: String,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let header = |name: hyper::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let content_type = header(hyper::header::CONTENT_TYPE);
    let auth = header(hyper::header::AUTHORIZATION);
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let q: HashMap<String, String> = form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let method = parts.method.as_str().to_owned();

    let mut st = lock(&shared);
    let reply = if auth != format!("Bearer {}", st.token) {
        Err(status(401, "Unauthorized", "Unauthorized"))
    } else if st.down {
        Err(status(
            503,
            "ServiceUnavailable",
            "the fake API server is down",
        ))
    } else if let Some(faulted) = st.faults.intercept(&method, &path, is_watch(&q)) {
        faulted
    } else {
        dispatch(
            &mut st,
            &shared,
            &addr,
            &method,
            &path,
            &q,
            &content_type,
            &body,
        )
    };
    let (code, resp) = match reply {
        Ok(stream) => (200, stream),
        Err((code, body)) => (code, json_response(code, &body)),
    };
    st.requests.push(Recorded {
        method,
        path,
        query,
        content_type,
        body: String::from_utf8_lossy(&body).into_owned(),
        status: code,
    });
    Ok(resp)
}

/// Whether the query asks for a watch.
fn is_watch(q: &HashMap<String, String>) -> bool {
    matches!(q.get("watch").map(String::as_str), Some("true" | "1"))
}

/// Routes one request. `Ok` is a watch's streaming response; every other
/// answer, success or not, is an `Err` reply to send as JSON.
#[allow(clippy::too_many_arguments)]
fn dispatch(
    st: &mut State,
    shared: &Shared,
    addr: &str,
    method: &str,
    path: &str,
    q: &HashMap<String, String>,
    content_type: &str,
    body: &[u8],
) -> Result<Response<Body>, Reply> {
    let not_found = || {
        status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let (res, namespace, name, sub) = match (method, route(path)) {
        ("GET", Route::Version) => return Err((200, version())),
        ("GET", Route::CoreVersions) => return Err((200, core_versions(addr))),
        ("GET", Route::Groups) => return Err((200, groups())),
        ("GET", Route::ResourceList { group, version }) => {
            return Err((200, resource_list(&group, &version)));
        }
        (
            _,
            Route::Object {
                res,
                namespace,
                name,
                sub,
            },
        ) => (res, namespace, name, sub),
        _ => return Err(not_found()),
    };
    // TokenRequest: a create subresource of service accounts
    if let ("POST", Some("token"), Some(ns), Some(n)) = (
        method,
        sub.as_deref(),
        namespace.as_deref(),
        name.as_deref(),
    ) && RESOURCES[res].plural == "serviceaccounts"
    {
        return Err(super::token::create(st, ns, n, body));
    }
    let to_status = match sub.as_deref() {
        None => false,
        Some("status") if RESOURCES[res].status => true,
        Some(_) => return Err(not_found()),
    };
    let ns = namespace.as_deref();
    Err(match (method, name) {
        ("GET", None) if matches!(q.get("watch").map(String::as_str), Some("true" | "1")) => {
            return watch(st, shared, res, namespace, q);
        }
        ("GET", None) => objects::list(st, res, namespace, q),
        ("POST", None) => objects::create(st, res, ns, body),
        ("GET", Some(n)) => objects::get(st, &key(res, ns, &n)),
        ("PUT", Some(n)) => objects::replace(st, key(res, ns, &n), to_status, body),
        ("PATCH", Some(n)) => {
            objects::patch(st, key(res, ns, &n), to_status, content_type, q, body)
        }
        ("DELETE", Some(n)) if !to_status => objects::delete(st, key(res, ns, &n), body),
        (m, _) => status(
            405,
            "MethodNotAllowed",
            format!("{m} is not supported on {path} by the fake"),
        ),
    })
}

/// Opens a watch: validates the parameters as the real server does, then
/// registers it and hands its stream to a task.
fn watch(
    st: &mut State,
    shared: &Shared,
    res: usize,
    namespace: Option<String>,
    q: &HashMap<String, String>,
) -> Result<Response<Body>, Reply> {
    let r = &RESOURCES[res];
    let filter = Filter::parse(
        r,
        namespace,
        q.get("fieldSelector").map(String::as_str),
        q.get("labelSelector").map(String::as_str),
    )
    .map_err(|m| status(400, "BadRequest", m))?;
    let flag = |k: &str| q.get(k).map(|v| v == "true" || v == "1");
    let bookmarks = flag("allowWatchBookmarks").unwrap_or(false);
    let initial = flag("sendInitialEvents");
    let rv_match = q
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or_default();
    let rv_text = q
        .get("resourceVersion")
        .map(String::as_str)
        .unwrap_or_default();
    let rv = parse_rv(rv_text)?;
    if initial.is_some() && rv_match != "NotOlderThan" {
        return Err(status(
            400,
            "BadRequest",
            "sendInitialEvents requires resourceVersionMatch=NotOlderThan",
        ));
    }
    if initial.is_none() && !rv_match.is_empty() {
        return Err(status(
            400,
            "BadRequest",
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    if initial == Some(true) && !bookmarks {
        return Err(status(
            400,
            "BadRequest",
            "sendInitialEvents requires allowWatchBookmarks=true",
        ));
    }
    let timeout = match q.get("timeoutSeconds").map(|t| t.parse::<u64>()) {
        None => Duration::from_secs(1800),
        Some(Ok(t)) => Duration::from_secs(t),
        Some(Err(_)) => {
            return Err(status(
                400,
                "BadRequest",
                "timeoutSeconds must be an integer",
            ));
        }
    };
    if let Some(n) = rv.filter(|n| *n > st.rv) {
        return Err(status(
            504,
            "Timeout",
            format!("Too large resource version: {n}, current: {}", st.rv),
        ));
    }
    let from = match (initial, rv) {
        (Some(true), _) => WatchFrom::Initial { end_bookmark: true },
        (Some(false), None | Some(0)) => WatchFrom::After(st.rv),
        (None, None | Some(0)) => WatchFrom::Initial {
            end_bookmark: false,
        },
        (_, Some(n)) => WatchFrom::After(n),
    };
    let (body_tx, body_rx) = mpsc::unbounded_channel();
    match st.watch(res, filter, from) {
        Ok((id, rx)) => {
            let every = st.bookmark_every;
            tokio::spawn(run_watch(
                shared.clone(),
                id,
                res,
                rx,
                body_tx,
                timeout,
                bookmarks.then_some(every),
            ));
        }
        Err(()) => {
            // A real server answers 200 and a single ERROR event; kube's
            // watcher relists on its code 410.
            let (_, mut expired) = status(
                410,
                "Expired",
                format!("too old resource version: {rv_text} ({})", st.compacted),
            );
            if let Some(m) = expired.as_object_mut() {
                m.remove("metadata");
            }
            let _ = body_tx.send(Ok(Bytes::from(line("ERROR", &expired))));
        }
    }
    let mut resp = Response::new(Body::Stream(body_rx));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// Feeds one watch's response until it times out, is ended or cut, or the
/// client goes away; then unregisters it.
async fn run_watch(
    shared: Shared,
    id: u64,
    res: usize,
    mut rx: mpsc::UnboundedReceiver<WatchMsg>,
    out: mpsc::UnboundedSender<Result<Bytes, io::Error>>,
    timeout: Duration,
    bookmark_every: Option<Duration>,
) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let every = bookmark_every.unwrap_or(Duration::from_secs(3600));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    // true: go on; false: the stream is over
    let forward = |msg: Option<WatchMsg>| match msg {
        Some(WatchMsg::Line(l)) => out.send(Ok(Bytes::from(l))).is_ok(),
        Some(WatchMsg::Abort) => {
            let _ = out.send(Err(io::Error::other("watch cut by the fake API server")));
            false
        }
        Some(WatchMsg::End) | None => false,
    };
    loop {
        // biased: queued events go out before the end or a bookmark
        tokio::select! {
            biased;
            msg = rx.recv() => if !forward(msg) { break },
            () = &mut deadline => break,
            () = out.closed() => break,
            _ = tick.tick(), if bookmark_every.is_some() => {
                // Drain what is queued under the lock, so the bookmark's
                // resourceVersion covers every event sent before it.
                let (rv, queued) = {
                    let st = lock(&shared);
                    let mut queued = Vec::new();
                    while let Ok(m) = rx.try_recv() {
                        queued.push(m);
                    }
                    (st.rv, queued)
                };
                if !queued.into_iter().all(|m| forward(Some(m))) {
                    break;
                }
                if out.send(Ok(Bytes::from(bookmark(res, rv, false)))).is_err() {
                    break;
                }
            }
        }
    }
    lock(&shared).unwatch(id);
}

fn version() -> Value {
    json!({"major": "1", "minor": "37", "gitVersion": "v1.37.0-fake", "gitCommit": "",
           "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25",
           "compiler": "gc", "platform": "linux/amd64"})
}

fn core_versions(addr: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}]})
}

fn groups() -> Value {
    let mut names: Vec<&str> = RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    names.dedup();
    let groups: Vec<Value> = names
        .into_iter()
        .map(|g| {
            let gv = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
            json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({"name": r.plural, "singularName": r.kind.to_lowercase(), "namespaced": r.namespaced,
            "kind": r.kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}));
        if r.status {
            resources.push(
                json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}
