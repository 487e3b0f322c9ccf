//! The CSI drivers volumed knows: by name, each with its endpoint, a
//! connected client, its node id and its node capabilities.
//!
//! Drivers arrive two ways: `--csi-driver NAME=SOCKET` (a standalone node)
//! and the kubelet's plugin registration (`discovery`). Either way a driver
//! is usable only once `NodeGetInfo` and `NodeGetCapabilities` answered.
//! A flag driver whose socket is not there yet is connected when a volume
//! first needs it, so the daemon never waits for a driver to start, and an
//! operation on a driver that is not reachable fails (final: no call was
//! made) and is retried with backoff like any failed operation.
//!
//! The registry owns a small tokio runtime: the plugin's operations run on
//! the executor's worker threads and block on their RPC there, so a slow
//! driver holds one worker, never the decision thread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus::HistogramVec;

use super::client::{CsiClient, CsiError, NodeCaps};
use super::connect_unix;

/// How a driver became known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `--csi-driver NAME=SOCKET`
    Flag,
    /// a registration socket in `plugins_registry/`
    Registration(PathBuf),
}

/// A usable driver.
#[derive(Debug, Clone)]
pub struct Driver {
    /// the name it answers `GetPluginInfo` with
    pub name: String,
    /// its CSI socket
    pub endpoint: PathBuf,
    /// the client on that socket
    pub client: CsiClient,
    /// `NodeGetInfo`'s node id
    pub node_id: String,
    /// `NodeGetCapabilities`, read when it registered
    pub caps: NodeCaps,
    /// how it became known
    pub origin: Origin,
}

/// Why a driver could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RegistryError {
    /// a `--csi-driver` flag is not `NAME=SOCKET` with a valid name and an
    /// absolute socket path
    #[error("--csi-driver {flag:?}: {why}")]
    Flag {
        /// the flag's value
        flag: String,
        /// what is wrong
        why: String,
    },
    /// the registry's runtime could not start
    #[error("start the CSI client runtime: {0}")]
    Runtime(String),
    /// no driver of that name is registered or configured
    #[error("CSI driver {0} is not registered (no --csi-driver flag, no registration socket)")]
    Unknown(String),
    /// its socket could not be connected
    #[error("CSI driver {driver} is not reachable at {}: {reason}", endpoint.display())]
    Unreachable {
        /// the driver
        driver: String,
        /// its socket
        endpoint: PathBuf,
        /// what failed
        reason: String,
    },
    /// it answered the registration calls with an error
    #[error("CSI driver {driver} failed registration: {cause}")]
    Rpc {
        /// the driver
        driver: String,
        /// the failed call
        cause: CsiError,
    },
}

/// Every known driver.
#[derive(Debug)]
pub struct Drivers {
    runtime: tokio::runtime::Runtime,
    timeout: Duration,
    seconds: Option<HistogramVec>,
    /// usable drivers
    ready: RwLock<BTreeMap<String, Arc<Driver>>>,
    /// flag drivers not connected yet: name → socket
    configured: RwLock<BTreeMap<String, PathBuf>>,
    /// held while a flag driver is connected on first use, so the workers
    /// that need it at once register it once
    connecting: std::sync::Mutex<()>,
}

