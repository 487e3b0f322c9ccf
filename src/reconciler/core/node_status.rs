//! What the node's status in the API server means for the loop:
//! `volumesAttached` fills devicePaths still uncertain (once, after the
//! first list), and an attachable volume's mount waits until
//! `volumesInUse` lists it (the publisher is woken once per volume).

use super::{Effect, World};
use crate::model::{AccessMode, UniqueVolumeName};
use crate::reconciler::effects::{FAILED_MOUNT, PodEvent};
use crate::reconciler::plan::Blocked;
use crate::state::{StateError, VolumeToMount};

/// The plan's blocked pods: each gets its error; a mount that waits for
/// `volumesInUse` asks the publisher for an update the first time; a pod
/// refused a ReadWriteOncePod volume gets a `FailedMount` event when the
/// error is new to it (the plan refuses it every pass until the holder is
/// gone: one event, not one per pass).
pub(super) fn blocked(w: &mut World, blocked: Vec<Blocked>, out: &mut Vec<Effect>) {
    for b in blocked {
        if let StateError::NotReportedInUse { volume, .. } = &b.error
            && w.dsw.request_in_use_report(volume)
        {
            out.push(Effect::ReportInUse);
        }
        let message = b.error.to_string();
        if matches!(b.error, StateError::ReadWriteOncePodInUse { .. })
            && !w.dsw.errors_of_pod(&b.pod).any(|e| *e == message)
        {
            out.push(Effect::PodEvent(PodEvent {
                names: w.pods.get(&b.pod).map(|e| e.pod.clone()),
                pod: b.pod.clone(),
                reason: FAILED_MOUNT,
                message: message.clone(),
            }));
        }
        w.dsw.add_pod_error(&b.pod, message);
    }
}

/// A mount of `want` starts: a ReadWriteOncePod refusal the pod was told
/// of no longer holds, so it leaves the pod's errors (the runtime API
/// would list it beside a later, unrelated blocker).
pub(super) fn lifted(w: &mut World, want: &VolumeToMount) {
    if want.spec.access_modes() != [AccessMode::ReadWriteOncePod] {
        return;
    }
    let refusal = StateError::ReadWriteOncePodInUse {
        volume: want.volume.clone(),
        spec_name: want.spec_name.clone(),
        pod: want.pod.clone(),
    };
    w.dsw.remove_pod_error(&want.pod, &refusal.to_string());
}

/// Seed 001's `volumesNeedUpdateFromNodeStatus`: a device reconstructed as
/// uncertain without its device path takes the one the node's status
/// lists, once. With the journal a reconstructed device almost always has
/// its path (from the journal), so this usually fills none; the count is
/// logged either way.
pub(super) fn device_paths_from_node(
    w: &mut World,
    paths: Vec<(UniqueVolumeName, std::path::PathBuf)>,
) {
    let listed = paths.len();
    let filled = paths
        .into_iter()
        .filter(|(v, p)| {
            !p.as_os_str().is_empty() && w.asw.update_reconstructed_device_path(v, p.clone())
        })
        .count();
    tracing::info!(
        listed,
        filled,
        "devicePaths from node.status.volumesAttached (only devices still uncertain without one take them)"
    );
}
