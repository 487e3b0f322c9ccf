//! The flag groups of `volumed run` beyond its own: the CSI drivers (`csi`)
//! and the API server (`api`). The health flags live with the `health`
//! command.

pub(crate) mod api;
pub(crate) mod csi;
