//! Compiles `proto/` with protox (a protobuf compiler in Rust: no `protoc` to install) and
//! generates the prost messages and tonic services.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/embstore/v1/serving.proto", "proto/etcd/rpc.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
