//! The CSI wire layer: the gRPC messages, clients and servers volumed speaks
//! to CSI node plugins (`csi.v1` Identity and Node) and the kubelet plugin
//! registration API they serve (`pluginregistration`), generated at build
//! time from `proto/` by `build.rs`, plus [`connect_unix`], the unix-socket
//! channel the clients run on, and [`CsiClient`], the one place an RPC to a
//! driver is made.

mod channel;
pub mod client;
pub mod discovery;
pub mod proto;
pub mod registry;

pub use channel::{ChannelError, connect_unix};
pub use client::{CsiClient, CsiError, NodeCaps};

#[cfg(test)]
mod proto_tests;
