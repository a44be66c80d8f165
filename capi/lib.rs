//! `libdistcomm.so` / `libdistcomm.a`: the engine's `dc_*` functions (`distcomm::ffi`), linked
//! into the C libraries. Nothing is defined here; see Cargo.toml for why this crate exists.

// Links the engine in: its #[no_mangle] dc_* functions are what these libraries export.
pub use engine::ffi;
