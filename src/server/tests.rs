//! The server over a real loopback socket with a fake provider, and the
//! client's ask path against it. Every wait is bounded.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use super::client::{self, JournalSource};
use super::daemon_file::DaemonFile;
use super::*;
use crate::model::UniqueVolumeName;
use crate::state::VolumeSnapshot;

const T: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Fake {
    ready: AtomicBool,
    asked: Mutex<Vec<Option<String>>>,
}

fn doc(boot: &str) -> DumpDoc {
    DumpDoc {
        schema_version: 1,
        boot_id: boot.to_owned(),
        node_name: "n1".to_owned(),
        checkpoint: None,
        corruption: None,
        records: Vec::new(),
        state: StateSnapshot::default(),
        journal_damage: None,
        subpaths: Vec::new(),
    }
}

impl DebugProvider for Fake {
    fn ready(&self) -> Result<(), String> {
        if self.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("reconstruction not done\nsecond line".to_owned())
        }
    }
    fn metrics_text(&self) -> String {
        "# TYPE volume_manager_total_volumes gauge\nvolume_manager_total_volumes 3\n".to_owned()
    }
    fn state(&self) -> StateSnapshot {
        StateSnapshot {
            volumes: vec![VolumeSnapshot {
                volume: UniqueVolumeName::from_raw("kubernetes.io/local-volume/pv1"),
                device: None,
                pods: Vec::new(),
                health: None,
            }],
            pod_errors: Default::default(),
            unmounted_outside: Vec::new(),
            pod_volume_health: Default::default(),
            journal_damage: None,
        }
    }
    fn journal(&self, volume: Option<&str>) -> Result<DumpDoc, String> {
        if let Ok(mut a) = self.asked.lock() {
            a.push(volume.map(str::to_owned));
        }
        match volume {
            Some("broken") => Err("sled said no".to_owned()),
            _ => Ok(doc("b-1")),
        }
    }
}

/// A server on its own runtime and thread; stopped (bounded) on drop.
/// It listens on all three: `addr` is the debug listener (every
/// endpoint), `probes` the `--listen` one, `dir` holds `api.sock`.
struct Running {
    addr: SocketAddr,
    probes: SocketAddr,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: mpsc::Receiver<()>,
}

fn start(fake: Arc<Fake>) -> Running {
    start_with(fake)
}

fn start_with(provider: Arc<dyn DebugProvider>) -> Running {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (tcp, probes) = rt.block_on(bind("127.0.0.1:0")).unwrap();
    let (debug, addr) = rt.block_on(bind("127.0.0.1:0")).unwrap();
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    let dir = tempfile::tempdir().unwrap();
    let unix = rt.block_on(async { api_socket::bind(dir.path()) }).unwrap();
    let listeners = Listeners {
        tcp,
        unix: Some(unix),
        debug: Some(debug),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        rt.block_on(serve(listeners, provider, async {
            let _ = stopped.await;
        }));
        let _ = tx.send(());
    });
    Running {
        addr,
        probes,
        dir,
        stop: Some(stop),
        done,
    }
}

impl Running {
    fn shut_down(&mut self) -> Result<(), mpsc::RecvTimeoutError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.done.recv_timeout(T)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.shut_down();
    }
}

/// A raw exchange: the whole response as text.
fn raw(addr: SocketAddr, request: &str) -> String {
    let mut s = std::net::TcpStream::connect_timeout(&addr, T).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.set_write_timeout(Some(T)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, body) = client::get(addr, path, T).unwrap();
    (status, String::from_utf8(body).unwrap())
}

#[test]
fn binding_a_taken_port_names_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let e = rt.block_on(bind(&addr)).unwrap_err();
    assert!(
        matches!(e, ServerError::Bind { .. }) && e.to_string().contains(&addr),
        "{e}"
    );
    let e = rt.block_on(bind("no-port-here")).unwrap_err();
    assert!(e.to_string().contains("no-port-here"), "{e}");
}

#[test]
fn healthz_is_ok_while_serving() {
    let s = start(Arc::default());
    assert_eq!(get(s.addr, "/healthz"), (200, "ok".to_owned()));
}

#[test]
fn readyz_is_503_with_one_line_until_the_provider_is_ready() {
    let fake = Arc::new(Fake::default());
    let s = start(Arc::clone(&fake));
    let (status, body) = get(s.addr, "/readyz");
    assert_eq!(status, 503);
    assert_eq!(body, "not ready: reconstruction not done second line\n");
    fake.ready.store(true, Ordering::SeqCst);
    assert_eq!(get(s.addr, "/readyz"), (200, "ok".to_owned()));
}

