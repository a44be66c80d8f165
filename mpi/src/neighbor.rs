//! Neighbourhood collectives (MPI_Neighbor_allgather(v), MPI_Neighbor_alltoall(v/w) and their
//! `_c` forms) on Cartesian and graph communicators: a receive from every in-neighbour and a
//! send to every out-neighbour, over the topology's own comm (see `topo.rs`), tagged so that
//! two edges between the same ranks keep their blocks apart. MPI_PROC_NULL neighbours (the
//! edges of a non-periodic grid) leave their receive blocks alone. The non-blocking forms run
//! the blocking ones as tasks (task.rs) on the topology's comm, in call order with each other;
//! the persistent ones (pcoll.rs) start those.

use crate::abi_gen::*;
use crate::api::{start_recv_on, start_send_on};
use crate::err::{MpiErr, Res};
use crate::topo::neighborhood;
use std::ffi::{c_int, c_void};

/// One block of a neighbourhood collective: where, how many elements, of which type.
struct Block {
    at: usize,
    count: i64,
    dt: MPI_Datatype,
}

/// Every argument is checked before anything is sent; then the receives are posted, the sends
/// started, and all waited for (within the communicator's timeout).
fn exchange(c: MPI_Comm, recv: &dyn Fn(usize) -> Result<Block, MpiErr>, send: &dyn Fn(usize) -> Result<Block, MpiErr>) -> Res {
    let (nbr, ins, outs) = neighborhood(c)?;
    let on = |e: MpiErr| e.on(c);
    let recvs: Vec<Block> = (0..ins.len()).map(recv).collect::<Result<_, _>>().map_err(on)?;
    let sends: Vec<Block> = (0..outs.len()).map(send).collect::<Result<_, _>>().map_err(on)?;
    for b in recvs.iter().chain(&sends) {
        crate::packing::checked_len(b.at as *const c_void, b.count, b.dt).map_err(on)?;
    }
    let mut started = Vec::with_capacity(ins.len() + outs.len());
    for (b, e) in recvs.iter().zip(&ins) {
        started.push(start_recv_on(&nbr, b.at as *mut c_void, b.count, b.dt, e.rank, e.tag, c)?);
    }
    for (b, e) in sends.iter().zip(&outs) {
        started.push(start_send_on(&nbr, b.at as *const c_void, b.count, b.dt, e.rank, e.tag, c)?);
    }
    let mut result = Ok(());
    for r in started {
        if let Err(e) = r.finish() {
            result = result.and(Err(e));
        }
    }
    result
}

/// Bytes one element of `dt` spans (blocks of a buffer are this far apart per element).
fn extent(dt: MPI_Datatype) -> Result<i64, MpiErr> {
    Ok(crate::datatype::get_any(dt)?.0.extent as i64)
}

/// The integer types of counts and displacements (int, MPI_Count, MPI_Aint).
trait Int: Copy {
    fn wide(self) -> i64;
}
impl Int for c_int {
    fn wide(self) -> i64 {
        self as i64
    }
}
impl Int for i64 {
    fn wide(self) -> i64 {
        self
    }
}
impl Int for isize {
    fn wide(self) -> i64 {
        self as i64
    }
}

/// Element `i` of the caller's array `p` (checked non-NULL when the neighbourhood has edges).
fn at<T: Int>(p: *const T, i: usize, what: &str) -> Result<i64, MpiErr> {
    if p.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: the caller's array has an entry per neighbour.
    Ok(unsafe { *p.add(i) }.wide())
}

fn offset(base: usize, elems: i64, ext: i64) -> usize {
    base.wrapping_add((elems * ext) as usize)
}

fn allgather(sbuf: *const c_void, sc: i64, st: MPI_Datatype, rbuf: *mut c_void, rc: i64, rt: MPI_Datatype, c: MPI_Comm) -> Res {
    let rext = extent(rt).map_err(|e| e.on(c))?;
    exchange(c, &|i| Ok(Block { at: offset(rbuf as usize, i as i64 * rc, rext), count: rc, dt: rt }), &|_| Ok(Block { at: sbuf as usize, count: sc, dt: st }))
}

