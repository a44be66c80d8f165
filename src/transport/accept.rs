//! The data listener's door: accepts the connections other ranks open on demand, for the
//! job's lifetime, on a thread of its own that never waits for anything else (so two ranks that
//! connect to each other at once, from any thread, always get their answers). Every accepted
//! connection is a non-blocking socket polled with the others; it must complete the mutual
//! handshake (its hello, our challenge, its proof of the job token: see `handshake`) within
//! `hello_wait` of being accepted, however it trickles the bytes; nothing is read beyond the
//! handshake's fixed sizes and nothing is allocated from what a stranger sends. Up to
//! [`MAX_PENDING`] connections are in their handshake at once; beyond that, new ones wait in the
//! kernel's backlog until a place is free (a genuine rank is never pushed out: its hello follows
//! its connect at once). Accept errors (descriptor exhaustion, connections
//! aborted in the backlog) are transient.

use super::handshake::{self, Hello, Received, CHALLENGE_LEN, HELLO_LEN};
use super::socket::MeshConfig;
use crate::auth;
use crate::dc_log;
use crate::log::Level;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Connections waiting for their hello, at most.
pub const MAX_PENDING: usize = 1024;

/// Where a connection is in the handshake (see `handshake`).
enum Phase {
    /// Reading its hello.
    Hello,
    /// Our challenge is sent (answering `hello`, with our nonce); reading its proof.
    Proof { hello: Received, nonce: [u8; auth::LEN] },
}

/// The door's side of one connection's handshake, without its socket (sans-IO, so that it can
/// be fuzzed): the shell reads into [`Handshake::space`], never more than the current phase's
/// fixed size, and writes what [`Handshake::advance`] says.
struct Handshake {
    phase: Phase,
    buf: [u8; HELLO_LEN],
    got: usize,
}

/// What the handshake of a connection came to after its bytes of a phase arrived.
enum Verdict {
    /// Send this challenge; its proof comes next.
    Challenge([u8; CHALLENGE_LEN]),
    Admit(Hello, handshake::Session),
    Refuse(String),
}

impl Handshake {
    fn new() -> Handshake {
        Handshake { phase: Phase::Hello, buf: [0; HELLO_LEN], got: 0 }
    }

    /// Bytes the current phase reads.
    fn want(&self) -> usize {
        match self.phase {
            Phase::Hello => HELLO_LEN,
            Phase::Proof { .. } => auth::LEN,
        }
    }

    /// Where the next bytes go: what the current phase still lacks (never empty before
    /// [`Handshake::advance`] is due).
    fn space(&mut self) -> &mut [u8] {
        let want = self.want();
        &mut self.buf[self.got..want]
    }

    /// `n` bytes were put into `space()`; whether the phase has all its bytes.
    fn filled(&mut self, n: usize) -> bool {
        self.got += n;
        self.got == self.want()
    }

    /// Moves on once the phase has all its bytes (see `handshake` for the steps).
    fn advance(&mut self, cfg: &MeshConfig) -> Verdict {
        match &self.phase {
            Phase::Hello => {
                let Some(h) = handshake::decode(&self.buf) else { return Verdict::Refuse("not a distcomm data connection".into()) };
                if h.job_id != cfg.job_id || h.world_size != cfg.size || h.rank >= cfg.size || h.rank == cfg.rank {
                    return Verdict::Refuse(format!("claiming rank {} of {} of job {:#x}", h.rank, h.world_size, h.job_id));
                }
                let Ok((challenge, nonce)) = handshake::challenge(&cfg.token_digest, &h, cfg.rank) else {
                    return Verdict::Refuse("no random numbers for a challenge".into());
                };
                self.phase = Phase::Proof { hello: h, nonce };
                self.got = 0;
                Verdict::Challenge(challenge)
            }
            Phase::Proof { hello, nonce } => {
                if !handshake::check_proof(&cfg.token_digest, hello, cfg.rank, nonce, &self.buf[..auth::LEN]) {
                    return Verdict::Refuse(format!("rank {} gave no valid proof of the job token", hello.rank));
                }
                let session = handshake::Session { job_id: hello.job_id, dialer: hello.rank, acceptor: cfg.rank, dialer_nonce: hello.nonce, acceptor_nonce: *nonce };
                Verdict::Admit(Hello { digest: cfg.token_digest, job_id: hello.job_id, rank: hello.rank, world_size: hello.world_size }, session)
            }
        }
    }
}

