//! Intercommunicators: a local and a remote group, disjoint; point-to-point goes from one group
//! to the other.
//!
//! An intercommunicator is, on the engine, two comms and the two groups' world ranks:
//! - `MpiComm::comm`, for point-to-point only: its members are the *remote* group and its rank
//!   is the local rank. Sends name remote ranks, statuses give remote ranks, and MPI_ANY_SOURCE
//!   matches the remote group only (nobody else sends on its context). Everything of the MPI
//!   layer's point-to-point (probes, persistent and matched receives) works on it unchanged;
//!   collectives never run on it (`colls::Coll::new` refuses an intercommunicator).
//! - `Inter::union`, over both groups, for the barrier, Intercomm_merge, Comm_dup, Comm_split
//!   and the messages of the inter collectives.

use crate::abi_gen::*;
use crate::api::{out, start_recv, start_send};
use crate::ctxid::mix;
use crate::words;
use crate::err::{MpiErr, Res};
use crate::state::{self, CommRef, MpiComm};
use distcomm::buffer::MutBuf;
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use std::ffi::{c_int, c_void};
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub struct Inter {
    /// World ranks of the local and the remote group, by rank.
    pub local: Vec<u32>,
    pub remote: Vec<u32>,
    pub union: Arc<Comm>,
    /// Union rank of each local and each remote rank.
    pub local_union: Vec<usize>,
    pub remote_union: Vec<usize>,
}

/// A number no other intercommunicator creation picks (with overwhelming odds): seeds the
/// context ids, which the two leaders cannot agree on otherwise without a common parent.
fn nonce() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now(), std::thread::current().id()))
}

/// The intercommunicator's handle, once `union` (over both groups, in any order) is made: the
/// point-to-point comm is derived from the union's context (the same on every member).
fn finish(parent: &Comm, union: Arc<Comm>, local: Vec<u32>, remote: Vec<u32>, errh: MPI_Errhandler) -> Result<MPI_Comm, MpiErr> {
    let at = |w: &u32| union.members().iter().position(|x| x == w).expect("a member of the union");
    let (local_union, remote_union): (Vec<usize>, Vec<usize>) = (local.iter().map(at).collect(), remote.iter().map(at).collect());
    let me = local_union.iter().position(|&u| u == union.rank()).expect("this process is in its local group");
    let p2p = parent.new_from_parts(mix(&[union.context_id(), 2]), me, remote.clone(), false).map_err(MpiErr::from)?;
    let h = state::add_comm(p2p, errh);
    let mc = state::get_comm(h)?;
    let _ = mc.inter.set(Inter { local, remote, union, local_union, remote_union });
    Ok(h)
}

pub fn of(mc: &MpiComm) -> Result<&Inter, MpiErr> {
    mc.inter.get().ok_or_else(|| MpiErr::new(MPI_ERR_COMM, "not an intercommunicator").on(mc.handle))
}

fn intra(c: MPI_Comm) -> Result<CommRef, MpiErr> {
    state::intra_comm(c, "making an intercommunicator")
}

/// The leaders' exchange on the peer comm: (nonce, leader world rank, group world ranks) each
/// way, as a header of two u64 and the size, then the list.
fn exchange(peer: MPI_Comm, remote_leader: c_int, tag: c_int, mine: &[u64]) -> Result<Vec<u64>, MpiErr> {
    let pc = state::get_comm(peer)?;
    if remote_leader < 0 || remote_leader as usize >= pc.comm.size() || remote_leader as usize == pc.rank() {
        return Err(MpiErr::new(MPI_ERR_RANK, format!("remote_leader {remote_leader} is not another rank of peer_comm (size {})", pc.comm.size())).on(peer));
    }
    let sendrecv = |s: &[u8], r: &mut [u8]| -> Res {
        let (rq, sq) = crate::api::start_recv_then_send(start_recv(r.as_mut_ptr() as *mut c_void, r.len() as i64, MPI_BYTE, remote_leader, tag, peer), || {
            start_send(s.as_ptr() as *const c_void, s.len() as i64, MPI_BYTE, remote_leader, tag, peer)
        })?;
        let sent = sq.finish();
        rq.finish()?;
        sent.map(|_| ())
    };
    let mut n = [0u8; 8];
    sendrecv(&(mine.len() as u64).to_le_bytes(), &mut n)?;
    let mut theirs = vec![0u8; 8 * u64::from_le_bytes(n) as usize];
    sendrecv(&words::to_bytes(mine), &mut theirs)?;
    Ok(words::from_bytes(&theirs))
}

