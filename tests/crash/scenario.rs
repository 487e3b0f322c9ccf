//! Runs one fixture on a fresh [`Node`]: start the daemon armed with the
//! crash point, let it settle and apply the triggers when there are any,
//! require the death by SIGKILL at that point, apply the changes made while
//! down, ask the dry run what a restart decides uncertain, restart, wait for
//! convergence and check every expectation (with `expect rpcs`, the test
//! CSI driver's calls since the restart began); stop it with SIGTERM and
//! check the files written to the PV.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::fixture::{Change, Cmp, Crash, Fixture, Ref};
use crate::node::{Node, PV};

/// How long an armed daemon may take to reach its point.
const CRASH_LIMIT: Duration = Duration::from_secs(30);
/// How long a converged daemon with the CSI driver is watched for late
/// RPCs before they are counted (ten `--poll-ms` periods).
const SETTLE: Duration = Duration::from_secs(1);

/// Applies one change to the node.
pub fn apply(node: &mut Node, c: &Change) {
    match c {
        Change::Delete(p) => node.delete_pod(p),
        Change::Add((p, kinds)) => node.add_pod(p, kinds),
        Change::Unmount(r) => node.unmount(r),
        Change::Foreign(r) => node.foreign(r),
        Change::Reboot => {
            // the loop devices go with a reboot; with a CSI raw block
            // volume the driver restarts too (its device keeps a file
            // below the root open, and a restarted driver has lost what
            // it staged: the case the restart must stage again)
            node.drop_holds();
            if node.csi_raw {
                node.restart_driver();
            }
            node.unmount_all();
            node.new_boot();
        }
        Change::DropObjects => node.drop_objects(),
        Change::Mounts(p) => node.ask_mounts(p),
        Change::Files(p, n) => node.write_many(p, *n),
    }
}

fn refs_of(node: &Node, paths: &[std::path::PathBuf]) -> Vec<String> {
    let mut v: Vec<String> = paths
        .iter()
        .map(|p| {
            node.ref_of(p)
                .map_or_else(|| p.display().to_string(), |r| r.to_string())
        })
        .collect();
    v.sort();
    v
}

/// What the runner prints about a scenario besides pass/fail.
#[derive(Debug, Default)]
pub struct Figures {
    /// the crash point that fired
    pub point: Option<String>,
    /// uncertain targets at restart, journal on
    pub uncertain_on: usize,
    /// uncertain targets at restart, `--journal off`
    pub uncertain_off: usize,
    /// a `full` fixture's figures
    pub full: Option<FullFigures>,
}

/// What a `full` fixture saw.
#[derive(Debug, Default)]
pub struct FullFigures {
    /// `kill`: what the start on the full disk did (`exit 75`, `unready`)
    pub restart: Option<&'static str>,
}

