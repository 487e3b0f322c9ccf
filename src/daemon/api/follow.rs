//! What the API source follows one by one for the node's pods (the set
//! `sources::api_refs` keeps): a watch by name of each ConfigMap and
//! Secret some pod refers to, and a keeper of each token a pod's projected
//! volume asks for — one task each, started when the first pod names it
//! and aborted (its object or token forgotten) when none does any more,
//! as the kubelet's watch-based managers and its token manager do. An
//! `immutable` object's watch ends once it has been read: it cannot
//! change (the kubelet stops those watches too).
//!
//! A pod waits for its followed objects' first report (`api_refs`); one
//! that has not answered in [`FIRST_REPORT_MAX`] (a watch the server
//! accepted and never answered) stops holding it: its pods are resolved
//! without it, so one hung watch cannot keep the node from being ready.
//!
//! After a restart a token's keeper starts from the token in place in the
//! pod's volume when the journal vouches for it and its renewal is not due
//! (`token_seed`): no TokenRequest, no rewrite.
//!
//! Nothing followed is logged: Secrets and tokens are secrets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::task::AbortHandle;

use super::Stores;
use super::token_seed::TokenSeeds;
use crate::apiserver::token::{Clock, Polled, SystemClock, TokenKeeper};
use crate::apiserver::{Named, ObjectSeen};
use crate::model::{IssuedToken, TokenRef};
use crate::sources::api::FollowChanges;
use crate::sources::api::ObjectRef;

/// What a followed object's task reports.
#[derive(Debug)]
pub(super) enum Followed {
    /// a ConfigMap's or Secret's watch
    Object(ObjectSeen),
    /// a new token, or why there is no valid one
    Token(Result<Arc<IssuedToken>, String>),
}

/// A token keeper's least and most sleep between looks, and its backoff
/// after a failed request.
const TOKEN_POLL: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));
const TOKEN_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// How long a followed object's first report may keep its pods waiting.
pub(super) const FIRST_REPORT_MAX: Duration = Duration::from_secs(30);

/// The tasks, by what they follow.
pub(super) struct Followers {
    client: kube::Client,
    /// every watch's timeout (`--api-watch-timeout`)
    watch_timeout: Duration,
    stores: Stores,
    clock: Arc<dyn Clock>,
    /// the tokens in place from before a restart
    seeds: TokenSeeds,
    /// `None`: an immutable object, read and no longer watched
    tasks: BTreeMap<ObjectRef, Option<AbortHandle>>,
    /// when each task not yet heard from was started
    unheard: BTreeMap<ObjectRef, Instant>,
    tx: UnboundedSender<(ObjectRef, Followed)>,
    /// what the tasks report
    pub(super) rx: UnboundedReceiver<(ObjectRef, Followed)>,
}

impl Followers {
    pub(super) fn new(
        client: kube::Client,
        stores: Stores,
        watch_timeout: Duration,
        seeds: TokenSeeds,
    ) -> Self {
        let (tx, rx) = unbounded_channel();
        Self {
            client,
            watch_timeout,
            stores,
            clock: Arc::new(SystemClock),
            seeds,
            tasks: BTreeMap::new(),
            unheard: BTreeMap::new(),
            tx,
            rx,
        }
    }

    /// Stops what no pod refers to any more, then starts what is new.
    /// `token_paths` says where a token's pod puts it (volume, path), for
    /// a token kept from before a restart.
    pub(super) fn change(
        &mut self,
        c: FollowChanges,
        token_paths: &dyn Fn(&TokenRef) -> Vec<(String, String)>,
    ) {
        for r in c.stop {
            if let Some(Some(t)) = self.tasks.remove(&r) {
                t.abort();
            }
            self.unheard.remove(&r);
            self.forget(r);
        }
        for r in c.start {
            if self.tasks.contains_key(&r) {
                continue;
            }
            let task = self.start(&r, token_paths);
            self.unheard.insert(r.clone(), Instant::now());
            self.tasks.insert(r, Some(task));
        }
    }

