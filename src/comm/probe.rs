//! Probing on a comm (MPI_Probe, Iprobe, Mprobe, Improbe, Mrecv) and withdrawing a receive
//! that nothing matched yet (MPI_Cancel): the transport's probes in comm ranks, waited with the
//! comm's timeout like any receive.

use super::{Comm, P2pOp};
use crate::buffer::MutBuf;
use crate::completion::Done;
use crate::error::{Error, Result, Status};
use crate::transport::{Matched, TagMatch};
use std::time::Instant;

/// What a probe found: the sender's comm rank, the user tag and the length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probed {
    pub source: usize,
    pub tag: u32,
    pub bytes: usize,
}

impl Comm {
    fn probe_match(&self, src: Option<usize>, tag: Option<u32>) -> (Option<u32>, TagMatch) {
        (src.map(|s| self.members[s]), tag.map_or(TagMatch::AnyUser, |t| TagMatch::Exact(u64::from(t))))
    }

    fn probed(&self, d: Done) -> Result<Probed> {
        let source = self.world_to_comm.get(&d.source).copied();
        let tag = u32::try_from(d.tag).ok();
        match (source, tag) {
            (Some(source), Some(tag)) => Ok(Probed { source, tag, bytes: d.bytes }),
            _ => Err(Error::new(Status::Internal, format!("probe found a message of world rank {} with tag {:#x}, not of this comm", d.source, d.tag))),
        }
    }

    /// The first message from comm rank `src` (None: any) with user tag `tag` (None: any)
    /// that a receive would match now, left for that receive; None if there is none yet.
    pub fn iprobe(&self, src: Option<usize>, tag: Option<u32>) -> Result<Option<Probed>> {
        self.check_usable()?;
        let (s, t) = self.probe_match(src, tag);
        let tr = self.transport();
        // A caller probing in a loop is waiting: read what our host's peers wrote.
        let _ = tr.poll_rings();
        tr.send_acks();
        tr.iprobe(&self.ctx, s, t).map(|d| self.probed(d)).transpose()
    }

    /// Waits (up to the comm's timeout) for a message as `iprobe` finds one.
    pub fn probe(&self, src: Option<usize>, tag: Option<u32>) -> Result<Probed> {
        self.probe_until(src, tag, self.deadline())
    }

    fn probe_until(&self, src: Option<usize>, tag: Option<u32>, deadline: Instant) -> Result<Probed> {
        if let Some(p) = self.iprobe(src, tag)? {
            return Ok(p);
        }
        let (s, t) = self.probe_match(src, tag);
        let op = P2pOp::Recv(self.transport().post_probe(&self.ctx, s, t)?);
        let what = || format!("in a probe for a message from {} with tag {}", src.map_or("any rank".into(), |s| format!("rank {s}")), tag.map_or("any".into(), |t| t.to_string()));
        let d = self.wait_p2p(&op, deadline, &what)?;
        self.probed(d)
    }

    /// A matched probe: takes the message `iprobe` would find, so that only `post_recv_matched`
    /// of the returned handle receives it. None if there is none yet.
    pub fn improbe(&self, src: Option<usize>, tag: Option<u32>) -> Result<Option<(Probed, Matched)>> {
        self.check_usable()?;
        let (s, t) = self.probe_match(src, tag);
        let tr = self.transport();
        let _ = tr.poll_rings();
        let Some(m) = tr.improbe(&self.ctx, s, t) else { return Ok(None) };
        Ok(Some((self.probed(m.envelope())?, m)))
    }

    /// Waits (up to the comm's timeout) for a message as `improbe` takes one.
    pub fn mprobe(&self, src: Option<usize>, tag: Option<u32>) -> Result<(Probed, Matched)> {
        let deadline = self.deadline();
        loop {
            if let Some(got) = self.improbe(src, tag)? {
                return Ok(got);
            }
            // Another thread may take what the probe saw before we do: then wait again.
            self.probe_until(src, tag, deadline)?;
        }
    }

    /// Starts the receive of a message a matched probe took, into `buf` (host memory).
    pub fn post_recv_matched(&self, m: Matched, buf: MutBuf) -> Result<P2pOp> {
        self.check_usable()?;
        #[cfg(feature = "nccl")]
        if self.route_p2p((buf.addr(), buf.len()))? {
            return Err(Error::new(Status::Unavailable, "a matched receive into CUDA device memory is not available"));
        }
        Ok(P2pOp::Recv(self.transport().recv_matched(&self.ctx, m, buf)?))
    }

    /// Withdraws receive `op` if no message matched it yet (it then fails with `e`); whether
    /// it was withdrawn. Sends and matched receives go on and complete as usual.
    pub fn cancel_unmatched(&self, op: &P2pOp, e: impl FnOnce() -> Error) -> bool {
        match op {
            P2pOp::Recv(r) if !r.comp.is_done() => self.transport().cancel_unmatched_recv(r, e()),
            _ => false,
        }
    }
}
