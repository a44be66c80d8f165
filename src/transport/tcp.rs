//! TCP connections between ranks, made on demand: the listener whose address the rendezvous
//! publishes, dialling a peer (simultaneous connects resolved by rank), admitting a peer's
//! connection at the door (`accept`), socket tuning and descriptor limits.

use crate::backoff::Jitter;
use super::endpoint::{Peer, SocketTransport, lock};
use super::tcp_io::STAGE_LEN;
use super::handshake::{self, Hello};
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an unauthenticated connection may take to present its hello.
pub(super) const HELLO_WAIT: Duration = Duration::from_secs(5);

/// A bound, listening data socket whose address the rendezvous publishes.
pub struct Listener {
    pub(super) inner: TcpListener,
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
    /// Per rank: where to read its memory if we may (single-copy), from `cma::probe`.
    pub cma_peers: Vec<Option<super::cma::Remote>>,
    /// Per rank: its pid if it runs on our host (whether we may read its memory or not), so
    /// that a wait for a peer we have no connection to notices that its process is gone.
    pub host_pids: Vec<Option<i32>>,
    /// How long a peer may stay silent before it is lost (see `heartbeat`; None: never).
    pub peer_timeout: Option<Duration>,
    /// Encrypt the connections to other hosts (`DC_ENCRYPT=1`; see `seal`).
    pub encrypt: bool,
}

/// Send buffer of a connection whose two ends are on one host (loopback, or the same address
/// at both ends), where the kernel's autotuning lets it grow to `net.ipv4.tcp_wmem`'s maximum
/// (4 MiB here). Megabytes in flight are megabytes the receiver copies after they left the
/// caches; a quarter megabyte (the kernel doubles it) keeps the receiver reading what was
/// just written: 16 MiB allreduce 0.73x, 4 MiB point-to-point 0.59x the time with
/// autotuning. Remote connections keep autotuning: their round trips need the window.
pub(super) const NEAR_SNDBUF: usize = 256 * 1024;

/// The send buffer to ask for on a connection (`DC_SOCKET_SNDBUF` bytes for every connection
/// if set, 0 meaning the kernel's autotuning), None to leave it to the kernel.
pub(super) fn send_buffer_size(stream: &TcpStream) -> Option<usize> {
    static FORCED: once_cell::sync::Lazy<Option<usize>> =
        once_cell::sync::Lazy::new(|| crate::params::get().socket_sndbuf);
    if let Some(n) = *FORCED {
        return (n > 0).then_some(n);
    }
    let (local, peer) = (stream.local_addr().ok()?.ip(), stream.peer_addr().ok()?.ip());
    (peer.is_loopback() || peer == local).then_some(NEAR_SNDBUF)
}

pub(super) fn tune(stream: &TcpStream, peer_timeout: Option<Duration>) -> Result<()> {
    stream.set_nodelay(true).map_err(|e| Error::system("TCP_NODELAY", e))?;
    let s = socket2::SockRef::from(stream);
    let _ = s.set_keepalive(true);
    if let Some(t) = peer_timeout {
        // Sent data unacknowledged that long breaks the connection (a dead host, a cut
        // network); silence without data is the heartbeat's to notice.
        let _ = s.set_tcp_user_timeout(Some(t));
    }
    if let Some(n) = send_buffer_size(stream) {
        let _ = s.set_send_buffer_size(n);
    }
    Ok(())
}

/// For connections without heartbeats (the store's): TCP keepalive probes after half the peer
/// timeout of silence, so that a dead host or a cut network breaks the connection within about
/// the timeout (a stopped process's kernel still answers them), and `TCP_USER_TIMEOUT` for
/// data sent and never acknowledged.
pub fn watch_liveness(stream: &TcpStream) {
    let Some(t) = crate::params::get().peer_timeout() else { return };
    let s = socket2::SockRef::from(stream);
    let idle = (t / 2).max(Duration::from_secs(1));
    let every = (t / 10).max(Duration::from_secs(1));
    let _ = s.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(idle).with_interval(every).with_retries(5));
    let _ = s.set_tcp_user_timeout(Some(t));
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
pub(super) fn system_error(what: String, e: io::Error) -> Error {
    if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
        return Error::new(Status::System, format!("{what}: {e}: out of file descriptors ({})", fd_limits()));
    }
    Error::system(what, e)
}

