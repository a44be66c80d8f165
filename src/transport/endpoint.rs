//! The endpoint of a world (`SocketTransport`, also named `Endpoint`): the peers and their
//! state (up, closed, lost), the contexts that aborts reach, the progress thread and shutdown.
//! Its other parts live beside it: posting, matching and single-copy messages (`messages`),
//! abort (`abort`), and the wires a peer's frames travel: a TCP connection made on demand
//! (`tcp`: dialling and the door; `tcp_io`: framed reads and writes, decoded by `protocol`)
//! and, between ranks of one host, shared-memory rings (`ring_wire`), with large messages
//! announced (`Rts`) and streamed through the ring once their receive is posted (`stream`),
//! or, with no rings, read single-copy from the sender's memory (`cma`); one whose receive does
//! not come stays in the sender's memory until it does, for at most [`park_limit`], and is
//! then copied out single-copy.
//!
//! A background progress thread reads every connection and writes what callers could not
//! write at once. A thread waiting on an op (no rings, ranks not outnumbering cores) reads and
//! writes the connections itself while it spins, and the progress thread stands aside
//! meanwhile.
//!
//! Lock order: a connection's `rx` may be held while taking `matcher` or the peer's
//! `streams_in`; `claimed` may be held while taking `matcher` or a connection's `tx`; nothing
//! else nests.

use super::messages::{Claimed, park_limit};
use super::ring_wire::{RingOut, RingsIn};
use super::tcp::{Dial, Listener, MeshConfig, raise_fd_limit, system_error};
use super::tcp_io::{Rx, Sink, TxItem};
use super::wire::WIRES;
use super::frame::{FrameKind, Header};
use super::matching::Matcher;
use super::protocol::Decoder;
use super::stream::StreamIn;
use super::ops::{CtxState, SendOp};
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Reason code of an abort frame (its `check` word): the sender found a collective mismatch.
pub const ABORT_MISMATCH: u32 = 1;
/// Abort reason: a panic in the library on the aborting rank.
pub const ABORT_PANIC: u32 = 2;

/// How often a wait looks at the process of a peer on our host it has no connection to.
pub(super) const ALIVE_CHECK_EVERY: Duration = Duration::from_millis(100);

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum PeerState {
    Up,
    /// The peer said goodbye (destroyed its communicator).
    Closed,
    Lost(String),
}

pub(super) struct Peer {
    pub(super) rank: u32,
    /// The connection, once one was made (by either side).
    pub(super) stream: OnceLock<TcpStream>,
    /// Connecting to the peer; the condvar tells waiting threads that the connection is up or
    /// the attempt ended.
    pub(super) dial: Mutex<Dial>,
    pub(super) dialled: Condvar,
    pub(super) rx: Mutex<Rx>,
    pub(super) tx: Mutex<VecDeque<TxItem>>,
    /// Outgoing bytes are queued: the progress thread watches for writability.
    pub(super) tx_busy: AtomicBool,
    /// Nothing more will be read (EOF or error).
    pub(super) rx_done: AtomicBool,
    pub(super) state: Mutex<PeerState>,
    /// `state` is no longer `Up` (read without its lock on every send and receive).
    pub(super) gone: AtomicBool,
    /// When `check_alive` last looked at the peer's process (ms since the transport started).
    pub(super) alive_checked_ms: AtomicU64,
    /// When something last came over the connection (ms since the transport started; see
    /// `heartbeat`).
    pub(super) last_heard_ms: AtomicU64,
    /// Same host: since when its process has been seen stopped (0: it was not).
    pub(super) stopped_since_ms: AtomicU64,
    /// Another host, no connection: since when waits have wanted it (0: none did), and whether
    /// a dial to watch it is under way.
    pub(super) unheard_since_ms: AtomicU64,
    pub(super) probing: AtomicBool,
    /// The peer's pid when it lets us read its memory (same host), for single-copy messages.
    pub(super) cma: Option<super::cma::Remote>,
    /// Our single-copy sends to this peer, waiting for its `Fin`, by cookie.
    pub(super) awaiting_fin: Mutex<HashMap<u64, Arc<SendOp>>>,
    /// Same host: our ring in the peer's segment. Once set (during init, before any message),
    /// every data and single-copy frame to this peer goes through it, keeping them in order.
    pub(super) ring_out: OnceLock<RingOut>,
    /// Messages the peer streams to us through our ring (see `stream`), in the order of their
    /// `Cts`. A chunk is copied under this lock, so a canceller waits for it.
    pub(super) streams_in: Mutex<Vec<StreamIn>>,
    /// Set with the connection when it is encrypted (another host, `DC_ENCRYPT`): every byte
    /// written and read goes through it (see `seal`).
    pub(super) sealed: OnceLock<Sealed>,
    /// Flow control (see `flow`): our messages offered to the peer, by cookie; the eager
    /// credit it gave us; the credit we owe it; our threads waiting for a send to it.
    pub(super) offers_out: Mutex<HashMap<u64, super::flow::OfferOut>>,
    pub(super) credit: std::sync::atomic::AtomicI64,
    pub(super) credit_due: AtomicUsize,
    pub(super) blocked_sending: AtomicUsize,
}

