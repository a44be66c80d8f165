//! Frames over a TCP connection: the writer's queue (written from the caller's thread when the
//! socket has room, else by the progress thread) and the reader, which stages bytes, feeds them to
//! the sans-IO decoder (`protocol`) and reads large bodies straight into their destination; a
//! waiting thread may read and write the sockets itself (`SocketReader`).

use super::endpoint::{Event, Peer, PeerState, SealIn, SealOut, Sealed, SocketTransport, lock};
use super::seal::{OVERHEAD, RECORD_MAX};
use super::cma;
use super::frame::{Header, HEADER_LEN};
use super::matching::Unexpected;
use super::ops::CtxState;
use super::abort::aborted_error;
use super::wire::Wire;
use super::flow::MESSAGE_COST;
use super::matching::verdict;
use super::protocol::{BodyAt, Decoder, Frame, Step};
use super::ops::{RecvOp, SendOp};
use crate::buffer::ConstBuf;
use crate::completion::{Done, Poll};
use crate::error::{Error, Result, Status};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

/// Bytes staged per connection for batching small frames.
pub(super) const STAGE_LEN: usize = 64 * 1024;

/// Bodies with at least this much left are read straight into their destination.
pub(super) const DIRECT_READ_MIN: usize = 16 * 1024;

/// After a body of at least this many bytes read straight into its destination, the next
/// read takes only the next header, so that a large body that follows is not read into the
/// stage and copied out: one more read per message to save a copy of up to the stage's size.
/// Measured (dc-bench over sockets, 2 ranks, 7-9 interleaved rounds, medians of new/old time;
/// for every body from 16 KiB): broadcast 64 KiB 0.94, 0.94, 1.04 idle and 0.86, 0.97 beside a
/// busy process; broadcast 32 KiB and sendrecv 16 KiB 0.95-1.05 (noise), hence not below this.
const HEADER_FIRST_MIN: usize = 48 * 1024;

/// Messages at least this large that arrive before their receive may be taken over by a
/// receive posted while they arrive (see `SocketTransport::adopt_in_flight`).
pub(super) const ADOPT_MIN: usize = 64 * 1024;

/// An unexpected body read straight from the socket grows its buffer by at least this much.
pub(super) const UNEXP_GROW_MIN: usize = 1 << 20;

/// Where the body of the data frame being read goes (the decoder knows how far it is).
pub(super) enum Sink {
    /// No body is being read.
    Idle,
    /// Filling a posted receive: `keep` bytes go to the buffer, the rest is discarded.
    User { op: Arc<RecvOp>, keep: usize, result: Result<Done> },
    /// No receive was posted: the body is kept (as unexpected) once complete; or, for an
    /// offered message (`fills`: its cookie), fills its place in the queue (see `flow`).
    Unexp { data: Vec<u8>, fills: Option<u64> },
    Discard,
}

/// A connection's reading side: bytes staged from the socket, the protocol's state (sans-IO,
/// see `protocol`) and where the current body goes.
pub(super) struct Rx {
    pub(super) stage: Box<[u8]>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) dec: Decoder,
    pub(super) sink: Sink,
    /// The last body was large and read straight into its destination: read only the next
    /// header (see `HEADER_FIRST_MIN`).
    pub(super) header_first: bool,
}

pub(super) enum Body {
    User(ConstBuf),
    Owned(Vec<u8>),
}

pub(super) struct TxItem {
    pub(super) hdr: [u8; HEADER_LEN],
    pub(super) hdr_off: usize,
    pub(super) body: Body,
    pub(super) off: usize,
    pub(super) op: Option<Arc<SendOp>>,
}

impl TxItem {
    pub(super) fn body(&self) -> &[u8] {
        match &self.body {
            // SAFETY: the op's buffer stays valid until the op completes; it completes only
            // when this item is written, cancelled (body copied first) or failed.
            Body::User(b) => unsafe { b.as_slice() },
            Body::Owned(v) => v,
        }
    }

    /// Stops using the caller's buffer: copies what is left of it and detaches the op.
    pub(super) fn detach(&mut self) -> Option<Arc<SendOp>> {
        if let Body::User(_) = self.body {
            let rest = self.body()[self.off..].to_vec();
            self.body = Body::Owned(rest);
            self.off = 0;
        }
        self.op.take()
    }
}

/// A thread reading and writing the sockets while it spins in a wait (see
/// `SocketTransport::read_while_waiting`).
pub struct SocketReader<'a>(&'a SocketTransport);

impl Poll for SocketReader<'_> {
    fn poll(&self) -> bool {
        self.0.poll_sockets()
    }
}

