//! One-sided transfers to other processes of a window, in fence epochs: the origin queues each
//! Put / Get / Accumulate / Get_accumulate / Compare_and_swap as a record for its target, and the closing
//! MPI_Win_fence (collective over the window's group) carries them: an all-to-all of the
//! records, each target applies what it got in origin rank order and record order, then an
//! all-to-all of the data the gets read back, unpacked into the origins' buffers. So a
//! transfer completes at the fence that ends its epoch, as the standard's active target
//! synchronization says, with no progress thread at the target.
//!
//! A record names the target data by the target datatype's blocks (the origin's definition of
//! it, as the standard says), its extent and count, so the target needs no datatype handle.

use crate::abi_gen::*;
use crate::datatype::Type;
use crate::err::{MpiErr, Res};
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PUT: u8 = 1;
const ACC: u8 = 2;
const GET: u8 = 3;
const GET_ACC: u8 = 4;
/// Compare-and-swap: the data is the compare value then the new one, one element each.
const CAS: u8 = 5;

/// Where a get's data goes at the origin once the fence brings it.
pub struct Landing {
    addr: usize,
    count: u64,
    t: Arc<Type>,
}

impl Landing {
    /// The bytes the get reads, packed.
    fn bytes(&self) -> usize {
        self.t.map.packed_bytes(self.count).unwrap_or(0) as usize
    }
}

/// The transfers of this process waiting for the next fence.
#[derive(Default)]
pub struct Pending {
    /// Records per target rank.
    out: Vec<Vec<u8>>,
    /// Per target rank, where its replies go, in record order.
    landings: Vec<Vec<Landing>>,
}

impl Pending {
    pub fn is_empty(&self) -> bool {
        self.out.iter().all(|v| v.is_empty())
    }

    /// Whether a transfer queued for `rank` needs an answer (a get of any kind).
    pub fn answers_due(&self, rank: usize) -> bool {
        self.landings.get(rank).is_some_and(|l| !l.is_empty())
    }

    /// The records for `rank` and where their replies go, taken out (an access epoch's end).
    pub fn take_for(&mut self, rank: usize) -> (Vec<u8>, Vec<Landing>) {
        match (self.out.get_mut(rank), self.landings.get_mut(rank)) {
            (Some(o), Some(l)) => (std::mem::take(o), std::mem::take(l)),
            _ => (Vec::new(), Vec::new()),
        }
    }

    fn slot(&mut self, n: usize, rank: usize) -> &mut Vec<u8> {
        if self.out.len() < n {
            self.out.resize_with(n, Vec::new);
            self.landings.resize_with(n, Vec::new);
        }
        &mut self.out[rank]
    }
}

/// A transfer's target: rank, displacement (in the target's disp units), and datatype.
pub struct Remote<'a> {
    pub rank: usize,
    pub disp: i64,
    pub count: u64,
    pub t: &'a Type,
}

fn put_u64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}

/// Queues a transfer: `kind`, its `op` and basic type (accumulates), its origin data, and for
/// gets where the reply lands.
fn queue(p: &mut Pending, n: usize, r: &Remote, kind: u8, op: MPI_Op, data: &[u8], landing: Option<Landing>) {
    let basic = r.t.map.basic.unwrap_or(0) as u64;
    let v = p.slot(n, r.rank);
    v.push(kind);
    put_u64(v, op as u64);
    put_u64(v, basic);
    put_u64(v, r.disp as u64);
    put_u64(v, r.count);
    put_u64(v, r.t.map.extent() as u64);
    let blocks = r.t.map.flat_blocks();
    put_u64(v, blocks.len() as u64);
    for b in &blocks {
        put_u64(v, b.off as u64);
        put_u64(v, b.len);
    }
    put_u64(v, data.len() as u64);
    v.extend_from_slice(data);
    if let Some(l) = landing {
        p.landings[r.rank].push(l);
    }
}

