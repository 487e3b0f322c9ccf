//! The daemon end to end: the real `volumed run` binary on a scratch root
//! ([`Env`]: the folders it is given, extra `run` arguments), a running
//! daemon ([`Daemon`]: its HTTP endpoints, log, bounded waits, SIGTERM) and
//! helpers to read `/debug/state` and `/metrics`. Used by `daemon_e2e` and
//! `csi_e2e`; each test runs it inside its own private mount namespace
//! ([`real`]).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use volumed::host::mountinfo::{MountInfo, MountTable};

use super::Scratch;

/// The daemon binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_volumed");
/// The boot id every [`Env`] gives the daemon.
pub const BOOT: &str = "0e2e0e2e-1111-2222-3333-444444444444";
/// `--node-name`.
pub const NODE: &str = "e2e-node";
/// How long any one condition may take to become true.
pub const WAIT: Duration = Duration::from_secs(60);

/// One test's world: the scratch dir and the folders the daemon is given.
pub struct Env {
    /// `--root-dir`
    pub root: PathBuf,
    /// `--journal-dir`
    pub journal: PathBuf,
    /// `--static-pods`
    pub pods: PathBuf,
    /// `--static-objects`
    pub objects: PathBuf,
    /// `--boot-id-file`
    pub boot: PathBuf,
    /// how many daemons were spawned (names each one's log)
    pub starts: usize,
    /// start the daemon in the scratch dir with relative paths
    pub relative: bool,
    /// give `--root-dir` as this path (a symlink to `root`) instead
    pub root_arg: Option<PathBuf>,
    /// more `run` arguments, after the ones above (e.g. `--csi-driver`,
    /// `--journal off`)
    pub extra_args: Vec<String>,
    /// more environment variables for the daemon (e.g. `NOTIFY_SOCKET`)
    pub extra_env: Vec<(String, String)>,
    // Last: dropped (lazily unmounting what is left) after everything else.
    /// the test's scratch dir, holding everything above
    pub scratch: Scratch,
}

impl Env {
    /// A fresh world in a scratch dir named after `prefix`.
    pub fn new(prefix: &str) -> Env {
        let scratch = Scratch::new(prefix);
        let p = scratch.path();
        let env = Env {
            root: p.join("root"),
            journal: p.join("journal"),
            pods: p.join("pods"),
            objects: p.join("objects"),
            boot: p.join("boot_id"),
            starts: 0,
            relative: false,
            root_arg: None,
            extra_args: Vec::new(),
            extra_env: Vec::new(),
            scratch,
        };
        super::mkdirs(&env.pods);
        super::mkdirs(&env.objects);
        fs::write(&env.boot, format!("{BOOT}\n")).unwrap();
        env
    }

    /// Starts `volumed run` and waits until it is ready.
    pub fn start(&mut self) -> Daemon {
        let daemon = self.start_serving();
        daemon.wait_until("/readyz is 200", || daemon.try_get("/readyz").0 == 200);
        daemon
    }

    /// Starts `volumed run` and waits until it serves HTTP, ready or not.
    pub fn start_serving(&mut self) -> Daemon {
        let daemon = self.spawn();
        let daemon_json = self.journal.join("daemon.json");
        let pid = daemon.child.borrow().id();
        daemon.wait_until("daemon.json names the new daemon", || {
            daemon.wrote_json(&daemon_json, pid)
        });
        let mut daemon = daemon;
        let info: Value = serde_json::from_slice(&fs::read(&daemon_json).unwrap()).unwrap();
        daemon.addr = Some(info["listen"].as_str().unwrap().parse().unwrap());
        daemon
    }

    /// Starts `volumed run` without waiting for anything.
    pub fn spawn(&mut self) -> Daemon {
        self.starts += 1;
        let log = self
            .scratch
            .path()
            .join(format!("daemon-{}.log", self.starts));
        let base = self.scratch.path();
        let arg = |p: &Path| match self.relative {
            true => p.strip_prefix(base).unwrap().to_owned(),
            false => p.to_owned(),
        };
        let child = Command::new(BIN)
            .current_dir(base)
            .arg("run")
            .arg("--root-dir")
            .arg(arg(self.root_arg.as_ref().unwrap_or(&self.root)))
            .arg("--journal-dir")
            .arg(arg(&self.journal))
            .arg("--static-pods")
            .arg(arg(&self.pods))
            .arg("--static-objects")
            .arg(arg(&self.objects))
            .args(["--listen", "127.0.0.1:0", "--node-name", NODE])
            .arg("--boot-id-file")
            .arg(&self.boot)
            .args(["--poll-ms", "100"])
            .args(&self.extra_args)
            .env("VOLUMED_LOG", "info")
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Daemon {
            child: RefCell::new(child),
            addr: None,
            socket: self.journal.join("api.sock"),
            log,
            exited: Cell::new(false),
        }
    }

