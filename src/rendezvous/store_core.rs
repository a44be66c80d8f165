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

/// What one client (a connection) may hold in the store: the keys it was the last to set, and
/// their keys' and values' bytes. A job's own use is far below (an exchange among 1024 ranks
/// sets a few keys per rank, of about a hundred bytes each, and one gathered value of about
/// 100 KB); a client past them (a runaway loop of sets, a bug) gets an error for that request
/// and the store stays whole for everyone else.
pub(super) const CLIENT_MAX_KEYS: usize = 1 << 20;
pub(super) const CLIENT_MAX_BYTES: usize = 1 << 30;

struct Entry {
    value: Arc<Vec<u8>>,
    /// The client that set it last, whose share it counts in.
    owner: u64,
}

#[derive(Default, Clone, Copy)]
struct Held {
    keys: usize,
    bytes: usize,
}

/// The store's state: the map, per key the GETs parked on it, and what each client holds.
pub(super) struct Core {
    data: HashMap<Vec<u8>, Entry>,
    waiters: HashMap<Vec<u8>, Vec<Waiter>>,
    held: HashMap<u64, Held>,
    limits: Held,
}

impl Default for Core {
    fn default() -> Core {
        Core::with_limits(CLIENT_MAX_KEYS, CLIENT_MAX_BYTES)
    }
}

