//! The NCCL hooks of a comm (feature "nccl"): which calls go to the device engine, its
//! communicator's setup for the world and for new groups, and device send envelopes.

use super::{Comm, P2pOp};
use crate::buffer::{ConstBuf, MutBuf};
use crate::collective::CollArgs;
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::transport::ops::COLL_TAG_BIT;
use crate::transport::TagMatch;
use crate::stable_hash::StableHasher;
use std::hash::{Hash, Hasher};
use std::time::Instant;

#[cfg(feature = "nccl")]
pub(super) const DEVICE_ENVELOPE_TAG: u64 = COLL_TAG_BIT | (1 << 62);

/// The non-empty buffers of a collective, as (address, bytes).
#[cfg(feature = "nccl")]
fn coll_buffers(args: &CollArgs) -> Vec<(usize, usize)> {
    use CollArgs::*;
    let mut v = Vec::with_capacity(2);
    let mut c = |b: Option<ConstBuf>| v.extend(b.map(|b| (b.addr(), b.len())));
    match args {
        Allreduce { send, .. } | Allgather { send, .. } | Allgatherv { send, .. } | ReduceScatter { send, .. } | Scatter { send, .. } => c(*send),
        Reduce { send, .. } => c(*send),
        Gather { send, .. } | Alltoall { send, .. } | Alltoallv { send, .. } => c(Some(*send)),
        Broadcast { .. } | Barrier => {}
    }
    let mut m = |b: Option<MutBuf>| v.extend(b.map(|b| (b.addr(), b.len())));
    match args {
        Allreduce { recv, .. }
        | Allgather { recv, .. }
        | Allgatherv { recv, .. }
        | ReduceScatter { recv, .. }
        | Scatter { recv, .. }
        | Alltoall { recv, .. }
        | Alltoallv { recv, .. } => m(Some(*recv)),
        Broadcast { buf, .. } => m(Some(*buf)),
        Reduce { recv, .. } | Gather { recv, .. } => m(*recv),
        Barrier => {}
    }
    v.retain(|&(_, len)| len > 0);
    v
}

/// A device buffer NCCL may use for this comm: on its GPU (NCCL would read another device's
/// memory through peer access, or fault) and not running past its allocation.
#[cfg(feature = "nccl")]
fn check_device_buffer(addr: usize, len: usize, place: crate::nccl::DevicePlace, comm_device: i32) -> Result<()> {
    if place.ordinal >= 0 && place.ordinal != comm_device {
        return Err(Error::new(
            Status::InvalidArgument,
            format!("the buffer at {addr:#x} is on CUDA device {}, but this comm's NCCL communicator is on device {comm_device}", place.ordinal),
        ));
    }
    if let Some((start, size)) = place.allocation {
        if addr.saturating_add(len) > start.saturating_add(size) {
            let room = start + size - addr;
            return Err(Error::new(
                Status::InvalidArgument,
                format!("the buffer at {addr:#x} needs {len} bytes, but its CUDA allocation ends {room} bytes after it"),
            ));
        }
    }
    Ok(())
}

#[cfg(feature = "nccl")]
impl Comm {
    /// Whether a call with these buffers goes through NCCL: all device memory -> yes, all host ->
    /// no, a mix -> DC_ERR_INVALID_ARGUMENT. A call without buffers goes where `default_device`
    /// says. Comms without NCCL never classify anything.
    /// Device buffers must be on the communicator's GPU and inside their allocation.
    pub(super) fn route(&self, bufs: &[(usize, usize)], default_device: bool) -> Result<bool> {
        let Some(dev) = self.device.get() else {
            return Ok(false);
        };
        let mut device = 0;
        let mut host = 0;
        for &(addr, len) in bufs.iter().filter(|b| b.1 > 0) {
            match crate::nccl::classify(addr) {
                crate::nccl::MemKind::Device(place) => {
                    check_device_buffer(addr, len, place, dev.device_ordinal())?;
                    device += 1
                }
                crate::nccl::MemKind::Host => host += 1,
            }
        }
        match (device, host) {
            (0, 0) => Ok(default_device),
            (_, 0) => Ok(true),
            (0, _) => Ok(false),
            _ => Err(Error::new(
                Status::InvalidArgument,
                "the call mixes CUDA device memory and host memory: pass all buffers on the device (NCCL) or all on the host",
            )),
        }
    }

    /// Launches device sends and receives posted on this comm (see `DeviceComm::flush`): every
    /// other call on the comm does this first, so posted device work never waits behind it.
    #[inline]
    pub(super) fn flush_device(&self) {
        if let Some(d) = self.device.get() {
            d.flush();
        }
    }

    /// `route` for one point-to-point buffer; inline, since comms without NCCL (most, and
    /// every message on them) only look at the empty cell.
    #[inline]
    pub(super) fn route_p2p(&self, buf: (usize, usize)) -> Result<bool> {
        if self.device.get().is_none() {
            return Ok(false);
        }
        self.route(&[buf], false)
    }

    /// Whether `args` goes to the device engine: its buffers are CUDA device memory (see
    /// `route`; a call without buffers, such as a barrier, goes there too).
    pub(super) fn on_device(&self, args: &CollArgs) -> Result<bool> {
        self.route(&coll_buffers(args), true)
    }

