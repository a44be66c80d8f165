//! Communicators: a group of ranks over a world's transport, with its own wire context, timeout,
//! collective sequence, abort state and a worker thread for non-blocking collectives.

use crate::buffer::{ConstBuf, MutBuf};
use crate::coll::{Link, Pending, PendingOp};
use crate::collective::CollArgs;
use crate::completion::{deadline_after, Completion, Done, WaitOutcome};
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::request::Request;
use crate::transport::ops::COLL_TAG_BIT;
use crate::transport::socket::ABORT_MISMATCH;
use crate::transport::socket::SocketTransport;
use crate::transport::{CtxState, RecvOp, SendOp, TagMatch};
use crate::coll::shm::ShmRun;
use crate::transport::shm::{self as shm_seg, Arena, Steps};
use std::collections::HashMap;
use std::ffi::CStr;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Collective tags with this bit set carry the `DC_DEBUG=DETAIL` check of the same call.
const CHECK_TAG_BIT: u64 = 1 << 62;

/// What one `dc_init` created: the transport shared by the world comm and its subgroups.
pub struct World {
    pub transport: Arc<SocketTransport>,
    /// The job's rendezvous store (already prefixed for this job and group), for later
    /// out-of-band exchanges such as NCCL unique ids.
    pub store: Arc<dyn crate::rendezvous::Store>,
    /// Every rank's data address, by world rank.
    pub addrs: Vec<std::net::SocketAddr>,
    /// By world rank: the index of its host (ranks with the same hostname share one), the
    /// same on every rank, for hierarchical collectives.
    pub hosts: Vec<u32>,
    /// Kept alive for the job's lifetime (e.g. the store server rank 0 hosts).
    pub keepalive: Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    pub shutdown_wait: Duration,
    /// Which transports collectives may use.
    pub policy: TransportPolicy,
    /// Whether comms get an NCCL communicator for device buffers, and on which device.
    #[cfg(feature = "nccl")]
    pub gpu: crate::nccl::GpuPlan,
}

/// `auto`: shared memory where every member of a comm can map the same segment, else sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportPolicy {
    Auto,
    Socket,
    Shm,
}

/// A comm whose members share a host: its arena, step counter, and the turn that keeps its
/// collectives in call order (the blocking caller and the worker thread may both run them).
struct ShmState {
    arena: Arena,
    steps: Steps,
    /// Members' pids when every member lets us read its memory (allgatherv and alltoallv read
    /// single-copy).
    pids: Option<Vec<i32>>,
    /// Reusable memory of the collectives: only the thread whose turn it is touches it (a
    /// mutex here would put a locked instruction right after each call's writes to shared
    /// memory, which then waits for them to reach the other cores).
    scratch: std::cell::UnsafeCell<crate::coll::shm::Scratch>,
    /// Sequence number of the collective whose turn it is.
    turn: AtomicU64,
    /// Threads waiting for their turn (rare: a blocking call behind queued non-blocking ones).
    turn_waiters: AtomicU64,
    turn_lock: Mutex<()>,
    turn_cv: Condvar,
}

// SAFETY: `scratch` is used only by the thread whose turn it is (see `scratch`); the rest is
// atomics, locks and the arena (Sync).
unsafe impl Sync for ShmState {}

/// A thread waiting for its turn looks again at least this often: passing the turn does not
/// fence (see `pass_turn`), so a waiter that registered just then may miss its notification.
const TURN_RECHECK: Duration = Duration::from_millis(1);

impl ShmState {
    /// The collectives' scratch memory.
    ///
    /// # Safety
    /// The caller holds the turn (between `wait_turn` and `pass_turn`) and drops the reference
    /// before passing it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn scratch(&self) -> &mut crate::coll::shm::Scratch {
        &mut *self.scratch.get()
    }

    /// Waits until collective `seq` may run (usually at once: one atomic load).
    fn wait_turn(&self, seq: u64, deadline: &dyn Fn() -> Instant, check: &dyn Fn() -> Result<()>) -> Result<()> {
        if self.turn.load(Ordering::Acquire) == seq {
            return Ok(());
        }
        self.turn_waiters.fetch_add(1, Ordering::SeqCst);
        let r = (|| loop {
            let g = lock(&self.turn_lock);
            let t = self.turn.load(Ordering::SeqCst);
            if t == seq {
                return Ok(());
            }
            check()?;
            let now = Instant::now();
            if now >= deadline() {
                return Err(Error::new(Status::Timeout, format!("collective #{t} before this one did not finish in time")));
            }
            let _ = self.turn_cv.wait_timeout(g, (deadline() - now).min(TURN_RECHECK));
        })();
        self.turn_waiters.fetch_sub(1, Ordering::SeqCst);
        r
    }

    fn pass_turn(&self, next: u64) {
        // Release, not SeqCst: a full fence here would stall until this call's stores to
        // shared memory reach the readers; waiters recheck every TURN_RECHECK instead.
        self.turn.store(next, Ordering::Release);
        if self.turn_waiters.load(Ordering::Relaxed) > 0 {
            let _g = lock(&self.turn_lock);
            self.turn_cv.notify_all();
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.transport.shutdown(Instant::now() + self.shutdown_wait);
    }
}

type Job = Box<dyn FnOnce() + Send>;

struct Executor {
    jobs: crossbeam::channel::Sender<Job>,
    thread: JoinHandle<()>,
}

