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
use crate::err::{MpiErr, Res};
use crate::state::{self, MpiComm};
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use std::ffi::{c_int, c_void};
use std::hash::{BuildHasher, Hash, Hasher};
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

/// User tags of the inter collectives' messages on `union` (nothing else sends there).
const TAG_BCAST: u32 = 1;

fn mix(parts: &[u64]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
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

/// The communicator behind `c` if it is an intercommunicator (collectives take this path).
pub fn lookup(c: MPI_Comm) -> Option<Arc<MpiComm>> {
    state::get_comm(c).ok().filter(|mc| mc.inter.get().is_some())
}

pub fn of(mc: &MpiComm) -> Result<&Inter, MpiErr> {
    mc.inter.get().ok_or_else(|| MpiErr::new(MPI_ERR_COMM, "not an intercommunicator").on(mc.handle))
}

fn intra(c: MPI_Comm) -> Result<Arc<MpiComm>, MpiErr> {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    if mc.inter.get().is_some() {
        return Err(MpiErr::new(MPI_ERR_COMM, "an intracommunicator is needed here, not an intercommunicator").on(c));
    }
    Ok(mc)
}

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn from_u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
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
    sendrecv(&u64s(mine), &mut theirs)?;
    Ok(from_u64s(&theirs))
}

/// Every union member's `mine` (the same length on each), by union rank.
fn allgather_u64s(x: &Inter, mine: &[u64]) -> Result<Vec<u64>, MpiErr> {
    let mut all = vec![0u8; 8 * mine.len() * x.union.size()];
    let send = u64s(mine);
    x.union
        .collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut all), dt: distcomm::DType::Uint64 })
        .map_err(MpiErr::from)?;
    Ok(from_u64s(&all))
}

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
    let mut h = u64s(&hdr);
    bcast_bytes(&lc.comm, &mut h, leader).map_err(|e| e.on(local_comm))?;
    let hdr = from_u64s(&h);
    if hdr[0] == 0 {
        return Err(failed.unwrap_or_else(|| MpiErr::new(MPI_ERR_OTHER, format!("the local leader (rank {leader}) could not reach the remote leader")).on(local_comm)));
    }
    let mut r = u64s(&remote);
    r.resize(8 * hdr[3] as usize, 0);
    bcast_bytes(&lc.comm, &mut r, leader).map_err(|e| e.on(local_comm))?;
    let remote: Vec<u32> = from_u64s(&r).into_iter().map(|w| w as u32).collect();
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

/// How many intercommunicators were made from these groups and tag: the n of the next one
/// (every member makes them in the same order).
static FROM_GROUPS: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

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
    let key = mix(&[mix(&members.iter().map(|&w| w as u64).collect::<Vec<_>>()), {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        tag.hash(&mut h);
        h.finish()
    }]);
    let n = {
        let mut g = FROM_GROUPS.lock().unwrap_or_else(|p| p.into_inner());
        match g.iter_mut().find(|e| e.0 == key) {
            Some(e) => {
                e.1 += 1;
                e.1 - 1
            }
            None => {
                g.push((key, 1));
                0
            }
        }
    };
    let union = world.comm.new_from_parts(mix(&[key, 0xfe, n]), rank, members, true).map_err(MpiErr::from)?;
    *o = finish(&world.comm, union, local, remote, errh)?;
    Ok(())
}

