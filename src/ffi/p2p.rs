//! Point-to-point exports.

use super::boundary::guard;
use super::checks::{self, on_rank};
use super::types::{dc_dtype, dc_status, DC_ANY_SOURCE, DC_ANY_TAG};
use crate::comm::{Comm, Exchanged, P2pOp};
use crate::completion::Stamp;
use crate::error::{Error, Result, Status};
use crate::request::Request;
use std::sync::Arc;

/// Who sent a received message, with which tag, and how many elements came.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dc_recv_info {
    /// Rank in the communicator of the sender.
    pub source: i32,
    /// Tag of the message.
    pub tag: i32,
    /// Number of elements received (may be less than the receive count).
    pub count: usize,
}

fn user_tag(tag: i32, any_ok: bool) -> Result<Option<u32>> {
    match tag {
        DC_ANY_TAG if any_ok => Ok(None),
        t if t >= 0 => Ok(Some(t as u32)),
        t => Err(Error::new(Status::InvalidArgument, format!("tag {t} is negative{}", if any_ok { " (and not DC_ANY_TAG)" } else { "" }))),
    }
}

/// A send's checked arguments: the buffer, the destination's rank and the tag.
type SendArgs = (crate::buffer::ConstBuf, usize, u32);
/// A receive's checked arguments: the buffer, the source (None: any), the tag (None: any) and
/// the element size.
type RecvArgs = (crate::buffer::MutBuf, Option<usize>, Option<u32>, usize);

unsafe fn send_args(buf: *const libc::c_void, count: usize, dt: dc_dtype, dst: i32, tag: i32, c: &Comm) -> Result<SendArgs> {
    let dt = checks::dtype(dt)?;
    let dst_r = checks::rank_in(dst, c.size(), "dst")?;
    let tag = user_tag(tag, false)?.unwrap_or(0);
    Ok((checks::src_buf(buf, checks::bytes(count, dt, "count")?, "buf")?, dst_r, tag))
}

unsafe fn recv_args(buf: *mut libc::c_void, count: usize, dt: dc_dtype, src: i32, tag: i32, c: &Comm) -> Result<RecvArgs> {
    let dt = checks::dtype(dt)?;
    let src_r = if src == DC_ANY_SOURCE { None } else { Some(checks::rank_in(src, c.size(), "src")?) };
    let tag = user_tag(tag, true)?;
    Ok((checks::dst_buf(buf, checks::bytes(count, dt, "count")?, "buf")?, src_r, tag, dt.size()))
}

unsafe fn start_send(buf: *const libc::c_void, count: usize, dt: dc_dtype, dst: i32, tag: i32, c: &Comm) -> Result<(P2pOp, i32)> {
    let (b, dst_r, tag) = send_args(buf, count, dt, dst, tag, c)?;
    Ok((c.post_send(b, dst_r, tag)?, dst))
}

unsafe fn start_recv(buf: *mut libc::c_void, count: usize, dt: dc_dtype, src: i32, tag: i32, c: &Comm) -> Result<(P2pOp, usize)> {
    let (b, src_r, tag, esize) = recv_args(buf, count, dt, src, tag, c)?;
    Ok((c.post_recv(b, src_r, tag)?, esize))
}

/// What a blocking receive from `src` waits for, for its error text.
fn receiving_from(src: i32) -> String {
    if src < 0 { "receiving from any rank".to_string() } else { format!("receiving from rank {src}") }
}

/// Writes what a finished receive got into `info` (may be NULL).
unsafe fn write_info(info: *mut dc_recv_info, c: &Comm, d: crate::completion::Done, esize: usize) {
    if let Some(i) = info.as_mut() {
        *i = dc_recv_info { source: c.comm_rank_of(d.source), tag: d.tag as i32, count: d.bytes / esize };
    }
}

/// Sends `count` elements of `dt` to rank `dst` with `tag` (>= 0). Blocks until the data is
/// handed to the transport (the buffer may then be reused), at most for the comm's timeout.
/// CUDA device memory (NCCL backend) goes through ncclSend and returns when the receiver has it
/// (no eager buffering: exchange with dc_isend/dc_irecv); device messages between two ranks are
/// received in the order sent, whatever their tags; a send to oneself is DC_ERR_UNAVAILABLE.
/// Statuses: DC_ERR_INVALID_ARGUMENT, DC_ERR_TIMEOUT, DC_ERR_PEER_LOST, DC_ERR_ABORTED.
#[no_mangle]
pub unsafe extern "C" fn dc_send(buf: *const libc::c_void, count: usize, dt: dc_dtype, dst: i32, tag: i32, comm: *mut Comm) -> dc_status {
    guard("dc_send", || {
        let c = checks::comm(comm)?;
        on_rank(c, || {
            let (b, dst_r, tag) = send_args(buf, count, dt, dst, tag, c)?;
            crate::transport::waits_at_once_up_to(b.len(), || {
                let op = c.post_send(b, dst_r, tag)?;
                c.wait_p2p_started(&op, &|| format!("sending to rank {dst}")).map(|_| ())
            })
        })
    })
}

