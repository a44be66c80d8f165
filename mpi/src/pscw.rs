//! Generalized active target synchronization: MPI_Win_post / start / complete / wait / test.
//!
//! Messages on the window's own communicator mark the epochs: `post` sends each origin of the
//! exposure epoch a token; `complete` waits for the tokens of its targets and sends each target
//! its transfers' records (the fence's, rma.rs), which the target's `wait` or `test` applies.
//! Transfers whose answer the origin needs (gets, fetch-and-op, compare-and-swap) travel as a
//! lock's do instead (passive.rs): the target's server applies them and answers at once, and
//! the target's `wait` is sent an empty record set. So `complete` never waits for the target
//! process to call anything (mpi4py's tests have the origin complete while the target sits in
//! a barrier), and `start` does not block.

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::passive::Passive;
use crate::rma::{self, deadline, Local, Pending};
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::comm::{Comm, P2pOp};

// Tags on the window's private communicator (its fences use collectives, not these).
const POST: u32 = 0x5057_0001;
const DONE: u32 = 0x5057_0002;

/// A pending receive of an 8-byte token (for a done token: the length of the records that
/// follow), its buffer boxed so it stays put meanwhile.
struct Token {
    op: P2pOp,
    buf: Box<[u8; 8]>,
}

impl Token {
    fn expect(comm: &Comm, from: usize, tag: u32) -> Result<Token, MpiErr> {
        let mut buf = Box::new([0u8; 8]);
        let op = comm.post_recv(MutBuf::from_slice(&mut buf[..]), Some(from), Some(tag)).map_err(MpiErr::from)?;
        Ok(Token { op, buf })
    }
}

/// The post/start epochs of one window and this process's tokens still in flight.
#[derive(Default)]
pub struct Epochs {
    /// Origins of the open exposure epoch (window ranks), each with its records' length to come.
    exposure: Option<Vec<(usize, Token)>>,
    /// Targets of the open access epoch, each with its post token to come.
    access: Option<Vec<(usize, Token)>>,
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

/// Sends `bytes` (kept until the send finishes: a large one waits for its receiver).
fn send(comm: &Comm, e: &mut Epochs, to: usize, tag: u32, bytes: Vec<u8>) -> Res {
    let op = comm.post_send(ConstBuf::from_slice(&bytes), to, tag).map_err(MpiErr::from)?;
    e.sending.push((op, bytes));
    Ok(())
}

/// MPI_Win_post: opens an exposure epoch for `origins` and tells each of them.
pub fn post(comm: &Comm, e: &mut Epochs, origins: Vec<usize>) -> Res {
    if e.exposure.is_some() {
        return mpi_err!(MPI_ERR_RMA_SYNC, "an exposure epoch is already open on this window (MPI_Win_post without MPI_Win_wait)");
    }
    let mut ex = Vec::with_capacity(origins.len());
    for &o in &origins {
        ex.push((o, Token::expect(comm, o, DONE)?));
    }
    e.exposure = Some(ex);
    for o in origins {
        send(comm, e, o, POST, vec![0; 8])?;
    }
    Ok(())
}

/// MPI_Win_start: opens an access epoch to `targets` (their post tokens are awaited by
/// complete).
pub fn start(comm: &Comm, e: &mut Epochs, targets: Vec<usize>) -> Res {
    if e.access.is_some() {
        return mpi_err!(MPI_ERR_RMA_SYNC, "an access epoch is already open on this window (MPI_Win_start without MPI_Win_complete)");
    }
    let mut acc = Vec::with_capacity(targets.len());
    for t in targets {
        acc.push((t, Token::expect(comm, t, POST)?));
    }
    e.access = Some(acc);
    Ok(())
}

/// MPI_Win_complete: for each target, its post seen, then its transfers sent: applied by its
/// server at once when an answer is due, else carried to its `wait`.
pub fn complete(comm: &Comm, passive: Option<&Passive>, e: &mut Epochs, pending: &mut Pending, timeout_ms: i64) -> Res {
    let Some(targets) = e.access.take() else {
        return mpi_err!(MPI_ERR_RMA_SYNC, "no access epoch is open on this window (MPI_Win_complete without MPI_Win_start)");
    };
    for (t, token) in targets {
        let what = || format!("MPI_Win_complete: the MPI_Win_post of window rank {t}");
        comm.wait_p2p(&token.op, deadline(timeout_ms), &what).map_err(MpiErr::from)?;
        let recs = match passive {
            Some(p) if pending.answers_due(t) => {
                p.flush(t, pending, timeout_ms)?;
                Vec::new()
            }
            _ => pending.take_for(t).0,
        };
        send(comm, e, t, DONE, (recs.len() as u64).to_le_bytes().to_vec())?;
        if !recs.is_empty() {
            send(comm, e, t, DONE, recs)?;
        }
    }
    reap(comm, e);
    Ok(())
}

/// MPI_Win_wait: every origin's records here and applied, in origin order.
pub fn wait(comm: &Comm, local: &Local, e: &mut Epochs, timeout_ms: i64) -> Res {
    let Some(origins) = e.exposure.take() else {
        return mpi_err!(MPI_ERR_RMA_SYNC, "no exposure epoch is open on this window (MPI_Win_wait without MPI_Win_post)");
    };
    let mut first: Res = Ok(());
    for (o, token) in origins {
        let what = || format!("MPI_Win_wait: the MPI_Win_complete of window rank {o}");
        comm.wait_p2p(&token.op, deadline(timeout_ms), &what).map_err(MpiErr::from)?;
        let recs = rma::recv_bytes(comm, o, DONE, u64::from_le_bytes(*token.buf) as usize, deadline(timeout_ms), &what).map_err(MpiErr::from)?;
        if !recs.is_empty() {
            // Every origin's records are applied even when one's fail.
            if let Err(err) = rma::apply(local, &recs) {
                if first.is_ok() {
                    first = Err(err);
                }
            }
        }
    }
    reap(comm, e);
    first
}

/// MPI_Win_test: `wait` if every origin's records have come, else false at once.
pub fn test(comm: &Comm, local: &Local, e: &mut Epochs, timeout_ms: i64) -> Result<bool, MpiErr> {
    let Some(ex) = e.exposure.as_ref() else {
        return mpi_err!(MPI_ERR_RMA_SYNC, "no exposure epoch is open on this window (MPI_Win_test without MPI_Win_post)");
    };
    if !ex.iter().all(|(_, t)| comm.p2p_is_done(&t.op)) {
        return Ok(false);
    }
    wait(comm, local, e, timeout_ms)?;
    Ok(true)
}

/// Drops the tokens sent that have gone.
fn reap(comm: &Comm, e: &mut Epochs) {
    e.sending.retain(|(op, _)| !comm.p2p_is_done(op));
}

/// Before the window goes: tokens still in flight finish.
pub fn drain(comm: &Comm, e: &mut Epochs, timeout_ms: i64) -> Res {
    for (op, _bytes) in std::mem::take(&mut e.sending) {
        comm.wait_p2p(&op, deadline(timeout_ms), &|| "MPI_Win_free: a post/start token".to_string()).map_err(MpiErr::from)?;
    }
    Ok(())
}
