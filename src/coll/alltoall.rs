//! alltoall and alltoallv: every receive is posted first, then every send (in staggered order
//! rank+1, rank+2, ... so that not everyone targets rank 0 at once). Small blocks in large
//! groups: Bruck (ceil(log2 n) steps instead of n-1 messages per rank).

use super::util::{check_len, peers, ranges_in, wait_all, Carve, Recv, Scratch};
use super::{tuning, Link};
use crate::bail;
use crate::error::{Result, Status};

/// Block `j` of `send` goes to rank `j`; block `i` of `recv` comes from rank `i`. Both buffers
/// hold `size` equal blocks.
pub fn alltoall(link: &dyn Link, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    check_len(recv.len(), send.len(), "alltoall: recv buffer")?;
    if !send.len().is_multiple_of(n) {
        bail!(
            Status::InvalidArgument,
            "alltoall: {} bytes are not {n} equal blocks",
            send.len()
        );
    }
    let block = send.len() / n;
    if block == 0 {
        return Ok(());
    }
    if tuning::alltoall_bruck(n, block) {
        return bruck(link, send, recv, block);
    }
    let mut recvs = Vec::with_capacity(n - 1);
    for (p, slot) in recv.chunks_mut(block).enumerate() {
        if p == r {
            slot.copy_from_slice(&send[r * block..(r + 1) * block]);
        } else {
            recvs.push(Recv::post(link, p, slot)?);
        }
    }
    let mut sends = Vec::with_capacity(n - 1);
    for p in peers(r, n) {
        sends.push(link.send(p, &send[p * block..(p + 1) * block])?);
    }
    wait_all(recvs, sends)
}

/// Bruck alltoall. Scratch slot i starts as the block for rank+i. At the step of distance
/// d = 1, 2, 4, ..., the slots whose index has bit d set go (packed) to rank+d, and the same
/// slots are refilled from rank-d; a block therefore travels its slot index in hops of powers of
/// two and ends at its destination in the same slot: slot i then holds the block from rank-i.
/// Each rank talks to 2 ceil(log2 n) peers; each block crosses up to ceil(log2 n) links.
pub(crate) fn bruck(link: &dyn Link, send: &[u8], recv: &mut [u8], block: usize) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let mut tmp = Scratch::take(n * block);
    let tmp = &mut tmp[..n * block];
    for i in 0..n {
        let j = (r + i) % n;
        tmp[i * block..(i + 1) * block].copy_from_slice(&send[j * block..(j + 1) * block]);
    }
    let slot = |i: usize| i * block..(i + 1) * block;
    let most = n.div_ceil(2) * block;
    let mut out = Scratch::take(most);
    let mut inb = Scratch::take(most);
    let mut d = 1;
    while d < n {
        let moving: Vec<usize> = (0..n).filter(|i| i & d != 0).collect();
        let len = moving.len() * block;
        for (k, &i) in moving.iter().enumerate() {
            out[k * block..(k + 1) * block].copy_from_slice(&tmp[slot(i)]);
        }
        {
            let rv = Recv::post(link, (r + n - d) % n, &mut inb[..len])?;
            let sd = link.send((r + d) % n, &out[..len])?;
            wait_all(vec![rv], vec![sd])?;
        }
        for (k, &i) in moving.iter().enumerate() {
            tmp[slot(i)].copy_from_slice(&inb[k * block..(k + 1) * block]);
        }
        d <<= 1;
    }
    for i in 0..n {
        let j = (r + n - i) % n;
        recv[j * block..(j + 1) * block].copy_from_slice(&tmp[slot(i)]);
    }
    Ok(())
}

/// `send[sdispls[j]..][..scounts[j]]` goes to rank `j`; `recv[rdispls[i]..][..rcounts[i]]` comes
/// from rank `i` (all in bytes). Receive blocks must not overlap; a message whose length differs
/// from the expected count is `Mismatch`. Every pair exchanges a message, empty ones included.
pub fn alltoallv(
    link: &dyn Link,
    send: &[u8],
    scounts: &[usize],
    sdispls: &[usize],
    recv: &mut [u8],
    rcounts: &[usize],
    rdispls: &[usize],
) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let sr = ranges_in(scounts, sdispls, n, send.len(), false, "alltoallv: send")?;
    let rr = ranges_in(rcounts, rdispls, n, recv.len(), true, "alltoallv: recv")?;
    if scounts[r] != rcounts[r] {
        bail!(
            Status::InvalidArgument,
            "alltoallv: rank {r} sends itself {} bytes but expects {}",
            scounts[r],
            rcounts[r]
        );
    }
    let recv = Carve::new(recv);
    let mut recvs = Vec::with_capacity(n - 1);
    for p in peers(r, n) {
        // SAFETY: receive blocks are pairwise disjoint (checked above).
        recvs.push(Recv::post(link, p, unsafe {
            recv.part_mut(rr[p].clone())
        })?);
    }
    let mut sends = Vec::with_capacity(n - 1);
    for p in peers(r, n) {
        sends.push(link.send(p, &send[sr[p].clone()])?);
    }
    // SAFETY: our own block is disjoint from the blocks being received.
    unsafe { recv.part_mut(rr[r].clone()) }.copy_from_slice(&send[sr[r].clone()]);
    wait_all(recvs, sends)
}
