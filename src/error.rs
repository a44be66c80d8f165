//! Status codes and the error type every layer returns.

use std::fmt;

/// Result status of every `dc_*` call. Values are part of the ABI and never reused.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Success = 0,
    InvalidArgument = 1,
    InvalidUsage = 2,
    Timeout = 3,
    PeerLost = 4,
    Mismatch = 5,
    Aborted = 6,
    Unavailable = 7,
    System = 8,
    Rendezvous = 9,
    Internal = 10,
    Remote = 11,
}

impl Status {
    pub const ALL: [Status; 12] = [
        Status::Success,
        Status::InvalidArgument,
        Status::InvalidUsage,
        Status::Timeout,
        Status::PeerLost,
        Status::Mismatch,
        Status::Aborted,
        Status::Unavailable,
        Status::System,
        Status::Rendezvous,
        Status::Internal,
        Status::Remote,
    ];

    /// The status with this C value, if any.
    pub fn from_raw(v: u32) -> Option<Status> {
        Status::ALL.iter().copied().find(|s| *s as u32 == v)
    }

    /// The C name ("DC_SUCCESS", ...), NUL-terminated for `dc_status_name`.
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            Status::Success => c"DC_SUCCESS",
            Status::InvalidArgument => c"DC_ERR_INVALID_ARGUMENT",
            Status::InvalidUsage => c"DC_ERR_INVALID_USAGE",
            Status::Timeout => c"DC_ERR_TIMEOUT",
            Status::PeerLost => c"DC_ERR_PEER_LOST",
            Status::Mismatch => c"DC_ERR_MISMATCH",
            Status::Aborted => c"DC_ERR_ABORTED",
            Status::Unavailable => c"DC_ERR_UNAVAILABLE",
            Status::System => c"DC_ERR_SYSTEM",
            Status::Rendezvous => c"DC_ERR_RENDEZVOUS",
            Status::Internal => c"DC_ERR_INTERNAL",
            Status::Remote => c"DC_ERR_REMOTE",
        }
    }

    pub fn name(self) -> &'static str {
        self.c_name().to_str().unwrap_or("DC_ERR_UNKNOWN")
    }
}

/// An error: a status plus a message for `dc_last_error()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub msg: String,
}

impl Error {
    pub fn new(status: Status, msg: impl Into<String>) -> Error {
        Error { status, msg: msg.into() }
    }

    /// An OS error with errno text.
    pub fn system(what: impl fmt::Display, e: std::io::Error) -> Error {
        Error::new(Status::System, format!("{what}: {e}"))
    }

    /// Prefixes the message with more context ("dc_allreduce: ...").
    pub fn context(mut self, ctx: impl fmt::Display) -> Error {
        self.msg = format!("{ctx}: {}", self.msg);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.msg)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// `err!(Status::X, "fmt", args)` builds an `Error`.
#[macro_export]
macro_rules! err {
    ($status:expr, $($fmt:tt)+) => {
        $crate::error::Error::new($status, format!($($fmt)+))
    };
}

/// `bail!(Status::X, "fmt", args)` returns an `Err(Error)`.
#[macro_export]
macro_rules! bail {
    ($status:expr, $($fmt:tt)+) => {
        return Err($crate::err!($status, $($fmt)+))
    };
}
