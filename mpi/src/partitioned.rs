//! Partitioned communication (MPI 4.0): MPI_Psend_init / MPI_Precv_init make persistent
//! requests for one message of `partitions` parts of `count` elements each. After MPI_Start the
//! sender marks parts ready (MPI_Pready, _range, _list); the message leaves in one transfer once
//! every part is ready, and MPI_Parrived says a part has arrived once the whole message has
//! (the coarsest granularity the standard allows). They travel on a point-to-point context of
//! their communicator's own, so they never match its other messages (MPI_ANY_TAG included).

use crate::abi_gen::*;
use crate::api::{out, start_recv_on, start_send_on};
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::request::{self, Persistent, Req};
use crate::state::{CommRef, MpiComm};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

/// Keeps partitioned traffic's context apart from the communicator's others.
const PARTITIONED: u64 = 0x5041_5254; // "PART"

/// One partitioned request (either side).
pub struct Part {
    /// The context of the communicator's partitioned messages; errors name the communicator.
    on: CommRef,
    comm: MPI_Comm,
    send: bool,
    buf: usize,
    parts: usize,
    count: MPI_Count,
    dt: MPI_Datatype,
    peer: c_int,
    tag: c_int,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    ready: Vec<bool>,
    nready: usize,
    /// The transfer: the receive from MPI_Start on, the send once every part is ready.
    inner: Option<Req>,
}

impl Part {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn comm(&self) -> &CommRef {
        &self.on
    }

    pub fn is_done(&self) -> bool {
        self.lock().inner.as_ref().is_some_and(|r| r.is_done())
    }

    pub fn peek(&self) -> Option<Result<MPI_Status, MpiErr>> {
        self.lock().inner.as_mut().and_then(|r| r.peek())
    }

    /// Waits for every part to be marked ready (another thread may be marking them), then for
    /// the transfer.
    pub fn finish_by(&self, deadline: &distcomm::completion::LazyDeadline) -> Result<MPI_Status, MpiErr> {
        let mut wait = request::Backoff::new(self.on.comm.timeout_ms());
        loop {
            if let Some(r) = self.lock().inner.take() {
                return r.finish_by(deadline);
            }
            wait.pause().map_err(|e| MpiErr::new(e.class, format!("{} (a partitioned send whose parts are not all marked ready)", e.msg)).on(self.comm))?;
        }
    }

    /// MPI_Start: no part ready; a receive is posted at once.
    fn start(self: &Arc<Part>) -> Result<Req, MpiErr> {
        let mut s = self.lock();
        s.ready = vec![false; self.parts];
        s.nready = 0;
        let total = self.count * self.parts as MPI_Count;
        s.inner = if self.send { None } else { Some(start_recv_on(&self.on, self.buf as *mut c_void, total, self.dt, self.peer, self.tag, self.comm)?) };
        Ok(Req::Partitioned(self.clone()))
    }

    fn mark_ready(&self, p: c_int) -> Res {
        if !self.send {
            return mpi_err!(MPI_ERR_REQUEST, "parts are marked ready on a partitioned send request, not a receive");
        }
        let mut s = self.lock();
        let Some(r) = usize::try_from(p).ok().filter(|&i| i < self.parts) else {
            return mpi_err!(MPI_ERR_ARG, "partition {p} is not one of the request's 0..{}", self.parts);
        };
        if s.ready[r] {
            return mpi_err!(MPI_ERR_ARG, "partition {p} is already marked ready");
        }
        s.ready[r] = true;
        s.nready += 1;
        if s.nready == self.parts {
            let total = self.count * self.parts as MPI_Count;
            s.inner = Some(start_send_on(&self.on, self.buf as *const c_void, total, self.dt, self.peer, self.tag, self.comm)?);
        }
        Ok(())
    }
}

/// The communicator's context of partitioned messages (made by each member alone, the same on
/// every one).
fn context_of(mc: &MpiComm) -> Result<CommRef, MpiErr> {
    if let Some(c) = mc.partitioned.get() {
        return Ok(c.clone());
    }
    if mc.inter.get().is_some() {
        return mpi_err!(MPI_ERR_UNSUPPORTED_OPERATION, "partitioned communication on an intercommunicator is not supported by distcomm's MPI library");
    }
    let id = crate::ctxid::mix(&[mc.comm.context_id(), PARTITIONED]);
    let comm = mc.comm.new_from_parts(id, mc.rank(), mc.group_members(), false).map_err(MpiErr::from)?;
    let c = crate::state::unlisted(comm, mc.handle, mc.errhandler.load(std::sync::atomic::Ordering::Relaxed));
    Ok(mc.partitioned.get_or_init(|| c).clone())
}

