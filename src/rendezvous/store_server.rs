//! The TCP store server: one thread, one epoll set, non-blocking sockets.
//!
//! The loop polls the listener, a wake-up pipe (for `Drop`) and every connection. Each connection
//! is a small state machine: `Hello` (a fixed 40-byte buffer, 5 s to fill it however slowly the
//! bytes trickle) -> `Ready` (requests, parsed incrementally by [`Parser`]) -> `Closing` (an
//! answer that ends the connection is flushed, then the socket is closed). A GET of an absent key
//! is parked on that key's waiter list in [`Core`] and answered when the key is SET/ADDed or its
//! wait expires; timers (hello deadlines, GET expiries, stalled writes) sit in one heap whose
//! nearest entry is the poll timeout. Answers that cannot be written at once are queued and
//! finished when the socket is writable; while a connection has more than [`OUT_SOFT`] queued it
//! takes no new requests, and one whose queue makes no progress for [`WRITE_STALL`] is dropped.
//! So a slow or hostile client costs the server a bounded buffer and never stalls the others.

use super::store_core::{answer_head, hello_verdict, Body, Core, Outcome, Parsed, Parser, Waiter};
use super::tcp_store::{challenge, BUSY, HELLO_LEN, MAX_VALUE_LEN, REPLY_MAGIC, R_ERROR, R_NOT_FOUND, R_OK, SERVER_LABEL, VERSION, WELCOME};
use crate::auth::{self, Key};
use super::tcp_store::{BAD_VERSION, REFUSED};
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::{dc_log, err};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an unauthenticated connection may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections that have not finished their hello, at most; more are answered "busy".
const MAX_PENDING_HELLOS: usize = 256;
/// Connections in all, at most.
const MAX_CONNECTIONS: usize = 8192;
/// A GET waits server-side at most this long per request; the client repeats until its deadline.
pub(super) const MAX_WAIT_CHUNK: Duration = Duration::from_secs(30);
/// Bytes read from one connection at a time.
const READ_CHUNK: usize = 64 << 10;
/// Bytes a connection that cannot take requests now (a parked GET, answers backed up) may have
/// read ahead, at most; beyond it the loop stops reading that socket.
const IN_CAP: usize = 64 << 10;
/// A connection with more answer bytes than this queued takes no new requests until they drain.
const OUT_SOFT: usize = 256 << 10;
/// Queued answer bytes beyond which a connection is dropped. With the rule above a connection
/// holds at most `OUT_SOFT` plus one answer, so only a bug reaches this; it is the hard bound.
const OUT_CAP: usize = OUT_SOFT + 9 + MAX_VALUE_LEN;
/// A connection whose queued answers make no progress for this long is dropped (it does not read).
const WRITE_STALL: Duration = Duration::from_secs(60);
/// Reads from one connection per turn of the loop, at most, and requests served: a client that
/// keeps its socket full is served in turns with the others (its rest waits for the next turn).
const READS_PER_TURN: u32 = 4;
const REQUESTS_PER_TURN: u32 = 64;
/// Connections accepted per turn of the loop, at most (then the others get theirs).
const ACCEPT_BATCH: usize = 64;
/// After accept fails (EMFILE and friends), the listener rests this long instead of spinning.
const ACCEPT_PAUSE: Duration = Duration::from_millis(20);

const LISTENER: u64 = u64::MAX;
const WAKE: u64 = u64::MAX - 1;

const EV_IN: u32 = libc::EPOLLIN as u32;
const EV_OUT: u32 = libc::EPOLLOUT as u32;
const EV_BAD: u32 = (libc::EPOLLERR | libc::EPOLLHUP) as u32;

/// What the server handle and the loop thread share.
struct Shared {
    stopping: AtomicBool,
    key: Key,
    num_keys: AtomicUsize,
    open_conns: AtomicUsize,
}

/// A TCP store server. It serves until dropped; `Drop` stops the loop and closes every connection.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    wake_write: RawFd,
    wake_read: RawFd,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer").field("addr", &self.addr).finish()
    }
}

