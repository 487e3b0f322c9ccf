//! Host-found targets the journal does not hold: their parameters rebuilt
//! from the host alone, and their decisions (also as reconstruction's
//! second phase, [`merge_leftovers`]).

use std::borrow::Cow;

use fxhash::FxHashSet;

use super::merge::record;
use super::paths::plain_bytes;
use super::{
    Boot, Decision, FailedTarget, HostObservation, HostTarget, JournalSays, MergeInput,
    MergeOutput, Rebuild, RebuildFailure, classify,
};
use crate::journal::TargetKey;
use crate::model::{PluginName, SharedParams, TargetParams, TargetRef, UniqueVolumeName};

/// The second phase of a split reconstruction: decides the host-found
/// targets of `input` (the pod-dir walk's bare dirs and dirs of unknown
/// plugins) that nothing has decided yet, exactly as [`merge`](super::merge) decides
/// host-only targets. A target is already decided when its path or key is
/// a journal target's (the journal decided it, from its own observation) or
/// one of `decided`'s decisions (the first phase's). `input.journal` says
/// whether the journal is on; its entries are not decided again.
pub fn merge_leftovers(input: &MergeInput<'_>, decided: &MergeOutput) -> MergeOutput {
    // by plain bytes, equal exactly when the paths are: `Path`'s hash
    // walks components, twice per target of a large node here
    let mut claimed: FxHashSet<Cow<'_, [u8]>> = FxHashSet::default();
    let mut keys: FxHashSet<&TargetKey> = FxHashSet::default();
    if let Some(journal) = input.journal {
        for (key, entry) in journal.entries() {
            keys.insert(key);
            claimed.extend(entry.current_params().path().map(plain_bytes));
        }
    }
    for d in &decided.decisions {
        keys.insert(&d.key);
        claimed.extend(d.params.path().map(plain_bytes));
    }
    claimed.extend(decided.failed.iter().map(|f| plain_bytes(&f.path)));
    let mut out = MergeOutput::default();
    merge_host_only(
        input,
        |_, h| claimed.contains(plain_bytes(&h.path).as_ref()),
        |k| keys.contains(k),
        &mut out,
    );
    out
}

/// Decides the host-found targets not `claimed` (by index, or path) whose
/// key is not `decided`; appends to `out`.
pub(super) fn merge_host_only(
    input: &MergeInput<'_>,
    claimed: impl Fn(usize, &HostTarget) -> bool,
    decided: impl Fn(&TargetKey) -> bool,
    out: &mut MergeOutput,
) {
    for (i, h) in input.host_targets.iter().enumerate() {
        if claimed(i, h) {
            continue;
        }
        match rebuild_params(h) {
            Err(cause) => out.failed.push(FailedTarget {
                path: h.path.clone(),
                target: h.target.clone(),
                plugin_name: h.plugin_name.to_string(),
                spec_name: h.spec_name.clone(),
                cause,
                observation: h.observation.clone(),
            }),
            Ok(params) => {
                let key = TargetKey::of(&params);
                // Same target under another path: the journal's decision stands.
                if decided(&key) {
                    continue;
                }
                let journal_says = match input.journal {
                    Some(_) => JournalSays::Nothing,
                    None => JournalSays::Off,
                };
                let host_says = classify::host_says(h.kind, &h.target, &h.observation, None, input);
                let boot = Boot::Same;
                let (result, reason) = classify::decide(h.kind, journal_says, host_says, boot);
                let decision = Decision {
                    key,
                    kind: h.kind,
                    journal_says,
                    host_says,
                    boot,
                    result,
                    reason,
                    params: SharedParams::new(params),
                    observed: h.observation.identity().cloned(),
                };
                record(out, decision, &h.observation);
            }
        }
    }
}

/// Rebuilds a host-found target's parameters from the host alone (the
/// kubelet's way): no mount options, the device path from the mount source
/// for device targets, the label from the mount (else `vol_data.json`).
fn rebuild_params(h: &HostTarget) -> Result<TargetParams, RebuildFailure> {
    let plugin = h.plugin.ok_or(RebuildFailure::UnknownPlugin)?;
    let (volume, recorded_label, csi) = match &h.rebuild {
        Rebuild::Ready {
            volume,
            selinux,
            csi,
        } => (volume.clone(), selinux.clone(), csi.clone()),
        Rebuild::FromPath => (volume_from_path(h, plugin)?, None, None),
        Rebuild::MissingMetadata { what } => {
            return Err(RebuildFailure::MissingMetadata(what.clone()));
        }
    };
    let mount = match &h.observation {
        HostObservation::Mounted(m) => Some(m),
        HostObservation::Absent | HostObservation::DirPresent | HostObservation::Mapped(_) => None,
    };
    let is_device = h.target == TargetRef::Device;
    Ok(TargetParams::at(
        volume,
        plugin,
        h.spec_name.as_str().into(),
        h.target.clone(),
        h.kind,
        Some(h.path.as_path().into()),
    )
    .with_device_path(match &h.observation {
        // a raw block pod map names its device by its symlink
        HostObservation::Mapped(map) => map.link.as_deref().map(Into::into),
        _ => mount
            .filter(|_| is_device)
            .map(|m| m.source.as_path().into()),
    })
    .with_selinux(match mount {
        Some(m) => m.identity.selinux.clone(),
        None => recorded_label,
    })
    .with_fs_type(mount.map(|m| m.identity.fs_type.as_str().into()))
    .with_csi(csi))
}

/// The unique volume name of a [`Rebuild::FromPath`] target.
fn volume_from_path(
    h: &HostTarget,
    plugin: PluginName,
) -> Result<UniqueVolumeName, RebuildFailure> {
    match (plugin, &h.target) {
        (PluginName::EmptyDir | PluginName::HostPath, TargetRef::Pod(pod)) => {
            Ok(UniqueVolumeName::per_pod(plugin, pod, &h.spec_name))
        }
        (PluginName::LocalVolume, _) => Ok(UniqueVolumeName::shared(plugin, &h.spec_name)),
        _ => Err(RebuildFailure::MissingMetadata(format!(
            "no volume name from the path of a {} {} target",
            plugin.as_str(),
            match h.target {
                TargetRef::Device => "device",
                TargetRef::Pod(_) => "pod",
            }
        ))),
    }
}
