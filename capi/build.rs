//! On Linux, gives the shared library its soname (major version from ../Cargo.toml, distcomm's
//! own version) and the version script that exports `dc_*` only.

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("..");
    let map = root.join("src/ffi/exports.map");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", map.display());
    println!("cargo:rerun-if-changed={}", root.join("Cargo.toml").display());
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let version = engine_version(&root.join("Cargo.toml"));
        let major = version.split('.').next().unwrap();
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libdistcomm.so.{major}");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", map.display());
        println!("cargo:rustc-env=DISTCOMM_VERSION={version}");
    }
}

/// The `version` of the `[package]` section of distcomm's Cargo.toml (as the Makefile reads it).
fn engine_version(manifest: &std::path::Path) -> String {
    let text = std::fs::read_to_string(manifest).expect("distcomm's Cargo.toml");
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && line.starts_with("version") {
            if let Some(v) = line.split('"').nth(1) {
                return v.to_string();
            }
        }
    }
    panic!("no version in the [package] section of {}", manifest.display());
}
