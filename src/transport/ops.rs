//! Posted operations and per-communicator context state shared by the transport and the comm.

use crate::buffer::{ConstBuf, MutBuf};
use crate::completion::Completion;
use crate::error::{Error, Status};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Tags at or above this value belong to collectives; user tags are below.
pub const COLL_TAG_BIT: u64 = 1 << 63;

/// A point-to-point message whose sender waits for our word that a receive matched it (a
/// synchronous send): the tag is `SYNC_TAG_BIT | seq << 32 | user tag`, matched as the user tag.
pub const SYNC_TAG_BIT: u64 = 1 << 62;
/// The empty message that answers a synchronous send: `ACK_TAG_BIT | seq << 32`. No user
/// receive (not even one of any tag) matches it.
pub const ACK_TAG_BIT: u64 = 1 << 61;
const SYNC_SEQ_BITS: u64 = 29;
const USER_TAG_MASK: u64 = 0xFFFF_FFFF;

/// The tag of a synchronous send of user tag `tag`, numbered `seq` (taken modulo 2^29).
pub fn sync_tag(seq: u64, tag: u32) -> u64 {
    SYNC_TAG_BIT | ((seq & ((1 << SYNC_SEQ_BITS) - 1)) << 32) | u64::from(tag)
}

/// The tag of the answer to the synchronous send `seq`.
pub fn ack_tag(seq: u64) -> u64 {
    ACK_TAG_BIT | ((seq & ((1 << SYNC_SEQ_BITS) - 1)) << 32)
}

/// Whether a message's tag asks for an answer when matched; the answer's tag if so.
#[inline]
pub fn ack_for(tag: u64) -> Option<u64> {
    if tag & (COLL_TAG_BIT | SYNC_TAG_BIT) != SYNC_TAG_BIT {
        return None;
    }
    Some(ACK_TAG_BIT | (tag & !(SYNC_TAG_BIT | USER_TAG_MASK)))
}

/// The tag a receiver sees: a synchronous send's user tag, any other tag as it is.
#[inline]
pub fn user_tag(tag: u64) -> u64 {
    if ack_for(tag).is_some() { tag & USER_TAG_MASK } else { tag }
}

/// Which tags a receive accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagMatch {
    Exact(u64),
    /// `DC_ANY_TAG`: any user (point-to-point) tag, never a collective's.
    AnyUser,
}

impl TagMatch {
    pub fn accepts(&self, tag: u64) -> bool {
        match *self {
            TagMatch::Exact(t) => t == tag || (ack_for(tag).is_some() && t == tag & USER_TAG_MASK),
            TagMatch::AnyUser => tag < COLL_TAG_BIT && tag & ACK_TAG_BIT == 0,
        }
    }
}

/// A communicator's identity on the wire and its abort state. Children (subgroups) see their
/// parent's abort.
#[derive(Debug)]
pub struct CtxState {
    pub id: u64,
    parent: Option<Arc<CtxState>>,
    aborted: AtomicBool,
    reason: Mutex<String>,
}

impl CtxState {
    pub fn new(id: u64, parent: Option<Arc<CtxState>>) -> Arc<CtxState> {
        Arc::new(CtxState { id, parent, aborted: AtomicBool::new(false), reason: Mutex::new(String::new()) })
    }

    /// Marks the context aborted; returns false if it already was.
    pub fn abort(&self, reason: &str) -> bool {
        let mut r = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if self.aborted.swap(true, Ordering::AcqRel) {
            return false;
        }
        *r = reason.to_string();
        true
    }

    #[inline]
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire) || self.parent.as_ref().is_some_and(|p| p.is_aborted())
    }

    /// The abort error for this context or its nearest aborted ancestor (every message asks:
    /// the answer is almost always a load or two and None).
    #[inline]
    pub fn abort_error(&self) -> Option<Error> {
        if !self.is_aborted() {
            return None;
        }
        self.abort_error_slow()
    }

    #[cold]
    fn abort_error_slow(&self) -> Option<Error> {
        if self.aborted.load(Ordering::Acquire) {
            let r = self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone();
            return Some(Error::new(Status::Aborted, r));
        }
        self.parent.as_ref().and_then(|p| p.abort_error_slow())
    }
}

/// A posted receive. The transport writes into `buf` only between matching and completion.
#[derive(Debug)]
pub struct RecvOp {
    pub comp: Completion,
    pub ctx: Arc<CtxState>,
    /// World rank to receive from; `None` for any source.
    pub src: Option<u32>,
    pub tag: TagMatch,
    /// Expected collective signature (0 for point-to-point).
    pub check: u32,
    pub buf: MutBuf,
    /// World rank whose connection is filling `buf` right now (u32::MAX: none).
    pub(crate) filling_from: AtomicU32,
}

thread_local! {
    /// Finished receives nobody refers to any more, kept for this thread's next receives: a
    /// program that posts a receive per message would otherwise pay an allocation and a free
    /// for each (a tenth of a small message's cost).
    static SPARE_RECVS: RefCell<Vec<Arc<RecvOp>>> = const { RefCell::new(Vec::new()) };
}

/// Spare receives kept per thread.
const SPARE_RECVS_MAX: usize = 8;