/// Receives up to `count` elements of `dt` from rank `src` (or DC_ANY_SOURCE) with `tag` (or
/// DC_ANY_TAG). Messages between one pair with one tag arrive in the order sent. A longer
/// message is DC_ERR_INVALID_ARGUMENT (truncation) with nothing written past `count`. `info`
/// (may be NULL) receives the sender, tag and element count. Blocks up to the comm's timeout.
/// CUDA device memory (NCCL backend): `count` must equal the sender's count; `src` must be a
/// rank (DC_ANY_SOURCE is DC_ERR_UNAVAILABLE); the next device message from `src` is taken, and
/// if its tag differs from a specific `tag` the call fails with DC_ERR_UNAVAILABLE (tags cannot
/// reorder device messages); both mismatches abort the comm's NCCL communicator.
/// Statuses: DC_ERR_INVALID_ARGUMENT, DC_ERR_TIMEOUT, DC_ERR_PEER_LOST, DC_ERR_ABORTED,
/// DC_ERR_UNAVAILABLE.
#[no_mangle]
pub unsafe extern "C" fn dc_recv(
    buf: *mut libc::c_void,
    count: usize,
    dt: dc_dtype,
    src: i32,
    tag: i32,
    comm: *mut Comm,
    info: *mut dc_recv_info,
) -> dc_status {
    guard("dc_recv", || {
        let c = checks::comm(comm)?;
        on_rank(c, || {
            let (b, src_r, tag, esize) = recv_args(buf, count, dt, src, tag, c)?;
            crate::transport::waits_at_once_up_to(b.len(), || {
                let deadline = crate::completion::LazyDeadline::new(c.timeout_ms());
                let d = c.recv_blocking(b, src_r, tag, &|| deadline.get(), &|| receiving_from(src))?;
                write_info(info, c, d, esize);
                Ok(())
            })
        })
    })
}

/// Sends to `dst` (as dc_send) and receives from `src` (as dc_recv) in one call, as
/// MPI_Sendrecv: the receive is started before any send that cannot finish at once, and
/// neither waits for the other, so ranks that exchange with each other (a ring, a pair) do not
/// deadlock whatever the sizes. The buffers
/// must not overlap. Every argument is checked before anything starts. Returns once both
/// finished, within the comm's timeout for the whole call; a failed send withdraws the
/// receive if it is still open, and the receive's failure, if it has one, is returned before
/// the send's. Statuses: as dc_send and dc_recv.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn dc_sendrecv(
    sendbuf: *const libc::c_void,
    sendcount: usize,
    sendtype: dc_dtype,
    dst: i32,
    sendtag: i32,
    recvbuf: *mut libc::c_void,
    recvcount: usize,
    recvtype: dc_dtype,
    src: i32,
    recvtag: i32,
    comm: *mut Comm,
    info: *mut dc_recv_info,
) -> dc_status {
    guard("dc_sendrecv", || {
        let c = checks::comm(comm)?;
        on_rank(c, || {
            let (sb, dst_r, stag) = send_args(sendbuf, sendcount, sendtype, dst, sendtag, c)?;
            let (rb, src_r, rtag, esize) = recv_args(recvbuf, recvcount, recvtype, src, recvtag, c)?;
            crate::transport::waits_at_once_up_to(sb.len().max(rb.len()), || {
                // One deadline for both: the call as a whole honours the timeout.
                let deadline = crate::completion::LazyDeadline::new(c.timeout_ms());
                let what = (&|| format!("sending to rank {dst}"), &|| receiving_from(src));
                match c.sendrecv((sb, dst_r, stag), (rb, src_r, rtag), &|| deadline.get(), (&what.0, &what.1)) {
                    Exchanged::Failed(e) => Err(e),
                    // The receive's failure, if it has one, before the send's.
                    Exchanged::Both { sent, got } => {
                        write_info(info, c, got?, esize);
                        sent
                    }
                }
            })
        })
    })
}

