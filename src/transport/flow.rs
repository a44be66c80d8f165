//! Flow control over connections, so that a rank that runs ahead cannot fill a slow rank's
//! memory with messages it has not asked for yet:
//!
//! - **Eager credit.** A sender may have at most [`max_unexpected_bytes`] of eager messages
//!   (each counted with [`MESSAGE_COST`] more for its bookkeeping) not yet consumed by the
//!   receiver; the receiver gives credit back (`Credit` frames, a quarter of the window at a
//!   time) as it consumes them: straight into a posted receive, or out of its unexpected queue.
//! - **Rendezvous.** A message of [`rendezvous_bytes`] or more, or one for which the sender has no
//!   credit, is offered instead (`Offer`: its length and a cookie). The offer takes its place in
//!   the receiver's queue (so messages keep their order); the receive that matches it answers
//!   `Cts`, and the sender then sends its bytes (`Pulled`) straight into that receive.
//! - **No deadlock.** A rank that waits for its own send to a peer takes that peer's offers at
//!   once (and copies its parked single-copy messages out), whatever the bound: two ranks that
//!   both send before they receive still pass each other, as with eager sends.
//!
//! Single-copy messages between ranks of one host (`cma`) were already announced, not sent;
//! the bound applies to copying them out of a sender that waits too long (see
//! `SocketTransport::fetch_overdue`).

use super::endpoint::{Event, Peer, SocketTransport, lock};
use super::frame::{FrameKind, Header, RTS_LEN};
use super::matching::{deliver_copy, verdict, Content, Matcher, Parked, Pull, Unexpected};
use super::ops::{CtxState, RecvOp, SendOp};
use super::protocol::Rts;
use super::tcp_io::{Body, Sink, TxItem};
use crate::error::Result;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// What each eager message costs beyond its bytes (its entry in the receiver's queue).
pub(super) const MESSAGE_COST: usize = 64;

/// `DC_MAX_UNEXPECTED_BYTES`: eager bytes a sender may have unconsumed at a receiver (default
/// 16 MiB per peer; at least 64 KiB).
pub fn max_unexpected_bytes() -> usize {
    static V: once_cell::sync::Lazy<usize> =
        once_cell::sync::Lazy::new(|| crate::params::get().max_unexpected_bytes.unwrap_or(16 << 20).max(64 << 10));
    *V
}

/// `DC_RENDEZVOUS_BYTES`: messages at least this large are offered, not sent eagerly (default
/// 1 MiB; at least 1 KiB).
pub fn rendezvous_bytes() -> usize {
    static V: once_cell::sync::Lazy<usize> =
        once_cell::sync::Lazy::new(|| crate::params::get().rendezvous_bytes.unwrap_or(1 << 20).max(1 << 10));
    *V
}

/// How much of an offered message a receive asks for: what its buffer takes.
fn wanted(op: &RecvOp, offer: &Parked) -> u64 {
    offer.len.min(op.buf.len()) as u64
}

/// A message we offered and the peer has not asked for yet.
pub(super) struct OfferOut {
    pub(super) ctx: u64,
    pub(super) body: Body,
    /// None once the send was withdrawn (its bytes were copied into `body`).
    pub(super) op: Option<Arc<SendOp>>,
}

/// Held while a thread waits for its send to a peer (see `SocketTransport::blocked_on`).
pub struct BlockedSend<'a>(&'a Peer);

impl Drop for BlockedSend<'_> {
    fn drop(&mut self) {
        self.0.blocked_sending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Peer {
    /// Takes `cost` of the eager credit the peer gave us; false if there is not that much.
    fn take_credit(&self, cost: usize) -> bool {
        let cost = cost as i64;
        self.credit.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| (c >= cost).then(|| c - cost)).is_ok()
    }
}

impl SocketTransport {
    /// Bytes of unexpected messages from world rank `src` held here: received, or offered and
    /// asked for (diagnostics and tests of the bound).
    pub fn held_from(&self, src: u32) -> usize {
        lock(&self.matcher).held_from(src)
    }

