//! Collectives over a shared-memory arena (all members on one host). The calling thread does
//! the work. Small ones (up to `Arena::eager_capacity`: 4 KiB up to 64 ranks, 2 KiB above) go
//! through the per-rank mailboxes (`run_eager`): writers post and go on, readers take what
//! they need. Larger ones take steps: data is staged
//! in per-rank slots, reduced in parallel with each rank owning a share of every chunk, and
//! copied out, chunk by chunk so it stays in cache; reductions up to 16 KiB take one step in
//! which everyone reduces every input in rank order. Every rank ends with the same bytes
//! because each value is computed once (large) or in the same order (small).
//!
//! Every collective stamps its mailbox slot with what it calls (signature and size); readers
//! compare the stamps they read, stepped collectives all stamps after their first step, so ranks
//! that disagree get `DC_ERR_MISMATCH` instead of garbage.

use crate::buffer::{ConstBuf, MutBuf};
use crate::collective::{describe, CollArgs};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result, Status};
use crate::reduce;
use crate::transport::shm::{Arena, Flag, Steps, EAGER_BYTES, IN_STAMP_LINE};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Reductions up to this many bytes take the one-step path.
pub const SMALL_REDUCE_BYTES: usize = 16 * 1024;
/// Elements reduced per block (keeps the f32 scratch of half types in L1).
const REDUCE_BLOCK: usize = 4096;
/// An alltoall of at least this many bytes (per rank, all blocks) reads the others' send
/// buffers directly (one copy) instead of staging through the arena (see `run`).
const ALLTOALL_DIRECT_MIN: usize = 64 * 1024;
/// From this size an alltoall is staged or read directly, whichever has lately been faster for
/// rank 0 (see `pick`): on 2026-12-07 (VM in its fast state, 2 ranks, dc-bench, 3 runs) staged
/// took 0.5-0.8x the direct time from 256 KiB to 16 MiB; the measures at `Alltoall` below, in
/// the slow state, had direct 4-5x ahead at 1 MiB.
const ALLTOALL_MEASURED_MIN: usize = 256 * 1024;
/// From this size (the root's whole buffer) a gather or scatter is staged or read directly
/// (the root reading every block, or every rank its block from the root), whichever has lately
/// been faster for rank 0 (see `pick`). Staged only, MPICH 5 read these directly and was ahead
/// on 2026-12-07 (its library against ours, 2 ranks, 5 rounds): scatter 1 MiB 96 against 69 us
/// in every round, gather 16 MiB 4.5 against 2.2 ms in four of five.
const ROOTED_MEASURED_MIN: usize = 256 * 1024;

/// Allgather blocks (bytes per rank) in this range are read straight from the others' buffers
/// (one copy) where the host's cores are not outnumbered by its ranks; other sizes are staged.
/// Measured (dc-bench, 2 ranks, 5 interleaved rounds, medians of direct/staged time): blocks of
/// 16 KiB 1.22, 32 KiB 0.86, 64 KiB 0.67-0.72, 128 KiB 0.67, 256 KiB 1.10, 512 KiB 1.31 idle;
/// beside a busy process 32 KiB 0.69, 64 KiB 0.27, 128 KiB 0.19 (the staged copy falls into its
/// slow mode there), 256 KiB 1.13. With 4 ranks on the 2 cores direct was 1.25-1.87x slower.
const ALLGATHER_DIRECT_BLOCKS: std::ops::RangeInclusive<usize> = 32 * 1024..=128 * 1024;

/// Allgather blocks of at least this many bytes are staged or read directly, whichever rank 0
/// measured to be faster lately (see `pick`): on this VM the staged copy is faster by 10-30%
/// most of the time and 4-6x slower in the minutes its two vCPUs sit far apart (a 1 MiB
/// allgather of 2 ranks, 512 KiB blocks: 42 us, then 254-344 us for minutes, while Open MPI's
/// single copy stayed at 43). Blocks below it are read directly (`ALLGATHER_DIRECT_BLOCKS`)
/// or staged; the pick's one call in 32 the slower way costs about 1% here.
const ALLGATHER_MEASURED_MIN: usize = 256 * 1024;

/// Allreduces and reduce_scatters of at least this many bytes (the whole input) are staged or
/// read once, whichever rank 0 measured to be faster lately (see `pick`), for the same reason:
/// read once they took 1.2-1.9x the staged time in the fast state (reduce_scatter 1-16 MiB,
/// allreduce 1.2-1.6x) and 0.29x (reduce_scatter) and 0.24-0.57x (allreduce) in the far one.
/// Against always staged (2 ranks, interleaved, the ping-pong probe telling the states apart):
/// allreduce 64 / 128 / 512 KiB 1.02 / 0.89 / 1.01 near and 0.32 / 0.25 / 0.25 far,
/// reduce_scatter 64 / 256 / 512 KiB 1.03 / 1.00 / 1.00 and 0.36 / 0.25 / 0.27. Not below: 32
/// KiB was 1.05 near (the pick's own cost shows on a 5 us call) and 0.43 far.
const REDUCE_MEASURED_MIN: usize = 64 * 1024;
/// Bytes of each other rank's input read at a time when a reduction reads them once: the
/// pieces and the output stay in the cache for the reduction (32 KiB pieces were 1.15-1.2x
/// slower at 4-16 MiB; 512 KiB 0.89-0.96x in 3 rounds, not taken up yet), and all pieces of a
/// step together at most `READ_PIECES_MAX` (many ranks, smaller pieces).
const READ_PIECE: usize = 128 * 1024;
const READ_PIECES_MAX: usize = 1 << 20;
/// Bytes before the counts in an alltoallv's mailbox post: rank 0's choice, and whether the
/// poster's counts and data follow (see `alltoallv`).
const A2AV_HEAD: usize = 16;

/// Where an alltoallv post of `n` ranks' counts (2 bytes each, the poster's own 0) puts its
/// data: the blocks for the other ranks, in rank order.
fn a2av_data_at(n: usize) -> usize {
    A2AV_HEAD + (2 * n).next_multiple_of(8)
}

/// The count for rank `j` in an alltoallv post.
fn a2av_count(post: &[u8], j: usize) -> usize {
    u16::from_le_bytes([post[A2AV_HEAD + 2 * j], post[A2AV_HEAD + 2 * j + 1]]) as usize
}
/// Words a measured collective posts with its stamp, at most (see `measured`).
const MEASURED_WORDS: usize = 3;

/// A broadcast of at least this many bytes is staged through the arena or read directly from
/// the root's buffer (one copy), whichever has lately been faster for the root (see `pick`).
/// Neither wins everywhere: idle, staged took half the direct time at 64 and 128 KiB (MPI
/// layer, 2 ranks: 3.6 against 7.3 us, MPICH 3.6; the root stages and goes on while the
/// reader copies out the step before, where a direct read keeps the root until the reader is
/// done), while staged copies have a mode 3-5x slower that direct reads do not show (direct
/// took 0.07-0.36x the staged time at 64 KiB beside a busy process in an earlier run). Against
/// always direct (2026-12-06, dc-bench, 5 interleaved rounds): 64 / 128 KiB 0.47 / 0.52 idle,
/// 0.43 / 0.57 beside a busy process (dcrun), 0.51 / 0.54 under a plain launcher; 4 ranks on
/// the 2 cores 0.37 / 0.46.
const BROADCAST_MEASURED_MIN: usize = 64 * 1024;

/// A broadcast of at least this many bytes that goes with one copy (the pick's second way,
/// see `broadcast_measured`) is copied by the root and the readers together (see
/// `broadcast_shared`), in pieces of a quarter of it (64 KiB to `BROADCAST_SHARED_PIECE`)
/// claimed one at a time. Until 2026-12-07 that was the only way from here, but staged is
/// faster on a quiet machine (dc-bench, 5 interleaved rounds, measured/always-shared time: 2
/// ranks 256 KiB / 1 / 4 / 16 MiB 0.39 / 0.45 / 0.53 / 0.47 idle, 0.35 / 0.46 / 0.57 / 1.01
/// beside a busy process, 0.34 / 0.52 / 0.52 / 0.80 under a plain launcher; 4 ranks idle 0.36 /
/// 0.41 / 0.81 / 0.92), and shared reads win in the VM's slow minutes. Measured against the
/// readers alone reading it (dc-bench, 5-7
/// interleaved rounds, medians of shared/direct time): 2 ranks 256 KiB 0.78, 512 KiB 0.58,
/// 1 MiB 0.62, 4 MiB 0.56, 16 MiB 0.52 idle; beside a busy process 256 KiB 0.78, 512 KiB 0.37,
/// 1 MiB 0.43, 16 MiB 0.74 under dcrun and 0.81-0.84 under a plain launcher; 4 ranks on the 2
/// cores 256 KiB 0.82, 1 MiB 0.87-0.92, 16 MiB 0.88. At 128 KiB 0.71 with 2 ranks but 1.10
/// with 4; below, one piece leaves nothing to share.
const BROADCAST_SHARED_MIN: usize = 256 * 1024;
const BROADCAST_SHARED_PIECE: usize = 256 * 1024;
/// Words of each rank's slot in a shared broadcast: its buffer's address, the next piece of
/// it to claim, and the piece the root failed to write (plus one; 0: none).
const SHARED_ADDR: usize = 0;
const SHARED_NEXT: usize = 1;
const SHARED_FAILED: usize = 2;

/// Reusable memory of a comm's shared-memory collectives (no allocation per call).
#[derive(Default)]
pub struct Scratch {
    /// The reductions' scratch (see `reduce_ordered`).
    bytes: Vec<u8>,
    /// An alltoallv's mailbox post, built before it is copied in.
    post: Vec<u8>,
    inputs: Vec<*const u8>,
    /// The others' parts of a reduction read once (see `reduce_read_once`).
    remote: Vec<u8>,
    /// Rank 0's (a broadcast's root's) measures of the collectives made two ways: staged
    /// (first) or read directly (second), indexed by `Measured`.
    picks: [crate::pick::BySize; 8],
}

/// Where the members' buffer addresses for a read-once collective are: in their staging slots
/// of a step, or posted with their stamps (see `measured`).
#[derive(Clone, Copy)]
enum Published {
    Step(u32),
    Posted,
}

/// The collectives that are staged or read once, whichever rank 0 measured faster lately.
#[derive(Clone, Copy)]
enum Measured {
    Allgather,
    Allreduce,
    ReduceScatter,
    /// Staged (first) or read directly; the root's times.
    Broadcast,
    Alltoall,
    /// Staged (first) or read directly, by rank 0's bytes sent (see `alltoallv`).
    Alltoallv,
    /// Staged (first) or read directly, by the root's whole buffer.
    Gather,
    Scatter,
}

impl Measured {
    /// The smallest call measured: the first size class of its picks.
    fn min_bytes(self) -> usize {
        match self {
            Measured::Allgather => ALLGATHER_MEASURED_MIN,
            Measured::Allreduce | Measured::ReduceScatter => REDUCE_MEASURED_MIN,
            Measured::Broadcast => BROADCAST_MEASURED_MIN,
            Measured::Alltoall | Measured::Alltoallv => ALLTOALL_MEASURED_MIN,
            Measured::Gather | Measured::Scatter => ROOTED_MEASURED_MIN,
        }
    }
}

// SAFETY: the pointers are only used within one collective call, under the comm's turn.
unsafe impl Send for Scratch {}

/// One collective call's view of the arena.
pub struct ShmRun<'a> {
    pub arena: &'a Arena,
    pub steps: &'a Steps,
    /// The collective's deadline, asked for only when a wait outlasts its spinning.
    pub deadline: &'a dyn Fn() -> Instant,
    /// Why waiting for a member (comm rank) is pointless (abort, that member gone), if it is.
    pub interrupt: &'a dyn Fn(usize) -> Option<Error>,
    scratch: &'a mut Scratch,
    /// Members' pids when every member's memory is readable (single-copy v-forms).
    pids: Option<&'a [i32]>,
    /// This collective's number on the comm (the same on every member).
    coll: u32,
    first: bool,
    /// Our mailbox slot holds this collective's stamp already (see `measured`).
    posted: bool,
    sig: u32,
    bytes: u64,
    /// Whether a staged broadcast stages in parts of slots (`Arena::my_part`), so that its root
    /// can run many steps ahead, rather than in the two whole slots: where the host's ranks
    /// outnumber its cores each step otherwise waits for every reader to get a core. dc-bench,
    /// 4 ranks on the 2 cores, 5 interleaved rounds, parts/whole time: 4 / 8 / 16 KiB 0.17 /
    /// 0.25 / 0.40, 32 / 48 KiB 0.60 / 0.70, 64 / 128 KiB 0.88 / 0.87. Not with a core per rank:
    /// 2 ranks idle 16 KiB 1.37 (the parts' 512 KiB leave the cache where two slots stay), 4 KiB
    /// 1.05, beside a busy process 0.55-1.19 (noise).
    pub stage_in_parts: bool,
}

fn copy(src: *const u8, dst: *mut u8, n: usize) {
    if n > 0 {
        // SAFETY: callers pass ranges inside validated caller buffers or arena slots, and the
        // step protocol guarantees no concurrent writer; ranges of one call never overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
    }
}

