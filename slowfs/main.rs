//! `volumed-slowfs`: a FUSE passthrough with an adjustable latency, the
//! slow journal disk of the nemesis soak (`tests/soak.rs`).
//!
//! `volumed-slowfs --backing DIR --mountpoint DIR --delay-file FILE` serves
//! the tree at `--backing` on `--mountpoint` (mounted with mount(2)
//! directly: run as root, no fusermount). A thread re-reads `--delay-file`
//! every 100 ms: a number of milliseconds (missing or empty: 0); write
//! (the kernel's writeback of cached writes), fsync, fsyncdir, flush,
//! create, rename and a truncating setattr each sleep that long before
//! doing their work (`fs.rs` says which are not slowed, and why). It prints `ready` once mounted; on SIGTERM or SIGINT
//! it unmounts (lazily if the mount is still in use) and exits 0; when the
//! mount goes away under it (`umount -l`) it exits 0 too.
//!
//! A request the kernel has handed to a FUSE server is waited for even by
//! a SIGKILLed caller (only one not yet read is abandoned), and so is the
//! flush each close sends as the killed process exits: a daemon killed in
//! a slow fsync exits once the delays are over, one for the request and
//! one per file it had open here. The delay is bounded, so the wait is.
//!
//! Test support, not a product: it is built with the package so tests can
//! find it through `CARGO_BIN_EXE_volumed-slowfs`
//! (`tests/support/slowfs.rs`).

mod fs;
mod nodes;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use fuser::{Config, MountOption, Session};
use nix::errno::Errno;
use nix::mount::{MntFlags, umount2};
use nix::sys::signal::{SigSet, Signal};

/// How often the delay file is read again.
const DELAY_POLL: Duration = Duration::from_millis(100);
/// Threads serving requests: a request sleeping its delay holds one, and
/// the others go on serving (a socket lookup never waits for a flush).
const THREADS: usize = 16;

#[derive(Parser, Debug)]
#[command(
    name = "volumed-slowfs",
    about = "A FUSE passthrough whose writes and syncs wait a delay read from a file, for tests"
)]
struct Args {
    /// The directory whose tree is served.
    #[arg(long)]
    backing: PathBuf,
    /// Where to mount it.
    #[arg(long)]
    mountpoint: PathBuf,
    /// A file holding the delay in milliseconds (missing or empty: 0).
    #[arg(long)]
    delay_file: PathBuf,
}

/// The delay a delay file's text asks for, in milliseconds: a plain
/// number, surrounding whitespace ignored, empty meaning 0.
fn parse_delay(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(0);
    }
    t.parse::<u64>()
        .map_err(|e| format!("{t:?} is not a number of milliseconds: {e}"))
}

/// The delay `file` asks for now (missing: 0); a bad one is reported and
/// keeps `last`.
fn read_delay(file: &Path, last: u64) -> u64 {
    match std::fs::read_to_string(file) {
        Ok(text) => parse_delay(&text).unwrap_or_else(|why| {
            eprintln!("volumed-slowfs: {}: {why}", file.display());
            last
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => {
            eprintln!("volumed-slowfs: read {}: {e}", file.display());
            last
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    // Before any thread exists: every thread inherits the mask, and only
    // the signal thread's sigwait takes SIGTERM and SIGINT.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block().context("block SIGTERM and SIGINT")?;
    // modes come masked by the kernel already, with the caller's umask
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());

    let delay = Arc::new(AtomicU64::new(read_delay(&args.delay_file, 0)));
    {
        let (delay, file) = (Arc::clone(&delay), args.delay_file.clone());
        std::thread::Builder::new()
            .name("delay-file".into())
            .spawn(move || {
                loop {
                    let last = delay.load(Ordering::Relaxed);
                    delay.store(read_delay(&file, last), Ordering::Relaxed);
                    std::thread::sleep(DELAY_POLL);
                }
            })
            .context("start the delay file's thread")?;
    }

    let filesystem = fs::SlowFs::new(&args.backing, delay)
        .with_context(|| format!("open the backing dir {}", args.backing.display()))?;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("volumed-slowfs".into()),
        MountOption::Subtype("slowfs".into()),
        MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(THREADS);
    let session = Session::new(filesystem, &args.mountpoint, &config)
        .with_context(|| format!("mount FUSE on {}", args.mountpoint.display()))?;
    let background = session.spawn().context("start serving")?;
    println!("ready");
    std::io::stdout().flush().context("print ready")?;

    let mountpoint = args.mountpoint.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let signal = signals.wait();
            eprintln!(
                "volumed-slowfs: {signal:?}: unmounting {}",
                mountpoint.display()
            );
            match umount2(&mountpoint, MntFlags::empty()) {
                // the session sees the connection end and main returns
                Ok(()) => {}
                Err(Errno::EBUSY) => {
                    // still in use: detached, its users get ENOTCONN once
                    // this process is gone
                    let _ = umount2(&mountpoint, MntFlags::MNT_DETACH);
                    std::process::exit(0);
                }
                Err(e) => {
                    eprintln!("volumed-slowfs: unmount {}: {e}", mountpoint.display());
                    std::process::exit(1);
                }
            }
        })
        .context("start the signal thread")?;

    // returns once the kernel ends the connection: unmounted by the signal
    // thread or by someone else
    background
        .join()
        .map_err(|e| anyhow!("serving {}: {e}", args.mountpoint.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_file_holds_a_plain_number_of_milliseconds() {
        let cases: [(&str, Result<u64, ()>); 7] = [
            ("", Ok(0)),
            ("\n", Ok(0)),
            ("0", Ok(0)),
            ("250\n", Ok(250)),
            ("  40 ", Ok(40)),
            ("-5", Err(())),
            ("20ms", Err(())),
        ];
        for (text, want) in cases {
            assert_eq!(parse_delay(text).map_err(|_| ()), want, "{text:?}");
        }
    }

    #[test]
    fn a_missing_delay_file_is_no_delay_and_a_bad_one_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("delay");
        assert_eq!(read_delay(&file, 70), 0);
        std::fs::write(&file, "oops").unwrap();
        assert_eq!(read_delay(&file, 70), 70);
        std::fs::write(&file, "300").unwrap();
        assert_eq!(read_delay(&file, 70), 300);
    }
}
