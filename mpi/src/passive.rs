//! Passive target one-sided communication: MPI_Win_lock / unlock / lock_all / unlock_all /
//! flush*. Every window of several processes has a server thread on a communicator of its own
//! (a dup of the window's): it grants locks (shared or exclusive, first come first served) and
//! applies the records of the transfers made under them (the fence's records, rma.rs),
//! answering with what the gets read. An origin sends each transfer to a locked target at its
//! call (`issue`) without waiting; `flush` and `unlock` wait for the answers of the gets and,
//! when transfers without an answer went since, for the server's confirmation: so a transfer is
//! complete at the target when the flush or unlock after it returns, as the standard says, it
//! progresses while the origin does anything else, and the target process need not call
//! anything.
//!
//! The server sleeps in the engine's wait (spin, then sleep until a peer's doorbell) and ends
//! when the window is freed (a stop request from its own process), or when a process of the
//! window is lost.

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::rma::{self, deadline, Landing, Local, Pending};
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::comm::{Comm, P2pOp};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The first word of an answer whose records the target refused (else the data's length).
const REFUSED: u64 = u64::MAX;

// Tags on the server's communicator.
const REQ: u32 = 0x5054_0001;
const REQ_DATA: u32 = 0x5054_0002;
const GRANT: u32 = 0x5054_0003;
const REPLY: u32 = 0x5054_0004;
const CONFIRM: u32 = 0x5054_0005;

/// A request is a 24-byte header (kind, argument, payload bytes) and its payload: one message
/// up to INLINE bytes (the server keeps a receive of that size posted), else the header alone
/// and the payload as a second message.
const HEADER: usize = 24;
const INLINE: usize = 16 << 10;

// Requests: the first word of a request's header.
const LOCK_SHARED: u64 = 1;
const LOCK_EXCLUSIVE: u64 = 2;
const UNLOCK: u64 = 3;
/// Records to apply; with argument 1, answered (REPLY) with what the gets read.
const DATA: u64 = 4;
const STOP: u64 = 5;
/// Confirm that the records before it are applied (answered on CONFIRM with the number of
/// unanswered batches refused since the last confirmation).
const FLUSH: u64 = 6;

/// The server's wait for the next request has no end but the window's.
const FOREVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A window's server and what this process holds of the others' locks.
pub struct Passive {
    comm: Arc<Comm>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Per window rank: this process holds its lock (lock, or lock_all).
    held: Mutex<Vec<bool>>,
    /// Per window rank: the transfers issued there and not yet known complete.
    issued: Mutex<Vec<Issued>>,
}

/// Transfers sent to one server whose completion a flush must still see.
#[derive(Default)]
struct Issued {
    /// The batches with gets, in order: each one's answer, received as it comes.
    answers: VecDeque<Answer>,
    /// Batches without gets went since the last one with an answer.
    unconfirmed: bool,
}

/// The receive of a batch's answer, posted before the batch went, and where its data lands.
struct Answer {
    op: P2pOp,
    buf: Vec<u8>,
    landings: Vec<Landing>,
}

impl Passive {
    /// Starts the server of a window over `comm` (a communicator of its own), whose memory
    /// here is `local`.
    pub fn start(comm: Arc<Comm>, local: Local) -> Passive {
        comm.set_timeout_ms(FOREVER.as_millis() as i64);
        let c = comm.clone();
        let thread = std::thread::Builder::new()
            .name("distcomm-mpi-rma".into())
            .spawn(move || {
                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve(&c, &local))) {
                    let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
                    eprintln!("distcomm MPI: the one-sided server of a window stopped: internal error ({what})");
                }
            })
            .ok();
        let n = comm.size();
        let issued = Mutex::new((0..n).map(|_| Issued::default()).collect());
        Passive { comm, thread: Mutex::new(thread), held: Mutex::new(vec![false; n]), issued }
    }

    pub fn holds(&self, rank: usize) -> bool {
        lock(&self.held).get(rank).copied().unwrap_or(false)
    }

    pub fn holds_any(&self) -> bool {
        lock(&self.held).iter().any(|&h| h)
    }

    /// MPI_Win_lock: returns once `rank`'s server granted the lock (within `timeout_ms`).
    pub fn lock(&self, rank: usize, exclusive: bool, timeout_ms: i64) -> Res {
        if self.holds(rank) {
            return mpi_err!(MPI_ERR_RMA_SYNC, "this process holds the lock of window rank {rank} already");
        }
        let kind = if exclusive { LOCK_EXCLUSIVE } else { LOCK_SHARED };
        self.ask(rank, GRANT, kind, deadline(timeout_ms), &|| format!("MPI_Win_lock: the lock of window rank {rank}"))?;
        lock(&self.held)[rank] = true;
        Ok(())
    }

    /// Sends request `kind` to `rank`'s server and waits for its 8-byte answer on `tag`.
    fn ask(&self, rank: usize, tag: u32, kind: u64, deadline: Instant, what: &dyn Fn() -> String) -> Result<u64, MpiErr> {
        let mut word = [0u8; 8];
        let op = self.comm.post_recv(MutBuf::from_slice(&mut word), Some(rank), Some(tag)).map_err(MpiErr::from)?;
        request(&self.comm, rank, kind, 0, &[], deadline)?;
        self.comm.wait_p2p(&op, deadline, what).map_err(MpiErr::from)?;
        Ok(u64::from_le_bytes(word))
    }

    /// Sends the transfers queued for `rank` (whose lock this process holds) to its server
    /// without waiting for them to be applied.
    pub fn issue(&self, rank: usize, pending: &mut Pending, timeout_ms: i64) -> Res {
        let (recs, landings) = pending.take_for(rank);
        if recs.is_empty() {
            return Ok(());
        }
        let mut issued = lock(&self.issued);
        let at = &mut issued[rank];
        if landings.is_empty() {
            request(&self.comm, rank, DATA, 0, &recs, deadline(timeout_ms))?;
            at.unconfirmed = true;
            return Ok(());
        }
        // The answer's receive is posted first, so that it lands in place when it comes.
        let mut buf = vec![0u8; 8 + rma::answer_bytes(&landings)];
        let op = self.comm.post_recv(MutBuf::from_slice(&mut buf), Some(rank), Some(REPLY)).map_err(MpiErr::from)?;
        let sent = request(&self.comm, rank, DATA, 1, &recs, deadline(timeout_ms));
        // Kept even if the request failed: the posted receive may still write into `buf`.
        at.answers.push_back(Answer { op, buf, landings });
        sent?;
        // The server answers in order: this answer will confirm what went before it.
        at.unconfirmed = false;
        Ok(())
    }

    /// MPI_Win_flush: the transfers to `rank` applied there, the gets' data unpacked here.
    pub fn flush(&self, rank: usize, pending: &mut Pending, timeout_ms: i64) -> Res {
        self.issue(rank, pending, timeout_ms)?;
        let deadline = deadline(timeout_ms);
        let what = || format!("MPI_Win_flush/unlock: the answer of window rank {rank}");
        let mut issued = lock(&self.issued);
        let at = &mut issued[rank];
        // Every answer is taken even after a refusal, or the next flush would read it.
        let mut first: Res = Ok(());
        while let Some(a) = at.answers.front() {
            self.comm.wait_p2p(&a.op, deadline, &what).map_err(MpiErr::from)?;
            let Some(a) = at.answers.pop_front() else { break };
            match u64::from_le_bytes(a.buf[..8].try_into().expect("8 bytes")) {
                REFUSED => first = first.and(Err(rma::refused(rank))),
                len => rma::land(&a.landings, &a.buf[8..(8 + len as usize).min(a.buf.len())]),
            }
        }
        if std::mem::take(&mut at.unconfirmed) && self.ask(rank, CONFIRM, FLUSH, deadline, &what)? > 0 {
            first = first.and(Err(rma::refused(rank)));
        }
        first
    }

    /// MPI_Win_unlock: flush, then the lock given back.
    pub fn unlock(&self, rank: usize, pending: &mut Pending, timeout_ms: i64) -> Res {
        if !self.holds(rank) {
            return mpi_err!(MPI_ERR_RMA_SYNC, "this process does not hold the lock of window rank {rank}");
        }
        // Transfers the target refused (a dynamic window's memory not attached there) are done
        // all the same: the lock is given back and the refusal reported.
        let flushed = self.flush(rank, pending, timeout_ms);
        if flushed.as_ref().is_err_and(|e| e.class != MPI_ERR_RMA_RANGE) {
            return flushed;
        }
        request(&self.comm, rank, UNLOCK, 0, &[], deadline(timeout_ms))?;
        lock(&self.held)[rank] = false;
        flushed
    }

    /// Stops this process's server (the window is being freed; every process has left its
    /// epochs: the caller synchronised them).
    pub fn stop(&self) {
        let me = self.comm.rank();
        let _ = request(&self.comm, me, STOP, 0, &[], Instant::now() + Duration::from_secs(30));
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        self.comm.destroy();
    }
}

