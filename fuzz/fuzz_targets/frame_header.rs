//! Data-connection frame headers (32 bytes from a peer): decode never panics, and whatever it
//! accepts encodes back to the same bytes (reserved bytes aside).
#![no_main]
use distcomm::transport::frame::{Header, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN {
        return;
    }
    let b: &[u8; HEADER_LEN] = data[..HEADER_LEN].try_into().unwrap();
    if let Ok(h) = Header::decode(b) {
        let mut want = *b;
        want[2] = 0;
        want[3] = 0;
        assert_eq!(h.encode(), want);
        assert!(h.len <= isize::MAX as u64);
    }
});
