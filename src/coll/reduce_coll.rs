//! reduce (the collective): binomial tree for small buffers, ring reduce-scatter + gather of the
//! finished chunks at the root for large ones (direct in small groups, up a binomial tree in
//! large ones, so the root does not talk to every rank).

use super::gather::tree_gather;
use super::reduce_scatter::{ring_reduce_scatter, RsBufs};
use super::tuning::{self, DIRECT_MAX_RANKS};
use super::util::{
    check_elems, check_len, check_op, check_root, split_elems, wait_all, Carve, Recv,
};
use super::Link;
use crate::bail;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Result, Status};
use crate::reduce::{combine, divide, narrow, needs_widen, widen};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Tree,
    /// Ring reduce-scatter with steps cut into segments of about `seg` bytes, then gather.
    Ring {
        seg: usize,
    },
}

/// Reduces every rank's `count_bytes` of input into the root's `recv`.
/// Non-root: `send` Some, `recv` ignored. Root: `recv` Some; `send` None = in place (`recv`
/// holds the root's input).
#[allow(clippy::too_many_arguments)]
pub fn reduce(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: Option<&mut [u8]>,
    count_bytes: usize,
    dt: DType,
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let n = link.size();
    check_root(root, n)?;
    check_op(dt, op)?;
    check_elems(count_bytes, dt, "reduce: count")?;
    if let Some(s) = send {
        check_len(s.len(), count_bytes, "reduce: send buffer")?;
    }
    if link.rank() == root {
        match &recv {
            Some(r) => check_len(r.len(), count_bytes, "reduce: recv buffer")?,
            None => bail!(
                Status::InvalidArgument,
                "reduce: the root needs a recv buffer"
            ),
        }
    } else if send.is_none() {
        bail!(
            Status::InvalidArgument,
            "reduce: a non-root rank needs a send buffer"
        );
    }
    let algo = tuning::reduce(n, count_bytes);
    reduce_with(link, send, recv, count_bytes, dt, op, root, algo)
}

/// `reduce` with an explicit algorithm (arguments already validated).
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_with(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: Option<&mut [u8]>,
    count_bytes: usize,
    dt: DType,
    op: ReduceOp,
    root: usize,
    algo: Algo,
) -> Result<()> {
    let is_root = link.rank() == root;
    let recv = if is_root { recv } else { None };
    if link.size() == 1 || count_bytes == 0 {
        if let (Some(s), Some(r)) = (send, recv) {
            r.copy_from_slice(s);
        }
        return Ok(());
    }
    match algo {
        Algo::Tree => tree(link, send, recv, count_bytes, dt, op, root),
        Algo::Ring { seg } => ring(link, send, recv, count_bytes, dt, op, root, seg),
    }
}

/// Binomial tree over ranks relative to the root. A rank folds in its children's subtrees in
/// increasing order (child vr+1, then vr+2, vr+4, ...), so the root's result is the reduction in
/// relative rank order root, root+1, ..., root-1. Half-precision Sum/Prod/Avg travel as f32.
fn tree(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: Option<&mut [u8]>,
    count_bytes: usize,
    dt: DType,
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let vr = (r + n - root) % n;
    let mut children = Vec::new();
    let mut parent = None;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            parent = Some((vr - mask + root) % n);
            break;
        }
        if vr + mask < n {
            children.push((vr + mask + root) % n);
        }
        mask <<= 1;
    }
    let wide = needs_widen(dt, op);
    let (wdt, wlen) = if wide {
        (DType::Float32, count_bytes * 2)
    } else {
        (dt, count_bytes)
    };

    // Leaf: send the input as is (widened if needed).
    if children.is_empty() {
        let parent = parent.expect("n >= 2: a leaf is not the root");
        let input = send.expect("validated");
        if wide {
            let mut w = vec![0u8; wlen];
            widen(dt, input, &mut w);
            return link.send(parent, &w)?.wait().map(drop);
        }
        return link.send(parent, input)?.wait().map(drop);
    }

    let mut got = vec![0u8; children.len() * wlen];
    let got = Carve::new(&mut got);
    let slot = |i: usize| i * wlen..(i + 1) * wlen;
    let mut recvs = Vec::with_capacity(children.len());
    for (i, c) in children.iter().enumerate() {
        // SAFETY: the slots are disjoint.
        recvs.push(Recv::post(link, *c, unsafe { got.part_mut(slot(i)) })?);
    }
    let mut recv = recv;
    // The accumulator: the root's recv buffer when no widening is needed, else scratch.
    let use_recv = !wide && recv.is_some();
    let mut scratch = Vec::new();
    if use_recv {
        if let (Some(s), Some(rb)) = (send, recv.as_deref_mut()) {
            rb.copy_from_slice(s);
        }
    } else {
        let input: &[u8] = send.or(recv.as_deref()).expect("validated");
        if wide {
            scratch = vec![0u8; wlen];
            widen(dt, input, &mut scratch);
        } else {
            scratch = input.to_vec();
        }
    }
    {
        let acc: &mut [u8] = if use_recv {
            recv.as_deref_mut().expect("root")
        } else {
            &mut scratch
        };
        for (i, rv) in recvs.into_iter().enumerate() {
            rv.wait()?;
            // SAFETY: this slot's receive has completed.
            combine(wdt, op, acc, unsafe { got.part(slot(i)) });
        }
        if let Some(p) = parent {
            return link.send(p, acc)?.wait().map(drop);
        }
        if op == ReduceOp::Avg {
            divide(wdt, acc, n);
        }
    }
    if wide {
        narrow(dt, &scratch, recv.expect("root has recv"));
    }
    Ok(())
}

