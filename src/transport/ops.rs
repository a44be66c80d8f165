//! Posted operations and per-communicator context state shared by the transport and the comm.

use crate::buffer::{ConstBuf, MutBuf};
use crate::completion::Completion;
use crate::error::{Error, Status};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Tags at or above this value belong to collectives; user tags are below.
pub const COLL_TAG_BIT: u64 = 1 << 63;

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
            TagMatch::Exact(t) => t == tag,
            TagMatch::AnyUser => tag < COLL_TAG_BIT,
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

    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire) || self.parent.as_ref().is_some_and(|p| p.is_aborted())
    }

    /// The abort error for this context or its nearest aborted ancestor.
    pub fn abort_error(&self) -> Option<Error> {
        if self.aborted.load(Ordering::Acquire) {
            let r = self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone();
            return Some(Error::new(Status::Aborted, r));
        }
        self.parent.as_ref().and_then(|p| p.abort_error())
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

impl RecvOp {
    pub fn new(ctx: Arc<CtxState>, src: Option<u32>, tag: TagMatch, check: u32, buf: MutBuf) -> Arc<RecvOp> {
        Arc::new(RecvOp { comp: Completion::new(), ctx, src, tag, check, buf, filling_from: AtomicU32::new(u32::MAX) })
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
}

impl SendOp {
    pub fn new(ctx: Arc<CtxState>, dst: u32, buf: ConstBuf) -> Arc<SendOp> {
        Arc::new(SendOp { comp: Completion::new(), ctx, dst, buf })
    }
}
