//! The TCP key-value store: a server (hosted by rank 0 or the launcher) and a client.
//!
//! # Wire protocol (all integers little-endian)
//!
//! The client's first bytes are a fixed 40-byte hello:
//! `"DCST"` | version `u16` (= 1) | reserved `u16` (= 0) | SHA-256("distcomm store token v1\0" ‖ token)`.
//! The server reads exactly these 40 bytes (with a 5 s read timeout, never allocating from anything
//! the peer sends), compares the digest in constant time and answers `"DCSR"` | code `u8`
//! (`0` welcome, `1` token refused, `2` unsupported version or not a distcomm client, `3` busy).
//! Anything but `0` is followed by closing the connection.
//!
//! After the hello, requests are `op u8 | key_len u32 | key | ...`:
//! - `1` SET: `value_len u64 | value`
//! - `2` GET: `wait_ms u32` (0: answer at once; else wait server-side until the key exists)
//! - `3` ADD: `delta i64`
//!
//! Answers are `code u8 | len u64 | bytes`: `0` ok (the value; SET answers an empty one, ADD the new
//! integer in decimal ASCII), `1` not found (within the wait), `2` error (a message). Keys are at
//! most [`MAX_KEY_LEN`] bytes, values at most [`MAX_VALUE_LEN`]; an oversized request is answered
//! with an error and the connection is closed. Counters written by ADD are stored as decimal text,
//! so GET on them returns e.g. `b"3"`.

use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::rendezvous::sha256::{ct_eq, Sha256};
use crate::rendezvous::Store;
use crate::{bail, dc_log, err};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = *b"DCST";
const REPLY_MAGIC: [u8; 4] = *b"DCSR";
const VERSION: u16 = 1;
const HELLO_LEN: usize = 40;

const WELCOME: u8 = 0;
const REFUSED: u8 = 1;
const BAD_VERSION: u8 = 2;
const BUSY: u8 = 3;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;

const R_OK: u8 = 0;
const R_NOT_FOUND: u8 = 1;
const R_ERROR: u8 = 2;

/// Longest key the server accepts.
pub const MAX_KEY_LEN: usize = 4096;
/// Largest value the server accepts.
pub const MAX_VALUE_LEN: usize = 64 << 20;

/// How long an unauthenticated connection may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections that have not finished their hello, at most; more are answered "busy".
const MAX_PENDING_HELLOS: usize = 256;
/// Connections in all, at most.
const MAX_CONNECTIONS: usize = 8192;
/// A GET waits server-side at most this long per request; the client repeats until its deadline.
const MAX_WAIT_CHUNK: Duration = Duration::from_secs(30);
/// How long a client waits for an answer beyond the server-side wait before calling the server dead.
const ANSWER_SLACK: Duration = Duration::from_secs(60);

/// The digest of a token that the hello carries.
fn token_digest(token: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"distcomm store token v1\0");
    h.update(token);
    h.finish()
}

/// `host:port`, with brackets for IPv6 literals.
pub fn fmt_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

// ---------------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------------

struct Shared {
    data: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
    stopping: AtomicBool,
    digest: [u8; 32],
    pending_hellos: AtomicUsize,
    conns: Mutex<Conns>,
    /// Longest server-side wait of one GET.
    max_wait: Duration,
}

#[derive(Default)]
struct Conns {
    next_id: u64,
    /// A clone of every open connection, so that `Drop` can shut them down.
    streams: HashMap<u64, TcpStream>,
    threads: Vec<JoinHandle<()>>,
}

impl Shared {
    fn new(digest: [u8; 32], max_wait: Duration) -> Shared {
        Shared {
            data: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            digest,
            pending_hellos: AtomicUsize::new(0),
            conns: Mutex::new(Conns::default()),
            max_wait,
        }
    }

