//! allreduce: direct exchange + rank-ordered reduction for small buffers in small groups,
//! binomial reduce to rank 0 + binomial broadcast for small buffers in large groups, ring
//! reduce-scatter + ring allgather for large ones; hierarchical (within hosts, then across) when
//! the link reports several hosts with several ranks (see `hier`). Every rank ends with bitwise
//! identical bytes: in the direct algorithm all ranks run the same reduction over the same inputs
//! in the same order; in the tree rank 0 finishes the result and it is copied everywhere; in the
//! ring each chunk is finished once, by its owner, and then copied everywhere.

use super::allgather::ring_allgather;
use super::reduce_scatter::{ring_reduce_scatter, RsBufs};
use super::{broadcast, hier, reduce_coll, tuning};
use super::util::{
    check_elems, check_len, check_op, peers, reduce_in_order, split_elems, wait_all, Recv,
};
use super::Link;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::reduce::{divide, narrow, needs_widen, widen};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Direct,
    /// Binomial-tree reduce to rank 0 (fixed combining order), binomial broadcast from rank 0.
    Tree,
    /// Ring with reduce-scatter steps cut into segments of about `seg` bytes.
    Ring {
        seg: usize,
    },
}

/// Reduces every rank's input element-wise into every rank's `recv`.
/// `send` None = in place (`recv` holds this rank's input).
pub fn allreduce(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: &mut [u8],
    dt: DType,
    op: ReduceOp,
) -> Result<()> {
    check_op(dt, op)?;
    check_elems(recv.len(), dt, "allreduce: buffer")?;
    if let Some(s) = send {
        check_len(s.len(), recv.len(), "allreduce: send buffer")?;
    }
    if let Some(hosts) = hier::Hosts::of(link) {
        return hier::allreduce(link, &hosts, send, recv, dt, op);
    }
    let algo = tuning::allreduce(link.size(), recv.len());
    allreduce_with(link, send, recv, dt, op, algo)
}

/// `allreduce` with an explicit algorithm (arguments already validated).
pub(crate) fn allreduce_with(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: &mut [u8],
    dt: DType,
    op: ReduceOp,
    algo: Algo,
) -> Result<()> {
    if link.size() == 1 || recv.is_empty() {
        if let Some(s) = send {
            recv.copy_from_slice(s);
        }
        return Ok(());
    }
    match algo {
        Algo::Direct => direct(link, send, recv, dt, op),
        Algo::Tree => tree(link, send, recv, dt, op),
        Algo::Ring { seg } => ring(link, send, recv, dt, op, seg),
    }
}

/// Every rank sends its input to every other rank, then reduces all `n` inputs in rank order.
fn direct(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: &mut [u8],
    dt: DType,
    op: ReduceOp,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let len = recv.len();
    // Our own input must survive until the reduction reads it; in place it lives in `recv`.
    let copy;
    let mine: &[u8] = match send {
        Some(s) => s,
        None => {
            copy = recv.to_vec();
            &copy
        }
    };
    let mut got = vec![0u8; n * len];
    {
        let mut recvs = Vec::with_capacity(n - 1);
        for (p, slot) in got.chunks_mut(len).enumerate() {
            if p != r {
                recvs.push(Recv::post(link, p, slot)?);
            }
        }
        let mut sends = Vec::with_capacity(n - 1);
        for p in peers(r, n) {
            sends.push(link.send(p, mine)?);
        }
        wait_all(recvs, sends)?;
    }
    let inputs: Vec<&[u8]> = (0..n)
        .map(|p| {
            if p == r {
                mine
            } else {
                &got[p * len..(p + 1) * len]
            }
        })
        .collect();
    reduce_in_order(dt, op, &inputs, recv, n);
    Ok(())
}

/// The reduce collective's binomial tree to rank 0 (children folded in a fixed order, half
/// precision widened and rounded once at the root, Avg divided there), then a binomial broadcast
/// of rank 0's finished bytes over the same tree edges. 2 ceil(log2 n) rounds; the tree's n-1
/// edges are the only pairs that talk.
fn tree(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: &mut [u8],
    dt: DType,
    op: ReduceOp,
) -> Result<()> {
    let len = recv.len();
    let reduce = reduce_coll::Algo::Tree;
    if link.rank() == 0 {
        reduce_coll::reduce_with(link, send, Some(&mut *recv), len, dt, op, 0, reduce)?;
    } else {
        reduce_coll::reduce_with(link, Some(send.unwrap_or(&*recv)), None, len, dt, op, 0, reduce)?;
    }
    broadcast::broadcast_with(link, recv, 0, broadcast::Algo::Tree)
}

/// Ring reduce-scatter over element-aligned chunks, owner finishes its chunk (Avg division,
/// f16/bf16 rounding), ring allgather. Half-precision Sum/Prod/Avg travel as f32 during the
/// reduce-scatter and are rounded once by the owner; the allgather moves the final 16-bit values.
fn ring(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: &mut [u8],
    dt: DType,
    op: ReduceOp,
    seg: usize,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let esz = dt.size();
    let count = recv.len() / esz;
    let ranges = split_elems(count, n, esz);
    if needs_widen(dt, op) {
        let mut w = vec![0u8; recv.len() * 2];
        widen(dt, send.unwrap_or(&*recv), &mut w);
        let wr = split_elems(count, n, 4);
        ring_reduce_scatter(link, RsBufs::InPlace(&mut w), &wr, DType::Float32, op, seg)?;
        let own = &mut w[wr[r].clone()];
        if op == ReduceOp::Avg {
            divide(DType::Float32, own, n);
        }
        narrow(dt, own, &mut recv[ranges[r].clone()]);
    } else {
        match send {
            Some(input) => {
                let out = &mut recv[ranges[r].clone()];
                ring_reduce_scatter(link, RsBufs::Separate { input, out }, &ranges, dt, op, seg)?
            }
            None => ring_reduce_scatter(link, RsBufs::InPlace(recv), &ranges, dt, op, seg)?,
        }
        if op == ReduceOp::Avg {
            divide(dt, &mut recv[ranges[r].clone()], n);
        }
    }
    ring_allgather(link, recv, &ranges)
}
