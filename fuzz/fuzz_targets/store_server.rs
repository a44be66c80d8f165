//! The TCP store server's parsers: the 72-byte client hello (its proof checked against a fixed challenge), then a stream of requests as from
//! an authenticated client. Nothing may panic, hang or allocate what a length field claims.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = distcomm::rendezvous::tcp_store::fuzz_server_input(data);
});
