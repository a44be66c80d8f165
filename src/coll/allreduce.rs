//! allreduce: direct exchange + rank-ordered reduction for small buffers, ring reduce-scatter +
//! ring allgather for large ones. Every rank ends with bitwise identical bytes: in the direct
//! algorithm all ranks run the same reduction over the same inputs in the same order; in the ring
//! each chunk is finished once, by its owner, and then copied everywhere.

use super::allgather::ring_allgather;
use super::reduce_scatter::{ring_reduce_scatter, RsBufs};
use super::tuning::{ALLREDUCE_SMALL_BYTES, RING_SEGMENT_BYTES};
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
    let algo = if recv.len() <= ALLREDUCE_SMALL_BYTES {
        Algo::Direct
    } else {
        Algo::Ring {
            seg: RING_SEGMENT_BYTES,
        }
    };
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
