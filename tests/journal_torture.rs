//! A tortured journal (issue 18, item 2): one real journal, written by the
//! daemon's writer API (`torture/golden.rs`), is copied and damaged many
//! ways, and each copy is opened in-process exactly as the daemon opens it
//! (`Journal::open` with `JournalConfig::new`, the same boot), then opened
//! again as the next start would.
//!
//! Kinds of damage:
//! - `flip`: one byte XOR 0xff at an offset of one of the journal's files
//!   (sled's `conf`, `db`, anything under `blobs/` or `snap.*`, and our
//!   `acked` and `checkpoint`); every byte of a file up to `VOLUMED_TORTURE_SAMPLE` bytes,
//!   past that a seeded sample of that many offsets plus every record
//!   envelope's first, middle and last byte;
//! - `truncate`: a file cut at every record envelope's start, middle and end
//!   (the same cap), and at every length of a small file;
//! - `zero`: each whole 4 KiB page of a file zeroed (a small file: all of it);
//! - `value`: through sled, one byte of a record envelope or a meta value
//!   flipped, or an envelope cut short (damage sled's own checksums cannot
//!   see, so the journal's envelope must; the checkpoint file, which no
//!   checksum of sled's covers, gets the file damage above).
//!
//! The invariant, per case:
//! (a) nothing panics (a panic hook counts panics on every thread; a sled
//!     panic contained at the journal's open edge is allowed and counted);
//! (b) `open` succeeds, or fails with `JournalError::Corrupt`/`NewerSchema`
//!     naming the journal dir and where it was moved;
//! (c) on success every record before the damage is replayed exactly as
//!     written: either the whole undamaged replay (checkpoint, tail and
//!     state), or, when replay stopped at a value that failed verification
//!     (sequence number s), exactly the undamaged records before s on top of
//!     the undamaged checkpoint; never a silent shortfall;
//! (d) nothing is invented: every replayed record equals one that was
//!     written, and the state names no target that was never written;
//! (e) what cannot be read is kept, never deleted: a journal moved aside is
//!     the only new dir beside it and holds every file of the damaged copy
//!     byte for byte (sled's under `as-found/`, since sled's recovery zeroes
//!     a damaged log's tail before it reports anything) and a note saying
//!     why; a `conf` or `snap.*` sled refused is moved aside alone, byte for
//!     byte, and the journal replays whole; a quarantined record is in the
//!     `quarantine` tree; an inspection (`dump`) that refuses a copy leaves
//!     every file as it was (checked on every 4th case);
//! (f) no crash loop: the next open succeeds (a fresh journal after a move
//!     aside) and reports no damage a second time.
//!
//! `VOLUMED_TORTURE_SAMPLE=N` (default 32) caps the per-file offsets,
//! `all` makes it exhaustive; `VOLUMED_TORTURE_SEED` picks the sample (the
//! seed used is printed). Sizes on the 2-core VM, debug build: the default
//! is 671 cases in 20-40 s; `VOLUMED_TORTURE_SAMPLE=512` is 6,181 cases in
//! about 8 minutes; `all` is about 560,000 cases (every byte of a
//! 512 KiB `db` and of a 14 KB checkpoint), about 5 hours. By hand:
//! `VOLUMED_TORTURE_SAMPLE=512 VOLUMED_TORTURE_SEED=7 cargo test --test journal_torture -- --nocapture`.
#![allow(clippy::tests_outside_test_module)] // integration tests live outside `mod tests` by design

#[path = "torture/golden.rs"]
mod golden;

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use volumed::journal::{Journal, JournalConfig, JournalError, JournalState, Replay};

const PAGE: usize = 4096;

/// Every panic on any thread of this process, as `thread: message`.
fn panics() -> &'static Mutex<Vec<String>> {
    static PANICS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    PANICS.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("?").to_owned();
            if let Ok(mut p) = panics().lock() {
                p.push(format!("{thread}: {info}"));
            }
            previous(info);
        }));
        Mutex::new(Vec::new())
    })
}

