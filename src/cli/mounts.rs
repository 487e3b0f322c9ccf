//! `volumed mounts UID CONTAINER [--timeout SECONDS] [--json]`: one
//! container's mounts in CRI's shape, asked of the daemon of
//! `--journal-dir` through its `api.sock` (the daemon binds the
//! container's subpaths as it answers).
//!
//! Exit codes: 0 ready (one mount per line on stdout); 1 not ready when the
//! time was up, or a pod or container volumed does not know (the errors on
//! stderr); 2 the daemon could not be asked or the arguments are wrong.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use volumed::server::api_client::{self, ApiClientError};

use super::wait_pod::{DEFAULT_TIMEOUT_SECS, or_exit_2, pod_and_wait};

#[derive(Args, Debug)]
pub(crate) struct MountsArgs {
    /// The pod UID.
    uid: String,
    /// The container's name.
    container: String,
    /// How long to wait for the pod's volumes, in seconds (0: answer at once).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TIMEOUT_SECS)]
    timeout: u64,
    /// The journal dir of the daemon to ask (its api.sock is there).
    #[arg(long, default_value = "/var/lib/kubelet/volumed")]
    journal_dir: PathBuf,
    /// Print the answer as the API's JSON document instead of lines.
    #[arg(long)]
    json: bool,
}

/// Runs `mounts` with its own exit codes (1 "not ready", 2 "could not ask").
pub(crate) fn main(args: MountsArgs) -> ExitCode {
    or_exit_2(mounts(args))
}

fn mounts(args: MountsArgs) -> Result<ExitCode> {
    let (uid, wait) = pod_and_wait(&args.uid, args.timeout)?;
    volumed::model::check_dns1123_label("container name", &args.container)?;
    let doc = match api_client::container_mounts(&args.journal_dir, &uid, &args.container, wait) {
        Ok(doc) => doc,
        Err(e @ (ApiClientError::UnknownPod { .. } | ApiClientError::UnknownContainer(_))) => {
            eprintln!("volumed: {e}");
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e).context("ask for the container's mounts"),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for m in &doc.mounts {
            let ro = if m.read_only { "ro" } else { "rw" };
            let propagation = serde_json::to_value(m.propagation)?;
            let propagation = propagation.as_str().unwrap_or("private");
            println!(
                "{}\t{}\t{}\t{ro}\t{propagation}",
                m.name, m.container_path, m.host_path
            );
        }
    }
    if doc.ready {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "volumed: pod {uid} container {}: mounts not ready after {} s: {}",
        args.container,
        args.timeout,
        doc.errors.join("; ")
    );
    Ok(ExitCode::from(1))
}
