//! The fake API server (`tests/support/apiserver`) against the real `kube`
//! 5 client and its runtime's watcher: selectors, pagination, relist on 410,
//! outages, restarts on the same port, the status subresource, the
//! create/replace/conflict/not-found answers, and TokenRequest.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, Pod};
use k8s_openapi::api::events::v1::Event as NewEvent;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::apiserver::FakeApiServer;
use support::apiserver::kube_client::{
    WAIT, api_status, applied, deleted, initial, next_event, until_watching,
};

fn pod(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}})
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn field_selected_watcher_sees_only_its_nodes_pods() {
    let server = FakeApiServer::start();
    for (n, node) in [("a1", "node-a"), ("a2", "node-a"), ("b1", "node-b")] {
        server.put(pod(n, node));
    }
    let api: Api<Pod> = Api::all(server.client().await);
    let mut events = watcher(
        api,
        watcher::Config::default().fields("spec.nodeName=node-a"),
    )
    .boxed();
    assert_eq!(initial(&mut events).await, names(&["a1", "a2"]));

    // Another node's pod first: if it leaked, it would come before a3.
    server.put(pod("b2", "node-b"));
    server.put(pod("a3", "node-a"));
    assert_eq!(applied(next_event(&mut events).await), "a3");
    assert!(server.delete("v1", "Pod", Some("default"), "a1"));
    assert_eq!(deleted(next_event(&mut events).await), "a1");
    // A pod moving away from node-a is a delete to this watch.
    server.put(pod("a2", "node-b"));
    assert_eq!(deleted(next_event(&mut events).await), "a2");
    server.put(pod("b1", "node-a"));
    assert_eq!(applied(next_event(&mut events).await), "b1");

    let watch = server
        .requests()
        .into_iter()
        .find(|r| r.is_watch())
        .expect("a watch request");
    assert_eq!(
        watch.param("fieldSelector").as_deref(),
        Some("spec.nodeName=node-a")
    );
    assert_eq!(watch.param("allowWatchBookmarks").as_deref(), Some("true"));
    assert!(
        watch.param("resourceVersion").is_some(),
        "the watch resumes from the list"
    );
    // kube's watcher and Api<T> ask for no discovery document.
    assert!(
        server.requests().iter().all(|r| r.path == "/api/v1/pods"),
        "{:?}",
        server.requests()
    );
}

#[tokio::test]
async fn a_list_of_1100_pods_comes_back_whole_through_pagination() {
    let server = FakeApiServer::start();
    for i in 0..1100 {
        server.put(pod(&format!("p{i:04}"), "node-a"));
    }
    let api: Api<Pod> = Api::all(server.client().await);

    let first = api
        .list(&ListParams::default().limit(500))
        .await
        .expect("first page");
    assert_eq!(first.items.len(), 500);
    assert!(
        first.metadata.continue_.is_some(),
        "a first page has a continue token"
    );
    assert_eq!(first.metadata.remaining_item_count, Some(600));

    server.clear_requests();
    let mut events = watcher(api, watcher::Config::default()).boxed();
    let seen = initial(&mut events).await;
    let want: BTreeSet<String> = (0..1100).map(|i| format!("p{i:04}")).collect();
    assert_eq!(seen, want);

    let lists: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_list())
        .collect();
    assert_eq!(lists.len(), 3, "500 + 500 + 100: {lists:?}");
    assert!(
        lists
            .iter()
            .all(|r| r.param("limit").as_deref() == Some("500"))
    );
    assert!(lists[0].param("continue").is_none());
    assert!(lists[1].param("continue").is_some() && lists[2].param("continue").is_some());
    assert!(lists.iter().all(|r| r.status == 200));
}

