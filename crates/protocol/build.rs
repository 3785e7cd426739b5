//! Generates the Rust bindings for `proto/reach/v1` with protox, a pure-Rust
//! protobuf compiler, so that no machine needs `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = ["common", "connector", "access", "health", "enrollment"]
        .map(|name| root.join(format!("reach/v1/{name}.proto")));
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    // The descriptor set is embedded for gRPC server reflection.
    std::fs::write(
        out.join("reach_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The rpc is named `Connect`, which would clash with the generated
        // `Client::connect(endpoint)` helper; clients use `Client::new(channel)`.
        .build_transport(false)
        // Boxed: inline, it would make every `ConnectorMessage` as large as
        // the status (a heartbeat's optional part).
        .boxed(".reach.v1.Heartbeat.status")
        .compile_fds(fds)?;
    Ok(())
}
