//! The code `build.rs` generates from `proto/csi.proto` and
//! `proto/pluginregistration.proto`: prost messages plus tonic clients
//! (`*_client`) and servers (`*_server`) for each service.
//!
//! Field numbers are the spec's; `proto_tests.rs` pins them against hand
//! encoded bytes.

/// CSI `csi.v1`: the Identity and Node services and their messages.
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    clippy::cast_possible_truncation
)]
pub mod csi_v1 {
    tonic::include_proto!("csi.v1");
}

/// The kubelet plugin registration API (`pluginregistration`, its v1).
#[allow(
    missing_docs,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    clippy::nursery,
    clippy::cast_possible_truncation
)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}
