//! Helpers shared by the algorithms: waiting with length checks, element-aligned partitions,
//! argument validation, and `Carve` for disjoint borrows that outlive the borrow checker's view.

use std::marker::PhantomData;
use std::ops::Range;

use super::{Link, Pending};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Result, Status};
use crate::{bail, err};

/// Scratch a thread keeps between collectives: receiving a large partial into a fresh
/// `vec![0; n]` zeroes (and, for a new mapping, faults in) megabytes on every call, about as
/// much work as receiving them. Up to this many bytes stay allocated per thread that runs
/// link collectives; larger scratch is freed after the call.
const SCRATCH_KEEP: usize = 64 << 20;

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `len` bytes of scratch (contents unspecified: whatever earlier calls left), returned to the
/// thread's store on drop. A nested user gets a buffer of its own.
pub(crate) struct Scratch(Vec<u8>);

impl Scratch {
    pub fn take(len: usize) -> Scratch {
        let mut v = SCRATCH.with(|c| c.take());
        if v.len() < len {
            v = vec![0u8; len];
        }
        Scratch(v)
    }
}

impl std::ops::Deref for Scratch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.0.len() <= SCRATCH_KEEP {
            let v = std::mem::take(&mut self.0);
            SCRATCH.with(|c| {
                // Keep the larger of ours and whatever a nested user put back.
                let other = c.take();
                c.set(if other.len() > v.len() { other } else { v });
            });
        }
    }
}

/// Waits for a receive and checks that exactly `expected` bytes came from `peer`.
pub(crate) fn wait_recv(p: Pending<'_>, expected: usize, peer: usize) -> Result<()> {
    let got = p.wait()?;
    if got != expected {
        bail!(
            Status::Mismatch,
            "expected {expected} bytes from rank {peer} but received {got} \
             (ranks disagree on the collective's arguments?)"
        );
    }
    Ok(())
}

/// A posted receive with what it must deliver.
pub(crate) struct Recv<'a> {
    pub op: Pending<'a>,
    pub len: usize,
    pub peer: usize,
}

impl<'a> Recv<'a> {
    pub fn post(link: &'a dyn Link, peer: usize, buf: &'a mut [u8]) -> Result<Recv<'a>> {
        let len = buf.len();
        Ok(Recv {
            op: link.recv(peer, buf)?,
            len,
            peer,
        })
    }
    pub fn wait(self) -> Result<()> {
        wait_recv(self.op, self.len, self.peer)
    }
}

/// Waits for every receive (in order), then every send. The first error returns at once; the
/// remaining ops are dropped, which cancels them.
pub(crate) fn wait_all(recvs: Vec<Recv<'_>>, sends: Vec<Pending<'_>>) -> Result<()> {
    for r in recvs {
        r.wait()?;
    }
    for s in sends {
        s.wait()?;
    }
    Ok(())
}

