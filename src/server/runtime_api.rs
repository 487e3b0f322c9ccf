//! `GET /v1/pods/<uid>/volumes[?wait=SECONDS]` (docs/runtime-api.md):
//! the pod's volumes from the provider, and the long-poll; with
//! `unmounted=1`, the kubelet's `WaitForUnmount`: whether none of the
//! pod's targets is mounted, long-polled the same way. And
//! `GET /v1/pods/<uid>/containers/<name>/mounts[?wait=SECONDS]`
//! (docs/http.md): one container's mounts, answered once the pod's volumes
//! are ready (or the wait is over), its subpaths bound by the provider.
//!
//! A long-poll holds no thread while it waits: it awaits the provider's
//! change counter (a tokio `watch`) or its deadline, and each look is one
//! short provider call on the blocking pool — so `/metrics`, `/healthz` and
//! `/readyz` are served beside any number of waiters. The number of
//! waiters is still bounded ([`MAX_LONG_POLLS`]): each change wakes every
//! one, and each then takes a snapshot of its pod under the world lock.
//! Shutdown answers every waiter at once with what is true then.

use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use tokio::sync::{Semaphore, watch};

use super::{DebugProvider, Resp, blocking, json, one_line, text};
use crate::model::PodUid;

/// The path prefix; the whole path is `/v1/pods/<uid>/volumes`.
pub const PREFIX: &str = "/v1/pods/";
/// The path suffix.
const SUFFIX: &str = "/volumes";
/// Between the uid and the container's name.
const CONTAINERS: &str = "/containers/";
/// The per-container path's suffix.
const MOUNTS_SUFFIX: &str = "/mounts";
/// The longest `wait` accepted, in seconds.
pub const MAX_WAIT_SECS: u64 = 3600;
/// How many long-polls may wait at once; one more is answered 503.
pub const MAX_LONG_POLLS: usize = 256;

/// What every long-poll shares: the bound, and the server's stop.
#[derive(Debug)]
pub(super) struct LongPolls {
    slots: Semaphore,
    stopping: watch::Receiver<bool>,
}

impl LongPolls {
    pub(super) fn new(stopping: watch::Receiver<bool>) -> Self {
        Self {
            slots: Semaphore::new(MAX_LONG_POLLS),
            stopping,
        }
    }

    /// How many slots are taken now.
    pub(super) fn waiting(&self) -> usize {
        MAX_LONG_POLLS.saturating_sub(self.slots.available_permits())
    }
}

/// Whether `path` is this endpoint's.
pub(super) fn is_pod_volumes(path: &str) -> bool {
    path.strip_prefix(PREFIX)
        .is_some_and(|rest| rest.ends_with(SUFFIX))
}

/// `(uid, container)` of a per-container mounts path, unchecked.
fn container_parts(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix(PREFIX)?.strip_suffix(MOUNTS_SUFFIX)?;
    let (uid, name) = rest.split_once(CONTAINERS)?;
    Some((uid, name))
}

/// Whether `path` is the per-container mounts endpoint's.
pub(super) fn is_container_mounts(path: &str) -> bool {
    container_parts(path).is_some()
}

/// What a request asks: which pod, how long to wait, and for what.
#[derive(Debug)]
struct Asked {
    uid: PodUid,
    wait: Option<Duration>,
    /// `unmounted=1`: wait for the pod's targets to go, not to come
    unmounted: bool,
}

/// The request, checked; else why it is bad (400).
fn parse(req: &Request<Incoming>) -> Result<Asked, String> {
    let path = req.uri().path();
    let raw = path
        .strip_prefix(PREFIX)
        .and_then(|r| r.strip_suffix(SUFFIX))
        .unwrap_or_default();
    let uid = PodUid::new(raw).map_err(|e| format!("pod uid {raw:?} in {path}: {e}"))?;
    let param = |name: &str| {
        req.uri().query().and_then(|q| {
            form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.into_owned())
        })
    };
    let unmounted = match param("unmounted").as_deref() {
        None | Some("0" | "false") => false,
        Some("1" | "true") => true,
        Some(other) => return Err(format!("unmounted {other:?}: not 1 or 0")),
    };
    let wait = parse_wait(param("wait"))?;
    Ok(Asked {
        uid,
        wait,
        unmounted,
    })
}