    fn forget(&self, r: ObjectRef) {
        match r {
            ObjectRef::ConfigMap(ns, n) => self.stores.api.set_config_map((ns, n), None),
            ObjectRef::Secret(ns, n) => {
                self.stores
                    .secrets
                    .set_from_api((ns.clone(), n.clone()), None);
                self.stores.api.set_secret((ns, n), None);
            }
            ObjectRef::Token(t) => self.stores.api.set_token(t, None),
            ObjectRef::Claim(..) => {}
        }
    }

    fn start(
        &mut self,
        r: &ObjectRef,
        token_paths: &dyn Fn(&TokenRef) -> Vec<(String, String)>,
    ) -> AbortHandle {
        let tx = self.tx.clone();
        let key = r.clone();
        let task = match r {
            ObjectRef::ConfigMap(ns, n) | ObjectRef::Secret(ns, n) => {
                let kind = match r {
                    ObjectRef::ConfigMap(..) => Named::ConfigMap,
                    _ => Named::Secret,
                };
                let mut watch = crate::apiserver::watch_named(
                    self.client.clone(),
                    kind,
                    ns,
                    n,
                    self.watch_timeout,
                );
                tokio::spawn(async move {
                    while let Some(seen) = watch.next().await {
                        if tx.send((key.clone(), Followed::Object(seen))).is_err() {
                            return;
                        }
                    }
                })
            }
            ObjectRef::Token(t) => {
                let mut keeper = TokenKeeper::new(t.clone(), self.clock.clone(), jitter());
                if let Some(seed) = self.seeds.take(t, &token_paths(t)) {
                    let kept = keeper.seed(seed);
                    tracing::info!(namespace = %t.namespace, service_account = %t.service_account,
                        pod = %t.pod_name, kept,
                        "service account token in place from before the restart (kept: its renewal is not due)");
                }
                tokio::spawn(keep_token(keeper, self.client.clone(), key, tx))
            }
            // never followed (see `ObjectRef::followed`)
            ObjectRef::Claim(..) => tokio::spawn(async {}),
        };
        task.abort_handle()
    }

    /// What a task said: into the stores. Whether it is still followed
    /// (its pods are then resolved again).
    pub(super) fn seen(&mut self, r: &ObjectRef, seen: Followed) -> bool {
        let Some(task) = self.tasks.get_mut(r) else {
            return false;
        };
        self.unheard.remove(r);
        match (r, seen) {
            (ObjectRef::Token(t), Followed::Token(got)) => {
                self.stores.api.set_token(t.clone(), Some(got));
            }
            (ObjectRef::ConfigMap(..) | ObjectRef::Secret(..), Followed::Object(seen)) => {
                let kind = match r {
                    ObjectRef::ConfigMap(..) => "ConfigMap",
                    _ => "Secret",
                };
                let doc = match seen {
                    // the object it had stays, as the kubelet's cache keeps it
                    Err(e) => {
                        tracing::warn!(error = %e, "API server");
                        return true;
                    }
                    Ok(doc) => doc,
                };
                let key = match r {
                    ObjectRef::ConfigMap(ns, n) | ObjectRef::Secret(ns, n) => {
                        (ns.clone(), n.clone())
                    }
                    _ => return true,
                };
                let obj = match doc
                    .clone()
                    .map(|d| crate::sources::api_store::payload_object(kind, d))
                {
                    None => None,
                    Some(Ok((_, o))) => Some(o),
                    Some(Err(e)) => {
                        tracing::error!(error = %e, "API server {kind}");
                        None
                    }
                };
                if obj.as_ref().is_some_and(|o| o.immutable)
                    && let Some(t) = task.take()
                {
                    t.abort();
                }
                if kind == "Secret" {
                    let csi = doc.and_then(|d| match crate::sources::api::secret_from_api(d) {
                        Ok((_, info)) => Some(info),
                        Err(e) => {
                            tracing::error!(error = %e, "API server Secret");
                            None
                        }
                    });
                    self.stores.secrets.set_from_api(key.clone(), csi);
                    self.stores.api.set_secret(key, obj);
                } else {
                    self.stores.api.set_config_map(key, obj);
                }
            }
            _ => {}
        }
        true
    }
}

