//! Small parts of point-to-point and statuses from MPI 4: MPI_Isendrecv(_replace), the
//! Request_get_status_any/all/some family, Status_get/set_source/tag/error, Get_address.

use crate::abi_gen::*;
use crate::api::{out, start_recv, start_recv_then_send, start_send, write_status};
use crate::err::{MpiErr, Res};
use crate::request::{self, Req};
use std::ffi::{c_int, c_void};

fn status<'a>(st: *const MPI_Status) -> Result<&'a MPI_Status, MpiErr> {
    // SAFETY: a non-NULL status from the caller is readable.
    unsafe { st.as_ref() }.ok_or_else(|| MpiErr::new(MPI_ERR_ARG, "status is NULL"))
}

pub unsafe fn status_get_source(st: *const MPI_Status, v: *mut c_int) -> Res {
    *out(v, "source")? = status(st)?.MPI_SOURCE;
    Ok(())
}
pub unsafe fn status_get_tag(st: *const MPI_Status, v: *mut c_int) -> Res {
    *out(v, "tag")? = status(st)?.MPI_TAG;
    Ok(())
}
pub unsafe fn status_get_error(st: *const MPI_Status, v: *mut c_int) -> Res {
    *out(v, "error")? = status(st)?.MPI_ERROR;
    Ok(())
}
pub unsafe fn status_set_source(st: *mut MPI_Status, v: c_int) -> Res {
    out(st, "status")?.MPI_SOURCE = v;
    Ok(())
}
pub unsafe fn status_set_tag(st: *mut MPI_Status, v: c_int) -> Res {
    out(st, "status")?.MPI_TAG = v;
    Ok(())
}
pub unsafe fn status_set_error(st: *mut MPI_Status, v: c_int) -> Res {
    out(st, "status")?.MPI_ERROR = v;
    Ok(())
}

/// Addresses are the pointers themselves (MPI_BOTTOM is 0).
pub unsafe fn get_address(location: *const c_void, address: *mut MPI_Aint) -> Res {
    *out(address, "address")? = location as MPI_Aint;
    Ok(())
}

