//! API-server source benchmark (issue 16): the real `volumed run` binary
//! with `--kubeconfig`, its real kube client watching the API-server fake
//! of `tests/support/apiserver/` over real HTTP, against the same pods
//! from the static folder, in the same run. Figures are printed, never
//! asserted.
//!
//! The bench moves itself into a private mount namespace first (as
//! `benches/daemon.rs`), so every mount dies with it. Every pod has one
//! `emptyDir: {medium: Memory}` (a tmpfs mount each); each run has a fresh
//! ext4 root on an autoclear loop device and a fresh journal.
//!
//! 1. **Through the watch.** The daemon starts watching a fake that holds
//!    only its Node and is waited on until `/readyz` says 200; the clock
//!    starts when the bench begins to create the P pods (1,000; quick 100)
//!    in the fake (each a write that the open watch sends on at once) and
//!    stops when `volume_manager_total_volumes{state="actual_state_of_world"}`
//!    reaches P. **Reference:** the same P pods' manifests, fully written,
//!    `rename(2)`d into the missing `--static-pods` dir of a daemon without
//!    an API server, timed the same way. The target: the watch at
//!    most 1.2x the folder.
//! 2. **Listed at start.** The same P pods already in the fake (or in the
//!    folder) when the daemon is spawned: the time from the spawn to all
//!    mounted, each way.
//!
//! The order of the two runs alternates between rounds (3; quick 1), and
//! the median of each is printed. `VOLUMED_BENCH_API_PODS=<n>` picks P.
//! Needs root; otherwise prints what it skipped and exits 0.

#[path = "support/mod.rs"]
mod bench_support;
#[path = "../tests/support/mod.rs"]
mod support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use bench_support::{
    BIN, Daemon, NODE, POLL, boot_id_file, fresh_ext4, journal_tempdir, median, quick_mode,
    stop_on_ext4, uid, write_pods,
};
use serde_json::json;
use support::apiserver::FakeApiServer;
use support::{Scratch, enter_private_mount_ns, require_root};

fn manifest(i: usize) -> String {
    let u = uid(i);
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p-{u}, namespace: bench, uid: {u}}}\n\
         spec:\n  nodeName: {NODE}\n  containers: [{{name: c, image: busybox}}]\n  \
         volumes: [{{name: cache, emptyDir: {{medium: Memory}}}}]\n"
    )
}

fn api_pod(i: usize) -> serde_json::Value {
    let u = uid(i);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("p-{u}"), "namespace": "bench", "uid": u},
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "cache", "emptyDir": {"medium": "Memory"}}]},
        "status": {"phase": "Running"},
    })
}

fn fake_with_node() -> FakeApiServer {
    let api = FakeApiServer::start();
    api.put(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    api
}

struct Run<'a> {
    scratch: &'a Path,
    journals: &'a Path,
    boot: &'a Path,
    pods: usize,
    wait: Duration,
}

impl Run<'_> {
    /// One daemon on a fresh root, watching `api` or not: with
    /// `staged_before` the pods are there before the spawn (the clock is
    /// the spawn's), else they are created (in the fake, or moved into the
    /// folder) once `/readyz` says 200. The time until all P are mounted.
    fn once(
        &self,
        name: &str,
        api: Option<&FakeApiServer>,
        staged_before: bool,
    ) -> Option<Duration> {
        let fs_dir = self.scratch.join(format!("fs-{name}"));
        let dev = fresh_ext4(&fs_dir, 512);
        let pods_dir = self.scratch.join(format!("pods-{name}"));
        let staged = self.scratch.join(format!("pods-{name}.staged"));
        let mut args = Vec::new();
        if let Some(api) = api {
            let kc = self.scratch.join(format!("kubeconfig-{name}"));
            api.write_kubeconfig(&kc);
            args = vec!["--kubeconfig".to_owned(), kc.display().to_string()];
        } else {
            write_pods(0..self.pods, &staged, manifest);
            if staged_before {
                fs::rename(&staged, &pods_dir).expect("manifests in place");
            }
        }
        let mut d = Daemon::start_with(
            &fs_dir.join("root"),
            &self.journals.join(format!("journal-{name}")),
            &pods_dir,
            None,
            self.boot,
            self.scratch.join(format!("daemon-{name}.log")),
            &args,
        );
        let t0 = if staged_before {
            d.spawned
        } else {
            d.wait_ready(POLL, Duration::from_secs(120));
            let t0 = Instant::now();
            match api {
                Some(api) => (0..self.pods).for_each(|i| drop(api.put(api_pod(i)))),
                None => fs::rename(&staged, &pods_dir).expect("manifests in place"),
            }
            t0
        };
        let got = d
            .wait_mounted(self.pods as u64, t0, self.wait)
            .map(|(_, asw)| asw);
        if got.is_none() {
            println!("  {name}: did not finish; log tail:\n{}", d.log_tail());
        }
        stop_on_ext4(d, &fs_dir, dev);
        got
    }
}