    /// Sender: whether a message of `len` bytes goes eagerly (its credit is then taken).
    pub(super) fn may_send_eagerly(&self, peer: &Peer, len: usize) -> bool {
        len < rendezvous_bytes() && peer.take_credit(len + MESSAGE_COST)
    }

    /// Sender: offers `op`'s message; it is sent when the peer asks for it (`send_offered`).
    pub(super) fn post_offer(&self, peer: &Arc<Peer>, ctx: &Arc<CtxState>, tag: u64, check: u32, op: Arc<SendOp>) -> Result<Arc<SendOp>> {
        let cookie = super::cma::new_cookie();
        let body = Rts { cookie, addr: 0, len: op.buf.len() as u64 }.encode();
        lock(&peer.offers_out).insert(cookie, OfferOut { ctx: ctx.id, body: Body::User(op.buf), op: Some(op.clone()) });
        let hdr = Header { kind: FrameKind::Offer, check, ctx: ctx.id, tag, len: RTS_LEN as u64 };
        if let Err(e) = self.enqueue(peer, TxItem { hdr: hdr.encode(), hdr_off: 0, body: Body::Owned(body.to_vec()), off: 0, op: None }) {
            lock(&peer.offers_out).remove(&cookie);
            return Err(e);
        }
        Ok(op)
    }

    /// Sender: the peer asked for the first `want` bytes of our message `cookie` (all of it,
    /// unless its receive is shorter): they go now, and the send completes once they are
    /// written. Nothing if `cookie` is no offer of ours (any more).
    pub(super) fn send_offered(&self, peer: &Arc<Peer>, cookie: u64, want: u64) {
        let Some(o) = lock(&peer.offers_out).remove(&cookie) else { return };
        let want = usize::try_from(want).unwrap_or(usize::MAX);
        let body = match o.body {
            Body::User(b) => Body::User(b.prefix(want)),
            Body::Owned(mut v) => {
                v.truncate(want);
                Body::Owned(v)
            }
        };
        let len = match &body {
            Body::User(b) => b.len(),
            Body::Owned(v) => v.len(),
        };
        let hdr = Header { kind: FrameKind::Pulled, check: 0, ctx: o.ctx, tag: cookie, len: len as u64 };
        let op = o.op.clone();
        if let Err(e) = self.enqueue(peer, TxItem { hdr: hdr.encode(), hdr_off: 0, body, off: 0, op: o.op }) {
            if let Some(op) = op {
                op.comp.complete(Err(e));
            }
        }
    }

    /// Sender: the peer dropped our offer `cookie` unread (its communicator was destroyed), as
    /// it drops messages received for it. False if `cookie` is no offer of ours.
    pub(super) fn offer_dropped(&self, peer: &Peer, cookie: u64) -> bool {
        let Some(o) = lock(&peer.offers_out).remove(&cookie) else { return false };
        if let Some(op) = o.op {
            op.comp.complete(Ok(crate::completion::Done { bytes: op.buf.len(), source: op.dst, tag: 0 }));
        }
        true
    }