pub struct Comm {
    world: Arc<World>,
    ctx: Arc<CtxState>,
    rank: usize,
    /// Comm rank -> world rank.
    members: Vec<u32>,
    world_to_comm: HashMap<u32, usize>,
    timeout_ms: AtomicI64,
    coll_seq: AtomicU64,
    child_seq: AtomicU64,
    executor: Mutex<Option<Executor>>,
    shm: once_cell::sync::OnceCell<ShmState>,
    /// The NCCL communicator for device buffers (NCCL backend only).
    #[cfg(feature = "nccl")]
    device: once_cell::sync::OnceCell<crate::nccl::DeviceComm>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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

/// A pending transport send or receive, owned by whoever waits for it.
pub enum P2pOp {
    Send(Arc<SendOp>),
    Recv(Arc<RecvOp>),
    /// A send or receive of device memory through NCCL.
    #[cfg(feature = "nccl")]
    Device(Box<crate::nccl::DeviceP2p>),
    /// Finished when it was started (a small send through a shared-memory ring).
    Done(Done),
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

/// Tag of the envelopes of device sends on the CPU transport: above every collective's tag
/// (`COLL_TAG_BIT | seq`), so neither user receives nor collectives ever match one.
#[cfg(feature = "nccl")]
const DEVICE_ENVELOPE_TAG: u64 = COLL_TAG_BIT | (1 << 62);

/// One collective call's `Link`: its tag and signature on the comm's context, and its deadline.
struct CollLink<'c> {
    comm: &'c Comm,
    tag: u64,
    sig: u32,
    seq: u64,
    deadline: Instant,
}

struct LinkOp<'c> {
    comm: &'c Comm,
    op: P2pOp,
    peer: usize,
    seq: u64,
    deadline: Instant,
}

impl PendingOp for LinkOp<'_> {
    fn wait(&mut self) -> Result<usize> {
        let (peer, seq) = (self.peer, self.seq);
        let what = || format!("waiting for rank {peer} in collective #{seq}");
        self.comm.wait_any(&self.op, &|| self.deadline, &what, true).map(|d| d.bytes).map_err(|e| {
            // A collective whose peer sent more than expected disagrees on the count.
            if e.status == Status::InvalidArgument {
                Error::new(Status::Mismatch, format!("{} (the ranks disagree on the count)", e.msg))
            } else {
                e
            }
        })
    }
}

impl Drop for LinkOp<'_> {
    fn drop(&mut self) {
        self.comm.cancel_p2p(&self.op, || Error::new(Status::Aborted, "cancelled"));
        self.op.release();
    }
}

impl Link for CollLink<'_> {
    fn rank(&self) -> usize {
        self.comm.rank
    }

    fn size(&self) -> usize {
        self.comm.members.len()
    }

    fn send<'a>(&'a self, peer: usize, buf: &'a [u8]) -> Result<Pending<'a>> {
        let op = self.comm.transport().post_send(&self.comm.ctx, self.comm.members[peer], self.tag, self.sig, ConstBuf::from_slice(buf))?;
        Ok(Pending::new(LinkOp { comm: self.comm, op: P2pOp::Send(op), peer, seq: self.seq, deadline: self.deadline }))
    }

    fn host_of(&self, peer: usize) -> usize {
        self.comm.world.hosts[self.comm.members[peer] as usize] as usize
    }

    fn recv<'a>(&'a self, peer: usize, buf: &'a mut [u8]) -> Result<Pending<'a>> {
        let src = Some(self.comm.members[peer]);
        let op = self.comm.transport().post_recv(&self.comm.ctx, src, TagMatch::Exact(self.tag), self.sig, MutBuf::from_slice(buf))?;
        Ok(Pending::new(LinkOp { comm: self.comm, op: P2pOp::Recv(op), peer, seq: self.seq, deadline: self.deadline }))
    }
}

/// A stable 64-bit id for a child context, the same on every member.
fn child_ctx_id(parent: u64, seq: u64, salt: &[i64]) -> u64 {
    let mut h = DefaultHasher::new();
    (parent, seq, salt).hash(&mut h);
    h.finish() | 1
}

impl Comm {
    /// The world communicator of a freshly connected transport.
    /// The world communicator of a freshly connected transport (collective: sets up shared
    /// memory where the policy allows).
    pub fn new_world(world: Arc<World>, job_id: u64, timeout_ms: i64) -> Result<Arc<Comm>> {
        let t = &world.transport;
        let members: Vec<u32> = (0..t.size()).collect();
        let rank = t.rank() as usize;
        let ctx = CtxState::new(job_id | 1, None);
        let comm = Comm::build(world, ctx, rank, members, timeout_ms);
        comm.setup_shm(true)?;
        #[cfg(feature = "nccl")]
        comm.setup_device_world()?;
        Ok(comm)
    }