impl SocketReader<'_> {
    /// Stops reading until the returned guard is dropped (the thread goes to sleep: the
    /// progress thread takes the sockets back meanwhile).
    pub fn pause(&self) -> SocketReaderPause<'_> {
        self.0.leave_sockets();
        SocketReaderPause(self)
    }
}

impl Drop for SocketReader<'_> {
    fn drop(&mut self) {
        self.0.leave_sockets();
    }
}

/// A paused `SocketReader`.
pub struct SocketReaderPause<'a>(&'a SocketReader<'a>);

impl Drop for SocketReaderPause<'_> {
    fn drop(&mut self) {
        self.0 .0.enter_sockets();
    }
}

impl SocketTransport {
    /// Queues a body-less control frame (abort, goodbye, fin) for `peer`.
    pub(super) fn send_control(&self, peer: &Arc<Peer>, hdr: Header) -> Result<()> {
        self.enqueue(peer, TxItem { hdr: hdr.encode(), hdr_off: 0, body: Body::Owned(Vec::new()), off: 0, op: None })
    }

    pub(super) fn enqueue(&self, peer: &Arc<Peer>, item: TxItem) -> Result<()> {
        self.connect_peer(peer, self.connect_wait)?;
        let mut q = lock(&peer.tx);
        // The state's guard must be gone before `gone_error` locks it again.
        let open = match &*lock(&peer.state) {
            PeerState::Up => true,
            // Control frames (our goodbye) still go to a peer that said goodbye first.
            PeerState::Closed => item.op.is_none(),
            PeerState::Lost(_) => false,
        };
        if !open {
            return Err(peer.gone_error().unwrap_or_else(|| Error::new(Status::PeerLost, "peer gone")));
        }
        let was_empty = q.is_empty();
        q.push_back(item);
        if was_empty {
            // Fast path: write from the caller's thread; hand the rest to the progress thread.
            let drained = self.flush(peer, &mut q).unwrap_or(false);
            if !drained {
                peer.tx_busy.store(true, Ordering::Release);
                drop(q);
                self.wake_progress();
            }
        }
        Ok(())
    }