#[test]
fn metrics_are_prometheus_text() {
    let s = start(Arc::default());
    let resp = raw(
        s.addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(
        resp.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4\r\n"),
        "{resp}"
    );
    assert!(resp.ends_with("volume_manager_total_volumes 3\n"), "{resp}");
}

#[test]
fn debug_state_is_the_snapshot_as_json() {
    let s = start(Arc::default());
    let (status, body) = get(s.addr, "/debug/state");
    assert_eq!(status, 200);
    let snap: StateSnapshot = serde_json::from_str(&body).unwrap();
    assert_eq!(snap, Fake::default().state());
}

#[test]
fn debug_journal_passes_the_volume_through_decoded() {
    let fake = Arc::new(Fake::default());
    let s = start(Arc::clone(&fake));
    let (status, body) = get(s.addr, "/debug/journal");
    assert_eq!(status, 200);
    let got: DumpDoc = serde_json::from_str(&body).unwrap();
    assert_eq!(got, doc("b-1"));
    let (status, _) = get(
        s.addr,
        "/debug/journal?volume=kubernetes.io%2Flocal-volume%2Fpv%201%26x&other=1",
    );
    assert_eq!(status, 200);
    let (status, body) = get(s.addr, "/debug/journal?volume=broken");
    assert_eq!(status, 500);
    assert!(body.contains("sled said no"), "{body}");
    assert_eq!(
        *fake.asked.lock().unwrap(),
        vec![
            None,
            Some("kubernetes.io/local-volume/pv 1&x".to_owned()),
            Some("broken".to_owned())
        ]
    );
}

#[test]
fn unknown_paths_are_404_and_other_methods_405() {
    let s = start(Arc::default());
    assert_eq!(get(s.addr, "/nope").0, 404);
    assert_eq!(get(s.addr, "/debug/").0, 404);
    let resp = raw(
        s.addr,
        "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");
    assert!(resp.to_ascii_lowercase().contains("allow: get"), "{resp}");
}

#[test]
fn garbage_requests_get_an_error_not_a_crash() {
    let s = start(Arc::default());
    let resp = raw(s.addr, "\x16\x03\x01 this is not http\r\n\r\n");
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 400"),
        "{resp}"
    );
    assert_eq!(get(s.addr, "/healthz").0, 200, "still serving");
}

#[test]
fn shutdown_returns_with_an_idle_connection_open() {
    let mut s = start(Arc::default());
    // A keep-alive connection that has made one request and stays open.
    let mut idle = std::net::TcpStream::connect_timeout(&s.addr, T).unwrap();
    idle.set_read_timeout(Some(T)).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 256];
    let n = idle.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    s.shut_down().expect("serve returns within the bound");
    assert!(client::get(s.addr, "/healthz", Duration::from_secs(2)).is_err());
}

#[test]
fn ask_daemon_reads_the_journal_through_daemon_json() {
    let fake = Arc::new(Fake::default());
    let s = start(Arc::clone(&fake));
    let dir = &s.dir;
    let me = DaemonFile::for_this_process(&s.probes.to_string(), "b-1");
    me.write(dir.path()).unwrap();
    let got = client::ask_daemon(dir.path(), "b-1", Some("a/b c"), T).unwrap();
    match got {
        JournalSource::Daemon { doc: d, daemon } => {
            assert_eq!(d, doc("b-1"));
            assert_eq!(daemon, me);
        }
        JournalSource::Local(..) => panic!("asked the daemon"),
    }
    assert_eq!(*fake.asked.lock().unwrap(), vec![Some("a/b c".to_owned())]);
    let e = client::ask_daemon(dir.path(), "b-1", Some("broken"), T).unwrap_err();
    assert!(
        e.to_string().contains("status 500") && e.to_string().contains("sled said no"),
        "{e}"
    );
}

