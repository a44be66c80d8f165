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
    /// Index of the host of member `peer` (`peer` itself included: `host_of(rank())` is this
    /// rank's host). Members with equal values share a host; the values mean nothing else.
    /// The default, every member on a host of its own, makes every algorithm flat. When members
    /// span several hosts and some host holds more than one, allreduce, barrier and broadcast
    /// go hierarchical (see `hier`). Must answer the same on every member.
    fn host_of(&self, peer: usize) -> usize {
        peer
    }
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

mod hier;
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

/// Algorithm selection: thresholds and the choice functions every dispatcher calls, all in bytes
/// of the caller's payload (before any f16/bf16 widening). Tuned for the socket transport's
/// model: ~25 us per message, ~2.5 GB/s per link.
///
/// Up to `DIRECT_MAX_RANKS` members the choices are the measured small-N ones. Above, the
/// number of distinct peers a rank touches matters as much as time: connections are opened on
/// demand, each costs a file descriptor and a handshake, and a 1024-rank job has a budget of
/// about 4 per rank for the algorithms. So large groups use binomial trees (N-1 edges in all,
/// 2 per rank on average; every tree is rooted at rank 0 unless the caller names a root, so
/// allreduce, barrier and broadcast from 0 share their edges) and rings (2 per rank), chosen
/// between by the cost model below. Recursive doubling / halving and dissemination (log N
/// peers per rank) are not used for that reason.
pub mod tuning {
    use super::allgather::Algo as Allgather;
    use super::allreduce::Algo as Allreduce;
    use super::barrier::Algo as Barrier;
    use super::broadcast::Algo as Broadcast;
    use super::gather::Algo as Gather;
    use super::reduce_coll::Algo as Reduce;
    use super::reduce_scatter::Algo as ReduceScatter;

    /// allreduce up to this many bytes per rank, at most `DIRECT_MAX_RANKS` members: every rank
    /// sends its input to every other rank and reduces all inputs in rank order (one message
    /// latency). Above: ring reduce-scatter + ring allgather (bandwidth optimal, 2(n-1) steps).
    /// Crossover of the cost model is ~150-300 KiB for 3..8 ranks; kept lower because the
    /// direct algorithm costs n x memory and n-1 concurrent messages per rank.
    pub const ALLREDUCE_SMALL_BYTES: usize = 64 << 10;
    /// reduce_scatter up to this many bytes of total input per rank: direct (each block sent to
    /// its owner, reduced in rank order), or in large groups a tree (see `reduce_scatter`).
    /// Above: ring.
    pub const REDUCE_SCATTER_SMALL_BYTES: usize = 64 << 10;
    /// reduce up to this many bytes: binomial tree (combines in rank order from the root).
    /// Above: ring reduce-scatter, then the finished chunks go to the root (directly up to
    /// `DIRECT_MAX_RANKS` members, up a binomial tree above). Larger groups move the
    /// threshold up with the cost model (`reduce`).
    pub const REDUCE_SMALL_BYTES: usize = 256 << 10;
    /// broadcast up to this many bytes (or with 2 ranks, or on a crowded host): binomial tree.
    /// Above: pipelined chain (for more than `DIRECT_MAX_RANKS` members only where the cost
    /// model says the chain wins).
    pub const BROADCAST_SMALL_BYTES: usize = 1 << 20;
    /// Pipelined-chain segment: len/16 clamped to [MIN, MAX].
    pub const BROADCAST_SEGMENT_MIN: usize = 64 << 10;
    pub const BROADCAST_SEGMENT_MAX: usize = 256 << 10;
    /// allgather(v) up to this many bytes of total output: direct (every rank sends its block
    /// to every other rank at once) up to `DIRECT_MAX_RANKS` members, Bruck (ceil(log2 n)
    /// steps) above. Above the threshold: ring.
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

    /// Groups up to this size keep the all-to-all-peers algorithms (direct small allreduce,
    /// direct allgather, direct gather/scatter, dissemination barrier): at 8 members they touch
    /// 7 peers (dissemination 6), within what a small job's connections cost, and they finish
    /// in one (dissemination: log2 n) message latency where a tree needs 2 log2 n. Above it the
    /// peers (N-1 per rank) and messages (N(N-1)) grow past any fd budget long before the
    /// latency advantage is gone (at 1024 members direct needs 1023 connections per rank).
    pub const DIRECT_MAX_RANKS: usize = 8;

