//! The service manager's notify protocol (sd_notify(3)), written here rather
//! than linked from libsystemd: one datagram of `KEY=VALUE` lines to the
//! unix socket `$NOTIFY_SOCKET` names (a path, or `@name` in the abstract
//! namespace). volumed sends `READY=1` once reconstruction is done and
//! `/readyz` answers 200, `STOPPING=1` when a graceful stop begins,
//! `STATUS=` lines for its startup phases and, when `$WATCHDOG_USEC` is
//! set for this process, `WATCHDOG=1` at half that interval — but only
//! while the reconciler loop is alive ([`Heartbeat`]): a loop stuck in a
//! step stops the pings and lets the service manager restart the daemon,
//! which then reconstructs from the journal.
//!
//! Without `$NOTIFY_SOCKET` every call is a no-op, so the daemon runs the
//! same under a shell, a container runtime or systemd. `vsock:` addresses
//! (VM guests) are not supported: a node daemon's manager is local.

use std::ffi::{OsStr, OsString};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The variable naming the notify socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
/// The watchdog interval in microseconds, when the manager enables it.
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
/// The pid the watchdog variables are meant for (unset: the main process).
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// What failed while talking to the service manager.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `$NOTIFY_SOCKET` is set but names no address we can send to
    #[error("NOTIFY_SOCKET {value:?}: {why}")]
    Address {
        /// the variable's value
        value: OsString,
        /// what is wrong with it
        why: &'static str,
    },
    /// the abstract or path address could not be formed
    #[error("NOTIFY_SOCKET {value:?}: {cause}")]
    BadAddress {
        /// the variable's value
        value: OsString,
        /// the cause
        cause: std::io::Error,
    },
    /// the datagram socket could not be created
    #[error("create the notify socket: {0}")]
    Socket(std::io::Error),
    /// sending one message failed
    #[error("send {message:?} to the service manager: {cause}")]
    Send {
        /// the first line of what was sent
        message: String,
        /// the cause
        cause: std::io::Error,
    },
}

/// Where notifications go, parsed from `$NOTIFY_SOCKET`'s value: a path,
/// or `@name` for an abstract-namespace socket (the leading `@` stands for
/// the NUL byte the kernel expects, as sd_notify(3) documents).
pub fn parse_address(value: &OsStr) -> Result<SocketAddr, NotifyError> {
    let bytes = value.as_bytes();
    let bad = |why| NotifyError::Address {
        value: value.to_owned(),
        why,
    };
    let formed = |r: std::io::Result<SocketAddr>| {
        r.map_err(|cause| NotifyError::BadAddress {
            value: value.to_owned(),
            cause,
        })
    };
    match bytes.first() {
        None => Err(bad("empty")),
        Some(b'@') if bytes.len() == 1 => Err(bad("an abstract address needs a name after @")),
        Some(b'@') => formed(SocketAddr::from_abstract_name(&bytes[1..])),
        Some(b'/') => formed(SocketAddr::from_pathname(value)),
        Some(_) if bytes.starts_with(b"vsock:") => Err(bad("vsock addresses are not supported")),
        Some(_) => Err(bad("neither an absolute path nor an @abstract name")),
    }
}

/// The watchdog ping period the manager asks of *this* process, from the
/// values of `$WATCHDOG_USEC` and `$WATCHDOG_PID`: half the interval, as
/// sd_watchdog_enabled(3) recommends. `None` when the watchdog is off, the
/// interval is not a positive number, or the variables name another pid.
pub fn watchdog_period(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|u| *u > 0)?;
    if let Some(pid) = pid {
        let pid: u32 = pid.trim().parse().ok()?;
        if pid != me {
            return None;
        }
    }
    Some(Duration::from_micros(usec) / 2)
}

