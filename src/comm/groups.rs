//! New communicators from an existing one: `new_group` (a list of ranks) and `split` (color and
//! key), each a collective over the parent, with a context id every member derives alike.

use super::Comm;
use crate::buffer::{ConstBuf, MutBuf};
use crate::collective::CollArgs;
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::transport::CtxState;
use crate::stable_hash::StableHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A stable 64-bit id for a child context, the same on every member.
fn child_ctx_id(parent: u64, seq: u64, salt: &[i64]) -> u64 {
    let mut h = StableHasher::new();
    (parent, seq, salt).hash(&mut h);
    h.finish() | 1
}

impl Comm {
    /// `dc_comm_new_group`: `ranks` are distinct parent ranks (checked by the caller). Every parent
    /// rank must call with the same list; a disagreement is `DC_ERR_MISMATCH` everywhere.
    pub fn new_group(&self, ranks: &[usize]) -> Result<Option<Arc<Comm>>> {
        let mut h = StableHasher::new();
        ranks.hash(&mut h);
        let mine = h.finish();
        let all = self.allgather_u64(&[mine])?;
        if let Some(r) = all.iter().position(|&x| x != mine) {
            return Err(Error::new(Status::Mismatch, format!("dc_comm_new_group: rank {r} passed a different rank list than rank {}", self.rank)));
        }
        let seq = self.child_seq.fetch_add(1, Ordering::Relaxed);
        let me = ranks.iter().position(|&r| r == self.rank);
        // Every parent rank takes part in the NCCL split, members or not.
        #[cfg(feature = "nccl")]
        let split = self.device_split(me.map(|_| 0), me.unwrap_or(0) as i32)?;
        let Some(me) = me else { return Ok(None) };
        let id = child_ctx_id(self.ctx.id, seq, &[-1, mine as i64]);
        let members = ranks.iter().map(|&r| self.members[r]).collect();
        let child = self.child(id, me, members)?;
        #[cfg(feature = "nccl")]
        child.attach_device(self, split)?;
        Ok(Some(child))
    }

    /// `dc_comm_split`: ranks with the same `color` form a group ordered by (key, parent rank);
    /// a negative color (like MPI_UNDEFINED) joins no group.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Arc<Comm>>> {
        let all = self.allgather_u64(&[color as u32 as u64, key as u32 as u64])?;
        let seq = self.child_seq.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "nccl")]
        let split = self.device_split((color >= 0).then_some(color as usize), key)?;
        if color < 0 {
            return Ok(None);
        }
        let mut group: Vec<(i32, usize)> = (0..self.size())
            .filter(|&r| all[2 * r] as u32 as i32 == color)
            .map(|r| (all[2 * r + 1] as u32 as i32, r))
            .collect();
        group.sort();
        let me = group.iter().position(|&(_, r)| r == self.rank).expect("caller is in its own color");
        let members = group.iter().map(|&(_, r)| self.members[r]).collect();
        let id = child_ctx_id(self.ctx.id, seq, &[color as i64]);
        let child = self.child(id, me, members)?;
        #[cfg(feature = "nccl")]
        child.attach_device(self, split)?;
        Ok(Some(child))
    }

    /// A comm with context `id` over world ranks `members`, made by those members alone (the
    /// parent's other ranks do not call): each passes the same `id` and `members`, which the
    /// caller derives alike on every one (MPI_Comm_create_group, intercommunicators). `rank` is
    /// this process's rank in it. With `collectives` it is set up for them (collective over the
    /// members); without, it is for point-to-point only and `members` may be other processes
    /// than this one (an intercommunicator's remote group, `rank` then the local rank).
    pub fn new_from_parts(&self, id: u64, rank: usize, members: Vec<u32>, collectives: bool) -> Result<Arc<Comm>> {
        let n = self.world.transport.size();
        if let Some(w) = members.iter().find(|&&w| w >= n) {
            return Err(Error::new(Status::InvalidArgument, format!("world rank {w} is not a rank of the world (size {n})")));
        }
        let me = self.world.transport.rank();
        if collectives && members.get(rank) != Some(&me) {
            return Err(Error::new(Status::InvalidArgument, format!("rank {rank} of the new comm is not this process (world rank {me})")));
        }
        if !collectives {
            let ctx = CtxState::new(id | 1, Some(self.ctx.clone()));
            return Ok(Comm::build(self.world.clone(), ctx, rank, members, self.timeout_ms()));
        }
        self.child(id | 1, rank, members)
    }

    /// Collective over the new group's members.
    fn child(&self, id: u64, rank: usize, members: Vec<u32>) -> Result<Arc<Comm>> {
        let ctx = CtxState::new(id, Some(self.ctx.clone()));
        dc_log!(Level::Info, Some(self.rank), "new communicator {id:#x}: rank {rank} of {}", members.len());
        let comm = Comm::build(self.world.clone(), ctx, rank, members, self.timeout_ms());
        if comm.arena_possible()? {
            comm.arena_pending.store(true, Ordering::Relaxed);
        }
        Ok(comm)
    }

    #[cfg(feature = "nccl")]
    pub(super) fn allreduce_u64_min(&self, mine: u64) -> Result<u64> {
        let send = mine.to_le_bytes();
        let mut recv = [0u8; 8];
        self.collective(CollArgs::Allreduce {
            send: Some(ConstBuf::from_slice(&send)),
            recv: MutBuf::from_slice(&mut recv),
            dt: crate::dtype::DType::Uint64,
            op: crate::dtype::ReduceOp::Min,
        })?;
        Ok(u64::from_le_bytes(recv))
    }

    pub(super) fn allgather_u64(&self, mine: &[u64]) -> Result<Vec<u64>> {
        let send: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut recv = vec![0u8; send.len() * self.size()];
        self.collective(CollArgs::Allgather {
            send: Some(ConstBuf::from_slice(&send)),
            recv: MutBuf::from_slice(&mut recv),
            dt: crate::dtype::DType::Uint64,
        })?;
        Ok(recv.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
    }
}
