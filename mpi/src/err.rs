//! Errors the MPI way: error classes, error codes that remember their message (so that
//! `MPI_Error_string` names the function and the reason), error handlers, and the guard every
//! export runs in (panic boundary, `DC_DEBUG=WARN` line, the communicator's handler).

use crate::abi_gen::*;
use crate::state;
use distcomm::log::Level;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// An MPI error on its way out: class, message, and the communicator whose handler it goes to
/// (`NO_OBJECT` for an error of no communicator, window, file or session: see `raise`).
#[derive(Debug, Clone)]
pub struct MpiErr {
    pub class: c_int,
    pub msg: String,
    pub comm: MPI_Comm,
}

pub type Res = Result<(), MpiErr>;

impl MpiErr {
    pub fn new(class: c_int, msg: impl Into<String>) -> MpiErr {
        MpiErr { class, msg: msg.into(), comm: NO_OBJECT }
    }

    /// The error goes to `comm`'s error handler (unless it is already routed to a comm).
    pub fn on(mut self, comm: MPI_Comm) -> MpiErr {
        if self.comm == NO_OBJECT {
            self.comm = comm;
        }
        self
    }
}

/// `Err(MpiErr)` with a formatted message.
#[macro_export]
macro_rules! mpi_err {
    ($class:expr, $($fmt:tt)+) => {
        Err($crate::err::MpiErr::new($class, format!($($fmt)+)))
    };
}

/// An engine error as an MPI error class (with the engine's message).
pub fn from_engine(e: &distcomm::Error) -> MpiErr {
    use distcomm::Status as S;
    let class = match e.status {
        S::Success => MPI_SUCCESS,
        S::InvalidArgument => MPI_ERR_ARG,
        S::InvalidUsage => MPI_ERR_OTHER,
        S::Timeout => MPI_ERR_OTHER,
        // ULFM's class (the ABI has none for it); the engine's message names the rank.
        S::PeerLost => MPIX_ERR_PROC_FAILED,
        S::Mismatch => MPI_ERR_OTHER,
        S::Aborted => MPI_ERR_PROC_ABORTED,
        S::Unavailable => MPI_ERR_UNSUPPORTED_OPERATION,
        S::System => MPI_ERR_OTHER,
        S::Rendezvous => MPI_ERR_OTHER,
        S::Internal => MPI_ERR_INTERN,
        S::Remote => MPI_ERR_OTHER,
    };
    MpiErr::new(class, format!("{} ({})", e.msg, e.status.name()))
}

impl From<distcomm::Error> for MpiErr {
    fn from(e: distcomm::Error) -> MpiErr {
        from_engine(&e)
    }
}

// ---- error codes ------------------------------------------------------------------------------

/// Codes above MPI_ERR_LASTCODE carry a message: code = (slot + 1) << CODE_SHIFT | class.
const CODE_SHIFT: u32 = 14;
const SLOTS: usize = 4096;

struct Codes {
    next: usize,
    msgs: Vec<String>,
}

static CODES: Mutex<Codes> = Mutex::new(Codes { next: 0, msgs: Vec::new() });

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fresh error code of `class` whose string is `text`.
fn make_code(class: c_int, text: String) -> c_int {
    if crate::errclass::is_user(class) {
        // An added class has no room for a slot: it is its own code.
        return class;
    }
    let mut c = lock(&CODES);
    if c.msgs.len() < SLOTS {
        c.msgs.resize(SLOTS, String::new());
    }
    let slot = c.next % SLOTS;
    c.next += 1;
    c.msgs[slot] = text;
    (((slot + 1) as c_int) << CODE_SHIFT) | class
}

/// The class of an error code (itself for a class), or None for a value that is neither.
pub fn class_of(code: c_int) -> Option<c_int> {
    if crate::errclass::is_user(code) {
        return crate::errclass::class_of(code);
    }
    if code < 0 {
        return None;
    }
    let class = code & ((1 << CODE_SHIFT) - 1);
    let slot = (code >> CODE_SHIFT) as usize;
    if slot > SLOTS || class_name(class).is_none() {
        return None;
    }
    Some(class)
}

