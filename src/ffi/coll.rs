//! Collective exports: each call's arguments are checked and converted into `CollArgs`, then run
//! on the calling thread (blocking form) or the comm's worker (the `dc_i*` form).

use super::boundary::guard;
use super::checks::{self, on_rank};
use super::types::{dc_dtype, dc_op, dc_status};
use crate::collective::CollArgs;
use crate::comm::Comm;
use crate::error::{Error, Result, Status};
use crate::request::Request;
use libc::c_void;

unsafe fn blocking(comm: *mut Comm, build: impl FnOnce(&Comm) -> Result<CollArgs>) -> Result<()> {
    let c = checks::comm(comm)?;
    on_rank(c, || c.collective(build(c)?))
}

unsafe fn nonblocking(comm: *mut Comm, req: *mut *mut Request, build: impl FnOnce(&Comm) -> Result<CollArgs>) -> Result<()> {
    let c = checks::comm_arc(comm)?;
    on_rank(&c, || {
        let out = checks::out(req, "req")?;
        let r = c.start_collective(build(&c)?)?;
        *out = r.into_raw();
        Ok(())
    })
}

fn total(block: usize, n: usize, what: &str) -> Result<usize> {
    block.checked_mul(n).filter(|&b| b <= isize::MAX as usize).ok_or_else(|| Error::new(Status::InvalidArgument, format!("{what}: size*count overflows")))
}

unsafe fn allreduce_args(sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, dt: dc_dtype, op: dc_op) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let op = checks::op(op, dt)?;
    let n = checks::bytes(count, dt, "count")?;
    let recv = checks::dst_buf(recvbuf, n, "recvbuf")?;
    let send = if sendbuf == recvbuf as *const c_void { None } else { Some(checks::src_buf(sendbuf, n, "sendbuf")?) };
    Ok(CollArgs::Allreduce { send, recv, dt, op })
}

unsafe fn broadcast_args(c: &Comm, buf: *mut c_void, count: usize, dt: dc_dtype, root: i32) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let root = checks::rank_in(root, c.size(), "root")?;
    let buf = checks::dst_buf(buf, checks::bytes(count, dt, "count")?, "buf")?;
    Ok(CollArgs::Broadcast { buf, dt, root })
}

unsafe fn reduce_args(c: &Comm, sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, dt: dc_dtype, op: dc_op, root: i32) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let op = checks::op(op, dt)?;
    let root = checks::rank_in(root, c.size(), "root")?;
    let n = checks::bytes(count, dt, "count")?;
    if c.rank() != root {
        let send = checks::src_buf(sendbuf, n, "sendbuf")?;
        return Ok(CollArgs::Reduce { send: Some(send), recv: None, bytes: n, dt, op, root });
    }
    let recv = checks::dst_buf(recvbuf, n, "recvbuf")?;
    let send = if sendbuf == recvbuf as *const c_void { None } else { Some(checks::src_buf(sendbuf, n, "sendbuf")?) };
    Ok(CollArgs::Reduce { send, recv: Some(recv), bytes: n, dt, op, root })
}

unsafe fn allgather_args(c: &Comm, sendbuf: *const c_void, recvbuf: *mut c_void, sendcount: usize, dt: dc_dtype) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let block = checks::bytes(sendcount, dt, "sendcount")?;
    let recv = checks::dst_buf(recvbuf, total(block, c.size(), "sendcount")?, "recvbuf")?;
    let in_place = !recvbuf.is_null() && sendbuf as usize == recvbuf as usize + c.rank() * block;
    let send = if in_place { None } else { Some(checks::src_buf(sendbuf, block, "sendbuf")?) };
    Ok(CollArgs::Allgather { send, recv, dt })
}

#[allow(clippy::too_many_arguments)]
unsafe fn allgatherv_args(
    c: &Comm,
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    dt: dc_dtype,
) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let counts = checks::array(recvcounts, c.size(), "recvcounts")?;
    let displs = checks::array(displs, c.size(), "displs")?;
    if counts[c.rank()] != sendcount {
        return Err(Error::new(Status::InvalidArgument, format!("sendcount {sendcount} differs from recvcounts[{}] = {}", c.rank(), counts[c.rank()])));
    }
    let (counts_b, displs_b, len) = checks::layout(counts, displs, dt, "recvcounts/displs")?;
    let recv = checks::dst_buf(recvbuf, len, "recvbuf")?;
    let in_place = !recvbuf.is_null() && sendbuf as usize == recvbuf as usize + displs_b[c.rank()];
    let send = if in_place { None } else { Some(checks::src_buf(sendbuf, counts_b[c.rank()], "sendbuf")?) };
    Ok(CollArgs::Allgatherv { send, recv, counts: counts_b, displs: displs_b, dt })
}

