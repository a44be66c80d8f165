//! Frames through the shared-memory rings to and from peers of our host (`ring`): inline bodies,
//! announcements, streamed messages (`stream`), what waits for room, the doorbell, and the
//! waiters that spin on the rings (`RingSpin`).

use super::endpoint::{Event, Peer, SocketTransport, lock};
use super::frame::{FrameKind, Header};
use super::matching::Unexpected;
use super::stream::StreamIn;
use super::abort::aborted_error;
use super::wire::Wire;
use super::ops::RecvOp;
use super::protocol::{self, Record};
use super::ring::RingSegment;
use super::crowded::inline_max_unpicked;
use super::stream::StreamOut;
use super::ops::{CtxState, SendOp};
use crate::buffer::{ConstBuf, MutBuf};
use crate::completion::{Done, Poll};
use crate::placement::Seats;
use crate::error::{Error, Result, Status};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Our ring in a peer's segment, and the frames that did not fit yet (sent in order as the
/// peer makes room).
pub(super) struct RingOut {
    pub(super) seg: RingSegment,
    pub(super) index: usize,
    pub(super) tx: Mutex<RingTx>,
}

/// The writer's side of a ring (one writer at a time: this lock).
#[derive(Default)]
pub(super) struct RingTx {
    /// Frames waiting for room, in order.
    pub(super) backlog: VecDeque<Vec<u8>>,
    /// Our last look at the reader's position (see `RingSegment::try_write`).
    pub(super) head: u64,
    /// Messages the peer asked us to stream (`Cts`), appended after the backlog, in order.
    pub(super) streams: VecDeque<StreamOut>,
    /// Frames moved from the backlog and streams into the ring so far.
    pub(super) flushed: u64,
}

/// Our own ring segment: one incoming ring per same-host peer.
pub(super) struct RingsIn {
    pub(super) seg: RingSegment,
    /// By world rank: that peer's ring in our segment.
    pub(super) index: Vec<Option<usize>>,
}

/// A thread waiting on our rings (see `SocketTransport::spin_on_rings`).
pub struct RingSpin<'a> {
    pub(super) t: &'a SocketTransport,
    pub(super) rings: &'a RingsIn,
    /// World rank whose answer the wait needs, if one (a receive from it, a send to it).
    pub(super) awaited: Option<u32>,
}

impl Poll for RingSpin<'_> {
    fn poll(&self) -> bool {
        self.t.poll_rings()
    }

    fn awaited_on_core(&self) -> bool {
        self.awaited.is_some_and(|r| self.t.peer_on_core(r))
    }

    fn yielding(&self, away: bool) {
        self.rings.seg.off_core(away);
    }

    fn seats(&self) -> Option<Seats<'_>> {
        let awaited = self.awaited.and_then(|r| self.t.peer_if_known(r)).and_then(|p| p.ring_out.get()).map(|o| o.seg.cpu_word());
        Some(Seats { mine: self.rings.seg.cpu_word(), awaited })
    }
}

impl RingSpin<'_> {
    /// Registers as asleep (writers ring the doorbell meanwhile) until the returned guard is
    /// dropped.
    pub fn pause(&self) -> RingSpinPause<'_> {
        self.rings.seg.sleep_start();
        self.rings.seg.spin_stop();
        // A writer that did not see us asleep yet rang no doorbell, and a reader that saw us
        // spinning did not ring back: look once more.
        let _ = self.t.poll_rings();
        RingSpinPause(self)
    }
}

impl Drop for RingSpin<'_> {
    fn drop(&mut self) {
        self.rings.seg.spin_stop();
        self.t.flush_all_rings();
    }
}

/// A paused `RingSpin`: asleep until this is dropped.
pub struct RingSpinPause<'a>(&'a RingSpin<'a>);

impl Drop for RingSpinPause<'_> {
    fn drop(&mut self) {
        self.0.rings.seg.spin_start();
        self.0.rings.seg.sleep_stop();
    }
}

