//! The MPI layer's own agreement steps (split colors, topology edges, merge flags): u64 words
//! through the engine's collectives, little-endian on the wire.

use crate::err::MpiErr;
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;

pub fn to_bytes(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn from_bytes(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// Every member's `mine` (the same length on each), concatenated in rank order.
pub fn allgather(c: &Comm, mine: &[u64]) -> Result<Vec<u64>, MpiErr> {
    let send = to_bytes(mine);
    let mut all = vec![0u8; send.len() * c.size()];
    c.collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut all), dt: distcomm::DType::Uint64 })?;
    Ok(from_bytes(&all))
}

/// Every member's `mine` (of any length), concatenated in rank order: the lengths first, then
/// the words padded to the longest.
pub fn allgather_any(c: &Comm, mine: &[u64]) -> Result<Vec<u64>, MpiErr> {
    let lens = allgather(c, &[mine.len() as u64])?;
    let max = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut padded = mine.to_vec();
    padded.resize(max, 0);
    let all = allgather(c, &padded)?;
    Ok(lens.iter().enumerate().flat_map(|(r, &n)| all[r * max..r * max + n as usize].to_vec()).collect())
}