impl Drivers {
    /// An empty registry whose RPCs time out after `timeout`; `seconds` is
    /// `csi_operations_seconds`.
    pub fn new(timeout: Duration, seconds: Option<HistogramVec>) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("volumed-csi")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime,
            timeout,
            seconds,
            ready: RwLock::new(BTreeMap::new()),
            configured: RwLock::new(BTreeMap::new()),
            connecting: std::sync::Mutex::new(()),
        })
    }

    /// How long an RPC may take before volumed gives up on it.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A registry with the drivers of `--csi-driver NAME=SOCKET` flags
    /// configured (connected on first use).
    pub fn from_flags(
        flags: &[String],
        timeout: Duration,
        seconds: Option<HistogramVec>,
    ) -> Result<Self, RegistryError> {
        let drivers =
            Self::new(timeout, seconds).map_err(|e| RegistryError::Runtime(e.to_string()))?;
        for flag in flags {
            let bad = |why: &str| RegistryError::Flag {
                flag: flag.clone(),
                why: why.to_owned(),
            };
            let (name, socket) = flag
                .split_once('=')
                .ok_or_else(|| bad("expected NAME=SOCKET"))?;
            crate::model::check_component("CSI driver name", name)
                .map_err(|e| bad(&e.to_string()))?;
            let socket = Path::new(socket);
            if !socket.is_absolute() {
                return Err(bad("the socket must be an absolute path"));
            }
            drivers.configure(name, socket);
        }
        Ok(drivers)
    }

    /// Runs `f` to completion on the registry's runtime, from a thread
    /// that is not one of its own (a worker, the discovery thread).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    /// Names a driver's socket (`--csi-driver`); it is connected on first use.
    pub fn configure(&self, name: &str, endpoint: &Path) {
        if let Ok(mut c) = self.configured.write() {
            c.insert(name.to_owned(), endpoint.to_owned());
        }
    }

    /// The usable driver `name`, connecting a configured one first.
    pub fn get(&self, name: &str) -> Result<Arc<Driver>, RegistryError> {
        let ready = || self.ready.read().ok().and_then(|r| r.get(name).cloned());
        if let Some(d) = ready() {
            return Ok(d);
        }
        let _one_at_a_time = self.connecting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = ready() {
            return Ok(d);
        }
        let endpoint = self
            .configured
            .read()
            .ok()
            .and_then(|c| c.get(name).cloned())
            .ok_or_else(|| RegistryError::Unknown(name.to_owned()))?;
        self.block_on(self.register(name, &endpoint, Origin::Flag))
    }

    /// Connects to `endpoint`, asks `NodeGetInfo` and `NodeGetCapabilities`,
    /// and makes the driver usable (replacing an earlier registration of
    /// the same name: a restarted driver, a new socket).
    pub async fn register(
        &self,
        name: &str,
        endpoint: &Path,
        origin: Origin,
    ) -> Result<Arc<Driver>, RegistryError> {
        let channel = connect_unix(endpoint)
            .await
            .map_err(|e| RegistryError::Unreachable {
                driver: name.to_owned(),
                endpoint: endpoint.to_owned(),
                reason: e.to_string(),
            })?;
        let client = CsiClient::new(name, channel, self.timeout, self.seconds.clone());
        let rpc = |cause| RegistryError::Rpc {
            driver: name.to_owned(),
            cause,
        };
        let node_id = client.node_info().await.map_err(rpc)?;
        let caps = client.node_caps().await.map_err(rpc)?;
        let driver = Arc::new(Driver {
            name: name.to_owned(),
            endpoint: endpoint.to_owned(),
            client,
            node_id,
            caps,
            origin,
        });
        if let Ok(mut r) = self.ready.write() {
            r.insert(name.to_owned(), driver.clone());
        }
        tracing::info!(driver = name, endpoint = %endpoint.display(), ?caps, "CSI driver registered");
        Ok(driver)
    }

    /// Every usable driver as (name, `NodeGetInfo`'s node id), by name: what
    /// the node's CSINode and `csi.volume.kubernetes.io/nodeid` list.
    pub fn node_ids(&self) -> Vec<(String, String)> {
        self.ready
            .read()
            .map(|r| {
                r.values()
                    .map(|d| (d.name.clone(), d.node_id.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Forgets the driver registered through `socket` (its registration
    /// socket went away); returns its name. A flag driver stays configured.
    pub fn deregister_socket(&self, socket: &Path) -> Option<String> {
        let mut r = self.ready.write().ok()?;
        let name = r
            .iter()
            .find(|(_, d)| matches!(&d.origin, Origin::Registration(s) if s == socket))
            .map(|(n, _)| n.clone())?;
        r.remove(&name);
        tracing::info!(driver = %name, socket = %socket.display(), "CSI driver deregistered");
        Some(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_flags_name_a_driver_and_an_absolute_socket() {
        let t = Duration::from_secs(1);
        let flags = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let d = Drivers::from_flags(&flags(&["d.example.com=/run/d.sock"]), t, None).unwrap();
        assert!(d.configured.read().unwrap().contains_key("d.example.com"));
        for (bad, why) in [
            ("d.example.com", "NAME=SOCKET"),
            ("../x=/run/d.sock", "CSI driver name"),
            ("d=run/d.sock", "absolute"),
        ] {
            let err = Drivers::from_flags(&flags(&[bad]), t, None)
                .unwrap_err()
                .to_string();
            assert!(err.contains(bad) && err.contains(why), "{err}");
        }
        // a configured driver whose socket is not there: final, named
        let err = d.get("d.example.com").unwrap_err().to_string();
        assert!(err.contains("not reachable at /run/d.sock"), "{err}");
        assert!(matches!(d.get("other"), Err(RegistryError::Unknown(_))));
    }
}
