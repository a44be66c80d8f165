//! TCP transport: one connection per pair of ranks that talk, opened on demand (the first send
//! to a peer, or the peer's first send to us; see `connect_peer` and `admit`), a background
//! progress thread that reads
//! every connection and writes what callers could not write at once, matching by context,
//! source and tag. A thread waiting on an op (no rings, ranks not outnumbering cores) reads and
//! writes the connections itself while it spins, and the progress thread stands aside
//! meanwhile. A body whose receive is already posted is read straight into the caller's
//! buffer, and so is the rest of a large one whose receive is posted while it arrives; small
//! frames are batched through a per-connection staging buffer. Between ranks of
//! one host, frames go through shared-memory rings (`ring`); a large message is announced
//! (`Rts`) and then streamed through the ring once its receive is posted (`stream`), or, with
//! no rings, read single-copy from the sender's memory (`cma`); one whose receive does not come
//! stays in the sender's memory until it does, for at most [`park_limit`], and is then copied
//! out single-copy.
//!
//! Lock order: a connection's `rx` may be held while taking `matcher` or the peer's
//! `streams_in`; `claimed` may be held while taking `matcher` or a connection's `tx`; nothing
//! else nests.

use super::cma;
use super::frame::{FrameKind, Header, HEADER_LEN, RTS_LEN};
use super::handshake::{self, Hello};
use super::matching::{deliver_copy, verdict, Content, Matcher, Parked, Unexpected};
use super::protocol::{self, BodyAt, Decoder, Frame, Record, Rts, Step};
use super::ring::RingSegment;
use super::stream::{StreamIn, StreamOut};
use super::ops::{CtxState, RecvOp, SendOp, TagMatch};
use crate::buffer::{ConstBuf, MutBuf};
use crate::completion::{Done, Poll};
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes staged per connection for batching small frames.
const STAGE_LEN: usize = 64 * 1024;
/// Bodies with at least this much left are read straight into their destination.
const DIRECT_READ_MIN: usize = 16 * 1024;
/// Reason code of an abort frame (its `check` word): the sender found a collective mismatch.
pub const ABORT_MISMATCH: u32 = 1;

/// Messages at least this large that arrive before their receive may be taken over by a
/// receive posted while they arrive (see `SocketTransport::adopt_in_flight`).
const ADOPT_MIN: usize = 64 * 1024;
/// An unexpected body read straight from the socket grows its buffer by at least this much.
const UNEXP_GROW_MIN: usize = 1 << 20;
/// A single-copy message whose receive is not posted stays in the sender's memory this long
/// (the receive copies it from there); then we copy it out, so the sender is released even if
/// no receive comes (two ranks that both send before they receive do not deadlock). Ranks that
/// outnumber the cores wait their turn for a core for milliseconds: they get longer.
fn park_limit() -> Duration {
    if crate::completion::oversubscribed() { Duration::from_millis(10) } else { Duration::from_millis(1) }
}
/// How long a withdrawn receive waits for the rest of a message already being streamed to it
/// (see `SocketTransport::finish_stream_for`).
const STREAM_CANCEL_GRACE: Duration = Duration::from_secs(2);
/// How often a wait looks at the process of a peer on our host it has no connection to.
const ALIVE_CHECK_EVERY: Duration = Duration::from_millis(100);
/// How long an abort waits to connect to a member it never talked to.
const ABORT_CONNECT_WAIT: Duration = Duration::from_secs(5);
/// How long an unauthenticated connection may take to present its hello.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// Takes the first posted receive that accepts a message from `src` with `tag` on `ctx`, marked
/// as being filled from `src` before the caller releases the matcher: a canceller that no
/// longer finds it posted then knows which connection to wait for (see `cancel_recv`). The
/// caller holds that connection's `rx` and clears the mark when done.
fn claim_posted(m: &mut Matcher, ctx: u64, src: u32, tag: u64) -> Option<Arc<RecvOp>> {
    let op = m.take_posted(ctx, src, tag)?;
    op.filling_from.store(src, Ordering::Release);
    Some(op)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where the body of the data frame being read goes (the decoder knows how far it is).
enum Sink {
    /// No body is being read.
    Idle,
    /// Filling a posted receive: `keep` bytes go to the buffer, the rest is discarded.
    User { op: Arc<RecvOp>, keep: usize, result: Result<Done> },
    /// No receive was posted: the body is kept (as unexpected) once complete.
    Unexp { data: Vec<u8> },
    Discard,
}

/// A connection's reading side: bytes staged from the socket, the protocol's state (sans-IO,
/// see `protocol`) and where the current body goes.
struct Rx {
    stage: Box<[u8]>,
    start: usize,
    end: usize,
    dec: Decoder,
    sink: Sink,
}

enum Body {
    User(ConstBuf),
    Owned(Vec<u8>),
}

struct TxItem {
    hdr: [u8; HEADER_LEN],
    hdr_off: usize,
    body: Body,
    off: usize,
    op: Option<Arc<SendOp>>,
}

impl TxItem {
    fn body(&self) -> &[u8] {
        match &self.body {
            // SAFETY: the op's buffer stays valid until the op completes; it completes only
            // when this item is written, cancelled (body copied first) or failed.
            Body::User(b) => unsafe { b.as_slice() },
            Body::Owned(v) => v,
        }
    }

    /// Stops using the caller's buffer: copies what is left of it and detaches the op.
    fn detach(&mut self) -> Option<Arc<SendOp>> {
        if let Body::User(_) = self.body {
            let rest = self.body()[self.off..].to_vec();
            self.body = Body::Owned(rest);
            self.off = 0;
        }
        self.op.take()
    }
}

#[derive(Debug, Clone, PartialEq)]
enum PeerState {
    Up,
    /// The peer said goodbye (destroyed its communicator).
    Closed,
    Lost(String),
}

/// Whether a connection to a peer is being made (see `SocketTransport::connect_peer`).
#[derive(Debug, Clone, PartialEq)]
enum Dial {
    /// No connection and nobody making one.
    Idle,
    /// A thread of ours is connecting.
    Connecting,
    /// The peer connected to us at the same time and keeps its connection: it is on its way.
    AwaitingPeer,
}

struct Peer {
    rank: u32,
    /// The connection, once one was made (by either side).
    stream: OnceLock<TcpStream>,
    /// Connecting to the peer; the condvar tells waiting threads that the connection is up or
    /// the attempt ended.
    dial: Mutex<Dial>,
    dialled: Condvar,
    rx: Mutex<Rx>,
    tx: Mutex<VecDeque<TxItem>>,
    /// Outgoing bytes are queued: the progress thread watches for writability.
    tx_busy: AtomicBool,
    /// Nothing more will be read (EOF or error).
    rx_done: AtomicBool,
    state: Mutex<PeerState>,
    /// `state` is no longer `Up` (read without its lock on every send and receive).
    gone: AtomicBool,
    /// When `check_alive` last looked at the peer's process (ms since the transport started).
    alive_checked_ms: std::sync::atomic::AtomicU64,
    /// The peer's pid when it lets us read its memory (same host), for single-copy messages.
    cma_pid: Option<i32>,
    /// Our single-copy sends to this peer, waiting for its `Fin`, by cookie.
    awaiting_fin: Mutex<HashMap<u64, Arc<SendOp>>>,
    /// Same host: our ring in the peer's segment. Once set (during init, before any message),
    /// every data and single-copy frame to this peer goes through it, keeping them in order.
    ring_out: OnceLock<RingOut>,
    /// Messages the peer streams to us through our ring (see `stream`), in the order of their
    /// `Cts`. A chunk is copied under this lock, so a canceller waits for it.
    streams_in: Mutex<Vec<StreamIn>>,
}

/// Our ring in a peer's segment, and the frames that did not fit yet (sent in order as the
/// peer makes room).
struct RingOut {
    seg: RingSegment,
    index: usize,
    tx: Mutex<RingTx>,
}

/// The writer's side of a ring (one writer at a time: this lock).
#[derive(Default)]
struct RingTx {
    /// Frames waiting for room, in order.
    backlog: VecDeque<Vec<u8>>,
    /// Our last look at the reader's position (see `RingSegment::try_write`).
    head: u64,
    /// Messages the peer asked us to stream (`Cts`), appended after the backlog, in order.
    streams: VecDeque<StreamOut>,
    /// Frames moved from the backlog and streams into the ring so far.
    flushed: u64,
}

/// Our own ring segment: one incoming ring per same-host peer.
struct RingsIn {
    seg: RingSegment,
    /// By world rank: that peer's ring in our segment.
    index: Vec<Option<usize>>,
}

impl Peer {
    fn new(rank: u32, cma_pid: Option<i32>) -> Peer {
        Peer {
            rank,
            stream: OnceLock::new(),
            dial: Mutex::new(Dial::Idle),
            dialled: Condvar::new(),
            // The staging buffer comes with the connection (see `attach_stream`).
            rx: Mutex::new(Rx { stage: Box::default(), start: 0, end: 0, dec: Decoder::new(), sink: Sink::Idle }),
            tx: Mutex::new(VecDeque::new()),
            tx_busy: AtomicBool::new(false),
            rx_done: AtomicBool::new(false),
            state: Mutex::new(PeerState::Up),
            gone: AtomicBool::new(false),
            alive_checked_ms: std::sync::atomic::AtomicU64::new(0),
            cma_pid,
            awaiting_fin: Mutex::new(HashMap::new()),
            ring_out: OnceLock::new(),
            streams_in: Mutex::new(Vec::new()),
        }
    }

    /// The connection's descriptor (-1 before there is one: only peers with a connection are
    /// read, written or polled).
    fn fd(&self) -> RawFd {
        self.stream.get().map_or(-1, |s| s.as_raw_fd())
    }

    fn connected(&self) -> bool {
        self.stream.get().is_some()
    }

    #[inline]
    fn gone_error(&self) -> Option<Error> {
        if !self.gone.load(Ordering::Acquire) {
            return None;
        }
        self.why_gone()
    }

    #[cold]
    fn why_gone(&self) -> Option<Error> {
        match &*lock(&self.state) {
            PeerState::Up => None,
            PeerState::Closed => Some(Error::new(
                Status::PeerLost,
                format!("rank {} has closed its connection (it destroyed its communicator or exited)", self.rank),
            )),
            PeerState::Lost(why) => Some(Error::new(Status::PeerLost, format!("rank {} is lost: {why}", self.rank))),
        }
    }
}

/// Things noticed while reading that must be handled after the connection's lock is released.
enum Event {
    /// Context, reason code.
    RemoteAbort(u64, u32),
    Closed,
    Gone(String),
    /// Tell the peer we are done reading its single-copy message.
    SendFin { cookie: u64, ok: bool },
    /// The peer is done reading our single-copy message.
    Fin { cookie: u64, ok: bool },
    /// Tell the peer to look at our rings (its ring to us has room again).
    Bell,
    /// Send what waits for room in our ring to the peer.
    Flush,
    /// Ask the peer to stream its message `cookie` to us (its receive is posted here).
    SendCts { cookie: u64 },
    /// The peer asks us to stream our message `cookie`.
    Cts { cookie: u64 },
}

pub struct SocketTransport {
    rank: u32,
    size: u32,
    /// By world rank (ours stays empty): made on first use, connected on demand.
    peers: Vec<OnceLock<Arc<Peer>>>,
    /// The peers with a connection or an outgoing ring, the only ones polled, flushed and told
    /// goodbye (a snapshot is cheap to take; it changes only when one is added).
    active: Mutex<Arc<Vec<Arc<Peer>>>>,
    /// Every rank's data address, and who we are and what we present when we connect.
    addrs: Vec<SocketAddr>,
    mesh: MeshConfig,
    /// How long an on-demand connect may take (the init timeout).
    connect_wait: Duration,
    started: Instant,
    /// The thread that accepts peers' connections (see `accept`), and how to stop it.
    door: Mutex<Option<JoinHandle<()>>>,
    listener: Arc<TcpListener>,
    door_stop: Arc<AtomicBool>,
    matcher: Mutex<Matcher>,
    /// Receives that matched a parked message, for the progress thread to copy (held during
    /// each copy, so a canceller waits for it).
    claimed: Mutex<VecDeque<Claimed>>,
    /// Entries in `claimed` (so that waits need not lock it to see that it is empty).
    claimed_n: AtomicUsize,
    /// Same host: our incoming rings (set during init).
    rings_in: OnceLock<RingsIn>,
    /// Frames waiting in some `RingOut::backlog`.
    backlogged: AtomicUsize,
    /// Large messages being read from a socket before any receive matched them (see
    /// `adopt_in_flight`).
    arriving_unexpected: AtomicUsize,
    /// Threads of ours inside a wait that read the sockets themselves (see `read_while_waiting`):
    /// meanwhile the progress thread leaves incoming data to them.
    socket_readers: AtomicUsize,
    ctxs: Mutex<HashMap<u64, Weak<CtxState>>>,
    /// Contexts a peer aborted before this process created them.
    early_aborts: Mutex<HashSet<u64>>,
    /// Held while an abort is marked, failed and announced, and while the goodbyes are queued:
    /// a goodbye never overtakes an abort's frames.
    abort_order: Mutex<()>,
    /// Peers lost so far (died or broke their connection without a goodbye).
    lost: AtomicUsize,
    wake: OwnedFd,
    stop: AtomicBool,
    next_cookie: std::sync::atomic::AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A thread waiting on our rings (see `SocketTransport::spin_on_rings`).
pub struct RingSpin<'a> {
    t: &'a SocketTransport,
    rings: &'a RingsIn,
    /// World rank whose answer the wait needs, if one (a receive from it, a send to it).
    awaited: Option<u32>,
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

/// A receive and the parked message it matched.
struct Claimed {
    op: Arc<RecvOp>,
    msg: Unexpected,
    since: Instant,
}

/// A bound, listening data socket whose address the rendezvous publishes.
pub struct Listener {
    inner: TcpListener,
}

impl Listener {
    /// Binds an ephemeral port on `ip` (the interface that reaches the master, never all).
    pub fn bind(ip: IpAddr, backlog_hint: usize) -> Result<Listener> {
        let addr = SocketAddr::new(ip, 0);
        let sock = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)
            .map_err(|e| Error::system("socket", e))?;
        sock.bind(&addr.into()).map_err(|e| Error::system(format!("bind {addr}"), e))?;
        // Room for the peers and for strangers that come first (the acceptor drops those).
        sock.listen((backlog_hint + 128).min(4096) as i32).map_err(|e| Error::system("listen", e))?;
        Ok(Listener { inner: sock.into() })
    }

    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.inner.local_addr().map_err(|e| Error::system("getsockname", e))
    }
}