/// Runs the fixture; `Err` says what did not hold.
pub fn run(f: &Fixture, figures: &mut Figures) -> Result<(), String> {
    if let Some(full) = &f.full {
        return crate::full::run(f, full, figures);
    }
    if !f.expect.rpcs.is_empty() && !f.uses_csi() {
        return Err("`expect rpcs` needs a pod with a `csi` volume (the driver)".into());
    }
    if !f.expect.owned.is_empty() && f.fs_group.is_none() {
        return Err("`expect owned` needs `option fs_group=<gid>`".into());
    }
    if f.expand && !f.uses_csi() {
        return Err("`option expand` needs a pod with a `csi` volume".into());
    }
    let mut node = Node::new(f.blank_device, f.uses_csi());
    if f.uses_raw() {
        node.use_raw();
    }
    if f.uses_csi_raw() {
        node.use_csi_raw();
    }
    node.checkpoint_every = f.checkpoint_every;
    node.fs_group = f.fs_group;
    if f.expand {
        node.set_expand();
    }
    for (p, kinds) in &f.pods {
        node.add_pod(p, kinds);
    }
    let crash_at = match &f.crash {
        Crash::At(p, n) => Some(format!("{p}:{n}")),
        Crash::Kill => None,
    };
    node.start(crash_at.as_deref())?;
    let settle_first = !f.trigger.is_empty() || f.crash == Crash::Kill;
    if settle_first {
        node.converge(&|_| Ok(()))
            .map_err(|e| format!("before the crash: {e}"))?;
        // Data on the PV, to be found after the restart.
        node.write_pv_files("before-crash")?;
        node.write_csi_raw_magic()?;
        for c in &f.trigger {
            apply(&mut node, c);
        }
    }
    match &f.crash {
        Crash::At(p, _) => {
            node.wait_crashed(p, CRASH_LIMIT)?;
            figures.point = Some(p.clone());
        }
        Crash::Kill => node.kill(),
    }
    for c in &f.down {
        apply(&mut node, c);
    }
    // a CSI raw block device the driver staged before the kill: bytes
    // on it, to be found unchanged (and through the pods' maps) after
    if !node.csi_raw_written {
        node.write_csi_raw_magic()?;
    }
    let on = node.dry_run_uncertain(true)?;
    let off = node.dry_run_uncertain(false)?;
    figures.uncertain_on = on.len();
    figures.uncertain_off = off.len();
    let mut problems = Vec::new();
    // sorted as strings, like `got` (`dev` and `csidev` sort after a pod)
    let mut want: Vec<String> = f
        .expect
        .uncertain
        .iter()
        .flatten()
        .map(Ref::to_string)
        .collect();
    want.sort();
    let got = refs_of(&node, &on);
    if got != want {
        problems.push(format!(
            "uncertain at restart: {got:?}, fixture says {want:?}"
        ));
    }

    let rpc_mark = node.rpc_mark();
    node.start(None)?;
    let e = &f.expect;
    let gone: Vec<String> = e.pod_dir_gone.clone();
    let no_pending = e.no_pending_deletions;
    let extra = move |n: &Node| -> Result<(), String> {
        for p in &gone {
            let d = n.root.join("pods").join(crate::node::uid(p));
            if d.exists() {
                return Err(format!("pod dir of {p} not removed"));
            }
        }
        if no_pending {
            let left = n.pending_deletions();
            if !left.is_empty() {
                return Err(format!("interrupted deletions left: {left:?}"));
            }
        }
        Ok(())
    };
    node.converge(&extra)?;
    if f.uses_csi() {
        // The node can look converged before the reconciler had its turns
        // (a configured driver is connected on first use only): let it run
        // a while so a late RPC is counted, and require it still converged.
        std::thread::sleep(SETTLE);
        node.converge(&extra)?;
    }

    let seen: BTreeSet<String> = node
        .mounts()
        .keys()
        .map(|p| {
            node.ref_of(p)
                .map_or_else(|| p.display().to_string(), |r| r.to_string())
        })
        .collect();
    let declared: BTreeSet<String> = e.mounts.iter().flatten().map(Ref::to_string).collect();
    if seen != declared {
        problems.push(format!(
            "mounts after restart: {seen:?}, fixture says {declared:?}"
        ));
    }
    let ops = node.plugin_ops()?;
    for (op, n) in &e.ops {
        let got = ops.get(op).copied().unwrap_or(0);
        if got != *n {
            problems.push(format!(
                "{op} re-issued {got} times after restart, fixture says {n} (all: {ops:?})"
            ));
        }
    }
    if !e.rpcs.is_empty() {
        let rpcs = node.rpcs_since(rpc_mark);
        for (method, n) in &e.rpcs {
            let got = rpcs.get(method).copied().unwrap_or(0);
            if got != *n {
                problems.push(format!(
                    "{method} called {got} times after restart, fixture says {n} (all: {rpcs:?})"
                ));
            }
        }
    }
    for (name, cmp, n) in &e.metrics {
        let got = node.metric(name)?;
        let ok = match cmp {
            Cmp::Eq => got == *n,
            Cmp::Ge => got >= *n,
        };
        if !ok {
            problems.push(format!("{name} = {got}, fixture wants {cmp:?} {n}"));
        }
    }
    for r in &e.owned {
        if let Err(err) = node.check_owned(r, f.fs_group.unwrap_or_default()) {
            problems.push(err);
        }
    }
    if let Err(err) = node.check_csi_raw_bytes() {
        problems.push(err);
    }
    if f.expand
        && let Err(err) = node.check_expanded()
    {
        problems.push(err);
    }
    if e.known_dev {
        let dump = node.dump()?;
        let dev = node.dev.path().display().to_string();
        let known = dump["records"].as_array().into_iter().flatten().any(|r| {
            r["type"] == "reconstructed"
                && r["pod_uid"].is_null()
                && r["volume"].as_str().is_some_and(|v| v.ends_with(PV))
                && r["params"]["device_path"] == dev.as_str()
                && r["params"]["mount_options"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|x| x == "noatime"))
        });
        if !known {
            problems.push(format!(
                "dump after restart does not show the device target with device_path {dev} and mount option noatime: {}",
                dump["records"]
            ));
        }
    }
    node.stop()?;
    if let Err(e) = node.check_pv_files() {
        problems.push(e);
    }
    if let Err(e) = node.check_raw_bytes() {
        problems.push(e);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}\n{}", problems.join("\n"), node.log_tail()))
    }
}
