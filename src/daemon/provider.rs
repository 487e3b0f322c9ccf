//! What the HTTP server reads of a running daemon ([`DebugProvider`]):
//! readiness, metrics, `/debug/state`, events, health, the journal's dump
//! and the runtime API's answers, each under the world's lock only as long
//! as a copy takes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::event_loop::World;
use crate::dump::DumpDoc;
use crate::journal::Journal;
use crate::metrics::{Metrics, gather_text};
use crate::model::UniqueVolumeName;
use crate::server::DebugProvider;
use crate::state::StateSnapshot;

/// How long `/debug/health?fresh=1` waits for the pass it asks for.
const HEALTH_WAIT: Duration = Duration::from_secs(30);

pub(super) struct Provider {
    pub(super) runtime: crate::runtime::VolumeManagerHandle,
    pub(super) world: Arc<Mutex<World>>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) journal: Option<Arc<Journal>>,
    pub(super) node_name: String,
    pub(super) boot_id: String,
    pub(super) monitor: Option<Arc<crate::health::Monitor>>,
    pub(super) sink: Arc<crate::health::RecentEvents>,
    /// the journaled subPath binds the runtime API makes; one at a time
    /// (two runtimes asking for one container at once must not both make,
    /// and stack, its binds)
    pub(super) subpaths: Arc<crate::reconciler::executor::subpaths::Subpaths>,
}

impl DebugProvider for Provider {
    fn ready(&self) -> Result<(), String> {
        // A provider exists only once `Daemon::start` has reconstructed, so
        // readiness waits only for every pod source to have listed (not for
        // the pod-dir walk: see `core::Phase::ready`).
        // A journal that cannot be written starts nothing: not ready, with
        // the reason (the kubelet and a DaemonSet see it).
        if let Some(why) = self.journal.as_ref().and_then(|j| j.unwritable_reason()) {
            return Err(format!(
                "the journal cannot be written, no volume operation starts: {why}"
            ));
        }
        let w = self.world.lock().unwrap_or_else(|p| p.into_inner());
        if !w.ready {
            return Err("not every pod source has been listed yet".into());
        }
        Ok(())
    }

    fn metrics_text(&self) -> String {
        if let Some(j) = &self.journal {
            self.metrics
                .journal
                .observe(j.flush_count(), j.synced_through());
            self.metrics
                .journal
                .observe_writes(j.unwritable_reason().is_none(), &j.write_errors());
        }
        gather_text(&self.metrics)
    }

    fn long_polls_waiting(&self, waiting: crate::server::LongPollsWaiting) {
        self.metrics
            .runtime_api
            .observe_long_polls(waiting.socket, waiting.debug);
    }

    fn state(&self) -> StateSnapshot {
        let w = self.world.lock().unwrap_or_else(|p| p.into_inner());
        let mut s = w.asw.snapshot();
        s.pod_errors = w
            .dsw
            .pod_errors()
            .map(|(p, e)| (p.as_str().to_owned(), e.iter().cloned().collect()))
            .collect();
        s.unmounted_outside = w.unmounted_outside.clone();
        drop(w);
        s.journal_damage = self
            .journal
            .as_ref()
            .and_then(|j| crate::dump::DamageJson::of(j.damage()));
        if let Some(m) = &self.monitor {
            m.read(|store| crate::health::report::fill_state(store, &mut s));
        }
        s
    }

    fn events(&self) -> Vec<crate::health::VolumeEvent> {
        self.sink.recent()
    }

    fn health(
        &self,
        fresh: bool,
        volume: Option<&str>,
    ) -> Option<crate::health::report::HealthDoc> {
        let m = self.monitor.as_ref()?;
        if fresh && !m.check_now(HEALTH_WAIT) {
            tracing::warn!(wait = ?HEALTH_WAIT, "health: an asked-for pass did not end in time");
        }
        let only = volume.map(UniqueVolumeName::from_raw);
        Some(m.read(|s| crate::health::report::document(s, only.as_ref())))
    }

    fn journal(&self, volume: Option<&str>) -> Result<DumpDoc, String> {
        let journal = self
            .journal
            .as_ref()
            .ok_or("the journal is off (--journal off)")?;
        let state = journal.state();
        let replay = journal
            .current(&self.node_name)
            .map_err(|e| e.to_string())?;
        let only = volume.map(UniqueVolumeName::from_raw);
        Ok(crate::dump::document(
            &replay,
            &state,
            &self.boot_id,
            only.as_ref(),
        ))
    }

    fn pod_volumes(&self, pod: &crate::model::PodUid) -> Option<crate::runtime::PodVolumes> {
        self.runtime.pod_volumes(pod)
    }

    fn pod_unmounted(&self, pod: &crate::model::PodUid) -> Option<crate::runtime::PodUnmounted> {
        Some(self.runtime.pod_unmounted(pod))
    }

    fn container_mounts(
        &self,
        pod: &crate::model::PodUid,
        container: &str,
    ) -> Option<Result<crate::runtime::ContainerMounts, String>> {
        use crate::model::{SubpathBind, SubpathKey};
        use crate::runtime::mounts::{answer, plan};
        // the pod looked at and its binds made under one lock, which a
        // TearDown's cleanup of its binds holds too
        let held = self.subpaths.hold();
        let view = self.runtime.container_view(pod, container)?;
        let Some(spec) = view.spec else {
            return Some(Err(format!("pod {pod}: no container {container:?}")));
        };
        let (planned, errors) = plan(&view.status, &spec);
        let doc = answer(&view.status, &spec, planned, errors, |req| {
            let (volume, is_mount) = view
                .volumes
                .iter()
                .find(|(name, _, _)| *name == req.volume)
                .map(|(_, unique, is_mount)| (unique.clone(), *is_mount))
                .ok_or_else(|| format!("volume {:?} is not the pod's", req.volume))?;
            let index = u32::try_from(req.index).map_err(|e| e.to_string())?;
            let key = SubpathKey::new(pod.clone(), &req.volume, container, index)
                .map_err(|e| e.to_string())?;
            let bind = SubpathBind {
                key,
                volume,
                sub_path: req.sub_path.clone(),
            };
            held.bind(&bind, &req.volume_path, is_mount)
        });
        drop(held);
        for e in &doc.errors {
            tracing::warn!(pod = %pod, container, error = %e, "container mounts");
        }
        Some(Ok(doc))
    }

    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        let c = self.runtime.changes();
        (!c.is_closed()).then(|| c.subscribe())
    }
}