/// Who we are and what a peer must present.
#[derive(Clone)]
pub struct MeshConfig {
    pub rank: u32,
    pub size: u32,
    pub token_digest: [u8; 32],
    pub job_id: u64,
    pub deadline: Instant,
    /// Per rank: its pid if we may read its memory (single-copy), from `cma::probe`.
    pub cma_pids: Vec<Option<i32>>,
    /// Per rank: its pid if it runs on our host (whether we may read its memory or not), so
    /// that a wait for a peer we have no connection to notices that its process is gone.
    pub host_pids: Vec<Option<i32>>,
}

/// Send buffer of a connection whose two ends are on one host (loopback, or the same address
/// at both ends), where the kernel's autotuning lets it grow to `net.ipv4.tcp_wmem`'s maximum
/// (4 MiB here). Megabytes in flight are megabytes the receiver copies after they left the
/// caches; a quarter megabyte (the kernel doubles it) keeps the receiver reading what was
/// just written: 16 MiB allreduce 0.73x, 4 MiB point-to-point 0.59x the time with
/// autotuning. Remote connections keep autotuning: their round trips need the window.
const NEAR_SNDBUF: usize = 256 * 1024;

/// The send buffer to ask for on a connection (`DC_SOCKET_SNDBUF` bytes for every connection
/// if set, 0 meaning the kernel's autotuning), None to leave it to the kernel.
fn send_buffer_size(stream: &TcpStream) -> Option<usize> {
    static FORCED: once_cell::sync::Lazy<Option<usize>> =
        once_cell::sync::Lazy::new(|| crate::params::get().socket_sndbuf);
    if let Some(n) = *FORCED {
        return (n > 0).then_some(n);
    }
    let (local, peer) = (stream.local_addr().ok()?.ip(), stream.peer_addr().ok()?.ip());
    (peer.is_loopback() || peer == local).then_some(NEAR_SNDBUF)
}

fn tune(stream: &TcpStream) -> Result<()> {
    stream.set_nodelay(true).map_err(|e| Error::system("TCP_NODELAY", e))?;
    let s = socket2::SockRef::from(stream);
    let _ = s.set_keepalive(true);
    if let Some(n) = send_buffer_size(stream) {
        let _ = s.set_send_buffer_size(n);
    }
    Ok(())
}

/// The soft and hard limits on open descriptors, for errors that run out of them.
pub fn fd_limits() -> String {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return "RLIMIT_NOFILE unknown".into();
    }
    format!("RLIMIT_NOFILE soft {} hard {}", l.rlim_cur, l.rlim_max)
}

/// Raises the soft limit on open descriptors to the hard limit (once per process): a rank holds
/// a descriptor per peer it talks to, and many ranks may share a process.
pub fn raise_fd_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit read and write the struct we pass.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
                l.rlim_cur = l.rlim_max;
                let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
        }
    });
}

/// An error of ours that ran out of descriptors says which limit.
fn system_error(what: String, e: io::Error) -> Error {
    if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
        return Error::new(Status::System, format!("{what}: {e}: out of file descriptors ({})", fd_limits()));
    }
    Error::system(what, e)
}

/// A pseudo-random number in [0, n) for jitter (no need for quality).
fn jitter(n: u64) -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos() as u64;
    let x = t ^ (std::process::id() as u64).rotate_left(17) ^ (&t as *const u64 as u64);
    x.wrapping_mul(0x9E37_79B9_7F4A_7C15) % n.max(1)
}

/// How long one attempt waits for the acceptor's answer to our hello before it hangs up and
/// dials again. A genuine acceptor answers within milliseconds; an attempt can still stall
/// (the connection stuck in a full accept queue, the acceptor's thread starved on a crowded
/// host), and a fresh one gets through where the stalled one would wait out the whole deadline.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// How long the loser of a simultaneous connect waits for the winner's connection before it
/// dials again (the winner's attempt may have failed: nobody tells the loser).
const AWAIT_PEER_SLICE: Duration = Duration::from_secs(2);

