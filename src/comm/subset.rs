//! `new_subset`: a communicator of some of a comm's ranks made by those ranks alone (MPI's
//! Comm_create_from_group and Comm_create_group), where `groups` makes one collectively over
//! the whole parent.
//!
//! No message decides the context id: every member derives it from the parent's id, the
//! caller's tag, the member list and how many comms it made before with that (tag, list) —
//! calls the members make in the same order (MPI's rule for these functions), so all agree.

use super::Comm;
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::transport::CtxState;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

/// Comms made so far per (parent id, tag, members) key, on this process.
static MADE: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);

impl Comm {
    /// `ranks`: distinct ranks of this comm, in the new comm's order, this rank among them.
    /// Collective over those ranks only; each must pass the same `ranks` and `tag`.
    pub fn new_subset(&self, ranks: &[usize], tag: &[u8]) -> Result<Arc<Comm>> {
        let Some(me) = ranks.iter().position(|&r| r == self.rank) else {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("new_subset: rank {} is not in the rank list", self.rank),
            ));
        };
        if let Some(&r) = ranks.iter().find(|&&r| r >= self.size()) {
            return Err(Error::new(
                Status::InvalidArgument,
                format!(
                    "new_subset: {r} is not a rank of the comm (size {})",
                    self.size()
                ),
            ));
        }
        let mut h = DefaultHasher::new();
        (self.ctx.id, tag, ranks).hash(&mut h);
        let key = h.finish();
        let n = {
            let mut m = super::lock(&MADE);
            let c = m.get_or_insert_with(HashMap::new).entry(key).or_insert(0);
            *c += 1;
            *c
        };
        let mut h = DefaultHasher::new();
        ("subset", key, n).hash(&mut h);
        let id = h.finish() | 1;
        let members: Vec<u32> = ranks.iter().map(|&r| self.members[r]).collect();
        let ctx = CtxState::new(id, Some(self.ctx.clone()));
        dc_log!(
            Level::Info,
            Some(self.rank),
            "new communicator {id:#x} from a group: rank {me} of {}",
            members.len()
        );
        let comm = Comm::build(self.world.clone(), ctx, me, members, self.timeout_ms());
        // Collective over the new comm's members only.
        comm.setup_shm(false)?;
        Ok(comm)
    }
}
