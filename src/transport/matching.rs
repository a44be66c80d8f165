//! Matching incoming messages to posted receives: per context, a queue of posted receives and a
//! queue of complete unexpected messages, both in order, so messages between one pair with one
//! tag are delivered in the order sent. Probes look at the unexpected queue without taking (or
//! wait in it for a message), and a synchronous send's answer is noted where it is matched.
//! Sans-IO: the socket layer feeds it.

use super::ops::{ack_for, user_tag, CtxState, RecvOp, TagMatch};
use crate::completion::Done;
use crate::error::{Error, Result, Status};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

/// A message that arrived before its receive was posted.
#[derive(Debug)]
pub struct Unexpected {
    pub src: u32,
    pub tag: u64,
    pub check: u32,
    pub content: Content,
    /// What it cost its sender's eager credit (see `flow`), given back once it is consumed;
    /// 0 for a message that did not come eagerly over a connection.
    pub credit: usize,
}

/// What an unexpected message holds.
#[derive(Debug)]
pub enum Content {
    /// Its bytes, received already.
    Bytes(Vec<u8>),
    /// A single-copy message still in the sender's memory: the receive that matches it copies it
    /// straight from there (the sender waits for our `Fin`), so a receive posted a little late
    /// costs no second copy.
    InSender(Parked),
    /// A message offered over a connection and not sent yet (see `flow`; `addr` unused): the
    /// receive that matches it asks for it. `pulled`: asked for already (its bytes are on their
    /// way here, to fill this entry in place, or to the receive that takes it meanwhile).
    Offered { offer: Parked, pulled: bool },
}

/// Where the body of an offered message goes when it comes (see `flow`), once a receive or a
/// matched probe took its entry out of the queue.
#[derive(Debug)]
pub enum Pull {
    /// Into this receive (tag and check as offered; the offer, to queue it again if the
    /// receive is withdrawn).
    Recv { op: Arc<RecvOp>, tag: u64, check: u32, offer: Parked },
    /// A matched probe took it before its bytes came: they are kept for its receive.
    Waiting,
    Arrived(Vec<u8>),
    /// Its receive was withdrawn after asking for fewer bytes than it has: dropped when they
    /// come (as a message being read into a withdrawn receive is).
    Drop,
}

/// Where a parked single-copy message lies in the sender's memory.
#[derive(Debug, Clone, Copy)]
pub struct Parked {
    pub addr: u64,
    pub len: usize,
    /// The sender's handle for our `Fin`.
    pub cookie: u64,
    pub since: Instant,
}

impl Unexpected {
    pub fn bytes(src: u32, tag: u64, check: u32, data: Vec<u8>) -> Unexpected {
        Unexpected { src, tag, check, content: Content::Bytes(data), credit: 0 }
    }

    /// Bytes of it this process holds or has asked for (what counts against the bound of
    /// unexpected bytes per peer): a received one's, or a pulled offer's.
    pub fn held(&self) -> usize {
        match &self.content {
            Content::Bytes(d) => d.len(),
            Content::Offered { offer, pulled: true } => offer.len,
            _ => 0,
        }
    }

    /// Its length in bytes (the sender's word for a parked one, checked when it came).
    pub fn len(&self) -> usize {
        match &self.content {
            Content::Bytes(d) => d.len(),
            Content::InSender(p) | Content::Offered { offer: p, .. } => p.len,
        }
    }

    /// What a probe reports of it.
    pub fn envelope(&self) -> Done {
        Done { bytes: self.len(), source: self.src, tag: user_tag(self.tag) }
    }

    /// Where it lies in the sender's memory, if it is still there.
    pub fn parked(&self) -> Option<&Parked> {
        match &self.content {
            Content::InSender(p) => Some(p),
            Content::Bytes(_) | Content::Offered { .. } => None,
        }
    }
}

#[derive(Debug, Default)]
struct Queues {
    posted: VecDeque<Arc<RecvOp>>,
    unexpected: VecDeque<Unexpected>,
    /// Blocking probes waiting for a message (ops with an empty buffer, never filled: each is
    /// completed with the envelope of the first message it accepts, which stays queued).
    probes: Vec<Arc<RecvOp>>,
}