    /// Writes queued frames until the queue is empty (Ok(true)) or the socket is full (Ok(false)).
    pub(super) fn flush(&self, peer: &Peer, q: &mut VecDeque<TxItem>) -> io::Result<bool> {
        if let Some(sealed) = peer.sealed.get() {
            return flush_sealed(peer, q, sealed);
        }
        while let Some(it) = q.front_mut() {
            let body = it.body();
            let hdr_rest = &it.hdr[it.hdr_off..];
            let body_rest = &body[it.off..];
            let iov = [
                libc::iovec { iov_base: hdr_rest.as_ptr() as *mut libc::c_void, iov_len: hdr_rest.len() },
                libc::iovec { iov_base: body_rest.as_ptr() as *mut libc::c_void, iov_len: body_rest.len() },
            ];
            // SAFETY: a zeroed msghdr is valid; iov points at live slices for the call.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = if body_rest.is_empty() { 1 } else { 2 };
            // SAFETY: valid fd and msghdr; MSG_NOSIGNAL turns a broken pipe into EPIPE.
            let n = unsafe { libc::sendmsg(peer.fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(false),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            let mut n = n as usize;
            let h = n.min(hdr_rest.len());
            it.hdr_off += h;
            n -= h;
            it.off += n;
            if it.hdr_off == HEADER_LEN && it.off == it.body().len() {
                let done = q.pop_front().unwrap();
                if let Some(op) = done.op {
                    let bytes = op.buf.len();
                    op.comp.complete(Ok(Done { bytes, source: op.dst, tag: 0 }));
                }
            }
        }
        Ok(true)
    }

    pub(super) fn pump_tx(&self, peer: &Peer) -> Option<Event> {
        self.pump_tx_locked(peer, lock(&peer.tx))
    }

    pub(super) fn pump_tx_locked(&self, peer: &Peer, mut q: MutexGuard<'_, VecDeque<TxItem>>) -> Option<Event> {
        match self.flush(peer, &mut q) {
            Ok(true) => {
                peer.tx_busy.store(false, Ordering::Release);
                None
            }
            Ok(false) => None,
            Err(e) => Some(Event::Gone(format!("write failed: {e}"))),
        }
    }

    /// For a thread waiting on an operation: sleeps in `poll` on the connections (at most `max`,
    /// or until `wake_fd` says the op finished) and reads whatever arrived itself. Saves the hop
    /// through the progress thread (a wake-up costs 15-30 us here).
    pub fn wait_readable(&self, max: Duration, wake_fd: RawFd) {
        let active = self.active();
        let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(active.len() + 1);
        let mut who: Vec<&Arc<Peer>> = Vec::with_capacity(active.len());
        for p in active.iter().filter(|p| p.connected() && !p.rx_done.load(Ordering::Acquire)) {
            pfds.push(libc::pollfd { fd: p.fd(), events: libc::POLLIN, revents: 0 });
            who.push(p);
        }
        pfds.push(libc::pollfd { fd: wake_fd, events: libc::POLLIN, revents: 0 });
        let ms = max.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: pfds is a valid array of pollfd for the call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        if n <= 0 {
            return;
        }
        let mut events = Vec::new();
        // `who` is one shorter than `pfds`: the last entry is the wake-up descriptor.
        for (pfd, peer) in pfds.iter().zip(who) {
            if pfd.revents == 0 {
                continue;
            }
            // If the progress thread is reading this connection, wait for it rather than spin:
            // it may be copying a large message on the core we share.
            self.pump_locked(peer, lock(&peer.rx), &mut events);
            if !events.is_empty() {
                self.handle_events(peer, &mut events);
            }
        }
    }

    /// For a thread about to wait on a transport without shared-memory rings: while it spins,
    /// it reads and writes the sockets itself (`poll_sockets`), and the progress thread leaves
    /// them alone (until the guard is dropped or paused to sleep). Data that completes the
    /// wait is then read by the thread that waits for it, as it arrives, instead of waking the
    /// progress thread, which preempts the waiter on its core and wakes it in turn (with a
    /// large message, once per arriving burst).
    pub fn read_while_waiting(&self) -> SocketReader<'_> {
        self.enter_sockets();
        SocketReader(self)
    }

    /// A reader starts (or resumes) reading. The progress thread may be asleep watching the
    /// sockets: nothing to change there (if it wakes, it sees us and leaves them alone).
    pub(super) fn enter_sockets(&self) {
        self.socket_readers.fetch_add(1, Ordering::SeqCst);
    }

    /// A reader stops reading; the last one hands the sockets back to the progress thread,
    /// waking it only when something may need it now (`sockets_have_work`): a blocking
    /// exchange whose receive just completed leaves nothing behind, and waking the progress
    /// thread after every one preempted the rank on its core (measured, 2 ranks over sockets:
    /// a 16 B sendrecv 38-44 us with the wake, 17-23 us without). Otherwise the progress thread
    /// takes the sockets back within `HANDBACK_LATE_MS`, when its safety-net poll ends.
    pub(super) fn leave_sockets(&self) {
        if self.socket_readers.fetch_sub(1, Ordering::SeqCst) == 1 {
            if self.sockets_have_work() {
                self.wake_progress();
            } else {
                self.sockets_unwatched.store(true, Ordering::Release);
            }
        }
    }

    /// Something wants the sockets read soon (a test of an unfinished operation, a large
    /// message starting): wakes the progress thread if the last reader left without doing so.
    pub fn want_progress(&self) {
        if self.sockets_unwatched.load(Ordering::Relaxed) && self.sockets_unwatched.swap(false, Ordering::AcqRel) {
            self.wake_progress();
        }
    }

    /// Whether the sockets have work for the progress thread while no one waits: receives or
    /// probes posted (their data may come), offered or single-copy sends waiting for their
    /// peer, bytes queued to write, claimed copies, acknowledgements or credit owed, messages
    /// arriving before their receive.
    fn sockets_have_work(&self) -> bool {
        if self.claimed_n.load(Ordering::Acquire) > 0
            || self.arriving_unexpected.load(Ordering::Acquire) > 0
            || self.backlogged.load(Ordering::Acquire) > 0
            || self.acks_due.load(Ordering::Acquire)
            || self.credit_owed.load(Ordering::Acquire)
        {
            return true;
        }
        let busy_peer = |p: &Arc<Peer>| {
            p.tx_busy.load(Ordering::Acquire) || !lock(&p.offers_out).is_empty() || !lock(&p.awaiting_fin).is_empty() || !lock(&p.streams_in).is_empty()
        };
        self.active().iter().any(busy_peer) || lock(&self.matcher).has_posted()
    }

    /// Reads what every connection has and writes what waits for room, skipping connections
    /// another thread is reading or writing; whether anything came or all queued data went.
    pub fn poll_sockets(&self) -> bool {
        let mut events = Vec::new();
        let mut got = false;
        for p in self.active().iter().filter(|p| p.connected()) {
            if p.tx_busy.load(Ordering::Acquire) {
                if let Ok(q) = p.tx.try_lock() {
                    events.extend(self.pump_tx_locked(p, q));
                    got |= !p.tx_busy.load(Ordering::Acquire);
                }
            }
            if !p.rx_done.load(Ordering::Acquire) {
                if let Ok(rx) = p.rx.try_lock() {
                    got |= self.pump_locked(p, rx, &mut events);
                }
            }
            if !events.is_empty() {
                self.handle_events(p, &mut events);
            }
        }
        got
    }

    /// The progress thread's read: it stops as soon as a waiter reads the sockets itself (a
    /// large message keeps a reader busy for milliseconds, while the waiter, on the same core,
    /// would spin on the lock).
    pub(super) fn pump_rx(&self, peer: &Peer, events: &mut Vec<Event>) {
        self.pump_read(peer, lock(&peer.rx), events, true);
    }

    /// Reads what the connection has (without blocking) and consumes it; whether any bytes came.
    pub(super) fn pump_locked(&self, peer: &Peer, rx: MutexGuard<'_, Rx>, events: &mut Vec<Event>) -> bool {
        self.pump_read(peer, rx, events, false)
    }

    pub(super) fn pump_read(&self, peer: &Peer, mut rx: MutexGuard<'_, Rx>, events: &mut Vec<Event>, yield_to_readers: bool) -> bool {
        if let Some(sealed) = peer.sealed.get() {
            return self.pump_read_sealed(peer, rx, events, yield_to_readers, sealed);
        }
        let mut got = false;
        loop {
            if let Err(e) = self.consume(peer, &mut rx, events) {
                events.push(Event::Gone(e.msg));
                return got;
            }
            rx.start = 0;
            rx.end = 0;
            // (After the staged bytes: nothing read is left behind for a reader that may not
            // come back to this connection before more data arrives.)
            if yield_to_readers && self.socket_readers.load(Ordering::Relaxed) > 0 {
                return got;
            }
            if self.arriving_unexpected.load(Ordering::Relaxed) > 0 {
                self.adopt_in_flight(peer, &mut rx);
            }
            let Rx { stage, dec, sink, header_first, .. } = &mut *rx;
            let (ptr, len, direct) = match (dec.body(), sink) {
                (Some(at), Sink::User { op, keep, .. }) if keep.saturating_sub(at.off) >= DIRECT_READ_MIN => {
                    // SAFETY: off < keep <= buf.len(); the op is ours until completed.
                    (unsafe { op.buf.as_ptr().add(at.off) }, *keep - at.off, true)
                }
                (Some(at), Sink::Unexp { data, .. }) if at.left() >= DIRECT_READ_MIN => {
                    // Grow with the bytes that actually arrive (at most doubling), never by the
                    // length a header claims.
                    let want = at.left().min(data.len().max(UNEXP_GROW_MIN));
                    if let Err(e) = data.try_reserve(want) {
                        events.push(Event::Gone(format!("no memory for {want} more bytes of a {}-byte message: {e}", at.len())));
                        return true;
                    }
                    // SAFETY: reserved capacity; set_len only after the kernel wrote the bytes.
                    (unsafe { data.as_mut_ptr().add(data.len()) }, want, true)
                }
                _ => {
                    let len = match dec.header_left() {
                        Some(left) if *header_first => left,
                        _ => stage.len(),
                    };
                    (stage.as_mut_ptr(), len, false)
                }
            };
            // Small traffic goes back to batched reads (see `HEADER_FIRST_MIN`).
            *header_first &= direct;
            // SAFETY: ptr is valid for len writable bytes (see above).
            let n = match unsafe { read_some(peer.fd(), ptr, len) } {
                Read::Got(n) => n,
                Read::Nothing => return got,
                Read::Closed => {
                    self.drain_ring_locked(peer, events);
                    events.push(Event::Gone(CLOSED_BY_PEER.into()));
                    return true;
                }
                Read::Failed(e) => {
                    events.push(Event::Gone(format!("read failed: {e}")));
                    return true;
                }
            };
            if !got {
                peer.last_heard_ms.store(self.now_ms(), Ordering::Release);
            }
            got = true;
            if !direct {
                rx.end = n;
                continue;
            }
            if let Sink::Unexp { data, .. } = &mut rx.sink {
                // SAFETY: the kernel initialised n more bytes within the reserved capacity.
                unsafe { data.set_len(data.len() + n) };
            }
            let at = rx.dec.body_read(n);
            rx.header_first = at.len() >= HEADER_FIRST_MIN;
            self.settle(peer, &mut rx.sink, at);
        }
    }

    /// `pump_read` on an encrypted connection: ciphertext is read into the opener's buffer, a
    /// few records at a time, and each whole record is opened in place and consumed from there
    /// (no direct reads into receive buffers: the bytes must be opened first). Only a partial
    /// record left at the end of a read is moved, to the buffer's front.
    fn pump_read_sealed(&self, peer: &Peer, mut rx: MutexGuard<'_, Rx>, events: &mut Vec<Event>, yield_to_readers: bool, sealed: &Sealed) -> bool {
        let mut got = false;
        let mut inp = lock(&sealed.inp);
        let SealIn { opener, buf, at } = &mut *inp;
        let Rx { dec, sink, .. } = &mut *rx;
        loop {
            loop {
                match opener.open(&mut buf[*at..]) {
                    Err(e) => {
                        events.push(Event::Gone(e.msg));
                        return true;
                    }
                    Ok(Some((took, plain))) => {
                        let record = *at;
                        *at += took;
                        let plain = &buf[record + plain.start..record + plain.end];
                        if let Err(e) = self.consume_bytes(peer, dec, sink, plain, events) {
                            events.push(Event::Gone(e.msg));
                            return true;
                        }
                    }
                    Ok(None) => break,
                }
            }
            if *at > 0 {
                buf.copy_within(*at.., 0);
                buf.truncate(buf.len() - *at);
                *at = 0;
            }
            if yield_to_readers && self.socket_readers.load(Ordering::Relaxed) > 0 {
                return got;
            }
            buf.reserve(SEALED_READ_AHEAD);
            let spare = buf.capacity() - buf.len();
            // SAFETY: reading into the reserved, unused capacity; set_len only after the kernel wrote.
            let n = match unsafe { read_some(peer.fd(), buf.as_mut_ptr().add(buf.len()), spare) } {
                Read::Got(n) => n,
                Read::Nothing => return got,
                Read::Closed => {
                    events.push(Event::Gone(CLOSED_BY_PEER.into()));
                    return true;
                }
                Read::Failed(e) => {
                    events.push(Event::Gone(format!("read failed: {e}")));
                    return true;
                }
            };
            // SAFETY: the kernel initialised n more bytes within the capacity.
            unsafe { buf.set_len(buf.len() + n) };
            if !got {
                peer.last_heard_ms.store(self.now_ms(), Ordering::Release);
            }
            got = true;
        }
    }

    /// Decodes the staged bytes (see `protocol`) and carries out what they complete: frames
    /// are acted on, body bytes go to the current sink.
    pub(super) fn consume(&self, peer: &Peer, rx: &mut Rx, events: &mut Vec<Event>) -> Result<()> {
        let Rx { stage, start, end, dec, sink, .. } = rx;
        let staged = &stage[*start..*end];
        *start = *end;
        self.consume_bytes(peer, dec, sink, staged, events)
    }

    /// `consume` of the bytes `data` (all of them, unless the peer broke the protocol).
    fn consume_bytes(&self, peer: &Peer, dec: &mut Decoder, sink: &mut Sink, mut data: &[u8], events: &mut Vec<Event>) -> Result<()> {
        while !data.is_empty() {
            let (n, step) = dec.decode(data)?;
            let rest = &data[n..];
            match step {
                None => {}
                // Only a peer that lets us read its memory may announce a message there (one on
                // another host, or that refused the probe, breaks the protocol).
                Some(Step::Frame(Frame::Rts(..))) if peer.cma.is_none() => {
                    return Err(Error::new(Status::PeerLost, "it announced a single-copy message over the socket, but it has no single-copy path to us (a protocol violation)"));
                }
                Some(Step::Frame(f)) => self.on_frame(peer, f, sink, events),
                Some(Step::Body { hdr, off, data }) => {
                    match sink {
                        Sink::User { op, keep, .. } => {
                            let n = data.len().min(keep.saturating_sub(off));
                            // SAFETY: off + n <= keep <= buf.len(); the op is ours until completed.
                            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), op.buf.as_ptr().add(off), n) };
                        }
                        Sink::Unexp { data: v, .. } => {
                            v.try_reserve(data.len()).map_err(|e| {
                                Error::new(Status::PeerLost, format!("no memory for {} more bytes of a {}-byte message: {e}", data.len(), hdr.len))
                            })?;
                            v.extend_from_slice(data);
                        }
                        Sink::Discard | Sink::Idle => {}
                    }
                    self.settle(peer, sink, BodyAt { hdr, off: off + data.len() });
                }
            }
            data = rest;
        }
        Ok(())
    }

    /// Moves on from a body that has all it takes: completes its receive (the rest of the body
    /// is discarded) or files it as unexpected.
    pub(super) fn settle(&self, peer: &Peer, sink: &mut Sink, at: BodyAt) {
        let next = match sink {
            Sink::User { op, keep, result } if at.off >= *keep => {
                op.filling_from.store(u32::MAX, Ordering::Release);
                let r = std::mem::replace(result, Ok(Done::default()));
                op.comp.complete(r);
                if at.left() > 0 { Sink::Discard } else { Sink::Idle }
            }
            Sink::Unexp { data, fills } if at.left() == 0 => {
                let h = at.hdr;
                let data = std::mem::take(data);
                match *fills {
                    Some(cookie) => self.pulled_arrived(peer, h.ctx, cookie, data),
                    None => {
                        if at.len() >= ADOPT_MIN {
                            self.arriving_unexpected.fetch_sub(1, Ordering::Relaxed);
                        }
                        self.deliver_or_file(h.ctx, peer.rank, h.tag, h.check, Cow::Owned(data), at.len() + MESSAGE_COST);
                    }
                }
                Sink::Idle
            }
            Sink::Discard if at.left() == 0 => Sink::Idle,
            _ => return,
        };
        *sink = next;
    }

    /// Acts on a frame that came over the socket; a data frame's body goes to the sink set here.
    pub(super) fn on_frame(&self, peer: &Peer, frame: Frame, sink: &mut Sink, events: &mut Vec<Event>) {
        match frame {
            Frame::Abort { ctx, code } => {
                self.note_remote_abort(ctx, peer.rank, code);
                events.push(Event::RemoteAbort);
            }
            Frame::Close => {
                // What the peer put in our ring before its goodbye comes first.
                self.drain_ring_locked(peer, events);
                events.push(Event::Closed);
            }
            Frame::Bell => {
                self.drain_ring_locked(peer, events);
                events.push(Event::Flush);
            }
            Frame::Rts(hdr, rts) => self.on_rts(peer, hdr, rts, false, events),
            Frame::Fin { cookie, ok } => events.push(Event::Fin { cookie, ok }),
            Frame::Withdraw { cookie } => events.push(Event::Withdraw { cookie }),
            Frame::Cts { cookie } => events.push(Event::Cts { cookie }),
            Frame::Lost { rank, how } => events.push(Event::LostElsewhere { rank, how }),
            Frame::Offer(hdr, offer) => self.on_offer(peer, hdr, offer, events),
            Frame::Credit { bytes } => events.push(Event::Credit { bytes }),
            Frame::Ask { cookie, want } => events.push(Event::Ask { cookie, want }),
            Frame::Pulled(hdr) => {
                *sink = self.pulled_sink(peer, hdr);
                self.settle(peer, sink, BodyAt { hdr, off: 0 });
            }
            Frame::Data(hdr) => {
                let len = hdr.len as usize;
                let posted = self.claim_posted(&mut lock(&self.matcher), hdr.ctx, peer.rank, hdr.tag);
                *sink = match posted {
                    Some(op) => {
                        self.consumed(peer, len + MESSAGE_COST);
                        let (keep, result) = verdict(&op, peer.rank, hdr.tag, hdr.check, len);
                        Sink::User { op, keep, result }
                    }
                    None => {
                        if len >= ADOPT_MIN {
                            self.arriving_unexpected.fetch_add(1, Ordering::Relaxed);
                        }
                        // Never more than a staging buffer up front, whatever the header claims.
                        Sink::Unexp { data: self.spare.take(len), fills: None }
                    }
                };
                // An empty body (or a receive that takes none of it) is complete already.
                self.settle(peer, sink, BodyAt { hdr, off: 0 });
            }
        }
    }

    /// A large message that is being read without a receive (none was posted when its header
    /// came) is taken over by the first receive posted for it since: what arrived is copied
    /// into its buffer and the rest is read straight there, instead of into a buffer that is
    /// copied again once complete. (Two ranks exchanging large messages are rarely in step:
    /// one side's next message often starts to arrive before the other posts its receive.)
    /// The reader holds the connection, so no other message of this peer can slip in between.
    pub(super) fn adopt_in_flight(&self, peer: &Peer, rx: &mut Rx) {
        let (Sink::Unexp { data, fills: None }, Some(at)) = (&rx.sink, rx.dec.body()) else { return };
        let (hdr, len, got) = (at.hdr, at.len(), at.off);
        debug_assert_eq!(got, data.len());
        if len < ADOPT_MIN || got >= len {
            return;
        }
        let Some(op) = self.claim_posted(&mut lock(&self.matcher), hdr.ctx, peer.rank, hdr.tag) else { return };
        self.consumed(peer, len + MESSAGE_COST);
        let (keep, result) = verdict(&op, peer.rank, hdr.tag, hdr.check, len);
        let n = got.min(keep);
        // SAFETY: n <= keep <= op's buffer length; the op is ours (taken from the posted queue,
        // and a canceller waits for this connection's lock, which our caller holds).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), op.buf.as_ptr(), n) };
        self.arriving_unexpected.fetch_sub(1, Ordering::Relaxed);
        rx.sink = if got <= keep {
            Sink::User { op, keep, result }
        } else {
            // Longer than the receive (or a mismatch) and past its end already: done with it.
            op.filling_from.store(u32::MAX, Ordering::Release);
            op.comp.complete(result);
            Sink::Discard
        };
    }
}

