//! `ApiState`: which pods a watch's changes make wanted, and when.

use super::*;
use crate::host::sys::LinuxSys;
use serde_json::json;

const NODE: &str = "node-a";

fn pod(uid: &str, name: &str, node: &str, claims: &[&str]) -> Box<Pod> {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": format!("v-{c}"), "persistentVolumeClaim": {"claimName": c}}))
        .chain([json!({"name": "scratch", "emptyDir": {}})])
        .collect();
    let v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
        "spec": {"nodeName": node, "containers": [], "volumes": volumes},
    });
    Box::new(serde_json::from_value(v).expect("a pod"))
}

fn pvc(name: &str, pv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"volumeName": pv}})
}

fn pv(name: &str, claim: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"local": {"path": format!("/srv/{name}")},
            "claimRef": {"namespace": "ns", "name": claim}}})
}

fn listed_state() -> ApiState {
    let mut s = ApiState::new(NODE);
    for k in Kind::ALL {
        s.apply(Change::Relist(k));
        s.apply(Change::Listed(k));
    }
    s
}

/// Each event as (kind, uid, volume names).
fn shown(events: &[SourceEvent]) -> Vec<(&'static str, String, Vec<String>)> {
    events
        .iter()
        .map(|e| match e {
            SourceEvent::PodAdded(p) => ("added", p.uid.as_str().to_owned(), outer(p)),
            SourceEvent::PodUpdated(p) => ("updated", p.uid.as_str().to_owned(), outer(p)),
            SourceEvent::PodRemoved(u) => ("removed", u.as_str().to_owned(), vec![]),
            SourceEvent::SourcesReady => ("ready", String::new(), vec![]),
        })
        .collect()
}

fn outer(p: &super::super::DesiredPod) -> Vec<String> {
    p.volumes.iter().map(|v| v.outer_name.to_string()).collect()
}

#[test]
fn only_this_nodes_running_non_mirror_pods_are_wanted() {
    let mut s = listed_state();
    let mut mirror = pod("u-mirror", "m", NODE, &[]);
    mirror.metadata.annotations = Some([(MIRROR_ANNOTATION.to_owned(), "x".to_owned())].into());
    let mut done = pod("u-done", "d", NODE, &[]);
    done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).expect("status"));
    let mut leaving = pod("u-leaving", "l", NODE, &[]);
    leaving.metadata.deletion_timestamp =
        serde_json::from_value(json!("2026-11-25T00:00:00Z")).ok();
    for p in [
        pod("u-1", "a", NODE, &[]),
        pod("u-2", "b", "node-b", &[]),
        mirror,
        done,
        leaving,
    ] {
        s.apply(Change::PodApplied(p));
    }
    let got = shown(&s.take_events(&LinuxSys));
    assert_eq!(
        got,
        vec![
            ("added", "u-1".into(), vec!["scratch".into()]),
            ("added", "u-leaving".into(), vec!["scratch".into()]),
        ],
        "another node's pod, a mirror pod and a finished pod are not wanted; a terminating one still is"
    );
    // A running pod that finishes is removed.
    let mut finished = pod("u-1", "a", NODE, &[]);
    finished.status = Some(serde_json::from_value(json!({"phase": "Failed"})).expect("status"));
    s.apply(Change::PodApplied(finished));
    assert_eq!(
        shown(&s.take_events(&LinuxSys)),
        vec![("removed", "u-1".into(), vec![])]
    );
}

#[test]
fn a_relist_removes_only_what_it_did_not_list_and_only_at_its_end() {
    let mut s = listed_state();
    s.apply(Change::PodApplied(pod("u-1", "a", NODE, &[])));
    s.apply(Change::PodApplied(pod("u-2", "b", NODE, &[])));
    assert_eq!(s.take_events(&LinuxSys).len(), 2);
    // The watch restarts (a 410): the new list has u-2 and u-3.
    s.apply(Change::Relist(Kind::Pod));
    s.apply(Change::PodApplied(pod("u-2", "b", NODE, &[])));
    s.apply(Change::PodApplied(pod("u-3", "c", NODE, &[])));
    assert_eq!(
        shown(&s.take_events(&LinuxSys)),
        vec![("added", "u-3".into(), vec!["scratch".into()])],
        "mid-list: nothing is removed, an unchanged pod is not sent again"
    );
    s.apply(Change::Listed(Kind::Pod));
    assert_eq!(
        shown(&s.take_events(&LinuxSys)),
        vec![("removed", "u-1".into(), vec![])],
        "the pod deleted while the watch was down goes once the list is whole"
    );
}

