//! Buffered sends and their buffers: the process's (MPI_Buffer_attach) and, from MPI 4.1, one
//! per communicator (MPI_Comm_attach_buffer) and one per session (MPI_Session_attach_buffer).
//! A buffered send uses its communicator's buffer, else the buffer of the session the
//! communicator derives from, else the process's. A buffered send copies the message (into memory of ours; the attached buffer only
//! limits how much may be in flight, as the standard accounts it: size + MPI_BSEND_OVERHEAD per
//! message) and sends from the copy, so it never waits for the receiver. MPI_BUFFER_AUTOMATIC
//! sets no limit.

use crate::abi_gen::*;
use crate::api::{out, start_send};
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::request::{self, Req};
use crate::state;
use std::ffi::{c_int, c_void};

/// Buffered messages of this many bytes or more keep their space until they are matched.
const HOLD_UNTIL_MATCHED: usize = 64 << 10;

/// Whose buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    Process,
    Comm(MPI_Comm),
    Session(MPI_Session),
}

struct Bsend {
    attached: Vec<(Owner, usize, usize)>,
    /// Communicators made from a session's group, and those derived from them: their session.
    sessions: Vec<(MPI_Comm, MPI_Session)>,
    /// Buffered sends in flight, by the buffer they count against.
    pending: Vec<(Owner, Req, Vec<u8>)>,
}

static BSEND: std::sync::Mutex<Bsend> = std::sync::Mutex::new(Bsend { attached: Vec::new(), sessions: Vec::new(), pending: Vec::new() });

fn bsend_lock() -> std::sync::MutexGuard<'static, Bsend> {
    BSEND.lock().unwrap_or_else(|p| p.into_inner())
}

impl Bsend {
    fn buffer(&self, o: Owner) -> Option<(usize, usize)> {
        self.attached.iter().find(|a| a.0 == o).map(|a| (a.1, a.2))
    }
    /// The pending sends of `o` (every one for `all`), taken out.
    fn take(&mut self, o: Owner, all: bool) -> Vec<(Owner, Req, Vec<u8>)> {
        let (mine, rest) = std::mem::take(&mut self.pending).into_iter().partition(|p| all || p.0 == o);
        self.pending = rest;
        mine
    }
}

fn finish_all(pending: Vec<(Owner, Req, Vec<u8>)>) -> Res {
    let mut first = None;
    for (_, r, data) in pending {
        if let Err(e) = r.finish() {
            first.get_or_insert(e);
        }
        drop(data);
    }
    first.map_or(Ok(()), Err)
}

/// Waits for every buffered send (MPI_Finalize).
pub fn bsend_flush() -> Res {
    let p = bsend_lock().take(Owner::Process, true);
    finish_all(p)
}

/// `c` derives from session `s` (MPI_Comm_create_from_group of a group of the session's).
pub fn comm_from_session(c: MPI_Comm, s: MPI_Session) {
    bsend_lock().sessions.push((c, s));
}

/// `child` was made from `parent` (a duplicate, a split): it derives from the same session.
pub fn comm_derived(parent: MPI_Comm, child: MPI_Comm) {
    let mut b = bsend_lock();
    if let Some(&(_, s)) = b.sessions.iter().find(|x| x.0 == parent) {
        b.sessions.push((child, s));
    }
}

pub(crate) fn start_bsend(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    // The message is packed now: what is sent is a copy of ours, as MPI_BYTE.
    let data = crate::packing::pack_copy(buf, count, dt).map_err(|e| e.on(c))?;
    let n = data.len();
    let mut b = bsend_lock();
    // Finished ones give their space back.
    let mut i = 0;
    while i < b.pending.len() {
        if b.pending[i].1.is_done() {
            let (_, r, _data) = b.pending.swap_remove(i);
            r.finish()?;
        } else {
            i += 1;
        }
    }
    // The communicator's buffer if it has one, else its session's, else the process's.
    let session = b.sessions.iter().find(|x| x.0 == c).map(|x| Owner::Session(x.1));
    let owner = [Some(Owner::Comm(c)), session].into_iter().flatten().find(|&o| b.buffer(o).is_some()).unwrap_or(Owner::Process);
    let Some((addr, size)) = b.buffer(owner) else {
        return Err(MpiErr::new(MPI_ERR_BUFFER, "no buffer is attached (MPI_Buffer_attach, MPI_Comm_attach_buffer or MPI_Session_attach_buffer) for a buffered send").on(c));
    };
    if addr != MPI_BUFFER_AUTOMATIC {
        let used: usize = b.pending.iter().filter(|p| p.0 == owner).map(|p| p.2.len() + MPI_BSEND_OVERHEAD as usize).sum();
        if used + n + MPI_BSEND_OVERHEAD as usize > size {
            return Err(MpiErr::new(MPI_ERR_BUFFER, format!("the attached buffer ({size} bytes, {used} in use) has no room for {n} bytes + MPI_BSEND_OVERHEAD")).on(c));
        }
    }
    // A large message holds its space until the receiver has matched it (as MPICH holds its
    // rendezvous-size messages): the attached buffer then bounds what is in flight, also
    // where the engine would take a copy at once (a send to self). A small one gives its
    // space back as soon as the engine has it, so a stream of small buffered sends to a rank
    // not yet receiving fits a buffer sized as for MPICH's eager messages.
    let r = if n >= HOLD_UNTIL_MATCHED {
        crate::persist::start_ssend(data.as_ptr() as *const c_void, n as i64, MPI_BYTE, dest, tag, c)?
    } else {
        start_send(data.as_ptr() as *const c_void, n as i64, MPI_BYTE, dest, tag, c)?
    };
    b.pending.push((owner, r, data));
    Ok(())
}

