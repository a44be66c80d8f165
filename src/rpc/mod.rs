//! Remote procedure calls in the manner of `paddle.distributed.rpc`: named workers, handlers
//! registered by name, synchronous and asynchronous calls with timeouts, worker infos, and a
//! collective shutdown that lets every outstanding call finish.
//!
//! - `protocol`: the wire format, tags, length checks and the shutdown rule (sans-IO, unit tested).
//! - `agent`: the engine: listener threads, the handler pool, call routing, shutdown.
//!
//! RPC runs over the job's point-to-point layer on a communicator context of its own, so its
//! traffic never mixes with the user's messages.

pub mod agent;
pub mod protocol;

pub use agent::{Agent, Handler, PendingCall, RpcAgent, RpcConfig, WorkerInfo};

/// Bytes owned by the library: a call's reply (free it with dc_buffer_free), or the reply
/// buffer lent to a handler (filled with dc_buffer_set, freed by the library).
#[derive(Debug, Default)]
pub struct Buffer {
    data: Vec<u8>,
    /// Lent to a handler for the duration of the call: the library frees it, not the handler.
    borrowed: bool,
}

impl Buffer {
    /// A buffer the caller owns (frees with `dc_buffer_free`).
    pub fn owned(data: Vec<u8>) -> Buffer {
        Buffer { data, borrowed: false }
    }

    /// The reply buffer lent to a handler.
    pub fn borrowed() -> Buffer {
        Buffer { data: Vec::new(), borrowed: true }
    }

    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }

    /// Replaces the contents with a copy of `data`.
    pub fn set(&mut self, data: &[u8]) {
        self.data.clear();
        self.data.extend_from_slice(data);
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.data
    }

    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.data)
    }
}
