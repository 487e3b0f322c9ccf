//! The test CSI driver (`volumed-testdriver`, source in `testdriver/`) as a
//! child process: spawn it, read its call log, set its faults, SIGKILL or
//! SIGTERM it. Spawned from inside a test's private mount namespace, its
//! mounts stay there.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a driver may take to print `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The driver's flags.
#[derive(Debug, Clone)]
pub struct DriverOpts {
    /// `--name`.
    pub name: String,
    /// `--endpoint`: the CSI socket.
    pub endpoint: PathBuf,
    /// `--state`: the call log and fault file.
    pub state: PathBuf,
    /// `--registration-dir`.
    pub registration_dir: Option<PathBuf>,
    /// `--node-id`.
    pub node_id: Option<String>,
    /// `--no-stage`.
    pub no_stage: bool,
    /// `--caps` (None: the driver's default).
    pub caps: Option<String>,
    /// `--stack`.
    pub stack: bool,
    /// `--no-block`.
    pub no_block: bool,
}

impl DriverOpts {
    /// Driver `name` with its socket (`csi.sock`) and state (`state/`) in
    /// `dir`, everything else by default.
    pub fn in_dir(name: &str, dir: &Path) -> Self {
        Self {
            name: name.to_owned(),
            endpoint: dir.join("csi.sock"),
            state: dir.join("state"),
            registration_dir: None,
            node_id: None,
            no_stage: false,
            caps: None,
            stack: false,
            no_block: false,
        }
    }

    /// Where the registration socket is, with `registration_dir`.
    pub fn registration_socket(&self) -> Option<PathBuf> {
        self.registration_dir
            .as_ref()
            .map(|d| d.join(format!("{}-reg.sock", self.name)))
    }

    fn args(&self) -> Vec<String> {
        let mut a = vec![
            "--name".to_owned(),
            self.name.clone(),
            "--endpoint".to_owned(),
            self.endpoint.display().to_string(),
            "--state".to_owned(),
            self.state.display().to_string(),
        ];
        if let Some(d) = &self.registration_dir {
            a.extend(["--registration-dir".to_owned(), d.display().to_string()]);
        }
        if let Some(id) = &self.node_id {
            a.extend(["--node-id".to_owned(), id.clone()]);
        }
        if let Some(c) = &self.caps {
            a.extend(["--caps".to_owned(), c.clone()]);
        }
        if self.no_stage {
            a.push("--no-stage".to_owned());
        }
        if self.stack {
            a.push("--stack".to_owned());
        }
        if self.no_block {
            a.push("--no-block".to_owned());
        }
        a
    }
}

/// A running `volumed-testdriver`; killed (SIGKILL) when dropped.
pub struct TestDriver {
    opts: DriverOpts,
    child: Option<Child>,
}

impl TestDriver {
    /// Starts the driver and waits until it prints `ready` (both sockets
    /// listen); panics if it does not within 20 s or exits first.
    #[track_caller]
    pub fn spawn(opts: DriverOpts) -> TestDriver {
        let mut child = Command::new(env!("CARGO_BIN_EXE_volumed-testdriver"))
            .args(opts.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn volumed-testdriver: {e}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = tx.send(first);
            // keep draining, so the driver never blocks on a full pipe
            for _ in lines {}
        });
        let mut driver = TestDriver {
            opts,
            child: Some(child),
        };
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(Some(Ok(line))) if line == "ready" => driver,
            other => {
                let status = driver.kill();
                panic!("volumed-testdriver did not get ready ({other:?}); exit {status:?}")
            }
        }
    }

    /// The flags it runs with (to spawn it again after a kill).
    pub fn opts(&self) -> &DriverOpts {
        &self.opts
    }

    /// The CSI socket.
    pub fn endpoint(&self) -> &Path {
        &self.opts.endpoint
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Every call logged so far (across restarts on the same state dir),
    /// oldest first.
    pub fn calls(&self) -> Vec<serde_json::Value> {
        read_calls(&self.opts.state)
    }

    /// [`TestDriver::calls`] with when each arrived (`at_ms`).
    pub fn calls_timed(&self) -> Vec<serde_json::Value> {
        read_calls_timed(&self.opts.state)
    }

    /// How many calls of `method` were logged.
    pub fn count(&self, method: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c["method"] == method)
            .count()
    }

    /// Replaces the fault file with `rules` (a JSON array), atomically.
    #[track_caller]
    pub fn set_faults(&self, rules: serde_json::Value) {
        write_faults(&self.opts.state, &rules);
    }

    /// The fault file as it is now (the driver counts `times` down in it).
    pub fn faults(&self) -> serde_json::Value {
        fs::read(self.opts.state.join("faults.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    /// Removes the fault file.
    pub fn clear_faults(&self) {
        let _ = fs::remove_file(self.opts.state.join("faults.json"));
    }

    /// Waits until it has exited on its own (a `die_after_work` fault).
    #[track_caller]
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("driver still owned");
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(s) = child.try_wait().expect("wait for the driver") {
                self.child = None;
                return s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "volumed-testdriver did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL and wait; None if it had already been reaped.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.signal_and_wait(Signal::SIGKILL)
    }

    /// SIGTERM and wait (it removes its sockets and exits 0).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.signal_and_wait(Signal::SIGTERM)
    }

    fn signal_and_wait(&mut self, sig: Signal) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if child.try_wait().ok().flatten().is_none() {
            let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
            let _ = kill(pid, sig);
        }
        child.wait().ok()
    }
}

impl Drop for TestDriver {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The call log in `state`, oldest first, without the arrival times (so
/// two calls with the same arguments compare equal).
pub fn read_calls(state: &Path) -> Vec<serde_json::Value> {
    let mut calls = read_calls_timed(state);
    for c in &mut calls {
        if let Some(o) = c.as_object_mut() {
            o.remove("at_ms");
        }
    }
    calls
}

/// The call log in `state`, oldest first, each with `at_ms`: when the
/// driver received it (ms since the epoch).
pub fn read_calls_timed(state: &Path) -> Vec<serde_json::Value> {
    read_jsonl(&state.join("calls.jsonl"), "call log")
}

/// The whole lines of a JSON-lines log the driver appends to. A line
/// without its newline yet is being written (a reader racing the
/// driver's append sees part of it): it is left for the next read.
fn read_jsonl(path: &Path, what: &str) -> Vec<serde_json::Value> {
    let Ok(text) = fs::read_to_string(path) else {
        return Vec::new();
    };
    text.split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what} line {l:?}: {e}")))
        .collect()
}

/// The outcome log in `state`, oldest first: per call answered, its
/// `method`, `pid`, `at_ms` and paths as in the call log, and the `code`
/// answered (`OK` or the gRPC error's name).
pub fn read_outcomes(state: &Path) -> Vec<serde_json::Value> {
    read_jsonl(&state.join("outcomes.jsonl"), "outcome log")
}

/// Writes `rules` as `state/faults.json`: a temp file renamed over it, so
/// the driver never reads half a file.
#[track_caller]
pub fn write_faults(state: &Path, rules: &serde_json::Value) {
    assert!(rules.is_array(), "faults are a JSON array of rules");
    fs::create_dir_all(state).expect("create the driver's state dir");
    let tmp = state.join("faults.json.tmp-test");
    let mut f = File::create(&tmp).expect("create the fault file");
    serde_json::to_writer(&mut f, rules).expect("write the fault file");
    f.write_all(b"\n").expect("write the fault file");
    f.sync_all().expect("sync the fault file");
    fs::rename(&tmp, state.join("faults.json")).expect("rename the fault file");
}
