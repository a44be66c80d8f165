//! distcomm: a communication library for distributed training and HPC with a C ABI.
//!
//! Layers, from the top: `ffi` (the extern "C" surface), `comm`/`request` (communicators and
//! pending operations), `coll` (collective algorithms over a `Link`), `reduce` (reduction
//! kernels), `transport` (moving bytes), `rendezvous` (forming the group).

pub mod error;
pub mod log;
pub mod dtype;
pub mod reduce;
pub mod coll;
pub mod rendezvous;
pub mod ffi;

pub use error::{Error, Result, Status};
pub use dtype::{DType, ReduceOp};
