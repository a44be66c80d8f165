//! gather and scatter: direct to / from the root in small groups, binomial trees in large ones
//! (plus the tree gather of variable blocks that the large reduce uses).

use std::ops::Range;

use super::util::{
    binomial, blocks, check_len, check_root, peers, subtree_end, wait_all, Carve, Recv, Scratch,
};
use super::{tuning, Link};
use crate::bail;
use crate::error::{Result, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Direct,
    Tree,
}

/// Byte offsets of relative ranks `from..to` packed in relative order (block of comm rank p:
/// `ranges[p].len()` bytes): `off[v - from]..off[v - from + 1]` is relative rank v's block.
fn packed_offsets(ranges: &[Range<usize>], root: usize, from: usize, to: usize) -> Vec<usize> {
    let n = ranges.len();
    let mut off = Vec::with_capacity(to - from + 1);
    let mut at = 0;
    off.push(0);
    for v in from..to {
        at += ranges[(v + root) % n].len();
        off.push(at);
    }
    off
}

/// A rank's place in the binomial tree rooted at `root`: its relative rank, its subtree's
/// blocks packed in relative order (`off`, from `packed_offsets`), its parent and children.
struct Subtree {
    vr: usize,
    off: Vec<usize>,
    parent: Option<usize>,
    children: Vec<usize>,
}

impl Subtree {
    fn of(r: usize, ranges: &[Range<usize>], root: usize) -> Subtree {
        let n = ranges.len();
        let vr = (r + n - root) % n;
        let off = packed_offsets(ranges, root, vr, subtree_end(vr, n));
        let (parent, children) = binomial(r, n, root);
        Subtree { vr, off, parent, children }
    }
}

/// Binomial gather of blocks that may differ in size: comm rank p contributes
/// `ranges[p].len()` bytes; at the root each block lands at `out[ranges[p]]`. A rank collects
/// its subtree's blocks packed in relative-rank order in scratch and sends them to its parent as
/// one message, so each rank talks to its parent and its children only. Non-root: `mine` is its
/// block, `out` None. Root: `out` Some, its own block already in place (`mine` unused).
pub(crate) fn tree_gather(
    link: &dyn Link,
    mine: &[u8],
    ranges: &[Range<usize>],
    root: usize,
    out: Option<&mut [u8]>,
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let Subtree { vr, off, parent, children } = Subtree::of(r, ranges, root);
    let total = *off.last().expect("a subtree holds its own rank");
    let mut tmp = Scratch::take(total);
    let tmp = &mut tmp[..total];
    if parent.is_some() {
        check_len(mine.len(), ranges[r].len(), "gather: block")?;
        tmp[..mine.len()].copy_from_slice(mine);
    }
    {
        let tmp = Carve::new(tmp);
        let mut recvs = Vec::with_capacity(children.len());
        for &c in &children {
            let vc = (c + n - root) % n;
            let part = off[vc - vr]..off[subtree_end(vc, n) - vr];
            // SAFETY: the children's subtrees are disjoint relative-rank intervals.
            recvs.push(Recv::post(link, c, unsafe { tmp.part_mut(part) })?);
        }
        wait_all(recvs, Vec::new())?;
    }
    match (parent, out) {
        (Some(p), _) => link.send(p, tmp)?.wait().map(drop),
        (None, Some(out)) => {
            for v in 1..n {
                let p = (v + root) % n;
                out[ranges[p].clone()].copy_from_slice(&tmp[off[v]..off[v + 1]]);
            }
            Ok(())
        }
        (None, None) => bail!(Status::InvalidArgument, "gather: the root needs a recv buffer"),
    }
}

/// Binomial scatter, the mirror of `tree_gather`: the root (`src` Some) packs the blocks
/// `src[ranges[p]]` in relative-rank order and sends each child its subtree's part; every rank
/// forwards its children's parts and keeps its own block in `mine` (`ranges[rank].len()` bytes).
pub(crate) fn tree_scatter(
    link: &dyn Link,
    src: Option<&[u8]>,
    ranges: &[Range<usize>],
    root: usize,
    mine: &mut [u8],
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let Subtree { vr, off, parent, children } = Subtree::of(r, ranges, root);
    let total = *off.last().expect("a subtree holds its own rank");
    let mut tmp = Scratch::take(total);
    let tmp = &mut tmp[..total];
    match (parent, src) {
        (Some(p), _) => Recv::post(link, p, tmp)?.wait()?,
        (None, Some(src)) => {
            for v in 0..n {
                tmp[off[v]..off[v + 1]].copy_from_slice(&src[ranges[(v + root) % n].clone()]);
            }
        }
        (None, None) => bail!(Status::InvalidArgument, "scatter: the root needs a send buffer"),
    }
    let tmp: &[u8] = tmp;
    let mut sends = Vec::with_capacity(children.len());
    // Largest subtree first: it has the longest way down.
    for &c in children.iter().rev() {
        let vc = (c + n - root) % n;
        sends.push(link.send(c, &tmp[off[vc - vr]..off[subtree_end(vc, n) - vr]])?);
    }
    mine.copy_from_slice(&tmp[..off[1]]);
    wait_all(Vec::new(), sends)
}

/// Collects every rank's `send` at the root: `recv` (root only, `size * send.len()` bytes) gets
/// rank `j`'s block at `j * send.len()`. `recv` is ignored on other ranks.
pub fn gather(link: &dyn Link, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    check_root(root, n)?;
    let block = send.len();
    let algo = tuning::gather(n);
    if r != root {
        if block == 0 {
            return Ok(());
        }
        if algo == Algo::Tree {
            return tree_gather(link, send, &blocks(n, block), root, None);
        }
        return link.send(root, send)?.wait().map(drop);
    }
    let Some(recv) = recv else {
        bail!(
            Status::InvalidArgument,
            "gather: the root needs a recv buffer"
        );
    };
    check_len(recv.len(), n * block, "gather: recv buffer")?;
    if block == 0 {
        return Ok(());
    }
    if algo == Algo::Tree {
        recv[r * block..(r + 1) * block].copy_from_slice(send);
        return tree_gather(link, send, &blocks(n, block), root, Some(recv));
    }
    let mut recvs = Vec::with_capacity(n - 1);
    for (p, slot) in recv.chunks_mut(block).enumerate() {
        if p == r {
            slot.copy_from_slice(send);
        } else {
            recvs.push(Recv::post(link, p, slot)?);
        }
    }
    wait_all(recvs, Vec::new())
}

/// Distributes the root's `send` (`size * recv.len()` bytes): block `j` goes to rank `j`'s `recv`.
/// `send` is ignored on other ranks.
pub fn scatter(link: &dyn Link, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    check_root(root, n)?;
    let block = recv.len();
    let algo = tuning::gather(n);
    if r != root {
        if block == 0 {
            return Ok(());
        }
        if algo == Algo::Tree {
            return tree_scatter(link, None, &blocks(n, block), root, recv);
        }
        return Recv::post(link, root, recv)?.wait();
    }
    let Some(send) = send else {
        bail!(
            Status::InvalidArgument,
            "scatter: the root needs a send buffer"
        );
    };
    check_len(send.len(), n * block, "scatter: send buffer")?;
    if block == 0 {
        return Ok(());
    }
    if algo == Algo::Tree {
        return tree_scatter(link, Some(send), &blocks(n, block), root, recv);
    }
    let mut sends = Vec::with_capacity(n - 1);
    for p in peers(r, n) {
        sends.push(link.send(p, &send[p * block..(p + 1) * block])?);
    }
    recv.copy_from_slice(&send[r * block..(r + 1) * block]);
    wait_all(Vec::new(), sends)
}
