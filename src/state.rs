//! The desired and actual state of the world (DSW, ASW): caches, no I/O.
