//! Hierarchical forms of allreduce, broadcast and barrier, for links whose members span several
//! hosts with several members on some host (`Link::host_of`): work within each host, then among
//! one member per host (its leader: the lowest rank there, or the broadcast root on the root's
//! host), then within each host again. Cross-host traffic is then one tree or ring over the
//! hosts, and each level runs the flat algorithm `tuning` picks for its own size, on a
//! `SubLink` that renumbers the level's members 0..k.
//!
//! Results are still bitwise identical on every member: each level finishes its values in one
//! place (the leader, or the flat algorithm's fixed order among leaders) and copies them on.
//! The reduction order differs from the flat algorithms' (host by host), which is fine as every
//! member gets the same bits. Half-precision Sum/Prod/Avg run all levels in f32 and round once
//! at the end; Avg runs as Sum and every member divides the same bits by n.

use super::util::Scratch;
use super::allreduce::allreduce_with;
use super::barrier::{barrier_with, fan_in, fan_out};
use super::broadcast::broadcast_with;
use super::reduce_coll::reduce_with;
use super::{tuning, Link, Pending};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::reduce::{divide, narrow, needs_widen, widen};

/// The members grouped by host.
pub(crate) struct Hosts {
    /// The members of each host, in increasing rank order; hosts ordered by their lowest rank.
    groups: Vec<Vec<usize>>,
    /// Index in `groups` of this rank's host.
    mine: usize,
}

impl Hosts {
    /// The grouping of `link`'s members, or None when the hierarchy would be flat anyway
    /// (every member on a host of its own, or all on one host).
    pub fn of(link: &dyn Link) -> Option<Hosts> {
        let n = link.size();
        if n <= 2 {
            return None;
        }
        let hosts: Vec<usize> = (0..n).map(|p| link.host_of(p)).collect();
        // The default `host_of` (and any placement with one member per host) is flat: cheap
        // check first, as this runs on every call.
        if hosts.iter().enumerate().all(|(p, &h)| h == p) || hosts.iter().all(|&h| h == hosts[0]) {
            return None;
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&p| (hosts[p], p));
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, &p) in order.iter().enumerate() {
            if i > 0 && hosts[order[i - 1]] == hosts[p] {
                groups.last_mut().expect("not first").push(p);
            } else {
                groups.push(vec![p]);
            }
        }
        if groups.len() == n {
            return None;
        }
        groups.sort_by_key(|g| g[0]);
        let me = link.rank();
        let mine = groups.iter().position(|g| g.contains(&me)).expect("every rank has a host");
        Some(Hosts { groups, mine })
    }

    /// Number of hosts.
    pub fn count(&self) -> usize {
        self.groups.len()
    }

    /// The members of this rank's host.
    fn local(&self) -> &[usize] {
        &self.groups[self.mine]
    }
}

/// A view of some of a link's members as a group of their own: member `i` of the view is comm
/// rank `members[i]` of the parent. Pairs keep their FIFO order; every level of a hierarchical
/// call uses its own pairs (same host, or different hosts), and the levels run in the same
/// order on every member.
pub(crate) struct SubLink<'l> {
    link: &'l dyn Link,
    members: &'l [usize],
    rank: usize,
}

impl<'l> SubLink<'l> {
    /// The view of `members` (which must hold `link.rank()`).
    pub fn new(link: &'l dyn Link, members: &'l [usize]) -> SubLink<'l> {
        let rank = members.iter().position(|&m| m == link.rank()).expect("a member of the view");
        SubLink {
            link,
            members,
            rank,
        }
    }
}

impl Link for SubLink<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.members.len()
    }
    fn send<'a>(&'a self, peer: usize, buf: &'a [u8]) -> Result<Pending<'a>> {
        self.link.send(self.members[peer], buf)
    }
    fn recv<'a>(&'a self, peer: usize, buf: &'a mut [u8]) -> Result<Pending<'a>> {
        self.link.recv(self.members[peer], buf)
    }
    fn host_of(&self, peer: usize) -> usize {
        self.link.host_of(self.members[peer])
    }
}