impl SocketTransport {
    /// Appends a message of at most the ring's `inline_max()` bytes to `peer`'s ring (or queues a
    /// copy, in order, for room): the send is complete.
    pub(super) fn write_inline(&self, peer: &Arc<Peer>, ctx: u64, tag: u64, check: u32, buf: ConstBuf) -> Done {
        // SAFETY: the caller's buffer is valid during this call; the ring keeps a copy.
        let body = unsafe { buf.as_slice() };
        self.ring_write(peer, &[&Header::data(ctx, tag, check, buf.len()).encode(), body]);
        Done { bytes: buf.len(), source: peer.rank, tag }
    }

    /// A send to a peer on our host: small bodies go inside the ring (the send is then done),
    /// larger ones single-copy with the `Rts` in the ring.
    pub(super) fn post_via_ring(&self, peer: &Arc<Peer>, ctx: &Arc<CtxState>, tag: u64, check: u32, op: Arc<SendOp>) -> Result<Arc<SendOp>> {
        if let Some(e) = peer.gone_error() {
            return Err(e);
        }
        if peer.ring_out.get().is_some_and(|o| self.goes_inline(peer, o.seg.inline_max(), op.buf.len())) {
            op.comp.complete(Ok(self.write_inline(peer, ctx.id, tag, check, op.buf)));
        } else {
            let (_, hdr, body) = self.rts_frame(peer, ctx, tag, check, &op);
            self.ring_write(peer, &[&hdr.encode(), &body]);
        }
        Ok(op)
    }

    /// Appends a frame to the peer's ring, after whatever waits for room (in order); rings the
    /// peer's doorbell unless it is watching.
    pub(super) fn ring_write(&self, peer: &Arc<Peer>, parts: &[&[u8]]) {
        let Some(out) = peer.ring_out.get() else { return };
        let mut tx = lock(&out.tx);
        self.flush_backlog(out, &mut tx);
        let RingTx { backlog, head, .. } = &mut *tx;
        if !backlog.is_empty() || !out.seg.try_write(out.index, parts, head) {
            backlog.push_back(parts.concat());
            self.backlogged.fetch_add(1, Ordering::Relaxed);
            self.pump(out, &mut tx);
        }
        drop(tx);
        self.bell_if_needed(peer, out);
    }

    /// Appends what waits (frames, then streamed messages) while it fits; if something is
    /// left, asks the peer to ring back once it made room.
    pub(super) fn pump(&self, out: &RingOut, tx: &mut RingTx) {
        if !self.flush_backlog(out, tx) {
            out.seg.mark_waiting(out.index);
            // The peer may have drained between our try and the mark: try once more.
            self.flush_backlog(out, tx);
        }
    }

    /// After a write to `peer`'s ring: its doorbell, if a thread of it sleeps in a wait.
    pub(super) fn bell_if_needed(&self, peer: &Arc<Peer>, out: &RingOut) {
        if out.seg.needs_bell(out.index) {
            let _ = self.send_control(peer, Header::control(FrameKind::Bell, 0));
        }
    }

    /// Moves waiting frames, then the chunks of streamed messages, into the ring while they
    /// fit; true when nothing is left. A streamed send completes with its last chunk.
    pub(super) fn flush_backlog(&self, out: &RingOut, tx: &mut RingTx) -> bool {
        let RingTx { backlog, head, streams, flushed } = tx;
        while let Some(f) = backlog.front() {
            if !out.seg.try_write(out.index, &[f], head) {
                return false;
            }
            *flushed += 1;
            backlog.pop_front();
            self.backlogged.fetch_sub(1, Ordering::Relaxed);
        }
        while let Some(s) = streams.front_mut() {
            let chunk = s.next_chunk();
            let hdr = Header { kind: FrameKind::Chunk, check: 0, ctx: 0, tag: s.cookie, len: chunk.len() as u64 };
            if !out.seg.try_write(out.index, &[&hdr.encode(), chunk], head) {
                return false;
            }
            *flushed += 1;
            s.off += chunk.len();
            if s.done() {
                let s = streams.pop_front().expect("front exists");
                self.backlogged.fetch_sub(1, Ordering::Relaxed);
                if let Some(op) = &s.op {
                    op.comp.complete(s.finished());
                }
            }
        }
        true
    }

