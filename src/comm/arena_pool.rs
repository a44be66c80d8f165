//! Arenas of destroyed communicators, kept mapped for a new communicator of the same members:
//! making an arena costs milliseconds (the kernel reserves, maps and later frees its pages:
//! 2 ms for the 1.9 MiB of two ranks here), taking one over costs three small collectives.
//! A rank keeps an arena once it destroyed its communicator; a new group's set-up
//! (`Comm::take_kept_arena`) takes one over only if every member still holds it, which each
//! does only after destroying the old communicator, so nobody uses it for the old one any
//! more. Members destroy comms in any order (persistent requests freed in different orders),
//! so rank 0 offers all it keeps for the members and the first that everyone holds is taken.

use crate::transport::shm::Arena;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Arenas kept per rank, and the bytes of /dev/shm they may hold together (their files are
/// unlinked: the memory goes back when the last member unmaps them).
pub(crate) const KEEP: usize = 4;
const _: () = assert!(KEEP <= 8, "a member says which offered arenas it keeps in a byte");
const KEEP_BYTES: usize = 64 << 20;

struct Kept {
    /// The members' world ranks, in comm rank order (the arena's slots follow it).
    members: Vec<u32>,
    arena: Arc<Arena>,
}

#[derive(Default)]
pub(crate) struct ArenaPool {
    kept: Mutex<VecDeque<Kept>>,
}

impl ArenaPool {
    /// Keeps the arena of a communicator of `members` that this rank destroyed; the oldest
    /// kept ones go where there are too many.
    pub(crate) fn keep(&self, members: &[u32], arena: Arc<Arena>) {
        if arena.bytes() > KEEP_BYTES {
            return;
        }
        let mut kept = super::lock(&self.kept);
        kept.push_back(Kept { members: members.to_vec(), arena });
        while kept.len() > KEEP || kept.iter().map(|k| k.arena.bytes()).sum::<usize>() > KEEP_BYTES {
            kept.pop_front();
        }
    }

    /// Takes every kept arena of `members` with staging slots of `chunk` bytes, the most
    /// recent first (rank 0's offer: a set-up on another thread cannot offer them too).
    pub(crate) fn take_all_for(&self, members: &[u32], chunk: usize) -> Vec<Arc<Arena>> {
        let mut kept = super::lock(&self.kept);
        let mut taken = Vec::new();
        while let Some(i) = kept.iter().rposition(|k| k.members == members && k.arena.chunk() == chunk) {
            taken.extend(kept.remove(i).map(|k| k.arena));
        }
        taken
    }

    /// Takes the arena of `members` named `nonce`, if this rank keeps it.
    pub(crate) fn take_nonce(&self, members: &[u32], nonce: u64) -> Option<Arc<Arena>> {
        let mut kept = super::lock(&self.kept);
        let i = kept.iter().rposition(|k| k.members == members && k.arena.nonce() == nonce)?;
        kept.remove(i).map(|k| k.arena)
    }
}
