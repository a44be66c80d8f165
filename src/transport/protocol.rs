//! The wire protocol of a data connection, sans-IO: a [`Decoder`] is fed the bytes a
//! connection delivered, in pieces of any size, and returns what they complete, one
//! [`Step`] at a time (a control frame, a single-copy announcement, the start and the pieces
//! of a message body); [`decode_record`] does the same for one record of a shared-memory ring.
//! Neither reads a socket, takes a lock or allocates: the socket transport (the I/O shell)
//! owns the bytes, decides where a body goes (a posted receive, an unexpected buffer, nowhere)
//! and carries the steps out. A body may also be read by the shell straight into its
//! destination ([`Decoder::body`], [`Decoder::body_read`]), so a large message is never copied
//! through a staging buffer.
//!
//! Nothing a peer sends is trusted: a header is checked whole before anything is done with it
//! (magic, kind, the body length a kind allows, at most [`MAX_BODY`]), and a peer that breaks
//! the protocol is lost, the error naming what it sent.

use super::frame::{FrameKind, Header, HEADER_LEN, RTS_LEN};
use crate::error::{Error, Result, Status};

pub use super::frame::MAX_BODY;

fn malformed(what: String) -> Error {
    Error::new(Status::PeerLost, format!("malformed frame: {what}"))
}

/// The body of an `Rts` frame: where a single-copy message lies in the sender's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rts {
    /// The sender's handle for our `Fin` (or `Cts`).
    pub cookie: u64,
    pub addr: u64,
    pub len: u64,
}

impl Rts {
    pub fn encode(&self) -> [u8; RTS_LEN] {
        let mut b = [0u8; RTS_LEN];
        b[..8].copy_from_slice(&self.cookie.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RTS_LEN]) -> Result<Rts> {
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let rts = Rts { cookie: word(0), addr: word(1), len: word(2) };
        if rts.len > MAX_BODY {
            return Err(malformed(format!("a single-copy announcement of {} bytes, over the cap of {MAX_BODY}", rts.len)));
        }
        Ok(rts)
    }
}

/// A frame the stream completed (bodies come apart, as [`Step::Body`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// A message starts; its `len` body bytes follow (none when it is empty).
    Data(Header),
    /// A single-copy message (see `cma`, `stream`).
    Rts(Header, Rts),
    /// The peer aborted communicator `ctx` (`code`: its reason).
    Abort { ctx: u64, code: u32 },
    /// The peer says goodbye.
    Close,
    /// Look at the shared-memory rings.
    Bell,
    /// The peer is done with our single-copy message `cookie`.
    Fin { cookie: u64, ok: bool },
    /// The peer asks us to stream our message `cookie` through the ring.
    Cts { cookie: u64 },
    /// The peer withdraws its single-copy message `cookie`.
    Withdraw { cookie: u64 },
    /// The peer lost world rank `rank` (`how`: see `heartbeat::LossKind`).
    Lost { rank: u64, how: u32 },
    /// A message offered, not sent (`Rts::addr` unused; see `flow`).
    Offer(Header, Rts),
    /// The body of an offered message starts (`tag`: its cookie); `len` bytes follow.
    Pulled(Header),
    /// The peer consumed `bytes` more of our eager messages.
    Credit { bytes: u64 },
    /// The peer asks for the first `want` bytes of our offered message `cookie`.
    Ask { cookie: u64, want: u64 },
}

/// What one call of [`Decoder::decode`] completed.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<'a> {
    Frame(Frame),
    /// Bytes `off..off + data.len()` of the body of data frame `hdr`; the body is complete
    /// when they reach `hdr.len`.
    Body { hdr: Header, off: usize, data: &'a [u8] },
}

/// Where the body being read stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyAt {
    pub hdr: Header,
    /// Body bytes read so far.
    pub off: usize,
}

impl BodyAt {
    pub fn len(&self) -> usize {
        self.hdr.len as usize
    }

