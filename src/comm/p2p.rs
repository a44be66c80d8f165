//! Point-to-point on a comm: posting sends and receives on the world's transport, and the one
//! wait every transport op goes through (timeout, abort, lost peers, the waiting policy).

use super::{Comm, lock};
use crate::buffer::{ConstBuf, MutBuf};
use crate::collective::CollArgs;
use crate::completion::{Completion, Done, WaitOutcome};
use crate::error::{Error, Result, Status};
use crate::transport::ops::COLL_TAG_BIT;
use crate::transport::{RecvOp, SendOp, TagMatch, WITHDRAW_GRACE_MAX};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How many times `Comm::recv_now` looks at an empty ring before the receive is posted: a
/// message a peer sends at the same time as we do arrives within them (a few microseconds),
/// and the usual wait, which also spins first, takes over after.
const RECV_NOW_POLLS: u32 = 64;

/// The largest send a blocking send-receive makes before it posts its receive (`send_first`).
/// Measured (dc-bench sendrecv, 5 interleaved rounds, medians against receive-first): 2 ranks
/// 16 B 0.56-0.63, 4 KiB 0.75-0.87, but 16 / 32 / 64 KiB only 0.96 / 1.00 / 0.97-1.04. Not where
/// ranks outnumber cores: with 4 ranks on 2 cores 16 B was level (0.94-1.12), 4 KiB 1.27 and
/// 64 KiB 1.13-1.24 slower.
const SEND_FIRST_MAX: usize = 4096;

/// Waits for a transport op, cancelling it on timeout or interruption (abort; for collectives
/// also a lost member) so its buffer is released. A timeout names lost members, if any. `idle`:
/// see `Completion::wait_with`.
#[allow(clippy::too_many_arguments)]
fn wait_op(
    comp: &Completion,
    deadline: &dyn Fn() -> Instant,
    timeout_ms: i64,
    interrupt: &dyn Fn() -> Option<Error>,
    lost: &dyn Fn() -> Option<Error>,
    cancel: &dyn Fn(Error),
    what: &dyn Fn() -> String,
    idle: Option<&dyn Fn(Duration, i32)>,
    poll: Option<&dyn crate::completion::Poll>,
) -> Result<Done> {
    match comp.wait_with(deadline, interrupt, idle, poll) {
        WaitOutcome::Finished(r) => r,
        WaitOutcome::TimedOut => {
            let meanwhile = lost().map(|l| format!(" (meanwhile {})", l.msg)).unwrap_or_default();
            let e = Error::new(Status::Timeout, format!("timed out after {timeout_ms} ms {}{meanwhile}", what()));
            cancel(e.clone());
            comp.result().unwrap_or(Err(e))
        }
        WaitOutcome::Interrupted(e) => {
            cancel(e.clone());
            comp.result().unwrap_or(Err(e))
        }
    }
}

/// A synchronous send's result: the send's once both finished, or the first failure (a failed
/// send gets no answer; a lost answer fails the send too).
fn sync_result(s: &SendOp, a: &RecvOp) -> Option<Result<Done>> {
    match (s.comp.result(), a.comp.result()) {
        (Some(Err(e)), _) | (_, Some(Err(e))) => Some(Err(e)),
        (Some(Ok(d)), Some(Ok(_))) => Some(Ok(d)),
        _ => None,
    }
}

/// What a blocking send-receive (`Comm::sendrecv`) came to.
pub enum Exchanged {
    /// Nothing was waited for: the receive could not be posted, or the send failed to start
    /// (the receive, if posted, withdrawn).
    Failed(Error),
    /// Both halves were waited for; a send that failed withdrew the receive if it was open.
    Both { sent: Result<()>, got: Result<Done> },
}

/// A pending transport send or receive, owned by whoever waits for it.
pub enum P2pOp {
    Send(Arc<SendOp>),
    Recv(Arc<RecvOp>),
    /// A send or receive of device memory through NCCL.
    #[cfg(feature = "nccl")]
    Device(Box<crate::nccl::DeviceP2p>),
    /// Finished when it was started (a small send through a shared-memory ring).
    Done(Done),
    /// A synchronous send: the send, and the receive of the empty answer the receiver sends
    /// once a receive matched it (see `transport::ops::sync_tag`).
    Sync(Arc<SendOp>, Arc<RecvOp>),
}