/// Hashes context ids (already random 64-bit numbers, or small counters) with one multiply:
/// the default SipHash showed up in profiles of small messages.
#[derive(Debug, Default, Clone, Copy)]
pub struct CtxHasher(u64);

impl std::hash::Hasher for CtxHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[derive(Debug, Default)]
pub struct Matcher {
    ctxs: HashMap<u64, Queues, std::hash::BuildHasherDefault<CtxHasher>>,
    /// Unexpected messages still in their senders' memory.
    parked: usize,
    /// Bytes held per source (see `Unexpected::held`).
    held: PerSource,
    /// Buffers of small unexpected bodies, kept for the next ones (see `small_body`).
    small: Vec<Vec<u8>>,
    /// Offered messages taken out of the queue, by (source, cookie): where their bytes go.
    pulls: HashMap<(u32, u64), Pull>,
    /// Answers owed to synchronous sends matched here: (context, sender, answer's tag), for the
    /// endpoint to send once it holds no lock (see `SocketTransport::send_acks`).
    acks: Vec<(Arc<CtxState>, u32, u64)>,
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
    (len, Ok(Done { bytes: len, source: src, tag: user_tag(tag) }))
}

/// Copies a received unexpected message (`data`, from `src` with `tag` and `check`) into `op`
/// and completes it.
pub fn deliver_copy(op: &RecvOp, src: u32, tag: u64, check: u32, data: &[u8]) {
    let (n, result) = verdict(op, src, tag, check, data.len());
    if n > 0 {
        // SAFETY: `op.buf` is valid for `op.buf.len() >= n` bytes until the op completes, and
        // nobody else writes it (the op was just taken out of the posted queue).
        unsafe { op.buf.as_mut_slice()[..n].copy_from_slice(&data[..n]) };
    }
    op.comp.complete(result);
}

/// What `Matcher::fetch_parked`'s callback made of a parked message.
pub enum Fetched {
    Bytes(Vec<u8>),
    /// Left parked, looked at again from this instant (or fetched by its receive).
    KeepUntil(Instant),
    /// Dropped (the copy failed).
    Drop,
}

/// Removes entry `i` (usually the first: a plain pop, where `remove` shifts by hand).
fn take_at<T>(q: &mut VecDeque<T>, i: usize) -> Option<T> {
    if i == 0 { q.pop_front() } else { q.remove(i) }
}

/// A count per source (world rank), indexed directly: every unexpected message is counted in
/// and out, and hashing the rank cost a small message about 120 instructions.
#[derive(Debug, Default)]
struct PerSource(Vec<usize>);

impl PerSource {
    fn get(&self, src: u32) -> usize {
        self.0.get(src as usize).copied().unwrap_or(0)
    }
    fn entry(&mut self, src: u32) -> &mut usize {
        let i = src as usize;
        if i >= self.0.len() {
            self.0.resize(i + 1, 0);
        }
        &mut self.0[i]
    }
}

/// Bodies up to this many bytes, arriving before their receive, go into kept buffers: a
/// malloc and a free per small message were about 100 instructions of a 16-byte exchange's
/// ~2400 (half its messages arrive first).
pub const SMALL_BODY: usize = 256;
const SMALL_KEEP: usize = 32;

impl Matcher {
    /// A copy of `data` to keep as an unexpected message's body (a kept buffer for a small one).
    pub fn small_body(&mut self, data: &[u8]) -> Vec<u8> {
        if data.len() > SMALL_BODY {
            return data.to_vec();
        }
        let mut v = self.small.pop().unwrap_or_else(|| Vec::with_capacity(SMALL_BODY));
        v.extend_from_slice(data);
        v
    }

    /// Takes back a body `small_body` made, once its bytes were delivered.
    pub fn keep_small_body(&mut self, mut v: Vec<u8>) {
        if v.capacity() == SMALL_BODY && self.small.len() < SMALL_KEEP {
            v.clear();
            self.small.push(v);
        }
    }

