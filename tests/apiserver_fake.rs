//! The fake API server (`tests/support/apiserver`) against the real `kube`
//! 5 client and its runtime's watcher: selectors, pagination, relist on 410,
//! outages, restarts on the same port, the status subresource, and the
//! create/replace/conflict/not-found answers.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, Pod};
use k8s_openapi::api::events::v1::Event as NewEvent;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::apiserver::FakeApiServer;

/// How long any single expected thing may take before the test fails.
const WAIT: Duration = Duration::from_secs(20);

/// A kube client configured from the kubeconfig the fake writes.
async fn client(server: &FakeApiServer) -> Client {
    let dir = tempfile::tempdir().expect("temp dir for the kubeconfig");
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path);
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("read the written kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .expect("kube accepts the kubeconfig");
    Client::try_from(config).expect("build a kube client")
}

fn pod(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
}

/// The next event of a watcher stream, within [`WAIT`].
async fn next<S, T>(stream: &mut S) -> Result<Event<T>, watcher::Error>
where
    S: Stream<Item = Result<Event<T>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the watcher produced nothing in time")
        .expect("the watcher stream ended")
}

/// Reads Init, InitApply..., InitDone and returns the names seen.
async fn initial<S>(stream: &mut S) -> BTreeSet<String>
where
    S: Stream<Item = Result<Event<Pod>, watcher::Error>> + Unpin,
{
    match next(stream).await {
        Ok(Event::Init) => {}
        other => panic!("expected Init, got {other:?}"),
    }
    let mut names = BTreeSet::new();
    loop {
        match next(stream).await {
            Ok(Event::InitApply(p)) => {
                assert!(names.insert(p.name_any()), "{} listed twice", p.name_any());
            }
            Ok(Event::InitDone) => return names,
            other => panic!("expected InitApply or InitDone, got {other:?}"),
        }
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The name of an Apply or Delete event.
fn applied(e: Result<Event<Pod>, watcher::Error>) -> String {
    match e {
        Ok(Event::Apply(p)) => p.name_any(),
        other => panic!("expected Apply, got {other:?}"),
    }
}

fn deleted(e: Result<Event<Pod>, watcher::Error>) -> String {
    match e {
        Ok(Event::Delete(p)) => p.name_any(),
        other => panic!("expected Delete, got {other:?}"),
    }
}

#[tokio::test]
async fn field_selected_watcher_sees_only_its_nodes_pods() {
    let server = FakeApiServer::start();
    for (n, node) in [("a1", "node-a"), ("a2", "node-a"), ("b1", "node-b")] {
        server.put(pod(n, node));
    }
    let api: Api<Pod> = Api::all(client(&server).await);
    let mut events = watcher(api, watcher::Config::default().fields("spec.nodeName=node-a")).boxed();
    assert_eq!(initial(&mut events).await, names(&["a1", "a2"]));

    // Another node's pod first: if it leaked, it would come before a3.
    server.put(pod("b2", "node-b"));
    server.put(pod("a3", "node-a"));
    assert_eq!(applied(next(&mut events).await), "a3");
    assert!(server.delete("v1", "Pod", Some("default"), "a1"));
    assert_eq!(deleted(next(&mut events).await), "a1");
    // A pod moving away from node-a is a delete to this watch.
    server.put(pod("a2", "node-b"));
    assert_eq!(deleted(next(&mut events).await), "a2");
    server.put(pod("b1", "node-a"));
    assert_eq!(applied(next(&mut events).await), "b1");

    let watch = server.requests().into_iter().find(|r| r.is_watch()).expect("a watch request");
    assert_eq!(watch.param("fieldSelector").as_deref(), Some("spec.nodeName=node-a"));
    assert_eq!(watch.param("allowWatchBookmarks").as_deref(), Some("true"));
    assert!(watch.param("resourceVersion").is_some(), "the watch resumes from the list");
}

use kube::runtime::watcher::watcher;
