//! DC_DEBUG=DETAIL fingerprints from peers: decode never panics, accepted ones round-trip and
//! describe themselves.
#![no_main]
use distcomm::debug_check::Fingerprint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(f) = Fingerprint::decode(data) {
        assert_eq!(Fingerprint::decode(&f.encode()), Some(f));
        let _ = f.describe();
    }
});
