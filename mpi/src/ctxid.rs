//! Context ids that no message agrees on: each member of a new communicator derives the same
//! id from what all members know alike (a parent's context, the member list, a tag) and how
//! many comms of that key this process made before (members make them in the same order, as
//! MPI requires of Comm_create_group, Comm_create_from_group and Intercomm_create_from_groups).
//! Hashed with the engine's `StableHasher`, so builds of different toolchains agree.

use distcomm::stable_hash::hash_of;
use std::collections::HashMap;
use std::sync::Mutex;

/// The calls that make such ids (`kind`).
pub(crate) const IDUP: u64 = 1;
pub(crate) const CREATE_GROUP: u64 = 2;
pub(crate) const CREATE_FROM_GROUP: u64 = 3;
pub(crate) const INTERCOMM_FROM_GROUPS: u64 = 4;

/// One id from several parts.
pub(crate) fn mix(parts: &[u64]) -> u64 {
    hash_of(parts)
}

/// How many ids were made for a key so far on this process.
static COUNTS: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);

/// The n of the next id made for `key` (0 for the first).
pub(crate) fn next_count(key: u64) -> u64 {
    let mut g = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
    let n = g.get_or_insert_with(HashMap::new).entry(key).or_insert(0);
    *n += 1;
    *n - 1
}

/// The id of a comm that only its `members` (world ranks) make: `kind` keeps the different
/// calls apart, `tag` is the caller's (an integer's bytes or a string tag).
pub(crate) fn members_only(parent_ctx: u64, kind: u64, members: &[u32], tag: &[u8]) -> u64 {
    let key = mix(&[parent_ctx, kind, hash_of(members), hash_of(tag)]);
    mix(&[key, next_count(key)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_of_a_key_gets_its_own_id_and_keys_differ() {
        let a1 = members_only(7, 1, &[0, 1], b"t");
        let a2 = members_only(7, 1, &[0, 1], b"t");
        assert_ne!(a1, a2, "a second comm of the same members and tag is another comm");
        assert_ne!(members_only(7, 1, &[1, 0], b"t"), a1);
        assert_ne!(members_only(7, 2, &[0, 1], b"t"), a1);
        assert_ne!(members_only(7, 1, &[0, 1], b"u"), a1);
        // Fixed by the algorithm, not by the toolchain: the first id of a fresh key.
        let fresh = mix(&[9, 3, hash_of(&[4u32][..]), hash_of(&b"x"[..])]);
        assert_eq!(members_only(9, 3, &[4], b"x"), mix(&[fresh, 0]));
    }
}