/// Every union member's `mine` (the same length on each), by union rank.
fn bcast_bytes(c: &Comm, buf: &mut [u8], root: usize) -> Result<(), MpiErr> {
    c.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(buf), dt: distcomm::DType::Uint8, root }).map_err(MpiErr::from)
}

pub unsafe fn intercomm_create(local_comm: MPI_Comm, local_leader: c_int, peer_comm: MPI_Comm, remote_leader: c_int, tag: c_int, newintercomm: *mut MPI_Comm) -> Res {
    let lc = intra(local_comm)?;
    let o = out(newintercomm, "newintercomm").map_err(|e| e.on(local_comm))?;
    let n = lc.size();
    if local_leader < 0 || local_leader as usize >= n {
        return Err(MpiErr::new(MPI_ERR_RANK, format!("local_leader {local_leader} is not a rank of local_comm (size {n})")).on(local_comm));
    }
    if !(0..=crate::api::TAG_UB).contains(&tag) {
        return Err(MpiErr::new(MPI_ERR_TAG, format!("tag {tag} is outside [0, MPI_TAG_UB]")).on(local_comm));
    }
    let leader = local_leader as usize;
    let local: Vec<u32> = lc.comm.members().to_vec();
    // The leader learns the remote group and tells its group: [ok, seed, local first, size],
    // then the remote world ranks. A failed exchange still reaches every member (ok = 0).
    let mut hdr = [0u64; 4];
    let mut remote = Vec::new();
    let mut failed = None;
    if lc.rank() == leader {
        let me = nonce();
        let mut mine = vec![me, local[leader] as u64];
        mine.extend(local.iter().map(|&w| w as u64));
        match exchange(peer_comm, remote_leader, tag, &mine) {
            Ok(t) if t.len() >= 3 => {
                let (their_nonce, their_leader) = (t[0], t[1]);
                let first = (local[leader] as u64) < their_leader;
                let seed = if first { mix(&[me, their_nonce]) } else { mix(&[their_nonce, me]) };
                remote = t[2..].to_vec();
                hdr = [1, seed, first as u64, remote.len() as u64];
            }
            Ok(_) => failed = Some(MpiErr::new(MPI_ERR_INTERN, "the remote leader sent no group").on(local_comm)),
            Err(e) => failed = Some(e),
        }
    }
    let mut h = words::to_bytes(&hdr);
    bcast_bytes(&lc.comm, &mut h, leader).map_err(|e| e.on(local_comm))?;
    let hdr = words::from_bytes(&h);
    if hdr[0] == 0 {
        return Err(failed.unwrap_or_else(|| MpiErr::new(MPI_ERR_OTHER, format!("the local leader (rank {leader}) could not reach the remote leader")).on(local_comm)));
    }
    let mut r = words::to_bytes(&remote);
    r.resize(8 * hdr[3] as usize, 0);
    bcast_bytes(&lc.comm, &mut r, leader).map_err(|e| e.on(local_comm))?;
    let remote: Vec<u32> = words::from_bytes(&r).into_iter().map(|w| w as u32).collect();
    if remote.iter().any(|w| local.contains(w)) {
        return Err(MpiErr::new(MPI_ERR_COMM, "the local and remote groups overlap (an intercommunicator's groups are disjoint)").on(local_comm));
    }
    // The union: the group whose leader has the lower world rank first.
    let first = hdr[2] == 1;
    let members: Vec<u32> = if first { [&local[..], &remote[..]].concat() } else { [&remote[..], &local[..]].concat() };
    let me = if first { lc.rank() } else { remote.len() + lc.rank() };
    let union = lc.comm.new_from_parts(mix(&[hdr[1], 1]), me, members, true).map_err(|e| MpiErr::from(e).on(local_comm))?;
    *o = finish(&lc.comm, union, local, remote, lc.errhandler.load(Ordering::Relaxed)).map_err(|e| e.on(local_comm))?;
    Ok(())
}


