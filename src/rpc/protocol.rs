//! The RPC wire protocol, sans-IO: what travels on the agent's private communicator context,
//! how tags are laid out, how lengths are validated before anything is allocated, the worker
//! record exchanged at init, and the shutdown quiescence rule. The agent feeds it bytes and counts.
//!
//! A call is four messages on the RPC context (tags below the collective bit):
//!
//! ```text
//! caller -> callee  tag REQ_HEADER          32-byte header: Request, call id, name_len, payload_len
//! caller -> callee  tag REQ_BODY | call id  function name bytes ++ request payload (exact length)
//! callee -> caller  tag REP_HEADER          32-byte header: Reply, call id, status, payload_len
//! callee -> caller  tag REP_BODY | call id  reply payload, or the error text (exact length)
//! ```
//!
//! Headers share one tag so a listener thread can receive them from any source; bodies carry the
//! call id in their tag, so the transport's matching pairs each body with its header's call.

use crate::error::{Error, Result, Status};

/// Bytes in every RPC header.
pub const HEADER_LEN: usize = 32;
const MAGIC: u8 = 0xD7;
const VERSION: u8 = 1;

/// Longest worker name in bytes (`dc_worker_info.name` is `char[64]` with its NUL).
pub const MAX_WORKER_NAME: usize = 63;
/// Longest function name in bytes.
pub const MAX_FUNCTION_NAME: usize = 255;
/// Default limit on a request or reply payload: 1 GiB (`DC_RPC_MAX_BYTES` changes it).
pub const DEFAULT_MAX_BYTES: usize = 1 << 30;

/// Call ids live in the low 56 bits of a body tag.
pub const ID_MASK: u64 = (1 << 56) - 1;

/// The classes of RPC messages, in the top byte of their tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TagClass {
    ReqHeader = 1,
    RepHeader = 2,
    ReqBody = 3,
    RepBody = 4,
    /// Never sent: a receive on this tag from each peer fails when the peer is lost.
    Watch = 5,
}

/// The tag of a message of `class` for call `id` (headers and watches use id 0).
pub fn tag(class: TagClass, id: u64) -> u64 {
    ((class as u64) << 56) | (id & ID_MASK)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Request = 1,
    Reply = 2,
    /// Sent by an agent to its own listeners to stop them.
    Stop = 3,
}

/// How a call ended on the callee (reply headers only). Unknown values read as `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyStatus {
    /// The body is the handler's reply.
    Ok,
    /// The handler returned a failure; the body is its text.
    HandlerFailed,
    /// No handler of that name; the body says so.
    UnknownFunction,
    /// The request or the reply exceeded a size limit; the body says which.
    TooLarge,
    /// The callee hit an internal error (e.g. a panicking handler); the body says what.
    Internal,
    /// A status this version does not know.
    Other(u8),
}

impl ReplyStatus {
    pub fn to_u8(self) -> u8 {
        match self {
            ReplyStatus::Ok => 0,
            ReplyStatus::HandlerFailed => 1,
            ReplyStatus::UnknownFunction => 2,
            ReplyStatus::TooLarge => 3,
            ReplyStatus::Internal => 4,
            ReplyStatus::Other(v) => v,
        }
    }

    pub fn from_u8(v: u8) -> ReplyStatus {
        match v {
            0 => ReplyStatus::Ok,
            1 => ReplyStatus::HandlerFailed,
            2 => ReplyStatus::UnknownFunction,
            3 => ReplyStatus::TooLarge,
            4 => ReplyStatus::Internal,
            v => ReplyStatus::Other(v),
        }
    }
}

/// One RPC header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub status: ReplyStatus,
    /// Requests: bytes of the function name at the start of the body. Replies: 0.
    pub name_len: u32,
    pub call_id: u64,
    /// Bytes of the payload (request, reply or error text).
    pub payload_len: u64,
}

impl Header {
    pub fn request(call_id: u64, name_len: usize, payload_len: usize) -> Header {
        Header { kind: Kind::Request, status: ReplyStatus::Ok, name_len: name_len as u32, call_id, payload_len: payload_len as u64 }
    }

    pub fn reply(call_id: u64, status: ReplyStatus, payload_len: usize) -> Header {
        Header { kind: Kind::Reply, status, name_len: 0, call_id, payload_len: payload_len as u64 }
    }

    pub fn stop() -> Header {
        Header { kind: Kind::Stop, status: ReplyStatus::Ok, name_len: 0, call_id: 0, payload_len: 0 }
    }