/// Starts a send (see dc_send) and returns at once with a request in `*req`; the buffer must
/// stay untouched until the request completes. Free the request with dc_request_free.
#[no_mangle]
pub unsafe extern "C" fn dc_isend(
    buf: *const libc::c_void,
    count: usize,
    dt: dc_dtype,
    dst: i32,
    tag: i32,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_isend", || {
        let c = checks::comm_arc(comm)?;
        on_rank(&c, || {
            let out = checks::out(req, "req")?;
            let started = Stamp::now();
            let (op, peer) = start_send(buf, count, dt, dst, tag, &c)?;
            *out = Request::p2p(Arc::clone(&c), op, peer, started).into_raw();
            Ok(())
        })
    })
}

/// Starts a receive (see dc_recv) and returns at once with a request in `*req`; after it
/// completes, dc_request_recv_info tells who sent what. Free with dc_request_free.
#[no_mangle]
pub unsafe extern "C" fn dc_irecv(
    buf: *mut libc::c_void,
    count: usize,
    dt: dc_dtype,
    src: i32,
    tag: i32,
    comm: *mut Comm,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_irecv", || {
        let c = checks::comm_arc(comm)?;
        on_rank(&c, || {
            let out = checks::out(req, "req")?;
            let started = Stamp::now();
            let (op, esize) = start_recv(buf, count, dt, src, tag, &c)?;
            *out = Request::p2p(Arc::clone(&c), op, src, started).with_elem_size(esize).into_raw();
            Ok(())
        })
    })
}

fn probe_args(src: i32, tag: i32, dt: dc_dtype, c: &Comm) -> Result<(Option<usize>, Option<u32>, usize)> {
    let dt = checks::dtype(dt)?;
    let src_r = if src == DC_ANY_SOURCE { None } else { Some(checks::rank_in(src, c.size(), "src")?) };
    Ok((src_r, user_tag(tag, true)?, dt.size()))
}

fn probed_info(p: crate::comm::Probed, esize: usize) -> dc_recv_info {
    dc_recv_info { source: p.source as i32, tag: p.tag as i32, count: p.bytes / esize }
}

/// Waits (up to the comm's timeout) until a message from `src` (or DC_ANY_SOURCE) with `tag`
/// (or DC_ANY_TAG) can be received, and describes it in `info` (sender, tag, and its length in
/// elements of `dt`, rounded down) without receiving it: the next matching dc_recv gets it.
/// Host messages only. Statuses: DC_ERR_INVALID_ARGUMENT, DC_ERR_TIMEOUT, DC_ERR_PEER_LOST,
/// DC_ERR_ABORTED.
#[no_mangle]
pub unsafe extern "C" fn dc_probe(src: i32, tag: i32, dt: dc_dtype, comm: *mut Comm, info: *mut dc_recv_info) -> dc_status {
    guard("dc_probe", || {
        let c = checks::comm(comm)?;
        on_rank(c, || {
            let (s, t, esize) = probe_args(src, tag, dt, c)?;
            let p = c.probe(s, t)?;
            if let Some(i) = info.as_mut() {
                *i = probed_info(p, esize);
            }
            Ok(())
        })
    })
}

/// dc_probe without waiting: `*flag` is true if a message is there (then `info`, which may be
/// NULL, describes it), false otherwise.
#[no_mangle]
pub unsafe extern "C" fn dc_iprobe(src: i32, tag: i32, dt: dc_dtype, comm: *mut Comm, flag: *mut bool, info: *mut dc_recv_info) -> dc_status {
    guard("dc_iprobe", || {
        let c = checks::comm(comm)?;
        let flag = flag.as_mut().ok_or_else(|| Error::new(Status::InvalidArgument, "flag is NULL"))?;
        on_rank(c, || {
            let (s, t, esize) = probe_args(src, tag, dt, c)?;
            let got = c.iprobe(s, t)?;
            *flag = got.is_some();
            if let (Some(p), Some(i)) = (got, info.as_mut()) {
                *i = probed_info(p, esize);
            }
            Ok(())
        })
    })
}

/// dc_send that returns only once a receive on `dst` has matched the message (a synchronous
/// send), at most after the comm's timeout. Host memory only. Statuses: as dc_send.
#[no_mangle]
pub unsafe extern "C" fn dc_ssend(buf: *const libc::c_void, count: usize, dt: dc_dtype, dst: i32, tag: i32, comm: *mut Comm) -> dc_status {
    guard("dc_ssend", || {
        let c = checks::comm(comm)?;
        on_rank(c, || {
            let dt = checks::dtype(dt)?;
            let dst_r = checks::rank_in(dst, c.size(), "dst")?;
            let tag = user_tag(tag, false)?.unwrap_or(0);
            let b = checks::src_buf(buf, checks::bytes(count, dt, "count")?, "buf")?;
            let op = c.post_ssend(b, dst_r, tag)?;
            c.wait_p2p_started(&op, &|| format!("sending synchronously to rank {dst}")).map(|_| ())
        })
    })
}