/// An encrypted connection's halves: the sealer with the record sealed and not yet written
/// (taken with the `tx` lock held), the opener with the ciphertext read and not yet opened
/// (taken with the `rx` lock held).
pub(super) struct Sealed {
    pub(super) out: Mutex<SealOut>,
    pub(super) inp: Mutex<SealIn>,
}

pub(super) struct SealOut {
    pub(super) sealer: super::seal::Sealer,
    pub(super) buf: Vec<u8>,
    pub(super) off: usize,
}

pub(super) struct SealIn {
    pub(super) opener: super::seal::Opener,
    /// Ciphertext read; records before `at` are opened and consumed.
    pub(super) buf: Vec<u8>,
    pub(super) at: usize,
}

impl Sealed {
    pub(super) fn new((sealer, opener): (super::seal::Sealer, super::seal::Opener)) -> Sealed {
        let cap = super::seal::RECORD_MAX + super::seal::OVERHEAD;
        Sealed {
            out: Mutex::new(SealOut { sealer, buf: Vec::with_capacity(cap), off: 0 }),
            inp: Mutex::new(SealIn { opener, buf: Vec::with_capacity(super::tcp_io::SEALED_READ_AHEAD + cap), at: 0 }),
        }
    }
}

impl Peer {
    pub(super) fn new(rank: u32, cma: Option<super::cma::Remote>) -> Peer {
        Peer {
            rank,
            stream: OnceLock::new(),
            dial: Mutex::new(Dial::Idle),
            dialled: Condvar::new(),
            // The staging buffer comes with the connection (see `attach_stream`).
            rx: Mutex::new(Rx { stage: Box::default(), start: 0, end: 0, dec: Decoder::new(), sink: Sink::Idle, header_first: false }),
            tx: Mutex::new(VecDeque::new()),
            tx_busy: AtomicBool::new(false),
            rx_done: AtomicBool::new(false),
            state: Mutex::new(PeerState::Up),
            gone: AtomicBool::new(false),
            alive_checked_ms: AtomicU64::new(0),
            last_heard_ms: AtomicU64::new(0),
            stopped_since_ms: AtomicU64::new(0),
            unheard_since_ms: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            cma,
            awaiting_fin: Mutex::new(HashMap::new()),
            ring_out: OnceLock::new(),
            streams_in: Mutex::new(Vec::new()),
            sealed: OnceLock::new(),
            offers_out: Mutex::new(HashMap::new()),
            credit: std::sync::atomic::AtomicI64::new(super::flow::max_unexpected_bytes() as i64),
            credit_due: AtomicUsize::new(0),
            blocked_sending: AtomicUsize::new(0),
        }
    }

    /// The connection's descriptor (-1 before there is one: only peers with a connection are
    /// read, written or polled).
    pub(super) fn fd(&self) -> RawFd {
        self.stream.get().map_or(-1, |s| s.as_raw_fd())
    }

    pub(super) fn connected(&self) -> bool {
        self.stream.get().is_some()
    }

