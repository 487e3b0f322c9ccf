//! The worker pools operations run on: one for every volume volumed
//! mounts itself (emptyDir, hostPath, local, payloads), and one per CSI
//! driver, started with its first operation. A driver that stops
//! answering holds only its own pool's workers, each until the call's
//! timeout (`--csi-timeout`, two minutes by default): the other drivers'
//! and the host plugins' operations never queue behind its calls. (The
//! kubelet runs every operation on a goroutine of its own, so a hung
//! driver there never delays an emptyDir either.)

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::reconciler::jobs::Queued;

use super::DaemonError;

/// Starts one worker taking jobs from the receiver.
pub(super) type StartWorker =
    Box<dyn Fn(Arc<Mutex<Receiver<Queued>>>) -> Result<JoinHandle<()>, DaemonError> + Send>;

/// The pools: where each job goes (see the module doc).
pub(super) struct Pools {
    /// workers per pool
    size: usize,
    /// the pool of the plugins that do not call a driver
    host: Sender<Queued>,
    /// one pool per CSI driver, by name
    drivers: HashMap<String, Sender<Queued>>,
    start: StartWorker,
}

impl Pools {
    /// `size` workers per pool (at least one); the host plugins' pool is
    /// started now, and its workers' handles returned. A driver's pool's
    /// are not kept: the loop ends only with nothing in flight, so they
    /// are idle then, and end as their queue closes with the pools.
    pub(super) fn new(
        size: usize,
        start: StartWorker,
    ) -> Result<(Self, Vec<JoinHandle<()>>), DaemonError> {
        let size = size.max(1);
        let (host, threads) = start_pool(size, &start)?;
        let pools = Self {
            size,
            host,
            drivers: HashMap::new(),
            start,
        };
        Ok((pools, threads))
    }

    /// Queues `q` on its pool: its CSI driver's (started now when it is
    /// the driver's first job), else the host plugins'. The job back when
    /// no worker can take it (none could be started, or all are gone).
    pub(super) fn send(&mut self, q: Queued) -> Result<(), Box<Queued>> {
        let tx = match q.job.csi_driver() {
            None => &self.host,
            Some(driver) => {
                if !self.drivers.contains_key(driver) {
                    match start_pool(self.size, &self.start) {
                        Ok((tx, _detached)) => {
                            self.drivers.insert(driver.to_owned(), tx);
                        }
                        Err(e) => {
                            tracing::error!(driver, error = %e, "start the driver's workers");
                            return Err(Box::new(q));
                        }
                    }
                }
                &self.drivers[driver]
            }
        };
        tx.send(q).map_err(|mpsc::SendError(q)| Box::new(q))
    }
}

/// `size` workers on one new queue: its sender, and the workers.
fn start_pool(
    size: usize,
    start: &StartWorker,
) -> Result<(Sender<Queued>, Vec<JoinHandle<()>>), DaemonError> {
    let (tx, rx) = mpsc::channel::<Queued>();
    let rx = Arc::new(Mutex::new(rx));
    let threads = (0..size)
        .map(|_| start(rx.clone()))
        .collect::<Result<_, _>>()?;
    Ok((tx, threads))
}
