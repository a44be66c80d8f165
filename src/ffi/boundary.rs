//! The panic boundary every export runs inside, and the thread-local `dc_last_error` text.

use super::types::dc_status;
use crate::error::{Error, Result, Status};
use std::cell::RefCell;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error (interior NULs are replaced).
pub fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "?")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Pointer to this thread's last error text; valid until this thread's next failing call.
pub fn last_error_ptr() -> *const libc::c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Runs the body of export `name`: converts its `Result` to a status, records the error text
/// (prefixed with the call's name), and turns a panic into `DC_ERR_INTERNAL`.
pub fn guard<F: FnOnce() -> Result<()>>(name: &str, body: F) -> dc_status {
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let err = match outcome {
        Ok(Ok(())) => return dc_status::DC_SUCCESS,
        Ok(Err(e)) => e,
        Err(panic) => Error::new(Status::Internal, format!("internal error (panic): {}", crate::panics::message(&*panic))),
    };
    set_last_error(&format!("{name}: {}", err.msg));
    crate::log::debug_error(name, &err);
    err.status.into()
}

/// Like `guard` for exports that cannot return a status: a panic yields `fallback`.
pub fn guard_value<T, F: FnOnce() -> T>(fallback: T, body: F) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(fallback)
}
