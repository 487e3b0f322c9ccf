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
    /// the drivers' pools' workers, joined when the pools go
    driver_workers: Vec<JoinHandle<()>>,
    start: StartWorker,
}

impl Pools {
    /// `size` workers per pool (at least one); the host plugins' pool is
    /// started now, and its workers' handles returned (its caller joins
    /// them). The drivers' pools' workers are joined when the pools are
    /// dropped, as the loop ends: with nothing in flight, so at once; a
    /// worker's clone of the executor then no longer holds the journal,
    /// which the binary closes next.
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
            driver_workers: Vec::new(),
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
                        Ok((tx, workers)) => {
                            self.drivers.insert(driver.to_owned(), tx);
                            self.driver_workers.extend(workers);
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

impl Drop for Pools {
    fn drop(&mut self) {
        // Closing the queues ends the workers; unwinding from a panic,
        // one may still be inside a call: then they are left to end.
        self.drivers.clear();
        if std::thread::panicking() {
            return;
        }
        for t in self.driver_workers.drain(..) {
            if t.join().is_err() {
                tracing::error!("a CSI driver's worker panicked");
            }
        }
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

#[cfg(test)]
mod tests {
    use std::sync::mpsc::RecvTimeoutError;
    use std::time::Duration;

    use super::*;
    use crate::model::{
        AccessMode, CsiLifecycle, CsiParams, PluginName, PodUid, TargetKind, TargetParams,
        TargetRef, UniqueVolumeName,
    };
    use crate::reconciler::jobs::Job;

    /// A pod target's teardown: of a CSI volume of `driver`, or, without
    /// one, of an emptyDir.
    fn teardown(driver: Option<&str>) -> Queued {
        let csi = driver.map(|d| {
            Arc::new(CsiParams {
                driver: d.to_owned(),
                volume_handle: "h".into(),
                lifecycle: CsiLifecycle::Persistent,
                access_modes: vec![AccessMode::ReadWriteOnce],
                read_only: false,
                publish_context: Default::default(),
                volume_context: Default::default(),
                stage_secret: None,
                publish_secret: None,
                mount_group: None,
                attachment_id: None,
            })
        });
        let params = TargetParams::at(
            UniqueVolumeName::from_raw(match driver {
                Some(d) => format!("kubernetes.io/csi/{d}^h"),
                None => "kubernetes.io/empty-dir/p-cache".to_owned(),
            }),
            match driver {
                Some(_) => PluginName::Csi,
                None => PluginName::EmptyDir,
            },
            "cache".into(),
            TargetRef::Pod(PodUid::new("p").unwrap()),
            TargetKind::Mount,
            None,
        )
        .with_csi(csi);
        Queued {
            job: Job::TearDown {
                params: Arc::new(params),
                subpaths: None,
            },
            intent: None,
        }
    }

    /// Pools of one worker each, whose workers say which job's driver they
    /// took (`""` for none) on the returned channel; a job of driver
    /// `stuck` blocks its worker until `release` is sent.
    fn pools(stuck: &'static str) -> (Pools, Receiver<String>, Sender<()>) {
        let (took_tx, took) = mpsc::channel::<String>();
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        let start: StartWorker = Box::new(move |rx| {
            let (took_tx, released) = (took_tx.clone(), released.clone());
            Ok(std::thread::spawn(move || {
                loop {
                    let job = rx.lock().unwrap().recv();
                    let Ok(q) = job else { return };
                    let driver = q.job.csi_driver().unwrap_or_default().to_owned();
                    let _ = took_tx.send(driver.clone());
                    if driver == stuck {
                        let _ = released.lock().unwrap().recv();
                    }
                }
            }))
        });
        let (pools, _host_workers) = Pools::new(1, start).unwrap();
        (pools, took, release)
    }

    #[test]
    fn a_driver_whose_calls_hang_holds_only_its_own_workers() {
        let (mut pools, took, release) = pools("hung.example.com");
        let next = || took.recv_timeout(Duration::from_secs(10));
        pools.send(teardown(Some("hung.example.com"))).unwrap();
        assert_eq!(next().unwrap(), "hung.example.com");
        // its only worker is stuck: a second job of it waits ...
        pools.send(teardown(Some("hung.example.com"))).unwrap();
        // ... and neither the host plugins' job nor another driver's does
        pools.send(teardown(None)).unwrap();
        assert_eq!(next().unwrap(), "");
        pools.send(teardown(Some("good.example.com"))).unwrap();
        assert_eq!(next().unwrap(), "good.example.com");
        assert_eq!(
            took.recv_timeout(Duration::from_millis(200)),
            Err(RecvTimeoutError::Timeout),
            "the hung driver's second job waits for its worker"
        );
        release.send(()).unwrap();
        assert_eq!(next().unwrap(), "hung.example.com");
        release.send(()).unwrap();
        drop(pools);
    }
}