/// Binds a listening socket on exactly `addr` (with `SO_REUSEADDR`, so a restart does not trip over
/// connections in `TIME_WAIT`). The raw `io::Error` is returned so callers can word `AddrInUse`.
pub fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    sock.set_reuse_address(true)?;
    sock.set_cloexec(true)?;
    sock.bind(&addr.into())?;
    // Room for a thousand ranks connecting at once (the kernel caps it at somaxconn).
    sock.listen(4096)?;
    Ok(sock.into())
}

fn epoll_ctl(ep: RawFd, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: ev is a valid epoll_event; ep and fd are descriptors this server owns.
    if unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl StoreServer {
    /// Binds `bind` (port 0: any free port, see [`StoreServer::local_addr`]) and starts serving.
    pub fn start(bind: SocketAddr, token: Vec<u8>) -> Result<StoreServer> {
        let listener = bind_listener(bind).map_err(|e| {
            if e.kind() == io::ErrorKind::AddrInUse {
                err!(Status::System, "store address {bind} is already in use (another job?)")
            } else {
                Error::system(format!("cannot listen on {bind}"), e)
            }
        })?;
        StoreServer::from_listener(listener, token)
    }

    /// Serves on an already bound and listening socket.
    pub fn from_listener(listener: TcpListener, token: Vec<u8>) -> Result<StoreServer> {
        let addr = listener.local_addr().map_err(|e| Error::system("getsockname", e))?;
        listener.set_nonblocking(true).map_err(|e| Error::system("making the store listener non-blocking", e))?;
        // SAFETY: plain syscall; the result is checked and owned below.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(Error::system("epoll_create1", io::Error::last_os_error()));
        }
        // SAFETY: ep is a fresh descriptor that nothing else owns.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: fds has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(Error::system("pipe2", io::Error::last_os_error()));
        }
        let close_pipe = || {
            // SAFETY: both descriptors came from pipe2 above and are closed once, on this path only.
            unsafe {
                libc::close(fds[0]);
                libc::close(fds[1]);
            }
        };
        let registered = epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, listener.as_raw_fd(), EV_IN, LISTENER)
            .and_then(|_| epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fds[0], EV_IN, WAKE));
        if let Err(e) = registered {
            close_pipe();
            return Err(Error::system("epoll_ctl", e));
        }
        let shared = Arc::new(Shared {
            stopping: AtomicBool::new(false),
            key: Key::from_token(&token),
            num_keys: AtomicUsize::new(0),
            open_conns: AtomicUsize::new(0),
        });
        let ev = EventLoop::new(listener, ep, fds[0], shared.clone());
        let thread = std::thread::Builder::new()
            .name("dc-store".into())
            .spawn(move || {
                // A panic ends the loop: its connections close with it, so every client's
                // request fails at once (instead of waiting for a store that is gone).
                if let Err(e) = crate::panics::catch("the rendezvous store's event loop", move || ev.run()) {
                    crate::dc_log!(crate::log::Level::Warn, None, "{}; the store is closed", e.msg);
                }
            })
            .map_err(|e| Error::system("spawning the store thread", e));
        let thread = match thread {
            Ok(h) => h,
            Err(e) => {
                close_pipe();
                return Err(e);
            }
        };
        dc_log!(Level::Info, None, "store server listening on {addr}");
        Ok(StoreServer { addr, shared, wake_write: fds[1], wake_read: fds[0], thread: Some(thread) })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether clients presenting `token` are let in.
    pub fn accepts_token(&self, token: &[u8]) -> bool {
        Key::from_token(token).same_as(&self.shared.key)
    }

    /// Waits until no client but one (this process's own) is connected, at most `max`.
    pub fn linger_while_clients(&self, max: Duration) {
        let end = Instant::now() + max;
        while self.shared.open_conns.load(Ordering::SeqCst) > 1 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Number of keys held (for tests and diagnostics).
    pub fn num_keys(&self) -> usize {
        self.shared.num_keys.load(Ordering::SeqCst)
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // SAFETY: writing one byte from a valid buffer to our own pipe.
        unsafe { libc::write(self.wake_write, [1u8].as_ptr() as *const libc::c_void, 1) };
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
        // SAFETY: the pipe's descriptors are ours and closed exactly once, after the loop thread
        // (the only other user of wake_read) has been joined.
        unsafe {
            libc::close(self.wake_write);
            libc::close(self.wake_read);
        }
        dc_log!(Level::Info, None, "store server on {} stopped", self.addr);
    }
}

