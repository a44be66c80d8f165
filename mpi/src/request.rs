//! MPI requests: integer handles (REQ_BASE + slot) for pending sends, receives and
//! collectives; completion fills MPI_Status (source, tag, and the byte count in MPI_internal).

use crate::abi_gen::*;
use crate::err::{from_engine, MpiErr};
use crate::state::{CommRef, MpiComm};
use distcomm::comm::P2pOp;
use distcomm::completion::LazyDeadline;
use std::ffi::c_int;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const REQ_BASE: usize = 0x3000_0000;

pub enum Req {
    /// Finished when made (MPI_PROC_NULL): its status.
    Done(MPI_Status),
    Send { comm: CommRef, op: P2pOp },
    Recv { comm: CommRef, op: P2pOp },
    /// A non-blocking collective or task on the engine; `after` runs once it succeeded; a
    /// task's MPI error waits in `err` (see task.rs).
    Coll { comm: CommRef, req: distcomm::request::Request, after: Option<Box<dyn FnOnce() + Send>>, err: Option<crate::task::ErrSlot> },
    /// A persistent request (MPI_Send_init, Recv_init, ...): inactive, or started.
    Persistent(Box<Persistent>),
    /// A receive and a send as one request (MPI_Isendrecv).
    Pair(Box<Pair>),
    /// A send or receive of a non-dense datatype, on packed bytes of ours.
    Packed(Box<crate::packing::Packed>),
    /// The program's own operation (MPI_Grequest_start).
    Generalized(crate::greq::Greq),
    /// A started partitioned send or receive (MPI_Psend_init, MPI_Precv_init).
    Partitioned(std::sync::Arc<crate::partitioned::Part>),
}

/// Done when both are; the receive's status. `keep` holds what the send sends from when it is
/// a copy (MPI_Isendrecv_replace).
pub struct Pair {
    pub recv: Req,
    pub send: Req,
    pub keep: Vec<u8>,
}

/// What MPI_Start starts (again and again), and the operation it started last, until a
/// completion call finishes it (the request then stays, inactive).
pub struct Persistent {
    pub comm: CommRef,
    pub start: Box<dyn Fn() -> Result<Req, MpiErr> + Send>,
    pub active: Option<Box<Req>>,
}

/// A request slot. A request being looked at or waited on is `Out` (taken by one thread): its
/// slot is not reused by another thread's new request meanwhile (MPI_THREAD_MULTIPLE), so a
/// `put_back` never lands on someone else's request.
enum Slot {
    Free,
    Out,
    In(Req),
}

static SLOTS: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn add(r: Req) -> MPI_Request {
    let mut s = lock(&SLOTS);
    let slot = s.iter().position(|x| matches!(x, Slot::Free)).unwrap_or_else(|| {
        s.push(Slot::Free);
        s.len() - 1
    });
    s[slot] = Slot::In(r);
    REQ_BASE + slot
}

/// Takes the request out of its slot (the caller completes it and `release`s the handle, or
/// puts it back).
pub fn take(h: MPI_Request) -> Result<Req, MpiErr> {
    let mut s = lock(&SLOTS);
    let Some(slot) = h.checked_sub(REQ_BASE).and_then(|i| s.get_mut(i)) else {
        return crate::mpi_err!(MPI_ERR_REQUEST, "{h:#x} is not a valid request (never made)");
    };
    match std::mem::replace(slot, Slot::Out) {
        Slot::In(r) => Ok(r),
        Slot::Out => crate::mpi_err!(MPI_ERR_REQUEST, "request {h:#x} is being completed by another thread (a request may be completed by one thread only)"),
        Slot::Free => {
            *slot = Slot::Free;
            crate::mpi_err!(MPI_ERR_REQUEST, "{h:#x} is not a valid request (already completed or freed)")
        }
    }
}

pub fn put_back(h: MPI_Request, r: Req) {
    lock(&SLOTS)[h - REQ_BASE] = Slot::In(r);
}

/// The handle of a request that was taken is free for new requests.
pub fn release(h: MPI_Request) {
    lock(&SLOTS)[h - REQ_BASE] = Slot::Free;
}

