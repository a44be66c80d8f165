//! Initialisation and communicator exports.

use super::boundary::guard;
use super::checks::{self, on_rank};
use super::types::dc_status;
use crate::comm::Comm;
use crate::error::{Error, Result, Status};
use crate::rendezvous::config::InitOptions;
use std::ffi::c_char;
use std::sync::Arc;

/// Options for `dc_init`. Fill with `dc_init_options_default` first, then change fields.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dc_init_options {
    /// sizeof(dc_init_options) as the caller compiled it (set by dc_init_options_default).
    pub struct_size: u32,
    /// NULL or "env://" | "tcp://HOST:PORT" | "file:///PATH". NULL means "env://".
    pub init_method: *const c_char,
    /// NULL or "auto" | "shm" | "socket" | "nccl". NULL means DC_TRANSPORT or "auto".
    /// "nccl": CUDA device buffers go through NCCL (libcuda.so.1 and libnccl.so.2 are loaded at
    /// run time), host buffers through the CPU transports; "auto" does the same when every rank
    /// has CUDA, NCCL and a GPU of its own, and stays on the CPU transports otherwise.
    pub backend: *const c_char,
    /// -1: from the environment, or assigned in arrival order by "file://".
    pub rank: i32,
    /// -1: from the environment.
    pub world_size: i32,
    /// NULL or a name that keeps jobs sharing one store or file apart.
    pub group_name: *const c_char,
    /// <= 0: the default (DC_TIMEOUT_MS, else 300000 ms).
    pub timeout_ms: i64,
    /// NULL: DC_TOKEN. The job's secret: every rank must give the same (at most 4096 bytes).
    pub token: *const c_char,
    /// -1: DC_ENCRYPT (on when it is 1); 0: connections between hosts in clear; 1: encrypted.
    /// Every rank must say the same.
    pub encrypt: i32,
}

impl Default for dc_init_options {
    fn default() -> Self {
        dc_init_options {
            struct_size: std::mem::size_of::<dc_init_options>() as u32,
            init_method: std::ptr::null(),
            backend: std::ptr::null(),
            rank: -1,
            world_size: -1,
            group_name: std::ptr::null(),
            timeout_ms: 0,
            token: std::ptr::null(),
            encrypt: -1,
        }
    }
}

/// Reads the caller's options, honouring only the fields its `struct_size` covers.
pub(super) unsafe fn read_options(p: *const dc_init_options) -> Result<InitOptions> {
    let mut o = dc_init_options::default();
    if let Some(given) = p.as_ref() {
        let n = given.struct_size as usize;
        if n < std::mem::size_of::<u32>() || n > 4096 {
            return Err(Error::new(Status::InvalidArgument, format!("opts->struct_size {n} is not plausible (call dc_init_options_default first)")));
        }
        let n = n.min(std::mem::size_of::<dc_init_options>());
        std::ptr::copy_nonoverlapping(p as *const u8, &mut o as *mut dc_init_options as *mut u8, n);
    }
    Ok(InitOptions {
        init_method: checks::opt_str(o.init_method, "init_method")?,
        backend: checks::opt_str(o.backend, "backend")?,
        rank: o.rank,
        world_size: o.world_size,
        group_name: checks::opt_str(o.group_name, "group_name")?,
        timeout_ms: o.timeout_ms,
        token: checks::opt_str(o.token, "token")?,
        encrypt: match o.encrypt {
            -1 => None,
            0 => Some(false),
            1 => Some(true),
            v => return Err(Error::new(Status::InvalidArgument, format!("opts->encrypt is {v}: expected -1 (DC_ENCRYPT), 0 or 1"))),
        },
    })
}

/// Fills every field of `opts` with its default and sets `struct_size`. NULL is ignored.
/// Never blocks.
#[no_mangle]
pub unsafe extern "C" fn dc_init_options_default(opts: *mut dc_init_options) {
    if let Some(o) = opts.as_mut() {
        *o = dc_init_options::default();
    }
}

