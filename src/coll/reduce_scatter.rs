//! reduce_scatter, and the ring reduce-scatter core shared with allreduce and reduce.

use std::ops::Range;

use super::gather::tree_scatter;
use super::reduce_coll::{self, reduce_with};
use super::util::{
    blocks, check_elems, check_op, peers, reduce_in_order, segments, send_segments, wait_all, Carve,
    Recv, Scratch,
};
use super::Link;
use crate::bail;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Result, Status};
use crate::reduce::{combine, divide, narrow, needs_widen, widen};

/// Buffers of a reduce_scatter call.
pub enum ReduceScatterBufs<'a> {
    /// `send` holds `size` blocks of `recv.len()` bytes; block `j` is reduced into rank `j`'s `recv`.
    Separate { send: &'a [u8], recv: &'a mut [u8] },
    /// The whole send buffer; the result lands in block `rank` of it (other blocks are clobbered).
    InPlace(&'a mut [u8]),
}

/// Buffers of the ring reduce-scatter core.
pub(crate) enum RsBufs<'a> {
    /// All of this rank's input; used as the accumulator (every chunk is clobbered). The result
    /// is in `buf[ranges[rank]]`.
    InPlace(&'a mut [u8]),
    /// Read-only input; `out` (exactly `ranges[rank].len()` bytes) receives the result.
    Separate { input: &'a [u8], out: &'a mut [u8] },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    /// Every block straight to its owner (n-1 peers per rank).
    Direct,
    /// Binomial-tree reduce of the whole input to rank 0, then a binomial scatter of the
    /// blocks: 2 ceil(log2 n) steps over the tree's edges (for small inputs in large groups).
    Tree,
    /// Ring with steps cut into segments of about `seg` bytes.
    Ring {
        seg: usize,
    },
}

/// Reduces chunk `c` (`ranges[c]`, element-aligned, pairwise disjoint) of every rank's input into
/// rank `c`. Ring: at step `s` rank `r` sends its partial of chunk `r-s-1` to `r+1` and folds the
/// partial of chunk `r-s-2` from `r-1` into its own input. Chunk `c` is therefore reduced in the
/// fixed order `c+1, c+2, ..., c` (each combine is `local op received` in place, `received op
/// local` with separate buffers: the same bits, as every op is commutative), and its final value is
/// computed once, by its owner. `Avg` combines as Sum; the caller divides.
/// Each step is cut into segments so reducing a segment overlaps receiving the next.
pub(crate) fn ring_reduce_scatter(
    link: &dyn Link,
    bufs: RsBufs<'_>,
    ranges: &[Range<usize>],
    dt: DType,
    op: ReduceOp,
    seg: usize,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    assert_eq!(ranges.len(), n);
    if n == 1 {
        if let RsBufs::Separate { input, out } = bufs {
            out.copy_from_slice(&input[ranges[0].clone()]);
        }
        return Ok(());
    }
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let esz = dt.size();
    let seg = (seg / esz).max(1) * esz;
    let maxc = ranges.iter().map(|c| c.len()).max().unwrap_or(0);

    match bufs {
        RsBufs::InPlace(buf) => {
            let mut tmp = Scratch::take(maxc);
            let buf = Carve::new(buf);
            for s in 0..n - 1 {
                let sc = ranges[(r + n - s - 1) % n].clone();
                let rc = ranges[(r + 2 * n - s - 2) % n].clone();
                let tmp = Carve::new(&mut tmp[..rc.len()]);
                let segs: Vec<Range<usize>> = segments(rc.len(), seg).collect();
                let mut recvs = Vec::with_capacity(segs.len());
                for g in &segs {
                    // SAFETY: the segments of `tmp` are disjoint.
                    recvs.push(Recv::post(link, left, unsafe { tmp.part_mut(g.clone()) })?);
                }
                // SAFETY: chunks `sc` and `rc` are disjoint (sc != rc as n >= 2, and the caller's
                // ranges do not overlap); the previous step's borrows of them have ended.
                let send = unsafe { buf.part(sc.clone()) };
                let acc = unsafe { buf.part_mut(rc.clone()) };
                let sends = send_segments(link, right, send, seg)?;
                for (rv, g) in recvs.into_iter().zip(&segs) {
                    rv.wait()?;
                    // SAFETY: this segment's receive has completed; no other part overlaps it.
                    combine(dt, op, &mut acc[g.clone()], unsafe { tmp.part(g.clone()) });
                }
                wait_all(Vec::new(), sends)?;
            }
        }
        RsBufs::Separate { input, out } => {
            assert_eq!(out.len(), ranges[r].len());
            // Two staging areas: the partial being sent and the one being produced.
            let mut stage = vec![0u8; if n > 2 { 2 * maxc } else { 0 }];
            let stage = Carve::new(&mut stage);
            let mut out = Some(out);
            for s in 0..n - 1 {
                let sci = (r + n - s - 1) % n;
                let rci = (r + 2 * n - s - 2) % n;
                let (slen, rlen) = (ranges[sci].len(), ranges[rci].len());
                let send: &[u8] = if s == 0 {
                    &input[ranges[sci].clone()]
                } else {
                    let base = ((s - 1) % 2) * maxc;
                    // SAFETY: staging area (s-1)%2 is only read during this step.
                    unsafe { stage.part(base..base + slen) }
                };
                let target: &mut [u8] = if s == n - 2 {
                    debug_assert_eq!(rci, r);
                    out.take().expect("final step runs once")
                } else {
                    let base = (s % 2) * maxc;
                    // SAFETY: staging area s%2 is disjoint from area (s-1)%2 being sent; its
                    // previous use (sent in step s-1) has completed.
                    unsafe { stage.part_mut(base..base + rlen) }
                };
                // The partial from the left lands where its sum goes, which is then folded with
                // our input: one buffer fewer than receiving aside (the ops are commutative,
                // bit for bit, so `received op local` equals `local op received`).
                let target = Carve::new(target);
                let segs: Vec<Range<usize>> = segments(rlen, seg).collect();
                let mut recvs = Vec::with_capacity(segs.len());
                for g in &segs {
                    // SAFETY: the segments of `target` are disjoint.
                    recvs.push(Recv::post(link, left, unsafe { target.part_mut(g.clone()) })?);
                }
                let sends = send_segments(link, right, send, seg)?;
                let local = &input[ranges[rci].clone()];
                for (rv, g) in recvs.into_iter().zip(&segs) {
                    rv.wait()?;
                    // SAFETY: this segment's receive has completed; nothing else borrows it.
                    combine(dt, op, unsafe { target.part_mut(g.clone()) }, &local[g.clone()]);
                }
                wait_all(Vec::new(), sends)?;
            }
        }
    }
    Ok(())
}

