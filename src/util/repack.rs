//! B-tree maps rebuilt full.

/// Rebuilds a B-tree map or set from its own entries, which fills every
/// node but the last. Filled in key order (reconstruction, a listing, a
/// mass start), a B-tree keeps its nodes a little over half full: a full
/// node splits in two and every later key goes to the right half. O(n):
/// the daemon repacks only when the node has doubled (`reconciler::core`).
pub(crate) fn repack<C>(c: &mut C)
where
    C: Default + IntoIterator + FromIterator<<C as IntoIterator>::Item>,
{
    *c = std::mem::take(c).into_iter().collect();
}