unsafe fn gather_args(c: &Comm, sendbuf: *const c_void, recvbuf: *mut c_void, sendcount: usize, dt: dc_dtype, root: i32) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let root = checks::rank_in(root, c.size(), "root")?;
    let block = checks::bytes(sendcount, dt, "sendcount")?;
    let send = checks::src_buf(sendbuf, block, "sendbuf")?;
    let recv = if c.rank() == root {
        Some(checks::dst_buf(recvbuf, total(block, c.size(), "sendcount")?, "recvbuf")?)
    } else {
        None
    };
    Ok(CollArgs::Gather { send, recv, dt, root })
}

unsafe fn scatter_args(c: &Comm, sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: usize, dt: dc_dtype, root: i32) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let root = checks::rank_in(root, c.size(), "root")?;
    let block = checks::bytes(recvcount, dt, "recvcount")?;
    let recv = checks::dst_buf(recvbuf, block, "recvbuf")?;
    let send = if c.rank() == root {
        Some(checks::src_buf(sendbuf, total(block, c.size(), "recvcount")?, "sendbuf")?)
    } else {
        None
    };
    Ok(CollArgs::Scatter { send, recv, dt, root })
}

unsafe fn reduce_scatter_args(c: &Comm, sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: usize, dt: dc_dtype, op: dc_op) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let op = checks::op(op, dt)?;
    let block = checks::bytes(recvcount, dt, "recvcount")?;
    let whole = total(block, c.size(), "recvcount")?;
    let in_place = !sendbuf.is_null() && recvbuf as usize == sendbuf as usize + c.rank() * block;
    if in_place {
        let all = checks::dst_buf(sendbuf as *mut c_void, whole, "sendbuf")?;
        return Ok(CollArgs::ReduceScatter { send: None, recv: all, dt, op });
    }
    let send = checks::src_buf(sendbuf, whole, "sendbuf")?;
    let recv = checks::dst_buf(recvbuf, block, "recvbuf")?;
    Ok(CollArgs::ReduceScatter { send: Some(send), recv, dt, op })
}

unsafe fn alltoall_args(c: &Comm, sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, dt: dc_dtype) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let whole = total(checks::bytes(count, dt, "count")?, c.size(), "count")?;
    let send = checks::src_buf(sendbuf, whole, "sendbuf")?;
    let recv = checks::dst_buf(recvbuf, whole, "recvbuf")?;
    Ok(CollArgs::Alltoall { send, recv, dt })
}

#[allow(clippy::too_many_arguments)]
unsafe fn alltoallv_args(
    c: &Comm,
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    dt: dc_dtype,
) -> Result<CollArgs> {
    let dt = checks::dtype(dt)?;
    let n = c.size();
    let (scounts, sdispls, slen) =
        checks::layout(checks::array(sendcounts, n, "sendcounts")?, checks::array(sdispls, n, "sdispls")?, dt, "sendcounts/sdispls")?;
    let (rcounts, rdispls, rlen) =
        checks::layout(checks::array(recvcounts, n, "recvcounts")?, checks::array(rdispls, n, "rdispls")?, dt, "recvcounts/rdispls")?;
    let send = checks::src_buf(sendbuf, slen, "sendbuf")?;
    let recv = checks::dst_buf(recvbuf, rlen, "recvbuf")?;
    Ok(CollArgs::Alltoallv { send, scounts, sdispls, recv, rcounts, rdispls, dt })
}

/// Reduces `count` elements across all ranks with `op`; every rank gets the same bytes in
/// `recvbuf`. `sendbuf == recvbuf` is in place. float16/bfloat16 reduce in float32 and round
/// once; DC_AVG on integers truncates toward zero. Blocking (up to the comm's timeout).
/// Every collective takes CUDA device memory on an NCCL comm (all of a call's buffers on the
/// device, or all on the host: a mix is DC_ERR_INVALID_ARGUMENT; every rank must pass the same
/// kind). On the device, results follow NCCL's arithmetic (DC_AVG is ncclAvg) and the bitwise
/// ops DC_BAND/DC_BOR/DC_BXOR are DC_ERR_UNAVAILABLE (NCCL has none).
/// Statuses: DC_ERR_INVALID_ARGUMENT (NULL, bad dtype/op, bitwise op on floats, overlapping
/// buffers), DC_ERR_MISMATCH, DC_ERR_TIMEOUT, DC_ERR_PEER_LOST, DC_ERR_ABORTED, DC_ERR_UNAVAILABLE.
#[no_mangle]
pub unsafe extern "C" fn dc_allreduce(sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, dt: dc_dtype, op: dc_op, comm: *mut Comm) -> dc_status {
    guard("dc_allreduce", || blocking(comm, |_| allreduce_args(sendbuf, recvbuf, count, dt, op)))
}