    /// `volumed dump --format json` of this env's journal (it asks the
    /// daemon when one runs).
    pub fn dump(&self) -> Value {
        let out = Command::new(BIN)
            .arg("dump")
            .arg("--journal-dir")
            .arg(&self.journal)
            .arg("--boot-id-file")
            .arg(&self.boot)
            .args(["--format", "json"])
            .output()
            .expect("run volumed dump");
        assert!(
            out.status.success(),
            "dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("dump prints JSON")
    }

    /// Writes the static pod manifest `file` (by rename).
    pub fn write_pod(&self, file: &str, text: &str) {
        // Written by rename, so the poller never reads half a file.
        let tmp = self.scratch.path().join(format!(".{file}.tmp"));
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, self.pods.join(file)).unwrap();
    }

    /// Deletes the static pod manifest `file`.
    pub fn remove_pod(&self, file: &str) {
        fs::remove_file(self.pods.join(file)).unwrap();
    }

    /// `<root>/pods/<uid>/volumes/<plugin>/<name>`.
    pub fn pod_volume(&self, uid: &str, plugin: &str, name: &str) -> PathBuf {
        self.root
            .join("pods")
            .join(uid)
            .join("volumes")
            .join(plugin)
            .join(name)
    }

    /// Every mount strictly below the root (the root's own bind excluded).
    pub fn mounts_below_root(&self) -> Vec<MountInfo> {
        let table = MountTable::read_self().unwrap();
        table
            .entries()
            .iter()
            .filter(|m| m.mount_point.starts_with(&self.root) && m.mount_point != self.root)
            .cloned()
            .collect()
    }
}

