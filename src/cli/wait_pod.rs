//! `volumed wait-pod UID [--timeout SECONDS] [--unmounted]`: what a
//! container runtime without an HTTP client runs before starting a pod's
//! containers (or, with `--unmounted`, after stopping them: the kubelet's
//! `WaitForUnmount`). Asks the daemon of `--journal-dir` through its
//! `api.sock` and waits for the pod's volumes to be mounted (or gone).
//!
//! Exit codes: 0 ready (the volumes on stdout, one per line) or, with
//! `--unmounted`, nothing mounted; 1 not ready when the time was up, a pod
//! volumed does not know, or volumes still mounted (the errors on stderr);
//! 2 the daemon could not be asked (none running, a bad answer) or the
//! arguments are wrong.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use volumed::model::PodUid;
use volumed::server::api_client::{self, ApiClientError};
use volumed::server::runtime_api::MAX_WAIT_SECS;

/// The kubelet's `podAttachAndMountTimeout`, 2 min 3 s.
pub(crate) const DEFAULT_TIMEOUT_SECS: u64 = 123;

#[derive(Args, Debug)]
pub(crate) struct WaitPodArgs {
    /// The pod UID.
    uid: String,
    /// How long to wait for the volumes, in seconds (0: answer at once).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TIMEOUT_SECS)]
    timeout: u64,
    /// The journal dir of the daemon to ask (its api.sock is there).
    #[arg(long, default_value = "/var/lib/kubelet/volumed")]
    journal_dir: PathBuf,
    /// Print the answer as the API's JSON document instead of lines.
    #[arg(long)]
    json: bool,
    /// Wait until none of the pod's volumes is mounted any more, instead
    /// of until all are.
    #[arg(long)]
    unmounted: bool,
}

/// Runs `wait-pod` with its own exit codes: 1 is "not ready", so "could
/// not ask" is 2.
pub(crate) fn main(args: WaitPodArgs) -> ExitCode {
    or_exit_2(wait_pod(args))
}

/// The exit code of a command whose 1 means "not ready": an error (the
/// daemon could not be asked, bad arguments) is printed and exits 2.
pub(crate) fn or_exit_2(result: Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("volumed: {e:#}");
        ExitCode::from(2)
    })
}

/// The pod's uid and the wait a command was given, checked.
pub(crate) fn pod_and_wait(uid: &str, timeout_secs: u64) -> Result<(PodUid, Duration)> {
    let uid = PodUid::new(uid).with_context(|| format!("pod uid {uid:?}"))?;
    anyhow::ensure!(
        timeout_secs <= MAX_WAIT_SECS,
        "--timeout {timeout_secs}: at most {MAX_WAIT_SECS} seconds"
    );
    Ok((uid, Duration::from_secs(timeout_secs)))
}

/// Runs `wait-pod`; an `Err` is the exit code 2 case.
fn wait_pod(args: WaitPodArgs) -> Result<ExitCode> {
    let (uid, wait) = pod_and_wait(&args.uid, args.timeout)?;
    if args.unmounted {
        return wait_unmounted(&args, &uid, wait);
    }
    let answer = api_client::wait_pod(&args.journal_dir, &uid, wait);
    let doc = match answer {
        Ok(doc) => doc,
        Err(e @ ApiClientError::UnknownPod { .. }) => {
            eprintln!("volumed: {e}");
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e).context("wait-pod"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for v in &doc.volumes {
            let ro = if v.read_only { "ro" } else { "rw" };
            let label = v.selinux_context.as_deref().unwrap_or("-");
            println!("{}\t{}\t{ro}\t{label}", v.name, v.host_path);
        }
    }
    if doc.ready {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "volumed: pod {uid}: volumes not ready after {} s: {}",
        args.timeout,
        doc.errors.join("; ")
    );
    Ok(ExitCode::from(1))
}

/// `--unmounted`: exit 0 once nothing of the pod is mounted, printing the
/// volumes still mounted on stderr otherwise (exit 1).
fn wait_unmounted(args: &WaitPodArgs, uid: &PodUid, wait: Duration) -> Result<ExitCode> {
    let doc = api_client::wait_unmounted(&args.journal_dir, uid, wait).context("wait-pod")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    }
    if doc.unmounted {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "volumed: pod {uid}: mounted volumes=[{}] after {} s",
        doc.mounted.join(" "),
        args.timeout
    );
    Ok(ExitCode::from(1))
}