impl P2pOp {
    /// The owner is done with the op: a finished receive nobody else refers to goes back to
    /// the pool of receive ops (see `RecvOp::recycle`), handing over this reference rather
    /// than a clone of it.
    pub fn release(&mut self) {
        if let P2pOp::Recv(_) = self {
            if let P2pOp::Recv(r) = std::mem::replace(self, P2pOp::Done(Done::default())) {
                RecvOp::recycle(r);
            }
        }
    }
}

impl Comm {
    /// Starts a send to comm rank `dst` with user tag `tag` (>= 0).
    pub fn post_send(&self, buf: ConstBuf, dst: usize, tag: u32) -> Result<P2pOp> {
        self.check_usable()?;
        #[cfg(feature = "nccl")]
        if self.route_p2p((buf.addr(), buf.len()))? {
            return Ok(P2pOp::Device(Box::new(crate::nccl::DeviceP2p::send(self, buf, dst, tag)?)));
        }
        #[cfg(feature = "nccl")]
        self.flush_device();
        if let Some(done) = self.transport().send_inline(&self.ctx, self.members[dst], tag as u64, 0, buf) {
            return done.map(P2pOp::Done);
        }
        Ok(P2pOp::Send(self.transport().post_send(&self.ctx, self.members[dst], tag as u64, 0, buf)?))
    }

    /// The send half of a blocking send-receive, sent before the receive is posted where that
    /// pays: a message of at most `SEND_FIRST_MAX` bytes that its wire takes whole at once (a
    /// small one to a peer of our host), done when this returns, after which the answer may be
    /// taken straight from our ring (`recv_blocking`). None: not such a send, ranks that
    /// outnumber the cores, or a comm that carries device memory: post the receive, then the
    /// send.
    pub fn send_first(&self, buf: ConstBuf, dst: usize, tag: u32) -> Option<Result<Done>> {
        if buf.len() > SEND_FIRST_MAX || crate::completion::oversubscribed() || self.carries_device() {
            return None;
        }
        if let Err(e) = self.check_usable() {
            return Some(Err(e));
        }
        self.transport().send_inline(&self.ctx, self.members[dst], tag as u64, 0, buf)
    }

    /// A blocking receive from comm rank `src` (None: any) with `tag` (None: any), within
    /// the comm's timeout (`deadline`). A message from one rank with one tag is first looked
    /// for in its ring (see `recv_now`); otherwise the receive is posted and waited for.
    pub fn recv_blocking(&self, buf: MutBuf, src: Option<usize>, tag: Option<u32>, deadline: &dyn Fn() -> Instant, what: &dyn Fn() -> String) -> Result<Done> {
        if let (Some(s), Some(t)) = (src, tag) {
            if let Some(d) = self.recv_now(buf, s, t) {
                return Ok(d);
            }
        }
        let mut op = self.post_recv(buf, src, tag)?;
        let got = self.wait_p2p_by(&op, deadline, what);
        op.release();
        got
    }

    /// A blocking send to comm rank `dst` and receive from `src` (None: any) with `rtag` (None:
    /// any), neither waiting for the other (so ranks that exchange with each other do not
    /// deadlock, whatever the sizes), within one `deadline` for both. A small send that goes at
    /// once goes first and the answer may then be taken from the ring (`send_first`,
    /// `recv_blocking`); otherwise the receive is posted before the send. A send that fails
    /// withdraws the receive if it is still open (it would take a later message meant for
    /// another call). Both outcomes come back: the C and MPI surfaces report them in their own
    /// order and terms. `what` names the send and the receive for timeout texts.
    #[inline]
    pub fn sendrecv(
        &self,
        send: (ConstBuf, usize, u32),
        recv: (MutBuf, Option<usize>, Option<u32>),
        deadline: &dyn Fn() -> Instant,
        what: (&dyn Fn() -> String, &dyn Fn() -> String),
    ) -> Exchanged {
        // Messages past 16-32 KiB that fit a ring inline go inline or are read single-copy as
        // such exchanges measured faster (see `transport::crowded`).
        let tr = self.transport();
        let Some(trial) = tr.crowded_exchange_starts(send.0.len()) else {
            return self.exchange(send, recv, deadline, what);
        };
        let started = Instant::now();
        let done = self.exchange(send, recv, deadline, what);
        if matches!(done, Exchanged::Both { sent: Ok(()), got: Ok(_) }) {
            tr.crowded_exchange_took(trial, started.elapsed());
        }
        done
    }

