//! The compact frame header that precedes every message on a data connection.
//!
//! 32 bytes, little endian: magic u8, kind u8, reserved u16, check u32, ctx u64, tag u64, len u64.
//! `check` is the collective signature (0 for point-to-point); `len` is the body length.

use crate::error::{Error, Result, Status};

pub const HEADER_LEN: usize = 32;
const MAGIC: u8 = 0xDC;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A message body of `len` bytes follows.
    Data = 1,
    /// The sender aborted communicator `ctx`.
    Abort = 2,
    /// The sender is shutting down gracefully; nothing more will come.
    Close = 3,
    /// Same host: instead of the body, where to read it (`RTS_LEN` bytes: cookie, address,
    /// length); the receiver copies it out of the sender's memory and answers `Fin`.
    Rts = 4,
    /// The receiver is done with the sender's memory for the message `tag` (a cookie);
    /// `check` is 0 on success.
    Fin = 5,
    /// Same host, sent over the socket: "look at our shared-memory rings" (frames wait in
    /// yours from us, or yours to us has room again; see `ring`).
    Bell = 6,
    /// Same host: "stream me the message `tag` (a cookie) through the ring" (see `stream`).
    Cts = 7,
    /// Same host, in the ring only: `len` bytes of the streamed message `tag` (a cookie).
    Chunk = 8,
    /// Over a connection: a message offered instead of sent (see `flow`): `RTS_LEN` bytes
    /// (cookie, 0, length); the receiver answers `Cts` when it wants the bytes.
    Offer = 9,
    /// The body of the offered message `tag` (a cookie), `len` bytes, after the receiver's `Cts`.
    Pulled = 10,
    /// The receiver consumed `tag` more bytes of our eager messages: we may send that much
    /// more eagerly (see `flow`).
    Credit = 11,
    /// "Send me your offered message `tag` (a cookie)": its first `ctx` bytes (what the
    /// receive takes; the field names no communicator here).
    Ask = 12,
    /// Same host: the sender withdraws its single-copy message `tag` (a cookie): the receiver
    /// drops it if no receive took it yet and answers `Fin` (check 1: not read), or answers
    /// `Fin` once the read under way ends. Travels in order after the message's `Rts`.
    Withdraw = 13,
    /// Across hosts, on a connection: "still here" (every quarter of the peer timeout; see
    /// `heartbeat`). Anything read from a connection counts; this is what an idle one sends.
    Ping = 16,
    /// "I lost world rank `tag`" (`check`: how, see `heartbeat::LossKind`), to the peers we
    /// are connected to, for a loss they cannot see themselves (a stopped or silent peer;
    /// a dead one's connections all break).
    Lost = 17,
}

/// Body length of an `Rts` frame.
pub const RTS_LEN: usize = 24;

/// The longest body a frame may announce (1 TiB): a length from the wire is checked against it
/// before anything is done with it (no message of a real job comes near it).
pub const MAX_BODY: u64 = 1 << 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub check: u32,
    pub ctx: u64,
    pub tag: u64,
    pub len: u64,
}

impl Header {
    pub fn data(ctx: u64, tag: u64, check: u32, len: usize) -> Header {
        Header { kind: FrameKind::Data, check, ctx, tag, len: len as u64 }
    }

    pub fn control(kind: FrameKind, ctx: u64) -> Header {
        Header { kind, check: 0, ctx, tag: 0, len: 0 }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = MAGIC;
        b[1] = self.kind as u8;
        b[4..8].copy_from_slice(&self.check.to_le_bytes());
        b[8..16].copy_from_slice(&self.ctx.to_le_bytes());
        b[16..24].copy_from_slice(&self.tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses a header; anything malformed is an error naming what came (the connection is
    /// then dropped).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header> {
        let bad = |what: String| Error::new(Status::PeerLost, format!("malformed frame header ({what})"));
        if b[0] != MAGIC {
            return Err(bad(format!("bad magic {:#04x}", b[0])));
        }
        let kind = match b[1] {
            1 => FrameKind::Data,
            2 => FrameKind::Abort,
            3 => FrameKind::Close,
            4 => FrameKind::Rts,
            5 => FrameKind::Fin,
            6 => FrameKind::Bell,
            7 => FrameKind::Cts,
            8 => FrameKind::Chunk,
            9 => FrameKind::Offer,
            10 => FrameKind::Pulled,
            11 => FrameKind::Credit,
            12 => FrameKind::Ask,
            13 => FrameKind::Withdraw,
            16 => FrameKind::Ping,
            17 => FrameKind::Lost,
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let h = Header {
            kind,
            check: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            ctx: u64_at(8),
            tag: u64_at(16),
            len: u64_at(24),
        };
        match h.kind {
            FrameKind::Data | FrameKind::Chunk | FrameKind::Pulled => {}
            FrameKind::Rts | FrameKind::Offer if h.len == RTS_LEN as u64 => {}
            FrameKind::Rts | FrameKind::Offer => return Err(bad(format!("an {:?} frame of {} bytes ({RTS_LEN} expected)", h.kind, h.len))),
            k if h.len != 0 => return Err(bad(format!("a {k:?} frame with a {}-byte body", h.len))),
            _ => {}
        }
        if h.len > MAX_BODY {
            return Err(bad(format!("a body of {} bytes, over the cap of {MAX_BODY}", h.len)));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects_garbage() {
        let h = Header::data(0xdead_beef_1234, 1 << 63 | 77, 0x0102_0304, 12345);
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut g = h.encode();
        g[0] = 0;
        assert!(Header::decode(&g).is_err());
        let mut g = h.encode();
        g[1] = 99;
        assert!(Header::decode(&g).is_err());
        let mut c = Header::control(FrameKind::Abort, 5).encode();
        c[24] = 1;
        assert!(Header::decode(&c).is_err());
    }
}