    fn lock_data(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Vec<u8>>> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_conns(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A TCP store server. It serves until dropped; `Drop` stops accepting, closes every connection
/// and joins its threads.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    wake_write: libc::c_int,
    wake_read: libc::c_int,
    acceptor: Option<JoinHandle<()>>,
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
    sock.listen(1024)?;
    Ok(sock.into())
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
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: fds has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(Error::system("pipe2", io::Error::last_os_error()));
        }
        let shared = Arc::new(Shared::new(token_digest(&token), MAX_WAIT_CHUNK));
        let sh = shared.clone();
        let wake_read = fds[0];
        let acceptor = std::thread::Builder::new()
            .name("dc-store-accept".into())
            .spawn(move || accept_loop(listener, wake_read, sh))
            .map_err(|e| Error::system("spawning the store thread", e));
        let acceptor = match acceptor {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: both descriptors came from pipe2 above and are closed once.
                unsafe {
                    libc::close(fds[0]);
                    libc::close(fds[1]);
                }
                return Err(e);
            }
        };
        dc_log!(Level::Info, None, "store server listening on {addr}");
        Ok(StoreServer { addr, shared, wake_write: fds[1], wake_read: fds[0], acceptor: Some(acceptor) })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether clients presenting `token` are let in.
    pub fn accepts_token(&self, token: &[u8]) -> bool {
        ct_eq(&token_digest(token), &self.shared.digest)
    }

    /// Waits until no client but one (this process's own) is connected, at most `max`.
    pub fn linger_while_clients(&self, max: Duration) {
        let end = Instant::now() + max;
        while self.shared.lock_conns().streams.len() > 1 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Number of keys held (for tests and diagnostics).
    pub fn num_keys(&self) -> usize {
        self.shared.lock_data().len()
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // SAFETY: writing one byte from a valid buffer to our own pipe.
        unsafe { libc::write(self.wake_write, [1u8].as_ptr() as *const libc::c_void, 1) };
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        let threads = {
            let mut c = self.shared.lock_conns();
            for s in c.streams.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut c.threads)
        };
        {
            // Wake server-side waits (taking the lock orders this after any check of `stopping`).
            let _g = self.shared.lock_data();
            self.shared.changed.notify_all();
        }
        for t in threads {
            let _ = t.join();
        }
        // SAFETY: the pipe's descriptors are ours and closed exactly once, after the acceptor
        // (the only other user of wake_read) has been joined.
        unsafe {
            libc::close(self.wake_write);
            libc::close(self.wake_read);
        }
        dc_log!(Level::Info, None, "store server on {} stopped", self.addr);
    }
}

fn accept_loop(listener: TcpListener, wake: libc::c_int, shared: Arc<Shared>) {
    loop {
        let mut fds = [
            libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: fds is a valid array of two pollfd structs.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            dc_log!(Level::Warn, None, "store server: poll failed: {e}; stopping");
            return;
        }
        if fds[0].revents == 0 {
            continue;
        }
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off a little instead of spinning.
                if e.kind() != io::ErrorKind::Interrupted && e.kind() != io::ErrorKind::WouldBlock {
                    dc_log!(Level::Warn, None, "store server: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
        };
        let mut conns = shared.lock_conns();
        conns.threads.retain(|t| !t.is_finished());
        let pending = shared.pending_hellos.load(Ordering::SeqCst);
        if conns.streams.len() >= MAX_CONNECTIONS || pending >= MAX_PENDING_HELLOS {
            drop(conns);
            dc_log!(Level::Warn, None, "store server: too many connections; turning away {peer}");
            let mut s = stream;
            let _ = s.set_nonblocking(true);
            let mut reply = [0u8; 5];
            reply[..4].copy_from_slice(&REPLY_MAGIC);
            reply[4] = BUSY;
            let _ = s.write(&reply);
            continue;
        }
        let Ok(clone) = stream.try_clone() else { continue };
        let id = conns.next_id;
        conns.next_id += 1;
        conns.streams.insert(id, clone);
        shared.pending_hellos.fetch_add(1, Ordering::SeqCst);
        let sh = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("dc-store-conn".into())
            .stack_size(256 << 10)
            .spawn(move || {
                serve_connection(stream, peer, &sh);
                sh.lock_conns().streams.remove(&id);
            });
        match spawned {
            Ok(h) => conns.threads.push(h),
            Err(e) => {
                shared.pending_hellos.fetch_sub(1, Ordering::SeqCst);
                if let Some(s) = conns.streams.remove(&id) {
                    let _ = s.shutdown(Shutdown::Both);
                }
                dc_log!(Level::Warn, None, "store server: cannot spawn a thread: {e}");
            }
        }
    }
}

/// Decrements the pending-hello count once, however the hello ends.
struct PendingHello<'a>(Option<&'a AtomicUsize>);

