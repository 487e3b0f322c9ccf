//! Reading the journal when a running daemon holds it: [`open_or_ask`] opens
//! the journal read-only, and when sled's lock is held (the daemon runs)
//! asks the daemon for `GET /debug/journal` instead, on its unix socket
//! `<journal-dir>/api.sock` once `daemon.json` says it is this boot's and
//! alive (`/debug/*` is not served on the TCP listener). `dump` uses it;
//! `reconstruct --dry-run` can too.
//!
//! The client is a tiny blocking HTTP/1.1 GET (over the socket, or over
//! `std::net::TcpStream` for the probes: [`get`]), not reqwest: it sends
//! one request to the daemon on the node, so a TLS-capable async client
//! with its runtime would be most of the binary for nothing. It asks `Connection: close` and reads to the end, decodes a
//! chunked body should one come, and bounds everything: connect, every
//! read and write, the whole exchange, and the body's size. Every byte it
//! receives and every field of daemon.json is external input: nothing here
//! panics on them.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::daemon_file::{self, DaemonFile, DaemonFileError};
use crate::dump::DumpDoc;
use crate::journal::{
    Journal, JournalConfig, JournalError, JournalState, NotOpened, Opened, Replay,
};

/// The default bound on one exchange with the daemon.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest response body accepted.
pub(super) const MAX_BODY: usize = 256 * 1024 * 1024;
/// The largest status line plus headers accepted.
pub(super) const MAX_HEAD: usize = 64 * 1024;

/// Where the journal was read from.
#[derive(Debug)]
pub enum JournalSource {
    /// opened here (nobody held it): what the open found, the state it implies
    Local(Replay, JournalState),
    /// a running daemon served it
    Daemon {
        /// the dump document it served
        doc: DumpDoc,
        /// the daemon's daemon.json
        daemon: DaemonFile,
    },
}

