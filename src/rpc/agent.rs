//! The RPC agent of one worker.
//!
//! Threads: a request listener (receives request headers from any worker, then the announced
//! body from that worker, and queues the call), a reply listener (receives reply headers and
//! bodies and hands them to the waiting call by call id), and a pool of handler threads (4, more
//! on demand while all are busy, up to 64). Callers wait on their own threads, so a handler may
//! call other workers, or its own, without starving the listeners.
//!
//! Peer loss: for every peer a receive that nothing ever matches is posted; the transport fails
//! it when the peer dies or closes, and every wait for a call to that peer checks it.
//!
//! Shutdown: see `protocol::shutdown_round`.

use super::protocol::{self, Counters, Header, Kind, ReplyStatus, Round, TagClass, WorkerRecord, HEADER_LEN, MAX_FUNCTION_NAME, MAX_WORKER_NAME, RECORD_LEN};
use crate::buffer::{ConstBuf, MutBuf};
use crate::collective::CollArgs;
use crate::comm::{Comm, P2pOp};
use crate::completion::{deadline_after, Completion, Done, WaitOutcome};
use crate::dc_log;
use crate::dtype::DType;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::rendezvous::config::InitOptions;
use crate::request::Request;
use crate::transport::RecvOp;
use crossbeam::channel::{Receiver, RecvTimeoutError, Sender};
use std::cell::Cell;
use std::collections::HashMap;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A handler: gets the agent (to make nested calls) and the request; returns the reply, or the
/// failure text the caller sees.
pub type Handler = Arc<dyn Fn(&Agent, &[u8]) -> std::result::Result<Vec<u8>, String> + Send + Sync>;

/// Handler threads kept when idle.
const CORE_THREADS: usize = 4;
/// Most handler threads an agent runs at once (more are started only while all are busy).
const MAX_THREADS: usize = 64;
/// How long a handler thread beyond the core ones waits for work before it exits.
const EXTRA_IDLE: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// The agent whose handler this thread is running (0: none).
    static SERVING: Cell<usize> = const { Cell::new(0) };
}

/// A worker as `dc_worker_info` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    pub name: String,
    /// The worker's rank in the job (its `dc_init` rank).
    pub rank: i32,
    /// The worker's data address (IP) and port, as the rendezvous published them.
    pub host: String,
    pub port: u16,
}

/// Tunables, from the environment by default.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// Largest request or reply payload accepted or sent (`DC_RPC_MAX_BYTES`, default 1 GiB).
    pub max_bytes: usize,
}

impl RpcConfig {
    pub fn from_env() -> Result<RpcConfig> {
        Ok(RpcConfig { max_bytes: protocol::max_bytes_from(crate::params::get().rpc_max_bytes.as_deref())? })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// `shutdown` began: user calls are refused, handlers may still call.
    ShuttingDown,
    Stopped,
}

/// A received request waiting for (or running on) a handler thread.
struct Job {
    from: usize,
    call_id: u64,
    function: String,
    body: Vec<u8>,
    payload: Range<usize>,
}

struct Registry {
    handlers: HashMap<String, Handler>,
    /// Requests for functions not registered yet, kept until the user thread moves on (at most
    /// [`MAX_HELD`] of them and [`MAX_HELD_BYTES`] of bodies: beyond, they are refused).
    held: Vec<Job>,
}

/// Requests held for functions not registered yet, at most (see `Registry::held`).
const MAX_HELD: usize = 1024;
const MAX_HELD_BYTES: usize = 256 << 20;

/// How long the body of a message may take to follow its header (it is sent right after it):
/// 10 s plus the time to move it at 50 MB/s, within the comm's timeout. A peer that announces a
/// body and never sends it holds the listener no longer than that.
fn body_wait(len: usize) -> Duration {
    Duration::from_secs(10) + Duration::from_micros(len as u64 / 50)
}

/// One outgoing call.
pub struct Call {
    id: u64,
    /// RPC-comm rank of the callee.
    to: usize,
    to_name: String,
    function: String,
    deadline: Instant,
    timeout_ms: i64,
    comp: Completion,
    reply: Mutex<Option<Vec<u8>>>,
}

impl Call {
    fn what(&self) -> String {
        format!("call #{} of {:?} on worker {:?}", self.id, self.function, self.to_name)
    }
}

/// Sends in flight and the buffers they read from.
struct Outgoing {
    ops: Vec<P2pOp>,
    _bufs: Vec<Vec<u8>>,
}

impl Outgoing {
    fn done(&self) -> bool {
        self.ops.iter().all(Comm::p2p_done)
    }
}

struct Pool {
    tx: Mutex<Option<Sender<Job>>>,
    rx: Receiver<Job>,
    live: AtomicUsize,
    idle: AtomicUsize,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

pub(crate) struct Inner {
    world: Arc<Comm>,
    rpc: Arc<Comm>,
    me: usize,
    infos: Vec<WorkerInfo>,
    by_name: HashMap<String, usize>,
    config: RpcConfig,
    registry: Mutex<Registry>,
    /// Set once the user thread made a call other than `register`: unknown functions fail from then on.
    settled: AtomicBool,
    state: RwLock<State>,
    stopped: AtomicBool,
    pending: Mutex<HashMap<u64, Arc<Call>>>,
    next_id: AtomicU64,
    watch: Vec<Option<Arc<RecvOp>>>,
    outbox: Mutex<Vec<Outgoing>>,
    issued: AtomicU64,
    served: AtomicU64,
    finished: AtomicU64,
    pool: Pool,
    listeners: Mutex<Vec<JoinHandle<()>>>,
}

/// A handle on a worker's agent: calls, registration, worker infos. Cheap to clone; handlers
/// get one. Using it after the agent stopped fails with `DC_ERR_INVALID_USAGE`.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

/// An RPC agent: this process's worker. dc_rpc_init creates it; dc_rpc_shutdown ends and frees it.
// Rust: dropping it without `shutdown` stops it locally (pending calls fail, peers see it leave).
pub struct RpcAgent {
    agent: Agent,
}

impl std::ops::Deref for RpcAgent {
    type Target = Agent;
    fn deref(&self) -> &Agent {
        &self.agent
    }
}

impl Drop for RpcAgent {
    fn drop(&mut self) {
        self.agent.inner.stop();
    }
}

/// This rank's data address, as host and port.
fn data_address(world: &Comm) -> (String, u16) {
    let a = world.world().addrs[world.members()[world.rank()] as usize];
    (a.ip().to_string(), a.port())
}

impl RpcAgent {
    /// `dc_rpc_init`: joins the job like `dc_init` (collective), exchanges worker infos and
    /// starts serving. A name already taken by a lower rank fails here with
    /// `DC_ERR_INVALID_ARGUMENT`; the other workers form the RPC group without it.
    pub fn init(name: &str, opts: &InitOptions) -> Result<RpcAgent> {
        RpcAgent::init_with(name, opts, RpcConfig::from_env()?)
    }