/// The wire over a TCP connection (made on demand): every pair has it. Between ranks of one
/// host whose memory we may read, a large message goes single-copy: an `Rts` over the
/// socket, and the receiver reads it from the sender's memory (`cma`).
pub(super) struct TcpWire;

impl Wire for TcpWire {
    fn can_connect(&self, _peer: &Peer) -> bool {
        true
    }

    fn send(&self, t: &SocketTransport, peer: &Arc<Peer>, ctx: &Arc<CtxState>, tag: u64, check: u32, op: Arc<SendOp>) -> Result<Arc<SendOp>> {
        let buf = op.buf;
        if peer.cma.is_some() && buf.len() >= cma::threshold() && cma::threshold() > 0 {
            return t.post_rts(peer, ctx, tag, check, op);
        }
        if !t.may_send_eagerly(peer, buf.len()) {
            return t.post_offer(peer, ctx, tag, check, op);
        }
        let item = TxItem { hdr: Header::data(ctx.id, tag, check, buf.len()).encode(), hdr_off: 0, body: Body::User(buf), off: 0, op: Some(op.clone()) };
        t.enqueue(peer, item)?;
        Ok(op)
    }

    /// Copied single-copy by the next wait (see `claim_parked`).
    fn fetch(&self, t: &SocketTransport, _peer: &Arc<Peer>, op: Arc<RecvOp>, msg: Unexpected) {
        t.claim_parked(op, msg);
    }