pub fn put(p: &mut Pending, n: usize, r: &Remote, data: &[u8]) {
    queue(p, n, r, PUT, 0, data, None);
}

pub fn accumulate(p: &mut Pending, n: usize, r: &Remote, op: MPI_Op, data: &[u8]) {
    queue(p, n, r, ACC, op, data, None);
}

/// A get (or, with `acc`, a get-accumulate) whose reply is unpacked into `count` elements of
/// `t` at `addr` at the fence.
pub fn get(p: &mut Pending, n: usize, r: &Remote, acc: Option<(MPI_Op, &[u8])>, addr: usize, count: u64, t: Arc<Type>) {
    let l = Landing { addr, count, t };
    match acc {
        Some((op, data)) => queue(p, n, r, GET_ACC, op, data, Some(l)),
        None => queue(p, n, r, GET, 0, &[], Some(l)),
    }
}

/// A compare-and-swap of one element: `compare` and `new` are its packed bytes; the element's
/// old value lands in `t` at `addr` at the fence.
pub fn compare_and_swap(p: &mut Pending, n: usize, r: &Remote, compare: &[u8], new: &[u8], addr: usize, t: Arc<Type>) {
    let data = [compare, new].concat();
    queue(p, n, r, CAS, 0, &data, Some(Landing { addr, count: 1, t }));
}

// ---- the fence --------------------------------------------------------------------------------

/// Reads a record stream; a malformed one (never made by `queue`) ends the walk.
struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn u64(&mut self) -> Option<u64> {
        let (h, t) = self.b.split_at_checked(8)?;
        self.b = t;
        Some(u64::from_le_bytes(h.try_into().ok()?))
    }
    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        let (h, t) = self.b.split_at_checked(n)?;
        self.b = t;
        Some(h)
    }
}

/// This process's window memory, as the target of the records (the window's and its
/// passive-target server's copies share `turns`).
#[derive(Clone)]
pub struct Local {
    pub base: usize,
    pub size: usize,
    pub disp_unit: i64,
    /// Held while a transfer reads or writes this memory: the passive-target server's thread
    /// and this process's own transfers to itself take turns, so an accumulate is atomic per
    /// element against the others (MPI's rule; two read-modify-writes at once lost one).
    pub turns: Arc<Mutex<()>>,
    /// A dynamic window's attached memory, (address, length) each (MPI_Win_attach); its
    /// offsets are addresses (`base` 0). None for the other flavors.
    pub attached: Option<Arc<Mutex<Vec<(usize, usize)>>>>,
}

impl Local {
    /// Whether `len` bytes at offset `at` (an address in a dynamic window) lie in this window's
    /// memory: within its size, or within attached regions (several that adjoin, as MPICH's
    /// tests attach two halves of one array and write across both).
    pub fn holds(&self, at: u64, len: u64) -> bool {
        let Some(end) = at.checked_add(len) else { return false };
        let Some(regions) = &self.attached else { return end <= self.size as u64 };
        let regions = regions.lock().unwrap_or_else(|p| p.into_inner());
        let mut covered = at;
        while covered < end {
            match regions.iter().find(|&&(b, l)| b as u64 <= covered && covered < (b + l) as u64) {
                Some(&(b, l)) => covered = (b + l) as u64,
                None => return false,
            }
        }
        true
    }

    /// `f` while no other transfer touches this memory.
    pub fn in_turn<T>(&self, f: impl FnOnce() -> T) -> T {
        let _turn = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        f()
    }
}

