//! Payload volumes benchmark (issue 17): P pods (500; quick 50) from the
//! API server, each with a configMap, a secret and a projected volume (a
//! service account token, the `kube-root-ca.crt` ConfigMap, a downwardAPI
//! item), mounted by the real `volumed run` binary watching the API-server
//! fake of `tests/support/apiserver/` over real HTTP, against the same
//! writes done directly by this process, in the same run. Figures are
//! printed, never asserted.
//!
//! - **volumed, from a warm cache.** The ConfigMap, the Secret and
//!   `kube-root-ca.crt` are shared by every pod; a first pod is mounted
//!   before the clock starts, so the daemon already follows all three
//!   objects (the cache is warm). The clock starts when the bench creates
//!   the P pods in the fake and stops when the ASW holds all 3 × P new
//!   volumes. What a pod still costs then: its token (one TokenRequest to
//!   the fake, bound to the pod), a tmpfs for the secret and one for the
//!   projected volume, three atomic writes, and their journal records.
//! - **Direct.** The same directories, the same two tmpfs mounts per pod
//!   and the same atomic writes (a timestamped dir with the files, the
//!   `..data` symlink made beside it and renamed into place, one symlink
//!   per file through `..data`) done by this process in a loop, with the
//!   same bytes (a token-sized string in place of the token), and the
//!   `ready` marker the kubelet's wrapped emptyDir leaves for each volume
//!   (`pods/<uid>/plugins/kubernetes.io~empty-dir/<name>/ready`). No
//!   journal, no API server.
//!
//! The target: volumed at most 1.5x the direct writes. The order of the
//! two alternates between rounds (3; quick 1); medians are printed.
//! `VOLUMED_BENCH_PAYLOAD_PODS=<n>` picks P. Needs root (it mounts);
//! otherwise says what it skipped and exits 0. Runs in a private mount
//! namespace with a fresh ext4 root per run.

#[path = "support/mod.rs"]
mod bench_support;
#[path = "../tests/support/mod.rs"]
mod support;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use bench_support::{
    BIN, Daemon, NODE, POLL, boot_id_file, fresh_ext4, journal_tempdir, median, quick_mode,
    stop_on_ext4, thread_ticks, threads_since, uid,
};
use serde_json::{Value, json};
use support::apiserver::FakeApiServer;
use support::{Scratch, enter_private_mount_ns, require_root};

const NS: &str = "bench";
const SA: &str = "bench-sa";
const CONF: &str = "listen = 0.0.0.0:8080\nworkers = 4\nlog = info\n";
const PASSWORD: &str = "bench-password-0123456789abcdef";
const CA: &str = "-----BEGIN CERTIFICATE-----\nbench-root-ca\n-----END CERTIFICATE-----\n";

/// The fake with the Node, the service account and the shared objects.
fn seeded_fake() -> FakeApiServer {
    let api = FakeApiServer::start();
    api.put(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    api.put(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": SA, "namespace": NS}}));
    api.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config", "namespace": NS}, "data": {"app.conf": CONF}}));
    api.put(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": NS}, "stringData": {"password": PASSWORD}}));
    api.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kube-root-ca.crt", "namespace": NS}, "data": {"ca.crt": CA}}));
    api
}

/// Pod `i` with the three payload volumes, as an API server holds it.
fn api_pod(i: usize) -> Value {
    let u = uid(i);
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("p-{u}"), "namespace": NS, "uid": u},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": SA,
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [
                {"name": "config", "configMap": {"name": "app-config"}},
                {"name": "creds", "secret": {"secretName": "db"}},
                {"name": "kube-api-access", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ]}},
            ],
        },
        "status": {"phase": "Running"},
    })
}

/// volumed: one warm-up pod mounted, then P pods created in the fake; the
/// time from their creation to all 3 × P of their volumes mounted.
fn through_volumed(
    scratch: &Path,
    journals: &Path,
    boot: &Path,
    name: &str,
    pods: usize,
) -> Option<Duration> {
    let fs_dir = scratch.join(format!("fs-{name}"));
    let dev = fresh_ext4(&fs_dir, 1024);
    let api = seeded_fake();
    let kc = scratch.join(format!("kubeconfig-{name}"));
    api.write_kubeconfig(&kc);
    let args = ["--kubeconfig".to_owned(), kc.display().to_string()];
    let mut d = Daemon::start_with(
        &fs_dir.join("root"),
        &journals.join(format!("journal-{name}")),
        &scratch.join(format!("pods-{name}")),
        None,
        boot,
        scratch.join(format!("daemon-{name}.log")),
        &args,
    );
    d.wait_ready(POLL, Duration::from_secs(120));
    // the warm-up pod: after it the three shared objects are followed
    api.put(api_pod(pods));
    d.wait_mounted(3, Instant::now(), Duration::from_secs(120))?;
    let me = nix::unistd::getpid();
    let (cpu0, fake0) = (thread_ticks(d.pid()), thread_ticks(me));
    let t0 = Instant::now();
    for i in 0..pods {
        api.put(api_pod(i));
    }
    let created = t0.elapsed();
    let got = d.wait_mounted(3 * (pods as u64 + 1), t0, Duration::from_secs(600));
    // the CPU each thread spent meanwhile: on 2 cores the mounts of the
    // first pods and the source's work for the last ones share them
    let cpu = threads_since(d.pid(), &cpu0);
    let fake = threads_since(me, &fake0);
    if let Ok(to) = std::env::var("VOLUMED_BENCH_PAYLOAD_LOG") {
        let _ = fs::write(format!("{to}.{name}"), d.log_text());
    }
    if got.is_none() {
        println!("  {name}: did not finish; log tail:\n{}", d.log_tail());
    }
    stop_on_ext4(d, &fs_dir, dev);
    if let Some((dsw, asw)) = got {
        // where the time goes: the source (pods resolved, tokens issued)
        // or the mounts and writes after it
        println!(
            "  {name}: every volume desired at {:.0} ms, mounted at {:.0} ms",
            dsw.as_secs_f64() * 1e3,
            asw.as_secs_f64() * 1e3
        );
        println!(
            "  {name}: the {pods} pods created in the fake in {:.0} ms",
            created.as_secs_f64() * 1e3
        );
        println!("  {name}: daemon CPU: {cpu}");
        println!("  {name}: bench CPU (the API fake): {fake}");
    }
    got.map(|(_, asw)| asw)
}