/// A connection to the service manager's notify socket, or none.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET`; a no-op notifier when it is unset.
    pub fn from_env() -> Result<Notifier, NotifyError> {
        match std::env::var_os(NOTIFY_SOCKET) {
            None => Ok(Notifier::none()),
            Some(v) => Notifier::to(&v),
        }
    }

    /// A notifier that sends nothing.
    pub fn none() -> Notifier {
        Notifier { target: None }
    }

    /// A notifier sending to the socket `value` names.
    pub fn to(value: &OsStr) -> Result<Notifier, NotifyError> {
        let addr = parse_address(value)?;
        let sock = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        Ok(Notifier {
            target: Some((sock, addr)),
        })
    }

    /// Whether a service manager listens (`$NOTIFY_SOCKET` was set).
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `state` (newline-separated `KEY=VALUE` lines) as one datagram.
    pub fn send(&self, state: &str) -> Result<(), NotifyError> {
        let Some((sock, addr)) = &self.target else {
            return Ok(());
        };
        sock.send_to_addr(state.as_bytes(), addr)
            .map(|_| ())
            .map_err(|cause| NotifyError::Send {
                message: state.lines().next().unwrap_or_default().to_owned(),
                cause,
            })
    }

    /// [`Notifier::send`], a failure logged: the service manager going away
    /// must never stop the daemon.
    pub fn send_or_log(&self, state: &str) {
        if let Err(e) = self.send(state) {
            tracing::warn!(error = %e, "sd_notify");
        }
    }
}

/// `STATUS=` with `text` on one line (a newline would start a new key).
pub fn status(text: &str) -> String {
    format!("STATUS={}", text.replace('\n', " "))
}

/// The reconciler loop's pulse, read by the watchdog and the readiness
/// wait. The loop marks when it starts handling a wake and when it goes
/// back to waiting; an idle loop is healthy (it wakes at least every
/// resync), a loop that has been inside one wake for longer than the
/// watchdog allows is stuck, and a loop that ended (or panicked) is dead.
#[derive(Debug)]
pub struct Heartbeat {
    origin: Instant,
    /// 0 while waiting for an event; else 1 + the millis since `origin`
    /// at which the current wake began
    busy_since: AtomicU64,
    ended: AtomicBool,
    ready: Mutex<bool>,
    ready_cv: Condvar,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            origin: Instant::now(),
            busy_since: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            ready: Mutex::new(false),
            ready_cv: Condvar::new(),
        }
    }
}

impl Heartbeat {
    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }

    /// The loop took a wake at `now` (events or a deadline).
    pub fn busy(&self, now: Instant) {
        let m = self.millis(now).saturating_add(1);
        self.busy_since.store(m, Ordering::SeqCst);
    }

    /// The loop is back to waiting for its next event.
    pub fn idle(&self) {
        self.busy_since.store(0, Ordering::SeqCst);
    }

    /// The loop returned or unwound: nothing will wake it again.
    pub fn ended(&self) {
        self.ended.store(true, Ordering::SeqCst);
        // a readiness waiter must not wait for a loop that is gone
        self.ready_cv.notify_all();
    }

    /// Whether the loop is alive at `now`: not ended, and idle or inside
    /// its current wake for less than `stuck_after`.
    pub fn alive(&self, now: Instant, stuck_after: Duration) -> bool {
        if self.ended.load(Ordering::SeqCst) {
            return false;
        }
        match self.busy_since.load(Ordering::SeqCst) {
            0 => true,
            m => {
                let since = Duration::from_millis(m - 1);
                now.saturating_duration_since(self.origin)
                    .saturating_sub(since)
                    < stuck_after
            }
        }
    }

    /// Every pod source has been listed: `/readyz` answers 200 from now on.
    pub fn set_ready(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.ready_cv.notify_all();
    }

    /// Waits up to `timeout` for readiness; whether it came (false also
    /// when the loop ended first).
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let (ready, _) = self
            .ready_cv
            .wait_timeout_while(ready, timeout, |r| {
                !*r && !self.ended.load(Ordering::SeqCst)
            })
            .unwrap_or_else(|p| p.into_inner());
        *ready
    }
}

/// Marks the heartbeat ended when dropped: the loop's thread holds one, so
/// a panic ends the pings as a return does.
#[derive(Debug)]
pub struct EndOnDrop(
    /// the loop's heartbeat
    pub std::sync::Arc<Heartbeat>,
);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.ended();
    }
}

/// Where the service stands, as the manager was told: `READY=1` is never
/// sent after `STOPPING=1`, nor twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Starting,
    Ready,
    Stopping,
}

/// The daemon's side of the protocol: what it tells the manager, and the
/// thread that says `READY=1` once the loop is ready, then pings the
/// watchdog while the loop is alive.
#[derive(Debug)]
pub struct Service {
    notifier: Notifier,
    told: Mutex<Told>,
}

impl Service {
    /// Over `notifier` (a no-op one when no manager listens).
    pub fn new(notifier: Notifier) -> Service {
        Service {
            notifier,
            told: Mutex::new(Told::Starting),
        }
    }

