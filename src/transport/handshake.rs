//! The hello a data connection presents before anything else: magic, a digest of the job token,
//! the job id and the sender's rank. The acceptor reads exactly this many bytes (with a short
//! read timeout), compares in constant time, and answers one byte: accepted, refused, or
//! "duplicate" (both ranks of the pair connected at once, and the acceptor's own connection,
//! made by the lower rank, is the one the pair keeps).

use crate::error::{Error, Result, Status};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const MAGIC: &[u8; 8] = b"DCDATA01";
pub const HELLO_LEN: usize = 8 + 32 + 8 + 4 + 4;
const ACCEPTED: u8 = 1;
const REFUSED: u8 = 0;
const DUPLICATE: u8 = 2;

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

/// A 32-byte digest of the job token (every rank runs the same library build).
pub fn token_digest(token: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = DefaultHasher::new();
        (b"distcomm-token", i as u64, token).hash(&mut h);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// Equality that takes the same time wherever the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub digest: [u8; 32],
    pub job_id: u64,
    pub rank: u32,
    pub world_size: u32,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..40].copy_from_slice(&self.digest);
        b[40..48].copy_from_slice(&self.job_id.to_le_bytes());
        b[48..52].copy_from_slice(&self.rank.to_le_bytes());
        b[52..56].copy_from_slice(&self.world_size.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        if &b[..8] != MAGIC {
            return None;
        }
        Some(Hello {
            digest: b[8..40].try_into().ok()?,
            job_id: u64::from_le_bytes(b[40..48].try_into().ok()?),
            rank: u32::from_le_bytes(b[48..52].try_into().ok()?),
            world_size: u32::from_le_bytes(b[52..56].try_into().ok()?),
        })
    }
}

/// Sends our hello on a fresh connection and waits for the acceptor's answer.
pub fn offer(stream: &mut TcpStream, hello: &Hello, peer: u32, wait: Duration) -> Result<Answer> {
    let io = |e: std::io::Error| Error::new(Status::Rendezvous, format!("handshake with rank {peer} failed: {e}"));
    stream.set_read_timeout(Some(wait.max(Duration::from_millis(1)))).map_err(io)?;
    stream.write_all(&hello.encode()).map_err(io)?;
    let mut ans = [0u8; 1];
    match stream.read_exact(&mut ans) {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return Ok(Answer::Silent),
        r => r.map_err(io)?,
    }
    stream.set_read_timeout(None).map_err(io)?;
    match ans[0] {
        ACCEPTED => Ok(Answer::Accepted),
        DUPLICATE => Ok(Answer::Duplicate),
        _ => Err(Error::new(Status::Rendezvous, format!("rank {peer} refused our connection (job token or job id differ)"))),
    }
}

/// Checks a received hello against the job's token digest (compared in constant time) and job
/// id; the rank is returned for the caller to check. A refused connection should be answered
/// with [`refuse`] and dropped.
pub fn verify(b: &[u8; HELLO_LEN], digest: &[u8; 32], job_id: u64) -> Option<Hello> {
    let h = Hello::decode(b)?;
    (constant_time_eq(&h.digest, digest) && h.job_id == job_id).then_some(h)
}

/// Tells an accepted peer it is in.
pub fn accept(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(&[ACCEPTED])?;
    stream.set_read_timeout(None)
}

/// Tells an accepted peer it is refused (e.g. a duplicate or out-of-range rank).
pub fn refuse(stream: &mut TcpStream) {
    let _ = stream.write_all(&[REFUSED]);
}

/// Tells a peer that connected while we connected to it that the pair keeps our connection.
pub fn duplicate(stream: &mut TcpStream) {
    let _ = stream.write_all(&[DUPLICATE]);
}