/// The text of an error code: the class's description, or the recorded message.
pub fn code_string(code: c_int) -> Option<String> {
    if crate::errclass::is_user(code) {
        return crate::errclass::string_of(code);
    }
    let class = class_of(code)?;
    let slot = (code >> CODE_SHIFT) as usize;
    let base = format!("{}: {}", class_name(class)?, class_text(class));
    if slot == 0 {
        return Some(base);
    }
    let c = lock(&CODES);
    match c.msgs.get(slot - 1) {
        Some(m) if !m.is_empty() => Some(m.clone()),
        _ => Some(base),
    }
}

pub fn class_name(class: c_int) -> Option<&'static str> {
    Some(match class {
        MPI_SUCCESS => "MPI_SUCCESS",
        MPI_ERR_BUFFER => "MPI_ERR_BUFFER",
        MPI_ERR_COUNT => "MPI_ERR_COUNT",
        MPI_ERR_TYPE => "MPI_ERR_TYPE",
        MPI_ERR_TAG => "MPI_ERR_TAG",
        MPI_ERR_COMM => "MPI_ERR_COMM",
        MPI_ERR_RANK => "MPI_ERR_RANK",
        MPI_ERR_REQUEST => "MPI_ERR_REQUEST",
        MPI_ERR_ROOT => "MPI_ERR_ROOT",
        MPI_ERR_GROUP => "MPI_ERR_GROUP",
        MPI_ERR_OP => "MPI_ERR_OP",
        MPI_ERR_TOPOLOGY => "MPI_ERR_TOPOLOGY",
        MPI_ERR_DIMS => "MPI_ERR_DIMS",
        MPI_ERR_ARG => "MPI_ERR_ARG",
        MPI_ERR_UNKNOWN => "MPI_ERR_UNKNOWN",
        MPI_ERR_TRUNCATE => "MPI_ERR_TRUNCATE",
        MPI_ERR_OTHER => "MPI_ERR_OTHER",
        MPI_ERR_INTERN => "MPI_ERR_INTERN",
        MPI_ERR_PENDING => "MPI_ERR_PENDING",
        MPI_ERR_IN_STATUS => "MPI_ERR_IN_STATUS",
        MPI_ERR_ACCESS => "MPI_ERR_ACCESS",
        MPI_ERR_AMODE => "MPI_ERR_AMODE",
        MPI_ERR_ASSERT => "MPI_ERR_ASSERT",
        MPI_ERR_BAD_FILE => "MPI_ERR_BAD_FILE",
        MPI_ERR_BASE => "MPI_ERR_BASE",
        MPI_ERR_CONVERSION => "MPI_ERR_CONVERSION",
        MPI_ERR_DISP => "MPI_ERR_DISP",
        MPI_ERR_DUP_DATAREP => "MPI_ERR_DUP_DATAREP",
        MPI_ERR_FILE_EXISTS => "MPI_ERR_FILE_EXISTS",
        MPI_ERR_FILE_IN_USE => "MPI_ERR_FILE_IN_USE",
        MPI_ERR_FILE => "MPI_ERR_FILE",
        MPI_ERR_INFO_KEY => "MPI_ERR_INFO_KEY",
        MPI_ERR_INFO_NOKEY => "MPI_ERR_INFO_NOKEY",
        MPI_ERR_INFO_VALUE => "MPI_ERR_INFO_VALUE",
        MPI_ERR_INFO => "MPI_ERR_INFO",
        MPI_ERR_IO => "MPI_ERR_IO",
        MPI_ERR_KEYVAL => "MPI_ERR_KEYVAL",
        MPI_ERR_LOCKTYPE => "MPI_ERR_LOCKTYPE",
        MPI_ERR_NAME => "MPI_ERR_NAME",
        MPI_ERR_NO_MEM => "MPI_ERR_NO_MEM",
        MPI_ERR_NOT_SAME => "MPI_ERR_NOT_SAME",
        MPI_ERR_NO_SPACE => "MPI_ERR_NO_SPACE",
        MPI_ERR_NO_SUCH_FILE => "MPI_ERR_NO_SUCH_FILE",
        MPI_ERR_PORT => "MPI_ERR_PORT",
        MPI_ERR_QUOTA => "MPI_ERR_QUOTA",
        MPI_ERR_READ_ONLY => "MPI_ERR_READ_ONLY",
        MPI_ERR_RMA_ATTACH => "MPI_ERR_RMA_ATTACH",
        MPI_ERR_RMA_CONFLICT => "MPI_ERR_RMA_CONFLICT",
        MPI_ERR_RMA_RANGE => "MPI_ERR_RMA_RANGE",
        MPI_ERR_RMA_SHARED => "MPI_ERR_RMA_SHARED",
        MPI_ERR_RMA_SYNC => "MPI_ERR_RMA_SYNC",
        MPI_ERR_SERVICE => "MPI_ERR_SERVICE",
        MPI_ERR_SIZE => "MPI_ERR_SIZE",
        MPI_ERR_SPAWN => "MPI_ERR_SPAWN",
        MPI_ERR_UNSUPPORTED_DATAREP => "MPI_ERR_UNSUPPORTED_DATAREP",
        MPI_ERR_UNSUPPORTED_OPERATION => "MPI_ERR_UNSUPPORTED_OPERATION",
        MPI_ERR_WIN => "MPI_ERR_WIN",
        MPI_ERR_RMA_FLAVOR => "MPI_ERR_RMA_FLAVOR",
        MPI_ERR_PROC_ABORTED => "MPI_ERR_PROC_ABORTED",
        MPI_ERR_VALUE_TOO_LARGE => "MPI_ERR_VALUE_TOO_LARGE",
        MPI_ERR_SESSION => "MPI_ERR_SESSION",
        MPI_ERR_ERRHANDLER => "MPI_ERR_ERRHANDLER",
        MPI_ERR_ABI => "MPI_ERR_ABI",
        MPIX_ERR_PROC_FAILED => "MPIX_ERR_PROC_FAILED",
        _ => return None,
    })
}