    /// The peer asked for our single-copy message `cookie` through the ring: stream it.
    pub(super) fn start_stream(&self, peer: &Arc<Peer>, cookie: u64) {
        // Gone if the send was withdrawn meanwhile (the peer's receive then times out).
        let Some(op) = lock(&peer.awaiting_fin).remove(&cookie) else { return };
        let Some(out) = peer.ring_out.get() else {
            op.comp.complete(Err(Error::new(Status::Internal, format!("rank {} asked for a stream without a ring", peer.rank))));
            return;
        };
        let mut tx = lock(&out.tx);
        tx.streams.push_back(StreamOut::new(cookie, op, out.seg.stream_chunk()));
        self.backlogged.fetch_add(1, Ordering::Relaxed);
        self.pump(out, &mut tx);
        drop(tx);
        self.bell_if_needed(peer, out);
    }

    /// Sends what waits for room in the ring to `peer`; whether anything went.
    pub(super) fn flush_ring(&self, peer: &Arc<Peer>) -> bool {
        let Some(out) = peer.ring_out.get() else { return false };
        let mut tx = lock(&out.tx);
        if tx.backlog.is_empty() && tx.streams.is_empty() {
            return false;
        }
        let before = tx.flushed;
        self.pump(out, &mut tx);
        let moved = tx.flushed != before;
        drop(tx);
        if moved {
            self.bell_if_needed(peer, out);
        }
        moved
    }

    /// Sends what waits for room in every ring; whether anything went.
    pub(super) fn flush_all_rings(&self) -> bool {
        if self.backlogged.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.active().iter().fold(false, |moved, p| self.flush_ring(p) | moved)
    }

    /// A chunk of a message `peer` streams to us: into its receive; the last one completes it.
    pub(super) fn on_chunk(&self, peer: &Peer, cookie: u64, data: &[u8]) {
        let mut streams = lock(&peer.streams_in);
        // Chunks come in the order of our `Cts`s: the stream is nearly always the first.
        let Some(i) = streams.iter().position(|s| s.cookie == cookie) else { return };
        if streams[i].take(data) {
            let mut s = streams.remove(i);
            let (len, took) = s.timing();
            s.finish(None);
            self.ring_read_took(true, len, took);
        }
    }

    /// Sets up our incoming rings (`index`: by world rank, that peer's ring in `seg`). Init
    /// calls this before telling peers where the segment is.
    pub fn attach_incoming_rings(&self, seg: RingSegment, index: Vec<Option<usize>>) {
        let _ = self.rings_in.set(RingsIn { seg, index });
    }

    /// From now on, frames to `peer` go through ring `index` of its segment. Init calls this
    /// before any message is sent.
    pub fn attach_outgoing_ring(&self, peer: u32, seg: RingSegment, index: usize) {
        let p = self.peer(peer);
        let _ = p.ring_out.set(RingOut { seg, index, tx: Mutex::new(RingTx::default()) });
        self.activate(p);
    }

    /// Bytes of our segment of incoming rings (0 without one).
    pub fn incoming_ring_bytes(&self) -> usize {
        self.rings_in.get().map_or(0, |r| r.seg.bytes())
    }

    /// Whether some peer sends to us through a ring (waiters then spin on the rings).
    pub fn has_rings(&self) -> bool {
        self.rings_in.get().is_some()
    }

