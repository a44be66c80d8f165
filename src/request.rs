//! Requests: a pending non-blocking operation, waited on from any thread.

use crate::comm::{Comm, P2pOp};
use crate::completion::{Completion, Done, LazyDeadline, Stamp, WaitOutcome};
use crate::error::{Error, Result, Status};
use crate::rpc::PendingCall;
use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Extra time a waiter gives a collective worker past the op's own deadline, after which the
/// worker has certainly failed the op itself.
const WORKER_GRACE: Duration = Duration::from_secs(2);

enum Kind {
    /// The deadline is the comm's timeout after `started` (computed only if a wait needs it).
    P2p { op: P2pOp, peer: i32, recv: bool, started: Stamp },
    Coll { comp: Arc<Completion>, deadline: Instant },
    /// An RPC started by `dc_rpc_call_async`; its reply is taken with `take_reply`.
    Rpc(PendingCall),
    /// A collective queued on the comm's NCCL stream: complete when its CUDA event is;
    /// `is_completed` queries the event and never blocks.
    #[cfg(feature = "nccl")]
    Device { op: crate::nccl::DevOp, deadline: Instant },
}

pub struct Request {
    comm: Arc<Comm>,
    kind: Kind,
    elem_size: usize,
}

/// What `dc_request_recv_info` reports: comm rank of the sender, tag, bytes.
#[derive(Debug, Clone, Copy)]
pub struct RecvInfo {
    pub source: i32,
    pub tag: i32,
    pub bytes: usize,
}

thread_local! {
    /// Allocations of requests freed on this thread, reused by the next ones made here (a
    /// program that posts and frees a request per message would otherwise pay malloc and free
    /// for each).
    // The boxes are the point: each is a request's own allocation, handed out again whole.
    #[allow(clippy::vec_box)]
    static SPARE: RefCell<Vec<Box<MaybeUninit<Request>>>> = const { RefCell::new(Vec::new()) };
}

/// Spare request allocations kept per thread.
const SPARE_MAX: usize = 8;

impl Request {
    /// Moves the request to the heap for a C caller (see `free_raw`).
    pub fn into_raw(self) -> *mut Request {
        let slot = SPARE.try_with(|s| s.borrow_mut().pop()).ok().flatten().unwrap_or_else(Box::new_uninit);
        Box::into_raw(Box::write(slot, self))
    }

    /// Drops a request made by `into_raw` (waiting for it first if it is pending, see Drop)
    /// and keeps its allocation for the next one.
    ///
    /// # Safety
    /// `p` came from `into_raw` and is not used again.
    pub unsafe fn free_raw(p: *mut Request) {
        // SAFETY: per the contract `p` is a live Box allocation holding a Request; after the
        // value is dropped it is an allocation of the same layout holding nothing.
        unsafe {
            std::ptr::drop_in_place(p);
            let slot = Box::from_raw(p as *mut MaybeUninit<Request>);
            let _ = SPARE.try_with(move |s| {
                let mut s = s.borrow_mut();
                if s.len() < SPARE_MAX {
                    s.push(slot);
                }
            });
        }
    }

    pub fn p2p(comm: Arc<Comm>, op: P2pOp, peer: i32, started: Stamp) -> Request {
        let recv = match &op {
            P2pOp::Recv(_) => true,
            #[cfg(feature = "nccl")]
            P2pOp::Device(d) => d.is_recv(),
            _ => false,
        };
        Request { comm, kind: Kind::P2p { op, peer, recv, started }, elem_size: 1 }
    }

    pub fn collective(comm: Arc<Comm>, comp: Arc<Completion>, deadline: Instant) -> Request {
        Request { comm, kind: Kind::Coll { comp, deadline }, elem_size: 1 }
    }

    /// An RPC started by `dc_rpc_call_async` (its call carries its own deadline).
    pub fn rpc(comm: Arc<Comm>, call: PendingCall) -> Request {
        Request { comm, kind: Kind::Rpc(call), elem_size: 1 }
    }

