//! Posting and matching messages, cancelling them, and single-copy messages (`Rts`, `Fin`, parked
//! messages copied out of the sender's memory, see `cma`): the endpoint's part, over whichever wire
//! a peer uses.

use super::endpoint::{Event, Peer, SocketTransport, lock};
use super::tcp_io::{Body, Sink, TxItem};
use super::cma;
use super::frame::{FrameKind, Header, RTS_LEN};
use super::matching::{deliver_copy, verdict, Content, Fetched, Matcher, Parked, Unexpected, SMALL_BODY};
use super::protocol::Rts;
use super::stream::StreamIn;
use super::wire::WIRES;
use super::ops::{CtxState, RecvOp, SendOp, TagMatch};
use crate::buffer::{ConstBuf, MutBuf};
use crate::completion::Done;
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A single-copy message whose receive is not posted stays in the sender's memory this long
/// (the receive copies it from there); then we copy it out, so the sender is released even if
/// no receive comes (two ranks that both send before they receive do not deadlock). Ranks that
/// outnumber the cores wait their turn for a core for milliseconds: they get longer.
pub(super) fn park_limit() -> Duration {
    if crate::completion::oversubscribed() { Duration::from_millis(10) } else { Duration::from_millis(1) }
}

/// How often a parked message kept in its sender's memory by the bound of unexpected bytes
/// (see `fetch_overdue`) is looked at again.
const OVER_BOUND_RECHECK: Duration = Duration::from_millis(100);

/// A withdrawal waits this long at most for a peer that is in the middle of a message with us
/// (see `SocketTransport::finish_stream_for` and `withdraw_single_copy`); a comm with a short
/// timeout gives less (`Comm::withdraw_grace`).
pub const WITHDRAW_GRACE_MAX: Duration = Duration::from_secs(2);


/// A receive and the parked message it matched.
pub(super) struct Claimed {
    pub(super) op: Arc<RecvOp>,
    pub(super) msg: Unexpected,
    pub(super) since: Instant,
}

/// Whether a large message that `peer` announced through our ring is read from its memory
/// (one copy, `cma`) rather than streamed to us through the ring (two copies, see `stream`).
/// Measured here (sendrecv, interleaved against streaming, 2 ranks): 0.09-0.17x the time from
/// 256 KiB to 16 MiB idle, 0.13-0.70x beside a busy process (see `cma::ring_threshold` for
/// smaller ones). Also where ranks outnumber cores: there streaming was kept from 4 MiB until
/// 2026-12-06 (single-copy 0.90x at 4 MiB but 1.19x at 16 MiB with 4 ranks on 2 cores, 1.07x
/// at 4 MiB with 8), but in the VM's slow state, where a line's transfer between the cores
/// costs most, the stream's hand-offs double its time and the single copy's do not: 4 ranks 4 /
/// 16 MiB 0.47 / 0.65, 8 ranks 0.55-0.70 / 0.55-0.75, 4 ranks beside a busy process 0.5-0.7 /
/// 0.5-0.97 (5 interleaved rounds each), level with MPICH's single copy. In the fast state the
/// stream stays ahead (single copy 1.18-1.19x at 4 MiB with 4 and 8 ranks and at 16 MiB with 4;
/// 0.82 at 16 MiB with 8): the single copy is chosen for being steady, and the better bet.
pub(super) fn ring_message_single_copy(peer: &Peer, len: usize) -> bool {
    peer.cma.is_some() && cma::threshold() > 0 && len >= cma::ring_threshold()
}

/// From this size a message that may be read once (`ring_message_single_copy`) is read or
/// streamed as the receiver's recent times say (see `SocketTransport::read_announced`).
const STREAM_PICK_MIN: usize = 256 * 1024;