    /// Reads the frames `peer` put in our ring. The caller holds the peer's `rx` lock (one
    /// reader per ring; a canceller of a receive waits for that lock, as for socket data).
    pub(super) fn drain_ring_locked(&self, peer: &Peer, events: &mut Vec<Event>) -> bool {
        let Some(rings) = self.rings_in.get() else { return false };
        let Some(i) = rings.index.get(peer.rank as usize).copied().flatten() else { return false };
        let n = rings.seg.drain(i, |rec| self.on_ring_frame(peer, rec, events));
        if ring_back_due(rings, i, peer) {
            events.push(Event::Bell);
        }
        n > 0
    }

    pub(super) fn on_ring_frame(&self, peer: &Peer, rec: &[u8], events: &mut Vec<Event>) {
        match protocol::decode_record(rec) {
            Ok(Record::Data(h, body)) => self.deliver_or_file(h.ctx, peer.rank, h.tag, h.check, Cow::Borrowed(body), 0),
            Ok(Record::Rts(h, rts)) => self.on_rts(peer, h, rts, true, events),
            Ok(Record::Chunk { cookie, data }) => self.on_chunk(peer, cookie, data),
            Ok(Record::Cts { cookie }) => events.push(Event::Cts { cookie }),
            Ok(Record::Fin { cookie, ok }) => events.push(Event::Fin { cookie, ok }),
            Ok(Record::Withdraw { cookie }) => events.push(Event::Withdraw { cookie }),
            Err(e) => events.push(Event::Gone(e.msg)),
        }
    }

    /// For a spinning waiter: reads every ring that has frames (skipping peers whose
    /// connection another thread is reading) and sends what waits for room; whether it read
    /// or sent anything.
    pub fn poll_rings(&self) -> bool {
        let Some(rings) = self.rings_in.get() else { return false };
        let mut events = Vec::new();
        let mut moved = false;
        for (r, i) in rings.index.iter().enumerate() {
            let Some(i) = *i else { continue };
            if !rings.seg.has_records(i) {
                continue;
            }
            let peer = self.peer(r as u32);
            if let Ok(_rx) = peer.rx.try_lock() {
                moved |= self.drain_ring_locked(peer, &mut events);
            }
            if !events.is_empty() {
                self.handle_events(peer, &mut events);
            }
        }
        self.flush_all_rings() | moved
    }

    /// A blocking receive's first look for a message from `src`, a peer of our host, with
    /// exactly `tag` (a synchronous send's tag differs) and `check`: taken straight from the
    /// ring into `buf` if it is the ring's next record, or becomes it within `polls` looks,
    /// and fits, and nothing queued here would take it or comes before it
    /// (`Matcher::clear_for`). No receive op is made, posted, matched, completed and freed:
    /// that was about half of a 16-byte exchange's instructions. None: the caller posts the
    /// receive as usual, which finds whatever this look left.
    pub fn take_inline_now(&self, ctx: &CtxState, src: u32, tag: u64, check: u32, buf: MutBuf, polls: u32) -> Option<Done> {
        let rings = self.rings_in.get()?;
        let i = rings.index.get(src as usize).copied().flatten()?;
        let mut left = polls;
        while !rings.seg.has_records(i) {
            left = left.checked_sub(1)?;
            std::hint::spin_loop();
        }
        let peer = self.peer(src);
        let rx = peer.rx.try_lock().ok()?;
        let m = lock(&self.matcher);
        if !m.clear_for(ctx.id, src, tag) {
            return None;
        }
        let mut got = None;
        rings.seg.take_next(i, |rec| match protocol::decode_record(rec) {
            Ok(Record::Data(h, body)) if h.ctx == ctx.id && h.tag == tag && h.check == check && body.len() <= buf.len() => {
                // SAFETY: the caller's buffer is valid for its length during this call, and
                // no op refers to it.
                unsafe { buf.as_mut_slice()[..body.len()].copy_from_slice(body) };
                got = Some(Done { bytes: body.len(), source: src, tag });
                true
            }
            _ => false,
        });
        drop(m);
        let ring_back = got.is_some() && ring_back_due(rings, i, peer);
        drop(rx);
        if ring_back {
            self.handle_events(peer, &mut vec![Event::Bell]);
        }
        got
    }

