//! What every RPC shares: the driver's configuration and [`Driver::call`],
//! which logs the call, applies its fault and runs the work.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tonic::{Response, Status};

use crate::state::{Fault, State};

/// The node capabilities `--caps` may add.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Caps {
    /// GET_VOLUME_STATS.
    pub stats: bool,
    /// VOLUME_CONDITION.
    pub condition: bool,
    /// VOLUME_MOUNT_GROUP.
    pub mount_group: bool,
    /// EXPAND_VOLUME: NodeExpandVolume remounts the volume's tmpfs bigger.
    pub expand: bool,
}

impl Caps {
    /// Parses a comma-separated list of capability names (empty: none).
    pub(crate) fn parse(list: &str) -> Result<Self, String> {
        let mut caps = Caps::default();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "GET_VOLUME_STATS" => caps.stats = true,
                "VOLUME_CONDITION" => caps.condition = true,
                "VOLUME_MOUNT_GROUP" => caps.mount_group = true,
                "EXPAND_VOLUME" => caps.expand = true,
                other => {
                    return Err(format!(
                        "unknown capability {other:?} (GET_VOLUME_STATS, VOLUME_CONDITION, \
                         VOLUME_MOUNT_GROUP, EXPAND_VOLUME)"
                    ));
                }
            }
        }
        Ok(caps)
    }
}

/// The driver: its flags and its state directory.
#[derive(Debug)]
pub(crate) struct Driver {
    /// `--name`.
    pub name: String,
    /// `--node-id` (default: the hostname).
    pub node_id: String,
    /// The CSI socket's path (GetInfo's endpoint).
    pub endpoint: String,
    /// Whether STAGE_UNSTAGE_VOLUME is advertised (not `--no-stage`).
    pub stage: bool,
    /// `--caps`.
    pub caps: Caps,
    /// `--stack`: NodePublish on a mounted target mounts again on top.
    pub stack: bool,
    /// Whether the block access type is served (not `--no-block`).
    pub block: bool,
    /// The loop device of each staged block volume, by staging path.
    pub loops: Mutex<HashMap<PathBuf, crate::loopdev::Loop>>,
    /// The call log and fault file.
    pub state: State,
    /// Serialises the mount work, so each check-then-mount is atomic.
    pub work_lock: Mutex<()>,
}

impl Driver {
    /// Runs one RPC: logs `entry`, applies the fault that matches it, then
    /// runs `work` (under the work lock), and logs the answer's code
    /// before it goes out.
    ///
    /// All of it runs in a task of its own: when the caller gives up (a
    /// deadline) the server drops the request's future, but a real driver
    /// goes on with what it started, and so does this one.
    pub(crate) async fn call<T, F>(
        self: &Arc<Self>,
        entry: Value,
        work: F,
    ) -> Result<Response<T>, Status>
    where
        T: Default + Send + 'static,
        F: FnOnce(&Driver, &Fault) -> Result<T, Status> + Send + 'static,
    {
        let driver = Arc::clone(self);
        let task = tokio::spawn(async move {
            let mut entry = entry;
            let out = driver.run(&mut entry, work).await;
            let code = out.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
            driver.state.finish(&entry, code)?;
            out
        });
        match task.await {
            Ok(Ok(Some(reply))) => Ok(Response::new(reply)),
            Ok(Ok(None)) => {
                // any message will do: `CsiServices` replaces its body
                let mut r = Response::new(T::default());
                r.extensions_mut().insert(GarbageReply);
                Ok(r)
            }
            Ok(Err(status)) => Err(status),
            Err(e) => Err(Status::internal(format!(
                "test driver: handler failed: {e}"
            ))),
        }
    }

    /// [`Driver::call`]'s fault and work: None for a garbage reply.
    async fn run<T, F>(&self, entry: &mut Value, work: F) -> Result<Option<T>, Status>
    where
        F: FnOnce(&Driver, &Fault) -> Result<T, Status>,
    {
        let fault = self.state.begin(entry)?;
        if let Some(delay) = fault.delay {
            tokio::time::sleep(delay).await;
        }
        if fault.hang {
            // the caller's deadline, or its connection closing, is
            // the only end: the server drops the request, never this
            std::future::pending::<()>().await;
        }
        if let Some((code, message)) = &fault.status {
            return Err(Status::new(*code, message.clone()));
        }
        if fault.garbage_reply {
            return Ok(None);
        }
        let out = {
            let _guard = self.work_lock.lock().unwrap_or_else(|p| p.into_inner());
            work(self, &fault)
        };
        if fault.die_after_work {
            die();
        }
        out.map(Some)
    }
}

/// Marks a response whose body the server replaces with bytes no
/// protobuf decoder accepts (a `garbage_reply` fault).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GarbageReply;

/// Dies at once, as if killed from outside: no reply, no cleanup.
fn die() -> ! {
    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    // SIGKILL cannot be blocked or caught; this is never reached
    std::process::abort()
}
