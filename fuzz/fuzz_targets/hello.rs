//! The handshake of a data connection (read before anything else): a hello, then a proof of the
//! job token. Decoding never panics and round-trips; no proof made without the token passes.
#![no_main]
use distcomm::transport::handshake::{challenge, check_proof, decode, token_digest, Hello, HELLO_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < HELLO_LEN + 32 {
        return;
    }
    let b: &[u8; HELLO_LEN] = data[..HELLO_LEN].try_into().unwrap();
    let digest = token_digest(b"fuzz token");
    if let Some(h) = decode(b) {
        let again = Hello { digest, job_id: h.job_id, rank: h.rank, world_size: h.world_size }.encode(&h.nonce);
        assert_eq!(&again, b);
        let (_, ours) = challenge(&digest, &h, 0).unwrap();
        assert!(!check_proof(&digest, &h, 0, &ours, &data[HELLO_LEN..HELLO_LEN + 32]));
    }
});
