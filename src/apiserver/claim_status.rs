//! A claim's status around a node expansion, written as the kubelet
//! writes it (docs/kubelet.md, "Volume expansion"): before the call,
//! `allocatedResourceStatuses["storage"]` is `NodeResizeInProgress`; after
//! a success, `capacity.storage` is the new size, the resize status is
//! gone and so are the resize conditions; after a final failure, a
//! `NodeResizeError` condition carries the error, and a failure the driver
//! says can never succeed makes the status `NodeResizeInfeasible`.
//!
//! Each update is a JSON merge patch of the status subresource. The two
//! around a call carry the claim's `resourceVersion`, so one made on a
//! stale read is refused (409) rather than undo what another writer did;
//! the failure's does not, as the kubelet's does not. The patches are
//! built by plain functions; [`patch_claim_status`] sends one.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Map, Value, json};

use crate::model::{
    ClaimCondition, ClaimResize, ClaimState, ClaimUpdate, RESIZE_CONDITIONS, ResizeStep,
};

/// The condition a failed node expansion adds.
pub const NODE_RESIZE_ERROR: &str = "NodeResizeError";

/// A condition as the API spells it.
fn condition_json(c: &ClaimCondition) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), json!(c.kind));
    m.insert("status".into(), json!(c.status));
    let optional = [
        ("reason", &c.reason),
        ("message", &c.message),
        ("lastProbeTime", &c.last_probe_time),
        ("lastTransitionTime", &c.last_transition_time),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            m.insert(k.into(), json!(v));
        }
    }
    Value::Object(m)
}

