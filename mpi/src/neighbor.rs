//! Neighbourhood collectives (MPI_Neighbor_allgather(v), MPI_Neighbor_alltoall(v/w) and their
//! `_c` forms) on Cartesian and graph communicators: a receive from every in-neighbour and a
//! send to every out-neighbour, over the topology's own comm (see `topo.rs`), tagged so that
//! two edges between the same ranks keep their blocks apart. MPI_PROC_NULL neighbours (the
//! edges of a non-periodic grid) leave their receive blocks alone.

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

pub unsafe fn neighbor_allgather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, comm: MPI_Comm) -> Res {
    allgather(sendbuf, sendcount as i64, sendtype, recvbuf, recvcount as i64, recvtype, comm)
}
pub unsafe fn neighbor_allgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm) -> Res {
    allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn neighbor_allgatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm) -> Res {
    allgatherv(sendbuf, sendcount as i64, sendtype, recvbuf, recvcounts, displs, recvtype, comm)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn neighbor_allgatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype, comm: MPI_Comm) -> Res {
    allgatherv(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype, comm)
}
pub unsafe fn neighbor_alltoall(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, comm: MPI_Comm) -> Res {
    alltoall(sendbuf, sendcount as i64, sendtype, recvbuf, recvcount as i64, recvtype, comm)
}
pub unsafe fn neighbor_alltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, comm: MPI_Comm) -> Res {
    alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn neighbor_alltoallv(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm) -> Res {
    alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn neighbor_alltoallv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtype: MPI_Datatype, comm: MPI_Comm) -> Res {
    alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn neighbor_alltoallw(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype, comm: MPI_Comm) -> Res {
    alltoallw(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts, rdispls, recvtypes, comm)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn neighbor_alltoallw_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype, comm: MPI_Comm) -> Res {
    alltoallw(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts, rdispls, recvtypes, comm)
}