    /// Little endian: magic u8, version u8, kind u8, status u8, name_len u32, call_id u64,
    /// payload_len u64, reserved u64 (zero).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = MAGIC;
        b[1] = VERSION;
        b[2] = self.kind as u8;
        b[3] = self.status.to_u8();
        b[4..8].copy_from_slice(&self.name_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.call_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.payload_len.to_le_bytes());
        b
    }

    /// Parses a header of exactly `HEADER_LEN` bytes; anything else is an error.
    pub fn decode(b: &[u8]) -> Result<Header> {
        let bad = |what: String| Error::new(Status::Internal, format!("malformed RPC header: {what}"));
        if b.len() != HEADER_LEN {
            return Err(bad(format!("{} bytes instead of {HEADER_LEN}", b.len())));
        }
        if b[0] != MAGIC {
            return Err(bad(format!("bad magic {:#x}", b[0])));
        }
        if b[1] != VERSION {
            return Err(bad(format!("protocol version {} (this library speaks {VERSION})", b[1])));
        }
        let kind = match b[2] {
            1 => Kind::Request,
            2 => Kind::Reply,
            3 => Kind::Stop,
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let h = Header {
            kind,
            status: ReplyStatus::from_u8(b[3]),
            name_len: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            call_id: u64_at(8),
            payload_len: u64_at(16),
        };
        if h.call_id & !ID_MASK != 0 {
            return Err(bad(format!("call id {:#x} out of range", h.call_id)));
        }
        if kind != Kind::Request && h.name_len != 0 {
            return Err(bad("a function name outside a request".into()));
        }
        Ok(h)
    }

    /// The body length a request announces, once its lengths are within `max_bytes` and the
    /// name limit. The caller allocates the body only after this check.
    pub fn request_body_len(&self, max_bytes: usize) -> std::result::Result<usize, String> {
        let name = self.name_len as usize;
        if name == 0 || name > MAX_FUNCTION_NAME {
            return Err(format!("function name of {name} bytes (allowed: 1 to {MAX_FUNCTION_NAME})"));
        }
        let payload = usize::try_from(self.payload_len).ok().filter(|&p| p <= max_bytes).ok_or_else(|| too_large("request", self.payload_len, max_bytes))?;
        name.checked_add(payload).ok_or_else(|| too_large("request", self.payload_len, max_bytes))
    }

    /// The body length a reply announces, if within `max_bytes`.
    pub fn reply_body_len(&self, max_bytes: usize) -> std::result::Result<usize, String> {
        usize::try_from(self.payload_len).ok().filter(|&p| p <= max_bytes).ok_or_else(|| too_large("reply", self.payload_len, max_bytes))
    }
}

/// The message for a payload over the limit.
pub fn too_large(what: &str, len: u64, max_bytes: usize) -> String {
    format!("{what} of {len} bytes exceeds the limit of {max_bytes} bytes (DC_RPC_MAX_BYTES)")
}

/// The body of a request: the function name, then the payload.
pub fn request_body(function: &str, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(function.len() + payload.len());
    b.extend_from_slice(function.as_bytes());
    b.extend_from_slice(payload);
    b
}

/// Splits a received request body into function name and payload.
pub fn split_request(h: &Header, body: &[u8]) -> std::result::Result<(String, std::ops::Range<usize>), String> {
    let n = h.name_len as usize;
    if body.len() < n || (body.len() - n) as u64 != h.payload_len {
        return Err(format!("request body of {} bytes does not match its header", body.len()));
    }
    let name = std::str::from_utf8(&body[..n]).map_err(|_| "function name is not valid UTF-8".to_string())?;
    Ok((name.to_string(), n..body.len()))
}

/// Checks a worker or function name: 1 to `max` bytes (no NUL, which C strings cannot hold).
pub fn check_name(name: &str, what: &str, max: usize) -> Result<()> {
    if name.is_empty() || name.len() > max || name.contains('\0') {
        return Err(Error::new(Status::InvalidArgument, format!("{what} {name:?} must be 1 to {max} bytes long")));
    }
    Ok(())
}

/// Reads `DC_RPC_MAX_BYTES`: a positive number of bytes; unset or empty means 1 GiB.
pub fn max_bytes_from(value: Option<&str>) -> Result<usize> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else { return Ok(DEFAULT_MAX_BYTES) };
    v.parse::<u64>()
        .ok()
        .filter(|&n| n > 0 && n <= isize::MAX as u64)
        .map(|n| n as usize)
        .ok_or_else(|| Error::new(Status::InvalidArgument, format!("DC_RPC_MAX_BYTES={v:?} is not a positive number of bytes")))
}

// ---- worker records ----------------------------------------------------------------------------

/// What each worker publishes at init: its name and its data address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRecord {
    pub name: String,
    pub host: String,
    pub port: u16,
}