/// Opens a connection to rank `peer` at `addr` and presents our hello; the peer's answer says
/// whether the pair keeps it. A refused connection means the peer's listener is closed (it is
/// bound before its address is published): the peer exited or shut its transport down. An
/// attempt that gets no answer within [`ANSWER_WAIT`] is dropped and made again.
fn connect_to(addr: SocketAddr, cfg: &MeshConfig, peer: u32, deadline: Instant) -> Result<(handshake::Answer, TcpStream)> {
    let mut backoff = Duration::from_millis(1);
    let mut refusals = 0;
    let mut stalls = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let why = if stalls > 0 { format!(" ({stalls} attempts got no answer within {ANSWER_WAIT:?})") } else { String::new() };
            return Err(Error::new(Status::Timeout, format!("could not connect to rank {peer} at {addr} within the timeout{why}")));
        }
        let retry = match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(mut s) => {
                let hello = Hello { digest: cfg.token_digest, job_id: cfg.job_id, rank: cfg.rank, world_size: cfg.size };
                match handshake::offer(&mut s, &hello, peer, left.min(ANSWER_WAIT))? {
                    handshake::Answer::Silent => {
                        stalls += 1;
                        dc_log!(Level::Warn, Some(cfg.rank as usize), "rank {peer} at {addr} did not answer our hello within {:?}; dialling again", left.min(ANSWER_WAIT));
                        false
                    }
                    ans => return Ok((ans, s)),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                refusals += 1;
                if refusals > 3 {
                    return Err(Error::new(Status::PeerLost, format!("rank {peer} at {addr} refused the connection: it has exited or closed its communicator")));
                }
                true
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::TimedOut | io::ErrorKind::Interrupted) => true,
            Err(e) => return Err(system_error(format!("connect to rank {peer} at {addr}"), e)),
        };
        if retry {
            // Jitter keeps ranks that all retry at once from coming back in step.
            let pause = backoff + Duration::from_micros(jitter(backoff.as_micros() as u64 + 1));
            std::thread::sleep(pause.min(left));
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }
}

