//! `<journal-dir>/api.sock`: the unix socket the runtime API (and every
//! other endpoint) is served on, for callers on the node that should not
//! need the TCP port. Mode 0600: only root (the daemon's user) may connect.
//!
//! The socket is bound under a temporary name, given its mode, then
//! renamed over `api.sock`: nobody can connect before the mode is set,
//! and a stale socket left by a daemon that died is replaced in one step.
//! Only one daemon runs per journal dir (the journal's lock), so a socket
//! found there at start is never a live one's.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// The socket's file name in the journal dir.
pub const API_SOCKET: &str = "api.sock";
/// Its mode.
pub const MODE: u32 = 0o600;

/// Where the socket of the daemon with journal dir `dir` is.
pub fn path(dir: &Path) -> PathBuf {
    dir.join(API_SOCKET)
}

/// What went wrong, by step, with the path.
#[derive(Debug, thiserror::Error)]
pub enum ApiSocketError {
    /// a step on the socket file failed
    #[error("{step} {path}: {cause}")]
    Io {
        /// `bind`, `chmod`, `rename into place`, `remove`, `listen`
        step: &'static str,
        /// the file
        path: PathBuf,
        /// the cause
        cause: std::io::Error,
    },
}

fn io(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ApiSocketError {
    let path = path.to_owned();
    move |cause| ApiSocketError::Io { step, path, cause }
}

/// The bound socket; its file is removed when this is dropped (the server
/// drops it once it stops accepting).
#[derive(Debug)]
pub struct ApiSocket {
    /// the listener
    pub listener: tokio::net::UnixListener,
    dir: PathBuf,
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        if let Err(e) = remove(&self.dir) {
            tracing::warn!("{e}");
        }
    }
}

/// Binds `<dir>/api.sock` with mode 0600, replacing a stale one. Must be
/// called inside a tokio runtime (the listener registers with it).
pub fn bind(dir: &Path) -> Result<ApiSocket, ApiSocketError> {
    let target = path(dir);
    let tmp = dir.join(format!(".{API_SOCKET}.{}", std::process::id()));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove", &tmp)(e)),
        _ => {}
    }
    let listener = std::os::unix::net::UnixListener::bind(&tmp).map_err(io("bind", &tmp))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(MODE))
        .map_err(io("chmod", &tmp))
        .and_then(|()| std::fs::rename(&tmp, &target).map_err(io("rename into place", &target)));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    listener
        .set_nonblocking(true)
        .map_err(io("listen", &target))?;
    let listener = tokio::net::UnixListener::from_std(listener).map_err(io("listen", &target))?;
    Ok(ApiSocket {
        listener,
        dir: dir.to_owned(),
    })
}

/// Removes `<dir>/api.sock` at stop (absent: nothing to do).
pub fn remove(dir: &Path) -> Result<(), ApiSocketError> {
    let target = path(dir);
    match std::fs::remove_file(&target) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &target)(e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt as _;

    use super::*;

    #[test]
    fn a_stale_socket_is_replaced_with_a_0600_one_that_accepts() {
        let dir = tempfile::tempdir().unwrap();
        // a socket left behind by a daemon that died: nobody listens
        drop(std::os::unix::net::UnixListener::bind(path(dir.path())).unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let socket = rt.block_on(async { bind(dir.path()) }).unwrap();
        let meta = std::fs::metadata(path(dir.path())).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, MODE);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [API_SOCKET], "no temporary name left");
        rt.block_on(async {
            let client = tokio::net::UnixStream::connect(path(dir.path()));
            let (c, a) = tokio::join!(client, socket.listener.accept());
            c.unwrap();
            a.unwrap();
        });
        drop(socket);
        assert!(!path(dir.path()).exists(), "removed with the listener");
        remove(dir.path()).unwrap();
    }
}
