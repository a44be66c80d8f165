//! The TCP key-value store: a server (hosted by rank 0 or the launcher) and a client.
//!
//! # Wire protocol (all integers little-endian)
//!
//! Both sides prove that they know the job token, with fresh nonces (see `crate::auth`), before
//! anything else is read:
//! 1. the server's challenge, 40 bytes: `"DCSC"` | version `u16` (= 2) | reserved `u16` |
//!    server nonce (32 bytes) — or, when it is full, `"DCSR"` | `3` (busy) and close;
//! 2. the client's hello, 72 bytes: `"DCST"` | version `u16` | reserved `u16` | client nonce |
//!    HMAC(key, "store/client", server nonce, client nonce);
//! 3. the server's answer: `"DCSR"` | code `u8` (`0` welcome, `1` token refused, `2` unsupported
//!    version or not a distcomm client), after `0` its own proof HMAC(key, "store/server",
//!    client nonce, server nonce), which the client checks before it trusts a byte of the store.
//!
//! The server reads exactly the hello's 72 bytes (all within 5 s, never allocating from anything
//! the peer sends) and compares in constant time; anything but welcome is followed by closing
//! the connection. A replayed hello fails (the server's nonce is new), and so does one reflected
//! (the roles' labels differ); a rogue server cannot answer the client's nonce.
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
//!
//! The server (one thread, one event loop for every connection) is in [`super::store_server`],
//! its parser and map without I/O in [`super::store_core`]; this file holds the client.

use super::store_core::parse_counter;
use super::store_server::MAX_WAIT_CHUNK;
pub use super::store_server::{bind_listener, StoreServer};
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::auth::{self, Key};
use crate::backoff::Jitter;
use crate::rendezvous::Store;
use crate::{bail, dc_log, err};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub(super) const MAGIC: [u8; 4] = *b"DCST";
pub(super) const REPLY_MAGIC: [u8; 4] = *b"DCSR";
pub(super) const CHALLENGE_MAGIC: [u8; 4] = *b"DCSC";
pub(super) const VERSION: u16 = 2;
pub(super) const CHALLENGE_LEN: usize = 8 + auth::LEN;
pub(super) const HELLO_LEN: usize = 8 + 2 * auth::LEN;
/// The proofs' labels (see `crate::auth`).
pub(super) const CLIENT_LABEL: &str = "store/client";
pub(super) const SERVER_LABEL: &str = "store/server";

pub(super) const WELCOME: u8 = 0;
pub(super) const REFUSED: u8 = 1;
pub(super) const BAD_VERSION: u8 = 2;
pub(super) const BUSY: u8 = 3;

pub(super) const OP_SET: u8 = 1;
pub(super) const OP_GET: u8 = 2;
pub(super) const OP_ADD: u8 = 3;

pub(super) const R_OK: u8 = 0;
pub(super) const R_NOT_FOUND: u8 = 1;
pub(super) const R_ERROR: u8 = 2;

/// Longest key the server accepts.
pub const MAX_KEY_LEN: usize = 4096;
/// Largest value the server accepts.
pub const MAX_VALUE_LEN: usize = 64 << 20;

/// How long a client waits for an answer beyond the server-side wait before calling the server dead.
const ANSWER_SLACK: Duration = Duration::from_secs(60);
/// The first pause between connection attempts; it doubles (with jitter) up to the next.
const CONNECT_BACKOFF_START: Duration = Duration::from_millis(10);
const CONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The challenge a server sends first.
pub(super) fn challenge(server_nonce: &[u8; auth::LEN]) -> [u8; CHALLENGE_LEN] {
    let mut c = [0u8; CHALLENGE_LEN];
    c[..4].copy_from_slice(&CHALLENGE_MAGIC);
    c[4..6].copy_from_slice(&VERSION.to_le_bytes());
    c[8..].copy_from_slice(server_nonce);
    c
}

/// A client's hello answering the challenge `server_nonce`.
pub(super) fn hello(key: &Key, server_nonce: &[u8], client_nonce: &[u8; auth::LEN]) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..4].copy_from_slice(&MAGIC);
    h[4..6].copy_from_slice(&VERSION.to_le_bytes());
    h[8..8 + auth::LEN].copy_from_slice(client_nonce);
    h[8 + auth::LEN..].copy_from_slice(&key.prove(CLIENT_LABEL, &[server_nonce, client_nonce]));
    h
}

/// `host:port`, with brackets for IPv6 literals.
pub fn fmt_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}