    pub fn init_with(name: &str, opts: &InitOptions, config: RpcConfig) -> Result<RpcAgent> {
        protocol::check_name(name, "worker name", MAX_WORKER_NAME)?;
        let world = crate::init::init(opts)?;
        RpcAgent::form(name, world.clone(), config).inspect_err(|_| world.destroy())
    }

    fn form(name: &str, world: Arc<Comm>, config: RpcConfig) -> Result<RpcAgent> {
        let (host, port) = data_address(&world);
        let mine = WorkerRecord { name: name.to_string(), host, port }.encode();
        let mut all = vec![0u8; RECORD_LEN * world.size()];
        world.collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&mine)), recv: MutBuf::from_slice(&mut all), dt: DType::Uint8 })?;
        let records = all.chunks_exact(RECORD_LEN).map(WorkerRecord::decode).collect::<Result<Vec<_>>>()?;
        let dups = protocol::duplicates(&records);
        let members: Vec<usize> = (0..records.len()).filter(|&r| dups[r].is_none()).collect();
        let rpc = world.new_group(&members)?;
        if let Some(first) = dups[world.rank()] {
            if let Some(g) = rpc {
                g.destroy();
            }
            return Err(Error::new(Status::InvalidArgument, format!("worker name {name:?} is already taken by rank {first}")));
        }
        let rpc = rpc.ok_or_else(|| Error::new(Status::Internal, "a worker with a unique name is not in the RPC group"))?;
        let infos: Vec<WorkerInfo> = members
            .iter()
            .map(|&r| WorkerInfo { name: records[r].name.clone(), rank: r as i32, host: records[r].host.clone(), port: records[r].port })
            .collect();
        let by_name = infos.iter().enumerate().map(|(i, w)| (w.name.clone(), i)).collect();
        let me = rpc.rank();
        // The watches below learn of a lost worker through its connection: have them all.
        rpc.connect_members()?;
        let mut watch = Vec::with_capacity(infos.len());
        for p in 0..infos.len() {
            watch.push(if p == me {
                None
            } else {
                // SAFETY: a zero-length buffer is never written.
                match rpc.post_recv_tag64(unsafe { MutBuf::new(std::ptr::null_mut(), 0) }, Some(p), protocol::tag(TagClass::Watch, 0))? {
                    P2pOp::Recv(r) => Some(r),
                    _ => None,
                }
            });
        }
        let (tx, rx) = crossbeam::channel::unbounded();
        let inner = Arc::new(Inner {
            world,
            rpc,
            me,
            infos,
            by_name,
            config,
            registry: Mutex::new(Registry { handlers: HashMap::new(), held: Vec::new() }),
            settled: AtomicBool::new(false),
            state: RwLock::new(State::Running),
            stopped: AtomicBool::new(false),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            watch,
            outbox: Mutex::new(Vec::new()),
            issued: AtomicU64::new(0),
            served: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            pool: Pool { tx: Mutex::new(Some(tx)), rx, live: AtomicUsize::new(0), idle: AtomicUsize::new(0), handles: Mutex::new(Vec::new()) },
            listeners: Mutex::new(Vec::new()),
        });
        let agent = RpcAgent { agent: Agent { inner: inner.clone() } };
        let rank = inner.world.rank();
        for (what, serve_requests) in [("req", true), ("rep", false)] {
            let me = inner.clone();
            let h = std::thread::Builder::new()
                .name(format!("dc-rpc-{what}-r{rank}"))
                .spawn(move || {
                    let what = if serve_requests { "the RPC request listener" } else { "the RPC reply listener" };
                    let listen = || if serve_requests { me.clone().request_listener() } else { me.clone().reply_listener() };
                    if let Err(e) = crate::panics::catch(what, listen) {
                        me.listener_failed(e);
                    }
                })
                .map_err(|e| Error::system("spawn RPC listener", e))?;
            lock(&inner.listeners).push(h);
        }
        dc_log!(Level::Info, Some(rank), "RPC agent {name:?} up: worker {} of {}", inner.me, inner.infos.len());
        Ok(agent)
    }

    /// `dc_rpc_shutdown`: collective over the workers. Refuses new user calls here, keeps serving
    /// until no call is in flight on any worker (at most the comm's timeout), then stops.
    pub fn shutdown(self) -> Result<()> {
        self.shutdown_in_place()
    }

    /// `shutdown` without giving up the agent's memory: the C surface frees its handle only
    /// after this returns, because handlers may use the handle until the agent stopped.
    pub fn shutdown_in_place(&self) -> Result<()> {
        let inner = &self.agent.inner;
        if inner.serving_here() {
            return Err(Error::new(Status::InvalidUsage, "dc_rpc_shutdown cannot be called from a handler"));
        }
        let r = inner.quiesce();
        inner.stop();
        r
    }
}

