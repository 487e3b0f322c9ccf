//! The driver's state directory: the call log (`calls.jsonl`, one JSON
//! object per RPC, appended and fsynced before the RPC does anything), the
//! outcome log (`outcomes.jsonl`: per RPC answered, its `method`, `pid`
//! and arrival `at_ms` as logged, the paths it names and the gRPC `code`
//! answered, `OK` or the error's, written before the answer goes out; a
//! call that hangs or dies has none) and the fault file (`faults.json`,
//! read before each RPC).
//!
//! # Fault rules
//!
//! `faults.json` is a JSON array of rules; the first rule that matches the
//! call applies, the rest are not looked at:
//!
//! ```json
//! [{"method": "NodeStageVolume", "volume_id": "vol-1", "times": 1,
//!   "delay_ms": 500, "code": "Unavailable", "message": "try later",
//!   "die_after_work": false, "abnormal": "disk on fire"}]
//! ```
//!
//! - `method` (required): the RPC's name as in the call log.
//! - `volume_id`: only calls for this volume match.
//! - `times`: how many more calls the rule applies to; each use counts it
//!   down in the file (rewritten atomically, so a restarted driver sees
//!   what is left); at 0 the rule is skipped. Absent: forever.
//! - `delay_ms`: sleep first (the work still runs afterwards, even if the
//!   caller has given up).
//! - `code` (a gRPC code name, `Unavailable` or `UNAVAILABLE`) with
//!   `message`: answer that status without doing the work.
//! - `die_after_work`: do the work, then die by SIGKILL before replying.
//! - `abnormal`: NodeGetVolumeStats reports the volume abnormal with this
//!   message.
//! - `capacity_bytes`: NodeExpandVolume grows the volume as asked, then
//!   answers this capacity instead of the size it reached (a driver that
//!   says less than it was asked for).
//! - `hang`: never answer and never do the work (a driver stuck inside
//!   the call); only the caller giving up ends it.
//! - `garbage_reply`: answer OK with a message body that is not the RPC's
//!   protobuf (a gRPC frame of bytes no decoder accepts), without doing
//!   the work.
//!
//! A file that does not parse fails every call with INTERNAL, so a typo in
//! a test shows instead of silently applying no fault.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tonic::{Code, Status};

/// The call log's file name in the state dir.
const CALLS: &str = "calls.jsonl";
/// The fault file's name in the state dir.
const FAULTS: &str = "faults.json";
/// The outcome log's file name in the state dir.
const OUTCOMES: &str = "outcomes.jsonl";
/// The fields of a call's entry its outcome repeats (what tells it apart).
const OUTCOME_KEYS: [&str; 5] = [
    "method",
    "pid",
    "at_ms",
    "staging_target_path",
    "target_path",
];

/// One rule of `faults.json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    method: String,
    #[serde(default)]
    volume_id: Option<String>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    die_after_work: Option<bool>,
    #[serde(default)]
    abnormal: Option<String>,
    #[serde(default)]
    capacity_bytes: Option<i64>,
    #[serde(default)]
    times: Option<u64>,
    #[serde(default)]
    hang: Option<bool>,
    #[serde(default)]
    garbage_reply: Option<bool>,
}

/// What the matching rule asks of one call (nothing by default).
#[derive(Debug, Default)]
pub(crate) struct Fault {
    /// Sleep this long before anything else.
    pub delay: Option<Duration>,
    /// Answer this instead of doing the work.
    pub status: Option<(Code, String)>,
    /// Do the work, then die before replying.
    pub die_after_work: bool,
    /// NodeGetVolumeStats: report the volume abnormal with this message.
    pub abnormal: Option<String>,
    /// NodeExpandVolume: answer this capacity.
    pub capacity_bytes: Option<i64>,
    /// Never answer, never do the work.
    pub hang: bool,
    /// Answer with an undecodable message, without doing the work.
    pub garbage_reply: bool,
}

/// The state directory, or none (`--state` not given: no log, no faults).
#[derive(Debug)]
pub(crate) struct State {
    dir: Option<PathBuf>,
    /// Serialises logging and the fault file's read-modify-write.
    lock: Mutex<()>,
}

impl State {
    /// The state in `dir` (created if missing).
    pub(crate) fn new(dir: Option<PathBuf>) -> io::Result<Self> {
        if let Some(d) = &dir {
            fs::create_dir_all(d)?;
        }
        Ok(Self {
            dir,
            lock: Mutex::new(()),
        })
    }

