//! Faults a test injects into the fake API server: an answer other than
//! the real one for the requests that match a rule, the way a sick real
//! server misbehaves — an error status (a 500 on every list of pods), a
//! watch that sends its headers and then nothing ever again, a watch
//! answered `410 Gone` round after round.
//!
//! Rules are checked in the order they were added; the first that matches
//! a request and still has uses left answers it, and nothing else is
//! looked at (the request is still recorded, with the status it got). A
//! faulted request changes no state. The rules hook into the request
//! handler after the token and [`set_down`](super::FakeApiServer::set_down)
//! checks, before routing.
//!
//! A hung watch's stream is held open (headers sent, no byte after them)
//! until the fake is dropped: only the client can end it, by giving up.

use std::io;
use std::time::Instant;

use hyper::Response;
use hyper::body::Bytes;
use tokio::sync::mpsc;

use super::http::{Body, lock};
use super::objects::{Reply, status};
use super::store::line;

/// Which requests of a path a rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// `GET` with `watch=true`
    Watch,
    /// `GET` of the collection, not a watch
    List,
    /// any request on the path
    Any,
}

/// What a faulted request is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// This status code, with a `Status` body (`500 InternalError`, …).
    Status(u16),
    /// A watch's `200` and headers, then nothing, never ended.
    HangWatch,
    /// A watch's `200` and one `ERROR` event carrying `410 Expired`, then
    /// the end of the stream: what a real server sends a watch whose
    /// resourceVersion it no longer has.
    GoneWatch,
}

/// One rule: `action` for the requests on `path` (exact, e.g.
/// `/api/v1/pods`) of `verb`, `times` times (`None`: until cleared).
#[derive(Clone, Debug)]
pub struct Fault {
    pub path: String,
    pub verb: Verb,
    pub action: Action,
    pub times: Option<usize>,
}

impl Fault {
    /// `action` on every request of `verb` on `path` until cleared.
    pub fn always(path: &str, verb: Verb, action: Action) -> Self {
        Fault {
            path: path.to_owned(),
            verb,
            action,
            times: None,
        }
    }

    /// `action` on the next `n` requests of `verb` on `path`.
    pub fn times(path: &str, verb: Verb, action: Action, n: usize) -> Self {
        Fault {
            times: Some(n),
            ..Fault::always(path, verb, action)
        }
    }
}

/// One faulted request: the rule's index (in the order added since the
/// last clear) and when it was answered.
#[derive(Clone, Debug)]
pub struct Hit {
    pub rule: usize,
    pub at: Instant,
}

/// The rules in force, what they answered, and the hung watches' senders.
#[derive(Default)]
pub struct Faults {
    rules: Vec<Fault>,
    hits: Vec<Hit>,
    hung: Vec<mpsc::UnboundedSender<Result<Bytes, io::Error>>>,
}

impl Faults {
    /// The answer of the first live rule matching the request, if any
    /// (`Ok`: a streamed watch response; `Err`: a reply to send as JSON,
    /// as the handler's dispatch returns them).
    pub fn intercept(
        &mut self,
        method: &str,
        path: &str,
        watch: bool,
    ) -> Option<Result<Response<Body>, Reply>> {
        let verb_matches = |v: Verb| match v {
            Verb::Any => true,
            Verb::Watch => method == "GET" && watch,
            Verb::List => method == "GET" && !watch,
        };
        let i = self.rules.iter().position(|r| {
            r.path == path && verb_matches(r.verb) && r.times.is_none_or(|n| n > 0)
        })?;
        let rule = &mut self.rules[i];
        if let Some(n) = rule.times.as_mut() {
            *n -= 1;
        }
        let action = rule.action.clone();
        self.hits.push(Hit {
            rule: i,
            at: Instant::now(),
        });
        Some(match action {
            Action::Status(code) => Err(status(
                code,
                reason(code),
                format!("injected fault: {code} for {method} {path}"),
            )),
            Action::HangWatch => {
                let (tx, rx) = mpsc::unbounded_channel();
                self.hung.push(tx);
                Ok(stream_response(rx))
            }
            Action::GoneWatch => {
                let (tx, rx) = mpsc::unbounded_channel();
                let (_, mut expired) =
                    status(410, "Expired", "injected fault: too old resource version");
                if let Some(m) = expired.as_object_mut() {
                    m.remove("metadata");
                }
                // sent, then the sender dropped: the stream ends after it
                let _ = tx.send(Ok(Bytes::from(line("ERROR", &expired))));
                Ok(stream_response(rx))
            }
        })
    }
}

/// The `reason` a real server gives a status code.
fn reason(code: u16) -> &'static str {
    match code {
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

fn stream_response(rx: mpsc::UnboundedReceiver<Result<Bytes, io::Error>>) -> Response<Body> {
    let mut resp = Response::new(Body::Stream(rx));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

impl super::FakeApiServer {
    /// Adds a rule after the ones in force (see the module doc).
    pub fn add_fault(&self, fault: Fault) {
        lock(&self.shared).faults.rules.push(fault);
    }

    /// Removes every rule and forgets their hits; hung watches stay hung.
    pub fn clear_faults(&self) {
        let mut st = lock(&self.shared);
        st.faults.rules.clear();
        st.faults.hits.clear();
    }

    /// Every faulted request since the last clear, oldest first.
    pub fn fault_hits(&self) -> Vec<Hit> {
        lock(&self.shared).faults.hits.clone()
    }

    /// How many uses rule `i` has left (`None`: unlimited, or no such rule).
    pub fn fault_uses_left(&self, i: usize) -> Option<usize> {
        lock(&self.shared).faults.rules.get(i).and_then(|r| r.times)
    }
}