/// The target byte ranges of one record: (offset in the window, length), in type-map order;
/// None when one leaves the window (the origin checked; this is the target's own guard).
/// Ranges that touch are merged: a dense type's `count` elements are one range (a put of 4 MiB
/// of MPI_BYTE was 4 Mi one-byte copies).
fn ranges(w: &Local, disp: i64, count: u64, extent: i64, blocks: &[(i64, u64)]) -> Option<Vec<(usize, usize)>> {
    let base = disp.checked_mul(w.disp_unit)?;
    let inside = |at: i64, len: i64| -> Option<(usize, usize)> {
        let end = at.checked_add(len)?;
        (at >= 0 && end >= at && w.holds(at as u64, len as u64)).then_some((at as usize, len as usize))
    };
    if let [(off, len)] = blocks {
        if *len as i64 == extent {
            let total = i64::try_from(count).ok()?.checked_mul(extent)?;
            let (at, len) = inside(base.checked_add(*off)?, total)?;
            return Some(if len == 0 { vec![] } else { vec![(at, len)] });
        }
    }
    let mut v: Vec<(usize, usize)> = Vec::new();
    for i in 0..count as i64 {
        for &(off, len) in blocks {
            let at = base.checked_add(i.checked_mul(extent)?)?.checked_add(off)?;
            let (at, len) = inside(at, len as i64)?;
            match v.last_mut() {
                Some(last) if last.0 + last.1 == at => last.1 += len,
                _ => v.push((at, len)),
            }
        }
    }
    Some(v)
}

/// Applies the records one origin sent, in turn with the other transfers to this memory;
/// returns the bytes its gets read.
pub fn apply(w: &Local, recs: &[u8]) -> Result<Vec<u8>, MpiErr> {
    w.in_turn(|| apply_now(w, recs))
}

fn apply_now(w: &Local, recs: &[u8]) -> Result<Vec<u8>, MpiErr> {
    let mut r = Reader { b: recs };
    let mut reply = Vec::new();
    let bad = || MpiErr::new(MPI_ERR_INTERN, "a one-sided record from another process is malformed");
    while !r.b.is_empty() {
        let kind = r.bytes(1).ok_or_else(bad)?[0];
        let op = r.u64().ok_or_else(bad)? as MPI_Op;
        let basic = r.u64().ok_or_else(bad)? as usize;
        let disp = r.u64().ok_or_else(bad)? as i64;
        let count = r.u64().ok_or_else(bad)?;
        let extent = r.u64().ok_or_else(bad)? as i64;
        let nb = r.u64().ok_or_else(bad)? as usize;
        let mut blocks = Vec::with_capacity(nb.min(recs.len() / 16));
        for _ in 0..nb {
            blocks.push((r.u64().ok_or_else(bad)? as i64, r.u64().ok_or_else(bad)?));
        }
        let dlen = r.u64().ok_or_else(bad)? as usize;
        let data = r.bytes(dlen).ok_or_else(bad)?;
        let rs = ranges(w, disp, count, extent, &blocks).ok_or_else(|| MpiErr::new(MPI_ERR_RMA_RANGE, "a one-sided transfer from another process leaves this process's window"))?;
        // SAFETY: every range lies within this process's window memory (checked just above).
        let mem = |(at, len): (usize, usize)| unsafe { std::slice::from_raw_parts_mut((w.base + at) as *mut u8, len) };
        let mut cur = Vec::new();
        if kind != PUT {
            for &x in &rs {
                cur.extend_from_slice(mem(x));
            }
        }
        if kind == GET || kind == GET_ACC || kind == CAS {
            reply.extend_from_slice(&cur);
        }
        let new: &[u8] = match kind {
            PUT => data,
            CAS => {
                let (compare, swap) = data.split_at_checked(cur.len()).ok_or_else(bad)?;
                if swap.len() != cur.len() {
                    return Err(bad());
                }
                if compare != cur.as_slice() {
                    continue;
                }
                swap
            }
            ACC | GET_ACC if op != MPI_NO_OP => {
                if data.len() != cur.len() {
                    return Err(bad());
                }
                crate::win::combine(op, Some(basic), data, &mut cur)?;
                &cur
            }
            _ => continue,
        };
        let mut o = 0;
        for x in rs {
            let m = mem(x);
            let n = m.len().min(new.len().saturating_sub(o));
            m[..n].copy_from_slice(&new[o..o + n]);
            o += n;
        }
    }
    Ok(reply)
}

