//! The extern "C" surface. Only conversion and checks live here: null and range checks, integer
//! to enum conversion, handle <-> object, the panic boundary and `dc_last_error`.

#![allow(non_camel_case_types)]

mod boundary;
mod checks;
pub mod coll;
pub mod comm;
pub mod p2p;
pub mod request;
pub mod status;
pub mod types;

pub use boundary::{guard, set_last_error};
pub use types::*;