/// Bytes of an encoded `WorkerRecord`: name[64], host[64], port u16, padding.
pub const RECORD_LEN: usize = 136;

impl WorkerRecord {
    /// Fixed size; `name` must already be checked, `host` is cut to 63 bytes.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        let n = self.name.len().min(63);
        b[..n].copy_from_slice(&self.name.as_bytes()[..n]);
        let mut h = self.host.len().min(63);
        while !self.host.is_char_boundary(h) {
            h -= 1;
        }
        b[64..64 + h].copy_from_slice(&self.host.as_bytes()[..h]);
        b[128..130].copy_from_slice(&self.port.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<WorkerRecord> {
        if b.len() != RECORD_LEN {
            return Err(Error::new(Status::Internal, "malformed worker record"));
        }
        let text = |s: &[u8]| {
            let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
            String::from_utf8_lossy(&s[..end]).into_owned()
        };
        Ok(WorkerRecord { name: text(&b[..64]), host: text(&b[64..128]), port: u16::from_le_bytes([b[128], b[129]]) })
    }
}

/// For each rank of the allgathered records: `None` if its name is unique so far, or the first
/// rank that holds the same name (the first holder keeps it, later ones are duplicates).
pub fn duplicates(records: &[WorkerRecord]) -> Vec<Option<usize>> {
    records.iter().enumerate().map(|(i, r)| records[..i].iter().position(|q| q.name == r.name)).collect()
}

// ---- shutdown ----------------------------------------------------------------------------------

/// One worker's cumulative counters, compared across workers at shutdown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests this worker sent.
    pub issued: u64,
    /// Requests this worker received and finished with (reply sent, or dropped).
    pub served: u64,
    /// Calls of this worker that ended (reply routed, timeout, peer lost).
    pub finished: u64,
    /// 1 when this worker's shutdown deadline has passed.
    pub expired: u64,
}

impl Counters {
    pub const WORDS: usize = 4;

    pub fn to_words(self) -> [u64; 4] {
        [self.issued, self.served, self.finished, self.expired]
    }

    pub fn from_words(w: &[u64]) -> Counters {
        Counters { issued: w[0], served: w[1], finished: w[2], expired: w[3] }
    }
}

/// What a shutdown round decides, the same on every worker (they all see the same counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// Nothing is in flight anywhere, and nothing moved since the previous round: stop.
    Quiet,
    /// Some worker ran out of time.
    Expired,
    /// Calls are still in flight: another round.
    Busy,
}

