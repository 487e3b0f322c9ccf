//! The monitor's findings in the shapes others read: `/debug/state`'s
//! `health` per volume and per-pod `Pod.status.volumeHealth`
//! (Kubernetes 1.37's types, so the API source can publish them as they
//! are), and `/debug/health`, which `volumed health` prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{PodVolumeHealth, VolumeHealthCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use super::store::Store;
use super::{Condition, Usage};
use crate::model::UniqueVolumeName;

/// `time` to the second (what the API's `Time` carries).
fn timestamp(time: SystemTime) -> Option<k8s_openapi::jiff::Timestamp> {
    let secs = time.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).ok()?).ok()
}

/// `time` as RFC 3339 (UTC, seconds).
pub fn rfc3339(time: SystemTime) -> String {
    timestamp(time).map(|t| t.to_string()).unwrap_or_default()
}

pub use crate::state::HealthJson;

impl From<&Condition> for HealthJson {
    fn from(c: &Condition) -> Self {
        HealthJson {
            abnormal: c.abnormal,
            reason: c.reason.to_owned(),
            message: c.message.to_string(),
            since: rfc3339(c.since),
            source: match c.source {
                super::Source::Csi => "csi",
                super::Source::Native => "native",
            }
            .to_owned(),
        }
    }
}

/// Each volume's condition, by unique volume name.
pub fn conditions(store: &Store) -> BTreeMap<String, HealthJson> {
    store
        .volumes
        .iter()
        .filter_map(|(v, r)| {
            Some((
                v.as_str().to_owned(),
                HealthJson::from(&**r.condition.as_ref()?),
            ))
        })
        .collect()
}

/// Writes each volume's condition and the pods' `volumeHealth` into a
/// `/debug/state` snapshot.
pub fn fill_state(store: &Store, s: &mut crate::state::StateSnapshot) {
    for v in &mut s.volumes {
        v.health = store
            .volumes
            .get(&v.volume)
            .and_then(|r| r.condition.as_deref())
            .map(HealthJson::from);
    }
    s.pod_volume_health = pod_volume_health(store)
        .into_iter()
        .filter_map(|(uid, h)| Some((uid, serde_json::to_value(h).ok()?)))
        .collect();
}

/// Per pod UID, its volumes' `Pod.status.volumeHealth` entries: one per
/// pod volume that has a condition, with the problems (none when normal).
pub fn pod_volume_health(store: &Store) -> BTreeMap<String, Vec<PodVolumeHealth>> {
    let mut out: BTreeMap<String, Vec<PodVolumeHealth>> = BTreeMap::new();
    for r in store.volumes.values() {
        let Some(c) = &r.condition else { continue };
        let since = timestamp(c.since).map(Time);
        let conditions: Vec<VolumeHealthCondition> = c
            .findings
            .iter()
            .take(16) // the API's limit
            .map(|f| VolumeHealthCondition {
                status: f.status.as_str().to_owned(),
                reason: f.reason.to_owned(),
                message: Some(f.message.clone()),
            })
            .collect();
        for p in r.pods.iter() {
            out.entry(p.uid.as_str().to_owned())
                .or_default()
                .push(PodVolumeHealth {
                    name: p.outer_name.to_string(),
                    health_conditions: Some(conditions.clone()),
                    last_transition_time: since.clone(),
                });
        }
    }
    for v in out.values_mut() {
        v.sort_by(|a, b| a.name.cmp(&b.name));
    }
    out
}

/// A PVC's names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimJson {
    /// its namespace
    pub namespace: String,
    /// its name
    pub name: String,
}

/// One volume in `/debug/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeHealthJson {
    /// the unique volume name
    pub volume: String,
    /// its plugin
    pub plugin: String,
    /// the claim, for a PVC-backed volume
    pub claim: Option<ClaimJson>,
    /// the condition; `null` when none was judged
    pub health: Option<HealthJson>,
    /// the usage last measured
    pub usage: Option<UsageJson>,
    /// RFC 3339: when it was last checked
    pub checked: String,
    /// the pods using it
    pub pods: Vec<String>,
}

/// [`Usage`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageJson {
    /// total bytes
    pub capacity_bytes: u64,
    /// bytes a pod may still write
    pub available_bytes: u64,
    /// bytes in use
    pub used_bytes: u64,
    /// total inodes, when counted
    pub inodes: Option<u64>,
    /// free inodes
    pub inodes_free: Option<u64>,
    /// inodes in use
    pub inodes_used: Option<u64>,
}