    /// Body bytes still to come.
    pub fn left(&self) -> usize {
        self.len() - self.off
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    Header { buf: [u8; HEADER_LEN], got: usize },
    /// The body of an `Rts` or `Offer` frame.
    Rts { hdr: Header, buf: [u8; RTS_LEN], got: usize },
    /// The body of a data frame (never empty).
    Body(BodyAt),
}

const AT_HEADER: State = State::Header { buf: [0; HEADER_LEN], got: 0 };

/// The receiving end of a data connection's byte stream (see the module's comment).
#[derive(Debug, Clone, Copy)]
pub struct Decoder {
    state: State,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder { state: AT_HEADER }
    }

    /// Decodes from the front of `input`: how many bytes it took and what they completed
    /// (None: they were all taken and complete nothing yet). Call again with the rest. An
    /// error is final: the peer broke the protocol.
    pub fn decode<'a>(&mut self, input: &'a [u8]) -> Result<(usize, Option<Step<'a>>)> {
        match &mut self.state {
            State::Header { buf, got } => {
                let n = input.len().min(HEADER_LEN - *got);
                buf[*got..*got + n].copy_from_slice(&input[..n]);
                *got += n;
                if *got < HEADER_LEN {
                    return Ok((n, None));
                }
                let hdr = Header::decode(buf)?;
                Ok((n, self.on_header(hdr)?))
            }
            State::Rts { hdr, buf, got } => {
                let n = input.len().min(RTS_LEN - *got);
                buf[*got..*got + n].copy_from_slice(&input[..n]);
                *got += n;
                if *got < RTS_LEN {
                    return Ok((n, None));
                }
                let rts = Rts::decode(buf)?;
                let frame = if hdr.kind == FrameKind::Offer { Frame::Offer(*hdr, rts) } else { Frame::Rts(*hdr, rts) };
                self.state = AT_HEADER;
                Ok((n, Some(Step::Frame(frame))))
            }
            State::Body(at) => {
                let n = input.len().min(at.left());
                let step = Step::Body { hdr: at.hdr, off: at.off, data: &input[..n] };
                self.advance(n);
                Ok((n, Some(step)))
            }
        }
    }

    fn on_header(&mut self, hdr: Header) -> Result<Option<Step<'static>>> {
        let frame = match hdr.kind {
            FrameKind::Data | FrameKind::Pulled => {
                if hdr.len > 0 {
                    self.state = State::Body(BodyAt { hdr, off: 0 });
                } else {
                    self.state = AT_HEADER;
                }
                let frame = if hdr.kind == FrameKind::Data { Frame::Data(hdr) } else { Frame::Pulled(hdr) };
                return Ok(Some(Step::Frame(frame)));
            }
            FrameKind::Rts | FrameKind::Offer => {
                self.state = State::Rts { hdr, buf: [0; RTS_LEN], got: 0 };
                return Ok(None);
            }
            FrameKind::Chunk => {
                return Err(malformed(format!("a stream chunk of {} bytes came over the socket (chunks go through the ring only)", hdr.len)));
            }
            FrameKind::Ping => {
                // Liveness only: that bytes came is what counts (see `heartbeat`).
                self.state = AT_HEADER;
                return Ok(None);
            }
            FrameKind::Abort => Frame::Abort { ctx: hdr.ctx, code: hdr.check },
            FrameKind::Close => Frame::Close,
            FrameKind::Lost => Frame::Lost { rank: hdr.tag, how: hdr.check },
            FrameKind::Bell => Frame::Bell,
            FrameKind::Fin => Frame::Fin { cookie: hdr.tag, ok: hdr.check == 0 },
            FrameKind::Cts => Frame::Cts { cookie: hdr.tag },
            FrameKind::Withdraw => Frame::Withdraw { cookie: hdr.tag },
            FrameKind::Credit => Frame::Credit { bytes: hdr.tag },
            FrameKind::Ask => Frame::Ask { cookie: hdr.tag, want: hdr.ctx },
        };
        self.state = AT_HEADER;
        Ok(Some(Step::Frame(frame)))
    }

    /// The data body being read, if one is: the shell may read its next bytes straight into
    /// their destination and report them with [`Decoder::body_read`].
    pub fn body(&self) -> Option<BodyAt> {
        match self.state {
            State::Body(at) => Some(at),
            _ => None,
        }
    }

    /// Bytes of the next header still to come, when one is being read (None: in a body).
    pub fn header_left(&self) -> Option<usize> {
        match self.state {
            State::Header { got, .. } => Some(HEADER_LEN - got),
            _ => None,
        }
    }

    /// The shell read `n` more bytes of the current body itself; where the body stands now
    /// (complete when `off == len`; the decoder then waits for the next header).
    ///
    /// # Panics
    /// If no body is being read or `n` is more than is left of it (the shell's bug).
    pub fn body_read(&mut self, n: usize) -> BodyAt {
        let State::Body(at) = self.state else { panic!("body_read without a body") };
        assert!(n <= at.left(), "body_read past the body's end");
        self.advance(n);
        BodyAt { off: at.off + n, ..at }
    }

    fn advance(&mut self, n: usize) {
        if let State::Body(at) = &mut self.state {
            at.off += n;
            if at.off == at.len() {
                self.state = AT_HEADER;
            }
        }
    }
}