impl PendingHello<'_> {
    fn done(&mut self) {
        if let Some(c) = self.0.take() {
            c.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for PendingHello<'_> {
    fn drop(&mut self) {
        self.done();
    }
}

fn serve_connection(mut s: TcpStream, peer: SocketAddr, shared: &Shared) {
    let mut pending = PendingHello(Some(&shared.pending_hellos));
    let _ = s.set_nodelay(true);
    if s.set_read_timeout(Some(HELLO_TIMEOUT)).is_err() {
        return;
    }
    let _ = s.set_write_timeout(Some(Duration::from_secs(60)));
    // A fixed-size buffer: nothing the peer sends before authenticating sizes an allocation.
    // The whole hello must arrive within HELLO_TIMEOUT, however slowly it trickles in.
    let mut hello = [0u8; HELLO_LEN];
    if let Err(e) = read_exact_by(&mut s, &mut hello, Instant::now() + HELLO_TIMEOUT) {
        dc_log!(Level::Warn, None, "store server: no valid hello from {peer} ({e}); dropped");
        return;
    }
    let mut reply = [0u8; 5];
    reply[..4].copy_from_slice(&REPLY_MAGIC);
    reply[4] = hello_verdict(&hello, &shared.digest);
    match reply[4] {
        BAD_VERSION => {
            let _ = s.write_all(&reply);
            dc_log!(Level::Warn, None, "store server: {peer} is not a distcomm v{VERSION} client; dropped");
            return;
        }
        REFUSED => {
            let _ = s.write_all(&reply);
            dc_log!(Level::Warn, None, "store server: {peer} presented a wrong token; refused");
            return;
        }
        _ => {}
    }
    if s.write_all(&reply).is_err() || s.set_read_timeout(None).is_err() {
        return;
    }
    pending.done();
    dc_log!(Level::Trace, None, "store server: client {peer} authenticated");

    loop {
        match serve_request(&mut s, shared) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof && !shared.stopping.load(Ordering::SeqCst) {
                    dc_log!(Level::Trace, None, "store server: connection from {peer} ended: {e}");
                }
                return;
            }
        }
    }
}

/// The answer code to a client's hello: WELCOME, BAD_VERSION or REFUSED (digest compared in
/// constant time).
fn hello_verdict(hello: &[u8; HELLO_LEN], digest: &[u8; 32]) -> u8 {
    let version = u16::from_le_bytes([hello[4], hello[5]]);
    if hello[..4] != MAGIC || version != VERSION {
        BAD_VERSION
    } else if !ct_eq(&hello[8..40], digest) {
        REFUSED
    } else {
        WELCOME
    }
}

fn read_u8(s: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(b[0])
}

fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(s: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Reads `len` bytes, growing the buffer as they arrive: a length announced by the peer
/// (already capped by the caller) never sizes an allocation up front.
fn read_vec(s: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(len.min(64 << 10));
    s.take(len as u64).read_to_end(&mut v)?;
    if v.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(v)
}

/// `read_exact` with one deadline for the whole buffer (a read timeout alone applies per read).
fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn write_answer(s: &mut impl Write, code: u8, body: &[u8]) -> io::Result<()> {
    let mut head = [0u8; 9];
    head[0] = code;
    head[1..].copy_from_slice(&(body.len() as u64).to_le_bytes());
    if body.len() <= 4096 {
        let mut msg = Vec::with_capacity(9 + body.len());
        msg.extend_from_slice(&head);
        msg.extend_from_slice(body);
        s.write_all(&msg)
    } else {
        s.write_all(&head)?;
        s.write_all(body)
    }
}

/// Parses a counter's stored text.
fn parse_counter(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

/// Serves one request; `Ok(false)` closes the connection.
fn serve_request<S: Read + Write>(s: &mut S, shared: &Shared) -> io::Result<bool> {
    let op = read_u8(s)?;
    let key_len = read_u32(s)? as usize;
    if key_len > MAX_KEY_LEN {
        write_answer(s, R_ERROR, format!("key of {key_len} bytes exceeds {MAX_KEY_LEN}").as_bytes())?;
        return Ok(false);
    }
    let key = read_vec(s, key_len)?;
    match op {
        OP_SET => {
            let len = read_u64(s)?;
            if len > MAX_VALUE_LEN as u64 {
                write_answer(s, R_ERROR, format!("value of {len} bytes exceeds {MAX_VALUE_LEN}").as_bytes())?;
                return Ok(false);
            }
            let value = read_vec(s, len as usize)?;
            {
                let mut d = shared.lock_data();
                d.insert(key, value);
                shared.changed.notify_all();
            }
            write_answer(s, R_OK, &[])?;
        }
        OP_GET => {
            let wait = Duration::from_millis(read_u32(s)? as u64).min(shared.max_wait);
            let deadline = Instant::now() + wait;
            let found = {
                let mut d = shared.lock_data();
                loop {
                    if let Some(v) = d.get(&key) {
                        break Some(v.clone());
                    }
                    if shared.stopping.load(Ordering::SeqCst) {
                        return Ok(false);
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        break None;
                    }
                    d = shared.changed.wait_timeout(d, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
                }
            };
            match found {
                Some(v) => write_answer(s, R_OK, &v)?,
                None => write_answer(s, R_NOT_FOUND, &[])?,
            }
        }
        OP_ADD => {
            let mut b = [0u8; 8];
            s.read_exact(&mut b)?;
            let delta = i64::from_le_bytes(b);
            let result = {
                let mut d = shared.lock_data();
                let cur = match d.get(&key) {
                    None => Some(0),
                    Some(v) => parse_counter(v),
                };
                match cur.map(|c| c.checked_add(delta)) {
                    Some(Some(n)) => {
                        d.insert(key.clone(), n.to_string().into_bytes());
                        shared.changed.notify_all();
                        Ok(n)
                    }
                    Some(None) => Err("counter overflow".to_string()),
                    None => Err(format!("the value at {:?} is not an integer", String::from_utf8_lossy(&key))),
                }
            };
            match result {
                Ok(n) => write_answer(s, R_OK, n.to_string().as_bytes())?,
                Err(m) => write_answer(s, R_ERROR, m.as_bytes())?,
            }
        }
        _ => {
            write_answer(s, R_ERROR, format!("unknown operation {op}").as_bytes())?;
            return Ok(false);
        }
    }
    Ok(true)
}

// ---------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------

struct Conn {
    stream: TcpStream,
    /// Set once the stream is out of step (an I/O error mid-request); every later call fails so.
    broken: Option<Error>,
}

/// A client of a [`StoreServer`]. Thread-safe; calls from several threads are serialised.
pub struct TcpStore {
    conn: Mutex<Conn>,
    addr: String,
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStore").field("addr", &self.addr).finish()
    }
}

enum Hello {
    Ok(TcpStream),
    /// Worth another try (busy server, or the connection went away during the hello).
    Retry(String),
}

impl TcpStore {
    /// Connects to the store at `host:port`, retrying (with backoff) while it is not there yet,
    /// until `deadline`; then `DC_ERR_TIMEOUT`. A wrong token is `DC_ERR_RENDEZVOUS`.
    pub fn connect(host: &str, port: u16, token: &[u8], deadline: Instant) -> Result<TcpStore> {
        let addr = fmt_host_port(host, port);
        let digest = token_digest(token);
        let start = Instant::now();
        let mut backoff = Duration::from_millis(10);
        let mut last_err: String;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match Self::try_connect(host, port, &addr, &digest, deadline) {
                Ok(Hello::Ok(stream)) => {
                    dc_log!(Level::Info, None, "connected to the store at {addr}");
                    return Ok(TcpStore { conn: Mutex::new(Conn { stream, broken: None }), addr });
                }
                Ok(Hello::Retry(why)) => last_err = why,
                Err(e) => return Err(e),
            }
            if attempts == 1 || attempts.is_multiple_of(50) {
                dc_log!(Level::Info, None, "store at {addr} not reachable yet ({last_err}); retrying");
            }
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    Status::Timeout,
                    "store at {addr} unreachable for {:.1} s ({last_err}) (is rank 0 / the launcher running?)",
                    (now - start).as_secs_f64()
                );
            }
            std::thread::sleep(backoff.min(deadline - now));
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    fn try_connect(host: &str, port: u16, addr: &str, digest: &[u8; 32], deadline: Instant) -> Result<Hello> {
        let addrs: Vec<SocketAddr> = match (host, port).to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => return Ok(Hello::Retry(format!("cannot resolve {host}: {e}"))),
        };
        let mut why = format!("{host} resolves to no address");
        for sa in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut s = match TcpStream::connect_timeout(&sa, left.min(Duration::from_secs(5))) {
                Ok(s) => s,
                Err(e) => {
                    why = format!("{sa}: {e}");
                    continue;
                }
            };
            let _ = s.set_nodelay(true);
            let mut hello = [0u8; HELLO_LEN];
            hello[..4].copy_from_slice(&MAGIC);
            hello[4..6].copy_from_slice(&VERSION.to_le_bytes());
            hello[8..].copy_from_slice(digest);
            let wait = deadline.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(100), Duration::from_secs(10));
            let _ = s.set_read_timeout(Some(wait));
            let _ = s.set_write_timeout(Some(wait));
            if let Err(e) = s.write_all(&hello) {
                why = format!("{sa}: sending the hello: {e}");
                continue;
            }
            let mut reply = [0u8; 5];
            if let Err(e) = s.read_exact(&mut reply) {
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut {
                    bail!(
                        Status::Rendezvous,
                        "store at {addr} did not answer the hello (not a distcomm store?)"
                    );
                }
                why = format!("{sa} closed the connection during the hello ({e}); not a distcomm store?");
                continue;
            }
            if reply[..4] != REPLY_MAGIC {
                bail!(Status::Rendezvous, "store at {addr} answered with garbage (not a distcomm store?)");
            }
            match reply[4] {
                WELCOME => {
                    let _ = s.set_read_timeout(None);
                    let _ = s.set_write_timeout(Some(ANSWER_SLACK));
                    return Ok(Hello::Ok(s));
                }
                REFUSED => bail!(
                    Status::Rendezvous,
                    "token refused by the store at {addr} (export the same DC_TOKEN on every rank)"
                ),
                BAD_VERSION => bail!(
                    Status::Rendezvous,
                    "store at {addr} does not speak store protocol version {VERSION}"
                ),
                BUSY => why = format!("{sa} is busy"),
                c => bail!(Status::Rendezvous, "store at {addr} answered the hello with code {c}"),
            }
        }
        Ok(Hello::Retry(why))
    }

    /// The address connected to, as `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// This end's address of the connection: the local address that routes to the store.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.lock().stream.local_addr().map_err(|e| Error::system("getsockname", e))
    }

    fn lock(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends one request and reads its answer. `wait` is how long the server may hold it.
    fn call(&self, request: &[&[u8]], wait: Duration) -> Result<(u8, Vec<u8>)> {
        let mut c = self.lock();
        if let Some(e) = &c.broken {
            return Err(e.clone());
        }
        let r = Self::exchange(&mut c.stream, request, wait);
        match r {
            Ok(x) => Ok(x),
            Err(e) => {
                let err = self.io_error(e);
                let _ = c.stream.shutdown(Shutdown::Both);
                c.broken = Some(err.clone());
                Err(err)
            }
        }
    }

    fn exchange(s: &mut TcpStream, request: &[&[u8]], wait: Duration) -> io::Result<(u8, Vec<u8>)> {
        let mut msg = Vec::with_capacity(request.iter().map(|p| p.len()).sum());
        for p in request {
            msg.extend_from_slice(p);
        }
        s.write_all(&msg)?;
        s.set_read_timeout(Some(wait + ANSWER_SLACK))?;
        let code = read_u8(s)?;
        let len = read_u64(s)?;
        if len > MAX_VALUE_LEN as u64 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("answer of {len} bytes")));
        }
        Ok((code, read_vec(s, len as usize)?))
    }

    fn io_error(&self, e: io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => err!(
                Status::Rendezvous,
                "the store at {} closed the connection (did rank 0 / the launcher exit?)",
                self.addr
            ),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                err!(Status::Rendezvous, "the store at {} stopped answering", self.addr)
            }
            _ => err!(Status::Rendezvous, "store at {}: {e}", self.addr),
        }
    }

    fn check_key(key: &str) -> Result<()> {
        if key.len() > MAX_KEY_LEN {
            bail!(Status::InvalidArgument, "store key of {} bytes exceeds {MAX_KEY_LEN}", key.len());
        }
        Ok(())
    }

    fn head(op: u8, key: &str) -> [u8; 5] {
        let mut h = [0u8; 5];
        h[0] = op;
        h[1..].copy_from_slice(&(key.len() as u32).to_le_bytes());
        h
    }

    fn remote_error(&self, body: &[u8]) -> Error {
        err!(Status::Rendezvous, "store at {}: {}", self.addr, String::from_utf8_lossy(body))
    }

    fn get_once(&self, key: &str, wait: Duration) -> Result<Option<Vec<u8>>> {
        Self::check_key(key)?;
        let ms = (wait.as_millis().min(MAX_WAIT_CHUNK.as_millis()) as u32).to_le_bytes();
        let (code, body) = self.call(&[&Self::head(OP_GET, key), key.as_bytes(), &ms], wait)?;
        match code {
            R_OK => Ok(Some(body)),
            R_NOT_FOUND => Ok(None),
            _ => Err(self.remote_error(&body)),
        }
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        Self::check_key(key)?;
        if value.len() > MAX_VALUE_LEN {
            bail!(Status::InvalidArgument, "store value of {} bytes exceeds {MAX_VALUE_LEN}", value.len());
        }
        let len = (value.len() as u64).to_le_bytes();
        let (code, body) =
            self.call(&[&Self::head(OP_SET, key), key.as_bytes(), &len, value], Duration::ZERO)?;
        match code {
            R_OK => Ok(()),
            _ => Err(self.remote_error(&body)),
        }
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let start = Instant::now();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Round up so a sub-millisecond remainder still waits rather than asking again at once.
            let wait = if left.is_zero() { Duration::ZERO } else { left.max(Duration::from_millis(1)) };
            if let Some(v) = self.get_once(key, wait)? {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                bail!(
                    Status::Timeout,
                    "store key {key:?} was not set within {:.1} s",
                    (Instant::now() - start).as_secs_f64()
                );
            }
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.get_once(key, Duration::ZERO)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        Self::check_key(key)?;
        let d = delta.to_le_bytes();
        let (code, body) = self.call(&[&Self::head(OP_ADD, key), key.as_bytes(), &d], Duration::ZERO)?;
        match code {
            R_OK => parse_counter(&body).ok_or_else(|| self.remote_error(b"malformed ADD answer")),
            _ => Err(self.remote_error(&body)),
        }
    }
}