/// A running `volumed run`; SIGKILLed on drop unless it was stopped.
pub struct Daemon {
    /// the process
    pub child: RefCell<Child>,
    /// its HTTP address, once it is known (the probes and `/metrics` only)
    pub addr: Option<SocketAddr>,
    /// its `api.sock`, where every endpoint is served
    pub socket: PathBuf,
    /// its stderr
    pub log: PathBuf,
    /// whether it has been reaped (then not killed on drop)
    pub exited: Cell<bool>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.exited.get() {
            let child = self.child.get_mut();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Daemon {
    /// Whether `daemon.json` names this daemon (written once it started).
    pub fn wrote_json(&self, daemon_json: &Path, pid: u32) -> bool {
        fs::read(daemon_json)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .is_some_and(|v| v["pid"] == pid)
    }

    /// The last lines of the daemon's stderr.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(40);
        lines[from..].join("\n")
    }

    /// The daemon's stderr so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `cond` until it holds; fails after [`WAIT`] (or when the daemon
    /// exits) naming `what`, with the daemon's stderr tail.
    #[track_caller]
    pub fn wait_until(&self, what: &str, cond: impl FnMut() -> bool) {
        self.wait_until_showing(what, cond, String::new);
    }

    /// [`Daemon::wait_until`] whose failure also shows what `show` says
    /// then (the mount table, a driver's calls, …).
    #[track_caller]
    pub fn wait_until_showing(
        &self,
        what: &str,
        mut cond: impl FnMut() -> bool,
        show: impl Fn() -> String,
    ) {
        let deadline = Instant::now() + WAIT;
        loop {
            if cond() {
                return;
            }
            let exited = self.child.borrow_mut().try_wait().unwrap();
            if let Some(status) = exited {
                self.exited.set(true);
                panic!(
                    "waiting for {what}: the daemon exited ({status})\n{}\n--- daemon stderr tail ---\n{}",
                    show(),
                    self.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "waiting for {what}: still false after {WAIT:?}\n{}\n--- daemon stderr tail ---\n{}",
                show(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One GET: (status, body); (0, error) when the request failed. The
    /// probes and `/metrics` are asked on the TCP listener, everything
    /// else on the socket (the TCP listener refuses it).
    pub fn try_get(&self, path: &str) -> (u16, String) {
        let bare = path.split('?').next().unwrap_or_default();
        if !matches!(bare, "/healthz" | "/readyz" | "/metrics") {
            return unix_get(&self.socket, path, Duration::from_secs(10))
                .unwrap_or_else(|e| (0, e));
        }
        let Some(addr) = self.addr else {
            return (0, "no address yet".into());
        };
        match volumed::server::client::get(addr, path, Duration::from_secs(10)) {
            Ok((status, body)) => (status, String::from_utf8_lossy(&body).into_owned()),
            Err(e) => (0, e.to_string()),
        }
    }

    /// GET `path`, which must answer 200; the body.
    #[track_caller]
    pub fn get(&self, path: &str) -> String {
        let (status, body) = self.try_get(path);
        assert_eq!(
            status,
            200,
            "GET {path}: {body}\n--- daemon stderr tail ---\n{}",
            self.log_tail()
        );
        body
    }

    /// `/debug/state`.
    pub fn state(&self) -> Value {
        serde_json::from_str(&self.get("/debug/state")).unwrap()
    }

    /// The errors `/debug/state` holds for the pod `uid`, joined.
    pub fn pod_errors(&self, uid: &str) -> String {
        let state = self.state();
        let errors = state["pod_errors"][uid].as_array().into_iter().flatten();
        let errors: Vec<&str> = errors.filter_map(Value::as_str).collect();
        errors.join("\n")
    }

    /// `/metrics`.
    pub fn metrics(&self) -> String {
        self.get("/metrics")
    }

    /// SIGKILL and reap it (an abrupt death: nothing flushed, nothing
    /// cleaned up).
    pub fn kill(self) {
        let mut child = self.child.borrow_mut();
        let _ = child.kill();
        let _ = child.wait();
        self.exited.set(true);
    }

    /// SIGTERM; the daemon must exit 0 within 30 s.
    #[track_caller]
    pub fn stop(self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.borrow().id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            let exited = self.child.borrow_mut().try_wait().unwrap();
            if let Some(s) = exited {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not exit within 30 s of SIGTERM\n--- daemon stderr tail ---\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.exited.set(true);
        assert!(
            status.success(),
            "SIGTERM must exit 0, got {status}\n--- daemon stderr tail ---\n{}",
            self.log_tail()
        );
    }
}

/// Every target in a `/debug/state` or `dump` state document:
/// mount path → (volume, state).
pub fn targets(state: &Value) -> BTreeMap<PathBuf, (String, String)> {
    let mut out = BTreeMap::new();
    for v in state["volumes"].as_array().unwrap() {
        let name = v["volume"].as_str().unwrap().to_owned();
        if let Some(d) = v["device"].as_object() {
            let path = PathBuf::from(d["mount_path"].as_str().unwrap_or("<no path>"));
            out.insert(
                path,
                (name.clone(), d["state"].as_str().unwrap().to_owned()),
            );
        }
        for p in v["pods"].as_array().unwrap() {
            let path = PathBuf::from(p["mount_path"].as_str().unwrap());
            out.insert(
                path,
                (name.clone(), p["state"].as_str().unwrap().to_owned()),
            );
        }
    }
    out
}

/// Whether `/debug/state` shows every path in `want` mounted.
pub fn all_mounted(state: &Value, want: &[PathBuf]) -> bool {
    let t = targets(state);
    want.iter()
        .all(|p| t.get(p).is_some_and(|(_, s)| s == "mounted"))
}

/// Whether no target of `uid` is in `/debug/state` any more (or only as not mounted).
pub fn pod_gone_from_state(state: &Value, root: &Path, uid: &str) -> bool {
    let prefix = root.join("pods").join(uid);
    targets(state)
        .iter()
        .all(|(p, (_, s))| !p.starts_with(&prefix) || s == "not_mounted")
}

/// The metric lines (name and labels → value) whose name is `name`.
pub fn series(metrics: &str, name: &str) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_owned(), v.parse().unwrap())
        })
        .collect()
}

/// Deletes every manifest and waits until nothing is mounted below the root.
pub fn delete_all_and_wait(env: &Env, daemon: &Daemon) {
    for e in fs::read_dir(&env.pods).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    daemon.wait_until("nothing mounted below the root", || {
        env.mounts_below_root().is_empty()
    });
}

/// The paths below `dir`, relative, sorted (empty when it does not exist).
pub fn tree(dir: &Path) -> Vec<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(base).unwrap().to_owned());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Runs `body` as root in a private mount namespace, or says it was skipped.
pub fn real(what: &str, body: fn()) {
    if !super::require_root(what) {
        return;
    }
    super::in_private_mount_ns(body);
}

/// One GET on the unix socket `socket` within `timeout`: (status, body).
pub fn unix_get(socket: &Path, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| format!("connect {}: {e}", socket.display()))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("receive: {e}"))?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").ok_or("no header end")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line: {head:?}"))?;
    Ok((status, body.to_owned()))
}
