//! Communicators: a group of ranks over a world's transport, with its own wire context, timeout,
//! collective sequence, abort state and a worker thread for non-blocking collectives.
//!
//! - `world`: what `dc_init` creates and every comm of the job shares;
//! - `p2p`: sends, receives and the one wait they all go through; `probe`: probes, matched
//!   probes and withdrawing an unmatched receive;
//! - `link`: the `Link` that collective algorithms are written against;
//! - `dispatch`: the ordered engines a collective is offered to (device, shared memory, link);
//! - `shm`: the shared-memory arena of a comm within one host;
//! - `groups`: new comms from a comm (`new_from_parts`: one made by its members alone);
//!   `executor`: the worker for non-blocking collectives;
//! - `device`: the NCCL hooks (feature "nccl").

mod arena_pool;
mod dispatch;
#[cfg(feature = "nccl")]
mod device;
mod executor;
mod groups;
mod link;
mod p2p;
mod probe;
mod shm;
mod world;

pub use p2p::{Exchanged, P2pOp};
pub use probe::Probed;
pub use world::{TransportPolicy, World};

use crate::completion::deadline_after;
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::transport::socket::SocketTransport;
use crate::transport::CtxState;
use executor::Executor;
use shm::ShmState;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Collective tags with this bit set carry the `DC_DEBUG=DETAIL` check of the same call.
const CHECK_TAG_BIT: u64 = 1 << 62;

