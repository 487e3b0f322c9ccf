//! [`PodMap`]: the pods of one volume, one record held inline or a sorted
//! `Vec`, rather than a `BTreeMap`.
//!
//! Almost every volume has one pod (a claim or an emptyDir belongs to one
//! pod), and a `BTreeMap` allocates a whole leaf node of eleven slots for its
//! first entry: with the DSW's and the ASW's per-pod records that was about
//! 3 KiB per volume, most of the daemon's memory per volume. A map of one
//! pod holds its record inline, in the volume's own record: no allocation of
//! its own (a `Vec` with room for exactly one was a second allocation per
//! volume in both states, with its own malloc header and rounding). A
//! second pod moves both into a sorted `Vec`; the same API subset and the
//! same (sorted by pod UID) iteration order either way. Lookups are a binary
//! search; a volume shared by many pods is rare and still small. The `Vec`
//! grows one slot at a time up to a few pods, then by doubling: one slot at
//! a time is quadratic for a volume shared by thousands of pods
//! (reconstruction of 5,000 binds of one local PV spent more time in
//! `realloc` than anywhere).

use std::fmt;

use crate::model::PodUid;

/// Up to this many pods a map grows by exactly one slot per insert.
const EXACT_UP_TO: usize = 4;

/// Where a map's records are.
#[derive(Clone)]
enum Entries<V> {
    /// exactly one pod, inline
    One((PodUid, V)),
    /// none (an empty `Vec` allocates nothing) or, sorted, more than one
    /// (or fewer after removals, or room reserved ahead)
    Many(Vec<(PodUid, V)>),
}

/// A small map from pod UID to `V`, iterated in UID order.
#[derive(Clone)]
pub struct PodMap<V> {
    entries: Entries<V>,
}

impl<V> Default for PodMap<V> {
    fn default() -> Self {
        Self {
            entries: Entries::Many(Vec::new()),
        }
    }
}

impl<V: PartialEq> PartialEq for PodMap<V> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<V: Eq> Eq for PodMap<V> {}

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

    fn as_slice(&self) -> &[(PodUid, V)] {
        match &self.entries {
            Entries::One(e) => std::slice::from_ref(e),
            Entries::Many(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [(PodUid, V)] {
        match &mut self.entries {
            Entries::One(e) => std::slice::from_mut(e),
            Entries::Many(v) => v,
        }
    }

    fn find(&self, pod: &PodUid) -> Result<usize, usize> {
        self.as_slice().binary_search_by(|(k, _)| k.cmp(pod))
    }

    /// Inserts or replaces `pod`'s value; returns the old one.
    pub fn insert(&mut self, pod: PodUid, value: V) -> Option<V> {
        let i = match self.find(&pod) {
            Ok(i) => return Some(std::mem::replace(&mut self.as_mut_slice()[i].1, value)),
            Err(i) => i,
        };
        // taken out and put back: an empty `Vec` in the meantime allocates
        // nothing
        self.entries = match std::mem::replace(&mut self.entries, Entries::Many(Vec::new())) {
            // the first pod: inline, unless room was reserved for more
            Entries::Many(v) if v.capacity() == 0 => Entries::One((pod, value)),
            Entries::Many(mut v) => {
                // grow by one, not by doubling: most maps hold one pod; past
                // a few, double (growing by one each time is quadratic)
                if v.len() < EXACT_UP_TO {
                    v.reserve_exact(1);
                } else {
                    v.reserve(1);
                }
                v.insert(i, (pod, value));
                Entries::Many(v)
            }
            Entries::One(first) => {
                let mut v = Vec::with_capacity(2);
                v.push(first);
                v.insert(i, (pod, value));
                Entries::Many(v)
            }
        };
        None
    }

    /// Room for exactly `additional` more pods (a caller that knows how many
    /// come: no regrowing, no spare slots; one pod into an empty map is held
    /// inline all the same).
    pub fn reserve_exact(&mut self, additional: usize) {
        self.entries = match std::mem::replace(&mut self.entries, Entries::Many(Vec::new())) {
            Entries::Many(mut v) => {
                if !(v.is_empty() && additional <= 1) {
                    v.reserve_exact(additional);
                }
                Entries::Many(v)
            }
            Entries::One(first) if additional == 0 => Entries::One(first),
            Entries::One(first) => {
                let mut v = Vec::with_capacity(1 + additional);
                v.push(first);
                Entries::Many(v)
            }
        };
    }

    /// `pod`'s value.
    pub fn get(&self, pod: &PodUid) -> Option<&V> {
        self.find(pod).ok().map(|i| &self.as_slice()[i].1)
    }

    /// `pod`'s value, mutable.
    pub fn get_mut(&mut self, pod: &PodUid) -> Option<&mut V> {
        let i = self.find(pod).ok()?;
        Some(&mut self.as_mut_slice()[i].1)
    }

    /// Removes `pod`; returns its value. The last pod leaves no allocation
    /// behind, and one left over is held inline again.
    pub fn remove(&mut self, pod: &PodUid) -> Option<V> {
        let i = self.find(pod).ok()?;
        match std::mem::replace(&mut self.entries, Entries::Many(Vec::new())) {
            Entries::One((_, v)) => Some(v),
            Entries::Many(mut v) => {
                let (_, value) = v.remove(i);
                self.entries = match v.len() {
                    0 => Entries::Many(Vec::new()),
                    1 => Entries::One(v.remove(0)),
                    _ => Entries::Many(v),
                };
                Some(value)
            }
        }
    }

    /// Whether `pod` is in the map.
    pub fn contains_key(&self, pod: &PodUid) -> bool {
        self.find(pod).is_ok()
    }

    /// How many pods.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// No pods.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// (pod, value) pairs in UID order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&PodUid, &V)> + ExactSizeIterator {
        self.as_slice().iter().map(|(k, v)| (k, v))
    }

    /// The pod UIDs in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &PodUid> + ExactSizeIterator {
        self.as_slice().iter().map(|(k, _)| k)
    }

    /// The values in UID order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.as_slice().iter().map(|(_, v)| v)
    }

    /// The `Vec`'s capacity (0 when the records are inline), for tests.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        match &self.entries {
            Entries::One(_) => 0,
            Entries::Many(v) => v.capacity(),
        }
    }
}

