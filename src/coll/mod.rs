//! Collective algorithms, written against the small `Link` trait so they never see a transport.
//!
//! A `Link` is one collective call's view of its communicator: the caller's rank, the group size,
//! and tagged point-to-point operations private to this call. Messages between one pair of ranks
//! within one collective are matched in the order they were posted (FIFO per pair).

use crate::error::Result;

/// One collective call's private point-to-point channel to the other members.
pub trait Link {
    /// This rank, in `[0, size)`.
    fn rank(&self) -> usize;
    /// Number of members.
    fn size(&self) -> usize;
    /// Starts sending `buf` to `peer`. The buffer stays borrowed until the op is waited or dropped.
    fn send<'a>(&'a self, peer: usize, buf: &'a [u8]) -> Result<Pending<'a>>;
    /// Starts receiving into `buf` from `peer`. A message longer than `buf` fails the op
    /// (truncation) without writing past `buf`; `wait` returns the number of bytes received.
    fn recv<'a>(&'a self, peer: usize, buf: &'a mut [u8]) -> Result<Pending<'a>>;
}

/// Something a `Link` implementation returns for a started operation.
pub trait PendingOp {
    /// Blocks until the op completes (honouring the call's deadline and abort); returns bytes moved.
    fn wait(&mut self) -> Result<usize>;
}

/// A started send or receive. Dropping it without waiting cancels it (and blocks until the
/// transport no longer touches the buffer), so an early `?` return is always memory-safe.
pub struct Pending<'a>(pub Box<dyn PendingOp + 'a>);

impl<'a> Pending<'a> {
    pub fn new(op: impl PendingOp + 'a) -> Pending<'a> {
        Pending(Box::new(op))
    }

    /// Waits and returns the number of bytes moved.
    pub fn wait(mut self) -> Result<usize> {
        self.0.wait()
    }
}

mod util;

pub mod allgather;
pub mod allreduce;
pub mod alltoall;
pub mod barrier;
pub mod broadcast;
pub mod gather;
pub mod reduce_coll;
pub mod reduce_scatter;
pub mod shm;

#[cfg(test)]
pub(crate) mod testing;

pub use allgather::{allgather, allgatherv};
pub use allreduce::allreduce;
pub use alltoall::{alltoall, alltoallv};
pub use barrier::barrier;
pub use broadcast::broadcast;
pub use gather::{gather, scatter};
pub use reduce_coll::reduce;
pub use reduce_scatter::{reduce_scatter, ReduceScatterBufs};

/// Algorithm selection thresholds, all in bytes of the caller's payload (before any f16/bf16
/// widening). Tuned for the socket transport's model: ~25 us per message, ~2.5 GB/s per link.
pub mod tuning {
    /// allreduce up to this many bytes per rank: every rank sends its input to every other rank
    /// and reduces all inputs in rank order (one message latency). Above: ring reduce-scatter +
    /// ring allgather (bandwidth optimal, 2(n-1) steps). Crossover of the cost model is
    /// ~150-300 KiB for 3..8 ranks; kept lower because the direct algorithm costs n x memory
    /// and n-1 concurrent messages per rank.
    pub const ALLREDUCE_SMALL_BYTES: usize = 64 << 10;
    /// reduce_scatter up to this many bytes of total input per rank: direct (each block sent to
    /// its owner, reduced in rank order). Above: ring.
    pub const REDUCE_SCATTER_SMALL_BYTES: usize = 64 << 10;
    /// reduce up to this many bytes: binomial tree (combines in rank order from the root).
    /// Above: ring reduce-scatter, then each rank sends its finished chunk to the root.
    pub const REDUCE_SMALL_BYTES: usize = 256 << 10;
    /// broadcast up to this many bytes (or with 2 ranks): binomial tree. Above: pipelined chain.
    pub const BROADCAST_SMALL_BYTES: usize = 1 << 20;
    /// Pipelined-chain segment: len/16 clamped to [MIN, MAX].
    pub const BROADCAST_SEGMENT_MIN: usize = 64 << 10;
    pub const BROADCAST_SEGMENT_MAX: usize = 256 << 10;
    /// allgather(v) up to this many bytes of total output: direct (every rank sends its block
    /// to every other rank at once). Above: ring.
    pub const ALLGATHER_SMALL_BYTES: usize = 256 << 10;
    /// Ring steps (reduce-scatter and allgather) move blocks in messages of at most this size
    /// (rounded down to whole elements); a reduce-scatter step reduces each as it arrives.
    /// Large, because every message costs: its waiter is woken, and on loopback TCP, where both
    /// cores are busy copying, fewer and larger messages beat overlapping the reduction (2 ranks,
    /// DC_TRANSPORT=socket, allreduce, interleaved against 256 KiB segments: 1 MiB 0.95x the
    /// time, 16 MiB 0.66x, 64 MiB 0.93x). Not larger: a message that arrives before its
    /// receive is posted is kept in a buffer of its size, and glibc maps (and the kernel faults
    /// in) a fresh one for every buffer above 32 MiB.
    pub const RING_SEGMENT_BYTES: usize = 16 << 20;
}

#[cfg(test)]
mod tests;
