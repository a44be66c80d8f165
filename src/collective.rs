//! A collective call as the engine sees it: validated buffers plus parameters, its signature
//! word for the cheap always-on mismatch check, and dispatch to the algorithm in `coll`.

use crate::buffer::{ConstBuf, MutBuf};
use crate::coll::{self, Link};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result, Status};

/// What `CollArgs::check_disjoint`'s error says (the MPI layer gives it its own class).
pub const OVERLAP: &str = "sendbuf and recvbuf overlap (only the documented in-place forms are allowed)";

/// Arguments of one collective call (sizes in bytes; counts/displacements converted to bytes).
#[derive(Debug, Clone)]
pub enum CollArgs {
    Allreduce { send: Option<ConstBuf>, recv: MutBuf, dt: DType, op: ReduceOp },
    Broadcast { buf: MutBuf, dt: DType, root: usize },
    Reduce { send: Option<ConstBuf>, recv: Option<MutBuf>, bytes: usize, dt: DType, op: ReduceOp, root: usize },
    Allgather { send: Option<ConstBuf>, recv: MutBuf, dt: DType },
    Allgatherv { send: Option<ConstBuf>, recv: MutBuf, counts: Vec<usize>, displs: Vec<usize>, dt: DType },
    Gather { send: ConstBuf, recv: Option<MutBuf>, dt: DType, root: usize },
    Scatter { send: Option<ConstBuf>, recv: MutBuf, dt: DType, root: usize },
    /// `send: None` = in place: `recv` is the whole send buffer and the result lands in block `rank`.
    ReduceScatter { send: Option<ConstBuf>, recv: MutBuf, dt: DType, op: ReduceOp },
    Alltoall { send: ConstBuf, recv: MutBuf, dt: DType },
    Alltoallv { send: ConstBuf, scounts: Vec<usize>, sdispls: Vec<usize>, recv: MutBuf, rcounts: Vec<usize>, rdispls: Vec<usize>, dt: DType },
    Barrier,
}

/// Collective kinds, numbered for the signature word.
const KINDS: [&str; 11] = [
    "allreduce", "broadcast", "reduce", "allgather", "allgatherv", "gather", "scatter", "reduce_scatter", "alltoall", "alltoallv", "barrier",
];

const NONE4: u32 = 0xF;
const NO_ROOT: u32 = 0x7FFFF;

/// Packs kind (5 bits), dtype (4), op (4) and root (19) into the word every frame of the call
/// carries, so ranks that disagree on what they are calling find out at the first message.
pub fn signature(kind: usize, dt: Option<DType>, op: Option<ReduceOp>, root: Option<usize>) -> u32 {
    let dt = dt.map_or(NONE4, |d| d as u32);
    let op = op.map_or(NONE4, |o| o as u32);
    let root = root.map_or(NO_ROOT, |r| (r as u32).min(NO_ROOT - 1));
    ((kind as u32 + 1) << 27) | (dt << 23) | (op << 19) | root
}

/// Human-readable form of a signature word, for mismatch messages.
pub fn describe(sig: u32) -> String {
    let kind = ((sig >> 27) as usize).wrapping_sub(1);
    let Some(name) = KINDS.get(kind) else { return format!("point-to-point or unknown ({sig:#x})") };
    let mut parts = Vec::new();
    if let Some(d) = DType::from_raw(((sig >> 23) & 0xF) as i64) {
        parts.push(d.name().to_string());
    }
    if let Some(o) = ReduceOp::from_raw(((sig >> 19) & 0xF) as i64) {
        parts.push(o.name().to_string());
    }
    if sig & NO_ROOT != NO_ROOT {
        parts.push(format!("root {}", sig & NO_ROOT));
    }
    format!("{name}({})", parts.join(", "))
}

impl CollArgs {
    fn kind(&self) -> usize {
        match self {
            CollArgs::Allreduce { .. } => 0,
            CollArgs::Broadcast { .. } => 1,
            CollArgs::Reduce { .. } => 2,
            CollArgs::Allgather { .. } => 3,
            CollArgs::Allgatherv { .. } => 4,
            CollArgs::Gather { .. } => 5,
            CollArgs::Scatter { .. } => 6,
            CollArgs::ReduceScatter { .. } => 7,
            CollArgs::Alltoall { .. } => 8,
            CollArgs::Alltoallv { .. } => 9,
            CollArgs::Barrier => 10,
        }
    }

