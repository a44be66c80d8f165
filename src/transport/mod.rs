//! Moving bytes between ranks. Transports know nothing of algorithms: they post tagged sends and
//! receives on a communicator context and complete them.

pub mod frame;
pub mod protocol;
pub mod flow;
pub mod ops;
pub mod matching;
pub mod socket;
mod endpoint;
mod heartbeat;
pub mod seal;
#[cfg(test)]
mod fake_peer;
mod abort;
mod messages;
mod probe;
mod tcp;
mod tcp_io;
mod ring_wire;
mod crowded;
pub use crowded::Trial;
mod spare;
mod wire;
pub mod handshake;
pub mod shm;
pub mod cma;
pub mod ring;
pub mod stream;
pub mod accept;

pub use ops::{CtxState, RecvOp, SendOp, TagMatch};
pub use messages::{waits_at_once, waits_at_once_up_to, WITHDRAW_GRACE_MAX};
pub use probe::Matched;
