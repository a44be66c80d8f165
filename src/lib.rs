//! distcomm: a communication library for distributed training and HPC with a C ABI.
//!
//! Layers, from the top: `ffi` (the extern "C" surface), `comm`/`request` (communicators and
//! pending operations), `collective` + `coll` (collective algorithms over a `Link`), `reduce`
//! (reduction kernels), `transport` (moving bytes), `rendezvous` (forming the group), `rpc`
//! (remote procedure calls over the point-to-point layer).

pub mod error;
pub mod params;
pub mod panics;
pub mod auth;
mod backoff;
pub mod log;
pub mod stable_hash;
pub mod dtype;
pub mod buffer;
pub mod completion;
pub mod placement;
mod pick;
pub mod waker;
pub mod transport;
pub mod reduce;
pub mod coll;
pub mod collective;
pub mod debug_check;
pub mod comm;
pub mod request;
pub mod init;
pub mod rpc;
pub mod rendezvous;
pub mod ffi;
#[cfg(feature = "nccl")]
pub mod nccl;

pub use error::{Error, Result, Status};
pub use dtype::{DType, ReduceOp};