/// Ring reduce-scatter (each rank finishes one chunk), then the chunks go to the root: each
/// straight there in small groups, up the binomial tree (`tree_gather`) in large ones.
#[allow(clippy::too_many_arguments)]
fn ring(
    link: &dyn Link,
    send: Option<&[u8]>,
    recv: Option<&mut [u8]>,
    count_bytes: usize,
    dt: DType,
    op: ReduceOp,
    root: usize,
    seg: usize,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let esz = dt.size();
    let count = count_bytes / esz;
    let ranges = split_elems(count, n, esz);
    let mut recv = recv;
    let mut mine = Vec::new();
    if needs_widen(dt, op) {
        let input: &[u8] = send.or(recv.as_deref()).expect("validated");
        let mut w = vec![0u8; count_bytes * 2];
        widen(dt, input, &mut w);
        let wr = split_elems(count, n, 4);
        ring_reduce_scatter(link, RsBufs::InPlace(&mut w), &wr, DType::Float32, op, seg)?;
        let own = &mut w[wr[r].clone()];
        if op == ReduceOp::Avg {
            divide(DType::Float32, own, n);
        }
        match recv.as_deref_mut() {
            Some(rb) => narrow(dt, own, &mut rb[ranges[r].clone()]),
            None => {
                mine = vec![0u8; ranges[r].len()];
                narrow(dt, own, &mut mine);
            }
        }
    } else {
        match (send, recv.as_deref_mut()) {
            (Some(input), Some(rb)) => {
                let out = &mut rb[ranges[r].clone()];
                ring_reduce_scatter(link, RsBufs::Separate { input, out }, &ranges, dt, op, seg)?;
            }
            (None, Some(rb)) => {
                ring_reduce_scatter(link, RsBufs::InPlace(rb), &ranges, dt, op, seg)?
            }
            (Some(input), None) => {
                mine = vec![0u8; ranges[r].len()];
                let out = &mut mine[..];
                ring_reduce_scatter(link, RsBufs::Separate { input, out }, &ranges, dt, op, seg)?;
            }
            (None, None) => unreachable!("validated"),
        }
        if op == ReduceOp::Avg {
            match recv.as_deref_mut() {
                Some(rb) => divide(dt, &mut rb[ranges[r].clone()], n),
                None => divide(dt, &mut mine, n),
            }
        }
    }
    if n > DIRECT_MAX_RANKS {
        return match recv {
            Some(rb) => tree_gather(link, &[], &ranges, root, Some(rb)),
            None => tree_gather(link, &mine, &ranges, root, None),
        };
    }
    match recv {
        Some(rb) => {
            let rb = Carve::new(rb);
            let mut recvs = Vec::with_capacity(n - 1);
            for p in (0..n).filter(|&p| p != r) {
                // SAFETY: the chunks are disjoint.
                recvs.push(Recv::post(link, p, unsafe {
                    rb.part_mut(ranges[p].clone())
                })?);
            }
            wait_all(recvs, Vec::new())
        }
        None => link.send(root, &mine)?.wait().map(drop),
    }
}
