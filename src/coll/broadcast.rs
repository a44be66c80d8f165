//! broadcast: binomial tree for small buffers (log2(n) rounds), pipelined chain for large ones
//! (each link carries the data once; segments overlap the hops); hierarchical (across hosts,
//! then within each) when the link reports several hosts with several ranks (see `hier`).

use super::util::{check_root, segments, wait_all, Carve, Recv};
use super::{hier, tuning, Link};
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Tree,
    /// Pipelined chain in segments of `seg` bytes.
    Chain {
        seg: usize,
    },
}

/// Copies `buf` of rank `root` into `buf` of every rank.
pub fn broadcast(link: &dyn Link, buf: &mut [u8], root: usize) -> Result<()> {
    let n = link.size();
    check_root(root, n)?;
    if let Some(hosts) = hier::Hosts::of(link) {
        return hier::broadcast(link, &hosts, buf, root);
    }
    let crowded = n > 2 && buf.len() > tuning::BROADCAST_SMALL_BYTES && one_crowded_host(link);
    broadcast_with(link, buf, root, tuning::broadcast(n, buf.len(), crowded))
}

/// Whether every member is on this host and it runs more ranks than it has cores. Asked of
/// the members' shared host only, so that all of them choose alike.
fn one_crowded_host(link: &dyn Link) -> bool {
    crate::completion::oversubscribed() && (1..link.size()).all(|p| link.host_of(p) == link.host_of(0))
}

pub(crate) fn broadcast_with(
    link: &dyn Link,
    buf: &mut [u8],
    root: usize,
    algo: Algo,
) -> Result<()> {
    if link.size() == 1 || buf.is_empty() {
        return Ok(());
    }
    match algo {
        Algo::Tree => tree(link, buf, root),
        Algo::Chain { seg } => chain(link, buf, root, seg),
    }
}

/// Binomial tree over ranks relative to the root: receive from the parent (relative rank with
/// its lowest set bit cleared), then send to children, largest subtree first.
fn tree(link: &dyn Link, buf: &mut [u8], root: usize) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let vr = (r + n - root) % n;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            let parent = (vr - mask + root) % n;
            Recv::post(link, parent, buf)?.wait()?;
            break;
        }
        mask <<= 1;
    }
    let mut sends = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            sends.push(link.send((vr + mask + root) % n, buf)?);
        }
        mask >>= 1;
    }
    wait_all(Vec::new(), sends)
}

/// Pipelined chain root -> root+1 -> ... -> root-1: every rank posts all its segment receives up
/// front and forwards each segment as soon as it has arrived.
fn chain(link: &dyn Link, buf: &mut [u8], root: usize, seg: usize) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let vr = (r + n - root) % n;
    let next = (vr + 1 < n).then(|| (r + 1) % n);
    let prev = (r + n - 1) % n;
    let segs: Vec<_> = segments(buf.len(), seg).collect();
    let mut sends = Vec::with_capacity(segs.len());
    if vr == 0 {
        let next = next.expect("n >= 2");
        for g in &segs {
            sends.push(link.send(next, &buf[g.clone()])?);
        }
        return wait_all(Vec::new(), sends);
    }
    let buf = Carve::new(buf);
    let mut recvs = Vec::with_capacity(segs.len());
    for g in &segs {
        // SAFETY: segments are disjoint.
        recvs.push(Recv::post(link, prev, unsafe { buf.part_mut(g.clone()) })?);
    }
    for (rv, g) in recvs.into_iter().zip(&segs) {
        rv.wait()?;
        if let Some(next) = next {
            // SAFETY: this segment's receive has completed; it is only read from now on.
            sends.push(link.send(next, unsafe { buf.part(g.clone()) })?);
        }
    }
    wait_all(Vec::new(), sends)
}
