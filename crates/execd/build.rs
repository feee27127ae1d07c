//! Generates the envd protocol types (`crates/execd/proto/e2b/*.proto`, vendored from
//! e2b-dev/infra) for the `e2b` module: `protox` parses the files in pure Rust (no `protoc`),
//! `prost-build` writes the message types and `pbjson-build` their proto3 JSON serde impls
//! (lowerCamelCase, 64-bit integers as strings, bytes as base64, enums by name). The output
//! lives in `OUT_DIR` only; nothing generated is committed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from("proto/e2b");
    let files = [
        proto_dir.join("process/process.proto"),
        proto_dir.join("filesystem/filesystem.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let descriptors = protox::compile(&files, [&proto_dir])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("e2b_descriptor.bin");
    std::fs::write(
        &descriptor_path,
        prost::Message::encode_to_vec(&descriptors),
    )?;

    prost_build::Config::new()
        .file_descriptor_set_path(&descriptor_path)
        .skip_protoc_run()
        .compile_well_known_types()
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_protos(&files, &[&proto_dir])?;

    let descriptor_set = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_set)?
        .ignore_unknown_fields()
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