    /// Counts `msg` in (`add`) or out of what its source has here.
    fn account(&mut self, msg: &Unexpected, add: bool) {
        fn adjust(map: &mut PerSource, src: u32, n: usize, add: bool) {
            if n == 0 {
                return;
            }
            let v = map.entry(src);
            *v = if add { *v + n } else { v.saturating_sub(n) };
        }
        self.parked = if add { self.parked + usize::from(msg.parked().is_some()) } else { self.parked - usize::from(msg.parked().is_some()) };
        adjust(&mut self.held, msg.src, msg.held(), add);
    }

    /// Bytes of unexpected messages from `src` held here (received, or pulled offers).
    pub fn held_from(&self, src: u32) -> usize {
        self.held.get(src)
    }

    /// Notes where the bytes of offer `cookie` of `src` go, now that its entry was taken.
    pub fn set_pull(&mut self, src: u32, cookie: u64, pull: Pull) {
        self.pulls.insert((src, cookie), pull);
    }

    pub fn take_pull(&mut self, src: u32, cookie: u64) -> Option<Pull> {
        self.pulls.remove(&(src, cookie))
    }

    /// Whether offer `cookie` of `src`, pulled, still waits in a queue of `ctx`.
    pub fn has_offer(&self, ctx: u64, src: u32, cookie: u64) -> bool {
        self.ctxs.get(&ctx).is_some_and(|q| q.unexpected.iter().any(|m| m.src == src && matches!(m.content, Content::Offered { offer, pulled: true } if offer.cookie == cookie)))
    }

    /// The bytes of offer `cookie` of `src` came: they fill its entry in place (order kept).
    /// Returns them if the entry is no longer queued.
    pub fn fill_offer(&mut self, ctx: u64, src: u32, cookie: u64, data: Vec<u8>) -> Option<Vec<u8>> {
        let Some(q) = self.ctxs.get_mut(&ctx) else { return Some(data) };
        let Some(m) = q.unexpected.iter_mut().find(|m| m.src == src && matches!(m.content, Content::Offered { offer, pulled: true } if offer.cookie == cookie)) else {
            return Some(data);
        };
        let before = m.held();
        m.content = Content::Bytes(data);
        let after = m.held();
        let v = self.held.entry(src);
        *v = (*v + after).saturating_sub(before);
        None
    }

    /// Takes every pull of offers from `src` (nothing more will come from it).
    pub fn take_pulls_from(&mut self, src: u32) -> Vec<Pull> {
        let keys: Vec<(u32, u64)> = self.pulls.keys().filter(|k| k.0 == src).copied().collect();
        keys.iter().filter_map(|k| self.pulls.remove(k)).collect()
    }

    /// Takes the pull that feeds `op`, if one does (the receive is being withdrawn).
    pub fn take_pull_of(&mut self, op: &Arc<RecvOp>) -> Option<(u32, Pull)> {
        let key = *self.pulls.iter().find(|(_, p)| matches!(p, Pull::Recv { op: o, .. } if Arc::ptr_eq(o, op)))?.0;
        self.pulls.remove(&key).map(|p| (key.0, p))
    }

    /// Makes every message of `src` still parked due for fetching at `due`; whether any is.
    pub fn rush_parked(&mut self, src: u32, due: Instant) -> bool {
        if self.parked == 0 {
            return false;
        }
        let mut any = false;
        for m in self.ctxs.values_mut().flat_map(|q| q.unexpected.iter_mut()).filter(|m| m.src == src) {
            if let Content::InSender(p) = &mut m.content {
                p.since = p.since.min(due);
                any = true;
            }
        }
        any
    }

    /// Marks every offer from `src` not asked for yet as pulled; returns (cookie, length) of each.
    pub fn pull_offers_from(&mut self, src: u32) -> Vec<(u64, usize)> {
        let mut cookies = Vec::new();
        let mut added = 0;
        for q in self.ctxs.values_mut() {
            for m in q.unexpected.iter_mut().filter(|m| m.src == src) {
                if let Content::Offered { offer, pulled: pulled @ false } = &mut m.content {
                    *pulled = true;
                    added += offer.len;
                    cookies.push((offer.cookie, offer.len));
                }
            }
        }
        *self.held.entry(src) += added;
        cookies
    }