/// An accepted connection in its handshake.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    hs: Handshake,
    deadline: Instant,
}

/// What became of a pending connection after a read.
enum Step {
    Wait,
    Drop(&'static str),
    /// The bytes of the current phase are all here.
    Full,
}

impl Pending {
    fn read(&mut self) -> Step {
        loop {
            match self.stream.read(self.hs.space()) {
                Ok(0) => return Step::Drop("closed during the handshake"),
                Ok(n) => {
                    if self.hs.filled(n) {
                        return Step::Full;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Wait,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Drop("read error during the handshake"),
            }
        }
    }

    /// Moves a connection whose phase is complete on, sending our challenge when it is due.
    fn advance(&mut self, cfg: &MeshConfig) -> Verdict {
        match self.hs.advance(cfg) {
            // A fresh connection's send buffer always takes these few bytes.
            Verdict::Challenge(c) if self.stream.write(&c).ok() != Some(CHALLENGE_LEN) => Verdict::Refuse("could not send our challenge".into()),
            v => v,
        }
    }
}

/// Serves `listener` until `stop` is set (whoever sets it shuts the listener down, which wakes
/// the loop): each connection that completes the handshake as another rank of this job is
/// handed to `admit` (blocking again, not yet answered), which answers it
/// (`handshake::accept`, `duplicate` or `refuse`). Everything else is refused or dropped here.
pub fn serve(listener: &TcpListener, cfg: &MeshConfig, hello_wait: Duration, stop: &AtomicBool, admit: &mut dyn FnMut(Hello, handshake::Session, TcpStream)) {
    let me = Some(cfg.rank as usize);
    if let Err(e) = listener.set_nonblocking(true) {
        dc_log!(Level::Warn, me, "data listener: {e}; no connections can be accepted");
        return;
    }
    let mut pending: Vec<Pending> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut warned_accept = false;
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        pending.retain(|p| {
            let keep = p.deadline > now;
            if !keep {
                dc_log!(Level::Warn, me, "dropped a data connection from {}: no handshake within {hello_wait:?}", p.from);
            }
            keep
        });

        // Wait for a newcomer (while there is room), handshake bytes, or the next deadline.
        let wait_ms = pending.iter().map(|p| p.deadline).min().map_or(1000, |d| d.saturating_duration_since(now).as_millis().clamp(1, 1000)) as libc::c_int;
        fds.clear();
        let listen_events = if pending.len() < MAX_PENDING { libc::POLLIN } else { 0 };
        fds.push(libc::pollfd { fd: listener.as_raw_fd(), events: listen_events, revents: 0 });
        fds.extend(pending.iter().map(|p| libc::pollfd { fd: p.stream.as_raw_fd(), events: libc::POLLIN, revents: 0 }));
        // SAFETY: fds is a valid array of pollfd for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait_ms) };
        if n <= 0 || stop.load(Ordering::Acquire) {
            continue;
        }

        // Handshake bytes first (indices shift once the newcomers are pushed).
        let ready: Vec<bool> = fds[1..].iter().map(|f| f.revents != 0).collect();
        let mut i = 0;
        for was_ready in ready {
            if !was_ready {
                i += 1;
                continue;
            }
            match pending[i].read() {
                Step::Wait => i += 1,
                Step::Drop(why) => {
                    let p = pending.remove(i);
                    dc_log!(Level::Warn, me, "dropped a data connection from {}: {why}", p.from);
                }
                Step::Full => match pending[i].advance(cfg) {
                    Verdict::Challenge(_) => i += 1,
                    Verdict::Admit(h, session) => {
                        let p = pending.remove(i);
                        if p.stream.set_nonblocking(false).is_ok() {
                            admit(h, session, p.stream);
                        }
                    }
                    Verdict::Refuse(why) => {
                        let mut p = pending.remove(i);
                        dc_log!(Level::Warn, me, "refused a data connection from {}: {why}", p.from);
                        handshake::refuse(&mut p.stream);
                    }
                },
            }
        }

        // Then newcomers.
        if fds[0].revents == 0 {
            continue;
        }
        while pending.len() < MAX_PENDING {
            match listener.accept() {
                Ok((stream, from)) => {
                    if stream.set_nonblocking(true).is_ok() {
                        pending.push(Pending { stream, from, hs: Handshake::new(), deadline: Instant::now() + hello_wait });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    // EMFILE/ENFILE: free a descriptor; other errors concern one connection.
                    if !warned_accept {
                        dc_log!(Level::Warn, me, "accept on the data listener failed: {e} ({})", super::socket::fd_limits());
                        warned_accept = true;
                    }
                    if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
                        if pending.is_empty() {
                            std::thread::sleep(Duration::from_millis(10));
                        } else {
                            pending.remove(0);
                        }
                    }
                    break;
                }
            }
        }
    }
}

/// The door's handshake without a socket, for the fuzz target and property tests (not an API).
#[doc(hidden)]
pub mod fuzzing {
    use super::{Handshake, MeshConfig, Verdict, CHALLENGE_LEN};
    use crate::transport::handshake::{token_digest, Session};
    use std::time::{Duration, Instant};

