//! Reconstruction's decisions counted in the metrics (the series are
//! registered in `metrics`; what each counts is in its module doc): one
//! call per reconstruction phase, from the daemon's startup.

use crate::metrics::Metrics;
use crate::model::{MountState, TargetRef};

use super::{HostSays, MergeOutput, Reason};

const TARGETS: [&str; 2] = ["device", "pod"];
const RESULTS: [MountState; 3] = [
    MountState::Mounted,
    MountState::Uncertain,
    MountState::NotMounted,
];

fn target_label(t: &TargetRef) -> &'static str {
    match t {
        TargetRef::Device => "device",
        TargetRef::Pod(_) => "pod",
    }
}

/// Counts one reconstruction's decisions and failures.
/// Every (target, result, reason) series of
/// `volumed_reconstruct_decisions_total` exists, at zero until counted, so
/// an alert needs no `absent()`: the first phase's call makes them, before
/// the HTTP server serves.
pub fn record_metrics(metrics: &Metrics, out: &MergeOutput) {
    let m = &metrics.reconstruct;
    for target in TARGETS {
        for result in RESULTS {
            for reason in Reason::ALL {
                m.decisions_total
                    .with_label_values(&[target, result.as_str(), reason.as_str()]);
            }
        }
    }
    // looked up per decision: a walk of the leftovers for each made this
    // O(decisions × leftovers)
    let left_dirs: std::collections::HashSet<&crate::journal::TargetKey> = out
        .orphan_leftovers
        .iter()
        .filter(|l| l.dir_present)
        .map(|l| &l.key)
        .collect();
    for d in &out.decisions {
        m.decisions_total
            .with_label_values(&[d.target_label(), d.result.as_str(), d.reason.as_str()])
            .inc();
        if matches!(d.key.target, TargetRef::Pod(_)) && found_on_host(&left_dirs, d) {
            m.operations_total.inc();
        }
    }
    for f in &out.failed {
        m.decisions_total
            .with_label_values(&[
                target_label(&f.target),
                MountState::Uncertain.as_str(),
                f.reason().as_str(),
            ])
            .inc();
        if matches!(f.target, TargetRef::Pod(_)) {
            m.operations_total.inc();
            m.operations_errors_total.inc();
        }
    }
    let outside = u64::try_from(out.unmounted_outside.len()).unwrap_or(u64::MAX);
    metrics.ops.unmounted_outside.inc_by(outside);
}

/// Whether the host showed something at a decided target: a mount, a
/// directory, or a mount-point dir left behind.
fn found_on_host(
    left_dirs: &std::collections::HashSet<&crate::journal::TargetKey>,
    d: &super::Decision,
) -> bool {
    d.observed.is_some() || d.host_says == HostSays::DirPresent || left_dirs.contains(&d.key)
}
