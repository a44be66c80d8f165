//! The mutual handshake of a data connection (see `crate::auth`): both sides prove that they
//! know the job token, over fresh nonces, before a byte of the job's traffic is read.
//!
//! 1. The connecting rank's hello, [`HELLO_LEN`] bytes: magic `DCDATA02` | job id `u64` | its
//!    rank `u32` | world size `u32` | its nonce.
//! 2. The acceptor's challenge: `CHALLENGE` | its nonce | HMAC(key, "data/server", job id, the
//!    connecting rank, the acceptor's rank, the connecting nonce, its nonce) — or, for a hello
//!    from another job or an impossible rank, one byte `REFUSED` and the connection is closed.
//! 3. The connecting rank checks that proof (a rogue acceptor cannot make it) and answers with
//!    HMAC(key, "data/client", job id, its rank, the acceptor's rank, the acceptor's nonce, its
//!    nonce).
//! 4. The acceptor checks it (constant time) and answers one byte: accepted, refused, or
//!    "duplicate" (both ranks of the pair connected at once, and the acceptor's own connection,
//!    made by the lower rank, is the one the pair keeps).
//!
//! A hello or a proof recorded on one connection is useless on another (the other side's nonce
//! is new), and one reflected back fails (the roles' labels differ).

use crate::auth::{self, Key};
pub use super::seal::Session;
use crate::error::{Error, Result, Status};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const MAGIC: &[u8; 8] = b"DCDATA02";
pub const HELLO_LEN: usize = 8 + 8 + 4 + 4 + auth::LEN;
/// The acceptor's challenge: a marker byte, its nonce and its proof.
pub const CHALLENGE_LEN: usize = 1 + 2 * auth::LEN;
const ACCEPTED: u8 = 1;
const REFUSED: u8 = 0;
const DUPLICATE: u8 = 2;
const CHALLENGE: u8 = 3;
const SERVER_LABEL: &str = "data/server";
const CLIENT_LABEL: &str = "data/client";

/// What the acceptor answered to our hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The connection is the pair's.
    Accepted,
    /// The peer connected to us at the same time and its connection wins: use that one.
    Duplicate,
    /// No answer within the wait (the caller may hang up and dial again).
    Silent,
}

/// The job key's bytes, as `MeshConfig` carries them (see `auth::Key`).
pub fn token_digest(token: &[u8]) -> [u8; 32] {
    Key::from_token(token).to_bytes()
}

/// Who connects: its rank, the job and (local only, never sent) the job key's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub digest: [u8; 32],
    pub job_id: u64,
    pub rank: u32,
    pub world_size: u32,
}

/// A hello as it travels: who, and the nonce it brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub job_id: u64,
    pub rank: u32,
    pub world_size: u32,
    pub nonce: [u8; auth::LEN],
}

impl Hello {
    /// The wire form with `nonce`.
    pub fn encode(&self, nonce: &[u8; auth::LEN]) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.job_id.to_le_bytes());
        b[16..20].copy_from_slice(&self.rank.to_le_bytes());
        b[20..24].copy_from_slice(&self.world_size.to_le_bytes());
        b[24..].copy_from_slice(nonce);
        b
    }
}

/// Parses a hello (None: not a distcomm data hello).
pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Received> {
    if &b[..8] != MAGIC {
        return None;
    }
    Some(Received {
        job_id: u64::from_le_bytes(b[8..16].try_into().ok()?),
        rank: u32::from_le_bytes(b[16..20].try_into().ok()?),
        world_size: u32::from_le_bytes(b[20..24].try_into().ok()?),
        nonce: b[24..].try_into().ok()?,
    })
}

fn server_proof(key: &Key, job_id: u64, client: u32, server: u32, client_nonce: &[u8], server_nonce: &[u8]) -> [u8; auth::LEN] {
    key.prove(SERVER_LABEL, &[&job_id.to_le_bytes(), &client.to_le_bytes(), &server.to_le_bytes(), client_nonce, server_nonce])
}

fn client_parts<'a>(job_id: &'a [u8; 8], client: &'a [u8; 4], server: &'a [u8; 4], server_nonce: &'a [u8], client_nonce: &'a [u8]) -> [&'a [u8]; 5] {
    [job_id, client, server, server_nonce, client_nonce]
}

/// The acceptor's side, step 2: the challenge answering hello `h`, made by rank `me`, and the
/// nonce to keep for step 4.
pub fn challenge(digest: &[u8; 32], h: &Received, me: u32) -> std::io::Result<([u8; CHALLENGE_LEN], [u8; auth::LEN])> {
    let key = Key::from_bytes(*digest);
    let nonce = auth::nonce()?;
    let mut c = [0u8; CHALLENGE_LEN];
    c[0] = CHALLENGE;
    c[1..1 + auth::LEN].copy_from_slice(&nonce);
    c[1 + auth::LEN..].copy_from_slice(&server_proof(&key, h.job_id, h.rank, me, &h.nonce, &nonce));
    Ok((c, nonce))
}