/// Per file: how many moved-aside copies sled had changed before the move.
fn rewritten() -> &'static Mutex<BTreeMap<PathBuf, usize>> {
    static REWRITTEN: OnceLock<Mutex<BTreeMap<PathBuf, usize>>> = OnceLock::new();
    REWRITTEN.get_or_init(Default::default)
}

fn panic_count() -> usize {
    panics().lock().map(|p| p.len()).unwrap_or(0)
}

fn cfg(dir: &Path) -> JournalConfig {
    JournalConfig::new(dir, golden::NODE, golden::BOOT)
}

/// splitmix64: a seeded sample needs no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }
}

/// Opens sled directly (to damage values or read the quarantine), waiting
/// for a lock a just-dropped journal's background threads still hold.
fn open_sled(dir: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::open(dir) {
            Ok(db) => return db,
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => panic!("open sled at {}: {e}", dir.display()),
        }
    }
}

/// Every regular file under `dir`, by path relative to it.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn write_files(dir: &Path, files: &BTreeMap<PathBuf, Vec<u8>>) {
    for (rel, bytes) in files {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
}

/// Where record envelopes (`VMDJ`, then a length at 16) sit in a file:
/// (start, end) of each whole one.
fn envelopes(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for i in 0..bytes.len().saturating_sub(24) {
        if &bytes[i..i + 4] == b"VMDJ" {
            let n = u32::from_le_bytes(bytes[i + 16..i + 20].try_into().unwrap()) as usize;
            let end = i + 24 + n;
            if end <= bytes.len() {
                out.push((i, end));
            }
        }
    }
    out
}

/// The undamaged journal: its files, what its replay is, what was written.
struct Golden {
    files: BTreeMap<PathBuf, Vec<u8>>,
    replay: Replay,
    /// the state the replay implies
    state: JournalState,
    written: golden::Written,
}

#[derive(Debug, Clone)]
enum Damage {
    Flip(PathBuf, usize),
    Truncate(PathBuf, usize),
    Zero(PathBuf, usize),
    /// (tree, key, byte to flip, or None: cut the value at `cut`)
    Value(&'static str, Vec<u8>, Option<usize>, usize),
}

impl Damage {
    fn kind(&self) -> String {
        match self {
            Damage::Flip(f, _) => format!("flip {}", f.display()),
            Damage::Truncate(f, _) => format!("truncate {}", f.display()),
            Damage::Zero(f, _) => format!("zero page {}", f.display()),
            Damage::Value(t, _, Some(_), _) => format!("flip value {t}"),
            Damage::Value(t, _, None, _) => format!("cut value {t}"),
        }
    }
}

/// What the open did with a damaged copy (the invariant held).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// everything replayed as written (the damage hit nothing that matters)
    Intact,
    /// replay stopped at a bad value; it and the rest were quarantined
    Quarantined,
    /// the journal was moved aside; a fresh one was created
    MovedAside,
    /// moved aside after sled panicked (contained at the open edge)
    MovedAsideSledPanicked,
    /// sled refused its damaged conf or snapshot: they were moved aside,
    /// the journal replayed from its log
    DerivedMovedAside,
}