    fn reply(&self, t: &SocketTransport, peer: &Arc<Peer>, hdr: Header) {
        let _ = t.send_control(peer, hdr);
    }

    fn send_in_order(&self, t: &SocketTransport, peer: &Arc<Peer>, hdr: Header) {
        let _ = t.send_control(peer, hdr);
    }

    fn fail_aborted(&self, _t: &SocketTransport, p: &Peer) {
        {
            let mut rx = lock(&p.rx);
            if let Sink::User { op, .. } = &rx.sink {
                if op.ctx.is_aborted() {
                    let op = op.clone();
                    rx.sink = Sink::Discard;
                    op.filling_from.store(u32::MAX, Ordering::Release);
                    op.comp.complete(Err(aborted_error(&op.ctx)));
                }
            }
        }
        lock(&p.offers_out).retain(|_, o| match &o.op {
            Some(op) if op.ctx.is_aborted() => {
                op.comp.complete(Err(aborted_error(&op.ctx)));
                false
            }
            _ => true,
        });
        let mut q = lock(&p.tx);
        let mut i = 0;
        while i < q.len() {
            let aborted = q[i].op.as_ref().is_some_and(|o| o.ctx.is_aborted());
            if aborted && q[i].hdr_off == 0 {
                let it = q.remove(i).unwrap();
                let op = it.op.unwrap();
                op.comp.complete(Err(aborted_error(&op.ctx)));
                continue;
            }
            if aborted {
                if let Some(op) = q[i].detach() {
                    op.comp.complete(Err(aborted_error(&op.ctx)));
                }
            }
            i += 1;
        }
    }

