//! The data connections' stateful frame decoder and the shared-memory ring records: fed a
//! stream in pieces of fuzzer-chosen sizes, nothing panics, a body is never read past its length
//! and an error is final (the peer is then lost).
#![no_main]
use distcomm::transport::protocol::{decode_record, Decoder, Step};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_record(data);
    let Some((&cut, stream)) = data.split_first() else { return };
    let piece = usize::from(cut).max(1);
    let mut d = Decoder::new();
    let mut at = 0;
    while at < stream.len() {
        let end = (at + piece).min(stream.len());
        let mut input = &stream[at..end];
        while !input.is_empty() {
            match d.decode(input) {
                Ok((n, step)) => {
                    assert!(n <= input.len() && (n > 0 || step.is_some()));
                    if let Some(Step::Body { hdr, off, data }) = step {
                        assert!(off as u64 + data.len() as u64 <= hdr.len);
                    }
                    input = &input[n..];
                }
                Err(_) => return,
            }
        }
        at = end;
    }
});
