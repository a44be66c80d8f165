//! The TCP store server's logic without I/O (see [`super::tcp_store`] for the wire protocol): a
//! request parser that is fed bytes as they arrive, and the key-value map with its per-key lists
//! of parked GETs. The event loop in [`super::store_server`] is the thin shell around them; the
//! fuzz entry point and the unit tests drive them directly.

use super::tcp_store::{
    HELLO_LEN, MAGIC, MAX_KEY_LEN, MAX_VALUE_LEN, OP_ADD, OP_GET, OP_SET, R_ERROR, R_NOT_FOUND, R_OK, VERSION,
};
use super::tcp_store::{BAD_VERSION, CLIENT_LABEL, REFUSED, WELCOME};
use crate::auth::Key;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A value buffer starts at most this large; it grows as the value's bytes arrive.
const VALUE_START: usize = 64 << 10;

/// The answer code to a client's hello after our challenge `server_nonce`: WELCOME,
/// BAD_VERSION or REFUSED (its proof checked in constant time).
pub(super) fn hello_verdict(hello: &[u8; HELLO_LEN], key: &Key, server_nonce: &[u8]) -> u8 {
    let version = u16::from_le_bytes([hello[4], hello[5]]);
    let (client_nonce, proof) = hello[8..].split_at(crate::auth::LEN);
    if hello[..4] != MAGIC || version != VERSION {
        BAD_VERSION
    } else if !key.verify(CLIENT_LABEL, &[server_nonce, client_nonce], proof) {
        REFUSED
    } else {
        WELCOME
    }
}

/// One parsed request.
#[derive(Debug, PartialEq)]
pub(super) enum Request {
    Set { key: Vec<u8>, value: Vec<u8> },
    Get { key: Vec<u8>, wait_ms: u32 },
    Add { key: Vec<u8>, delta: i64 },
}

/// What the parser found at the end of a request.
#[derive(Debug, PartialEq)]
pub(super) enum Parsed {
    Request(Request),
    /// A request the server refuses: answered with this error, then the connection is closed.
    Fatal(String),
}

#[derive(Default, Clone, Copy, PartialEq, Debug)]
enum Stage {
    /// `op u8 | key_len u32`
    #[default]
    Head,
    Key,
    /// SET: `value_len u64`; GET: `wait_ms u32`; ADD: `delta i64`
    Tail,
    Value,
}

/// An incremental parser of requests: fed whatever bytes have arrived, it keeps its place between
/// calls. Nothing the peer announces sizes an allocation before it is checked against the limits,
/// and a value's buffer grows only as its bytes arrive (at most doubling what has arrived).
#[derive(Default)]
pub(super) struct Parser {
    stage: Stage,
    fixed: [u8; 8],
    got: usize,
    op: u8,
    key_len: usize,
    key: Vec<u8>,
    value_len: usize,
    value: Vec<u8>,
}

impl Parser {
    /// Whether the parser is between requests (nothing of a next one has arrived).
    #[cfg(test)]
    fn idle(&self) -> bool {
        self.stage == Stage::Head && self.got == 0
    }

    /// Copies bytes of `input` into the fixed field until it holds `need`; returns how many.
    fn fill(&mut self, input: &[u8], need: usize) -> usize {
        let n = (need - self.got).min(input.len());
        self.fixed[self.got..self.got + n].copy_from_slice(&input[..n]);
        self.got += n;
        n
    }

    fn fatal(&mut self, why: String) -> Option<Parsed> {
        *self = Parser::default();
        Some(Parsed::Fatal(why))
    }

