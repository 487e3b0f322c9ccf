//! Domain-free helpers: time (`time`: UTC dates, milliseconds for log
//! lines), the kubelet's duration spellings (`duration`), work split in two
//! on two threads (`halves`), kubectl-like text tables (`table`), B-tree
//! maps rebuilt full (`repack`), an error's causes on one line (`chain`).
//! Nothing here knows volumes, mounts or the journal.

pub(crate) mod chain;
pub mod duration;
pub(crate) mod halves;
pub(crate) mod repack;
pub(crate) mod table;
pub mod time;
