//! Churn: the daemon under continuous pod adds and deletes is SIGKILLed at
//! random moments and restarted, again and again. After each restart, once
//! it converged ([`Node::converge`]: no leaked mount, no double mount, no
//! mount missing for a desired pod, nothing uncertain, `dump` equal to
//! `/debug/state` equal to the mount table), two more invariants are
//! checked: a pod desired across the kill keeps the very mounts it had (same
//! mount ids: nothing a running pod uses was unmounted), and at the end every
//! file written to the persistent volume is still there. The number of
//! targets a restart decides uncertain is measured with the journal and, on
//! the same host state, with `--journal off` (both by the dry run while the
//! daemon is down). Pods draw their volumes from `tmp`, `disk`, `pv` and
//! `csi` (the test CSI driver runs for the whole churn).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::fixture::{Kind, Ref};
use crate::node::Node;

/// A small, seeded xorshift (no dependency; reproducible by seed).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// What a churn run found.
#[derive(Debug, Default)]
pub struct ChurnReport {
    /// SIGKILLs done
    pub kills: usize,
    /// invariants broken, one line each
    pub violations: Vec<String>,
    /// uncertain targets at the restarts, summed, journal on
    pub uncertain_on: usize,
    /// the same, `--journal off`
    pub uncertain_off: usize,
}

const POOL: usize = 8;

/// Runs `iters` kill-restart rounds with `seed`; with `api`, the pods and
/// their objects come from the API-server fake, not the static folders.
pub fn run(iters: u64, seed: u64, api: bool) -> ChurnReport {
    let mut rng = Rng::new(seed);
    let mut report = ChurnReport::default();
    let mut node = Node::new(false, true);
    if api {
        node.use_api();
    }
    node.checkpoint_every = Some(16);
    let pool: Vec<(String, Vec<Kind>)> = (0..POOL)
        .map(|i| {
            let mut kinds = Vec::new();
            // (secret volumes read the static objects: the API source does
            // not watch the Secrets they name yet)
            let secret = if api { None } else { Some(Kind::Secret) };
            for k in [Kind::Tmp, Kind::Disk, Kind::Pv, Kind::Csi]
                .into_iter()
                .chain(secret)
            {
                if rng.below(2) == 0 {
                    kinds.push(k);
                }
            }
            if kinds.is_empty() {
                kinds.push(Kind::Tmp);
            }
            (format!("c{i}"), kinds)
        })
        .collect();
    for (p, k) in pool.iter().take(3) {
        node.add_pod(p, k);
    }
    if let Err(e) = node.start(None).and_then(|()| node.converge(&|_| Ok(()))) {
        report.violations.push(format!("first start: {e}"));
        return report;
    }
    for i in 0..iters {
        // What the running pods have now.
        let before: BTreeMap<Ref, u32> = node
            .expected_mounts()
            .keys()
            .filter_map(|r| {
                let m = node.mounts();
                let id = m.get(&node.path(r))?.first()?.id;
                Some((r.clone(), id))
            })
            .collect();
        let desired_before = node.desired.clone();
        if let Some(p) = node
            .desired
            .iter()
            .find(|(_, k)| k.contains(&Kind::Pv))
            .map(|(p, _)| p.clone())
            && let Err(e) = node.write_pv_file(&p, &format!("iter{i}"))
        {
            report.violations.push(format!("iteration {i}: write: {e}"));
        }
        let mut touched = std::collections::BTreeSet::new();
        for _ in 0..=rng.below(4) {
            let (p, k) = &pool[usize::try_from(rng.below(POOL as u64)).unwrap_or(0)];
            touched.insert(p.clone());
            if node.desired.contains_key(p) {
                node.delete_pod(p);
            } else {
                node.add_pod(p, k);
            }
            std::thread::sleep(Duration::from_millis(rng.below(300)));
        }
        std::thread::sleep(Duration::from_millis(rng.below(400)));
        node.kill();
        report.kills += 1;
        match (node.dry_run_uncertain(true), node.dry_run_uncertain(false)) {
            (Ok(on), Ok(off)) => {
                report.uncertain_on += on.len();
                report.uncertain_off += off.len();
            }
            (Err(e), _) | (_, Err(e)) => report.violations.push(format!("iteration {i}: {e}")),
        }
        if let Err(e) = node.start(None).and_then(|()| node.converge(&|_| Ok(()))) {
            report
                .violations
                .push(format!("iteration {i} (seed {}): {e}", rng.0));
            break;
        }
        // A pod desired before the kill and still desired: its mounts are the same ones.
        let after = node.mounts();
        for (r, id) in &before {
            let kept = match r {
                Ref::Pod(p, _) => {
                    !touched.contains(p)
                        && desired_before.contains_key(p)
                        && node.desired.contains_key(p)
                }
                // churn maps no raw block volume
                Ref::RawDev | Ref::CsiRawDev | Ref::CsiRawPublish(_) => false,
                Ref::Dev | Ref::CsiDev => {
                    let kind = if *r == Ref::Dev { Kind::Pv } else { Kind::Csi };
                    desired_before.iter().any(|(p, k)| {
                        k.contains(&kind) && !touched.contains(p) && node.desired.contains_key(p)
                    })
                }
            };
            if !kept {
                continue;
            }
            let now = after
                .get(&node.path(r))
                .and_then(|v| v.first())
                .map(|s| s.id);
            if now != Some(*id) {
                report.violations.push(format!(
                    "iteration {i}: {r} was in use by a running pod and was unmounted (mount id {id} -> {now:?})"
                ));
            }
        }
    }
    if let Err(e) = node.stop() {
        report.violations.push(e);
    }
    if let Err(e) = node.check_pv_files() {
        report.violations.push(e);
    }
    report
}