/// `out = in_0 op in_1 op ... op in_{k-1}` over `len` bytes in the given order; half types reduce
/// in f32 and round once; `Avg` divides by `avg_n`. `out` may be one of the inputs.
///
/// # Safety
/// Every input and `out` must be valid for `len` bytes.
unsafe fn reduce_ordered(dt: DType, op: ReduceOp, avg_n: usize, inputs: &[*const u8], out: *mut u8, len: usize, scratch: &mut Vec<u8>) {
    let es = dt.size();
    let widen = reduce::needs_widen(dt, op);
    let aliased = inputs.iter().any(|&p| crate::buffer::overlaps(p as usize, len, out as usize, len));
    if !widen && !aliased && inputs.len() >= 2 && len > 0 {
        // Straight into `out`: one pass fewer than through the scratch block.
        let o = std::slice::from_raw_parts_mut(out, len);
        let part = |i: usize| std::slice::from_raw_parts(inputs[i], len);
        reduce::combine_into(dt, op, o, part(0), part(1));
        for i in 2..inputs.len() {
            reduce::combine(dt, op, o, part(i));
        }
        if op == ReduceOp::Avg {
            reduce::divide(dt, o, avg_n);
        }
        return;
    }
    let blk = REDUCE_BLOCK * es;
    let need = if widen { 4 * blk } else { blk };
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    let mut off = 0;
    while off < len {
        let n = blk.min(len - off);
        let part = |i: usize| std::slice::from_raw_parts(inputs[i].add(off), n);
        if widen {
            let (acc, tmp) = scratch[..4 * blk].split_at_mut(2 * blk);
            let (acc, tmp) = (&mut acc[..2 * n], &mut tmp[..2 * n]);
            reduce::widen(dt, part(0), acc);
            for i in 1..inputs.len() {
                reduce::widen(dt, part(i), tmp);
                reduce::combine(DType::Float32, op, acc, tmp);
            }
            if op == ReduceOp::Avg {
                reduce::divide(DType::Float32, acc, avg_n);
            }
            reduce::narrow(dt, acc, std::slice::from_raw_parts_mut(out.add(off), n));
        } else {
            let acc = &mut scratch[..n];
            acc.copy_from_slice(part(0));
            for i in 1..inputs.len() {
                reduce::combine(dt, op, acc, part(i));
            }
            if op == ReduceOp::Avg {
                reduce::divide(dt, acc, avg_n);
            }
            std::ptr::copy_nonoverlapping(acc.as_ptr(), out.add(off), n);
        }
        off += n;
    }
}

/// Splits `len` bytes of `es`-byte elements into `parts` nearly equal element-aligned pieces;
/// returns piece `i` as (offset, length).
fn share(len: usize, es: usize, parts: usize, i: usize) -> (usize, usize) {
    let elems = len / es;
    let (base, extra) = (elems / parts, elems % parts);
    let start = i * base + i.min(extra);
    let n = base + usize::from(i < extra);
    (start * es, n * es)
}

/// Word `i` of posted bytes.
fn word_at(posted: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(posted[i * 8..i * 8 + 8].try_into().unwrap())
}

/// Counts and displacements of `n` blocks of `block` bytes, one after the other.
fn even_blocks(n: usize, block: usize) -> (Vec<usize>, Vec<usize>) {
    (vec![block; n], (0..n).map(|r| r * block).collect())
}

/// Where each rank's block of an allgather(v) or gather lies in the receive buffer.
#[derive(Clone, Copy)]
enum Blocks<'b> {
    /// `block` bytes each, rank r's at r * block.
    Even(usize),
    /// Rank r's `counts[r]` bytes at `displs[r]`.
    Listed { counts: &'b [usize], displs: &'b [usize] },
}

impl Blocks<'_> {
    /// Rank `r`'s block: (offset, length).
    fn of(self, r: usize) -> (usize, usize) {
        match self {
            Blocks::Even(b) => (r * b, b),
            Blocks::Listed { counts, displs } => (displs[r], counts[r]),
        }
    }

    /// The longest block (the same on every rank: the lists are the collective's arguments).
    fn largest(self) -> usize {
        match self {
            Blocks::Even(b) => b,
            Blocks::Listed { counts, .. } => counts.iter().copied().max().unwrap_or(0),
        }
    }
}

/// The (offset, length) pieces of `total` bytes, at most `piece` each; always at least one
/// (possibly empty), so every rank takes the same steps even for an empty call.
fn pieces(total: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    let steps = total.div_ceil(piece.max(1)).max(1);
    (0..steps).map(move |i| (i * piece, piece.min(total - (i * piece).min(total))))
}

/// The part of a block of `len` bytes that the piece at `off` of `p` bytes covers: its offset in
/// the block and its length (empty past the block's end). Blocks of different lengths step by
/// the longest one's pieces.
fn piece_of(len: usize, off: usize, p: usize) -> (usize, usize) {
    (off.min(len), p.min(len.saturating_sub(off)))
}

/// Largest piece (bytes, element-aligned) of which `k` fit in one slot.
fn piece_for(chunk: usize, k: usize, es: usize) -> usize {
    ((chunk / k.max(1)) / es * es).max(es)
}

/// Where in `owner`'s slot the piece for rank `j` goes when the owner stages a piece for every
/// rank but itself (`n - 1` pieces a slot: no room kept for its own, which it copies directly;
/// at 2 ranks that halves the steps of a scatter or alltoall).
fn piece_place(j: usize, owner: usize) -> usize {
    j - usize::from(j > owner)
}