/// The acceptor's side, step 4: whether `proof` answers our challenge `our_nonce` to hello `h`.
pub fn check_proof(digest: &[u8; 32], h: &Received, me: u32, our_nonce: &[u8], proof: &[u8]) -> bool {
    let key = Key::from_bytes(*digest);
    let (j, c, s) = (h.job_id.to_le_bytes(), h.rank.to_le_bytes(), me.to_le_bytes());
    key.verify(CLIENT_LABEL, &client_parts(&j, &c, &s, our_nonce, &h.nonce), proof)
}

/// The connecting side, step 3: our proof answering challenge `c` of rank `peer` to our
/// `hello` sent with `nonce`, or None when the challenge's proof is not the job's (a rogue
/// acceptor). Without I/O, so that tests and fuzzers can play a genuine rank.
pub fn answer(hello: &Hello, nonce: &[u8; auth::LEN], peer: u32, c: &[u8; CHALLENGE_LEN]) -> Option<[u8; auth::LEN]> {
    let key = Key::from_bytes(hello.digest);
    let their_nonce = &c[1..1 + auth::LEN];
    if c[0] != CHALLENGE || !auth::ct_eq(&server_proof(&key, hello.job_id, hello.rank, peer, nonce, their_nonce), &c[1 + auth::LEN..]) {
        return None;
    }
    let (j, me, them) = (hello.job_id.to_le_bytes(), hello.rank.to_le_bytes(), peer.to_le_bytes());
    Some(key.prove(CLIENT_LABEL, &client_parts(&j, &me, &them, their_nonce, nonce)))
}

/// The connecting side: sends our hello on a fresh connection to rank `peer`, checks the
/// acceptor's proof, proves ourselves, and returns its answer (with the session, whose nonces
/// key an encrypted connection: see `seal`).
pub fn offer(stream: &mut TcpStream, hello: &Hello, peer: u32, wait: Duration) -> Result<(Answer, Option<Session>)> {
    let io = |e: std::io::Error| Error::new(Status::Rendezvous, format!("handshake with rank {peer} failed: {e}"));
    let silent = |e: &std::io::Error| matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
    let nonce = auth::nonce().map_err(io)?;
    stream.set_read_timeout(Some(wait.max(Duration::from_millis(1)))).map_err(io)?;
    stream.write_all(&hello.encode(&nonce)).map_err(io)?;
    let mut c = [0u8; CHALLENGE_LEN];
    match stream.read_exact(&mut c[..1]) {
        Err(e) if silent(&e) => return Ok((Answer::Silent, None)),
        r => r.map_err(io)?,
    }
    if c[0] != CHALLENGE {
        return Err(refused(peer));
    }
    match stream.read_exact(&mut c[1..]) {
        Err(e) if silent(&e) => return Ok((Answer::Silent, None)),
        r => r.map_err(io)?,
    }
    let their_nonce = &c[1..1 + auth::LEN];
    let Some(proof) = answer(hello, &nonce, peer, &c) else {
        return Err(Error::new(
            Status::Rendezvous,
            format!("the listener of rank {peer} could not prove that it knows the job token: not this job's rank (an impostor, or another job on its port)"),
        ));
    };
    stream.write_all(&proof).map_err(io)?;
    let mut ans = [0u8; 1];
    match stream.read_exact(&mut ans) {
        Err(e) if silent(&e) => return Ok((Answer::Silent, None)),
        r => r.map_err(io)?,
    }
    stream.set_read_timeout(None).map_err(io)?;
    let session = Session { job_id: hello.job_id, dialer: hello.rank, acceptor: peer, dialer_nonce: nonce, acceptor_nonce: their_nonce.try_into().expect("a nonce") };
    match ans[0] {
        ACCEPTED => Ok((Answer::Accepted, Some(session))),
        DUPLICATE => Ok((Answer::Duplicate, None)),
        _ => Err(refused(peer)),
    }
}

fn refused(peer: u32) -> Error {
    Error::new(Status::Rendezvous, format!("rank {peer} refused our connection (job token or job id differ)"))
}

/// The whole acceptor's side on a blocking stream, as rank `me` of a job of `size` (tests and
/// fake peers; the door runs the same steps without blocking): the hello, after a valid proof,
/// or None (the connection was refused).
pub fn serve_blocking(stream: &mut TcpStream, digest: &[u8; 32], job_id: u64, me: u32, size: u32) -> std::io::Result<Option<Received>> {
    let mut b = [0u8; HELLO_LEN];
    stream.read_exact(&mut b)?;
    let Some(h) = decode(&b).filter(|h| h.job_id == job_id && h.world_size == size && h.rank < size && h.rank != me) else {
        refuse(stream);
        return Ok(None);
    };
    let (c, nonce) = challenge(digest, &h, me)?;
    stream.write_all(&c)?;
    let mut proof = [0u8; auth::LEN];
    stream.read_exact(&mut proof)?;
    if !check_proof(digest, &h, me, &nonce, &proof) {
        refuse(stream);
        return Ok(None);
    }
    Ok(Some(h))
}