/// Parses a counter's stored text.
pub(super) fn parse_counter(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

impl Core {
    /// A store whose clients may each hold at most `keys` keys of `bytes` bytes.
    pub(super) fn with_limits(keys: usize, bytes: usize) -> Core {
        Core { data: HashMap::new(), waiters: HashMap::new(), held: HashMap::new(), limits: Held { keys, bytes } }
    }

    pub(super) fn num_keys(&self) -> usize {
        self.data.len()
    }

    /// Serves one request. A GET of an absent key with a wait becomes [`Outcome::Park`] (the caller
    /// parks it with [`Core::park`]); a SET or ADD returns, with its answer, the waiters of its key
    /// (and only those) and the value they are to be answered with. `client` names the
    /// connection (its share of the store is bounded: see [`CLIENT_MAX_KEYS`]).
    pub(super) fn serve(&mut self, client: u64, req: Request, max_wait: Duration) -> (Outcome, Vec<Waiter>, Option<Arc<Vec<u8>>>) {
        match req {
            Request::Set { key, value } => {
                let value = Arc::new(value);
                match self.store(client, key, value.clone()) {
                    Ok(woken) => (Outcome::Answer(R_OK, Body::Owned(Vec::new())), woken, Some(value)),
                    Err(why) => (Outcome::Answer(R_ERROR, Body::Owned(why.into_bytes())), Vec::new(), None),
                }
            }
            Request::Get { key, wait_ms } => {
                if let Some(e) = self.data.get(&key) {
                    return (Outcome::Answer(R_OK, Body::Shared(e.value.clone())), Vec::new(), None);
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
                    Some(e) => parse_counter(&e.value),
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
                match self.store(client, key, value.clone()) {
                    Ok(woken) => (Outcome::Answer(R_OK, Body::Owned(text)), woken, Some(value)),
                    Err(why) => (Outcome::Answer(R_ERROR, Body::Owned(why.into_bytes())), Vec::new(), None),
                }
            }
        }
    }

    /// Stores `value` under `key` for `client` and takes that key's waiters; refused (nothing
    /// changes) when the client would then hold more than its limits.
    fn store(&mut self, client: u64, key: Vec<u8>, value: Arc<Vec<u8>>) -> std::result::Result<Vec<Waiter>, String> {
        let cost = key.len() + value.len();
        let old = self.data.get(&key).map(|e| (e.owner, key.len() + e.value.len()));
        let mine = self.held.get(&client).copied().unwrap_or_default();
        let after = match old {
            Some((owner, was)) if owner == client => Held { keys: mine.keys, bytes: mine.bytes - was + cost },
            _ => Held { keys: mine.keys + 1, bytes: mine.bytes + cost },
        };
        if after.keys > self.limits.keys || after.bytes > self.limits.bytes {
            return Err(format!(
                "store limit: this client would hold {} keys of {} bytes, over the limit of {} keys and {} bytes per client (a runaway loop of sets?)",
                after.keys, after.bytes, self.limits.keys, self.limits.bytes
            ));
        }
        if let Some((owner, was)) = old {
            if let Some(h) = self.held.get_mut(&owner) {
                h.keys -= 1;
                h.bytes -= was;
            }
        }
        let h = self.held.entry(client).or_default();
        h.keys += 1;
        h.bytes += cost;
        let woken = self.waiters.remove(&key).unwrap_or_default();
        self.data.insert(key, Entry { value, owner: client });
        Ok(woken)
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
            match core.serve(0, Request::Get { key: key.into(), wait_ms: 10_000 }, wait).0 {
                Outcome::Park(k, _) => core.park(k, (conn, 1)),
                o => panic!("{o:?}"),
            }
        }
        assert_eq!(core.parked(), 4);
        // Connection 2's wait expires.
        core.unpark(b"a", (2, 1));
        let (o, woken, v) = core.serve(0, Request::Set { key: b"a".to_vec(), value: b"x".to_vec() }, wait);
        assert!(matches!(o, Outcome::Answer(R_OK, _)));
        assert_eq!(woken, vec![(1, 1), (4, 1)]);
        assert_eq!(v.unwrap().as_slice(), b"x");
        assert_eq!(core.parked(), 1, "the waiter on b stays parked");
        // Setting another key wakes nobody; ADD on b wakes b's waiter with the counter's text.
        assert!(core.serve(0, Request::Set { key: b"c".to_vec(), value: vec![] }, wait).1.is_empty());
        let (_, woken, v) = core.serve(0, Request::Add { key: b"b".to_vec(), delta: 5 }, wait);
        assert_eq!(woken, vec![(3, 1)]);
        assert_eq!(v.unwrap().as_slice(), b"5");
        assert_eq!(core.parked(), 0);
        // A GET of a present key answers at once; of an absent one without a wait, "not found".
        assert!(matches!(core.serve(0, Request::Get { key: b"a".to_vec(), wait_ms: 5 }, wait).0, Outcome::Answer(R_OK, Body::Shared(_))));
        assert!(matches!(core.serve(0, Request::Get { key: b"z".to_vec(), wait_ms: 0 }, wait).0, Outcome::Answer(R_NOT_FOUND, _)));
        assert!(matches!(core.serve(0, Request::Get { key: b"z".to_vec(), wait_ms: 5 }, Duration::ZERO).0, Outcome::Answer(R_NOT_FOUND, _)));
        assert_eq!(core.num_keys(), 3);
    }

    #[test]
    fn each_client_holds_at_most_its_limits() {
        let wait = Duration::ZERO;
        let mut core = Core::with_limits(3, 100);
        let set = |core: &mut Core, client: u64, key: &str, len: usize| core.serve(client, Request::Set { key: key.into(), value: vec![7; len] }, wait).0;
        let refused = |o: Outcome| matches!(o, Outcome::Answer(R_ERROR, b) if String::from_utf8_lossy(b.bytes()).contains("store limit"));
        for k in ["a", "b", "c"] {
            assert!(matches!(set(&mut core, 1, k, 10), Outcome::Answer(R_OK, _)));
        }
        // A fourth key is refused and changes nothing; overwriting its own keys is fine.
        assert!(refused(set(&mut core, 1, "d", 1)));
        assert!(matches!(core.serve(1, Request::Get { key: b"d".to_vec(), wait_ms: 0 }, wait).0, Outcome::Answer(R_NOT_FOUND, _)));
        assert!(matches!(set(&mut core, 1, "a", 20), Outcome::Answer(R_OK, _)));
        assert!(refused(core.serve(1, Request::Add { key: b"n".to_vec(), delta: 1 }, wait).0), "ADD counts too");
        // Bytes: 3 keys of 1+20, 1+10, 1+10 = 43; growing "b" to 80 would make 113.
        assert!(refused(set(&mut core, 1, "b", 80)));
        // Another client is not affected, and a key it overwrites moves into its share.
        assert!(matches!(set(&mut core, 2, "c", 50), Outcome::Answer(R_OK, _)));
        assert!(matches!(set(&mut core, 1, "d", 1), Outcome::Answer(R_OK, _)), "client 1 holds 2 keys again");
        assert!(matches!(core.serve(2, Request::Add { key: b"n".to_vec(), delta: 1 }, wait).0, Outcome::Answer(R_OK, _)));
        assert!(refused(set(&mut core, 2, "e", 60)), "client 2: 51 + 2 + 61 bytes");
        assert_eq!(core.num_keys(), 5);
    }
}