#[tokio::test]
async fn compaction_and_a_cut_watch_make_the_watcher_relist() {
    let server = FakeApiServer::start();
    // No bookmarks while the test holds the stream: the watcher's
    // resourceVersion stays at its list's.
    server.set_bookmark_interval(Duration::from_secs(3600));
    for (n, node) in [("a1", "node-a"), ("a2", "node-a"), ("b1", "node-b")] {
        server.put(pod(n, node));
    }
    let api: Api<Pod> = Api::all(server.client().await);
    let mut events = watcher(
        api,
        watcher::Config::default().fields("spec.nodeName=node-a"),
    )
    .boxed();
    assert_eq!(initial(&mut events).await, names(&["a1", "a2"]));
    until_watching(&mut events, &server, 1).await;

    // The stream is not polled, so the watcher cannot reconnect until the
    // changes and the compaction are done.
    server.cut_watches();
    assert_eq!(server.open_watches(), 0);
    server.put(pod("a3", "node-a"));
    assert!(server.delete("v1", "Pod", Some("default"), "a1"));
    server.put(pod("b2", "node-b"));
    server.compact();
    server.clear_requests();

    match next_event(&mut events).await {
        Err(watcher::Error::WatchError(status)) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected the 410 watch error, got {other:?}"),
    }
    assert_eq!(initial(&mut events).await, names(&["a2", "a3"]));

    let reqs = server.requests();
    let watch = reqs.iter().position(|r| r.is_watch()).expect("a rewatch");
    let list = reqs.iter().position(|r| r.is_list()).expect("a relist");
    assert!(
        watch < list,
        "the relist follows the expired watch: {reqs:?}"
    );
    assert_eq!(reqs[list].status, 200);
}

#[tokio::test]
async fn while_down_kube_retries_the_503s_and_the_watcher_recovers() {
    let server = FakeApiServer::start();
    server.put(pod("a1", "node-a"));
    let api: Api<Pod> = Api::namespaced(server.client().await, "default");
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    assert_eq!(initial(&mut events).await, names(&["a1"]));
    until_watching(&mut events, &server, 1).await;

    server.clear_requests();
    server.set_down(true);
    server.put(pod("a2", "node-a"));
    // kube's client retries a 503 itself (up to 15 times, backing off from
    // 5 ms), so the watcher sees no error: wait for a few retried rewatches.
    let deadline = tokio::time::Instant::now() + WAIT;
    while server
        .requests()
        .iter()
        .filter(|r| r.is_watch() && r.status == 503)
        .count()
        < 3
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no retried rewatch: {:?}",
            server.requests()
        );
        if let Ok(item) = tokio::time::timeout(Duration::from_millis(10), events.next()).await {
            panic!("the retries should hide the outage, got {item:?}");
        }
    }
    server.set_down(false);
    assert_eq!(applied(next_event(&mut events).await), "a2");
    assert_eq!(
        server.requests().last().map(|r| (r.is_watch(), r.status)),
        Some((true, 200))
    );
}

#[tokio::test]
async fn without_client_retries_503s_reach_the_watcher_and_its_backoff_recovers() {
    let server = FakeApiServer::start();
    server.put(pod("a1", "node-a"));
    let api: Api<Pod> = Api::namespaced(server.client_with_retries(false).await, "default");
    let mut events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    assert_eq!(initial(&mut events).await, names(&["a1"]));
    until_watching(&mut events, &server, 1).await;

    server.set_down(true);
    match api.get("a1").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (503, "ServiceUnavailable"))
        }
        other => panic!("expected a 503, got {other:?}"),
    }
    // The watch was ended; the rewatch fails with 503.
    match next_event(&mut events).await {
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) => assert_eq!(s.code, 503),
        other => panic!("expected a failed rewatch, got {other:?}"),
    }
    server.put(pod("a2", "node-a"));
    server.set_down(false);
    // More 503s while the backoff runs are expected; then a2 arrives.
    let name = loop {
        match next_event(&mut events).await {
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) if s.code == 503 => {}
            other => break applied(other),
        }
    };
    assert_eq!(name, "a2");
}

