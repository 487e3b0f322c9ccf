//! The client side of `<journal-dir>/api.sock`, where every endpoint but
//! the probes is served: `volumed wait-pod`'s one blocking
//! `GET /v1/pods/<uid>/volumes?wait=N` (with `--unmounted`,
//! `?unmounted=1&wait=N`), `volumed mounts`'
//! `GET /v1/pods/<uid>/containers/<name>/mounts?wait=N`, and [`get_ok`] for
//! `dump`, `health` and `reconstruct --dry-run` (through `super::client`).
//!
//! The socket is how a runtime finds the daemon of a journal dir: no
//! socket, or one nobody listens on (left by a daemon that died), means no
//! daemon runs, and says so apart from any answer the daemon gives. Every
//! byte received is external input: nothing here panics on it, and the
//! exchange is bounded by the wait plus [`MARGIN`].

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::api_socket;
use super::client::{Exchange, exchange};
use crate::model::PodUid;
use crate::runtime::{ContainerMounts, PodUnmounted, PodVolumes};

/// How much longer than the wait the exchange may take.
pub const MARGIN: Duration = Duration::from_secs(10);

/// Why `wait-pod` got no answer, or which.
#[derive(Debug, thiserror::Error)]
pub enum ApiClientError {
    /// no daemon listens for this journal dir
    #[error("no volumed daemon is running for journal dir {dir}: {why}")]
    NoDaemon {
        /// the journal dir
        dir: PathBuf,
        /// what was found instead
        why: String,
    },
    /// a socket step failed
    #[error("{step} {socket}: {cause}")]
    Io {
        /// `connect`, `send` or `receive`
        step: &'static str,
        /// the socket
        socket: PathBuf,
        /// the cause
        cause: std::io::Error,
    },
    /// no whole answer in time
    #[error("GET {path} on {socket}: no full answer within {after:?}")]
    Timeout {
        /// the socket
        socket: PathBuf,
        /// the request path
        path: String,
        /// the bound
        after: Duration,
    },
    /// the daemon does not know the pod
    #[error("pod {pod}: volumed does not know this pod")]
    UnknownPod {
        /// the pod
        pod: PodUid,
    },
    /// the pod has no such container (the daemon's words)
    #[error("{0}")]
    UnknownContainer(String),
    /// the answer is not what the API promises
    #[error("GET {path} on {socket}: {reason}")]
    BadResponse {
        /// the socket
        socket: PathBuf,
        /// the request path
        path: String,
        /// what was wrong (a status other than 200 or 404 and its body, or
        /// a body that is not the document)
        reason: String,
    },
}

/// Asks the daemon of journal dir `dir` whether pod `pod`'s volumes are
/// ready, waiting up to `wait` for them.
pub fn wait_pod(dir: &Path, pod: &PodUid, wait: Duration) -> Result<PodVolumes, ApiClientError> {
    let path = format!("/v1/pods/{pod}/volumes?wait={}", wait.as_secs());
    match get(dir, &path, wait + MARGIN)? {
        Answer::Ok(doc) => Ok(doc),
        Answer::NotFound(_) => Err(ApiClientError::UnknownPod { pod: pod.clone() }),
    }
}

/// Asks the daemon of journal dir `dir` whether none of pod `pod`'s
/// volumes is mounted any more, waiting up to `wait` for it (the kubelet's
/// `WaitForUnmount`).
pub fn wait_unmounted(
    dir: &Path,
    pod: &PodUid,
    wait: Duration,
) -> Result<PodUnmounted, ApiClientError> {
    let path = format!("/v1/pods/{pod}/volumes?unmounted=1&wait={}", wait.as_secs());
    match get(dir, &path, wait + MARGIN)? {
        Answer::Ok(doc) => Ok(doc),
        // the daemon answers every pod; a 404 is a daemon without the question
        Answer::NotFound(_) => Err(ApiClientError::BadResponse {
            socket: api_socket::path(dir),
            path,
            reason: "status 404: this daemon does not answer unmounted=1".to_owned(),
        }),
    }
}

/// `GET path` on the socket of the daemon of journal dir `dir` within
/// `after`: the decoded document of a 200; any other status is a bad
/// response naming it.
pub fn get_ok<T: serde::de::DeserializeOwned>(
    dir: &Path,
    path: &str,
    after: Duration,
) -> Result<T, ApiClientError> {
    match get(dir, path, after)? {
        Answer::Ok(doc) => Ok(doc),
        Answer::NotFound(_) => Err(ApiClientError::BadResponse {
            socket: api_socket::path(dir),
            path: path.to_owned(),
            reason: "status 404".to_owned(),
        }),
    }
}