fn plan(g: &Golden, sample: Option<usize>, rng: &mut Rng) -> Vec<Damage> {
    let mut out = Vec::new();
    // Offsets 0..len, or the sample plus `extra` when the file is larger.
    let pick = |rng: &mut Rng, len: usize, extra: &[usize]| -> Vec<usize> {
        match sample {
            Some(n) if len > n => {
                let mut s: BTreeSet<usize> = (0..n).map(|_| rng.below(len)).collect();
                s.extend(extra.iter().copied().filter(|&o| o < len));
                s.into_iter().collect()
            }
            _ => (0..len).collect(),
        }
    };
    for (rel, bytes) in &g.files {
        let len = bytes.len();
        let mut marks: Vec<usize> = envelopes(bytes)
            .iter()
            .flat_map(|&(s, e)| [s, (s + e) / 2, e - 1])
            .collect();
        if let Some(n) = sample {
            marks = (0..n.min(marks.len()))
                .map(|_| marks[rng.below(marks.len())])
                .collect();
        }
        for o in pick(rng, len, &marks) {
            out.push(Damage::Flip(rel.clone(), o));
        }
        let cuts: Vec<usize> = envelopes(bytes)
            .iter()
            .flat_map(|&(s, e)| [s, (s + e) / 2, e])
            .chain([0])
            .collect();
        let cuts = match sample {
            _ if len <= PAGE && sample.is_none_or(|n| len <= n) => (0..len).collect(),
            Some(n) if len <= PAGE => (0..n).map(|_| rng.below(len)).collect(),
            Some(n) if cuts.len() > n => (0..n).map(|_| cuts[rng.below(cuts.len())]).collect(),
            _ => cuts,
        };
        let cuts: BTreeSet<usize> = cuts.into_iter().collect();
        for c in cuts {
            out.push(Damage::Truncate(rel.clone(), c));
        }
        for page in 0..len.div_ceil(PAGE) {
            out.push(Damage::Zero(rel.clone(), page));
        }
    }
    out.extend(value_plan(g, sample, rng));
    out
}

/// Value-level damage: a first, middle and last record, every meta value.
fn value_plan(g: &Golden, sample: Option<usize>, rng: &mut Rng) -> Vec<Damage> {
    let mut out = Vec::new();
    let tail: Vec<u64> = g.replay.tail.iter().map(|r| r.seq).collect();
    let mut values: Vec<(&'static str, Vec<u8>, usize)> = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path(), &g.files);
    let db = open_sled(dir.path());
    for seq in [tail[0], tail[tail.len() / 2], tail[tail.len() - 1]] {
        let v = db
            .open_tree("records")
            .unwrap()
            .get(seq.to_be_bytes())
            .unwrap()
            .unwrap();
        values.push(("records", seq.to_be_bytes().to_vec(), v.len()));
    }
    for kv in db.open_tree("meta").unwrap().iter() {
        let (k, v) = kv.unwrap();
        values.push(("meta", k.to_vec(), v.len()));
    }
    for (tree, key, len) in values {
        let offsets: Vec<usize> = match sample {
            Some(n) if len > n => (0..n)
                .map(|_| rng.below(len))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            _ => (0..len).collect(),
        };
        for &o in &offsets {
            out.push(Damage::Value(tree, key.clone(), Some(o), 0));
        }
        if tree != "meta" {
            for cut in offsets {
                out.push(Damage::Value(tree, key.clone(), None, cut));
            }
        }
    }
    // The checkpoint file cut anywhere, as its value once was in sled (the
    // file plan cuts a large file only at its envelopes' edges, and this
    // one is a single envelope).
    let ck = PathBuf::from(volumed::journal::CHECKPOINT_FILE);
    let len = g.files.get(&ck).map_or(0, Vec::len);
    let cuts: BTreeSet<usize> = match sample {
        Some(n) if len > n => (0..n).map(|_| rng.below(len)).collect(),
        _ => (0..len).collect(),
    };
    out.extend(cuts.into_iter().map(|c| Damage::Truncate(ck.clone(), c)));
    out
}

fn apply(dir: &Path, d: &Damage) {
    use std::os::unix::fs::FileExt;
    match d {
        Damage::Flip(rel, o) => {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dir.join(rel))
                .unwrap();
            let mut b = [0u8; 1];
            f.read_exact_at(&mut b, *o as u64).unwrap();
            f.write_all_at(&[b[0] ^ 0xff], *o as u64).unwrap();
        }
        Damage::Truncate(rel, len) => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join(rel))
                .unwrap();
            f.set_len(*len as u64).unwrap();
        }
        Damage::Zero(rel, page) => {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dir.join(rel))
                .unwrap();
            let len = usize::try_from(f.metadata().unwrap().len()).unwrap();
            let start = page * PAGE;
            let n = PAGE.min(len - start);
            f.write_all_at(&vec![0u8; n], start as u64).unwrap();
        }
        Damage::Value(tree, key, flip, cut) => {
            let db = open_sled(dir);
            let t = db.open_tree(tree).unwrap();
            let mut v = t.get(key).unwrap().unwrap().to_vec();
            match flip {
                Some(o) => v[*o] ^= 0xff,
                None => v.truncate(*cut),
            }
            t.insert(key.as_slice(), v).unwrap();
            db.flush().unwrap();
        }
    }
}