    /// A `STATUS=` line (a startup phase), unless stopping has begun.
    pub fn status(&self, text: &str) {
        let told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        if *told != Told::Stopping {
            self.notifier.send_or_log(&status(text));
        }
    }

    /// `READY=1`, once, and never after `STOPPING=1`; whether it was sent.
    pub fn ready(&self, text: &str) -> bool {
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        if *told != Told::Starting {
            return false;
        }
        *told = Told::Ready;
        self.notifier
            .send_or_log(&format!("READY=1\n{}", status(text)));
        true
    }

    /// `STOPPING=1`: a graceful stop has begun.
    pub fn stopping(&self, text: &str) {
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        *told = Told::Stopping;
        self.notifier
            .send_or_log(&format!("STOPPING=1\n{}", status(text)));
    }

    fn is_stopping(&self) -> bool {
        *self.told.lock().unwrap_or_else(|p| p.into_inner()) == Told::Stopping
    }

    /// Starts the thread that waits for `heartbeat`'s readiness, sends
    /// `READY=1` (with `ready_text`), then, when `watchdog` is a ping
    /// period, sends `WATCHDOG=1` each period while the loop is alive
    /// (stuck for a whole watchdog interval, twice the period, it is not).
    /// Once stopping, pings go on whatever the loop does: the manager may
    /// keep the watchdog armed while the service deactivates, and the
    /// stop's own timeout (TimeoutStopSec) bounds a stop that hangs.
    pub fn spawn(
        self: &std::sync::Arc<Self>,
        heartbeat: std::sync::Arc<Heartbeat>,
        watchdog: Option<Duration>,
        ready_text: String,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("volumed-notify".into())
            .spawn(move || me.watch(&heartbeat, watchdog, &ready_text))
    }

