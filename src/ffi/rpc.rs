//! Remote procedure call exports (`paddle.distributed.rpc` in C): agents, handlers, calls,
//! worker infos and library-owned byte buffers.

use super::boundary::guard;
use super::checks;
use super::comm::{dc_init_options, read_options};
use super::types::dc_status;
use crate::error::{Error, Result, Status};
use crate::request::Request;
use crate::rpc::{Agent, Buffer, Handler, RpcAgent, WorkerInfo};
use libc::c_void;
use std::ffi::c_char;
use std::sync::Arc;

/// A worker of the RPC group, as `dc_rpc_worker_info` and `dc_rpc_all_worker_infos` report it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dc_worker_info {
    /// The worker's name (NUL-terminated, at most 63 bytes).
    pub name: [c_char; 64],
    /// The worker's rank in the job (its dc_init rank).
    pub rank: i32,
    /// The IP address of the worker's data connections (NUL-terminated).
    pub host: [c_char; 64],
    /// The port its data listener had during init.
    pub port: u16,
}

/// A handler runs on a library thread of the callee (several may run at once, also for the same
/// function). It reads the request (`request_len` bytes; `request` is never NULL) and sets the
/// reply with dc_buffer_set (copied; the library owns `reply`, do not free it). Returning
/// anything but DC_SUCCESS fails the call with DC_ERR_REMOTE, and the text given to
/// dc_buffer_set is passed back as the caller's dc_last_error(). The return value is read as a
/// plain integer: any value is defined. A handler may call other workers (or its own) through
/// the agent, e.g. passed in `userdata`.
pub type dc_rpc_handler = Option<unsafe extern "C" fn(userdata: *mut c_void, request: *const c_void, request_len: usize, reply: *mut Buffer) -> dc_status>;

/// The same function pointer with its return value read as an integer, so a C handler that
/// returns a value outside `dc_status` is not undefined behaviour on the Rust side.
type RawHandler = unsafe extern "C" fn(*mut c_void, *const c_void, usize, *mut Buffer) -> u32;

static EMPTY: [u8; 1] = [0];

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(Status::InvalidArgument, msg.into())
}

/// A handle on the agent behind `p`, taken at once so the call never reads `*p` again.
unsafe fn agent(p: *const RpcAgent) -> Result<Agent> {
    p.as_ref().map(|a| (**a).clone()).ok_or_else(|| invalid("agent is NULL"))
}

unsafe fn required_str(p: *const c_char, what: &str) -> Result<String> {
    checks::opt_str(p, what)?.ok_or_else(|| invalid(format!("{what} is NULL")))
}

unsafe fn payload<'a>(p: *const c_void, len: usize) -> Result<&'a [u8]> {
    let b = checks::src_buf(p, len, "request")?;
    Ok(b.as_slice())
}

fn copy_c_string(dst: &mut [c_char; 64], s: &str) {
    *dst = [0; 64];
    let mut n = s.len().min(63);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
}

fn to_c(w: &WorkerInfo) -> dc_worker_info {
    let mut info = dc_worker_info { name: [0; 64], rank: w.rank, host: [0; 64], port: w.port };
    copy_c_string(&mut info.name, &w.name);
    copy_c_string(&mut info.host, &w.host);
    info
}

/// Joins the job as RPC worker `name` (1 to 63 bytes, unique in the job) and returns this
/// process's agent in `*agent`. Collective: forms the job like dc_init (`opts` as there, NULL:
/// everything from the environment), then exchanges worker infos; returns when every worker
/// has joined. A name already taken by a lower rank fails with DC_ERR_INVALID_ARGUMENT on that
/// rank; the other workers form the group without it. Request and reply payloads are limited to
/// DC_RPC_MAX_BYTES bytes (default 1 GiB). Handler threads: 4, more while all are busy (up to 64).
/// Statuses: those of dc_init, DC_ERR_INVALID_ARGUMENT (NULL, bad name, bad DC_RPC_MAX_BYTES).
#[no_mangle]
pub unsafe extern "C" fn dc_rpc_init(name: *const c_char, opts: *const dc_init_options, agent: *mut *mut RpcAgent) -> dc_status {
    guard("dc_rpc_init", || {
        let out = checks::out(agent, "agent")?;
        let name = required_str(name, "name")?;
        let o = read_options(opts)?;
        let a = RpcAgent::init(&name, &o)?;
        *out = Box::into_raw(Box::new(a));
        Ok(())
    })
}