#[tokio::test]
async fn the_watcher_reconnects_after_a_restart_on_the_same_port() {
    let server = FakeApiServer::start();
    let url = server.url();
    server.put(pod("a1", "node-a"));
    let api: Api<Pod> = Api::all(server.client().await);
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    assert_eq!(initial(&mut events).await, names(&["a1"]));
    until_watching(&mut events, &server, 1).await;

    server.stop();
    let addr = url.trim_start_matches("http://");
    let refused =
        std::net::TcpStream::connect(addr).expect_err("a stopped server refuses connections");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    server.put(pod("a2", "node-a"));
    server.restart();
    assert_eq!(server.url(), url);

    // Connection errors while it was down are expected; then a2 arrives.
    let name = loop {
        match next_event(&mut events).await {
            Err(watcher::Error::WatchStartFailed(_) | watcher::Error::WatchFailed(_)) => {}
            other => break applied(other),
        }
    };
    assert_eq!(name, "a2");
}

fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": "node-a", "labels": {"zone": "z1"}},
           "spec": {},
           "status": {"volumesInUse": ["kubernetes.io/csi/d^v1"],
                      "capacity": {"cpu": "4"},
                      "conditions": [{"type": "Ready", "status": "True"}]}})
}

#[tokio::test]
async fn a_merge_patch_of_node_status_changes_only_status() {
    let server = FakeApiServer::start();
    let before = server.put(node());
    let api: Api<Node> = Api::all(server.client().await);

    let patch = json!({"status": {"volumesInUse": ["kubernetes.io/csi/d^v2", "kubernetes.io/csi/d^v3"]},
                       "metadata": {"labels": {"zone": "changed", "new": "label"}}});
    let after = api
        .patch_status("node-a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch node status");
    let status = after.status.expect("status");
    assert_eq!(
        status.volumes_in_use,
        Some(vec![
            "kubernetes.io/csi/d^v2".into(),
            "kubernetes.io/csi/d^v3".into()
        ])
    );
    assert!(
        status.capacity.is_some_and(|c| c["cpu"].0 == "4"),
        "other status fields stay"
    );
    assert_eq!(status.conditions.map(|c| c.len()), Some(1));
    assert_eq!(
        after.metadata.labels.as_ref().map(|l| l.len()),
        Some(1),
        "a status patch cannot change labels"
    );
    assert_eq!(
        after
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("zone"))
            .map(String::as_str),
        Some("z1")
    );
    assert_ne!(
        after.metadata.resource_version,
        before["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_owned)
    );

    // Strategic merge replaces the plain string list the same way.
    let strategic = json!({"status": {"volumesInUse": []}});
    let after = api
        .patch_status(
            "node-a",
            &PatchParams::default(),
            &Patch::Strategic(&strategic),
        )
        .await
        .expect("strategic patch of node status");
    assert_eq!(after.status.and_then(|s| s.volumes_in_use), Some(vec![]));

    // A patch of the object changes labels but not status.
    let object_patch =
        json!({"metadata": {"labels": {"zone": "z2"}}, "status": {"volumesInUse": ["x"]}});
    let after = api
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(&object_patch),
        )
        .await
        .expect("patch node");
    assert_eq!(after.labels().get("zone").map(String::as_str), Some("z2"));
    assert_eq!(after.status.and_then(|s| s.volumes_in_use), Some(vec![]));

    let patches: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(patches[0].path, "/api/v1/nodes/node-a/status");
    assert_eq!(patches[0].content_type, "application/merge-patch+json");
    assert_eq!(
        patches[1].content_type,
        "application/strategic-merge-patch+json"
    );
    assert_eq!(patches[2].path, "/api/v1/nodes/node-a");
}

fn csinode(rv: Option<&str>) -> CSINode {
    let mut v = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                       "metadata": {"name": "node-a"},
                       "spec": {"drivers": [{"name": "d.example.com", "nodeID": "node-a"}]}});
    if let Some(rv) = rv {
        v["metadata"]["resourceVersion"] = json!(rv);
    }
    serde_json::from_value(v).expect("a CSINode")
}