    /// Cost model: one message's latency (ns) and a link's bandwidth (bytes per us).
    pub const MODEL_LATENCY_NS: u64 = 25_000;
    pub const MODEL_BYTES_PER_US: u64 = 2_500;
    /// Bytes a link moves in one message latency (alpha x beta): 62.5 KB.
    const LATENCY_BYTES: u64 = MODEL_LATENCY_NS * MODEL_BYTES_PER_US / 1000;

    /// ceil(log2 n) (0 for n <= 1): rounds of a binomial tree.
    pub fn ceil_log2(n: usize) -> usize {
        n.max(1).next_power_of_two().trailing_zeros() as usize
    }

    /// Largest allreduce (bytes) for which binomial reduce + binomial broadcast beats the ring
    /// in the model, for groups above `DIRECT_MAX_RANKS`: tree 2L(a + S/b) against ring
    /// 2(n-1)a + 2S/b (L = ceil(log2 n)) gives S <= a b (n-1-L)/(L-1): 83 KB at 9 ranks,
    /// 229 KB at 16, 2.2 MB at 256, 7 MB at 1024.
    pub fn allreduce_tree_max_bytes(n: usize) -> usize {
        let l = ceil_log2(n) as u64;
        if l < 2 {
            return 0;
        }
        (LATENCY_BYTES * (n as u64 - 1).saturating_sub(l) / (l - 1)) as usize
    }

    /// allreduce (flat: the hierarchical form calls this for each of its levels).
    pub(crate) fn allreduce(n: usize, bytes: usize) -> Allreduce {
        let ring = Allreduce::Ring {
            seg: RING_SEGMENT_BYTES,
        };
        if n <= DIRECT_MAX_RANKS {
            if bytes <= ALLREDUCE_SMALL_BYTES {
                Allreduce::Direct
            } else {
                ring
            }
        } else if bytes <= allreduce_tree_max_bytes(n) {
            Allreduce::Tree
        } else {
            ring
        }
    }

    /// reduce: the tree up to `REDUCE_SMALL_BYTES`, and for groups above `DIRECT_MAX_RANKS` up
    /// to where the model's tree L(a + S/b) meets the ring's (n-1+L)a + 2S/b: S <= a b (n-1)/(L-2)
    /// (469 KB at 16 ranks, 8 MB at 1024).
    pub(crate) fn reduce(n: usize, bytes: usize) -> Reduce {
        let mut max = REDUCE_SMALL_BYTES;
        if n > DIRECT_MAX_RANKS {
            let l = ceil_log2(n) as u64;
            max = max.max((LATENCY_BYTES * (n as u64 - 1) / (l - 2)) as usize);
        }
        if bytes <= max {
            Reduce::Tree
        } else {
            Reduce::Ring {
                seg: RING_SEGMENT_BYTES,
            }
        }
    }

    /// Pipelined-chain segment for a buffer of `len` bytes.
    pub(crate) fn chain_segment(len: usize) -> usize {
        (len / 16).clamp(BROADCAST_SEGMENT_MIN, BROADCAST_SEGMENT_MAX)
    }

