//! A dialer at the data listener's door (`distcomm::transport::accept::fuzzing`), its bytes split
//! anywhere, and the door's rules it checks. Shared by tests/parsers_prop.rs and the cargo-fuzz
//! target fuzz/fuzz_targets/door.rs (each includes it with `#[path]`).

#![allow(dead_code)]

use distcomm::transport::accept::fuzzing::{Door, Event};
use distcomm::transport::handshake::{answer, decode, token_digest, Hello, Received, Session, CHALLENGE_LEN, HELLO_LEN};

pub const TOKEN: &[u8] = b"door token";
pub const JOB: u64 = 0x00D0_0D00;
/// The door is rank `ME` of `SIZE`.
pub const ME: u32 = 1;
pub const SIZE: u32 = 4;
const PROOF_LEN: usize = 32;

/// How the dialer answers the door's challenge.
#[derive(Clone, Copy, Debug)]
pub enum Proof {
    /// With the job token, as a genuine rank does (waiting for the challenge: what `hello` holds
    /// beyond a hello's bytes is not sent).
    Genuine,
    /// The genuine proof with byte `.0 % 32` xored with `.1 | 1`.
    Tampered(usize, u8),
    /// These bytes (a proof recorded on another connection, say), after the challenge.
    Given([u8; PROOF_LEN]),
    /// Whatever `hello` holds beyond a hello's bytes, sent before the challenge came.
    Raw,
}

/// What the door did.
#[derive(Debug, Default)]
pub struct Played {
    pub challenge: Option<[u8; CHALLENGE_LEN]>,
    /// The proof a genuine rank would have given to that challenge.
    pub genuine: Option<[u8; PROOF_LEN]>,
    /// Its decision (None: still waiting for bytes).
    pub decision: Option<Event>,
}

impl Played {
    pub fn admitted(&self) -> bool {
        matches!(self.decision, Some(Event::Admitted(_)))
    }
}

/// A genuine rank's hello as `rank`.
pub fn hello(rank: u32, nonce: &[u8; 32]) -> [u8; HELLO_LEN] {
    Hello { digest: token_digest(TOKEN), job_id: JOB, rank, world_size: SIZE }.encode(nonce)
}

/// A hello the door must challenge: this job's, a possible rank, not its own.
fn acceptable(b: &[u8]) -> Option<Received> {
    let h = decode(b.get(..HELLO_LEN)?.try_into().unwrap())?;
    (h.job_id == JOB && h.world_size == SIZE && h.rank < SIZE && h.rank != ME).then_some(h)
}

/// Feeds `bytes` in pieces of the sizes `cuts` gives (cycled from `*k`) until the door decides
/// something or the bytes run out; returns how many it took and what it said.
fn feed(door: &mut Door, bytes: &[u8], cuts: &[u8], k: &mut usize) -> (usize, Option<Event>) {
    let mut pos = 0;
    while pos < bytes.len() {
        let cut = cuts.get(*k % cuts.len().max(1)).map_or(bytes.len(), |&c| c as usize % 97 + 1);
        *k += 1;
        let piece = &bytes[pos..(pos + cut).min(bytes.len())];
        let (n, event) = door.feed(piece);
        assert!(n <= piece.len(), "took {n} of {} bytes", piece.len());
        pos += n;
        if event.is_some() {
            return (pos, event);
        }
        assert_eq!(n, piece.len(), "a door that has not decided left bytes of its phase");
    }
    (pos, None)
}

/// Sends `hello` to a fresh door, then (once challenged) the proof `proof` and `tail`, split at
/// `cuts`, and panics where the door breaks a rule: it reads nothing beyond the handshake's fixed
/// sizes, and nothing once it decided; it challenges exactly the acceptable hellos, with a
/// challenge that proves the token to a genuine rank; it admits exactly the genuine proof, with
/// the session of both nonces; every refusal says why.
pub fn play(hello: &[u8], proof: Proof, cuts: &[u8], tail: &[u8]) -> Played {
    let mut door = Door::new(TOKEN, JOB, ME, SIZE);
    let mut k = 0;
    let mut played = Played::default();
    let (took, event) = feed(&mut door, hello, cuts, &mut k);
    let Some(event) = event else {
        assert!(took < HELLO_LEN, "a whole hello and no answer");
        return played;
    };
    assert_eq!(took, HELLO_LEN, "answered a hello of {took} bytes");
    let h = acceptable(hello);
    let c = match event {
        Event::Challenge(c) => c,
        Event::Refused(why) => {
            assert!(h.is_none(), "refused an acceptable hello: {why}");
            assert!(!why.is_empty());
            played.decision = Some(Event::Refused(why));
            return after_decision(door, played, tail);
        }
        Event::Admitted(s) => panic!("admitted on its hello alone: {s:?}"),
    };
    let h = h.expect("challenged a hello it must refuse");
    let claimed = Hello { digest: token_digest(TOKEN), job_id: h.job_id, rank: h.rank, world_size: h.world_size };
    let genuine = answer(&claimed, &h.nonce, ME, &c).expect("the door's challenge proves the token");
    played.challenge = Some(c);
    played.genuine = Some(genuine);

    let mut rest = match proof {
        Proof::Genuine => genuine.to_vec(),
        Proof::Tampered(i, x) => {
            let mut p = genuine;
            p[i % PROOF_LEN] ^= x | 1;
            p.to_vec()
        }
        Proof::Given(p) => p.to_vec(),
        Proof::Raw => hello[HELLO_LEN..].to_vec(),
    };
    rest.extend_from_slice(tail);
    let (took, event) = feed(&mut door, &rest, cuts, &mut k);
    let Some(event) = event else {
        assert!(took < PROOF_LEN, "a whole proof and no decision");
        return played;
    };
    assert_eq!(took, PROOF_LEN, "decided on a proof of {took} bytes");
    let given = &rest[..PROOF_LEN];
    match &event {
        Event::Admitted(s) => {
            assert_eq!(given, genuine, "admitted without a valid proof");
            let want = Session { job_id: JOB, dialer: h.rank, acceptor: ME, dialer_nonce: h.nonce, acceptor_nonce: c[1..33].try_into().unwrap() };
            assert_eq!(*s, want);
        }
        Event::Refused(why) => {
            assert_ne!(given, genuine, "refused the genuine proof: {why}");
            assert!(!why.is_empty());
        }
        Event::Challenge(_) => panic!("challenged twice"),
    }
    played.decision = Some(event);
    after_decision(door, played, tail)
}

/// Once it decided, the door takes nothing more.
fn after_decision(mut door: Door, played: Played, tail: &[u8]) -> Played {
    assert_eq!(door.feed(if tail.is_empty() { b"x" } else { tail }), (0, None), "read after its decision");
    played
}
