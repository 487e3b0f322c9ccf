//! Reconstruction's phase 1 handing its ASW to a loop that started before
//! it was over ([`Phase::Reconstructing`]).

use std::time::Instant;

use super::{Core, Effect, Event, Phase, Reconstructed, World};

impl Core {
    /// Whether `ev`, arriving before the ASW is handed over, must wait for
    /// it. Source events fill the DSW at once — unless a pod can be refused
    /// for its label: then the pod already holding the volume must be
    /// applied first (`holders_first` reads the ASW); without labels the
    /// DSW is the same in any order. What reads or changes the ASW waits.
    pub(super) fn waits_for_asw(&self, ev: &Event) -> bool {
        match ev {
            Event::Sources(_) => self.cfg.selinux.labels_volumes(),
            Event::Stop | Event::Reconstructed(_) | Event::ReportedInUse(_) => false,
            Event::Leftovers(..)
            | Event::JobDone(_)
            | Event::Done(_)
            | Event::NodeDevicePaths(_) => true,
        }
    }

    /// Takes the ASW and the failed targets, enters the listing phase (the
    /// populated one when every source already listed), then handles the
    /// events that waited for the ASW. The step goes on to its first pass.
    pub(super) fn reconstructed(
        &mut self,
        w: &mut World,
        r: Reconstructed,
        now: Instant,
        out: &mut Vec<Effect>,
    ) {
        if self.phase != Phase::Reconstructing {
            tracing::error!(phase = ?self.phase, "reconstruction handed over outside the reconstructing phase; ignored");
            return;
        }
        w.asw = r.asw;
        w.unmounted_outside = r.unmounted_outside;
        self.failed.extend(r.failed);
        self.note_not_mounted(r.not_mounted);
        self.phase = match w.dsw.is_populated() {
            true => Phase::Populated,
            false => Phase::Listing { walked: false },
        };
        for ev in std::mem::take(&mut self.early) {
            self.handle(w, ev, now, out);
        }
    }
}