#[allow(clippy::too_many_arguments)]
fn allgatherv<C: Int, D: Int>(sbuf: *const c_void, sc: i64, st: MPI_Datatype, rbuf: *mut c_void, rcs: *const C, displs: *const D, rt: MPI_Datatype, c: MPI_Comm) -> Res {
    let rext = extent(rt).map_err(|e| e.on(c))?;
    let recv = |i| Ok(Block { at: offset(rbuf as usize, at(displs, i, "displs")?, rext), count: at(rcs, i, "recvcounts")?, dt: rt });
    exchange(c, &recv, &|_| Ok(Block { at: sbuf as usize, count: sc, dt: st }))
}

fn alltoall(sbuf: *const c_void, sc: i64, st: MPI_Datatype, rbuf: *mut c_void, rc: i64, rt: MPI_Datatype, c: MPI_Comm) -> Res {
    let (sext, rext) = (extent(st).map_err(|e| e.on(c))?, extent(rt).map_err(|e| e.on(c))?);
    exchange(c, &|i| Ok(Block { at: offset(rbuf as usize, i as i64 * rc, rext), count: rc, dt: rt }), &|j| Ok(Block { at: offset(sbuf as usize, j as i64 * sc, sext), count: sc, dt: st }))
}

#[allow(clippy::too_many_arguments)]
fn alltoallv<C: Int, D: Int>(sbuf: *const c_void, scs: *const C, sd: *const D, st: MPI_Datatype, rbuf: *mut c_void, rcs: *const C, rd: *const D, rt: MPI_Datatype, c: MPI_Comm) -> Res {
    let (sext, rext) = (extent(st).map_err(|e| e.on(c))?, extent(rt).map_err(|e| e.on(c))?);
    let recv = |i| Ok(Block { at: offset(rbuf as usize, at(rd, i, "rdispls")?, rext), count: at(rcs, i, "recvcounts")?, dt: rt });
    let send = |j| Ok(Block { at: offset(sbuf as usize, at(sd, j, "sdispls")?, sext), count: at(scs, j, "sendcounts")?, dt: st });
    exchange(c, &recv, &send)
}

/// Displacements in bytes, a type per neighbour.
#[allow(clippy::too_many_arguments)]
fn alltoallw<C: Int>(sbuf: *const c_void, scs: *const C, sd: *const MPI_Aint, sts: *const MPI_Datatype, rbuf: *mut c_void, rcs: *const C, rd: *const MPI_Aint, rts: *const MPI_Datatype, c: MPI_Comm) -> Res {
    let ty = |p: *const MPI_Datatype, i: usize, what: &str| -> Result<MPI_Datatype, MpiErr> {
        if p.is_null() {
            return crate::mpi_err!(MPI_ERR_ARG, "{what} is NULL");
        }
        // SAFETY: the caller's array has an entry per neighbour.
        Ok(unsafe { *p.add(i) })
    };
    let recv = |i| Ok(Block { at: offset(rbuf as usize, at(rd, i, "rdispls")?, 1), count: at(rcs, i, "recvcounts")?, dt: ty(rts, i, "recvtypes")? });
    let send = |j| Ok(Block { at: offset(sbuf as usize, at(sd, j, "sdispls")?, 1), count: at(scs, j, "sendcounts")?, dt: ty(sts, j, "sendtypes")? });
    exchange(c, &recv, &send)
}

/// A blocking neighbourhood collective runs after the comm's non-blocking ones started before
/// it (their messages use the same tags).
fn now(c: MPI_Comm, f: impl FnOnce() -> Res) -> Res {
    neighborhood(c)?.0.comm.finish_queued();
    f()
}

/// A non-blocking one: `f` (the blocking form) as a task behind the comm's others, on the
/// topology's comm; its request in `*r`.
fn start(c: MPI_Comm, r: *mut MPI_Request, name: &str, f: impl FnOnce() -> Res + 'static) -> Res {
    let (nbr, _, _) = neighborhood(c)?;
    let mc = crate::state::get_comm(c)?;
    let r = crate::api::out(r, "request").map_err(|e| e.on(c))?;
    crate::task::start_with_caller_args(r, &mc, &nbr.comm, name, f)
}

/// `name(args.., comm)` and `iname(args.., comm, request)` of `inner(args.., comm)`.
macro_rules! neighbor_forms {
    ($($name:ident, $iname:ident => $inner:ident($($a:ident: $t:ty => $conv:expr),*);)*) => {$(
        #[allow(clippy::too_many_arguments)] // the standard's signature
        pub unsafe fn $name($($a: $t,)* comm: MPI_Comm) -> Res {
            now(comm, || $inner($($conv,)* comm))
        }
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $iname($($a: $t,)* comm: MPI_Comm, request: *mut MPI_Request) -> Res {
            start(comm, request, concat!("MPI_", stringify!($iname)), move || $inner($($conv,)* comm))
        }
    )*};
}