/// How long one attempt waits for the acceptor's answer to our hello before it hangs up and
/// dials again. A genuine acceptor answers within milliseconds; an attempt can still stall
/// (the connection stuck in a full accept queue, the acceptor's thread starved on a crowded
/// host), and a fresh one gets through where the stalled one would wait out the whole deadline.
pub(super) const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// How long the loser of a simultaneous connect waits for the winner's connection before it
/// dials again (the winner's attempt may have failed: nobody tells the loser).
pub(super) const AWAIT_PEER_SLICE: Duration = Duration::from_secs(2);

/// Opens a connection to rank `peer` at `addr` and presents our hello; the peer's answer says
/// whether the pair keeps it. A refused connection means the peer's listener is closed (it is
/// bound before its address is published): the peer exited or shut its transport down. An
/// attempt that gets no answer within [`ANSWER_WAIT`] is dropped and made again.
pub(super) fn connect_to(addr: SocketAddr, cfg: &MeshConfig, peer: u32, deadline: Instant) -> Result<(handshake::Answer, TcpStream, Option<handshake::Session>)> {
    let mut backoff = Duration::from_millis(1);
    let mut rng = Jitter::new();
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
                    (handshake::Answer::Silent, _) => {
                        stalls += 1;
                        dc_log!(Level::Warn, Some(cfg.rank as usize), "rank {peer} at {addr} did not answer our hello within {:?}; dialling again", left.min(ANSWER_WAIT));
                        false
                    }
                    (ans, session) => return Ok((ans, s, session)),
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
            let pause = backoff + rng.up_to(backoff);
            std::thread::sleep(pause.min(left));
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }
}

/// Whether a connection to a peer is being made (see `SocketTransport::connect_peer`).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Dial {
    /// No connection and nobody making one.
    Idle,
    /// A thread of ours is connecting.
    Connecting,
    /// The peer connected to us at the same time and keeps its connection: it is on its way.
    AwaitingPeer,
}