    /// `sendrecv`'s exchange.
    #[inline]
    fn exchange(
        &self,
        (sb, dst, stag): (ConstBuf, usize, u32),
        (rb, src, rtag): (MutBuf, Option<usize>, Option<u32>),
        deadline: &dyn Fn() -> Instant,
        what: (&dyn Fn() -> String, &dyn Fn() -> String),
    ) -> Exchanged {
        if let Some(sent) = self.send_first(sb, dst, stag) {
            return match sent {
                Ok(_) => Exchanged::Both { sent: Ok(()), got: self.recv_blocking(rb, src, rtag, deadline, what.1) },
                Err(e) => Exchanged::Failed(e),
            };
        }
        let mut recv = match self.post_recv(rb, src, rtag) {
            Ok(r) => r,
            Err(e) => return Exchanged::Failed(e),
        };
        let mut send = match self.post_send(sb, dst, stag) {
            Ok(s) => s,
            Err(e) => {
                self.cancel_p2p(&recv, || e.clone());
                recv.release();
                return Exchanged::Failed(e);
            }
        };
        let sent = self.wait_p2p_by(&send, deadline, what.0).map(|_| ());
        if let Err(e) = &sent {
            self.cancel_p2p(&recv, || e.clone());
        }
        let got = self.wait_p2p_by(&recv, deadline, what.1);
        send.release();
        recv.release();
        Exchanged::Both { sent, got }
    }

    /// Starts a synchronous send to comm rank `dst`: it completes once the bytes are out and a
    /// receive on `dst` matched the message (its answer came). Host memory only.
    pub fn post_ssend(&self, buf: ConstBuf, dst: usize, tag: u32) -> Result<P2pOp> {
        self.check_usable()?;
        #[cfg(feature = "nccl")]
        if self.route_p2p((buf.addr(), buf.len()))? {
            return Err(Error::new(Status::Unavailable, "synchronous sends of CUDA device memory are not available"));
        }
        let tr = self.transport();
        let (w, seq) = (self.members[dst], tr.next_sync_seq());
        // The answer's receive is posted first: it may come as soon as the message is out.
        // SAFETY: an empty buffer.
        let empty = unsafe { MutBuf::new(std::ptr::null_mut(), 0) };
        let ack = tr.post_recv(&self.ctx, Some(w), TagMatch::Exact(crate::transport::ops::ack_tag(seq)), 0, empty)?;
        match tr.post_send(&self.ctx, w, crate::transport::ops::sync_tag(seq, tag), 0, buf) {
            Ok(send) => Ok(P2pOp::Sync(send, ack)),
            Err(e) => {
                tr.cancel_recv(&ack, e.clone(), self.withdraw_grace());
                Err(e)
            }
        }
    }

    /// Starts a receive from comm rank `src` (None: any) with user tag `tag` (None: any).
    pub fn post_recv(&self, buf: MutBuf, src: Option<usize>, tag: Option<u32>) -> Result<P2pOp> {
        self.check_usable()?;
        #[cfg(feature = "nccl")]
        if self.route_p2p((buf.addr(), buf.len()))? {
            let Some(src) = src else {
                return Err(Error::new(Status::Unavailable, "DC_ANY_SOURCE is not available on CUDA device memory (NCCL receives from one named rank)"));
            };
            return Ok(P2pOp::Device(Box::new(crate::nccl::DeviceP2p::recv(self, buf, src, tag)?)));
        }
        #[cfg(feature = "nccl")]
        self.flush_device();
        let tag = tag.map_or(TagMatch::AnyUser, |t| TagMatch::Exact(t as u64));
        let src = src.map(|s| self.members[s]);
        Ok(P2pOp::Recv(self.transport().post_recv(&self.ctx, src, tag, 0, buf)?))
    }

    /// Whether the comm has a device engine (NCCL): the shortcuts for small host messages
    /// (`send_first`, `recv_now`) leave its calls to the usual path, which keeps host and
    /// device work in order.
    fn carries_device(&self) -> bool {
        #[cfg(feature = "nccl")]
        return self.device.get().is_some();
        #[cfg(not(feature = "nccl"))]
        false
    }

    /// A blocking receive's first look: the message from comm rank `src` with `tag`, taken
    /// straight from the ring of a peer of our host if it is there already or arrives within
    /// a few polls (see `SocketTransport::take_inline_now`). None: post the receive and wait
    /// (also on comms that carry device memory, and on an aborted one, whose error the usual
    /// path reports).
    pub fn recv_now(&self, buf: MutBuf, src: usize, tag: u32) -> Option<Done> {
        if self.carries_device() || self.ctx.abort_error().is_some() {
            return None;
        }
        // With more ranks than cores the sender may need our core: one look, no spin.
        let polls = if crate::completion::oversubscribed() { 0 } else { RECV_NOW_POLLS };
        self.transport().take_inline_now(&self.ctx, *self.members.get(src)?, tag as u64, 0, buf, polls)
    }

