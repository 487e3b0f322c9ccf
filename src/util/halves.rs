//! Work split in two on two threads: the one helper behind the daemon's
//! two-core steps that divide a list (the merge deciding a large journal,
//! the sources parsing many manifests).

/// `f` over `items[..at]` on this thread and over `items[at..]` on a scoped
/// thread named `name` meanwhile; the results in that order. An empty
/// second part gets no thread, and without a thread to be had this thread
/// does both parts. A panic on the second thread is raised again here.
pub(crate) fn in_two_halves<T: Sync, R: Send>(
    name: &str,
    items: &[T],
    at: usize,
    f: impl Fn(&[T]) -> R + Sync,
) -> (R, R) {
    let (first, second) = items.split_at(at.min(items.len()));
    if second.is_empty() {
        return (f(first), f(second));
    }
    std::thread::scope(|scope| {
        let f = &f;
        let there = std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(scope, move || f(second));
        let here = f(first);
        let there = match there {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => f(second),
        };
        (here, there)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split point gives both parts, in order, and the second part
    /// runs on the named thread unless it is empty.
    #[test]
    fn both_parts_come_back_in_order_from_their_threads() {
        let items: Vec<u32> = (0..6).collect();
        for at in 0..=8 {
            let (a, b) = in_two_halves("volumed-test-half", &items, at, |part| {
                let thread = std::thread::current().name().map(str::to_owned);
                (part.to_vec(), thread)
            });
            let cut = at.min(items.len());
            assert_eq!(a.0, items[..cut], "split at {at}");
            assert_eq!(b.0, items[cut..], "split at {at}");
            assert_ne!(a.1.as_deref(), Some("volumed-test-half"), "split at {at}");
            let want = (cut < items.len()).then_some("volumed-test-half");
            if want.is_some() {
                assert_eq!(b.1.as_deref(), want, "split at {at}");
            }
        }
    }
}
