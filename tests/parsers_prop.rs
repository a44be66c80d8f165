//! Property tests that always run: random and mutated input for every parser that sees bytes
//! from the network or strings from the environment (the same functions the cargo-fuzz targets
//! in fuzz/ call). A tiny deterministic PRNG keeps failures reproducible: the seed and the case
//! number are in every assertion message. `DC_PROP_CASES` scales the number of cases.
//!
//! A counting allocator checks the rule "never allocate from an untrusted length": while a
//! parser runs on this thread, the largest single allocation is recorded.

use distcomm::debug_check::Fingerprint;
use distcomm::rendezvous::config::{parse_host_port, parse_method, resolve, InitOptions};
use distcomm::rendezvous::tcp_store::{fuzz_server_input, raw};
use distcomm::transport::frame::{FrameKind, Header, HEADER_LEN, RTS_LEN};
use distcomm::transport::handshake::{challenge, check_proof, decode, token_digest, Hello, HELLO_LEN};
use distcomm::rpc::protocol as rpc;
use distcomm::Status;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

// ---- a counting allocator (per thread, only while tracking) --------------------------------

struct Counting;

thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size());
        System.alloc_zeroed(l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        System.realloc(p, l, new)
    }
}

fn note(size: usize) {
    let _ = TRACK.try_with(|t| {
        if t.get() {
            let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
        }
    });
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result and the largest single allocation it made on this thread.
fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|m| m.set(0));
    TRACK.with(|t| t.set(true));
    let r = f();
    TRACK.with(|t| t.set(false));
    (r, LARGEST.with(|m| m.get()))
}

// ---- a tiny deterministic PRNG (splitmix64) ----------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// An "interesting" integer: small, a boundary, or random.
    fn edge_u64(&mut self) -> u64 {
        match self.below(6) {
            0 => self.below(8) as u64,
            1 => u64::MAX - self.below(3) as u64,
            2 => 1 << self.below(64),
            3 => (isize::MAX as u64).wrapping_add(self.below(3) as u64),
            4 => u32::MAX as u64,
            _ => self.next(),
        }
    }
    /// Flips, overwrites, inserts or removes a few bytes.
    fn mutate(&mut self, v: &mut Vec<u8>) {
        for _ in 0..1 + self.below(4) {
            match self.below(5) {
                0 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] ^= 1 << self.below(8);
                }
                1 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] = self.next() as u8;
                }
                2 => {
                    let i = self.below(v.len() + 1);
                    v.insert(i, self.next() as u8);
                }
                3 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v.remove(i);
                }
                _ if v.len() >= 8 => {
                    // Overwrite 8 bytes with an edge value (often a length field).
                    let i = self.below(v.len() - 7);
                    let e = self.edge_u64().to_le_bytes();
                    v[i..i + 8].copy_from_slice(&e);
                }
                _ => {}
            }
        }
    }
}

