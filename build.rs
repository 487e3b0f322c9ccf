//! Generates the CSI and plugin-registration gRPC code from `proto/`.
//!
//! protox parses the `.proto` files in pure Rust (it carries the well-known
//! types, so `google/protobuf/wrappers.proto` needs no file on disk), and
//! tonic-prost-build turns the descriptor set into prost messages plus tonic
//! clients and servers. Nothing here needs `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/csi.proto", "proto/pluginregistration.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
