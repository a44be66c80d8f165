//! Panics in the library's own threads and calls: caught where a thread or an operation starts,
//! turned into an error that names them (and, for a communicator, an abort its peers hear of),
//! never a thread that dies silently while others wait for it. The fault tests inject one at a
//! named site with `arm` (Rust only: no C caller can reach it).

use crate::error::{Error, Status};
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The sites where `arm` can inject a panic: a collective's run (`collective`), a non-blocking
/// collective's job on the comm's worker (`worker`), the RPC request listener (`rpc`), the
/// transport's progress thread (`progress`).
pub const SITES: [&str; 4] = ["collective", "worker", "rpc", "progress"];

static ARMED: AtomicBool = AtomicBool::new(false);
static SITE: Mutex<Option<&'static str>> = Mutex::new(None);

/// For the fault tests: the next time (and every time) the library reaches `site`, it panics
/// there. None disarms.
pub fn arm(site: Option<&'static str>) {
    assert!(site.is_none_or(|s| SITES.contains(&s)), "no panic site {site:?}");
    *SITE.lock().unwrap_or_else(|p| p.into_inner()) = site;
    ARMED.store(site.is_some(), Ordering::Release);
}

/// The text a panic carried.
pub fn message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a panic without a message".into())
}

/// Runs `f`; a panic in it becomes `DC_ERR_INTERNAL` naming `what` and the panic's text.
pub fn catch<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, Error> {
    catch_named(|| what.to_string(), f)
}

/// `catch` with the name made only if there is a panic (on the paths every call takes: a
/// formatted name costs an allocation, as much as a small collective itself).
pub fn catch_named<T>(what: impl FnOnce() -> String, f: impl FnOnce() -> T) -> Result<T, Error> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| Error::new(Status::Internal, format!("a panic in {}: {}", what(), message(&*p))))
}

/// Panics if the fault tests armed `site` (one atomic load otherwise).
#[inline]
pub fn inject(site: &str) {
    if ARMED.load(Ordering::Acquire) && *SITE.lock().unwrap_or_else(|p| p.into_inner()) == Some(site) {
        panic!("injected at site {site:?} by the fault tests");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_an_internal_error_naming_it() {
        let e = catch("the test", || -> u32 { panic!("boom {}", 7) }).unwrap_err();
        assert_eq!(e.status, Status::Internal);
        assert_eq!(e.msg, "a panic in the test: boom 7");
        assert_eq!(catch("x", || 5).unwrap(), 5);
        let e = catch("y", || std::panic::panic_any(3u8)).unwrap_err();
        assert!(e.msg.ends_with("a panic without a message"), "{}", e.msg);
    }
}