/// Non-blocking dc_allreduce: returns at once with `*req`; buffers stay in use until it completes.
/// On device memory the operation is queued on the comm's stream and the request completes with it.
#[no_mangle]
pub unsafe extern "C" fn dc_iallreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dt: dc_dtype,
    op: dc_op,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_iallreduce", || nonblocking(comm, req, |_| allreduce_args(sendbuf, recvbuf, count, dt, op)))
}

/// Copies `count` elements from `root`'s `buf` into every rank's `buf`. Blocking.
/// Statuses: DC_ERR_INVALID_ARGUMENT, DC_ERR_MISMATCH, DC_ERR_TIMEOUT, DC_ERR_PEER_LOST, DC_ERR_ABORTED.
#[no_mangle]
pub unsafe extern "C" fn dc_broadcast(buf: *mut c_void, count: usize, dt: dc_dtype, root: i32, comm: *mut Comm) -> dc_status {
    guard("dc_broadcast", || blocking(comm, |c| broadcast_args(c, buf, count, dt, root)))
}

/// Non-blocking dc_broadcast.
#[no_mangle]
pub unsafe extern "C" fn dc_ibroadcast(buf: *mut c_void, count: usize, dt: dc_dtype, root: i32, comm: *mut Comm, req: *mut *mut Request) -> dc_status {
    guard("dc_ibroadcast", || nonblocking(comm, req, |c| broadcast_args(c, buf, count, dt, root)))
}

/// Reduces `count` elements with `op` into `root`'s `recvbuf` (NULL allowed elsewhere).
/// At root, `sendbuf == recvbuf` is in place. Blocking. Statuses as dc_allreduce.
#[no_mangle]
pub unsafe extern "C" fn dc_reduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dt: dc_dtype,
    op: dc_op,
    root: i32,
    comm: *mut Comm,
) -> dc_status {
    guard("dc_reduce", || blocking(comm, |c| reduce_args(c, sendbuf, recvbuf, count, dt, op, root)))
}

/// Non-blocking dc_reduce.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dc_ireduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dt: dc_dtype,
    op: dc_op,
    root: i32,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_ireduce", || nonblocking(comm, req, |c| reduce_args(c, sendbuf, recvbuf, count, dt, op, root)))
}

/// Gathers `sendcount` elements from every rank into every rank's `recvbuf` (size*sendcount,
/// block r from rank r). In place when `sendbuf == recvbuf + rank*sendcount`. Blocking.
/// Statuses: DC_ERR_INVALID_ARGUMENT, DC_ERR_MISMATCH, DC_ERR_TIMEOUT, DC_ERR_PEER_LOST, DC_ERR_ABORTED.
#[no_mangle]
pub unsafe extern "C" fn dc_allgather(sendbuf: *const c_void, recvbuf: *mut c_void, sendcount: usize, dt: dc_dtype, comm: *mut Comm) -> dc_status {
    guard("dc_allgather", || blocking(comm, |c| allgather_args(c, sendbuf, recvbuf, sendcount, dt)))
}

/// Non-blocking dc_allgather.
#[no_mangle]
pub unsafe extern "C" fn dc_iallgather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dt: dc_dtype,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_iallgather", || nonblocking(comm, req, |c| allgather_args(c, sendbuf, recvbuf, sendcount, dt)))
}

/// Like dc_allgather with per-rank counts: rank r's `recvcounts[r]` elements land at
/// `recvbuf + displs[r]` (elements; arrays of comm size; blocks may not overlap).
/// `sendcount` must equal `recvcounts[rank]`. In place when `sendbuf == recvbuf + displs[rank]`.
/// Blocking. Statuses as dc_allgather.
#[no_mangle]
pub unsafe extern "C" fn dc_allgatherv(
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    dt: dc_dtype,
    comm: *mut Comm,
) -> dc_status {
    guard("dc_allgatherv", || blocking(comm, |c| allgatherv_args(c, sendbuf, sendcount, recvbuf, recvcounts, displs, dt)))
}

/// Non-blocking dc_allgatherv; the count and displacement arrays are copied at the call.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dc_iallgatherv(
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    dt: dc_dtype,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_iallgatherv", || nonblocking(comm, req, |c| allgatherv_args(c, sendbuf, sendcount, recvbuf, recvcounts, displs, dt)))
}

/// Gathers `sendcount` elements from every rank into `root`'s `recvbuf` (size*sendcount;
/// NULL allowed elsewhere). Send and receive buffers may not overlap. Blocking.
/// Statuses as dc_allgather.
#[no_mangle]
pub unsafe extern "C" fn dc_gather(sendbuf: *const c_void, recvbuf: *mut c_void, sendcount: usize, dt: dc_dtype, root: i32, comm: *mut Comm) -> dc_status {
    guard("dc_gather", || blocking(comm, |c| gather_args(c, sendbuf, recvbuf, sendcount, dt, root)))
}