/// One GET on the unix socket in `dir`: (status, body).
fn unix_get(dir: &std::path::Path, path: &str) -> (u16, String) {
    let mut s = std::os::unix::net::UnixStream::connect(api_socket::path(dir)).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (
        head.split(' ').nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
}

#[test]
fn the_tcp_listener_serves_probes_and_metrics_and_refuses_the_rest() {
    let fake = Arc::new(Fake::default());
    fake.ready.store(true, Ordering::SeqCst);
    let s = start(Arc::clone(&fake));
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(get(s.probes, path).0, 200, "{path}");
    }
    for path in [
        "/debug/state",
        "/debug/journal",
        "/debug/events",
        "/debug/health",
        "/v1/pods/p1/volumes",
        "/v1/pods/p1/volumes?wait=30",
        "/v1/pods/p1/volumes?unmounted=1&wait=30",
    ] {
        let asked = std::time::Instant::now();
        let (status, body) = get(s.probes, path);
        assert_eq!(status, 403, "{path}: {body}");
        assert!(body.contains("api.sock"), "says where to ask: {body}");
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{path}: not waited"
        );
    }
    assert!(
        fake.asked.lock().unwrap().is_empty(),
        "the journal was not read"
    );
    assert_eq!(get(s.probes, "/nope").0, 404);
    // the socket and the debug listener serve everything
    assert_eq!(unix_get(s.dir.path(), "/debug/state").0, 200);
    assert_eq!(unix_get(s.dir.path(), "/metrics").0, 200);
    assert_eq!(get(s.addr, "/debug/state").0, 200);
}

/// A provider whose pod is never ready, with a change counter: every
/// `wait` long-polls until its time is up.
struct NeverReady {
    changes: tokio::sync::watch::Sender<u64>,
}

impl DebugProvider for NeverReady {
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
    fn metrics_text(&self) -> String {
        String::new()
    }
    fn state(&self) -> StateSnapshot {
        StateSnapshot::default()
    }
    fn journal(&self, _: Option<&str>) -> Result<DumpDoc, String> {
        Err("none".to_owned())
    }
    fn pod_volumes(&self, pod: &crate::model::PodUid) -> Option<crate::runtime::PodVolumes> {
        Some(crate::runtime::PodVolumes {
            pod_uid: pod.to_string(),
            ready: false,
            volumes: Vec::new(),
            errors: vec!["unmounted volumes=[data]".to_owned()],
            supplemental_groups: Vec::new(),
        })
    }
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.changes.subscribe())
    }
}

/// TCP clients hold every long-poll slot they can get (the debug
/// listener's, all of them) and knock on `--listen`: a runtime on the
/// socket still gets its long-poll, which lasts its wait.
#[test]
fn tcp_clients_never_take_the_socket_s_long_poll_slots() {
    let provider = Arc::new(NeverReady {
        changes: tokio::sync::watch::Sender::new(0),
    });
    let s = start_with(provider);
    let request = "GET /v1/pods/p1/volumes?wait=120 HTTP/1.1\r\nHost: x\r\n\r\n";
    // one more than the slots, none ever done: exactly one is turned away
    let mut held = Vec::new();
    for _ in 0..=runtime_api::MAX_LONG_POLLS {
        let mut c = std::net::TcpStream::connect_timeout(&s.addr, T).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        c.set_nonblocking(true).unwrap();
        held.push(c);
    }
    let deadline = std::time::Instant::now() + T;
    let turned_away = loop {
        let mut buf = [0u8; 64];
        let answered: Vec<String> = held
            .iter_mut()
            .filter_map(|c| match c.read(&mut buf) {
                Ok(n) if n > 0 => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
                _ => None,
            })
            .collect();
        if !answered.is_empty() {
            break answered;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no debug long-poll turned away"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(turned_away.len(), 1, "{turned_away:?}");
    assert!(
        turned_away[0].starts_with("HTTP/1.1 503"),
        "{turned_away:?}"
    );
    // and on --listen a long-poll is refused outright
    for _ in 0..8 {
        assert_eq!(get(s.probes, "/v1/pods/p1/volumes?wait=120").0, 403);
    }
    let asked = std::time::Instant::now();
    let (status, body) = unix_get(s.dir.path(), "/v1/pods/p1/volumes?wait=1");
    assert_eq!(status, 200, "the socket's slots are its own: {body}");
    assert!(body.contains("\"ready\": false"), "{body}");
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "it long-polled its whole wait"
    );
    drop(held);
}

/// [`NeverReady`] that keeps what the server tells of its long-polls.
struct Counting {
    inner: NeverReady,
    told: Mutex<Vec<LongPollsWaiting>>,
}

impl DebugProvider for Counting {
    fn ready(&self) -> Result<(), String> {
        self.inner.ready()
    }
    fn metrics_text(&self) -> String {
        self.inner.metrics_text()
    }
    fn state(&self) -> StateSnapshot {
        self.inner.state()
    }
    fn journal(&self, v: Option<&str>) -> Result<DumpDoc, String> {
        self.inner.journal(v)
    }
    fn pod_volumes(&self, pod: &crate::model::PodUid) -> Option<crate::runtime::PodVolumes> {
        self.inner.pod_volumes(pod)
    }
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.changes()
    }
    fn long_polls_waiting(&self, waiting: LongPollsWaiting) {
        self.told.lock().unwrap().push(waiting);
    }
}