    fn watch(&self, heartbeat: &Heartbeat, watchdog: Option<Duration>, ready_text: &str) {
        // short waits, so a stop before readiness ends the thread
        while !heartbeat.wait_ready(Duration::from_millis(200)) {
            if self.is_stopping() || heartbeat.ended.load(Ordering::SeqCst) {
                return;
            }
        }
        self.ready(ready_text);
        let Some(period) = watchdog else {
            return;
        };
        let stuck_after = period.saturating_mul(2);
        let mut silent = false;
        loop {
            if self.is_stopping() || heartbeat.alive(Instant::now(), stuck_after) {
                self.notifier.send_or_log("WATCHDOG=1");
                silent = false;
            } else if !silent {
                silent = true;
                tracing::error!(
                    ?stuck_after,
                    "the reconciler loop is stuck or gone: watchdog pings stop, the service manager will restart volumed"
                );
            }
            std::thread::sleep(period);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn recv(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_path_address_receives_the_datagram() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::to(path.as_os_str()).unwrap();
        assert!(n.enabled());
        n.send("READY=1\nSTATUS=ready").unwrap();
        assert_eq!(recv(&sock), "READY=1\nSTATUS=ready");
    }

    #[test]
    fn an_abstract_address_receives_the_datagram() {
        let name = format!("volumed-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        let n = Notifier::to(OsStr::new(&format!("@{name}"))).unwrap();
        n.send("WATCHDOG=1").unwrap();
        assert_eq!(recv(&sock), "WATCHDOG=1");
    }

    #[test]
    fn bad_addresses_are_named_errors_and_unset_is_a_no_op() {
        for bad in ["", "@", "relative/path", "vsock:2:1234"] {
            let e = parse_address(OsStr::new(bad)).unwrap_err();
            assert!(e.to_string().contains("NOTIFY_SOCKET"), "{bad}: {e}");
        }
        let n = Notifier::none();
        assert!(!n.enabled());
        n.send("READY=1").unwrap();
    }

    #[test]
    fn a_send_to_a_missing_socket_fails_with_the_message() {
        let dir = tempfile::tempdir().unwrap();
        let n = Notifier::to(dir.path().join("gone.sock").as_os_str()).unwrap();
        let e = n.send("STOPPING=1\nSTATUS=x").unwrap_err();
        assert!(e.to_string().contains("\"STOPPING=1\""), "{e}");
    }

    #[test]
    fn the_watchdog_period_is_half_the_interval_for_this_pid_only() {
        let me = 4242;
        let check = |usec, pid, want: Option<u64>| {
            assert_eq!(
                watchdog_period(usec, pid, me),
                want.map(Duration::from_millis),
                "{usec:?} {pid:?}"
            );
        };
        check(Some("2000000"), None, Some(1000));
        check(Some("2000000"), Some("4242"), Some(1000));
        check(Some("2000000"), Some("1"), None);
        check(Some("2000000"), Some("x"), None);
        check(Some("0"), None, None);
        check(Some("-5"), None, None);
        check(Some("soon"), None, None);
        check(None, Some("4242"), None);
    }

    #[test]
    fn status_stays_on_one_line() {
        assert_eq!(status("a\nb"), "STATUS=a b");
    }

    #[test]
    fn the_heartbeat_is_alive_idle_or_briefly_busy_and_dead_when_stuck_or_ended() {
        let h = Heartbeat::default();
        let t0 = Instant::now();
        let limit = Duration::from_secs(10);
        assert!(h.alive(t0, limit), "idle from the start");
        h.busy(t0);
        assert!(h.alive(t0 + Duration::from_secs(9), limit));
        assert!(!h.alive(t0 + Duration::from_secs(11), limit), "stuck");
        h.idle();
        assert!(h.alive(t0 + Duration::from_secs(60), limit), "idle again");
        let h = Arc::new(h);
        drop(EndOnDrop(h.clone()));
        assert!(!h.alive(t0, limit), "ended");
    }

    #[test]
    fn readiness_wakes_a_waiter_and_an_ended_loop_releases_it_unready() {
        let h = Arc::new(Heartbeat::default());
        assert!(!h.wait_ready(Duration::from_millis(10)));
        let h2 = h.clone();
        let t = std::thread::spawn(move || h2.wait_ready(Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        h.set_ready();
        assert!(t.join().unwrap());

        let h = Arc::new(Heartbeat::default());
        let h2 = h.clone();
        let t = std::thread::spawn(move || h2.wait_ready(Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        h.ended();
        assert!(!t.join().unwrap());
    }

    /// Every datagram that arrives within `within` of the call (a total
    /// deadline: pings keep coming).
    fn drain(sock: &UnixDatagram, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return out;
            }
            sock.set_read_timeout(Some(left)).unwrap();
            match sock.recv(&mut buf) {
                Ok(n) => out.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(_) => return out,
            }
        }
    }

    #[test]
    fn the_service_says_ready_once_then_pings_only_while_the_loop_is_alive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        let service = Arc::new(Service::new(Notifier::to(path.as_os_str()).unwrap()));
        let beat = Arc::new(Heartbeat::default());
        let period = Duration::from_millis(40);
        service
            .spawn(beat.clone(), Some(period), "ready".into())
            .unwrap();
        service.status("reconstructing");
        assert_eq!(
            drain(&sock, Duration::from_millis(200)),
            ["STATUS=reconstructing"],
            "no READY=1 and no ping before the loop is ready"
        );
        beat.set_ready();
        let got = drain(&sock, Duration::from_millis(200));
        assert_eq!(
            got.first().map(String::as_str),
            Some("READY=1\nSTATUS=ready")
        );
        assert!(
            got[1..].iter().all(|m| m == "WATCHDOG=1") && got.len() > 2,
            "{got:?}"
        );
        // the loop takes a wake and never comes back: within two periods
        // the pings stop
        beat.busy(Instant::now());
        drain(&sock, period * 3);
        assert_eq!(
            drain(&sock, period * 4),
            Vec::<String>::new(),
            "stuck loop, no pings"
        );
        // a graceful stop pings again whatever the loop does
        service.stopping("stopping");
        let got = drain(&sock, Duration::from_millis(200));
        assert_eq!(
            got.first().map(String::as_str),
            Some("STOPPING=1\nSTATUS=stopping")
        );
        assert!(got[1..].contains(&"WATCHDOG=1".to_owned()), "{got:?}");
        assert!(!service.ready("again"), "never READY=1 after STOPPING=1");
    }

    #[test]
    fn a_stop_before_readiness_ends_the_thread_without_ready() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        let service = Arc::new(Service::new(Notifier::to(path.as_os_str()).unwrap()));
        let beat = Arc::new(Heartbeat::default());
        let t = service
            .spawn(
                beat.clone(),
                Some(Duration::from_millis(10)),
                "ready".into(),
            )
            .unwrap();
        service.stopping("stopping");
        t.join().unwrap();
        beat.set_ready();
        assert_eq!(
            drain(&sock, Duration::from_millis(100)),
            ["STOPPING=1\nSTATUS=stopping"]
        );
    }
}
