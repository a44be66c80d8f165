//! Collectives on an intercommunicator (colls.rs and colltypes.rs hand them over): the barrier
//! over both groups, and the rest as point-to-point between the groups on the union comm
//! (see inter.rs). The non-blocking forms run these as tasks (colls.rs, task.rs).

use crate::abi_gen::*;
use crate::colls::{aints, counts};
use crate::err::{MpiErr, Res};
use crate::inter::of;
use crate::state::MpiComm;
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use std::ffi::{c_int, c_void};

/// User tags of the inter collectives' messages on `union` (nothing else sends there).
const TAG_BCAST: u32 = 1;

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

/// MPI_Reduce_scatter_block: the fold of the other group's vectors (`rcount` elements for each
/// rank of this group), block `rank` here. The whole fold is made on every rank (an allreduce
/// into a buffer of ours), then this rank's block is copied out.
pub fn reduce_scatter_block(mc: &MpiComm, sbuf: *const c_void, rbuf: *mut c_void, rcount: i64, dt: MPI_Datatype, o: MPI_Op) -> Res {
    let local = of(mc)?.local.len();
    reduce_scatter_counts(mc, sbuf, rbuf, &vec![rcount; local], dt, o)
}

/// MPI_Reduce_scatter: as `reduce_scatter_block`, with a count for each rank of this group.
pub fn reduce_scatter<T: Copy + Into<i64>>(mc: &MpiComm, sbuf: *const c_void, rbuf: *mut c_void, rcounts: *const T, dt: MPI_Datatype, o: MPI_Op) -> Res {
    let local = of(mc)?.local.len();
    let rc = counts(rcounts, local, "recvcounts").map_err(|e| e.on(mc.handle))?;
    reduce_scatter_counts(mc, sbuf, rbuf, &rc, dt, o)
}

fn reduce_scatter_counts(mc: &MpiComm, sbuf: *const c_void, rbuf: *mut c_void, rcounts: &[i64], dt: MPI_Datatype, o: MPI_Op) -> Res {
    let on = |e: MpiErr| e.on(mc.handle);
    let d = crate::datatype::get(dt).map_err(on)?;
    let total: i64 = rcounts.iter().sum();
    let before: i64 = rcounts[..mc.rank()].iter().sum();
    let (skip, mine) = (d.bytes(before).map_err(on)?, d.bytes(rcounts[mc.rank()]).map_err(on)?);
    let mut all = vec![0u8; d.bytes(total).map_err(on)?];
    allreduce(mc, sbuf, all.as_mut_ptr() as *mut c_void, total, dt, o)?;
    if mine > 0 {
        // SAFETY: the caller's receive buffer holds its `rcounts[rank]` elements (`mine` bytes).
        unsafe { std::ptr::copy_nonoverlapping(all.as_ptr().add(skip), rbuf as *mut u8, mine) };
    }
    Ok(())
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
