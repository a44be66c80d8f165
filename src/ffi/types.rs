//! Types and constants as C sees them. Enum-like inputs are plain integers so that any value a
//! caller passes is defined behaviour; the conversion to Rust enums happens in `checks`.

use crate::error::Status;

/// Status of every call. `DC_SUCCESS` is 0; values are never reused.
// repr(C): a C enum's size, so the header declares `typedef enum dc_status {...} dc_status;`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum dc_status {
    DC_SUCCESS = 0,
    /// Bad pointer, enum value, rank, root, count or op/dtype pair; nothing was sent.
    DC_ERR_INVALID_ARGUMENT = 1,
    /// Wrong state: destroyed or aborted comm, not a member, ...
    DC_ERR_INVALID_USAGE = 2,
    /// The operation or rendezvous did not finish within the timeout.
    DC_ERR_TIMEOUT = 3,
    /// A peer process died or its connection broke.
    DC_ERR_PEER_LOST = 4,
    /// Ranks called collectives that disagree (op, dtype, count, root).
    DC_ERR_MISMATCH = 5,
    /// dc_comm_abort was called on this comm (locally or by a peer).
    DC_ERR_ABORTED = 6,
    /// Backend or feature not present (no NCCL, no GPU, not compiled).
    DC_ERR_UNAVAILABLE = 7,
    /// An OS call failed (socket, mmap, file); errno text in dc_last_error().
    DC_ERR_SYSTEM = 8,
    /// Init could not form the group: unreachable store, bad token, ...
    DC_ERR_RENDEZVOUS = 9,
    /// A bug, including a caught panic.
    DC_ERR_INTERNAL = 10,
    /// An RPC handler on the remote worker failed, or is unknown.
    DC_ERR_REMOTE = 11,
}

impl From<Status> for dc_status {
    fn from(s: Status) -> dc_status {
        match s {
            Status::Success => dc_status::DC_SUCCESS,
            Status::InvalidArgument => dc_status::DC_ERR_INVALID_ARGUMENT,
            Status::InvalidUsage => dc_status::DC_ERR_INVALID_USAGE,
            Status::Timeout => dc_status::DC_ERR_TIMEOUT,
            Status::PeerLost => dc_status::DC_ERR_PEER_LOST,
            Status::Mismatch => dc_status::DC_ERR_MISMATCH,
            Status::Aborted => dc_status::DC_ERR_ABORTED,
            Status::Unavailable => dc_status::DC_ERR_UNAVAILABLE,
            Status::System => dc_status::DC_ERR_SYSTEM,
            Status::Rendezvous => dc_status::DC_ERR_RENDEZVOUS,
            Status::Internal => dc_status::DC_ERR_INTERNAL,
            Status::Remote => dc_status::DC_ERR_REMOTE,
        }
    }
}

/// Element type: one of the `DC_INT8` ... `DC_BFLOAT16` constants (NCCL's numbering).
pub type dc_dtype = i32;
pub const DC_INT8: dc_dtype = 0;
pub const DC_UINT8: dc_dtype = 1;
pub const DC_INT32: dc_dtype = 2;
pub const DC_UINT32: dc_dtype = 3;
pub const DC_INT64: dc_dtype = 4;
pub const DC_UINT64: dc_dtype = 5;
pub const DC_FLOAT16: dc_dtype = 6;
pub const DC_FLOAT32: dc_dtype = 7;
pub const DC_FLOAT64: dc_dtype = 8;
pub const DC_BFLOAT16: dc_dtype = 9;

/// Reduction operator: one of the `DC_SUM` ... `DC_BXOR` constants (first five as NCCL's).
pub type dc_op = i32;
pub const DC_SUM: dc_op = 0;
pub const DC_PROD: dc_op = 1;
pub const DC_MAX: dc_op = 2;
pub const DC_MIN: dc_op = 3;
pub const DC_AVG: dc_op = 4;
pub const DC_BAND: dc_op = 5;
pub const DC_BOR: dc_op = 6;
pub const DC_BXOR: dc_op = 7;

/// Receive from any rank (`dc_recv`, `dc_irecv`).
pub const DC_ANY_SOURCE: i32 = -1;
/// Receive with any tag (`dc_recv`, `dc_irecv`).
pub const DC_ANY_TAG: i32 = -1;