/// Counters are monotone and every round's snapshots are taken after all of the previous
/// round's (the allgather orders them), so counters unchanged over two rounds were unchanged at
/// one instant between them; if then every request sent was served and every call ended,
/// nothing was in flight at that instant and nothing can start afterwards (handlers only run
/// for requests, and user calls are refused once shutdown began).
pub fn shutdown_round(prev: Option<&[Counters]>, cur: &[Counters]) -> Round {
    if cur.iter().any(|c| c.expired != 0) {
        return Round::Expired;
    }
    let sum = |f: fn(&Counters) -> u64| cur.iter().map(f).fold(0u64, u64::wrapping_add);
    let balanced = sum(|c| c.issued) == sum(|c| c.served) && sum(|c| c.issued) == sum(|c| c.finished);
    if balanced && prev == Some(cur) {
        Round::Quiet
    } else {
        Round::Busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_garbage_is_refused() {
        let h = Header::request(77, 5, 1 << 40);
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let r = Header::reply(ID_MASK, ReplyStatus::HandlerFailed, 3);
        assert_eq!(Header::decode(&r.encode()).unwrap(), r);
        assert_eq!(Header::decode(&Header::stop().encode()).unwrap().kind, Kind::Stop);
        let unknown = {
            let mut b = r.encode();
            b[3] = 200;
            Header::decode(&b).unwrap()
        };
        assert_eq!(unknown.status, ReplyStatus::Other(200));
        for (i, v) in [(0usize, 0u8), (1, 9), (2, 0), (2, 4)] {
            let mut b = h.encode();
            b[i] = v;
            assert!(Header::decode(&b).is_err(), "byte {i} = {v} accepted");
        }
        assert!(Header::decode(&h.encode()[..31]).is_err());
        let mut b = r.encode();
        b[4] = 1; // a name length in a reply
        assert!(Header::decode(&b).is_err());
        let mut b = h.encode();
        b[15] = 1; // call id beyond 56 bits
        assert!(Header::decode(&b).is_err());
    }

    #[test]
    fn lengths_are_checked_before_allocation() {
        let max = 1000;
        assert_eq!(Header::request(1, 3, 1000).request_body_len(max), Ok(1003));
        assert!(Header::request(1, 3, 1001).request_body_len(max).unwrap_err().contains("exceeds"));
        assert!(Header::request(1, 0, 1).request_body_len(max).is_err());
        assert!(Header::request(1, MAX_FUNCTION_NAME + 1, 1).request_body_len(max).is_err());
        let mut huge = Header::request(1, 3, 0);
        huge.payload_len = u64::MAX;
        assert!(huge.request_body_len(usize::MAX).is_err(), "name + payload must not overflow");
        assert!(huge.request_body_len(max).is_err());
        assert_eq!(Header::reply(1, ReplyStatus::Ok, 10).reply_body_len(10), Ok(10));
        assert!(Header::reply(1, ReplyStatus::Ok, 11).reply_body_len(10).is_err());
    }

    #[test]
    fn request_bodies_split() {
        let body = request_body("echo", b"xyz");
        let h = Header::request(4, 4, 3);
        let (name, range) = split_request(&h, &body).unwrap();
        assert_eq!((name.as_str(), &body[range]), ("echo", &b"xyz"[..]));
        assert!(split_request(&Header::request(4, 4, 2), &body).is_err());
        assert!(split_request(&Header::request(4, 2, 0), &[0xff, 0xfe]).is_err());
    }

    #[test]
    fn tags_stay_below_the_collective_bit_and_apart() {
        let t = tag(TagClass::RepBody, u64::MAX);
        assert!(t < crate::transport::ops::COLL_TAG_BIT);
        assert_eq!(t >> 56, TagClass::RepBody as u64);
        assert_ne!(tag(TagClass::ReqBody, 5), tag(TagClass::RepBody, 5));
        assert_ne!(tag(TagClass::ReqHeader, 0), tag(TagClass::RepHeader, 0));
    }

    #[test]
    fn names_and_limits() {
        assert!(check_name("w", "worker name", MAX_WORKER_NAME).is_ok());
        assert!(check_name("", "worker name", MAX_WORKER_NAME).is_err());
        assert!(check_name(&"x".repeat(64), "worker name", MAX_WORKER_NAME).is_err());
        assert!(check_name(&"x".repeat(63), "worker name", MAX_WORKER_NAME).is_ok());
        assert_eq!(max_bytes_from(None).unwrap(), DEFAULT_MAX_BYTES);
        assert_eq!(max_bytes_from(Some(" ")).unwrap(), DEFAULT_MAX_BYTES);
        assert_eq!(max_bytes_from(Some("4096")).unwrap(), 4096);
        for bad in ["0", "-1", "1G", "99999999999999999999"] {
            assert_eq!(max_bytes_from(Some(bad)).unwrap_err().status, Status::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn worker_records_and_duplicates() {
        let r = WorkerRecord { name: "trainer-0".into(), host: "10.1.2.3".into(), port: 4242 };
        assert_eq!(WorkerRecord::decode(&r.encode()).unwrap(), r);
        let long = WorkerRecord { name: "n".into(), host: "é".repeat(40), port: 1 };
        let back = WorkerRecord::decode(&long.encode()).unwrap();
        assert!(back.host.len() <= 63 && long.host.starts_with(&back.host));
        let recs: Vec<WorkerRecord> = ["a", "b", "a", "c", "b"].iter().map(|n| WorkerRecord { name: n.to_string(), host: String::new(), port: 0 }).collect();
        assert_eq!(duplicates(&recs), vec![None, None, Some(0), None, Some(1)]);
    }

    #[test]
    fn shutdown_needs_two_equal_balanced_rounds() {
        let c = |issued, served, finished| Counters { issued, served, finished, expired: 0 };
        let busy = [c(3, 1, 2), c(1, 3, 1)];
        assert_eq!(shutdown_round(None, &busy), Round::Busy);
        let quiet = [c(3, 1, 3), c(1, 3, 1)];
        assert_eq!(shutdown_round(None, &quiet), Round::Busy, "one round is never enough");
        assert_eq!(shutdown_round(Some(&busy), &quiet), Round::Busy, "counters moved");
        assert_eq!(shutdown_round(Some(&quiet), &quiet), Round::Quiet);
        // Balanced sums but a served request whose call has not ended at its caller.
        let unfinished = [c(2, 0, 1), c(0, 2, 0)];
        assert_eq!(shutdown_round(Some(&unfinished), &unfinished), Round::Busy);
        let expired = [c(0, 0, 0), Counters { expired: 1, ..Default::default() }];
        assert_eq!(shutdown_round(None, &expired), Round::Expired);
        let w = quiet[0].to_words();
        assert_eq!(Counters::from_words(&w), quiet[0]);
    }
}