    /// Consumes bytes of `input` up to the end of at most one request: how many it took, and the
    /// request if one completed. `None` means every byte was taken and more are needed.
    pub(super) fn feed(&mut self, input: &[u8]) -> (usize, Option<Parsed>) {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match self.stage {
                Stage::Head => {
                    used += self.fill(rest, 5);
                    if self.got < 5 {
                        return (used, None);
                    }
                    self.got = 0;
                    self.op = self.fixed[0];
                    self.key_len = u32::from_le_bytes(self.fixed[1..5].try_into().unwrap()) as usize;
                    if self.key_len > MAX_KEY_LEN {
                        let why = format!("key of {} bytes exceeds {MAX_KEY_LEN}", self.key_len);
                        return (used, self.fatal(why));
                    }
                    self.key = Vec::with_capacity(self.key_len);
                    self.stage = Stage::Key;
                }
                Stage::Key => {
                    let n = (self.key_len - self.key.len()).min(rest.len());
                    self.key.extend_from_slice(&rest[..n]);
                    used += n;
                    if self.key.len() < self.key_len {
                        return (used, None);
                    }
                    match self.op {
                        OP_SET | OP_GET | OP_ADD => self.stage = Stage::Tail,
                        op => return (used, self.fatal(format!("unknown operation {op}"))),
                    }
                }
                Stage::Tail => {
                    let need = if self.op == OP_GET { 4 } else { 8 };
                    used += self.fill(rest, need);
                    if self.got < need {
                        return (used, None);
                    }
                    self.got = 0;
                    let key = std::mem::take(&mut self.key);
                    match self.op {
                        OP_GET => {
                            self.stage = Stage::Head;
                            let wait_ms = u32::from_le_bytes(self.fixed[..4].try_into().unwrap());
                            return (used, Some(Parsed::Request(Request::Get { key, wait_ms })));
                        }
                        OP_ADD => {
                            self.stage = Stage::Head;
                            let delta = i64::from_le_bytes(self.fixed);
                            return (used, Some(Parsed::Request(Request::Add { key, delta })));
                        }
                        _ => {
                            let len = u64::from_le_bytes(self.fixed);
                            if len > MAX_VALUE_LEN as u64 {
                                return (used, self.fatal(format!("value of {len} bytes exceeds {MAX_VALUE_LEN}")));
                            }
                            self.key = key;
                            self.value_len = len as usize;
                            self.value = Vec::with_capacity(self.value_len.min(VALUE_START));
                            self.stage = Stage::Value;
                        }
                    }
                }
                Stage::Value => {
                    let have = self.value.len();
                    let n = (self.value_len - have).min(rest.len());
                    if self.value.capacity() - have < n {
                        let target = (have + n).max(self.value.capacity() * 2).min(self.value_len);
                        self.value.reserve_exact(target - have);
                    }
                    self.value.extend_from_slice(&rest[..n]);
                    used += n;
                    if self.value.len() < self.value_len {
                        return (used, None);
                    }
                    self.stage = Stage::Head;
                    let key = std::mem::take(&mut self.key);
                    let value = std::mem::take(&mut self.value);
                    return (used, Some(Parsed::Request(Request::Set { key, value })));
                }
            }
        }
    }
}

/// An answer's body: small ones are owned; stored values are shared, so that a value read by a
/// thousand clients is queued a thousand times without a copy.
#[derive(Debug, Clone)]
pub(super) enum Body {
    Owned(Vec<u8>),
    Shared(Arc<Vec<u8>>),
}

impl Body {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Body::Owned(v) => v,
            Body::Shared(v) => v,
        }
    }
}

/// The 9-byte head of an answer: `code u8 | len u64`.
pub(super) fn answer_head(code: u8, len: usize) -> [u8; 9] {
    let mut head = [0u8; 9];
    head[0] = code;
    head[1..].copy_from_slice(&(len as u64).to_le_bytes());
    head
}

/// A parked GET: the connection it came from and that connection's park number (a connection
/// parks at most one GET at a time; the number tells a stale timer or wake-up from a live one).
pub(super) type Waiter = (u64, u64);

/// What serving a request comes to.
#[derive(Debug)]
pub(super) enum Outcome {
    Answer(u8, Body),
    /// Key absent: park the GET on the key's waiter list for at most this long.
    Park(Vec<u8>, Duration),
}

/// The store's state: the map and, per key, the GETs parked on it.
#[derive(Default)]
pub(super) struct Core {
    data: HashMap<Vec<u8>, Arc<Vec<u8>>>,
    waiters: HashMap<Vec<u8>, Vec<Waiter>>,
}

