//! Passive target one-sided communication: MPI_Win_lock / unlock / lock_all / unlock_all /
//! flush*. Every window of several processes has a server thread on a communicator of its own
//! (a dup of the window's): it grants locks (shared or exclusive, first come first served) and
//! applies the records of the transfers made under them (the fence's records, rma.rs),
//! answering with what the gets read. An origin queues its transfers to a locked target as in
//! an epoch and sends them at `flush` or `unlock`, waiting for the answer: so a transfer is
//! complete at the target when the flush or unlock that carries it returns, as the standard
//! says, and the target process need not call anything.
//!
//! The server sleeps in the engine's wait (spin, then sleep until a peer's doorbell) and ends
//! when the window is freed (a stop request from its own process), or when a process of the
//! window is lost.

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::rma::{self, deadline, Local, Pending};
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::comm::Comm;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The reply length that says the target refused the records (see `serve`).
const REFUSED: u64 = u64::MAX;

// Tags on the server's communicator.
const REQ: u32 = 0x5054_0001;
const REQ_DATA: u32 = 0x5054_0002;
const GRANT: u32 = 0x5054_0003;
const REPLY: u32 = 0x5054_0004;

// Requests: the first word of a request's 24-byte header (kind, argument, payload bytes).
const LOCK_SHARED: u64 = 1;
const LOCK_EXCLUSIVE: u64 = 2;
const UNLOCK: u64 = 3;
const DATA: u64 = 4;
const STOP: u64 = 5;

/// The server's wait for the next request has no end but the window's.
const FOREVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A window's server and what this process holds of the others' locks.
pub struct Passive {
    comm: Arc<Comm>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Per window rank: this process holds its lock (lock, or lock_all).
    held: Mutex<Vec<bool>>,
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
        Passive { comm, thread: Mutex::new(thread), held: Mutex::new(vec![false; n]) }
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
        let deadline = deadline(timeout_ms);
        let mut grant = [0u8; 8];
        let op = self.comm.post_recv(MutBuf::from_slice(&mut grant), Some(rank), Some(GRANT)).map_err(MpiErr::from)?;
        request(&self.comm, rank, if exclusive { LOCK_EXCLUSIVE } else { LOCK_SHARED }, &[], deadline)?;
        self.comm.wait_p2p(&op, deadline, &|| format!("MPI_Win_lock: the lock of window rank {rank}")).map_err(MpiErr::from)?;
        lock(&self.held)[rank] = true;
        Ok(())
    }

    /// MPI_Win_flush: the transfers queued for `rank` carried and applied there, the gets'
    /// data unpacked here.
    pub fn flush(&self, rank: usize, pending: &mut Pending, timeout_ms: i64) -> Res {
        let (recs, landings) = pending.take_for(rank);
        if recs.is_empty() {
            return Ok(());
        }
        let deadline = deadline(timeout_ms);
        let what = || format!("MPI_Win_flush/unlock: the answer of window rank {rank}");
        let mut len = [0u8; 8];
        let op = self.comm.post_recv(MutBuf::from_slice(&mut len), Some(rank), Some(REPLY)).map_err(MpiErr::from)?;
        request(&self.comm, rank, DATA, &recs, deadline)?;
        self.comm.wait_p2p(&op, deadline, &what).map_err(MpiErr::from)?;
        let len = u64::from_le_bytes(len);
        if len == REFUSED {
            return Err(rma::refused(rank));
        }
        let data = rma::recv_bytes(&self.comm, rank, REPLY, len as usize, deadline, &what).map_err(MpiErr::from)?;
        rma::land(&landings, &data);
        Ok(())
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
        request(&self.comm, rank, UNLOCK, &[], deadline(timeout_ms))?;
        lock(&self.held)[rank] = false;
        flushed
    }

    /// Stops this process's server (the window is being freed; every process has left its
    /// epochs: the caller synchronised them).
    pub fn stop(&self) {
        let me = self.comm.rank();
        let _ = request(&self.comm, me, STOP, &[], Instant::now() + Duration::from_secs(30));
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        self.comm.destroy();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends a request (header, then `payload` if any) to `rank`'s server; returns once sent.
fn request(comm: &Comm, rank: usize, kind: u64, payload: &[u8], deadline: Instant) -> Res {
    let hdr: Vec<u8> = [kind, 0, payload.len() as u64].iter().flat_map(|x| x.to_le_bytes()).collect();
    let what = || format!("a one-sided request to window rank {rank}");
    let op = comm.post_send(ConstBuf::from_slice(&hdr), rank, REQ).map_err(MpiErr::from)?;
    comm.wait_p2p(&op, deadline, &what).map_err(MpiErr::from)?;
    if !payload.is_empty() {
        let op = comm.post_send(ConstBuf::from_slice(payload), rank, REQ_DATA).map_err(MpiErr::from)?;
        comm.wait_p2p(&op, deadline, &what).map_err(MpiErr::from)?;
    }
    Ok(())
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
    loop {
        let mut hdr = [0u8; 24];
        let Ok(op) = comm.post_recv(MutBuf::from_slice(&mut hdr), None, Some(REQ)) else { return };
        let Ok(done) = comm.wait_p2p(&op, Instant::now() + FOREVER, &|| "the one-sided server's next request".to_string()) else { return };
        let origin = comm.comm_rank_of(done.source);
        if origin < 0 {
            return;
        }
        let origin = origin as usize;
        let word = |i: usize| u64::from_le_bytes(hdr[8 * i..8 * i + 8].try_into().unwrap());
        let (kind, len) = (word(0), word(2) as usize);
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
                let what = || "a one-sided request's records".to_string();
                rma::recv_bytes(comm, origin, REQ_DATA, len, Instant::now() + FOREVER, &what).and_then(|recs| {
                    // A malformed or out-of-range record is answered REFUSED (for a dynamic
                    // window only the target can tell), or its origin would wait.
                    let Ok(reply) = rma::apply(local, &recs) else {
                        return answer(comm, origin, REPLY, &REFUSED.to_le_bytes());
                    };
                    answer(comm, origin, REPLY, &(reply.len() as u64).to_le_bytes())?;
                    if reply.is_empty() { Ok(()) } else { answer(comm, origin, REPLY, &reply) }
                })
            }
            STOP if origin == comm.rank() => return,
            _ => Ok(()),
        };
        if r.is_err() {
            return;
        }
    }
}
