//! Driver discovery as the kubelet's plugin watcher does it: every socket in
//! `<root>/plugins_registry/` is a registration socket (node-driver-registrar
//! serves one per driver). For each new one: `GetInfo` (type `CSIPlugin`, a
//! name, an endpoint, the versions it supports), then `NodeGetInfo` and
//! `NodeGetCapabilities` on the endpoint, then `NotifyRegistrationStatus`
//! with the result. A socket that goes away deregisters its driver; one that
//! is replaced (a restarted registrar makes a new socket file) registers
//! again.
//!
//! The watch is the daemon's own `Watcher` (inotify on the dir, a resync
//! every 30 s); a change costs one listing of the dir and RPCs for the
//! sockets that changed only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::connect_unix;
use super::proto::pluginregistration as reg;
use super::registry::{Drivers, Origin};
use crate::host::sys::Sys;
use crate::host::sys_types::FileKind;
use crate::host::watch::{Stopper, Watcher};

/// The plugin type CSI drivers register with.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// Whether a registrar's supported versions include one volumed speaks
/// (CSI 1.x; the kubelet accepts `1.0.0`, `v1.0.0` and later 1.x).
pub fn speaks_v1(versions: &[String]) -> bool {
    versions.iter().any(|v| {
        let v = v.strip_prefix('v').unwrap_or(v);
        v == "1" || v.starts_with("1.")
    })
}

/// What a registration socket said, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// the driver's name
    pub name: String,
    /// its CSI socket (the registration socket itself when it names none)
    pub endpoint: PathBuf,
}

/// Checks a `GetInfo` answer the way the kubelet does; the error is what
/// `NotifyRegistrationStatus` reports back.
pub fn check_info(info: &reg::PluginInfo, socket: &Path) -> Result<Registration, String> {
    if info.r#type != CSI_PLUGIN_TYPE {
        return Err(format!(
            "plugin type {:?} is not handled by volumed (only {CSI_PLUGIN_TYPE})",
            info.r#type
        ));
    }
    crate::model::check_component("CSI driver name", &info.name).map_err(|e| e.to_string())?;
    if !speaks_v1(&info.supported_versions) {
        return Err(format!(
            "driver {} supports none of the CSI versions volumed speaks (1.x): {:?}",
            info.name, info.supported_versions
        ));
    }
    let endpoint = if info.endpoint.is_empty() {
        socket.to_owned()
    } else {
        PathBuf::from(&info.endpoint)
    };
    if !endpoint.is_absolute() {
        return Err(format!(
            "endpoint {:?} is not an absolute path",
            info.endpoint
        ));
    }
    Ok(Registration {
        name: info.name.clone(),
        endpoint,
    })
}

/// The discovery thread; stops when [`Discovery::stop`] is called.
pub struct Discovery {
    stopper: Stopper,
    thread: Option<JoinHandle<()>>,
}