pub unsafe fn bsend_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    start_bsend(buf, count, dt, dest, tag, c)
}
pub unsafe fn bsend(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm) -> Res {
    start_bsend(buf, count as MPI_Count, dt, dest, tag, c)
}
/// The request of a buffered send is complete once the message is buffered, i.e. at once.
pub unsafe fn ibsend_c(buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    let r = out(req, "request").map_err(|e| e.on(c))?;
    start_bsend(buf, count, dt, dest, tag, c)?;
    *r = request::add(Req::Done(request::empty_status()));
    Ok(())
}
pub unsafe fn ibsend(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, req: *mut MPI_Request) -> Res {
    ibsend_c(buf, count as MPI_Count, dt, dest, tag, c, req)
}

fn attach(o: Owner, buffer: *mut c_void, size: MPI_Count) -> Res {
    if size < 0 {
        return mpi_err!(MPI_ERR_ARG, "size {size} is negative");
    }
    if buffer.is_null() && size > 0 {
        return mpi_err!(MPI_ERR_BUFFER, "buffer is NULL");
    }
    let mut b = bsend_lock();
    if b.buffer(o).is_some() {
        return mpi_err!(MPI_ERR_BUFFER, "a buffer is already attached (detach it first)");
    }
    b.attached.push((o, buffer as usize, size as usize));
    Ok(())
}

/// Waits for the buffer's sends, then detaches it.
fn detach(o: Owner, addr: *mut c_void, size: *mut MPI_Count) -> Res {
    let a = out(addr as *mut *mut c_void, "buffer_addr")?;
    let s = out(size, "size")?;
    if bsend_lock().buffer(o).is_none() {
        return mpi_err!(MPI_ERR_BUFFER, "no buffer is attached");
    }
    let p = bsend_lock().take(o, false);
    finish_all(p)?;
    let mut b = bsend_lock();
    let Some(i) = b.attached.iter().position(|x| x.0 == o) else { return mpi_err!(MPI_ERR_BUFFER, "no buffer is attached") };
    let (_, p, n) = b.attached.remove(i);
    *a = p as *mut c_void;
    *s = n as MPI_Count;
    Ok(())
}

fn detach_int(o: Owner, addr: *mut c_void, size: *mut c_int) -> Res {
    let mut n: MPI_Count = 0;
    detach(o, addr, &mut n)?;
    *out(size, "size")? = n.min(c_int::MAX as MPI_Count) as c_int;
    Ok(())
}

pub unsafe fn buffer_attach_c(buffer: *mut c_void, size: MPI_Count) -> Res {
    attach(Owner::Process, buffer, size)
}
pub unsafe fn buffer_attach(buffer: *mut c_void, size: c_int) -> Res {
    attach(Owner::Process, buffer, size as MPI_Count)
}
pub unsafe fn buffer_detach_c(addr: *mut c_void, size: *mut MPI_Count) -> Res {
    detach(Owner::Process, addr, size)
}
pub unsafe fn buffer_detach(addr: *mut c_void, size: *mut c_int) -> Res {
    detach_int(Owner::Process, addr, size)
}
/// Waits for the buffered sends that use `o`'s buffer.
fn flush(o: Owner) -> Res {
    let p = bsend_lock().take(o, false);
    finish_all(p)
}

/// `flush` as request `*req`: a task on `on`'s worker waits for the sends (`name` is the call's).
fn iflush(o: Owner, on: &state::CommRef, name: &str, req: *mut MPI_Request) -> Res {
    let r = out(req, "request")?;
    let p = bsend_lock().take(o, false);
    *r = request::add(crate::task::start(on, &on.comm, name, move || finish_all(p), None)?);
    Ok(())
}