impl RecvOp {
    pub fn new(ctx: &Arc<CtxState>, src: Option<u32>, tag: TagMatch, check: u32, buf: MutBuf) -> Arc<RecvOp> {
        if let Some(mut spare) = SPARE_RECVS.try_with(|s| s.borrow_mut().pop()).ok().flatten() {
            if let Some(op) = Arc::get_mut(&mut spare) {
                // A spare of the same context keeps its reference (no count to touch).
                if !Arc::ptr_eq(&op.ctx, ctx) {
                    op.ctx = ctx.clone();
                }
                op.comp = Completion::new();
                (op.src, op.tag, op.check, op.buf) = (src, tag, check, buf);
                op.filling_from = AtomicU32::new(u32::MAX);
                return spare;
            }
        }
        Arc::new(RecvOp { comp: Completion::new(), ctx: ctx.clone(), src, tag, check, buf, filling_from: AtomicU32::new(u32::MAX) })
    }

    /// Called with the owner's reference as it lets go of `op`: keeps the allocation for a
    /// later `new` if nobody else refers to it (the transport let go of it when it finished
    /// the op).
    pub fn recycle(op: Arc<RecvOp>) {
        if Arc::strong_count(&op) != 1 || Arc::weak_count(&op) != 0 || !op.comp.is_done() {
            return;
        }
        let _ = SPARE_RECVS.try_with(move |s| {
            let mut s = s.borrow_mut();
            if s.len() < SPARE_RECVS_MAX {
                s.push(op);
            }
        });
    }

    pub fn matches(&self, ctx: u64, src: u32, tag: u64) -> bool {
        self.ctx.id == ctx && self.src.is_none_or(|s| s == src) && self.tag.accepts(tag)
    }
}

/// A posted send.
#[derive(Debug)]
pub struct SendOp {
    pub comp: Completion,
    pub ctx: Arc<CtxState>,
    pub dst: u32,
    pub buf: ConstBuf,
    /// A single-copy send whose receiver was asked to let go of it (`FrameKind::Withdraw`):
    /// a `Fin` saying it was dropped no longer completes it; whoever withdrew it does.
    pub withdrawn: std::sync::atomic::AtomicBool,
}

impl SendOp {
    pub fn new(ctx: Arc<CtxState>, dst: u32, buf: ConstBuf) -> Arc<SendOp> {
        Arc::new(SendOp { comp: Completion::new(), ctx, dst, buf, withdrawn: std::sync::atomic::AtomicBool::new(false) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::completion::Done;

    #[test]
    fn synchronous_tags_match_as_their_user_tag_and_answers_match_no_user_receive() {
        let t = sync_tag(7, 42);
        assert!(TagMatch::Exact(42).accepts(t) && TagMatch::AnyUser.accepts(t));
        assert!(!TagMatch::Exact(43).accepts(t));
        assert_eq!(user_tag(t), 42);
        assert_eq!(ack_for(t), Some(ack_tag(7)));
        assert_eq!(ack_for(42), None);
        assert_eq!(ack_for(COLL_TAG_BIT | SYNC_TAG_BIT | 3), None, "collective tags are not sends");
        assert!(!TagMatch::AnyUser.accepts(ack_tag(7)));
        assert!(!TagMatch::Exact(0).accepts(ack_tag(7)));
        assert!(TagMatch::Exact(ack_tag(7)).accepts(ack_tag(7)));
        assert_eq!(ack_tag(7 + (1 << 29)), ack_tag(7), "numbers wrap");
        assert_eq!(user_tag(5), 5);
    }

    #[test]
    fn a_recycled_receive_starts_afresh_and_a_shared_one_is_not_recycled() {
        let ctx = CtxState::new(1, None);
        let mut a = [0u8; 4];
        let op = RecvOp::new(&ctx, Some(1), TagMatch::Exact(5), 0, MutBuf::from_slice(&mut a));
        let first = Arc::as_ptr(&op);
        op.comp.complete(Err(Error::new(Status::Aborted, "x")));
        RecvOp::recycle(op);
        let other = CtxState::new(2, None);
        let mut b = [0u8; 8];
        let op = RecvOp::new(&other, None, TagMatch::AnyUser, 3, MutBuf::from_slice(&mut b));
        assert_eq!(Arc::as_ptr(&op), first, "the allocation is reused");
        assert!(!op.comp.is_done(), "pending again");
        assert_eq!((op.ctx.id, op.src, op.tag, op.check, op.buf.len()), (2, None, TagMatch::AnyUser, 3, 8));
        assert_eq!(op.filling_from.load(Ordering::Relaxed), u32::MAX);

        // Held by someone else (a transport queue), or not finished: never handed out again.
        op.comp.complete(Ok(Done::default()));
        let held = op.clone();
        RecvOp::recycle(op);
        let pending = RecvOp::new(&ctx, None, TagMatch::AnyUser, 0, MutBuf::from_slice(&mut a));
        assert_ne!(Arc::as_ptr(&pending), Arc::as_ptr(&held));
        let pending_ptr = Arc::as_ptr(&pending);
        RecvOp::recycle(pending.clone());
        let next = RecvOp::new(&ctx, None, TagMatch::AnyUser, 0, MutBuf::from_slice(&mut a));
        assert_ne!(Arc::as_ptr(&next), pending_ptr, "a pending op is not recycled");
        drop(pending);
    }
}
