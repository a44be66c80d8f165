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
use std::collections::HashMap;
use std::ffi::CString;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Kept alive for the job's lifetime (e.g. the store server rank 0 hosts).
    pub keepalive: Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    pub shutdown_wait: Duration,
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
    backend: CString,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for a transport op, cancelling it on timeout or interruption (abort; for collectives
/// also a lost member) so its buffer is released. A timeout names lost members, if any.
fn wait_op(
    comp: &Completion,
    deadline: Instant,
    timeout_ms: i64,
    interrupt: &dyn Fn() -> Option<Error>,
    lost: &dyn Fn() -> Option<Error>,
    cancel: &dyn Fn(Error),
    what: &dyn Fn() -> String,
) -> Result<Done> {
    match comp.wait(deadline, interrupt) {
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
}

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
        self.comm.wait_any(&self.op, self.deadline, &what, true).map(|d| d.bytes).map_err(|e| {
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
        self.comm.cancel_p2p(&self.op, Error::new(Status::Aborted, "cancelled"));
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
    pub fn new_world(world: Arc<World>, job_id: u64, timeout_ms: i64, backend: &str) -> Arc<Comm> {
        let t = &world.transport;
        let members: Vec<u32> = (0..t.size()).collect();
        let rank = t.rank() as usize;
        let ctx = CtxState::new(job_id | 1, None);
        Comm::build(world, ctx, rank, members, timeout_ms, backend)
    }

    fn build(world: Arc<World>, ctx: Arc<CtxState>, rank: usize, members: Vec<u32>, timeout_ms: i64, backend: &str) -> Arc<Comm> {
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
            backend: CString::new(backend).unwrap_or_default(),
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

    pub fn backend(&self) -> &CString {
        &self.backend
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
        Ok(P2pOp::Send(self.transport().post_send(&self.ctx, self.members[dst], tag as u64, 0, buf)?))
    }

    /// Starts a receive from comm rank `src` (None: any) with user tag `tag` (None: any).
    pub fn post_recv(&self, buf: MutBuf, src: Option<usize>, tag: Option<u32>) -> Result<P2pOp> {
        self.check_usable()?;
        let tag = tag.map_or(TagMatch::AnyUser, |t| TagMatch::Exact(t as u64));
        let src = src.map(|s| self.members[s]);
        Ok(P2pOp::Recv(self.transport().post_recv(&self.ctx, src, tag, 0, buf)?))
    }

    /// Comm rank of a world rank (for `dc_recv_info.source`).
    pub fn comm_rank_of(&self, world_rank: u32) -> i32 {
        self.world_to_comm.get(&world_rank).map_or(-1, |&r| r as i32)
    }

    pub fn wait_p2p(&self, op: &P2pOp, deadline: Instant, what: &dyn Fn() -> String) -> Result<Done> {
        self.wait_any(op, deadline, what, false)
    }

    /// Waits for `op`. Within a collective (`coll`), a lost member of the comm also ends the
    /// wait: the call cannot complete without it, even when this rank waits for another peer.
    fn wait_any(&self, op: &P2pOp, deadline: Instant, what: &dyn Fn() -> String, coll: bool) -> Result<Done> {
        let t = self.timeout_ms();
        let interrupt = || self.ctx.abort_error().or_else(|| if coll { self.lost_member() } else { None });
        let lost = || self.lost_member();
        match op {
            P2pOp::Send(s) => wait_op(&s.comp, deadline, t, &interrupt, &lost, &|e| self.transport().cancel_send(s, e), what),
            P2pOp::Recv(r) => wait_op(&r.comp, deadline, t, &interrupt, &lost, &|e| self.transport().cancel_recv(r, e), what),
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

    /// Withdraws an unfinished op (no-op when finished).
    pub fn cancel_p2p(&self, op: &P2pOp, e: Error) {
        match op {
            P2pOp::Send(s) if !s.comp.is_done() => self.transport().cancel_send(s, e),
            P2pOp::Recv(r) if !r.comp.is_done() => self.transport().cancel_recv(r, e),
            _ => {}
        }
    }

    pub fn p2p_done(op: &P2pOp) -> bool {
        match op {
            P2pOp::Send(s) => s.comp.is_done(),
            P2pOp::Recv(r) => r.comp.is_done(),
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

    fn execute(&self, args: &CollArgs, seq: u64, deadline: Instant) -> Result<()> {
        self.check_usable()?;
        let link = CollLink { comm: self, tag: COLL_TAG_BIT | seq, sig: args.signature(), seq, deadline };
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
        if crate::debug_check::enabled() {
            let check = CollLink { tag: COLL_TAG_BIT | CHECK_TAG_BIT | seq, sig: crate::debug_check::CHECK_SIG, ..link };
            crate::debug_check::verify(&check, args).or_else(fail)?;
        }
        // SAFETY: buffers were validated by the C surface and stay valid until we return.
        let r = unsafe { args.run(&link) };
        r.or_else(|e| {
            if e.status == Status::Mismatch {
                // Only some ranks see a mismatch in the data (e.g. the receiver of a short
                // message); the others would wait for messages that never come until the
                // timeout. Aborting the comm tells them at once.
                self.abort_because(&format!("rank {} found mismatched collective arguments in collective #{seq}", self.rank), ABORT_MISMATCH);
            }
            fail(e)
        })
    }

    /// Runs a collective on the calling thread.
    pub fn collective(&self, args: CollArgs) -> Result<()> {
        self.check_usable()?;
        let (seq, deadline) = self.next_collective();
        self.execute(&args, seq, deadline)
    }

    /// Queues a collective on the comm's worker thread; it progresses while the caller computes.
    pub fn start_collective(self: &Arc<Self>, args: CollArgs) -> Result<Request> {
        self.check_usable()?;
        let (seq, deadline) = self.next_collective();
        let comp = Arc::new(Completion::new());
        let (me, done) = (self.clone(), comp.clone());
        let job: Job = Box::new(move || {
            let r = me.execute(&args, seq, deadline);
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
        let Some(me) = ranks.iter().position(|&r| r == self.rank) else { return Ok(None) };
        let id = child_ctx_id(self.ctx.id, seq, &[-1, mine as i64]);
        let members = ranks.iter().map(|&r| self.members[r]).collect();
        Ok(Some(self.child(id, me, members)))
    }

    /// `dc_comm_split`: ranks with the same `color` form a group ordered by (key, parent rank);
    /// a negative color (like MPI_UNDEFINED) joins no group.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Arc<Comm>>> {
        let all = self.allgather_u64(&[color as u32 as u64, key as u32 as u64])?;
        let seq = self.child_seq.fetch_add(1, Ordering::Relaxed);
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
        Ok(Some(self.child(id, me, members)))
    }

    fn child(&self, id: u64, rank: usize, members: Vec<u32>) -> Arc<Comm> {
        let ctx = CtxState::new(id, Some(self.ctx.clone()));
        let backend = self.backend.to_str().unwrap_or("socket").to_string();
        dc_log!(Level::Info, Some(self.rank), "new communicator {id:#x}: rank {rank} of {}", members.len());
        Comm::build(self.world.clone(), ctx, rank, members, self.timeout_ms(), &backend)
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
        if self.ctx.abort(why) {
            dc_log!(Level::Warn, Some(self.rank), "communicator {:#x} aborted: {why}", self.ctx.id);
        }
        self.transport().abort_ctx(&self.ctx, &self.members, code);
    }

    /// Lets queued non-blocking collectives finish, then releases the comm's context.
    pub fn destroy(&self) {
        let ex = lock(&self.executor).take();
        if let Some(ex) = ex {
            drop(ex.jobs);
            let _ = ex.thread.join();
        }
        self.transport().unregister_ctx(self.ctx.id);
    }
}