neighbor_forms! {
    neighbor_allgather, ineighbor_allgather => allgather(sendbuf: *const c_void => sendbuf, sendcount: c_int => sendcount as i64, sendtype: MPI_Datatype => sendtype, recvbuf: *mut c_void => recvbuf, recvcount: c_int => recvcount as i64, recvtype: MPI_Datatype => recvtype);
    neighbor_allgather_c, ineighbor_allgather_c => allgather(sendbuf: *const c_void => sendbuf, sendcount: MPI_Count => sendcount, sendtype: MPI_Datatype => sendtype, recvbuf: *mut c_void => recvbuf, recvcount: MPI_Count => recvcount, recvtype: MPI_Datatype => recvtype);
    neighbor_allgatherv, ineighbor_allgatherv => allgatherv(sendbuf: *const c_void => sendbuf, sendcount: c_int => sendcount as i64, sendtype: MPI_Datatype => sendtype, recvbuf: *mut c_void => recvbuf, recvcounts: *const c_int => recvcounts, displs: *const c_int => displs, recvtype: MPI_Datatype => recvtype);
    neighbor_allgatherv_c, ineighbor_allgatherv_c => allgatherv(sendbuf: *const c_void => sendbuf, sendcount: MPI_Count => sendcount, sendtype: MPI_Datatype => sendtype, recvbuf: *mut c_void => recvbuf, recvcounts: *const MPI_Count => recvcounts, displs: *const MPI_Aint => displs, recvtype: MPI_Datatype => recvtype);
    neighbor_alltoall, ineighbor_alltoall => alltoall(sendbuf: *const c_void => sendbuf, sendcount: c_int => sendcount as i64, sendtype: MPI_Datatype => sendtype, recvbuf: *mut c_void => recvbuf, recvcount: c_int => recvcount as i64, recvtype: MPI_Datatype => recvtype);
    neighbor_alltoall_c, ineighbor_alltoall_c => alltoall(sendbuf: *const c_void => sendbuf, sendcount: MPI_Count => sendcount, sendtype: MPI_Datatype => sendtype, recvbuf: *mut c_void => recvbuf, recvcount: MPI_Count => recvcount, recvtype: MPI_Datatype => recvtype);
    neighbor_alltoallv, ineighbor_alltoallv => alltoallv(sendbuf: *const c_void => sendbuf, sendcounts: *const c_int => sendcounts, sdispls: *const c_int => sdispls, sendtype: MPI_Datatype => sendtype, recvbuf: *mut c_void => recvbuf, recvcounts: *const c_int => recvcounts, rdispls: *const c_int => rdispls, recvtype: MPI_Datatype => recvtype);
    neighbor_alltoallv_c, ineighbor_alltoallv_c => alltoallv(sendbuf: *const c_void => sendbuf, sendcounts: *const MPI_Count => sendcounts, sdispls: *const MPI_Aint => sdispls, sendtype: MPI_Datatype => sendtype, recvbuf: *mut c_void => recvbuf, recvcounts: *const MPI_Count => recvcounts, rdispls: *const MPI_Aint => rdispls, recvtype: MPI_Datatype => recvtype);
    neighbor_alltoallw, ineighbor_alltoallw => alltoallw(sendbuf: *const c_void => sendbuf, sendcounts: *const c_int => sendcounts, sdispls: *const MPI_Aint => sdispls, sendtypes: *const MPI_Datatype => sendtypes, recvbuf: *mut c_void => recvbuf, recvcounts: *const c_int => recvcounts, rdispls: *const MPI_Aint => rdispls, recvtypes: *const MPI_Datatype => recvtypes);
    neighbor_alltoallw_c, ineighbor_alltoallw_c => alltoallw(sendbuf: *const c_void => sendbuf, sendcounts: *const MPI_Count => sendcounts, sdispls: *const MPI_Aint => sdispls, sendtypes: *const MPI_Datatype => sendtypes, recvbuf: *mut c_void => recvbuf, recvcounts: *const MPI_Count => recvcounts, rdispls: *const MPI_Aint => rdispls, recvtypes: *const MPI_Datatype => recvtypes);
}