/// Waits for request `*h` and gives its status: the handle becomes MPI_REQUEST_NULL, except a
/// persistent request's, which stays and is inactive again (an inactive one gives the empty
/// status at once, as the standard says).
pub fn complete(h: &mut MPI_Request) -> Result<MPI_Status, MpiErr> {
    match take(*h)? {
        Req::Persistent(mut p) => {
            let started = p.active.take();
            put_back(*h, Req::Persistent(p));
            started.map_or(Ok(empty_status()), |r| r.finish())
        }
        r => {
            release(*h);
            *h = MPI_REQUEST_NULL;
            r.finish()
        }
    }
}

/// Whether `h` is an active request: not MPI_REQUEST_NULL and not an inactive persistent one
/// (Waitany, Testany, Waitsome and Testsome pass over those).
pub fn is_active(h: MPI_Request) -> Result<bool, MpiErr> {
    if h == MPI_REQUEST_NULL {
        return Ok(false);
    }
    let r = take(h)?;
    let active = !matches!(&r, Req::Persistent(p) if p.active.is_none());
    put_back(h, r);
    Ok(active)
}

/// A status that says its receive was cancelled (MPI_Test_cancelled reads it).
pub fn cancelled_status() -> MPI_Status {
    let mut st = empty_status();
    st.MPI_internal[2] = 1;
    st
}

pub fn empty_status() -> MPI_Status {
    MPI_Status { MPI_SOURCE: MPI_ANY_SOURCE, MPI_TAG: MPI_ANY_TAG, MPI_ERROR: MPI_SUCCESS, MPI_internal: [0; 5] }
}

pub fn set_count(st: &mut MPI_Status, bytes: usize) {
    st.MPI_internal[0] = bytes as u32 as c_int;
    st.MPI_internal[1] = ((bytes as u64) >> 32) as u32 as c_int;
}

pub fn count_of(st: &MPI_Status) -> u64 {
    (st.MPI_internal[0] as u32 as u64) | ((st.MPI_internal[1] as u32 as u64) << 32)
}

pub fn proc_null_status() -> MPI_Status {
    MPI_Status { MPI_SOURCE: MPI_PROC_NULL, MPI_TAG: MPI_ANY_TAG, MPI_ERROR: MPI_SUCCESS, MPI_internal: [0; 5] }
}

fn recv_error(e: distcomm::Error) -> MpiErr {
    if e.status == distcomm::Status::InvalidArgument {
        MpiErr::new(MPI_ERR_TRUNCATE, format!("message truncated: {}", e.msg))
    } else {
        from_engine(&e)
    }
}

impl Req {
    pub fn comm(&self) -> Option<&CommRef> {
        match self {
            Req::Done(_) | Req::Generalized(_) => None,
            Req::Send { comm, .. } | Req::Recv { comm, .. } | Req::Coll { comm, .. } => Some(comm),
            Req::Persistent(p) => Some(&p.comm),
            Req::Pair(p) => p.recv.comm().or(p.send.comm()),
            Req::Packed(p) => p.inner.comm(),
            Req::Partitioned(p) => Some(p.comm()),
        }
    }

    pub fn is_done(&self) -> bool {
        match self {
            Req::Done(_) => true,
            Req::Send { comm, op } | Req::Recv { comm, op } => comm.comm.p2p_is_done(op),
            Req::Coll { req, .. } => req.is_completed(),
            Req::Persistent(p) => p.active.as_ref().is_none_or(|r| r.is_done()),
            Req::Pair(p) => p.recv.is_done() && p.send.is_done(),
            Req::Packed(p) => p.inner.is_done(),
            Req::Generalized(g) => g.is_done(),
            Req::Partitioned(p) => p.is_done(),
        }
    }

