//! The crash fixture format (`fixtures/crash/*.crash`, documented in
//! `fixtures/crash/README.md`): one line per statement, `#` starts a
//! comment, the first word is the keyword.
//!
//! ```text
//! describe   <free text>
//! pods       <pod>:<kind>[,<kind>…] …      # before the crash; kinds: tmp disk pv csi secret configmap raw csiraw
//! option     blank_device | checkpoint_every=<n> | fs_group=<gid> | expand
//! crash      <point>[:<n>] | kill           # kill: the runner SIGKILLs after settling
//! full       <point>[:<n>] free | kill      # instead of crash: the journal's disk fills there
//! trigger    delete <pod> | add <pod>:<kinds> | mounts <pod>   # while the armed daemon runs, after it settled
//! down       delete <pod> | add <pod>:<kinds> | unmount <ref> | foreign <ref> | reboot | drop_objects
//! expect     mounts <ref>… | -              # exact mount points under the root after restart
//! expect     uncertain <ref>… | -           # exact set the restart decides uncertain
//! expect     ops <op>=<n>…                  # volumed_plugin_operations_total after restart
//! expect     rpcs <Method>=<n>…             # the test CSI driver's calls after restart
//! expect     metric <name>>=<n> | <name>=<n>
//! expect     known dev                      # dump shows the device path and mount options
//! expect     pod_dir_gone <pod>             # pods/<uid> removed by orphan cleanup
//! expect     owned <ref>…                   # an fsGroup walk owned the target (`option fs_group`)
//! expect     no_pending_deletions           # no `.deleting~N` dir left
//! expect_fail <bug>                         # a known daemon bug: the scenario must fail
//! ```
//!
//! A `<ref>` is `<pod>/<kind>` (a pod target), `dev` (the local PV's
//! device target), `csidev` (the CSI PV's staging target), `rawdev` (the
//! raw block PV's global map dir), `csirawdev` (the CSI raw block PV's
//! staging dir) or `<pod>/csirawpub` (the driver's bind on the pod's
//! publish file of the CSI raw block PV: a mount, not a target).

use std::collections::BTreeMap;
use std::path::Path;

/// The volume kinds a fixture pod can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// an emptyDir on tmpfs (`medium: Memory`, 1 MiB): a `mount` target, multi-step SetUp
    Tmp,
    /// a disk emptyDir: a `dir` target
    Disk,
    /// the local PV `pv-blk` (ext4 on a loop device): a device target and a bind
    Pv,
    /// the CSI PV `pv-csi` of the test driver: a staging target (its tmpfs,
    /// NodeStageVolume) and a publish target (a bind, NodePublishVolume)
    Csi,
    /// a secret volume of the Secret `crash-secret`: a tmpfs `mount` target
    /// the atomic writer fills (multi-step: tmpfs, payload dir, `..data`
    /// swap, links)
    Secret,
    /// a configMap volume of the ConfigMap `crash-config`: a disk `dir`
    /// target (the wrapped disk emptyDir) the atomic writer fills; its
    /// TearDown renames it to `.deleting~N` as a disk emptyDir's does
    ConfigMap,
    /// the raw block local PV `pv-raw` (`volumeMode: Block`, a blank loop
    /// device): its global map dir (MapDevice) and the pod's map
    /// (MapPodDevice: the device bound on the pod's file there, the pod's
    /// symlink, the loop device's hold)
    Raw,
    /// the CSI raw block PV `pv-csiraw` of the test driver (`volumeMode:
    /// Block`, the driver's loop device per staged volume): its staging
    /// dir (MapDevice: NodeStageVolume) and the pod's map (MapPodDevice:
    /// NodePublishVolume on the publish file, the device bound on the
    /// pod's file in `volumeDevices/<pv>/dev`, the pod's symlink to the
    /// publish file, the loop device's hold)
    CsiRaw,
}

