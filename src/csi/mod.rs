//! The CSI wire layer: the gRPC messages, clients and servers volumed speaks
//! to CSI node plugins (`csi.v1` Identity and Node) and the kubelet plugin
//! registration API they serve (`pluginregistration`), generated at build
//! time from `proto/` by `build.rs`, plus [`connect_unix`], the unix-socket
//! channel the clients run on. No client logic lives here.

mod channel;
pub mod proto;

pub use channel::{ChannelError, connect_unix};

#[cfg(test)]
mod proto_tests;