/// Collective over `comm`: every process's blocks to every other (`send[r]` to rank r).
fn exchange(comm: &Comm, send: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, MpiErr> {
    let n = comm.size();
    let sizes: Vec<u8> = (0..n).flat_map(|r| (send.get(r).map_or(0, |v| v.len()) as u64).to_le_bytes()).collect();
    let mut rsizes = vec![0u8; 8 * n];
    comm.collective(CollArgs::Alltoall { send: ConstBuf::from_slice(&sizes), recv: MutBuf::from_slice(&mut rsizes), dt: distcomm::DType::Uint64 })?;
    let rc: Vec<usize> = rsizes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize).collect();
    let sc: Vec<usize> = (0..n).map(|r| send.get(r).map_or(0, |v| v.len())).collect();
    let mut flat = Vec::with_capacity(sc.iter().sum());
    for v in send.iter().take(n) {
        flat.extend_from_slice(v);
    }
    let displs = |c: &[usize]| c.iter().scan(0, |s, &x| Some(std::mem::replace(s, *s + x))).collect::<Vec<usize>>();
    let (sd, rd) = (displs(&sc), displs(&rc));
    let mut recv = vec![0u8; rc.iter().sum()];
    comm.collective(CollArgs::Alltoallv {
        send: ConstBuf::from_slice(&flat),
        scounts: sc,
        sdispls: sd,
        recv: MutBuf::from_slice(&mut recv),
        rcounts: rc.clone(),
        rdispls: rd.clone(),
        dt: distcomm::DType::Uint8,
    })?;
    Ok((0..n).map(|r| recv[rd[r]..rd[r] + rc[r]].to_vec()).collect())
}

/// The deadline of a wait that may last `timeout_ms` (a window's communicator's timeout).
pub fn deadline(timeout_ms: i64) -> Instant {
    Instant::now() + Duration::from_millis(timeout_ms.max(1) as u64)
}

/// Receives the `len` bytes that `from` sends with `tag` (records, or what gets read, carried
/// point to point after their length): nothing is waited for when `len` is 0.
pub fn recv_bytes(comm: &Comm, from: usize, tag: u32, len: usize, deadline: Instant, what: &dyn Fn() -> String) -> Result<Vec<u8>, distcomm::Error> {
    let mut v = vec![0u8; len];
    if len > 0 {
        let op = comm.post_recv(MutBuf::from_slice(&mut v), Some(from), Some(tag))?;
        comm.wait_p2p(&op, deadline, what)?;
    }
    Ok(v)
}

