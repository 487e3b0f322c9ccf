//! [`PodMap`]: the pods of one volume, a sorted `Vec` rather than a
//! `BTreeMap`.
//!
//! Almost every volume has one pod (a claim or an emptyDir belongs to one
//! pod), and a `BTreeMap` allocates a whole leaf node of eleven slots for its
//! first entry: with the DSW's and the ASW's per-pod records that was about
//! 3 KiB per volume, most of the daemon's memory per volume. A sorted `Vec`
//! with room for exactly one holds one record and keeps the same API subset
//! and the same (sorted by pod UID) iteration order. Lookups are a binary
//! search; a volume shared by many pods is rare and still small. It grows
//! one slot at a time up to a few pods, then by doubling: one slot at a time
//! is quadratic for a volume shared by thousands of pods (reconstruction of
//! 5,000 binds of one local PV spent more time in `realloc` than anywhere).

use std::fmt;

use crate::model::PodUid;

/// Up to this many pods a map grows by exactly one slot per insert.
const EXACT_UP_TO: usize = 4;

/// A small map from pod UID to `V`, iterated in UID order.
#[derive(Clone, PartialEq, Eq)]
pub struct PodMap<V> {
    entries: Vec<(PodUid, V)>,
}

impl<V> Default for PodMap<V> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<V: fmt::Debug> fmt::Debug for PodMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V> PodMap<V> {
    /// An empty map (allocates nothing).
    pub fn new() -> Self {
        Self::default()
    }

    fn find(&self, pod: &PodUid) -> Result<usize, usize> {
        self.entries.binary_search_by(|(k, _)| k.cmp(pod))
    }

    /// Inserts or replaces `pod`'s value; returns the old one.
    pub fn insert(&mut self, pod: PodUid, value: V) -> Option<V> {
        match self.find(&pod) {
            Ok(i) => Some(std::mem::replace(&mut self.entries[i].1, value)),
            Err(i) => {
                // grow by one, not by doubling: most maps hold one pod; past
                // a few, double (growing by one each time is quadratic)
                if self.entries.len() < EXACT_UP_TO {
                    self.entries.reserve_exact(1);
                } else {
                    self.entries.reserve(1);
                }
                self.entries.insert(i, (pod, value));
                None
            }
        }
    }

    /// Room for exactly `additional` more pods (a caller that knows how many
    /// come: no regrowing, no spare slots).
    pub fn reserve_exact(&mut self, additional: usize) {
        self.entries.reserve_exact(additional);
    }

    /// `pod`'s value.
    pub fn get(&self, pod: &PodUid) -> Option<&V> {
        self.find(pod).ok().map(|i| &self.entries[i].1)
    }

    /// `pod`'s value, mutable.
    pub fn get_mut(&mut self, pod: &PodUid) -> Option<&mut V> {
        self.find(pod).ok().map(|i| &mut self.entries[i].1)
    }

    /// Removes `pod`; returns its value.
    pub fn remove(&mut self, pod: &PodUid) -> Option<V> {
        let v = self.find(pod).ok().map(|i| self.entries.remove(i).1);
        if self.entries.is_empty() {
            self.entries = Vec::new();
        }
        v
    }

    /// Whether `pod` is in the map.
    pub fn contains_key(&self, pod: &PodUid) -> bool {
        self.find(pod).is_ok()
    }

    /// How many pods.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No pods.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// (pod, value) pairs in UID order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&PodUid, &V)> + ExactSizeIterator {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The pod UIDs in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &PodUid> + ExactSizeIterator {
        self.entries.iter().map(|(k, _)| k)
    }

    /// The values in UID order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }
}

impl<'a, V> IntoIterator for &'a PodMap<V> {
    type Item = (&'a PodUid, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (PodUid, V)>,
        fn(&'a (PodUid, V)) -> (&'a PodUid, &'a V),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

impl<V> FromIterator<(PodUid, V)> for PodMap<V> {
    fn from_iter<I: IntoIterator<Item = (PodUid, V)>>(iter: I) -> Self {
        let mut m = Self::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> PodUid {
        PodUid::new(format!("00000000-0000-4000-8000-{s:0>12}")).unwrap()
    }

    #[test]
    fn behaves_as_a_sorted_map() {
        let mut m = PodMap::new();
        assert!(m.is_empty());
        assert_eq!(m.insert(uid("3"), 'c'), None);
        assert_eq!(m.insert(uid("1"), 'a'), None);
        assert_eq!(m.insert(uid("2"), 'b'), None);
        assert_eq!(m.insert(uid("1"), 'A'), Some('a'));
        assert_eq!(m.len(), 3);
        assert_eq!(m.values().copied().collect::<String>(), "Abc");
        assert_eq!(m.get(&uid("2")), Some(&'b'));
        *m.get_mut(&uid("2")).unwrap() = 'B';
        assert!(m.contains_key(&uid("3")));
        assert_eq!(m.remove(&uid("3")), Some('c'));
        assert_eq!(m.remove(&uid("3")), None);
        assert_eq!(
            m.keys().cloned().collect::<Vec<_>>(),
            vec![uid("1"), uid("2")]
        );
        let copy: PodMap<char> = m.iter().map(|(k, v)| (k.clone(), *v)).collect();
        assert_eq!(copy, m);
    }

    #[test]
    fn one_pod_holds_one_slot() {
        let mut m = PodMap::new();
        m.insert(uid("1"), [0u8; 64]);
        assert_eq!(m.entries.capacity(), 1);
    }

    #[test]
    fn many_pods_grow_by_doubling() {
        let mut m = PodMap::new();
        for i in 0..EXACT_UP_TO {
            m.insert(uid(&i.to_string()), ());
        }
        assert_eq!(m.entries.capacity(), EXACT_UP_TO, "exact up to a few");
        let mut grew = 0;
        for i in EXACT_UP_TO..1000 {
            let before = m.entries.capacity();
            m.insert(uid(&i.to_string()), ());
            grew += usize::from(m.entries.capacity() != before);
        }
        assert!(grew < 20, "{grew} reallocations for 1000 pods");
        assert_eq!(m.len(), 1000);
    }
}