    #[inline]
    pub(super) fn gone_error(&self) -> Option<Error> {
        if !self.gone.load(Ordering::Acquire) {
            return None;
        }
        self.why_gone()
    }

    #[cold]
    pub(super) fn why_gone(&self) -> Option<Error> {
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
pub(super) enum Event {
    /// A peer aborted a context (marked already, see `note_remote_abort`): fail its operations.
    RemoteAbort,
    Closed,
    Gone(String),
    /// Tell the peer we are done reading its single-copy message.
    SendFin { cookie: u64, ok: bool },
    /// The peer is done reading our single-copy message.
    Fin { cookie: u64, ok: bool },
    /// The peer withdraws its single-copy message `cookie` (see `messages::on_withdraw`).
    Withdraw { cookie: u64 },
    /// Tell the peer to look at our rings (its ring to us has room again).
    Bell,
    /// Send what waits for room in our ring to the peer.
    Flush,
    /// Ask the peer to stream (or, over a connection, send) its message `cookie` to us.
    SendCts { cookie: u64 },
    /// The peer asks us to stream our message `cookie`.
    Cts { cookie: u64 },
    /// The peer lost world rank `rank` (see `heartbeat::LossKind`).
    LostElsewhere { rank: u64, how: u32 },
    /// The peer gives back eager credit (see `flow`).
    Credit { bytes: u64 },
    /// The peer asks for (the first `want` bytes of) our offered message `cookie`.
    Ask { cookie: u64, want: u64 },
    /// Ask the peer for its offered message `cookie` (see `flow`).
    AskFor { cookie: u64, want: u64 },
}

/// The endpoint of one world: peers (each reached over a TCP connection made on demand, and
/// shared-memory rings when on our host), matching, abort, peer state and the progress thread.
pub struct SocketTransport {
    pub(super) rank: u32,
    pub(super) size: u32,
    /// By world rank (ours stays empty): made on first use, connected on demand.
    pub(super) peers: Vec<OnceLock<Arc<Peer>>>,
    /// The peers with a connection or an outgoing ring, the only ones polled, flushed and told
    /// goodbye (a snapshot is cheap to take; it changes only when one is added).
    pub(super) active: Mutex<Arc<Vec<Arc<Peer>>>>,
    /// Every rank's data address, and who we are and what we present when we connect.
    pub(super) addrs: Vec<SocketAddr>,
    pub(super) mesh: MeshConfig,
    /// How long an on-demand connect may take (the init timeout).
    pub(super) connect_wait: Duration,
    pub(super) started: Instant,
    /// The thread that accepts peers' connections (see `accept`), and how to stop it.
    pub(super) door: Mutex<Option<JoinHandle<()>>>,
    pub(super) listener: Arc<TcpListener>,
    pub(super) door_stop: Arc<AtomicBool>,
    pub(super) matcher: Mutex<Matcher>,
    /// Receives that matched a parked message, for the progress thread to copy (held during
    /// each copy, so a canceller waits for it).
    pub(super) claimed: Mutex<VecDeque<Claimed>>,
    /// Entries in `claimed` (so that waits need not lock it to see that it is empty).
    pub(super) claimed_n: AtomicUsize,
    /// Same host: our incoming rings (set during init).
    pub(super) rings_in: OnceLock<RingsIn>,
    /// Frames waiting in some `RingOut::backlog`.
    pub(super) backlogged: AtomicUsize,
    /// Large messages being read from a socket before any receive matched them (see
    /// `adopt_in_flight`).
    pub(super) arriving_unexpected: AtomicUsize,
    /// Threads of ours inside a wait that read the sockets themselves (see `read_while_waiting`):
    /// meanwhile the progress thread leaves incoming data to them.
    pub(super) socket_readers: AtomicUsize,
    /// The last reader left without waking the progress thread (nothing was pending), which
    /// may not watch the sockets for up to `HANDBACK_LATE_MS` (see `want_progress`).
    pub(super) sockets_unwatched: AtomicBool,
    pub(super) ctxs: Mutex<HashMap<u64, Weak<CtxState>>>,
    /// Contexts a peer aborted before this process created them.
    pub(super) early_aborts: Mutex<HashSet<u64>>,
    /// Held while an abort is marked, failed and announced, and while the goodbyes are queued:
    /// a goodbye never overtakes an abort's frames.
    pub(super) abort_order: Mutex<()>,
    /// Peers lost so far (died or broke their connection without a goodbye).
    pub(super) lost: AtomicUsize,
    pub(super) wake: OwnedFd,
    pub(super) stop: AtomicBool,
    /// Numbers our synchronous sends (see `ops::sync_tag`).
    pub(super) next_sync: AtomicU64,
    /// The matcher holds answers owed to synchronous sends (see `probe::send_acks`).
    pub(super) acks_due: AtomicBool,
    /// Threads between taking answers from the matcher and posting them (see `send_acks`).
    pub(super) acks_sending: std::sync::atomic::AtomicUsize,
    /// Some peer is owed eager credit (see `flow::give_credit`).
    pub(super) credit_owed: AtomicBool,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
    /// How long a peer may be silent (`DC_PEER_TIMEOUT_MS`; see `heartbeat`), and when the
    /// progress thread's next heartbeat turn is due.
    pub(super) peer_timeout: Option<Duration>,
    pub(super) next_beat_ms: AtomicU64,
    /// Buffers for bodies that arrive before their receive (see `spare`).
    pub(super) spare: super::spare::SpareBodies,
    /// How fast large messages announced through our rings came lately, read once or streamed
    /// (see `messages::read_announced`).
    pub(super) ring_reads: Mutex<crate::pick::BySize>,
    /// Where ranks outnumber the cores: how messages go, as blocking exchanges measured (see
    /// `crowded`).
    pub(super) crowded: super::crowded::Crowded,
    /// Ourselves, for threads we start (a background dial).
    pub(super) me: Mutex<Weak<SocketTransport>>,
}

/// How long the progress thread may leave the sockets to readers that have left without waking
/// it (nothing pending then; see `leave_sockets`): what a message for an operation nobody waits
/// for may wait at most before it is read.
const HANDBACK_LATE_MS: i32 = 1;

impl SocketTransport {
    /// Starts the transport: the door that accepts peers' connections (on `listener`, whose
    /// address `addrs[rank]` the rendezvous published) and the progress thread. Nothing is
    /// connected yet: each pair connects when one of them first sends to the other.
    pub fn start(listener: Listener, addrs: &[SocketAddr], cfg: &MeshConfig, connect_wait: Duration) -> Result<Arc<SocketTransport>> {
        let n = cfg.size as usize;
        if addrs.len() != n || cfg.cma_peers.len() != n || cfg.host_pids.len() != n {
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
            sockets_unwatched: AtomicBool::new(false),
            arriving_unexpected: AtomicUsize::new(0),
            ctxs: Mutex::new(HashMap::new()),
            early_aborts: Mutex::new(HashSet::new()),
            abort_order: Mutex::new(()),
            lost: AtomicUsize::new(0),
            // SAFETY: efd is a fresh descriptor owned by nobody else.
            wake: unsafe { OwnedFd::from_raw_fd(efd) },
            stop: AtomicBool::new(false),
            next_sync: AtomicU64::new(0),
            acks_due: AtomicBool::new(false),
            acks_sending: std::sync::atomic::AtomicUsize::new(0),
            credit_owed: AtomicBool::new(false),
            thread: Mutex::new(None),
            peer_timeout: cfg.peer_timeout,
            next_beat_ms: AtomicU64::new(0),
            spare: Default::default(),
            ring_reads: Default::default(),
            crowded: Default::default(),
            me: Mutex::new(Weak::new()),
        });
        *lock(&t.me) = Arc::downgrade(&t);
        t.open_door(listener)?;
        let t2 = t.clone();
        let handle = std::thread::Builder::new()
            .name(format!("dc-progress-r{}", cfg.rank))
            .spawn(move || {
                let t3 = t2.clone();
                if let Err(e) = crate::panics::catch("the progress thread", move || t3.progress_loop()) {
                    t2.progress_failed(e);
                }
            })
            .map_err(|e| Error::system("spawn progress thread", e))?;
        *lock(&t.thread) = Some(handle);
        dc_log!(Level::Info, Some(cfg.rank as usize), "socket transport: {} peers, connected on demand", n.saturating_sub(1));
        Ok(t)
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    pub(super) fn peer(&self, r: u32) -> &Arc<Peer> {
        debug_assert!(r != self.rank, "no peer for ourselves");
        self.peers[r as usize].get_or_init(|| Arc::new(Peer::new(r, self.mesh.cma_peers.get(r as usize).copied().flatten())))
    }

    /// The peer if it was ever used (None: nothing was sent to or received from it yet).
    pub(super) fn peer_if_known(&self, r: u32) -> Option<&Arc<Peer>> {
        self.peers.get(r as usize)?.get()
    }

    /// The peers with a connection or an outgoing ring.
    pub(super) fn active(&self) -> Arc<Vec<Arc<Peer>>> {
        lock(&self.active).clone()
    }

    pub(super) fn activate(&self, peer: &Arc<Peer>) {
        let mut a = lock(&self.active);
        if !a.iter().any(|p| Arc::ptr_eq(p, peer)) {
            let mut v = Vec::with_capacity(a.len() + 1);
            v.extend(a.iter().cloned());
            v.push(peer.clone());
            *a = Arc::new(v);
        }
    }

    pub(super) fn wake_progress(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
    }

    /// The pid of world rank `r` when we may read its memory directly (same host, probed).
    pub fn readable_pid(&self, r: u32) -> Option<i32> {
        if r == self.rank {
            return Some(std::process::id() as i32);
        }
        self.mesh.cma_peers.get(r as usize).copied().flatten().map(|c| c.pid)
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
        let (parked, credit) = lock(&self.matcher).remove_ctx(id);
        // Their messages are dropped with the context, as received ones are.
        for (src, p) in parked {
            self.release_sender(self.peer(src), p.cookie, true);
        }
        for (src, c) in credit {
            self.consumed(self.peer(src), c);
        }
    }

    /// Registered contexts plus contexts with matching state (leak checks, diagnostics).
    pub fn live_contexts(&self) -> usize {
        lock(&self.ctxs).len() + lock(&self.matcher).num_ctxs()
    }

    /// For a wait on world rank `r`: an error if it is gone. A peer we have no connection to
    /// yet (on demand) cannot tell us it died, and one that is stopped or whose host died
    /// tells nothing: see `heartbeat::look_at` (at most every [`ALIVE_CHECK_EVERY`]).
    pub fn check_alive(&self, r: u32) -> Option<Error> {
        if r == self.rank {
            return None;
        }
        let peer = self.peer(r);
        if let Some(e) = peer.gone_error() {
            return Some(e);
        }
        self.look_at(peer);
        peer.gone_error()
    }

    /// A peer we could not reach (its listener is closed) is lost, as one whose connection broke.
    pub(super) fn mark_lost(&self, peer: &Arc<Peer>, why: String) {
        let mut st = lock(&peer.state);
        if *st == PeerState::Up {
            dc_log!(Level::Warn, Some(self.rank as usize), "lost rank {}: {why}", peer.rank);
            *st = PeerState::Lost(why);
            peer.gone.store(true, Ordering::Release);
            self.lost.fetch_add(1, Ordering::Release);
        }
    }

    /// The first of `members` (world ranks) that is lost, as (index in `members`, why), leaving
    /// out the indices in `except`. Peers that said goodbye are not lost. One atomic load while
    /// nobody is lost.
    pub fn lost_among(&self, members: &[u32], except: &[usize]) -> Option<(usize, String)> {
        if self.lost.load(Ordering::Acquire) == 0 {
            return None;
        }
        members.iter().enumerate().filter(|(i, _)| !except.contains(i)).find_map(|(i, &m)| match self.peer_if_known(m).map(|p| lock(&p.state).clone()) {
            Some(PeerState::Lost(why)) => Some((i, why)),
            _ => None,
        })
    }

    pub(super) fn handle_events(&self, peer: &Arc<Peer>, events: &mut Vec<Event>) {
        for ev in events.drain(..) {
            match ev {
                Event::RemoteAbort => self.fail_aborted(),
                Event::SendFin { cookie, ok } => self.release_sender(peer, cookie, ok),
                Event::Bell => {
                    let _ = self.send_control(peer, Header::control(FrameKind::Bell, 0));
                }
                Event::Flush => {
                    self.flush_ring(peer);
                }
                Event::SendCts { cookie } => self.reply(peer, Header { tag: cookie, ..Header::control(FrameKind::Cts, 0) }),
                Event::Cts { cookie } => self.start_stream(peer, cookie),
                Event::Credit { bytes } => self.on_credit(peer, bytes),
                Event::Ask { cookie, want } => self.send_offered(peer, cookie, want),
                Event::AskFor { cookie, want } => self.ask_for(peer.rank, cookie, want),
                Event::LostElsewhere { rank, how } => self.on_lost_elsewhere(peer.rank, rank, how),
                Event::Fin { cookie, ok } => self.on_fin(peer, cookie, ok),
                Event::Withdraw { cookie } => self.on_withdraw(peer, cookie),
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
    pub(super) fn fail_peer_ops(&self, peer: &Arc<Peer>) {
        let gone = || peer.gone_error().unwrap_or_else(|| Error::new(Status::PeerLost, format!("rank {} is gone", peer.rank)));
        // An operation of a context the peer aborted before it went says so (see
        // `note_remote_abort`): the abort is the cause, the goodbye its consequence.
        let err = |ctx: &CtxState| Err(ctx.abort_error().unwrap_or_else(gone));
        for (cookie, op) in lock(&peer.awaiting_fin).drain() {
            // Let go of without its Fin: a peer declared lost may still be reading.
            super::cma::revoke(cookie);
            op.comp.complete(err(&op.ctx));
        }
        if peer.rx_done.load(Ordering::Acquire) {
            // Nothing more will come from it: every wire gives up what it holds.
            for w in WIRES {
                w.fail_all(self, peer, &gone);
            }
        }
        let ops = lock(&self.matcher).drain_posted(|op| op.src == Some(peer.rank));
        for op in ops {
            op.comp.complete(err(&op.ctx));
        }
    }

    /// The progress thread panicked: nothing reads the connections any more. Every context is
    /// aborted with the panic's text (its waiters return at once) and the peers we talk to are
    /// told, instead of everyone waiting out the timeout.
    fn progress_failed(&self, e: Error) {
        let msg = format!("rank {}: {}", self.rank, e.msg);
        dc_log!(Level::Warn, Some(self.rank as usize), "{msg}; every communicator of this process is aborted");
        let ctxs: Vec<Arc<CtxState>> = lock(&self.ctxs).values().filter_map(|w| w.upgrade()).collect();
        let peers: Vec<u32> = self.active().iter().map(|p| p.rank).collect();
        for ctx in ctxs {
            self.abort_ctx(&ctx, &peers, ABORT_PANIC, || {
                ctx.abort(&msg);
            });
        }
    }

    pub(super) fn progress_loop(self: Arc<Self>) {
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        let mut who: Vec<Arc<Peer>> = Vec::new();
        let mut events = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            crate::panics::inject("progress");
            pfds.clear();
            who.clear();
            pfds.push(libc::pollfd { fd: self.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
            let readers_wait = self.socket_readers.load(Ordering::SeqCst) > 0;
            if !readers_wait {
                self.sockets_unwatched.store(false, Ordering::Release);
            }
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
            self.send_acks();
            self.give_credit();
            self.flush_all_rings();
            let mut timeout_ms = match self.fetch_overdue() {
                Some(due) => due.as_micros().div_ceil(1000).min(1000) as i32,
                None => 1000,
            };
            if let Some(next) = self.heartbeat() {
                timeout_ms = timeout_ms.min(next.as_millis().max(1) as i32);
            }
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
                // The last reader to leave wakes us when something needs us at once (see
                // `leave_sockets`); otherwise we take the sockets back when this ends.
                timeout_ms = timeout_ms.min(HANDBACK_LATE_MS);
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

/// The name the architecture gives it (see ARCHITECTURE.md): one per world, over per-peer wires.
pub type Endpoint = SocketTransport;
