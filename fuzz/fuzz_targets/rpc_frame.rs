//! RPC frames as a callee and a caller read them: the 32-byte header, the body length it
//! announces (checked against the size limit before anything is allocated), a request body split
//! into function name and payload, and the worker records exchanged at start-up. Nothing panics;
//! whatever is accepted stays within what came.
#![no_main]
use distcomm::rpc::protocol::{split_request, Header, WorkerRecord, HEADER_LEN, MAX_FUNCTION_NAME};
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let _ = WorkerRecord::decode(data);
    let Some(head) = data.get(..HEADER_LEN) else { return };
    let Ok(h) = Header::decode(head) else { return };
    let body = &data[HEADER_LEN..];
    if let Ok(n) = h.request_body_len(LIMIT) {
        assert!(n <= LIMIT + MAX_FUNCTION_NAME);
        if let Ok((name, payload)) = split_request(&h, &body[..n.min(body.len())]) {
            assert_eq!(name.len(), h.name_len as usize);
            assert!(payload.end <= body.len() && payload.len() as u64 == h.payload_len);
        }
    }
    if let Ok(n) = h.reply_body_len(LIMIT) {
        assert!(n <= LIMIT);
    }
});