    fn build(world: Arc<World>, ctx: Arc<CtxState>, rank: usize, members: Vec<u32>, timeout_ms: i64) -> Arc<Comm> {
        world.transport.register_ctx(&ctx);
        let world_to_comm = members.iter().enumerate().map(|(i, &w)| (w, i)).collect();
        Arc::new(Comm {
            world,
            ctx,
            rank,
            members,
            world_to_comm,
            timeout_ms: AtomicI64::new(timeout_ms),
            coll_seq: AtomicU64::new(0),
            child_seq: AtomicU64::new(0),
            executor: Mutex::new(None),
            shm: once_cell::sync::OnceCell::new(),
            #[cfg(feature = "nccl")]
            device: once_cell::sync::OnceCell::new(),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The world this comm belongs to (transport, store).
    pub fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// Comm rank -> world rank.
    pub fn members(&self) -> &[u32] {
        &self.members
    }

    /// This comm's 64-bit context id (the same on every member).
    pub fn context_id(&self) -> u64 {
        self.ctx.id
    }

    /// The transport this comm's collectives use: "nccl" (device buffers through NCCL, host
    /// buffers as below), "shm" or "socket".
    pub fn backend(&self) -> &'static CStr {
        #[cfg(feature = "nccl")]
        if self.device.get().is_some() {
            return c"nccl";
        }
        if self.shm.get().is_some() { c"shm" } else { c"socket" }
    }

    /// The comm's NCCL communicator, if it has one.
    #[cfg(feature = "nccl")]
    pub fn device(&self) -> Option<&crate::nccl::DeviceComm> {
        self.device.get()
    }

    /// `dc_comm_set_stream`: later device operations run on `stream` (NULL: the comm's own).
    pub fn set_stream(&self, stream: *mut libc::c_void) -> Result<()> {
        #[cfg(feature = "nccl")]
        if let Some(d) = self.device.get() {
            d.set_stream(stream);
            return Ok(());
        }
        if !stream.is_null() {
            let why = if cfg!(feature = "nccl") { "" } else { " (this build has no NCCL support)" };
            return Err(Error::new(Status::Unavailable, format!("communicator uses backend \"{}\", which has no CUDA streams{why}", self.backend().to_string_lossy())));
        }
        Ok(())
    }

    pub fn timeout_ms(&self) -> i64 {
        self.timeout_ms.load(Ordering::Relaxed)
    }

    pub fn set_timeout_ms(&self, ms: i64) {
        self.timeout_ms.store(ms, Ordering::Relaxed);
    }

    fn transport(&self) -> &SocketTransport {
        &self.world.transport
    }

    /// `DC_ERR_ABORTED` if this comm (or a parent) was aborted.
    pub fn check_usable(&self) -> Result<()> {
        match self.ctx.abort_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn deadline(&self) -> Instant {
        deadline_after(self.timeout_ms())
    }

    // ---- point to point ---------------------------------------------------------------------

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
    fn wait_any(&self, op: &P2pOp, deadline: &dyn Fn() -> Instant, what: &dyn Fn() -> String, coll: bool) -> Result<Done> {
        let t = self.timeout_ms();
        if let Some(r) = self.finished(op) {
            return r;
        }
        let tr = self.transport();
        let awaited = match op {
            P2pOp::Send(s) => Some(s.dst),
            P2pOp::Recv(r) => r.src,
            _ => None,
        };
        // A peer we have no connection to yet (they are made on demand) is looked at directly.
        let interrupt = || {
            self.ctx.abort_error().or_else(|| if coll { self.lost_member() } else { None }).or_else(|| awaited.and_then(|r| tr.check_alive(r)))
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
            P2pOp::Send(s) => wait_op(&s.comp, deadline, t, &interrupt, &lost, &|e| tr.cancel_send(s, e), what, Some(&idle), poll),
            P2pOp::Recv(r) => wait_op(&r.comp, deadline, t, &interrupt, &lost, &|e| tr.cancel_recv(r, e), what, Some(&idle), poll),
            #[cfg(feature = "nccl")]
            P2pOp::Device(d) => d.wait(self, deadline(), what),
            P2pOp::Done(d) => Ok(*d),
        }
    }

    /// `DC_ERR_PEER_LOST` naming the first member of this comm whose process died or whose
    /// connection broke (not one that said goodbye), if any.
    fn lost_member(&self) -> Option<Error> {
        let (r, why) = self.transport().lost_among(&self.members)?;
        let w = self.members[r];
        let world = if w as usize != r { format!(" (world rank {w})") } else { String::new() };
        Some(Error::new(Status::PeerLost, format!("rank {r}{world} is lost: {why}")))
    }

    /// Withdraws an unfinished op, failing it with `e()` (no-op when finished: the error is
    /// only built for an op that is withdrawn, not for every finished op dropped).
    pub fn cancel_p2p(&self, op: &P2pOp, e: impl FnOnce() -> Error) {
        match op {
            P2pOp::Send(s) if !s.comp.is_done() => self.transport().cancel_send(s, e()),
            P2pOp::Recv(r) if !r.comp.is_done() => self.transport().cancel_recv(r, e()),
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
        }
    }

    /// Whether `op` has finished (never blocks; for device ops, one event query).
    pub fn p2p_is_done(&self, op: &P2pOp) -> bool {
        // A caller that tests in a loop is waiting too: read what our host's peers wrote.
        if !Comm::p2p_done(op) {
            let _ = self.transport().poll_rings();
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
        }
    }

    /// A deadline for a new operation.
    pub fn op_deadline(&self) -> Instant {
        self.deadline()
    }

    // ---- collectives ------------------------------------------------------------------------

    fn next_collective(&self) -> (u64, Instant) {
        (self.coll_seq.fetch_add(1, Ordering::Relaxed), self.deadline())
    }

    /// `deadline` is asked for only when something waits long enough to need it (reading the
    /// clock is a tenth of a small allreduce here).
    fn execute(&self, args: &CollArgs, seq: u64, deadline: &dyn Fn() -> Instant) -> Result<()> {
        self.check_usable()?;
        dc_log!(Level::Trace, Some(self.rank), "{} #{seq} starts", args.name());
        let fail = |e: Error| {
            let e = e.context(format!("collective #{seq}"));
            dc_log!(Level::Warn, Some(self.rank), "{} failed: {}", args.name(), e.msg);
            Err(e)
        };
        // A collective needs every member: with one lost, fail at once.
        if let Some(e) = self.lost_member() {
            return fail(e);
        }
        let r = match self.shm.get() {
            Some(shm) => self.execute_shm(shm, args, seq, deadline),
            None => self.detail_check(args, seq, deadline()).and_then(|_| self.execute_link(args, seq, deadline())),
        };
        r.or_else(fail)
    }

    /// DC_DEBUG=DETAIL: every member compares every argument (the v-forms' counts too) before
    /// anything moves, on shared memory as on sockets.
    fn detail_check(&self, args: &CollArgs, seq: u64, deadline: Instant) -> Result<()> {
        if !crate::debug_check::enabled() {
            return Ok(());
        }
        let check = CollLink { comm: self, tag: COLL_TAG_BIT | CHECK_TAG_BIT | seq, sig: crate::debug_check::CHECK_SIG, seq, deadline };
        crate::debug_check::verify(&check, args)
    }

    fn execute_link(&self, args: &CollArgs, seq: u64, deadline: Instant) -> Result<()> {
        let link = CollLink { comm: self, tag: COLL_TAG_BIT | seq, sig: args.signature(), seq, deadline };
        // SAFETY: buffers were validated by the C surface and stay valid until we return.
        let r = unsafe { args.run(&link) };
        if let Err(e) = &r {
            if e.status == Status::Mismatch {
                // Only some ranks see a mismatch in the data (e.g. the receiver of a short
                // message); the others would wait for messages that never come until the
                // timeout. Aborting the comm tells them at once. (Shared memory compares every
                // call's arguments on all ranks first, so it needs no abort.)
                self.abort_because(&format!("rank {} found mismatched collective arguments in collective #{seq}", self.rank), ABORT_MISMATCH);
            }
        }
        r
    }

    /// Shared-memory collectives run strictly in call order: wait for our turn, run, pass it on.
    fn execute_shm(&self, shm: &ShmState, args: &CollArgs, seq: u64, deadline: &dyn Fn() -> Instant) -> Result<()> {
        shm.wait_turn(seq, deadline, &|| self.check_usable())?;
        // A lost member (its process died, its connection broke) stops every wait; one that said
        // goodbye stops only a wait for itself: with small collectives running ahead, a member
        // may have finished its last call and left while another's data still comes.
        let interrupt = |r: usize| {
            self.ctx.abort_error().or_else(|| self.lost_member()).or_else(|| self.member_gone(shm, r))
        };
        // The collective's number on the arena: the same on every member (0 is never used).
        let coll = (seq + 1) as u32;
        let r = if let Err(e) = self.detail_check(args, seq, deadline()) {
            Err(e)
        } else {
            // SAFETY: we hold the turn until `pass_turn` below; `run` ends with this block.
            let scratch = unsafe { shm.scratch() };
            let mut run = ShmRun::new(&shm.arena, &shm.steps, coll, deadline, &interrupt, scratch, shm.pids.as_deref());
            // SAFETY: buffers were validated by the C surface and stay valid until we return.
            let done = unsafe { run.run_eager(args) }.or_else(|| unsafe { run.run(args) });
            done.unwrap_or_else(|| self.execute_link(args, seq, deadline()))
        };
        shm.arena.finished(coll);
        shm.pass_turn(seq + 1);
        r
    }

    /// Why a wait on shared memory for comm rank `r` cannot end: it destroyed the comm, closed
    /// its connection, or its process is gone (connections are made on demand, so a member we
    /// never talked to is looked at directly).
    fn member_gone(&self, shm: &ShmState, r: usize) -> Option<Error> {
        // A member that saw an abort may leave at once: look at its leaving first, then at the
        // abort (marked on the arena before it was announced), so the abort is what we report.
        let left = shm.arena.has_left(r);
        if let Some(by) = shm.arena.aborted_by() {
            self.ctx.abort(&format!("rank {by} aborted the communicator"));
            return self.ctx.abort_error();
        }
        if left {
            let w = self.members[r];
            return Some(Error::new(Status::PeerLost, format!("rank {r} (world rank {w}) has left: it destroyed its communicator")));
        }
        self.transport().check_alive(self.members[r])
    }

    /// Bytes of /dev/shm behind this rank (for tests and the memory documentation): the comm's
    /// arena (one segment, which every member reports) and this rank's segment of incoming
    /// point-to-point rings (the world's, one per rank of a host). 0 for what it does not have.
    pub fn shm_bytes(&self) -> (usize, usize) {
        (self.shm.get().map_or(0, |s| s.arena.bytes()), self.transport().incoming_ring_bytes())
    }

    /// Maps one shared segment for all members if the policy allows and every member can
    /// (same host, same /dev/shm, room in it for the segment); otherwise the comm stays on
    /// sockets. Collective. The segment's size grows linearly with the members and is capped
    /// (see `transport::shm`): rank 0 reserves all of it before anyone maps it, and a /dev/shm
    /// without room for it is a WARN line and sockets (under backend "shm": the error).
    fn setup_shm(&self, world_comm: bool) -> Result<()> {
        let policy = self.world.policy;
        if policy == TransportPolicy::Socket || self.size() < 2 {
            return Ok(());
        }
        let n = self.size();
        // Every member knows every member's host: a comm that spans hosts needs no try.
        let host = self.world.hosts[self.members[0] as usize];
        if self.members.iter().any(|&w| self.world.hosts[w as usize] != host) {
            if policy == TransportPolicy::Shm {
                return Err(Error::new(Status::Unavailable, "backend \"shm\": the communicator's members are on different hosts"));
            }
            return Ok(());
        }
        // The world comm's setup talks through the store, not the comm: collectives over
        // sockets would open connections (made on demand) that shared memory never needs
        // afterwards. A subgroup's goes through its members: the store's host (world rank 0)
        // may not be among them and may have finished.
        let store = world_comm.then_some(&*self.world.store);
        let key = format!("shm/{:016x}", self.ctx.id);
        // Rank 0 creates the segment and tells the others its name parts: ok, pid, chunk, nonce;
        // if it could not, the bytes it needed and found free in /dev/shm.
        let mut info = [0u8; 40];
        let mut created = None;
        let mut failure = None;
        if self.rank == 0 {
            shm_seg::reclaim_stale_segments();
            let requested = crate::params::get().shm_chunk;
            let chunk = shm_seg::chunk_for(n, requested);
            let nonce = crate::init::random_u64();
            let path = shm_seg::segment_path(self.ctx.id);
            match Arena::create(&path, n, chunk, nonce) {
                Ok(a) => {
                    info[0] = 1;
                    info[4..8].copy_from_slice(&std::process::id().to_le_bytes());
                    info[8..16].copy_from_slice(&(chunk as u64).to_le_bytes());
                    info[16..24].copy_from_slice(&nonce.to_le_bytes());
                    created = Some((a, path));
                }
                Err(e) => {
                    let need = shm_seg::arena_bytes(n, chunk) as u64;
                    let free = shm_seg::free_bytes(std::path::Path::new("/dev/shm")).unwrap_or(0);
                    info[24..32].copy_from_slice(&need.to_le_bytes());
                    info[32..40].copy_from_slice(&free.to_le_bytes());
                    let then = if policy == TransportPolicy::Shm { "backend \"shm\" fails" } else { "collectives over sockets" };
                    dc_log!(Level::Warn, Some(self.rank), "communicator {:#x} of {n} ranks: no shared-memory arena, {then}: {}", self.ctx.id, e.msg);
                    failure = Some(e.msg);
                }
            }
        }
        match store {
            None => self.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut info), dt: crate::dtype::DType::Uint8, root: 0 })?,
            Some(store) if self.rank == 0 => store.set(&key, &info)?,
            Some(store) => {
                let v = store.get(&key, self.deadline()).map_err(|e| e.context("waiting for rank 0 to set up shared memory"))?;
                if v.len() != info.len() {
                    return Err(Error::new(Status::Rendezvous, format!("malformed shared-memory announcement under {key}")));
                }
                info.copy_from_slice(&v);
            }
        }
        let pid = u32::from_le_bytes(info[4..8].try_into().unwrap());
        let chunk = u64::from_le_bytes(info[8..16].try_into().unwrap()) as usize;
        let nonce = u64::from_le_bytes(info[16..24].try_into().unwrap());
        if info[0] != 1 && policy == TransportPolicy::Shm {
            let need = u64::from_le_bytes(info[24..32].try_into().unwrap());
            let free = u64::from_le_bytes(info[32..40].try_into().unwrap());
            let why = failure.unwrap_or_else(|| format!("{} needed, {} free in /dev/shm", shm_seg::show_bytes(need), shm_seg::show_bytes(free)));
            return Err(Error::new(Status::Unavailable, format!("backend \"shm\": rank 0 could not reserve the shared-memory arena of {n} ranks: {why}")));
        }
        let arena = match created {
            Some((a, _)) => Some(a),
            None if info[0] == 1 => {
                let path = std::path::PathBuf::from(format!("/dev/shm/distcomm-{pid}-{:016x}", self.ctx.id));
                Arena::open(&path, n, chunk, nonce, self.rank).map_err(|e| dc_log!(Level::Info, Some(self.rank), "cannot map the shared segment: {}", e.msg)).ok()
            }
            None => None,
        };
        // Everyone says whether it mapped the segment; then it can be unlinked.
        let ok = [u8::from(arena.is_some())];
        let mut all_ok = [0u8; 1];
        match store {
            None => self.collective(CollArgs::Allreduce {
                send: Some(ConstBuf::from_slice(&ok)),
                recv: MutBuf::from_slice(&mut all_ok),
                dt: crate::dtype::DType::Uint8,
                op: crate::dtype::ReduceOp::Min,
            })?,
            Some(store) => {
                let ranks: Vec<usize> = (0..n).collect();
                let said = crate::rendezvous::exchange_among(store, &format!("{key}/mapped"), self.rank, &ranks, &ok, self.deadline())?;
                all_ok[0] = u8::from(said.iter().all(|v| v.as_slice() == [1]));
                // Rank 0 usually hosts the store and may go on and exit at once: it waits
                // until the others have read what they need from it.
                if self.rank != 0 {
                    if store.add(&format!("{key}/read"), 1)? == n as i64 - 1 {
                        store.set(&format!("{key}/all_read"), b"1")?;
                    }
                } else {
                    store.get(&format!("{key}/all_read"), self.deadline())?;
                }
            }
        }
        if self.rank == 0 {
            let _ = std::fs::remove_file(shm_seg::segment_path(self.ctx.id));
        }
        match (all_ok[0], arena) {
            (1, Some(arena)) => {
                dc_log!(Level::Info, Some(self.rank), "communicator {:#x}: shared memory, {} ranks, {} bytes", self.ctx.id, n, arena.bytes());
                let pids: Option<Vec<i32>> = self.members.iter().map(|&w| self.transport().readable_pid(w)).collect();
                let state = ShmState {
                    arena,
                    steps: Steps::default(),
                    pids,
                    scratch: std::cell::UnsafeCell::new(Default::default()),
                    turn: AtomicU64::new(self.coll_seq.load(Ordering::Relaxed)),
                    turn_waiters: AtomicU64::new(0),
                    turn_lock: Mutex::new(()),
                    turn_cv: Condvar::new(),
                };
                let _ = self.shm.set(state);
                Ok(())
            }
            _ if policy == TransportPolicy::Shm => {
                Err(Error::new(Status::Unavailable, "backend \"shm\": not every member can map the same shared-memory segment (different hosts or /dev/shm)"))
            }
            _ => Ok(()),
        }
    }

