//! The data listener's door (its non-blocking handshake state machine, without a socket): a
//! dialer sends a genuine or arbitrary hello, then a genuine, tampered, given or arbitrary
//! proof, split at arbitrary points. The door never panics, reads nothing past the handshake's
//! fixed sizes, challenges only acceptable hellos and admits only the genuine proof (the checks
//! are in tests/common/door_play.rs, which tests/parsers_prop.rs runs on every `cargo test`).
//! The door has no length fields to trust; libFuzzer's -malloc_limit_mb catches big allocations.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../../tests/common/door_play.rs"]
mod door_play;
use door_play::{play, Proof, SIZE};

fuzz_target!(|data: &[u8]| {
    // mode: bit 0 an arbitrary hello (else a genuine one), bits 1-2 the proof; then the rank
    // claimed, how many bytes give the cuts, the cuts, and the rest of the stream.
    let [mode, rank, ncuts, rest @ ..] = data else { return };
    let (cuts, rest) = rest.split_at((*ncuts as usize).min(rest.len()));
    let hello = if mode & 1 == 1 {
        rest.to_vec()
    } else {
        let mut h = door_play::hello(*rank as u32 % (SIZE + 1), &[*mode; 32]).to_vec();
        h.extend_from_slice(rest);
        h
    };
    let proof = match (mode >> 1) & 3 {
        0 => Proof::Genuine,
        1 => Proof::Tampered(*rank as usize, *ncuts),
        2 => {
            let mut p = [0u8; 32];
            let n = rest.len().min(32);
            p[..n].copy_from_slice(&rest[..n]);
            Proof::Given(p)
        }
        _ => Proof::Raw,
    };
    let played = play(&hello, proof, cuts, rest);
    if matches!(proof, Proof::Given(_)) {
        // Random bytes can match a fresh HMAC over a fresh nonce only by chance (2^-256).
        assert!(!played.admitted());
    }
});