/// Reduces block `j` of every rank's send buffer into rank `j`. Blocks are `recv.len()` bytes
/// (Separate) or `buf.len() / size` (InPlace). Result bits are identical to what any other
/// member would compute for the same block: the reduction order is fixed by the algorithm.
pub fn reduce_scatter(
    link: &dyn Link,
    bufs: ReduceScatterBufs<'_>,
    dt: DType,
    op: ReduceOp,
) -> Result<()> {
    let n = link.size();
    check_op(dt, op)?;
    let (total, block) = match &bufs {
        ReduceScatterBufs::Separate { send, recv } => {
            if send.len() != n * recv.len() {
                bail!(
                    Status::InvalidArgument,
                    "reduce_scatter: send buffer holds {} bytes, expected {} ranks x {} bytes",
                    send.len(),
                    n,
                    recv.len()
                );
            }
            (send.len(), recv.len())
        }
        ReduceScatterBufs::InPlace(buf) => {
            if !buf.len().is_multiple_of(n) {
                bail!(
                    Status::InvalidArgument,
                    "reduce_scatter: in-place buffer of {} bytes is not {n} equal blocks",
                    buf.len()
                );
            }
            (buf.len(), buf.len() / n)
        }
    };
    check_elems(block, dt, "reduce_scatter block")?;
    reduce_scatter_with(link, bufs, dt, op, super::tuning::reduce_scatter(n, total))
}

/// `Algo::Tree`: the reduction in rank order at rank 0 (the tree reduce's order), then each
/// block down the scatter tree to its owner.
fn tree(link: &dyn Link, bufs: ReduceScatterBufs<'_>, block: usize, dt: DType, op: ReduceOp) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let ranges = blocks(n, block);
    let mut mine = Scratch::take(block);
    let mine = &mut mine[..block];
    {
        let input: &[u8] = match &bufs {
            ReduceScatterBufs::Separate { send, .. } => send,
            ReduceScatterBufs::InPlace(buf) => buf,
        };
        let mut whole = if r == 0 { Some(Scratch::take(input.len())) } else { None };
        let acc = whole.as_mut().map(|w| &mut w[..input.len()]);
        reduce_with(link, Some(input), acc, input.len(), dt, op, 0, reduce_coll::Algo::Tree)?;
        tree_scatter(link, whole.as_ref().map(|w| &w[..input.len()]), &ranges, 0, mine)?;
    }
    match bufs {
        ReduceScatterBufs::Separate { recv, .. } => recv.copy_from_slice(mine),
        ReduceScatterBufs::InPlace(buf) => buf[r * block..(r + 1) * block].copy_from_slice(mine),
    }
    Ok(())
}