    /// Runs a collective on the calling thread.
    pub fn collective(&self, args: CollArgs) -> Result<()> {
        self.check_usable()?;
        #[cfg(feature = "nccl")]
        self.flush_device();
        #[cfg(feature = "nccl")]
        if let Some(op) = self.start_device(&args)? {
            let dev = self.device.get().expect("device comm");
            let deadline = self.deadline();
            return dev.wait(&op, deadline, self.timeout_ms(), &|| self.ctx.abort_error()).map_err(|e| e.context("on CUDA device memory (NCCL)"));
        }
        let seq = self.coll_seq.fetch_add(1, Ordering::Relaxed);
        let deadline = crate::completion::LazyDeadline::new(self.timeout_ms());
        self.execute(&args, seq, &|| deadline.get())
    }

    /// Queues a collective on the comm's worker thread; it progresses while the caller computes.
    pub fn start_collective(self: &Arc<Self>, args: CollArgs) -> Result<Request> {
        self.check_usable()?;
        #[cfg(feature = "nccl")]
        self.flush_device();
        #[cfg(feature = "nccl")]
        if let Some(op) = self.start_device(&args)? {
            return Ok(Request::device(self.clone(), op, self.deadline()));
        }
        let (seq, deadline) = self.next_collective();
        let comp = Arc::new(Completion::new());
        let (me, done) = (self.clone(), comp.clone());
        let job: Job = Box::new(move || {
            let r = me.execute(&args, seq, &|| deadline);
            done.complete(r.map(|_| Done::default()));
        });
        self.submit(job)?;
        Ok(Request::collective(self.clone(), comp, deadline))
    }