// ---------------------------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------------------------

enum Phase {
    /// Our challenge is sent; its nonce, and the hello's bytes so far.
    Hello { nonce: [u8; auth::LEN], buf: [u8; HELLO_LEN], got: usize },
    Ready,
    /// The last answer is queued; close once it is written.
    Closing,
}

struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    phase: Phase,
    parser: Parser,
    /// Bytes read but not parsed yet (while the connection could not take requests).
    stash: Vec<u8>,
    /// The peer sent EOF.
    read_closed: bool,
    /// The GET parked server-side: its key and park number.
    parked: Option<(Vec<u8>, u64)>,
    parks: u64,
    out: VecDeque<Body>,
    /// Bytes of `out.front()` already written.
    out_pos: usize,
    /// Bytes queued and not yet written.
    out_len: usize,
    /// When the queue last made progress (or last became non-empty).
    out_since: Instant,
    stall_armed: bool,
    /// Queued more than OUT_CAP: to be dropped.
    overflow: bool,
    /// Events registered with epoll.
    interest: u32,
}

impl Conn {
    /// Whether requests may be parsed and served now.
    fn serving(&self) -> bool {
        matches!(self.phase, Phase::Ready) && self.parked.is_none() && self.out_len < OUT_SOFT && !self.overflow
    }

    fn queue(&mut self, body: Body) {
        let n = body.bytes().len();
        if n == 0 {
            return;
        }
        if self.out_len == 0 {
            self.out_since = Instant::now();
        }
        self.out_len += n;
        if self.out_len > OUT_CAP {
            self.overflow = true;
        }
        self.out.push_back(body);
    }

    fn answer(&mut self, code: u8, body: Body) {
        let head = answer_head(code, body.bytes().len());
        match body {
            Body::Shared(v) if v.len() > 4096 => {
                self.queue(Body::Owned(head.to_vec()));
                self.queue(Body::Shared(v));
            }
            b => {
                let mut m = Vec::with_capacity(9 + b.bytes().len());
                m.extend_from_slice(&head);
                m.extend_from_slice(b.bytes());
                self.queue(Body::Owned(m));
            }
        }
    }

