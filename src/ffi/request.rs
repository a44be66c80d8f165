//! Request exports.

use super::boundary::guard;
use super::checks;
use super::p2p::dc_recv_info;
use super::types::dc_status;
use crate::error::{Error, Result, Status};
use crate::request::Request;

unsafe fn request<'a>(p: *const Request) -> Result<&'a Request> {
    p.as_ref().ok_or_else(|| Error::new(Status::InvalidArgument, "req is NULL"))
}

/// Blocks until the operation completes (at most the comm's timeout from when it started) and
/// returns its status; may be called again and keeps returning it. Safe from any thread.
#[no_mangle]
pub unsafe extern "C" fn dc_request_wait(req: *mut Request) -> dc_status {
    guard("dc_request_wait", || request(req)?.wait().map(|_| ()))
}

/// Sets `*done` to whether the operation has completed. Never blocks (for an operation on CUDA
/// device memory it queries the CUDA event recorded after it).
#[no_mangle]
pub unsafe extern "C" fn dc_request_is_completed(req: *mut Request, done: *mut bool) -> dc_status {
    guard("dc_request_is_completed", || {
        let r = request(req)?;
        *checks::out(done, "done")? = r.is_completed();
        Ok(())
    })
}

/// Waits for every request in `reqs[0..n)` (NULL entries are skipped) and returns the first
/// failure's status (all are waited regardless).
#[no_mangle]
pub unsafe extern "C" fn dc_request_wait_all(n: usize, reqs: *const *mut Request) -> dc_status {
    guard("dc_request_wait_all", || {
        if n == 0 {
            return Ok(());
        }
        let list = checks::array(reqs, n, "reqs")?;
        let mut first: Option<Error> = None;
        for (i, &r) in list.iter().enumerate() {
            if let Some(r) = r.as_ref() {
                if let Err(e) = r.wait() {
                    first.get_or_insert(e.context(format!("request {i}")));
                }
            }
        }
        first.map_or(Ok(()), Err)
    })
}

/// Frees a request, first waiting for it if it is still pending; NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn dc_request_free(req: *mut Request) -> dc_status {
    guard("dc_request_free", || {
        if !req.is_null() {
            Request::free_raw(req);
        }
        Ok(())
    })
}

/// For a completed receive request: who sent the message (comm rank), its tag, and how many
/// elements came. DC_ERR_INVALID_USAGE if the request is not a receive or has not completed.
#[no_mangle]
pub unsafe extern "C" fn dc_request_recv_info(req: *const Request, info: *mut dc_recv_info) -> dc_status {
    guard("dc_request_recv_info", || {
        let r = request(req)?;
        let out = checks::out(info, "info")?;
        let i = r.recv_info()?;
        *out = dc_recv_info { source: i.source, tag: i.tag, count: i.bytes / r.elem_size() };
        Ok(())
    })
}