#[test]
fn the_source_is_listed_only_once_every_kind_was() {
    let mut s = ApiState::new(NODE);
    for k in Kind::ALL {
        assert!(!s.listed(), "not before {k:?} is listed");
        s.apply(Change::Relist(k));
        assert!(!s.listed());
        s.apply(Change::Listed(k));
    }
    assert!(s.listed());
    // A later relist does not make it unlisted: readiness is once.
    s.apply(Change::Relist(Kind::Pod));
    assert!(s.listed());
}

#[test]
fn a_claim_that_arrives_later_updates_only_the_pods_that_name_it() {
    let mut s = listed_state();
    s.apply(Change::PodApplied(pod("u-1", "a", NODE, &["c1"])));
    s.apply(Change::PodApplied(pod("u-2", "b", NODE, &["c2"])));
    let first = s.take_events(&LinuxSys);
    assert_eq!(
        shown(&first),
        vec![
            ("added", "u-1".into(), vec!["scratch".into()]),
            ("added", "u-2".into(), vec!["scratch".into()]),
        ]
    );
    let SourceEvent::PodAdded(p) = &first[0] else {
        panic!("added")
    };
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("ns/c1") && e.contains("API server")),
        "the unresolved claim is an error naming it and where it was looked for: {:?}",
        p.errors
    );
    s.apply(Change::Applied(Kind::PersistentVolume, pv("pv1", "c1")));
    s.apply(Change::Applied(
        Kind::PersistentVolumeClaim,
        pvc("c1", "pv1"),
    ));
    assert_eq!(
        shown(&s.take_events(&LinuxSys)),
        vec![(
            "updated",
            "u-1".into(),
            vec!["v-c1".into(), "scratch".into()]
        )],
        "u-2 does not name c1: not resolved again"
    );
    // The PV goes: the pod keeps its volume (unresolved) but is told.
    s.apply(Change::Deleted(Kind::PersistentVolume, pv("pv1", "c1")));
    let ev = s.take_events(&LinuxSys);
    let SourceEvent::PodUpdated(p) = &ev[0] else {
        panic!("updated: {ev:?}")
    };
    assert!(p.unresolved.contains("v-c1"), "{p:?}");
}

#[test]
fn a_relist_of_objects_drops_the_ones_it_did_not_list() {
    let mut s = listed_state();
    s.apply(Change::Applied(Kind::PersistentVolume, pv("pv1", "c1")));
    s.apply(Change::Applied(
        Kind::PersistentVolumeClaim,
        pvc("c1", "pv1"),
    ));
    s.apply(Change::PodApplied(pod("u-1", "a", NODE, &["c1"])));
    assert_eq!(
        shown(&s.take_events(&LinuxSys)),
        vec![("added", "u-1".into(), vec!["v-c1".into(), "scratch".into()])]
    );
    s.apply(Change::Relist(Kind::PersistentVolumeClaim));
    s.apply(Change::Listed(Kind::PersistentVolumeClaim));
    assert!(s.objects().pvcs.is_empty());
    let ev = s.take_events(&LinuxSys);
    let SourceEvent::PodUpdated(p) = &ev[0] else {
        panic!("updated: {ev:?}")
    };
    assert!(p.unresolved.contains("v-c1"), "{p:?}");
}

#[test]
fn a_pod_the_server_sends_broken_keeps_what_it_had_and_is_named() {
    let mut s = listed_state();
    s.apply(Change::PodApplied(pod("u-1", "a", NODE, &[])));
    assert_eq!(s.take_events(&LinuxSys).len(), 1);
    let mut broken = pod("u-1", "a", NODE, &[]);
    broken.spec = None;
    s.apply(Change::PodApplied(broken));
    let ev = s.take_events(&LinuxSys);
    assert!(ev.is_empty(), "nothing changes: {ev:?}");
    let errors = s.take_errors();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("/api/v1/namespaces/ns/pods/a")),
        "the error names the object: {errors:?}"
    );
    let mut hostile = pod("x", "h", NODE, &[]);
    hostile.metadata.uid = Some("../../etc".into());
    s.apply(Change::PodApplied(hostile));
    assert!(s.take_events(&LinuxSys).is_empty());
    assert!(s.take_errors().iter().any(|e| e.contains("pods/h")));
    let mut no_uid = pod("x", "b", NODE, &[]);
    no_uid.metadata.uid = None;
    s.apply(Change::PodApplied(no_uid));
    assert!(s.take_events(&LinuxSys).is_empty());
    assert!(s.take_errors().iter().any(|e| e.contains("metadata.uid")));
}

