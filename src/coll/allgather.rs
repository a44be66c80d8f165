//! allgather and allgatherv: direct exchange for small outputs in small groups, Bruck
//! (ceil(log2 n) steps) for small outputs in large ones, ring for large outputs; plus the ring
//! allgather core shared with allreduce.

use std::ops::Range;

use super::tuning::{self, RING_SEGMENT_BYTES};
use super::util::{
    blocks, check_len, peers, ranges_in, segments, send_segments, wait_all, Carve, Recv, Scratch,
};
use super::Link;
use crate::bail;
use crate::error::{Result, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Direct,
    Bruck,
    Ring,
}

/// Bruck allgather: blocks are kept in scratch in the order "own block, then rank+1's, rank+2's,
/// ..." (variable sizes packed). At the step of distance d = 1, 2, 4, ... a rank sends the first
/// min(d, n-d) blocks it holds to rank-d and receives as many from rank+d, which are its blocks
/// d.. in that order; after ceil(log2 n) steps it holds all n and copies them into place. Each
/// rank talks to 2 ceil(log2 n) peers (rank +- powers of two).
pub(crate) fn bruck_allgather(link: &dyn Link, buf: &mut [u8], ranges: &[Range<usize>]) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let mut off = Vec::with_capacity(n + 1);
    off.push(0);
    for i in 0..n {
        off.push(off[i] + ranges[(r + i) % n].len());
    }
    let total = off[n];
    let mut tmp = Scratch::take(total);
    let tmp = &mut tmp[..total];
    tmp[..off[1]].copy_from_slice(&buf[ranges[r].clone()]);
    let mut d = 1;
    while d < n {
        let cnt = d.min(n - d);
        let (held, rest) = tmp.split_at_mut(off[d]);
        let rv = Recv::post(link, (r + d) % n, &mut rest[..off[d + cnt] - off[d]])?;
        let sd = link.send((r + n - d) % n, &held[..off[cnt]])?;
        wait_all(vec![rv], vec![sd])?;
        d <<= 1;
    }
    for i in 1..n {
        buf[ranges[(r + i) % n].clone()].copy_from_slice(&tmp[off[i]..off[i + 1]]);
    }
    Ok(())
}

/// Ring allgather: rank `r`'s block is already at `buf[ranges[r]]`; afterwards every block is
/// everywhere. At step `s` rank `r` forwards block `r-s` to `r+1` and receives block `r-s-1`
/// from `r-1`, straight into place. `ranges` must be pairwise disjoint.
pub(crate) fn ring_allgather(
    link: &dyn Link,
    buf: &mut [u8],
    ranges: &[Range<usize>],
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    assert_eq!(ranges.len(), n);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let buf = Carve::new(buf);
    for s in 0..n.saturating_sub(1) {
        let sb = ranges[(r + n - s) % n].clone();
        let rb = ranges[(r + 2 * n - s - 1) % n].clone();
        // Large blocks go in segments (see RING_SEGMENT_BYTES).
        let mut recvs = Vec::new();
        for g in segments(rb.len(), RING_SEGMENT_BYTES) {
            // SAFETY: distinct blocks are disjoint (caller's contract; sb != rb since n >= 2),
            // and so are the segments of one block.
            recvs.push(Recv::post(link, left, unsafe { buf.part_mut(rb.start + g.start..rb.start + g.end) })?);
        }
        // SAFETY: as above; the block being sent is only read.
        let sends = send_segments(link, right, unsafe { buf.part(sb) }, RING_SEGMENT_BYTES)?;
        wait_all(recvs, sends)?;
    }
    Ok(())
}

/// Direct allgather: every rank posts receives for every other block and sends its own block to
/// every other rank.
pub(crate) fn direct_allgather(
    link: &dyn Link,
    buf: &mut [u8],
    ranges: &[Range<usize>],
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let buf = Carve::new(buf);
    let mut recvs = Vec::with_capacity(n);
    for p in peers(r, n) {
        // SAFETY: blocks are pairwise disjoint; ours (ranges[r]) is only read.
        recvs.push(Recv::post(link, p, unsafe {
            buf.part_mut(ranges[p].clone())
        })?);
    }
    // SAFETY: as above.
    let mine = unsafe { buf.part(ranges[r].clone()) };
    let mut sends = Vec::with_capacity(n);
    for p in peers(r, n) {
        sends.push(link.send(p, mine)?);
    }
    wait_all(recvs, sends)
}

fn run(link: &dyn Link, recv: &mut [u8], ranges: &[Range<usize>], algo: Algo) -> Result<()> {
    if link.size() == 1 {
        return Ok(());
    }
    match algo {
        Algo::Direct => direct_allgather(link, recv, ranges),
        Algo::Bruck => bruck_allgather(link, recv, ranges),
        Algo::Ring => ring_allgather(link, recv, ranges),
    }
}

/// Gathers every rank's block into `recv` (`size * block` bytes, block `j` from rank `j`).
/// `send` None: in place, this rank's block is already at `recv[rank*block..]`.
pub fn allgather(link: &dyn Link, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
    let n = link.size();
    let block = match send {
        Some(s) => {
            check_len(recv.len(), n * s.len(), "allgather: recv buffer")?;
            s.len()
        }
        None => {
            if !recv.len().is_multiple_of(n) {
                bail!(
                    Status::InvalidArgument,
                    "allgather: in-place buffer of {} bytes is not {n} equal blocks",
                    recv.len()
                );
            }
            recv.len() / n
        }
    };
    let algo = tuning::allgather(n, recv.len());
    allgather_with(link, send, recv, block, algo)
}

pub(crate) fn allgather_with(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: &mut [u8],
    block: usize,
    algo: Algo,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    if let Some(s) = send {
        recv[r * block..(r + 1) * block].copy_from_slice(s);
    }
    if block == 0 {
        return Ok(());
    }
    run(link, recv, &blocks(n, block), algo)
}

/// Gathers `counts[j]` bytes from rank `j` into `recv[displs[j]..]`. Blocks must lie within
/// `recv` and not overlap. `send` None: in place (this rank's block already at its displacement).
pub fn allgatherv(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: &mut [u8],
    counts: &[usize],
    displs: &[usize],
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let ranges = ranges_in(counts, displs, n, recv.len(), true, "allgatherv")?;
    if let Some(s) = send {
        check_len(s.len(), counts[r], "allgatherv: send buffer")?;
    }
    let total: usize = counts.iter().sum();
    let algo = tuning::allgather(n, total);
    allgatherv_with(link, send, recv, &ranges, algo)
}

pub(crate) fn allgatherv_with(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: &mut [u8],
    ranges: &[Range<usize>],
    algo: Algo,
) -> Result<()> {
    let r = link.rank();
    if let Some(s) = send {
        recv[ranges[r].clone()].copy_from_slice(s);
    }
    if ranges.iter().all(|x| x.is_empty()) {
        return Ok(());
    }
    run(link, recv, ranges, algo)
}