#[tokio::test]
async fn csinode_create_replace_conflict_not_found_and_event_create() {
    let server = FakeApiServer::start();
    let client = server.client().await;
    let api: Api<CSINode> = Api::all(client.clone());
    let pp = PostParams::default();

    assert_eq!(
        api_status(api.get("node-a").await),
        (404, "NotFound".into())
    );
    let created = api
        .create(&pp, &csinode(None))
        .await
        .expect("create the CSINode");
    let rv = created
        .metadata
        .resource_version
        .clone()
        .expect("a resourceVersion");
    assert!(created.metadata.uid.is_some() && created.metadata.creation_timestamp.is_some());
    assert_eq!(
        api_status(api.create(&pp, &csinode(None)).await),
        (409, "AlreadyExists".into())
    );

    let mut changed = csinode(Some(&rv));
    changed.spec.drivers[0].node_id = "node-a-2".into();
    let replaced = api
        .replace("node-a", &pp, &changed)
        .await
        .expect("replace with the current rv");
    assert_eq!(replaced.spec.drivers[0].node_id, "node-a-2");
    assert_eq!(replaced.metadata.uid, created.metadata.uid);
    assert_eq!(
        api_status(api.replace("node-a", &pp, &changed).await),
        (409, "Conflict".into())
    );
    assert_eq!(
        api_status(api.replace("node-b", &pp, &csinode(None)).await),
        (400, "BadRequest".into())
    );
    api.delete("node-a", &Default::default())
        .await
        .expect("delete the CSINode");
    assert_eq!(
        api_status(api.delete("node-a", &Default::default()).await),
        (404, "NotFound".into())
    );

    // core/v1 events: created with POST, aggregated with a count patch.
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let ev: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "pod-a.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "pod-a", "namespace": "default"},
        "reason": "FailedMount", "message": "boom", "type": "Warning", "count": 1}))
    .expect("an event");
    events.create(&pp, &ev).await.expect("create the event");
    let patched = events
        .patch(
            "pod-a.1",
            &PatchParams::default(),
            &Patch::Merge(json!({"count": 2})),
        )
        .await
        .expect("aggregate the event");
    assert_eq!(patched.count, Some(2));
    let listed = events
        .list(&ListParams::default().fields("involvedObject.name=pod-a,reason=FailedMount"))
        .await
        .expect("list events by involved object");
    assert_eq!(listed.items.len(), 1);

    // events.k8s.io/v1
    let new_events: Api<NewEvent> = Api::namespaced(client, "default");
    let ev: NewEvent = serde_json::from_value(json!({
        "metadata": {"generateName": "pod-a.", "namespace": "default"},
        "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "volumed",
        "reportingInstance": "node-a", "action": "Mount", "reason": "FailedMount", "type": "Warning",
        "regarding": {"kind": "Pod", "name": "pod-a", "namespace": "default"}}))
    .expect("an events.k8s.io event");
    let created = new_events
        .create(&pp, &ev)
        .await
        .expect("create the new-style event");
    assert!(created.name_any().starts_with("pod-a."));
    assert_eq!(server.list("events.k8s.io/v1", "Event").len(), 1);
}

#[tokio::test]
async fn selectors_are_checked_and_applied_as_a_real_server_does() {
    let server = FakeApiServer::start();
    server.put(pod("a1", "node-a"));
    let mut other = pod("a2", "node-a");
    other["metadata"]["labels"] = json!({"app": "db", "tier": "1"});
    server.put(other);
    let api: Api<Pod> = Api::all(server.client().await);
    let listed = |lp: ListParams| {
        let api = api.clone();
        async move {
            let l = api.list(&lp).await.expect("list");
            l.items
                .iter()
                .map(ResourceExt::name_any)
                .collect::<BTreeSet<_>>()
        }
    };
    assert_eq!(
        listed(ListParams::default().labels("app=web")).await,
        names(&["a1"])
    );
    assert_eq!(
        listed(ListParams::default().labels("app in (web,db),tier")).await,
        names(&["a2"])
    );
    assert_eq!(
        listed(ListParams::default().labels("app!=web")).await,
        names(&["a2"])
    );
    assert_eq!(
        listed(ListParams::default().fields("metadata.name!=a1")).await,
        names(&["a2"])
    );
    assert_eq!(
        listed(ListParams::default().fields("spec.nodeName=node-b")).await,
        names(&[])
    );
    assert_eq!(
        api_status(
            api.list(&ListParams::default().fields("spec.volumes=x"))
                .await
        ),
        (400, "BadRequest".into())
    );
}

