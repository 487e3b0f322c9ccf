//! Pod events to the API server, aggregated and rate limited the way
//! client-go's event recorder does it for the kubelet (its
//! `EventCorrelator`), so a volume failing every backoff step does not
//! flood etcd:
//! - **dedup**: the same event (pod, type, reason, message) within
//!   [`WINDOW`] is the same Event object, its `count` and `lastTimestamp`
//!   patched;
//! - **aggregation**: more than [`SIMILAR`] different messages of the same
//!   (pod, type, reason) within [`WINDOW`] become one Event whose message
//!   starts `(combined from similar events): `;
//! - **spam filter**: per pod a token bucket of [`BURST`] events refilled
//!   one per [`REFILL`]; an event without a token is dropped (and counted).
//!
//! [`Recorder::record`] is the pure decision; `publish.rs` sends it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::health::VolumeEvent;

/// How long an event stays the same Event object.
pub(crate) const WINDOW: Duration = Duration::from_secs(600);
/// Different messages of one reason before they are combined.
pub(crate) const SIMILAR: usize = 10;
/// Events a pod may get at once.
pub(crate) const BURST: f64 = 25.0;
/// One more allowed per this long.
pub(crate) const REFILL: Duration = Duration::from_secs(300);
/// Keys remembered before old ones are forgotten.
const REMEMBERED: usize = 4096;

/// What to send for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// create the Event object `name` (count 1)
    Create {
        /// `metadata.name`
        name: String,
        /// the message (combined, perhaps)
        message: String,
    },
    /// the same event again: patch `name` to this count
    Patch {
        /// `metadata.name`
        name: String,
        /// the new `count`
        count: u32,
        /// the message (combined, perhaps)
        message: String,
    },
    /// the pod's bucket is empty: dropped
    Drop,
}

#[derive(Debug)]
struct Seen {
    name: String,
    count: u32,
    last: Instant,
}

#[derive(Debug)]
struct Similar {
    messages: BTreeSet<String>,
    since: Instant,
}

/// The decisions' memory.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// (pod, type, reason, message) → the Event it is
    seen: BTreeMap<(String, &'static str, &'static str, String), Seen>,
    /// (pod, type, reason) → messages seen in the window
    similar: BTreeMap<(String, &'static str, &'static str), Similar>,
    /// pod → (tokens, when last refilled)
    buckets: BTreeMap<String, (f64, Instant)>,
    dropped: u64,
}

impl Recorder {
    /// What to send for `ev` at `now`; `name_of` makes a new Event's name.
    pub(crate) fn record(
        &mut self,
        ev: &VolumeEvent,
        now: Instant,
        name_of: impl FnOnce() -> String,
    ) -> Decision {
        if !self.take_token(&ev.pod_uid, now) {
            self.dropped += 1;
            return Decision::Drop;
        }
        self.forget_old(now);
        let group = (ev.pod_uid.clone(), ev.kind, ev.reason);
        let similar = self.similar.entry(group).or_insert_with(|| Similar {
            messages: BTreeSet::new(),
            since: now,
        });
        if now.duration_since(similar.since) > WINDOW {
            similar.messages.clear();
            similar.since = now;
        }
        similar.messages.insert(ev.message.clone());
        // Past SIMILAR different messages they are one Event, keyed without
        // a message, whatever this one says.
        let (message, key_message) = match similar.messages.len() > SIMILAR {
            true => (
                "(combined from similar events): ".to_owned() + &ev.message,
                String::new(),
            ),
            false => (ev.message.clone(), ev.message.clone()),
        };
        let key = (ev.pod_uid.clone(), ev.kind, ev.reason, key_message);
        match self.seen.get_mut(&key) {
            Some(s) if now.duration_since(s.last) <= WINDOW => {
                s.count += 1;
                s.last = now;
                Decision::Patch {
                    name: s.name.clone(),
                    count: s.count,
                    message,
                }
            }
            _ => {
                let name = name_of();
                self.seen.insert(
                    key,
                    Seen {
                        name: name.clone(),
                        count: 1,
                        last: now,
                    },
                );
                Decision::Create { name, message }
            }
        }
    }