    /// Whether world rank `r` holds its core, where its wire can tell (see `Wire::peer_on_core`).
    pub(super) fn peer_on_core(&self, r: u32) -> bool {
        self.peer_if_known(r).is_some_and(|p| self.wire(p).peer_on_core(p))
    }

    /// For a thread about to wait (None when we have no rings): it polls the rings while it
    /// spins, and registers as asleep while it sleeps (`RingSpin::pause`), so that writers then
    /// ring the doorbell. Reads what is there already. `awaited`: the world rank whose answer
    /// the wait needs, if one (see `Poll`).
    pub fn spin_on_rings(&self, awaited: Option<u32>) -> Option<RingSpin<'_>> {
        let rings = self.rings_in.get()?;
        rings.seg.spin_start();
        self.poll_rings();
        Some(RingSpin { t: self, rings, awaited })
    }
}

/// After records of `peer`'s ring `i` were consumed: whether to ring the writer back. It waits
/// for room, unless one of its threads spins (and so sends on by itself; the ring costs a
/// system call here and a wake-up there). Clears the writer's mark.
fn ring_back_due(rings: &RingsIn, i: usize, peer: &Peer) -> bool {
    rings.seg.take_waiting(i) && !peer.ring_out.get().is_some_and(|o| o.seg.owner_spins())
}

impl SocketTransport {
    /// Whether a body of `len` bytes goes inside a ring that takes bodies up to `inline_max` (a
    /// quarter of the ring, 64 KiB at most): every body it takes does, larger ones are announced
    /// (read single-copy or streamed), and so is every body over `inline_max_unpicked` (16-32
    /// KiB) that would be read single-copy (`ring_message_single_copy`: we may
    /// read the peer's memory, so it may read ours, the same probe and rules; otherwise it would be
    /// streamed, two copies and more steps than inline), unless blocking exchanges lately went
    /// clearly faster with such bodies inline (see `crowded`): neither way wins on every day.
    /// Inline against single-copy, measured on 2026-12-06 (dc-bench
    /// sendrecv, 2 ranks, 5 interleaved rounds, medians of inline/single-copy time): 40 / 48 / 64
    /// KiB 0.53 / 0.58 / 0.66 idle, 0.62 / 0.67 / 0.77 beside a busy process (dcrun), 0.68 / 0.73 /
    /// 0.75 under a plain launcher; in 15 idle rounds 64 KiB 0.74 in medians and 0.94 in means, but
    /// with 3 rounds of 18-25 us where single-copy's worst was 15.5 (the copies' slow mode). (An
    /// earlier run had single-copy ahead from 40 KiB: 64 KiB 0.75 of the inline time idle, 0.58
    /// beside a busy process, the inline copies falling into a mode 3-4x slower at times; and
    /// on 2026-12-08, see `inline_max_unpicked`.)
    fn goes_inline(&self, peer: &Peer, inline_max: usize, len: usize) -> bool {
        len <= inline_max
            && (len <= inline_max_unpicked()
                || !super::messages::ring_message_single_copy(peer, len)
                || crate::placement::yields_lose_the_core()
                || self.crowded.inline())
    }
}

/// The wire through our ring in a same-host peer's segment (set up at init for pairs that
/// map each other's segments): small bodies inline, larger ones announced and streamed.
pub(super) struct RingWire;

impl Wire for RingWire {
    fn can_connect(&self, peer: &Peer) -> bool {
        peer.ring_out.get().is_some()
    }

    fn send(&self, t: &SocketTransport, peer: &Arc<Peer>, ctx: &Arc<CtxState>, tag: u64, check: u32, op: Arc<SendOp>) -> Result<Arc<SendOp>> {
        t.post_via_ring(peer, ctx, tag, check, op)
    }

