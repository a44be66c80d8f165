//! Generalized active target synchronization: MPI_Win_post / start / complete / wait / test.
//!
//! An access epoch's transfers are the fence's records (rma.rs), carried point to point on the
//! window's own communicator instead of by a collective: `complete` sends each target of the
//! epoch its records (an 8-byte length, then the bytes), the target's `wait` (or `test`)
//! applies them and answers with what the gets read (length, then bytes), and `complete`
//! unpacks those answers. A `post` sends each origin of the exposure epoch a token that
//! `complete` waits for before it sends.
//!
//! Nothing here waits without serving: while a process waits (for tokens or answers in
//! `complete`, for records in `wait`) it also applies the records its own exposure epoch
//! receives, so two processes that are each other's origin and target never wait for each
//! other; `start` does not block at all. Sends are never waited for on the spot either (a
//! large one completes only once its receiver reads it): they are kept until they finish.

use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::rma::{self, Landing, Local, Pending};
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::comm::{Comm, P2pOp};
use std::time::Instant;

// Tags on the window's private communicator (nothing else is sent on it).
const POST: u32 = 0x5057_0001;
const DATA: u32 = 0x5057_0002;
const REPLY: u32 = 0x5057_0003;

/// A receive of one 8-byte length, its buffer boxed so it stays put while the op is pending.
struct LenRecv {
    op: P2pOp,
    buf: Box<[u8; 8]>,
}

impl LenRecv {
    fn post(comm: &Comm, from: usize, tag: u32) -> Result<LenRecv, MpiErr> {
        let mut buf = Box::new([0u8; 8]);
        let op = comm.post_recv(MutBuf::from_slice(&mut buf[..]), Some(from), Some(tag)).map_err(MpiErr::from)?;
        Ok(LenRecv { op, buf })
    }
    fn len(&self) -> usize {
        u64::from_le_bytes(*self.buf) as usize
    }
}

/// The epochs of one window and this process's sends still in flight.
#[derive(Default)]
pub struct Epochs {
    /// Origins of the open exposure epoch (window ranks) and, for each, the pending receive of
    /// its records' length (None once its records are applied).
    exposure: Option<Vec<(usize, Option<LenRecv>)>>,
    /// Targets of the open access epoch and, for each, the pending receive of its post token.
    access: Option<Vec<(usize, Option<LenRecv>)>>,
    sending: Vec<(P2pOp, Vec<u8>)>,
}

impl Epochs {
    pub fn is_access_target(&self, rank: usize) -> bool {
        self.access.as_ref().is_some_and(|a| a.iter().any(|(t, _)| *t == rank))
    }

    pub fn is_open(&self) -> bool {
        self.exposure.is_some() || self.access.is_some()
    }
}

/// Sends `bytes` to `to` as a length and (if any) the bytes, kept until the sends finish.
fn send(comm: &Comm, e: &mut Epochs, to: usize, tag: u32, bytes: Vec<u8>) -> Res {
    let len = (bytes.len() as u64).to_le_bytes().to_vec();
    for part in [len, bytes] {
        if part.is_empty() {
            continue;
        }
        let op = comm.post_send(ConstBuf::from_slice(&part), to, tag).map_err(MpiErr::from)?;
        e.sending.push((op, part));
    }
    Ok(())
}

/// Receives `len` bytes that follow a length from `from` (sent right after it).
fn recv_bytes(comm: &Comm, from: usize, tag: u32, len: usize, deadline: Instant) -> Result<Vec<u8>, MpiErr> {
    let mut v = vec![0u8; len];
    if len > 0 {
        let op = comm.post_recv(MutBuf::from_slice(&mut v), Some(from), Some(tag)).map_err(MpiErr::from)?;
        comm.wait_p2p(&op, deadline, &|| format!("MPI_Win_complete/wait: the one-sided data of window rank {from}")).map_err(MpiErr::from)?;
    }
    Ok(v)
}

/// One round of progress: finished sends dropped, the records of every origin that sent them
/// applied and answered. Returns whether anything happened.
fn serve(comm: &Comm, local: &Local, e: &mut Epochs, deadline: Instant) -> Result<bool, MpiErr> {
    let before = e.sending.len();
    e.sending.retain(|(op, _)| !comm.p2p_is_done(op));
    let mut moved = e.sending.len() != before;
    let mut replies = Vec::new();
    if let Some(ex) = e.exposure.as_mut() {
        for (origin, pending) in ex.iter_mut() {
            let Some(r) = pending.as_ref().filter(|r| comm.p2p_is_done(&r.op)) else { continue };
            comm.p2p_result(&r.op).expect("finished").map_err(MpiErr::from)?;
            let recs = recv_bytes(comm, *origin, DATA, r.len(), deadline)?;
            *pending = None;
            replies.push((*origin, rma::apply(local, &recs)));
            moved = true;
        }
    }
    let mut first: Res = Ok(());
    for (origin, r) in replies {
        // An origin always gets its answer (empty when applying failed), or it would wait.
        let reply = r.unwrap_or_else(|err| {
            if first.is_ok() {
                first = Err(err);
            }
            Vec::new()
        });
        send(comm, e, origin, REPLY, reply)?;
    }
    first.map(|_| moved)
}

