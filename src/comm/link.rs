//! The `Link` that algorithms see: one collective call's sends and receives on the comm's
//! context, with its tag, signature and deadline.

use super::{Comm, P2pOp};
use crate::buffer::{ConstBuf, MutBuf};
use crate::coll::{Link, Pending, PendingOp};
use crate::error::{Error, Result, Status};
use crate::transport::TagMatch;
use std::time::Instant;

/// One collective call's `Link`: its tag and signature on the comm's context, and its deadline.
pub(super) struct CollLink<'c> {
    pub(super) comm: &'c Comm,
    pub(super) tag: u64,
    pub(super) sig: u32,
    pub(super) seq: u64,
    pub(super) deadline: Instant,
}

struct LinkOp<'c> {
    comm: &'c Comm,
    op: P2pOp,
    peer: usize,
    seq: u64,
    deadline: Instant,
}

impl PendingOp for LinkOp<'_> {
    fn wait(&mut self) -> Result<usize> {
        let (peer, seq) = (self.peer, self.seq);
        let what = || format!("waiting for rank {peer} in collective #{seq}");
        self.comm.wait_any(&self.op, &|| self.deadline, &what, true).map(|d| d.bytes).map_err(|e| {
            // A collective whose peer sent more than expected disagrees on the count.
            if e.status == Status::InvalidArgument {
                Error::new(Status::Mismatch, format!("{} (the ranks disagree on the count)", e.msg))
            } else {
                e
            }
        })
    }
}

impl Drop for LinkOp<'_> {
    fn drop(&mut self) {
        self.comm.cancel_p2p(&self.op, || Error::new(Status::Aborted, "cancelled"));
        self.op.release();
    }
}

impl Link for CollLink<'_> {
    fn rank(&self) -> usize {
        self.comm.rank
    }

    fn size(&self) -> usize {
        self.comm.members.len()
    }

    fn send<'a>(&'a self, peer: usize, buf: &'a [u8]) -> Result<Pending<'a>> {
        let op = self.comm.transport().post_send(&self.comm.ctx, self.comm.members[peer], self.tag, self.sig, ConstBuf::from_slice(buf))?;
        Ok(Pending::new(LinkOp { comm: self.comm, op: P2pOp::Send(op), peer, seq: self.seq, deadline: self.deadline }))
    }

    fn host_of(&self, peer: usize) -> usize {
        self.comm.world.hosts[self.comm.members[peer] as usize] as usize
    }

    fn recv<'a>(&'a self, peer: usize, buf: &'a mut [u8]) -> Result<Pending<'a>> {
        let src = Some(self.comm.members[peer]);
        let op = self.comm.transport().post_recv(&self.comm.ctx, src, TagMatch::Exact(self.tag), self.sig, MutBuf::from_slice(buf))?;
        Ok(Pending::new(LinkOp { comm: self.comm, op: P2pOp::Recv(op), peer, seq: self.seq, deadline: self.deadline }))
    }
}