    /// What the door did once a phase had all its bytes.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Event {
        /// It answered the hello with this challenge and now reads the proof.
        Challenge([u8; CHALLENGE_LEN]),
        /// It admitted the connection (the rank is the session's dialer).
        Admitted(Session),
        /// It refused the connection, saying why.
        Refused(String),
    }

    /// One connection at the door of rank `me` of a job of `size` ranks.
    pub struct Door {
        hs: Handshake,
        cfg: MeshConfig,
        done: bool,
    }

    impl Door {
        pub fn new(token: &[u8], job_id: u64, me: u32, size: u32) -> Door {
            let n = size as usize;
            let cfg = MeshConfig { rank: me, size, token_digest: token_digest(token), job_id, deadline: Instant::now() + Duration::from_secs(1), cma_peers: vec![None; n], host_pids: vec![None; n], peer_timeout: None, encrypt: false };
            Door { hs: Handshake::new(), cfg, done: false }
        }

        /// Feeds `bytes` as one read of the socket would bring them: takes what the current
        /// phase lacks, at most, and returns how many it took and what it did if the phase
        /// completed. Once admitted or refused the connection has left the door: it takes nothing.
        pub fn feed(&mut self, bytes: &[u8]) -> (usize, Option<Event>) {
            if self.done {
                return (0, None);
            }
            let space = self.hs.space();
            let n = space.len().min(bytes.len());
            space[..n].copy_from_slice(&bytes[..n]);
            if !self.hs.filled(n) {
                return (n, None);
            }
            let event = match self.hs.advance(&self.cfg) {
                Verdict::Challenge(c) => Event::Challenge(c),
                Verdict::Admit(_, session) => Event::Admitted(session),
                Verdict::Refuse(why) => Event::Refused(why),
            };
            self.done = !matches!(event, Event::Challenge(_));
            (n, Some(event))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::handshake::{token_digest, Hello};
    use std::io::Write;
    use std::sync::Arc;

    fn cfg(rank: u32, size: u32) -> MeshConfig {
        MeshConfig { rank, size, token_digest: token_digest(b"t"), job_id: 9, deadline: Instant::now() + Duration::from_secs(10), cma_peers: vec![None; size as usize], host_pids: vec![None; size as usize], peer_timeout: None, encrypt: false }
    }

    fn hello(rank: u32, size: u32) -> [u8; HELLO_LEN] {
        Hello { digest: token_digest(b"t"), job_id: 9, rank, world_size: size }.encode(&[4; 32])
    }

    /// Serves `l` as rank 0 of 3 on a thread; admitted ranks are accepted and sent back.
    fn door(l: TcpListener, wait: Duration) -> (Arc<AtomicBool>, std::sync::mpsc::Receiver<(u32, TcpStream)>, std::thread::JoinHandle<()>, i32) {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let fd = l.as_raw_fd();
        let s2 = stop.clone();
        let t = std::thread::spawn(move || {
            serve(&l, &cfg(0, 3), wait, &s2, &mut |h, _, mut s| {
                handshake::accept(&mut s).unwrap();
                tx.send((h.rank, s)).unwrap();
            })
        });
        (stop, rx, t, fd)
    }

    #[test]
    fn strangers_are_dropped_and_ranks_get_in() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let mut strangers = Vec::new();
        for bytes in [&[][..], &[0u8; 100][..], &hello(1, 3)[..10]] {
            let mut s = TcpStream::connect(a).unwrap();
            s.write_all(bytes).unwrap();
            strangers.push(s);
        }
        // A well-formed hello, then a proof made without the token.
        let mut wrong = TcpStream::connect(a).unwrap();
        wrong.write_all(&hello(1, 3)).unwrap();
        let mut liar = TcpStream::connect(a).unwrap();
        liar.write_all(&hello(0, 3)).unwrap();
        // A slow sender: one byte now, the rest never.
        let mut slow = TcpStream::connect(a).unwrap();
        slow.write_all(&hello(2, 3)[..1]).unwrap();
        let (stop, admitted, t, fd) = door(l, Duration::from_millis(300));
        let t0 = Instant::now();
        let offer = |r: u32| {
            let mut s = TcpStream::connect(a).unwrap();
            handshake::offer(&mut s, &Hello { digest: token_digest(b"t"), job_id: 9, rank: r, world_size: 3 }, 0, Duration::from_secs(5)).map(|(ans, _)| (ans, s))
        };
        let k1 = offer(1).unwrap();
        let k2 = offer(2).unwrap();
        assert_eq!((k1.0, k2.0), (handshake::Answer::Accepted, handshake::Answer::Accepted));
        let mut got: Vec<u32> = (0..2).map(|_| admitted.recv_timeout(Duration::from_secs(5)).unwrap().0).collect();
        got.sort();
        assert_eq!(got, [1, 2]);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        let mut b = [9u8; 1];
        wrong.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut challenge = [0u8; CHALLENGE_LEN];
        wrong.read_exact(&mut challenge).unwrap();
        wrong.write_all(&[0xEE; 32]).unwrap();
        assert_eq!(wrong.read(&mut b).unwrap(), 1);
        assert_eq!(b[0], 0, "a wrong proof is refused");
        liar.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        assert_eq!(liar.read(&mut b).unwrap(), 1);
        assert_eq!(b[0], 0, "our own rank is refused");
        stop.store(true, Ordering::Release);
        // SAFETY: shutting down the listener the serving thread polls wakes it.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        t.join().unwrap();
        drop((k1, k2, strangers, slow));
    }

    #[test]
    fn many_ranks_connecting_at_once_all_get_in() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let fd = l.as_raw_fd();
        let s2 = stop.clone();
        let n = 300u32;
        let t = std::thread::spawn(move || {
            let mut count = 0;
            let mut keep = Vec::new();
            serve(&l, &cfg(0, n + 1), Duration::from_secs(5), &s2, &mut |_, _, mut s| {
                handshake::accept(&mut s).unwrap();
                keep.push(s);
                count += 1;
            });
            count
        });
        let clients: Vec<_> = (1..=n)
            .map(|r| {
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(a).unwrap();
                    let h = Hello { digest: token_digest(b"t"), job_id: 9, rank: r, world_size: n + 1 };
                    handshake::offer(&mut s, &h, 0, Duration::from_secs(20)).map(|_| s)
                })
            })
            .collect();
        let streams: Vec<_> = clients.into_iter().map(|c| c.join().unwrap().unwrap()).collect();
        stop.store(true, Ordering::Release);
        // SAFETY: shutting down the listener the serving thread polls wakes it.
        unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        assert_eq!(t.join().unwrap(), n);
        drop(streams);
    }
}
