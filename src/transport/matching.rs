//! Matching incoming messages to posted receives: per context, a queue of posted receives and a
//! queue of complete unexpected messages, both in order, so messages between one pair with one
//! tag are delivered in the order sent. Sans-IO: the socket layer feeds it.

use super::ops::RecvOp;
use crate::completion::Done;
use crate::error::{Error, Result, Status};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A message that arrived before its receive was posted.
#[derive(Debug)]
pub struct Unexpected {
    pub src: u32,
    pub tag: u64,
    pub check: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, Default)]
struct Queues {
    posted: VecDeque<Arc<RecvOp>>,
    unexpected: VecDeque<Unexpected>,
}

#[derive(Debug, Default)]
pub struct Matcher {
    ctxs: HashMap<u64, Queues>,
}

/// The outcome of delivering a message of `len` bytes with signature `check` from `src` to `op`:
/// how many bytes to write into the buffer, and the result to complete the op with.
pub fn verdict(op: &RecvOp, src: u32, tag: u64, check: u32, len: usize) -> (usize, Result<Done>) {
    if check != op.check {
        let e = Error::new(
            Status::Mismatch,
            format!(
                "rank {src} called {} where this rank called {}",
                crate::collective::describe(check),
                crate::collective::describe(op.check)
            ),
        );
        return (0, Err(e));
    }
    let cap = op.buf.len();
    if len > cap {
        let e = Error::new(
            Status::InvalidArgument,
            format!("message of {len} bytes from rank {src} is longer than the receive buffer of {cap} bytes (truncated)"),
        );
        return (cap, Err(e));
    }
    (len, Ok(Done { bytes: len, source: src, tag }))
}

/// Copies an unexpected message into `op` and completes it.
pub fn deliver_copy(op: &RecvOp, msg: &Unexpected) {
    let (n, result) = verdict(op, msg.src, msg.tag, msg.check, msg.data.len());
    if n > 0 {
        // SAFETY: `op.buf` is valid for `op.buf.len() >= n` bytes until the op completes, and
        // nobody else writes it (the op was just taken out of the posted queue).
        unsafe { op.buf.as_mut_slice()[..n].copy_from_slice(&msg.data[..n]) };
    }
    op.comp.complete(result);
}

impl Matcher {
    /// Takes the first posted receive that accepts a message from `src` with `tag` on `ctx`.
    pub fn take_posted(&mut self, ctx: u64, src: u32, tag: u64) -> Option<Arc<RecvOp>> {
        let q = self.ctxs.get_mut(&ctx)?;
        let i = q.posted.iter().position(|op| op.matches(ctx, src, tag))?;
        q.posted.remove(i)
    }

    /// Takes the first complete unexpected message that `op` accepts.
    pub fn take_unexpected(&mut self, op: &RecvOp) -> Option<Unexpected> {
        let q = self.ctxs.get_mut(&op.ctx.id)?;
        let i = q.unexpected.iter().position(|m| op.matches(op.ctx.id, m.src, m.tag))?;
        q.unexpected.remove(i)
    }

    pub fn push_posted(&mut self, op: Arc<RecvOp>) {
        self.ctxs.entry(op.ctx.id).or_default().posted.push_back(op);
    }

    pub fn push_unexpected(&mut self, ctx: u64, msg: Unexpected) {
        self.ctxs.entry(ctx).or_default().unexpected.push_back(msg);
    }

    /// Removes `op` if it is still posted; true if it was.
    pub fn remove_posted(&mut self, op: &Arc<RecvOp>) -> bool {
        let Some(q) = self.ctxs.get_mut(&op.ctx.id) else { return false };
        match q.posted.iter().position(|p| Arc::ptr_eq(p, op)) {
            Some(i) => {
                q.posted.remove(i);
                true
            }
            None => false,
        }
    }

    /// Removes and returns every posted receive for which `pred` holds.
    pub fn drain_posted(&mut self, mut pred: impl FnMut(&RecvOp) -> bool) -> Vec<Arc<RecvOp>> {
        let mut out = Vec::new();
        for q in self.ctxs.values_mut() {
            let (take, keep): (VecDeque<_>, VecDeque<_>) = q.posted.drain(..).partition(|op| pred(op));
            q.posted = keep;
            out.extend(take);
        }
        out
    }

    /// Contexts with queues (posted or unexpected, possibly empty).
    pub fn num_ctxs(&self) -> usize {
        self.ctxs.len()
    }

    /// Forgets a destroyed context (drops its unexpected messages).
    pub fn remove_ctx(&mut self, ctx: u64) {
        self.ctxs.remove(&ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::MutBuf;
    use crate::transport::ops::{CtxState, TagMatch};

    fn op(ctx: &Arc<CtxState>, src: Option<u32>, tag: TagMatch, buf: &mut [u8]) -> Arc<RecvOp> {
        RecvOp::new(ctx.clone(), src, tag, 0, MutBuf::from_slice(buf))
    }

    #[test]
    fn in_order_per_pair_and_tag_with_wildcards() {
        let ctx = CtxState::new(1, None);
        let mut m = Matcher::default();
        for (src, tag, byte) in [(1u32, 5u64, 10u8), (2, 5, 20), (1, 5, 11), (1, 6, 12)] {
            m.push_unexpected(1, Unexpected { src, tag, check: 0, data: vec![byte] });
        }
        let mut b = [0u8; 1];
        let r = op(&ctx, Some(1), TagMatch::Exact(5), &mut b);
        deliver_copy(&r, &m.take_unexpected(&r).unwrap());
        assert_eq!(b[0], 10);
        let r = op(&ctx, Some(1), TagMatch::Exact(5), &mut b);
        deliver_copy(&r, &m.take_unexpected(&r).unwrap());
        assert_eq!(b[0], 11);
        let r = op(&ctx, None, TagMatch::AnyUser, &mut b);
        let msg = m.take_unexpected(&r).unwrap();
        assert_eq!((msg.src, msg.data[0]), (2, 20));
        let r = op(&ctx, Some(1), TagMatch::AnyUser, &mut b);
        assert_eq!(m.take_unexpected(&r).unwrap().data[0], 12);
    }

    #[test]
    fn truncation_writes_nothing_past_the_buffer() {
        let ctx = CtxState::new(1, None);
        let mut b = [0u8; 4];
        let r = op(&ctx, Some(0), TagMatch::Exact(0), &mut b[..2]);
        deliver_copy(&r, &Unexpected { src: 0, tag: 0, check: 0, data: vec![1, 2, 3, 4] });
        assert_eq!(r.comp.result().unwrap().unwrap_err().status, Status::InvalidArgument);
        assert_eq!(b, [1, 2, 0, 0]);
    }

    #[test]
    fn any_tag_never_matches_collective_traffic() {
        assert!(!TagMatch::AnyUser.accepts(crate::transport::ops::COLL_TAG_BIT | 3));
        assert!(TagMatch::AnyUser.accepts(3));
    }
}