impl From<Usage> for UsageJson {
    fn from(u: Usage) -> Self {
        UsageJson {
            capacity_bytes: u.capacity_bytes,
            available_bytes: u.available_bytes,
            used_bytes: u.used_bytes,
            inodes: u.inodes,
            inodes_free: u.inodes_free,
            inodes_used: u.inodes_used,
        }
    }
}

/// `/debug/health`: every checked volume, sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthDoc {
    /// passes completed since the daemon started
    pub passes: u64,
    /// the volumes
    pub volumes: Vec<VolumeHealthJson>,
}

/// The store as `/debug/health`: every volume, or `only` that one (none
/// when it is not checked). One volume's costs O(log volumes), where the
/// whole store's document grows with the node.
pub fn document(store: &Store, only: Option<&UniqueVolumeName>) -> HealthDoc {
    use std::ops::Bound::{Included, Unbounded};
    let bounds = only.map_or((Unbounded, Unbounded), |v| (Included(v), Included(v)));
    HealthDoc {
        passes: store.passes,
        volumes: store
            .volumes
            .range::<UniqueVolumeName, _>(bounds)
            .map(|(v, r)| VolumeHealthJson {
                volume: v.as_str().to_owned(),
                plugin: r.plugin.as_str().to_owned(),
                claim: r.claim.as_ref().map(|c| ClaimJson {
                    namespace: c.namespace.clone(),
                    name: c.name.clone(),
                }),
                health: r.condition.as_deref().map(HealthJson::from),
                usage: r.usage().map(UsageJson::from),
                checked: rfc3339(r.checked()),
                pods: r.pods.iter().map(|p| p.uid.as_str().to_owned()).collect(),
            })
            .collect(),
    }
}