impl SocketTransport {
    /// Starts the transport: the door that accepts peers' connections (on `listener`, whose
    /// address `addrs[rank]` the rendezvous published) and the progress thread. Nothing is
    /// connected yet: each pair connects when one of them first sends to the other.
    pub fn start(listener: Listener, addrs: &[SocketAddr], cfg: &MeshConfig, connect_wait: Duration) -> Result<Arc<SocketTransport>> {
        let n = cfg.size as usize;
        if addrs.len() != n || cfg.cma_pids.len() != n || cfg.host_pids.len() != n {
            return Err(Error::new(Status::Internal, "socket transport: address book and world size differ"));
        }
        raise_fd_limit();
        // SAFETY: eventfd returns a new descriptor we own, or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(system_error("eventfd".into(), io::Error::last_os_error()));
        }
        let listener = Arc::new(listener.inner);
        let t = Arc::new(SocketTransport {
            rank: cfg.rank,
            size: cfg.size,
            peers: (0..n).map(|_| OnceLock::new()).collect(),
            active: Mutex::new(Arc::new(Vec::new())),
            addrs: addrs.to_vec(),
            mesh: cfg.clone(),
            connect_wait,
            started: Instant::now(),
            door: Mutex::new(None),
            listener: listener.clone(),
            door_stop: Arc::new(AtomicBool::new(false)),
            matcher: Mutex::new(Matcher::default()),
            claimed: Mutex::new(VecDeque::new()),
            claimed_n: AtomicUsize::new(0),
            rings_in: OnceLock::new(),
            backlogged: AtomicUsize::new(0),
            socket_readers: AtomicUsize::new(0),
            arriving_unexpected: AtomicUsize::new(0),
            ctxs: Mutex::new(HashMap::new()),
            early_aborts: Mutex::new(HashSet::new()),
            abort_order: Mutex::new(()),
            lost: AtomicUsize::new(0),
            // SAFETY: efd is a fresh descriptor owned by nobody else.
            wake: unsafe { OwnedFd::from_raw_fd(efd) },
            stop: AtomicBool::new(false),
            next_cookie: std::sync::atomic::AtomicU64::new(1),
            thread: Mutex::new(None),
        });
        // The door holds only a weak reference: the transport's drop (after `shutdown`) is
        // not kept waiting for it.
        let weak = Arc::downgrade(&t);
        let stop = t.door_stop.clone();
        let mesh = cfg.clone();
        let door = std::thread::Builder::new()
            .name(format!("dc-accept-r{}", cfg.rank))
            .stack_size(256 << 10)
            .spawn(move || {
                super::accept::serve(&listener, &mesh, HELLO_WAIT, &stop, &mut |h, s| match weak.upgrade() {
                    Some(t) => {
                        // The door serves every peer: a fault while admitting one must not
                        // close it for the others.
                        let admitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.admit(h.rank, s)));
                        if let Err(p) = admitted {
                            let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
                            dc_log!(Level::Warn, Some(t.rank as usize), "admitting rank {}'s connection panicked: {what}", h.rank);
                        }
                    }
                    None => drop(s),
                });
            })
            .map_err(|e| Error::system("spawn the data acceptor", e))?;
        *lock(&t.door) = Some(door);
        let t2 = t.clone();
        let handle = std::thread::Builder::new()
            .name(format!("dc-progress-r{}", cfg.rank))
            .spawn(move || t2.progress_loop())
            .map_err(|e| Error::system("spawn progress thread", e))?;
        *lock(&t.thread) = Some(handle);
        dc_log!(Level::Info, Some(cfg.rank as usize), "socket transport: {} peers, connected on demand", n.saturating_sub(1));
        Ok(t)
    }

    /// The peers with a connection or an outgoing ring.
    fn active(&self) -> Arc<Vec<Arc<Peer>>> {
        lock(&self.active).clone()
    }

    fn activate(&self, peer: &Arc<Peer>) {
        let mut a = lock(&self.active);
        if !a.iter().any(|p| Arc::ptr_eq(p, peer)) {
            let mut v = Vec::with_capacity(a.len() + 1);
            v.extend(a.iter().cloned());
            v.push(peer.clone());
            *a = Arc::new(v);
        }
    }

    /// Makes `stream` the connection to `peer` (the caller holds its `dial` lock) and lets the
    /// progress thread watch it.
    fn attach_stream(&self, peer: &Arc<Peer>, stream: TcpStream) -> Result<()> {
        tune(&stream)?;
        stream.set_nonblocking(true).map_err(|e| Error::system("nonblocking", e))?;
        lock(&peer.rx).stage = vec![0u8; STAGE_LEN].into_boxed_slice();
        if peer.stream.set(stream).is_err() {
            return Err(Error::new(Status::Internal, format!("a second connection to rank {}", peer.rank)));
        }
        self.activate(peer);
        peer.dialled.notify_all();
        self.wake_progress();
        dc_log!(Level::Trace, Some(self.rank as usize), "connected to rank {}", peer.rank);
        Ok(())
    }

    /// The door's part: rank `from` connected to us (hello checked, not answered). When both
    /// ranks of a pair connect at once, the lower rank's connection is the one kept: the higher
    /// rank accepts it while its own attempt is answered "duplicate" and waits for it.
    fn admit(&self, from: u32, mut stream: TcpStream) {
        let peer = self.peer(from);
        let dial = lock(&peer.dial);
        let ours_wins = *dial == Dial::Connecting && self.rank < from;
        if peer.connected() || ours_wins {
            handshake::duplicate(&mut stream);
            return;
        }
        if handshake::accept(&mut stream).is_err() {
            return;
        }
        if let Err(e) = self.attach_stream(peer, stream) {
            dc_log!(Level::Warn, Some(self.rank as usize), "connection from rank {from}: {}", e.msg);
        }
        drop(dial);
    }

    /// Connects to `peer` unless a connection exists (made by either side); the connection is
    /// up when this returns Ok. Other threads wanting the same peer meanwhile wait for this one.
    fn connect_peer(&self, peer: &Arc<Peer>, wait: Duration) -> Result<()> {
        if peer.connected() {
            return Ok(());
        }
        let deadline = Instant::now() + wait;
        let mut dial = lock(&peer.dial);
        loop {
            if peer.connected() {
                return Ok(());
            }
            if let Some(e) = peer.gone_error() {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                let why = if *dial == Dial::AwaitingPeer { " (it was connecting to us at the same time and its connection never came)" } else { "" };
                return Err(Error::new(Status::Timeout, format!("no connection to rank {} within {wait:?}{why}", peer.rank)));
            }
            match *dial {
                Dial::Idle => break,
                Dial::Connecting | Dial::AwaitingPeer => {
                    dial = peer.dialled.wait_timeout(dial, (deadline - now).min(Duration::from_millis(100))).unwrap_or_else(|p| p.into_inner()).0;
                }
            }
        }
        *dial = Dial::Connecting;
        drop(dial);
        let mut slice = AWAIT_PEER_SLICE;
        let (r, mut dial) = loop {
            let attempt = connect_to(self.addrs[peer.rank as usize], &self.mesh, peer.rank, deadline);
            let mut dial = lock(&peer.dial);
            match attempt {
                Ok((handshake::Answer::Accepted, s)) => break (self.attach_stream(peer, s), dial),
                Ok((handshake::Answer::Duplicate, _)) => {
                    // Its connection is on its way (or here already): wait for it like any
                    // thread, for a while; its attempt may have failed, so then dial again.
                    *dial = Dial::AwaitingPeer;
                    let until = deadline.min(Instant::now() + slice);
                    while !peer.connected() && Instant::now() < until && peer.gone_error().is_none() {
                        let left = until.saturating_duration_since(Instant::now()).min(Duration::from_millis(100));
                        dial = peer.dialled.wait_timeout(dial, left).unwrap_or_else(|p| p.into_inner()).0;
                    }
                    if peer.connected() {
                        break (Ok(()), dial);
                    }
                    if let Some(e) = peer.gone_error() {
                        break (Err(e), dial);
                    }
                    if Instant::now() >= deadline {
                        let e = Error::new(Status::Timeout, format!("rank {} said it connects to us but did not within {wait:?}", peer.rank));
                        break (Err(e), dial);
                    }
                    dc_log!(Level::Info, Some(self.rank as usize), "rank {} said it connects to us but did not within {slice:?}; dialling again", peer.rank);
                    *dial = Dial::Connecting;
                    drop(dial);
                    slice *= 2;
                }
                Ok((handshake::Answer::Silent, _)) => {
                    break (Err(Error::new(Status::Timeout, format!("rank {} did not answer within {wait:?}", peer.rank))), dial);
                }
                Err(e) => break (Err(e), dial),
            }
        };
        *dial = Dial::Idle;
        peer.dialled.notify_all();
        drop(dial);
        if let Err(e) = &r {
            if e.status == Status::PeerLost {
                self.mark_lost(peer, e.msg.clone());
            }
        }
        r
    }

    /// Stops accepting connections (the door thread ends; the listener closes with us).
    fn stop_door(&self) {
        let Some(door) = lock(&self.door).take() else { return };
        self.door_stop.store(true, Ordering::Release);
        // Wakes the door's poll (the descriptor stays ours until the transport is dropped).
        // SAFETY: shutdown on a listening socket we own.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = door.join();
    }

    /// For a wait on world rank `r`: an error if it is gone. A peer we have no connection to
    /// yet (on demand) cannot tell us it died, so one on our host is looked at directly (its
    /// process, at most every [`ALIVE_CHECK_EVERY`]); one with a connection is watched there.
    pub fn check_alive(&self, r: u32) -> Option<Error> {
        if r == self.rank {
            return None;
        }
        let peer = self.peer(r);
        if let Some(e) = peer.gone_error() {
            return Some(e);
        }
        if peer.connected() {
            return None;
        }
        let pid = self.mesh.host_pids.get(r as usize).copied().flatten()?;
        if pid == std::process::id() as i32 {
            return None;
        }
        let now = self.started.elapsed().as_millis() as u64;
        let last = peer.alive_checked_ms.load(Ordering::Relaxed);
        if last != 0 && now < last + ALIVE_CHECK_EVERY.as_millis() as u64 {
            return None;
        }
        peer.alive_checked_ms.store(now.max(1), Ordering::Relaxed);
        if process_gone(pid) {
            self.mark_lost(peer, format!("its process {pid} is gone (it exited or was killed)"));
            self.fail_peer_ops(peer);
            return peer.gone_error();
        }
        None
    }

    /// Connects to world rank `r` now rather than at the first message (tests, warm-ups).
    pub fn connect(&self, r: u32) -> Result<()> {
        if r == self.rank || r >= self.size {
            return Err(Error::new(Status::InvalidArgument, format!("no peer rank {r} to connect to")));
        }
        self.connect_peer(self.peer(r), self.connect_wait)
    }

    /// How many peers we hold a connection to.
    pub fn connected_peers(&self) -> usize {
        self.active().iter().filter(|p| p.connected()).count()
    }

    /// A peer we could not reach (its listener is closed) is lost, as one whose connection broke.
    fn mark_lost(&self, peer: &Arc<Peer>, why: String) {
        let mut st = lock(&peer.state);
        if *st == PeerState::Up {
            dc_log!(Level::Warn, Some(self.rank as usize), "lost rank {}: {why}", peer.rank);
            *st = PeerState::Lost(why);
            peer.gone.store(true, Ordering::Release);
            self.lost.fetch_add(1, Ordering::Release);
        }
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    fn peer(&self, r: u32) -> &Arc<Peer> {
        debug_assert!(r != self.rank, "no peer for ourselves");
        self.peers[r as usize].get_or_init(|| Arc::new(Peer::new(r, self.mesh.cma_pids.get(r as usize).copied().flatten())))
    }

    /// The peer if it was ever used (None: nothing was sent to or received from it yet).
    fn peer_if_known(&self, r: u32) -> Option<&Arc<Peer>> {
        self.peers.get(r as usize)?.get()
    }

    fn wake_progress(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// The pid of world rank `r` when we may read its memory directly (same host, probed).
    pub fn readable_pid(&self, r: u32) -> Option<i32> {
        if r == self.rank {
            return Some(std::process::id() as i32);
        }
        self.mesh.cma_pids.get(r as usize).copied().flatten()
    }

    /// Makes a context known so aborts from peers reach it.
    pub fn register_ctx(&self, ctx: &Arc<CtxState>) {
        lock(&self.ctxs).insert(ctx.id, Arc::downgrade(ctx));
        if lock(&self.early_aborts).remove(&ctx.id) {
            ctx.abort("a peer aborted this communicator");
        }
    }

    /// Forgets a destroyed context and any messages still waiting for it.
    pub fn unregister_ctx(&self, id: u64) {
        lock(&self.ctxs).remove(&id);
        let parked = lock(&self.matcher).remove_ctx(id);
        // Their messages are dropped with the context, as received ones are.
        for (src, p) in parked {
            self.release_sender(self.peer(src), p.cookie, true);
        }
    }

    /// The first of `members` (world ranks) that is lost, as (index in `members`, why). Peers that
    /// said goodbye are not lost. One atomic load while nobody is lost.
    pub fn lost_among(&self, members: &[u32]) -> Option<(usize, String)> {
        if self.lost.load(Ordering::Acquire) == 0 {
            return None;
        }
        members.iter().enumerate().find_map(|(i, &m)| match self.peer_if_known(m).map(|p| lock(&p.state).clone()) {
            Some(PeerState::Lost(why)) => Some((i, why)),
            _ => None,
        })
    }

    /// Registered contexts plus contexts with matching state (leak checks, diagnostics).
    pub fn live_contexts(&self) -> usize {
        lock(&self.ctxs).len() + lock(&self.matcher).num_ctxs()
    }

    // ---- posting -------------------------------------------------------------------------

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
        let peer = self.peer(dst);
        if peer.ring_out.get().is_some() {
            return self.post_via_ring(peer, ctx, tag, check, op);
        }
        if peer.cma_pid.is_some() && buf.len() >= cma::threshold() && cma::threshold() > 0 {
            return self.post_rts(peer, ctx, tag, check, op);
        }
        let item = TxItem { hdr: Header::data(ctx.id, tag, check, buf.len()).encode(), hdr_off: 0, body: Body::User(buf), off: 0, op: Some(op.clone()) };
        self.enqueue(peer, item)?;
        Ok(op)
    }

    /// Sends a message of at most the ring's `inline_max()` bytes to a peer on our host: appended to
    /// its ring at once (or queued, in order, for room), so the send is complete on return and
    /// needs no op to wait on. None where that does not apply (no ring, larger, to ourselves):
    /// the caller posts the send.
    pub fn send_inline(&self, ctx: &CtxState, dst: u32, tag: u64, check: u32, buf: ConstBuf) -> Option<Result<Done>> {
        if dst == self.rank {
            return None;
        }
        let peer = self.peer(dst);
        if buf.len() > peer.ring_out.get()?.seg.inline_max() {
            return None;
        }
        if let Some(e) = ctx.abort_error().or_else(|| peer.gone_error()) {
            return Some(Err(e));
        }
        Some(Ok(self.write_inline(peer, ctx.id, tag, check, buf)))
    }

    /// Appends a message of at most the ring's `inline_max()` bytes to `peer`'s ring (or queues a
    /// copy, in order, for room): the send is complete.
    fn write_inline(&self, peer: &Arc<Peer>, ctx: u64, tag: u64, check: u32, buf: ConstBuf) -> Done {
        // SAFETY: the caller's buffer is valid during this call; the ring keeps a copy.
        let body = unsafe { buf.as_slice() };
        self.ring_write(peer, &[&Header::data(ctx, tag, check, buf.len()).encode(), body]);
        Done { bytes: buf.len(), source: peer.rank, tag }
    }

    /// Single-copy send: tell the peer where the message is; it completes on the peer's `Fin`.
    fn post_rts(&self, peer: &Arc<Peer>, ctx: &Arc<CtxState>, tag: u64, check: u32, op: Arc<SendOp>) -> Result<Arc<SendOp>> {
        let (cookie, hdr, body) = self.rts_frame(peer, ctx, tag, check, &op);
        if let Err(e) = self.enqueue(peer, TxItem { hdr: hdr.encode(), hdr_off: 0, body: Body::Owned(body.to_vec()), off: 0, op: None }) {
            lock(&peer.awaiting_fin).remove(&cookie);
            return Err(e);
        }
        Ok(op)
    }

    /// The `Rts` frame announcing `op`'s buffer, registered to wait for its `Fin`.
    fn rts_frame(&self, peer: &Peer, ctx: &CtxState, tag: u64, check: u32, op: &Arc<SendOp>) -> (u64, Header, [u8; RTS_LEN]) {
        let cookie = self.next_cookie.fetch_add(1, Ordering::Relaxed);
        let body = Rts { cookie, addr: op.buf.addr() as u64, len: op.buf.len() as u64 }.encode();
        lock(&peer.awaiting_fin).insert(cookie, op.clone());
        (cookie, Header { kind: FrameKind::Rts, check, ctx: ctx.id, tag, len: RTS_LEN as u64 }, body)
    }

    /// A send to a peer on our host: small bodies go inside the ring (the send is then done),
    /// larger ones single-copy with the `Rts` in the ring.
    fn post_via_ring(&self, peer: &Arc<Peer>, ctx: &Arc<CtxState>, tag: u64, check: u32, op: Arc<SendOp>) -> Result<Arc<SendOp>> {
        if let Some(e) = peer.gone_error() {
            return Err(e);
        }
        if peer.ring_out.get().is_some_and(|o| op.buf.len() <= o.seg.inline_max()) {
            op.comp.complete(Ok(self.write_inline(peer, ctx.id, tag, check, op.buf)));
        } else {
            let (_, hdr, body) = self.rts_frame(peer, ctx, tag, check, &op);
            self.ring_write(peer, &[&hdr.encode(), &body]);
        }
        Ok(op)
    }

    /// Appends a frame to the peer's ring, after whatever waits for room (in order); rings the
    /// peer's doorbell unless it is watching.
    fn ring_write(&self, peer: &Arc<Peer>, parts: &[&[u8]]) {
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
    fn pump(&self, out: &RingOut, tx: &mut RingTx) {
        if !self.flush_backlog(out, tx) {
            out.seg.mark_waiting(out.index);
            // The peer may have drained between our try and the mark: try once more.
            self.flush_backlog(out, tx);
        }
    }

    /// After a write to `peer`'s ring: its doorbell, if a thread of it sleeps in a wait.
    fn bell_if_needed(&self, peer: &Arc<Peer>, out: &RingOut) {
        if out.seg.needs_bell(out.index) {
            let _ = self.send_control(peer, Header::control(FrameKind::Bell, 0));
        }
    }

    /// Moves waiting frames, then the chunks of streamed messages, into the ring while they
    /// fit; true when nothing is left. A streamed send completes with its last chunk.
    fn flush_backlog(&self, out: &RingOut, tx: &mut RingTx) -> bool {
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
    fn start_stream(&self, peer: &Arc<Peer>, cookie: u64) {
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
    fn flush_ring(&self, peer: &Arc<Peer>) -> bool {
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
    fn flush_all_rings(&self) -> bool {
        if self.backlogged.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.active().iter().fold(false, |moved, p| self.flush_ring(p) | moved)
    }

    /// Queues a body-less control frame (abort, goodbye, fin) for `peer`.
    fn send_control(&self, peer: &Arc<Peer>, hdr: Header) -> Result<()> {
        self.enqueue(peer, TxItem { hdr: hdr.encode(), hdr_off: 0, body: Body::Owned(Vec::new()), off: 0, op: None })
    }

    fn enqueue(&self, peer: &Arc<Peer>, item: TxItem) -> Result<()> {
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

    fn send_to_self(&self, ctx: u64, tag: u64, check: u32, buf: ConstBuf) {
        // SAFETY: the caller's send buffer is valid for the duration of this call.
        let data = unsafe { buf.as_slice() };
        self.deliver_or_file(ctx, self.rank, tag, check, Cow::Borrowed(data));
    }

    /// A message received in full: into its posted receive if there is one (copied under the
    /// matcher's lock, so a canceller cannot withdraw the receive meanwhile), else kept as
    /// unexpected (a borrowed `data` is copied only then).
    fn deliver_or_file(&self, ctx: u64, src: u32, tag: u64, check: u32, data: Cow<'_, [u8]>) {
        let mut m = lock(&self.matcher);
        match m.take_posted(ctx, src, tag) {
            Some(op) => deliver_copy(&op, src, tag, check, &data),
            None => m.push_unexpected(ctx, Unexpected::bytes(src, tag, check, data.into_owned())),
        }
    }

    /// Posts a receive from world rank `src` (None: any source).
    pub fn post_recv(&self, ctx: &Arc<CtxState>, src: Option<u32>, tag: TagMatch, check: u32, buf: MutBuf) -> Result<Arc<RecvOp>> {
        if let Some(e) = ctx.abort_error() {
            return Err(e);
        }
        let op = RecvOp::new(ctx, src, tag, check, buf);
        let mut m = lock(&self.matcher);
        if let Some(msg) = m.take_unexpected(&op) {
            drop(m);
            match &msg.content {
                Content::Bytes(data) => deliver_copy(&op, msg.src, msg.tag, msg.check, data),
                Content::InSender(p) if self.peer(msg.src).ring_out.get().is_some() => {
                    // Announced through the ring: have it streamed (see `stream`).
                    let peer = self.peer(msg.src);
                    lock(&peer.streams_in).push(StreamIn::new(p.cookie, op.clone(), msg.src, msg.tag, msg.check, p.len));
                    self.reply(peer, Header { tag: p.cookie, ..Header::control(FrameKind::Cts, 0) });
                }
                Content::InSender(_) => {
                    // The copy takes a while: this call (an irecv perhaps, followed by a send)
                    // goes on, and the next wait makes the copy (see `copy_claimed`).
                    lock(&self.claimed).push_back(Claimed { op: op.clone(), msg, since: Instant::now() });
                    self.claimed_n.fetch_add(1, Ordering::Release);
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

    /// A large message that is being read without a receive (none was posted when its header
    /// came) is taken over by the first receive posted for it since: what arrived is copied
    /// into its buffer and the rest is read straight there, instead of into a buffer that is
    /// copied again once complete. (Two ranks exchanging large messages are rarely in step:
    /// one side's next message often starts to arrive before the other posts its receive.)
    /// The reader holds the connection, so no other message of this peer can slip in between.
    fn adopt_in_flight(&self, peer: &Peer, rx: &mut Rx) {
        let (Sink::Unexp { data }, Some(at)) = (&rx.sink, rx.dec.body()) else { return };
        let (hdr, len, got) = (at.hdr, at.len(), at.off);
        debug_assert_eq!(got, data.len());
        if len < ADOPT_MIN || got >= len {
            return;
        }
        let Some(op) = claim_posted(&mut lock(&self.matcher), hdr.ctx, peer.rank, hdr.tag) else { return };
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

    // ---- cancelling ----------------------------------------------------------------------

    /// Withdraws a receive (timeout, abort, drop). On return the transport no longer touches its
    /// buffer; the op is completed with `err` unless it had already finished.
    pub fn cancel_recv(&self, op: &Arc<RecvOp>, err: Error) {
        if lock(&self.matcher).remove_posted(op) {
            op.comp.complete(Err(err));
            return;
        }
        {
            // Waits for a copy in progress; a claim not yet copied gives its message back.
            let mut q = lock(&self.claimed);
            if let Some(i) = q.iter().position(|c| Arc::ptr_eq(&c.op, op)) {
                let c = q.remove(i).expect("position is in range");
                self.claimed_n.fetch_sub(1, Ordering::Release);
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
            self.finish_stream_for(op, from);
        }
    }

    /// A receive being withdrawn that a peer streams to: the message was taken from the
    /// queue and asked for, so it cannot go back; the receive gets it, as if it had completed
    /// just before (we read our ring until it has). Only if the sender stops sending for
    /// [`STREAM_CANCEL_GRACE`] is the receive failed and the rest of the message dropped.
    /// Returns at once if `op` is not being streamed to.
    fn finish_stream_for(&self, op: &Arc<RecvOp>, from: u32) {
        let peer = self.peer(from);
        let give_up = Instant::now() + STREAM_CANCEL_GRACE;
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
    /// the stream stays well-formed. The op is completed with `err` unless already finished.
    pub fn cancel_send(&self, op: &Arc<SendOp>, err: Error) {
        if op.dst != self.rank {
            // A single-copy send the peer has not finished reading: stop waiting for it. (The
            // peer reads as soon as the request arrives, so only a frozen peer can still read.)
            lock(&self.peer(op.dst).awaiting_fin).retain(|_, o| !Arc::ptr_eq(o, op));
            if let Some(out) = self.peer(op.dst).ring_out.get() {
                // Being streamed: the rest is copied, so the receiver still gets it whole.
                let mut tx = lock(&out.tx);
                if let Some(s) = tx.streams.iter_mut().find(|s| s.op.as_ref().is_some_and(|o| Arc::ptr_eq(o, op))) {
                    s.detach();
                }
            }
            let mut q = lock(&self.peer(op.dst).tx);
            if let Some(i) = q.iter().position(|it| it.op.as_ref().is_some_and(|o| Arc::ptr_eq(o, op))) {
                if q[i].hdr_off == 0 {
                    q.remove(i);
                } else {
                    q[i].detach();
                }
            }
        }
        op.comp.complete(Err(err));
    }

    // ---- abort ---------------------------------------------------------------------------

    /// Marks `ctx` aborted (`mark`), fails every pending operation of aborted contexts and tells
    /// `members` (world ranks) why (`code`: 0 for dc_comm_abort, [`ABORT_MISMATCH`]), all before
    /// any goodbye can be queued: a thread the abort releases may destroy the comm at once, and
    /// its goodbye must not reach the peers first (they would report a lost peer instead).
    pub fn abort_ctx(&self, ctx: &Arc<CtxState>, members: &[u32], code: u32, mark: impl FnOnce()) {
        let _order = lock(&self.abort_order);
        mark();
        self.fail_aborted();
        for &m in members {
            if m != self.rank {
                // Members we never talked to are told too (connected to for it, briefly: a
                // dead one must not hold the abort up).
                let p = self.peer(m);
                if self.connect_peer(p, self.connect_wait.min(ABORT_CONNECT_WAIT)).is_ok() {
                    let _ = self.send_control(p, Header { check: code, ..Header::control(FrameKind::Abort, ctx.id) });
                }
            }
        }
    }

    fn fail_aborted(&self) {
        let fail = |c: &Arc<CtxState>| Err(c.abort_error().unwrap_or_else(|| Error::new(Status::Aborted, "aborted")));
        let ops = lock(&self.matcher).drain_posted(|op| op.ctx.is_aborted());
        for op in ops {
            op.comp.complete(fail(&op.ctx));
        }
        for p in self.active().iter() {
            {
                let mut rx = lock(&p.rx);
                if let Sink::User { op, .. } = &rx.sink {
                    if op.ctx.is_aborted() {
                        let op = op.clone();
                        rx.sink = Sink::Discard;
                        op.filling_from.store(u32::MAX, Ordering::Release);
                        op.comp.complete(fail(&op.ctx));
                    }
                }
            }
            for s in lock(&p.streams_in).iter_mut() {
                if let Some(ctx) = s.op.as_ref().map(|o| o.ctx.clone()).filter(|c| c.is_aborted()) {
                    s.finish(fail(&ctx).err());
                }
            }
            if let Some(out) = p.ring_out.get() {
                for s in lock(&out.tx).streams.iter_mut() {
                    if let Some(op) = s.op.as_ref().filter(|o| o.ctx.is_aborted()).cloned() {
                        s.detach();
                        op.comp.complete(fail(&op.ctx));
                    }
                }
            }
            lock(&p.awaiting_fin).retain(|_, op| {
                let aborted = op.ctx.is_aborted();
                if aborted {
                    op.comp.complete(fail(&op.ctx));
                }
                !aborted
            });
            let mut q = lock(&p.tx);
            let mut i = 0;
            while i < q.len() {
                let aborted = q[i].op.as_ref().is_some_and(|o| o.ctx.is_aborted());
                if aborted && q[i].hdr_off == 0 {
                    let it = q.remove(i).unwrap();
                    let op = it.op.unwrap();
                    op.comp.complete(fail(&op.ctx));
                    continue;
                }
                if aborted {
                    if let Some(op) = q[i].detach() {
                        op.comp.complete(fail(&op.ctx));
                    }
                }
                i += 1;
            }
        }
    }

    fn on_remote_abort(&self, ctx_id: u64, from: u32, code: u32) {
        let ctx = lock(&self.ctxs).get(&ctx_id).and_then(|w| w.upgrade());
        let why = match code {
            ABORT_MISMATCH => " after it found mismatched collective arguments (DC_ERR_MISMATCH there)",
            _ => "",
        };
        match ctx {
            Some(c) => {
                if c.abort(&format!("rank {from} aborted the communicator{why}")) {
                    dc_log!(Level::Warn, Some(self.rank as usize), "rank {from} aborted communicator {ctx_id:#x}");
                }
            }
            None => {
                lock(&self.early_aborts).insert(ctx_id);
            }
        }
        self.fail_aborted();
    }

    // ---- writing -------------------------------------------------------------------------

    /// Writes queued frames until the queue is empty (Ok(true)) or the socket is full (Ok(false)).
    fn flush(&self, peer: &Peer, q: &mut VecDeque<TxItem>) -> io::Result<bool> {
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

    fn pump_tx(&self, peer: &Peer) -> Option<Event> {
        self.pump_tx_locked(peer, lock(&peer.tx))
    }

    fn pump_tx_locked(&self, peer: &Peer, mut q: MutexGuard<'_, VecDeque<TxItem>>) -> Option<Event> {
        match self.flush(peer, &mut q) {
            Ok(true) => {
                peer.tx_busy.store(false, Ordering::Release);
                None
            }
            Ok(false) => None,
            Err(e) => Some(Event::Gone(format!("write failed: {e}"))),
        }
    }

    // ---- reading -------------------------------------------------------------------------

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
    fn enter_sockets(&self) {
        self.socket_readers.fetch_add(1, Ordering::SeqCst);
    }

    /// A reader stops reading; the last one hands the sockets back to the progress thread.
    fn leave_sockets(&self) {
        if self.socket_readers.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.wake_progress();
        }
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
    fn pump_rx(&self, peer: &Peer, events: &mut Vec<Event>) {
        self.pump_read(peer, lock(&peer.rx), events, true);
    }

    /// Reads what the connection has (without blocking) and consumes it; whether any bytes came.
    fn pump_locked(&self, peer: &Peer, rx: MutexGuard<'_, Rx>, events: &mut Vec<Event>) -> bool {
        self.pump_read(peer, rx, events, false)
    }

    fn pump_read(&self, peer: &Peer, mut rx: MutexGuard<'_, Rx>, events: &mut Vec<Event>, yield_to_readers: bool) -> bool {
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
            let Rx { stage, dec, sink, .. } = &mut *rx;
            let (ptr, len, direct) = match (dec.body(), sink) {
                (Some(at), Sink::User { op, keep, .. }) if keep.saturating_sub(at.off) >= DIRECT_READ_MIN => {
                    // SAFETY: off < keep <= buf.len(); the op is ours until completed.
                    (unsafe { op.buf.as_ptr().add(at.off) }, *keep - at.off, true)
                }
                (Some(at), Sink::Unexp { data }) if at.left() >= DIRECT_READ_MIN => {
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
                _ => (stage.as_mut_ptr(), stage.len(), false),
            };
            // SAFETY: ptr is valid for len writable bytes (see above).
            let n = unsafe { libc::recv(peer.fd(), ptr as *mut libc::c_void, len, libc::MSG_DONTWAIT) };
            if n == 0 {
                self.drain_ring_locked(peer, events);
                events.push(Event::Gone("connection closed by the peer (process exited or was killed?)".into()));
                return true;
            }
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => return got,
                    io::ErrorKind::Interrupted => continue,
                    _ => {
                        events.push(Event::Gone(format!("read failed: {e}")));
                        return true;
                    }
                }
            }
            let n = n as usize;
            got = true;
            if !direct {
                rx.end = n;
                continue;
            }
            if let Sink::Unexp { data } = &mut rx.sink {
                // SAFETY: the kernel initialised n more bytes within the reserved capacity.
                unsafe { data.set_len(data.len() + n) };
            }
            let at = rx.dec.body_read(n);
            self.settle(peer, &mut rx.sink, at);
        }
    }

    /// Decodes the staged bytes (see `protocol`) and carries out what they complete: frames
    /// are acted on, body bytes go to the current sink.
    fn consume(&self, peer: &Peer, rx: &mut Rx, events: &mut Vec<Event>) -> Result<()> {
        let Rx { stage, start, end, dec, sink } = rx;
        while *start < *end {
            let (n, step) = dec.decode(&stage[*start..*end])?;
            *start += n;
            match step {
                None => {}
                Some(Step::Frame(f)) => self.on_frame(peer, f, sink, events),
                Some(Step::Body { hdr, off, data }) => {
                    match sink {
                        Sink::User { op, keep, .. } => {
                            let n = data.len().min(keep.saturating_sub(off));
                            // SAFETY: off + n <= keep <= buf.len(); the op is ours until completed.
                            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), op.buf.as_ptr().add(off), n) };
                        }
                        Sink::Unexp { data: v } => {
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
        }
        Ok(())
    }

    /// Moves on from a body that has all it takes: completes its receive (the rest of the body
    /// is discarded) or files it as unexpected.
    fn settle(&self, peer: &Peer, sink: &mut Sink, at: BodyAt) {
        let next = match sink {
            Sink::User { op, keep, result } if at.off >= *keep => {
                op.filling_from.store(u32::MAX, Ordering::Release);
                let r = std::mem::replace(result, Ok(Done::default()));
                op.comp.complete(r);
                if at.left() > 0 { Sink::Discard } else { Sink::Idle }
            }
            Sink::Unexp { data } if at.left() == 0 => {
                if at.len() >= ADOPT_MIN {
                    self.arriving_unexpected.fetch_sub(1, Ordering::Relaxed);
                }
                let h = at.hdr;
                self.deliver_or_file(h.ctx, peer.rank, h.tag, h.check, Cow::Owned(std::mem::take(data)));
                Sink::Idle
            }
            Sink::Discard if at.left() == 0 => Sink::Idle,
            _ => return,
        };
        *sink = next;
    }

    /// A single-copy message: copy it out of the sender's memory into its posted receive and
    /// tell the sender it may reuse its buffer (or, when it came through our ring, ask the
    /// sender to stream it, see `stream`); with no receive posted, park it (see
    /// [`park_limit`]).
    fn on_rts(&self, peer: &Peer, hdr: Header, rts: Rts, via_ring: bool, events: &mut Vec<Event>) {
        let parked = Parked { cookie: rts.cookie, addr: rts.addr, len: rts.len as usize, since: Instant::now() };
        let mut m = lock(&self.matcher);
        let Some(op) = claim_posted(&mut m, hdr.ctx, peer.rank, hdr.tag) else {
            m.push_unexpected(hdr.ctx, Unexpected { src: peer.rank, tag: hdr.tag, check: hdr.check, content: Content::InSender(parked) });
            drop(m);
            // The progress thread fetches it if no receive comes in time.
            self.wake_progress();
            return;
        };
        drop(m);
        if via_ring {
            lock(&peer.streams_in).push(StreamIn::new(parked.cookie, op, peer.rank, hdr.tag, hdr.check, parked.len));
            events.push(Event::SendCts { cookie: parked.cookie });
            return;
        }
        // The op is ours: taken from the posted queue, and a canceller waits for this
        // connection's lock, which we hold.
        let ok = self.read_into(&op, peer, hdr.tag, hdr.check, &parked);
        op.filling_from.store(u32::MAX, Ordering::Release);
        events.push(Event::SendFin { cookie: parked.cookie, ok });
    }

    /// A chunk of a message `peer` streams to us: into its receive; the last one completes it.
    fn on_chunk(&self, peer: &Peer, cookie: u64, data: &[u8]) {
        let mut streams = lock(&peer.streams_in);
        // Chunks come in the order of our `Cts`s: the stream is nearly always the first.
        let Some(i) = streams.iter().position(|s| s.cookie == cookie) else { return };
        if streams[i].take(data) {
            streams.remove(i).finish(None);
        }
    }

    /// Completes `op` (which nobody else may touch meanwhile) with a single-copy message of
    /// `peer` read from its memory; whether the read worked (the sender's `Fin` says so).
    fn read_into(&self, op: &RecvOp, peer: &Peer, tag: u64, check: u32, parked: &Parked) -> bool {
        let (keep, result) = verdict(op, peer.rank, tag, check, parked.len);
        // SAFETY: keep <= op.buf.len(), and the caller owns the op.
        let r = unsafe { cma::read(peer.cma_pid.unwrap_or(-1), parked.addr, op.buf.as_ptr(), keep) };
        let ok = r.is_ok();
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
            let Some(c) = q.pop_front() else { return };
            self.claimed_n.fetch_sub(1, Ordering::Release);
            if let Some(p) = c.msg.parked() {
                // Nobody else knows the op yet; a canceller waits for `claimed`, which we hold.
                let peer = self.peer(c.msg.src);
                let ok = self.read_into(&c.op, peer, c.msg.tag, c.msg.check, p);
                self.release_sender(peer, p.cookie, ok);
            }
        }
    }

    /// Copies out every message parked longer than [`park_limit`]; returns how long until the
    /// next parked or claimed one is due.
    fn fetch_overdue(&self) -> Option<Duration> {
        let now = Instant::now();
        let mut released = Vec::new();
        let mut m = lock(&self.matcher);
        m.fetch_parked(now - park_limit(), |src, p| {
            let peer = self.peer(src);
            let mut data = Vec::new();
            // The length is the sender's word (capped when it came): room is asked for, not
            // assumed.
            let r = match data.try_reserve_exact(p.len) {
                // SAFETY: reading p.len bytes into reserved capacity, then setting the length.
                Ok(()) => unsafe { cma::read(peer.cma_pid.unwrap_or(-1), p.addr, data.as_mut_ptr(), p.len) },
                Err(e) => Err(io::Error::new(io::ErrorKind::OutOfMemory, format!("no memory for its {} bytes: {e}", p.len))),
            };
            released.push((src, p.cookie, r.is_ok()));
            match r {
                Ok(()) => {
                    unsafe { data.set_len(p.len) };
                    Some(data)
                }
                Err(e) => {
                    dc_log!(Level::Warn, Some(self.rank as usize), "{}", cma_failed(src, e).msg);
                    None
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
    fn release_sender(&self, peer: &Arc<Peer>, cookie: u64, ok: bool) {
        self.reply(peer, Header { check: u32::from(!ok), tag: cookie, ..Header::control(FrameKind::Fin, 0) });
    }

    /// Sends a control frame that needs no order (`Fin`, `Cts`): through the ring when it has
    /// room at once, else the socket.
    fn reply(&self, peer: &Arc<Peer>, hdr: Header) {
        if let Some(out) = peer.ring_out.get() {
            let mut tx = lock(&out.tx);
            if out.seg.try_write(out.index, &[&hdr.encode()], &mut tx.head) {
                drop(tx);
                self.bell_if_needed(peer, out);
                return;
            }
        }
        let _ = self.send_control(peer, hdr);
    }

    // ---- shared-memory rings ---------------------------------------------------------------

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
    fn drain_ring_locked(&self, peer: &Peer, events: &mut Vec<Event>) -> bool {
        let Some(rings) = self.rings_in.get() else { return false };
        let Some(i) = rings.index.get(peer.rank as usize).copied().flatten() else { return false };
        let n = rings.seg.drain(i, |rec| self.on_ring_frame(peer, rec, events));
        // The writer waits for room: ring it back unless one of its threads spins (and so
        // sends on by itself; the ring costs a system call here and a wake-up there).
        if rings.seg.take_waiting(i) && !peer.ring_out.get().is_some_and(|o| o.seg.owner_spins()) {
            events.push(Event::Bell);
        }
        n > 0
    }

    fn on_ring_frame(&self, peer: &Peer, rec: &[u8], events: &mut Vec<Event>) {
        match protocol::decode_record(rec) {
            Ok(Record::Data(h, body)) => self.deliver_or_file(h.ctx, peer.rank, h.tag, h.check, Cow::Borrowed(body)),
            Ok(Record::Rts(h, rts)) => self.on_rts(peer, h, rts, true, events),
            Ok(Record::Chunk { cookie, data }) => self.on_chunk(peer, cookie, data),
            Ok(Record::Cts { cookie }) => events.push(Event::Cts { cookie }),
            Ok(Record::Fin { cookie, ok }) => events.push(Event::Fin { cookie, ok }),
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

    /// Whether world rank `r`, on our host, holds its core (see `RingSegment::owner_on_core`);
    /// false for a peer without rings.
    fn peer_on_core(&self, r: u32) -> bool {
        self.peer_if_known(r).and_then(|p| p.ring_out.get()).is_some_and(|o| o.seg.owner_on_core())
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

    /// Acts on a frame that came over the socket; a data frame's body goes to the sink set here.
    fn on_frame(&self, peer: &Peer, frame: Frame, sink: &mut Sink, events: &mut Vec<Event>) {
        match frame {
            Frame::Abort { ctx, code } => events.push(Event::RemoteAbort(ctx, code)),
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
            Frame::Cts { cookie } => events.push(Event::Cts { cookie }),
            Frame::Data(hdr) => {
                let len = hdr.len as usize;
                let posted = claim_posted(&mut lock(&self.matcher), hdr.ctx, peer.rank, hdr.tag);
                *sink = match posted {
                    Some(op) => {
                        let (keep, result) = verdict(&op, peer.rank, hdr.tag, hdr.check, len);
                        Sink::User { op, keep, result }
                    }
                    None => {
                        if len >= ADOPT_MIN {
                            self.arriving_unexpected.fetch_add(1, Ordering::Relaxed);
                        }
                        // Never more than a staging buffer up front, whatever the header claims.
                        Sink::Unexp { data: Vec::with_capacity(len.min(STAGE_LEN)) }
                    }
                };
                // An empty body (or a receive that takes none of it) is complete already.
                self.settle(peer, sink, BodyAt { hdr, off: 0 });
            }
        }
    }

    fn handle_events(&self, peer: &Arc<Peer>, events: &mut Vec<Event>) {
        for ev in events.drain(..) {
            match ev {
                Event::RemoteAbort(ctx, code) => self.on_remote_abort(ctx, peer.rank, code),
                Event::SendFin { cookie, ok } => self.release_sender(peer, cookie, ok),
                Event::Bell => {
                    let _ = self.send_control(peer, Header::control(FrameKind::Bell, 0));
                }
                Event::Flush => {
                    self.flush_ring(peer);
                }
                Event::SendCts { cookie } => self.reply(peer, Header { tag: cookie, ..Header::control(FrameKind::Cts, 0) }),
                Event::Cts { cookie } => self.start_stream(peer, cookie),
                Event::Fin { cookie, ok } => {
                    if let Some(op) = lock(&peer.awaiting_fin).remove(&cookie) {
                        let r = if ok {
                            Ok(Done { bytes: op.buf.len(), source: op.dst, tag: 0 })
                        } else {
                            Err(Error::new(Status::System, format!("rank {} could not read the message from our memory", peer.rank)))
                        };
                        op.comp.complete(r);
                    }
                }
                Event::Closed => {
                    *lock(&peer.state) = PeerState::Closed;
                    peer.gone.store(true, Ordering::Release);
                    dc_log!(Level::Info, Some(self.rank as usize), "rank {} closed its connection", peer.rank);
                    self.fail_peer_ops(peer);
                }
                Event::Gone(why) => {
                    peer.rx_done.store(true, Ordering::Release);
                    {
                        let mut st = lock(&peer.state);
                        if *st == PeerState::Up {
                            dc_log!(Level::Warn, Some(self.rank as usize), "lost rank {}: {why}", peer.rank);
                            *st = PeerState::Lost(why);
                            peer.gone.store(true, Ordering::Release);
                            self.lost.fetch_add(1, Ordering::Release);
                        }
                    }
                    self.fail_peer_ops(peer);
                }
            }
        }
    }

    /// Fails everything that waits on a peer that is gone.
    fn fail_peer_ops(&self, peer: &Arc<Peer>) {
        let err = || Err(peer.gone_error().unwrap_or_else(|| Error::new(Status::PeerLost, format!("rank {} is gone", peer.rank))));
        {
            let mut rx = lock(&peer.rx);
            if peer.rx_done.load(Ordering::Acquire) {
                rx.dec = Decoder::new();
                if let Sink::User { op, .. } = std::mem::replace(&mut rx.sink, Sink::Idle) {
                    op.filling_from.store(u32::MAX, Ordering::Release);
                    op.comp.complete(err());
                }
            }
        }
        for (_, op) in lock(&peer.awaiting_fin).drain() {
            op.comp.complete(err());
        }
        if peer.rx_done.load(Ordering::Acquire) {
            for mut s in lock(&peer.streams_in).drain(..) {
                s.finish(err().err());
            }
            if let Some(out) = peer.ring_out.get() {
                let mut tx = lock(&out.tx);
                for s in tx.streams.drain(..) {
                    self.backlogged.fetch_sub(1, Ordering::Relaxed);
                    if let Some(op) = s.op {
                        op.comp.complete(err());
                    }
                }
            }
            let mut q = lock(&peer.tx);
            for mut it in q.drain(..) {
                if let Some(op) = it.op.take() {
                    op.comp.complete(err());
                }
            }
            peer.tx_busy.store(false, Ordering::Release);
        }
        let ops = lock(&self.matcher).drain_posted(|op| op.src == Some(peer.rank));
        for op in ops {
            op.comp.complete(err());
        }
    }

    // ---- the progress thread ---------------------------------------------------------------

    fn progress_loop(self: Arc<Self>) {
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        let mut who: Vec<Arc<Peer>> = Vec::new();
        let mut events = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            pfds.clear();
            who.clear();
            pfds.push(libc::pollfd { fd: self.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
            let readers_wait = self.socket_readers.load(Ordering::SeqCst) > 0;
            for p in self.active().iter().filter(|p| p.connected()) {
                let mut ev = 0;
                if !p.rx_done.load(Ordering::Acquire) && !readers_wait {
                    ev |= libc::POLLIN;
                }
                if p.tx_busy.load(Ordering::Acquire) && !readers_wait {
                    ev |= libc::POLLOUT;
                }
                if ev != 0 {
                    pfds.push(libc::pollfd { fd: p.fd(), events: ev, revents: 0 });
                    who.push(p.clone());
                }
            }
            self.copy_claimed(Some(Instant::now() - park_limit()));
            self.flush_all_rings();
            let mut timeout_ms = match self.fetch_overdue() {
                Some(due) => due.as_micros().div_ceil(1000).min(1000) as i32,
                None => 1000,
            };
            if self.rings_in.get().is_some() {
                // Frames for a process that is not waiting ring no doorbell: look every
                // millisecond (so non-blocking operations progress, and a single-copy sender
                // is released, without a wait here).
                let _ = self.poll_rings();
                timeout_ms = timeout_ms.min(1);
            }
            if self.backlogged.load(Ordering::Relaxed) > 0 {
                // The peer rings when it made room; this is only a safety net.
                timeout_ms = timeout_ms.min(1);
            }
            if readers_wait {
                // The last reader to leave wakes us; this is only a safety net.
                timeout_ms = timeout_ms.min(10);
            }
            // SAFETY: pfds is a valid array of pollfd for the call.
            let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
            if n <= 0 {
                continue;
            }
            if pfds[0].revents != 0 {
                let mut v: u64 = 0;
                // SAFETY: reading 8 bytes into a u64 from our eventfd.
                unsafe { libc::read(self.wake.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
            }
            if self.socket_readers.load(Ordering::SeqCst) > 0 {
                // A waiter spins on the sockets now: it reads and writes them.
                continue;
            }
            for (pfd, peer) in pfds[1..].iter().zip(who.iter()) {
                if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && !peer.rx_done.load(Ordering::Acquire) {
                    self.pump_rx(peer, &mut events);
                }
                if pfd.revents & (libc::POLLOUT | libc::POLLERR) != 0 && peer.tx_busy.load(Ordering::Acquire) {
                    if let Some(ev) = self.pump_tx(peer) {
                        events.push(ev);
                    }
                }
                if !events.is_empty() {
                    self.handle_events(peer, &mut events);
                }
            }
        }
    }

    /// Says goodbye to every peer, flushes what is queued, waits briefly for their goodbyes,
    /// and stops the progress thread. Pending sends get until `deadline`.
    pub fn shutdown(&self, deadline: Instant) {
        let handle = lock(&self.thread).take();
        let Some(handle) = handle else { return };
        // Frames still waiting for room in a peer's ring go before our goodbye (which takes
        // the socket and could overtake them).
        while self.backlogged.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            self.flush_all_rings();
            std::thread::sleep(Duration::from_micros(200));
        }
        // No new connections from now on (a peer that connects later finds us gone), so the
        // peers told goodbye are all that have a connection.
        self.stop_door();
        let connected: Vec<Arc<Peer>> = self.active().iter().filter(|p| p.connected()).cloned().collect();
        dc_log!(Level::Info, Some(self.rank as usize), "socket transport: {} connections of {} possible at shutdown", connected.len(), self.size.saturating_sub(1));
        {
            let _order = lock(&self.abort_order);
            for p in connected.iter() {
                // A peer that already said goodbye still reads until it hears ours.
                let _ = self.send_control(p, Header::control(FrameKind::Close, 0));
            }
        }
        let polite = deadline.min(Instant::now() + Duration::from_secs(2));
        let connected = &connected;
        let flushed = |p: &Arc<Peer>| lock(&p.tx).is_empty() || p.rx_done.load(Ordering::Acquire);
        while Instant::now() < deadline && !connected.iter().all(flushed) {
            std::thread::sleep(Duration::from_micros(200));
        }
        let said_bye = |p: &Arc<Peer>| p.gone_error().is_some();
        while Instant::now() < polite && !connected.iter().all(said_bye) {
            std::thread::sleep(Duration::from_micros(500));
        }
        self.stop.store(true, Ordering::Release);
        self.wake_progress();
        let _ = handle.join();
        for p in connected.iter() {
            let Some(stream) = p.stream.get() else { continue };
            let _ = stream.shutdown(std::net::Shutdown::Write);
            let mut sink = [0u8; 4096];
            // Drain what is left so closing sends FIN, not RST.
            // SAFETY: reading into a local buffer.
            while unsafe { libc::recv(p.fd(), sink.as_mut_ptr() as *mut libc::c_void, sink.len(), libc::MSG_DONTWAIT) } > 0 {}
        }
    }
}

/// Whether process `pid` (of our host) has exited: it no longer exists, or it is a zombie
/// that its parent has not reaped yet.
fn process_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // "pid (comm) S ...": the state follows the last parenthesis.
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next());
    matches!(state, Some('Z') | Some('X'))
}

fn cma_failed(rank: u32, e: io::Error) -> Error {
    let status = if e.raw_os_error() == Some(libc::ESRCH) { Status::PeerLost } else { Status::System };
    Error::new(status, format!("copying a message from rank {rank} failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_within_the_host_gets_the_small_send_buffer() {
        if crate::params::get().socket_sndbuf.is_some() {
            return; // forced for every connection: nothing to tell apart
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        assert_eq!(send_buffer_size(&c), Some(NEAR_SNDBUF));
        assert_eq!(send_buffer_size(&a), Some(NEAR_SNDBUF));
        tune(&c).unwrap();
        let got = socket2::SockRef::from(&c).send_buffer_size().unwrap();
        // Linux doubles what it is asked for (bookkeeping); autotuning would start at 16 KiB
        // and end at tcp_wmem's maximum.
        assert!((NEAR_SNDBUF..=2 * NEAR_SNDBUF).contains(&got), "SO_SNDBUF {got}");
    }

    /// Plays rank 0 of 2 at a listener of its own: each accepted connection gets its hello read
    /// and `answers[k]` written back (1 accepted, 2 duplicate); the streams are kept open.
    fn fake_rank0(answers: Vec<u8>) -> (SocketAddr, std::thread::JoinHandle<Vec<TcpStream>>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut kept = Vec::new();
            for ans in answers {
                let (mut s, _) = l.accept().unwrap();
                let mut hello = [0u8; handshake::HELLO_LEN];
                std::io::Read::read_exact(&mut s, &mut hello).unwrap();
                std::io::Write::write_all(&mut s, &[ans]).unwrap();
                kept.push(s);
            }
            kept
        });
        (a, t)
    }

    #[test]
    fn a_peer_that_answers_duplicate_but_never_connects_is_dialled_again() {
        let (fake, t0) = fake_rank0(vec![2, 1]);
        let digest = handshake::token_digest(b"t");
        let cfg = MeshConfig { rank: 1, size: 2, token_digest: digest, job_id: 9, deadline: Instant::now(), cma_pids: vec![None; 2], host_pids: vec![None; 2] };
        let listener = Listener::bind("127.0.0.1".parse().unwrap(), 2).unwrap();
        let addrs = vec![fake, listener.local_addr().unwrap()];
        let t = SocketTransport::start(listener, &addrs, &cfg, Duration::from_secs(30)).unwrap();
        let started = Instant::now();
        t.connect(0).expect("the second dial is accepted");
        let took = started.elapsed();
        assert!(took >= AWAIT_PEER_SLICE && took < AWAIT_PEER_SLICE * 4, "{took:?}");
        assert_eq!(t.connected_peers(), 1);
        let kept = t0.join().unwrap();
        assert_eq!(kept.len(), 2);
        t.shutdown(Instant::now() + Duration::from_millis(200));
    }
}
