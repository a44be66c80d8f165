//! The wires a peer's messages travel, behind one small trait, and the one table they are
//! chosen from: the first wire in [`WIRES`] that can connect a pair carries that pair's
//! messages (a pair that has shared-memory rings uses them for every message, keeping them in
//! order; every other pair uses its TCP connection, made on demand). Adding a wire is a new
//! `impl Wire` and a row in the table.
//!
//! What a wire does not decide stays with the endpoint: matching, the posted and unexpected
//! queues, abort and peer state. Single-copy reads (`cma`) are how the TCP wire moves a large
//! message between ranks of one host (an `Rts` over the socket, the receiver reading the
//! sender's memory); the ring wire streams such a message through the ring instead.

use super::endpoint::{Peer, SocketTransport};
use super::frame::Header;
use super::matching::Unexpected;
use super::ops::{CtxState, RecvOp, SendOp};
use super::ring_wire::RingWire;
use super::tcp_io::TcpWire;
use crate::buffer::ConstBuf;
use crate::completion::Done;
use crate::error::{Error, Result};
use std::sync::Arc;

/// One way of moving frames to a peer.
pub(super) trait Wire: Sync {
    /// Whether this wire connects us to `peer` (rings: set up for the pair at init; TCP: every
    /// pair, from the address book).
    fn can_connect(&self, peer: &Peer) -> bool;

    /// Sends the message of `op` (tag, check) on context `ctx`: whole, or announced for the
    /// receiver to fetch. The op completes when its buffer is free again.
    fn send(&self, t: &SocketTransport, peer: &Arc<Peer>, ctx: &Arc<CtxState>, tag: u64, check: u32, op: Arc<SendOp>) -> Result<Arc<SendOp>>;

    /// Sends a small message at once, complete on return (no op to wait on); None where the
    /// wire cannot (the caller posts the send instead).
    fn send_inline(&self, _t: &SocketTransport, _peer: &Arc<Peer>, _ctx: &CtxState, _tag: u64, _check: u32, _buf: ConstBuf) -> Option<Result<Done>> {
        None
    }

    /// A receive matched `msg`, a message still in the sender's memory (its `Rts` came over
    /// this wire): has it brought into the receive.
    fn fetch(&self, t: &SocketTransport, peer: &Arc<Peer>, op: Arc<RecvOp>, msg: Unexpected);

    /// Sends a control frame that needs no order with the messages (`Fin`, `Cts`).
    fn reply(&self, t: &SocketTransport, peer: &Arc<Peer>, hdr: Header);

    /// Sends a control frame after everything sent to `peer` before it (`Withdraw`, which
    /// must reach the peer after the `Rts` it names).
    fn send_in_order(&self, t: &SocketTransport, peer: &Arc<Peer>, hdr: Header);

    /// Fails the operations of aborted contexts that this wire holds for `peer` (a receive
    /// being filled, a send being written or streamed): their buffers are no longer used.
    fn fail_aborted(&self, t: &SocketTransport, peer: &Peer);

    /// Nothing more comes from `peer`: fails (with `err`) every operation this wire holds
    /// for it.
    fn fail_all(&self, t: &SocketTransport, peer: &Peer, err: &dyn Fn() -> Error);

    /// Send `op` is withdrawn: this wire stops using its buffer (dropped if not started, the
    /// rest copied if under way, so the receiver still gets the message whole).
    fn withdraw_send(&self, t: &SocketTransport, peer: &Peer, op: &Arc<SendOp>);

    /// Whether the peer's process holds its core right now, if the wire can tell (a waiter
    /// then polls a little longer before it yields; see `completion::Poll`).
    fn peer_on_core(&self, _peer: &Peer) -> bool {
        false
    }
}

/// The wires in the order they are tried; the last connects every pair. (Failing and
/// withdrawing operations asks every wire: a pair that sends on its ring still has a socket
/// for control frames.)
pub(super) static WIRES: [&dyn Wire; 2] = [&RingWire, &TcpWire];

impl SocketTransport {
    /// The wire that carries our messages to `peer` (see [`WIRES`]).
    #[inline]
    pub(super) fn wire(&self, peer: &Peer) -> &'static dyn Wire {
        WIRES.iter().copied().find(|w| w.can_connect(peer)).unwrap_or(&TcpWire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ring::{RingSegment, MAX_RING_BYTES};
    use crate::transport::ring_wire::{RingOut, RingTx};
    use std::sync::Mutex;

    fn chosen(peer: &Peer) -> &'static dyn Wire {
        WIRES.iter().copied().find(|w| w.can_connect(peer)).expect("some wire connects every pair")
    }

    #[test]
    fn a_pair_with_a_ring_takes_the_ring_and_every_other_pair_tcp() {
        let plain = Peer::new(1, None);
        assert!(std::ptr::addr_eq(chosen(&plain), &TcpWire as &dyn Wire));
        let nonce = 0x7770_0000 ^ u64::from(std::process::id());
        let path = std::path::PathBuf::from(format!("/dev/shm/distcomm-{}-p2p-wiretest-{nonce:x}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let seg = RingSegment::create(&path, 2, MAX_RING_BYTES, nonce).unwrap();
        std::fs::remove_file(&path).unwrap();
        let near = Peer::new(1, crate::transport::cma::probe(&crate::transport::cma::advertisement()));
        let _ = near.ring_out.set(RingOut { seg, index: 0, tx: Mutex::new(RingTx::default()) });
        assert!(std::ptr::addr_eq(chosen(&near), &RingWire as &dyn Wire));
        assert!(WIRES.last().unwrap().can_connect(&plain), "the last wire connects every pair");
    }
}