/// A size as a quantity: the PV's own spelling when it is that size (the
/// kubelet copies the PV's quantity), else bytes with the largest binary
/// suffix that divides them.
fn quantity(state: &ClaimState, bytes: u64) -> String {
    if state.pv_capacity == Some(bytes)
        && let Some(text) = &state.pv_capacity_text
    {
        return text.clone();
    }
    for (suffix, shift) in [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// The patch made before NodeExpandVolume, for a resizer that keeps the
/// recovery fields (none for an older one: nothing to mark).
pub fn in_progress_patch(state: &ClaimState, update: ClaimUpdate) -> Option<Value> {
    if update == ClaimUpdate::Legacy {
        return None;
    }
    Some(json!({
        "metadata": { "resourceVersion": state.resource_version },
        "status": { "allocatedResourceStatuses": { "storage": "NodeResizeInProgress" } },
    }))
}

/// The patch made after NodeExpandVolume grew the volume to `bytes`: the
/// capacity, no resize status (with the recovery fields), no resize
/// condition.
pub fn finished_patch(state: &ClaimState, bytes: u64, update: ClaimUpdate) -> Value {
    let mut status = json!({ "capacity": { "storage": quantity(state, bytes) } });
    if update == ClaimUpdate::Recovery {
        status["allocatedResourceStatuses"] = json!({ "storage": null });
    }
    let kept: Vec<Value> = (state.conditions.iter())
        .filter(|c| !RESIZE_CONDITIONS.contains(&c.kind.as_str()))
        .map(condition_json)
        .collect();
    if kept.len() != state.conditions.len() {
        status["conditions"] = Value::Array(kept);
    }
    json!({
        "metadata": { "resourceVersion": state.resource_version },
        "status": status,
    })
}

/// The patch made after NodeExpandVolume failed for good with `error`
/// (at `now`, RFC 3339): a `NodeResizeError` condition saying so (one
/// already true is kept as it is, as the kubelet merges conditions),
/// the other conditions kept; `infeasible` (the driver's InvalidArgument
/// or OutOfRange: the size cannot be reached) also makes the
/// resize status `NodeResizeInfeasible`, which no node retries.
pub fn failed_patch(state: &ClaimState, error: &str, infeasible: bool, now: &str) -> Value {
    let fresh = ClaimCondition {
        kind: NODE_RESIZE_ERROR.to_owned(),
        status: "True".to_owned(),
        message: Some(format!("failed to expand pvc with {error}")),
        last_transition_time: Some(now.to_owned()),
        ..ClaimCondition::default()
    };
    let mut seen = false;
    let mut conditions: Vec<Value> = Vec::with_capacity(state.conditions.len() + 1);
    for c in &state.conditions {
        if c.kind == NODE_RESIZE_ERROR {
            seen = true;
            let same = c.status == fresh.status;
            conditions.push(condition_json(if same { c } else { &fresh }));
        } else {
            conditions.push(condition_json(c));
        }
    }
    if !seen {
        conditions.push(condition_json(&fresh));
    }
    let mut status = json!({ "conditions": conditions });
    if infeasible {
        status["allocatedResourceStatuses"] = json!({ "storage": "NodeResizeInfeasible" });
    }
    json!({ "status": status })
}

/// The finished patch again, on the claim as it is now (`fresh`, the
/// object as the API server sends it): after a 409, the update made on
/// the claim as it was read lost to another writer; its resourceVersion
/// and conditions are taken from the fresh object, the rest as before.
pub fn finished_patch_on(fresh: &Value, bytes_text: &Value, update: ClaimUpdate) -> Value {
    let mut status = json!({ "capacity": { "storage": bytes_text } });
    if update == ClaimUpdate::Recovery {
        status["allocatedResourceStatuses"] = json!({ "storage": null });
    }
    let conditions: Vec<Value> = fresh
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let kept: Vec<Value> = (conditions.iter())
        .filter(|c| {
            let kind = c.get("type").and_then(Value::as_str).unwrap_or_default();
            !RESIZE_CONDITIONS.contains(&kind)
        })
        .cloned()
        .collect();
    if kept.len() != conditions.len() {
        status["conditions"] = Value::Array(kept);
    }
    json!({
        "metadata": { "resourceVersion": fresh.pointer("/metadata/resourceVersion") },
        "status": status,
    })
}

/// The patch of one update (none: nothing to write).
pub fn patch_of(update: &ClaimResize, now: &str) -> Option<Value> {
    let claim = &update.claim;
    match &update.step {
        ResizeStep::Started => in_progress_patch(claim, update.update),
        ResizeStep::Finished(bytes) => Some(finished_patch(claim, *bytes, update.update)),
        ResizeStep::Failed { error, infeasible } => {
            Some(failed_patch(claim, error, *infeasible, now))
        }
    }
}

/// Sends `patch` to the status of claim `namespace/name`; the claim's
/// new `resourceVersion`.
pub async fn patch_claim_status(
    client: &Client,
    namespace: &str,
    name: &str,
    patch: &Value,
) -> kube::Result<Option<String>> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|c| c.metadata.resource_version)
}