    /// MPI_Request_get_status: the status if the request has completed, without freeing it
    /// (a collective's follow-up step runs now, so its buffers are final).
    pub fn peek(&mut self) -> Option<Result<MPI_Status, MpiErr>> {
        if !self.is_done() {
            return None;
        }
        let mut st = empty_status();
        match self {
            Req::Done(s) => return Some(Ok(*s)),
            Req::Generalized(g) => return g.peek(),
            Req::Partitioned(p) => return p.peek(),
            Req::Persistent(p) => return p.active.as_mut().map_or(Some(Ok(st)), |r| r.peek()),
            Req::Pair(p) => {
                if let Some(Err(e)) = p.send.peek() {
                    return Some(Err(e));
                }
                return p.recv.peek();
            }
            Req::Packed(p) => {
                let r = p.inner.peek();
                if let Some(Ok(st)) = &r {
                    // Unpacked once, the first time the completed receive is looked at.
                    if let Some(u) = p.unpack.take() {
                        u.run(&p.buf[..(count_of(st) as usize).min(p.buf.len())]);
                    }
                }
                return r;
            }
            Req::Send { comm, op } => {
                if let Some(Err(e)) = comm.comm.p2p_result(op) {
                    return Some(Err(from_engine(&e).on(comm.handle)));
                }
            }
            Req::Recv { comm, op } => match comm.comm.p2p_result(op)? {
                Err(e) => return Some(Err(recv_error(e).on(comm.handle))),
                Ok(d) => {
                    st.MPI_SOURCE = comm.comm.comm_rank_of(d.source);
                    st.MPI_TAG = d.tag as c_int;
                    set_count(&mut st, d.bytes);
                }
            },
            Req::Coll { comm, req, after, err } => {
                if let Err(e) = req.wait() {
                    return Some(Err(crate::task::error_of(err, &e).on(comm.handle)));
                }
                if let Some(f) = after.take() {
                    f();
                }
            }
        }
        Some(Ok(st))
    }

    /// Waits (up to the comm's timeout) and gives the status, or the error routed to the comm.
    pub fn finish(self) -> Result<MPI_Status, MpiErr> {
        // A request of no communicator (a generalized one) waits up to the world's timeout.
        let of_world = || crate::state::world_timeout_ms().unwrap_or(0);
        let deadline = LazyDeadline::new(self.comm().map_or_else(of_world, |c| c.comm.timeout_ms()));
        self.finish_by(&deadline)
    }

    /// `finish`, every wait up to `deadline` (one call's, shared by all it waits for).
    pub fn finish_by(self, deadline: &LazyDeadline) -> Result<MPI_Status, MpiErr> {
        let st = empty_status();
        match self {
            Req::Done(s) => return Ok(s),
            Req::Generalized(g) => return g.finish_by(deadline),
            Req::Partitioned(p) => return p.finish_by(deadline),
            Req::Persistent(p) => return p.active.map_or(Ok(st), |r| r.finish_by(deadline)),
            Req::Pair(p) => {
                let Pair { recv, send, keep } = *p;
                let r = finish_pair(recv, send, deadline);
                drop(keep);
                return r;
            }
            Req::Packed(p) => {
                let crate::packing::Packed { inner, buf, unpack } = *p;
                let st = inner.finish_by(deadline)?;
                if let Some(u) = unpack {
                    u.run(&buf[..(count_of(&st) as usize).min(buf.len())]);
                }
                return Ok(st);
            }
            Req::Send { comm, op } => finish_send_by(&comm, op, deadline)?,
            Req::Recv { comm, op } => return finish_recv_by(&comm, op, deadline),
            Req::Coll { comm, req, after, err } => {
                req.wait().map_err(|e| crate::task::error_of(&err, &e).on(comm.handle))?;
                drop(req);
                if let Some(f) = after {
                    f();
                }
            }
        }
        Ok(st)
    }
}

/// Waits for a send started on `comm` up to `deadline` (one call's, shared by its operations).
pub fn finish_send_by(comm: &MpiComm, mut op: P2pOp, deadline: &LazyDeadline) -> Result<(), MpiErr> {
    let r = comm.comm.wait_p2p_by(&op, &|| deadline.get(), &|| "MPI send".to_string());
    op.release();
    r.map(|_| ()).map_err(|e| from_engine(&e).on(comm.handle))
}

/// Waits for a receive started on `comm` up to `deadline` (one call's, shared by its
/// operations); its status.
pub fn finish_recv_by(comm: &MpiComm, mut op: P2pOp, deadline: &LazyDeadline) -> Result<MPI_Status, MpiErr> {
    let r = comm.comm.wait_p2p_by(&op, &|| deadline.get(), &|| "MPI receive".to_string());
    op.release();
    recv_status(comm, r)
}

/// A receive's status, or its error through `comm`'s handle.
#[inline(always)]
pub fn recv_status(comm: &MpiComm, r: distcomm::Result<distcomm::completion::Done>) -> Result<MPI_Status, MpiErr> {
    let d = r.map_err(|e| recv_error(e).on(comm.handle))?;
    let mut st = empty_status();
    st.MPI_SOURCE = comm.comm.comm_rank_of(d.source);
    st.MPI_TAG = d.tag as c_int;
    set_count(&mut st, d.bytes);
    Ok(st)
}