impl Discovery {
    /// Starts watching `dir` (created if missing) for registration sockets.
    pub fn start(dir: PathBuf, drivers: Arc<Drivers>, sys: Arc<dyn Sys>) -> std::io::Result<Self> {
        if let Err(e) = sys.mkdir(&dir, 0o750) {
            tracing::debug!(dir = %dir.display(), error = %e, "plugins_registry not created");
        }
        let mut watcher = Watcher::new(vec![dir.clone()], Duration::from_secs(1));
        let stopper = watcher.stopper();
        let thread = std::thread::Builder::new()
            .name("volumed-plugins".into())
            .spawn(move || {
                let mut known = BTreeMap::new();
                loop {
                    scan(&dir, &drivers, sys.as_ref(), &mut known);
                    // None is also "timed out" or "nothing relevant", not only "stopped"
                    let _ = watcher.wait_changed(Duration::from_secs(30));
                    if watcher.is_stopped() {
                        break;
                    }
                }
            })?;
        Ok(Self {
            stopper,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(&mut self) {
        self.stopper.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One pass: registers new or replaced sockets, deregisters gone ones.
/// `known` maps each socket to the identity of the file it was registered
/// from (device, inode, change time), so a replaced file registers again.
fn scan(
    dir: &Path,
    drivers: &Drivers,
    sys: &dyn Sys,
    known: &mut BTreeMap<PathBuf, (u64, u64, i128)>,
) {
    let listing = match sys.read_dir(dir) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot list plugins_registry");
            return;
        }
    };
    let mut present = BTreeMap::new();
    for (name, kind) in listing {
        if !matches!(kind, Ok(FileKind::Socket)) {
            continue;
        }
        let path = dir.join(&name);
        if let Ok(st) = sys.stat(&path, false) {
            present.insert(path, st.file_id());
        }
    }
    for gone in known
        .keys()
        .filter(|p| !present.contains_key(*p))
        .cloned()
        .collect::<Vec<_>>()
    {
        known.remove(&gone);
        drivers.deregister_socket(&gone);
    }
    for (socket, id) in present {
        if known.get(&socket) == Some(&id) {
            continue;
        }
        if drivers.block_on(register_socket(&socket, drivers)) {
            known.insert(socket, id);
        } else {
            // tried again on the next change or resync
            known.remove(&socket);
        }
    }
}

/// The registration handshake on one socket; true when it registered.
async fn register_socket(socket: &Path, drivers: &Drivers) -> bool {
    let channel = match connect_unix(socket).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(socket = %socket.display(), error = %e, "registration socket not reachable");
            return false;
        }
    };
    let mut client = reg::registration_client::RegistrationClient::new(channel);
    let mut req = tonic::Request::new(reg::InfoRequest {});
    req.set_timeout(Duration::from_secs(10));
    let info = match client.get_info(req).await {
        Ok(r) => r.into_inner(),
        Err(e) => {
            tracing::warn!(socket = %socket.display(), code = ?e.code(), message = e.message(), "GetInfo failed");
            return false;
        }
    };
    let result = match check_info(&info, socket) {
        Ok(r) => drivers
            .register(
                &r.name,
                &r.endpoint,
                Origin::Registration(socket.to_owned()),
            )
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        Err(why) => Err(why),
    };
    if let Err(why) = &result {
        tracing::warn!(socket = %socket.display(), error = %why, "plugin registration failed");
    }
    let status = reg::RegistrationStatus {
        plugin_registered: result.is_ok(),
        error: result.as_ref().err().cloned().unwrap_or_default(),
    };
    let mut req = tonic::Request::new(status);
    req.set_timeout(Duration::from_secs(10));
    if let Err(e) = client.notify_registration_status(req).await {
        tracing::warn!(socket = %socket.display(), code = ?e.code(), "NotifyRegistrationStatus failed");
    }
    result.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ty: &str, name: &str, endpoint: &str, versions: &[&str]) -> reg::PluginInfo {
        reg::PluginInfo {
            r#type: ty.into(),
            name: name.into(),
            endpoint: endpoint.into(),
            supported_versions: versions.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn registrations_are_checked_as_the_kubelet_checks_them() {
        let sock = Path::new("/r/plugins_registry/d-reg.sock");
        let ok = check_info(
            &info("CSIPlugin", "d.example.com", "/csi/d.sock", &["1.0.0"]),
            sock,
        );
        assert_eq!(
            ok,
            Ok(Registration {
                name: "d.example.com".into(),
                endpoint: "/csi/d.sock".into()
            })
        );
        let no_endpoint = check_info(&info("CSIPlugin", "d", "", &["v1.2.0"]), sock).unwrap();
        assert_eq!(
            no_endpoint.endpoint, sock,
            "the registration socket serves CSI too"
        );
        for (bad, why) in [
            (info("DevicePlugin", "d", "/x", &["1.0.0"]), "type"),
            (info("CSIPlugin", "../d", "/x", &["1.0.0"]), "name"),
            (info("CSIPlugin", "d", "/x", &["0.3.0"]), "versions"),
            (info("CSIPlugin", "d", "/x", &[]), "versions"),
            (info("CSIPlugin", "d", "rel/x.sock", &["1.0.0"]), "absolute"),
        ] {
            let err = check_info(&bad, sock).unwrap_err();
            assert!(
                err.contains(why) || err.contains("CSI driver name"),
                "{why}: {err}"
            );
        }
    }

    #[test]
    fn only_csi_1_x_is_spoken() {
        assert!(speaks_v1(&["0.3.0".into(), "1.5.0".into()]));
        assert!(speaks_v1(&["v1.0.0".into()]));
        assert!(!speaks_v1(&["10.0.0".into(), "0.1".into()]));
    }
}
