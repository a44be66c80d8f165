//! barrier: dissemination with empty messages (ceil(log2 n) rounds).

use super::util::{wait_all, Recv};
use super::Link;
use crate::error::Result;

/// Returns once every member has entered the barrier.
pub fn barrier(link: &dyn Link) -> Result<()> {
    let (n, r) = (link.size(), link.rank());
    let mut k = 1;
    while k < n {
        let mut none = [0u8; 0];
        let rv = Recv::post(link, (r + n - k) % n, &mut none)?;
        let sd = link.send((r + k) % n, &[])?;
        wait_all(vec![rv], vec![sd])?;
        k <<= 1;
    }
    Ok(())
}