/// MPI_Comm_dup of an intercommunicator: a new union (collective over both groups).
pub fn dup(mc: &MpiComm) -> Result<MPI_Comm, MpiErr> {
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
    // Every member's `high`: the group that passed true goes second; if both passed the same,
    // the group of union rank 0 goes first. Each group keeps its ranks' order.
    let highs = allgather_u64s(x, &[(high != 0) as u64]).map_err(|e| e.on(c))?;
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
    let all = allgather_u64s(x, &[col as u64, key as i64 as u64]).map_err(|e| e.on(c))?;
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

// ---- collectives on an intercommunicator ------------------------------------------------------

/// Every member of both groups enters before any leaves.
pub fn barrier(mc: &MpiComm) -> Res {
    let x = of(mc)?;
    x.union.collective(CollArgs::Barrier).map_err(|e| MpiErr::from(e).on(mc.handle))
}

/// MPI_Bcast on an intercommunicator: the root passes MPI_ROOT, the rest of its group
/// MPI_PROC_NULL, the other group the root's rank; the root sends to each of them.
pub fn bcast(mc: &MpiComm, buf: *mut c_void, count: i64, dt: MPI_Datatype, root: c_int) -> Res {
    let x = of(mc)?;
    let c = mc.handle;
    let on = |e: MpiErr| e.on(c);
    match root {
        MPI_PROC_NULL => Ok(()),
        MPI_ROOT => {
            let o = crate::packing::outgoing(buf, count, dt).map_err(on)?;
            // SAFETY: the bytes (the caller's buffer, or our packed copy) stay until the sends end.
            let b = unsafe { ConstBuf::new(o.ptr, o.len) };
            let ops: Vec<_> = (0..x.remote.len())
                .map(|r| x.union.post_send(b, x.remote_union[r], TAG_BCAST))
                .collect::<Result<_, _>>()
                .map_err(|e| MpiErr::from(e).on(c))?;
            for op in ops {
                x.union.wait_p2p_started(&op, &|| "MPI_Bcast on an intercommunicator (root's send)".into()).map_err(|e| MpiErr::from(e).on(c))?;
            }
            drop(o);
            Ok(())
        }
        r if r >= 0 && (r as usize) < x.remote.len() => {
            let i = crate::packing::incoming(buf, count, dt).map_err(on)?;
            // SAFETY: the bytes stay until the receive completes (below).
            let b = unsafe { MutBuf::new(i.ptr, i.len) };
            let op = x.union.post_recv(b, Some(x.remote_union[r as usize]), Some(TAG_BCAST)).map_err(|e| MpiErr::from(e).on(c))?;
            let d = x.union.wait_p2p_started(&op, &|| "MPI_Bcast on an intercommunicator".into()).map_err(|e| MpiErr::from(e).on(c))?;
            if d.bytes != i.len {
                return Err(MpiErr::new(MPI_ERR_TRUNCATE, format!("the root sent {} bytes, the receive expects {}", d.bytes, i.len)).on(c));
            }
            if let Some((tmp, u)) = i.tmp {
                u.run(&tmp);
            }
            Ok(())
        }
        r => Err(MpiErr::new(MPI_ERR_ROOT, format!("root {r} is not MPI_ROOT, MPI_PROC_NULL or a rank of the remote group (size {})", x.remote.len())).on(c)),
    }
}

/// The answer of an inter collective not implemented here.
pub fn unsupported(mc: &MpiComm) -> MpiErr {
    MpiErr::new(MPI_ERR_UNSUPPORTED_OPERATION, "this collective is not supported on an intercommunicator (MPI_Barrier and MPI_Bcast are)").on(mc.handle)
}

// ---- gathers, scatters and all-to-all on an intercommunicator: point-to-point on the union ----
//
// Every block goes from its sender to its receiver in one message on `union`, with a tag per
// kind (messages of one pair and tag arrive in order, so calls in sequence do not mix).

const TAG_GATHER: u32 = 2;
const TAG_SCATTER: u32 = 3;
const TAG_ALLGATHER: u32 = 4;
const TAG_ALLTOALL: u32 = 5;

/// `count` elements of `dt` at `disp` elements past `buf`.
#[derive(Clone, Copy)]
struct Block {
    addr: usize,
    count: i64,
    dt: MPI_Datatype,
}

fn block(buf: *const c_void, disp: i64, count: i64, dt: MPI_Datatype) -> Result<Block, MpiErr> {
    let ext = crate::datatype::resolve(dt)?.map.extent();
    Ok(Block { addr: (buf as usize).wrapping_add((disp * ext) as usize), count, dt })
}

/// Posts every receive, then every send (remote ranks), and waits for all of them.
fn exchange_blocks(mc: &MpiComm, tag: u32, sends: &[(usize, Block)], recvs: &[(usize, Block)]) -> Res {
    let x = of(mc)?;
    let c = mc.handle;
    let eng = |e: distcomm::Error| MpiErr::from(e).on(c);
    let mut incoming = Vec::with_capacity(recvs.len());
    for &(r, b) in recvs {
        let i = crate::packing::incoming(b.addr as *mut c_void, b.count, b.dt).map_err(|e| e.on(c))?;
        // SAFETY: the caller's buffer (or our packed one) stays until the receive completes.
        let buf = unsafe { MutBuf::new(i.ptr, i.len) };
        let op = x.union.post_recv(buf, Some(x.remote_union[r]), Some(tag)).map_err(eng)?;
        incoming.push((op, i));
    }
    let mut outgoing = Vec::with_capacity(sends.len());
    for &(r, b) in sends {
        let o = crate::packing::outgoing(b.addr as *const c_void, b.count, b.dt).map_err(|e| e.on(c))?;
        // SAFETY: the bytes stay (in `outgoing`) until the send completes.
        let buf = unsafe { ConstBuf::new(o.ptr, o.len) };
        let op = x.union.post_send(buf, x.remote_union[r], tag).map_err(eng)?;
        outgoing.push((op, o));
    }
    let what = || "a collective on an intercommunicator".to_string();
    for (op, _o) in &outgoing {
        x.union.wait_p2p_started(op, &what).map_err(eng)?;
    }
    for (op, i) in incoming {
        let d = x.union.wait_p2p_started(&op, &what).map_err(|e| {
            if e.status == distcomm::Status::InvalidArgument {
                MpiErr::new(MPI_ERR_TRUNCATE, format!("message truncated: {}", e.msg)).on(c)
            } else {
                eng(e)
            }
        })?;
        if let Some((tmp, u)) = i.tmp {
            u.run(&tmp[..d.bytes.min(tmp.len())]);
        }
    }
    Ok(())
}

/// The counts (and displacements, if given) of a v-form's root, read for `n` remote ranks.
type RootCounts<'a> = &'a dyn Fn(usize) -> Result<(Vec<i64>, Option<Vec<i64>>), MpiErr>;

/// What a rooted inter collective does here: MPI_ROOT, MPI_PROC_NULL, or a remote root.
enum Role {
    Root,
    Nothing,
    Leaf(usize),
}

fn role(mc: &MpiComm, root: c_int) -> Result<Role, MpiErr> {
    let n = of(mc)?.remote.len();
    match root {
        MPI_ROOT => Ok(Role::Root),
        MPI_PROC_NULL => Ok(Role::Nothing),
        r if r >= 0 && (r as usize) < n => Ok(Role::Leaf(r as usize)),
        r => Err(MpiErr::new(MPI_ERR_ROOT, format!("root {r} is not MPI_ROOT, MPI_PROC_NULL or a rank of the remote group (size {n})")).on(mc.handle)),
    }
}

pub fn remote_n(mc: &MpiComm) -> Result<usize, MpiErr> {
    Ok(of(mc)?.remote.len())
}

/// One block per remote rank, at `disps` (or `r * count` without them).
fn per_remote(mc: &MpiComm, buf: *const c_void, counts: &[i64], disps: Option<&[i64]>, dt: MPI_Datatype) -> Result<Vec<(usize, Block)>, MpiErr> {
    (0..remote_n(mc)?)
        .map(|r| {
            let d = disps.map_or(r as i64 * counts[r], |d| d[r]);
            Ok((r, block(buf, d, counts[r], dt).map_err(|e| e.on(mc.handle))?))
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
pub fn gatherv_any(mc: &MpiComm, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: RootCounts, rdt: MPI_Datatype, root: c_int) -> Res {
    match role(mc, root)? {
        Role::Nothing => Ok(()),
        Role::Root => {
            let (cs, ds) = rcounts(remote_n(mc)?).map_err(|e| e.on(mc.handle))?;
            let recvs = per_remote(mc, rbuf, &cs, ds.as_deref(), rdt)?;
            exchange_blocks(mc, TAG_GATHER, &[], &recvs)
        }
        Role::Leaf(r) => exchange_blocks(mc, TAG_GATHER, &[(r, block(sbuf, 0, scount, sdt)?)], &[]),
    }
}

#[allow(clippy::too_many_arguments)]
pub fn scatterv_any(mc: &MpiComm, sbuf: *const c_void, scounts: RootCounts, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Res {
    match role(mc, root)? {
        Role::Nothing => Ok(()),
        Role::Root => {
            let (cs, ds) = scounts(remote_n(mc)?).map_err(|e| e.on(mc.handle))?;
            let sends = per_remote(mc, sbuf, &cs, ds.as_deref(), sdt)?;
            exchange_blocks(mc, TAG_SCATTER, &sends, &[])
        }
        Role::Leaf(r) => exchange_blocks(mc, TAG_SCATTER, &[], &[(r, block(rbuf, 0, rcount, rdt)?)]),
    }
}

/// Allgather(v): my block to every remote rank; each remote rank's block into its place.
#[allow(clippy::too_many_arguments)]
pub fn allgatherv_any(mc: &MpiComm, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: &[i64], displs: Option<&[i64]>, rdt: MPI_Datatype) -> Res {
    let n = remote_n(mc)?;
    let mine = block(sbuf, 0, scount, sdt).map_err(|e| e.on(mc.handle))?;
    let sends: Vec<_> = (0..n).map(|r| (r, mine)).collect();
    exchange_blocks(mc, TAG_ALLGATHER, &sends, &per_remote(mc, rbuf, rcounts, displs, rdt)?)
}

/// Alltoall(v): block r of the send buffer to remote rank r, its block into place r.
#[allow(clippy::too_many_arguments)]
pub fn alltoallv_any(mc: &MpiComm, sbuf: *const c_void, scounts: &[i64], sdispls: Option<&[i64]>, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: &[i64], rdispls: Option<&[i64]>, rdt: MPI_Datatype) -> Res {
    exchange_blocks(mc, TAG_ALLTOALL, &per_remote(mc, sbuf, scounts, sdispls, sdt)?, &per_remote(mc, rbuf, rcounts, rdispls, rdt)?)
}

// The entry points colls.rs hands an intercommunicator to (blocking forms; the non-blocking
// ones answer MPI_ERR_UNSUPPORTED_OPERATION there).

use crate::colls::{aints, counts};

#[allow(clippy::too_many_arguments)]
pub fn gather(mc: &MpiComm, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Res {
    gatherv_any(mc, sbuf, scount, sdt, rbuf, &|n| Ok((vec![rcount; n], None)), rdt, root)
}
#[allow(clippy::too_many_arguments)]
pub fn scatter(mc: &MpiComm, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype, root: c_int) -> Res {
    scatterv_any(mc, sbuf, &|n| Ok((vec![scount; n], None)), sdt, rbuf, rcount, rdt, root)
}
pub fn allgather(mc: &MpiComm, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Res {
    let n = remote_n(mc)?;
    allgatherv_any(mc, sbuf, scount, sdt, rbuf, &vec![rcount; n], None, rdt)
}
pub fn alltoall(mc: &MpiComm, sbuf: *const c_void, scount: i64, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: i64, rdt: MPI_Datatype) -> Res {
    let n = remote_n(mc)?;
    alltoallv_any(mc, sbuf, &vec![scount; n], None, sdt, rbuf, &vec![rcount; n], None, rdt)
}

macro_rules! v_forms {
    ($gv:ident, $sv:ident, $agv:ident, $atv:ident, $cnt:ty, $disp:ty, $read_d:ident) => {
        #[allow(clippy::too_many_arguments)]
        pub fn $gv(mc: &MpiComm, sbuf: *const c_void, scount: $cnt, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const $cnt, displs: *const $disp, rdt: MPI_Datatype, root: c_int) -> Res {
            gatherv_any(mc, sbuf, scount as i64, sdt, rbuf, &|n| Ok((counts(rcounts, n, "recvcounts")?, Some($read_d(displs, n, "displs")?))), rdt, root)
        }
        #[allow(clippy::too_many_arguments)]
        pub fn $sv(mc: &MpiComm, sbuf: *const c_void, scounts: *const $cnt, displs: *const $disp, sdt: MPI_Datatype, rbuf: *mut c_void, rcount: $cnt, rdt: MPI_Datatype, root: c_int) -> Res {
            scatterv_any(mc, sbuf, &|n| Ok((counts(scounts, n, "sendcounts")?, Some($read_d(displs, n, "displs")?))), sdt, rbuf, rcount as i64, rdt, root)
        }
        #[allow(clippy::too_many_arguments)]
        pub fn $agv(mc: &MpiComm, sbuf: *const c_void, scount: $cnt, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const $cnt, displs: *const $disp, rdt: MPI_Datatype) -> Res {
            let n = remote_n(mc)?;
            let on = |e: MpiErr| e.on(mc.handle);
            allgatherv_any(mc, sbuf, scount as i64, sdt, rbuf, &counts(rcounts, n, "recvcounts").map_err(on)?, Some(&$read_d(displs, n, "displs").map_err(on)?), rdt)
        }
        #[allow(clippy::too_many_arguments)]
        pub fn $atv(mc: &MpiComm, sbuf: *const c_void, scounts: *const $cnt, sdispls: *const $disp, sdt: MPI_Datatype, rbuf: *mut c_void, rcounts: *const $cnt, rdispls: *const $disp, rdt: MPI_Datatype) -> Res {
            let n = remote_n(mc)?;
            let on = |e: MpiErr| e.on(mc.handle);
            if crate::colls::in_place(sbuf) {
                return Err(MpiErr::new(MPI_ERR_ARG, "MPI_IN_PLACE is not allowed on an intercommunicator").on(mc.handle));
            }
            let (sc, sd) = (counts(scounts, n, "sendcounts").map_err(on)?, $read_d(sdispls, n, "sdispls").map_err(on)?);
            let (rc, rd) = (counts(rcounts, n, "recvcounts").map_err(on)?, $read_d(rdispls, n, "rdispls").map_err(on)?);
            alltoallv_any(mc, sbuf, &sc, Some(&sd), sdt, rbuf, &rc, Some(&rd), rdt)
        }
    };
}
v_forms!(gatherv, scatterv, allgatherv, alltoallv, c_int, c_int, counts);
v_forms!(gatherv_c, scatterv_c, allgatherv_c, alltoallv_c, MPI_Count, MPI_Aint, aints);

// ---- reductions on an intercommunicator: the other group's contributions, folded here in
// rank order (as colls.rs folds the reductions the engine lacks) -----------------------------

/// The fold of `dt` with `o`, and the bytes of `count` elements.
fn reduction(mc: &MpiComm, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Result<(crate::op::Local, usize), MpiErr> {
    let on = |e: MpiErr| e.on(mc.handle);
    let d = crate::datatype::get(dt).map_err(on)?;
    let n = d.bytes(count).map_err(on)?;
    let l = match crate::op::plan(o, &d).map_err(on)? {
        crate::op::Plan::Local(l) => l,
        crate::op::Plan::Engine(..) => crate::op::Local::Predef(o, d),
    };
    Ok((l, n))
}

fn bytes_at(p: *const c_void, n: usize) -> Block {
    Block { addr: p as usize, count: n as i64, dt: MPI_BYTE }
}

/// Receives one `n`-byte contribution from each remote rank (sending `mine` to each of
/// `to`) and folds them into `out`.
#[allow(clippy::too_many_arguments)]
fn fold_remote(mc: &MpiComm, tag: u32, l: &crate::op::Local, count: i64, n: usize, mine: Option<*const c_void>, to: &[usize], out: *mut c_void) -> Res {
    let rn = remote_n(mc)?;
    let mut all = vec![0u8; n * rn];
    let base = all.as_mut_ptr();
    let recvs: Vec<_> = (0..rn).map(|r| (r, bytes_at(base.wrapping_add(r * n) as *const c_void, n))).collect();
    let sends: Vec<_> = match mine {
        Some(p) => to.iter().map(|&r| (r, bytes_at(p, n))).collect(),
        None => Vec::new(),
    };
    exchange_blocks(mc, tag, &sends, &recvs)?;
    if n > 0 {
        // SAFETY: the caller's receive buffer holds `count` elements (`n` bytes).
        let out = unsafe { std::slice::from_raw_parts_mut(out as *mut u8, n) };
        crate::op::fold_ranks(l, count as usize, n, &all, out);
    }
    Ok(())
}

const TAG_REDUCE: u32 = 6;
const TAG_ALLREDUCE: u32 = 7;

/// MPI_Reduce: the root (MPI_ROOT) gets the fold of the other group's contributions.
pub fn reduce(mc: &MpiComm, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op, root: c_int) -> Res {
    // The arguments of a rank that passes MPI_PROC_NULL are not significant (mpi4py passes
    // MPI_BYTE there): nothing is checked.
    let role = role(mc, root)?;
    if let Role::Nothing = role {
        return Ok(());
    }
    let (l, n) = reduction(mc, count, dt, o)?;
    match role {
        Role::Nothing => Ok(()),
        Role::Root => fold_remote(mc, TAG_REDUCE, &l, count, n, None, &[], rbuf),
        Role::Leaf(r) => exchange_blocks(mc, TAG_REDUCE, &[(r, bytes_at(sbuf, n))], &[]),
    }
}

/// MPI_Allreduce: each group gets the fold of the other group's contributions.
pub fn allreduce(mc: &MpiComm, sbuf: *const c_void, rbuf: *mut c_void, count: i64, dt: MPI_Datatype, o: MPI_Op) -> Res {
    if crate::colls::in_place(sbuf) {
        return Err(MpiErr::new(MPI_ERR_ARG, "MPI_IN_PLACE is not allowed on an intercommunicator").on(mc.handle));
    }
    let (l, n) = reduction(mc, count, dt, o)?;
    let all: Vec<usize> = (0..remote_n(mc)?).collect();
    fold_remote(mc, TAG_ALLREDUCE, &l, count, n, Some(sbuf), &all, rbuf)
}

/// Scans are defined on intracommunicators only.
pub fn scan(mc: &MpiComm, _s: *const c_void, _r: *mut c_void, _n: i64, _d: MPI_Datatype, _o: MPI_Op) -> Res {
    Err(MpiErr::new(MPI_ERR_COMM, "MPI_Scan and MPI_Exscan take an intracommunicator").on(mc.handle))
}
pub use scan as exscan;

pub fn reduce_scatter_block(mc: &MpiComm, _s: *const c_void, _r: *mut c_void, _n: i64, _d: MPI_Datatype, _o: MPI_Op) -> Res {
    Err(unsupported(mc))
}

/// MPI_Alltoallw: block r (`counts[r]` of `types[r]` at byte displacement `displs[r]`) to and
/// from remote rank r.
pub fn alltoallw(mc: &MpiComm, sbuf: *const c_void, s: (&[i64], &[i64], &[MPI_Datatype]), rbuf: *mut c_void, r: (&[i64], &[i64], &[MPI_Datatype])) -> Res {
    if crate::colls::in_place(sbuf) {
        return Err(MpiErr::new(MPI_ERR_ARG, "MPI_IN_PLACE is not allowed on an intercommunicator").on(mc.handle));
    }
    let at = |buf: *const c_void, (c, d, t): (&[i64], &[i64], &[MPI_Datatype]), i: usize| Block { addr: (buf as usize).wrapping_add(d[i] as usize), count: c[i], dt: t[i] };
    let n = remote_n(mc)?;
    let sends: Vec<_> = (0..n).map(|i| (i, at(sbuf, s, i))).collect();
    let recvs: Vec<_> = (0..n).map(|i| (i, at(rbuf as *const c_void, r, i))).collect();
    exchange_blocks(mc, TAG_ALLTOALL, &sends, &recvs)
}