impl<'a, V> IntoIterator for &'a PodMap<V> {
    type Item = (&'a PodUid, &'a V);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (PodUid, V)>,
        fn(&'a (PodUid, V)) -> (&'a PodUid, &'a V),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter().map(|(k, v)| (k, v))
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
    fn one_pod_is_held_inline() {
        let mut m = PodMap::new();
        m.insert(uid("1"), [0u8; 64]);
        assert!(matches!(m.entries, Entries::One(_)));
        // a second pod moves both into a Vec of exactly two, and removing
        // one brings the other back inline
        m.insert(uid("0"), [1u8; 64]);
        assert_eq!(m.capacity(), 2);
        assert_eq!(
            m.keys().cloned().collect::<Vec<_>>(),
            vec![uid("0"), uid("1")]
        );
        assert_eq!(m.remove(&uid("0")), Some([1u8; 64]));
        assert!(matches!(m.entries, Entries::One(_)));
        assert_eq!(m.remove(&uid("1")), Some([0u8; 64]));
        assert!(m.is_empty());
        assert_eq!(m.capacity(), 0);
        // room reserved for several is used from the first pod on
        m.reserve_exact(3);
        m.insert(uid("1"), [0u8; 64]);
        assert_eq!(m.capacity(), 3);
    }

    #[test]
    fn many_pods_grow_by_doubling() {
        let mut m = PodMap::new();
        for i in 0..EXACT_UP_TO {
            m.insert(uid(&i.to_string()), ());
        }
        assert_eq!(m.capacity(), EXACT_UP_TO, "exact up to a few");
        let mut grew = 0;
        for i in EXACT_UP_TO..1000 {
            let before = m.capacity();
            m.insert(uid(&i.to_string()), ());
            grew += usize::from(m.capacity() != before);
        }
        assert!(grew < 20, "{grew} reallocations for 1000 pods");
        assert_eq!(m.len(), 1000);
    }
}