/// Parses a counter's stored text.
pub(super) fn parse_counter(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

impl Core {
    pub(super) fn num_keys(&self) -> usize {
        self.data.len()
    }

    /// Serves one request. A GET of an absent key with a wait becomes [`Outcome::Park`] (the caller
    /// parks it with [`Core::park`]); a SET or ADD returns, with its answer, the waiters of its key
    /// (and only those) and the value they are to be answered with.
    pub(super) fn serve(&mut self, req: Request, max_wait: Duration) -> (Outcome, Vec<Waiter>, Option<Arc<Vec<u8>>>) {
        match req {
            Request::Set { key, value } => {
                let value = Arc::new(value);
                let woken = self.store(key, value.clone());
                (Outcome::Answer(R_OK, Body::Owned(Vec::new())), woken, Some(value))
            }
            Request::Get { key, wait_ms } => {
                if let Some(v) = self.data.get(&key) {
                    return (Outcome::Answer(R_OK, Body::Shared(v.clone())), Vec::new(), None);
                }
                let wait = Duration::from_millis(wait_ms as u64).min(max_wait);
                if wait.is_zero() {
                    (Outcome::Answer(R_NOT_FOUND, Body::Owned(Vec::new())), Vec::new(), None)
                } else {
                    (Outcome::Park(key, wait), Vec::new(), None)
                }
            }
            Request::Add { key, delta } => {
                let cur = match self.data.get(&key) {
                    None => Some(0),
                    Some(v) => parse_counter(v),
                };
                let n = match cur.map(|c| c.checked_add(delta)) {
                    Some(Some(n)) => n,
                    Some(None) => return (Outcome::Answer(R_ERROR, Body::Owned(b"counter overflow".to_vec())), Vec::new(), None),
                    None => {
                        let m = format!("the value at {:?} is not an integer", String::from_utf8_lossy(&key));
                        return (Outcome::Answer(R_ERROR, Body::Owned(m.into_bytes())), Vec::new(), None);
                    }
                };
                let text = n.to_string().into_bytes();
                let value = Arc::new(text.clone());
                let woken = self.store(key, value.clone());
                (Outcome::Answer(R_OK, Body::Owned(text)), woken, Some(value))
            }
        }
    }

    /// Stores `value` under `key` and takes that key's waiters.
    fn store(&mut self, key: Vec<u8>, value: Arc<Vec<u8>>) -> Vec<Waiter> {
        let woken = self.waiters.remove(&key).unwrap_or_default();
        self.data.insert(key, value);
        woken
    }

    /// Parks `w` on `key` until it is set (or the caller's timer takes it off with [`Core::unpark`]).
    pub(super) fn park(&mut self, key: Vec<u8>, w: Waiter) {
        self.waiters.entry(key).or_default().push(w);
    }

    /// Takes `w` off `key`'s waiter list (its wait expired or its connection closed).
    pub(super) fn unpark(&mut self, key: &[u8], w: Waiter) {
        if let Some(list) = self.waiters.get_mut(key) {
            list.retain(|x| *x != w);
            if list.is_empty() {
                self.waiters.remove(key);
            }
        }
    }

    /// Parked GETs in all (for tests).
    #[cfg(test)]
    fn parked(&self) -> usize {
        self.waiters.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(key: &str, value: &[u8]) -> Vec<u8> {
        let mut m = vec![OP_SET];
        m.extend_from_slice(&(key.len() as u32).to_le_bytes());
        m.extend_from_slice(key.as_bytes());
        m.extend_from_slice(&(value.len() as u64).to_le_bytes());
        m.extend_from_slice(value);
        m
    }

    fn get(key: &str, wait_ms: u32) -> Vec<u8> {
        let mut m = vec![OP_GET];
        m.extend_from_slice(&(key.len() as u32).to_le_bytes());
        m.extend_from_slice(key.as_bytes());
        m.extend_from_slice(&wait_ms.to_le_bytes());
        m
    }

    #[test]
    fn parser_takes_requests_byte_by_byte_and_in_one_piece() {
        let mut stream = set("k", b"value");
        stream.extend(get("k", 7));
        stream.extend(set("", b""));
        let expect = vec![
            Parsed::Request(Request::Set { key: b"k".to_vec(), value: b"value".to_vec() }),
            Parsed::Request(Request::Get { key: b"k".to_vec(), wait_ms: 7 }),
            Parsed::Request(Request::Set { key: vec![], value: vec![] }),
        ];
        // One byte at a time.
        let mut p = Parser::default();
        let mut got = Vec::new();
        for b in &stream {
            let (n, r) = p.feed(std::slice::from_ref(b));
            assert_eq!(n, 1);
            got.extend(r);
        }
        // The empty SET completes on its last length byte.
        assert_eq!(got, expect);
        assert!(p.idle());
        // All at once: one request per call.
        let mut p = Parser::default();
        let mut rest = &stream[..];
        let mut got = Vec::new();
        while let (n, Some(r)) = p.feed(rest) {
            rest = &rest[n..];
            got.push(r);
        }
        assert_eq!(got, expect);
    }

    #[test]
    fn parser_refuses_oversized_lengths_before_allocating() {
        let mut p = Parser::default();
        let mut m = vec![OP_GET];
        m.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(p.feed(&m), (5, Some(Parsed::Fatal(w))) if w.contains("exceeds")));
        let mut m = set("k", b"");
        let n = m.len();
        m[n - 8..].copy_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(matches!(p.feed(&m), (_, Some(Parsed::Fatal(w))) if w.contains("exceeds")));
        // A 64 MiB claim with a little behind it: the buffer is sized by what arrived.
        let mut m = set("k", b"");
        let n = m.len();
        m[n - 8..].copy_from_slice(&(MAX_VALUE_LEN as u64).to_le_bytes());
        m.extend_from_slice(&[1; 1000]);
        assert_eq!(p.feed(&m), (m.len(), None));
        assert!(p.value.capacity() <= VALUE_START);
        let mut p = Parser::default();
        assert!(matches!(p.feed(&[99, 0, 0, 0, 0]), (5, Some(Parsed::Fatal(w))) if w.contains("unknown operation 99")));
    }

    #[test]
    fn a_set_wakes_only_the_waiters_of_its_key() {
        let mut core = Core::default();
        let wait = Duration::from_secs(30);
        // Three GETs parked on "a", one on "b".
        for (conn, key) in [(1, "a"), (2, "a"), (3, "b"), (4, "a")] {
            match core.serve(Request::Get { key: key.into(), wait_ms: 10_000 }, wait).0 {
                Outcome::Park(k, _) => core.park(k, (conn, 1)),
                o => panic!("{o:?}"),
            }
        }
        assert_eq!(core.parked(), 4);
        // Connection 2's wait expires.
        core.unpark(b"a", (2, 1));
        let (o, woken, v) = core.serve(Request::Set { key: b"a".to_vec(), value: b"x".to_vec() }, wait);
        assert!(matches!(o, Outcome::Answer(R_OK, _)));
        assert_eq!(woken, vec![(1, 1), (4, 1)]);
        assert_eq!(v.unwrap().as_slice(), b"x");
        assert_eq!(core.parked(), 1, "the waiter on b stays parked");
        // Setting another key wakes nobody; ADD on b wakes b's waiter with the counter's text.
        assert!(core.serve(Request::Set { key: b"c".to_vec(), value: vec![] }, wait).1.is_empty());
        let (_, woken, v) = core.serve(Request::Add { key: b"b".to_vec(), delta: 5 }, wait);
        assert_eq!(woken, vec![(3, 1)]);
        assert_eq!(v.unwrap().as_slice(), b"5");
        assert_eq!(core.parked(), 0);
        // A GET of a present key answers at once; of an absent one without a wait, "not found".
        assert!(matches!(core.serve(Request::Get { key: b"a".to_vec(), wait_ms: 5 }, wait).0, Outcome::Answer(R_OK, Body::Shared(_))));
        assert!(matches!(core.serve(Request::Get { key: b"z".to_vec(), wait_ms: 0 }, wait).0, Outcome::Answer(R_NOT_FOUND, _)));
        assert!(matches!(core.serve(Request::Get { key: b"z".to_vec(), wait_ms: 5 }, Duration::ZERO).0, Outcome::Answer(R_NOT_FOUND, _)));
        assert_eq!(core.num_keys(), 3);
    }
}