#[allow(clippy::too_many_arguments)] // the standard's signature
fn init(send: bool, buf: *mut c_void, parts: c_int, count: MPI_Count, dt: MPI_Datatype, peer: c_int, tag: c_int, c: MPI_Comm, r: *mut MPI_Request) -> Res {
    crate::state::check_active()?;
    let mc = crate::state::get_comm(c)?;
    let fail = |e: MpiErr| e.on(c);
    let r = out(r, "request").map_err(fail)?;
    if parts < 1 {
        return Err(fail(MpiErr::new(MPI_ERR_ARG, format!("partitions {parts} must be at least 1"))));
    }
    if count < 0 {
        return Err(fail(MpiErr::new(MPI_ERR_COUNT, format!("count {count} is negative"))));
    }
    count.checked_mul(parts as MPI_Count).ok_or_else(|| fail(MpiErr::new(MPI_ERR_COUNT, "partitions x count overflows")))?;
    // The arguments are checked now; the message itself is checked by each start.
    crate::api::p2p_args(buf, count * parts as MPI_Count, dt, peer, tag, c, !send)?;
    let on = context_of(&mc).map_err(fail)?;
    let part = Arc::new(Part { on, comm: c, send, buf: buf as usize, parts: parts as usize, count, dt, peer, tag, state: Mutex::default() });
    let start = Box::new(move || part.start());
    *r = request::add(Req::Persistent(Box::new(Persistent { comm: mc, start, active: None })));
    Ok(())
}

#[allow(clippy::too_many_arguments)] // the standard's signature
pub unsafe fn psend_init(buf: *const c_void, parts: c_int, count: MPI_Count, dt: MPI_Datatype, dest: c_int, tag: c_int, c: MPI_Comm, _info: MPI_Info, r: *mut MPI_Request) -> Res {
    init(true, buf as *mut c_void, parts, count, dt, dest, tag, c, r)
}

#[allow(clippy::too_many_arguments)] // the standard's signature
pub unsafe fn precv_init(buf: *mut c_void, parts: c_int, count: MPI_Count, dt: MPI_Datatype, src: c_int, tag: c_int, c: MPI_Comm, _info: MPI_Info, r: *mut MPI_Request) -> Res {
    init(false, buf, parts, count, dt, src, tag, c, r)
}

/// The started partitioned request behind handle `h`.
fn part_of(h: MPI_Request) -> Result<Arc<Part>, MpiErr> {
    let req = request::take(h)?;
    let part = match &req {
        Req::Persistent(p) => match p.active.as_deref() {
            Some(Req::Partitioned(part)) => Ok(part.clone()),
            Some(_) => mpi_err!(MPI_ERR_REQUEST, "{h:#x} is not a partitioned request"),
            None => mpi_err!(MPI_ERR_REQUEST, "partitioned request {h:#x} is not started (MPI_Start)"),
        },
        _ => mpi_err!(MPI_ERR_REQUEST, "{h:#x} is not a partitioned request"),
    };
    request::put_back(h, req);
    part
}

fn on_part(h: MPI_Request, f: impl FnOnce(&Part) -> Res) -> Res {
    crate::state::check_active()?;
    let part = part_of(h)?;
    f(&part).map_err(|e| e.on(part.comm))
}

pub unsafe fn pready(p: c_int, h: MPI_Request) -> Res {
    on_part(h, |part| part.mark_ready(p))
}

pub unsafe fn pready_range(lo: c_int, hi: c_int, h: MPI_Request) -> Res {
    on_part(h, |part| {
        if lo > hi {
            return mpi_err!(MPI_ERR_ARG, "partition_low {lo} is above partition_high {hi}");
        }
        (lo..=hi).try_for_each(|p| part.mark_ready(p))
    })
}

pub unsafe fn pready_list(n: c_int, list: *const c_int, h: MPI_Request) -> Res {
    on_part(h, |part| {
        if n < 0 || (n > 0 && list.is_null()) {
            return mpi_err!(MPI_ERR_ARG, "array_of_partitions is NULL or its length {n} negative");
        }
        // SAFETY: the caller's array of `n` partitions.
        let ps = if n == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(list, n as usize) } };
        ps.iter().try_for_each(|&p| part.mark_ready(p))
    })
}

pub unsafe fn parrived(h: MPI_Request, p: c_int, flag: *mut c_int) -> Res {
    on_part(h, |part| {
        let f = out(flag, "flag")?;
        if part.send {
            return mpi_err!(MPI_ERR_REQUEST, "MPI_Parrived asks a partitioned receive request, not a send");
        }
        if usize::try_from(p).ok().is_none_or(|i| i >= part.parts) {
            return mpi_err!(MPI_ERR_ARG, "partition {p} is not one of the request's 0..{}", part.parts);
        }
        *f = part.is_done() as c_int;
        Ok(())
    })
}
