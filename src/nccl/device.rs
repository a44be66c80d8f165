//! `DeviceComm`: the NCCL communicator behind a comm, its own stream (or the caller's, after
//! `dc_comm_set_stream`), and every collective of the API on device memory. NCCL's own
//! collectives serve allreduce, broadcast, reduce, allgather and reduce_scatter; gather,
//! scatter, allgatherv, alltoall and alltoallv are grouped ncclSend/ncclRecv (own blocks
//! copied with cuMemcpyDtoDAsync); barrier is a one-word allreduce. Operations are queued on the
//! stream and an event recorded after them: the event is the operation's completion.

// Handles (streams, communicators) are raw pointers that the driver and NCCL check, not us.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use super::cuda::{self, Device, DeviceMem, Event, Stream};
use super::{status_of, Runtime};
use crate::buffer::{ConstBuf, MutBuf};
use crate::collective::CollArgs;
use crate::completion::{Backoff, Pace};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result, Status};
use crate::rendezvous::Store;
use cudarc::driver::sys::CUstream;
use cudarc::nccl::sys::{cudaStream_t, ncclComm, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use once_cell::sync::OnceCell;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// NCCL_SPLIT_NOCOLOR: the rank joins no communicator of the split.
const SPLIT_NOCOLOR: c_int = -1;
/// ncclInProgress (non-blocking communicators only; never an error).
const NCCL_IN_PROGRESS: c_int = 7;
const UNIQUE_ID_BYTES: usize = std::mem::size_of::<ncclUniqueId>();

fn nccl_dtype(dt: DType) -> ncclDataType_t {
    use ncclDataType_t::*;
    match dt {
        DType::Int8 => ncclInt8,
        DType::Uint8 => ncclUint8,
        DType::Int32 => ncclInt32,
        DType::Uint32 => ncclUint32,
        DType::Int64 => ncclInt64,
        DType::Uint64 => ncclUint64,
        DType::Float16 => ncclFloat16,
        DType::Float32 => ncclFloat32,
        DType::Float64 => ncclFloat64,
        DType::Bfloat16 => ncclBfloat16,
    }
}

/// DC_AVG is ncclAvg; the bitwise ops have no NCCL counterpart.
pub fn nccl_op(op: ReduceOp) -> Result<ncclRedOp_t> {
    use ncclRedOp_t::*;
    Ok(match op {
        ReduceOp::Sum => ncclSum,
        ReduceOp::Prod => ncclProd,
        ReduceOp::Max => ncclMax,
        ReduceOp::Min => ncclMin,
        ReduceOp::Avg => ncclAvg,
        ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => {
            return Err(Error::new(
                Status::Unavailable,
                format!("op {} is not available on CUDA device memory: NCCL has no bitwise reductions (use host buffers for it)", op.name()),
            ))
        }
    })
}

/// A queued device operation: complete when its event is. The outcome is kept, so waiting again
/// returns the same status.
pub struct DevOp {
    /// Shared by the sends and receives launched in one NCCL group.
    event: Arc<Event>,
    outcome: Mutex<Option<Result<()>>>,
}

impl DevOp {
    fn new(event: Event) -> DevOp {
        DevOp::shared(Arc::new(event))
    }

    fn shared(event: Arc<Event>) -> DevOp {
        DevOp { event, outcome: Mutex::new(None) }
    }

    fn outcome(&self) -> Option<Result<()>> {
        self.outcome.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn finish(&self, r: Result<()>) -> Result<()> {
        let mut g = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        g.get_or_insert(r).clone()
    }
}

pub struct DeviceComm {
    rt: &'static Runtime,
    dev: Arc<Device>,
    comm: AtomicPtr<ncclComm>,
    rank: usize,
    size: usize,
    own: Stream,
    /// The caller's stream (dc_comm_set_stream), 0 for none.
    user: AtomicUsize,
    aborted: AtomicBool,
    abort_reason: Mutex<String>,
    /// One word for dc_barrier, allocated on first use.
    scratch: OnceCell<DeviceMem>,
    /// Device sends and receives posted but not launched yet (see `flush`).
    pending: Mutex<Vec<PendingP2p>>,
    /// Held while NCCL calls are issued: a request may be waited on (and so launch pending
    /// work) from another thread than the comm's.
    launch: Mutex<()>,
}

/// Where a launched send or receive reports: its operation, or why it could not be launched.
pub type P2pSlot = Arc<OnceCell<Result<DevOp>>>;

struct PendingP2p {
    addr: usize,
    bytes: usize,
    peer: usize,
    send: bool,
    slot: P2pSlot,
}

// SAFETY: the NCCL communicator is used by one thread at a time (the API's rule for a comm) and
// aborted from any thread, which NCCL allows; the other handles are thread-safe.
unsafe impl Send for DeviceComm {}
unsafe impl Sync for DeviceComm {}

/// What a rank got from splitting its parent's NCCL communicator.
pub enum Split {
    /// ncclCommSplit made this rank's new communicator.
    Comm(usize),
    /// The rank is not in the new group.
    NotMember,
    /// This NCCL has no ncclCommSplit: members create one through the store.
    Unsupported,
}

impl DeviceComm {
    /// Creates the communicator of `size` ranks: rank 0 makes the NCCL unique id and publishes it
    /// under `key` in `store`; the others read it (until `deadline`). Collective over the ranks.
    pub fn init(rt: &'static Runtime, dev: Arc<Device>, store: &dyn Store, key: &str, rank: usize, size: usize, deadline: Instant) -> Result<DeviceComm> {
        dev.make_current()?;
        let own = Stream::new()?;
        let api = rt.nccl();
        let mut id = ncclUniqueId { internal: [0; UNIQUE_ID_BYTES] };
        if rank == 0 {
            // SAFETY: writes one ncclUniqueId.
            let r = unsafe { (api.get_unique_id)(&mut id) };
            if r != 0 {
                // Tell the others at once instead of letting them time out.
                let _ = store.set(key, b"");
                return Err(nccl_error(rt, std::ptr::null_mut(), r, "ncclGetUniqueId"));
            }
            // SAFETY: ncclUniqueId is 128 plain bytes.
            let bytes = unsafe { std::slice::from_raw_parts(&id as *const ncclUniqueId as *const u8, UNIQUE_ID_BYTES) };
            store.set(key, bytes)?;
        } else {
            let v = store.get(key, deadline).map_err(|e| e.context("waiting for rank 0's NCCL unique id"))?;
            if v.len() != UNIQUE_ID_BYTES {
                return Err(Error::new(Status::Unavailable, "rank 0 could not create an NCCL unique id (see its error)"));
            }
            // SAFETY: 128 bytes into the 128-byte id.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), &mut id as *mut ncclUniqueId as *mut u8, UNIQUE_ID_BYTES) };
        }
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: NCCL writes the new communicator; blocking until every rank has joined.
        let r = unsafe { (api.comm_init_rank)(&mut comm, size as c_int, id, rank as c_int) };
        if r != 0 {
            return Err(nccl_error(rt, std::ptr::null_mut(), r, "ncclCommInitRank"));
        }
        Ok(DeviceComm::wrap(rt, dev, comm, rank, size, own))
    }

    fn wrap(rt: &'static Runtime, dev: Arc<Device>, comm: ncclComm_t, rank: usize, size: usize, own: Stream) -> DeviceComm {
        DeviceComm {
            rt,
            dev,
            comm: AtomicPtr::new(comm),
            rank,
            size,
            own,
            user: AtomicUsize::new(0),
            aborted: AtomicBool::new(false),
            abort_reason: Mutex::new(String::new()),
            scratch: OnceCell::new(),
            pending: Mutex::new(Vec::new()),
            launch: Mutex::new(()),
        }
    }

    /// The child communicator made by `split` (rank and size in the child).
    pub fn from_split(&self, raw: usize, rank: usize, size: usize) -> Result<DeviceComm> {
        self.dev.make_current()?;
        let own = match Stream::new() {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: the communicator split just made, never used.
                unsafe { (self.rt.nccl().comm_destroy)(raw as ncclComm_t) };
                return Err(e);
            }
        };
        Ok(DeviceComm::wrap(self.rt, self.dev.clone(), raw as ncclComm_t, rank, size, own))
    }

    /// A child through the store (NCCL without ncclCommSplit): collective over the child's ranks.
    pub fn init_child(&self, store: &dyn Store, key: &str, rank: usize, size: usize, deadline: Instant) -> Result<DeviceComm> {
        DeviceComm::init(self.rt, self.dev.clone(), store, key, rank, size, deadline)
    }

    /// ncclCommSplit over this communicator (collective over all its ranks, members or not).
    pub fn split(&self, color: Option<usize>, key: i32) -> Result<Split> {
        let Some(split) = self.rt.nccl().comm_split else { return Ok(Split::Unsupported) };
        let _launch = lock(&self.launch);
        self.flush_locked();
        let comm = self.nccl_comm()?;
        self.dev.make_current()?;
        let color = color.map_or(SPLIT_NOCOLOR, |c| c as c_int);
        let mut out: ncclComm_t = std::ptr::null_mut();
        // SAFETY: a live communicator; NULL config inherits the parent's.
        let r = unsafe { split(comm, color, key, &mut out, std::ptr::null_mut()) };
        self.check(r, "ncclCommSplit")?;
        Ok(if out.is_null() { Split::NotMember } else { Split::Comm(out as usize) })
    }

    pub fn device_ordinal(&self) -> i32 {
        self.dev.ordinal
    }

    /// `dc_comm_set_stream`: later operations run on `stream` (NULL: the comm's own stream).
    pub fn set_stream(&self, stream: *mut c_void) {
        self.user.store(stream as usize, Ordering::Release);
    }

    fn stream(&self) -> CUstream {
        match self.user.load(Ordering::Acquire) {
            0 => self.own.0,
            s => s as CUstream,
        }
    }

    fn aborted_error(&self) -> Option<Error> {
        if !self.aborted.load(Ordering::Acquire) {
            return None;
        }
        let why = self.abort_reason.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Some(Error::new(Status::Aborted, format!("the NCCL communicator was aborted ({why})")))
    }

    fn nccl_comm(&self) -> Result<ncclComm_t> {
        match self.aborted_error() {
            Some(e) => Err(e),
            None => Ok(self.comm.load(Ordering::Acquire)),
        }
    }

    /// ncclCommAbort (once): unblocks NCCL work of this communicator here; later operations fail
    /// with DC_ERR_ABORTED.
    pub fn abort(&self, reason: &str) {
        let mut g = self.abort_reason.lock().unwrap_or_else(|p| p.into_inner());
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        *g = reason.to_string();
        drop(g);
        let _ = self.dev.make_current();
        let comm = self.comm.load(Ordering::Acquire);
        // SAFETY: a live communicator, aborted once; NCCL frees it.
        unsafe { (self.rt.nccl().comm_abort)(comm) };
    }

    fn check(&self, code: c_int, what: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        Err(nccl_error(self.rt, self.comm.load(Ordering::Acquire), code, what))
    }

    /// An asynchronous NCCL error (a peer failed, a network error), if one happened.
    fn async_error(&self) -> Option<Error> {
        let comm = self.comm.load(Ordering::Acquire);
        let mut code: c_int = 0;
        // SAFETY: a live communicator; writes one result code.
        let r = unsafe { (self.rt.nccl().comm_get_async_error)(comm, &mut code) };
        if r != 0 {
            return Some(nccl_error(self.rt, comm, r, "ncclCommGetAsyncError"));
        }
        (code != 0 && code != NCCL_IN_PROGRESS).then(|| nccl_error(self.rt, comm, code, "NCCL communicator"))
    }

    // ---- operations ---------------------------------------------------------------------------

    /// Queues collective `args` (device buffers, checked by the C surface) on the op stream.
    pub fn start(&self, args: &CollArgs) -> Result<DevOp> {
        let _launch = lock(&self.launch);
        self.flush_locked();
        let comm = self.nccl_comm()?;
        self.dev.make_current()?;
        let s = self.stream();
        let ns = s as cudaStream_t;
        let api = self.rt.nccl();
        let (rank, n) = (self.rank, self.size);
        let u8t = ncclDataType_t::ncclUint8;
        use CollArgs::*;
        // SAFETY (every NCCL call below): the pointers are device memory of the byte sizes the C
        // surface computed; NCCL touches nothing beyond them.
        match args {
            Allreduce { send, recv, dt, op } => {
                let op = nccl_op(*op)?;
                let sp = send.map_or(recv.addr(), |b| b.addr()) as *const c_void;
                let r = unsafe { (api.all_reduce)(sp, recv.as_ptr() as *mut c_void, recv.len() / dt.size(), nccl_dtype(*dt), op, comm, ns) };
                self.check(r, "ncclAllReduce")?;
            }
            Broadcast { buf, root, .. } => {
                let p = buf.as_ptr() as *mut c_void;
                let r = unsafe { (api.broadcast)(p, p, buf.len(), u8t, *root as c_int, comm, ns) };
                self.check(r, "ncclBroadcast")?;
            }
            Reduce { send, recv, bytes, dt, op, root } => {
                let op = nccl_op(*op)?;
                // In place at the root: send None. Off the root NCCL never touches recvbuff; it
                // gets the send buffer rather than NULL (as PyTorch passes it).
                let sp = match (send, recv) {
                    (Some(b), _) => b.addr(),
                    (None, Some(r)) => r.addr(),
                    (None, None) => return Err(Error::new(Status::Internal, "reduce without buffers")),
                };
                let rp = recv.map_or(sp, |b| b.addr()) as *mut c_void;
                let sp = sp as *const c_void;
                let r = unsafe { (api.reduce)(sp, rp, bytes / dt.size(), nccl_dtype(*dt), op, *root as c_int, comm, ns) };
                self.check(r, "ncclReduce")?;
            }
            Allgather { send, recv, .. } => {
                let block = recv.len() / n;
                let sp = send.map_or(recv.addr() + rank * block, |b| b.addr()) as *const c_void;
                let r = unsafe { (api.all_gather)(sp, recv.as_ptr() as *mut c_void, block, u8t, comm, ns) };
                self.check(r, "ncclAllGather")?;
            }
            ReduceScatter { send, recv, dt, op } => {
                let op = nccl_op(*op)?;
                let (sp, rp, bytes) = match send {
                    Some(b) => (b.addr(), recv.addr(), recv.len()),
                    None => {
                        let block = recv.len() / n;
                        (recv.addr(), recv.addr() + rank * block, block)
                    }
                };
                let r = unsafe { (api.reduce_scatter)(sp as *const c_void, rp as *mut c_void, bytes / dt.size(), nccl_dtype(*dt), op, comm, ns) };
                self.check(r, "ncclReduceScatter")?;
            }
            Allgatherv { send, recv, counts, displs, .. } => {
                let own = recv.addr() + displs[rank];
                if let Some(b) = send {
                    cuda::copy_async(own, b.addr(), counts[rank], s)?;
                }
                self.group(comm, ns, |g| {
                    for p in (0..n).filter(|&p| p != rank) {
                        g.send(own, counts[rank], p)?;
                        g.recv(recv.addr() + displs[p], counts[p], p)?;
                    }
                    Ok(())
                })?;
            }
            Gather { send, recv, root, .. } => {
                let block = send.len();
                match recv {
                    Some(r) => {
                        cuda::copy_async(r.addr() + rank * block, send.addr(), block, s)?;
                        self.group(comm, ns, |g| (0..n).filter(|&p| p != rank).try_for_each(|p| g.recv(r.addr() + p * block, block, p)))?;
                    }
                    None => self.group(comm, ns, |g| g.send(send.addr(), block, *root))?,
                }
            }
            Scatter { send, recv, root, .. } => {
                let block = recv.len();
                match send {
                    Some(sb) => {
                        cuda::copy_async(recv.addr(), sb.addr() + rank * block, block, s)?;
                        self.group(comm, ns, |g| (0..n).filter(|&p| p != rank).try_for_each(|p| g.send(sb.addr() + p * block, block, p)))?;
                    }
                    None => self.group(comm, ns, |g| g.recv(recv.addr(), block, *root))?,
                }
            }
            Alltoall { send, recv, .. } => {
                let block = send.len() / n;
                cuda::copy_async(recv.addr() + rank * block, send.addr() + rank * block, block, s)?;
                self.group(comm, ns, |g| {
                    for p in (0..n).filter(|&p| p != rank) {
                        g.send(send.addr() + p * block, block, p)?;
                        g.recv(recv.addr() + p * block, block, p)?;
                    }
                    Ok(())
                })?;
            }
            Alltoallv { send, scounts, sdispls, recv, rcounts, rdispls, .. } => {
                if scounts[rank] != rcounts[rank] {
                    return Err(Error::new(
                        Status::InvalidArgument,
                        format!("sendcounts[{rank}] and recvcounts[{rank}] differ ({} and {} bytes): this rank's block to itself", scounts[rank], rcounts[rank]),
                    ));
                }
                cuda::copy_async(recv.addr() + rdispls[rank], send.addr() + sdispls[rank], scounts[rank], s)?;
                self.group(comm, ns, |g| {
                    for p in (0..n).filter(|&p| p != rank) {
                        g.send(send.addr() + sdispls[p], scounts[p], p)?;
                        g.recv(recv.addr() + rdispls[p], rcounts[p], p)?;
                    }
                    Ok(())
                })?;
            }
            Barrier => {
                let word = match self.scratch.get_or_try_init(|| DeviceMem::alloc(4)) {
                    Ok(m) => m.0 as usize as *mut c_void,
                    Err(e) => return Err(e),
                };
                let r = unsafe { (api.all_reduce)(word, word, 1, ncclDataType_t::ncclInt32, ncclRedOp_t::ncclMax, comm, ns) };
                self.check(r, "ncclAllReduce (barrier)")?;
            }
        }
        Ok(DevOp::new(Event::record(s)?))
    }

    /// Posts a send of `buf` to comm rank `peer`; it is launched by the next `flush`.
    pub fn send(&self, buf: ConstBuf, peer: usize) -> Result<P2pSlot> {
        self.post_p2p(buf.addr(), buf.len(), peer, true)
    }

    /// Posts a receive of exactly `buf.len()` bytes from comm rank `peer` (launched by `flush`).
    pub fn recv(&self, buf: MutBuf, peer: usize) -> Result<P2pSlot> {
        self.post_p2p(buf.addr(), buf.len(), peer, false)
    }

    fn post_p2p(&self, addr: usize, bytes: usize, peer: usize, send: bool) -> Result<P2pSlot> {
        if peer == self.rank {
            return Err(Error::new(Status::Unavailable, "a send or receive on CUDA device memory to or from this rank itself is not available (NCCL would wait for itself); copy with cudaMemcpy"));
        }
        self.nccl_comm()?;
        let slot: P2pSlot = Arc::new(OnceCell::new());
        lock(&self.pending).push(PendingP2p { addr, bytes, peer, send, slot: slot.clone() });
        Ok(slot)
    }

    /// Launches the posted sends and receives as one NCCL group (so an irecv and an isend
    /// posted back to back run together, as NCCL needs for exchanges and rings). Called by
    /// every other operation of the comm and by every wait or completion query, so posted
    /// work never waits for long.
    pub fn flush(&self) {
        if lock(&self.pending).is_empty() {
            return;
        }
        let _launch = lock(&self.launch);
        self.flush_locked();
    }

    fn flush_locked(&self) {
        let ops = std::mem::take(&mut *lock(&self.pending));
        if ops.is_empty() {
            return;
        }
        let launched: Result<Arc<Event>> = (|| {
            let comm = self.nccl_comm()?;
            self.dev.make_current()?;
            let s = self.stream();
            self.group(comm, s as cudaStream_t, |g| {
                ops.iter().try_for_each(|o| if o.send { g.send(o.addr, o.bytes, o.peer) } else { g.recv(o.addr, o.bytes, o.peer) })
            })?;
            Ok(Arc::new(Event::record(s)?))
        })();
        for o in ops {
            let _ = o.slot.set(match &launched {
                Ok(ev) => Ok(DevOp::shared(ev.clone())),
                Err(e) => Err(e.clone()),
            });
        }
    }

    fn group(&self, comm: ncclComm_t, stream: cudaStream_t, f: impl FnOnce(&Group) -> Result<()>) -> Result<()> {
        let api = self.rt.nccl();
        // SAFETY: group calls only bracket the sends and receives below.
        self.check(unsafe { (api.group_start)() }, "ncclGroupStart")?;
        let r = f(&Group { dc: self, comm, stream });
        let end = unsafe { (api.group_end)() };
        r?;
        self.check(end, "ncclGroupEnd")
    }

    // ---- completion ---------------------------------------------------------------------------

    /// Whether `op` has finished (never blocks: one event query).
    pub fn is_done(&self, op: &DevOp) -> bool {
        if op.outcome().is_some() {
            return true;
        }
        if let Some(e) = self.aborted_error() {
            let _ = op.finish(Err(e));
            return true;
        }
        let _ = self.dev.make_current();
        match op.event.query() {
            Ok(true) => {
                let _ = op.finish(Ok(()));
                true
            }
            Ok(false) => false,
            Err(e) => {
                let _ = op.finish(Err(e));
                true
            }
        }
    }

    /// The outcome of a finished `op`, if it has finished.
    pub fn result(&self, op: &DevOp) -> Option<Result<()>> {
        if self.is_done(op) {
            op.outcome()
        } else {
            None
        }
    }

    /// Waits (polling the event with the library's backoff, never inside CUDA) until `op` is
    /// complete, `deadline` passes, `interrupt` reports an abort or lost peer, or NCCL reports an
    /// asynchronous error. The last three abort the NCCL communicator, as NCCL asks of a caller
    /// that gives up on an operation.
    pub fn wait(&self, op: &DevOp, deadline: Instant, timeout_ms: i64, interrupt: &dyn Fn() -> Option<Error>) -> Result<()> {
        if let Some(r) = op.outcome() {
            return r;
        }
        self.dev.make_current()?;
        let mut backoff = Backoff::for_progress_thread();
        loop {
            match op.event.query() {
                Ok(true) => return op.finish(Ok(())),
                Ok(false) => {}
                Err(e) => return op.finish(Err(e)),
            }
            let pace = backoff.next();
            if pace == Pace::Spin {
                continue;
            }
            if let Some(e) = self.aborted_error() {
                return op.finish(Err(e));
            }
            if let Some(e) = interrupt() {
                self.abort(&e.msg);
                return op.finish(Err(e));
            }
            if let Some(e) = self.async_error() {
                self.abort(&e.msg);
                return op.finish(Err(e));
            }
            if Instant::now() >= deadline {
                let e = Error::new(Status::Timeout, format!("the NCCL operation did not finish within {timeout_ms} ms (the NCCL communicator is aborted)"));
                self.abort("timeout");
                return op.finish(Err(e));
            }
            if pace == Pace::Sleep {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// The sends and receives of one NCCL group (zero-byte ones are left out on both sides).
struct Group<'a> {
    dc: &'a DeviceComm,
    comm: ncclComm_t,
    stream: cudaStream_t,
}

impl Group<'_> {
    fn send(&self, addr: usize, bytes: usize, peer: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: device memory of `bytes` (checked by the C surface).
        let r = unsafe { (self.dc.rt.nccl().send)(addr as *const c_void, bytes, ncclDataType_t::ncclUint8, peer as c_int, self.comm, self.stream) };
        self.dc.check(r, "ncclSend")
    }

    fn recv(&self, addr: usize, bytes: usize, peer: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: as for send, writable.
        let r = unsafe { (self.dc.rt.nccl().recv)(addr as *mut c_void, bytes, ncclDataType_t::ncclUint8, peer as c_int, self.comm, self.stream) };
        self.dc.check(r, "ncclRecv")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for DeviceComm {
    fn drop(&mut self) {
        self.flush();
        if self.aborted.load(Ordering::Acquire) {
            return; // ncclCommAbort already freed the communicator
        }
        let _ = self.dev.make_current();
        // Let queued work on our own stream finish (bounded), then free the communicator.
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match cuda::stream_idle(self.own.0) {
                Ok(false) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
                Ok(true) => break,
                _ => {
                    self.abort("destroyed with operations that did not finish");
                    return;
                }
            }
        }
        let comm = self.comm.load(Ordering::Acquire);
        // SAFETY: a live communicator, destroyed once.
        unsafe { (self.rt.nccl().comm_destroy)(comm) };
    }
}

/// An NCCL failure with NCCL's own words for it: ncclGetErrorString and, where NCCL has it,
/// ncclGetLastError (which says what actually went wrong).
pub fn nccl_error(rt: &Runtime, comm: ncclComm_t, code: c_int, what: &str) -> Error {
    let api = rt.nccl();
    // SAFETY: NCCL returns static or thread-local NUL-terminated strings (or NULL).
    let text = |p: *const std::ffi::c_char| if p.is_null() { String::new() } else { unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned() };
    let name = text(unsafe { (api.get_error_string)(code) });
    let last = api.get_last_error.map(|f| text(unsafe { f(comm) })).unwrap_or_default();
    let mut msg = format!("{what} failed: {name} (ncclResult {code})");
    if !last.trim().is_empty() {
        msg.push_str(": ");
        msg.push_str(last.trim());
    }
    Error::new(status_of(code), msg)
}