/// The socket's long-polls waiting now, as `/metrics` tells the provider.
fn socket_waiting(s: &Running, p: &Counting) -> usize {
    assert_eq!(get(s.probes, "/metrics").0, 200);
    p.told.lock().unwrap().last().map_or(0, |w| w.socket)
}

/// Waits (bounded) until `/metrics` tells `n` long-polls on the socket.
fn until_socket_waiting(s: &Running, p: &Counting, n: usize, what: &str) {
    let deadline = std::time::Instant::now() + T;
    loop {
        let now = socket_waiting(s, p);
        if now == n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {now} long-polls waiting, not {n}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `n` long-polls on the socket at once, each on its own connection with
/// its request sent.
fn socket_waiters(s: &Running, n: usize, wait: u64) -> Vec<std::os::unix::net::UnixStream> {
    (0..n)
        .map(|_| {
            let mut c = std::os::unix::net::UnixStream::connect(api_socket::path(s.dir.path()))
                .unwrap();
            c.set_read_timeout(Some(T)).unwrap();
            write!(
                c,
                "GET /v1/pods/p1/volumes?wait={wait} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            c
        })
        .collect()
}

/// Every waiter's status line.
fn statuses(waiters: Vec<std::os::unix::net::UnixStream>) -> Vec<String> {
    waiters
        .into_iter()
        .map(|mut c| {
            let mut raw = String::new();
            let _ = c.read_to_string(&mut raw);
            raw.lines().next().unwrap_or_default().to_owned()
        })
        .collect()
}

/// Waiters that time out, that their client abandons mid-wait, and that
/// shutdown answers all give their long-poll slot back: after more of
/// them than there are slots, every slot can be taken again, and the
/// server has none taken when it stops. A real server on a real unix
/// socket; the provider is a double (a pod never ready), as the slots are
/// the server's alone.
#[test]
fn long_poll_slots_come_back_from_timeouts_abandoned_waits_and_shutdown() {
    use runtime_api::MAX_LONG_POLLS;
    let provider = Arc::new(Counting {
        inner: NeverReady {
            changes: tokio::sync::watch::Sender::new(0),
        },
        told: Mutex::new(Vec::new()),
    });
    let mut s = start_with(provider.clone());
    assert_eq!(socket_waiting(&s, &provider), 0);

    // every slot taken by waits that time out: all answered 200
    let waiters = socket_waiters(&s, MAX_LONG_POLLS, 1);
    let got = statuses(waiters);
    assert!(
        got.iter().all(|l| l.starts_with("HTTP/1.1 200")),
        "{:?}",
        got.iter().find(|l| !l.starts_with("HTTP/1.1 200"))
    );
    until_socket_waiting(&s, &provider, 0, "after the timeouts");

    // every slot taken by waits of an hour, then the clients go
    let waiters = socket_waiters(&s, MAX_LONG_POLLS, 3600);
    until_socket_waiting(&s, &provider, MAX_LONG_POLLS, "every slot taken");
    drop(waiters);
    until_socket_waiting(&s, &provider, 0, "after the clients went");

    // so every slot can be taken again: one more is turned away
    let waiters = socket_waiters(&s, MAX_LONG_POLLS, 3600);
    until_socket_waiting(&s, &provider, MAX_LONG_POLLS, "every slot taken again");
    let (status, body) = unix_get(s.dir.path(), "/v1/pods/p1/volumes?wait=1");
    assert_eq!(status, 503, "{body}");

    // shutdown answers them all and leaves no slot taken
    s.shut_down().expect("the server stops");
    let got = statuses(waiters);
    assert!(
        got.iter().all(|l| l.starts_with("HTTP/1.1 200")),
        "{:?}",
        got.iter().find(|l| !l.starts_with("HTTP/1.1 200"))
    );
    assert_eq!(
        provider.told.lock().unwrap().last(),
        Some(&LongPollsWaiting::default()),
        "none taken once stopped"
    );
}