    fn submit(&self, job: Job) -> Result<()> {
        let mut ex = lock(&self.executor);
        if ex.is_none() {
            let (tx, rx) = crossbeam::channel::unbounded::<Job>();
            let thread = std::thread::Builder::new()
                .name(format!("dc-coll-r{}", self.rank))
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .map_err(|e| Error::system("spawn collective worker", e))?;
            *ex = Some(Executor { jobs: tx, thread });
        }
        ex.as_ref().unwrap().jobs.send(job).map_err(|_| Error::new(Status::Internal, "collective worker is gone"))
    }

    // ---- groups -----------------------------------------------------------------------------

    /// `dc_comm_new_group`: `ranks` are distinct parent ranks (checked by the caller). Every parent
    /// rank must call with the same list; a disagreement is `DC_ERR_MISMATCH` everywhere.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<Arc<Comm>>> {
        let mut h = DefaultHasher::new();
        ranks.hash(&mut h);
        let mine = h.finish();
        let all = self.allgather_u64(&[mine])?;
        if let Some(r) = all.iter().position(|&x| x != mine) {
            return Err(Error::new(Status::Mismatch, format!("dc_comm_new_group: rank {r} passed a different rank list than rank {}", self.rank)));
        }
        let seq = self.child_seq.fetch_add(1, Ordering::Relaxed);
        let me = ranks.iter().position(|&r| r == self.rank);
        // Every parent rank takes part in the NCCL split, members or not.
        #[cfg(feature = "nccl")]
        let split = self.device_split(me.map(|_| 0), me.unwrap_or(0) as i32)?;
        let Some(me) = me else { return Ok(None) };
        let id = child_ctx_id(self.ctx.id, seq, &[-1, mine as i64]);
        let members = ranks.iter().map(|&r| self.members[r]).collect();
        let child = self.child(id, me, members)?;
        #[cfg(feature = "nccl")]
        child.attach_device(self, split)?;
        Ok(Some(child))
    }

    /// `dc_comm_split`: ranks with the same `color` form a group ordered by (key, parent rank);
    /// a negative color (like MPI_UNDEFINED) joins no group.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Arc<Comm>>> {
        let all = self.allgather_u64(&[color as u32 as u64, key as u32 as u64])?;
        let seq = self.child_seq.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "nccl")]
        let split = self.device_split((color >= 0).then_some(color as usize), key)?;
        if color < 0 {
            return Ok(None);
        }
        let mut group: Vec<(i32, usize)> = (0..self.size())
            .filter(|&r| all[2 * r] as u32 as i32 == color)
            .map(|r| (all[2 * r + 1] as u32 as i32, r))
            .collect();
        group.sort();
        let me = group.iter().position(|&(_, r)| r == self.rank).expect("caller is in its own color");
        let members = group.iter().map(|&(_, r)| self.members[r]).collect();
        let id = child_ctx_id(self.ctx.id, seq, &[color as i64]);
        let child = self.child(id, me, members)?;
        #[cfg(feature = "nccl")]
        child.attach_device(self, split)?;
        Ok(Some(child))
    }

    /// Collective over the new group's members.
    fn child(&self, id: u64, rank: usize, members: Vec<u32>) -> Result<Arc<Comm>> {
        let ctx = CtxState::new(id, Some(self.ctx.clone()));
        dc_log!(Level::Info, Some(self.rank), "new communicator {id:#x}: rank {rank} of {}", members.len());
        let comm = Comm::build(self.world.clone(), ctx, rank, members, self.timeout_ms());
        comm.setup_shm(false)?;
        Ok(comm)
    }

    fn allreduce_u64_min(&self, mine: u64) -> Result<u64> {
        let send = mine.to_le_bytes();
        let mut recv = [0u8; 8];
        self.collective(CollArgs::Allreduce {
            send: Some(ConstBuf::from_slice(&send)),
            recv: MutBuf::from_slice(&mut recv),
            dt: crate::dtype::DType::Uint64,
            op: crate::dtype::ReduceOp::Min,
        })?;
        Ok(u64::from_le_bytes(recv))
    }

    fn allgather_u64(&self, mine: &[u64]) -> Result<Vec<u64>> {
        let send: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut recv = vec![0u8; send.len() * self.size()];
        self.collective(CollArgs::Allgather {
            send: Some(ConstBuf::from_slice(&send)),
            recv: MutBuf::from_slice(&mut recv),
            dt: crate::dtype::DType::Uint64,
        })?;
        Ok(recv.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
    }

    // ---- abort and destroy ----------------------------------------------------------------------

    /// Fails every pending operation on this comm (and its subgroups) here and on its peers.
    pub fn abort(&self) {
        self.abort_because(&format!("dc_comm_abort was called on rank {}", self.rank), 0);
    }

    /// Aborts with `why` as the local reason; `code` tells peers why (see `on_remote_abort`).
    fn abort_because(&self, why: &str, code: u32) {
        #[cfg(feature = "nccl")]
        if let Some(d) = self.device.get() {
            d.abort(why);
        }
        self.transport().abort_ctx(&self.ctx, &self.members, code, || {
            // Members waiting on shared memory see this first (frames to members we have no
            // connection to take a connect).
            if let Some(shm) = self.shm.get() {
                shm.arena.mark_aborted(self.rank);
            }
            if self.ctx.abort(why) {
                dc_log!(Level::Warn, Some(self.rank), "communicator {:#x} aborted: {why}", self.ctx.id);
            }
        });
    }

    /// Lets queued non-blocking collectives finish, then releases the comm's context.
    pub fn destroy(&self) {
        let ex = lock(&self.executor).take();
        if let Some(ex) = ex {
            drop(ex.jobs);
            let _ = ex.thread.join();
        }
        if let Some(shm) = self.shm.get() {
            shm.arena.leave();
        }
        self.transport().unregister_ctx(self.ctx.id);
    }
}