/// `volumed health`'s table: one line per volume.
pub fn render_table(doc: &HealthDoc) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<9} {:<26} {:<7} {:>12} {:>12} {:>10}  {:<28} VOLUME / MESSAGE",
        "STATE", "REASON", "SOURCE", "USED", "AVAILABLE", "INODES", "CLAIM"
    );
    for v in &doc.volumes {
        let (state, reason, source, message) = match &v.health {
            Some(h) if h.abnormal => (
                "ABNORMAL",
                h.reason.as_str(),
                h.source.as_str(),
                h.message.as_str(),
            ),
            Some(h) => ("ok", h.reason.as_str(), h.source.as_str(), ""),
            None => ("-", "-", "-", ""),
        };
        let num = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        let claim = v
            .claim
            .as_ref()
            .map_or_else(|| "-".to_owned(), |c| format!("{}/{}", c.namespace, c.name));
        let _ = writeln!(
            out,
            "{:<9} {:<26} {:<7} {:>12} {:>12} {:>10}  {:<28} {}",
            state,
            reason,
            source,
            num(v.usage.map(|u| u.used_bytes)),
            num(v.usage.map(|u| u.available_bytes)),
            num(v.usage.and_then(|u| u.inodes_used)),
            claim,
            v.volume
        );
        if !message.is_empty() {
            let _ = writeln!(out, "{:>10}{message}", "");
        }
    }
    let _ = writeln!(
        out,
        "{} volume(s), {} pass(es)",
        doc.volumes.len(),
        doc.passes
    );
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;

    use super::super::store::Judged;
    use super::super::{Claim, Finding, PodRef, PodTarget, Severity, Subject};
    use super::*;
    use crate::model::{PluginName, PodUid, TargetKind, UniqueVolumeName};

    fn target(uid: &str, outer: &str) -> PodTarget {
        PodTarget {
            uid: PodUid::new(uid).unwrap(),
            outer_name: outer.into(),
            path: format!("/k/pods/{uid}/volumes/{outer}").into(),
            kind: TargetKind::Mount,
            pod: Some(Arc::new(PodRef {
                namespace: "default".into(),
                name: uid.into(),
            })),
            read_only: false,
        }
    }

    /// A pass's store as every report reads it: the volumes' plugins,
    /// claims, pods (uid and volume name) and conditions, as the subjects
    /// of the pass had them; a pass that no longer finds a pod or a
    /// volume leaves it out, a hung volume keeps its record.
    #[test]
    fn the_store_reports_the_pods_claims_and_conditions_of_the_pass() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let shared = Subject {
            volume: UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
            plugin: PluginName::LocalVolume,
            spec: None,
            device: Some("/k/plugins/local/pv1".into()),
            pods: vec![target("u2", "data"), target("u1", "data")],
            claim: Some(Box::new(Claim {
                namespace: "default".into(),
                name: "pvc1".into(),
            })),
        };
        let cache = Subject {
            volume: UniqueVolumeName::from_raw("kubernetes.io/empty-dir/u1-cache"),
            plugin: PluginName::EmptyDir,
            spec: None,
            device: None,
            pods: vec![target("u1", "cache")],
            claim: None,
        };
        let full = Finding {
            status: Severity::Degraded,
            reason: "OutOfSpace",
            message: "no space left".into(),
        };
        let abnormal = super::super::decide::native_condition(vec![full], t);
        let healthy = super::super::decide::native_condition(vec![], t);
        let judged = |condition: &Condition, pass| Judged {
            condition: Some(Arc::new(condition.clone())),
            usage: None,
            checked: t,
            pass,
        };
        let mut store = Store::default();
        assert!(store.put(shared.clone(), judged(&abnormal, 1)));
        assert!(store.put(cache.clone(), judged(&healthy, 1)));
        assert!(store.end_pass(1, &HashSet::new(), true).is_empty());

        let health = |reason: &str, message: &str, abnormal: bool| {
            json!({"abnormal": abnormal, "reason": reason, "message": message,
                   "since": "2023-11-14T22:13:20Z", "source": "native"})
        };
        let doc = serde_json::to_value(document(&store, None)).unwrap();
        assert_eq!(
            doc,
            json!({"passes": 1, "volumes": [
                {"volume": "kubernetes.io/empty-dir/u1-cache", "plugin": "kubernetes.io/empty-dir",
                 "claim": null, "health": health("Healthy", "no problem found", false),
                 "usage": null, "checked": "2023-11-14T22:13:20Z", "pods": ["u1"]},
                {"volume": "kubernetes.io/local-volume/pv1", "plugin": "kubernetes.io/local-volume",
                 "claim": {"namespace": "default", "name": "pvc1"},
                 "health": health("OutOfSpace", "no space left", true),
                 "usage": null, "checked": "2023-11-14T22:13:20Z", "pods": ["u2", "u1"]},
            ]})
        );
        let one = |name: &str| {
            let doc = document(&store, Some(&UniqueVolumeName::from_raw(name)));
            let names: Vec<String> = doc.volumes.into_iter().map(|v| v.volume).collect();
            (doc.passes, names)
        };
        let pv = "kubernetes.io/local-volume/pv1";
        assert_eq!(one(pv), (1, vec![pv.to_owned()]), "one volume asked for");
        assert_eq!(
            one("kubernetes.io/empty-dir/nope"),
            (1, vec![]),
            "not checked"
        );
        assert_eq!(
            serde_json::to_value(conditions(&store)).unwrap(),
            json!({"kubernetes.io/empty-dir/u1-cache": health("Healthy", "no problem found", false),
                   "kubernetes.io/local-volume/pv1": health("OutOfSpace", "no space left", true)})
        );
        let since = "2023-11-14T22:13:20Z";
        let problem =
            json!([{"status": "Degraded", "reason": "OutOfSpace", "message": "no space left"}]);
        assert_eq!(
            serde_json::to_value(pod_volume_health(&store)).unwrap(),
            json!({
                "u1": [
                    {"name": "cache", "healthConditions": [], "lastTransitionTime": since},
                    {"name": "data", "healthConditions": problem, "lastTransitionTime": since},
                ],
                "u2": [{"name": "data", "healthConditions": problem, "lastTransitionTime": since}],
            })
        );

        // pass 2: u2 is gone from the shared volume, the cache volume hangs
        let mut fewer = shared.clone();
        fewer.pods.remove(0);
        assert!(!store.put(fewer, judged(&abnormal, 2)));
        let hung = HashSet::from([cache.volume.clone()]);
        assert!(store.end_pass(2, &hung, false).is_empty());
        let doc = document(&store, None);
        assert_eq!(doc.passes, 2);
        let pods: Vec<_> = doc.volumes.iter().map(|v| v.pods.clone()).collect();
        assert_eq!(pods, [vec!["u1"], vec!["u1"]]);

        // pass 3: the local volume is no longer mounted, nor hung
        let gone = store.end_pass(3, &HashSet::new(), false);
        assert_eq!(gone.len(), 2);
        assert_eq!(
            gone.iter()
                .filter_map(|r| r.claim.as_deref())
                .collect::<Vec<_>>(),
            [&Claim {
                namespace: "default".into(),
                name: "pvc1".into()
            }]
        );
        assert!(store.volumes.is_empty());
    }

    #[test]
    fn times_are_rfc3339_utc_seconds() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_400);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20Z");
    }
}