/// Tells an accepted peer it is in.
pub fn accept(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(&[ACCEPTED])?;
    stream.set_read_timeout(None)
}

/// Tells a peer it is refused (another job, a wrong token, an impossible rank).
pub fn refuse(stream: &mut TcpStream) {
    let _ = stream.write_all(&[REFUSED]);
}

/// Tells a peer that connected while we connected to it that the pair keeps our connection.
pub fn duplicate(stream: &mut TcpStream) {
    let _ = stream.write_all(&[DUPLICATE]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c, l.accept().unwrap().0)
    }

    fn hello(token: &[u8], rank: u32) -> Hello {
        Hello { digest: token_digest(token), job_id: 7, rank, world_size: 4 }
    }

    #[test]
    fn both_sides_prove_the_token() {
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || {
            let h = serve_blocking(&mut s, &token_digest(b"k"), 7, 2, 4).unwrap().expect("a genuine rank");
            accept(&mut s).unwrap();
            h.rank
        });
        assert_eq!(offer(&mut c, &hello(b"k", 1), 2, Duration::from_secs(5)).unwrap().0, Answer::Accepted);
        assert_eq!(t.join().unwrap(), 1);
    }

    #[test]
    fn a_wrong_token_is_refused_either_way() {
        // The connecting side has the wrong token: the acceptor's proof fails at the client.
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || serve_blocking(&mut s, &token_digest(b"k"), 7, 2, 4));
        let e = offer(&mut c, &hello(b"other", 1), 2, Duration::from_secs(5)).unwrap_err();
        assert!(e.msg.contains("could not prove"), "{e}");
        drop(c);
        assert!(t.join().unwrap().is_err(), "the acceptor gets no proof");
        // A forged proof (the right challenge, then garbage) is refused by the acceptor.
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || serve_blocking(&mut s, &token_digest(b"k"), 7, 2, 4).unwrap());
        c.write_all(&hello(b"k", 1).encode(&[1; 32])).unwrap();
        let mut ch = [0u8; CHALLENGE_LEN];
        c.read_exact(&mut ch).unwrap();
        c.write_all(&[0u8; 32]).unwrap();
        assert_eq!(t.join().unwrap(), None);
        let mut b = [9u8; 1];
        c.read_exact(&mut b).unwrap();
        assert_eq!(b[0], REFUSED);
    }

    #[test]
    fn a_recorded_exchange_fails_on_a_new_connection() {
        // A genuine exchange on one connection...
        let (mut c, mut s) = pair();
        let t = std::thread::spawn(move || {
            let h = serve_blocking(&mut s, &token_digest(b"k"), 7, 2, 4).unwrap();
            accept(&mut s).unwrap();
            h
        });
        assert_eq!(offer(&mut c, &hello(b"k", 1), 2, Duration::from_secs(5)).unwrap().0, Answer::Accepted);
        let _ = t.join().unwrap().unwrap();
        // ...then, on another connection, a genuine hello and a proof made for an old challenge:
        // the acceptor's nonce is new, so it is refused.
        let (mut c2, mut s2) = pair();
        let t2 = std::thread::spawn(move || serve_blocking(&mut s2, &token_digest(b"k"), 7, 2, 4).unwrap());
        let old_nonce = [5u8; 32];
        c2.write_all(&hello(b"k", 1).encode(&old_nonce)).unwrap();
        let mut ch = [0u8; CHALLENGE_LEN];
        c2.read_exact(&mut ch).unwrap();
        let key = Key::from_token(b"k");
        let stale = key.prove(CLIENT_LABEL, &client_parts(&7u64.to_le_bytes(), &1u32.to_le_bytes(), &2u32.to_le_bytes(), &[0u8; 32], &old_nonce));
        c2.write_all(&stale).unwrap();
        assert_eq!(t2.join().unwrap(), None, "a proof for another challenge");
    }

    #[test]
    fn another_job_or_an_impossible_rank_is_refused_at_the_hello() {
        for (job, rank, size) in [(8u64, 1u32, 4u32), (7, 2, 4), (7, 9, 4), (7, 1, 5)] {
            let (mut c, mut s) = pair();
            let t = std::thread::spawn(move || serve_blocking(&mut s, &token_digest(b"k"), 7, 2, 4).unwrap());
            let h = Hello { digest: token_digest(b"k"), job_id: job, rank, world_size: size };
            let e = offer(&mut c, &h, 2, Duration::from_secs(5)).unwrap_err();
            assert!(e.msg.contains("refused"), "{job} {rank} {size}: {e}");
            assert_eq!(t.join().unwrap(), None);
        }
    }
}