// ---- NCCL backend hooks ---------------------------------------------------------------------------

/// The non-empty buffers of a collective, as (address, bytes).
#[cfg(feature = "nccl")]
fn coll_buffers(args: &CollArgs) -> Vec<(usize, usize)> {
    use CollArgs::*;
    let mut v = Vec::with_capacity(2);
    let mut c = |b: Option<ConstBuf>| v.extend(b.map(|b| (b.addr(), b.len())));
    match args {
        Allreduce { send, .. } | Allgather { send, .. } | Allgatherv { send, .. } | ReduceScatter { send, .. } | Scatter { send, .. } => c(*send),
        Reduce { send, .. } => c(*send),
        Gather { send, .. } | Alltoall { send, .. } | Alltoallv { send, .. } => c(Some(*send)),
        Broadcast { .. } | Barrier => {}
    }
    let mut m = |b: Option<MutBuf>| v.extend(b.map(|b| (b.addr(), b.len())));
    match args {
        Allreduce { recv, .. }
        | Allgather { recv, .. }
        | Allgatherv { recv, .. }
        | ReduceScatter { recv, .. }
        | Scatter { recv, .. }
        | Alltoall { recv, .. }
        | Alltoallv { recv, .. } => m(Some(*recv)),
        Broadcast { buf, .. } => m(Some(*buf)),
        Reduce { recv, .. } | Gather { recv, .. } => m(*recv),
        Barrier => {}
    }
    v.retain(|&(_, len)| len > 0);
    v
}

