//! `dc_status_name`, `dc_last_error`, `dc_version`.

use super::boundary::{guard_value, last_error_ptr};
use crate::error::Status;
use libc::c_char;

/// Name of a status ("DC_SUCCESS", "DC_ERR_TIMEOUT", ...). Never NULL: an unknown value gives
/// "DC_ERR_UNKNOWN". The string is static. Never blocks.
#[no_mangle]
pub extern "C" fn dc_status_name(s: u32) -> *const c_char {
    let unknown = c"DC_ERR_UNKNOWN".as_ptr();
    guard_value(unknown, || Status::from_raw(s).map_or(unknown, |st| st.c_name().as_ptr()))
}

/// This thread's message for its last failed call, naming the call, the comm's rank and the peer
/// involved; "" if no call has failed on this thread. Valid until this thread's next failing call.
/// Never NULL, never blocks.
#[no_mangle]
pub extern "C" fn dc_last_error() -> *const c_char {
    guard_value(b"\0".as_ptr() as *const c_char, last_error_ptr)
}

/// The library version as major*10000 + minor*100 + patch.
#[no_mangle]
pub extern "C" fn dc_version() -> u32 {
    let num = |s: &str| s.parse::<u32>().unwrap_or(0);
    num(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + num(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + num(env!("CARGO_PKG_VERSION_PATCH"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn every_status_has_its_c_name() {
        let names = [
            "DC_SUCCESS", "DC_ERR_INVALID_ARGUMENT", "DC_ERR_INVALID_USAGE", "DC_ERR_TIMEOUT", "DC_ERR_PEER_LOST", "DC_ERR_MISMATCH",
            "DC_ERR_ABORTED", "DC_ERR_UNAVAILABLE", "DC_ERR_SYSTEM", "DC_ERR_RENDEZVOUS", "DC_ERR_INTERNAL", "DC_ERR_REMOTE",
        ];
        for (v, want) in names.iter().enumerate() {
            let name = unsafe { CStr::from_ptr(dc_status_name(v as u32)) }.to_str().unwrap();
            assert_eq!(name, *want);
            assert_eq!(Status::from_raw(v as u32).unwrap().name(), *want);
        }
        let unknown = unsafe { CStr::from_ptr(dc_status_name(999)) };
        assert_eq!(unknown.to_str().unwrap(), "DC_ERR_UNKNOWN");
    }
}