/// What went wrong, by step, with the path or address.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// opening the journal failed for a reason other than the daemon's lock
    #[error(transparent)]
    Open(JournalError),
    /// the journal is locked and the daemon holding it could not be asked
    #[error(
        "the journal in {dir} is held by a running volumed, and asking it failed: {reason}; stop it to dump, or read GET /debug/journal from it"
    )]
    Busy {
        /// the journal dir
        dir: PathBuf,
        /// why asking failed (in the message, not a `source`: the message
        /// already says it, and a chain would print it twice)
        reason: Box<ClientError>,
    },
    /// there is no daemon.json
    #[error("no {path}")]
    NoDaemonFile {
        /// where it was looked for
        path: PathBuf,
    },
    /// daemon.json could not be read
    #[error(transparent)]
    DaemonFile(#[from] DaemonFileError),
    /// daemon.json names a pid that cannot be a daemon's
    #[error("{path} names pid {pid}, which is not a process id")]
    BadPid {
        /// daemon.json
        path: PathBuf,
        /// the pid in it
        pid: u32,
    },
    /// daemon.json is left from a daemon that is gone
    #[error("{path} is stale: {why}")]
    Stale {
        /// daemon.json
        path: PathBuf,
        /// pid not alive, or another boot
        why: String,
    },
    /// the listen address does not resolve
    #[error("resolve {addr}: {reason}")]
    Resolve {
        /// the address
        addr: String,
        /// why
        reason: String,
    },
    /// a socket step (connect, send, receive) failed
    #[error("{step} http://{addr}{path}: {cause}")]
    Io {
        /// `connect`, `send` or `receive`
        step: &'static str,
        /// the address
        addr: SocketAddr,
        /// the request path
        path: String,
        /// the cause
        cause: std::io::Error,
    },
    /// the whole exchange took too long
    #[error("GET http://{addr}{path}: no full answer within {after:?}")]
    Timeout {
        /// the address
        addr: SocketAddr,
        /// the request path
        path: String,
        /// the bound
        after: Duration,
    },
    /// the response is not HTTP we understand, or too large
    #[error("GET http://{addr}{path}: bad response: {reason}")]
    BadResponse {
        /// the address
        addr: SocketAddr,
        /// the request path
        path: String,
        /// what was wrong
        reason: String,
    },
    /// the daemon answered with a status other than 200
    #[error("GET http://{addr}{path}: status {status}: {body}")]
    Status {
        /// the address
        addr: SocketAddr,
        /// the request path
        path: String,
        /// the status
        status: u16,
        /// the first line of the body
        body: String,
    },
    /// asking the daemon on its socket failed
    #[error(transparent)]
    Socket(#[from] super::api_client::ApiClientError),
    /// the body is not the dump document
    #[error("GET http://{addr}{path}: decode the dump document: {cause}")]
    Decode {
        /// the address
        addr: SocketAddr,
        /// the request path
        path: String,
        /// the cause
        cause: serde_json::Error,
    },
}

/// Opens the journal in `dir` read-only; when a running daemon holds it,
/// asks that daemon (`GET /debug/journal[?volume=]`) within `timeout`.
/// `volume` only filters the daemon's answer: a local replay is whole.
///
/// A lock held with no live daemon behind it (another `dump` for a moment,
/// a daemon between opening the journal and writing daemon.json) is tried
/// again until the inspection's wait is over (`Journal::open_or_ask`).
pub fn open_or_ask(
    dir: &Path,
    boot_id: &str,
    volume: Option<&str>,
    timeout: Duration,
) -> Result<JournalSource, ClientError> {
    let cfg = JournalConfig::inspect(dir, boot_id);
    // why no daemon answered yet, for the error when none ever does
    let mut not_yet = None;
    let opened = Journal::open_or_ask(&cfg, || match ask_daemon(dir, boot_id, volume, timeout) {
        Ok(source) => Ok(Some(source)),
        Err(e @ (ClientError::NoDaemonFile { .. } | ClientError::Stale { .. })) => {
            not_yet = Some(e);
            Ok(None)
        }
        Err(e) => Err(e),
    });
    match opened {
        Ok(Opened::Here(here)) => {
            let (journal, replay) = *here;
            Ok(JournalSource::Local(replay, journal.into_state()))
        }
        Ok(Opened::Holder(source)) => Ok(source),
        Err(NotOpened::Open(e)) => Err(ClientError::Open(e)),
        Err(NotOpened::Held(reason)) => Err(ClientError::Busy {
            dir: dir.to_owned(),
            reason: Box::new(
                reason
                    .or(not_yet)
                    .unwrap_or_else(|| ClientError::NoDaemonFile {
                        path: daemon_file::path(dir),
                    }),
            ),
        }),
    }
}

/// Asks the daemon named by `<dir>/daemon.json` for its journal, after
/// checking the file is this boot's and its pid is alive.
pub fn ask_daemon(
    dir: &Path,
    boot_id: &str,
    volume: Option<&str>,
    timeout: Duration,
) -> Result<JournalSource, ClientError> {
    let file = daemon_file::path(dir);
    let daemon =
        DaemonFile::read(dir)?.ok_or_else(|| ClientError::NoDaemonFile { path: file.clone() })?;
    if daemon.boot_id != boot_id {
        return Err(ClientError::Stale {
            path: file,
            why: format!("written in boot {}, this is boot {boot_id}", daemon.boot_id),
        });
    }
    let pid = i32::try_from(daemon.pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(ClientError::BadPid {
            path: file.clone(),
            pid: daemon.pid,
        })?;
    if !pid_alive(pid) {
        return Err(ClientError::Stale {
            path: file,
            why: format!("pid {pid} is not running"),
        });
    }
    let path = with_query("/debug/journal", &[volume.map(|v| ("volume", v))]);
    let doc = super::api_client::get_ok(dir, &path, timeout)?;
    Ok(JournalSource::Daemon { doc, daemon })
}

/// Asks the daemon named by `<dir>/daemon.json` for its volume health, of
/// every volume or of `volume` alone (`GET /debug/health`, after a pass
/// asked for now when `fresh`).
pub fn ask_health(
    dir: &Path,
    fresh: bool,
    volume: Option<&str>,
    timeout: Duration,
) -> Result<crate::health::report::HealthDoc, ClientError> {
    let file = daemon_file::path(dir);
    DaemonFile::read(dir)?.ok_or(ClientError::NoDaemonFile { path: file })?;
    let asked = [
        fresh.then_some(("fresh", "1")),
        volume.map(|v| ("volume", v)),
    ];
    let path = with_query("/debug/health", &asked);
    Ok(super::api_client::get_ok(dir, &path, timeout)?)
}

/// `path` with the pairs given as its query string, encoded (a `None`
/// pair is left out): how any caller asks the daemon's endpoints.
pub fn with_query(path: &str, pairs: &[Option<(&str, &str)>]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.extend_pairs(pairs.iter().flatten());
    match query.finish() {
        q if q.is_empty() => path.to_owned(),
        q => format!("{path}?{q}"),
    }
}

/// `kill(pid, 0)`: alive unless the kernel says there is no such process
/// (EPERM means it exists under another user).
fn pid_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) | Err(Errno::EPERM) => true,
        Err(_) => false,
    }
}