#[cfg(feature = "nccl")]
impl Comm {
    /// Whether a call with these buffers goes through NCCL: all device memory -> yes, all host ->
    /// no, a mix -> DC_ERR_INVALID_ARGUMENT. A call without buffers goes where `default_device`
    /// says. Comms without NCCL never classify anything.
    fn route(&self, bufs: &[(usize, usize)], default_device: bool) -> Result<bool> {
        if self.device.get().is_none() {
            return Ok(false);
        }
        let mut device = 0;
        let mut host = 0;
        for &(addr, len) in bufs.iter().filter(|b| b.1 > 0) {
            let _ = len;
            match crate::nccl::classify(addr) {
                crate::nccl::MemKind::Device => device += 1,
                crate::nccl::MemKind::Host => host += 1,
            }
        }
        match (device, host) {
            (0, 0) => Ok(default_device),
            (_, 0) => Ok(true),
            (0, _) => Ok(false),
            _ => Err(Error::new(
                Status::InvalidArgument,
                "the call mixes CUDA device memory and host memory: pass all buffers on the device (NCCL) or all on the host",
            )),
        }
    }

    /// Launches device sends and receives posted on this comm (see `DeviceComm::flush`): every
    /// other call on the comm does this first, so posted device work never waits behind it.
    #[inline]
    fn flush_device(&self) {
        if let Some(d) = self.device.get() {
            d.flush();
        }
    }

    /// `route` for one point-to-point buffer; inline, since comms without NCCL (most, and
    /// every message on them) only look at the empty cell.
    #[inline]
    fn route_p2p(&self, buf: (usize, usize)) -> Result<bool> {
        if self.device.get().is_none() {
            return Ok(false);
        }
        self.route(&[buf], false)
    }