impl Agent {
    /// This worker's name.
    pub fn name(&self) -> &str {
        &self.inner.infos[self.inner.me].name
    }

    /// Registers (or replaces) the handler of `function`. Requests that arrived for it before
    /// are served now.
    pub fn register(&self, function: &str, handler: Handler) -> Result<()> {
        protocol::check_name(function, "function name", MAX_FUNCTION_NAME)?;
        self.inner.check_running()?;
        let held = {
            let mut reg = lock(&self.inner.registry);
            reg.handlers.insert(function.to_string(), handler);
            let (now, later): (Vec<Job>, Vec<Job>) = std::mem::take(&mut reg.held).into_iter().partition(|j| j.function == function);
            reg.held = later;
            now
        };
        for j in held {
            self.inner.submit(j);
        }
        Ok(())
    }

    /// `rpc_sync`: calls `function` on worker `to` and waits for its reply. `timeout_ms <= 0`:
    /// the comm's timeout.
    pub fn call(&self, to: &str, function: &str, payload: &[u8], timeout_ms: i64) -> Result<Vec<u8>> {
        let call = self.inner.start_call(to, function, payload, timeout_ms)?;
        let p = PendingCall { inner: self.inner.clone(), call };
        p.wait()?;
        p.take_reply()
    }

    /// `rpc_async`: starts the call and returns a request to wait on (`take_reply` afterwards).
    pub fn call_async(&self, to: &str, function: &str, payload: &[u8], timeout_ms: i64) -> Result<Request> {
        let call = self.inner.start_call(to, function, payload, timeout_ms)?;
        Ok(Request::rpc(self.inner.rpc.clone(), PendingCall { inner: self.inner.clone(), call }))
    }

    /// The worker called `name`, or this one for `None`.
    pub fn worker_info(&self, name: Option<&str>) -> Result<WorkerInfo> {
        self.inner.user_activity();
        let i = match name {
            None => self.inner.me,
            Some(n) => self.inner.worker_index(n)?,
        };
        Ok(self.inner.infos[i].clone())
    }

    /// Every worker, in rank order.
    pub fn all_worker_infos(&self) -> Vec<WorkerInfo> {
        self.inner.user_activity();
        self.inner.infos.clone()
    }

    /// Whether the calling thread is running one of this agent's handlers.
    pub fn in_handler(&self) -> bool {
        self.inner.serving_here()
    }

    /// The payload limit of this agent.
    pub fn max_bytes(&self) -> usize {
        self.inner.config.max_bytes
    }
}

/// An outgoing call that a request (or `Agent::call`) waits on.
pub struct PendingCall {
    inner: Arc<Inner>,
    call: Arc<Call>,
}

impl PendingCall {
    /// Waits for the reply, the call's deadline, or the callee's loss. Repeatable.
    pub fn wait(&self) -> Result<Done> {
        let call = &self.call;
        let outcome = call.comp.wait(call.deadline, &|| self.inner.interrupt(call));
        match outcome {
            WaitOutcome::Finished(r) => r,
            WaitOutcome::TimedOut => {
                let e = Error::new(Status::Timeout, format!("{} did not finish within the timeout of {} ms", call.what(), call.timeout_ms));
                self.inner.fail_call(call, e);
                self.result_now()
            }
            WaitOutcome::Interrupted(e) => {
                self.inner.fail_call(call, e);
                self.result_now()
            }
        }
    }

    fn result_now(&self) -> Result<Done> {
        self.call.comp.result().unwrap_or_else(|| Err(Error::new(Status::Internal, "call neither finished nor failed")))
    }

    /// Never blocks; notices the deadline and a lost callee too.
    pub fn is_done(&self) -> bool {
        let call = &self.call;
        if call.comp.is_done() {
            return true;
        }
        if let Some(e) = self.inner.interrupt(call) {
            self.inner.fail_call(call, e);
        } else if Instant::now() >= call.deadline {
            let _ = self.wait();
        }
        call.comp.is_done()
    }

