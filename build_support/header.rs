//! Generation of `include/distcomm.h` with cbindgen. Shared by `build.rs` (which writes the
//! header) and `tests/header.rs` (which checks that the committed header is current), so both
//! produce the header the same way: `cbindgen.toml` plus the adjustments below.
#![allow(dead_code)]

use crate::scan::Scan;
use std::path::Path;

/// Reads `cbindgen.toml` from the crate root.
pub fn load_config(manifest_dir: &Path) -> Result<cbindgen::Config, String> {
    cbindgen::Config::from_file(manifest_dir.join("cbindgen.toml"))
        .map_err(|e| format!("cbindgen.toml: {e}"))
}

/// The name a Rust item gets in C (after `[export.rename]`).
pub fn c_name(config: &cbindgen::Config, rust_name: &str) -> String {
    config.export.rename.get(rust_name).cloned().unwrap_or_else(|| rust_name.to_string())
}

/// True for names that belong in the public header.
pub fn is_public_c_name(name: &str) -> bool {
    name.starts_with("dc_") || name.starts_with("DC_")
}

/// Generates the header text from the sources under `manifest_dir/src`.
///
/// Adjustments to `cbindgen.toml`, both automatic so new code needs no config edits:
/// - cbindgen emits every `pub const` of the crate, also associated ones (`impl T { pub const X }`),
///   and with them the types they mention. Those whose C name is not `DC_*`/`dc_*` are internal
///   and excluded, so the header only carries the API.
/// - every type whose C name is `dc_*` is included even before a function uses it (`dc_status`,
///   ABI structs), since C callers name them directly.
pub fn generate(manifest_dir: &Path, scan: &Scan) -> Result<String, String> {
    let mut config = load_config(manifest_dir)?;
    let mut exclude = Vec::new();
    for c in &scan.consts {
        if !is_public_c_name(&c_name(&config, &c.name)) {
            exclude.push(c.name.clone());
        }
    }
    for (ty, name) in &scan.assoc_consts {
        let ty_c = c_name(&config, ty);
        if !is_public_c_name(&ty_c) {
            // cbindgen 0.29 keys associated constants as NAME followed by the type name.
            exclude.push(format!("{name}{ty}"));
            exclude.push(format!("{ty}_{name}"));
        }
    }
    let mut include = Vec::new();
    let types = scan.structs.iter().map(|s| &s.name);
    let types = types.chain(scan.enums.iter().map(|e| &e.name)).chain(scan.aliases.keys());
    for ty in types {
        if is_public_c_name(&c_name(&config, ty)) {
            include.push(ty.clone());
        }
    }
    for name in exclude {
        if !config.export.exclude.contains(&name) {
            config.export.exclude.push(name);
        }
    }
    for name in include {
        if !config.export.include.contains(&name) {
            config.export.include.push(name);
        }
    }
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(manifest_dir.join("src").join("lib.rs"))
        .generate()
        .map_err(|e| format!("cbindgen: {e}"))?;
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).map_err(|e| format!("cbindgen output is not UTF-8: {e}"))
}
