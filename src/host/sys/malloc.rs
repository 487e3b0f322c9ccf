//! glibc allocator tunables the daemon sets: the arena cap and trimming.

/// Caps glibc's malloc at `arenas` arenas (`mallopt(M_ARENA_MAX)`), unless
/// `MALLOC_ARENA_MAX` is set in the environment (glibc reads that itself and
/// it wins). glibc otherwise gives each thread that contends for a lock an
/// arena of its own (up to 8 per core); the daemon's worker, tokio and sled
/// threads each fill one with the per-volume records they allocate, and
/// their freed space is kept per arena, so RSS per volume grows with the
/// thread count. Call it first thing in `main`, before any thread starts.
/// Returns whether the cap was set (always `false` off glibc).
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

/// Gives the allocator's free pages back to the kernel (`malloc_trim(0)`).
/// glibc returns memory on `free` only from the top of a heap; what a burst
/// of work freed in the middle (parsed manifests, job reports, journal
/// buffers) otherwise stays in RSS. Returns whether anything was released
/// (always `false` off glibc).
pub fn trim_malloc() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: `malloc_trim` takes no pointers; it locks each arena while
        // it releases whole free pages (madvise), so any thread may call it
        // at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}