fn class_text(class: c_int) -> &'static str {
    match class {
        MPI_SUCCESS => "no error",
        MPI_ERR_BUFFER => "invalid buffer pointer",
        MPI_ERR_COUNT => "invalid count argument",
        MPI_ERR_TYPE => "invalid datatype",
        MPI_ERR_TAG => "invalid tag",
        MPI_ERR_COMM => "invalid communicator",
        MPI_ERR_RANK => "invalid rank",
        MPI_ERR_REQUEST => "invalid request",
        MPI_ERR_ROOT => "invalid root",
        MPI_ERR_GROUP => "invalid group",
        MPI_ERR_OP => "invalid operation",
        MPI_ERR_ARG => "invalid argument of some other kind",
        MPI_ERR_UNKNOWN => "unknown error",
        MPI_ERR_TRUNCATE => "message truncated on receive",
        MPI_ERR_OTHER => "known error not in this list",
        MPI_ERR_INTERN => "internal MPI (implementation) error",
        MPI_ERR_PENDING => "pending request",
        MPI_ERR_IN_STATUS => "error code is in status",
        MPI_ERR_UNSUPPORTED_OPERATION => "unsupported operation",
        MPI_ERR_PROC_ABORTED => "operation failed because a peer process has aborted",
        MPI_ERR_ERRHANDLER => "invalid error handler",
        MPIX_ERR_PROC_FAILED => "a process the operation needs has failed",
        _ => "error",
    }
}

// ---- error handlers -----------------------------------------------------------------------------

/// A user error handler made by MPI_Comm_create_errhandler.
pub type UserHandler = MPI_Comm_errhandler_function;

pub const ERRH_BASE: usize = 0x4000_0000;

static USER_HANDLERS: Mutex<Vec<UserHandler>> = Mutex::new(Vec::new());

