//! Domain-free helpers: time (`time`: UTC dates, milliseconds for log
//! lines), the kubelet's duration spellings (`duration`), and work split in
//! two on two threads (`halves`). Nothing here knows volumes, mounts or the
//! journal.

pub mod duration;
pub mod halves;
pub mod time;