    /// Queues `args` on NCCL if its buffers are device memory (None: run it on the CPU path).
    fn start_device(&self, args: &CollArgs) -> Result<Option<crate::nccl::DevOp>> {
        let Some(dev) = self.device.get() else { return Ok(None) };
        if !self.route(&coll_buffers(args), true)? {
            return Ok(None);
        }
        dc_log!(Level::Trace, Some(self.rank), "{} on CUDA device memory (NCCL)", args.name());
        dev.start(args).map(Some).map_err(|e| e.context("on CUDA device memory (NCCL)"))
    }

    /// Waits for a device collective of this comm (a request's wait).
    pub fn wait_device(&self, op: &crate::nccl::DevOp, deadline: Instant) -> Result<()> {
        let dev = self.device.get().expect("device comm");
        dev.flush();
        dev.wait(op, deadline, self.timeout_ms(), &|| self.ctx.abort_error()).map_err(|e| e.context("on CUDA device memory (NCCL)"))
    }

    /// Whether a device collective has finished (never blocks), and its result.
    pub fn device_result(&self, op: &crate::nccl::DevOp) -> Option<Result<()>> {
        let dev = self.device.get().expect("device comm");
        dev.flush();
        dev.result(op)
    }

    /// Posts the envelope of a device send to comm rank `dst` on the CPU transport.
    pub(crate) fn post_envelope_send(&self, dst: usize, buf: ConstBuf) -> Result<P2pOp> {
        Ok(P2pOp::Send(self.transport().post_send(&self.ctx, self.members[dst], DEVICE_ENVELOPE_TAG, 0, buf)?))
    }

    /// Posts the receive of the next device-send envelope from comm rank `src`.
    pub(crate) fn post_envelope_recv(&self, src: usize, buf: MutBuf) -> Result<P2pOp> {
        let src = Some(self.members[src]);
        Ok(P2pOp::Recv(self.transport().post_recv(&self.ctx, src, TagMatch::Exact(DEVICE_ENVELOPE_TAG), 0, buf)?))
    }

    /// The world comm's NCCL communicator, if the backend asks for one: every rank says whether
    /// it can (libraries, a device) and which GPU it would use; all must be able to, and under
    /// "auto" no two ranks may share a GPU. Collective.
    fn setup_device_world(&self) -> Result<()> {
        use crate::nccl::GpuMode;
        let plan = self.world.gpu;
        if plan.mode == GpuMode::Off {
            return Ok(());
        }
        let local = crate::nccl::local_device(plan.local_rank);
        let ident = match &local {
            Ok((_, d)) => {
                let mut h = DefaultHasher::new();
                (crate::log::hostname(), &d.bus_id).hash(&mut h);
                h.finish() | 1
            }
            Err(_) => 0,
        };
        // First whether anyone cannot (a tree allreduce: an allgather here would connect every
        // rank of a large CPU-only job to log N peers for nothing), the lowest such rank.
        let n = self.size();
        let unable = self.allreduce_u64_min(if local.is_ok() { u64::MAX } else { self.rank as u64 })?;
        if unable != u64::MAX {
            let r = unable as usize;
            let why = match &local {
                Err(e) if r == self.rank => e.clone(),
                _ => format!("rank {r} cannot use NCCL (its own error says why)"),
            };
            if plan.mode == GpuMode::Required {
                return Err(Error::new(Status::Unavailable, format!("backend \"nccl\" is unavailable: {why}")));
            }
            dc_log!(Level::Info, Some(self.rank), "NCCL not used: {why}");
            return Ok(());
        }
        if plan.mode == GpuMode::IfAvailable {
            let mut ids = self.allgather_u64(&[ident])?;
            ids.sort_unstable();
            if ids.windows(2).any(|w| w[0] == w[1]) {
                dc_log!(Level::Info, Some(self.rank), "NCCL not used: some ranks share a GPU (backend \"nccl\" would try anyway)");
                return Ok(());
            }
        }
        let (rt, dev) = local.map_err(|e| Error::new(Status::Unavailable, e))?;
        let ordinal = dev.ordinal;
        let key = format!("nccl_id/{:016x}", self.ctx.id);
        let dc = crate::nccl::DeviceComm::init(rt, dev, &*self.world.store, &key, self.rank, n, self.deadline())?;
        dc_log!(Level::Info, Some(self.rank), "communicator {:#x}: NCCL on CUDA device {ordinal}; {}", self.ctx.id, rt.describe());
        let _ = self.device.set(dc);
        Ok(())
    }

    /// Splits the NCCL communicator for a new group (collective over this comm: every rank,
    /// member or not). None when this comm has no NCCL communicator.
    fn device_split(&self, color: Option<usize>, key: i32) -> Result<Option<crate::nccl::device::Split>> {
        match self.device.get() {
            Some(d) => d.split(color, key).map(Some),
            None => Ok(None),
        }
    }

    /// Gives a new child comm its NCCL communicator (from the split, or through the store when
    /// NCCL has no ncclCommSplit: collective over the child).
    fn attach_device(&self, parent: &Comm, split: Option<crate::nccl::device::Split>) -> Result<()> {
        use crate::nccl::device::Split;
        let Some(pd) = parent.device.get() else { return Ok(()) };
        let dc = match split {
            None => return Ok(()),
            Some(Split::Comm(raw)) => pd.from_split(raw, self.rank, self.size())?,
            Some(Split::NotMember) => return Err(Error::new(Status::Internal, "ncclCommSplit left out a rank of the new group")),
            Some(Split::Unsupported) => {
                let key = format!("nccl_id/{:016x}", self.ctx.id);
                pd.init_child(&*self.world.store, &key, self.rank, self.size(), self.deadline())?
            }
        };
        let _ = self.device.set(dc);
        Ok(())
    }
}
