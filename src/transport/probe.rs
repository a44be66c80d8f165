//! Probing and the answers of synchronous sends: looking at the first matching unexpected
//! message without taking it (probe), taking it into a handle that only one receive can get
//! (matched probe), receiving exactly that message, withdrawing a receive only if nothing
//! matched it yet (MPI_Cancel), and sending the empty answer a synchronous send waits for.
//!
//! A message counts once it is whole in the queue: received in full, or announced (`Rts`) and
//! still in the sender's memory, whose length the announcement gives. One being read from a
//! socket is not there yet; messages of one sender reach the queue in the order sent, so a
//! probe never reports a later one first.

use super::endpoint::{lock, SocketTransport};
use super::matching::{deliver_copy, Content, Unexpected};
use super::ops::{CtxState, RecvOp, TagMatch};
use crate::buffer::{ConstBuf, MutBuf};
use crate::completion::Done;
use crate::dc_log;
use crate::error::{Error, Result};
use crate::log::Level;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A message taken out of the unexpected queue by a matched probe: no other receive can match
/// it; `SocketTransport::recv_matched` receives it.
#[derive(Debug)]
pub struct Matched {
    pub(super) ctx: u64,
    pub(super) msg: Unexpected,
}

impl Matched {
    /// Length in bytes, world rank of the sender, user tag.
    pub fn envelope(&self) -> Done {
        self.msg.envelope()
    }
}

impl SocketTransport {
    /// The envelope of the first whole message on `ctx` from world rank `src` (None: any) that
    /// `tag` accepts, left queued.
    pub fn iprobe(&self, ctx: &CtxState, src: Option<u32>, tag: TagMatch) -> Option<Done> {
        lock(&self.matcher).peek(ctx.id, src, tag)
    }

    /// A blocking probe: an op (empty buffer, never written) completed with the envelope of
    /// the first message it accepts, now or when one arrives. Waited like a receive; a wait
    /// that gives up withdraws it with `cancel_recv`.
    pub fn post_probe(&self, ctx: &Arc<CtxState>, src: Option<u32>, tag: TagMatch) -> Result<Arc<RecvOp>> {
        if let Some(e) = ctx.abort_error() {
            return Err(e);
        }
        // SAFETY: an empty buffer; the matcher never writes into a probe.
        let op = RecvOp::new(ctx, src, tag, 0, unsafe { MutBuf::new(std::ptr::null_mut(), 0) });
        let mut m = lock(&self.matcher);
        if let Some(s) = src.filter(|&s| s != self.rank) {
            if m.peek(ctx.id, src, tag).is_none() {
                if let Some(e) = self.peer(s).gone_error() {
                    return Err(e);
                }
            }
        }
        m.push_probe(op.clone());
        Ok(op)
    }

    /// A matched probe: takes the first whole message that would match (as `iprobe`) out of
    /// the queue. A synchronous send is answered now: it has matched.
    pub fn improbe(&self, ctx: &Arc<CtxState>, src: Option<u32>, tag: TagMatch) -> Option<Matched> {
        let msg = {
            let mut m = lock(&self.matcher);
            let mut msg = m.take_matching(ctx, src, tag)?;
            self.note_acks(&m);
            if let Content::Offered { offer, pulled: true } = msg.content {
                // Its bytes are on their way: kept for the matched receive.
                m.set_pull(msg.src, offer.cookie, super::matching::Pull::Waiting);
            }
            let credit = std::mem::take(&mut msg.credit);
            drop(m);
            if credit > 0 {
                self.consumed(self.peer(msg.src), credit);
            }
            msg
        };
        self.send_acks();
        Some(Matched { ctx: ctx.id, msg })
    }