    /// A device collective (NCCL backend).
    #[cfg(feature = "nccl")]
    pub fn device(comm: Arc<Comm>, op: crate::nccl::DevOp, deadline: Instant) -> Request {
        Request { comm, kind: Kind::Device { op, deadline }, elem_size: 1 }
    }

    /// Element size of a receive, so `recv_info` can count elements.
    pub fn with_elem_size(mut self, n: usize) -> Request {
        self.elem_size = n.max(1);
        self
    }

    pub fn elem_size(&self) -> usize {
        self.elem_size
    }

    fn finished(&self) -> Option<Result<Done>> {
        match &self.kind {
            Kind::P2p { op, .. } => self.comm.p2p_result(op),
            Kind::Coll { comp, .. } => comp.result(),
            Kind::Rpc(call) => call.result(),
            #[cfg(feature = "nccl")]
            Kind::Device { op, .. } => self.comm.device_result(op).map(|r| r.map(|_| Done::default())),
        }
    }

    /// Blocks until the op finishes or its deadline passes; returns the op's status, again and
    /// again if called more than once.
    pub fn wait(&self) -> Result<Done> {
        match &self.kind {
            Kind::P2p { op, peer, recv, started } => {
                let (peer, recv) = (*peer, *recv);
                let what = || {
                    let dir = if recv { "receive from" } else { "send to" };
                    if peer < 0 { format!("waiting for a {dir} any rank") } else { format!("waiting for a {dir} rank {peer}") }
                };
                let deadline = LazyDeadline::since(*started, self.comm.timeout_ms());
                self.comm.wait_p2p_by(op, &|| deadline.get(), &what)
            }
            Kind::Coll { comp, deadline } => {
                // Still queued behind nothing running: run it here rather than wait for the worker.
                self.comm.run_queued_until(comp);
                match comp.wait(*deadline + WORKER_GRACE, &|| None) {
                    WaitOutcome::Finished(r) => r,
                    _ => Err(Error::new(Status::Timeout, "non-blocking collective did not finish within the timeout")),
                }
            }
            Kind::Rpc(call) => call.wait(),
            #[cfg(feature = "nccl")]
            Kind::Device { op, deadline } => self.comm.wait_device(op, *deadline).map(|_| Done::default()),
        }
    }

    /// Never blocks. A collective still queued is handed to the comm's worker now (whoever
    /// tests, as MPI's test loops do, wants it to progress).
    pub fn is_completed(&self) -> bool {
        let done = self.done();
        if !done && matches!(self.kind, Kind::Coll { .. }) {
            self.comm.kick_queued();
        }
        done
    }

    fn done(&self) -> bool {
        match &self.kind {
            Kind::P2p { op, .. } => self.comm.p2p_is_done(op),
            Kind::Coll { comp, .. } => comp.is_done(),
            Kind::Rpc(call) => call.is_done(),
            #[cfg(feature = "nccl")]
            Kind::Device { op, .. } => self.comm.device_result(op).is_some(),
        }
    }

    /// The reply of a completed RPC (once); its error if the call failed.
    pub fn take_reply(&self) -> Result<Vec<u8>> {
        match &self.kind {
            Kind::Rpc(call) => call.take_reply(),
            _ => Err(Error::new(Status::InvalidUsage, "request is not an RPC (dc_rpc_call_async)")),
        }
    }

    /// Sender, tag and size of a completed receive.
    pub fn recv_info(&self) -> Result<RecvInfo> {
        let Kind::P2p { recv: true, .. } = self.kind else {
            return Err(Error::new(Status::InvalidUsage, "request is not a receive"));
        };
        match self.finished() {
            None => Err(Error::new(Status::InvalidUsage, "receive has not completed yet (wait for it first)")),
            Some(Err(e)) => Err(e),
            Some(Ok(d)) => Ok(RecvInfo { source: self.comm.comm_rank_of(d.source), tag: d.tag as i32, bytes: d.bytes }),
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if !self.done() {
            let _ = self.wait();
        }
        if let Kind::P2p { op, .. } = &mut self.kind {
            self.comm.cancel_p2p(op, || Error::new(Status::Aborted, "request freed"));
            op.release();
        }
    }
}
