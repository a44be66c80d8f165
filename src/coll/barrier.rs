//! barrier: dissemination with empty messages (ceil(log2 n) rounds) in small groups; binomial
//! fan-in to rank 0 and fan-out from it in large ones (2 ceil(log2 n) rounds over the n-1 edges
//! of the tree the small allreduce uses, where dissemination would touch 2 log2 n peers per
//! rank); hierarchical (within hosts, across their leaders, within hosts) when the link reports
//! several hosts with several ranks (see `hier`).

use super::util::{binomial, wait_all, Recv};
use super::{hier, tuning, Link};
use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Dissemination,
    Tree,
}

/// Returns once every member has entered the barrier.
pub fn barrier(link: &dyn Link) -> Result<()> {
    if let Some(hosts) = hier::Hosts::of(link) {
        return hier::barrier(link, &hosts);
    }
    barrier_with(link, tuning::barrier(link.size()))
}

pub(crate) fn barrier_with(link: &dyn Link, algo: Algo) -> Result<()> {
    if link.size() == 1 {
        return Ok(());
    }
    match algo {
        Algo::Dissemination => dissemination(link),
        Algo::Tree => {
            fan_in(link)?;
            fan_out(link)
        }
    }
}

fn dissemination(link: &dyn Link) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let mut k = 1;
    while k < n {
        let mut none = [0u8; 0];
        let rv = Recv::post(link, (r + n - k) % n, &mut none)?;
        let sd = link.send((r + k) % n, &[])?;
        wait_all(vec![rv], vec![sd])?;
        k <<= 1;
    }
    Ok(())
}

/// Up the binomial tree rooted at rank 0: an empty message to the parent once every child's has
/// come. When it returns on rank 0, every member has entered.
pub(crate) fn fan_in(link: &dyn Link) -> Result<()> {
    let (parent, children) = binomial(link.rank(), link.size(), 0);
    let mut none = vec![[0u8; 0]; children.len()];
    let mut recvs = Vec::with_capacity(children.len());
    for (c, b) in children.iter().zip(none.iter_mut()) {
        recvs.push(Recv::post(link, *c, b)?);
    }
    wait_all(recvs, Vec::new())?;
    match parent {
        Some(p) => link.send(p, &[])?.wait().map(drop),
        None => Ok(()),
    }
}

/// Down the same tree: wait for the parent's empty message, pass it to the children.
pub(crate) fn fan_out(link: &dyn Link) -> Result<()> {
    let (parent, children) = binomial(link.rank(), link.size(), 0);
    if let Some(p) = parent {
        Recv::post(link, p, &mut [])?.wait()?;
    }
    let mut sends = Vec::with_capacity(children.len());
    // Largest subtree first: it has the longest way down.
    for c in children.iter().rev() {
        sends.push(link.send(*c, &[])?);
    }
    wait_all(Vec::new(), sends)
}