    /// Starts a send with a full 64-bit tag (below the collective tags), for protocols the
    /// library runs on a context of its own (RPC).
    pub fn post_send_tag64(&self, buf: ConstBuf, dst: usize, tag: u64) -> Result<P2pOp> {
        self.check_usable()?;
        debug_assert!(tag < COLL_TAG_BIT);
        Ok(P2pOp::Send(self.transport().post_send(&self.ctx, self.members[dst], tag, 0, buf)?))
    }

    /// Starts a receive of exactly `tag` (below the collective tags) from comm rank `src`
    /// (None: any), for protocols the library runs on a context of its own (RPC).
    pub fn post_recv_tag64(&self, buf: MutBuf, src: Option<usize>, tag: u64) -> Result<P2pOp> {
        self.check_usable()?;
        debug_assert!(tag < COLL_TAG_BIT);
        let src = src.map(|s| self.members[s]);
        Ok(P2pOp::Recv(self.transport().post_recv(&self.ctx, src, TagMatch::Exact(tag), 0, buf)?))
    }

    /// Connects to every other member now (connections are otherwise made on demand), for
    /// protocols that must notice a member's loss even before they talk to it (RPC).
    /// Collective: it returns once every member holds all its connections, so no member goes on
    /// (and perhaps exits) while another still connects to it (that connect would be refused).
    pub fn connect_members(&self) -> Result<()> {
        for &w in &self.members {
            if w != self.world.transport.rank() {
                self.world.transport.connect(w)?;
            }
        }
        self.collective(CollArgs::Barrier)
    }

    /// Comm rank of a world rank (for `dc_recv_info.source`).
    pub fn comm_rank_of(&self, world_rank: u32) -> i32 {
        // Members are distinct, so a comm rank that holds the same world rank is the one (the
        // world and its duplicates always): no hashing, which costs a small message's receive
        // about 130 instructions.
        if self.members.get(world_rank as usize) == Some(&world_rank) {
            return world_rank as i32;
        }
        self.world_to_comm.get(&world_rank).map_or(-1, |&r| r as i32)
    }

    /// Waits for an op that was just started, up to the comm's timeout (the clock is read only
    /// if the op is not finished already, as small sends between ranks of a host are).
    pub fn wait_p2p_started(&self, op: &P2pOp, what: &dyn Fn() -> String) -> Result<Done> {
        if let P2pOp::Done(d) = op {
            return Ok(*d);
        }
        let deadline = crate::completion::LazyDeadline::new(self.timeout_ms());
        self.wait_p2p_by(op, &|| deadline.get(), what)
    }

    /// The result of a host op that has finished already (None: not yet, or a device op).
    fn finished(&self, op: &P2pOp) -> Option<Result<Done>> {
        if Comm::p2p_done(op) { self.p2p_result(op) } else { None }
    }

    pub fn wait_p2p(&self, op: &P2pOp, deadline: Instant, what: &dyn Fn() -> String) -> Result<Done> {
        self.wait_any(op, &|| deadline, what, false)
    }

    /// `wait_p2p` with a deadline computed only if the wait needs it.
    pub fn wait_p2p_by(&self, op: &P2pOp, deadline: &dyn Fn() -> Instant, what: &dyn Fn() -> String) -> Result<Done> {
        self.wait_any(op, deadline, what, false)
    }