impl Kind {
    /// The fixture word.
    pub fn word(self) -> &'static str {
        match self {
            Kind::Tmp => "tmp",
            Kind::Disk => "disk",
            Kind::Pv => "pv",
            Kind::Csi => "csi",
            Kind::Secret => "secret",
            Kind::ConfigMap => "configmap",
            Kind::Raw => "raw",
            Kind::CsiRaw => "csiraw",
        }
    }

    fn parse(s: &str) -> Result<Self, String> {
        match s {
            "tmp" => Ok(Kind::Tmp),
            "disk" => Ok(Kind::Disk),
            "pv" => Ok(Kind::Pv),
            "csi" => Ok(Kind::Csi),
            "secret" => Ok(Kind::Secret),
            "configmap" => Ok(Kind::ConfigMap),
            "raw" => Ok(Kind::Raw),
            "csiraw" => Ok(Kind::CsiRaw),
            other => Err(format!(
                "unknown volume kind {other:?} (tmp, disk, pv, csi, secret, configmap, raw, csiraw)"
            )),
        }
    }
}

/// A target named in a fixture.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ref {
    /// the device target of `pv-blk`
    Dev,
    /// the staging target of `pv-csi` (shared by every pod using it)
    CsiDev,
    /// the device target of `pv-raw`: its global map dir
    RawDev,
    /// the device target of `pv-csiraw`: its staging dir
    CsiRawDev,
    /// a pod's target of one kind
    Pod(String, Kind),
    /// the driver's bind on a pod's publish file of `pv-csiraw` (a mount
    /// of the pod's map, not a target of its own)
    CsiRawPublish(String),
}

impl Ref {
    /// Parses `dev`, `csidev`, `rawdev`, `csirawdev`, `<pod>/<kind>` or
    /// `<pod>/csirawpub`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "dev" => return Ok(Ref::Dev),
            "csidev" => return Ok(Ref::CsiDev),
            "rawdev" => return Ok(Ref::RawDev),
            "csirawdev" => return Ok(Ref::CsiRawDev),
            _ => {}
        }
        let (pod, kind) = s.split_once('/').ok_or_else(|| {
            format!(
                "a target is `dev`, `csidev`, `rawdev`, `csirawdev` or `<pod>/<kind>`, not {s:?}"
            )
        })?;
        if kind == "csirawpub" {
            return Ok(Ref::CsiRawPublish(pod.to_owned()));
        }
        Ok(Ref::Pod(pod.to_owned(), Kind::parse(kind)?))
    }
}

impl std::fmt::Display for Ref {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ref::Dev => f.write_str("dev"),
            Ref::CsiDev => f.write_str("csidev"),
            Ref::RawDev => f.write_str("rawdev"),
            Ref::CsiRawDev => f.write_str("csirawdev"),
            Ref::Pod(p, k) => write!(f, "{p}/{}", k.word()),
            Ref::CsiRawPublish(p) => write!(f, "{p}/csirawpub"),
        }
    }
}

/// A pod and its volumes.
pub type PodDef = (String, Vec<Kind>);

/// A change to the pods or the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// remove the pod's manifest
    Delete(String),
    /// add a pod manifest
    Add(PodDef),
    /// unmount a target behind volumed's back
    Unmount(Ref),
    /// unmount a target and mount a foreign tmpfs there
    Foreign(Ref),
    /// unmount everything under the root and present a new boot id
    Reboot,
    /// remove the PV and PVC objects
    DropObjects,
    /// ask the runtime API for the pod's container `c`'s mounts (a pod
    /// with a `disk` volume mounts `sub` of it by subPath), which binds it
    Mounts(String),
    /// `n` files of mode 0600 in a new dir `many/` of the pod's PV
    /// target (more for an fsGroup walk to change)
    Files(String, usize),
}

/// How the daemon dies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Crash {
    /// `VOLUMED_CRASH_AT=<point>:<n>`
    At(String, u32),
    /// the runner SIGKILLs it once it settled
    Kill,
}

