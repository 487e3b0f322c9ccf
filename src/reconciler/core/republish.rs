//! `requiresRepublish`: a CSI driver whose CSIDriver asks for it gets
//! NodePublishVolume again for every mounted pod target once per sync
//! period (the kubelet's `--sync-frequency`, 1 min: its pod workers mark
//! such volumes "remount required" on each periodic pod sync). Drivers use
//! it to refresh what they put in the target (rotated secrets, tokens).
//! Nothing else is ever published twice: the journal and the host agreeing
//! is not a reason to call a driver again.
//!
//! Payload volumes (configMap, secret, downwardAPI, projected) get a SetUp
//! in the same pass when the payload their objects make now (the DSW's
//! spec, whose version the sources fill in from the objects) is not the
//! one last written (the ASW's spec), so a changed ConfigMap or Secret is
//! written within a sync period, atomically, with a new intent recording
//! its hash. A payload whose objects are all `immutable` is read once and
//! never written again; after a restart (the ASW has no spec yet) the
//! first pass runs one SetUp, which finds the payload in place and
//! rewrites nothing if it did not change.
//!
//! Once a period this walks the DSW (the kubelet walks every pod per sync
//! too); an event never does.

use std::time::Instant;

use super::{Core, Effect, World};
use crate::model::VolumeSpec;
use crate::reconciler::jobs::job_for;
use crate::reconciler::plan::Action;
use crate::state::DesiredStateOfWorld;

impl Core {
    /// Starts a SetUp for every mounted target of a republishing volume,
    /// once per [`super::CoreConfig::republish_every`] (zero: never).
    pub(super) fn maybe_republish(&mut self, w: &World, now: Instant, out: &mut Vec<Effect>) {
        let every = self.cfg.republish_every;
        // no job starts beside a sweep (see `maybe_sweep`)
        if every.is_zero() || self.in_flight.sweep {
            return;
        }
        let due = *self.timers.republish_at.get_or_insert(now + every);
        if now < due {
            return;
        }
        self.timers.republish_at = Some(now + every);
        for (name, uid, v, p) in w.dsw.volumes_to_mount_iter() {
            let again = match &*v.spec {
                VolumeSpec::Csi(c) => c.republish,
                VolumeSpec::Payload(want) => payload_changed(w, name, want),
                _ => false,
            };
            if !again {
                continue;
            }
            // an uncertain target is set up again by the plan anyway
            let mounted = w
                .asw
                .pod_exists_in_volume(name, uid, v.effective_selinux.as_ref())
                .is_ok_and(|p| p.mounted);
            if !mounted {
                continue;
            }
            let action = Action::Mount {
                want: Box::new(DesiredStateOfWorld::volume_to_mount(name, uid, v, p)),
                mount_device: false,
            };
            if !self.pending.start(&action.key(), now) {
                continue;
            }
            if let Some(job) = job_for(&action, &w.asw, None, &self.cfg.layout) {
                tracing::debug!(volume = %name, pod = %uid, "set up again: republished or a new payload");
                out.push(Effect::Start {
                    job,
                    announce: self.cfg.journal,
                });
            }
        }
    }
}

/// Whether the payload `want` describes is not the one the ASW says was
/// last written to `volume` (unknown after a restart: then yes, once).
fn payload_changed(
    w: &World,
    volume: &crate::model::UniqueVolumeName,
    want: &crate::model::PayloadSpec,
) -> bool {
    let written = w.asw.volume(volume).and_then(|v| v.spec.clone());
    match written.as_deref() {
        Some(VolumeSpec::Payload(had)) if had.immutable => false,
        Some(VolumeSpec::Payload(had)) => {
            let hash = |s: &crate::model::PayloadSpec| s.version.as_ref().map(|v| v.hash.clone());
            hash(had) != hash(want)
        }
        _ => true,
    }
}