/// `GET http://<listen><path>` within `timeout`; the body when the status is
/// 200, with the address connected to.
pub fn get_ok(
    listen: &str,
    path: &str,
    timeout: Duration,
) -> Result<(SocketAddr, Vec<u8>), ClientError> {
    let addr = resolve(listen)?;
    let (status, body) = get(addr, path, timeout)?;
    if status != 200 {
        let text = String::from_utf8_lossy(&body);
        return Err(ClientError::Status {
            addr,
            path: path.to_owned(),
            status,
            body: text.lines().next().unwrap_or_default().to_owned(),
        });
    }
    Ok((addr, body))
}

fn resolve(listen: &str) -> Result<SocketAddr, ClientError> {
    let resolve_err = |reason: String| ClientError::Resolve {
        addr: listen.to_owned(),
        reason,
    };
    let mut addrs = listen
        .to_socket_addrs()
        .map_err(|e| resolve_err(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| resolve_err("no address".to_owned()))
}

/// One `GET` to `addr`: (status, body). Bounded by `timeout` as a whole.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<(u16, Vec<u8>), ClientError> {
    let deadline = Instant::now() + timeout;
    let io = |step| {
        move |cause| ClientError::Io {
            step,
            addr,
            path: path.to_owned(),
            cause,
        }
    };
    let timed_out = || ClientError::Timeout {
        addr,
        path: path.to_owned(),
        after: timeout,
    };
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(io("connect"))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(io("send"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json, text/plain\r\nConnection: close\r\nUser-Agent: volumed/{}\r\n\r\n",
        env!("CARGO_PKG_VERSION")
    );
    exchange(&mut stream, &request, deadline).map_err(|e| match e {
        Exchange::Io(step, source) => io(step)(source),
        Exchange::Timeout => timed_out(),
        Exchange::Bad(reason) => bad(addr, path, reason),
    })
}

/// A stream an exchange runs over: each read is bounded.
pub(super) trait TimedStream: std::io::Read + std::io::Write {
    /// `set_read_timeout` of the std stream.
    fn read_timeout(&self, t: Duration) -> std::io::Result<()>;
}

impl TimedStream for TcpStream {
    fn read_timeout(&self, t: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(t))
    }
}

impl TimedStream for std::os::unix::net::UnixStream {
    fn read_timeout(&self, t: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(t))
    }
}

/// Why an exchange failed; each client names its peer around it.
#[derive(Debug)]
pub(super) enum Exchange {
    /// `send` or `receive` failed
    Io(&'static str, std::io::Error),
    /// no whole answer by the deadline
    Timeout,
    /// the answer is not HTTP as asked, or too large
    Bad(String),
}

/// Sends `request` and reads the whole `Connection: close` answer by
/// `deadline`: (status, body). Shared by the TCP client here and the unix
/// socket client (`api_client`).
pub(super) fn exchange<S: TimedStream>(
    stream: &mut S,
    request: &str,
    deadline: Instant,
) -> Result<(u16, Vec<u8>), Exchange> {
    stream
        .write_all(request.as_bytes())
        .map_err(|e| Exchange::Io("send", e))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(Exchange::Timeout)?;
        stream
            .read_timeout(left)
            .map_err(|e| Exchange::Io("receive", e))?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(buf.get(..n).unwrap_or_default()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Exchange::Timeout);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Exchange::Io("receive", e)),
        }
        if raw.len() > MAX_HEAD + MAX_BODY {
            return Err(Exchange::Bad(format!("larger than {MAX_BODY} bytes")));
        }
    }
    parse_response(&raw).map_err(Exchange::Bad)
}