impl SocketTransport {
    /// Whether to read a large message that `peer` announced through our ring from its memory
    /// (one copy) or ask for it streamed (two copies, pipelined): the sender does either. Below
    /// `STREAM_PICK_MIN`, and wherever single copies are off, as `ring_message_single_copy`
    /// says; from there by how fast each way went lately (`pick`; reading is the first way, a
    /// stream is taken while it is clearly faster). Neither wins everywhere: on 2026-12-07
    /// (dc-bench sendrecv, VM in its fast state) a stream took half the time of a read from 256
    /// KiB to 16 MiB at 2 ranks, idle and beside a busy process, and at 4 ranks on 2 cores from
    /// 1 MiB; earlier measures, in the VM's slow state, had the read at 0.09-0.17x the stream's
    /// time (see `ring_message_single_copy`).
    pub(super) fn read_announced(&self, peer: &Peer, len: usize) -> bool {
        if !ring_message_single_copy(peer, len) {
            return false;
        }
        len < STREAM_PICK_MIN || !lock(&self.ring_reads).of(len, STREAM_PICK_MIN).second()
    }

    /// A message of `len` bytes announced through a ring was in its receive `took` after its
    /// announce came, read once or `streamed`.
    pub(super) fn ring_read_took(&self, streamed: bool, len: usize, took: Duration) {
        if len >= STREAM_PICK_MIN {
            lock(&self.ring_reads).of(len, STREAM_PICK_MIN).took(streamed, len, took);
        }
    }
}

pub(super) fn cma_failed(rank: u32, e: io::Error) -> Error {
    let status = if e.raw_os_error() == Some(libc::ESRCH) { Status::PeerLost } else { Status::System };
    Error::new(status, format!("copying a message from rank {rank} failed: {e}"))
}

/// Messages at least this large take protocol steps (single-copy announcements, offers, asks,
/// streams) that should progress while their caller computes: starting one makes sure the
/// progress thread watches the sockets (see `want_progress`). Smaller ones wait in the kernel's
/// buffers until their receive is waited for or tested.
const PROGRESS_AT_ONCE_BYTES: usize = 64 * 1024;

thread_local! {
    /// Set while this thread runs a call that waits for what it starts (see `waits_at_once`).
    static WAITS_AT_ONCE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, a call that waits for the operations it starts as soon as it has started them (a
/// blocking send, receive or exchange, a collective): the large messages it starts do not wake
/// the progress thread, since the waiter reads the sockets itself (and, where ranks outnumber
/// cores, sleeps in a poll on them). The wake only made the progress thread and the waiter
/// take turns on the sockets and the cores: 2 ranks over sockets, 5 interleaved rounds,
/// without/with it, sendrecv 64 KiB 0.63-0.70 of the time, 256 KiB 0.80, allreduce 64 KiB 0.55.
pub fn waits_at_once<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            WAITS_AT_ONCE.with(|w| w.set(self.0));
        }
    }
    let _restore = Restore(WAITS_AT_ONCE.with(|w| w.replace(true)));
    f()
}

/// `waits_at_once` for a call none of whose buffers exceeds `bytes`: where none is large enough
/// for the mark to matter (see `large_start`), `f` runs without it. In a shared library each
/// look at a thread-local is a call into the dynamic linker, two per call, which a 16 B
/// exchange feels.
pub fn waits_at_once_up_to<R>(bytes: usize, f: impl FnOnce() -> R) -> R {
    if bytes < PROGRESS_AT_ONCE_BYTES {
        f()
    } else {
        waits_at_once(f)
    }
}

impl SocketTransport {
    /// Takes the first posted receive that accepts a message from `src` with `tag` on `ctx`,
    /// marked as being filled from `src` before the caller releases the matcher: a canceller
    /// that no longer finds it posted then knows which connection to wait for (see
    /// `cancel_recv`). The caller holds that connection's `rx` and clears the mark when done.
    pub(super) fn claim_posted(&self, m: &mut Matcher, ctx: u64, src: u32, tag: u64) -> Option<Arc<RecvOp>> {
        let op = m.take_posted(ctx, src, tag)?;
        op.filling_from.store(src, Ordering::Release);
        self.note_acks(m);
        Some(op)
    }

