//! The large-message tests of tests/threads.rs with the messages streamed through the
//! shared-memory rings in chunks, as where single copies are not allowed or a message is below
//! `DC_CMA_MIN` (there a receiver asks the sender to stream rather than reading the sender's
//! memory itself). Its own test binary: the choice is made once per process, from the
//! environment.

mod common;
#[path = "common/large_p2p.rs"]
mod large_p2p;

/// Every message that does not go inline is streamed: single copies only from 1 TiB. Set
/// before the first job of this process reads its parameters.
fn streaming_only() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("DC_CMA_MIN", (1u64 << 40).to_string()));
}

#[test]
fn streamed_messages_arrive_whole_and_truncate_safely() {
    streaming_only();
    large_p2p::arrive_whole_and_truncate_safely();
}

#[test]
fn an_abort_ends_a_message_streaming_through_the_ring() {
    streaming_only();
    large_p2p::an_abort_ends_a_large_message();
}

#[test]
fn ring_streams_keep_order_in_both_directions() {
    streaming_only();
    large_p2p::keep_order_in_both_directions();
}

#[test]
fn a_withdrawn_streamed_send_is_never_read_after_it_ends() {
    streaming_only();
    large_p2p::a_withdrawn_large_send_is_never_read_after_it_ends(2);
}