    /// The state dir, if `--state` was given.
    pub(crate) fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Logs the call `entry` (an object with at least `method`; the pid is
    /// added, so a test can tell a restarted driver's calls apart, and the
    /// time it arrived, `at_ms`), then
    /// finds the fault that applies to it and uses one of its `times`.
    pub(crate) fn begin(&self, entry: &mut Value) -> Result<Fault, Status> {
        let Some(dir) = &self.dir else {
            return Ok(Fault::default());
        };
        entry["pid"] = Value::from(std::process::id());
        // when the call arrived (ms since the epoch): tests order calls by
        // it rather than by when they happened to poll the log
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let ms = now.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        entry["at_ms"] = Value::from(ms);
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        append_line(&dir.join(CALLS), entry)
            .map_err(|e| Status::internal(format!("test driver: writing the call log: {e}")))?;
        let method = entry["method"].as_str().unwrap_or_default();
        let volume_id = entry.get("volume_id").and_then(Value::as_str);
        take_fault(&dir.join(FAULTS), method, volume_id)
            .map_err(|e| Status::internal(format!("test driver: {FAULTS}: {e}")))
    }
}

impl State {
    /// Logs the answer to the call `entry` (as [`State::begin`] completed
    /// it): `code` is the gRPC code's name (`OK` for a reply).
    pub(crate) fn finish(&self, entry: &Value, code: Code) -> Result<(), Status> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let mut outcome = serde_json::Map::new();
        for k in OUTCOME_KEYS {
            if let Some(v) = entry.get(k) {
                outcome.insert(k.to_owned(), v.clone());
            }
        }
        let name = match code {
            Code::Ok => "OK".to_owned(),
            c => format!("{c:?}"),
        };
        outcome.insert("code".to_owned(), Value::from(name));
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        append_line(&dir.join(OUTCOMES), &Value::Object(outcome))
            .map_err(|e| Status::internal(format!("test driver: writing the outcome log: {e}")))
    }
}

/// Appends `entry` and a newline in one write, then fsyncs.
fn append_line(path: &Path, entry: &Value) -> io::Result<()> {
    let mut line = serde_json::to_vec(entry)?;
    line.push(b'\n');
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    f.write_all(&line)?;
    f.sync_data()
}

/// The first rule in `path` matching the call, its `times` counted down in
/// the file; the default fault when the file is missing or nothing matches.
fn take_fault(path: &Path, method: &str, volume_id: Option<&str>) -> Result<Fault, String> {
    let text = match fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Fault::default()),
        Err(e) => return Err(e.to_string()),
    };
    let mut raw: Vec<Value> = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    for (i, value) in raw.iter_mut().enumerate() {
        let rule = Rule::deserialize(&*value).map_err(|e| format!("rule {i}: {e}"))?;
        let matches = rule.method == method
            && rule
                .volume_id
                .as_deref()
                .is_none_or(|want| Some(want) == volume_id);
        if !matches || rule.times == Some(0) {
            continue;
        }
        let fault = to_fault(&rule).map_err(|e| format!("rule {i}: {e}"))?;
        if let Some(n) = rule.times {
            value["times"] = Value::from(n - 1);
            rewrite(path, &raw).map_err(|e| format!("counting down rule {i}: {e}"))?;
        }
        return Ok(fault);
    }
    Ok(Fault::default())
}

fn to_fault(rule: &Rule) -> Result<Fault, String> {
    let status = match &rule.code {
        None => None,
        Some(name) => {
            let code = code_by_name(name).ok_or_else(|| format!("unknown gRPC code {name:?}"))?;
            let message = rule
                .message
                .clone()
                .unwrap_or_else(|| format!("injected fault: {name}"));
            Some((code, message))
        }
    };
    Ok(Fault {
        delay: rule.delay_ms.map(Duration::from_millis),
        status,
        die_after_work: rule.die_after_work.unwrap_or(false),
        abnormal: rule.abnormal.clone(),
        capacity_bytes: rule.capacity_bytes,
        hang: rule.hang.unwrap_or(false),
        garbage_reply: rule.garbage_reply.unwrap_or(false),
    })
}

/// A gRPC code from its name, in either spelling (`FailedPrecondition`,
/// `FAILED_PRECONDITION`).
fn code_by_name(name: &str) -> Option<Code> {
    let key: String = name
        .chars()
        .filter(|c| *c != '_')
        .collect::<String>()
        .to_ascii_lowercase();
    let code = match key.as_str() {
        "cancelled" => Code::Cancelled,
        "unknown" => Code::Unknown,
        "invalidargument" => Code::InvalidArgument,
        "deadlineexceeded" => Code::DeadlineExceeded,
        "notfound" => Code::NotFound,
        "alreadyexists" => Code::AlreadyExists,
        "permissiondenied" => Code::PermissionDenied,
        "resourceexhausted" => Code::ResourceExhausted,
        "failedprecondition" => Code::FailedPrecondition,
        "aborted" => Code::Aborted,
        "outofrange" => Code::OutOfRange,
        "unimplemented" => Code::Unimplemented,
        "internal" => Code::Internal,
        "unavailable" => Code::Unavailable,
        "dataloss" => Code::DataLoss,
        "unauthenticated" => Code::Unauthenticated,
        _ => return None,
    };
    Some(code)
}

/// Replaces `path` with `rules`: a temp file beside it, fsynced, renamed
/// over it, so a crash leaves the old or the new file, never half of one.
fn rewrite(path: &Path, rules: &[Value]) -> io::Result<()> {
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    let mut f = File::create(&tmp)?;
    serde_json::to_writer_pretty(&mut f, rules)?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}
