//! `requiresRepublish`: a CSI driver whose CSIDriver asks for it gets
//! NodePublishVolume again for every mounted pod target once per sync
//! period (the kubelet's `--sync-frequency`, 1 min: its pod workers mark
//! such volumes "remount required" on each periodic pod sync). Drivers use
//! it to refresh what they put in the target (rotated secrets, tokens).
//! Nothing else is ever published twice: the journal and the host agreeing
//! is not a reason to call a driver again.
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
            if !matches!(&*v.spec, VolumeSpec::Csi(c) if c.republish) {
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
                tracing::debug!(volume = %name, pod = %uid, "requiresRepublish: NodePublishVolume again");
                out.push(Effect::Start {
                    job,
                    announce: self.cfg.journal,
                });
            }
        }
    }
}