    /// A message of `len` bytes starts: a large one makes sure the progress thread watches the
    /// sockets unless its caller waits for it at once (see `waits_at_once`).
    fn large_start(&self, len: usize) {
        if len >= PROGRESS_AT_ONCE_BYTES && !WAITS_AT_ONCE.with(|w| w.get()) {
            self.want_progress();
        }
    }

    /// Starts sending `buf` to world rank `dst`. Completes when the bytes are handed to the kernel.
    pub fn post_send(&self, ctx: &Arc<CtxState>, dst: u32, tag: u64, check: u32, buf: ConstBuf) -> Result<Arc<SendOp>> {
        if let Some(e) = ctx.abort_error() {
            return Err(e);
        }
        let op = SendOp::new(ctx.clone(), dst, buf);
        if dst == self.rank {
            self.send_to_self(ctx.id, tag, check, buf);
            op.comp.complete(Ok(Done { bytes: buf.len(), source: dst, tag }));
            return Ok(op);
        }
        self.large_start(buf.len());
        let peer = self.peer(dst);
        self.wire(peer).send(self, peer, ctx, tag, check, op)
    }

    /// Sends a small message to a peer whose wire takes it whole at once (a ring to a peer on
    /// our host, up to its `inline_max()` bytes), so the send is complete on return and needs no
    /// op to wait on. None where that does not apply (another wire, larger, to ourselves): the
    /// caller posts the send.
    pub fn send_inline(&self, ctx: &CtxState, dst: u32, tag: u64, check: u32, buf: ConstBuf) -> Option<Result<Done>> {
        if dst == self.rank {
            return None;
        }
        let peer = self.peer(dst);
        self.wire(peer).send_inline(self, peer, ctx, tag, check, buf)
    }

    /// Single-copy send: tell the peer where the message is; it completes on the peer's `Fin`.
    pub(super) fn post_rts(&self, peer: &Arc<Peer>, ctx: &Arc<CtxState>, tag: u64, check: u32, op: Arc<SendOp>) -> Result<Arc<SendOp>> {
        let (cookie, hdr, body) = self.rts_frame(peer, ctx, tag, check, &op);
        if let Err(e) = self.enqueue(peer, TxItem { hdr: hdr.encode(), hdr_off: 0, body: Body::Owned(body.to_vec()), off: 0, op: None }) {
            lock(&peer.awaiting_fin).remove(&cookie);
            return Err(e);
        }
        Ok(op)
    }

    /// The `Rts` frame announcing `op`'s buffer, registered to wait for its `Fin`.
    pub(super) fn rts_frame(&self, peer: &Peer, ctx: &CtxState, tag: u64, check: u32, op: &Arc<SendOp>) -> (u64, Header, [u8; RTS_LEN]) {
        let cookie = cma::new_cookie();
        let body = Rts { cookie, addr: op.buf.addr() as u64, len: op.buf.len() as u64 }.encode();
        cma::publish(cookie);
        lock(&peer.awaiting_fin).insert(cookie, op.clone());
        (cookie, Header { kind: FrameKind::Rts, check, ctx: ctx.id, tag, len: RTS_LEN as u64 }, body)
    }

    pub(super) fn send_to_self(&self, ctx: u64, tag: u64, check: u32, buf: ConstBuf) {
        // SAFETY: the caller's send buffer is valid for the duration of this call.
        let data = unsafe { buf.as_slice() };
        self.deliver_or_file(ctx, self.rank, tag, check, Cow::Borrowed(data), 0);
    }