fn cases(default: usize) -> usize {
    std::env::var("DC_PROP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

const SEED: u64 = 0x00DC_0004;

// ---- frame headers -------------------------------------------------------------------------------

#[test]
fn frame_headers_decode_safely_and_round_trip() {
    let mut rng = Rng(SEED);
    let mut accepted = 0;
    for case in 0..cases(200_000) {
        let mut b = [0u8; HEADER_LEN];
        if rng.below(2) == 0 {
            b.copy_from_slice(&rng.bytes(HEADER_LEN));
        } else {
            let kinds = [
                FrameKind::Data,
                FrameKind::Abort,
                FrameKind::Close,
                FrameKind::Fin,
                FrameKind::Bell,
                FrameKind::Cts,
                FrameKind::Chunk,
                FrameKind::Pulled,
                FrameKind::Credit,
                FrameKind::Ask,
            ];
            let kind = kinds[rng.below(kinds.len())];
            let with_body = matches!(kind, FrameKind::Data | FrameKind::Chunk | FrameKind::Pulled);
            let h = Header { kind, check: rng.next() as u32, ctx: rng.next(), tag: rng.edge_u64(), len: if with_body { rng.edge_u64() } else { 0 } };
            let mut v = h.encode().to_vec();
            if rng.below(3) > 0 {
                rng.mutate(&mut v);
            }
            v.resize(HEADER_LEN, 0);
            b.copy_from_slice(&v);
        }
        let (r, big) = largest_alloc(|| Header::decode(&b));
        if let Ok(h) = r {
            accepted += 1;
            let mut want = b;
            want[2] = 0;
            want[3] = 0;
            assert_eq!(h.encode(), want, "seed {SEED:#x} case {case}");
            assert!(h.len <= isize::MAX as u64, "seed {SEED:#x} case {case}: impossible length accepted");
            let body_ok = matches!(h.kind, FrameKind::Data | FrameKind::Chunk | FrameKind::Pulled)
                || (matches!(h.kind, FrameKind::Rts | FrameKind::Offer) && h.len == RTS_LEN as u64);
            assert!(body_ok || h.len == 0, "case {case}: a control frame with a body");
        } else {
            assert!(big < 4096, "case {case}: a refusal allocated {big} bytes");
        }
    }
    assert!(accepted > 1000, "the generator hardly produced valid headers ({accepted})");
}

// ---- hellos ----------------------------------------------------------------------------------------

#[test]
fn hellos_are_verified_and_strangers_refused() {
    let mut rng = Rng(SEED ^ 1);
    let digest = token_digest(b"the token");
    let good = Hello { digest, job_id: 77, rank: 3, world_size: 8 };
    let nonce = [0x42u8; 32];
    for case in 0..cases(100_000) {
        let mut v = if rng.below(2) == 0 { good.encode(&nonce).to_vec() } else { rng.bytes(HELLO_LEN) };
        if rng.below(4) > 0 {
            rng.mutate(&mut v);
        }
        v.resize(HELLO_LEN, 0);
        let b: [u8; HELLO_LEN] = v.try_into().unwrap();
        let Some(h) = decode(&b) else {
            assert!(b[..8] != good.encode(&nonce)[..8], "case {case}: the magic refused");
            continue;
        };
        let back = Hello { digest, job_id: h.job_id, rank: h.rank, world_size: h.world_size }.encode(&h.nonce);
        assert_eq!(back, b, "case {case}");
        // A proof that was not made with the token is never taken (random bytes here; a real
        // one made over another challenge in the unit tests).
        let (_, ours) = challenge(&digest, &h, 0).unwrap();
        let forged = rng.bytes(32);
        assert!(!check_proof(&digest, &h, 0, &ours, &forged), "case {case}: a forged proof taken");
    }
}

// ---- DETAIL fingerprints ---------------------------------------------------------------------------

#[test]
fn fingerprints_decode_safely() {
    let mut rng = Rng(SEED ^ 2);
    let mut valid = vec![0xD7u8, 0, 7, 0];
    valid.extend_from_slice(&u32::MAX.to_le_bytes());
    valid.extend_from_slice(&12u64.to_le_bytes());
    valid.resize(40, 0);
    assert!(Fingerprint::decode(&valid).is_some());
    for case in 0..cases(100_000) {
        let mut v = if rng.below(2) == 0 { valid.clone() } else {
            let n = rng.below(64);
            rng.bytes(n)
        };
        rng.mutate(&mut v);
        if let Some(f) = Fingerprint::decode(&v) {
            assert_eq!(f.encode().to_vec(), v, "case {case}");
            assert!(!f.describe().is_empty());
        }
    }
}

// ---- the store server's parsers ------------------------------------------------------------------

/// A stream of well-formed requests (SET, GET, ADD) and how many there are.
fn requests(rng: &mut Rng) -> (Vec<u8>, usize) {
    let mut m = Vec::new();
    let n = rng.below(6);
    for _ in 0..n {
        let key: String = (0..rng.below(12)).map(|_| (b'a' + rng.below(26) as u8) as char).collect();
        match rng.below(3) {
            0 => {
                let len = rng.below(100);
                let value = rng.bytes(len);
                m.extend_from_slice(&raw::set_header(&key, value.len() as u64));
                m.extend_from_slice(&value);
            }
            1 => {
                m.push(2);
                m.extend_from_slice(&(key.len() as u32).to_le_bytes());
                m.extend_from_slice(key.as_bytes());
                m.extend_from_slice(&(rng.next() as u32).to_le_bytes());
            }
            _ => {
                m.push(3);
                m.extend_from_slice(&(key.len() as u32).to_le_bytes());
                m.extend_from_slice(key.as_bytes());
                m.extend_from_slice(&(rng.below(1000) as i64 - 500).to_le_bytes());
            }
        }
    }
    (m, n)
}

#[test]
fn store_server_parsing_survives_garbage_without_big_allocations() {
    let mut rng = Rng(SEED ^ 3);
    let t0 = Instant::now();
    for case in 0..cases(30_000) {
        let hello = match rng.below(3) {
            0 => raw::hello(b"fuzz", &raw::FUZZ_NONCE),
            1 => raw::hello(b"not the token", &raw::FUZZ_NONCE),
            _ => rng.bytes(72),
        };
        let (reqs, n) = requests(&mut rng);
        let mut input = hello.clone();
        input.extend_from_slice(&reqs);
        let mutated = rng.below(3) > 0;
        if mutated {
            rng.mutate(&mut input);
        }
        let ((verdict, served), big) = largest_alloc(|| fuzz_server_input(&input));
        // Keys are at most 4 KiB; values arrive as they are read; answers are small.
        assert!(big <= 64 << 10 | 4096, "seed {:#x} case {case}: an allocation of {big} bytes", SEED ^ 3);
        if !mutated {
            assert_eq!(served, n, "case {case}: a well-formed stream was not served whole");
            let expect = if hello == raw::hello(b"fuzz", &raw::FUZZ_NONCE) { Some(0) } else if hello[..4] == *b"DCST" && hello[4..6] == [2, 0] { Some(1) } else { Some(2) };
            assert_eq!(verdict, expect, "case {case}");
        }
    }
    // Lengths that claim the maximum (64 MiB values, 4 KiB keys) with nothing behind them.
    let mut m = raw::hello(b"fuzz", &raw::FUZZ_NONCE);
    m.extend_from_slice(&raw::set_header("k", 64 << 20));
    m.extend_from_slice(&[7u8; 1000]);
    let ((_, served), big) = largest_alloc(|| fuzz_server_input(&m));
    assert_eq!(served, 0);
    assert!(big < 1 << 20, "a 64 MiB claim allocated {big} bytes");
    assert!(t0.elapsed() < Duration::from_secs(60), "took {:?}", t0.elapsed());
}

// ---- init methods, host:port, the environment ------------------------------------------------------

const PIECES: [&str; 24] = [
    "env://", "tcp://", "file://", "/", "[", "]", ":", "::1", "127.0.0.1", "host", "29500", "0", "65535", "65536", "-1", " ", "%",
    "é", "\u{0}", "//", "x", "99999999999999999999", "TCP://", "+8",
];

fn text(rng: &mut Rng) -> String {
    (0..rng.below(6)).map(|_| PIECES[rng.below(PIECES.len())]).collect()
}

#[test]
fn init_methods_and_addresses_parse_safely() {
    let mut rng = Rng(SEED ^ 4);
    for case in 0..cases(50_000) {
        let s = text(&mut rng);
        match parse_host_port(&s, "prop") {
            Ok((h, p)) => {
                assert!(!h.is_empty() && p >= 1, "case {case}: {s:?}");
                if !h.contains(['[', ']']) {
                    let again = distcomm::rendezvous::tcp_store::fmt_host_port(&h, p);
                    assert_eq!(parse_host_port(&again, "prop").unwrap(), (h, p), "case {case}: {s:?}");
                }
            }
            Err(e) => assert_eq!(e.status, Status::InvalidArgument, "case {case}: {s:?}"),
        }
        if let Err(e) = parse_method(&s) {
            assert_eq!(e.status, Status::InvalidArgument, "case {case}: {s:?}");
        }
    }
}

#[test]
fn the_environment_resolves_safely() {
    let mut rng = Rng(SEED ^ 5);
    let names = [
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DC_TOKEN", "DC_TIMEOUT_MS", "DC_TRANSPORT", "DC_SOCKET_IFNAME",
        "DC_LAUNCHER_STORE", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
        "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM",
    ];
    let mut ok = 0;
    for case in 0..cases(20_000) {
        let mut env = HashMap::new();
        for n in names {
            if rng.below(2) == 0 {
                let v = match rng.below(3) {
                    0 => rng.below(10).to_string(),
                    1 => rng.edge_u64().to_string(),
                    _ => text(&mut rng),
                };
                env.insert(n.to_string(), v);
            }
        }
        if rng.below(2) == 0 {
            // A plausible job, so that the success path is exercised too.
            env.insert("MASTER_ADDR".into(), "127.0.0.1".into());
            env.insert("MASTER_PORT".into(), (1 + rng.below(65535)).to_string());
            env.insert("WORLD_SIZE".into(), (1 + rng.below(8)).to_string());
            env.insert("RANK".into(), "0".into());
        }
        let opts = InitOptions {
            init_method: (rng.below(2) == 0).then(|| text(&mut rng)),
            backend: (rng.below(4) == 0).then(|| ["auto", "shm", "socket", "nccl", "x"][rng.below(5)].to_string()),
            rank: rng.below(6) as i32 - 2,
            world_size: rng.below(6) as i32 - 2,
            group_name: (rng.below(4) == 0).then(|| text(&mut rng)),
            timeout_ms: rng.edge_u64() as i64,
            token: (rng.below(4) == 0).then(|| text(&mut rng)),
            encrypt: [None, Some(false), Some(true)][rng.below(3)],
        };
        match resolve(&opts, &|k| env.get(k).cloned()) {
            Ok(cfg) => {
                ok += 1;
                assert!(cfg.world_size >= 1, "case {case}");
                if let Some(r) = cfg.rank {
                    assert!(r < cfg.world_size, "case {case}: rank {r} of {}", cfg.world_size);
                }
                assert!(!cfg.timeout.is_zero(), "case {case}");
            }
            // Rendezvous: no DC_TOKEN for a store that other hosts can reach.
            Err(e) if e.status == Status::Rendezvous => assert!(e.msg.contains("DC_TOKEN is not set"), "case {case}: {e}"),
            Err(e) => assert!(matches!(e.status, Status::InvalidArgument | Status::Unavailable), "case {case}: {e}"),
        }
    }
    assert!(ok > cases(20_000) / 50, "almost nothing resolved ({ok})");
}

// ---- RPC frames ------------------------------------------------------------------------------------

/// The RPC header, the body lengths it announces and a request body's split, on random and
/// mutated input (the same checks as fuzz/fuzz_targets/rpc_frame.rs): nothing panics, a length
/// is accepted only within the limit, an accepted split stays within the body, and a refusal
/// allocates nothing large.
#[test]
fn rpc_frames_decode_safely() {
    const LIMIT: usize = 1 << 20;
    let mut rng = Rng(SEED ^ 0x59c);
    let mut accepted = 0;
    for case in 0..cases(100_000) {
        let mut v = if rng.below(2) == 0 {
            let n = rpc::HEADER_LEN + rng.below(64);
            rng.bytes(n)
        } else {
            let name: String = (0..1 + rng.below(8)).map(|_| (b'a' + rng.below(26) as u8) as char).collect();
            let n = rng.below(32);
            let payload = rng.bytes(n);
            let h = rpc::Header::request(rng.next() & 0xffff, name.len(), payload.len());
            let mut v = h.encode().to_vec();
            v.extend_from_slice(&rpc::request_body(&name, &payload));
            if rng.below(3) > 0 {
                rng.mutate(&mut v);
            }
            v
        };
        v.resize(v.len().max(rpc::HEADER_LEN), 0);
        let (h, big) = largest_alloc(|| rpc::Header::decode(&v[..rpc::HEADER_LEN]));
        assert!(big < 4096, "case {case}: decoding allocated {big} bytes");
        let Ok(h) = h else { continue };
        let body = &v[rpc::HEADER_LEN..];
        if let Ok(n) = h.request_body_len(LIMIT) {
            assert!(n <= LIMIT + rpc::MAX_FUNCTION_NAME, "case {case}: {n} bytes accepted");
            if let Ok((name, payload)) = rpc::split_request(&h, &body[..n.min(body.len())]) {
                accepted += 1;
                assert_eq!(name.len(), h.name_len as usize, "case {case}");
                assert!(payload.end <= body.len() && payload.len() as u64 == h.payload_len, "case {case}");
            }
        }
        if let Ok(n) = h.reply_body_len(LIMIT) {
            assert!(n <= LIMIT);
        }
        let _ = rpc::WorkerRecord::decode(&v);
    }
    assert!(accepted > 100, "the generator hardly produced valid requests ({accepted})");
}

// ---- the data listener's door ------------------------------------------------------------------

#[path = "common/door_play.rs"]
mod door_play;

/// The door's handshake state machine fed genuine, mutated and random hellos, genuine, tampered,
/// replayed and random proofs, split at random points (the same checks as
/// fuzz/fuzz_targets/door.rs; `door_play::play` asserts the rules): it never panics, never
/// admits without the genuine proof, never reads past the handshake and allocates nothing large.
#[test]
fn the_door_admits_only_genuine_proofs_however_bytes_arrive() {
    use door_play::{play, Proof, ME, SIZE};
    let seed = SEED ^ 0xd00;
    let mut rng = Rng(seed);
    let (mut admitted, mut refused_proofs, mut replays) = (0, 0, 0);
    let mut recorded = None;
    for case in 0..cases(50_000) {
        let rank = rng.below(SIZE as usize + 1) as u32;
        let nonce: [u8; 32] = rng.bytes(32).try_into().unwrap();
        let random = rng.below(6) == 0;
        let mut hello = if random {
            let n = rng.below(100);
            rng.bytes(n)
        } else {
            door_play::hello(rank, &nonce).to_vec()
        };
        let pristine = !random && rank < SIZE && rank != ME;
        let mutated = rng.below(5) == 0;
        if mutated {
            rng.mutate(&mut hello);
        }
        let proof = match (rng.below(5), recorded) {
            (0 | 1, _) => Proof::Genuine,
            (2, _) => Proof::Tampered(rng.below(32), rng.next() as u8),
            (3, Some(p)) => Proof::Given(p),
            _ => {
                let n = rng.below(64);
                hello.extend(rng.bytes(n));
                Proof::Raw
            }
        };
        let (ncuts, ntail) = (1 + rng.below(8), rng.below(40));
        let cuts = rng.bytes(ncuts);
        let tail = rng.bytes(ntail);
        let (played, big) = largest_alloc(|| play(&hello, proof, &cuts, &tail));
        assert!(big < 1024, "seed {seed:#x} case {case}: an allocation of {big} bytes");
        if pristine && !mutated && matches!(proof, Proof::Genuine) {
            assert!(played.admitted(), "seed {seed:#x} case {case}: a genuine rank was not admitted: {:?}", played.decision);
        }
        if let Proof::Given(_) = proof {
            replays += played.challenge.is_some() as usize;
            assert!(!played.admitted(), "seed {seed:#x} case {case}: a proof recorded on another connection was taken");
        }
        admitted += played.admitted() as usize;
        refused_proofs += (played.challenge.is_some() && !played.admitted()) as usize;
        if played.admitted() {
            recorded = played.genuine;
        }
    }
    let n = cases(50_000);
    assert!(admitted > n / 10 && refused_proofs > n / 10 && replays > n / 50, "the generator missed cases: {admitted} admitted, {refused_proofs} proofs refused, {replays} replays");
}