/// A blocking receive on `comm` up to `deadline` (see `Comm::recv_blocking`: a small message
/// from a peer of our host may be taken straight from its ring); its status.
#[inline(always)]
pub fn recv_blocking(comm: &MpiComm, buf: distcomm::buffer::MutBuf, src: Option<usize>, tag: Option<u32>, deadline: &LazyDeadline) -> Result<MPI_Status, MpiErr> {
    recv_status(comm, comm.comm.recv_blocking(buf, src, tag, &|| deadline.get(), &|| "MPI receive".to_string()))
}

/// Withdraws a receive started on `comm`, for a call that fails after starting it.
pub fn withdraw_recv(comm: &MpiComm, op: &P2pOp) {
    comm.comm.cancel_p2p(op, || distcomm::Error::new(distcomm::Status::Aborted, "withdrawn: the call failed"));
}

/// Both halves of a send-receive within one deadline. A failed send withdraws the receive if it
/// is still open (it would take a later message) and is the error reported; otherwise the
/// receive's error or status.
pub fn finish_pair(recv: Req, send: Req, deadline: &LazyDeadline) -> Result<MPI_Status, MpiErr> {
    let sent = send.finish_by(deadline);
    if sent.is_err() {
        recv.withdraw();
    }
    let got = recv.finish_by(deadline);
    sent.and(got)
}

impl Req {
    /// Withdraws a receive still open, for a call that fails after starting it (the request
    /// still has to be finished or dropped).
    pub fn withdraw(&self) {
        match self {
            Req::Recv { comm, op } => withdraw_recv(comm, op),
            Req::Packed(p) => p.inner.withdraw(),
            _ => {}
        }
    }

    /// Withdraws a receive that was just started and drops it (the packed buffer goes after
    /// the receive into it is withdrawn).
    pub fn cancel_now(self) {
        self.withdraw();
    }
}

/// A waiting loop over several requests: spins briefly, then sleeps in growing steps (up to
/// 1 ms) so that a rank blocked for long does not hold a core; gives up at `deadline`.
pub struct Backoff {
    start: Instant,
    deadline: Instant,
    sleep: Duration,
}

impl Backoff {
    pub fn new(timeout_ms: i64) -> Backoff {
        let now = Instant::now();
        let t = if timeout_ms <= 0 { Duration::from_secs(300) } else { Duration::from_millis(timeout_ms as u64) };
        Backoff { start: now, deadline: now + t, sleep: Duration::from_micros(10) }
    }

    pub fn pause(&mut self) -> Result<(), MpiErr> {
        let now = Instant::now();
        if now >= self.deadline {
            return crate::mpi_err!(MPI_ERR_OTHER, "timed out after {} ms waiting for requests (DC_TIMEOUT_MS)", (now - self.start).as_millis());
        }
        if now - self.start < Duration::from_micros(200) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep);
            self.sleep = (self.sleep * 2).min(Duration::from_millis(1));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(tag: c_int) -> Req {
        let mut st = empty_status();
        st.MPI_TAG = tag;
        Req::Done(st)
    }

    /// Threads that look at their requests (take and put back, as MPI_Test does) while others
    /// make new ones: a handle always names the request it was made for (a slot taken out is
    /// not handed to a new request meanwhile).
    #[test]
    fn handles_stay_theirs_while_threads_take_and_put_back() {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..2000 {
                        let tag = t * 100_000 + i;
                        let mut h = add(done(tag));
                        for _ in 0..3 {
                            let r = take(h).expect("our request");
                            assert!(matches!(&r, Req::Done(s) if s.MPI_TAG == tag));
                            std::thread::yield_now();
                            put_back(h, r);
                        }
                        let st = complete(&mut h).expect("completes");
                        assert_eq!((st.MPI_TAG, h), (tag, MPI_REQUEST_NULL));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_request_taken_by_one_thread_is_refused_to_another() {
        let h = add(done(1));
        let r = take(h).unwrap();
        let e = take(h).err().expect("refused while out");
        assert!(e.class == MPI_ERR_REQUEST && e.msg.contains("another thread"), "{}", e.msg);
        put_back(h, r);
        let mut h2 = h;
        complete(&mut h2).unwrap();
    }
}