    /// The C name of the call ("dc_allreduce").
    pub fn name(&self) -> &'static str {
        [
            "dc_allreduce", "dc_broadcast", "dc_reduce", "dc_allgather", "dc_allgatherv", "dc_gather", "dc_scatter",
            "dc_reduce_scatter", "dc_alltoall", "dc_alltoallv", "dc_barrier",
        ][self.kind()]
    }

    /// A send buffer of its own must not overlap the receive buffer: the copies between them
    /// assume distinct memory. The in-place forms have no send buffer (or send from a copy).
    /// Checked for every caller (the C API, the MPI layer) before anything is sent.
    #[inline]
    pub fn check_disjoint(&self) -> Result<()> {
        use CollArgs::*;
        let (send, recv) = match self {
            Allreduce { send: Some(s), recv, .. }
            | Reduce { send: Some(s), recv: Some(recv), .. }
            | Allgather { send: Some(s), recv, .. }
            | Allgatherv { send: Some(s), recv, .. }
            | Gather { send: s, recv: Some(recv), .. }
            | Scatter { send: Some(s), recv, .. }
            | ReduceScatter { send: Some(s), recv, .. }
            | Alltoall { send: s, recv, .. }
            | Alltoallv { send: s, recv, .. } => (s, recv),
            _ => return Ok(()),
        };
        if crate::buffer::overlaps(send.addr(), send.len(), recv.addr(), recv.len()) {
            return Err(Error::new(Status::InvalidArgument, format!("{}: {OVERLAP}", self.name())));
        }
        Ok(())
    }

    pub fn signature(&self) -> u32 {
        use CollArgs::*;
        let (dt, op, root) = match self {
            Allreduce { dt, op, .. } | ReduceScatter { dt, op, .. } => (Some(*dt), Some(*op), None),
            Reduce { dt, op, root, .. } => (Some(*dt), Some(*op), Some(*root)),
            Broadcast { dt, root, .. } | Gather { dt, root, .. } | Scatter { dt, root, .. } => (Some(*dt), None, Some(*root)),
            Allgather { dt, .. } | Allgatherv { dt, .. } | Alltoall { dt, .. } | Alltoallv { dt, .. } => (Some(*dt), None, None),
            Barrier => (None, None, None),
        };
        signature(self.kind(), dt, op, root)
    }

    /// Runs the algorithm over `link`.
    ///
    /// # Safety
    /// The buffers must be valid (as promised by the C caller) and not used by anyone else
    /// until this returns; distinct buffers must not overlap (the C surface checks).
    pub unsafe fn run(&self, link: &dyn Link) -> Result<()> {
        use CollArgs::*;
        match self {
            Allreduce { send, recv, dt, op } => coll::allreduce::allreduce(link, send.map(|s| s.as_slice()), recv.as_mut_slice(), *dt, *op),
            Broadcast { buf, root, .. } => coll::broadcast::broadcast(link, buf.as_mut_slice(), *root),
            Reduce { send, recv, bytes, dt, op, root } => {
                coll::reduce_coll::reduce(link, send.map(|s| s.as_slice()), recv.map(|r| r.as_mut_slice()), *bytes, *dt, *op, *root)
            }
            Allgather { send, recv, .. } => coll::allgather::allgather(link, send.map(|s| s.as_slice()), recv.as_mut_slice()),
            Allgatherv { send, recv, counts, displs, .. } => {
                coll::allgather::allgatherv(link, send.map(|s| s.as_slice()), recv.as_mut_slice(), counts, displs)
            }
            Gather { send, recv, root, .. } => coll::gather::gather(link, send.as_slice(), recv.map(|r| r.as_mut_slice()), *root),
            Scatter { send, recv, root, .. } => coll::gather::scatter(link, send.map(|s| s.as_slice()), recv.as_mut_slice(), *root),
            ReduceScatter { send, recv, dt, op } => {
                let bufs = match send {
                    Some(s) => coll::reduce_scatter::ReduceScatterBufs::Separate { send: s.as_slice(), recv: recv.as_mut_slice() },
                    None => coll::reduce_scatter::ReduceScatterBufs::InPlace(recv.as_mut_slice()),
                };
                coll::reduce_scatter::reduce_scatter(link, bufs, *dt, *op)
            }
            Alltoall { send, recv, .. } => coll::alltoall::alltoall(link, send.as_slice(), recv.as_mut_slice()),
            Alltoallv { send, scounts, sdispls, recv, rcounts, rdispls, .. } => {
                coll::alltoall::alltoallv(link, send.as_slice(), scounts, sdispls, recv.as_mut_slice(), rcounts, rdispls)
            }
            Barrier => coll::barrier::barrier(link),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_send_and_receive_buffers_are_refused() {
        let mut mem = vec![0u8; 64];
        let base = mem.as_mut_ptr();
        // SAFETY: ranges inside `mem`; nothing is read or written, only addresses compared.
        let send = |at: usize, len: usize| unsafe { ConstBuf::new(base.add(at), len) };
        let recv = |at: usize, len: usize| unsafe { MutBuf::new(base.add(at), len) };
        let v = |n: usize| vec![n; 2];
        let (f, i) = (DType::Float32, DType::Int32);
        let overlapping = [
            CollArgs::Allreduce { send: Some(send(0, 16)), recv: recv(8, 16), dt: f, op: ReduceOp::Sum },
            CollArgs::Reduce { send: Some(send(0, 16)), recv: Some(recv(0, 16)), bytes: 16, dt: f, op: ReduceOp::Sum, root: 0 },
            CollArgs::Allgather { send: Some(send(28, 8)), recv: recv(0, 32), dt: i },
            CollArgs::Allgatherv { send: Some(send(4, 4)), recv: recv(0, 8), counts: v(4), displs: vec![0, 4], dt: i },
            CollArgs::Gather { send: send(0, 8), recv: Some(recv(4, 16)), dt: i, root: 0 },
            CollArgs::Scatter { send: Some(send(0, 16)), recv: recv(15, 8), dt: i, root: 0 },
            CollArgs::ReduceScatter { send: Some(send(0, 16)), recv: recv(12, 8), dt: f, op: ReduceOp::Sum },
            CollArgs::Alltoall { send: send(0, 16), recv: recv(0, 16), dt: i },
            CollArgs::Alltoallv { send: send(16, 16), scounts: v(8), sdispls: vec![0, 8], recv: recv(0, 17), rcounts: v(8), rdispls: vec![0, 8], dt: i },
        ];
        for a in &overlapping {
            let e = a.check_disjoint().expect_err(a.name());
            assert_eq!(e.status, Status::InvalidArgument);
            assert!(e.msg.starts_with(a.name()) && e.msg.ends_with(OVERLAP), "{}", e.msg);
        }
        // Apart (touching is apart), in place, empty, or without a second buffer: fine.
        let fine = [
            CollArgs::Allreduce { send: Some(send(0, 16)), recv: recv(16, 16), dt: f, op: ReduceOp::Sum },
            CollArgs::Allreduce { send: None, recv: recv(0, 16), dt: f, op: ReduceOp::Sum },
            CollArgs::Reduce { send: Some(send(0, 16)), recv: None, bytes: 16, dt: f, op: ReduceOp::Sum, root: 1 },
            CollArgs::Allgather { send: None, recv: recv(0, 32), dt: i },
            CollArgs::Gather { send: send(0, 8), recv: None, dt: i, root: 1 },
            CollArgs::Alltoall { send: send(0, 0), recv: recv(0, 0), dt: i },
            CollArgs::Broadcast { buf: recv(0, 64), dt: i, root: 0 },
            CollArgs::Barrier,
        ];
        for a in &fine {
            assert!(a.check_disjoint().is_ok(), "{a:?}");
        }
    }

    #[test]
    fn signatures_describe_themselves() {
        let s = signature(0, Some(DType::Float32), Some(ReduceOp::Sum), None);
        assert_eq!(describe(s), "allreduce(float32, sum)");
        let b = signature(1, Some(DType::Int8), None, Some(3));
        assert_eq!(describe(b), "broadcast(int8, root 3)");
        assert_ne!(s, b);
        assert_eq!(describe(signature(10, None, None, None)), "barrier()");
        assert!(describe(0).starts_with("point-to-point"));
    }
}