/// Feeds bytes to the server's parsers, for fuzzing and property tests: the first
/// [`HELLO_LEN`](super) bytes go through the hello check, the rest is parsed as requests of an
/// authenticated client (GET never waits) until the stream ends or the server closes it.
/// Returns the hello's answer code and the number of requests served.
#[doc(hidden)]
pub fn fuzz_server_input(bytes: &[u8]) -> (Option<u8>, usize) {
    let shared = Shared::new(token_digest(b"fuzz"), Duration::ZERO);
    let verdict = bytes.get(..HELLO_LEN).map(|h| hello_verdict(h.try_into().unwrap(), &shared.digest));
    struct Io<'a> {
        input: &'a [u8],
        out: io::Sink,
    }
    impl Read for Io<'_> {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            self.input.read(b)
        }
    }
    impl Write for Io<'_> {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.out.write(b)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut io = Io { input: bytes.get(HELLO_LEN..).unwrap_or(&[]), out: io::sink() };
    let mut served = 0;
    while let Ok(true) = serve_request(&mut io, &shared) {
        served += 1;
    }
    (verdict, served)
}

/// Builds raw protocol bytes; for tests that play a misbehaving client.
#[doc(hidden)]
pub mod raw {
    /// A valid hello for `token`.
    pub fn hello(token: &[u8]) -> Vec<u8> {
        let mut h = Vec::with_capacity(super::HELLO_LEN);
        h.extend_from_slice(&super::MAGIC);
        h.extend_from_slice(&super::VERSION.to_le_bytes());
        h.extend_from_slice(&[0, 0]);
        h.extend_from_slice(&super::token_digest(token));
        h
    }

    /// A SET request header claiming a value of `value_len` bytes (no value bytes follow).
    pub fn set_header(key: &str, value_len: u64) -> Vec<u8> {
        let mut m = vec![super::OP_SET];
        m.extend_from_slice(&(key.len() as u32).to_le_bytes());
        m.extend_from_slice(key.as_bytes());
        m.extend_from_slice(&value_len.to_le_bytes());
        m
    }
}
