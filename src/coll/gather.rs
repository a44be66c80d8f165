//! gather and scatter: direct to / from the root.

use super::util::{check_len, check_root, peers, wait_all, Recv};
use super::Link;
use crate::bail;
use crate::error::{Result, Status};

/// Collects every rank's `send` at the root: `recv` (root only, `size * send.len()` bytes) gets
/// rank `j`'s block at `j * send.len()`. `recv` is ignored on other ranks.
pub fn gather(link: &dyn Link, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    check_root(root, n)?;
    let block = send.len();
    if r != root {
        if block == 0 {
            return Ok(());
        }
        return link.send(root, send)?.wait().map(drop);
    }
    let Some(recv) = recv else {
        bail!(
            Status::InvalidArgument,
            "gather: the root needs a recv buffer"
        );
    };
    check_len(recv.len(), n * block, "gather: recv buffer")?;
    if block == 0 {
        return Ok(());
    }
    let mut recvs = Vec::with_capacity(n - 1);
    for (p, slot) in recv.chunks_mut(block).enumerate() {
        if p == r {
            slot.copy_from_slice(send);
        } else {
            recvs.push(Recv::post(link, p, slot)?);
        }
    }
    wait_all(recvs, Vec::new())
}

/// Distributes the root's `send` (`size * recv.len()` bytes): block `j` goes to rank `j`'s `recv`.
/// `send` is ignored on other ranks.
pub fn scatter(link: &dyn Link, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    check_root(root, n)?;
    let block = recv.len();
    if r != root {
        if block == 0 {
            return Ok(());
        }
        return Recv::post(link, root, recv)?.wait();
    }
    let Some(send) = send else {
        bail!(
            Status::InvalidArgument,
            "scatter: the root needs a send buffer"
        );
    };
    check_len(send.len(), n * block, "scatter: send buffer")?;
    if block == 0 {
        return Ok(());
    }
    let mut sends = Vec::with_capacity(n - 1);
    for p in peers(r, n) {
        sends.push(link.send(p, &send[p * block..(p + 1) * block])?);
    }
    recv.copy_from_slice(&send[r * block..(r + 1) * block]);
    wait_all(Vec::new(), sends)
}