fn read_u8(s: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok(b[0])
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
    /// Connects to the store at `host:port`, retrying while it is not there yet or busy, until
    /// `deadline`; then `DC_ERR_TIMEOUT`. A wrong token is `DC_ERR_RENDEZVOUS`. The pause between
    /// tries doubles from 10 ms to 1 s and is drawn at random from half to one and a half times
    /// that, so a thousand ranks started together (refused, or answered "busy") spread out.
    pub fn connect(host: &str, port: u16, token: &[u8], deadline: Instant) -> Result<TcpStore> {
        let addr = fmt_host_port(host, port);
        let key = Key::from_token(token);
        let start = Instant::now();
        let mut backoff = CONNECT_BACKOFF_START;
        let mut rng = Jitter::new();
        let mut last_err: String;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match Self::try_connect(host, port, &addr, &key, deadline) {
                Ok(Hello::Ok(stream)) => {
                    dc_log!(Level::Info, None, "connected to the store at {addr} (attempt {attempts})");
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
            std::thread::sleep(rng.around(backoff).min(deadline - now));
            backoff = (backoff * 2).min(CONNECT_BACKOFF_MAX);
        }
    }

    fn try_connect(host: &str, port: u16, addr: &str, key: &Key, deadline: Instant) -> Result<Hello> {
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
            crate::transport::socket::watch_liveness(&s);
            let wait = deadline.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(100), Duration::from_secs(10));
            let _ = s.set_read_timeout(Some(wait));
            let _ = s.set_write_timeout(Some(wait));
            let silent = |e: &io::Error| matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut);
            // The challenge (or "busy").
            let mut first = [0u8; CHALLENGE_LEN];
            if let Err(e) = s.read_exact(&mut first[..5]) {
                if silent(&e) {
                    bail!(Status::Rendezvous, "store at {addr} sent no challenge (not a distcomm store?)");
                }
                why = format!("{sa} closed the connection before its challenge ({e}); not a distcomm store?");
                continue;
            }
            if first[..4] == REPLY_MAGIC && first[4] == BUSY {
                why = format!("{sa} is busy");
                continue;
            }
            if first[..4] != CHALLENGE_MAGIC {
                bail!(Status::Rendezvous, "store at {addr} answered with garbage (not a distcomm store?)");
            }
            if let Err(e) = s.read_exact(&mut first[5..]) {
                why = format!("{sa}: reading the challenge: {e}");
                continue;
            }
            let version = u16::from_le_bytes([first[4], first[5]]);
            if version != VERSION {
                bail!(Status::Rendezvous, "store at {addr} speaks store protocol version {version}, this library {VERSION} (mixed distcomm versions?)");
            }
            let server_nonce = &first[8..];
            let client_nonce = auth::nonce().map_err(|e| Error::system("a nonce for the store's handshake", e))?;
            if let Err(e) = s.write_all(&hello(key, server_nonce, &client_nonce)) {
                why = format!("{sa}: sending the hello: {e}");
                continue;
            }
            let mut reply = [0u8; 5];
            if let Err(e) = s.read_exact(&mut reply) {
                if silent(&e) {
                    bail!(Status::Rendezvous, "store at {addr} did not answer the hello (not a distcomm store?)");
                }
                why = format!("{sa} closed the connection during the hello ({e}); not a distcomm store?");
                continue;
            }
            if reply[..4] != REPLY_MAGIC {
                bail!(Status::Rendezvous, "store at {addr} answered with garbage (not a distcomm store?)");
            }
            if reply[4] == WELCOME {
                let mut proof = [0u8; auth::LEN];
                if let Err(e) = s.read_exact(&mut proof) {
                    why = format!("{sa}: reading the store's proof: {e}");
                    continue;
                }
                if !key.verify(SERVER_LABEL, &[&client_nonce, server_nonce], &proof) {
                    bail!(
                        Status::Rendezvous,
                        "the store at {addr} could not prove that it knows the job token: not this job's store (an impostor, or another job on the port)"
                    );
                }
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
/// [`HELLO_LEN`](super) bytes go through the hello check (against the challenge
/// [`raw::FUZZ_NONCE`]), the rest is parsed as requests of an
/// authenticated client (GET never waits) until the stream ends or the server would close it.
/// Returns the hello's answer code and the number of requests served.
#[doc(hidden)]
pub fn fuzz_server_input(bytes: &[u8]) -> (Option<u8>, usize) {
    use super::store_core::{answer_head, hello_verdict, Core, Outcome, Parsed, Parser};
    let key = Key::from_token(b"fuzz");
    let verdict = bytes.get(..HELLO_LEN).map(|h| hello_verdict(h.try_into().unwrap(), &key, &raw::FUZZ_NONCE));
    let mut core = Core::default();
    let mut parser = Parser::default();
    let mut input = bytes.get(HELLO_LEN..).unwrap_or(&[]);
    let mut served = 0;
    loop {
        let (n, parsed) = parser.feed(input);
        input = &input[n..];
        match parsed {
            Some(Parsed::Request(req)) => {
                match core.serve(0, req, Duration::ZERO).0 {
                    Outcome::Answer(code, body) => {
                        std::hint::black_box(answer_head(code, body.bytes().len()));
                    }
                    Outcome::Park(..) => unreachable!("GET never waits here"),
                }
                served += 1;
            }
            Some(Parsed::Fatal(_)) | None => break,
        }
    }
    (verdict, served)
}

/// Builds raw protocol bytes; for tests that play a misbehaving client.
#[doc(hidden)]
pub mod raw {
    use std::io::{Read, Write};

    /// The server nonce that `fuzz_server_input` challenges with.
    pub const FUZZ_NONCE: [u8; 32] = [0x5C; 32];
    /// Bytes of the server's challenge.
    pub const CHALLENGE_LEN: usize = super::CHALLENGE_LEN;

    /// A hello for `token` answering the challenge `server_nonce` (a fixed client nonce).
    pub fn hello(token: &[u8], server_nonce: &[u8]) -> Vec<u8> {
        super::hello(&super::Key::from_token(token), server_nonce, &[0x3A; 32]).to_vec()
    }

    /// Reads the server's challenge on `s` and returns its nonce.
    pub fn read_challenge(s: &mut std::net::TcpStream) -> std::io::Result<Vec<u8>> {
        let mut c = [0u8; super::CHALLENGE_LEN];
        s.read_exact(&mut c)?;
        Ok(c[8..].to_vec())
    }

    /// Authenticates `s` with `token`: the challenge, our hello, the server's answer code (its
    /// proof, after a welcome, is read and not checked).
    pub fn authenticate(s: &mut std::net::TcpStream, token: &[u8]) -> std::io::Result<u8> {
        let nonce = read_challenge(s)?;
        s.write_all(&hello(token, &nonce))?;
        let mut r = [0u8; 5];
        s.read_exact(&mut r)?;
        if r[4] == super::WELCOME {
            s.read_exact(&mut [0u8; 32])?;
        }
        Ok(r[4])
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