    pub fn result(&self) -> Option<Result<Done>> {
        self.call.comp.result()
    }

    /// The reply of a call that succeeded; once.
    pub fn take_reply(&self) -> Result<Vec<u8>> {
        match self.call.comp.result() {
            None => Err(Error::new(Status::InvalidUsage, "the call has not completed yet (wait for it first)")),
            Some(Err(e)) => Err(e),
            Some(Ok(_)) => lock(&self.call.reply).take().ok_or_else(|| Error::new(Status::InvalidUsage, "the reply was already taken")),
        }
    }
}

impl Inner {
    fn ptr(&self) -> usize {
        self as *const Inner as usize
    }

    fn serving_here(&self) -> bool {
        SERVING.with(|s| s.get() == self.ptr())
    }

    fn rank_tag(&self) -> Option<usize> {
        Some(self.world.rank())
    }

    fn worker_index(&self, name: &str) -> Result<usize> {
        self.by_name.get(name).copied().ok_or_else(|| {
            let known: Vec<&str> = self.infos.iter().map(|w| w.name.as_str()).collect();
            Error::new(Status::InvalidArgument, format!("no worker named {name:?} (workers: {})", known.join(", ")))
        })
    }

    fn check_running(&self) -> Result<()> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::new(Status::InvalidUsage, "the RPC agent is shut down"));
        }
        Ok(())
    }

    /// A call from the user's thread (not a handler): registration is over, so requests for
    /// functions still unknown fail from now on.
    fn user_activity(self: &Arc<Self>) {
        if !self.serving_here() {
            self.settle();
        }
    }

    fn settle(self: &Arc<Self>) {
        if self.settled.swap(true, Ordering::AcqRel) {
            return;
        }
        let held = std::mem::take(&mut lock(&self.registry).held);
        for j in held {
            self.submit(j);
        }
    }

    /// Why a wait for `call` must end now: its callee is gone, or the agent stopped.
    fn interrupt(&self, call: &Call) -> Option<Error> {
        if let Some(e) = self.peer_error(call.to) {
            return Some(Error::new(e.status, format!("{}: {}", call.what(), e.msg)));
        }
        // A callee on our host that is stopped (or gone before we connected) tells nothing
        // through its connection: it is looked at (see transport::heartbeat).
        if let Some(e) = self.rpc.members().get(call.to).and_then(|&w| self.rpc.transport().check_alive(w)) {
            return Some(Error::new(e.status, format!("{}: {}", call.what(), e.msg)));
        }
        if self.stopped.load(Ordering::Acquire) {
            return Some(Error::new(Status::Aborted, format!("{}: the RPC agent was shut down", call.what())));
        }
        None
    }

    fn peer_error(&self, peer: usize) -> Option<Error> {
        self.watch.get(peer)?.as_ref()?.comp.result()?.err()
    }

    // ---- calling -----------------------------------------------------------------------------

    fn start_call(self: &Arc<Self>, to: &str, function: &str, payload: &[u8], timeout_ms: i64) -> Result<Arc<Call>> {
        let from_handler = self.serving_here();
        if !from_handler {
            self.settle();
        }
        let dst = self.worker_index(to)?;
        protocol::check_name(function, "function name", MAX_FUNCTION_NAME)?;
        if payload.len() > self.config.max_bytes {
            return Err(Error::new(Status::InvalidArgument, protocol::too_large("request", payload.len() as u64, self.config.max_bytes)));
        }
        let timeout_ms = if timeout_ms > 0 { timeout_ms } else { self.rpc.timeout_ms() };
        // Held for reading while the call is issued, so `shutdown` sees either no call or a counted one.
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        match *state {
            State::Running => {}
            State::ShuttingDown if from_handler => {}
            State::ShuttingDown => return Err(Error::new(Status::InvalidUsage, "dc_rpc_shutdown has begun on this worker (only handlers may still call)")),
            State::Stopped => return Err(Error::new(Status::InvalidUsage, "the RPC agent is shut down")),
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) & protocol::ID_MASK;
        let call = Arc::new(Call {
            id,
            to: dst,
            to_name: to.to_string(),
            function: function.to_string(),
            deadline: deadline_after(timeout_ms),
            timeout_ms,
            comp: Completion::new(),
            reply: Mutex::new(None),
        });
        if let Some(e) = self.peer_error(dst) {
            return Err(Error::new(e.status, format!("{}: {}", call.what(), e.msg)));
        }
        lock(&self.pending).insert(id, call.clone());
        let hdr = Header::request(id, function.len(), payload.len()).encode().to_vec();
        let body = protocol::request_body(function, payload);
        let h = match self.rpc.post_send_tag64(ConstBuf::from_slice(&hdr), dst, protocol::tag(TagClass::ReqHeader, 0)) {
            Ok(h) => h,
            Err(e) => {
                lock(&self.pending).remove(&id);
                return Err(e.context(call.what()));
            }
        };
        self.issued.fetch_add(1, Ordering::SeqCst);
        drop(state);
        match self.rpc.post_send_tag64(ConstBuf::from_slice(&body), dst, protocol::tag(TagClass::ReqBody, id)) {
            Ok(b) => self.keep(vec![h, b], vec![hdr, body]),
            Err(e) => {
                self.keep(vec![h], vec![hdr, body]);
                self.fail_call(&call, e.context(call.what()));
            }
        }
        dc_log!(Level::Trace, self.rank_tag(), "{} sent ({} bytes)", call.what(), payload.len());
        Ok(call)
    }

    /// Ends `call` with `e` unless it already ended.
    fn fail_call(&self, call: &Call, e: Error) {
        if lock(&self.pending).remove(&call.id).is_some() {
            self.finished.fetch_add(1, Ordering::SeqCst);
            call.comp.complete(Err(e));
        }
    }

    /// Ends `call` with its reply (or remote failure) unless it already ended (timed out).
    fn complete_call(&self, call: &Call, r: Result<Vec<u8>>) {
        if lock(&self.pending).remove(&call.id).is_none() {
            return;
        }
        self.finished.fetch_add(1, Ordering::SeqCst);
        match r {
            Ok(data) => {
                let bytes = data.len();
                *lock(&call.reply) = Some(data);
                call.comp.complete(Ok(Done { bytes, source: call.to as u32, tag: call.id }));
            }
            Err(e) => {
                call.comp.complete(Err(e));
            }
        }
    }

    /// Keeps send buffers alive until their sends complete (never cancelled while the agent
    /// runs, so a header is always followed by its body).
    fn keep(&self, ops: Vec<P2pOp>, bufs: Vec<Vec<u8>>) {
        let out = Outgoing { ops, _bufs: bufs };
        let mut q = lock(&self.outbox);
        q.retain(|o| !o.done());
        if !out.done() {
            q.push(out);
        }
    }

    /// Sends a header and its body to `to`.
    fn post_pair(&self, to: usize, header: &Header, body_tag: u64, body: Vec<u8>) -> Result<()> {
        let htag = match header.kind {
            Kind::Reply => protocol::tag(TagClass::RepHeader, 0),
            _ => protocol::tag(TagClass::ReqHeader, 0),
        };
        let hdr = header.encode().to_vec();
        let h = self.rpc.post_send_tag64(ConstBuf::from_slice(&hdr), to, htag)?;
        match self.rpc.post_send_tag64(ConstBuf::from_slice(&body), to, body_tag) {
            Ok(b) => {
                self.keep(vec![h, b], vec![hdr, body]);
                Ok(())
            }
            Err(e) => {
                self.keep(vec![h], vec![hdr, body]);
                Err(e)
            }
        }
    }

    fn send_reply(&self, to: usize, call_id: u64, status: ReplyStatus, body: Vec<u8>) {
        let h = Header::reply(call_id, status, body.len());
        if let Err(e) = self.post_pair(to, &h, protocol::tag(TagClass::RepBody, call_id), body) {
            dc_log!(Level::Warn, self.rank_tag(), "RPC reply to worker {to} for call #{call_id} not sent: {}", e.msg);
        }
    }

    /// Receives and discards the body a message of `tag` from `from` announced.
    fn drain(&self, from: usize, tag: u64) {
        // SAFETY: a zero-length buffer is never written; the transport discards the body.
        let _ = self.rpc.post_recv_tag64(unsafe { MutBuf::new(std::ptr::null_mut(), 0) }, Some(from), tag);
    }

    /// Receives exactly `len` bytes of `tag` from `from` (allocated only after the caller's check).
    fn recv_body(&self, from: usize, tag: u64, len: usize, what: &dyn Fn() -> String) -> Result<Vec<u8>> {
        let mut body = vec![0u8; len];
        let op = self.rpc.post_recv_tag64(MutBuf::from_slice(&mut body), Some(from), tag)?;
        let deadline = self.rpc.op_deadline().min(Instant::now() + body_wait(len));
        let d = self.rpc.wait_p2p(&op, deadline, what)?;
        if d.bytes != len {
            return Err(Error::new(Status::Internal, format!("{}: body of {} bytes where the header announced {len}", what(), d.bytes)));
        }
        Ok(body)
    }

    /// Waits for a header on `tag` from any worker; `None` when the listener must stop.
    fn next_header(&self, tag: u64, buf: &mut [u8; HEADER_LEN]) -> Option<(usize, Header)> {
        loop {
            let op = match self.rpc.post_recv_tag64(MutBuf::from_slice(buf), None, tag) {
                Ok(op) => op,
                Err(e) => {
                    if !self.stopped.load(Ordering::Acquire) {
                        dc_log!(Level::Warn, self.rank_tag(), "RPC listener stops: {}", e.msg);
                    }
                    return None;
                }
            };
            let forever = deadline_after(i64::MAX);
            let done = match self.rpc.wait_p2p(&op, forever, &|| "waiting for RPC messages".into()) {
                Ok(d) => d,
                // A message longer than a header: garbage from a peer, skipped.
                Err(e) if e.status == Status::InvalidArgument => {
                    dc_log!(Level::Warn, self.rank_tag(), "RPC listener dropped a message: {}", e.msg);
                    continue;
                }
                // A worker lost: its calls fail through their own watches; the listener
                // acknowledges the loss and goes on serving the others.
                Err(e) if e.status == Status::PeerLost && !self.stopped.load(Ordering::Acquire) && {
                    self.rpc.ack_failures();
                    self.rpc.lost_unacknowledged().is_none()
                } =>
                {
                    dc_log!(Level::Info, self.rank_tag(), "RPC listener goes on without a lost worker: {}", e.msg);
                    continue;
                }
                Err(e) => {
                    if !self.stopped.load(Ordering::Acquire) {
                        dc_log!(Level::Warn, self.rank_tag(), "RPC listener stops: {}", e.msg);
                    }
                    return None;
                }
            };
            let from = self.rpc.comm_rank_of(done.source);
            match Header::decode(&buf[..done.bytes]) {
                Ok(h) if h.kind == Kind::Stop && from == self.me as i32 => return None,
                Ok(h) if from >= 0 => return Some((from as usize, h)),
                Ok(_) => {}
                Err(e) => dc_log!(Level::Warn, self.rank_tag(), "RPC listener dropped a message from rank {}: {}", done.source, e.msg),
            }
        }
    }

    // ---- serving -----------------------------------------------------------------------------

    fn request_listener(self: Arc<Self>) {
        let mut buf = [0u8; HEADER_LEN];
        while let Some((from, h)) = self.next_header(protocol::tag(TagClass::ReqHeader, 0), &mut buf) {
            if h.kind != Kind::Request {
                dc_log!(Level::Warn, self.rank_tag(), "RPC: unexpected {:?} header from worker {from}", h.kind);
                continue;
            }
            self.on_request(from, h);
        }
    }

    /// Fails every call still waiting for its reply with `status` and `why`.
    fn fail_pending(&self, status: Status, why: &str) {
        let calls: Vec<Arc<Call>> = lock(&self.pending).drain().map(|(_, c)| c).collect();
        for c in calls {
            self.finished.fetch_add(1, Ordering::SeqCst);
            c.comp.complete(Err(Error::new(status, format!("{}: {why}", c.what()))));
        }
    }

    /// A listener panicked: nothing will be received any more. Every call waiting here fails
    /// with the panic's text, and the agent's comm is aborted, which its peers hear of.
    fn listener_failed(&self, e: Error) {
        dc_log!(Level::Warn, self.rank_tag(), "{}; the RPC agent stops serving", e.msg);
        self.fail_pending(Status::Internal, &e.msg);
        self.rpc.abort();
    }

    fn on_request(self: &Arc<Self>, from: usize, h: Header) {
        crate::panics::inject("rpc");
        let body_tag = protocol::tag(TagClass::ReqBody, h.call_id);
        let len = match h.request_body_len(self.config.max_bytes) {
            Ok(n) => n,
            Err(msg) => {
                self.drain(from, body_tag);
                let msg = format!("worker {:?} refused the request: {msg}", self.infos[self.me].name);
                self.send_reply(from, h.call_id, ReplyStatus::TooLarge, msg.into_bytes());
                self.served.fetch_add(1, Ordering::SeqCst);
                return;
            }
        };
        let what = || format!("receiving the request of call #{} from worker {from}", h.call_id);
        let body = match self.recv_body(from, body_tag, len, &what) {
            Ok(b) => b,
            Err(e) => {
                dc_log!(Level::Warn, self.rank_tag(), "RPC request dropped: {}", e.msg);
                self.served.fetch_add(1, Ordering::SeqCst);
                return;
            }
        };
        match protocol::split_request(&h, &body) {
            Ok((function, payload)) => self.submit(Job { from, call_id: h.call_id, function, body, payload }),
            Err(msg) => {
                self.send_reply(from, h.call_id, ReplyStatus::Internal, msg.into_bytes());
                self.served.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    fn submit(self: &Arc<Self>, job: Job) {
        let Some(job) = self.hold_if_unknown(job) else { return };
        let tx = lock(&self.pool.tx).clone();
        let Some(tx) = tx else {
            // Stopped: nobody will serve it.
            self.served.fetch_add(1, Ordering::SeqCst);
            return;
        };
        if tx.send(job).is_err() {
            self.served.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if self.pool.idle.load(Ordering::Acquire) == 0 {
            self.spawn_worker();
        }
    }

    /// A request for a function not registered yet is held (it may be about to be), up to
    /// [`MAX_HELD`] requests and [`MAX_HELD_BYTES`]; beyond, it is refused at once. Decided here,
    /// on the listener's thread in the order requests arrive, so that the first ones are the
    /// ones held whichever handler thread would have run them. Returns the job if it is to be
    /// served now (its function is known, or registration is over and it will be told so).
    fn hold_if_unknown(self: &Arc<Self>, job: Job) -> Option<Job> {
        let mut reg = lock(&self.registry);
        if reg.handlers.contains_key(&job.function) || self.settled.load(Ordering::Acquire) || self.stopped.load(Ordering::Acquire) {
            return Some(job);
        }
        let held_bytes: usize = reg.held.iter().map(|j| j.body.len()).sum();
        if reg.held.len() >= MAX_HELD || held_bytes + job.body.len() > MAX_HELD_BYTES {
            drop(reg);
            let me = &self.infos[self.me].name;
            let msg = format!("worker {me:?} already holds {MAX_HELD} requests (or {} MiB) for functions it has not registered yet; {:?} refused", MAX_HELD_BYTES >> 20, job.function);
            self.send_reply(job.from, job.call_id, ReplyStatus::UnknownFunction, msg.into_bytes());
            self.served.fetch_add(1, Ordering::SeqCst);
            return None;
        }
        reg.held.push(job);
        drop(reg);
        // The user thread may have settled meanwhile: then nobody else would release it.
        if self.settled.load(Ordering::Acquire) {
            let held = std::mem::take(&mut lock(&self.registry).held);
            for j in held {
                self.submit(j);
            }
        }
        None
    }

    fn spawn_worker(self: &Arc<Self>) {
        let grew = self.pool.live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < MAX_THREADS).then_some(n + 1));
        let Ok(n) = grew else { return };
        let me = self.clone();
        let spawned = std::thread::Builder::new().name(format!("dc-rpc-h{n}-r{}", self.world.rank())).spawn(move || me.handler_thread());
        match spawned {
            Ok(h) => {
                let mut hs = lock(&self.pool.handles);
                hs.retain(|h| !h.is_finished());
                hs.push(h);
            }
            Err(e) => {
                self.pool.live.fetch_sub(1, Ordering::AcqRel);
                dc_log!(Level::Warn, self.rank_tag(), "could not start an RPC handler thread: {e}");
            }
        }
    }

    fn handler_thread(self: Arc<Self>) {
        loop {
            self.pool.idle.fetch_add(1, Ordering::AcqRel);
            let r = self.pool.rx.recv_timeout(EXTRA_IDLE);
            self.pool.idle.fetch_sub(1, Ordering::AcqRel);
            match r {
                Ok(job) => self.serve(job),
                Err(RecvTimeoutError::Timeout) => {
                    let shrink = self.pool.live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n > CORE_THREADS).then(|| n - 1));
                    if shrink.is_ok() {
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.pool.live.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
            }
        }
    }

    fn serve(self: &Arc<Self>, job: Job) {
        let handler = lock(&self.registry).handlers.get(&job.function).cloned();
        let me = &self.infos[self.me].name;
        let (status, body) = match handler {
            None => (ReplyStatus::UnknownFunction, format!("no function {:?} is registered on worker {me:?}", job.function).into_bytes()),
            Some(h) => {
                let agent = Agent { inner: self.clone() };
                let prev = SERVING.with(|s| s.replace(self.ptr()));
                let r = catch_unwind(AssertUnwindSafe(|| h(&agent, &job.body[job.payload.clone()])));
                SERVING.with(|s| s.set(prev));
                match r {
                    Ok(Ok(reply)) if reply.len() > self.config.max_bytes => {
                        let msg = protocol::too_large(&format!("the reply of {:?} on worker {me:?}", job.function), reply.len() as u64, self.config.max_bytes);
                        (ReplyStatus::TooLarge, msg.into_bytes())
                    }
                    Ok(Ok(reply)) => (ReplyStatus::Ok, reply),
                    Ok(Err(text)) => {
                        let mut t = text.into_bytes();
                        t.truncate(self.config.max_bytes);
                        (ReplyStatus::HandlerFailed, t)
                    }
                    Err(panic) => {
                        let what = crate::panics::message(&*panic);
                        (ReplyStatus::Internal, format!("handler {:?} on worker {me:?} panicked: {what}", job.function).into_bytes())
                    }
                }
            }
        };
        let (from, call_id) = (job.from, job.call_id);
        drop(job);
        self.send_reply(from, call_id, status, body);
        self.served.fetch_add(1, Ordering::SeqCst);
    }

    // ---- replies -----------------------------------------------------------------------------

    fn reply_listener(self: Arc<Self>) {
        let mut buf = [0u8; HEADER_LEN];
        while let Some((from, h)) = self.next_header(protocol::tag(TagClass::RepHeader, 0), &mut buf) {
            if h.kind != Kind::Reply {
                dc_log!(Level::Warn, self.rank_tag(), "RPC: unexpected {:?} header from worker {from}", h.kind);
                continue;
            }
            self.on_reply(from, h);
        }
    }

    fn on_reply(&self, from: usize, h: Header) {
        let body_tag = protocol::tag(TagClass::RepBody, h.call_id);
        let call = lock(&self.pending).get(&h.call_id).filter(|c| c.to == from).cloned();
        let Some(call) = call else {
            // Its caller gave up (timeout): drop the late reply.
            self.drain(from, body_tag);
            dc_log!(Level::Trace, self.rank_tag(), "late RPC reply for call #{} from worker {from} dropped", h.call_id);
            return;
        };
        let len = match h.reply_body_len(self.config.max_bytes) {
            Ok(n) => n,
            Err(msg) => {
                self.drain(from, body_tag);
                self.complete_call(&call, Err(Error::new(Status::Remote, format!("{}: {msg}", call.what()))));
                return;
            }
        };
        let what = || format!("receiving the reply of {}", call.what());
        let r = self.recv_body(from, body_tag, len, &what).and_then(|body| {
            let text = || String::from_utf8_lossy(&body).into_owned();
            match h.status {
                ReplyStatus::Ok => Ok(body),
                ReplyStatus::HandlerFailed => Err(Error::new(Status::Remote, format!("worker {:?}, function {:?}: {}", call.to_name, call.function, text()))),
                ReplyStatus::UnknownFunction | ReplyStatus::TooLarge | ReplyStatus::Internal => Err(Error::new(Status::Remote, text())),
                ReplyStatus::Other(v) => Err(Error::new(Status::Remote, format!("{} failed with unknown remote status {v}: {}", call.what(), text()))),
            }
        });
        self.complete_call(&call, r);
    }

    // ---- shutdown ----------------------------------------------------------------------------

    /// The collective part of shutdown: rounds of counter exchange until all is quiet.
    fn quiesce(self: &Arc<Self>) -> Result<()> {
        {
            let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
            if *st != State::Running {
                return Err(Error::new(Status::InvalidUsage, "dc_rpc_shutdown was already called"));
            }
            *st = State::ShuttingDown;
        }
        self.settle();
        let timeout_ms = self.rpc.timeout_ms();
        let deadline = deadline_after(timeout_ms);
        let mut prev: Option<Vec<Counters>> = None;
        let mut nap = Duration::from_millis(1);
        let mut rounds = 0u64;
        loop {
            let mine = Counters {
                issued: self.issued.load(Ordering::SeqCst),
                served: self.served.load(Ordering::SeqCst),
                finished: self.finished.load(Ordering::SeqCst),
                expired: (Instant::now() >= deadline) as u64,
            };
            let send: Vec<u8> = mine.to_words().iter().flat_map(|w| w.to_le_bytes()).collect();
            let mut recv = vec![0u8; send.len() * self.rpc.size()];
            self.rpc
                .collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Uint64 })
                .map_err(|e| e.context("dc_rpc_shutdown"))?;
            let words: Vec<u64> = recv.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
            let all: Vec<Counters> = words.chunks_exact(Counters::WORDS).map(Counters::from_words).collect();
            rounds += 1;
            match protocol::shutdown_round(prev.as_deref(), &all) {
                Round::Quiet => {
                    dc_log!(Level::Info, self.rank_tag(), "RPC shutdown: quiet after {rounds} rounds");
                    return Ok(());
                }
                Round::Expired => {
                    let (i, s, f) = all.iter().fold((0, 0, 0), |(i, s, f), c| (i + c.issued, s + c.served, f + c.finished));
                    return Err(Error::new(
                        Status::Timeout,
                        format!("calls were still in flight after the timeout of {timeout_ms} ms ({i} requests sent, {s} served, {f} calls ended; a handler that never returns?)"),
                    ));
                }
                Round::Busy => {
                    prev = Some(all);
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(50));
                }
            }
        }
    }

    /// Stops serving and releases everything (not collective). Idempotent.
    fn stop(self: &Arc<Self>) {
        {
            let mut st = self.state.write().unwrap_or_else(|p| p.into_inner());
            if *st == State::Stopped {
                return;
            }
            *st = State::Stopped;
        }
        self.stopped.store(true, Ordering::Release);
        let wait = Duration::from_millis(self.rpc.timeout_ms().clamp(0, 30_000) as u64);
        let deadline = Instant::now() + wait;
        // The listeners stop on a Stop header from this worker itself.
        let stop = Header::stop().encode();
        for class in [TagClass::ReqHeader, TagClass::RepHeader] {
            let _ = self.rpc.post_send_tag64(ConstBuf::from_slice(&stop), self.me, protocol::tag(class, 0));
        }
        for h in std::mem::take(&mut *lock(&self.listeners)) {
            let _ = h.join();
        }
        // Handler threads finish what they run and exit; requests still held are dropped.
        lock(&self.registry).held.clear();
        drop(lock(&self.pool.tx).take());
        while self.pool.live.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let handles = std::mem::take(&mut *lock(&self.pool.handles));
        if self.pool.live.load(Ordering::Acquire) == 0 {
            for h in handles {
                let _ = h.join();
            }
        } else {
            dc_log!(Level::Warn, self.rank_tag(), "RPC agent stopped with handlers still running (left behind)");
        }
        // Handlers may hold agent handles: forget them, so nothing keeps the agent alive.
        lock(&self.registry).handlers.clear();
        self.fail_pending(Status::Aborted, "the RPC agent was shut down");
        for w in self.watch.iter().flatten() {
            self.rpc.cancel_p2p(&P2pOp::Recv(w.clone()), || Error::new(Status::Aborted, "RPC agent stopped"));
        }
        let sends = std::mem::take(&mut *lock(&self.outbox));
        for o in &sends {
            for op in &o.ops {
                if let P2pOp::Send(s) = op {
                    let _ = s.comp.wait(deadline, &|| None);
                }
                self.rpc.cancel_p2p(op, || Error::new(Status::Aborted, "RPC agent stopped"));
            }
        }
        drop(sends);
        self.rpc.destroy();
        self.world.destroy();
        dc_log!(Level::Info, self.rank_tag(), "RPC agent stopped");
    }
}
