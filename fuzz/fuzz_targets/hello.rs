//! The hello of a data connection (read before anything else): decode and verify never panic;
//! verify accepts only the job's digest and id.
#![no_main]
use distcomm::transport::handshake::{token_digest, verify, Hello, HELLO_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < HELLO_LEN {
        return;
    }
    let b: &[u8; HELLO_LEN] = data[..HELLO_LEN].try_into().unwrap();
    let digest = token_digest(b"fuzz token");
    if let Some(h) = Hello::decode(b) {
        assert_eq!(&h.encode(), b);
    }
    if let Some(h) = verify(b, &digest, 42) {
        assert_eq!(h.digest, digest);
        assert_eq!(h.job_id, 42);
    }
});