impl SocketTransport {
    /// Makes `stream` the connection to `peer` (the caller holds its `dial` lock) and lets the
    /// progress thread watch it. `session`: the handshake's, and whether we dialled; a
    /// connection to another host is encrypted with it when the job says so (`DC_ENCRYPT`).
    pub(super) fn attach_stream(&self, peer: &Arc<Peer>, stream: TcpStream, session: Option<(handshake::Session, bool)>) -> Result<()> {
        if self.mesh.encrypt && self.remote(peer.rank) {
            let Some((session, dialled)) = session else {
                return Err(Error::new(Status::Internal, format!("no handshake session for the connection to rank {}", peer.rank)));
            };
            let halves = session.halves(&crate::auth::Key::from_bytes(self.mesh.token_digest), dialled);
            let _ = peer.sealed.set(super::endpoint::Sealed::new(halves));
        }
        tune(&stream, self.mesh.peer_timeout)?;
        stream.set_nonblocking(true).map_err(|e| Error::system("nonblocking", e))?;
        lock(&peer.rx).stage = vec![0u8; STAGE_LEN].into_boxed_slice();
        peer.last_heard_ms.store(self.now_ms(), Ordering::Release);
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
    pub(super) fn admit(&self, from: u32, session: handshake::Session, mut stream: TcpStream) {
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
        if let Err(e) = self.attach_stream(peer, stream, Some((session, false))) {
            dc_log!(Level::Warn, Some(self.rank as usize), "connection from rank {from}: {}", e.msg);
        }
        drop(dial);
    }

    /// Connects to `peer` unless a connection exists (made by either side); the connection is
    /// up when this returns Ok. Other threads wanting the same peer meanwhile wait for this one.
    pub(super) fn connect_peer(&self, peer: &Arc<Peer>, wait: Duration) -> Result<()> {
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
                Ok((handshake::Answer::Accepted, s, session)) => break (self.attach_stream(peer, s, session.map(|x| (x, true))), dial),
                Ok((handshake::Answer::Duplicate, ..)) => {
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
                Ok((handshake::Answer::Silent, ..)) => {
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

    /// Opens the door: a thread that accepts peers' connections on `listener` for the job's
    /// lifetime (see `accept`) and admits them. It holds only a weak reference: the
    /// transport's drop (after `shutdown`) is not kept waiting for it.
    pub(super) fn open_door(self: &Arc<Self>, listener: Arc<TcpListener>) -> Result<()> {
        let weak = Arc::downgrade(self);
        let stop = self.door_stop.clone();
        let mesh = self.mesh.clone();
        let door = std::thread::Builder::new()
            .name(format!("dc-accept-r{}", self.rank))
            .stack_size(256 << 10)
            .spawn(move || {
                super::accept::serve(&listener, &mesh, HELLO_WAIT, &stop, &mut |h, session, s| match weak.upgrade() {
                    Some(t) => {
                        // The door serves every peer: a fault while admitting one must not
                        // close it for the others.
                        let admitted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.admit(h.rank, session, s)));
                        if let Err(p) = admitted {
                            let what = crate::panics::message(&*p);
                            dc_log!(Level::Warn, Some(t.rank as usize), "admitting rank {}'s connection panicked: {what}", h.rank);
                        }
                    }
                    None => drop(s),
                });
            })
            .map_err(|e| Error::system("spawn the data acceptor", e))?;
        *lock(&self.door) = Some(door);
        Ok(())
    }

    /// Stops accepting connections (the door thread ends; the listener closes with us).
    pub(super) fn stop_door(&self) {
        let Some(door) = lock(&self.door).take() else { return };
        self.door_stop.store(true, Ordering::Release);
        // Wakes the door's poll (the descriptor stays ours until the transport is dropped).
        // SAFETY: shutdown on a listening socket we own.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = door.join();
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
        tune(&c, None).unwrap();
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
                let h = handshake::serve_blocking(&mut s, &handshake::token_digest(b"t"), 9, 0, 2).unwrap();
                assert!(h.is_some(), "rank 1 proves the token");
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
        let cfg = MeshConfig { rank: 1, size: 2, token_digest: digest, job_id: 9, deadline: Instant::now(), cma_peers: vec![None; 2], host_pids: vec![None; 2], peer_timeout: None, encrypt: false };
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

    #[test]
    fn aborts_for_unknown_contexts_are_kept_within_a_bound() {
        let cfg = MeshConfig { rank: 0, size: 2, token_digest: handshake::token_digest(b"t"), job_id: 9, deadline: Instant::now(), cma_peers: vec![None; 2], host_pids: vec![None; 2], peer_timeout: None, encrypt: false };
        let listener = Listener::bind("127.0.0.1".parse().unwrap(), 2).unwrap();
        let addrs = vec![listener.local_addr().unwrap(), "127.0.0.1:9".parse().unwrap()];
        let t = SocketTransport::start(listener, &addrs, &cfg, Duration::from_secs(5)).unwrap();
        for id in 0..(super::super::abort::MAX_EARLY_ABORTS as u64 + 100) {
            t.note_remote_abort(1000 + id, 1, 0);
        }
        assert_eq!(t.early_aborts.lock().unwrap().len(), super::super::abort::MAX_EARLY_ABORTS);
        // One that was kept still reaches its context when it is created.
        let ctx = crate::transport::CtxState::new(1000, None);
        t.register_ctx(&ctx);
        assert!(ctx.is_aborted());
        t.shutdown(Instant::now() + Duration::from_millis(100));
    }
}