    /// broadcast: tree for small buffers and 2 ranks; above `BROADCAST_SMALL_BYTES` the chain,
    /// except in groups above `DIRECT_MAX_RANKS` where the model's chain
    /// (segments + n - 2)(a + seg/b) loses to the tree's L(a + S/b) (the chain's n-2 fill steps
    /// dominate: at 1024 ranks the tree wins up to ~38 MB), and among `crowded` members (one
    /// host running more ranks than it has cores): there the chain's pipelining has no core to
    /// overlap on and each of its segments waits for its rank to get one, where the tree moves
    /// the same bytes in n-1 whole messages, as Gloo does. Measured (DC_TRANSPORT=socket, 2
    /// cores, dc-bench, 5 interleaved rounds, medians of tree/chain time): 4 ranks 16 MiB 0.68,
    /// 4 MiB 0.44, 16 MiB beside a busy process 0.80; 3 ranks 16 MiB 0.48.
    pub(crate) fn broadcast(n: usize, bytes: usize, crowded: bool) -> Broadcast {
        if n <= 2 || bytes <= BROADCAST_SMALL_BYTES || crowded {
            return Broadcast::Tree;
        }
        let seg = chain_segment(bytes);
        let chain = Broadcast::Chain { seg };
        if n <= DIRECT_MAX_RANKS {
            return chain;
        }
        let step_ns = |b: usize| MODEL_LATENCY_NS as u128 + b as u128 * 1000 / MODEL_BYTES_PER_US as u128;
        let chain_ns = (bytes.div_ceil(seg) + n - 2) as u128 * step_ns(seg);
        let tree_ns = ceil_log2(n) as u128 * step_ns(bytes);
        if tree_ns <= chain_ns {
            Broadcast::Tree
        } else {
            chain
        }
    }

    /// barrier: dissemination (ceil(log2 n) rounds, 2 log2 n peers) up to `DIRECT_MAX_RANKS`,
    /// binomial fan-in to rank 0 and fan-out above (2 ceil(log2 n) rounds, the allreduce tree's
    /// edges).
    pub(crate) fn barrier(n: usize) -> Barrier {
        if n <= DIRECT_MAX_RANKS {
            Barrier::Dissemination
        } else {
            Barrier::Tree
        }
    }

    /// allgather(v), by the total output: direct up to `ALLGATHER_SMALL_BYTES` in small groups,
    /// Bruck in large ones (ceil(log2 n) steps where the ring needs n-1; it touches
    /// 2 log2 n peers per rank, which allgather, unlike allreduce and barrier, may spend),
    /// ring above.
    pub(crate) fn allgather(n: usize, total_bytes: usize) -> Allgather {
        if total_bytes > ALLGATHER_SMALL_BYTES {
            Allgather::Ring
        } else if n <= DIRECT_MAX_RANKS {
            Allgather::Direct
        } else {
            Allgather::Bruck
        }
    }

    /// reduce_scatter, by the total input per rank: up to `REDUCE_SCATTER_SMALL_BYTES` direct
    /// in small groups (one message latency) and a tree reduce then tree scatter in large ones
    /// (2 log2 n steps on the tree's edges instead of n-1 peers per rank); ring above.
    pub(crate) fn reduce_scatter(n: usize, total_bytes: usize) -> ReduceScatter {
        if total_bytes > REDUCE_SCATTER_SMALL_BYTES {
            ReduceScatter::Ring { seg: RING_SEGMENT_BYTES }
        } else if n <= DIRECT_MAX_RANKS {
            ReduceScatter::Direct
        } else {
            ReduceScatter::Tree
        }
    }

    /// alltoall blocks up to this size in groups above `DIRECT_MAX_RANKS` go by Bruck.
    /// Bruck sends ceil(log2 n) messages of ~n/2 blocks where direct sends n-1 of one block:
    /// it pays (log2 n)/2 times the bytes to save n-1-log2 n message costs, which the model
    /// says pays while a block is below ~2 a b / log2 n (12 KB at 1024 ranks); kept lower, as
    /// the extra copies (pack and unpack at every step) are not in the model.
    pub const ALLTOALL_BRUCK_MAX_BLOCK: usize = 2 << 10;

    /// alltoall: Bruck for small blocks in large groups, else every block straight to its rank.
    pub(crate) fn alltoall_bruck(n: usize, block: usize) -> bool {
        n > DIRECT_MAX_RANKS && block <= ALLTOALL_BRUCK_MAX_BLOCK
    }

    /// gather and scatter: direct to / from the root up to `DIRECT_MAX_RANKS`, binomial tree
    /// above (the root talks to log2 n children instead of n-1 ranks; each block crosses at
    /// most log2 n links).
    pub(crate) fn gather(n: usize) -> Gather {
        if n <= DIRECT_MAX_RANKS {
            Gather::Direct
        } else {
            Gather::Tree
        }
    }
}

#[cfg(test)]
mod tests;