/// The `wait` parameter's value, checked.
fn parse_wait(wait: Option<String>) -> Result<Option<Duration>, String> {
    let Some(w) = wait else {
        return Ok(None);
    };
    let secs: u64 = w
        .parse()
        .map_err(|_| format!("wait {w:?}: not a whole number of seconds (e.g. wait=30)"))?;
    if secs > MAX_WAIT_SECS {
        return Err(format!(
            "wait {secs}: longer than the {MAX_WAIT_SECS} s a long-poll may last"
        ));
    }
    Ok(Some(Duration::from_secs(secs)))
}

/// The per-container request, checked: the pod, the container (a DNS-1123
/// label, as the API server requires) and the wait.
fn parse_container(req: &Request<Incoming>) -> Result<(PodUid, String, Option<Duration>), String> {
    let path = req.uri().path();
    let (raw, name) = container_parts(path).unwrap_or_default();
    let uid = PodUid::new(raw).map_err(|e| format!("pod uid {raw:?} in {path}: {e}"))?;
    crate::model::check_dns1123_label("container name", name)
        .map_err(|e| format!("container {name:?} in {path}: {e}"))?;
    let wait = req.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "wait")
            .map(|(_, v)| v.into_owned())
    });
    Ok((uid, name.to_owned(), parse_wait(wait)?))
}

/// Answers the endpoint: at once without `wait`, else once the pod is
/// ready or the wait is over (a pod not known yet is waited for too:
/// the runtime may learn of a pod before volumed does). An unknown pod
/// at the end is 404.
pub(super) async fn pod_volumes(
    provider: Arc<dyn DebugProvider>,
    req: &Request<Incoming>,
    polls: &LongPolls,
) -> Result<Resp, Resp> {
    let asked = match parse(req) {
        Ok(p) => p,
        Err(why) => {
            return Ok(text(
                StatusCode::BAD_REQUEST,
                format!("{}\n", one_line(&why)),
            ));
        }
    };
    if asked.unmounted {
        return pod_unmounted(provider, asked, polls).await;
    }
    let Asked { uid, wait, .. } = asked;
    let look = |provider: &Arc<dyn DebugProvider>, uid: &PodUid| {
        let uid = uid.clone();
        blocking(Arc::clone(provider), move |p| p.pod_volumes(&uid))
    };
    let answer = |now: Option<crate::runtime::PodVolumes>, uid: &PodUid| match now {
        Some(doc) => json(&doc),
        None => text(
            StatusCode::NOT_FOUND,
            format!("pod {uid}: volumed does not know this pod\n"),
        ),
    };
    let changes = provider.changes();
    let (Some(wait), Some(mut changes)) = (wait.filter(|w| !w.is_zero()), changes) else {
        let now = look(&provider, &uid).await?;
        return Ok(answer(now, &uid));
    };
    let Ok(_slot) = polls.slots.try_acquire() else {
        return Ok(full());
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut stopping = polls.stopping.clone();
    loop {
        // marked seen before the look: a change after it wakes the wait
        changes.borrow_and_update();
        let now = look(&provider, &uid).await?;
        let ready = now.as_ref().is_some_and(|d| d.ready);
        if ready || tokio::time::Instant::now() >= deadline || *stopping.borrow() {
            return Ok(answer(now, &uid));
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    // the daemon is gone: what is true now
                    let now = look(&provider, &uid).await?;
                    return Ok(answer(now, &uid));
                }
            }
            () = tokio::time::sleep_until(deadline) => {}
            _ = stopping.changed() => {}
        }
    }
}

/// The answer when every long-poll slot is taken.
fn full() -> Resp {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("{MAX_LONG_POLLS} long-polls are waiting already; ask again, or without wait\n"),
    )
}