    /// A message received in full: into its posted receive if there is one (copied under the
    /// matcher's lock, so a canceller cannot withdraw the receive meanwhile), else kept as
    /// unexpected (a borrowed `data` is copied only then). `credit`: what it cost its sender's
    /// eager credit (see `flow`), given back once it is consumed.
    pub(super) fn deliver_or_file(&self, ctx: u64, src: u32, tag: u64, check: u32, data: Cow<'_, [u8]>, credit: usize) {
        let mut m = lock(&self.matcher);
        match m.take_posted(ctx, src, tag) {
            Some(op) => {
                self.note_acks(&m);
                deliver_copy(&op, src, tag, check, &data);
                drop(m);
                if let Cow::Owned(body) = data {
                    self.spare.give(body);
                }
                if credit > 0 {
                    self.consumed(self.peer(src), credit);
                }
            }
            None => {
                let body = match data {
                    Cow::Borrowed(b) => m.small_body(b),
                    Cow::Owned(v) => v,
                };
                m.push_unexpected(ctx, Unexpected { credit, ..Unexpected::bytes(src, tag, check, body) })
            }
        }
    }

    /// Posts a receive from world rank `src` (None: any source).
    pub fn post_recv(&self, ctx: &Arc<CtxState>, src: Option<u32>, tag: TagMatch, check: u32, buf: MutBuf) -> Result<Arc<RecvOp>> {
        if let Some(e) = ctx.abort_error() {
            return Err(e);
        }
        self.large_start(buf.len());
        let op = RecvOp::new(ctx, src, tag, check, buf);
        let mut m = lock(&self.matcher);
        if let Some(mut msg) = m.take_unexpected(&op) {
            self.note_acks(&m);
            // An offered message's bytes are to come: where they go is noted before anyone
            // else can see that its entry is gone.
            let ask = self.pull_into(&mut m, &op, &msg);
            // A small body is copied out here, under the lock, so its buffer is kept at once.
            let small = matches!(&msg.content, Content::Bytes(data) if data.len() <= SMALL_BODY);
            if let (true, Content::Bytes(data)) = (small, &mut msg.content) {
                deliver_copy(&op, msg.src, msg.tag, msg.check, data);
                m.keep_small_body(std::mem::take(data));
            }
            drop(m);
            self.send_acks();
            let credit = std::mem::take(&mut msg.credit);
            if credit > 0 {
                self.consumed(self.peer(msg.src), credit);
            }
            match msg.content {
                Content::Bytes(_) if small => {}
                Content::Bytes(ref mut data) => {
                    deliver_copy(&op, msg.src, msg.tag, msg.check, data);
                    self.spare.give(std::mem::take(data));
                }
                Content::Offered { .. } => {
                    if let Some((cookie, want)) = ask {
                        self.ask_for(msg.src, cookie, want);
                    }
                }
                _ => {
                    // Still in the sender's memory: its wire brings it (streamed through a
                    // ring, or copied single-copy).
                    let peer = self.peer(msg.src);
                    self.wire(peer).fetch(self, peer, op.clone(), msg);
                }
            }
            return Ok(op);
        }
        if let Some(s) = src.filter(|&s| s != self.rank) {
            if let Some(e) = self.peer(s).gone_error() {
                return Err(e);
            }
        }
        m.push_posted(op.clone());
        Ok(op)
    }

    /// A receive matched a message that a peer announced over its socket and that is still in
    /// its memory: the copy takes a while, so this call (an irecv perhaps, followed by a send)
    /// goes on, and the next wait makes the copy (see `copy_claimed`).
    pub(super) fn claim_parked(&self, op: Arc<RecvOp>, msg: Unexpected) {
        lock(&self.claimed).push_back(Claimed { op, msg, since: Instant::now() });
        self.claimed_n.fetch_add(1, Ordering::Release);
    }