/// A receive and a send as one request (the receive's status); `keep` holds what the send
/// sends from when it is a copy (Isendrecv_replace).
fn pair(recv: Req, send: Req, keep: Vec<u8>) -> Req {
    Req::Pair(Box::new(request::Pair { recv, send, keep }))
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn isendrecv_c(
    sbuf: *const c_void,
    scount: MPI_Count,
    sdt: MPI_Datatype,
    dest: c_int,
    stag: c_int,
    rbuf: *mut c_void,
    rcount: MPI_Count,
    rdt: MPI_Datatype,
    src: c_int,
    rtag: c_int,
    c: MPI_Comm,
    req: *mut MPI_Request,
) -> Res {
    let r = out(req, "request").map_err(|e| e.on(c))?;
    let (recv, send) = start_recv_then_send(start_recv(rbuf, rcount, rdt, src, rtag, c), || start_send(sbuf, scount, sdt, dest, stag, c))?;
    *r = request::add(pair(recv, send, Vec::new()));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn isendrecv(
    sbuf: *const c_void,
    scount: c_int,
    sdt: MPI_Datatype,
    dest: c_int,
    stag: c_int,
    rbuf: *mut c_void,
    rcount: c_int,
    rdt: MPI_Datatype,
    src: c_int,
    rtag: c_int,
    c: MPI_Comm,
    req: *mut MPI_Request,
) -> Res {
    isendrecv_c(sbuf, scount as MPI_Count, sdt, dest, stag, rbuf, rcount as MPI_Count, rdt, src, rtag, c, req)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn isendrecv_replace_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, stag: c_int, src: c_int, rtag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    let r = out(req, "request").map_err(|e| e.on(c))?;
    // The send goes from a packed copy (as MPI_BYTE): the receive overwrites the buffer.
    let copy = crate::packing::pack_copy(buf, count, dt).map_err(|e| e.on(c))?;
    let (recv, send) = start_recv_then_send(start_recv(buf, count, dt, src, rtag, c), || {
        start_send(copy.as_ptr() as *const c_void, copy.len() as i64, MPI_BYTE, dest, stag, c)
    })?;
    *r = request::add(pair(recv, send, copy));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn isendrecv_replace(buf: *mut c_void, count: c_int, dt: MPI_Datatype, dest: c_int, stag: c_int, src: c_int, rtag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    isendrecv_replace_c(buf, count as MPI_Count, dt, dest, stag, src, rtag, c, req)
}

fn handles<'a>(n: c_int, p: *const MPI_Request) -> Result<&'a [MPI_Request], MpiErr> {
    if n < 0 {
        return crate::mpi_err!(MPI_ERR_COUNT, "count {n} is negative");
    }
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "array_of_requests is NULL");
    }
    // SAFETY: the caller's array holds `n` requests.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
}

/// The status of `h` if it completed, without freeing it (as MPI_Request_get_status).
fn peek(h: MPI_Request) -> Result<Option<MPI_Status>, MpiErr> {
    if h == MPI_REQUEST_NULL {
        return Ok(Some(request::empty_status()));
    }
    let mut r = request::take(h)?;
    let got = r.peek();
    request::put_back(h, r);
    got.transpose()
}

fn status_slot(sts: *mut MPI_Status, i: usize) -> *mut MPI_Status {
    if sts.is_null() { sts } else { unsafe { sts.add(i) } }
}

pub unsafe fn request_get_status_any(n: c_int, rq: *const MPI_Request, index: *mut c_int, flag: *mut c_int, st: *mut MPI_Status) -> Res {
    crate::state::check_active()?;
    let hs = handles(n, rq)?;
    let idx = out(index, "index")?;
    let f = out(flag, "flag")?;
    let mut active = false;
    for (i, &h) in hs.iter().enumerate() {
        if !request::is_active(h)? {
            continue;
        }
        active = true;
        if let Some(s) = peek(h)? {
            (*f, *idx) = (1, i as c_int);
            write_status(st, s);
            return Ok(());
        }
    }
    *f = (!active) as c_int;
    *idx = MPI_UNDEFINED;
    if let (false, Some(p)) = (active, unsafe { st.as_mut() }) {
        // The empty status, its error field included.
        *p = request::empty_status();
    }
    Ok(())
}

pub unsafe fn request_get_status_all(n: c_int, rq: *const MPI_Request, flag: *mut c_int, sts: *mut MPI_Status) -> Res {
    crate::state::check_active()?;
    let hs = handles(n, rq)?;
    let f = out(flag, "flag")?;
    let mut got = Vec::with_capacity(hs.len());
    for &h in hs {
        match peek(h)? {
            Some(s) => got.push(s),
            None => {
                *f = 0;
                return Ok(());
            }
        }
    }
    *f = 1;
    for (i, s) in got.into_iter().enumerate() {
        if let Some(p) = unsafe { status_slot(sts, i).as_mut() } {
            *p = s;
            p.MPI_ERROR = MPI_SUCCESS;
        }
    }
    Ok(())
}

pub unsafe fn request_get_status_some(n: c_int, rq: *const MPI_Request, outcount: *mut c_int, indices: *mut c_int, sts: *mut MPI_Status) -> Res {
    crate::state::check_active()?;
    let hs = handles(n, rq)?;
    let oc = out(outcount, "outcount")?;
    let mut active = false;
    let mut k = 0usize;
    for (i, &h) in hs.iter().enumerate() {
        if !request::is_active(h)? {
            continue;
        }
        active = true;
        if let Some(s) = peek(h)? {
            if indices.is_null() {
                return crate::mpi_err!(MPI_ERR_ARG, "array_of_indices is NULL");
            }
            // SAFETY: the caller's arrays hold incount entries.
            unsafe { *indices.add(k) = i as c_int };
            if let Some(p) = unsafe { status_slot(sts, k).as_mut() } {
                *p = s;
                p.MPI_ERROR = MPI_SUCCESS;
            }
            k += 1;
        }
    }
    *oc = if active { k as c_int } else { MPI_UNDEFINED };
    Ok(())
}
