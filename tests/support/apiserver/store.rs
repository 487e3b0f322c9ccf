//! The fake's state: objects keyed by resource, namespace and name, one
//! global resourceVersion counter, the event history since the compaction
//! point, the open watches (fed under the same lock as every write, so
//! each sees changes in resourceVersion order) and the request log.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Recorded;
use super::resources::RESOURCES;
use super::select::Filter;

/// (resource index, namespace or "" for cluster-scoped, name): sorts the
/// way etcd keys do, so lists come out in the real server's order.
pub type Key = (usize, String, String);

/// One write, kept until the next compaction.
struct Change {
    rv: u64,
    key: Key,
    prev: Option<Value>,
    cur: Option<Value>,
}

/// What a watch's stream is told.
pub enum WatchMsg {
    /// One `{"type":..,"object":..}` line, newline included.
    Line(String),
    /// End the response cleanly (the chunked terminator).
    End,
    /// Break the connection without ending the chunked body.
    Abort,
}

struct WatchReg {
    id: u64,
    res: usize,
    filter: Filter,
    tx: mpsc::UnboundedSender<WatchMsg>,
}

/// Where a watch starts.
pub enum WatchFrom {
    /// Synthetic ADDED events for every matching object first (a watch
    /// without a resourceVersion, or with "0"); with `end_bookmark`
    /// (sendInitialEvents) a BOOKMARK annotated
    /// `k8s.io/initial-events-end` follows them.
    Initial { end_bookmark: bool },
    /// Every change after this resourceVersion.
    After(u64),
}

/// Everything behind the fake's one lock.
pub struct State {
    /// The resourceVersion of the last write (starts at 1, so no list ever
    /// says "0", which means "any" to a watch).
    pub rv: u64,
    /// History before and at this resourceVersion is forgotten.
    pub compacted: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    watches: Vec<WatchReg>,
    next_watch: u64,
    pub requests: Vec<Recorded>,
    pub down: bool,
    pub bookmark_every: Duration,
    pub token: String,
    /// What a test injects (`faults.rs`).
    pub faults: super::faults::Faults,
}