/// Registers `handler` for `function` (1 to 255 bytes) on this worker, replacing any earlier
/// one; `userdata` is passed to every invocation. Requests for a function that is not
/// registered yet wait until it is, or until this process makes its next RPC call other than
/// dc_rpc_register (dc_rpc_call*, dc_rpc_worker_info, dc_rpc_all_worker_infos, dc_rpc_shutdown),
/// after which they fail with DC_ERR_REMOTE: register every handler right after dc_rpc_init.
/// Never blocks. Statuses: DC_ERR_INVALID_ARGUMENT, DC_ERR_INVALID_USAGE (agent shut down).
#[no_mangle]
pub unsafe extern "C" fn dc_rpc_register(agent: *mut RpcAgent, function: *const c_char, handler: dc_rpc_handler, userdata: *mut c_void) -> dc_status {
    guard("dc_rpc_register", || {
        let a = self::agent(agent)?;
        let function = required_str(function, "function")?;
        let f = handler.ok_or_else(|| invalid("handler is NULL"))?;
        // SAFETY: same arguments and calling convention; only the return value is read as the
        // integer C passes it in.
        let f: RawHandler = std::mem::transmute::<unsafe extern "C" fn(*mut c_void, *const c_void, usize, *mut Buffer) -> dc_status, RawHandler>(f);
        let ud = userdata as usize;
        let h: Handler = Arc::new(move |_agent: &Agent, request: &[u8]| {
            let mut reply = Buffer::borrowed();
            let req = if request.is_empty() { EMPTY.as_ptr() } else { request.as_ptr() };
            // SAFETY: the caller registered a handler with this signature; the request and the
            // reply buffer are valid for the duration of the call.
            let status = unsafe { f(ud as *mut c_void, req as *const c_void, request.len(), &mut reply) };
            let data = reply.take();
            if status == 0 {
                return Ok(data);
            }
            if data.is_empty() {
                // SAFETY: dc_status_name accepts any value and returns a static string.
                let name = unsafe { std::ffi::CStr::from_ptr(super::status::dc_status_name(status)) };
                return Err(format!("the handler returned {} ({status})", name.to_string_lossy()));
            }
            Err(String::from_utf8_lossy(&data).into_owned())
        });
        a.register(&function, h)
    })
}

/// rpc_sync: calls `function` on worker `to` with the `request_len` bytes at `request` (copied
/// before returning; NULL allowed when 0) and waits for the reply, at most `timeout_ms`
/// (<= 0: the comm's timeout, DC_TIMEOUT_MS or 300000). On success `*reply` is a new buffer
/// (free with dc_buffer_free); `reply` may be NULL to discard it. Safe from any thread and from
/// handlers. Statuses: DC_ERR_INVALID_ARGUMENT (unknown worker, request over DC_RPC_MAX_BYTES;
/// nothing sent), DC_ERR_REMOTE (unknown function, the handler failed: its text is in
/// dc_last_error(), a size limit on the callee), DC_ERR_TIMEOUT (a late reply is dropped; the
/// agent stays usable), DC_ERR_PEER_LOST, DC_ERR_INVALID_USAGE (after dc_rpc_shutdown began).
#[no_mangle]
pub unsafe extern "C" fn dc_rpc_call(
    agent: *mut RpcAgent,
    to: *const c_char,
    function: *const c_char,
    request: *const c_void,
    request_len: usize,
    timeout_ms: i64,
    reply: *mut *mut Buffer,
) -> dc_status {
    guard("dc_rpc_call", || {
        let a = self::agent(agent)?;
        let to = required_str(to, "to")?;
        let function = required_str(function, "function")?;
        let data = a.call(&to, &function, payload(request, request_len)?, timeout_ms)?;
        if let Some(out) = reply.as_mut() {
            *out = Box::into_raw(Box::new(Buffer::owned(data)));
        }
        Ok(())
    })
}

/// rpc_async: starts the call (see dc_rpc_call; the request is copied) and returns at once with
/// `*req`. dc_request_wait returns the call's status (DC_ERR_TIMEOUT once `timeout_ms` passed),
/// dc_request_is_completed polls it, dc_request_take_reply gets the reply, dc_request_free frees
/// it (waiting first if pending).
#[no_mangle]
pub unsafe extern "C" fn dc_rpc_call_async(
    agent: *mut RpcAgent,
    to: *const c_char,
    function: *const c_char,
    request: *const c_void,
    request_len: usize,
    timeout_ms: i64,
    req: *mut *mut Request,
) -> dc_status {
    guard("dc_rpc_call_async", || {
        let a = self::agent(agent)?;
        let out = checks::out(req, "req")?;
        let to = required_str(to, "to")?;
        let function = required_str(function, "function")?;
        let r = a.call_async(&to, &function, payload(request, request_len)?, timeout_ms)?;
        *out = r.into_raw();
        Ok(())
    })
}

/// The reply of a completed dc_rpc_call_async request, as a new buffer in `*reply` (free with
/// dc_buffer_free). Once per request. Never blocks. Statuses: the call's own failure if it
/// failed, DC_ERR_INVALID_USAGE (not completed yet, reply already taken, not an RPC request).
#[no_mangle]
pub unsafe extern "C" fn dc_request_take_reply(req: *mut Request, reply: *mut *mut Buffer) -> dc_status {
    guard("dc_request_take_reply", || {
        let r = req.as_ref().ok_or_else(|| invalid("req is NULL"))?;
        let out = checks::out(reply, "reply")?;
        let data = r.take_reply()?;
        *out = Box::into_raw(Box::new(Buffer::owned(data)));
        Ok(())
    })
}

