//! Synchronous sends (MPI_Ssend, Issend), MPI_Cancel, and persistent requests (MPI_Send_init,
//! Ssend_init, Bsend_init, Rsend_init, Recv_init, Start, Startall).

use crate::abi_gen::*;
use crate::api::{out, p2p_args, start_bsend, start_recv, start_send};
use crate::err::{MpiErr, Res};
use crate::request::{self, Persistent, Req};
use distcomm::buffer::ConstBuf;
use std::ffi::{c_int, c_void};

pub(crate) fn start_ssend(buf: *const c_void, count: i64, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    let a = p2p_args(buf, count, dt, dest, tag, c, false)?;
    if dest == MPI_PROC_NULL {
        return Ok(Req::Done(request::proc_null_status()));
    }
    let o = crate::packing::outgoing(buf, count, dt).map_err(|e| e.on(c))?;
    // SAFETY: the bytes (the caller's buffer, or our packed copy) stay until the send completes.
    let b = unsafe { ConstBuf::new(o.ptr, o.len) };
    let op = a.mc.comm.post_ssend(b, dest as usize, tag as u32).map_err(|e| MpiErr::from(e).on(c))?;
    Ok(crate::packing::wrap(Req::Send { comm: a.mc, op }, o.keep, None))
}

pub unsafe fn ssend_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    start_ssend(buf, count, dt, dest, tag, c)?.finish().map(|_| ())
}

pub unsafe fn ssend(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    ssend_c(buf, count as MPI_Count, dt, dest, tag, c)
}

pub unsafe fn issend_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    let r = out(req, "request").map_err(|e| e.on(c))?;
    *r = request::add(start_ssend(buf, count, dt, dest, tag, c)?);
    Ok(())
}

pub unsafe fn issend(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    issend_c(buf, count as MPI_Count, dt, dest, tag, c, req)
}

/// `r` with its receive withdrawn if no message matched it yet (see `cancel`).
fn withdraw(r: Req) -> Req {
    match r {
        Req::Recv { comm, op } => {
            let e = || distcomm::Error::new(distcomm::Status::Aborted, "cancelled by MPI_Cancel");
            if comm.comm.cancel_unmatched(&op, e) {
                Req::Done(request::cancelled_status())
            } else {
                Req::Recv { comm, op }
            }
        }
        Req::Packed(mut p) => {
            p.inner = withdraw(p.inner);
            if matches!(p.inner, Req::Done(_)) {
                p.unpack = None;
            }
            Req::Packed(p)
        }
        other => other,
    }
}

/// A receive that no message matched yet is withdrawn: it completes with a status that
/// MPI_Test_cancelled reports as cancelled. Anything else (a send, a matched receive, a
/// collective) is not cancelled and completes as usual: the standard allows that answer.
pub unsafe fn cancel(req: *mut MPI_Request) -> Res {
    crate::state::check_active()?;
    let h = *out(req, "request")?;
    if h == MPI_REQUEST_NULL {
        return crate::mpi_err!(MPI_ERR_REQUEST, "MPI_REQUEST_NULL cannot be cancelled");
    }
    let r = request::take(h)?;
    let r = match r {
        Req::Generalized(g) => {
            let called = g.cancel();
            request::put_back(h, Req::Generalized(g));
            return called;
        }
        Req::Persistent(mut p) => {
            p.active = p.active.map(|a| Box::new(withdraw(*a)));
            Req::Persistent(p)
        }
        other => withdraw(other),
    };
    request::put_back(h, r);
    Ok(())
}

// ---- persistent requests --------------------------------------------------------------------------

/// Makes an inactive persistent request whose MPI_Start calls `start`. The arguments are
/// checked now (as the send or receive would check them), so a bad one fails the init call.
#[allow(clippy::too_many_arguments)]
fn persistent(
    buf: *const c_void,
    count: i64,
    dt: MPI_Datatype,
    peer: c_int,
    tag: c_int,
    c: MPI_Comm,
    recv: bool,
    req: *mut MPI_Request,
    start: fn(usize, i64, MPI_Datatype, c_int, c_int, MPI_Comm) -> Result<Req, MpiErr>,
) -> Res {
    let r = out(req, "request").map_err(|e| e.on(c))?;
    let a = p2p_args(buf, count, dt, peer, tag, c, recv)?;
    let addr = buf as usize;
    // The request keeps its datatype: MPI_Type_free of it before the last MPI_Start is allowed.
    let pin = Pin::new(dt);
    let start = Box::new(move || {
        // The whole Pin moves into the closure (not just its field), so it lives as long.
        let pin = &pin;
        start(addr, count, pin.0, peer, tag, c)
    });
    *r = request::add(Req::Persistent(Box::new(Persistent { comm: a.mc, start, active: None })));
    Ok(())
}