    /// Writes what the socket takes now.
    fn flush(&mut self) -> io::Result<()> {
        while let Some(front) = self.out.front() {
            let b = &front.bytes()[self.out_pos..];
            match self.stream.write(b) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.out_pos += n;
                    self.out_len -= n;
                    self.out_since = Instant::now();
                    if n == b.len() {
                        self.out.pop_front();
                        self.out_pos = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn wanted(&self) -> u32 {
        let out = if self.out_len > 0 { EV_OUT } else { 0 };
        let read = match self.phase {
            Phase::Hello { .. } => true,
            Phase::Closing => false,
            Phase::Ready => {
                !self.read_closed
                    && ((self.serving() && self.stash.is_empty()) || (self.parked.is_some() && self.stash.len() < IN_CAP))
            }
        };
        out | if read { EV_IN } else { 0 }
    }
}

/// A timer in the loop's heap. Stale ones (their connection gone or moved on) fire harmlessly.
#[derive(PartialEq, Eq, PartialOrd, Ord, Clone, Copy, Debug)]
enum Timer {
    Hello,
    /// The parked GET with this park number expires.
    Wait(u64),
    Stall,
}

enum Step {
    /// Progress made: go round again.
    More,
    /// Nothing more until the socket is ready (or the connection is woken).
    Blocked,
    Close,
}

struct EventLoop {
    listener: TcpListener,
    ep: OwnedFd,
    wake: RawFd,
    shared: Arc<Shared>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    pending_hellos: usize,
    core: Core,
    timers: BinaryHeap<Reverse<(Instant, u64, Timer)>>,
    /// Connections to drive (they have events, or a wake-up queued an answer for them).
    ready: Vec<u64>,
    accept_paused_until: Option<Instant>,
    scratch: Vec<u8>,
    /// Reads and requests left to the connection being driven in this turn.
    reads_left: u32,
    requests_left: u32,
    /// Connections whose turn ended with work left: driven again after the next poll.
    deferred: Vec<u64>,
}

impl EventLoop {
    fn new(listener: TcpListener, ep: OwnedFd, wake: RawFd, shared: Arc<Shared>) -> EventLoop {
        EventLoop {
            listener,
            ep,
            wake,
            shared,
            conns: HashMap::new(),
            next_id: 0,
            pending_hellos: 0,
            core: Core::default(),
            timers: BinaryHeap::new(),
            ready: Vec::new(),
            accept_paused_until: None,
            scratch: vec![0; READ_CHUNK],
            reads_left: 0,
            requests_left: 0,
            deferred: Vec::new(),
        }
    }

    fn run(mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
        loop {
            while let Some(id) = self.ready.pop() {
                self.service(id);
            }
            let timeout = self.poll_timeout();
            let timeout = if self.deferred.is_empty() { timeout } else { 0 };
            // SAFETY: events has room for events.len() entries; ep is our epoll descriptor.
            let n = unsafe { libc::epoll_wait(self.ep.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, timeout) };
            if self.shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                dc_log!(Level::Warn, None, "store server: epoll_wait failed: {e}; stopping");
                break;
            }
            for ev in &events[..n as usize] {
                let (bits, token) = (ev.events, ev.u64);
                match token {
                    LISTENER => self.accept(),
                    WAKE => {
                        let mut b = [0u8; 64];
                        // SAFETY: reading into a valid buffer from our own non-blocking pipe.
                        while unsafe { libc::read(self.wake, b.as_mut_ptr() as *mut libc::c_void, b.len()) } > 0 {}
                    }
                    id if bits & EV_BAD != 0 && bits & EV_IN == 0 => {
                        // Reset or both ways shut: nobody will read our answers.
                        if let Some(c) = self.conns.remove(&id) {
                            self.close(id, c);
                        }
                    }
                    id => self.ready.push(id),
                }
            }
            self.ready.append(&mut self.deferred);
            self.fire_timers(Instant::now());
        }
        // Closing the sockets tells every client (and every parked GET) the store is gone.
        self.conns.clear();
        self.shared.open_conns.store(0, Ordering::SeqCst);
    }

    fn poll_timeout(&mut self) -> i32 {
        let now = Instant::now();
        if let Some(t) = self.accept_paused_until {
            if t <= now {
                self.accept_paused_until = None;
                let _ = epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_MOD, self.listener.as_raw_fd(), EV_IN, LISTENER);
                // Connections may be waiting: look at the listener again at once.
                return 0;
            }
        }
        let next = self.timers.peek().map(|Reverse((t, _, _))| *t).into_iter().chain(self.accept_paused_until).min();
        match next {
            None => -1,
            Some(t) if t <= now => 0,
            Some(t) => (t - now).as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
        }
    }

    fn accept(&mut self) {
        for _ in 0..ACCEPT_BATCH {
            match self.listener.accept() {
                Ok((s, peer)) => self.admit(s, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // EMFILE and friends: rest the listener a little instead of spinning.
                    dc_log!(Level::Warn, None, "store server: accept failed: {e}");
                    let _ = epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_MOD, self.listener.as_raw_fd(), 0, LISTENER);
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut s: TcpStream, peer: SocketAddr) {
        if s.set_nonblocking(true).is_err() {
            return;
        }
        if self.conns.len() >= MAX_CONNECTIONS || self.pending_hellos >= MAX_PENDING_HELLOS {
            dc_log!(Level::Info, None, "store server: too many connections; turning away {peer} (busy)");
            let mut reply = [0u8; 5];
            reply[..4].copy_from_slice(&REPLY_MAGIC);
            reply[4] = BUSY;
            let _ = s.write(&reply);
            return;
        }
        let _ = s.set_nodelay(true);
        crate::transport::socket::watch_liveness(&s);
        // Our challenge first: 40 bytes always fit a fresh connection's send buffer.
        let Ok(nonce) = auth::nonce() else {
            dc_log!(Level::Warn, None, "store server: no random numbers for a challenge; turning away {peer}");
            return;
        };
        if s.write(&challenge(&nonce)).ok() != Some(super::tcp_store::CHALLENGE_LEN) {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_ADD, s.as_raw_fd(), EV_IN, id) {
            dc_log!(Level::Warn, None, "store server: cannot watch the connection from {peer}: {e}");
            return;
        }
        let now = Instant::now();
        self.conns.insert(
            id,
            Conn {
                stream: s,
                peer,
                phase: Phase::Hello { nonce, buf: [0; HELLO_LEN], got: 0 },
                parser: Parser::default(),
                stash: Vec::new(),
                read_closed: false,
                parked: None,
                parks: 0,
                out: VecDeque::new(),
                out_pos: 0,
                out_len: 0,
                out_since: now,
                stall_armed: false,
                overflow: false,
                interest: EV_IN,
            },
        );
        self.pending_hellos += 1;
        self.shared.open_conns.store(self.conns.len(), Ordering::SeqCst);
        self.timers.push(Reverse((now + HELLO_TIMEOUT, id, Timer::Hello)));
    }

    fn close(&mut self, id: u64, c: Conn) {
        if let Some((key, seq)) = &c.parked {
            self.core.unpark(key, (id, *seq));
        }
        if matches!(c.phase, Phase::Hello { .. }) {
            self.pending_hellos -= 1;
        }
        let _ = epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_DEL, c.stream.as_raw_fd(), 0, id);
        self.shared.open_conns.store(self.conns.len(), Ordering::SeqCst);
        // Dropping `c` closes the socket.
    }

    /// Drives one connection as far as it goes now, then registers what it waits for.
    fn service(&mut self, id: u64) {
        let Some(mut c) = self.conns.remove(&id) else { return };
        self.reads_left = READS_PER_TURN;
        self.requests_left = REQUESTS_PER_TURN;
        let keep = self.drive(id, &mut c);
        if !keep {
            self.close(id, c);
            return;
        }
        let want = c.wanted();
        if want != c.interest {
            if epoll_ctl(self.ep.as_raw_fd(), libc::EPOLL_CTL_MOD, c.stream.as_raw_fd(), want, id).is_err() {
                self.close(id, c);
                return;
            }
            c.interest = want;
        }
        if c.out_len > 0 && !c.stall_armed {
            c.stall_armed = true;
            self.timers.push(Reverse((c.out_since + WRITE_STALL, id, Timer::Stall)));
        }
        self.conns.insert(id, c);
    }

    /// Reads, parses, serves and writes until the connection blocks; false: close it.
    fn drive(&mut self, id: u64, c: &mut Conn) -> bool {
        loop {
            if c.overflow {
                dc_log!(Level::Warn, None, "store server: {} does not read its answers; dropped", c.peer);
                return false;
            }
            if let Err(e) = c.flush() {
                dc_log!(Level::Trace, None, "store server: connection from {} ended: {e}", c.peer);
                return false;
            }
            let step = match c.phase {
                Phase::Closing => return c.out_len > 0,
                Phase::Hello { .. } => self.read_hello(c),
                Phase::Ready => self.step_ready(id, c),
            };
            match step {
                Step::More => {}
                Step::Blocked => return true,
                Step::Close => return false,
            }
        }
    }

    fn read_hello(&mut self, c: &mut Conn) -> Step {
        let Phase::Hello { nonce, buf, got } = &mut c.phase else { return Step::More };
        // Only the hello's own bytes are read; what follows stays in the socket for `Ready`.
        match c.stream.read(&mut buf[*got..]) {
            Ok(0) => {
                dc_log!(Level::Warn, None, "store server: no valid hello from {} (closed early); dropped", c.peer);
                return Step::Close;
            }
            Ok(n) => *got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Blocked,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Step::More,
            Err(e) => {
                dc_log!(Level::Warn, None, "store server: no valid hello from {} ({e}); dropped", c.peer);
                return Step::Close;
            }
        }
        if *got < HELLO_LEN {
            return Step::More;
        }
        let verdict = hello_verdict(buf, &self.shared.key, &nonce[..]);
        self.pending_hellos -= 1;
        let mut reply = REPLY_MAGIC.to_vec();
        reply.push(verdict);
        if verdict == WELCOME {
            // Our proof, over the client's nonce: the client trusts us only after checking it.
            let client_nonce = &buf[8..8 + auth::LEN];
            reply.extend_from_slice(&self.shared.key.prove(SERVER_LABEL, &[client_nonce, &nonce[..]]));
        }
        c.queue(Body::Owned(reply));
        match verdict {
            WELCOME => {
                c.phase = Phase::Ready;
                dc_log!(Level::Trace, None, "store server: client {} authenticated", c.peer);
            }
            BAD_VERSION => {
                c.phase = Phase::Closing;
                dc_log!(Level::Warn, None, "store server: {} is not a distcomm v{VERSION} client; dropped", c.peer);
            }
            _ => {
                debug_assert_eq!(verdict, REFUSED);
                c.phase = Phase::Closing;
                dc_log!(Level::Warn, None, "store server: {} presented a wrong token; refused", c.peer);
            }
        }
        Step::More
    }

    fn step_ready(&mut self, id: u64, c: &mut Conn) -> Step {
        // Requests read ahead earlier come first.
        if c.serving() && !c.stash.is_empty() {
            if self.requests_left == 0 {
                self.deferred.push(id);
                return Step::Blocked;
            }
            let stash = std::mem::take(&mut c.stash);
            let used = self.parse(id, c, &stash);
            c.stash = stash;
            c.stash.drain(..used);
            if c.stash.is_empty() {
                c.stash = Vec::new();
            }
            return Step::More;
        }
        if c.read_closed {
            // No more requests will come. A GET parked for a peer that left is given up.
            if c.parked.is_some() {
                return Step::Close;
            }
            // Unparsed bytes remain only while answers are backed up: wait for them to drain.
            if c.stash.is_empty() {
                c.phase = Phase::Closing;
                return Step::More;
            }
            return Step::Blocked;
        }
        let room = if c.serving() && c.stash.is_empty() {
            READ_CHUNK
        } else if c.parked.is_some() && c.stash.len() < IN_CAP {
            // Read ahead (bounded), so that a peer leaving while it waits is noticed.
            IN_CAP - c.stash.len()
        } else {
            return Step::Blocked;
        };
        if self.reads_left == 0 || self.requests_left == 0 {
            // Its turn is over; the others have theirs first.
            self.deferred.push(id);
            return Step::Blocked;
        }
        self.reads_left -= 1;
        let mut scratch = std::mem::take(&mut self.scratch);
        let step = match c.stream.read(&mut scratch[..room]) {
            Ok(0) => {
                c.read_closed = true;
                Step::More
            }
            Ok(n) => {
                let used = if c.serving() { self.parse(id, c, &scratch[..n]) } else { 0 };
                c.stash.extend_from_slice(&scratch[used..n]);
                Step::More
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Step::Blocked,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Step::More,
            Err(e) => {
                dc_log!(Level::Trace, None, "store server: connection from {} ended: {e}", c.peer);
                Step::Close
            }
        };
        self.scratch = scratch;
        step
    }

    /// Parses and serves requests from `input` while the connection can take them; returns how
    /// many bytes it used.
    fn parse(&mut self, id: u64, c: &mut Conn, input: &[u8]) -> usize {
        let mut used = 0;
        while c.serving() && used < input.len() && self.requests_left > 0 {
            let (n, parsed) = c.parser.feed(&input[used..]);
            used += n;
            if parsed.is_some() {
                self.requests_left -= 1;
            }
            match parsed {
                None => {}
                Some(Parsed::Fatal(why)) => {
                    c.answer(R_ERROR, Body::Owned(why.into_bytes()));
                    c.phase = Phase::Closing;
                }
                Some(Parsed::Request(req)) => self.serve(id, c, req),
            }
        }
        used
    }

    fn serve(&mut self, id: u64, c: &mut Conn, req: super::store_core::Request) {
        let (outcome, woken, value) = self.core.serve(id, req, MAX_WAIT_CHUNK);
        if let Some(v) = value {
            self.shared.num_keys.store(self.core.num_keys(), Ordering::SeqCst);
            for w in woken {
                self.wake(w, &v);
            }
        }
        match outcome {
            Outcome::Answer(code, body) => c.answer(code, body),
            Outcome::Park(key, wait) => {
                c.parks += 1;
                self.core.park(key.clone(), (id, c.parks));
                self.timers.push(Reverse((Instant::now() + wait, id, Timer::Wait(c.parks))));
                c.parked = Some((key, c.parks));
                // A connection has at most three live timers (hello, wait, stall): past this, most
                // of the heap is stale, and compacting costs O(1) per push amortised.
                if self.timers.len() > 1024 + 4 * (self.conns.len() + 1) {
                    self.compact_timers(id, c);
                }
            }
        }
    }

    /// Drops the timers that can no longer fire (GETs answered before their expiry leave theirs in
    /// the heap), so the heap stays proportional to the live connections and waits. `c` is the
    /// connection being served (out of the map meanwhile).
    fn compact_timers(&mut self, id: u64, c: &Conn) {
        let live = |cid: u64, timer: Timer, conns: &HashMap<u64, Conn>| {
            let Some(x) = (if cid == id { Some(c) } else { conns.get(&cid) }) else { return false };
            match timer {
                Timer::Hello => matches!(x.phase, Phase::Hello { .. }),
                Timer::Wait(seq) => x.parked.as_ref().is_some_and(|(_, s)| *s == seq),
                Timer::Stall => x.stall_armed,
            }
        };
        let timers = std::mem::take(&mut self.timers);
        self.timers = timers.into_iter().filter(|Reverse((_, cid, t))| live(*cid, *t, &self.conns)).collect();
    }

    /// Answers a parked GET whose key was just set.
    fn wake(&mut self, (id, seq): Waiter, value: &Arc<Vec<u8>>) {
        let Some(w) = self.conns.get_mut(&id) else { return };
        if w.parked.as_ref().is_some_and(|(_, s)| *s == seq) {
            w.parked = None;
            w.answer(R_OK, Body::Shared(value.clone()));
            self.ready.push(id);
        }
    }

    fn fire_timers(&mut self, now: Instant) {
        while let Some(&Reverse((t, id, timer))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(c) = self.conns.get_mut(&id) else { continue };
            match timer {
                Timer::Hello => {
                    if matches!(c.phase, Phase::Hello { .. }) {
                        dc_log!(Level::Warn, None, "store server: no valid hello from {} within {HELLO_TIMEOUT:?}; dropped", c.peer);
                        let c = self.conns.remove(&id).unwrap();
                        self.close(id, c);
                    }
                }
                Timer::Wait(seq) => {
                    if c.parked.as_ref().is_some_and(|(_, s)| *s == seq) {
                        let (key, _) = c.parked.take().unwrap();
                        c.answer(R_NOT_FOUND, Body::Owned(Vec::new()));
                        self.core.unpark(&key, (id, seq));
                        self.ready.push(id);
                    }
                }
                Timer::Stall => {
                    c.stall_armed = false;
                    if c.out_len == 0 {
                        continue;
                    }
                    if now >= c.out_since + WRITE_STALL {
                        dc_log!(Level::Warn, None, "store server: {} has not read its answers for {WRITE_STALL:?}; dropped", c.peer);
                        let c = self.conns.remove(&id).unwrap();
                        self.close(id, c);
                    } else {
                        c.stall_armed = true;
                        let at = c.out_since + WRITE_STALL;
                        self.timers.push(Reverse((at, id, Timer::Stall)));
                    }
                }
            }
        }
    }
}
