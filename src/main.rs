//! The `volumed` binary.
fn main() {}
