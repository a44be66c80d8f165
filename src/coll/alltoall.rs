//! alltoall and alltoallv: every receive is posted first, then every send (in staggered order
//! rank+1, rank+2, ... so that not everyone targets rank 0 at once).

use super::util::{check_len, peers, ranges_in, wait_all, Carve, Recv};
use super::Link;
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