#[tokio::test]
async fn a_streaming_list_watcher_gets_initial_events_and_their_end() {
    let server = FakeApiServer::start();
    server.put(pod("a1", "node-a"));
    server.put(pod("b1", "node-b"));
    let api: Api<Pod> = Api::all(server.client().await);
    let config = watcher::Config::default()
        .fields("spec.nodeName=node-a")
        .streaming_lists();
    let mut events = watcher(api, config).boxed();
    assert_eq!(initial(&mut events).await, names(&["a1"]));
    server.put(pod("a2", "node-a"));
    assert_eq!(applied(next_event(&mut events).await), "a2");
    let reqs = server.requests();
    assert!(reqs.iter().all(|r| !r.is_list()), "no list: {reqs:?}");
    assert_eq!(reqs[0].param("sendInitialEvents").as_deref(), Some("true"));
}

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "namespace": "default"}, "data": {"a": "1", "b": "2"}})
}

#[tokio::test]
async fn json_patch_and_apply_patch_are_served() {
    let server = FakeApiServer::start();
    server.put(configmap("cm"));
    let client = server.client().await;

    // RFC 6902, sent raw: kube's Patch::Json needs a feature we do not build.
    let ops = json!([{"op": "test", "path": "/data/a", "value": "1"},
                     {"op": "remove", "path": "/data/b"},
                     {"op": "add", "path": "/data/c", "value": "3"}]);
    let req = hyper::Request::builder()
        .method("PATCH")
        .uri("/api/v1/namespaces/default/configmaps/cm")
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(&ops).expect("encode the patch"))
        .expect("a request");
    let patched: Value = client.request(req).await.expect("JSON patch");
    assert_eq!(patched["data"], json!({"a": "1", "c": "3"}));
    let failing = json!([{"op": "test", "path": "/data/a", "value": "no"}]);
    let req = hyper::Request::builder()
        .method("PATCH")
        .uri("/api/v1/namespaces/default/configmaps/cm")
        .header("content-type", "application/json-patch+json")
        .body(serde_json::to_vec(&failing).expect("encode the patch"))
        .expect("a request");
    assert_eq!(api_status(client.request::<Value>(req).await).0, 422);

    // Server-side apply creates a missing object and needs a field manager.
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
    let applied = api
        .patch(
            "cm2",
            &PatchParams::apply("volumed"),
            &Patch::Apply(configmap("cm2")),
        )
        .await
        .expect("apply creates");
    assert_eq!(
        applied.data.and_then(|d| d.get("b").cloned()).as_deref(),
        Some("2")
    );
    assert!(
        server
            .get("v1", "ConfigMap", Some("default"), "cm2")
            .is_some()
    );
    let no_manager = PatchParams::default();
    assert_eq!(
        api_status(
            api.patch("cm2", &no_manager, &Patch::Apply(configmap("cm2")))
                .await
        )
        .0,
        400
    );
}