    fn fail_all(&self, t: &SocketTransport, peer: &Peer, err: &dyn Fn() -> Error) {
        {
            let mut rx = lock(&peer.rx);
            rx.dec = Decoder::new();
            if let Sink::User { op, .. } = std::mem::replace(&mut rx.sink, Sink::Idle) {
                op.filling_from.store(u32::MAX, Ordering::Release);
                op.comp.complete(Err(err()));
            }
        }
        for (_, o) in lock(&peer.offers_out).drain() {
            if let Some(op) = o.op {
                op.comp.complete(Err(err()));
            }
        }
        // Receives (of any source, too) waiting for the bytes of its offers.
        let pulls = lock(&t.matcher).take_pulls_from(peer.rank);
        for p in pulls {
            if let super::matching::Pull::Recv { op, .. } = p {
                op.filling_from.store(u32::MAX, Ordering::Release);
                op.comp.complete(Err(err()));
            }
        }
        let mut q = lock(&peer.tx);
        for mut it in q.drain(..) {
            if let Some(op) = it.op.take() {
                op.comp.complete(Err(err()));
            }
        }
        peer.tx_busy.store(false, Ordering::Release);
    }

    fn withdraw_send(&self, _t: &SocketTransport, peer: &Peer, op: &Arc<SendOp>) {
        // Offered and not asked for: its bytes are kept for when the receiver asks (its entry
        // waits in the receiver's queue), so the receiver still gets the message whole.
        for o in lock(&peer.offers_out).values_mut() {
            if o.op.as_ref().is_some_and(|x| Arc::ptr_eq(x, op)) {
                // SAFETY: the op's buffer is valid until the op completes, after this.
                o.body = Body::Owned(unsafe { op.buf.as_slice() }.to_vec());
                o.op = None;
            }
        }
        let mut q = lock(&peer.tx);
        if let Some(i) = q.iter().position(|it| it.op.as_ref().is_some_and(|o| Arc::ptr_eq(o, op))) {
            if q[i].hdr_off == 0 {
                q.remove(i);
            } else {
                q[i].detach();
            }
        }
    }
}