fn show(times: &[Duration]) -> String {
    times
        .iter()
        .map(|t| format!("{:.0}", t.as_secs_f64() * 1e3))
        .collect::<Vec<_>>()
        .join("/")
}

fn main() {
    if !require_root("the API-server bench runs volumed, which makes real mounts") {
        return;
    }
    enter_private_mount_ns();
    let quick = quick_mode();
    let pods = std::env::var("VOLUMED_BENCH_API_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 100 } else { 1_000 });
    let rounds = if quick { 1 } else { 3 };
    let scratch = Scratch::new("volumed-api-bench-");
    let journals = journal_tempdir("volumed-api-bench-journal-");
    let boot = boot_id_file(scratch.path());
    let run = Run {
        scratch: scratch.path(),
        journals: journals.path(),
        boot: &boot,
        pods,
        wait: Duration::from_secs(if quick { 60 } else { 600 }),
    };
    println!(
        "API-server bench ({} mode): binary {BIN}; {pods} pods x 1 tmpfs emptyDir, {rounds} round(s)",
        if quick { "quick" } else { "full" }
    );
    // (watch, folder) and (listed, folder listed), each round alternating
    let mut times: [Vec<Duration>; 4] = Default::default();
    for r in 0..rounds {
        let mut each = |k: usize| {
            let name = format!("{r}-{k}");
            let got = match k {
                0 => run.once(&name, Some(&fake_with_node()), false),
                1 => run.once(&name, None, false),
                2 => {
                    let api = fake_with_node();
                    (0..pods).for_each(|i| drop(api.put(api_pod(i))));
                    run.once(&name, Some(&api), true)
                }
                _ => run.once(&name, None, true),
            };
            if let Some(t) = got {
                times[k].push(t);
            }
        };
        let order: [usize; 4] = if r % 2 == 0 {
            [0, 1, 2, 3]
        } else {
            [1, 0, 3, 2]
        };
        for k in order {
            each(k);
        }
    }
    if times.iter().any(|t| t.len() < rounds) {
        println!("API-server bench: some runs did not finish (see above)");
        return;
    }
    let [mut watch, mut folder, mut listed, mut folder_listed] = times;
    let (w, f) = (median(&mut watch), median(&mut folder));
    let (l, fl) = (median(&mut listed), median(&mut folder_listed));
    println!(
        "through the watch: {pods} pods mounted in {:.0} ms (runs {}), the same manifests \
         moved into the folder {:.0} ms (runs {}): ratio {:.2}x (target <= 1.2x)",
        w.as_secs_f64() * 1e3,
        show(&watch),
        f.as_secs_f64() * 1e3,
        show(&folder),
        w.as_secs_f64() / f.as_secs_f64()
    );
    println!(
        "listed at start: spawn to {pods} mounted {:.0} ms from the API server (runs {}), \
         {:.0} ms from the folder (runs {}): ratio {:.2}x",
        l.as_secs_f64() * 1e3,
        show(&listed),
        fl.as_secs_f64() * 1e3,
        show(&folder_listed),
        l.as_secs_f64() / fl.as_secs_f64()
    );
}