pub fn new_user_handler(f: UserHandler) -> MPI_Errhandler {
    let mut v = lock(&USER_HANDLERS);
    v.push(f);
    ERRH_BASE + v.len() - 1
}

pub fn valid_errhandler(h: MPI_Errhandler) -> bool {
    matches!(h, MPI_ERRORS_ARE_FATAL | MPI_ERRORS_ABORT | MPI_ERRORS_RETURN)
        || (h >= ERRH_BASE && h - ERRH_BASE < lock(&USER_HANDLERS).len())
}

thread_local! {
    /// This thread is inside a user error handler.
    static IN_HANDLER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Calls the user error handler `h` for `code` on `comm`. An error raised by an MPI call that
/// the handler itself makes is returned to it without calling a handler again: one that fails
/// on every call (an unsupported function) would otherwise recurse until the stack ends.
pub fn call_user_handler(h: MPI_Errhandler, mut comm: MPI_Comm, code: c_int) {
    if IN_HANDLER.with(|f| f.replace(true)) {
        return;
    }
    let f = lock(&USER_HANDLERS).get(h.wrapping_sub(ERRH_BASE)).copied();
    if let Some(f) = f {
        let mut c = code;
        // SAFETY: the user's handler, called as the standard says (comm, code, ...).
        unsafe { f(&mut comm, &mut c) };
    }
    IN_HANDLER.with(|f| f.set(false));
}

/// The `comm` of an error that belongs to no object.
pub const NO_OBJECT: MPI_Comm = MPI_COMM_NULL;

/// Where an error of no object goes: MPI_COMM_SELF's handler (MPI 4), unless the program set
/// none there and set one on MPI_COMM_WORLD, where MPI 3 sent such errors; MPICH does the same
/// for programs written before MPI 4 (its `attrerrtype` test sets only MPI_COMM_WORLD's).
fn no_object_comm() -> MPI_Comm {
    if !SET_ON_SELF.load(Ordering::Relaxed) && SET_ON_WORLD.load(Ordering::Relaxed) {
        MPI_COMM_WORLD
    } else {
        MPI_COMM_SELF
    }
}

/// Whether the program set MPI_COMM_SELF's or MPI_COMM_WORLD's error handler (see
/// `no_object_comm`).
static SET_ON_SELF: AtomicBool = AtomicBool::new(false);
static SET_ON_WORLD: AtomicBool = AtomicBool::new(false);

/// The program set `comm`'s error handler.
pub fn handler_set_on(comm: MPI_Comm) {
    match comm {
        MPI_COMM_SELF => SET_ON_SELF.store(true, Ordering::Relaxed),
        MPI_COMM_WORLD => SET_ON_WORLD.store(true, Ordering::Relaxed),
        _ => {}
    }
}

/// Raises `e` (already logged) on its communicator's handler; returns the code to give back.
fn raise(func: &str, e: MpiErr) -> c_int {
    let text = format!("{func}: {}: {}", class_name(e.class).unwrap_or("MPI_ERR_UNKNOWN"), e.msg);
    if distcomm::log::enabled(Level::Warn) {
        distcomm::log::write(Level::Warn, state::world_rank(), format_args!("{text}"));
    }
    let code = make_code(e.class, text.clone());
    let comm = if e.comm == NO_OBJECT { no_object_comm() } else { e.comm };
    let handler = state::errhandler_of(comm);
    match handler {
        MPI_ERRORS_RETURN => code,
        h if h >= ERRH_BASE => {
            call_user_handler(h, comm, code);
            code
        }
        _ => {
            // MPI_ERRORS_ARE_FATAL (the default) and MPI_ERRORS_ABORT: the job ends.
            state::say(&format!("{}: fatal MPI error: {text}\n", state::who()));
            if e.class == MPI_ERR_PROC_ABORTED {
                // Another rank aborted (MPI_Abort or its own fatal error) and is exiting with
                // its code: let it go first, so that the launcher reports its status, not ours.
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            state::abort_job(comm, 1)
        }
    }
}

/// Runs an export's implementation: panics become MPI_ERR_INTERN, errors go to their handler.
pub fn guard(func: &str, f: impl FnOnce() -> Res) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => MPI_SUCCESS,
        Ok(Err(e)) => raise(func, e),
        Err(p) => {
            let what = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            raise(func, MpiErr::new(MPI_ERR_INTERN, format!("internal error (a panic in distcomm's MPI layer: {what})")).on(MPI_COMM_WORLD))
        }
    }
}

