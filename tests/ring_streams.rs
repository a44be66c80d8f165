//! The large-message tests of tests/threads.rs with the messages streamed through the
//! shared-memory rings in chunks, as where a host's ranks outnumber its cores (there a
//! receiver asks the sender to stream rather than reading the sender's memory itself). Its own
//! test binary: the choice is made once per process, from the launcher's variables.

mod common;
#[path = "common/large_p2p.rs"]
mod large_p2p;

/// Four ranks said to share one core: the library streams large same-host messages. Set
/// before the first job of this process reads its parameters.
fn as_if_ranks_outnumber_cores() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::env::set_var("LOCAL_WORLD_SIZE", "4");
        std::env::set_var("DC_LOCAL_CORES", "1");
    });
}

#[test]
fn streamed_messages_arrive_whole_and_truncate_safely() {
    as_if_ranks_outnumber_cores();
    large_p2p::arrive_whole_and_truncate_safely();
}

#[test]
fn an_abort_ends_a_message_streaming_through_the_ring() {
    as_if_ranks_outnumber_cores();
    large_p2p::an_abort_ends_a_large_message();
}

#[test]
fn ring_streams_keep_order_in_both_directions() {
    as_if_ranks_outnumber_cores();
    large_p2p::keep_order_in_both_directions();
}

#[test]
fn a_withdrawn_streamed_send_is_never_read_after_it_ends() {
    as_if_ranks_outnumber_cores();
    large_p2p::a_withdrawn_large_send_is_never_read_after_it_ends(2);
}