/// Serves until `done` says so, honouring the communicator's timeout.
fn serve_until(comm: &Comm, local: &Local, e: &mut Epochs, what: &str, mut done: impl FnMut(&Comm, &mut Epochs) -> bool) -> Res {
    let deadline = comm.op_deadline();
    let mut idle = 0u32;
    loop {
        let moved = serve(comm, local, e, deadline)?;
        if done(comm, e) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return mpi_err!(crate::abi_gen::MPI_ERR_OTHER, "{what}: timed out (DC_TIMEOUT_MS) waiting for the other processes of the epoch");
        }
        idle = if moved { 0 } else { idle.saturating_add(1) };
        match idle {
            0..=200 => std::hint::spin_loop(),
            201..=2000 => std::thread::yield_now(),
            _ => std::thread::sleep(std::time::Duration::from_micros(50)),
        }
    }
}

/// MPI_Win_post: opens an exposure epoch for `origins` and tells each of them.
pub fn post(comm: &Comm, e: &mut Epochs, origins: Vec<usize>) -> Res {
    if e.exposure.is_some() {
        return mpi_err!(crate::abi_gen::MPI_ERR_RMA_SYNC, "an exposure epoch is already open on this window (MPI_Win_post without MPI_Win_wait)");
    }
    let mut ex = Vec::with_capacity(origins.len());
    for &o in &origins {
        ex.push((o, Some(LenRecv::post(comm, o, DATA)?)));
    }
    e.exposure = Some(ex);
    for o in origins {
        send(comm, e, o, POST, Vec::new())?;
    }
    Ok(())
}

/// MPI_Win_start: opens an access epoch to `targets` (their tokens are awaited by complete).
pub fn start(comm: &Comm, e: &mut Epochs, targets: Vec<usize>) -> Res {
    if e.access.is_some() {
        return mpi_err!(crate::abi_gen::MPI_ERR_RMA_SYNC, "an access epoch is already open on this window (MPI_Win_start without MPI_Win_complete)");
    }
    let mut acc = Vec::with_capacity(targets.len());
    for t in targets {
        acc.push((t, Some(LenRecv::post(comm, t, POST)?)));
    }
    e.access = Some(acc);
    Ok(())
}

/// MPI_Win_complete: every target's post seen, its records sent, its answers unpacked.
pub fn complete(comm: &Comm, local: &Local, e: &mut Epochs, pending: &mut Pending) -> Res {
    let Some(targets) = e.access.take() else {
        return mpi_err!(crate::abi_gen::MPI_ERR_RMA_SYNC, "no access epoch is open on this window (MPI_Win_complete without MPI_Win_start)");
    };
    let (order, tokens): (Vec<usize>, Vec<Option<LenRecv>>) = targets.into_iter().unzip();
    serve_until(comm, local, e, "MPI_Win_complete", |c, _| tokens.iter().flatten().all(|r| c.p2p_is_done(&r.op)))?;
    let mut answers: Vec<(usize, Vec<Landing>, LenRecv)> = Vec::with_capacity(order.len());
    for &t in &order {
        let (recs, landings) = pending.take_for(t);
        let reply = LenRecv::post(comm, t, REPLY)?;
        send(comm, e, t, DATA, recs)?;
        answers.push((t, landings, reply));
    }
    serve_until(comm, local, e, "MPI_Win_complete", |c, _| answers.iter().all(|(_, _, r)| c.p2p_is_done(&r.op)))?;
    let deadline = comm.op_deadline();
    for (t, landings, reply) in answers {
        comm.p2p_result(&reply.op).expect("finished").map_err(MpiErr::from)?;
        let data = recv_bytes(comm, t, REPLY, reply.len(), deadline)?;
        rma::land(&landings, &data);
    }
    Ok(())
}

/// MPI_Win_wait: every origin's records applied and answered, and those answers sent.
pub fn wait(comm: &Comm, local: &Local, e: &mut Epochs) -> Res {
    if e.exposure.is_none() {
        return mpi_err!(crate::abi_gen::MPI_ERR_RMA_SYNC, "no exposure epoch is open on this window (MPI_Win_wait without MPI_Win_post)");
    }
    serve_until(comm, local, e, "MPI_Win_wait", |_, e| e.exposure.as_ref().is_some_and(|ex| ex.iter().all(|(_, p)| p.is_none())) && e.sending.is_empty())?;
    e.exposure = None;
    Ok(())
}

/// MPI_Win_test: `wait` if every origin's records are here, else false at once.
pub fn test(comm: &Comm, local: &Local, e: &mut Epochs) -> Result<bool, MpiErr> {
    let Some(ex) = e.exposure.as_ref() else {
        return mpi_err!(crate::abi_gen::MPI_ERR_RMA_SYNC, "no exposure epoch is open on this window (MPI_Win_test without MPI_Win_post)");
    };
    if !ex.iter().all(|(_, p)| p.as_ref().is_none_or(|r| comm.p2p_is_done(&r.op))) {
        serve(comm, local, e, comm.op_deadline())?;
        return Ok(false);
    }
    wait(comm, local, e)?;
    Ok(true)
}

/// Before the window goes: sends still in flight finish (their receivers are in their epochs).
pub fn drain(comm: &Comm, local: &Local, e: &mut Epochs) -> Res {
    serve_until(comm, local, e, "MPI_Win_free", |_, e| e.sending.is_empty())
}