#[test]
fn an_attachment_that_arrives_later_updates_the_pods_of_its_volume() {
    let mut s = listed_state();
    let csi_pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv1"},
        "spec": {"claimRef": {"namespace": "ns", "name": "c1"},
            "csi": {"driver": "d.example.com", "volumeHandle": "h1"}}});
    s.apply(Change::Applied(Kind::PersistentVolume, csi_pv));
    s.apply(Change::Applied(
        Kind::PersistentVolumeClaim,
        pvc("c1", "pv1"),
    ));
    s.apply(Change::PodApplied(pod("u-1", "a", NODE, &["c1"])));
    let ev = s.take_events(&LinuxSys);
    let SourceEvent::PodAdded(p) = &ev[0] else {
        panic!("added: {ev:?}")
    };
    assert!(
        p.unresolved.contains("v-c1"),
        "waits for its attachment: {p:?}"
    );
    s.apply(Change::Applied(
        Kind::VolumeAttachment,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": "va1"},
            "spec": {"attacher": "d.example.com", "nodeName": NODE,
                "source": {"persistentVolumeName": "pv1"}},
            "status": {"attached": true}}),
    ));
    assert_eq!(
        shown(&s.take_events(&LinuxSys)),
        vec![(
            "updated",
            "u-1".into(),
            vec!["v-c1".into(), "scratch".into()]
        )]
    );
}

#[test]
fn only_the_secrets_the_pods_csi_volumes_name_are_wanted() {
    let mut s = listed_state();
    // pv1 names its stage Secret, pv2 its expand Secret: both wanted
    let pv_with = |name: &str, claim: &str, secret: &str| {
        let field = match name {
            "pv1" => "nodeStageSecretRef",
            _ => "nodeExpandSecretRef",
        };
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"claimRef": {"namespace": "ns", "name": claim},
                "csi": {"driver": "d.example.com", "volumeHandle": name,
                    field: {"namespace": "ns", "name": secret}}}})
    };
    s.apply(Change::Applied(
        Kind::CsiDriver,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "d.example.com"}, "spec": {"attachRequired": false}}),
    ));
    s.apply(Change::Applied(
        Kind::PersistentVolume,
        pv_with("pv1", "c1", "s1"),
    ));
    s.apply(Change::Applied(
        Kind::PersistentVolumeClaim,
        pvc("c1", "pv1"),
    ));
    s.apply(Change::Applied(
        Kind::PersistentVolume,
        pv_with("pv2", "c2", "s2"),
    ));
    s.apply(Change::Applied(
        Kind::PersistentVolumeClaim,
        pvc("c2", "pv2"),
    ));
    let _ = s.take_events(&LinuxSys);
    assert_eq!(s.take_follow_changes(), None, "no pod names any yet");
    s.apply(Change::PodApplied(pod("u-1", "a", NODE, &["c1"])));
    s.apply(Change::PodApplied(pod("u-2", "b", NODE, &["c1"])));
    let _ = s.take_events(&LinuxSys);
    let key = |n: &str| super::ObjectRef::Secret("ns".to_owned(), n.to_owned());
    let start = |r: &[&str]| crate::sources::api::FollowChanges {
        start: r.iter().map(|n| key(n)).collect(),
        ..Default::default()
    };
    assert_eq!(s.take_follow_changes(), Some(start(&["s1"])));
    assert_eq!(s.take_follow_changes(), None, "told once");
    // one of two users goes: still wanted
    s.apply(Change::PodDeleted(pod("u-1", "a", NODE, &["c1"])));
    let _ = s.take_events(&LinuxSys);
    assert_eq!(s.take_follow_changes(), None);
    s.apply(Change::PodApplied(pod("u-3", "c", NODE, &["c2"])));
    s.apply(Change::PodDeleted(pod("u-2", "b", NODE, &["c1"])));
    let _ = s.take_events(&LinuxSys);
    let mut both = start(&["s2"]);
    both.stop.insert(key("s1"));
    assert_eq!(s.take_follow_changes(), Some(both));
}