/// Asks the daemon of journal dir `dir` for container `container`'s mounts
/// of pod `pod`, waiting up to `wait` for the pod's volumes.
pub fn container_mounts(
    dir: &Path,
    pod: &PodUid,
    container: &str,
    wait: Duration,
) -> Result<ContainerMounts, ApiClientError> {
    let path = format!(
        "/v1/pods/{pod}/containers/{container}/mounts?wait={}",
        wait.as_secs()
    );
    match get(dir, &path, wait + MARGIN)? {
        Answer::Ok(doc) => Ok(doc),
        Answer::NotFound(why) if why.ends_with("does not know this pod") => {
            Err(ApiClientError::UnknownPod { pod: pod.clone() })
        }
        Answer::NotFound(why) => Err(ApiClientError::UnknownContainer(why)),
    }
}

/// A 200's document, or a 404 with the first line of its body.
enum Answer<T> {
    Ok(T),
    NotFound(String),
}

/// `GET path` on the socket of the daemon of journal dir `dir`, within
/// `after`: the decoded 200, a 404, or why there is neither.
fn get<T: serde::de::DeserializeOwned>(
    dir: &Path,
    path: &str,
    after: Duration,
) -> Result<Answer<T>, ApiClientError> {
    let socket = api_socket::path(dir);
    let no_daemon = |why: String| ApiClientError::NoDaemon {
        dir: dir.to_owned(),
        why,
    };
    let mut stream = match UnixStream::connect(&socket) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(no_daemon(format!("{} does not exist", socket.display())));
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(no_daemon(format!(
                "nobody listens on {} (left by a daemon that is gone)",
                socket.display()
            )));
        }
        Err(cause) => {
            return Err(ApiClientError::Io {
                step: "connect",
                socket,
                cause,
            });
        }
    };
    let (status, body) = ask(&mut stream, &socket, path, after)?;
    let bad = |reason: String| ApiClientError::BadResponse {
        socket: socket.clone(),
        path: path.to_owned(),
        reason,
    };
    match status {
        200 => serde_json::from_slice(&body)
            .map(Answer::Ok)
            .map_err(|e| bad(format!("decode the answer: {e}"))),
        404 => {
            let text = String::from_utf8_lossy(&body);
            Ok(Answer::NotFound(
                text.lines().next().unwrap_or_default().to_owned(),
            ))
        }
        s => {
            let text = String::from_utf8_lossy(&body);
            let first = text.lines().next().unwrap_or_default();
            Err(bad(format!("status {s}: {first}")))
        }
    }
}

/// Sends the GET and reads the whole `Connection: close` answer by `after`.
fn ask(
    stream: &mut UnixStream,
    socket: &Path,
    path: &str,
    after: Duration,
) -> Result<(u16, Vec<u8>), ApiClientError> {
    let deadline = Instant::now() + after;
    let io = |step| {
        move |cause| ApiClientError::Io {
            step,
            socket: socket.to_owned(),
            cause,
        }
    };
    let timed_out = || ApiClientError::Timeout {
        socket: socket.to_owned(),
        path: path.to_owned(),
        after,
    };
    stream.set_write_timeout(Some(MARGIN)).map_err(io("send"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\nUser-Agent: volumed/{}\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    );
    exchange(stream, &request, deadline).map_err(|e| match e {
        Exchange::Io(step, cause) => io(step)(cause),
        Exchange::Timeout => timed_out(),
        Exchange::Bad(reason) => ApiClientError::BadResponse {
            socket: socket.to_owned(),
            path: path.to_owned(),
            reason,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use super::*;

    fn uid() -> PodUid {
        PodUid::new("u1").unwrap()
    }

    #[test]
    fn no_socket_and_a_stale_socket_both_say_no_daemon_runs() {
        let dir = tempfile::tempdir().unwrap();
        let e = wait_pod(dir.path(), &uid(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ApiClientError::NoDaemon { .. }), "{e}");
        assert!(e.to_string().contains("does not exist"), "{e}");
        drop(std::os::unix::net::UnixListener::bind(api_socket::path(dir.path())).unwrap());
        let e = wait_pod(dir.path(), &uid(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ApiClientError::NoDaemon { .. }), "{e}");
        assert!(e.to_string().contains("nobody listens"), "{e}");
    }

    #[test]
    fn garbage_from_the_socket_is_a_bad_response_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let listener =
            std::os::unix::net::UnixListener::bind(api_socket::path(dir.path())).unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n{nope")
                .unwrap();
        });
        let e = wait_pod(dir.path(), &uid(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(e, ApiClientError::BadResponse { .. }), "{e}");
        server.join().unwrap();
    }
}