impl Followers {
    /// The followed objects not heard from within `max` of their start
    /// (each returned once): they hold their pods no longer.
    pub(super) fn overdue(&mut self, now: Instant, max: Duration) -> Vec<ObjectRef> {
        take_overdue(&mut self.unheard, now, max)
    }
}

fn take_overdue(
    unheard: &mut BTreeMap<ObjectRef, Instant>,
    now: Instant,
    max: Duration,
) -> Vec<ObjectRef> {
    let late: Vec<ObjectRef> = unheard
        .iter()
        .filter(|(_, at)| now.saturating_duration_since(**at) >= max)
        .map(|(r, _)| r.clone())
        .collect();
    for r in &late {
        unheard.remove(r);
    }
    late
}

/// A few seconds' jitter per token, so a node's tokens do not all renew in
/// the same second (the kubelet draws one at random; the clock's
/// nanoseconds are random enough here).
fn jitter() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Duration::from_millis(u64::from(nanos) % 10_000)
}

/// One token's task: a look when a renewal is due, a new token reported,
/// a failure reported (and retried with a backoff). A renewal that fails
/// while the old token is valid is logged (without the token) and retried.
/// A keeper seeded with the token in place reports it at once and asks
/// for none before its renewal is due.
async fn keep_token(
    mut keeper: TokenKeeper,
    client: kube::Client,
    key: ObjectRef,
    tx: UnboundedSender<(ObjectRef, Followed)>,
) {
    if let Some(t) = keeper.current().cloned() {
        if tx.send((key.clone(), Followed::Token(Ok(t)))).is_err() {
            return;
        }
        tokio::time::sleep(keeper.next_poll(TOKEN_POLL.0, TOKEN_POLL.1)).await;
    }
    let mut backoff = TOKEN_POLL.0;
    loop {
        let wait = match keeper.poll(&client).await {
            Polled::Fresh(t) => {
                backoff = TOKEN_POLL.0;
                if tx.send((key.clone(), Followed::Token(Ok(t)))).is_err() {
                    return;
                }
                keeper.next_poll(TOKEN_POLL.0, TOKEN_POLL.1)
            }
            Polled::Kept(None) => keeper.next_poll(TOKEN_POLL.0, TOKEN_POLL.1),
            Polled::Kept(Some(e)) => {
                tracing::warn!(error = %e, "renew a service account token; the one in place is valid still");
                grow(&mut backoff)
            }
            Polled::Failed(e) => {
                if tx
                    .send((key.clone(), Followed::Token(Err(e.to_string()))))
                    .is_err()
                {
                    return;
                }
                grow(&mut backoff)
            }
        };
        tokio::time::sleep(wait).await;
    }
}

fn grow(backoff: &mut Duration) -> Duration {
    let now = *backoff;
    *backoff = (*backoff * 2).min(TOKEN_BACKOFF_MAX);
    now
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_unheard_for_the_limit_is_overdue_once() {
        let t0 = Instant::now();
        let cm = |n: &str| ObjectRef::ConfigMap("ns".into(), n.into());
        let mut unheard =
            BTreeMap::from([(cm("old"), t0), (cm("new"), t0 + Duration::from_secs(20))]);
        let max = Duration::from_secs(30);
        assert!(take_overdue(&mut unheard, t0 + Duration::from_secs(29), max).is_empty());
        let at = t0 + Duration::from_secs(30);
        assert_eq!(take_overdue(&mut unheard, at, max), [cm("old")]);
        assert!(take_overdue(&mut unheard, at, max).is_empty(), "once");
        let later = t0 + Duration::from_secs(50);
        assert_eq!(take_overdue(&mut unheard, later, max), [cm("new")]);
    }
}