    /// Waits for `op`. Within a collective (`coll`), a lost member of the comm also ends the
    /// wait: the call cannot complete without it, even when this rank waits for another peer.
    pub(super) fn wait_any(&self, op: &P2pOp, deadline: &dyn Fn() -> Instant, what: &dyn Fn() -> String, coll: bool) -> Result<Done> {
        let t = self.timeout_ms();
        if let Some(r) = self.finished(op) {
            return r;
        }
        let tr = self.transport();
        if let P2pOp::Sync(s, a) = op {
            let sent = self.wait_any(&P2pOp::Send(s.clone()), deadline, what, coll);
            if let Err(e) = &sent {
                tr.cancel_recv(a, e.clone(), self.withdraw_grace());
            }
            let d = sent?;
            let answer = || format!("{} (for the receiver's match of a synchronous send)", what());
            return self.wait_any(&P2pOp::Recv(a.clone()), deadline, &answer, coll).map(|_| d);
        }
        tr.send_acks();
        // While we wait for our send, the peer's messages to us are taken whatever the bound of
        // unexpected bytes (see `transport::flow`): it may be waiting for its send to us.
        let _blocked = match op {
            P2pOp::Send(s) => tr.blocked_on(s.dst),
            _ => None,
        };
        let awaited = match op {
            P2pOp::Send(s) => Some(s.dst),
            P2pOp::Recv(r) => r.src,
            _ => None,
        };
        // A receive from any source may wait for any member: a lost one the caller has not
        // acknowledged fails it (ULFM's rule: the lost rank could have been the sender).
        let any_source = matches!(op, P2pOp::Recv(r) if r.src.is_none());
        // A peer we have no connection to yet (they are made on demand) is looked at directly;
        // for a receive from any source, one member per look, in turn (each look is cheap and
        // rate-limited per peer, but a comm may have thousands). A look only marks a member
        // lost (its process is gone, or it went silent); one that said goodbye is not.
        let next_member = std::cell::Cell::new(0usize);
        let look_at_a_member = || {
            let i = next_member.get() % self.members.len().max(1);
            next_member.set(i + 1);
            if let Some(&w) = self.members.get(i) {
                tr.check_alive(w);
            }
        };
        let interrupt = || {
            self.ctx
                .abort_error()
                .or_else(|| if coll { self.lost_member() } else { None })
                .or_else(|| awaited.and_then(|r| tr.check_alive(r)))
                .or_else(|| {
                    if !any_source {
                        return None;
                    }
                    look_at_a_member();
                    self.lost_unacknowledged()
                })
        };
        let lost = || self.lost_member();
        // Copies that our receives claimed are ours to make while we wait.
        tr.copy_claimed(None);
        // What a peer on our host sent may be in its ring already (ranks that share a core
        // find it there after every switch): one look before registering as a spinner.
        if tr.poll_rings() {
            if let Some(r) = self.finished(op) {
                return r;
            }
        }
        // Peers on our host write to our shared-memory rings: we poll them while we spin, and
        // register as asleep while we sleep, so that writers then ring our doorbell.
        let spin = tr.spin_on_rings(awaited);
        // Without rings, the data comes over the sockets: read them ourselves while we spin.
        // Not when ranks outnumber the cores: a waiter then yields at once, and data it would
        // move waits for its next turn on a core; the progress thread is woken for it instead.
        let reader = if spin.is_none() && !crate::completion::oversubscribed() { Some(tr.read_while_waiting()) } else { None };
        // Sleep in poll on the sockets ourselves: a receive (or a single-copy send's Fin) is
        // finished by arriving data (or a doorbell), and anything else that finishes the op
        // wakes us too.
        let idle = |d: Duration, fd: i32| {
            let _paused = spin.as_ref().map(|s| s.pause());
            let _paused_reader = reader.as_ref().map(|r| r.pause());
            tr.wait_readable(d, fd);
        };
        let poll: Option<&dyn crate::completion::Poll> = match (&spin, &reader) {
            (Some(s), _) => Some(s),
            (None, Some(r)) => Some(r),
            (None, None) => None,
        };
        match op {
            P2pOp::Send(s) => wait_op(&s.comp, deadline, t, &interrupt, &lost, &|e| tr.cancel_send(s, e, self.withdraw_grace()), what, Some(&idle), poll),
            P2pOp::Recv(r) => wait_op(&r.comp, deadline, t, &interrupt, &lost, &|e| tr.cancel_recv(r, e, self.withdraw_grace()), what, Some(&idle), poll),
            #[cfg(feature = "nccl")]
            P2pOp::Device(d) => d.wait(self, deadline(), what),
            P2pOp::Done(d) => Ok(*d),
            P2pOp::Sync(..) => unreachable!("waited above"),
        }
    }

    /// `DC_ERR_PEER_LOST` naming the first member of this comm whose process died or whose
    /// connection broke (not one that said goodbye), if any.
    pub(super) fn lost_member(&self) -> Option<Error> {
        let (r, why) = self.transport().lost_among(&self.members, &[])?;
        Some(self.member_lost(r, &why))
    }

    fn member_lost(&self, r: usize, why: &str) -> Error {
        let w = self.members[r];
        let world = if w as usize != r { format!(" (world rank {w})") } else { String::new() };
        Error::new(Status::PeerLost, format!("rank {r}{world} is lost: {why}"))
    }