fn bad(addr: SocketAddr, path: &str, reason: String) -> ClientError {
    ClientError::BadResponse {
        addr,
        path: path.to_owned(),
        reason,
    }
}

/// Splits a whole `Connection: close` response into status and body.
pub(super) fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let head_end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .filter(|p| *p <= MAX_HEAD)
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(raw.get(..head_end).unwrap_or_default())
        .map_err(|_| "headers are not UTF-8")?;
    let body = raw.get(head_end + 4..).unwrap_or_default();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(format!("status line {status_line:?}"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .filter(|s| (100..=599).contains(s))
        .ok_or_else(|| format!("status line {status_line:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("header line {line:?}"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().ends_with("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| format!("content-length {value:?}"))?;
            length = Some(n);
        }
    }
    let body = if chunked {
        dechunk(body)?
    } else if let Some(n) = length {
        body.get(..n)
            .ok_or_else(|| format!("body is {} bytes, content-length {n}", body.len()))?
            .to_vec()
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

/// Decodes a chunked body (extensions and trailers ignored).
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line without end")?;
        let line = std::str::from_utf8(rest.get(..eol).unwrap_or_default())
            .map_err(|_| "chunk size is not UTF-8")?;
        let hex = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(hex, 16).map_err(|_| format!("chunk size {hex:?}"))?;
        rest = rest.get(eol + 2..).unwrap_or_default();
        if size == 0 {
            return Ok(out);
        }
        if size > MAX_BODY.saturating_sub(out.len()) {
            return Err(format!("larger than {MAX_BODY} bytes"));
        }
        let chunk = rest
            .get(..size)
            .ok_or_else(|| format!("chunk of {size} bytes cut short"))?;
        out.extend_from_slice(chunk);
        rest = rest
            .get(size..)
            .and_then(|r| r.strip_prefix(b"\r\n"))
            .ok_or("chunk without its line end")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_content_length_and_chunked_bodies() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: x\r\n\r\nhello";
        assert_eq!(parse_response(raw).unwrap(), (200, b"hello".to_vec()));
        let raw = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw).unwrap(), (503, b"abcde".to_vec()));
        let raw = b"HTTP/1.0 200 OK\r\n\r\nto the end";
        assert_eq!(parse_response(raw).unwrap(), (200, b"to the end".to_vec()));
    }

    #[test]
    fn garbage_responses_are_errors_not_panics() {
        for raw in [
            &b""[..],
            b"hello",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\nab\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabXX0\r\n\r\n",
        ] {
            assert!(
                parse_response(raw).is_err(),
                "{:?}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn a_silent_server_is_a_timeout() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Accepts (the kernel does) but never answers.
        let start = Instant::now();
        let e = get(addr, "/debug/journal", Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(listener);
    }

    #[test]
    fn a_closed_port_is_a_connect_error_naming_the_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let e = get(addr, "/x", Duration::from_secs(2)).unwrap_err();
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }

    #[test]
    fn no_daemon_file_and_a_dead_pid_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let e = ask_daemon(dir.path(), "b", None, DEFAULT_TIMEOUT).unwrap_err();
        assert!(matches!(e, ClientError::NoDaemonFile { .. }), "{e}");
        // A pid that exited: a child we reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let f = DaemonFile {
            pid,
            listen: "127.0.0.1:1".to_owned(),
            boot_id: "b".to_owned(),
            version: "0".to_owned(),
            started_ns: 1,
            debug_listen: None,
        };
        f.write(dir.path()).unwrap();
        let e = ask_daemon(dir.path(), "b", None, DEFAULT_TIMEOUT).unwrap_err();
        assert!(e.to_string().contains("not running"), "{e}");
        let e = ask_daemon(dir.path(), "other-boot", None, DEFAULT_TIMEOUT).unwrap_err();
        assert!(e.to_string().contains("boot"), "{e}");
        DaemonFile { pid: 0, ..f }.write(dir.path()).unwrap();
        let e = ask_daemon(dir.path(), "b", None, DEFAULT_TIMEOUT).unwrap_err();
        assert!(matches!(e, ClientError::BadPid { .. }), "{e}");
    }
}