impl Drop for Passive {
    fn drop(&mut self) {
        // An answer never waited for (its flush failed): its receive may still be posted, so
        // its buffer is left to it.
        for at in lock(&self.issued).iter_mut() {
            at.answers.drain(..).for_each(|a| std::mem::forget(a.buf));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends a request (its header and `payload`, see INLINE) to `rank`'s server; returns once
/// sent.
fn request(comm: &Comm, rank: usize, kind: u64, arg: u64, payload: &[u8], deadline: Instant) -> Res {
    let inline = HEADER + payload.len() <= INLINE;
    let mut msg = Vec::with_capacity(if inline { HEADER + payload.len() } else { HEADER });
    for w in [kind, arg, payload.len() as u64] {
        msg.extend_from_slice(&w.to_le_bytes());
    }
    let what = || format!("a one-sided request to window rank {rank}");
    let send = |bytes: &[u8], tag| -> Res {
        let op = comm.post_send(ConstBuf::from_slice(bytes), rank, tag).map_err(MpiErr::from)?;
        comm.wait_p2p(&op, deadline, &what).map_err(MpiErr::from)?;
        Ok(())
    };
    if inline {
        msg.extend_from_slice(payload);
        return send(&msg, REQ);
    }
    send(&msg, REQ)?;
    send(payload, REQ_DATA)
}

/// Sends `bytes` to `to` with `tag` and waits for it to go.
fn answer(comm: &Comm, to: usize, tag: u32, bytes: &[u8]) -> Result<(), distcomm::Error> {
    let op = comm.post_send(ConstBuf::from_slice(bytes), to, tag)?;
    comm.wait_p2p(&op, Instant::now() + FOREVER, &|| format!("a one-sided answer to window rank {to}")).map(|_| ())
}

/// Who holds this process's lock.
#[derive(Default)]
struct Lock {
    exclusive: Option<usize>,
    shared: usize,
    waiting: VecDeque<(usize, bool)>,
}

impl Lock {
    fn grantable(&self, exclusive: bool) -> bool {
        self.exclusive.is_none() && (!exclusive || self.shared == 0)
    }
    fn take(&mut self, origin: usize, exclusive: bool) {
        if exclusive {
            self.exclusive = Some(origin);
        } else {
            self.shared += 1;
        }
    }
    fn release(&mut self, origin: usize) {
        if self.exclusive == Some(origin) {
            self.exclusive = None;
        } else {
            self.shared = self.shared.saturating_sub(1);
        }
    }
}

/// The server: requests in arrival order until a stop (or a lost process) ends it.
fn serve(comm: &Comm, local: &Local) {
    let mut lk = Lock::default();
    // Per origin: records refused since its last confirmation (batches without an answer).
    let mut refused = vec![0u64; comm.size()];
    let mut msg = vec![0u8; INLINE];
    loop {
        let Ok(op) = comm.post_recv(MutBuf::from_slice(&mut msg), None, Some(REQ)) else { return };
        let Ok(done) = comm.wait_p2p(&op, Instant::now() + FOREVER, &|| "the one-sided server's next request".to_string()) else { return };
        let origin = comm.comm_rank_of(done.source);
        if origin < 0 {
            return;
        }
        let origin = origin as usize;
        let got = done.bytes.min(INLINE);
        if got < HEADER {
            continue;
        }
        let word = |i: usize| u64::from_le_bytes(msg[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        let (kind, arg, len) = (word(0), word(1), word(2) as usize);
        let separate;
        let recs = if got == HEADER && len > 0 {
            let what = || "a one-sided request's records".to_string();
            let Ok(v) = rma::recv_bytes(comm, origin, REQ_DATA, len, Instant::now() + FOREVER, &what) else { return };
            separate = v;
            &separate[..]
        } else {
            &msg[HEADER..got]
        };
        let r = match kind {
            LOCK_SHARED | LOCK_EXCLUSIVE => {
                let exclusive = kind == LOCK_EXCLUSIVE;
                if lk.waiting.is_empty() && lk.grantable(exclusive) {
                    lk.take(origin, exclusive);
                    answer(comm, origin, GRANT, &[0u8; 8])
                } else {
                    lk.waiting.push_back((origin, exclusive));
                    Ok(())
                }
            }
            UNLOCK => {
                lk.release(origin);
                let mut r = Ok(());
                while let Some(&(o, ex)) = lk.waiting.front() {
                    if !lk.grantable(ex) {
                        break;
                    }
                    lk.waiting.pop_front();
                    lk.take(o, ex);
                    r = r.and(answer(comm, o, GRANT, &[0u8; 8]));
                }
                r
            }
            DATA => {
                // A malformed or out-of-range record is refused (for a dynamic window only the
                // target can tell): answered REFUSED, or counted for the confirmation.
                let applied = rma::apply(local, recs);
                match (arg, applied) {
                    (0, applied) => {
                        refused[origin] += applied.is_err() as u64;
                        Ok(())
                    }
                    (_, Ok(read)) => answer(comm, origin, REPLY, &[&(read.len() as u64).to_le_bytes()[..], &read].concat()),
                    (_, Err(_)) => answer(comm, origin, REPLY, &REFUSED.to_le_bytes()),
                }
            }
            FLUSH => answer(comm, origin, CONFIRM, &std::mem::take(&mut refused[origin]).to_le_bytes()),
            STOP if origin == comm.rank() => return,
            _ => Ok(()),
        };
        if r.is_err() {
            return;
        }
    }
}
