//! `dc_status_name`, `dc_last_error`, `dc_version`.

use super::boundary::{guard_value, last_error_ptr};
use libc::c_char;

static UNKNOWN: &[u8] = b"DC_ERR_UNKNOWN\0";

/// Name of a status ("DC_SUCCESS", "DC_ERR_TIMEOUT", ...). Never NULL: an unknown value gives
/// "DC_ERR_UNKNOWN". The string is static. Never blocks.
#[no_mangle]
pub extern "C" fn dc_status_name(s: u32) -> *const c_char {
    guard_value(UNKNOWN.as_ptr() as *const c_char, || {
        let name: &'static [u8] = match s {
            0 => b"DC_SUCCESS\0",
            1 => b"DC_ERR_INVALID_ARGUMENT\0",
            2 => b"DC_ERR_INVALID_USAGE\0",
            3 => b"DC_ERR_TIMEOUT\0",
            4 => b"DC_ERR_PEER_LOST\0",
            5 => b"DC_ERR_MISMATCH\0",
            6 => b"DC_ERR_ABORTED\0",
            7 => b"DC_ERR_UNAVAILABLE\0",
            8 => b"DC_ERR_SYSTEM\0",
            9 => b"DC_ERR_RENDEZVOUS\0",
            10 => b"DC_ERR_INTERNAL\0",
            11 => b"DC_ERR_REMOTE\0",
            _ => UNKNOWN,
        };
        name.as_ptr() as *const c_char
    })
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
    use crate::error::Status;
    use std::ffi::CStr;

    #[test]
    fn every_status_has_its_c_name() {
        for v in 0..=11u32 {
            let name = unsafe { CStr::from_ptr(dc_status_name(v)) }.to_str().unwrap();
            let s: Status = unsafe { std::mem::transmute(v) };
            assert_eq!(name, s.name());
        }
        let unknown = unsafe { CStr::from_ptr(dc_status_name(999)) };
        assert_eq!(unknown.to_str().unwrap(), "DC_ERR_UNKNOWN");
    }
}