pub struct Comm {
    world: Arc<World>,
    ctx: Arc<CtxState>,
    rank: usize,
    /// Comm rank -> world rank.
    members: Vec<u32>,
    world_to_comm: HashMap<u32, usize>,
    timeout_ms: AtomicI64,
    coll_seq: AtomicU64,
    child_seq: AtomicU64,
    executor: Mutex<Option<Executor>>,
    /// Comm ranks of lost members the caller acknowledged (`ack_failures`): they no longer
    /// fail receives from any source.
    acked_lost: Mutex<Vec<usize>>,
    shm: once_cell::sync::OnceCell<ShmState>,
    /// A new group's arena is made at its first collective, not with the group: programs make
    /// and free communicators by the thousand (MPI_Comm_dup), many never used for a
    /// collective, and an arena costs a shared segment of megabytes (about 1 ms to make).
    arena_pending: std::sync::atomic::AtomicBool,
    /// The set-up a non-blocking first collective queued (a blocking one waits for it).
    arena_setup: once_cell::sync::OnceCell<Arc<crate::completion::Completion>>,
    /// The NCCL communicator for device buffers (NCCL backend only).
    #[cfg(feature = "nccl")]
    device: once_cell::sync::OnceCell<crate::nccl::DeviceComm>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Comm {
    /// The world communicator of a freshly connected transport.
    /// The world communicator of a freshly connected transport (collective: sets up shared
    /// memory where the policy allows).
    pub fn new_world(world: Arc<World>, job_id: u64, timeout_ms: i64) -> Result<Arc<Comm>> {
        let t = &world.transport;
        let members: Vec<u32> = (0..t.size()).collect();
        let rank = t.rank() as usize;
        let ctx = CtxState::new(job_id | 1, None);
        let comm = Comm::build(world, ctx, rank, members, timeout_ms);
        comm.setup_shm(shm::Setup::Store)?;
        #[cfg(feature = "nccl")]
        comm.setup_device_world()?;
        Ok(comm)
    }

    fn build(world: Arc<World>, ctx: Arc<CtxState>, rank: usize, members: Vec<u32>, timeout_ms: i64) -> Arc<Comm> {
        world.transport.register_ctx(&ctx);
        let world_to_comm = members.iter().enumerate().map(|(i, &w)| (w, i)).collect();
        Arc::new(Comm {
            world,
            ctx,
            rank,
            members,
            world_to_comm,
            timeout_ms: AtomicI64::new(timeout_ms),
            coll_seq: AtomicU64::new(0),
            child_seq: AtomicU64::new(0),
            executor: Mutex::new(None),
            acked_lost: Mutex::new(Vec::new()),
            shm: once_cell::sync::OnceCell::new(),
            arena_pending: std::sync::atomic::AtomicBool::new(false),
            arena_setup: once_cell::sync::OnceCell::new(),
            #[cfg(feature = "nccl")]
            device: once_cell::sync::OnceCell::new(),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// The world this comm belongs to (transport, store).
    pub fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// Comm rank -> world rank.
    pub fn members(&self) -> &[u32] {
        &self.members
    }

    /// This comm's 64-bit context id (the same on every member).
    pub fn context_id(&self) -> u64 {
        self.ctx.id
    }

    /// The transport this comm's collectives use: "nccl" (device buffers through NCCL, host
    /// buffers as below), "shm" or "socket".
    pub fn backend(&self) -> &'static CStr {
        #[cfg(feature = "nccl")]
        if self.device.get().is_some() {
            return c"nccl";
        }
        // A group whose arena waits for its first collective reports it already.
        if self.shm.get().is_some() || self.arena_pending.load(Ordering::Relaxed) { c"shm" } else { c"socket" }
    }

    /// The comm's NCCL communicator, if it has one.
    #[cfg(feature = "nccl")]
    pub fn device(&self) -> Option<&crate::nccl::DeviceComm> {
        self.device.get()
    }

    /// `dc_comm_set_stream`: later device operations run on `stream` (NULL: the comm's own).
    pub fn set_stream(&self, stream: *mut libc::c_void) -> Result<()> {
        #[cfg(feature = "nccl")]
        if let Some(d) = self.device.get() {
            d.set_stream(stream);
            return Ok(());
        }
        if !stream.is_null() {
            let why = if cfg!(feature = "nccl") { "" } else { " (this build has no NCCL support)" };
            return Err(Error::new(Status::Unavailable, format!("communicator uses backend \"{}\", which has no CUDA streams{why}", self.backend().to_string_lossy())));
        }
        Ok(())
    }

    pub fn timeout_ms(&self) -> i64 {
        self.timeout_ms.load(Ordering::Relaxed)
    }

    pub fn set_timeout_ms(&self, ms: i64) {
        self.timeout_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn transport(&self) -> &SocketTransport {
        &self.world.transport
    }

    /// `DC_ERR_ABORTED` if this comm (or a parent) was aborted.
    pub fn check_usable(&self) -> Result<()> {
        match self.ctx.abort_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    pub(super) fn deadline(&self) -> Instant {
        deadline_after(self.timeout_ms())
    }

    // ---- abort and destroy ----------------------------------------------------------------------

    /// Fails every pending operation on this comm (and its subgroups) here and on its peers.
    pub fn abort(&self) {
        self.abort_because(&format!("dc_comm_abort was called on rank {}", self.rank), 0);
    }

    /// Aborts with `why` as the local reason; `code` tells peers why (see `on_remote_abort`).
    pub(super) fn abort_because(&self, why: &str, code: u32) {
        #[cfg(feature = "nccl")]
        if let Some(d) = self.device.get() {
            d.abort(why);
        }
        self.transport().abort_ctx(&self.ctx, &self.members, code, || {
            // Members waiting on shared memory see this first (frames to members we have no
            // connection to take a connect).
            if let Some(shm) = self.shm.get() {
                shm.arena.mark_aborted(self.rank);
            }
            if self.ctx.abort(why) {
                dc_log!(Level::Warn, Some(self.rank), "communicator {:#x} aborted: {why}", self.ctx.id);
            }
        });
    }

    /// Ends this process's part in the job (see `World::close`): for a library layer that
    /// keeps its world comm past the end (MPI_Finalize); every comm of the world fails after.
    pub fn close_world(&self) {
        self.world.close();
    }

    /// Lets queued non-blocking collectives finish, then releases the comm's context.
    pub fn destroy(&self) {
        let ex = lock(&self.executor).take();
        if let Some(ex) = ex {
            ex.finish();
        }
        if let Some(shm) = self.shm.get() {
            shm.arena.leave();
            if shm.arena.aborted_by().is_none() && shm.arena.lost_member().is_none() {
                self.world.arena_pool.keep(&self.members, shm.arena.clone());
            }
        }
        self.transport().unregister_ctx(self.ctx.id);
    }
}
