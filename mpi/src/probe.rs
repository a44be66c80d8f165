//! MPI_Probe, Iprobe, Mprobe, Improbe, Mrecv, Imrecv: the engine's probes, and message handles
//! (MSG_BASE + slot) for messages a matched probe took, each received exactly once.

use crate::abi_gen::*;
use crate::api::{check_comm_peer, engine_source_tag, out, write_status};
use crate::err::{MpiErr, Res};
use crate::request::{self, Req};
use crate::state::CommRef;
use distcomm::buffer::MutBuf;
use distcomm::comm::Probed;
use distcomm::transport::Matched;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

pub const MSG_BASE: usize = 0x3800_0000;

static MESSAGES: Mutex<Vec<Option<(CommRef, MPI_Comm, Matched)>>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn add(v: (CommRef, MPI_Comm, Matched)) -> MPI_Message {
    let mut s = lock(&MESSAGES);
    let slot = s.iter().position(|x| x.is_none()).unwrap_or_else(|| {
        s.push(None);
        s.len() - 1
    });
    s[slot] = Some(v);
    MSG_BASE + slot
}

/// The communicator handle a message was probed on (its errors go to that handler).
fn comm_of(h: MPI_Message) -> Option<MPI_Comm> {
    let s = lock(&MESSAGES);
    h.checked_sub(MSG_BASE).and_then(|i| s.get(i)).and_then(|x| x.as_ref()).map(|m| m.1)
}

fn take(h: MPI_Message) -> Result<(CommRef, MPI_Comm, Matched), MpiErr> {
    let mut s = lock(&MESSAGES);
    match h.checked_sub(MSG_BASE).and_then(|i| s.get_mut(i)).and_then(|x| x.take()) {
        Some(m) => Ok(m),
        None => crate::mpi_err!(MPI_ERR_REQUEST, "{h:#x} is not a valid message (never probed, or received already)"),
    }
}

fn status_of(p: &Probed) -> MPI_Status {
    let mut st = request::empty_status();
    st.MPI_SOURCE = p.source as c_int;
    st.MPI_TAG = p.tag as c_int;
    request::set_count(&mut st, p.bytes);
    st
}

/// (source, tag) as the engine takes them, after the checks every probe makes.
fn probe_args(source: c_int, tag: c_int, c: MPI_Comm) -> Result<(CommRef, Option<usize>, Option<u32>), MpiErr> {
    let mc = check_comm_peer(source, tag, c)?;
    let (source, tag) = engine_source_tag(source, tag);
    Ok((mc, source, tag))
}

pub unsafe fn probe(source: c_int, tag: c_int, c: MPI_Comm, st: *mut MPI_Status) -> Res {
    let (mc, s, t) = probe_args(source, tag, c)?;
    if source == MPI_PROC_NULL {
        write_status(st, request::proc_null_status());
        return Ok(());
    }
    let p = mc.comm.probe(s, t).map_err(|e| MpiErr::from(e).on(c))?;
    write_status(st, status_of(&p));
    Ok(())
}

pub unsafe fn iprobe(source: c_int, tag: c_int, c: MPI_Comm, flag: *mut c_int, st: *mut MPI_Status) -> Res {
    let (mc, s, t) = probe_args(source, tag, c)?;
    let f = out(flag, "flag").map_err(|e| e.on(c))?;
    if source == MPI_PROC_NULL {
        *f = 1;
        write_status(st, request::proc_null_status());
        return Ok(());
    }
    match mc.comm.iprobe(s, t).map_err(|e| MpiErr::from(e).on(c))? {
        Some(p) => {
            *f = 1;
            write_status(st, status_of(&p));
        }
        None => *f = 0,
    }
    Ok(())
}

pub unsafe fn mprobe(source: c_int, tag: c_int, c: MPI_Comm, msg: *mut MPI_Message, st: *mut MPI_Status) -> Res {
    let (mc, s, t) = probe_args(source, tag, c)?;
    let m = out(msg, "message").map_err(|e| e.on(c))?;
    if source == MPI_PROC_NULL {
        *m = MPI_MESSAGE_NO_PROC;
        write_status(st, request::proc_null_status());
        return Ok(());
    }
    let (p, matched) = mc.comm.mprobe(s, t).map_err(|e| MpiErr::from(e).on(c))?;
    *m = add((mc, c, matched));
    write_status(st, status_of(&p));
    Ok(())
}

pub unsafe fn improbe(source: c_int, tag: c_int, c: MPI_Comm, flag: *mut c_int, msg: *mut MPI_Message, st: *mut MPI_Status) -> Res {
    let (mc, s, t) = probe_args(source, tag, c)?;
    let f = out(flag, "flag").map_err(|e| e.on(c))?;
    let m = out(msg, "message").map_err(|e| e.on(c))?;
    if source == MPI_PROC_NULL {
        *f = 1;
        *m = MPI_MESSAGE_NO_PROC;
        write_status(st, request::proc_null_status());
        return Ok(());
    }
    match mc.comm.improbe(s, t).map_err(|e| MpiErr::from(e).on(c))? {
        Some((p, matched)) => {
            *f = 1;
            *m = add((mc, c, matched));
            write_status(st, status_of(&p));
        }
        None => *f = 0,
    }
    Ok(())
}

/// Starts the receive of message `*msg` (which becomes MPI_MESSAGE_NULL). Every argument is
/// checked before the message is taken, so a bad call leaves it for a good one.
fn start_mrecv(buf: *mut c_void, count: i64, dt: MPI_Datatype, msg: *mut MPI_Message) -> Result<Req, MpiErr> {
    let m = out(msg, "message")?;
    if *m == MPI_MESSAGE_NO_PROC {
        *m = MPI_MESSAGE_NULL;
        return Ok(Req::Done(request::proc_null_status()));
    }
    if *m == MPI_MESSAGE_NULL {
        return crate::mpi_err!(MPI_ERR_REQUEST, "MPI_MESSAGE_NULL cannot be received");
    }
    let on = |e: MpiErr| e.on(comm_of(*m).unwrap_or(MPI_COMM_SELF));
    let i = crate::packing::incoming(buf, count, dt).map_err(on)?;
    let (mc, c, matched) = take(*m)?;
    *m = MPI_MESSAGE_NULL;
    // SAFETY: the bytes (the caller's buffer, or our packed one) stay until the receive completes.
    let b = unsafe { MutBuf::new(i.ptr, i.len) };
    let op = mc.comm.post_recv_matched(matched, b).map_err(|e| MpiErr::from(e).on(c))?;
    Ok(crate::packing::wrap_recv(Req::Recv { comm: mc, op }, i.tmp))
}

pub unsafe fn mrecv_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, msg: *mut MPI_Message, st: *mut MPI_Status) -> Res {
    write_status(st, start_mrecv(buf, count, dt, msg)?.finish()?);
    Ok(())
}

pub unsafe fn mrecv(buf: *mut c_void, count: c_int, dt: MPI_Datatype, msg: *mut MPI_Message, st: *mut MPI_Status) -> Res {
    mrecv_c(buf, count as MPI_Count, dt, msg, st)
}

pub unsafe fn imrecv_c(buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, msg: *mut MPI_Message, req: *mut MPI_Request) -> Res {
    let r = out(req, "request")?;
    *r = request::add(start_mrecv(buf, count, dt, msg)?);
    Ok(())
}

pub unsafe fn imrecv(buf: *mut c_void, count: c_int, dt: MPI_Datatype, msg: *mut MPI_Message, req: *mut MPI_Request) -> Res {
    imrecv_c(buf, count as MPI_Count, dt, msg, req)
}
