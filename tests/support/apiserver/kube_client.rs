//! The kube side for tests of the fake: a real `kube::Client` built from
//! the kubeconfig the fake writes, and helpers that read a watcher stream
//! with deadlines instead of sleeps and unwrap what tests expect.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::ResourceExt;
use kube::runtime::watcher::{self, Event};

use super::FakeApiServer;

/// How long one expected thing (an event, an open watch) may take before
/// a test fails.
pub const WAIT: Duration = Duration::from_secs(20);

impl FakeApiServer {
    /// A kube client configured from this server's kubeconfig, with kube's
    /// default retries (it retries 429, 503 and 504 up to 15 times, backing
    /// off from 5 ms, so a short outage never reaches the caller).
    pub async fn client(&self) -> kube::Client {
        self.client_with_retries(true).await
    }

    /// The same, choosing whether kube retries 429/503/504 itself.
    pub async fn client_with_retries(&self, retry: bool) -> kube::Client {
        let dir = tempfile::tempdir().expect("temp dir for the kubeconfig");
        let path = dir.path().join("kubeconfig");
        self.write_kubeconfig(&path);
        let kubeconfig =
            kube::config::Kubeconfig::read_from(&path).expect("read the written kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("kube accepts the kubeconfig");
        config.default_retry = retry;
        kube::Client::try_from(config).expect("build a kube client")
    }
}

/// The next item of a watcher stream, within [`WAIT`]; panics if none
/// comes or the stream ends.
pub async fn next_event<S, T>(stream: &mut S) -> Result<Event<T>, watcher::Error>
where
    S: Stream<Item = Result<Event<T>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the watcher produced nothing in time")
        .expect("the watcher stream ended")
}

/// Polls a watcher (it opens its watch only when polled after InitDone)
/// until the fake has `n` open watches; an event meanwhile is a failure.
pub async fn until_watching<S, T>(stream: &mut S, server: &FakeApiServer, n: usize)
where
    S: Stream<Item = Result<Event<T>, watcher::Error>> + Unpin,
    T: Debug,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while server.open_watches() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no watch opened in time"
        );
        if let Ok(item) = tokio::time::timeout(Duration::from_millis(10), stream.next()).await {
            panic!("unexpected event while waiting for the watch: {item:?}");
        }
    }
}

/// Reads a watcher's Init, InitApply... and InitDone; returns the names
/// listed (each at most once, or the test fails).
pub async fn initial<S, K>(stream: &mut S) -> BTreeSet<String>
where
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Unpin,
    K: Resource + Debug,
{
    match next_event(stream).await {
        Ok(Event::Init) => {}
        other => panic!("expected Init, got {other:?}"),
    }
    let mut names = BTreeSet::new();
    loop {
        match next_event(stream).await {
            Ok(Event::InitApply(o)) => {
                assert!(names.insert(o.name_any()), "{} listed twice", o.name_any());
            }
            Ok(Event::InitDone) => return names,
            other => panic!("expected InitApply or InitDone, got {other:?}"),
        }
    }
}

/// The name in an Apply event; anything else fails the test.
pub fn applied<K: Resource + Debug>(e: Result<Event<K>, watcher::Error>) -> String {
    match e {
        Ok(Event::Apply(o)) => o.name_any(),
        other => panic!("expected Apply, got {other:?}"),
    }
}

/// The name in a Delete event; anything else fails the test.
pub fn deleted<K: Resource + Debug>(e: Result<Event<K>, watcher::Error>) -> String {
    match e {
        Ok(Event::Delete(o)) => o.name_any(),
        other => panic!("expected Delete, got {other:?}"),
    }
}

/// The code and reason of an API error; success fails the test.
pub fn api_status<T: Debug>(r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason),
        other => panic!("expected an API error, got {other:?}"),
    }
}