/// The kubelet's atomic write of `files` into `dir`, done by hand.
fn atomic_write(dir: &Path, files: &[(&str, &[u8], u32)]) {
    let ts = dir.join("..2026_11_26_00_00_00.000000001");
    fs::create_dir(&ts).expect("payload dir");
    for (name, bytes, mode) in files {
        let f = ts.join(name);
        fs::write(&f, bytes).expect("payload file");
        fs::set_permissions(&f, fs::Permissions::from_mode(*mode)).expect("file mode");
    }
    symlink(ts.file_name().expect("ts name"), dir.join("..data_tmp")).expect("..data_tmp");
    fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("..data");
    for (name, _, _) in files {
        symlink(Path::new("..data").join(name), dir.join(name)).expect("user-visible link");
    }
}

fn tmpfs_at(dir: &Path) {
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("mode=0755"),
    )
    .expect("mount tmpfs");
}

/// The same directories, mounts and atomic writes, by this process.
fn direct(scratch: &Path, name: &str, pods: usize) -> Duration {
    let fs_dir = scratch.join(format!("fs-{name}"));
    let dev = fresh_ext4(&fs_dir, 1024);
    let root = fs_dir.join("root");
    let token = "x".repeat(900); // about a real bound token's length
    let t0 = Instant::now();
    for i in 0..pods {
        let vols = root.join("pods").join(uid(i)).join("volumes");
        let config = vols.join("kubernetes.io~configmap/config");
        let creds = vols.join("kubernetes.io~secret/creds");
        let projected = vols.join("kubernetes.io~projected/kube-api-access");
        for d in [&config, &creds, &projected] {
            fs::create_dir_all(d).expect("pod volume dir");
            let marker = root
                .join("pods")
                .join(uid(i))
                .join("plugins/kubernetes.io~empty-dir")
                .join(d.file_name().expect("volume name"));
            fs::create_dir_all(&marker).expect("wrapped emptyDir's dir");
            fs::write(marker.join("ready"), b"").expect("ready marker");
        }
        atomic_write(&config, &[("app.conf", CONF.as_bytes(), 0o644)]);
        tmpfs_at(&creds);
        atomic_write(&creds, &[("password", PASSWORD.as_bytes(), 0o644)]);
        tmpfs_at(&projected);
        atomic_write(
            &projected,
            &[
                ("token", token.as_bytes(), 0o644),
                ("ca.crt", CA.as_bytes(), 0o644),
                ("namespace", NS.as_bytes(), 0o644),
            ],
        );
    }
    let took = t0.elapsed();
    for i in 0..pods {
        let vols = root.join("pods").join(uid(i)).join("volumes");
        for v in [
            "kubernetes.io~secret/creds",
            "kubernetes.io~projected/kube-api-access",
        ] {
            nix::mount::umount2(&vols.join(v), nix::mount::MntFlags::MNT_DETACH).expect("umount");
        }
    }
    bench_support::drop_ext4(&fs_dir, dev);
    took
}

fn show(times: &[Duration]) -> String {
    let ms: Vec<String> = times
        .iter()
        .map(|t| format!("{:.0}", t.as_secs_f64() * 1e3))
        .collect();
    ms.join("/")
}

fn main() {
    if !require_root("the payload bench runs volumed, which makes real mounts") {
        return;
    }
    enter_private_mount_ns();
    let quick = quick_mode();
    let pods = std::env::var("VOLUMED_BENCH_PAYLOAD_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if quick { 50 } else { 500 });
    let rounds = if quick { 1 } else { 3 };
    let scratch = Scratch::new("volumed-payload-bench-");
    let journals = journal_tempdir("volumed-payload-bench-journal-");
    let boot = boot_id_file(scratch.path());
    println!(
        "payload bench ({} mode): binary {BIN}; {pods} pods x (configMap, secret, projected \
         token + kube-root-ca.crt + downwardAPI), {rounds} round(s)",
        if quick { "quick" } else { "full" }
    );
    let (mut daemon, mut by_hand) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let mut one = |k: usize| {
            let name = format!("{r}-{k}");
            match k {
                0 => {
                    let got = through_volumed(scratch.path(), journals.path(), &boot, &name, pods);
                    daemon.extend(got);
                }
                _ => by_hand.push(direct(scratch.path(), &name, pods)),
            }
        };
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            one(k);
        }
    }
    if daemon.len() < rounds {
        println!("payload bench: some volumed runs did not finish (see above)");
        return;
    }
    let (v, d) = (median(&mut daemon), median(&mut by_hand));
    println!(
        "{pods} pods' payload volumes ({} volumes): volumed from a warm cache {:.0} ms \
         (runs {}), the same writes directly {:.0} ms (runs {}): ratio {:.2}x (target <= 1.5x)",
        3 * pods,
        v.as_secs_f64() * 1e3,
        show(&daemon),
        d.as_secs_f64() * 1e3,
        show(&by_hand),
        v.as_secs_f64() / d.as_secs_f64()
    );
}