    /// Withdraws a receive (timeout, abort, drop). On return the transport no longer touches its
    /// buffer; the op is completed with `err` unless it had already finished. A sender in the
    /// middle of streaming to it is given `grace` to finish.
    pub fn cancel_recv(&self, op: &Arc<RecvOp>, err: Error, grace: Duration) {
        let withdrawn = {
            let mut m = lock(&self.matcher);
            m.remove_posted(op) || m.remove_probe(op)
        };
        if withdrawn || self.withdraw_pull(op) {
            op.comp.complete(Err(err));
            return;
        }
        {
            // Waits for a copy in progress; a claim not yet copied gives its message back.
            let mut q = lock(&self.claimed);
            if let Some(i) = q.iter().position(|c| Arc::ptr_eq(&c.op, op)) {
                let c = self.take_claim(&mut q, i);
                lock(&self.matcher).return_unexpected(op.ctx.id, c.msg);
                op.comp.complete(Err(err));
                return;
            }
        }
        let from = op.filling_from.load(Ordering::Acquire);
        if from != u32::MAX && from != self.rank {
            {
                // Whoever took the op from the queue holds this while it sets up the fill (a
                // read into the buffer, or a stream) and while it reads: once we have it, the
                // op is being read here, being streamed, or done.
                let mut rx = lock(&self.peer(from).rx);
                if let Sink::User { op: o, .. } = &rx.sink {
                    if Arc::ptr_eq(o, op) {
                        rx.sink = Sink::Discard;
                        op.filling_from.store(u32::MAX, Ordering::Release);
                        op.comp.complete(Err(err));
                        return;
                    }
                }
            }
            self.finish_stream_for(op, from, grace);
        }
    }

    /// A receive being withdrawn that a peer streams to: the message was taken from the
    /// queue and asked for, so it cannot go back; the receive gets it, as if it had completed
    /// just before (we read our ring until it has). Only if the sender has not finished within
    /// `grace` is the receive failed and the rest of the message dropped. Returns at once if
    /// `op` is not being streamed to.
    pub(super) fn finish_stream_for(&self, op: &Arc<RecvOp>, from: u32, grace: Duration) {
        let peer = self.peer(from);
        let give_up = Instant::now() + grace;
        loop {
            {
                let mut streams = lock(&peer.streams_in);
                match streams.iter_mut().find(|s| s.op.as_ref().is_some_and(|o| Arc::ptr_eq(o, op))) {
                    None => return,
                    Some(s) if Instant::now() >= give_up => {
                        let e = Error::new(Status::Timeout, format!("rank {from} stopped streaming a message to a withdrawn receive"));
                        dc_log!(Level::Warn, Some(self.rank as usize), "{}; its rest is dropped", e.msg);
                        s.finish(Some(e));
                        return;
                    }
                    Some(_) => {}
                }
            }
            if !self.poll_rings() {
                std::thread::yield_now();
            }
        }
    }

    /// Withdraws a send: not yet started, it is dropped; half written, the rest is copied so
    /// the stream stays well-formed; announced single-copy, the receiver lets go of it first
    /// (see `withdraw_single_copy`, within `grace`). The op is completed with `err` unless
    /// already finished. On return the transport no longer touches its buffer, and no peer
    /// reads it.
    pub fn cancel_send(&self, op: &Arc<SendOp>, err: Error, grace: Duration) {
        if op.dst != self.rank {
            let peer = self.peer(op.dst);
            self.withdraw_single_copy(peer, op, grace);
            for w in WIRES {
                w.withdraw_send(self, peer, op);
            }
        }
        op.comp.complete(Err(err));
    }