    /// Notes the answer a synchronous send is owed once `tag` (from `src`) matched.
    fn matched(&mut self, ctx: &Arc<CtxState>, src: u32, tag: u64) {
        if let Some(ack) = ack_for(tag) {
            self.acks.push((ctx.clone(), src, ack));
        }
    }

    /// Takes the first posted receive that accepts a message from `src` with `tag` on `ctx`.
    pub fn take_posted(&mut self, ctx: u64, src: u32, tag: u64) -> Option<Arc<RecvOp>> {
        let q = self.ctxs.get_mut(&ctx)?;
        let i = q.posted.iter().position(|op| op.matches(ctx, src, tag))?;
        let op = take_at(&mut q.posted, i)?;
        self.matched(&op.ctx, src, tag);
        Some(op)
    }

    /// Whether a message from `src` with `tag` on `ctx` may go straight into a receive that
    /// was never posted here (see `SocketTransport::take_inline_now`): no posted receive or
    /// waiting probe would take it, and no unexpected message from `src` is queued on `ctx`
    /// (one could come before it).
    pub fn clear_for(&self, ctx: u64, src: u32, tag: u64) -> bool {
        let Some(q) = self.ctxs.get(&ctx) else { return true };
        q.probes.is_empty() && !q.posted.iter().any(|op| op.matches(ctx, src, tag)) && !q.unexpected.iter().any(|m| m.src == src)
    }

    /// Takes the first complete unexpected message that `op` accepts.
    pub fn take_unexpected(&mut self, op: &RecvOp) -> Option<Unexpected> {
        self.take_matching(&op.ctx, op.src, op.tag)
    }

    /// Takes the first complete unexpected message on `ctx` from `src` (None: any) whose tag
    /// `tag` accepts (a matched probe, or a receive).
    pub fn take_matching(&mut self, ctx: &Arc<CtxState>, src: Option<u32>, tag: TagMatch) -> Option<Unexpected> {
        let q = self.ctxs.get_mut(&ctx.id)?;
        let i = q.unexpected.iter().position(|m| src.is_none_or(|s| s == m.src) && tag.accepts(m.tag))?;
        let msg = take_at(&mut q.unexpected, i)?;
        self.account(&msg, false);
        self.matched(ctx, msg.src, msg.tag);
        Some(msg)
    }

    /// The envelope (length, source, user tag) of the first complete unexpected message on
    /// `ctx` from `src` (None: any) that `tag` accepts, left in the queue.
    pub fn peek(&self, ctx: u64, src: Option<u32>, tag: TagMatch) -> Option<Done> {
        let q = self.ctxs.get(&ctx)?;
        q.unexpected.iter().find(|m| src.is_none_or(|s| s == m.src) && tag.accepts(m.tag)).map(Unexpected::envelope)
    }

    /// Registers a blocking probe (an op whose buffer is never written): completed with the
    /// envelope of the first message it accepts, now if one is queued.
    pub fn push_probe(&mut self, op: Arc<RecvOp>) {
        if let Some(d) = self.peek(op.ctx.id, op.src, op.tag) {
            op.comp.complete(Ok(d));
            return;
        }
        self.ctxs.entry(op.ctx.id).or_default().probes.push(op);
    }

    /// Removes a probe that gave up; true if it was still waiting.
    pub fn remove_probe(&mut self, op: &Arc<RecvOp>) -> bool {
        let Some(q) = self.ctxs.get_mut(&op.ctx.id) else { return false };
        let before = q.probes.len();
        q.probes.retain(|p| !Arc::ptr_eq(p, op));
        q.probes.len() != before
    }

    /// Answers owed to synchronous sends, taken (see `Matcher::acks`).
    pub fn take_acks(&mut self) -> Vec<(Arc<CtxState>, u32, u64)> {
        std::mem::take(&mut self.acks)
    }

    pub fn has_acks(&self) -> bool {
        !self.acks.is_empty()
    }