    #[cfg(test)]
    /// Events dropped by the spam filter so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    fn take_token(&mut self, pod: &str, now: Instant) -> bool {
        let (tokens, at) = self.buckets.entry(pod.to_owned()).or_insert((BURST, now));
        let refill = now.duration_since(*at).as_secs_f64() / REFILL.as_secs_f64();
        *tokens = (*tokens + refill).min(BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Bounded memory: past [`REMEMBERED`] keys, those older than the
    /// window go (a full bucket is the same as no bucket).
    fn forget_old(&mut self, now: Instant) {
        let old = |at: Instant| now.duration_since(at) > WINDOW;
        if self.seen.len() > REMEMBERED {
            self.seen.retain(|_, s| !old(s.last));
        }
        if self.similar.len() > REMEMBERED {
            self.similar.retain(|_, s| !old(s.since));
        }
        if self.buckets.len() > REMEMBERED {
            self.buckets.retain(|_, (t, at)| *t < BURST && !old(*at));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(pod: &str, message: &str) -> VolumeEvent {
        VolumeEvent {
            kind: "Warning",
            reason: "FailedMount",
            message: message.into(),
            pod_uid: pod.into(),
            namespace: Some("ns".into()),
            pod: Some("p".into()),
            time: String::new(),
        }
    }

    fn counter() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("e{n}")
        }
    }

    #[test]
    fn the_same_event_again_is_a_count_on_one_object() {
        let t0 = Instant::now();
        let mut r = Recorder::default();
        let mut name = counter();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // (seconds, message, expected)
        let rows: [(u64, &str, Decision); 4] = [
            (
                0,
                "boom",
                Decision::Create {
                    name: "e1".into(),
                    message: "boom".into(),
                },
            ),
            (
                1,
                "boom",
                Decision::Patch {
                    name: "e1".into(),
                    count: 2,
                    message: "boom".into(),
                },
            ),
            (
                2,
                "other",
                Decision::Create {
                    name: "e2".into(),
                    message: "other".into(),
                },
            ),
            // past the window the same message is a new Event
            (
                3 + WINDOW.as_secs(),
                "boom",
                Decision::Create {
                    name: "e3".into(),
                    message: "boom".into(),
                },
            ),
        ];
        for (s, m, want) in rows {
            assert_eq!(r.record(&ev("u1", m), at(s), &mut name), want, "{s}s {m}");
        }
    }

    #[test]
    fn many_different_messages_are_combined_into_one_event() {
        let t0 = Instant::now();
        let mut r = Recorder::default();
        let mut name = counter();
        for i in 0..SIMILAR {
            let got = r.record(&ev("u1", &format!("m{i}")), t0, &mut name);
            assert!(matches!(got, Decision::Create { .. }), "{i}: {got:?}");
        }
        let first = r.record(&ev("u1", "m-new"), t0, &mut name);
        let Decision::Create {
            name: combined,
            message,
        } = first
        else {
            panic!("the first combined one creates: {first:?}")
        };
        assert!(
            message.starts_with("(combined from similar events): m-new"),
            "{message}"
        );
        let next = r.record(&ev("u1", "m-newer"), t0, &mut name);
        assert!(
            matches!(&next, Decision::Patch { name, count: 2, .. } if *name == combined),
            "later ones count on it: {next:?}"
        );
    }

    #[test]
    fn a_pod_gets_a_burst_then_one_event_per_refill() {
        let t0 = Instant::now();
        let mut r = Recorder::default();
        let mut name = counter();
        for _ in 0..25 {
            assert_ne!(r.record(&ev("u1", "x"), t0, &mut name), Decision::Drop);
        }
        assert_eq!(r.record(&ev("u1", "x"), t0, &mut name), Decision::Drop);
        assert_eq!(r.dropped(), 1);
        // another pod has its own bucket
        assert_ne!(r.record(&ev("u2", "x"), t0, &mut name), Decision::Drop);
        // one refill later, one more
        let later = t0 + REFILL;
        assert_ne!(r.record(&ev("u1", "x"), later, &mut name), Decision::Drop);
        assert_eq!(r.record(&ev("u1", "x"), later, &mut name), Decision::Drop);
    }
}