/// Joins a job and returns its world communicator in `*world` (free with dc_comm_destroy).
/// `opts` NULL: everything from the environment (env://). Blocking and collective: returns when
/// every rank has joined, or with DC_ERR_TIMEOUT naming the ranks that never came.
/// Statuses: DC_ERR_INVALID_ARGUMENT (bad options or environment, naming the variable),
/// DC_ERR_TIMEOUT, DC_ERR_RENDEZVOUS (bad token, unreachable store), DC_ERR_SYSTEM (port in use),
/// DC_ERR_UNAVAILABLE (backend not built; backend "nccl" without libcuda.so.1, libnccl.so.2 or a
/// GPU: dc_last_error names what is missing). With NCCL, the device is the one current on the
/// calling thread (cudaSetDevice), else LOCAL_RANK modulo the device count.
#[no_mangle]
pub unsafe extern "C" fn dc_init(opts: *const dc_init_options, world: *mut *mut Comm) -> dc_status {
    guard("dc_init", || {
        let out = checks::out(world, "world")?;
        let o = read_options(opts)?;
        let comm = crate::init::init(&o)?;
        *out = Arc::into_raw(comm) as *mut Comm;
        Ok(())
    })
}

/// This process's rank in `comm`. Never blocks.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_rank(comm: *const Comm, rank: *mut i32) -> dc_status {
    guard("dc_comm_rank", || {
        let c = checks::comm(comm)?;
        *checks::out(rank, "rank")? = c.rank() as i32;
        Ok(())
    })
}

/// The number of ranks in `comm`. Never blocks.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_size(comm: *const Comm, size: *mut i32) -> dc_status {
    guard("dc_comm_size", || {
        let c = checks::comm(comm)?;
        *checks::out(size, "size")? = c.size() as i32;
        Ok(())
    })
}

/// The transport `comm` uses ("socket", "shm", "nccl"); the string lives as long as the comm.
/// "nccl": device buffers go through NCCL, host buffers through shared memory or sockets.
/// Never blocks.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_backend(comm: *const Comm, name: *mut *const c_char) -> dc_status {
    guard("dc_comm_backend", || {
        let c = checks::comm(comm)?;
        *checks::out(name, "name")? = c.backend().as_ptr();
        Ok(())
    })
}

/// Creates a communicator of the parent ranks `ranks[0..nranks)` (distinct, in the order that
/// defines the new ranks). Collective over `parent`: every parent rank calls with the same list.
/// A caller not in the list gets `*out = NULL` and DC_SUCCESS. Blocking.
/// Statuses: DC_ERR_INVALID_ARGUMENT (NULL, empty, out of range or duplicate ranks),
/// DC_ERR_MISMATCH (ranks passed different lists), DC_ERR_TIMEOUT, DC_ERR_PEER_LOST, DC_ERR_ABORTED.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_new_group(parent: *mut Comm, ranks: *const i32, nranks: i32, out: *mut *mut Comm) -> dc_status {
    guard("dc_comm_new_group", || {
        let c = checks::comm(parent)?;
        on_rank(c, || {
            let o = checks::out(out, "out")?;
            if nranks <= 0 || nranks as usize > c.size() {
                return Err(Error::new(Status::InvalidArgument, format!("nranks {nranks} is outside [1, {}]", c.size())));
            }
            let list = checks::array(ranks, nranks as usize, "ranks")?;
            let mut seen = vec![false; c.size()];
            let mut parent_ranks = Vec::with_capacity(list.len());
            for &r in list {
                let r = checks::rank_in(r, c.size(), "rank")?;
                if std::mem::replace(&mut seen[r], true) {
                    return Err(Error::new(Status::InvalidArgument, format!("rank {r} appears twice in ranks")));
                }
                parent_ranks.push(r);
            }
            *o = c.new_group(&parent_ranks)?.map_or(std::ptr::null_mut(), |g| Arc::into_raw(g) as *mut Comm);
            Ok(())
        })
    })
}