/// MPI_Intercomm_create_from_groups: collective over both groups, with no parent communicator:
/// every member knows both groups, so the context id comes from them and the tag alone.
#[allow(clippy::too_many_arguments)]
pub unsafe fn intercomm_create_from_groups(
    lg: MPI_Group,
    local_leader: c_int,
    rg: MPI_Group,
    remote_leader: c_int,
    stringtag: *const std::ffi::c_char,
    _info: MPI_Info,
    errh: MPI_Errhandler,
    newintercomm: *mut MPI_Comm,
) -> Res {
    state::check_active()?;
    let o = out(newintercomm, "newintercomm")?;
    if stringtag.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "stringtag is NULL");
    }
    if !crate::err::valid_errhandler(errh) {
        return crate::mpi_err!(MPI_ERR_ARG, "{errh:#x} is not a valid error handler");
    }
    let (local, remote) = (crate::group::get(lg)?.to_vec(), crate::group::get(rg)?.to_vec());
    for (what, g, l) in [("local", &local, local_leader), ("remote", &remote, remote_leader)] {
        if l < 0 || l as usize >= g.len() {
            return crate::mpi_err!(MPI_ERR_RANK, "{what}_leader {l} is not a rank of the {what} group (size {})", g.len());
        }
    }
    if remote.iter().any(|w| local.contains(w)) {
        return crate::mpi_err!(MPI_ERR_GROUP, "the local and remote groups overlap (an intercommunicator's groups are disjoint)");
    }
    let world = state::get_comm(MPI_COMM_WORLD)?;
    let me = world.comm.members()[world.rank()];
    let Some(my_local) = local.iter().position(|&w| w == me) else {
        return crate::mpi_err!(MPI_ERR_GROUP, "this process is not in local_group");
    };
    // The union: the group whose leader has the lower world rank first.
    let first = local[local_leader as usize] < remote[remote_leader as usize];
    let members: Vec<u32> = if first { [&local[..], &remote[..]].concat() } else { [&remote[..], &local[..]].concat() };
    let rank = if first { my_local } else { remote.len() + my_local };
    // SAFETY: a NUL-terminated string from the caller.
    let tag = unsafe { std::ffi::CStr::from_ptr(stringtag) }.to_bytes().to_vec();
    let id = crate::ctxid::members_only(world.comm.context_id(), crate::ctxid::INTERCOMM_FROM_GROUPS, &members, &tag);
    let union = world.comm.new_from_parts(id, rank, members, true).map_err(MpiErr::from)?;
    *o = finish(&world.comm, union, local, remote, errh)?;
    Ok(())
}

/// MPI_Comm_dup of an intercommunicator: a new union (collective over both groups), after
/// the comm's non-blocking collectives started before it.
pub fn dup(mc: &MpiComm) -> Result<MPI_Comm, MpiErr> {
    of(mc)?.union.finish_queued();
    dup_in_order(mc)
}

/// `dup` where its turn has come (MPI_Comm_idup's task).
pub fn dup_in_order(mc: &MpiComm) -> Result<MPI_Comm, MpiErr> {
    let x = of(mc)?;
    let all: Vec<usize> = (0..x.union.size()).collect();
    let union = x.union.new_group(&all).map_err(|e| MpiErr::from(e).on(mc.handle))?.expect("every rank is a member of its dup");
    finish(&mc.comm, union, x.local.clone(), x.remote.clone(), mc.errhandler.load(Ordering::Relaxed))
}

pub unsafe fn intercomm_merge(c: MPI_Comm, high: c_int, newintracomm: *mut MPI_Comm) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    let x = of(&mc)?;
    let o = out(newintracomm, "newintracomm").map_err(|e| e.on(c))?;
    x.union.finish_queued();
    // Every member's `high`: the group that passed true goes second; if both passed the same,
    // the group of union rank 0 goes first. Each group keeps its ranks' order.
    let highs = words::allgather(&x.union, &[(high != 0) as u64]).map_err(|e| e.on(c))?;
    let (mut a, mut b) = (&x.local_union, &x.remote_union);
    if !a.contains(&0) {
        std::mem::swap(&mut a, &mut b);
    }
    if highs[a[0]] == 1 && highs[b[0]] == 0 {
        std::mem::swap(&mut a, &mut b);
    }
    let order: Vec<usize> = a.iter().chain(b.iter()).copied().collect();
    let child = x.union.new_group(&order).map_err(|e| MpiErr::from(e).on(c))?.expect("every rank is a member of the merge");
    *o = state::add_comm(child, mc.errhandler.load(Ordering::Relaxed));
    Ok(())
}