/// Non-blocking dc_gather.
#[no_mangle]
pub unsafe extern "C" fn dc_igather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    dt: dc_dtype,
    root: i32,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_igather", || nonblocking(comm, req, |c| gather_args(c, sendbuf, recvbuf, sendcount, dt, root)))
}

/// Sends block r (`recvcount` elements) of `root`'s `sendbuf` (size*recvcount; NULL allowed
/// elsewhere) to rank r's `recvbuf`. Blocking. Statuses as dc_allgather.
#[no_mangle]
pub unsafe extern "C" fn dc_scatter(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: usize, dt: dc_dtype, root: i32, comm: *mut Comm) -> dc_status {
    guard("dc_scatter", || blocking(comm, |c| scatter_args(c, sendbuf, recvbuf, recvcount, dt, root)))
}

/// Non-blocking dc_scatter.
#[no_mangle]
pub unsafe extern "C" fn dc_iscatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dt: dc_dtype,
    root: i32,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_iscatter", || nonblocking(comm, req, |c| scatter_args(c, sendbuf, recvbuf, recvcount, dt, root)))
}

/// Reduces `sendbuf` (size*recvcount elements) across ranks with `op`; rank r gets block r in
/// `recvbuf`. In place when `recvbuf == sendbuf + rank*recvcount`. Blocking.
/// Statuses as dc_allreduce.
#[no_mangle]
pub unsafe extern "C" fn dc_reduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dt: dc_dtype,
    op: dc_op,
    comm: *mut Comm,
) -> dc_status {
    guard("dc_reduce_scatter", || blocking(comm, |c| reduce_scatter_args(c, sendbuf, recvbuf, recvcount, dt, op)))
}

/// Non-blocking dc_reduce_scatter.
#[no_mangle]
pub unsafe extern "C" fn dc_ireduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    dt: dc_dtype,
    op: dc_op,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_ireduce_scatter", || nonblocking(comm, req, |c| reduce_scatter_args(c, sendbuf, recvbuf, recvcount, dt, op)))
}

/// Block j (`count` elements) of `sendbuf` goes to rank j; block i of `recvbuf` comes from
/// rank i (both size*count). Buffers may not overlap. Blocking. Statuses as dc_allgather.
#[no_mangle]
pub unsafe extern "C" fn dc_alltoall(sendbuf: *const c_void, recvbuf: *mut c_void, count: usize, dt: dc_dtype, comm: *mut Comm) -> dc_status {
    guard("dc_alltoall", || blocking(comm, |c| alltoall_args(c, sendbuf, recvbuf, count, dt)))
}

/// Non-blocking dc_alltoall.
#[no_mangle]
pub unsafe extern "C" fn dc_ialltoall(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: usize,
    dt: dc_dtype,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_ialltoall", || nonblocking(comm, req, |c| alltoall_args(c, sendbuf, recvbuf, count, dt)))
}

/// Like dc_alltoall with per-rank counts and displacements (elements, arrays of comm size):
/// `sendcounts[j]` elements at `sendbuf + sdispls[j]` go to rank j, whose block lands at its
/// `recvbuf + rdispls[i]`. Blocking. Statuses as dc_allgather.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dc_alltoallv(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    dt: dc_dtype,
    comm: *mut Comm,
) -> dc_status {
    guard("dc_alltoallv", || blocking(comm, |c| alltoallv_args(c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dt)))
}

/// Non-blocking dc_alltoallv; the count and displacement arrays are copied at the call.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dc_ialltoallv(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    dt: dc_dtype,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_ialltoallv", || nonblocking(comm, req, |c| alltoallv_args(c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, dt)))
}

/// Returns when every rank has entered the barrier. Blocking (up to the comm's timeout).
/// On an NCCL comm it is a one-word device allreduce on the comm's stream, so it also returns
/// only after the device operations queued before it on that stream (on every rank) are done.
/// Statuses: DC_ERR_INVALID_ARGUMENT, DC_ERR_MISMATCH, DC_ERR_TIMEOUT, DC_ERR_PEER_LOST, DC_ERR_ABORTED.
#[no_mangle]
pub unsafe extern "C" fn dc_barrier(comm: *mut Comm) -> dc_status {
    guard("dc_barrier", || blocking(comm, |_| Ok(CollArgs::Barrier)))
}

/// Non-blocking dc_barrier.
#[no_mangle]
pub unsafe extern "C" fn dc_ibarrier(comm: *mut Comm, req: *mut *mut Request) -> dc_status {
    guard("dc_ibarrier", || nonblocking(comm, req, |_| Ok(CollArgs::Barrier)))
}