/// Fills `*info` with the worker called `name`, or with this worker when `name` is NULL.
/// Never blocks. Statuses: DC_ERR_INVALID_ARGUMENT (NULL agent or info, unknown name).
#[no_mangle]
pub unsafe extern "C" fn dc_rpc_worker_info(agent: *mut RpcAgent, name: *const c_char, info: *mut dc_worker_info) -> dc_status {
    guard("dc_rpc_worker_info", || {
        let a = self::agent(agent)?;
        let out = checks::out(info, "info")?;
        let name = checks::opt_str(name, "name")?;
        *out = to_c(&a.worker_info(name.as_deref())?);
        Ok(())
    })
}

/// Writes the first `capacity` workers, in rank order, to `infos` and the number of workers to
/// `*count` (like snprintf: compare it with `capacity`; `infos` may be NULL when `capacity` is
/// 0). Never blocks.
#[no_mangle]
pub unsafe extern "C" fn dc_rpc_all_worker_infos(agent: *mut RpcAgent, infos: *mut dc_worker_info, capacity: usize, count: *mut usize) -> dc_status {
    guard("dc_rpc_all_worker_infos", || {
        let a = self::agent(agent)?;
        let n = checks::out(count, "count")?;
        let all = a.all_worker_infos();
        if capacity > 0 {
            if infos.is_null() {
                return Err(invalid("infos is NULL"));
            }
            let dst = std::slice::from_raw_parts_mut(infos, capacity.min(all.len()));
            for (d, w) in dst.iter_mut().zip(&all) {
                *d = to_c(w);
            }
        }
        *n = all.len();
        Ok(())
    })
}

/// Collective over the workers: refuses new calls from this process's threads (handlers may
/// still call), keeps serving until no call is outstanding on any worker, then stops and frees
/// the agent, whatever the status. Waits at most the comm's timeout for the others. Call it
/// once this process's other threads have stopped starting calls on the agent; the handle is
/// invalid afterwards.
/// Statuses: DC_ERR_TIMEOUT (a worker never called shutdown, or calls stayed in flight),
/// DC_ERR_PEER_LOST, DC_ERR_INVALID_USAGE (called from a handler: nothing is freed then).
#[no_mangle]
pub unsafe extern "C" fn dc_rpc_shutdown(agent: *mut RpcAgent) -> dc_status {
    guard("dc_rpc_shutdown", || {
        let a = agent.as_ref().ok_or_else(|| invalid("agent is NULL"))?;
        if a.in_handler() {
            return Err(Error::new(Status::InvalidUsage, "dc_rpc_shutdown cannot be called from a handler"));
        }
        // Handlers may use the handle until the agent stopped: free it only afterwards.
        let r = a.shutdown_in_place();
        drop(Box::from_raw(agent));
        r
    })
}

/// Replaces the contents of `buf` with a copy of the `len` bytes at `data` (NULL allowed when
/// `len` is 0). Statuses: DC_ERR_INVALID_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn dc_buffer_set(buf: *mut Buffer, data: *const c_void, len: usize) -> dc_status {
    guard("dc_buffer_set", || {
        let b = buf.as_mut().ok_or_else(|| invalid("buf is NULL"))?;
        if len > isize::MAX as usize {
            return Err(invalid(format!("len {len} is too large")));
        }
        b.set(checks::src_buf(data, len, "data")?.as_slice());
        Ok(())
    })
}

/// The bytes of `buf` (never NULL for a valid buffer, also when empty; NULL for NULL). Valid
/// until the buffer is changed or freed.
#[no_mangle]
pub unsafe extern "C" fn dc_buffer_data(buf: *const Buffer) -> *const c_void {
    super::boundary::guard_value(std::ptr::null(), || match buf.as_ref() {
        None => std::ptr::null(),
        Some(b) if b.as_slice().is_empty() => EMPTY.as_ptr() as *const c_void,
        Some(b) => b.as_slice().as_ptr() as *const c_void,
    })
}

/// The number of bytes in `buf` (0 for NULL).
#[no_mangle]
pub unsafe extern "C" fn dc_buffer_len(buf: *const Buffer) -> usize {
    super::boundary::guard_value(0, || buf.as_ref().map_or(0, |b| b.as_slice().len()))
}

/// Frees a buffer the library returned (dc_rpc_call, dc_request_take_reply); NULL is a no-op.
/// The reply buffer lent to a handler is not the handler's to free: DC_ERR_INVALID_USAGE.
#[no_mangle]
pub unsafe extern "C" fn dc_buffer_free(buf: *mut Buffer) -> dc_status {
    guard("dc_buffer_free", || {
        let Some(b) = buf.as_ref() else { return Ok(()) };
        if b.is_borrowed() {
            return Err(Error::new(Status::InvalidUsage, "this buffer belongs to the library (a handler's reply)"));
        }
        drop(Box::from_raw(buf));
        Ok(())
    })
}