    /// `lost_member`, leaving out the members whose loss the caller acknowledged.
    pub fn lost_unacknowledged(&self) -> Option<Error> {
        self.transport().lost_among(&self.members, &[])?; // (no lock while nobody is lost)
        let acked = lock(&self.acked_lost);
        let (r, why) = self.transport().lost_among(&self.members, &acked)?;
        Some(self.member_lost(r, &format!("{why}; a receive from any source fails while a lost member is not acknowledged (dc_comm_failure_ack, MPIX_Comm_failure_ack)")))
    }

    /// Acknowledges every member lost so far (ULFM's `MPIX_Comm_failure_ack`): receives from
    /// any source no longer fail for them (ones from a lost rank still do). Returns the comm
    /// ranks acknowledged now and before, in rank order.
    pub fn ack_failures(&self) -> Vec<usize> {
        let mut acked = lock(&self.acked_lost);
        while let Some((r, _)) = self.transport().lost_among(&self.members, &acked) {
            acked.push(r);
        }
        acked.sort_unstable();
        acked.clone()
    }

    /// The members whose loss was acknowledged (`MPIX_Comm_failure_get_acked`), in rank order.
    pub fn acked_failures(&self) -> Vec<usize> {
        lock(&self.acked_lost).clone()
    }

    /// How long withdrawing an op waits for a peer in the middle of its message (a receiver
    /// reading our memory, a sender streaming to us): a tenth of the comm's timeout, from 10 ms
    /// to 2 s, so a call that timed out ends soon after its timeout even when that peer is
    /// stopped (the message is then revoked or dropped, never delivered torn).
    pub(crate) fn withdraw_grace(&self) -> Duration {
        let tenth = Duration::from_millis(self.timeout_ms().max(0) as u64 / 10);
        tenth.clamp(Duration::from_millis(10), WITHDRAW_GRACE_MAX)
    }

    /// Withdraws an unfinished op, failing it with `e()` (no-op when finished: the error is
    /// only built for an op that is withdrawn, not for every finished op dropped).
    pub fn cancel_p2p(&self, op: &P2pOp, e: impl FnOnce() -> Error) {
        match op {
            P2pOp::Send(s) if !s.comp.is_done() => self.transport().cancel_send(s, e(), self.withdraw_grace()),
            P2pOp::Recv(r) if !r.comp.is_done() => self.transport().cancel_recv(r, e(), self.withdraw_grace()),
            P2pOp::Sync(s, a) if !(s.comp.is_done() && a.comp.is_done()) => {
                let e = e();
                self.transport().cancel_send(s, e.clone(), self.withdraw_grace());
                self.transport().cancel_recv(a, e, self.withdraw_grace());
            }
            #[cfg(feature = "nccl")]
            P2pOp::Device(d) => d.cancel(self, e()),
            _ => {}
        }
    }

    pub fn p2p_done(op: &P2pOp) -> bool {
        match op {
            P2pOp::Send(s) => s.comp.is_done(),
            P2pOp::Recv(r) => r.comp.is_done(),
            #[cfg(feature = "nccl")]
            P2pOp::Device(_) => false,
            P2pOp::Done(_) => true,
            P2pOp::Sync(s, a) => sync_result(s, a).is_some(),
        }
    }

    /// Whether `op` has finished (never blocks; for device ops, one event query).
    pub fn p2p_is_done(&self, op: &P2pOp) -> bool {
        // A caller that tests in a loop is waiting too: read what our host's peers wrote.
        if !Comm::p2p_done(op) {
            let tr = self.transport();
            tr.send_acks();
            let _ = tr.poll_rings();
            tr.want_progress();
        }
        match op {
            #[cfg(feature = "nccl")]
            P2pOp::Device(d) => d.is_done(self),
            _ => Comm::p2p_done(op),
        }
    }

    /// The result of a finished `op`.
    pub fn p2p_result(&self, op: &P2pOp) -> Option<Result<Done>> {
        match op {
            P2pOp::Send(s) => s.comp.result(),
            P2pOp::Recv(r) => r.comp.result(),
            #[cfg(feature = "nccl")]
            P2pOp::Device(d) => d.result(self),
            P2pOp::Done(d) => Some(Ok(*d)),
            P2pOp::Sync(s, a) => sync_result(s, a),
        }
    }

    /// A deadline for a new operation.
    pub fn op_deadline(&self) -> Instant {
        self.deadline()
    }
}