    /// A single-copy send its receiver may be reading: asks the receiver to drop it, or to
    /// finish the read under way, and waits for its `Fin` (a round trip), so the caller may
    /// free the buffer on return. A receiver lost, or silent for `grace` (stopped), is not
    /// waited for: the message is revoked first (`cma::revoke`), so a read of it that ends
    /// later is discarded there instead of delivered from freed memory.
    fn withdraw_single_copy(&self, peer: &Arc<Peer>, op: &Arc<SendOp>, grace: Duration) {
        let Some(cookie) = self.ask_withdraw(peer, op) else { return };
        let give_up = Instant::now() + grace;
        let mut idle_polls = 0u32;
        while lock(&peer.awaiting_fin).contains_key(&cookie) {
            if Instant::now() >= give_up {
                if lock(&peer.awaiting_fin).remove(&cookie).is_some() {
                    cma::revoke(cookie);
                    dc_log!(Level::Warn, Some(self.rank as usize), "rank {} did not answer the withdrawal of a message it may be reading from our memory within {grace:?}; the message is revoked (a read of it that ends later is discarded there)", peer.rank);
                }
                return;
            }
            // The Fin comes over the ring or the socket: read both ourselves (the progress
            // thread may be asleep, or leave the sockets to this waiting thread).
            if self.poll_rings() | self.poll_sockets() {
                idle_polls = 0;
            } else {
                idle_polls += 1;
                if idle_polls < 1000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
    }

    /// Asks `peer` (once) to let go of `op`'s single-copy message if it is still announced and
    /// not finished; its cookie then (it stays in `awaiting_fin` until the peer's `Fin`).
    fn ask_withdraw(&self, peer: &Arc<Peer>, op: &Arc<SendOp>) -> Option<u64> {
        let cookie = lock(&peer.awaiting_fin).iter().find(|(_, o)| Arc::ptr_eq(o, op)).map(|(c, _)| *c)?;
        self.send_withdraw(peer, cookie, op);
        Some(cookie)
    }

    /// Asks `peer` to let go of our single-copy message `cookie` (`op`'s), unless asked before.
    pub(super) fn send_withdraw(&self, peer: &Arc<Peer>, cookie: u64, op: &SendOp) {
        if !op.withdrawn.swap(true, Ordering::AcqRel) {
            self.wire(peer).send_in_order(self, peer, Header { tag: cookie, ..Header::control(FrameKind::Withdraw, 0) });
        }
    }

    /// The receiver of our single-copy message `cookie` is done with it (`ok`: it read it).
    pub(super) fn on_fin(&self, peer: &Arc<Peer>, cookie: u64, ok: bool) {
        let Some(op) = lock(&peer.awaiting_fin).remove(&cookie) else {
            self.offer_dropped(peer, cookie);
            return;
        };
        if op.ctx.is_aborted() {
            op.comp.complete(Err(super::abort::aborted_error(&op.ctx)));
        } else if ok {
            // Read, withdrawn or not: the message was delivered.
            op.comp.complete(Ok(Done { bytes: op.buf.len(), source: op.dst, tag: 0 }));
        } else if op.withdrawn.load(Ordering::Acquire) {
            // Dropped at our request: its withdrawer (`cancel_send`) completes it with its own
            // error.
        } else {
            op.comp.complete(Err(Error::new(Status::System, format!("rank {} could not read the message from our memory", peer.rank))));
        }
    }

    /// `peer` withdraws its single-copy message `cookie`: still parked, it is dropped (no
    /// receive gets it) and the sender told it was not read; claimed by a receive and not yet
    /// read, it is read now (the receive gets it) and the sender told. Anything else: its
    /// read is over and its `Fin` sent, or it is being streamed.
    pub(super) fn on_withdraw(&self, peer: &Arc<Peer>, cookie: u64) {
        if lock(&self.matcher).withdraw_parked(peer.rank, cookie) {
            self.release_sender(peer, cookie, false);
            return;
        }
        // A copy under way holds `claimed` until it is done.
        let mut q = lock(&self.claimed);
        let Some(i) = q.iter().position(|c| c.msg.src == peer.rank && c.msg.parked().is_some_and(|p| p.cookie == cookie)) else { return };
        let c = self.take_claim(&mut q, i);
        self.copy_claim(c);
    }

    /// Takes claim `i` out of the queue (held by the caller).
    fn take_claim(&self, q: &mut VecDeque<Claimed>, i: usize) -> Claimed {
        let c = q.remove(i).expect("position is in range");
        self.claimed_n.fetch_sub(1, Ordering::Release);
        c
    }

    /// Copies a claimed message into its receive and tells its sender. The caller still holds
    /// `claimed`: nobody else knows the op yet, and a canceller waits for that lock.
    fn copy_claim(&self, c: Claimed) {
        if let Some(p) = c.msg.parked() {
            let peer = self.peer(c.msg.src);
            let ok = self.read_into(&c.op, peer, c.msg.tag, c.msg.check, p);
            self.release_sender(peer, p.cookie, ok);
        }
    }

    /// A single-copy message: copy it out of the sender's memory into its posted receive and
    /// tell the sender it may reuse its buffer (or, when it came through our ring, ask the
    /// sender to stream it, see `stream`); with no receive posted, park it (see
    /// [`park_limit`]).
    pub(super) fn on_rts(&self, peer: &Peer, hdr: Header, rts: Rts, via_ring: bool, events: &mut Vec<Event>) {
        let parked = Parked { cookie: rts.cookie, addr: rts.addr, len: rts.len as usize, since: Instant::now() };
        let mut m = lock(&self.matcher);
        let Some(op) = self.claim_posted(&mut m, hdr.ctx, peer.rank, hdr.tag) else {
            m.push_unexpected(hdr.ctx, Unexpected { src: peer.rank, tag: hdr.tag, check: hdr.check, content: Content::InSender(parked), credit: 0 });
            drop(m);
            // The progress thread fetches it if no receive comes in time. Where we have rings
            // it looks every millisecond anyway (see `progress`), well within `park_limit`:
            // waking it for every early announce cost a context switch each, and with more
            // ranks than cores it took a rank's core (4 ranks on 2 cores, 128 KiB ring
            // exchange: about one wake per exchange).
            if self.rings_in.get().is_none() {
                self.wake_progress();
            }
            return;
        };
        drop(m);
        if via_ring && !self.read_announced(peer, parked.len) {
            lock(&peer.streams_in).push(StreamIn::new(parked.cookie, op, peer.rank, hdr.tag, hdr.check, parked.len, parked.since));
            events.push(Event::SendCts { cookie: parked.cookie });
            return;
        }
        // The op is ours: taken from the posted queue, and a canceller waits for this
        // connection's lock, which we hold.
        let ok = self.read_into(&op, peer, hdr.tag, hdr.check, &parked);
        op.filling_from.store(u32::MAX, Ordering::Release);
        events.push(Event::SendFin { cookie: parked.cookie, ok });
    }

    /// Completes `op` (which nobody else may touch meanwhile) with a single-copy message of
    /// `peer` read from its memory; whether the read worked (the sender's `Fin` says so).
    pub(super) fn read_into(&self, op: &RecvOp, peer: &Peer, tag: u64, check: u32, parked: &Parked) -> bool {
        let (keep, result) = verdict(op, peer.rank, tag, check, parked.len);
        // SAFETY: keep <= op.buf.len(), and the caller owns the op.
        let r = unsafe { cma::read_message(peer.cma, parked.cookie, parked.addr, op.buf.as_ptr(), keep) };
        let ok = r.is_ok();
        if ok && peer.ring_out.get().is_some() {
            self.ring_read_took(false, keep, parked.since.elapsed());
        }
        op.comp.complete(r.map_err(|e| cma_failed(peer.rank, e)).and(result));
        ok
    }

    /// Copies the parked messages that receives claimed into those receives: all of them when a
    /// waiting caller helps, those claimed before `cutoff` in the progress thread. Waiters copy
    /// first because the progress thread shares the caller's core when ranks fill the cores: it
    /// would hold up whatever the caller does next (such as its own send) for the whole copy.
    pub fn copy_claimed(&self, cutoff: Option<Instant>) {
        if self.claimed_n.load(Ordering::Acquire) == 0 {
            return;
        }
        loop {
            let mut q = lock(&self.claimed);
            match q.front() {
                Some(c) if cutoff.is_none_or(|t| c.since <= t) => {}
                _ => return,
            }
            let c = self.take_claim(&mut q, 0);
            self.copy_claim(c);
        }
    }

    /// Copies out every message parked longer than [`park_limit`] while its sender's held
    /// bytes stay within the bound (`flow::max_unexpected_bytes`; beyond, only while we wait
    /// for our own send to that sender, see `flow`); returns how long until the next parked
    /// or claimed one is due.
    pub(super) fn fetch_overdue(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut released = Vec::new();
        let mut m = lock(&self.matcher);
        m.fetch_parked(now - park_limit(), |src, p, held| {
            let peer = self.peer(src);
            if held + p.len > super::flow::max_unexpected_bytes() && peer.blocked_sending.load(Ordering::Acquire) == 0 {
                // Stays in the sender's memory until its receive comes (or the bound allows).
                return Fetched::KeepUntil(now + OVER_BOUND_RECHECK);
            }
            let mut data = Vec::new();
            // The length is the sender's word (capped when it came): room is asked for, not
            // assumed.
            let r = match data.try_reserve_exact(p.len) {
                // SAFETY: reading p.len bytes into reserved capacity, then setting the length.
                Ok(()) => unsafe { cma::read_message(peer.cma, p.cookie, p.addr, data.as_mut_ptr(), p.len) },
                Err(e) => Err(io::Error::new(io::ErrorKind::OutOfMemory, format!("no memory for its {} bytes: {e}", p.len))),
            };
            released.push((src, p.cookie, r.is_ok()));
            match r {
                Ok(()) => {
                    unsafe { data.set_len(p.len) };
                    Fetched::Bytes(data)
                }
                Err(e) => {
                    dc_log!(Level::Warn, Some(self.rank as usize), "{}", cma_failed(src, e).msg);
                    Fetched::Drop
                }
            }
        });
        let oldest = m.oldest_parked();
        drop(m);
        let oldest = match (oldest, lock(&self.claimed).front().map(|c| c.since)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let next = oldest.map(|t| (t + park_limit()).saturating_duration_since(now));
        for (src, cookie, ok) in released {
            self.release_sender(self.peer(src), cookie, ok);
        }
        next
    }

    /// Tells the sender of a single-copy message that we are done with its buffer.
    pub(super) fn release_sender(&self, peer: &Arc<Peer>, cookie: u64, ok: bool) {
        self.reply(peer, Header { check: u32::from(!ok), tag: cookie, ..Header::control(FrameKind::Fin, 0) });
    }

    /// Sends a control frame that needs no order (`Fin`, `Cts`) over the peer's wire.
    pub(super) fn reply(&self, peer: &Arc<Peer>, hdr: Header) {
        self.wire(peer).reply(self, peer, hdr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting_at_once() -> bool {
        WAITS_AT_ONCE.with(|w| w.get())
    }

    #[test]
    fn waits_at_once_holds_for_its_call_only_nested_or_unwinding() {
        assert!(!waiting_at_once());
        waits_at_once(|| {
            assert!(waiting_at_once());
            waits_at_once(|| assert!(waiting_at_once()));
            assert!(waiting_at_once(), "an inner call ended the outer one's");
        });
        assert!(!waiting_at_once(), "left set after the call");
        let _ = std::panic::catch_unwind(|| waits_at_once(|| panic!("inside")));
        assert!(!waiting_at_once(), "left set after a panic");
        // Another thread's calls are its own.
        waits_at_once(|| std::thread::spawn(|| assert!(!waiting_at_once())).join().unwrap());
    }

    #[test]
    fn waits_at_once_up_to_marks_only_calls_with_a_large_buffer() {
        // Below the size that consults the mark, it is not set (and an outer call's stays).
        waits_at_once_up_to(PROGRESS_AT_ONCE_BYTES - 1, || assert!(!waiting_at_once()));
        waits_at_once(|| waits_at_once_up_to(16, || assert!(waiting_at_once())));
        waits_at_once_up_to(PROGRESS_AT_ONCE_BYTES, || assert!(waiting_at_once()));
        assert!(!waiting_at_once());
    }
}