/// Splits `count` elements of `esz` bytes into `n` contiguous parts whose sizes differ by at
/// most one element (the first `count % n` parts get the extra one). Byte ranges.
pub(crate) fn split_elems(count: usize, n: usize, esz: usize) -> Vec<Range<usize>> {
    let (base, rem) = (count / n, count % n);
    let mut start = 0;
    (0..n)
        .map(|i| {
            let len = (base + usize::from(i < rem)) * esz;
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

/// `n` equal blocks of `block` bytes.
pub(crate) fn blocks(n: usize, block: usize) -> Vec<Range<usize>> {
    (0..n).map(|i| i * block..(i + 1) * block).collect()
}

/// Pieces of at most `seg` bytes covering `0..len`; always at least one (possibly empty) piece,
/// so sender and receiver agree on the message count even for empty chunks.
pub(crate) fn segments(len: usize, seg: usize) -> impl Iterator<Item = Range<usize>> {
    let seg = seg.max(1);
    let n = len.div_ceil(seg).max(1);
    (0..n).map(move |i| (i * seg).min(len)..((i + 1) * seg).min(len))
}

/// Starts sending `buf` to `peer` as messages of at most `seg` bytes, in order (one, empty,
/// for an empty `buf`: a receiver posts one receive per `segments` range).
pub(crate) fn send_segments<'a>(link: &'a dyn Link, peer: usize, buf: &'a [u8], seg: usize) -> Result<Vec<Pending<'a>>> {
    segments(buf.len(), seg).map(|g| link.send(peer, &buf[g])).collect()
}

pub(crate) fn check_op(dt: DType, op: ReduceOp) -> Result<()> {
    if !op.valid_for(dt) {
        bail!(
            Status::InvalidArgument,
            "op {} is not defined for dtype {}",
            op.name(),
            dt.name()
        );
    }
    Ok(())
}

pub(crate) fn check_elems(len: usize, dt: DType, what: &str) -> Result<()> {
    if !len.is_multiple_of(dt.size()) {
        bail!(
            Status::InvalidArgument,
            "{what}: {len} bytes is not a whole number of {} elements",
            dt.name()
        );
    }
    Ok(())
}

pub(crate) fn check_root(root: usize, n: usize) -> Result<()> {
    if root >= n {
        bail!(Status::InvalidArgument, "root {root} is outside [0, {n})");
    }
    Ok(())
}

pub(crate) fn check_len(got: usize, want: usize, what: &str) -> Result<()> {
    if got != want {
        bail!(
            Status::InvalidArgument,
            "{what} holds {got} bytes, expected {want}"
        );
    }
    Ok(())
}

/// Byte ranges `displs[i]..displs[i]+counts[i]`, checked to lie within `buf_len` (and, when
/// `disjoint`, not to overlap each other; empty ranges never overlap).
pub(crate) fn ranges_in(
    counts: &[usize],
    displs: &[usize],
    n: usize,
    buf_len: usize,
    disjoint: bool,
    what: &str,
) -> Result<Vec<Range<usize>>> {
    if counts.len() != n || displs.len() != n {
        bail!(
            Status::InvalidArgument,
            "{what}: {} counts and {} displacements for {n} ranks",
            counts.len(),
            displs.len()
        );
    }
    let mut out = Vec::with_capacity(n);
    for (i, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        match d.checked_add(c) {
            Some(end) if end <= buf_len => out.push(d..end),
            _ => bail!(
                Status::InvalidArgument,
                "{what}: rank {i}'s block [{d}, {d}+{c}) exceeds the buffer of {buf_len} bytes"
            ),
        }
    }
    if disjoint {
        let mut sorted: Vec<&Range<usize>> = out.iter().filter(|r| !r.is_empty()).collect();
        sorted.sort_by_key(|r| r.start);
        if let Some(w) = sorted.windows(2).find(|w| w[0].end > w[1].start) {
            return Err(err!(
                Status::InvalidArgument,
                "{what}: blocks {:?} and {:?} overlap",
                w[0],
                w[1]
            ));
        }
    }
    Ok(out)
}

/// Hands out sub-slices of one buffer when several of them must be borrowed at once across
/// pending operations in ways the borrow checker cannot see are disjoint (e.g. receives posted
/// into segments 1..k while segment 0, already received, is read or forwarded).
pub(crate) struct Carve<'a> {
    ptr: *mut u8,
    len: usize,
    _buf: PhantomData<&'a mut [u8]>,
}

impl<'a> Carve<'a> {
    pub fn new(buf: &'a mut [u8]) -> Carve<'a> {
        Carve {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            _buf: PhantomData,
        }
    }

    fn check(&self, r: &Range<usize>) {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "carve: {r:?} outside 0..{}",
            self.len
        );
    }

    /// # Safety
    /// While the returned slice is alive, no other slice handed out by this `Carve` that overlaps
    /// `r` may be alive (shared slices may overlap shared slices).
    pub unsafe fn part_mut(&self, r: Range<usize>) -> &'a mut [u8] {
        self.check(&r);
        // SAFETY: in bounds (checked); the buffer is exclusively borrowed for 'a by `new`;
        // exclusivity among the parts is the caller's obligation.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }

    /// # Safety
    /// While the returned slice is alive, no mutable slice overlapping `r` handed out by this
    /// `Carve` may be alive.
    pub unsafe fn part(&self, r: Range<usize>) -> &'a [u8] {
        self.check(&r);
        // SAFETY: as for `part_mut`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(r.start), r.len()) }
    }
}

/// `out = inputs[0] op inputs[1] op ... op inputs[k-1]`, left to right, then divided by `avg_n`
/// when `op` is Avg. Half-precision Sum/Prod/Avg reduce in f32 and round once. Every rank that
/// calls this with the same inputs gets the same bits.
pub(crate) fn reduce_in_order(
    dt: DType,
    op: ReduceOp,
    inputs: &[&[u8]],
    out: &mut [u8],
    avg_n: usize,
) {
    debug_assert!(!inputs.is_empty() && inputs.iter().all(|i| i.len() == out.len()));
    if crate::reduce::needs_widen(dt, op) {
        let mut acc = vec![0u8; out.len() * 2];
        let mut tmp = vec![0u8; out.len() * 2];
        crate::reduce::widen(dt, inputs[0], &mut acc);
        for inp in &inputs[1..] {
            crate::reduce::widen(dt, inp, &mut tmp);
            crate::reduce::combine(DType::Float32, op, &mut acc, &tmp);
        }
        if op == ReduceOp::Avg {
            crate::reduce::divide(DType::Float32, &mut acc, avg_n);
        }
        crate::reduce::narrow(dt, &acc, out);
        return;
    }
    match inputs {
        [only] => out.copy_from_slice(only),
        [a, b, rest @ ..] => {
            crate::reduce::combine_into(dt, op, out, a, b);
            for inp in rest {
                crate::reduce::combine(dt, op, out, inp);
            }
        }
        [] => {}
    }
    if op == ReduceOp::Avg {
        crate::reduce::divide(dt, out, avg_n);
    }
}

/// Peers other than `rank`, starting after it: rank+1, rank+2, ... (staggers traffic).
pub(crate) fn peers(rank: usize, n: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |k| (rank + k) % n)
}

/// This rank's place in the binomial tree over `n` ranks rooted at `root`, numbered relative to
/// the root (vr = (rank - root) mod n): the parent is vr with its lowest set bit cleared, the
/// children are vr + 1, vr + 2, vr + 4, ... below that bit (and below n). Returns the parent
/// (None at the root) and the children in that increasing order, as comm ranks. The subtree of
/// relative rank v holds relative ranks v..min(v + lowbit(v), n) (the root's: all of them).
pub(crate) fn binomial(rank: usize, n: usize, root: usize) -> (Option<usize>, Vec<usize>) {
    let vr = (rank + n - root) % n;
    let mut children = Vec::new();
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            return (Some((vr - mask + root) % n), children);
        }
        if vr + mask < n {
            children.push((vr + mask + root) % n);
        }
        mask <<= 1;
    }
    (None, children)
}

/// End (exclusive, relative rank) of the binomial subtree of relative rank `vr` among `n`.
pub(crate) fn subtree_end(vr: usize, n: usize) -> usize {
    if vr == 0 {
        n
    } else {
        (vr + (1 << vr.trailing_zeros())).min(n)
    }
}