/// Writes each update `updates` brings, in order, until `stop`. The
/// updates of one expansion carry the claim as it was read, so a patch
/// after one this task made takes that patch's `resourceVersion` (as
/// the kubelet patches the claim each patch returned). A failed write is
/// logged and dropped, as the kubelet's is; the claim then still says
/// the expansion is pending.
pub(crate) async fn send_claim_updates(
    client: Client,
    mut updates: tokio::sync::mpsc::UnboundedReceiver<ClaimResize>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // per claim: the resourceVersion a patch was made on, and the one it
    // returned
    let mut moved: std::collections::HashMap<(String, String), (String, String)> =
        Default::default();
    loop {
        let update = tokio::select! {
            u = updates.recv() => match u { Some(u) => u, None => return },
            _ = stop.changed() => return,
        };
        let now = crate::health::report::rfc3339(std::time::SystemTime::now());
        let Some(mut patch) = patch_of(&update, &now) else {
            continue;
        };
        let key = (update.claim.namespace.clone(), update.claim.name.clone());
        let mut made_on = None;
        if let Some(rv) = patch.pointer_mut("/metadata/resourceVersion") {
            if let (Some(sent), Some((from, to))) = (rv.as_str(), moved.get(&key))
                && sent == from
            {
                *rv = json!(to);
            }
            made_on = rv.as_str().map(str::to_owned);
        }
        match patch_claim_status(&client, &key.0, &key.1, &patch).await {
            Ok(Some(new)) => {
                if let Some(old) = made_on {
                    moved.insert(key, (old, new));
                }
            }
            Ok(None) => {}
            // another writer (the resize controller) changed the claim
            // since it was read: a finished expansion is written again on
            // the claim as it is now, as the kubelet reads it again
            Err(kube::Error::Api(e))
                if e.code == 409 && matches!(update.step, ResizeStep::Finished(_)) =>
            {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &key.0);
                let again = match api.get_status(&key.1).await {
                    Ok(fresh) => match serde_json::to_value(&fresh) {
                        Ok(fresh) => {
                            let patch = finished_patch_on(
                                &fresh,
                                &patch["status"]["capacity"]["storage"],
                                update.update,
                            );
                            patch_claim_status(&client, &key.0, &key.1, &patch).await
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "encode claim");
                            continue;
                        }
                    },
                    Err(e) => Err(e),
                };
                if let Err(e) = again {
                    tracing::warn!(claim = %format!("{}/{}", key.0, key.1), error = %e,
                        "patch claim status after a node expansion, on a fresh read");
                }
            }
            Err(e) => tracing::warn!(claim = %format!("{}/{}", key.0, key.1), error = %e,
                "patch claim status after a node expansion"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ClaimSize;

    const GI: u64 = 1 << 30;

    fn cond(kind: &str, status: &str, message: &str) -> ClaimCondition {
        ClaimCondition {
            kind: kind.into(),
            status: status.into(),
            message: Some(message.into()),
            last_transition_time: Some("2026-01-01T00:00:00Z".into()),
            ..ClaimCondition::default()
        }
    }

    fn state(conditions: Vec<ClaimCondition>) -> ClaimState {
        ClaimState {
            namespace: "ns".into(),
            name: "data".into(),
            resource_version: Some("42".into()),
            pv_capacity: Some(2 * GI),
            pv_capacity_text: Some("2048Mi".into()),
            size: ClaimSize {
                status_capacity: Some(GI),
                allocated: true,
                resize_status: None,
            },
            conditions,
        }
    }

    #[test]
    fn in_progress_is_marked_only_for_a_resizer_with_the_recovery_fields() {
        let s = state(vec![]);
        assert_eq!(in_progress_patch(&s, ClaimUpdate::Legacy), None);
        assert_eq!(
            in_progress_patch(&s, ClaimUpdate::Recovery),
            Some(json!({
                "metadata": {"resourceVersion": "42"},
                "status": {"allocatedResourceStatuses": {"storage": "NodeResizeInProgress"}},
            }))
        );
    }

    #[test]
    fn finished_sets_the_capacity_and_drops_the_resize_status_and_conditions() {
        let other = cond("ModifyingVolume", "True", "elsewhere");
        let s = state(vec![
            cond("FileSystemResizePending", "True", "waiting"),
            other.clone(),
            cond("NodeResizeError", "True", "earlier"),
        ]);
        assert_eq!(
            finished_patch(&s, 2 * GI, ClaimUpdate::Recovery),
            json!({
                "metadata": {"resourceVersion": "42"},
                "status": {
                    "capacity": {"storage": "2048Mi"},
                    "allocatedResourceStatuses": {"storage": null},
                    "conditions": [condition_json(&other)],
                },
            }),
            "the PV's quantity as written; other conditions kept as read"
        );
        // an older resizer: no resize status to remove; no resize
        // condition: the list is left alone
        let plain = state(vec![other]);
        assert_eq!(
            finished_patch(&plain, 3 * GI, ClaimUpdate::Legacy),
            json!({
                "metadata": {"resourceVersion": "42"},
                "status": {"capacity": {"storage": "3Gi"}},
            })
        );
    }

    #[test]
    fn a_failure_adds_node_resize_error_and_infeasible_only_when_final_for_good() {
        let s = state(vec![cond("FileSystemResizePending", "True", "waiting")]);
        let p = failed_patch(&s, "OutOfRange: too big", true, "2026-02-02T00:00:00Z");
        assert_eq!(
            p,
            json!({"status": {
                "conditions": [
                    condition_json(&s.conditions[0]),
                    {"type": "NodeResizeError", "status": "True",
                     "message": "failed to expand pvc with OutOfRange: too big",
                     "lastTransitionTime": "2026-02-02T00:00:00Z"},
                ],
                "allocatedResourceStatuses": {"storage": "NodeResizeInfeasible"},
            }}),
            "no resourceVersion: as the kubelet's"
        );
        let retried = failed_patch(&s, "Internal: disk busy", false, "t");
        assert!(retried["status"].get("allocatedResourceStatuses").is_none());
        // one already true is kept as it was
        let again = state(vec![cond("NodeResizeError", "True", "first")]);
        let p = failed_patch(&again, "second", false, "t");
        assert_eq!(
            p["status"]["conditions"],
            json!([condition_json(&again.conditions[0])])
        );
    }

    #[test]
    fn a_finished_patch_after_a_conflict_takes_the_fresh_claims_version_and_conditions() {
        let fresh = json!({
            "metadata": {"name": "data", "resourceVersion": "77"},
            "status": {
                "capacity": {"storage": "1Gi"},
                "conditions": [
                    {"type": "FileSystemResizePending", "status": "True"},
                    {"type": "ModifyingVolume", "status": "True"},
                ],
            },
        });
        assert_eq!(
            finished_patch_on(&fresh, &json!("2Gi"), ClaimUpdate::Recovery),
            json!({
                "metadata": {"resourceVersion": "77"},
                "status": {
                    "capacity": {"storage": "2Gi"},
                    "allocatedResourceStatuses": {"storage": null},
                    "conditions": [{"type": "ModifyingVolume", "status": "True"}],
                },
            })
        );
        let plain = json!({"metadata": {"resourceVersion": "78"}, "status": {}});
        assert_eq!(
            finished_patch_on(&plain, &json!("2Gi"), ClaimUpdate::Legacy),
            json!({
                "metadata": {"resourceVersion": "78"},
                "status": {"capacity": {"storage": "2Gi"}},
            })
        );
    }

    #[test]
    fn each_step_maps_to_its_patch() {
        use std::sync::Arc;
        let s = Arc::new(state(vec![]));
        let of = |update, step| {
            patch_of(
                &ClaimResize {
                    claim: s.clone(),
                    update,
                    step,
                },
                "t",
            )
        };
        assert_eq!(of(ClaimUpdate::Legacy, ResizeStep::Started), None);
        assert_eq!(
            of(ClaimUpdate::Recovery, ResizeStep::Started),
            in_progress_patch(&s, ClaimUpdate::Recovery)
        );
        assert_eq!(
            of(ClaimUpdate::Recovery, ResizeStep::Finished(2 * GI)),
            Some(finished_patch(&s, 2 * GI, ClaimUpdate::Recovery))
        );
        let failed = ResizeStep::Failed {
            error: "e".into(),
            infeasible: false,
        };
        assert_eq!(
            of(ClaimUpdate::Recovery, failed),
            Some(failed_patch(&s, "e", false, "t"))
        );
    }

    #[test]
    fn sizes_without_the_pvs_spelling_use_the_largest_binary_suffix() {
        let mut s = state(vec![]);
        s.pv_capacity_text = None;
        let table = [
            (2 * GI, "2Gi"),
            (3 << 20, "3Mi"),
            (3072, "3Ki"),
            (1536, "1536"),
            (1000, "1000"),
        ];
        for (bytes, want) in table {
            assert_eq!(quantity(&s, bytes), want, "{bytes}");
        }
        // the PV's spelling only for the PV's size
        s.pv_capacity_text = Some("2048Mi".into());
        assert_eq!(quantity(&s, 2 * GI), "2048Mi");
        assert_eq!(quantity(&s, 4 * GI), "4Gi");
    }
}