impl State {
    pub fn new(token: String) -> Self {
        State {
            rv: 1,
            compacted: 1,
            objects: BTreeMap::new(),
            history: Vec::new(),
            watches: Vec::new(),
            next_watch: 0,
            requests: Vec::new(),
            down: false,
            bookmark_every: Duration::from_secs(1),
            token,
            faults: super::faults::Faults::default(),
        }
    }

    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// The one mutation point: stores `new` under `key` (or deletes it when
    /// `None`) at the next resourceVersion, records the change and tells the
    /// watches. Returns the stored object (for a delete, the last state
    /// stamped with the deletion's resourceVersion, as the DELETED event
    /// carries it).
    pub fn commit(&mut self, key: Key, new: Option<Value>) -> Value {
        self.rv += 1;
        let rv = self.rv.to_string();
        let prev = self.objects.remove(&key);
        let stored = match new {
            Some(mut obj) => {
                obj["metadata"]["resourceVersion"] = json!(rv);
                self.objects.insert(key.clone(), obj.clone());
                obj
            }
            None => {
                let mut gone = prev.clone().unwrap_or_else(|| json!({"metadata": {}}));
                gone["metadata"]["resourceVersion"] = json!(rv);
                gone
            }
        };
        let cur = self.objects.get(&key).cloned();
        let change = Change {
            rv: self.rv,
            key,
            prev,
            cur,
        };
        self.watches.retain(|w| match event_for(w, &change) {
            Some(line) => w.tx.send(WatchMsg::Line(line)).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push(change);
        stored
    }

    /// The objects of resource `res` as they were at resourceVersion `at`
    /// (`None`: now), in key order; `Err` when `at` is before the
    /// compaction point (the history to rebuild it is gone).
    pub fn snapshot(&self, res: usize, at: Option<u64>) -> Result<Vec<(Key, Value)>, ()> {
        let mut objs: BTreeMap<Key, Value> = self
            .objects
            .range((res, String::new(), String::new())..)
            .take_while(|(k, _)| k.0 == res)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(at) = at {
            if at < self.compacted {
                return Err(());
            }
            // undo, newest first, every change after `at`
            for c in self.history.iter().rev().take_while(|c| c.rv > at) {
                if c.key.0 != res {
                    continue;
                }
                match &c.prev {
                    Some(p) => objs.insert(c.key.clone(), p.clone()),
                    None => objs.remove(&c.key),
                };
            }
        }
        Ok(objs.into_iter().collect())
    }

    /// Every stored object of resource `res`.
    pub fn all(&self, res: usize) -> Vec<Value> {
        self.snapshot(res, None)
            .unwrap_or_default()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// Registers a watch on `res`, queueing its initial events; `Err(())`
    /// when `from` is older than the compaction point (410 Expired).
    pub fn watch(
        &mut self,
        res: usize,
        filter: Filter,
        from: WatchFrom,
    ) -> Result<(u64, mpsc::UnboundedReceiver<WatchMsg>), ()> {
        let (tx, rx) = mpsc::unbounded_channel();
        let reg = WatchReg {
            id: self.next_watch,
            res,
            filter,
            tx,
        };
        match from {
            WatchFrom::Initial { end_bookmark } => {
                for (_, obj) in self.snapshot(res, None).unwrap_or_default() {
                    if reg.filter.matches(&obj) {
                        let _ = reg.tx.send(WatchMsg::Line(line("ADDED", &obj)));
                    }
                }
                if end_bookmark {
                    let _ = reg.tx.send(WatchMsg::Line(bookmark(res, self.rv, true)));
                }
            }
            WatchFrom::After(n) => {
                if n < self.compacted {
                    return Err(());
                }
                for c in self.history.iter().filter(|c| c.rv > n) {
                    if let Some(l) = event_for(&reg, c) {
                        let _ = reg.tx.send(WatchMsg::Line(l));
                    }
                }
            }
        }
        self.next_watch += 1;
        let id = reg.id;
        self.watches.push(reg);
        Ok((id, rx))
    }

    pub fn unwatch(&mut self, id: u64) {
        self.watches.retain(|w| w.id != id);
    }

    pub fn open_watches(&self) -> usize {
        self.watches.iter().filter(|w| !w.tx.is_closed()).count()
    }

    /// How many watches of the resource `plural` are open.
    pub fn open_watches_of(&self, plural: &str) -> usize {
        let of = |w: &&WatchReg| super::resources::RESOURCES[w.res].plural == plural;
        self.watches
            .iter()
            .filter(of)
            .filter(|w| !w.tx.is_closed())
            .count()
    }

    /// Tells every open watch `msg` (End or Abort) and forgets them.
    pub fn end_watches(&mut self, abort: bool) {
        for w in self.watches.drain(..) {
            let _ = w.tx.send(if abort {
                WatchMsg::Abort
            } else {
                WatchMsg::End
            });
        }
    }

    /// Forgets the history: from now on only the current state is known.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }
}

/// The event a change means to one watch, as the real server's cache
/// computes it: the new state passes the filter and the old did not →
/// ADDED; both → MODIFIED; only the old → DELETED carrying the old state
/// stamped with the change's resourceVersion.
fn event_for(w: &WatchReg, c: &Change) -> Option<String> {
    if w.res != c.key.0 {
        return None;
    }
    let cur = c.cur.as_ref().filter(|o| w.filter.matches(o));
    let prev = c.prev.as_ref().filter(|o| w.filter.matches(o));
    match (prev, cur) {
        (None, Some(o)) => Some(line("ADDED", o)),
        (Some(_), Some(o)) => Some(line("MODIFIED", o)),
        (Some(p), None) => {
            let mut gone = p.clone();
            gone["metadata"]["resourceVersion"] = json!(c.rv.to_string());
            Some(line("DELETED", &gone))
        }
        (None, None) => None,
    }
}

pub fn line(kind: &str, obj: &Value) -> String {
    let mut s = json!({"type": kind, "object": obj}).to_string();
    s.push('\n');
    s
}

/// A BOOKMARK line: an object of the resource's kind carrying only
/// `metadata.resourceVersion` (and the initial-events-end annotation).
pub fn bookmark(res: usize, rv: u64, initial_end: bool) -> String {
    let r = &RESOURCES[res];
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(
        "BOOKMARK",
        &json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": meta}),
    )
}

/// A fresh UID, unique in the process.
pub fn new_uid() -> String {
    static N: AtomicU64 = AtomicU64::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let pid = u64::from(std::process::id());
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        t & 0xffff_ffff,
        pid & 0xffff,
        (n >> 12) & 0xfff,
        n & 0xfff,
        (t >> 32) & 0xffff_ffff_ffff
    )
}

/// Now as RFC 3339 in UTC with second precision (metav1.Time's format).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (y, m, d, h, mi, s) = volumed::util::time::utc(secs);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}
