//! The extern "C" surface. Only conversion and checks live here: null and range checks, integer
//! to enum conversion, handle <-> object, the panic boundary and `dc_last_error`.

#![allow(non_camel_case_types)]

mod boundary;
mod checks;
pub mod coll;
pub mod comm;
pub mod p2p;
pub mod request;
pub mod rpc;
pub mod status;
pub mod types;

pub use boundary::{guard, set_last_error};
// Reachable from Rust (dc-bench calls the C surface as C users do).
pub use status::{dc_last_error, dc_status_name, dc_version};
pub use types::*;