#[tokio::test]
async fn resource_versions_are_validated_and_compaction_expires_them() {
    let server = FakeApiServer::start();
    for i in 0..3 {
        server.put(pod(&format!("p{i}"), "node-a"));
    }
    let api: Api<Pod> = Api::all(server.client_with_retries(false).await);
    let old = server.resource_version();
    server.put(pod("p3", "node-a"));

    // Exact reads the past, from the history.
    let exact = ListParams::default()
        .at(&old.to_string())
        .matching(kube::api::VersionMatch::Exact);
    let then = api.list(&exact).await.expect("an Exact list");
    assert_eq!(then.items.len(), 3);
    assert_eq!(then.metadata.resource_version, Some(old.to_string()));
    // So does a paginated list at a version without a match (legacy rule).
    let legacy = ListParams::default().at(&old.to_string()).limit(10);
    assert_eq!(
        api.list(&legacy).await.expect("a legacy list").items.len(),
        3
    );

    // Later pages are the first page's snapshot: p4, written between
    // pages, is not in them.
    let first = api
        .list(&ListParams::default().limit(2))
        .await
        .expect("a first page");
    let token = first.metadata.continue_.expect("a continue token");
    server.put(pod("p4", "node-a"));
    let next_page = ListParams::default().limit(2).continue_token(&token);
    let second = api.list(&next_page).await.expect("the second page");
    let second_names: Vec<_> = second.items.iter().map(ResourceExt::name_any).collect();
    assert_eq!(second_names, ["p2", "p3"]);
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    assert!(second.metadata.continue_.is_none());
    let too_large = ListParams::default()
        .at(&(server.resource_version() + 10).to_string())
        .matching(kube::api::VersionMatch::NotOlderThan);
    assert_eq!(
        api_status(api.list(&too_large).await),
        (504, "Timeout".into())
    );

    server.compact();
    assert_eq!(api_status(api.list(&exact).await), (410, "Expired".into()));
    assert_eq!(api_status(api.list(&legacy).await), (410, "Expired".into()));
    assert_eq!(
        api_status(api.list(&next_page).await),
        (410, "Expired".into())
    );
    // NotOlderThan an old version is served, as by a real server.
    let not_older = ListParams::default()
        .at(&old.to_string())
        .matching(kube::api::VersionMatch::NotOlderThan);
    assert_eq!(
        api.list(&not_older)
            .await
            .expect("NotOlderThan list")
            .items
            .len(),
        5
    );

    // A watch from before the compaction gets one ERROR event, then ends.
    let mut stream = api
        .watch(&kube::api::WatchParams::default(), &old.to_string())
        .await
        .expect("the watch starts")
        .boxed();
    match tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("an event in time")
    {
        Some(Ok(kube::api::WatchEvent::Error(s))) => {
            assert_eq!((s.code, s.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    let end = tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the stream ends in time");
    assert!(end.is_none(), "the expired watch ends: {end:?}");
}

#[tokio::test]
async fn a_watch_gets_bookmarks_ends_at_its_timeout_and_requests_need_the_token() {
    let server = FakeApiServer::start();
    server.set_bookmark_interval(Duration::from_millis(300));
    server.put(pod("a1", "node-a"));
    let rv = server.resource_version().to_string();
    let api: Api<Pod> = Api::all(server.client().await);
    let started = std::time::Instant::now();
    let mut stream = api
        .watch(&kube::api::WatchParams::default().timeout(1), &rv)
        .await
        .expect("the watch starts")
        .boxed();
    let mut bookmarks = 0;
    loop {
        match tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("an event or the end in time")
        {
            Some(Ok(kube::api::WatchEvent::Bookmark(b))) => {
                assert_eq!(b.metadata.resource_version, rv);
                assert_eq!(b.types.kind, "Pod");
                bookmarks += 1;
            }
            None => break,
            other => panic!("expected bookmarks, then the end: {other:?}"),
        }
    }
    assert!(bookmarks >= 2, "{bookmarks} bookmarks in a second");
    assert!(started.elapsed() >= Duration::from_secs(1));

    // Discovery and /version are served for clients that ask.
    let client = server.client().await;
    let version = client.apiserver_version().await.expect("GET /version");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "37")
    );
    let core = client.list_core_api_versions().await.expect("GET /api");
    assert_eq!(core.versions, ["v1"]);
    let groups = client.list_api_groups().await.expect("GET /apis");
    assert!(groups.groups.iter().any(|g| g.name == "storage.k8s.io"));
    let storage = client
        .list_api_group_resources("storage.k8s.io/v1")
        .await
        .expect("GET /apis/storage.k8s.io/v1");
    assert!(
        storage
            .resources
            .iter()
            .any(|r| r.name == "volumeattachments/status")
    );

    // Plain HTTP/1.1 without the bearer token.
    let addr = server.url().trim_start_matches("http://").to_owned();
    let reply = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
        conn.write_all(b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("send");
        let mut reply = String::new();
        conn.read_to_string(&mut reply).expect("read the reply");
        reply
    })
    .await
    .expect("the raw request");
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    assert!(reply.contains("\"reason\":\"Unauthorized\""), "{reply}");
}

#[tokio::test]
async fn kubes_event_recorder_creates_then_aggregates_by_patch() {
    use kube::runtime::events::{Event as RecEvent, EventType, Recorder, Reporter};
    let server = FakeApiServer::start();
    let stored = server.put(pod("a1", "node-a"));
    let reference = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "a1",
        "uid": stored["metadata"]["uid"]}))
    .expect("an object reference");
    let reporter = Reporter {
        controller: "volumed".into(),
        instance: Some("node-a".into()),
    };
    let recorder = Recorder::new(server.client().await, reporter);
    let event = RecEvent {
        type_: EventType::Warning,
        reason: "FailedMount".into(),
        note: Some("boom".into()),
        action: "Mount".into(),
        secondary: None,
    };
    recorder
        .publish(&event, &reference)
        .await
        .expect("first publish");
    recorder
        .publish(&event, &reference)
        .await
        .expect("second publish");

    let events = server.list("events.k8s.io/v1", "Event");
    assert_eq!(events.len(), 1, "the repeat is aggregated: {events:?}");
    assert_eq!(events[0]["series"]["count"], 2);
    let writes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/apis/events.k8s.io/v1/"))
        .map(|r| (r.method, r.status))
        .collect();
    assert_eq!(
        writes,
        [("POST".to_owned(), 201), ("PATCH".to_owned(), 200)]
    );
}