/// `reduce_scatter` with an explicit algorithm (arguments already validated).
pub(crate) fn reduce_scatter_with(
    link: &dyn Link,
    bufs: ReduceScatterBufs<'_>,
    dt: DType,
    op: ReduceOp,
    algo: Algo,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let block = match &bufs {
        ReduceScatterBufs::Separate { recv, .. } => recv.len(),
        ReduceScatterBufs::InPlace(buf) => buf.len() / n,
    };
    if block == 0 {
        return Ok(());
    }
    let own = r * block..(r + 1) * block;
    if n == 1 {
        if let ReduceScatterBufs::Separate { send, recv } = bufs {
            recv.copy_from_slice(send);
        }
        return Ok(());
    }
    match algo {
        Algo::Direct => direct(link, bufs, block, dt, op),
        Algo::Tree => tree(link, bufs, block, dt, op),
        Algo::Ring { seg } if needs_widen(dt, op) => {
            let src: &[u8] = match &bufs {
                ReduceScatterBufs::Separate { send, .. } => send,
                ReduceScatterBufs::InPlace(buf) => buf,
            };
            let mut w = vec![0u8; src.len() * 2];
            widen(dt, src, &mut w);
            let wr = blocks(n, block * 2);
            ring_reduce_scatter(link, RsBufs::InPlace(&mut w), &wr, DType::Float32, op, seg)?;
            let wown = &mut w[wr[r].clone()];
            if op == ReduceOp::Avg {
                divide(DType::Float32, wown, n);
            }
            match bufs {
                ReduceScatterBufs::Separate { recv, .. } => narrow(dt, wown, recv),
                ReduceScatterBufs::InPlace(buf) => narrow(dt, wown, &mut buf[own]),
            }
            Ok(())
        }
        Algo::Ring { seg } => {
            let ranges = blocks(n, block);
            let out = match bufs {
                ReduceScatterBufs::Separate { send, recv } => {
                    ring_reduce_scatter(
                        link,
                        RsBufs::Separate {
                            input: send,
                            out: recv,
                        },
                        &ranges,
                        dt,
                        op,
                        seg,
                    )?;
                    recv
                }
                ReduceScatterBufs::InPlace(buf) => {
                    ring_reduce_scatter(link, RsBufs::InPlace(buf), &ranges, dt, op, seg)?;
                    &mut buf[own]
                }
            };
            if op == ReduceOp::Avg {
                divide(dt, out, n);
            }
            Ok(())
        }
    }
}

/// Every rank sends block `j` straight to rank `j`, which reduces the `n` blocks in rank order.
fn direct(
    link: &dyn Link,
    bufs: ReduceScatterBufs<'_>,
    block: usize,
    dt: DType,
    op: ReduceOp,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let own = r * block..(r + 1) * block;
    let mut got = vec![0u8; n * block];
    let (src, mine): (&[u8], Vec<u8>) = match &bufs {
        ReduceScatterBufs::Separate { send, .. } => (send, Vec::new()),
        // The result overwrites our own contribution, so keep a copy of it.
        ReduceScatterBufs::InPlace(buf) => (buf, buf[own.clone()].to_vec()),
    };
    {
        let mut recvs = Vec::with_capacity(n - 1);
        for (p, chunk) in got.chunks_mut(block).enumerate() {
            if p != r {
                recvs.push(Recv::post(link, p, chunk)?);
            }
        }
        let mut sends = Vec::with_capacity(n - 1);
        for p in peers(r, n) {
            sends.push(link.send(p, &src[p * block..(p + 1) * block])?);
        }
        wait_all(recvs, sends)?;
    }
    let (out, mine): (&mut [u8], &[u8]) = match bufs {
        ReduceScatterBufs::Separate { send, recv } => (recv, &send[own]),
        ReduceScatterBufs::InPlace(buf) => (&mut buf[own], &mine),
    };
    let inputs: Vec<&[u8]> = (0..n)
        .map(|p| {
            if p == r {
                mine
            } else {
                &got[p * block..(p + 1) * block]
            }
        })
        .collect();
    reduce_in_order(dt, op, &inputs, out, n);
    Ok(())
}