    /// Up to the ring's `inline_max()` bytes (see `goes_inline`): appended to the ring at once
    /// (or queued, in order, for room).
    fn send_inline(&self, t: &SocketTransport, peer: &Arc<Peer>, ctx: &CtxState, tag: u64, check: u32, buf: ConstBuf) -> Option<Result<Done>> {
        if !t.goes_inline(peer, peer.ring_out.get()?.seg.inline_max(), buf.len()) {
            return None;
        }
        if let Some(e) = ctx.abort_error().or_else(|| peer.gone_error()) {
            return Some(Err(e));
        }
        Some(Ok(t.write_inline(peer, ctx.id, tag, check, buf)))
    }

    /// Announced through the ring: read from the sender's memory by the next wait, or streamed
    /// (see `read_announced`).
    fn fetch(&self, t: &SocketTransport, peer: &Arc<Peer>, op: Arc<RecvOp>, msg: Unexpected) {
        let Some(p) = msg.parked() else { return };
        if t.read_announced(peer, p.len) {
            return t.claim_parked(op, msg);
        }
        lock(&peer.streams_in).push(StreamIn::new(p.cookie, op, msg.src, msg.tag, msg.check, p.len, p.since));
        t.reply(peer, Header { tag: p.cookie, ..Header::control(FrameKind::Cts, 0) });
    }

    /// Through the ring when it has room at once, else the socket.
    fn reply(&self, t: &SocketTransport, peer: &Arc<Peer>, hdr: Header) {
        if let Some(out) = peer.ring_out.get() {
            let mut tx = lock(&out.tx);
            if out.seg.try_write(out.index, &[&hdr.encode()], &mut tx.head) {
                drop(tx);
                t.bell_if_needed(peer, out);
                return;
            }
        }
        let _ = t.send_control(peer, hdr);
    }

    fn send_in_order(&self, t: &SocketTransport, peer: &Arc<Peer>, hdr: Header) {
        t.ring_write(peer, &[&hdr.encode()]);
    }

    fn fail_aborted(&self, _t: &SocketTransport, p: &Peer) {
        for s in lock(&p.streams_in).iter_mut() {
            if let Some(ctx) = s.op.as_ref().map(|o| o.ctx.clone()).filter(|c| c.is_aborted()) {
                s.finish(Some(aborted_error(&ctx)));
            }
        }
        if let Some(out) = p.ring_out.get() {
            for s in lock(&out.tx).streams.iter_mut() {
                if let Some(op) = s.op.as_ref().filter(|o| o.ctx.is_aborted()).cloned() {
                    s.detach();
                    op.comp.complete(Err(aborted_error(&op.ctx)));
                }
            }
        }
    }

    fn fail_all(&self, t: &SocketTransport, peer: &Peer, err: &dyn Fn() -> Error) {
        for mut s in lock(&peer.streams_in).drain(..) {
            s.finish(Some(err()));
        }
        if let Some(out) = peer.ring_out.get() {
            let mut tx = lock(&out.tx);
            for s in tx.streams.drain(..) {
                t.backlogged.fetch_sub(1, Ordering::Relaxed);
                if let Some(op) = s.op {
                    op.comp.complete(Err(err()));
                }
            }
        }
    }

    /// Being streamed: the rest is copied, so the receiver still gets it whole.
    fn withdraw_send(&self, _t: &SocketTransport, peer: &Peer, op: &Arc<SendOp>) {
        if let Some(out) = peer.ring_out.get() {
            let mut tx = lock(&out.tx);
            if let Some(s) = tx.streams.iter_mut().find(|s| s.op.as_ref().is_some_and(|o| Arc::ptr_eq(o, op))) {
                s.detach();
            }
        }
    }

    /// See `RingSegment::owner_on_core`.
    fn peer_on_core(&self, peer: &Peer) -> bool {
        peer.ring_out.get().is_some_and(|o| o.seg.owner_on_core())
    }
}