/// A pod with a configMap volume and a projected token.
fn payload_pod() -> Box<Pod> {
    let v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-p"},
        "spec": {"nodeName": NODE, "containers": [], "volumes": [
            {"name": "config", "configMap": {"name": "app"}},
            {"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}}]}},
        ]},
    });
    Box::new(serde_json::from_value(v).expect("a pod"))
}

fn app_config(rv: &str) -> crate::plugins::payload::KubeObject {
    let doc = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app", "namespace": "ns", "resourceVersion": rv},
        "data": {"k": rv}});
    crate::sources::api_store::payload_object("ConfigMap", doc)
        .expect("a ConfigMap")
        .1
}

/// The versions the pod's volumes were resolved with: (kind, resourceVersion).
fn versions(events: &[SourceEvent]) -> Vec<(String, String)> {
    let pod = match events {
        [SourceEvent::PodAdded(p) | SourceEvent::PodUpdated(p)] => p,
        other => panic!("{:?}", shown(other)),
    };
    pod.volumes
        .iter()
        .filter_map(|v| match &*v.spec {
            crate::model::VolumeSpec::Payload(p) => p.version.clone(),
            _ => None,
        })
        .flat_map(|v| v.objects.clone())
        .map(|o| (o.kind, o.resource_version))
        .collect()
}

#[test]
fn a_payload_pod_is_held_until_its_objects_report_then_follows_their_changes() {
    use crate::model::IssuedToken;
    use std::sync::Arc;
    let store = crate::sources::api_store::ApiObjectStore::default();
    let stores = ObjectStores(vec![Arc::new(store.clone())]);
    let mut s = listed_state().with_payload(stores);
    s.apply(Change::PodApplied(payload_pod()));
    let cm = ObjectRef::ConfigMap("ns".into(), "app".into());
    let follow = s.take_follow_changes().expect("objects to follow").start;
    let token = follow
        .iter()
        .find_map(|r| match r {
            ObjectRef::Token(t) => Some(t.clone()),
            _ => None,
        })
        .expect("a token to keep");
    assert_eq!(follow.len(), 2, "{follow:?}");
    assert_eq!(
        (token.service_account.as_str(), token.pod_uid.as_str()),
        ("default", "u-p")
    );
    assert_eq!(token.expiration_seconds, 600);
    assert!(
        s.take_events(&LinuxSys).is_empty(),
        "held: nothing reported"
    );
    assert!(!s.settled());

    store.set_config_map(("ns".into(), "app".into()), Some(app_config("1")));
    s.object_reported(&cm);
    assert!(
        s.take_events(&LinuxSys).is_empty(),
        "the token has not come"
    );
    let expires = std::time::UNIX_EPOCH + std::time::Duration::from_secs(2_000_000_600);
    let issued = IssuedToken {
        token: "t1".into(),
        expires,
        expiration_seconds: 600,
    };
    store.set_token(token.clone(), Some(Ok(Arc::new(issued))));
    s.object_reported(&ObjectRef::Token(token.clone()));
    let evs = s.take_events(&LinuxSys);
    assert!(s.settled());
    assert_eq!(
        versions(&evs),
        [
            ("ConfigMap".to_owned(), "1".to_owned()),
            (
                "ServiceAccountToken".to_owned(),
                "exp:2000000600".to_owned()
            ),
        ]
    );
    assert_eq!(shown(&evs)[0].0, "added");

    // the watch says it changed: the pod is resolved again, updated
    store.set_config_map(("ns".into(), "app".into()), Some(app_config("2")));
    s.object_reported(&cm);
    let evs = s.take_events(&LinuxSys);
    assert_eq!(shown(&evs)[0].0, "updated");
    assert_eq!(versions(&evs)[0], ("ConfigMap".to_owned(), "2".to_owned()));

    // a failed renewal with no valid token: the volume's error
    store.set_token(token.clone(), Some(Err("forbidden".into())));
    s.object_reported(&ObjectRef::Token(token.clone()));
    let evs = s.take_events(&LinuxSys);
    let [SourceEvent::PodUpdated(p)] = evs.as_slice() else {
        panic!("{:?}", shown(&evs))
    };
    assert!(
        p.errors
            .iter()
            .any(|e| e.contains("kube-api-access") && e.contains("forbidden")),
        "{:?}",
        p.errors
    );

    // the pod gone: nothing followed any more
    s.apply(Change::PodDeleted(payload_pod()));
    let _ = s.take_events(&LinuxSys);
    let stopped = s.take_follow_changes().expect("what to stop");
    assert!(stopped.start.is_empty());
    assert_eq!(stopped.stop, follow, "nothing followed any more");
}

