//! Events about volumes, per pod, as the kubelet records them on the pod
//! (`VolumeConditionAbnormal`, a Warning, "Volume `<name>`: `<message>`"), plus
//! one volumed adds when the condition clears (`VolumeConditionNormal`, a
//! Normal event; the kubelet says nothing then). They go to an
//! [`EventSink`]: with `--kubeconfig` they are also posted to the API
//! server as Events on the pod; every node keeps the recent ones for
//! `/debug/events` ([`RecentEvents`]) and logs each.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;

/// One event, in `/debug/events`' shape (docs/http.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeEvent {
    /// `Normal` or `Warning`
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `VolumeConditionAbnormal` or `VolumeConditionNormal`
    pub reason: &'static str,
    /// "Volume `<pod's volume name>`: `<what>`"
    pub message: String,
    /// the pod
    pub pod_uid: String,
    /// its namespace, when a source lists the pod
    pub namespace: Option<String>,
    /// its name, when a source lists the pod
    pub pod: Option<String>,
    /// RFC 3339
    pub time: String,
}

/// The kubelet's reason for an abnormal volume condition.
pub(crate) const ABNORMAL: &str = "VolumeConditionAbnormal";
/// volumed's reason for a condition that cleared.
pub(crate) const NORMAL: &str = "VolumeConditionNormal";
// The loop's own reasons, decided by the core.

/// A pod event the core or a job decided, as the sink takes it (a
/// Warning; a Normal for a node expansion that succeeded, as the
/// kubelet's), at `now`.
pub(crate) fn stamped(
    e: crate::reconciler::effects::PodEvent,
    now: std::time::SystemTime,
) -> VolumeEvent {
    let normal = e.reason == crate::reconciler::executor::FILE_SYSTEM_RESIZE_SUCCESSFUL;
    VolumeEvent {
        kind: if normal { "Normal" } else { "Warning" },
        reason: e.reason,
        message: e.message,
        pod_uid: e.pod.as_str().to_owned(),
        namespace: e.names.as_ref().map(|n| n.namespace.to_string()),
        pod: e.names.as_ref().map(|n| n.name.to_string()),
        time: super::report::rfc3339(now),
    }
}

/// Where events go.
pub trait EventSink: Send + Sync {
    /// Records one event (never blocks on I/O for long).
    fn emit(&self, event: VolumeEvent);
}

/// How many events [`RecentEvents`] keeps.
pub(crate) const RECENT: usize = 1000;

/// The last `RECENT` events, oldest first, each also logged.
#[derive(Debug, Default)]
pub struct RecentEvents {
    events: Mutex<VecDeque<VolumeEvent>>,
}

impl RecentEvents {
    /// The events kept, newest last.
    pub fn recent(&self) -> Vec<VolumeEvent> {
        let e = self.events.lock().unwrap_or_else(|p| p.into_inner());
        e.iter().cloned().collect()
    }
}

impl EventSink for RecentEvents {
    fn emit(&self, event: VolumeEvent) {
        match event.kind {
            "Warning" => tracing::warn!(
                reason = event.reason,
                pod_uid = %event.pod_uid,
                namespace = event.namespace.as_deref().unwrap_or(""),
                pod = event.pod.as_deref().unwrap_or(""),
                "{}",
                event.message
            ),
            _ => tracing::info!(
                reason = event.reason,
                pod_uid = %event.pod_uid,
                namespace = event.namespace.as_deref().unwrap_or(""),
                pod = event.pod.as_deref().unwrap_or(""),
                "{}",
                event.message
            ),
        }
        let mut e = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if e.len() == RECENT {
            e.pop_front();
        }
        e.push_back(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: usize) -> VolumeEvent {
        VolumeEvent {
            kind: "Warning",
            reason: ABNORMAL,
            message: format!("Volume data: {n}"),
            pod_uid: "u1".into(),
            namespace: None,
            pod: None,
            time: String::new(),
        }
    }

    #[test]
    fn the_sink_keeps_the_newest_events_last_and_drops_the_oldest() {
        let sink = RecentEvents::default();
        for n in 0..RECENT + 5 {
            sink.emit(event(n));
        }
        let kept = sink.recent();
        assert_eq!(kept.len(), RECENT);
        assert_eq!(kept[0].message, "Volume data: 5");
        assert_eq!(
            kept[RECENT - 1].message,
            format!("Volume data: {}", RECENT + 4)
        );
    }
}