    pub fn push_posted(&mut self, op: Arc<RecvOp>) {
        self.ctxs.entry(op.ctx.id).or_default().posted.push_back(op);
    }

    /// Completes the probes waiting on `q` that accept `msg` (it stays queued).
    fn wake_probes(q: &mut Queues, msg: &Unexpected) {
        if q.probes.is_empty() {
            return;
        }
        q.probes.retain(|p| {
            let hit = p.src.is_none_or(|s| s == msg.src) && p.tag.accepts(msg.tag);
            if hit {
                p.comp.complete(Ok(msg.envelope()));
            }
            !hit
        });
    }

    pub fn push_unexpected(&mut self, ctx: u64, msg: Unexpected) {
        self.account(&msg, true);
        let q = self.ctxs.entry(ctx).or_default();
        Matcher::wake_probes(q, &msg);
        q.unexpected.push_back(msg);
    }

    /// Puts back a message taken by a receive that was then withdrawn, at the head of its
    /// context's queue: every message before it came from another pair or tag, so per pair and
    /// tag the order is kept. A synchronous send was answered when it was taken: it is not
    /// answered again.
    pub fn return_unexpected(&mut self, ctx: u64, mut msg: Unexpected) {
        self.account(&msg, true);
        msg.tag = user_tag(msg.tag);
        let q = self.ctxs.entry(ctx).or_default();
        Matcher::wake_probes(q, &msg);
        q.unexpected.push_front(msg);
    }

    /// When the longest-parked message was parked, if any is.
    pub fn oldest_parked(&self) -> Option<Instant> {
        if self.parked == 0 {
            return None;
        }
        self.ctxs.values().flat_map(|q| q.unexpected.iter()).filter_map(|m| Some(m.parked()?.since)).min()
    }

    /// Fetches every message parked at or before `cutoff`: `fetch(src, parked, held)` (held:
    /// the bytes of `src` held here) returns its bytes, which replace it in place (order
    /// kept), or says to leave it parked (over the bound of held bytes) or to drop it.
    pub fn fetch_parked(&mut self, cutoff: Instant, mut fetch: impl FnMut(u32, &Parked, usize) -> Fetched) {
        if self.parked == 0 {
            return;
        }
        let Matcher { ctxs, parked, held, .. } = self;
        for q in ctxs.values_mut() {
            q.unexpected.retain_mut(|m| {
                let Content::InSender(p) = &mut m.content else { return true };
                if p.since > cutoff {
                    return true;
                }
                let h = held.entry(m.src);
                match fetch(m.src, p, *h) {
                    Fetched::Bytes(data) => {
                        *parked -= 1;
                        *h += data.len();
                        m.content = Content::Bytes(data);
                        true
                    }
                    Fetched::KeepUntil(t) => {
                        p.since = t;
                        true
                    }
                    Fetched::Drop => {
                        *parked -= 1;
                        false
                    }
                }
            });
        }
    }

    /// Drops the message `cookie` of `src` if it is still parked in its sender's memory (the
    /// sender withdrew it); whether it was.
    pub fn withdraw_parked(&mut self, src: u32, cookie: u64) -> bool {
        if self.parked == 0 {
            return false;
        }
        let is_it = |m: &Unexpected| m.src == src && matches!(&m.content, Content::InSender(p) if p.cookie == cookie);
        let Some(q) = self.ctxs.values_mut().find(|q| q.unexpected.iter().any(is_it)) else { return false };
        let i = q.unexpected.iter().position(is_it).expect("found above");
        let m = q.unexpected.remove(i).expect("position is in range");
        self.account(&m, false);
        true
    }