    /// Launches `args` on the device engine.
    pub(super) fn start_device(&self, dev: &crate::nccl::DeviceComm, args: &CollArgs) -> Result<crate::nccl::DevOp> {
        dc_log!(Level::Trace, Some(self.rank), "{} on CUDA device memory (NCCL)", args.name());
        dev.start(args).map_err(|e| e.context("on CUDA device memory (NCCL)"))
    }

    /// Waits for a device collective of this comm (a request's wait).
    pub fn wait_device(&self, op: &crate::nccl::DevOp, deadline: Instant) -> Result<()> {
        let dev = self.device.get().expect("device comm");
        dev.flush();
        dev.wait(op, deadline, self.timeout_ms(), &|| self.ctx.abort_error()).map_err(|e| e.context("on CUDA device memory (NCCL)"))
    }

    /// Whether a device collective has finished (never blocks), and its result.
    pub fn device_result(&self, op: &crate::nccl::DevOp) -> Option<Result<()>> {
        let dev = self.device.get().expect("device comm");
        dev.flush();
        dev.result(op)
    }

    /// Posts the envelope of a device send to comm rank `dst` on the CPU transport.
    pub(crate) fn post_envelope_send(&self, dst: usize, buf: ConstBuf) -> Result<P2pOp> {
        Ok(P2pOp::Send(self.transport().post_send(&self.ctx, self.members[dst], DEVICE_ENVELOPE_TAG, 0, buf)?))
    }

    /// Posts the receive of the next device-send envelope from comm rank `src`.
    pub(crate) fn post_envelope_recv(&self, src: usize, buf: MutBuf) -> Result<P2pOp> {
        let src = Some(self.members[src]);
        Ok(P2pOp::Recv(self.transport().post_recv(&self.ctx, src, TagMatch::Exact(DEVICE_ENVELOPE_TAG), 0, buf)?))
    }

    /// The world comm's NCCL communicator, if the backend asks for one: every rank says whether
    /// it can (libraries, a device) and which GPU it would use; all must be able to, and under
    /// "auto" no two ranks may share a GPU. Collective.
    pub(super) fn setup_device_world(&self) -> Result<()> {
        use crate::nccl::GpuMode;
        let plan = self.world.gpu;
        if plan.mode == GpuMode::Off {
            return Ok(());
        }
        let local = crate::nccl::local_device(plan.local_rank);
        let ident = match &local {
            Ok((_, d)) => {
                let mut h = StableHasher::new();
                (crate::log::hostname(), &d.bus_id).hash(&mut h);
                h.finish() | 1
            }
            Err(_) => 0,
        };
        // First whether anyone cannot (a tree allreduce: an allgather here would connect every
        // rank of a large CPU-only job to log N peers for nothing), the lowest such rank.
        let n = self.size();
        let unable = self.allreduce_u64_min(if local.is_ok() { u64::MAX } else { self.rank as u64 })?;
        if unable != u64::MAX {
            let r = unable as usize;
            let why = match &local {
                Err(e) if r == self.rank => e.clone(),
                _ => format!("rank {r} cannot use NCCL (its own error says why)"),
            };
            if plan.mode == GpuMode::Required {
                return Err(Error::new(Status::Unavailable, format!("backend \"nccl\" is unavailable: {why}")));
            }
            dc_log!(Level::Info, Some(self.rank), "NCCL not used: {why}");
            return Ok(());
        }
        if plan.mode == GpuMode::IfAvailable {
            let mut ids = self.allgather_u64(&[ident])?;
            ids.sort_unstable();
            if ids.windows(2).any(|w| w[0] == w[1]) {
                dc_log!(Level::Info, Some(self.rank), "NCCL not used: some ranks share a GPU (backend \"nccl\" would try anyway)");
                return Ok(());
            }
        }
        let (rt, dev) = local.map_err(|e| Error::new(Status::Unavailable, e))?;
        let ordinal = dev.ordinal;
        let key = format!("nccl_id/{:016x}", self.ctx.id);
        let dc = crate::nccl::DeviceComm::init(rt, dev, &*self.world.store, &key, self.rank, n, self.deadline())?;
        dc_log!(Level::Info, Some(self.rank), "communicator {:#x}: NCCL on CUDA device {ordinal}; {}", self.ctx.id, rt.describe());
        let _ = self.device.set(dc);
        Ok(())
    }

    /// Splits the NCCL communicator for a new group (collective over this comm: every rank,
    /// member or not). None when this comm has no NCCL communicator.
    pub(super) fn device_split(&self, color: Option<usize>, key: i32) -> Result<Option<crate::nccl::device::Split>> {
        match self.device.get() {
            Some(d) => d.split(color, key).map(Some),
            None => Ok(None),
        }
    }

    /// Gives a new child comm its NCCL communicator (from the split, or through the store when
    /// NCCL has no ncclCommSplit: collective over the child).
    pub(super) fn attach_device(&self, parent: &Comm, split: Option<crate::nccl::device::Split>) -> Result<()> {
        use crate::nccl::device::Split;
        let Some(pd) = parent.device.get() else { return Ok(()) };
        let dc = match split {
            None => return Ok(()),
            Some(Split::Comm(raw)) => pd.from_split(raw, self.rank, self.size())?,
            Some(Split::NotMember) => return Err(Error::new(Status::Internal, "ncclCommSplit left out a rank of the new group")),
            Some(Split::Unsupported) => {
                let key = format!("nccl_id/{:016x}", self.ctx.id);
                pd.init_child(&*self.world.store, &key, self.rank, self.size(), self.deadline())?
            }
        };
        let _ = self.device.set(dc);
        Ok(())
    }
}