/// Waits for the buffered sends that use the process's buffer.
pub unsafe fn buffer_flush() -> Res {
    flush(Owner::Process)
}

/// The same as a request (on MPI_COMM_SELF's worker: the buffer is the process's, no
/// communicator's).
pub unsafe fn buffer_iflush(req: *mut MPI_Request) -> Res {
    state::check_active()?;
    iflush(Owner::Process, &state::get_comm(MPI_COMM_SELF)?, "MPI_Buffer_iflush", req)
}

fn comm_ok(c: MPI_Comm) -> Res {
    state::check_active()?;
    state::get_comm(c).map(|_| ())
}

pub unsafe fn comm_attach_buffer_c(c: MPI_Comm, buffer: *mut c_void, size: MPI_Count) -> Res {
    comm_ok(c)?;
    attach(Owner::Comm(c), buffer, size).map_err(|e| e.on(c))
}
pub unsafe fn comm_attach_buffer(c: MPI_Comm, buffer: *mut c_void, size: c_int) -> Res {
    comm_attach_buffer_c(c, buffer, size as MPI_Count)
}
pub unsafe fn comm_detach_buffer_c(c: MPI_Comm, addr: *mut c_void, size: *mut MPI_Count) -> Res {
    comm_ok(c)?;
    detach(Owner::Comm(c), addr, size).map_err(|e| e.on(c))
}
pub unsafe fn comm_detach_buffer(c: MPI_Comm, addr: *mut c_void, size: *mut c_int) -> Res {
    comm_ok(c)?;
    detach_int(Owner::Comm(c), addr, size).map_err(|e| e.on(c))
}
/// Waits for the buffered sends that use the communicator's buffer.
pub unsafe fn comm_flush_buffer(c: MPI_Comm) -> Res {
    comm_ok(c)?;
    flush(Owner::Comm(c)).map_err(|e| e.on(c))
}
/// The same as a request: a task on the comm's worker waits for the sends.
pub unsafe fn comm_iflush_buffer(c: MPI_Comm, req: *mut MPI_Request) -> Res {
    comm_ok(c)?;
    iflush(Owner::Comm(c), &state::get_comm(c)?, "MPI_Comm_iflush_buffer", req).map_err(|e| e.on(c))
}

/// A freed communicator's buffer is detached (its sends in flight go on).
pub fn forget_comm(c: MPI_Comm) {
    let mut b = bsend_lock();
    b.attached.retain(|a| a.0 != Owner::Comm(c));
    b.sessions.retain(|x| x.0 != c);
}

/// MPI_Session_finalize: the sends that use the session's buffer are delivered, and the buffer
/// is detached.
pub fn session_finalized(s: MPI_Session) -> Res {
    let r = flush(Owner::Session(s));
    let mut b = bsend_lock();
    b.attached.retain(|a| a.0 != Owner::Session(s));
    b.sessions.retain(|x| x.1 != s);
    r
}

fn session_ok(s: MPI_Session) -> Res {
    state::check_active()?;
    crate::session::check(s)
}

pub unsafe fn session_attach_buffer_c(s: MPI_Session, buffer: *mut c_void, size: MPI_Count) -> Res {
    session_ok(s)?;
    attach(Owner::Session(s), buffer, size).map_err(|e| e.on(s))
}
pub unsafe fn session_attach_buffer(s: MPI_Session, buffer: *mut c_void, size: c_int) -> Res {
    session_attach_buffer_c(s, buffer, size as MPI_Count)
}
pub unsafe fn session_detach_buffer_c(s: MPI_Session, addr: *mut c_void, size: *mut MPI_Count) -> Res {
    session_ok(s)?;
    detach(Owner::Session(s), addr, size).map_err(|e| e.on(s))
}
pub unsafe fn session_detach_buffer(s: MPI_Session, addr: *mut c_void, size: *mut c_int) -> Res {
    session_ok(s)?;
    detach_int(Owner::Session(s), addr, size).map_err(|e| e.on(s))
}
/// Waits for the buffered sends that use the session's buffer.
pub unsafe fn session_flush_buffer(s: MPI_Session) -> Res {
    session_ok(s)?;
    flush(Owner::Session(s)).map_err(|e| e.on(s))
}
/// The same as a request: a task on MPI_COMM_SELF's worker waits for the sends.
pub unsafe fn session_iflush_buffer(s: MPI_Session, req: *mut MPI_Request) -> Res {
    session_ok(s)?;
    iflush(Owner::Session(s), &state::get_comm(MPI_COMM_SELF)?, "MPI_Session_iflush_buffer", req).map_err(|e| e.on(s))
}