/// The fence's transfers: collective over `comm`, with this process's `pending` ones.
pub fn fence(comm: &Comm, w: &Local, pending: Pending) -> Res {
    let n = comm.size();
    let got = exchange(comm, &pending.out)?;
    // Each origin that sent records gets a status byte (OK or REFUSED: a record out of this
    // window's memory, which only a dynamic window's target can tell) and what its gets read.
    let mut first: Res = Ok(());
    let mut replies = Vec::with_capacity(n);
    for recs in &got {
        if recs.is_empty() {
            replies.push(Vec::new());
            continue;
        }
        match apply(w, recs) {
            Ok(r) => replies.push([&[OK][..], &r].concat()),
            Err(e) => {
                replies.push(vec![REFUSED]);
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
    }
    let back = exchange(comm, &replies)?;
    for (r, data) in back.iter().enumerate().filter(|(r, _)| pending.out.get(*r).is_some_and(|o| !o.is_empty())) {
        match data.split_first() {
            Some((&OK, read)) => land(pending.landings.get(r).map(|v| v.as_slice()).unwrap_or(&[]), read),
            _ => {
                if first.is_ok() {
                    first = Err(refused(r));
                }
            }
        }
    }
    first
}

/// A reply's status: the records were applied, or one was refused (see `fence`).
const OK: u8 = 0;
const REFUSED: u8 = 1;

/// The error of an origin whose transfers `rank` refused.
pub fn refused(rank: usize) -> MpiErr {
    MpiErr::new(MPI_ERR_RMA_RANGE, format!("window rank {rank} refused a transfer of this epoch: its target data is not within the memory attached there"))
}

/// The bytes the gets of `landings` read, packed (their answer's length).
pub fn answer_bytes(landings: &[Landing]) -> usize {
    landings.iter().map(Landing::bytes).sum()
}

/// Unpacks what one target's gets read (`data`, in record order) into their origin buffers.
pub fn land(landings: &[Landing], data: &[u8]) {
    let mut o = 0usize;
    for l in landings {
        let end = (o + l.bytes()).min(data.len());
        // SAFETY: the origin buffer of the get holds `count` elements of its type and is the
        // library's until the epoch ends (MPI's rule).
        unsafe { l.t.map.unpack(&data[o..end], l.addr as *mut u8, l.count) };
        o = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_merged_and_checked_against_the_window() {
        let w = Local { base: 0, size: 1 << 23, disp_unit: 1, turns: Default::default(), attached: None };
        // 4 Mi bytes of a dense type: one range.
        assert_eq!(ranges(&w, 8, 4 << 20, 1, &[(0, 1)]), Some(vec![(8, 4 << 20)]));
        assert_eq!(ranges(&w, 0, 0, 4, &[(0, 4)]), Some(vec![]));
        // A resized contiguous type (its block 4 bytes in): one range from there.
        assert_eq!(ranges(&w, 0, 3, 2, &[(4, 2)]), Some(vec![(4, 6)]));
        // A vector of 2-of-every-4 bytes: separate ranges; blocks that touch merge.
        assert_eq!(ranges(&w, 0, 3, 4, &[(0, 2)]), Some(vec![(0, 2), (4, 2), (8, 2)]));
        assert_eq!(ranges(&w, 0, 2, 4, &[(0, 2), (2, 2)]), Some(vec![(0, 8)]));
        // Outside the window, below or beyond: refused.
        assert_eq!(ranges(&w, -1, 1, 1, &[(0, 1)]), None);
        assert_eq!(ranges(&w, 1, 1 << 23, 1, &[(0, 1)]), None);
        assert_eq!(ranges(&w, 0, 3, 1 << 22, &[(0, 4)]), None);
        let w4 = Local { base: 0, size: 64, disp_unit: 4, turns: Default::default(), attached: None };
        assert_eq!(ranges(&w4, 15, 1, 4, &[(0, 4)]), Some(vec![(60, 4)]));
        assert_eq!(ranges(&w4, 16, 1, 4, &[(0, 4)]), None);
        // A dynamic window: offsets are addresses, inside one attached region each.
        let regions = Arc::new(Mutex::new(vec![(0x1000, 64), (0x2000, 16)]));
        let wd = Local { base: 0, size: 0, disp_unit: 1, turns: Default::default(), attached: Some(regions.clone()) };
        assert_eq!(ranges(&wd, 0x1000, 64, 1, &[(0, 1)]), Some(vec![(0x1000, 64)]));
        assert_eq!(ranges(&wd, 0x2008, 2, 4, &[(0, 4)]), Some(vec![(0x2008, 8)]));
        assert_eq!(ranges(&wd, 0x1000, 65, 1, &[(0, 1)]), None, "past the region's end");
        assert_eq!(ranges(&wd, 0x103c, 2, 4, &[(0, 4)]), None, "across two regions' gap");
        regions.lock().unwrap().push((0x1040, 16));
        assert_eq!(ranges(&wd, 0x103c, 2, 4, &[(0, 4)]), Some(vec![(0x103c, 8)]), "across two that adjoin");
        assert_eq!(ranges(&wd, 0x3000, 1, 1, &[(0, 1)]), None, "not attached");
        regions.lock().unwrap().clear();
        assert_eq!(ranges(&wd, 0x1000, 1, 1, &[(0, 1)]), None, "detached");
    }
}