    /// Whether any receive, probe or pull of an offered message waits here for data.
    pub fn has_posted(&self) -> bool {
        !self.pulls.is_empty() || self.ctxs.values().any(|q| !q.posted.is_empty() || !q.probes.is_empty())
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

    /// Forgets a destroyed context: drops its unexpected messages and returns those still in
    /// their senders' memory (parked or offered, not pulled), as (source, parked), so their
    /// senders can be released, and the eager credit the others held, by source.
    pub fn remove_ctx(&mut self, ctx: u64) -> (Vec<(u32, Parked)>, Vec<(u32, usize)>) {
        let Some(q) = self.ctxs.remove(&ctx) else { return (Vec::new(), Vec::new()) };
        let mut senders = Vec::new();
        let mut credit = Vec::new();
        for m in &q.unexpected {
            self.account(m, false);
            match &m.content {
                Content::InSender(p) | Content::Offered { offer: p, pulled: false } => senders.push((m.src, *p)),
                _ => {}
            }
            if m.credit > 0 {
                credit.push((m.src, m.credit));
            }
        }
        (senders, credit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::MutBuf;
    use crate::transport::ops::{CtxState, TagMatch};

    fn op(ctx: &Arc<CtxState>, src: Option<u32>, tag: TagMatch, buf: &mut [u8]) -> Arc<RecvOp> {
        RecvOp::new(ctx, src, tag, 0, MutBuf::from_slice(buf))
    }

    #[test]
    fn in_order_per_pair_and_tag_with_wildcards() {
        let ctx = CtxState::new(1, None);
        let mut m = Matcher::default();
        for (src, tag, byte) in [(1u32, 5u64, 10u8), (2, 5, 20), (1, 5, 11), (1, 6, 12)] {
            m.push_unexpected(1, Unexpected::bytes(src, tag, 0, vec![byte]));
        }
        let first = |m: &mut Matcher, r: &RecvOp| match m.take_unexpected(r).unwrap() {
            Unexpected { src, content: Content::Bytes(d), .. } => (src, d[0]),
            other => panic!("{other:?}"),
        };
        let mut b = [0u8; 1];
        let r = op(&ctx, Some(1), TagMatch::Exact(5), &mut b);
        assert_eq!(first(&mut m, &r), (1, 10));
        let r = op(&ctx, Some(1), TagMatch::Exact(5), &mut b);
        assert_eq!(first(&mut m, &r), (1, 11));
        let r = op(&ctx, None, TagMatch::AnyUser, &mut b);
        assert_eq!(first(&mut m, &r), (2, 20));
        let r = op(&ctx, Some(1), TagMatch::AnyUser, &mut b);
        assert_eq!(first(&mut m, &r), (1, 12));
    }

    fn parked(cookie: u64, since: Instant) -> Content {
        Content::InSender(Parked { addr: 0x1000, len: 1, cookie, since })
    }

    #[test]
    fn parked_messages_keep_their_place_when_fetched_and_are_released_with_their_context() {
        let ctx = CtxState::new(1, None);
        let t0 = Instant::now();
        let later = t0 + std::time::Duration::from_secs(1);
        let mut m = Matcher::default();
        m.push_unexpected(1, Unexpected { src: 1, tag: 5, check: 0, content: parked(7, t0), credit: 0 });
        m.push_unexpected(1, Unexpected::bytes(1, 5, 0, vec![2]));
        m.push_unexpected(1, Unexpected { src: 1, tag: 5, check: 0, content: parked(8, later), credit: 0 });
        assert_eq!(m.oldest_parked(), Some(t0));
        let mut asked = Vec::new();
        m.fetch_parked(t0, |src, p, _| {
            asked.push((src, p.cookie));
            Fetched::Bytes(vec![1])
        });
        assert_eq!(asked, [(1, 7)], "only the overdue one");
        assert_eq!(m.oldest_parked(), Some(later));
        let mut b = [0u8; 1];
        for want in [1u8, 2] {
            let r = op(&ctx, Some(1), TagMatch::Exact(5), &mut b);
            match m.take_unexpected(&r).unwrap().content {
                Content::Bytes(d) => assert_eq!(d, [want]),
                other => panic!("{other:?}"),
            }
        }
        m.push_unexpected(2, Unexpected { src: 0, tag: 1, check: 0, content: parked(9, t0), credit: 0 });
        let (gone, _) = m.remove_ctx(1);
        assert_eq!(gone.iter().map(|(s, p)| (*s, p.cookie)).collect::<Vec<_>>(), [(1, 8)]);
        assert_eq!(m.oldest_parked(), Some(t0), "context 2's message stays");
        m.fetch_parked(later, |_, _, _| Fetched::KeepUntil(later));
        assert_eq!(m.oldest_parked(), Some(later), "one left parked stays, due later");
        m.fetch_parked(later, |_, _, _| Fetched::Drop);
        assert_eq!(m.oldest_parked(), None, "a failed fetch drops the message");
    }

    #[test]
    fn truncation_writes_nothing_past_the_buffer() {
        let ctx = CtxState::new(1, None);
        let mut b = [0u8; 4];
        let r = op(&ctx, Some(0), TagMatch::Exact(0), &mut b[..2]);
        deliver_copy(&r, 0, 0, 0, &[1, 2, 3, 4]);
        assert_eq!(r.comp.result().unwrap().unwrap_err().status, Status::InvalidArgument);
        assert_eq!(b, [1, 2, 0, 0]);
    }

    #[test]
    fn probes_see_without_taking_wait_for_arrivals_and_matches_owe_answers() {
        use crate::transport::ops::{ack_tag, sync_tag};
        let ctx = CtxState::new(1, None);
        let mut m = Matcher::default();
        m.push_unexpected(1, Unexpected::bytes(2, 5, 0, vec![0; 3]));
        m.push_unexpected(1, Unexpected { src: 2, tag: 6, check: 0, content: parked(1, Instant::now()), credit: 0 });
        assert_eq!(m.peek(1, None, TagMatch::Exact(6)), Some(Done { bytes: 1, source: 2, tag: 6 }), "a parked one's length");
        assert_eq!(m.peek(1, Some(2), TagMatch::AnyUser).map(|d| d.tag), Some(5), "first in line");
        assert_eq!(m.peek(1, Some(3), TagMatch::AnyUser), None);
        assert_eq!(m.peek(2, None, TagMatch::AnyUser), None, "another context");
        // A waiting probe is completed by the first message it accepts, which stays queued.
        let mut none = [0u8; 0];
        let p = op(&ctx, Some(3), TagMatch::AnyUser, &mut none);
        m.push_probe(p.clone());
        assert!(!p.comp.is_done());
        m.push_unexpected(1, Unexpected::bytes(4, 9, 0, vec![1]));
        assert!(!p.comp.is_done(), "not from rank 3");
        m.push_unexpected(1, Unexpected::bytes(3, sync_tag(11, 9), 0, vec![1, 2]));
        assert_eq!(p.comp.result().unwrap().unwrap(), Done { bytes: 2, source: 3, tag: 9 }, "the user tag");
        assert!(!m.remove_probe(&p), "gone once completed");
        let q = op(&ctx, None, TagMatch::Exact(77), &mut none);
        m.push_probe(q.clone());
        assert!(m.remove_probe(&q) && !q.comp.is_done());
        // Taking a synchronous send owes its sender an answer; put back, it is not owed again.
        assert!(!m.has_acks());
        let msg = m.take_matching(&ctx, Some(3), TagMatch::Exact(9)).unwrap();
        let acks = m.take_acks();
        assert_eq!(acks.iter().map(|(c, s, t)| (c.id, *s, *t)).collect::<Vec<_>>(), [(1, 3, ack_tag(11))]);
        m.return_unexpected(1, msg);
        let again = m.take_matching(&ctx, Some(3), TagMatch::Exact(9)).unwrap();
        assert_eq!(again.len(), 2);
        assert!(!m.has_acks());
        // A posted receive that takes one likewise.
        let mut b = [0u8; 4];
        m.push_posted(op(&ctx, None, TagMatch::AnyUser, &mut b));
        assert!(m.take_posted(1, 5, sync_tag(12, 1)).is_some());
        assert_eq!(m.take_acks().len(), 1);
    }

    #[test]
    fn any_tag_never_matches_collective_traffic() {
        assert!(!TagMatch::AnyUser.accepts(crate::transport::ops::COLL_TAG_BIT | 3));
        assert!(TagMatch::AnyUser.accepts(3));
    }
}