/// The records tree's sequence numbers in the undamaged journal.
fn golden_seqs(g: &Golden) -> Vec<u64> {
    g.replay.tail.iter().map(|r| r.seq).collect()
}

/// (c) and (d) for a successful open.
fn check_replay(g: &Golden, r: &Replay, state: &JournalState) -> Result<Outcome, String> {
    if let Some(lost) = r.lost_tail {
        return Err(format!("a lost tail {lost:?} within the same boot"));
    }
    for k in state.entries().map(|(k, _)| k) {
        if !g.written.keys.contains(k) {
            return Err(format!("(d) invented target {k:?}"));
        }
    }
    for rec in &r.tail {
        if !g.replay.tail.contains(rec) {
            return Err(format!(
                "(d) record {} is not one that was written",
                rec.seq
            ));
        }
    }
    let Some(c) = &r.corruption else {
        let same =
            r.tail == g.replay.tail && *state == g.state && r.checkpoint == g.replay.checkpoint;
        return match same {
            true => Ok(Outcome::Intact),
            false => Err(format!(
                "(c) silent difference: {} of {} records, {} of {} targets, checkpoint {:?}",
                r.tail.len(),
                g.replay.tail.len(),
                state.len(),
                g.state.len(),
                r.checkpoint
            )),
        };
    };
    if r.checkpoint != g.replay.checkpoint {
        return Err(format!(
            "(c) replay went on without the checkpoint ({}): {:?}",
            c.reason, r.checkpoint
        ));
    }
    let kept: Vec<_> = g
        .replay
        .tail
        .iter()
        .filter(|x| x.seq < c.seq)
        .cloned()
        .collect();
    if r.tail != kept {
        return Err(format!(
            "(c) stopped at {} but replayed {} records, not the {} before it",
            c.seq,
            r.tail.len(),
            kept.len()
        ));
    }
    let rest: Vec<u64> = golden_seqs(g).into_iter().filter(|&s| s >= c.seq).collect();
    if r.quarantined != rest {
        return Err(format!("(e) quarantined {:?}, not {rest:?}", r.quarantined));
    }
    Ok(Outcome::Quarantined)
}