/// A handle of our own to a derived datatype, freed with the persistent request.
struct Pin(MPI_Datatype);

impl Pin {
    fn new(dt: MPI_Datatype) -> Pin {
        match crate::datatype::resolve(dt) {
            Ok(t) if dt >= crate::datatype::TYPE_BASE => Pin(crate::datatype::handle_for(&t)),
            _ => Pin(dt),
        }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if self.0 >= crate::datatype::TYPE_BASE {
            let _ = crate::datatype::free(self.0);
        }
    }
}

fn send_start(buf: usize, count: i64, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    start_send(buf as *const c_void, count, dt, dest, tag, c)
}

fn ssend_start(buf: usize, count: i64, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    start_ssend(buf as *const c_void, count, dt, dest, tag, c)
}

/// A buffered send's request is complete once the message is buffered, i.e. at once.
fn bsend_start(buf: usize, count: i64, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    start_bsend(buf as *const c_void, count, dt, dest, tag, c)?;
    Ok(Req::Done(request::empty_status()))
}

fn recv_start(buf: usize, count: i64, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm) -> Result<Req, MpiErr> {
    start_recv(buf as *mut c_void, count, dt, src, tag, c)
}

pub unsafe fn send_init_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count, dt, dest, tag, c, false, req, send_start)
}
pub unsafe fn send_init(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count as i64, dt, dest, tag, c, false, req, send_start)
}
pub unsafe fn ssend_init_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count, dt, dest, tag, c, false, req, ssend_start)
}
pub unsafe fn ssend_init(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count as i64, dt, dest, tag, c, false, req, ssend_start)
}
pub unsafe fn bsend_init_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count, dt, dest, tag, c, false, req, bsend_start)
}
pub unsafe fn bsend_init(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count as i64, dt, dest, tag, c, false, req, bsend_start)
}
// A ready send may be a standard send (see api::rsend).
pub unsafe fn rsend_init_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count, dt, dest, tag, c, false, req, send_start)
}
pub unsafe fn rsend_init(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count as i64, dt, dest, tag, c, false, req, send_start)
}
pub unsafe fn recv_init_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count, dt, src, tag, c, true, req, recv_start)
}
pub unsafe fn recv_init(buf: *mut c_void, count: c_int, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    persistent(buf, count as i64, dt, src, tag, c, true, req, recv_start)
}

/// Checks that `h` is an inactive persistent request (error: MPI_ERR_REQUEST).
fn check_startable(h: MPI_Request) -> Res {
    let r = request::take(h)?;
    let ok = match &r {
        Req::Persistent(p) if p.active.is_none() => Ok(()),
        Req::Persistent(p) => Err(MpiErr::new(MPI_ERR_REQUEST, "the persistent request is active already (complete it before starting it again)").on(p.comm.handle)),
        _ => Err(MpiErr::new(MPI_ERR_REQUEST, format!("{h:#x} is not a persistent request"))),
    };
    request::put_back(h, r);
    ok
}

fn start_one(h: MPI_Request) -> Res {
    let mut p = match request::take(h)? {
        Req::Persistent(p) => p,
        other => {
            request::put_back(h, other);
            return crate::mpi_err!(MPI_ERR_REQUEST, "{h:#x} is not a persistent request");
        }
    };
    let started = (p.start)();
    let c = p.comm.handle;
    let res = started.map(|r| p.active = Some(Box::new(r)));
    request::put_back(h, Req::Persistent(p));
    res.map_err(|e| e.on(c))
}

pub unsafe fn start(req: *mut MPI_Request) -> Res {
    crate::state::check_active()?;
    let h = *out(req, "request")?;
    check_startable(h)?;
    start_one(h)
}

/// Every request is checked before any is started.
pub unsafe fn startall(n: c_int, rq: *mut MPI_Request) -> Res {
    crate::state::check_active()?;
    if n < 0 {
        return crate::mpi_err!(MPI_ERR_COUNT, "count {n} is negative");
    }
    if n == 0 {
        return Ok(());
    }
    if rq.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "array_of_requests is NULL");
    }
    // SAFETY: the caller's array holds `n` requests.
    let hs = unsafe { std::slice::from_raw_parts(rq, n as usize) };
    for &h in hs {
        check_startable(h)?;
    }
    for &h in hs {
        start_one(h)?;
    }
    Ok(())
}
