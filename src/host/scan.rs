//! Host scan (in progress).
