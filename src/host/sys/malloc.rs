//! The process allocator and what the daemon tunes in it: jemalloc with one
//! arena (feature `jemalloc`, on by default), else glibc's malloc with the
//! arena cap; and the trim that gives freed pages back after a burst.
//!
//! Why jemalloc: a start at tens of thousands of volumes parses manifests,
//! the mount table and the journal's records while it builds the records
//! that stay. glibc's malloc puts both side by side and, once the parse is
//! freed, keeps the holes it leaves (smaller than a page, so `malloc_trim`
//! cannot release them): much of its RSS at tens of thousands of volumes.
//! jemalloc keeps each size class in slabs of its own and returns any page
//! that empties.

/// jemalloc's options, for the `volumed` binary to give it (it declares
/// jemalloc the global allocator and exports these as jemalloc's
/// `malloc_conf`; a library cannot, or the benches could not count
/// allocations with an allocator of their own):
/// - `narenas:1`: one arena, as for glibc (see [`limit_malloc_arenas`]);
/// - `tcache:false`: no per-thread caches, which hold freed memory per
///   thread (a dozen threads, most of them idle);
/// - `dirty_decay_ms`/`muzzy_decay_ms`: freed pages go back to the kernel
///   about a second after they were freed, and at once when the daemon
///   trims ([`trim_malloc`]);
/// - `background_thread:true`, `max_background_threads:1`: one thread of
///   jemalloc's own runs that decay. Without it decay advances only as
///   later allocations come, so an idle daemon kept what a burst had freed
///   unless one of its trims followed (an HTTP debug document does not).
///   The thread sleeps while nothing waits to be returned.
///
/// `_RJEM_MALLOC_CONF` in the environment overrides any of them.
#[cfg(feature = "jemalloc")]
const JEMALLOC_CONF: &std::ffi::CStr = c"narenas:1,tcache:false,dirty_decay_ms:1000,\
    muzzy_decay_ms:0,background_thread:true,max_background_threads:1";

/// `JEMALLOC_CONF` as jemalloc's `malloc_conf` is typed (a C string
/// pointer), for the binary's exported static.
#[cfg(feature = "jemalloc")]
pub const JEMALLOC_MALLOC_CONF: Option<&std::ffi::c_char> =
    // SAFETY: the pointer is to the first byte of a `'static` C string.
    Some(unsafe { &*JEMALLOC_CONF.as_ptr() });

/// Caps glibc's malloc at `arenas` arenas (`mallopt(M_ARENA_MAX)`), unless
/// `MALLOC_ARENA_MAX` is set in the environment (glibc reads that itself and
/// it wins). glibc otherwise gives each thread that contends for a lock an
/// arena of its own (up to 8 per core); the daemon's worker, tokio and sled
/// threads each fill one with the per-volume records they allocate, and
/// their freed space is kept per arena, so RSS per volume grows with the
/// thread count. Call it first thing in `main`, before any thread starts.
/// Under jemalloc, glibc's malloc serves only what C code allocates, and
/// the cap still keeps that to one arena. Returns whether the cap was set
/// (always `false` off glibc).
pub fn limit_malloc_arenas(arenas: i32) -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: `mallopt` only changes a tunable of the allocator; it takes
        // no pointers, and glibc makes it safe to call at any time (it locks
        // the main arena). Called before other threads exist, it also cannot
        // race with an arena being created.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        let _ = arenas;
        false
    }
}

/// Gives the allocator's free pages back to the kernel: jemalloc purges
/// every arena's unused dirty pages at once rather than within the decay
/// time; glibc's `malloc_trim(0)` releases the whole free pages of its
/// heaps (it returns memory on `free` only from the top of a heap). Called
/// after a burst of work freed much (parsed manifests, job reports,
/// journal buffers, a health pass). Returns whether the call succeeded
/// (glibc: whether anything was released; always `false` elsewhere).
pub fn trim_malloc() -> bool {
    #[cfg(feature = "jemalloc")]
    {
        // `MALLCTL_ARENAS_ALL` (4096) names every arena.
        let name = c"arena.4096.purge";
        // SAFETY: `mallctl` reads the NUL-terminated name; a purge takes
        // no old or new value, so every other pointer is null and both
        // lengths zero, as jemalloc documents for a "void" control.
        unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            ) == 0
        }
    }
    #[cfg(all(not(feature = "jemalloc"), target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` takes no pointers; it locks each arena while
        // it releases whole free pages (madvise), so any thread may call it
        // at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(all(not(feature = "jemalloc"), not(target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    /// jemalloc knows the control the trim names, and the purge succeeds
    /// (this test binary's allocator is the system's, but jemalloc is
    /// linked in and purges its own arenas). glibc's trim is not tested:
    /// it only says whether it released anything.
    #[cfg(feature = "jemalloc")]
    #[test]
    fn jemalloc_purges_every_arena_by_the_trims_control() {
        assert!(super::trim_malloc());
    }
}