/// MPI_Comm_split of an intercommunicator: the ranks of a color in each group form the new
/// local and remote groups (ordered by key, then rank); a color with no remote ranks, or
/// MPI_UNDEFINED, gives MPI_COMM_NULL. Collective over both groups.
pub fn split(mc: &MpiComm, color: c_int, key: c_int) -> Result<MPI_Comm, MpiErr> {
    let x = of(mc)?;
    let c = mc.handle;
    if color < 0 && color != MPI_UNDEFINED {
        return Err(MpiErr::new(MPI_ERR_ARG, format!("color {color} is negative (only MPI_UNDEFINED may be)")).on(c));
    }
    let col = if color == MPI_UNDEFINED { -1 } else { color as i64 };
    x.union.finish_queued();
    let all = words::allgather(&x.union, &[col as u64, key as i64 as u64]).map_err(|e| e.on(c))?;
    let pick = |union_ranks: &[usize], worlds: &[u32]| -> Vec<u32> {
        let mut v: Vec<(i64, usize)> = (0..worlds.len()).filter(|&r| col >= 0 && all[2 * union_ranks[r]] as i64 == col).map(|r| (all[2 * union_ranks[r] + 1] as i64, r)).collect();
        v.sort();
        v.into_iter().map(|(_, r)| worlds[r]).collect()
    };
    let (local, remote) = (pick(&x.local_union, &x.local), pick(&x.remote_union, &x.remote));
    let ucolor = if col >= 0 && !remote.is_empty() { color } else { -1 };
    match x.union.split(ucolor, key).map_err(|e| MpiErr::from(e).on(c))? {
        None => Ok(MPI_COMM_NULL),
        Some(u) => finish(&mc.comm, u, local, remote, mc.errhandler.load(Ordering::Relaxed)),
    }
}

/// MPI_Comm_create of an intercommunicator: `group` (the same on every member of a local
/// group) names the local ranks that take part; the new intercommunicator joins the members of
/// each side's group, and whoever is in neither, or faces an empty group, gets MPI_COMM_NULL.
/// A split with color 0 for the group's members, keyed by their place in it. Collective over
/// both groups.
pub fn create(mc: &MpiComm, group: &[u32]) -> Result<MPI_Comm, MpiErr> {
    let x = of(mc)?;
    if let Some(w) = group.iter().find(|w| !x.local.contains(w)) {
        return Err(MpiErr::new(MPI_ERR_GROUP, format!("world rank {w} of the group is not in the intercommunicator's local group")).on(mc.handle));
    }
    let me = x.local[mc.rank()];
    match group.iter().position(|&w| w == me) {
        Some(place) => split(mc, 0, place as c_int),
        None => split(mc, MPI_UNDEFINED, 0),
    }
}

pub unsafe fn comm_test_inter(c: MPI_Comm, flag: *mut c_int) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    *out(flag, "flag").map_err(|e| e.on(c))? = mc.inter.get().is_some() as c_int;
    Ok(())
}

pub unsafe fn comm_remote_size(c: MPI_Comm, size: *mut c_int) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    let x = of(&mc)?;
    *out(size, "size").map_err(|e| e.on(c))? = x.remote.len() as c_int;
    Ok(())
}

pub unsafe fn comm_remote_group(c: MPI_Comm, g: *mut MPI_Group) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    let x = of(&mc)?;
    *out(g, "group").map_err(|e| e.on(c))? = crate::group::add(x.remote.clone());
    Ok(())
}

/// MPI_Comm_compare of two intercommunicators: by both groups.
pub fn compare(a: &MpiComm, b: &MpiComm) -> c_int {
    let (Some(x), Some(y)) = (a.inter.get(), b.inter.get()) else { return MPI_UNEQUAL };
    if x.local == y.local && x.remote == y.remote {
        return MPI_CONGRUENT;
    }
    let sorted = |v: &[u32]| {
        let mut s = v.to_vec();
        s.sort_unstable();
        s
    };
    if sorted(&x.local) == sorted(&y.local) && sorted(&x.remote) == sorted(&y.remote) {
        MPI_SIMILAR
    } else {
        MPI_UNEQUAL
    }
}

// The collectives on an intercommunicator (colls.rs hands them over): see intercoll.rs.
pub use crate::intercoll::*;