/// (b) and (e) for a failed open.
/// `Ok`: the files sled rewrote before the journal was moved aside.
fn check_error(
    dir: &Path,
    e: &JournalError,
    before: &BTreeMap<PathBuf, Vec<u8>>,
) -> Result<Vec<PathBuf>, String> {
    let (path, moved_to) = match e {
        JournalError::Corrupt {
            path,
            moved_to,
            reason,
        } if !reason.is_empty() => (path, moved_to),
        JournalError::NewerSchema { path, moved_to, .. } => (path, moved_to),
        other => return Err(format!("(b) not a corruption error: {other}")),
    };
    if path != dir {
        return Err(format!(
            "(b) names {} not {}",
            path.display(),
            dir.display()
        ));
    }
    let Some(to) = moved_to else {
        return Err("(e) not moved aside".into());
    };
    let beside: Vec<_> = std::fs::read_dir(dir.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    if beside.len() != 1 {
        return Err(format!("(e) more than the journal moved aside: {beside:?}"));
    }
    if dir.exists() || !to.exists() {
        return Err(format!(
            "(e) {} not moved to {}",
            dir.display(),
            to.display()
        ));
    }
    // sled's recovery zeroes a damaged log's tail and replaces its
    // `snap.*`, so its files are compared with the copy the journal made
    // before sled opened them (`as-found/`); ours must be as they were.
    let after = files(to);
    let mut changed = Vec::new();
    for (name, bytes) in before {
        // the watermark, the checkpoint and the clean-close marker are
        // ours, not sled's
        let ours = ["acked", "checkpoint", "clean-close"]
            .iter()
            .any(|f| name == Path::new(f));
        let kept = match ours {
            true => after.get(name),
            false => after.get(&Path::new("as-found").join(name)),
        };
        if kept != Some(bytes) {
            return Err(format!(
                "(e) {} is not kept as it was in {}",
                name.display(),
                to.display()
            ));
        }
        if !ours && after.get(name) != Some(bytes) {
            changed.push(name.clone());
        }
    }
    if !after.contains_key(Path::new("volumed-moved-aside.txt")) {
        return Err(format!("(e) no note says why {} was moved", to.display()));
    }
    Ok(changed)
}

/// One damaged copy, opened twice. `Err`: the invariant that broke.
fn run(g: &Golden, d: &Damage, dir: &Path, inspect_first: bool) -> Result<Outcome, String> {
    write_files(dir, &g.files);
    apply(dir, d);
    let mut before = files(dir);
    if inspect_first {
        // `dump` and `reconstruct --dry-run` change nothing, whatever sled's
        // recovery does to the files while they look.
        let inspected = catch_unwind(AssertUnwindSafe(|| {
            Journal::open(&JournalConfig::inspect(dir, golden::BOOT)).map(drop)
        }));
        if inspected.is_err() {
            return Err("(a) an inspection panicked".into());
        }
        // One that sled opened may write as any open does (its log, a
        // newer `snap.*`, the `acked` refresh): compare only after a
        // refusal, when sled's recovery has zeroed the damaged tail.
        let after = files(dir);
        if matches!(inspected, Ok(Err(_))) {
            for (name, bytes) in &before {
                if after.get(name) != Some(bytes) {
                    return Err(format!("an inspection changed {}", name.display()));
                }
            }
        }
        before = after;
    }
    let panics = panic_count();
    let opened = catch_unwind(AssertUnwindSafe(|| Journal::open(&cfg(dir))));
    let panicked = panic_count() - panics;
    let outcome = match opened {
        Err(_) => return Err("(a) open panicked".into()),
        Ok(Ok((j, r))) => {
            let mut outcome = check_replay(g, &r, &j.state())?;
            drop(j);
            if let [aside] = r.damage.moved_aside.as_slice() {
                // Only a conf or snapshot sled refused is moved aside from a
                // journal that opens; they are kept as they were.
                for (name, bytes) in &before {
                    let derived =
                        name.to_string_lossy().starts_with("snap.") || name == Path::new("conf");
                    if derived && std::fs::read(aside.path.join(name)).ok().as_ref() != Some(bytes)
                    {
                        return Err(format!(
                            "(e) {} not kept in {}",
                            name.display(),
                            aside.path.display()
                        ));
                    }
                }
                outcome = Outcome::DerivedMovedAside;
            } else if !r.damage.moved_aside.is_empty() {
                return Err(format!("(e) moved aside {:?}", r.damage.moved_aside));
            }
            if outcome == Outcome::Quarantined {
                let q = open_sled(dir).open_tree("quarantine").unwrap();
                if let Some(s) = r
                    .quarantined
                    .iter()
                    .find(|s| !q.contains_key(s.to_be_bytes()).unwrap())
                {
                    return Err(format!(
                        "(e) quarantined record {s} is not in the quarantine tree"
                    ));
                }
            }
            outcome
        }
        Ok(Err(e)) => {
            for f in check_error(dir, &e, &before)? {
                if let Ok(mut c) = rewritten().lock() {
                    *c.entry(f).or_default() += 1;
                }
            }
            match panicked {
                0 => Outcome::MovedAside,
                _ => Outcome::MovedAsideSledPanicked,
            }
        }
    };
    if panicked > 0 && outcome != Outcome::MovedAsideSledPanicked {
        return Err(format!("(a) {panicked} panic(s) on other threads"));
    }
    // (f) the next start.
    let panics = panic_count();
    let again = catch_unwind(AssertUnwindSafe(|| Journal::open(&cfg(dir))));
    match again {
        Ok(Ok((_, r))) if r.corruption.is_none() && r.lost_tail.is_none() => {}
        Ok(Ok((_, r))) => {
            return Err(format!(
                "(f) the next open reports {:?} again",
                r.corruption
            ));
        }
        Ok(Err(e)) => return Err(format!("(f) the next open fails: {e}")),
        Err(_) => return Err("(f) the next open panicked".into()),
    }
    if panic_count() > panics {
        return Err("(f) the next open panicked on another thread".into());
    }
    Ok(outcome)
}

fn sample_size() -> Option<usize> {
    match std::env::var("VOLUMED_TORTURE_SAMPLE").as_deref() {
        Ok("all") => None,
        Ok(n) => Some(
            n.parse()
                .expect("VOLUMED_TORTURE_SAMPLE is a number or `all`"),
        ),
        Err(_) => Some(32),
    }
}

#[test]
fn every_damaged_copy_opens_or_is_moved_aside_and_loses_nothing_silently() {
    panics();
    let seed = std::env::var("VOLUMED_TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7027_0270_u64);
    let sample = sample_size();
    let started = std::time::Instant::now();
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("golden");
    let written = golden::write(&src);
    let (j, replay) = Journal::open(&cfg(&src)).unwrap();
    let state = j.into_state();
    // Read after the reopen: it rewrote `acked`, and sled leaves a
    // `snap.*` file when a journal is dropped, both part of what is damaged.
    let g = Golden {
        files: files(&src),
        replay,
        state,
        written,
    };
    assert!(g.replay.corruption.is_none() && g.replay.checkpoint.is_some());
    assert_eq!(g.state.last_seq(), g.written.acked);
    let mut rng = Rng(seed);
    let cases = plan(&g, sample, &mut rng);
    eprintln!(
        "torture: seed {seed:#x}, sample {sample:?}, {} cases over {:?} ({} records after the checkpoint, {} targets)",
        cases.len(),
        g.files
            .iter()
            .map(|(p, b)| format!("{}={}B", p.display(), b.len()))
            .collect::<Vec<_>>(),
        g.replay.tail.len(),
        g.state.len(),
    );
    let mut tally: BTreeMap<(String, Outcome), usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for (n, d) in cases.iter().enumerate() {
        let dir = base.path().join(format!("c{n}")).join("journal");
        std::fs::create_dir_all(&dir).unwrap();
        match run(&g, d, &dir, n % 4 == 0) {
            Ok(o) => *tally.entry((d.kind(), o)).or_default() += 1,
            Err(why) => failures.push(format!("{d:?}: {why}")),
        }
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }
    for ((kind, outcome), n) in &tally {
        eprintln!("torture: {kind:<28} {outcome:?}: {n}");
    }
    if let Ok(r) = rewritten().lock() {
        for (f, n) in r.iter() {
            eprintln!(
                "torture: moved aside with {} rewritten by sled (kept as found in as-found/): {n}",
                f.display()
            );
        }
    }
    eprintln!(
        "torture: {} cases in {:.1}s, {} failed",
        cases.len(),
        started.elapsed().as_secs_f64(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases broke the invariant:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