/// One record of a shared-memory ring: a frame and its body in one piece.
#[derive(Debug, PartialEq, Eq)]
pub enum Record<'a> {
    Data(Header, &'a [u8]),
    Rts(Header, Rts),
    /// Bytes of the message `cookie` streamed to us (see `stream`).
    Chunk { cookie: u64, data: &'a [u8] },
    Cts { cookie: u64 },
    Fin { cookie: u64, ok: bool },
    Withdraw { cookie: u64 },
}

/// Decodes a ring record (a header and its body, padded to the ring's alignment). Only the
/// frames that travel in a ring are accepted.
pub fn decode_record(rec: &[u8]) -> Result<Record<'_>> {
    let bad = |what: String| Error::new(Status::PeerLost, format!("malformed frame in the shared-memory ring: {what}"));
    let Some(h) = rec.get(..HEADER_LEN) else {
        return Err(bad(format!("a record of {} bytes, shorter than a frame header", rec.len())));
    };
    let hdr = Header::decode(h.try_into().expect("HEADER_LEN bytes")).map_err(|e| bad(e.msg))?;
    let body = &rec[HEADER_LEN..];
    let short = || bad(format!("a {:?} frame of {} bytes in a record with {} bytes after the header", hdr.kind, hdr.len, body.len()));
    let sized = |len: u64| body.get(..len as usize).ok_or_else(short);
    Ok(match hdr.kind {
        FrameKind::Data => Record::Data(hdr, sized(hdr.len)?),
        FrameKind::Chunk => Record::Chunk { cookie: hdr.tag, data: sized(hdr.len)? },
        FrameKind::Rts => Record::Rts(hdr, Rts::decode(sized(RTS_LEN as u64)?.try_into().expect("RTS_LEN bytes")).map_err(|e| bad(e.msg))?),
        FrameKind::Cts => Record::Cts { cookie: hdr.tag },
        FrameKind::Fin => Record::Fin { cookie: hdr.tag, ok: hdr.check == 0 },
        FrameKind::Withdraw => Record::Withdraw { cookie: hdr.tag },
        k => return Err(bad(format!("a {k:?} frame, which never goes through a ring"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a stream decodes to, in a form that does not depend on how it was split: frames,
    /// and each data frame's body joined.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Frame(Frame),
        Body(u64, Vec<u8>),
    }

    fn record(seen: &mut Vec<Seen>, step: Step<'_>) {
        match step {
            Step::Frame(f) => {
                if let Frame::Data(h) | Frame::Pulled(h) = f {
                    seen.push(Seen::Frame(f));
                    seen.push(Seen::Body(h.tag, Vec::new()));
                } else {
                    seen.push(Seen::Frame(f));
                }
            }
            Step::Body { hdr, off, data } => {
                let Some(Seen::Body(tag, body)) = seen.last_mut() else { panic!("a body without its header") };
                assert_eq!(*tag, hdr.tag);
                assert_eq!(body.len(), off, "body bytes out of order");
                body.extend_from_slice(data);
                assert!(body.len() <= hdr.len as usize);
            }
        }
    }

    /// Feeds `pieces` one after another; the error if one came.
    fn feed(pieces: &[&[u8]]) -> (Vec<Seen>, Option<Error>) {
        let mut d = Decoder::new();
        let mut seen = Vec::new();
        for p in pieces {
            let mut rest = *p;
            while !rest.is_empty() {
                match d.decode(rest) {
                    Ok((n, step)) => {
                        assert!(n > 0 || step.is_some(), "no progress");
                        rest = &rest[n..];
                        if let Some(s) = step {
                            record(&mut seen, s);
                        }
                    }
                    Err(e) => return (seen, Some(e)),
                }
            }
        }
        assert!(d.body().is_none(), "stream ended inside a body");
        (seen, None)
    }

    fn data(ctx: u64, tag: u64, body: &[u8]) -> Vec<u8> {
        let mut v = Header::data(ctx, tag, 7, body.len()).encode().to_vec();
        v.extend_from_slice(body);
        v
    }

    fn control(kind: FrameKind, ctx: u64, tag: u64, check: u32) -> Vec<u8> {
        Header { tag, check, ..Header::control(kind, ctx) }.encode().to_vec()
    }

    fn rts(ctx: u64, tag: u64, r: Rts) -> Vec<u8> {
        let mut v = Header { kind: FrameKind::Rts, check: 3, ctx, tag, len: RTS_LEN as u64 }.encode().to_vec();
        v.extend_from_slice(&r.encode());
        v
    }

    /// Back-to-back frames of every kind a socket carries, empty and non-empty bodies.
    fn stream() -> (Vec<u8>, Vec<Seen>) {
        let body: Vec<u8> = (0..100u8).collect();
        let r = Rts { cookie: 9, addr: 0x7fff_0000, len: 1 << 20 };
        let parts = [
            data(1, 10, &body),
            data(1, 11, &[]),
            control(FrameKind::Abort, 5, 0, 1),
            rts(2, 12, r),
            control(FrameKind::Fin, 0, 9, 1),
            control(FrameKind::Cts, 0, 8, 0),
            control(FrameKind::Withdraw, 0, 6, 0),
            control(FrameKind::Bell, 0, 0, 0),
            control(FrameKind::Ping, 0, 0, 0),
            control(FrameKind::Lost, 0, 7, 2),
            data(3, 13, &[42]),
            control(FrameKind::Close, 0, 0, 0),
        ];
        let hdr = |ctx, tag, len| Header::data(ctx, tag, 7, len);
        let want = vec![
            Seen::Frame(Frame::Data(hdr(1, 10, 100))),
            Seen::Body(10, body.clone()),
            Seen::Frame(Frame::Data(hdr(1, 11, 0))),
            Seen::Body(11, vec![]),
            Seen::Frame(Frame::Abort { ctx: 5, code: 1 }),
            Seen::Frame(Frame::Rts(Header { kind: FrameKind::Rts, check: 3, ctx: 2, tag: 12, len: RTS_LEN as u64 }, r)),
            Seen::Frame(Frame::Fin { cookie: 9, ok: false }),
            Seen::Frame(Frame::Cts { cookie: 8 }),
            Seen::Frame(Frame::Withdraw { cookie: 6 }),
            Seen::Frame(Frame::Bell),
            Seen::Frame(Frame::Lost { rank: 7, how: 2 }),
            Seen::Frame(Frame::Data(hdr(3, 13, 1))),
            Seen::Body(13, vec![42]),
            Seen::Frame(Frame::Close),
        ];
        (parts.concat(), want)
    }

    #[test]
    fn back_to_back_frames_decode_whole() {
        let (bytes, want) = stream();
        let (seen, err) = feed(&[&bytes]);
        assert!(err.is_none());
        assert_eq!(seen, want);
    }

    #[test]
    fn a_stream_split_at_every_byte_boundary_decodes_the_same() {
        let (bytes, want) = stream();
        for cut in 0..=bytes.len() {
            let (seen, err) = feed(&[&bytes[..cut], &bytes[cut..]]);
            assert!(err.is_none(), "cut at {cut}");
            assert_eq!(seen, want, "cut at {cut}");
        }
        for a in (0..bytes.len()).step_by(7) {
            for b in a..=bytes.len() {
                let (seen, _) = feed(&[&bytes[..a], &bytes[a..b], &bytes[b..]]);
                assert_eq!(seen, want, "cuts at {a} and {b}");
            }
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(feed(&singles).0, want, "one byte at a time");
    }

    #[test]
    fn a_body_read_by_the_shell_itself_resumes_at_the_next_header() {
        let body = vec![5u8; 1000];
        let bytes = [data(1, 1, &body), control(FrameKind::Bell, 0, 0, 0)].concat();
        let mut d = Decoder::new();
        let (n, step) = d.decode(&bytes[..HEADER_LEN + 10]).unwrap();
        assert_eq!((n, step), (HEADER_LEN, Some(Step::Frame(Frame::Data(Header::data(1, 1, 7, 1000))))));
        let (n, step) = d.decode(&bytes[HEADER_LEN..HEADER_LEN + 10]).unwrap();
        assert_eq!(n, 10);
        assert!(matches!(step, Some(Step::Body { off: 0, .. })));
        // The shell reads the next 990 bytes straight into the receive.
        assert_eq!(d.body().map(|b| (b.off, b.left())), Some((10, 990)));
        let at = d.body_read(500);
        assert_eq!((at.off, at.left()), (510, 490));
        assert_eq!(d.body_read(490).left(), 0);
        assert!(d.body().is_none());
        let (_, step) = d.decode(&bytes[HEADER_LEN + 1000..]).unwrap();
        assert_eq!(step, Some(Step::Frame(Frame::Bell)));
    }

    /// A small deterministic generator (xorshift), so a failure names its seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn random_streams_cut_at_random_places_decode_the_same() {
        for seed in 1..200u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let mut bytes = Vec::new();
            for f in 0..rng.below(20) + 1 {
                match rng.below(4) {
                    0 => {
                        let body: Vec<u8> = (0..rng.below(3000)).map(|i| (i * 7 + f) as u8).collect();
                        bytes.extend(data(f as u64, rng.next(), &body));
                    }
                    1 => bytes.extend(rts(1, 2, Rts { cookie: rng.next(), addr: rng.next(), len: rng.next() % MAX_BODY })),
                    2 => bytes.extend(control(FrameKind::Fin, 0, rng.next(), rng.next() as u32 & 1)),
                    _ => bytes.extend(control(FrameKind::Bell, 0, 0, 0)),
                }
            }
            let (want, err) = feed(&[&bytes]);
            assert!(err.is_none(), "seed {seed}");
            let mut pieces = Vec::new();
            let mut at = 0;
            while at < bytes.len() {
                let n = (rng.below(64) + 1).min(bytes.len() - at);
                pieces.push(&bytes[at..at + n]);
                at += n;
            }
            assert_eq!(feed(&pieces).0, want, "seed {seed}");
        }
    }

    #[test]
    fn garbage_never_panics_and_never_runs_past_a_body() {
        for seed in 1..300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
            // Mostly valid frames with a byte changed here and there, so decoding gets deep.
            let mut bytes = [data(1, 2, &[9; 40]), control(FrameKind::Cts, 0, 5, 0), rts(3, 4, Rts { cookie: 1, addr: 2, len: 3 })].concat();
            for _ in 0..rng.below(4) {
                let i = rng.below(bytes.len());
                bytes[i] = rng.next() as u8;
            }
            let mut d = Decoder::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                match d.decode(rest) {
                    Ok((n, step)) => {
                        if let Some(Step::Body { hdr, off, data }) = step {
                            assert!(off + data.len() <= hdr.len as usize, "seed {seed}");
                        }
                        rest = &rest[n..];
                    }
                    Err(e) => {
                        assert_eq!(e.status, Status::PeerLost, "seed {seed}");
                        break;
                    }
                }
            }
        }
    }

    fn refused(bytes: &[u8]) -> String {
        let (_, err) = feed(&[bytes]);
        let e = err.unwrap_or_else(|| panic!("accepted {bytes:?}"));
        assert_eq!(e.status, Status::PeerLost);
        e.msg
    }

    #[test]
    fn malformed_headers_lose_the_peer_and_name_what_it_sent() {
        let mut b = data(1, 1, &[]);
        b[0] = 0x17;
        assert!(refused(&b).contains("0x17"), "{}", refused(&b));
        let mut b = data(1, 1, &[]);
        b[1] = 99;
        assert!(refused(&b).contains("99"));
        let mut b = control(FrameKind::Fin, 0, 1, 0);
        b[24] = 5;
        assert!(refused(&b).contains("5-byte body"), "{}", refused(&b));
        let mut b = rts(1, 1, Rts { cookie: 1, addr: 1, len: 1 });
        b[24] = 23;
        assert!(refused(&b).contains("23"));
        let chunk = Header { kind: FrameKind::Chunk, check: 0, ctx: 0, tag: 1, len: 4 }.encode();
        assert!(refused(&chunk).contains("chunk"));
        // Good frames first: what came before the bad one is still delivered.
        let bytes = [data(1, 2, &[1, 2]), vec![0; HEADER_LEN]].concat();
        let (seen, err) = feed(&[&bytes]);
        assert_eq!(seen.len(), 2);
        assert!(err.is_some());
    }

    #[test]
    fn lengths_from_the_wire_are_capped_before_anything_is_done_with_them() {
        for len in [MAX_BODY + 1, isize::MAX as u64, u64::MAX] {
            let h = Header { kind: FrameKind::Data, check: 0, ctx: 1, tag: 1, len };
            let msg = refused(&h.encode());
            assert!(msg.contains(&len.to_string()), "{msg}");
        }
        let msg = refused(&rts(1, 1, Rts { cookie: 1, addr: 1, len: u64::MAX }));
        assert!(msg.contains(&u64::MAX.to_string()), "{msg}");
        // At the cap: accepted, and the decoder holds nothing for it (the shell grows its
        // buffer with the bytes that arrive).
        let mut d = Decoder::new();
        let at_cap = Header::data(1, 1, 0, MAX_BODY as usize).encode();
        let (_, step) = d.decode(&at_cap).unwrap();
        assert!(matches!(step, Some(Step::Frame(Frame::Data(_)))));
        assert_eq!(d.body().unwrap().left(), MAX_BODY as usize);
        assert!(std::mem::size_of::<Decoder>() < 128);
    }

    #[test]
    fn flow_control_frames_decode_whole_at_every_split() {
        let offer = Rts { cookie: 9, addr: 0, len: 1 << 30 };
        let mut offer_frame = Header { kind: FrameKind::Offer, check: 3, ctx: 1, tag: 2, len: RTS_LEN as u64 }.encode().to_vec();
        offer_frame.extend_from_slice(&offer.encode());
        let mut pulled = Header { kind: FrameKind::Pulled, check: 0, ctx: 1, tag: 9, len: 5 }.encode().to_vec();
        pulled.extend_from_slice(&[1, 2, 3, 4, 5]);
        let stream = [offer_frame, pulled, control(FrameKind::Credit, 0, 4096, 0), control(FrameKind::Ask, 77, 9, 0)].concat();
        for cut in 0..stream.len() {
            let (seen, err) = feed(&[&stream[..cut], &stream[cut..]]);
            assert!(err.is_none(), "cut at {cut}");
            assert!(matches!(seen[0], Seen::Frame(Frame::Offer(h, r)) if h.tag == 2 && r == offer), "cut at {cut}: {seen:?}");
            assert!(matches!(seen[1], Seen::Frame(Frame::Pulled(h)) if h.tag == 9 && h.len == 5));
            let body: Vec<u8> = stream[HEADER_LEN * 2 + RTS_LEN..HEADER_LEN * 2 + RTS_LEN + 5].to_vec();
            assert_eq!(seen.iter().filter_map(|s| if let Seen::Body(9, b) = s { Some(b.clone()) } else { None }).next(), Some(body));
            assert!(seen.contains(&Seen::Frame(Frame::Credit { bytes: 4096 })));
            assert!(seen.contains(&Seen::Frame(Frame::Ask { cookie: 9, want: 77 })));
        }
        // An offer with a body of the wrong size, or over the cap, loses the peer.
        let mut bad = Header { kind: FrameKind::Offer, check: 0, ctx: 1, tag: 2, len: 8 }.encode().to_vec();
        bad.extend_from_slice(&[0; 8]);
        assert!(feed(&[&bad]).1.is_some());
        let mut huge = Header { kind: FrameKind::Offer, check: 0, ctx: 1, tag: 2, len: RTS_LEN as u64 }.encode().to_vec();
        huge.extend_from_slice(&Rts { cookie: 1, addr: 0, len: u64::MAX }.encode());
        assert!(feed(&[&huge]).1.unwrap().msg.contains("cap"));
    }

    #[test]
    fn ring_records_decode_with_their_bodies() {
        let mut rec = data(4, 5, &[1, 2, 3]);
        rec.resize(64, 0xee); // padding to the ring's alignment
        assert_eq!(decode_record(&rec).unwrap(), Record::Data(Header::data(4, 5, 7, 3), &[1, 2, 3]));
        let mut chunk = Header { kind: FrameKind::Chunk, check: 0, ctx: 0, tag: 77, len: 2 }.encode().to_vec();
        chunk.extend_from_slice(&[8, 9]);
        assert_eq!(decode_record(&chunk).unwrap(), Record::Chunk { cookie: 77, data: &[8, 9] });
        let r = Rts { cookie: 3, addr: 4, len: 5 };
        assert!(matches!(decode_record(&rts(1, 2, r)).unwrap(), Record::Rts(_, got) if got == r));
        assert_eq!(decode_record(&control(FrameKind::Cts, 0, 6, 0)).unwrap(), Record::Cts { cookie: 6 });
        assert_eq!(decode_record(&control(FrameKind::Fin, 0, 6, 0)).unwrap(), Record::Fin { cookie: 6, ok: true });
        assert_eq!(decode_record(&control(FrameKind::Withdraw, 0, 6, 0)).unwrap(), Record::Withdraw { cookie: 6 });
    }

    #[test]
    fn malformed_ring_records_are_refused() {
        let bad = |rec: &[u8]| decode_record(rec).expect_err("accepted").msg;
        assert!(bad(&[0; 10]).contains("10 bytes"));
        assert!(bad(&control(FrameKind::Close, 0, 0, 0)).contains("never goes through a ring"));
        assert!(bad(&control(FrameKind::Abort, 0, 0, 0)).contains("Abort"));
        let short = &data(1, 1, &[1, 2, 3, 4])[..HEADER_LEN + 2];
        assert!(bad(short).contains("2 bytes after the header"), "{}", bad(short));
        let mut r = rts(1, 1, Rts { cookie: 1, addr: 1, len: 1 });
        r.truncate(HEADER_LEN + 8);
        assert!(bad(&r).contains("Rts"));
        let huge = Header { kind: FrameKind::Data, check: 0, ctx: 1, tag: 1, len: u64::MAX }.encode();
        assert!(bad(&huge).contains("cap"));
    }
}