/// Ciphertext an encrypted connection's read asks for at once (a few records: fewer reads, and
/// fewer partial records moved to the buffer's front).
pub(super) const SEALED_READ_AHEAD: usize = 4 * (RECORD_MAX + OVERHEAD);

/// `flush` on an encrypted connection: the queued frames' bytes are sealed a record at a time
/// (several small frames share one) and the record is written; a frame is done (its send
/// complete) once all its bytes are sealed, as its buffer is no longer needed then.
fn flush_sealed(peer: &Peer, q: &mut VecDeque<TxItem>, sealed: &Sealed) -> io::Result<bool> {
    let mut out = lock(&sealed.out);
    let SealOut { sealer, buf, off } = &mut *out;
    loop {
        while *off < buf.len() {
            let rest = &buf[*off..];
            // SAFETY: a valid fd and a live slice; MSG_NOSIGNAL turns a broken pipe into EPIPE.
            let n = unsafe { libc::send(peer.fd(), rest.as_ptr() as *const libc::c_void, rest.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return Ok(false),
                    io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
            *off += n as usize;
        }
        buf.clear();
        *off = 0;
        if q.is_empty() {
            return Ok(true);
        }
        sealer.seal_appended(buf, |record| take_a_record(q, record));
    }
}

/// Moves the queued frames' next bytes, up to a record's worth, to the end of `record`;
/// completes the sends of the frames moved whole.
fn take_a_record(q: &mut VecDeque<TxItem>, record: &mut Vec<u8>) {
    let start = record.len();
    let room = |record: &Vec<u8>| RECORD_MAX - (record.len() - start);
    while let Some(it) = q.front_mut() {
        let h = (HEADER_LEN - it.hdr_off).min(room(record));
        record.extend_from_slice(&it.hdr[it.hdr_off..it.hdr_off + h]);
        it.hdr_off += h;
        let body = it.body();
        let b = (body.len() - it.off).min(room(record));
        record.extend_from_slice(&body[it.off..it.off + b]);
        it.off += b;
        if it.hdr_off < HEADER_LEN || it.off < it.body().len() {
            return; // the record is full
        }
        let done = q.pop_front().unwrap();
        if let Some(op) = done.op {
            let bytes = op.buf.len();
            op.comp.complete(Ok(Done { bytes, source: op.dst, tag: 0 }));
        }
        if room(record) == 0 {
            return;
        }
    }
}

const CLOSED_BY_PEER: &str = "connection closed by the peer (process exited or was killed?)";

/// What one non-blocking read of a connection gave.
enum Read {
    Got(usize),
    /// Nothing to read now.
    Nothing,
    /// The peer closed its end.
    Closed,
    Failed(io::Error),
}

/// Reads what the connection `fd` has, up to `len` bytes into `ptr`, without blocking (an
/// interrupted read is retried).
///
/// # Safety
/// `ptr` must be valid for `len` writable bytes.
unsafe fn read_some(fd: RawFd, ptr: *mut u8, len: usize) -> Read {
    loop {
        // SAFETY: the caller's promise.
        let n = unsafe { libc::recv(fd, ptr as *mut libc::c_void, len, libc::MSG_DONTWAIT) };
        if n > 0 {
            return Read::Got(n as usize);
        }
        if n == 0 {
            return Read::Closed;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Read::Nothing,
            io::ErrorKind::Interrupted => continue,
            _ => return Read::Failed(e),
        }
    }
}