/// What every function outside the supported set does.
pub fn unsupported(func: &str, comm: MPI_Comm) -> c_int {
    let comm = if state::is_comm_handle(comm) { comm } else { MPI_COMM_SELF };
    raise(func, MpiErr::new(MPI_ERR_UNSUPPORTED_OPERATION, "not supported by distcomm's MPI library (libmpi_abi.so.1) yet").on(comm))
}

/// MPI_T functions (the tool interface) return their own error class and never call handlers.
pub fn unsupported_tool(func: &str) -> c_int {
    if distcomm::log::enabled(Level::Warn) {
        distcomm::log::write(Level::Warn, state::world_rank(), format_args!("{func}: MPI_T_ERR_NOT_SUPPORTED: the tool interface is not supported by distcomm's MPI library"));
    }
    MPI_T_ERR_NOT_SUPPORTED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_remember_class_and_message() {
        let code = make_code(MPI_ERR_RANK, "MPI_Send: MPI_ERR_RANK: dest 9".into());
        assert!(code > MPI_ERR_LASTCODE);
        assert_eq!(class_of(code), Some(MPI_ERR_RANK));
        assert_eq!(code_string(code).as_deref(), Some("MPI_Send: MPI_ERR_RANK: dest 9"));
        // A class is its own code, with the standard's description.
        assert_eq!(class_of(MPI_ERR_TRUNCATE), Some(MPI_ERR_TRUNCATE));
        assert!(code_string(MPI_ERR_TRUNCATE).unwrap().starts_with("MPI_ERR_TRUNCATE: message truncated"));
        assert_eq!(class_of(-1), None);
        assert_eq!(class_of(9999), None);
        assert!(code_string(MPI_SUCCESS).unwrap().starts_with("MPI_SUCCESS"));
    }

    #[test]
    fn every_class_of_the_abi_has_a_name() {
        for c in 0..=MPI_ERR_ABI {
            assert!(class_name(c).is_some(), "class {c}");
        }
        assert!(class_name(MPI_ERR_ABI + 1).is_none());
        // The extension's class is beyond the ABI's, and a class like theirs.
        assert!(MPIX_ERR_PROC_FAILED > MPI_ERR_ABI && MPIX_ERR_PROC_FAILED < MPI_T_ERR_CANNOT_INIT);
        assert_eq!(class_of(MPIX_ERR_PROC_FAILED), Some(MPIX_ERR_PROC_FAILED));
        assert!(code_string(MPIX_ERR_PROC_FAILED).unwrap().starts_with("MPIX_ERR_PROC_FAILED: a process"));
        let code = make_code(MPIX_ERR_PROC_FAILED, "MPI_Recv: rank 1 is lost".into());
        assert_eq!(class_of(code), Some(MPIX_ERR_PROC_FAILED));
    }

    #[test]
    fn engine_statuses_map_to_classes() {
        let e = distcomm::Error::new(distcomm::Status::Aborted, "x");
        assert_eq!(from_engine(&e).class, MPI_ERR_PROC_ABORTED);
        let e = distcomm::Error::new(distcomm::Status::Internal, "x");
        assert_eq!(from_engine(&e).class, MPI_ERR_INTERN);
        let e = distcomm::Error::new(distcomm::Status::PeerLost, "rank 1 is lost: connection closed");
        let m = from_engine(&e);
        assert!(m.class == MPIX_ERR_PROC_FAILED && m.msg.contains("rank 1"), "{m:?}");
    }
}