/// Hierarchical allreduce (arguments already validated, n >= 3).
pub(crate) fn allreduce(
    link: &dyn Link,
    hosts: &Hosts,
    send: Option<&[u8]>,
    recv: &mut [u8],
    dt: DType,
    op: ReduceOp,
) -> Result<()> {
    if recv.is_empty() {
        return Ok(());
    }
    let n = link.size();
    let wop = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
    if needs_widen(dt, op) {
        let wlen = recv.len() * 2;
        let mut w = Scratch::take(wlen);
        let w = &mut w[..wlen];
        widen(dt, send.unwrap_or(&*recv), w);
        levels(link, hosts, w, DType::Float32, wop)?;
        if op == ReduceOp::Avg {
            divide(DType::Float32, w, n);
        }
        narrow(dt, w, recv);
    } else {
        if let Some(s) = send {
            recv.copy_from_slice(s);
        }
        levels(link, hosts, recv, dt, wop)?;
        if op == ReduceOp::Avg {
            divide(dt, recv, n);
        }
    }
    Ok(())
}

/// In place on `buf` (`dt` needs no widening, `op` is not Avg): reduce within the host to its
/// leader, allreduce among the leaders, broadcast within the host.
fn levels(link: &dyn Link, hosts: &Hosts, buf: &mut [u8], dt: DType, op: ReduceOp) -> Result<()> {
    let len = buf.len();
    let local = SubLink::new(link, hosts.local());
    let k = local.size();
    if k > 1 {
        let algo = tuning::reduce(k, len);
        if local.rank() == 0 {
            reduce_with(&local, None, Some(&mut *buf), len, dt, op, 0, algo)?;
        } else {
            reduce_with(&local, Some(&*buf), None, len, dt, op, 0, algo)?;
        }
    }
    if local.rank() == 0 {
        let leaders: Vec<usize> = hosts.groups.iter().map(|g| g[0]).collect();
        let across = SubLink::new(link, &leaders);
        let algo = tuning::allreduce(hosts.count(), len);
        allreduce_with(&across, None, buf, dt, op, algo)?;
    }
    if k > 1 {
        broadcast_with(&local, buf, 0, tuning::broadcast(k, len, crate::completion::oversubscribed()))?;
    }
    Ok(())
}

/// Hierarchical broadcast (root already checked): from the root to one member of every other
/// host (its lowest rank), then within each host from that member (the root itself on its own
/// host).
pub(crate) fn broadcast(link: &dyn Link, hosts: &Hosts, buf: &mut [u8], root: usize) -> Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    let len = buf.len();
    let leader = |g: &Vec<usize>| if g.contains(&root) { root } else { g[0] };
    let leaders: Vec<usize> = hosts.groups.iter().map(leader).collect();
    let me = link.rank();
    if leaders.contains(&me) {
        let across = SubLink::new(link, &leaders);
        let aroot = leaders.iter().position(|&l| l == root).expect("the root leads its host");
        broadcast_with(&across, buf, aroot, tuning::broadcast(hosts.count(), len, false))?;
    }
    let local = SubLink::new(link, hosts.local());
    if local.size() > 1 {
        let lroot = hosts.local().iter().position(|&p| p == leaders[hosts.mine]).expect("on this host");
        broadcast_with(&local, buf, lroot, tuning::broadcast(local.size(), len, crate::completion::oversubscribed()))?;
    }
    Ok(())
}

/// Hierarchical barrier: fan-in within each host to its leader, barrier among the leaders,
/// fan-out within each host.
pub(crate) fn barrier(link: &dyn Link, hosts: &Hosts) -> Result<()> {
    let local = SubLink::new(link, hosts.local());
    if local.size() > 1 {
        fan_in(&local)?;
    }
    if local.rank() == 0 {
        let leaders: Vec<usize> = hosts.groups.iter().map(|g| g[0]).collect();
        let across = SubLink::new(link, &leaders);
        barrier_with(&across, tuning::barrier(hosts.count()))?;
    }
    if local.size() > 1 {
        fan_out(&local)?;
    }
    Ok(())
}
