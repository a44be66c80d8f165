//! The socket transport's public names at their old paths. The transport itself is the
//! endpoint (`endpoint`: matching, peers, abort, progress) over its wires: TCP connections
//! (`tcp`, `tcp_io`) and shared-memory rings (`ring_wire`), with single-copy reads (`cma`).

pub use super::endpoint::{Endpoint, SocketTransport, ABORT_MISMATCH, ABORT_PANIC};
pub use super::ring_wire::{RingSpin, RingSpinPause};
pub use super::tcp::{fd_limits, raise_fd_limit, watch_liveness, Listener, MeshConfig};
pub use super::tcp_io::{SocketReader, SocketReaderPause};