/// What follows the journal's disk filling up at a point (`full`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AfterFull {
    /// the space is freed while the daemon runs: it recovers by itself
    Free,
    /// it is SIGKILLed while full and started on the full disk, then the
    /// space is freed and it is started again
    Kill,
}

/// `full <point>[:<n>] free|kill`: the daemon is held at the point's n-th
/// hit while the runner fills the journal's disk to its last byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Full {
    /// the crash point
    pub point: String,
    /// which hit of it
    pub n: u32,
    /// what follows
    pub then: AfterFull,
}

/// A comparison in a `metric` expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `=`
    Eq,
    /// `>=`
    Ge,
}

/// What must hold after the restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expect {
    /// exact mount points under the root (besides the root itself)
    pub mounts: Option<Vec<Ref>>,
    /// exact set of targets the restart decides uncertain
    pub uncertain: Option<Vec<Ref>>,
    /// plugin operations re-issued after the restart, per operation
    pub ops: BTreeMap<String, u64>,
    /// the test CSI driver's calls after the restart, per method
    pub rpcs: BTreeMap<String, u64>,
    /// other metrics
    pub metrics: Vec<(String, Cmp, u64)>,
    /// the dump knows the device target's device path and mount options
    pub known_dev: bool,
    /// pods whose dir orphan cleanup must have removed
    pub pod_dir_gone: Vec<String>,
    /// no `.deleting~N` dir may be left
    pub no_pending_deletions: bool,
    /// targets an fsGroup walk must have owned (`option fs_group`)
    pub owned: Vec<Ref>,
}

/// One scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixture {
    /// the file stem
    pub name: String,
    /// what it shows
    pub describe: String,
    /// pods before the crash
    pub pods: Vec<PodDef>,
    /// leave the PV's device without a filesystem
    pub blank_device: bool,
    /// `--checkpoint-every`
    pub checkpoint_every: Option<u64>,
    /// every pod's `securityContext.fsGroup`
    pub fs_group: Option<u32>,
    /// the CSI PV grown beyond its claim, the driver able to expand it
    pub expand: bool,
    /// how the daemon dies
    pub crash: Crash,
    /// the journal's disk fills at a point instead (`crash` is unused)
    pub full: Option<Full>,
    /// changes while the armed daemon runs (after it settled)
    pub trigger: Vec<Change>,
    /// changes while it is down
    pub down: Vec<Change>,
    /// the result after restart
    pub expect: Expect,
    /// a known bug: the scenario must fail
    pub expect_fail: Option<String>,
}

fn pod_def(s: &str) -> Result<PodDef, String> {
    let (pod, kinds) = s
        .split_once(':')
        .ok_or_else(|| format!("a pod is `<name>:<kind>[,<kind>…]`, not {s:?}"))?;
    if pod.is_empty() || !pod.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("pod name {pod:?}: letters and digits only"));
    }
    let kinds = kinds
        .split(',')
        .map(Kind::parse)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((pod.to_owned(), kinds))
}

fn change(words: &[&str], down: bool) -> Result<Change, String> {
    let one = || {
        words
            .get(1)
            .copied()
            .ok_or_else(|| format!("{:?} needs an argument", words[0]))
    };
    let c = match words.first().copied() {
        Some("delete") => Change::Delete(one()?.to_owned()),
        Some("add") => Change::Add(pod_def(one()?)?),
        Some("unmount") if down => Change::Unmount(Ref::parse(one()?)?),
        Some("foreign") if down => Change::Foreign(Ref::parse(one()?)?),
        Some("reboot") if down => Change::Reboot,
        Some("drop_objects") if down => Change::DropObjects,
        Some("mounts") if !down => Change::Mounts(one()?.to_owned()),
        Some("files") if !down => {
            let n = words.get(2).and_then(|n| n.parse().ok());
            Change::Files(one()?.to_owned(), n.ok_or("files <pod> <n>")?)
        }
        other => return Err(format!("unknown change {other:?}")),
    };
    Ok(c)
}

/// The CSI node RPCs an `expect rpcs` line can count.
pub const RPCS: [&str; 5] = [
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeUnstageVolume",
    "NodeExpandVolume",
];