/// A generic ephemeral volume of an API pod: its claim `<pod>-<volume>`
/// is watched as any claim the pod names; one whose controller is another
/// pod is the kubelet's error, and the claim's owner changing to the pod
/// resolves it.
#[test]
fn an_api_pods_ephemeral_volume_uses_its_claim_only_when_it_owns_it() {
    let mut s = listed_state();
    let v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-web"},
        "spec": {"nodeName": NODE, "containers": [], "volumes": [
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        ]},
    });
    s.apply(Change::PodApplied(Box::new(
        serde_json::from_value(v).expect("a pod"),
    )));
    drop(s.take_events(&LinuxSys));
    let owned_by = |uid: &str| {
        let mut c = pvc("web-scratch", "pv-eph");
        c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": uid, "controller": true}]);
        c
    };
    s.apply(Change::Applied(
        Kind::PersistentVolume,
        pv("pv-eph", "web-scratch"),
    ));
    s.apply(Change::Applied(
        Kind::PersistentVolumeClaim,
        owned_by("u-other"),
    ));
    let ev = s.take_events(&LinuxSys);
    let SourceEvent::PodUpdated(p) = &ev[0] else {
        panic!("updated: {ev:?}")
    };
    assert!(p.volumes.is_empty(), "{p:?}");
    assert!(
        p.errors
            .iter()
            .any(|e| e
                .ends_with("PVC ns/web-scratch was not created for pod ns/web (pod is not owner)")),
        "{:?}",
        p.errors
    );
    s.apply(Change::Applied(
        Kind::PersistentVolumeClaim,
        owned_by("u-web"),
    ));
    assert_eq!(
        shown(&s.take_events(&LinuxSys)),
        vec![("updated", "u-web".into(), vec!["scratch".into()])]
    );
}

/// A pod from the API server: its fsGroup and policy reach the emptyDir
/// that takes the walk; a negative fsGroup refuses that volume with an
/// error naming the pod, the volume and the field (the API server would
/// refuse it; a hand-made object or another client may not).
#[test]
fn an_api_pods_fs_group_is_parsed_and_a_bad_one_refuses_its_volumes() {
    let mut s = listed_state();
    let mut good = pod("u-1", "a", NODE, &[]);
    good.spec.as_mut().expect("spec").security_context = Some(
        serde_json::from_value(json!({"fsGroup": 3000, "fsGroupChangePolicy": "OnRootMismatch"}))
            .expect("a context"),
    );
    let mut bad = pod("u-2", "b", NODE, &[]);
    bad.spec.as_mut().expect("spec").security_context =
        Some(serde_json::from_value(json!({"fsGroup": -1})).expect("a context"));
    s.apply(Change::PodApplied(good));
    s.apply(Change::PodApplied(bad));
    let events = s.take_events(&LinuxSys);
    let added = |uid: &str| {
        events.iter().find_map(|e| match e {
            SourceEvent::PodAdded(p) if p.uid.as_str() == uid => Some(p.clone()),
            _ => None,
        })
    };
    let a = added("u-1").expect("u-1 added");
    assert_eq!(
        a.volumes[0].fs_group,
        Some(crate::model::FsGroup {
            gid: 3000,
            policy: crate::model::FsGroupChangePolicy::OnRootMismatch,
        })
    );
    let b = added("u-2").expect("u-2 added");
    assert!(b.volumes.is_empty(), "{:?}", b.volumes);
    assert!(b.unresolved.contains("scratch"));
    assert_eq!(
        b.errors,
        vec!["pod ns/b: volume \"scratch\": spec.securityContext.fsGroup: -1 is negative"]
    );
}