    /// Sender: the peer consumed `bytes` more of our eager messages.
    pub(super) fn on_credit(&self, peer: &Peer, bytes: u64) {
        // More than was ever taken is the peer's error; capping keeps the bound whatever it says.
        let window = max_unexpected_bytes() as i64;
        let add = bytes.min(window as u64) as i64;
        let _ = peer.credit.fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| Some((c + add).min(window)));
    }

    /// Receiver: `cost` of `peer`'s eager credit was consumed. Once a quarter of the window is
    /// due, the progress thread gives it back (see `give_credit`): this may be called with
    /// the connection's locks held.
    pub(super) fn consumed(&self, peer: &Peer, cost: usize) {
        if cost == 0 {
            return;
        }
        let due = peer.credit_due.fetch_add(cost, Ordering::AcqRel) + cost;
        let quarter = max_unexpected_bytes() / 4;
        if due >= quarter && due - cost < quarter {
            self.credit_owed.store(true, Ordering::Release);
            self.wake_progress();
        }
    }

    /// The progress thread: sends the credit due to each peer (see `consumed`).
    pub(super) fn give_credit(&self) {
        if !self.credit_owed.swap(false, Ordering::AcqRel) {
            return;
        }
        let quarter = max_unexpected_bytes() / 4;
        for peer in self.active().iter() {
            if peer.credit_due.load(Ordering::Acquire) < quarter {
                continue;
            }
            let due = peer.credit_due.swap(0, Ordering::AcqRel);
            let _ = self.send_control(peer, Header { tag: due as u64, ..Header::control(FrameKind::Credit, 0) });
        }
    }

    /// Receiver: `peer` offers a message. A posted receive takes it and asks for it; else it
    /// waits in the queue for one (asked for at once if we wait for our own send to `peer`).
    pub(super) fn on_offer(&self, peer: &Peer, hdr: Header, offer: Rts, events: &mut Vec<Event>) {
        let parked = Parked { cookie: offer.cookie, addr: 0, len: offer.len as usize, since: Instant::now() };
        let mut m = lock(&self.matcher);
        if let Some(op) = self.claim_posted(&mut m, hdr.ctx, peer.rank, hdr.tag) {
            let want = wanted(&op, &parked);
            m.set_pull(peer.rank, offer.cookie, Pull::Recv { op, tag: hdr.tag, check: hdr.check, offer: parked });
            drop(m);
            events.push(Event::AskFor { cookie: offer.cookie, want });
            return;
        }
        let pulled = peer.blocked_sending.load(Ordering::Acquire) > 0;
        m.push_unexpected(hdr.ctx, Unexpected { src: peer.rank, tag: hdr.tag, check: hdr.check, content: Content::Offered { offer: parked, pulled }, credit: 0 });
        drop(m);
        if pulled {
            events.push(Event::AskFor { cookie: offer.cookie, want: offer.len });
        }
    }

    /// Receiver, holding the matcher's lock `m`: receive `op` took the offered message `msg`
    /// out of the queue, so its bytes go to `op`. Returns what to ask for (cookie, bytes), if
    /// nobody asked yet.
    pub(super) fn pull_into(&self, m: &mut Matcher, op: &Arc<RecvOp>, msg: &Unexpected) -> Option<(u64, u64)> {
        let Content::Offered { offer, pulled } = msg.content else { return None };
        op.filling_from.store(msg.src, Ordering::Release);
        m.set_pull(msg.src, offer.cookie, Pull::Recv { op: op.clone(), tag: msg.tag, check: msg.check, offer });
        (!pulled).then(|| (offer.cookie, wanted(op, &offer)))
    }

    /// Receiver: asks `src` for the first `want` bytes of its offered message `cookie`.
    pub(super) fn ask_for(&self, src: u32, cookie: u64, want: u64) {
        // Over the connection, where the offer came (never through a ring).
        let _ = self.send_control(self.peer(src), Header { tag: cookie, ctx: want, ..Header::control(FrameKind::Ask, 0) });
    }

    /// Receiver: the receive of a matched probe's offered message (taken out of the queue
    /// earlier, see `Matcher::set_pull`'s `Waiting`).
    pub(super) fn pull_matched(&self, op: &Arc<RecvOp>, msg: &Unexpected) {
        let Content::Offered { offer, .. } = msg.content else { return };
        let mut m = lock(&self.matcher);
        if let Some(Pull::Arrived(data)) = m.take_pull(msg.src, offer.cookie) {
            drop(m);
            deliver_copy(op, msg.src, msg.tag, msg.check, &data);
            return;
        }
        if let Some((cookie, want)) = self.pull_into(&mut m, op, msg) {
            drop(m);
            self.ask_for(msg.src, cookie, want);
        }
    }

    /// Receiver: where the body of offered message `hdr.tag` (a cookie) goes: its receive, or
    /// its place in the queue (or a matched probe's keeping); nowhere if we did not ask for it.
    pub(super) fn pulled_sink(&self, peer: &Peer, hdr: Header) -> Sink {
        let (src, cookie, len) = (peer.rank, hdr.tag, hdr.len as usize);
        let mut m = lock(&self.matcher);
        let into_queue = || Sink::Unexp { data: self.spare.take(len), fills: Some(cookie) };
        match m.take_pull(src, cookie) {
            Some(Pull::Recv { op, tag, check, offer }) => {
                // Judged by the length offered; the body is what the receive takes of it.
                let (keep, mut result) = verdict(&op, src, tag, check, offer.len);
                if len != keep {
                    let e = format!("rank {src} sent {len} bytes of an offered message of {} where {keep} were asked for", offer.len);
                    result = Err(crate::error::Error::new(crate::error::Status::PeerLost, e));
                }
                Sink::User { op, keep: keep.min(len), result }
            }
            Some(Pull::Drop) => Sink::Discard,
            Some(Pull::Waiting) => {
                m.set_pull(src, cookie, Pull::Waiting);
                into_queue()
            }
            Some(arrived @ Pull::Arrived(_)) => {
                // A second body for one offer: ignored (the first one stays).
                m.set_pull(src, cookie, arrived);
                Sink::Discard
            }
            None if m.has_offer(hdr.ctx, src, cookie) => into_queue(),
            None => Sink::Discard,
        }
    }

    /// Receiver: the body of offered message `cookie` came whole without a receive: it fills
    /// the offer's place in the queue, or goes to the receive (or matched probe) that took it
    /// from there meanwhile.
    pub(super) fn pulled_arrived(&self, peer: &Peer, ctx: u64, cookie: u64, data: Vec<u8>) {
        let mut m = lock(&self.matcher);
        let Some(data) = m.fill_offer(ctx, peer.rank, cookie, data) else { return };
        match m.take_pull(peer.rank, cookie) {
            Some(Pull::Recv { op, tag, check, .. }) => {
                drop(m);
                op.filling_from.store(u32::MAX, Ordering::Release);
                deliver_copy(&op, peer.rank, tag, check, &data);
            }
            Some(Pull::Waiting) => m.set_pull(peer.rank, cookie, Pull::Arrived(data)),
            // Dropped with its communicator, or with its withdrawn receive.
            _ => {}
        }
    }

    /// Receiver: receive `op`, being withdrawn, waits for an offered message's bytes: the
    /// message goes back to the head of its queue (its bytes, asked for, will fill it there).
    /// False if `op` waits for no such bytes.
    pub(super) fn withdraw_pull(&self, op: &Arc<RecvOp>) -> bool {
        let mut m = lock(&self.matcher);
        let Some((src, Pull::Recv { tag, check, offer, .. })) = m.take_pull_of(op) else { return false };
        op.filling_from.store(u32::MAX, Ordering::Release);
        if (wanted(op, &offer) as usize) < offer.len {
            // Only part of it was asked for: it cannot go back whole.
            m.set_pull(src, offer.cookie, Pull::Drop);
        } else {
            m.return_unexpected(op.ctx.id, Unexpected { src, tag, check, content: Content::Offered { offer, pulled: true }, credit: 0 });
        }
        true
    }

    /// A thread is about to wait for its send to world rank `dst`: until the guard drops, the
    /// offers of `dst` are taken at once, and those already queued (and its parked single-copy
    /// messages) now, so that two ranks sending to each other before they receive pass.
    pub fn blocked_on(&self, dst: u32) -> Option<BlockedSend<'_>> {
        if dst == self.rank {
            return None;
        }
        let peer = self.peer(dst);
        peer.blocked_sending.fetch_add(1, Ordering::AcqRel);
        let (rushed, cookies) = {
            let mut m = lock(&self.matcher);
            (m.rush_parked(dst, Instant::now() - super::messages::park_limit()), m.pull_offers_from(dst))
        };
        for (c, len) in cookies {
            self.ask_for(dst, c, len as u64);
        }
        if rushed {
            // The progress thread copies them out.
            self.wake_progress();
        }
        Some(BlockedSend(peer))
    }
}