fn token_request(
    pod: &str,
    uid: &str,
    secs: i64,
) -> k8s_openapi::api::authentication::v1::TokenRequest {
    serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": ["vault"], "expirationSeconds": secs,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}},
    }))
    .unwrap()
}

#[tokio::test]
async fn a_token_request_is_answered_for_a_bound_pod_and_refused_otherwise() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let server = FakeApiServer::start();
    let p = server.put(pod("web", "node-a"));
    let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
    let api: Api<ServiceAccount> = Api::namespaced(server.client().await, "default");
    let pp = PostParams::default();

    let (code, msg) = api_status(
        api.create_token_request("robot", &pp, &token_request("web", &uid, 3600))
            .await,
    );
    assert_eq!(code, 404, "no such service account: {msg}");
    server.put(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "robot", "namespace": "default"}}));

    let before = std::time::SystemTime::now();
    let one = api
        .create_token_request("robot", &pp, &token_request("web", &uid, 3600))
        .await
        .unwrap();
    let two = api
        .create_token_request("robot", &pp, &token_request("web", &uid, 3600))
        .await
        .unwrap();
    let (s1, s2) = (one.status.unwrap(), two.status.unwrap());
    assert_ne!(s1.token, s2.token, "a token per request");
    let spec = one.spec.unwrap();
    assert_eq!(spec.audiences, Some(vec!["vault".to_owned()]), "echoed");
    let expires = std::time::SystemTime::from(s1.expiration_timestamp.unwrap().0);
    let lifetime = expires.duration_since(before).unwrap();
    assert!(
        (3599..=3601).contains(&lifetime.as_secs()),
        "expires an hour on: {lifetime:?}"
    );

    for (req, want) in [
        (token_request("web", &uid, 599), 422),
        (token_request("gone", &uid, 3600), 404),
        (token_request("web", "not-its-uid", 3600), 409),
    ] {
        let (code, msg) = api_status(api.create_token_request("robot", &pp, &req).await);
        assert_eq!(code, want, "{msg}");
    }
    let posts: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| (r.path, r.status))
        .collect();
    assert_eq!(posts.len(), 6, "every request recorded: {posts:?}");
    assert!(
        posts
            .iter()
            .all(|(p, _)| p == "/api/v1/namespaces/default/serviceaccounts/robot/token")
    );
}