fn refs(words: &[&str]) -> Result<Vec<Ref>, String> {
    if words == ["-"] {
        return Ok(Vec::new());
    }
    let mut v = words
        .iter()
        .map(|w| Ref::parse(w))
        .collect::<Result<Vec<_>, _>>()?;
    v.sort();
    Ok(v)
}

fn expect(e: &mut Expect, words: &[&str]) -> Result<(), String> {
    match words {
        ["mounts", rest @ ..] => e.mounts = Some(refs(rest)?),
        ["uncertain", rest @ ..] => e.uncertain = Some(refs(rest)?),
        ["ops", rest @ ..] => {
            for w in rest {
                let (op, n) = w
                    .split_once('=')
                    .ok_or_else(|| format!("ops wants <op>=<n>, not {w:?}"))?;
                let n = n.parse().map_err(|_| format!("not a count: {w:?}"))?;
                e.ops.insert(op.to_owned(), n);
            }
        }
        ["rpcs", rest @ ..] => {
            for w in rest {
                let (method, n) = w
                    .split_once('=')
                    .ok_or_else(|| format!("rpcs wants <Method>=<n>, not {w:?}"))?;
                if !RPCS.contains(&method) {
                    return Err(format!("rpcs: unknown method {method:?} (one of {RPCS:?})"));
                }
                let n = n.parse().map_err(|_| format!("not a count: {w:?}"))?;
                e.rpcs.insert(method.to_owned(), n);
            }
        }
        ["metric", m] => {
            let (name, cmp, n) = if let Some((a, b)) = m.split_once(">=") {
                (a, Cmp::Ge, b)
            } else if let Some((a, b)) = m.split_once('=') {
                (a, Cmp::Eq, b)
            } else {
                return Err(format!("metric wants <name>>=<n> or <name>=<n>: {m:?}"));
            };
            let n = n.parse().map_err(|_| format!("not a count: {m:?}"))?;
            e.metrics.push((name.to_owned(), cmp, n));
        }
        ["known", "dev"] => e.known_dev = true,
        ["owned", rest @ ..] => e.owned = refs(rest)?,
        ["pod_dir_gone", pod] => e.pod_dir_gone.push((*pod).to_owned()),
        ["no_pending_deletions"] => e.no_pending_deletions = true,
        other => return Err(format!("unknown expectation {other:?}")),
    }
    Ok(())
}