    /// Receives the message a matched probe took into `buf` (its context must be `ctx`).
    pub fn recv_matched(&self, ctx: &Arc<CtxState>, matched: Matched, buf: MutBuf) -> Result<Arc<RecvOp>> {
        let Matched { ctx: id, mut msg } = matched;
        if id != ctx.id {
            return Err(Error::new(crate::error::Status::InvalidArgument, "the message was probed on another communicator"));
        }
        let op = RecvOp::new(ctx, Some(msg.src), TagMatch::Exact(msg.tag), msg.check, buf);
        if let Content::Bytes(data) = &mut msg.content {
            deliver_copy(&op, msg.src, msg.tag, msg.check, data);
            self.spare.give(std::mem::take(data));
        } else if let Content::Offered { .. } = msg.content {
            self.pull_matched(&op, &msg);
        } else {
            if let Some(e) = ctx.abort_error() {
                return Err(e);
            }
            let peer = self.peer(msg.src);
            self.wire(peer).fetch(self, peer, op.clone(), msg);
        }
        Ok(op)
    }

    /// MPI_Cancel of a receive: withdraws it only if no message matched it yet (it is still
    /// posted); true if it was withdrawn (completed with `err`). A receive that matched (even
    /// one still waiting for a parked message's copy: its sender may have been answered)
    /// completes as usual.
    pub fn cancel_unmatched_recv(&self, op: &Arc<RecvOp>, err: Error) -> bool {
        let withdrawn = {
            let mut m = lock(&self.matcher);
            m.remove_posted(op) || m.remove_probe(op)
        };
        if withdrawn {
            op.comp.complete(Err(err));
        }
        withdrawn
    }

    /// The number of the next synchronous send (see `ops::sync_tag`).
    pub fn next_sync_seq(&self) -> u64 {
        self.next_sync.fetch_add(1, Ordering::Relaxed)
    }

    /// After a match made under the matcher's lock `m`: answers are owed if it noted any; the
    /// progress thread is woken to send them unless the caller does (`send_acks`).
    pub(super) fn note_acks(&self, m: &super::matching::Matcher) {
        if m.has_acks() && !self.acks_due.swap(true, Ordering::AcqRel) {
            self.wake_progress();
        }
    }

    /// Sends the answers owed to synchronous sends matched here (cheap when there are none).
    /// Called holding no lock of the endpoint: by the progress thread, by waits, and after
    /// matches made by a caller's own thread.
    ///
    /// A caller with nothing to send waits (briefly) for another thread that took answers and
    /// has not posted them yet: a receive that matched our own synchronous send is answered
    /// through that post (inline, to ourselves), and without the wait a caller could see its
    /// receive done and its synchronous send not, while the progress thread had the answer
    /// in hand (mpi4py's test_p2p_obj testManyISSendAndRecv saw that on a busy machine).
    pub fn send_acks(&self) {
        if self.acks_due.load(Ordering::SeqCst) {
            // Counted before the flag is cleared, so a caller that sees it clear sees us counted.
            self.acks_sending.fetch_add(1, Ordering::SeqCst);
            if self.acks_due.swap(false, Ordering::SeqCst) {
                let acks = lock(&self.matcher).take_acks();
                for (ctx, src, tag) in acks {
                    // An empty message; nobody waits for its send, which finishes on its own.
                    if let Err(e) = self.post_send(&ctx, src, tag, 0, ConstBuf::from_slice(&[])) {
                        dc_log!(Level::Warn, Some(self.rank as usize), "could not answer a synchronous send of rank {src}: {}", e.msg);
                    }
                }
            }
            self.acks_sending.fetch_sub(1, Ordering::SeqCst);
        }
        // Bounded: posting does not wait for peers, but a waiting caller must not hang. (The
        // clock is read only when there is something to wait for: this runs on every poll.)
        if self.acks_sending.load(Ordering::SeqCst) == 0 {
            return;
        }
        let start = std::time::Instant::now();
        while self.acks_sending.load(Ordering::SeqCst) > 0 && start.elapsed() < std::time::Duration::from_millis(10) {
            std::thread::yield_now();
        }
    }
}