impl<'a> ShmRun<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        arena: &'a Arena,
        steps: &'a Steps,
        coll: u32,
        deadline: &'a dyn Fn() -> Instant,
        interrupt: &'a dyn Fn(usize) -> Option<Error>,
        scratch: &'a mut Scratch,
        pids: Option<&'a [i32]>,
    ) -> ShmRun<'a> {
        let stage_in_parts = crate::completion::oversubscribed();
        ShmRun { arena, steps, deadline, interrupt, scratch, pids, coll, first: true, posted: false, sig: 0, bytes: 0, stage_in_parts }
    }

    fn n(&self) -> usize {
        self.arena.ranks()
    }

    /// Sets the reduction inputs, one per rank in rank order.
    fn set_inputs(&mut self, f: impl Fn(usize) -> *const u8) {
        let n = self.n();
        self.scratch.inputs.clear();
        self.scratch.inputs.extend((0..n).map(f));
    }

    /// Reduces the inputs set by `set_inputs` into `out`.
    unsafe fn reduce(&mut self, dt: DType, op: ReduceOp, avg_n: usize, out: *mut u8, len: usize) {
        let Scratch { bytes, inputs, .. } = &mut *self.scratch;
        reduce_ordered(dt, op, avg_n, inputs, out, len, bytes);
    }

    fn me(&self) -> usize {
        self.arena.rank()
    }

    /// Starts a step: returns its number (the caller then fills its staging slot). The first
    /// step of a collective stamps our mailbox slot with what we call, for `staged` to compare.
    fn begin(&mut self) -> Result<u32> {
        let s = self.next_step()?;
        self.steps.staged_whole(s);
        // Our staging slot for `s` was last read at step s - 2; everyone reaching s - 1 says
        // that is over. Only a step that did not wait for everyone (`staged_from`) leaves it open.
        self.everyone_past(s.wrapping_sub(1))?;
        Ok(s)
    }

    /// Starts a step that stages at most `Arena::part_bytes` in our part of a slot (`my_part`)
    /// if `writes`, and nothing otherwise: a writer waits only until its readers are done with
    /// that part (`Steps::part_needs`), so it may run many steps ahead of them.
    fn begin_part(&mut self, writes: bool) -> Result<u32> {
        let s = self.next_step()?;
        if writes {
            self.everyone_past(self.steps.part_needs(s))?;
        }
        Ok(s)
    }

    /// Takes the next step's number; the collective's first step stamps our mailbox slot with
    /// what we call first (unless `measured` posted it already).
    fn next_step(&mut self) -> Result<u32> {
        if self.first && !self.posted {
            self.post(&[])?;
        }
        Ok(self.steps.next())
    }

    /// Waits until every rank has reached step `s`, unless that is known already.
    fn everyone_past(&self, s: u32) -> Result<()> {
        if !self.steps.all_reached(s) {
            self.arena.wait_all(Flag::Stage, s, self.deadline, self.interrupt)?;
            self.steps.everyone_reached(s);
        }
        Ok(())
    }

    /// Posts this collective's stamp (what we call) and `data` in our mailbox slot.
    fn post(&self, data: &[u8]) -> Result<()> {
        self.arena.post(self.coll, self.sig, self.bytes, data, self.deadline, self.interrupt)
    }

    /// Publishes our staging for step `s` and waits for everyone's; on the collective's first
    /// step also checks that everyone is calling the same thing.
    fn staged(&mut self, s: u32) -> Result<()> {
        self.arena.publish(Flag::Stage, s);
        if !std::mem::take(&mut self.first) {
            self.arena.wait_all(Flag::Stage, s, self.deadline, self.interrupt)?;
            self.steps.everyone_reached(s);
            return Ok(());
        }
        // First step: a rank that calls something else may never publish this step (it went
        // the mailbox way): its stamp says so meanwhile. Once every rank has published the
        // step, its stamp (posted before) must match ours.
        self.arena.wait_all(Flag::Stage, s, self.deadline, &|r| self.interrupted_or_elsewhere(r))?;
        self.steps.everyone_reached(s);
        (0..self.n()).filter(|&r| r != self.me()).try_for_each(|r| self.agreed(r))
    }

    /// Publishes our staging for step `s` and waits only for `from`'s (not at all if we are
    /// `from`): a step with one writer, whose readers copy out while the writer goes on. On
    /// the collective's first step the readers check the writer's stamp.
    fn staged_from(&mut self, s: u32, from: usize) -> Result<()> {
        self.arena.publish(Flag::Stage, s);
        let first = std::mem::take(&mut self.first);
        if self.me() == from {
            return Ok(());
        }
        if !first {
            return self.arena.wait_one(from, Flag::Stage, s, self.deadline, self.interrupt);
        }
        self.arena.wait_one(from, Flag::Stage, s, self.deadline, &|r| self.interrupted_or_elsewhere(r))?;
        self.agreed(from)
    }

    /// Why waiting for rank `r` at a collective's first step is pointless: an interruption, or
    /// its stamp saying it calls something else.
    fn interrupted_or_elsewhere(&self, r: usize) -> Option<Error> {
        (self.interrupt)(r).or_else(|| self.arena.peek(r, self.coll).and_then(|(sig, len)| self.disagreement(r, sig, len)))
    }

    /// Checks, once rank `r` has reached this collective's first step, that it calls what we do.
    fn agreed(&self, r: usize) -> Result<()> {
        match self.arena.peek(r, self.coll) {
            Some((sig, len)) => self.disagreement(r, sig, len).map_or(Ok(()), Err),
            None => Err(Error::new(
                Status::Mismatch,
                format!("rank {r} is at another collective than rank {}'s ({} on {} bytes): a rank skipped or added a call", self.me(), describe(self.sig), self.bytes),
            )),
        }
    }

    /// The error if rank `r` calls `sig` on `len` bytes where we call something else.
    fn disagreement(&self, r: usize, sig: u32, len: u64) -> Option<Error> {
        (sig != self.sig || len != self.bytes).then(|| {
            Error::new(Status::Mismatch, format!("rank {r} called {} on {len} bytes where rank {} called {} on {} bytes", describe(sig), self.me(), describe(self.sig), self.bytes))
        })
    }

    fn results(&self, s: u32) -> Result<()> {
        self.arena.publish(Flag::Result, s);
        self.arena.wait_all(Flag::Result, s, self.deadline, self.interrupt)
    }

    /// Runs a collective whose posts fit a mailbox slot (`Arena::eager_capacity`: 4 KiB up to
    /// 64 ranks, else 2 KiB) through the mailboxes (see `transport::shm`): the root of a
    /// broadcast (the contributors of a reduce) post and go on, the others wait only for what
    /// they read. `None` for anything else.
    ///
    /// # Safety
    /// As for `run`.
    pub unsafe fn run_eager(&mut self, args: &CollArgs) -> Option<Result<()>> {
        self.sig = args.signature();
        let whole = |b: MutBuf| std::slice::from_raw_parts(b.as_ptr() as *const u8, b.len());
        // The large slots serve what was measured faster through them than staged (see
        // `LARGE_EAGER_BYTES`); alltoall and reduce_scatter were 12-18% slower there at 3-4
        // KiB (each rank reads a block of every post), so they keep to the small slots.
        let cap = self.arena.eager_capacity();
        Some(match args {
            // Everyone stamps its slot and waits for every other stamp.
            CollArgs::Barrier => {
                self.bytes = 0;
                self.post(&[]).and_then(|_| (0..self.n()).filter(|&r| r != self.me()).try_for_each(|r| self.fetch_agreeing(r).map(|_| ())))
            }
            CollArgs::Broadcast { buf, root, .. } if buf.len() <= cap => {
                self.bytes = buf.len() as u64;
                self.eager_broadcast(*buf, *root)
            }
            // Everyone posts its block and copies every other's.
            CollArgs::Allgather { send, recv, .. } if recv.len() / self.n() <= cap => {
                let block = recv.len() / self.n();
                self.bytes = block as u64;
                self.eager_allgatherv(*send, *recv, Blocks::Even(block))
            }
            CollArgs::Allgatherv { send, recv, counts, displs, .. } if counts.iter().all(|&c| c <= cap) => {
                self.bytes = counts.iter().sum::<usize>() as u64;
                self.eager_allgatherv(*send, *recv, Blocks::Listed { counts, displs })
            }
            // Everyone posts its whole send buffer and copies its block out of every other's.
            CollArgs::Alltoall { send, recv, .. } if recv.len() <= EAGER_BYTES => {
                let (n, me) = (self.n(), self.me());
                let block = recv.len() / n;
                self.bytes = recv.len() as u64;
                let all = send.as_slice();
                self.post(all).and_then(|_| self.gather_posted(me * block, Blocks::Even(block), *recv, all.as_ptr().add(me * block)))
            }
            // Everyone posts its whole input and reduces its own block of every rank's.
            CollArgs::ReduceScatter { send, recv, dt, op } if send.map_or(recv.len(), |s| s.len()) <= EAGER_BYTES => {
                let (n, me) = (self.n(), self.me());
                let (input, out) = match send {
                    Some(s) => (s.as_slice(), recv.as_ptr()),
                    None => (whole(*recv), recv.as_ptr().add(me * (recv.len() / n))),
                };
                let block = input.len() / n;
                self.bytes = input.len() as u64;
                self.post(input).and_then(|_| self.reduce_posted(input, me * block, block, out, *dt, *op))
            }
            // The others post their block and go on; the root copies every block.
            CollArgs::Gather { send, recv, root, .. } if send.len() <= cap => {
                self.bytes = send.len() as u64;
                self.eager_gather(*send, *recv, *root)
            }
            // The root posts every block and goes on; each other rank copies its own.
            CollArgs::Scatter { send, recv, root, .. } if recv.len() * self.n() <= cap => {
                self.bytes = recv.len() as u64;
                self.eager_scatter(*send, *recv, *root)
            }
            CollArgs::Allreduce { send, recv, dt, op } if recv.len() <= cap => {
                self.bytes = recv.len() as u64;
                let input = send.map_or_else(|| whole(*recv), |s| s.as_slice());
                self.eager_reduce(input, Some(*recv), *dt, *op, None)
            }
            CollArgs::Reduce { send, recv, bytes, dt, op, root } if *bytes <= cap => {
                self.bytes = *bytes as u64;
                let input = match (send, recv) {
                    (Some(s), _) => s.as_slice(),
                    (None, Some(r)) => whole(*r),
                    (None, None) => return Some(Err(Error::new(Status::Internal, "reduce without input"))),
                };
                let out = if self.me() == *root { *recv } else { None };
                self.eager_reduce(&input[..*bytes], out, *dt, *op, Some(*root))
            }
            _ => return None,
        })
    }

    /// Everyone posts its block (at most a slot's capacity) and copies every other's into its
    /// place.
    unsafe fn eager_allgatherv(&mut self, send: Option<ConstBuf>, recv: MutBuf, blocks: Blocks) -> Result<()> {
        let (at, len) = blocks.of(self.me());
        let mine = send.map_or_else(|| std::slice::from_raw_parts(recv.as_ptr().add(at) as *const u8, len), |s| s.as_slice());
        self.post(mine)?;
        self.gather_posted(0, blocks, recv, mine.as_ptr())
    }

    /// gather through the mailboxes: the others post their block and go on, as eager sends
    /// would; the root posts its stamp and copies every block into `recv`.
    unsafe fn eager_gather(&mut self, send: ConstBuf, recv: Option<MutBuf>, root: usize) -> Result<()> {
        let mine = send.as_slice();
        if self.me() != root {
            return self.post(mine);
        }
        let Some(recv) = recv else { return Err(Error::new(Status::InvalidArgument, "gather: the root needs a recv buffer")) };
        self.post(&[])?;
        self.gather_posted(0, Blocks::Even(mine.len()), recv, mine.as_ptr())
    }

    /// scatter through the mailboxes: the root posts every block (all of them at most
    /// the capacity) and goes on; the others post their stamp and copy their block out.
    unsafe fn eager_scatter(&mut self, send: Option<ConstBuf>, recv: MutBuf, root: usize) -> Result<()> {
        let (me, block) = (self.me(), recv.len());
        if me == root {
            let Some(send) = send else { return Err(Error::new(Status::InvalidArgument, "scatter: the root needs a send buffer")) };
            self.post(send.as_slice())?;
            copy(send.as_slice().as_ptr().add(me * block), recv.as_ptr(), block);
            return Ok(());
        }
        self.post(&[])?;
        // The root's post holds every block: longer than the size we agree on (one block).
        let posted = self.fetch_slot(root)?;
        copy(posted[me * block..][..block].as_ptr(), recv.as_ptr(), block);
        Ok(())
    }

    /// The root posts the data and goes on; the others post their stamp and copy the root's.
    unsafe fn eager_broadcast(&mut self, buf: MutBuf, root: usize) -> Result<()> {
        let whole = std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len());
        if self.me() == root {
            return self.post(whole);
        }
        self.post(&[])?;
        let data = self.fetch_agreeing(root)?;
        copy(data.as_ptr(), buf.as_ptr(), data.len());
        // Small broadcasts often come in runs whose root is ahead (see `Arena::prefetch_slot`).
        if data.len() <= IN_STAMP_LINE {
            self.arena.prefetch_slot(root, self.coll.wrapping_add(1));
        }
        Ok(())
    }

    /// Everyone posts its input (`root` Some: a reduce, whose root posts only its stamp and
    /// alone waits); the readers reduce all inputs in rank order, the same bytes everywhere.
    unsafe fn eager_reduce(&mut self, input: &[u8], out: Option<MutBuf>, dt: DType, op: ReduceOp, root: Option<usize>) -> Result<()> {
        let me = self.me();
        self.post(if root == Some(me) { &[] } else { input })?;
        match out.filter(|_| root.is_none_or(|r| r == me)) {
            Some(out) => self.reduce_posted(input, 0, input.len(), out.as_ptr(), dt, op),
            None => Ok(()),
        }
    }

    /// Reduces `len` bytes at offset `at` of every rank's posted data (ours: `own`) into `out`,
    /// in rank order.
    unsafe fn reduce_posted(&mut self, own: &[u8], at: usize, len: usize, out: *mut u8, dt: DType, op: ReduceOp) -> Result<()> {
        let me = self.me();
        // The inputs' list is taken out of the scratch while `fetch_agreeing` borrows us.
        let mut inputs = std::mem::take(&mut self.scratch.inputs);
        inputs.clear();
        let got = (0..self.n()).try_for_each(|r| {
            inputs.push(if r == me { own.as_ptr() } else { self.fetch_agreeing(r)?.as_ptr() }.add(at));
            Ok(())
        });
        self.scratch.inputs = inputs;
        got?;
        self.reduce(dt, op, self.n(), out, len);
        Ok(())
    }

    /// Copies each rank's block (its length in `blocks`, at most a slot's capacity) from offset
    /// `at` of its posted data into its place in `recv`, and our own block from `own`.
    unsafe fn gather_posted(&self, at: usize, blocks: Blocks, recv: MutBuf, own: *const u8) -> Result<()> {
        let me = self.me();
        for r in (0..self.n()).filter(|&r| r != me) {
            let (to, len) = blocks.of(r);
            let posted = self.fetch_agreeing(r)?;
            // The posted size agreed with ours, so it covers the block; checked all the same.
            let Some(data) = posted.get(at..at + len) else {
                return Err(Error::new(Status::Mismatch, format!("rank {r} posted {} bytes where rank {me} reads {len} at {at}", posted.len())));
            };
            copy(data.as_ptr(), recv.as_ptr().add(to), len);
        }
        let (to, len) = blocks.of(me);
        let mine = recv.as_ptr().add(to);
        if !std::ptr::eq(own, mine) {
            copy(own, mine, len);
        }
        Ok(())
    }

    /// Rank `r`'s mailbox data for this collective (as long as the size we agree on, at most
    /// its slot's), if it calls what we call.
    fn fetch_agreeing(&self, r: usize) -> Result<&'a [u8]> {
        let slot = self.fetch_slot(r)?;
        Ok(&slot[..(self.bytes as usize).min(slot.len())])
    }

    /// Rank `r`'s whole mailbox data area for this collective (a small slot's `EAGER_BYTES`, or
    /// the large slot where its data went), if it calls what we call: for data whose length the
    /// data itself says (see `alltoallv`, which posts at most `EAGER_BYTES`).
    fn fetch_slot(&self, r: usize) -> Result<&'a [u8]> {
        let (sig, len, data) = self.arena.fetch(r, self.coll, self.deadline, self.interrupt)?;
        self.disagreement(r, sig, len).map_or(Ok(data), Err)
    }

    /// Runs `args` on shared memory; `None` if this collective has no shared-memory algorithm.
    ///
    /// # Safety
    /// The buffers of `args` must be valid as the C surface promised.
    pub unsafe fn run(&mut self, args: &CollArgs) -> Option<Result<()>> {
        use CollArgs::*;
        self.sig = args.signature();
        Some(match args {
            // Through the mailboxes (see `run_eager`).
            Barrier => return None,
            Allreduce { send, recv, dt, op } => {
                self.bytes = recv.len() as u64;
                let input = send.unwrap_or(ConstBuf::new(recv.as_ptr(), recv.len()));
                if recv.len() >= REDUCE_MEASURED_MIN && self.spread() {
                    let words = [input.as_slice().as_ptr() as u64, recv.as_ptr() as u64];
                    return Some(self.measured(
                        Measured::Allreduce,
                        recv.len(),
                        &words,
                        |run| run.allreduce(input, Some(*recv), *dt, *op, None),
                        |run| run.allreduce_read_once(input, *recv, *dt, *op),
                    ));
                }
                self.allreduce(input, Some(*recv), *dt, *op, None)
            }
            Reduce { send, recv, bytes, dt, op, root } => {
                self.bytes = *bytes as u64;
                let input = match (send, recv) {
                    (Some(s), _) => *s,
                    (None, Some(r)) => ConstBuf::new(r.as_ptr(), r.len()),
                    (None, None) => return Some(Err(Error::new(Status::Internal, "reduce without input"))),
                };
                let out = if self.me() == *root { *recv } else { None };
                self.allreduce(input, out, *dt, *op, Some(*root))
            }
            Broadcast { buf, root, .. } => {
                self.bytes = buf.len() as u64;
                self.broadcast(*buf, *root)
            }
            Allgather { send, recv, .. } => {
                let block = recv.len() / self.n();
                self.bytes = block as u64;
                self.allgatherv(*send, *recv, Blocks::Even(block))
            }
            Allgatherv { send, recv, counts, displs, .. } => {
                self.bytes = counts.iter().sum::<usize>() as u64;
                self.allgatherv(*send, *recv, Blocks::Listed { counts, displs })
            }
            Alltoallv { send, scounts, sdispls, recv, rcounts, rdispls, .. } => {
                // The sizes differ from rank to rank: nothing to compare.
                self.bytes = 0;
                // Everyone's words (see `alltoallv_words`) in one slot, or the link does it.
                if (2 + 2 * self.n()) * 8 > self.arena.chunk() {
                    return None;
                }
                self.alltoallv(*send, scounts, sdispls, *recv, rcounts, rdispls)
            }
            ReduceScatter { send, recv, dt, op } => {
                let (input, out) = match send {
                    Some(s) => (*s, *recv),
                    None => {
                        let block = recv.len() / self.n();
                        let whole = ConstBuf::new(recv.as_ptr(), recv.len());
                        (whole, MutBuf::new(recv.as_ptr().add(self.me() * block), block))
                    }
                };
                self.bytes = input.len() as u64;
                if input.len() >= REDUCE_MEASURED_MIN && self.spread() {
                    return Some(self.measured(
                        Measured::ReduceScatter,
                        input.len(),
                        &[input.as_slice().as_ptr() as u64],
                        |run| run.reduce_scatter(input, out, *dt, *op),
                        |run| run.reduce_scatter_read_once(input, out, *dt, *op),
                    ));
                }
                self.reduce_scatter(input, out, *dt, *op)
            }
            Alltoall { send, recv, .. } => {
                let block = recv.len() / self.n();
                self.bytes = recv.len() as u64;
                // Large ones with one copy, each rank reading its blocks from the others' send
                // buffers: measured against the staged copy (dc-bench, 5 and 3 interleaved
                // runs, medians), 2 ranks 64 KiB 7.6 against 23 us, 1 MiB 79 against 392,
                // 16 MiB level; 4 ranks on 2 cores 64 KiB 32 against 83, 1 MiB 453 against
                // 1151, 16 MiB 13.5 against 19.7 ms. (The staged copy runs in two modes here,
                // one 3-4x slower; below 64 KiB it wins in both.)
                if recv.len() >= ALLTOALL_DIRECT_MIN && self.reads_directly() {
                    let (send, recv) = (*send, *recv);
                    let direct = move |run: &mut Self| {
                        let (counts, displs) = even_blocks(run.n(), block);
                        run.alltoallv_direct(send.as_slice().as_ptr(), &counts, &displs, recv, &counts, &displs)
                    };
                    if recv.len() >= ALLTOALL_MEASURED_MIN {
                        return Some(self.measured(Measured::Alltoall, recv.len(), &[], |run| run.alltoall(send, recv, block), direct));
                    }
                    return Some(direct(self));
                }
                self.alltoall(*send, *recv, block)
            }
            Gather { send, recv, root, .. } => {
                self.bytes = send.len() as u64;
                let (send, recv, root) = (*send, *recv, *root);
                let whole = send.len() * self.n();
                if whole >= ROOTED_MEASURED_MIN && self.reads_directly() {
                    return Some(self.measured(Measured::Gather, whole, &[], |run| run.gather(send, recv, root), |run| run.gather_direct(send, recv, root)));
                }
                self.gather(send, recv, root)
            }
            Scatter { send, recv, root, .. } => {
                self.bytes = recv.len() as u64;
                let (send, recv, root) = (*send, *recv, *root);
                let whole = recv.len() * self.n();
                if whole >= ROOTED_MEASURED_MIN && self.reads_directly() {
                    return Some(self.measured(Measured::Scatter, whole, &[], |run| run.scatter(send, recv, root), |run| run.scatter_direct(send, recv, root)));
                }
                self.scatter(send, recv, root)
            }
        })
    }

    /// Allreduce (`root: None`, result everywhere) or reduce (result only at `root`).
    unsafe fn allreduce(&mut self, input: ConstBuf, out: Option<MutBuf>, dt: DType, op: ReduceOp, root: Option<usize>) -> Result<()> {
        let (n, me, es) = (self.n(), self.me(), dt.size());
        let len = input.len();
        let src = input.as_slice().as_ptr();
        let avg_n = n;
        if len <= SMALL_REDUCE_BYTES.min(self.arena.chunk()) {
            // One step: stage everything, everyone (or the root) reduces all inputs in rank order.
            let s = self.begin()?;
            copy(src, self.arena.my_stage(s).as_mut_ptr(), len);
            self.staged(s)?;
            if let Some(o) = out {
                self.set_inputs(|r| self.arena.stage(r, s).as_ptr());
                self.reduce(dt, op, avg_n, o.as_ptr(), len);
            }
            return Ok(());
        }
        // Chunked: each rank owns one share of every chunk, reduces it once, publishes it.
        for (off, p) in pieces(len, piece_for(self.arena.chunk(), 1, es * n)) {
            let s = self.begin()?;
            let stage = self.arena.my_stage(s).as_mut_ptr();
            let (mine_at, mine_len) = share(p, es, n, me);
            // Stage what the other owners need (our own share is read from the input directly).
            copy(src.add(off), stage, mine_at);
            copy(src.add(off + mine_at + mine_len), stage.add(mine_at + mine_len), p - mine_at - mine_len);
            self.staged(s)?;
            let result = self.arena.result_ptr(s);
            let arena = self.arena;
            let inputs_at = |b: usize| move |r: usize| if r == me { src.add(off + mine_at + b) } else { arena.stage(r, s).as_ptr().add(mine_at + b) };
            match out.filter(|_| root.is_none_or(|r| r == me)) {
                Some(o) => {
                    // Our share goes straight into the output, block by block, and from there
                    // (still in L1) into the result slot for the others: no second pass over it.
                    let dst = o.as_ptr().add(off + mine_at);
                    for (b, m) in pieces(mine_len, REDUCE_BLOCK * es) {
                        let f = inputs_at(b);
                        self.set_inputs(f);
                        self.reduce(dt, op, avg_n, dst.add(b), m);
                        copy(dst.add(b), result.add(mine_at + b), m);
                    }
                    self.results(s)?;
                    for r in (0..n).filter(|&r| r != me) {
                        let (at, l) = share(p, es, n, r);
                        copy(result.add(at), o.as_ptr().add(off + at), l);
                    }
                }
                None => {
                    let f = inputs_at(0);
                    self.set_inputs(f);
                    self.reduce(dt, op, avg_n, result.add(mine_at), mine_len);
                    self.results(s)?;
                }
            }
        }
        Ok(())
    }

    /// Publishes `words` in our staging slot for a new step and waits for everyone's.
    fn exchange_words(&mut self, words: &[u64]) -> Result<u32> {
        let s = self.begin()?;
        let stage = self.arena.my_stage(s);
        for (i, w) in words.iter().enumerate() {
            stage[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        self.staged(s)?;
        Ok(s)
    }

    fn word(&self, r: usize, s: u32, i: usize) -> u64 {
        u64::from_le_bytes(self.arena.stage(r, s)[i * 8..i * 8 + 8].try_into().unwrap())
    }

    /// Copies `len` bytes at `remote` in member `r`'s memory to `dst`.
    unsafe fn read_from(&self, r: usize, remote: u64, dst: *mut u8, len: usize) -> Result<()> {
        let pid = self.pids.map_or(-1, |p| p[r]);
        crate::transport::cma::read(pid, remote, dst, len).map_err(|e| self.remote_failed(r, "reading", e))
    }

    /// Copies `len` bytes at `src` to `remote` in member `r`'s memory.
    unsafe fn write_to(&self, r: usize, remote: u64, src: *const u8, len: usize) -> Result<()> {
        let pid = self.pids.map_or(-1, |p| p[r]);
        crate::transport::cma::write(pid, remote, src, len).map_err(|e| self.remote_failed(r, "writing", e))
    }

    fn remote_failed(&self, r: usize, doing: &str, e: std::io::Error) -> Error {
        let gone = e.raw_os_error() == Some(libc::ESRCH);
        if gone {
            // The others may be waiting for a member that is alive but stops here with us
            // (our error ends our part in the collective); marked, their waits fail at once
            // naming `r` instead of running into the timeout.
            self.arena.mark_lost(r);
        }
        Error::new(if gone { Status::PeerLost } else { Status::System }, format!("{doing} rank {r}'s buffer failed: {e}"))
    }

    /// Ends a single-copy collective: nobody leaves (and reuses its buffers) before everyone
    /// has finished reading them.
    fn finish_reads(&mut self) -> Result<()> {
        let s = self.begin()?;
        self.staged(s)
    }

    /// allgather(v) beyond the mailboxes, by its largest block (the same on every rank): staged
    /// (two copies, pipelined through the arena) for large blocks, where a single
    /// `process_vm_readv` copy spends most of its time pinning the peer's pages one by one
    /// (15-60% slower from 256 KiB blocks; again on 2026-12-02 in medians: 1 MiB 76 against 52
    /// us, 16 MiB 4.7 against 4.1 ms, though the staged copy ran 4-7x slower in some runs).
    /// Mid-sized blocks are read directly (see `ALLGATHER_DIRECT_BLOCKS`); from
    /// `ALLGATHER_MEASURED_MIN` whichever is faster now.
    unsafe fn allgatherv(&mut self, send: Option<ConstBuf>, recv: MutBuf, blocks: Blocks) -> Result<()> {
        let largest = blocks.largest();
        let mine = send.map_or(recv.as_ptr().add(blocks.of(self.me()).0) as *const u8, |b| b.as_slice().as_ptr());
        let spread = self.spread();
        if ALLGATHER_DIRECT_BLOCKS.contains(&largest) && spread {
            return self.allgatherv_direct(mine, send.is_some(), recv, blocks);
        }
        if largest >= ALLGATHER_MEASURED_MIN && spread {
            return self.measured(
                Measured::Allgather,
                largest,
                &[mine as u64],
                |run| run.gather_staged(mine, Some(recv), blocks, None),
                |run| run.read_published_blocks(Published::Posted, mine, send.is_some(), recv, blocks),
            );
        }
        self.gather_staged(mine, Some(recv), blocks, None)
    }

    /// allgather(v) with one copy: each rank reads every other rank's block from its memory.
    unsafe fn allgatherv_direct(&mut self, mine: *const u8, out_of_place: bool, recv: MutBuf, blocks: Blocks) -> Result<()> {
        let s = self.exchange_words(&[mine as u64])?;
        self.read_published_blocks(Published::Step(s), mine, out_of_place, recv, blocks)
    }

    /// Whether collectives may read the others' memory, and the host's cores are not
    /// outnumbered by its ranks (where reading once came out slower).
    fn spread(&self) -> bool {
        self.pids.is_some() && !crate::completion::oversubscribed()
    }

    /// Runs a collective staged or read once, whichever has lately been faster for rank 0 at
    /// this size (see `pick`). Rank 0 says which in its mailbox slot, where every member also
    /// posts `words` (the read-once way's addresses) with its stamp: no step is added, and the
    /// staged way takes exactly its own steps (one more made it 15-20% slower at 1 MiB).
    unsafe fn measured(
        &mut self,
        what: Measured,
        size: usize,
        words: &[u64],
        staged: impl FnOnce(&mut Self) -> Result<()>,
        read_once: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let (me, bytes, started) = (self.me(), size, Instant::now());
        // The read-once allreduce writes into the others' outputs: not where that is hidden
        // from a memory checker (see `cma::writes_to_peers`).
        let may = !matches!(what, Measured::Allreduce) || crate::transport::cma::writes_to_peers();
        let once = me == 0 && may && self.pick(what, bytes).second();
        let mut posted = [0u64; MEASURED_WORDS];
        posted[..words.len()].copy_from_slice(words);
        posted[words.len()] = u64::from(once);
        self.post_words(&posted[..words.len() + 1])?;
        // Every member's stamp is compared before anyone goes on: one that calls something
        // else must not leave on seeing rank 0's alone, or the others would see it gone rather
        // than the mismatch (every member posts before it looks, so each finds the others').
        for r in (0..self.n()).filter(|&r| r != me) {
            self.fetch_agreeing(r)?;
        }
        let once = self.posted_word(0, words.len())? == 1;
        let done = if once { read_once(self) } else { staged(self) };
        if me == 0 && done.is_ok() {
            self.pick(what, bytes).took(once, bytes, started.elapsed());
        }
        done
    }

    /// The pick (rank 0's, or a broadcast root's) of `what` for calls of `bytes`.
    fn pick(&mut self, what: Measured, bytes: usize) -> &mut crate::pick::Pick {
        self.scratch.picks[what as usize].of(bytes, what.min_bytes())
    }

    /// Posts this collective's stamp with `words` (at most `MEASURED_WORDS`), read by the others
    /// with `posted_word`; the collective's first step then posts nothing more.
    fn post_words(&mut self, words: &[u64]) -> Result<()> {
        let mut bytes = [0u8; 8 * MEASURED_WORDS];
        for (i, w) in words.iter().enumerate() {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        self.post(&bytes[..8 * words.len()])?;
        self.posted = true;
        Ok(())
    }

    /// Word `i` that rank `r` posted with its stamp (see `measured`), once it has.
    fn posted_word(&self, r: usize, i: usize) -> Result<u64> {
        let data = self.fetch_agreeing(r)?;
        let bytes = data.get(i * 8..i * 8 + 8).ok_or_else(|| Error::new(Status::Internal, format!("rank {r} posted no word {i}")))?;
        Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
    }

    /// Reduces `len` bytes at offset `at` of every member's input (ours at `own`, the others'
    /// at the address each posted first) into `out`, in rank order as the staged way does (the
    /// same bytes either way), reading the others' once, a piece at a time.
    unsafe fn reduce_read_once(&mut self, own: *const u8, at: usize, len: usize, out: *mut u8, dt: DType, op: ReduceOp) -> Result<()> {
        let (n, me, es) = (self.n(), self.me(), dt.size());
        let piece = (READ_PIECE.min(READ_PIECES_MAX / (n - 1).max(1)) / es * es).max(es);
        if self.scratch.remote.len() < (n - 1) * piece {
            self.scratch.remote.resize((n - 1) * piece, 0);
        }
        let base = self.scratch.remote.as_mut_ptr();
        let slot = move |r: usize| base.add((r - usize::from(r > me)) * piece);
        // Each member's input address, looked up once (not per piece); ours is not read.
        let inputs = (0..n).map(|r| if r == me { Ok(0) } else { self.posted_word(r, 0) }).collect::<Result<Vec<u64>>>()?;
        for (off, p) in pieces(len, piece) {
            for r in (0..n).filter(|&r| r != me) {
                self.read_from(r, inputs[r] + (at + off) as u64, slot(r), p)?;
            }
            self.set_inputs(|r| if r == me { own.add(off) } else { slot(r) as *const u8 });
            self.reduce(dt, op, n, out.add(off), p);
        }
        Ok(())
    }

    /// reduce_scatter read once: each rank reduces its block from everyone's input.
    unsafe fn reduce_scatter_read_once(&mut self, input: ConstBuf, out: MutBuf, dt: DType, op: ReduceOp) -> Result<()> {
        let (me, block) = (self.me(), out.len());
        let reduced = self.reduce_read_once(input.as_slice().as_ptr().add(me * block), me * block, block, out.as_ptr(), dt, op);
        self.finish_reads()?;
        reduced
    }

    /// allreduce read once: each rank reduces its share from everyone's input into its output
    /// (a reduce_scatter), then writes it into the others' outputs (`process_vm_writev`) from
    /// its cache, where reading it from theirs was slow in the VM's far mode (see `pick`: 1 and
    /// 4 MiB took 0.31-0.33x the time of reading, level otherwise). In place, a share is only
    /// overwritten in others' buffers after its owner, the only one that reads it, has.
    unsafe fn allreduce_read_once(&mut self, input: ConstBuf, out: MutBuf, dt: DType, op: ReduceOp) -> Result<()> {
        let (n, me, len, es) = (self.n(), self.me(), out.len(), dt.size());
        let (at, l) = share(len, es, n, me);
        let mut first_err = self.reduce_read_once(input.as_slice().as_ptr().add(at), at, l, out.as_ptr().add(at), dt, op).err();
        for r in (0..n).filter(|&r| r != me) {
            if first_err.is_none() {
                first_err = self.posted_word(r, 1).and_then(|to| self.write_to(r, to + at as u64, out.as_ptr().add(at), l)).err();
            }
        }
        // Nobody leaves before every share is everywhere; a rank that could not do its part
        // says so, or the others would return its share's garbage.
        let done = self.exchange_words(&[u64::from(first_err.is_some())])?;
        if let Some(r) = (0..n).find(|&r| r != me && self.word(r, done, 0) == 1) {
            first_err.get_or_insert_with(|| self.member_failed(r, "could not reduce its share of the allreduce or hand it out"));
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The error for member `r`, which said it could not do its part (`what`): where a member
    /// was found lost, that loss is the cause the caller must see (say rank 0 failed reading a
    /// rank that died after handing everyone else its part), else `r`'s failure.
    fn member_failed(&self, r: usize, what: &str) -> Error {
        match self.arena.lost_member().filter(|&x| x != self.me()) {
            Some(x) => Error::new(Status::PeerLost, format!("rank {x} is lost: rank {r} {what}")),
            None => Error::new(Status::System, format!("rank {r} {what}")),
        }
    }

    /// The rest of a direct allgather(v) once every buffer's address is published (`at`): reads
    /// the others' blocks, copies our own block `mine` (when `out_of_place`), and ends the reads.
    unsafe fn read_published_blocks(&mut self, at: Published, mine: *const u8, out_of_place: bool, recv: MutBuf, blocks: Blocks) -> Result<()> {
        let me = self.me();
        // Read everything we can, but always take the final step: the ranks must stay in step.
        let mut first_err = None;
        for r in (0..self.n()).filter(|&r| r != me) {
            let from = match at {
                Published::Step(s) => Ok(self.word(r, s, 0)),
                Published::Posted => self.posted_word(r, 0),
            };
            let (to, len) = blocks.of(r);
            if let Err(e) = from.and_then(|from| self.read_from(r, from, recv.as_ptr().add(to), len)) {
                first_err.get_or_insert(e);
            }
        }
        if out_of_place {
            let (to, len) = blocks.of(me);
            copy(mine, recv.as_ptr().add(to), len);
        }
        self.finish_reads()?;
        first_err.map_or(Ok(()), Err)
    }

    /// alltoallv: through the mailboxes when every rank's data fits its slot, else staged or
    /// read directly, as rank 0 says. Each rank posts, with its stamp, rank 0's choice and, when
    /// its data for the others fits, its counts and that data (`A2AV_HEAD`); having read every
    /// post (which it does anyway, to check that everyone calls alltoallv), each knows whether
    /// all fit.
    #[allow(clippy::too_many_arguments)]
    unsafe fn alltoallv(&mut self, send: ConstBuf, scounts: &[usize], sdispls: &[usize], recv: MutBuf, rcounts: &[usize], rdispls: &[usize]) -> Result<()> {
        let (n, me, started) = (self.n(), self.me(), Instant::now());
        let src = send.as_slice().as_ptr();
        let total: usize = scounts.iter().sum();
        let reads = me == 0 && self.alltoallv_reads(total);
        let data_at = a2av_data_at(n);
        // Our own block is copied from our buffer, not posted.
        let fits = data_at.checked_add(total - scounts[me]).is_some_and(|end| end <= EAGER_BYTES);
        // Built in the scratch (kept from call to call: no 2 KiB to clear each time).
        let mut post = std::mem::take(&mut self.scratch.post);
        post.resize(EAGER_BYTES, 0);
        post[..8].copy_from_slice(&u64::from(reads).to_le_bytes());
        post[8..16].copy_from_slice(&u64::from(fits).to_le_bytes());
        let mut end = A2AV_HEAD;
        if fits {
            end = data_at;
            for (j, (&c, &d)) in scounts.iter().zip(sdispls).enumerate().filter(|&(j, _)| j != me) {
                post[A2AV_HEAD + 2 * j..][..2].copy_from_slice(&(c as u16).to_le_bytes());
                copy(src.add(d), post.as_mut_ptr().add(end), c);
                end += c;
            }
            post[A2AV_HEAD + 2 * me..][..2].fill(0);
        }
        let posted = self.post(&post[..end]);
        self.scratch.post = post;
        posted?;
        self.posted = true;
        let mut all_fit = fits;
        for r in (0..n).filter(|&r| r != me) {
            all_fit &= word_at(self.fetch_slot(r)?, 1) == 1;
        }
        if all_fit {
            return self.alltoallv_posted(send, scounts, sdispls, recv, rcounts, rdispls);
        }
        let reads = word_at(self.fetch_slot(0)?, 0) == 1;
        let s = self.alltoallv_words(src, scounts, sdispls)?;
        let done = if reads { self.alltoallv_read(s, src, sdispls, recv, rcounts, rdispls) } else { self.alltoallv_staged(s, src, scounts, sdispls, recv, rcounts, rdispls) };
        if me == 0 && total >= ALLTOALL_MEASURED_MIN && self.pids.is_some() && done.is_ok() {
            self.pick(Measured::Alltoallv, total).took(reads, total, started.elapsed());
        }
        done
    }

    /// Rank 0's choice for an alltoallv beyond the mailboxes, by the bytes it sends: read the
    /// others' buffers directly (true), or stage. As for alltoall (see `ALLTOALL_DIRECT_MIN`),
    /// whichever was faster lately from `ALLTOALL_MEASURED_MIN`.
    fn alltoallv_reads(&mut self, total: usize) -> bool {
        if self.pids.is_none() {
            return false;
        }
        if total >= ALLTOALL_MEASURED_MIN {
            return self.pick(Measured::Alltoallv, total).second();
        }
        total >= ALLTOALL_DIRECT_MIN
    }

    /// An alltoallv whose every rank posted its counts and data (see `alltoallv`): each copies
    /// its block from every post, checking it against what it expects.
    unsafe fn alltoallv_posted(&mut self, send: ConstBuf, scounts: &[usize], sdispls: &[usize], recv: MutBuf, rcounts: &[usize], rdispls: &[usize]) -> Result<()> {
        let (n, me) = (self.n(), self.me());
        let data_at = a2av_data_at(n);
        let mut first_err = None;
        for r in 0..n {
            let (post, at, count) = if r == me {
                (send.as_slice(), sdispls[me], scounts[me])
            } else {
                let post = self.fetch_slot(r)?;
                // r's blocks for the others in rank order (r's own is not posted).
                (post, data_at + (0..me).filter(|&j| j != r).map(|j| a2av_count(post, j)).sum::<usize>(), a2av_count(post, me))
            };
            if count != rcounts[r] || at + count > post.len() {
                let msg = format!("rank {r} sends {count} bytes to rank {me}, which expects {}", rcounts[r]);
                first_err.get_or_insert(Error::new(Status::Mismatch, msg));
                continue;
            }
            copy(post.as_ptr().add(at), recv.as_ptr().add(rdispls[r]), count);
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Publishes this rank's send buffer, counts, displacements and largest count for an
    /// alltoall(v) beyond the mailboxes (`2 + 2n` words); the step's number.
    unsafe fn alltoallv_words(&mut self, src: *const u8, scounts: &[usize], sdispls: &[usize]) -> Result<u32> {
        let mut words = Vec::with_capacity(2 + 2 * scounts.len());
        words.push(src as u64);
        words.extend(scounts.iter().map(|&c| c as u64));
        words.extend(sdispls.iter().map(|&d| d as u64));
        words.push(scounts.iter().copied().max().unwrap_or(0) as u64);
        self.exchange_words(&words)
    }

    /// What rank `r` sends us by its words of step `s` (see `alltoallv_words`), and the error
    /// when that is not what we expect.
    fn alltoallv_sent(&self, s: u32, r: usize, expect: usize) -> (usize, Option<Error>) {
        let count = self.word(r, s, 1 + self.me()) as usize;
        let err = (count != expect).then(|| Error::new(Status::Mismatch, format!("rank {r} sends {count} bytes to rank {}, which expects {expect}", self.me())));
        (count, err)
    }

    /// alltoall(v) with one copy: each rank published its send buffer and displacements
    /// (step `s`), and reads the block meant for it from every other rank.
    unsafe fn alltoallv_read(&mut self, s: u32, src: *const u8, sdispls: &[usize], recv: MutBuf, rcounts: &[usize], rdispls: &[usize]) -> Result<()> {
        let (n, me) = (self.n(), self.me());
        // Read everything we can, but always take the final step: the ranks must stay in step.
        let mut first_err = None;
        for r in 0..n {
            let (count, wrong) = self.alltoallv_sent(s, r, rcounts[r]);
            if let Some(e) = wrong {
                first_err.get_or_insert(e);
            } else if r == me {
                // Our own block from our own arguments (what the arena holds is for the others),
                // unless it is in place already (a gather's or scatter's root).
                let (from, to) = (src.add(sdispls[me]), recv.as_ptr().add(rdispls[me]));
                if !std::ptr::eq(from, to) {
                    copy(from, to, count);
                }
            } else if let Err(e) = self.read_from(r, self.word(r, s, 0) + self.word(r, s, 1 + n + me), recv.as_ptr().add(rdispls[r]), count) {
                first_err.get_or_insert(e);
            }
        }
        self.finish_reads()?;
        first_err.map_or(Ok(()), Err)
    }

    /// alltoall(v) with one copy from the start: publishes this rank's send buffer and counts
    /// (`alltoallv_words`), then reads (`alltoallv_read`).
    #[allow(clippy::too_many_arguments)]
    unsafe fn alltoallv_direct(&mut self, src: *const u8, scounts: &[usize], sdispls: &[usize], recv: MutBuf, rcounts: &[usize], rdispls: &[usize]) -> Result<()> {
        let s = self.alltoallv_words(src, scounts, sdispls)?;
        self.alltoallv_read(s, src, sdispls, recv, rcounts, rdispls)
    }

    /// alltoall(v) staged: in steps by the largest count of any rank (published at step `s`),
    /// each rank stages its piece of every block in the others' places of its slot, and copies
    /// the piece meant for it out of every other rank's.
    #[allow(clippy::too_many_arguments)]
    unsafe fn alltoallv_staged(&mut self, s: u32, src: *const u8, scounts: &[usize], sdispls: &[usize], recv: MutBuf, rcounts: &[usize], rdispls: &[usize]) -> Result<()> {
        let (n, me) = (self.n(), self.me());
        // Everything needed from step `s`'s words, read before the slots are reused.
        let largest = (0..n).map(|r| self.word(r, s, 1 + 2 * n) as usize).max().unwrap_or(0);
        let mut first_err = None;
        let sent: Vec<usize> = (0..n)
            .map(|r| {
                let (count, wrong) = self.alltoallv_sent(s, r, rcounts[r]);
                if let Some(e) = wrong {
                    first_err.get_or_insert(e);
                }
                count.min(rcounts[r])
            })
            .collect();
        let piece = piece_for(self.arena.chunk(), n - 1, 1);
        for (off, p) in pieces(largest, piece) {
            let s = self.begin()?;
            let stage = self.arena.my_stage(s).as_mut_ptr();
            for j in (0..n).filter(|&j| j != me) {
                let (at, len) = piece_of(scounts[j], off, p);
                copy(src.add(sdispls[j] + at), stage.add(piece_place(j, me) * piece), len);
            }
            self.staged(s)?;
            for r in (0..n).filter(|&r| r != me) {
                let (at, len) = piece_of(sent[r], off, p);
                copy(self.arena.stage(r, s).as_ptr().add(piece_place(me, r) * piece), recv.as_ptr().add(rdispls[r] + at), len);
            }
        }
        copy(src.add(sdispls[me]), recv.as_ptr().add(rdispls[me]), sent[me]);
        first_err.map_or(Ok(()), Err)
    }

    unsafe fn broadcast(&mut self, buf: MutBuf, root: usize) -> Result<()> {
        if buf.len() >= BROADCAST_MEASURED_MIN && self.pids.is_some() {
            return self.broadcast_measured(buf, root);
        }
        self.broadcast_staged(buf, root)
    }

    /// The root stages each piece and goes on (the next step waits until the readers are done
    /// with the slot it reuses), as an eager send would. Where the ranks outnumber the cores
    /// the pieces go in parts of slots, so the root runs up to `SLOTS * PARTS - 1` steps ahead
    /// instead of one (see `stage_in_parts`).
    unsafe fn broadcast_staged(&mut self, buf: MutBuf, root: usize) -> Result<()> {
        let (me, parts) = (self.me(), self.stage_in_parts);
        let piece = if parts { self.arena.part_bytes() } else { self.arena.chunk() };
        for (off, p) in pieces(buf.len(), piece) {
            let s = if parts { self.begin_part(me == root)? } else { self.begin()? };
            if me == root {
                let to = if parts { self.arena.my_part(s) } else { self.arena.my_stage(s) };
                copy(buf.as_ptr().add(off), to.as_mut_ptr(), p);
            }
            self.staged_from(s, root)?;
            if me != root {
                let from = if parts { self.arena.part(root, s) } else { self.arena.stage(root, s) };
                copy(from.as_ptr(), buf.as_ptr().add(off), p);
            }
        }
        Ok(())
    }

    /// broadcast staged or with one copy (below `BROADCAST_SHARED_MIN` the readers read the
    /// root's buffer, from there they and the root share the copying out: `broadcast_shared`),
    /// as the root's own times lately say (see `BROADCAST_MEASURED_MIN`). The root posts its
    /// buffer's address and its choice with its stamp and does not wait for the readers'
    /// stamps, so a staged root still runs a step ahead.
    unsafe fn broadcast_measured(&mut self, buf: MutBuf, root: usize) -> Result<()> {
        let (len, started) = (buf.len(), Instant::now());
        let shared = len >= BROADCAST_SHARED_MIN;
        if self.me() == root {
            let direct = self.pick(Measured::Broadcast, len).second();
            self.post_words(&[buf.as_ptr() as u64, u64::from(direct)])?;
            // The readers are done once everyone has reached the final step.
            let done = match (direct, shared) {
                (false, _) => self.broadcast_staged(buf, root),
                (true, true) => self.broadcast_shared(buf, root),
                (true, false) => self.finish_reads(),
            };
            if done.is_ok() {
                self.pick(Measured::Broadcast, len).took(direct, len, started.elapsed());
            }
            return done;
        }
        if self.posted_word(root, 1)? == 0 {
            return self.broadcast_staged(buf, root);
        }
        if shared {
            return self.broadcast_shared(buf, root);
        }
        // Read if we can, but always take the final step: the ranks must stay in step.
        let read = self.posted_word(root, 0).and_then(|from| self.read_from(root, from, buf.as_ptr(), len));
        self.finish_reads()?;
        read
    }

    /// broadcast with one copy, shared out: every reader claims pieces of its buffer one at a
    /// time and reads them from the root's, and the root, instead of waiting, claims pieces of
    /// the readers' buffers too and writes them (`process_vm_writev`). Whoever runs does the
    /// work: two cores copy where one did, and a rank that loses its core holds up at most the
    /// piece it claimed.
    unsafe fn broadcast_shared(&mut self, buf: MutBuf, root: usize) -> Result<()> {
        let (n, me, len, at) = (self.n(), self.me(), buf.len(), buf.as_ptr());
        let size = (len / 4).clamp(64 * 1024, BROADCAST_SHARED_PIECE);
        let count = len.div_ceil(size);
        let piece = |i: usize| (i * size, size.min(len - i * size));
        let s = self.exchange_words(&[at as u64, 0, 0])?;
        let claim = |r: usize| Some(self.arena.stage_word(r, s, SHARED_NEXT).fetch_add(1, Ordering::AcqRel) as usize).filter(|&i| i < count);
        let from = self.word(root, s, SHARED_ADDR);
        let mut first_err = None;
        if me == root {
            // Round after round, a piece of every reader that has some left (none where writes
            // are hidden from a memory checker, see `cma::writes_to_peers`: the readers read it
            // all). A write that fails for another reason than a lost reader is left to the
            // reader (see below), and that reader gets no more help.
            let mut open: Vec<usize> = if crate::transport::cma::writes_to_peers() { (0..n).filter(|&r| r != root).collect() } else { Vec::new() };
            while !open.is_empty() && first_err.is_none() {
                open.retain(|&r| {
                    let Some(i) = claim(r) else { return false };
                    let (off, l) = piece(i);
                    match self.write_to(r, self.word(r, s, SHARED_ADDR) + off as u64, at.add(off), l) {
                        Ok(()) => true,
                        Err(e) => {
                            if e.status == Status::PeerLost {
                                first_err.get_or_insert(e);
                            } else {
                                self.arena.stage_word(r, s, SHARED_FAILED).store(i as u64 + 1, Ordering::Release);
                            }
                            false
                        }
                    }
                });
            }
        } else {
            while let Some(i) = claim(me) {
                let (off, l) = piece(i);
                if let Err(e) = self.read_from(root, from + off as u64, at.add(off), l) {
                    first_err = Some(e);
                    break;
                }
            }
        }
        // Once everyone is here every claimed piece is written or marked failed; the root's
        // buffer stays until the last step.
        let done = self.begin()?;
        self.staged(done)?;
        if me != root && first_err.is_none() {
            let failed = self.arena.stage_word(me, s, SHARED_FAILED).load(Ordering::Acquire) as usize;
            if failed > 0 {
                let (off, l) = piece(failed - 1);
                first_err = self.read_from(root, from + off as u64, at.add(off), l).err();
            }
        }
        self.finish_reads()?;
        first_err.map_or(Ok(()), Err)
    }

    /// Every rank stages its block (`blocks`) from `mine`; the readers (everyone, or only
    /// `root`) copy every block into its place in `recv`. allgather(v), and gather. The steps
    /// go by the largest block, so every rank takes the same ones.
    unsafe fn gather_staged(&mut self, mine: *const u8, recv: Option<MutBuf>, blocks: Blocks, root: Option<usize>) -> Result<()> {
        let (n, me) = (self.n(), self.me());
        let out = recv.filter(|_| root.is_none_or(|r| r == me));
        let (my_at, my_len) = blocks.of(me);
        for (off, p) in pieces(blocks.largest(), self.arena.chunk()) {
            let s = self.begin()?;
            let (at, len) = piece_of(my_len, off, p);
            copy(mine.add(at), self.arena.my_stage(s).as_mut_ptr(), len);
            self.staged(s)?;
            if let Some(out) = out {
                for r in (0..n).filter(|&r| r != me) {
                    let (block_at, block_len) = blocks.of(r);
                    let (at, len) = piece_of(block_len, off, p);
                    copy(self.arena.stage(r, s).as_ptr(), out.as_ptr().add(block_at + at), len);
                }
            }
        }
        if let Some(out) = out {
            let own = out.as_ptr().add(my_at);
            if own as *const u8 != mine {
                copy(mine, own, my_len);
            }
        }
        Ok(())
    }

    unsafe fn gather(&mut self, send: ConstBuf, recv: Option<MutBuf>, root: usize) -> Result<()> {
        self.gather_staged(send.as_slice().as_ptr(), recv, Blocks::Even(send.len()), Some(root))
    }

    /// Whether the members may read each other's buffers directly as an alltoall(v) does: every
    /// member's memory readable, and their words fit a slot (see `alltoallv_words`).
    fn reads_directly(&self) -> bool {
        self.pids.is_some() && (2 + 2 * self.n()) * 8 <= self.arena.chunk()
    }

    /// A gather with one copy, as an alltoallv in which every member sends its block to the
    /// root and the root reads them all (see `alltoallv_direct`).
    unsafe fn gather_direct(&mut self, send: ConstBuf, recv: Option<MutBuf>, root: usize) -> Result<()> {
        let (n, me, block) = (self.n(), self.me(), send.len());
        let out = recv.filter(|_| me == root);
        let scounts: Vec<usize> = (0..n).map(|j| if j == root { block } else { 0 }).collect();
        let rcounts: Vec<usize> = (0..n).map(|_| if out.is_some() { block } else { 0 }).collect();
        let rdispls: Vec<usize> = (0..n).map(|r| if out.is_some() { r * block } else { 0 }).collect();
        let zeros = vec![0; n];
        self.alltoallv_direct(send.as_slice().as_ptr(), &scounts, &zeros, out.unwrap_or(MutBuf::new(std::ptr::null_mut(), 0)), &rcounts, &rdispls)
    }

    /// A scatter with one copy, as an alltoallv in which the root sends every member its block
    /// and each reads its own from the root's buffer (see `alltoallv_direct`).
    unsafe fn scatter_direct(&mut self, send: Option<ConstBuf>, recv: MutBuf, root: usize) -> Result<()> {
        let (n, me, block) = (self.n(), self.me(), recv.len());
        let src = send.filter(|_| me == root).map(|s| s.as_slice().as_ptr());
        let scounts: Vec<usize> = (0..n).map(|_| if src.is_some() { block } else { 0 }).collect();
        let sdispls: Vec<usize> = (0..n).map(|j| j * block).collect();
        let rcounts: Vec<usize> = (0..n).map(|r| if r == root { block } else { 0 }).collect();
        let zeros = vec![0; n];
        self.alltoallv_direct(src.unwrap_or(std::ptr::null()), &scounts, &sdispls, recv, &rcounts, &zeros)
    }

    /// The senders (everyone, or only `root`) stage block j of `send` for rank j; every rank
    /// copies the block meant for it from each sender into `recv` (from sender r at r * block,
    /// or at 0 when there is one sender). alltoall, and scatter.
    unsafe fn scatter_staged(&mut self, send: Option<*const u8>, recv: MutBuf, block: usize, root: Option<usize>) -> Result<()> {
        let (n, me) = (self.n(), self.me());
        let sends = root.is_none_or(|r| r == me);
        let place = |r: usize| if root.is_some() { 0 } else { r * block };
        for (off, p) in pieces(block, piece_for(self.arena.chunk(), n - 1, 1)) {
            let s = self.begin()?;
            if let (true, Some(src)) = (sends, send) {
                let stage = self.arena.my_stage(s).as_mut_ptr();
                for j in (0..n).filter(|&j| j != me) {
                    copy(src.add(j * block + off), stage.add(piece_place(j, me) * p), p);
                }
            }
            self.staged(s)?;
            for r in (0..n).filter(|&r| r != me && root.is_none_or(|root| root == r)) {
                copy(self.arena.stage(r, s).as_ptr().add(piece_place(me, r) * p), recv.as_ptr().add(place(r) + off), p);
            }
        }
        if let (true, Some(src)) = (sends, send) {
            copy(src.add(me * block), recv.as_ptr().add(place(me)), block);
        }
        Ok(())
    }

    unsafe fn alltoall(&mut self, send: ConstBuf, recv: MutBuf, block: usize) -> Result<()> {
        self.scatter_staged(Some(send.as_slice().as_ptr()), recv, block, None)
    }

    unsafe fn scatter(&mut self, send: Option<ConstBuf>, recv: MutBuf, root: usize) -> Result<()> {
        self.scatter_staged(send.map(|s| s.as_slice().as_ptr()), recv, recv.len(), Some(root))
    }

    unsafe fn reduce_scatter(&mut self, input: ConstBuf, out: MutBuf, dt: DType, op: ReduceOp) -> Result<()> {
        let (n, me, es) = (self.n(), self.me(), dt.size());
        let block = out.len();
        let src = input.as_slice().as_ptr();
        for (off, p) in pieces(block, piece_for(self.arena.chunk(), n - 1, es)) {
            let s = self.begin()?;
            let stage = self.arena.my_stage(s).as_mut_ptr();
            for j in (0..n).filter(|&j| j != me) {
                copy(src.add(j * block + off), stage.add(piece_place(j, me) * p), p);
            }
            self.staged(s)?;
            self.set_inputs(|r| if r == me { src.add(me * block + off) } else { self.arena.stage(r, s).as_ptr().add(piece_place(me, r) * p) });
            self.reduce(dt, op, n, out.as_ptr().add(off), p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::segment_path;
    use std::sync::Arc;
    use std::time::Duration;

    /// Runs `args_of(me)` on `n` ranks (threads) over one arena of `chunk`-byte slots, rank
    /// `me` seeing the members' pids as `pids_of(me)`; then `check(me)` on its buffers. Per
    /// rank: None when the arena left the collective to the link, else whether it checked out.
    fn on_threads<B: Send + 'static>(
        n: usize,
        chunk: usize,
        pids_of: impl Fn(usize) -> Vec<i32>,
        make: impl Fn(usize) -> B,
        args_of: fn(&mut B) -> CollArgs,
        check: fn(usize, &B) -> bool,
    ) -> Vec<Option<bool>> {
        calls_on_threads(n, chunk, 1, false, pids_of, make, args_of)
            .into_iter()
            .enumerate()
            .map(|(me, (mut results, bufs))| {
                results.pop().unwrap().map(|r| {
                    r.unwrap();
                    check(me, &bufs)
                })
            })
            .collect()
    }

    /// Runs `calls` collectives `args_of(me)` one after another on `n` ranks (threads), as
    /// `on_threads` does. Per rank: each call's result (None when the arena left it to the
    /// link), and the buffers.
    #[allow(clippy::type_complexity)]
    fn calls_on_threads<B: Send + 'static>(
        n: usize,
        chunk: usize,
        calls: u32,
        in_parts: bool,
        pids_of: impl Fn(usize) -> Vec<i32>,
        make: impl Fn(usize) -> B,
        args_of: fn(&mut B) -> CollArgs,
    ) -> Vec<(Vec<Option<Result<()>>>, B)> {
        // Tests run in parallel: each call gets its own segment name.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = segment_path(0x6174_7676_0000_0000 ^ call << 32 ^ ((n * 1000 + chunk) as u64));
        let first = Arc::new(Arena::create(&path, n, chunk, 5).unwrap());
        let arenas: Vec<Arc<Arena>> = (0..n).map(|r| if r == 0 { first.clone() } else { Arc::new(Arena::open(&path, n, chunk, 5, r).unwrap()) }).collect();
        std::fs::remove_file(&path).unwrap();
        let threads: Vec<_> = arenas
            .into_iter()
            .enumerate()
            .map(|(me, a)| {
                let (pids, mut bufs) = (pids_of(me), make(me));
                std::thread::spawn(move || {
                    let (steps, mut scratch) = (Steps::default(), Scratch::default());
                    let far = Instant::now() + Duration::from_secs(30);
                    let (deadline, interrupt) = (move || far, |_| None);
                    let results = (1..=calls)
                        .map(|coll| {
                            let args = args_of(&mut bufs);
                            let mut run = ShmRun::new(&a, &steps, coll, &deadline, &interrupt, &mut scratch, Some(&pids));
                            run.stage_in_parts = in_parts;
                            // SAFETY: the buffers outlive the call.
                            let done = unsafe { run.run_eager(&args) }.or_else(|| unsafe { run.run(&args) });
                            a.finished(coll);
                            done
                        })
                        .collect();
                    (results, bufs)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    }

    fn our_pids(n: usize) -> impl Fn(usize) -> Vec<i32> {
        move |_| vec![std::process::id() as i32; n]
    }

    /// alltoallv on `n` ranks (threads) over an arena of `chunk`-byte slots: Some(result) when
    /// the arena ran it, None when it left it to the link. Rank r sends r+1 bytes of value
    /// 16r+j to rank j, packed in rank order.
    fn alltoallv_on(n: usize, chunk: usize) -> Vec<Option<bool>> {
        struct Bufs {
            n: usize,
            me: usize,
            send: Vec<u8>,
            recv: Vec<u8>,
        }
        let make = |me: usize| Bufs { n, me, send: (0..n).flat_map(|j| vec![(16 * me + j) as u8; me + 1]).collect(), recv: vec![0u8; n * (n + 1) / 2] };
        fn rdispls(n: usize) -> Vec<usize> {
            (0..n).map(|r| r * (r + 1) / 2).collect()
        }
        on_threads(
            n,
            chunk,
            our_pids(n),
            make,
            |b| {
                let (n, me) = (b.n, b.me);
                CollArgs::Alltoallv {
                    send: ConstBuf::from_slice(&b.send),
                    scounts: vec![me + 1; n],
                    sdispls: (0..n).map(|j| j * (me + 1)).collect(),
                    recv: MutBuf::from_slice(&mut b.recv),
                    rcounts: (0..n).map(|r| r + 1).collect(),
                    rdispls: rdispls(n),
                    dt: crate::dtype::DType::Uint8,
                }
            },
            |me, b| {
                let d = rdispls(b.n);
                (0..b.n).all(|r| b.recv[d[r]..][..r + 1].iter().all(|&x| x == (16 * r + me) as u8))
            },
        )
    }

    /// A 1 MiB + 5 broadcast from rank 0 over 3 ranks (threads), the root's helping writes
    /// going to `pids_of(0)`: data everywhere.
    fn shared_broadcast_on(pids_of: impl Fn(usize) -> Vec<i32>) -> Vec<Option<bool>> {
        const LEN: usize = (1 << 20) + 5;
        fn want(i: usize) -> u8 {
            (i * 7 + 3) as u8
        }
        on_threads(3, 64 * 1024, pids_of, |me| if me == 0 { (0..LEN).map(want).collect() } else { vec![0xEEu8; LEN] }, |b: &mut Vec<u8>| CollArgs::Broadcast { buf: MutBuf::from_slice(b), dt: crate::dtype::DType::Uint8, root: 0 }, |_, b| {
            b.len() == LEN && b.iter().enumerate().all(|(i, &x)| x == want(i))
        })
    }

    #[test]
    fn a_shared_broadcast_arrives_whole() {
        assert_eq!(shared_broadcast_on(our_pids(3)), vec![Some(true); 3]);
    }

    #[test]
    fn a_shared_broadcast_whose_root_cannot_write_is_read_by_the_readers() {
        // The root sees a process that is not a member (a child of ours, where the readers'
        // buffers are not mapped) behind the readers' pids: its first write fails, the piece
        // it claimed is left to the reader, which reads that and the rest itself.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let stranger = child.id() as i32;
        let us = std::process::id() as i32;
        let got = shared_broadcast_on(move |me| if me == 0 { vec![us, stranger, stranger] } else { vec![us; 3] });
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(got, vec![Some(true); 3]);
    }

    #[test]
    fn small_broadcasts_that_run_ahead_in_parts_arrive_whole() {
        // 400 broadcasts and allgathers on 3 ranks with 64 KiB slots (4 KiB parts), the root
        // turning round, broadcasts staged in parts and in whole slots: most fill a part, every
        // fifth takes six, every 64th is measured (staged or direct), every seventh is an
        // allgather (whole slots), and one reader stops for a while now and then so that the
        // roots run far ahead. Each rank checks the call before it as it fills its buffer for
        // the next.
        const GATHERED: usize = 6000;
        struct Bufs {
            me: usize,
            call: usize,
            buf: Vec<u8>,
            wrong: usize,
        }
        fn len(call: usize) -> usize {
            match call {
                c if c % 64 == 63 => BROADCAST_MEASURED_MIN + 1,
                c if c % 7 == 6 => 3 * GATHERED,
                c if c % 5 == 4 => 20 * 1024 + 3,
                c => 2049 + c % 2048,
            }
        }
        fn want(call: usize, i: usize) -> u8 {
            (i * 5 + call * 11 + 1) as u8
        }
        fn args(b: &mut Bufs) -> CollArgs {
            if b.call > 0 && b.buf.iter().enumerate().any(|(i, &x)| x != want(b.call - 1, i)) {
                b.wrong += 1;
            }
            if b.me == 2 && b.call % 40 == 0 {
                std::thread::sleep(Duration::from_millis(3));
            }
            let (call, dt) = (b.call, crate::dtype::DType::Uint8);
            b.call += 1;
            if call % 7 == 6 && call % 64 != 63 {
                // An allgather in place: every rank stages its block in a whole slot.
                b.buf = (0..len(call)).map(|i| if i / GATHERED == b.me { want(call, i) } else { 0xEE }).collect();
                return CollArgs::Allgather { send: None, recv: MutBuf::from_slice(&mut b.buf), dt };
            }
            let root = call / 3 % 3;
            b.buf = (0..len(call)).map(|i| if b.me == root { want(call, i) } else { 0xEE }).collect();
            CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b.buf), dt, root }
        }
        for in_parts in [true, false] {
            let ranks = calls_on_threads(3, 64 * 1024, 400, in_parts, our_pids(3), |me| Bufs { me, call: 0, buf: Vec::new(), wrong: 0 }, args);
            for (me, (results, mut b)) in ranks.into_iter().enumerate() {
                assert!(results.into_iter().all(|r| matches!(r, Some(Ok(())))), "rank {me}, in parts: {in_parts}");
                args(&mut b);
                assert_eq!(b.wrong, 0, "rank {me}, in parts: {in_parts}: broadcasts that arrived wrong");
            }
        }
    }

    #[test]
    fn measured_broadcasts_arrive_whole_staged_and_read_directly() {
        // 30 broadcasts of 64 KiB + 5 and of 256 KiB + 5 (shared out from there), the root
        // turning round: each root's pick takes the two ways in turn for its first 8 calls (see
        // `pick`), so both ways run from every root. Each rank checks the broadcast before it
        // as it fills its buffer for the next.
        for len in [BROADCAST_MEASURED_MIN + 5, BROADCAST_SHARED_MIN + 5] {
            measured_broadcasts_arrive_whole(len);
        }
    }

    #[test]
    fn measured_alltoalls_arrive_whole_staged_and_read_directly() {
        // 24 alltoalls of 3 blocks of 96 KiB + 1 on 3 ranks: rank 0's pick takes the two ways
        // in turn for its first 8 calls, then the faster with the other now and then. Each
        // rank checks the call before it as it fills its buffers for the next.
        const BLOCK: usize = 96 * 1024 + 1;
        struct Bufs {
            me: usize,
            call: usize,
            send: Vec<u8>,
            recv: Vec<u8>,
            wrong: usize,
        }
        fn want(call: usize, from: usize, to: usize, i: usize) -> u8 {
            (i * 7 + call * 13 + from * 5 + to * 3) as u8
        }
        fn args(b: &mut Bufs) -> CollArgs {
            if b.call > 0 && (0..3).any(|r| b.recv[r * BLOCK..][..BLOCK].iter().enumerate().any(|(i, &x)| x != want(b.call - 1, r, b.me, i))) {
                b.wrong += 1;
            }
            for to in 0..3 {
                for i in 0..BLOCK {
                    b.send[to * BLOCK + i] = want(b.call, b.me, to, i);
                }
            }
            b.recv.fill(0xEE);
            b.call += 1;
            CollArgs::Alltoall { send: ConstBuf::from_slice(&b.send), recv: MutBuf::from_slice(&mut b.recv), dt: crate::dtype::DType::Uint8 }
        }
        let make = |me| Bufs { me, call: 0, send: vec![0; 3 * BLOCK], recv: vec![0; 3 * BLOCK], wrong: 0 };
        for (me, (results, mut b)) in calls_on_threads(3, 64 * 1024, 24, false, our_pids(3), make, args).into_iter().enumerate() {
            assert!(results.into_iter().all(|r| matches!(r, Some(Ok(())))), "rank {me}");
            args(&mut b);
            assert_eq!(b.wrong, 0, "rank {me}: alltoalls that arrived wrong");
        }
    }

    /// allgatherv of uneven blocks, placed out of rank order with gaps between them, through
    /// every way the arena has: the mailboxes (blocks up to 2 KiB), staged (in several steps
    /// of 64 KiB), read directly (largest block 32-128 KiB), and rank 0's pick between staged
    /// and direct (from 256 KiB; its first calls take both). Every third call is in place.
    /// Each rank checks the call before it as it fills its buffers for the next, gaps included.
    #[test]
    fn allgathervs_arrive_whole_every_way() {
        const SIZES: [[usize; 3]; 4] = [[5, 0, 2000], [3000, 17, 150_001], [70_000, 1, 100_000], [300_001, 5, 262_144]];
        const GAP: usize = 3;
        struct Bufs {
            me: usize,
            call: usize,
            send: Vec<u8>,
            recv: Vec<u8>,
            displs: Vec<usize>,
            wrong: Vec<usize>,
        }
        // Calls 0-3 one of each size, then 16 of the largest (the pick's turns).
        fn counts(call: usize) -> [usize; 3] {
            SIZES[call.min(3)]
        }
        // Rank 2's block first, then rank 0's, then rank 1's.
        fn displs(c: [usize; 3]) -> Vec<usize> {
            vec![c[2] + GAP, c[2] + c[0] + 2 * GAP, 0]
        }
        fn want(call: usize, from: usize, i: usize) -> u8 {
            (i * 7 + call * 13 + from * 5) as u8
        }
        fn args(b: &mut Bufs) -> CollArgs {
            if b.call > 0 {
                let (c, d) = (counts(b.call - 1), &b.displs);
                let mut expect = vec![0xEEu8; b.recv.len()];
                for r in 0..3 {
                    for i in 0..c[r] {
                        expect[d[r] + i] = want(b.call - 1, r, i);
                    }
                }
                if b.recv != expect {
                    b.wrong.push(b.call - 1);
                }
            }
            let c = counts(b.call);
            b.displs = displs(c);
            let total = c.iter().sum::<usize>() + 2 * GAP;
            b.recv = vec![0xEE; total];
            let in_place = b.call % 3 == 2;
            let mine: Vec<u8> = (0..c[b.me]).map(|i| want(b.call, b.me, i)).collect();
            if in_place {
                b.recv[b.displs[b.me]..][..c[b.me]].copy_from_slice(&mine);
            }
            b.send = mine;
            b.call += 1;
            CollArgs::Allgatherv {
                send: (!in_place).then(|| ConstBuf::from_slice(&b.send)),
                recv: MutBuf::from_slice(&mut b.recv),
                counts: c.to_vec(),
                displs: b.displs.clone(),
                dt: crate::dtype::DType::Uint8,
            }
        }
        let make = |me| Bufs { me, call: 0, send: Vec::new(), recv: Vec::new(), displs: Vec::new(), wrong: Vec::new() };
        for (me, (results, mut b)) in calls_on_threads(3, 64 * 1024, 20, false, our_pids(3), make, args).into_iter().enumerate() {
            assert!(results.iter().all(|r| matches!(r, Some(Ok(())))), "rank {me}: {results:?}");
            args(&mut b);
            assert!(b.wrong.is_empty(), "rank {me}: calls that arrived wrong: {:?}", b.wrong);
        }
    }

    /// alltoallv of uneven blocks (some empty), sent and received out of rank order with gaps,
    /// through every way: the mailboxes (all data fits the slots), staged because one rank's
    /// does not (rank 0 sends little), read directly (rank 0 sends 64-256 KiB), and rank 0's
    /// pick between staged (several steps of 64 KiB slots) and direct. Each rank checks the call
    /// before it as it fills its buffers for the next, gaps included.
    #[test]
    fn alltoallvs_arrive_whole_every_way() {
        const GAP: usize = 5;
        struct Bufs {
            me: usize,
            call: usize,
            send: Vec<u8>,
            recv: Vec<u8>,
            wrong: Vec<usize>,
        }
        // Bytes `from` sends `to` at call `call`: calls 0-3 one of each way, then 16 of the last.
        fn count(call: usize, from: usize, to: usize) -> usize {
            let uneven = |base: usize| base * (1 + (from * 3 + to) % 4) / 4 + (from + to) % 3;
            match call.min(3) {
                // Fits the slot only without the block to itself, which is not posted.
                0 if from == to => 1900 + from,
                0 => uneven(100),
                1 if from == 1 => 5000 + to,
                1 => uneven(10),
                2 => uneven(60_000),
                _ if (from, to) == (2, 0) => 0,
                _ => uneven(200_000),
            }
        }
        // Blocks placed in reverse rank order, GAP bytes apart: (displacements, total).
        fn layout(call: usize, me: usize, sending: bool) -> (Vec<usize>, usize) {
            let mut displs = vec![0; 3];
            let mut at = 0;
            for r in (0..3).rev() {
                displs[r] = at;
                at += if sending { count(call, me, r) } else { count(call, r, me) } + GAP;
            }
            (displs, at)
        }
        fn want(call: usize, from: usize, to: usize, i: usize) -> u8 {
            (i * 7 + call * 13 + from * 5 + to * 3) as u8
        }
        fn args(b: &mut Bufs) -> CollArgs {
            let me = b.me;
            if b.call > 0 {
                let call = b.call - 1;
                let (d, total) = layout(call, me, false);
                let mut expect = vec![0xEEu8; total];
                for r in 0..3 {
                    for i in 0..count(call, r, me) {
                        expect[d[r] + i] = want(call, r, me, i);
                    }
                }
                if b.recv != expect {
                    b.wrong.push(call);
                }
            }
            let call = b.call;
            let (sdispls, stotal) = layout(call, me, true);
            let (rdispls, rtotal) = layout(call, me, false);
            b.send = vec![0; stotal];
            for j in 0..3 {
                for i in 0..count(call, me, j) {
                    b.send[sdispls[j] + i] = want(call, me, j, i);
                }
            }
            b.recv = vec![0xEE; rtotal];
            b.call += 1;
            CollArgs::Alltoallv {
                send: ConstBuf::from_slice(&b.send),
                scounts: (0..3).map(|j| count(call, me, j)).collect(),
                sdispls,
                recv: MutBuf::from_slice(&mut b.recv),
                rcounts: (0..3).map(|r| count(call, r, me)).collect(),
                rdispls,
                dt: crate::dtype::DType::Uint8,
            }
        }
        let make = |me| Bufs { me, call: 0, send: Vec::new(), recv: Vec::new(), wrong: Vec::new() };
        for (me, (results, mut b)) in calls_on_threads(3, 64 * 1024, 20, false, our_pids(3), make, args).into_iter().enumerate() {
            assert!(results.iter().all(|r| matches!(r, Some(Ok(())))), "rank {me}: {results:?}");
            args(&mut b);
            assert!(b.wrong.is_empty(), "rank {me}: calls that arrived wrong: {:?}", b.wrong);
        }
    }

    /// A rank that expects more from rank 0 than rank 0 sends gets a mismatch naming both, in
    /// the mailboxes and staged alike; nobody waits for it, and the next call goes on.
    #[test]
    fn alltoallv_counts_that_disagree_are_named() {
        struct Bufs {
            me: usize,
            call: usize,
            send: Vec<u8>,
            recv: Vec<u8>,
        }
        // Calls 0 and 1 disagree (small, then staged), call 2 agrees.
        fn args(b: &mut Bufs) -> CollArgs {
            let (call, me) = (b.call, b.me);
            b.call += 1;
            let len = if call == 1 { 20_000 } else { 10 };
            b.send = vec![me as u8; 3 * len];
            b.recv = vec![0; 3 * len + 1];
            let mut rcounts = vec![len; 3];
            if me == 2 && call < 2 {
                rcounts[0] += 1;
            }
            CollArgs::Alltoallv {
                send: ConstBuf::from_slice(&b.send),
                scounts: vec![len; 3],
                sdispls: vec![0, len, 2 * len],
                recv: MutBuf::from_slice(&mut b.recv),
                rcounts,
                rdispls: vec![0, len + 1, 2 * len + 1],
                dt: crate::dtype::DType::Uint8,
            }
        }
        let make = |me| Bufs { me, call: 0, send: Vec::new(), recv: Vec::new() };
        for (me, (results, _)) in calls_on_threads(3, 64 * 1024, 3, false, our_pids(3), make, args).into_iter().enumerate() {
            for (call, r) in results.iter().enumerate() {
                match (me, call, r) {
                    (2, 0 | 1, Some(Err(e))) => {
                        assert_eq!(e.status, Status::Mismatch);
                        assert!(e.msg.contains("rank 0 sends") && e.msg.contains("rank 2, which expects"), "{e}");
                    }
                    (_, _, Some(Ok(()))) => {}
                    _ => panic!("rank {me} call {call}: {r:?}"),
                }
            }
        }
    }

    /// Small gathers and scatters go through the mailboxes; the root moves from call to call,
    /// and the sizes run up to the slot's 2 KiB (scatter: all blocks together).
    #[test]
    fn small_gathers_and_scatters_arrive_whole() {
        gathers_and_scatters_arrive_whole(&[1, 48, 500, 682], false, 40);
    }

    /// Gathers and scatters of 3 blocks of 96 KiB + 1, every fourth call in place at the root:
    /// rank 0's picks take the two ways (staged, read directly) in turn for their first 8 calls
    /// each, then the faster with the other now and then.
    #[test]
    fn measured_gathers_and_scatters_arrive_whole_staged_and_read_directly() {
        gathers_and_scatters_arrive_whole(&[96 * 1024 + 1], true, 48);
    }

    /// `calls` calls on 3 ranks, gathers and scatters in turn, the root going round, blocks of
    /// the sizes of `blocks` in turn, in place at the root in every second pair of calls if
    /// `in_place`. Each rank checks the call before it as it fills its buffers for the next.
    fn gathers_and_scatters_arrive_whole(blocks: &'static [usize], in_place: bool, calls: u32) {
        struct Bufs {
            me: usize,
            call: usize,
            blocks: &'static [usize],
            in_place: bool,
            mine: Vec<u8>,
            all: Vec<u8>,
            wrong: Vec<usize>,
        }
        fn want(call: usize, rank: usize, i: usize) -> u8 {
            (i * 7 + call * 13 + rank * 5) as u8
        }
        // Call c: root c % 3, a gather when even, a scatter when odd.
        fn args(b: &mut Bufs) -> CollArgs {
            let place = |b: &Bufs, c: usize| b.in_place && c % 4 >= 2 && b.me == c % 3;
            if let Some(c) = b.call.checked_sub(1) {
                let (root, block) = (c % 3, b.blocks[c / 2 % b.blocks.len()]);
                let ok = if c % 2 == 0 {
                    b.me != root || (0..3).all(|r| b.all[r * block..][..block].iter().enumerate().all(|(i, &x)| x == want(c, r, i)))
                } else {
                    let got = if place(b, c) { &b.all[b.me * block..][..block] } else { &b.mine[..] };
                    got.iter().enumerate().all(|(i, &x)| x == want(c, b.me, i))
                };
                if !ok {
                    b.wrong.push(c);
                }
            }
            let (c, me) = (b.call, b.me);
            let (root, block, place) = (c % 3, b.blocks[c / 2 % b.blocks.len()], place(b, c));
            b.call += 1;
            if c % 2 == 0 {
                b.all = vec![0xEE; 3 * block];
                b.mine = (0..block).map(|i| want(c, me, i)).collect();
                if place {
                    b.all[me * block..][..block].copy_from_slice(&b.mine);
                }
                let send = ConstBuf::from_slice(if place { &b.all[me * block..][..block] } else { &b.mine });
                let recv = (me == root).then(|| MutBuf::from_slice(&mut b.all));
                CollArgs::Gather { send, recv, dt: crate::dtype::DType::Uint8, root }
            } else {
                b.all = (0..3 * block).map(|i| want(c, i / block, i % block)).collect();
                b.mine = vec![0xEE; block];
                let send = (me == root).then(|| ConstBuf::from_slice(&b.all));
                let recv = MutBuf::from_slice(if place { &mut b.all[me * block..][..block] } else { &mut b.mine });
                CollArgs::Scatter { send, recv, dt: crate::dtype::DType::Uint8, root }
            }
        }
        let make = |me| Bufs { me, call: 0, blocks, in_place, mine: Vec::new(), all: Vec::new(), wrong: Vec::new() };
        for (me, (results, mut b)) in calls_on_threads(3, 64 * 1024, calls, false, our_pids(3), make, args).into_iter().enumerate() {
            assert!(results.iter().all(|r| matches!(r, Some(Ok(())))), "rank {me}: {results:?}");
            args(&mut b);
            assert!(b.wrong.is_empty(), "rank {me}: calls that arrived wrong: {:?}", b.wrong);
        }
    }

    fn measured_broadcasts_arrive_whole(len: usize) {
        struct Bufs {
            me: usize,
            call: usize,
            buf: Vec<u8>,
            wrong: usize,
        }
        fn want(call: usize, i: usize) -> u8 {
            (i * 7 + call * 13 + 3) as u8
        }
        fn args(b: &mut Bufs) -> CollArgs {
            if b.call > 0 && b.buf.iter().enumerate().any(|(i, &x)| x != want(b.call - 1, i)) {
                b.wrong += 1;
            }
            let root = b.call % 3;
            for (i, x) in b.buf.iter_mut().enumerate() {
                *x = if b.me == root { want(b.call, i) } else { 0xEE };
            }
            b.call += 1;
            CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b.buf), dt: crate::dtype::DType::Uint8, root }
        }
        for (me, (results, mut b)) in calls_on_threads(3, 64 * 1024, 30, false, our_pids(3), |me| Bufs { me, call: 0, buf: vec![0; len], wrong: 0 }, args).into_iter().enumerate() {
            assert!(results.into_iter().all(|r| matches!(r, Some(Ok(())))), "rank {me}, {len} bytes");
            args(&mut b);
            assert_eq!(b.wrong, 0, "rank {me}, {len} bytes: broadcasts that arrived wrong");
        }
    }

    #[test]
    fn a_read_once_allreduce_names_the_member_lost_behind_another_members_failure() {
        // Rank 0 sees a process that is gone behind rank 2's pid: its reads of rank 2 fail as
        // they would had rank 2 died after handing the others its part. Rank 1, which did its
        // part, must not blame rank 0 (a live member) but report rank 2 lost, as rank 0 does.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id() as i32;
        child.wait().unwrap();
        let us = std::process::id() as i32;
        const LEN: usize = 256 * 1024;
        let got = calls_on_threads(3, 64 * 1024, 2, false, move |me| if me == 0 { vec![us, us, gone] } else { vec![us; 3] }, |_| vec![1u8; LEN], |b: &mut Vec<u8>| {
            CollArgs::Allreduce { send: None, recv: MutBuf::from_slice(b), dt: crate::dtype::DType::Uint8, op: ReduceOp::Max }
        });
        // The first call of the size is staged (it does not read), the second reads once.
        assert!(got.iter().all(|(results, _)| matches!(results[0], Some(Ok(())))));
        let second: Vec<Error> = got.into_iter().map(|(mut results, _)| results.pop().unwrap().unwrap().unwrap_err()).collect();
        for (r, e) in second.iter().enumerate().take(2) {
            assert_eq!(e.status, Status::PeerLost, "rank {r}: {e:?}");
            assert!(e.to_string().contains("rank 2"), "rank {r}: {e}");
        }
    }

    #[test]
    fn alltoallv_words_must_fit_the_slot() {
        // 4 ranks exchange 2 + 2 * 4 words (80 bytes) when their data leaves the mailboxes: a
        // 64-byte slot is too small (once, it was written past), 128 is enough.
        assert_eq!(alltoallv_on(4, 64), vec![None; 4]);
        assert_eq!(alltoallv_on(4, 128), vec![Some(true); 4]);
    }

    #[test]
    fn pieces_always_take_one_step() {
        assert_eq!(pieces(0, 10).collect::<Vec<_>>(), vec![(0, 0)]);
        assert_eq!(pieces(25, 10).collect::<Vec<_>>(), vec![(0, 10), (10, 10), (20, 5)]);
        assert_eq!(pieces(20, 10).collect::<Vec<_>>(), vec![(0, 10), (10, 10)]);
    }

    #[test]
    fn shares_cover_the_range_element_aligned() {
        for (len, es, parts) in [(0, 4, 3), (40, 4, 3), (44, 4, 8), (7, 1, 2), (1 << 20, 2, 7)] {
            let mut next = 0;
            for i in 0..parts {
                let (at, n) = share(len, es, parts, i);
                assert_eq!(at, next);
                assert_eq!(at % es, 0);
                next = at + n;
            }
            assert_eq!(next, len);
        }
    }
}