/// Parses one fixture's text.
pub fn parse(name: &str, text: &str) -> Result<Fixture, String> {
    let mut f = Fixture {
        name: name.to_owned(),
        describe: String::new(),
        pods: Vec::new(),
        blank_device: false,
        checkpoint_every: None,
        fs_group: None,
        expand: false,
        crash: Crash::Kill,
        full: None,
        trigger: Vec::new(),
        down: Vec::new(),
        expect: Expect::default(),
        expect_fail: None,
    };
    let mut crash_seen = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = |e: String| format!("{name}:{}: {e}", i + 1);
        let rest = line[words[0].len()..].trim();
        match words[0] {
            "describe" => f.describe = rest.to_owned(),
            "pods" => {
                for w in &words[1..] {
                    f.pods.push(pod_def(w).map_err(at)?);
                }
            }
            "option" => match words.get(1).copied() {
                Some("blank_device") => f.blank_device = true,
                Some("expand") => f.expand = true,
                Some(o) if o.starts_with("fs_group=") => {
                    let n = o["fs_group=".len()..]
                        .parse()
                        .map_err(|_| at(format!("bad option {o:?}")))?;
                    f.fs_group = Some(n);
                }
                Some(o) if o.starts_with("checkpoint_every=") => {
                    let n = o["checkpoint_every=".len()..]
                        .parse()
                        .map_err(|_| at(format!("bad option {o:?}")))?;
                    f.checkpoint_every = Some(n);
                }
                other => return Err(at(format!("unknown option {other:?}"))),
            },
            "crash" => {
                crash_seen = true;
                f.crash = match words.get(1).copied() {
                    Some("kill") => Crash::Kill,
                    Some(p) => {
                        let (point, n) = match p.rsplit_once(':') {
                            Some((a, b)) => {
                                (a, b.parse().map_err(|_| at(format!("bad count in {p:?}")))?)
                            }
                            None => (p, 1),
                        };
                        Crash::At(point.to_owned(), n)
                    }
                    None => return Err(at("crash needs a point or `kill`".into())),
                };
            }
            "full" => {
                let (Some(p), Some(then), None) = (words.get(1), words.get(2), words.get(3)) else {
                    return Err(at("full needs `<point>[:<n>] free|kill`".into()));
                };
                let (point, n) = match p.rsplit_once(':') {
                    Some((a, b)) => (a, b.parse().map_err(|_| at(format!("bad count in {p:?}")))?),
                    None => (*p, 1),
                };
                let then = match *then {
                    "free" => AfterFull::Free,
                    "kill" => AfterFull::Kill,
                    other => {
                        return Err(at(format!("after full: `free` or `kill`, not {other:?}")));
                    }
                };
                f.full = Some(Full {
                    point: point.to_owned(),
                    n,
                    then,
                });
            }
            "trigger" => f.trigger.push(change(&words[1..], false).map_err(at)?),
            "down" => f.down.push(change(&words[1..], true).map_err(at)?),
            "expect" => expect(&mut f.expect, &words[1..]).map_err(at)?,
            "expect_fail" => f.expect_fail = Some(rest.trim_matches('"').to_owned()),
            other => return Err(at(format!("unknown keyword {other:?}"))),
        }
    }
    if f.full.is_some() {
        // the runner adds pods until the daemon degrades, and checks
        // convergence to every desired pod itself
        if crash_seen || f.expect != Expect::default() || !f.down.is_empty() {
            return Err(format!(
                "{name}: a `full` fixture has no `crash`, `down` or `expect` line"
            ));
        }
        return Ok(f);
    }
    if !crash_seen {
        return Err(format!("{name}: no `crash` line"));
    }
    if f.expect.mounts.is_none() || f.expect.uncertain.is_none() {
        return Err(format!(
            "{name}: `expect mounts` and `expect uncertain` are required"
        ));
    }
    Ok(f)
}

/// Every fixture in `dir` (`*.crash`), sorted by name.
pub fn load_all(dir: &Path) -> Result<Vec<Fixture>, String> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let path = e.map_err(|e| e.to_string())?.path();
        if path.extension().is_none_or(|x| x != "crash") {
            continue;
        }
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .ok_or("fixture name is not UTF-8")?
            .to_owned();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{name}: {e}"))?;
        out.push(parse(&name, &text)?);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

impl Fixture {
    /// Whether a pod of the scenario (before the crash, triggered or added
    /// while down) has a `csi` or `csiraw` volume: the node then runs the
    /// test driver.
    pub fn uses_csi(&self) -> bool {
        let added = self
            .trigger
            .iter()
            .chain(&self.down)
            .filter_map(|c| match c {
                Change::Add((_, kinds)) => Some(kinds),
                _ => None,
            });
        self.pods
            .iter()
            .map(|(_, kinds)| kinds)
            .chain(added)
            .any(|kinds| kinds.contains(&Kind::Csi) || kinds.contains(&Kind::CsiRaw))
    }

    /// Whether a pod of the scenario before the crash has a `csiraw`
    /// volume: the node then has the CSI raw block PV and its claim.
    pub fn uses_csi_raw(&self) -> bool {
        self.pods
            .iter()
            .any(|(_, kinds)| kinds.contains(&Kind::CsiRaw))
    }

    /// Whether a pod of the scenario before the crash has a `raw` volume:
    /// the node then has the raw block PV's device.
    pub fn uses_raw(&self) -> bool {
        self.pods
            .iter()
            .any(|(_, kinds)| kinds.contains(&Kind::Raw))
    }
}