/// `?unmounted=1`: at once without `wait`, else once none of the pod's
/// targets is mounted or the wait is over. A pod volumed does not know
/// has nothing mounted, so it is answered `unmounted` at once (the
/// kubelet's `WaitForUnmount` returns for it too); 404 only when the
/// provider does not offer the question.
async fn pod_unmounted(
    provider: Arc<dyn DebugProvider>,
    asked: Asked,
    polls: &LongPolls,
) -> Result<Resp, Resp> {
    let Asked { uid, wait, .. } = asked;
    let look = |provider: &Arc<dyn DebugProvider>| {
        let uid = uid.clone();
        blocking(Arc::clone(provider), move |p| p.pod_unmounted(&uid))
    };
    let answer = |now: Option<crate::runtime::PodUnmounted>| match now {
        Some(doc) => json(&doc),
        None => text(
            StatusCode::NOT_FOUND,
            "this server does not answer unmounted=1\n",
        ),
    };
    let changes = provider.changes();
    let (Some(wait), Some(mut changes)) = (wait.filter(|w| !w.is_zero()), changes) else {
        return Ok(answer(look(&provider).await?));
    };
    let Ok(_slot) = polls.slots.try_acquire() else {
        return Ok(full());
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut stopping = polls.stopping.clone();
    loop {
        // marked seen before the look: a change after it wakes the wait
        changes.borrow_and_update();
        let now = look(&provider).await?;
        let done = now.as_ref().is_none_or(|d| d.unmounted);
        if done || tokio::time::Instant::now() >= deadline || *stopping.borrow() {
            return Ok(answer(now));
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return Ok(answer(look(&provider).await?));
                }
            }
            () = tokio::time::sleep_until(deadline) => {}
            _ = stopping.changed() => {}
        }
    }
}

/// Answers the per-container endpoint: once the pod's volumes are ready
/// (waiting as `pod_volumes` waits, within the same bound on waiters) or
/// the wait is over, the provider's answer, which binds the container's
/// subpaths. 404 for a pod no source knows or a container it lacks.
pub(super) async fn container_mounts(
    provider: Arc<dyn DebugProvider>,
    req: &Request<Incoming>,
    polls: &LongPolls,
) -> Result<Resp, Resp> {
    let (uid, name, wait) = match parse_container(req) {
        Ok(p) => p,
        Err(why) => {
            return Ok(text(
                StatusCode::BAD_REQUEST,
                format!("{}\n", one_line(&why)),
            ));
        }
    };
    let changes = provider.changes();
    let (Some(wait), Some(mut changes)) = (wait.filter(|w| !w.is_zero()), changes) else {
        return answer_container(&provider, &uid, &name).await;
    };
    let Ok(_slot) = polls.slots.try_acquire() else {
        return Ok(full());
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut stopping = polls.stopping.clone();
    loop {
        changes.borrow_and_update();
        let look = {
            let uid = uid.clone();
            blocking(Arc::clone(&provider), move |p| p.pod_volumes(&uid)).await?
        };
        let ready = look.as_ref().is_some_and(|d| d.ready);
        if ready || tokio::time::Instant::now() >= deadline || *stopping.borrow() {
            return answer_container(&provider, &uid, &name).await;
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return answer_container(&provider, &uid, &name).await;
                }
            }
            () = tokio::time::sleep_until(deadline) => {}
            _ = stopping.changed() => {}
        }
    }
}

/// The provider's answer for one container, as the response.
async fn answer_container(
    provider: &Arc<dyn DebugProvider>,
    uid: &PodUid,
    name: &str,
) -> Result<Resp, Resp> {
    let (pod, container) = (uid.clone(), name.to_owned());
    let got = blocking(Arc::clone(provider), move |p| {
        p.container_mounts(&pod, &container)
    })
    .await?;
    Ok(match got {
        Some(Ok(doc)) => json(&doc),
        Some(Err(why)) => text(StatusCode::NOT_FOUND, format!("{}\n", one_line(&why))),
        None => text(
            StatusCode::NOT_FOUND,
            format!("pod {uid}: volumed does not know this pod\n"),
        ),
    })
}