/// Splits `parent` by `color`: ranks with equal color form a new comm, ordered by `key` then by
/// parent rank. A negative color joins no group (`*out = NULL`). Collective over `parent`. Blocking.
/// Statuses: DC_ERR_INVALID_ARGUMENT, DC_ERR_TIMEOUT, DC_ERR_PEER_LOST, DC_ERR_ABORTED.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_split(parent: *mut Comm, color: i32, key: i32, out: *mut *mut Comm) -> dc_status {
    guard("dc_comm_split", || {
        let c = checks::comm(parent)?;
        on_rank(c, || {
            let o = checks::out(out, "out")?;
            *o = c.split(color, key)?.map_or(std::ptr::null_mut(), |g| Arc::into_raw(g) as *mut Comm);
            Ok(())
        })
    })
}

/// Sets the timeout of every later blocking call and request on `comm`; `timeout_ms <= 0`
/// restores the default (DC_TIMEOUT_MS, else 300000 ms). Never blocks.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_set_timeout(comm: *mut Comm, timeout_ms: i64) -> dc_status {
    guard("dc_comm_set_timeout", || {
        let c = checks::comm(comm)?;
        let ms = if timeout_ms > 0 { timeout_ms } else { crate::rendezvous::config::default_timeout_ms(&|k| std::env::var(k).ok()) };
        c.set_timeout_ms(ms);
        Ok(())
    })
}

/// NCCL backend: run this comm's device operations on `cuda_stream` (a CUstream/cudaStream_t of
/// the comm's device; NULL: the comm's own stream, which orders itself after work on the legacy
/// default stream). Work the caller queued earlier on that stream is done before the operation
/// starts. Blocking calls still return only when the operation is complete; a dc_i* request
/// completes with the stream (dc_request_is_completed queries a CUDA event). The stream must
/// outlive the operations queued on it. On a comm without NCCL, NULL is accepted and anything
/// else is DC_ERR_UNAVAILABLE. Never blocks.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_set_stream(comm: *mut Comm, cuda_stream: *mut libc::c_void) -> dc_status {
    guard("dc_comm_set_stream", || {
        checks::comm(comm)?.set_stream(cuda_stream)
    })
}

/// Aborts `comm`: every pending and later operation on it (and on its subgroups) fails with
/// DC_ERR_ABORTED, here at once and on its peers as soon as they hear of it. May be called from
/// any thread, also while another thread is blocked on `comm`. With NCCL it also calls
/// ncclCommAbort (a device operation that times out does the same). Never blocks. The comm must
/// still be destroyed.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_abort(comm: *mut Comm) -> dc_status {
    guard("dc_comm_abort", || {
        checks::comm(comm)?.abort();
        Ok(())
    })
}

/// Acknowledges the members of `comm` lost so far (ULFM's MPIX_Comm_failure_ack): a receive
/// from DC_ANY_SOURCE fails with DC_ERR_PEER_LOST while a member is lost and not acknowledged
/// (the lost rank could have been its sender); after this it goes on with the others.
/// Receives from a lost rank, and collectives, still fail. `nacked` (may be NULL) gets how
/// many members are acknowledged in all. Never blocks.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_failure_ack(comm: *mut Comm, nacked: *mut i32) -> dc_status {
    guard("dc_comm_failure_ack", || {
        let n = checks::comm(comm)?.ack_failures().len();
        if let Some(out) = unsafe { nacked.as_mut() } {
            *out = n as i32;
        }
        Ok(())
    })
}

/// Completes the comm's pending operations and frees it; NULL is a no-op. Not collective, but
/// destroying the last comm of a job says goodbye to every peer (waits up to 2 s for theirs).
/// The handle is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn dc_comm_destroy(comm: *mut Comm) -> dc_status {
    guard("dc_comm_destroy", || {
        if comm.is_null() {
            return Ok(());
        }
        let c = Arc::from_raw(comm as *const Comm);
        c.destroy();
        drop(c);
        Ok(())
    })
}
