//! Type maps: where the bytes of one element of a datatype lie in memory, as blocks of
//! (offset, length) in type-map order (adjacent runs merged) and, for types made of many
//! copies of a smaller one, repeats that keep that smaller map once (a vector of a billion
//! blocks is one repeat, not a billion blocks); the bounds the standard defines (lb, ub, true
//! bounds, sticky markers from MPI_Type_create_resized); the type signature as runs of basic
//! elements (for MPI_Get_elements), compact in the same way; and pack/unpack between user
//! memory and the contiguous bytes the engine moves.

use std::sync::Arc;

/// Segments (blocks and repeats) a type map writes out before each further part of the caller's
/// list becomes one segment: what we store stays within this plus the caller's list, never a
/// multiple of it.
#[cfg(not(test))]
const FLAT_BUDGET: usize = 1 << 22;
/// Small under test, so that the unit tests cross it with lists of a few thousand.
#[cfg(test)]
const FLAT_BUDGET: usize = 1 << 10;

/// A part repeated into at most this many segments is stored flat (its blocks can merge and
/// packing walks one list); a larger one is stored as a repeat of its child's map.
const FLAT_LIMIT: u64 = 256;

/// `n` basic elements in a row of predefined type `basic`, `size` bytes each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub basic: usize,
    pub size: u64,
    pub n: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub off: i64,
    pub len: u64,
}

/// A piece of a type map, offsets from the element's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    Block(Block),
    /// `count` copies of the map `inner`, the first at `off`, each next `stride` bytes on.
    Repeat { off: i64, count: u64, stride: i64, inner: Arc<[Seg]> },
}

/// A piece of a type signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SigSeg {
    Run(Run),
    /// `count` copies of the signature `inner`, which holds `size` bytes in `nelems` elements.
    Repeat { count: u64, inner: Arc<[SigSeg]>, size: u64, nelems: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub blocks: Arc<[Seg]>,
    /// Bytes of data (MPI_Type_size).
    pub size: u64,
    pub lb: i64,
    pub ub: i64,
    pub true_lb: i64,
    pub true_ub: i64,
    /// lb/ub set by MPI_Type_create_resized (markers that outer constructors keep).
    pub explicit_lb: bool,
    pub explicit_ub: bool,
    /// The largest alignment of a basic element (struct extents are padded to it).
    pub align: u64,
    /// The basic elements in order (the type signature), runs merged.
    pub sig: Arc<[SigSeg]>,
    /// Basic elements in one element of this type.
    pub nelems: u64,
    /// The one predefined type every basic element is (reductions), or None when mixed.
    pub basic: Option<usize>,
}

/// Why a type map could not be made.
#[derive(Debug, PartialEq, Eq)]
pub enum MapErr {
    /// Offsets, sizes or counts overflow 64 bits.
    Overflow,
    /// The memory for the map could not be had.
    NoMemory,
}

fn ck(v: Option<i64>) -> Result<i64, MapErr> {
    v.ok_or(MapErr::Overflow)
}

/// One part of a new type: `reps` elements of `child`, the first at byte `disp`, each next one
/// `stride` bytes further (the child's extent, unless a vector or subarray says otherwise).
pub struct Part<'a> {
    pub disp: i64,
    pub reps: u64,
    pub stride: i64,
    pub child: &'a Layout,
}

impl<'a> Part<'a> {
    /// `reps` elements of `child` back to back from `disp`.
    pub fn new(disp: i64, reps: u64, child: &'a Layout) -> Part<'a> {
        Part { disp, reps, stride: child.extent(), child }
    }

    /// `reps` elements of `child`, `stride` bytes apart, from `disp`.
    pub fn strided(disp: i64, reps: u64, stride: i64, child: &'a Layout) -> Part<'a> {
        Part { disp, reps, stride, child }
    }
}

impl Layout {
    /// A predefined type: its data `blocks` within [0, extent).
    pub fn predefined(handle: usize, blocks: &[(i64, u64)], extent: i64, align: u64) -> Layout {
        let size = blocks.iter().map(|b| b.1).sum();
        let true_lb = blocks.first().map_or(0, |b| b.0);
        let true_ub = blocks.last().map_or(0, |b| b.0 + b.1 as i64);
        Layout {
            blocks: blocks.iter().map(|&(off, len)| Seg::Block(Block { off, len })).collect(),
            size,
            lb: 0,
            ub: extent,
            true_lb,
            true_ub,
            explicit_lb: false,
            explicit_ub: false,
            align: align.max(1),
            sig: if size > 0 { Arc::new([SigSeg::Run(Run { basic: handle, size, n: 1 })]) } else { Arc::new([]) },
            nelems: 1,
            basic: Some(handle),
        }
    }

    pub fn extent(&self) -> i64 {
        self.ub - self.lb
    }

    pub fn true_extent(&self) -> i64 {
        self.true_ub - self.true_lb
    }

    /// The one block of an element's data, if it is one.
    fn single_block(&self) -> Option<Block> {
        match &*self.blocks {
            [Seg::Block(b)] => Some(*b),
            _ => None,
        }
    }

    /// Where the data of `count` elements lies when it is one run of memory (no data; one
    /// element of one block; or one block per element, elements back to back): the run's
    /// offset from the first element's address. Packing such data is one copy, not one per
    /// element.
    pub fn one_run(&self, count: u64) -> Option<i64> {
        if self.size == 0 {
            return Some(0);
        }
        self.single_block().filter(|b| count <= 1 || self.extent() == b.len as i64).map(|b| b.off)
    }

    /// The bytes of `count` elements' run (`one_run`) that fit in `room`.
    fn run_bytes(&self, count: u64, room: usize) -> usize {
        self.size.checked_mul(count).map_or(room, |t| t.min(room as u64) as usize)
    }

    /// Data in one block at offset 0 and elements back to back: user memory is the wire format.
    pub fn dense(&self) -> bool {
        self.lb == 0 && self.extent() as u64 == self.size && (self.size == 0 || self.single_block() == Some(Block { off: 0, len: self.size }))
    }

    /// The type made of `parts` in order (every constructor is this); `pad` rounds the extent
    /// up to the largest alignment when no resized marker fixes the upper bound (what
    /// MPI_Type_create_struct does, as C compilers pad structs).
    pub fn compose(parts: &[Part], pad: bool) -> Result<Layout, MapErr> {
        let mut blocks: Vec<Seg> = Vec::new();
        let mut sig: Vec<SigSeg> = Vec::new();
        // At least one segment a part: ask for that much now so that a list too long for this
        // machine is an error, not an abort.
        blocks.try_reserve(parts.len()).map_err(|_| MapErr::NoMemory)?;
        let (mut size, mut nelems, mut align) = (0u64, 0u64, 1u64);
        // Bounds over the parts: all, resized markers only, data only.
        let (mut lb, mut ub): (Option<i64>, Option<i64>) = (None, None);
        let (mut xlb, mut xub): (Option<i64>, Option<i64>) = (None, None);
        let (mut tlb, mut tub): (Option<i64>, Option<i64>) = (None, None);
        let mut basic: Option<Option<usize>> = None;
        for p in parts {
            let c = p.child;
            align = align.max(c.align);
            basic = Some(match basic {
                None => c.basic,
                Some(b) if b == c.basic => b,
                Some(_) => None,
            });
            if p.reps == 0 {
                continue;
            }
            let last = ck(p.stride.checked_mul(i64::try_from(p.reps - 1).map_err(|_| MapErr::Overflow)?))?;
            let lo = ck(p.disp.checked_add(last.min(0)))?;
            let hi = ck(p.disp.checked_add(last.max(0)))?;
            let (l, u) = (ck(lo.checked_add(c.lb))?, ck(hi.checked_add(c.ub))?);
            lb = Some(lb.map_or(l, |x| x.min(l)));
            ub = Some(ub.map_or(u, |x| x.max(u)));
            if c.explicit_lb {
                xlb = Some(xlb.map_or(l, |x| x.min(l)));
            }
            if c.explicit_ub {
                xub = Some(xub.map_or(u, |x| x.max(u)));
            }
            if c.size > 0 {
                let (l, u) = (ck(lo.checked_add(c.true_lb))?, ck(hi.checked_add(c.true_ub))?);
                tlb = Some(tlb.map_or(l, |x| x.min(l)));
                tub = Some(tub.map_or(u, |x| x.max(u)));
            }
            size = c.size.checked_mul(p.reps).and_then(|s| s.checked_add(size)).ok_or(MapErr::Overflow)?;
            nelems = c.nelems.checked_mul(p.reps).and_then(|s| s.checked_add(nelems)).ok_or(MapErr::Overflow)?;
            if size > i64::MAX as u64 {
                return Err(MapErr::Overflow);
            }
            place_blocks(&mut blocks, p, c)?;
            place_sig(&mut sig, p.reps, c)?;
        }
        let explicit_lb = xlb.is_some();
        let explicit_ub = xub.is_some();
        let mut out = Layout {
            blocks: blocks.into(),
            size,
            lb: xlb.or(lb).unwrap_or(0),
            ub: xub.or(ub).unwrap_or(0),
            true_lb: tlb.unwrap_or(0),
            true_ub: tub.unwrap_or(0),
            explicit_lb,
            explicit_ub,
            align,
            sig: sig.into(),
            nelems,
            basic: basic.flatten(),
        };
        if pad && !out.explicit_ub && lb.is_some() {
            let ext = out.ub - out.lb;
            let a = out.align as i64;
            let r = ext.rem_euclid(a);
            if r != 0 {
                out.ub = ck(out.ub.checked_add(a - r))?;
            }
        }
        ck(out.ub.checked_sub(out.lb))?;
        Ok(out)
    }

    /// MPI_Type_create_resized: the same data, with lb and extent set (sticky markers).
    pub fn resized(&self, lb: i64, extent: i64) -> Result<Layout, MapErr> {
        let mut l = self.clone();
        l.lb = lb;
        l.ub = ck(lb.checked_add(extent))?;
        l.explicit_lb = true;
        l.explicit_ub = true;
        Ok(l)
    }

    /// Basic elements in `bytes` of packed data, or None when they end inside an element.
    pub fn elements_in(&self, bytes: u64) -> Option<u64> {
        if self.size == 0 {
            return Some(0);
        }
        let (full, mut rem) = (bytes / self.size, bytes % self.size);
        let mut n = full.checked_mul(self.nelems)?;
        sig_prefix(&self.sig, false, &mut rem, &mut n);
        (rem == 0).then_some(n)
    }

    /// Packed bytes of the first `n` basic elements of a sequence of elements of this type
    /// (MPI_Status_set_elements).
    pub fn bytes_of_elements(&self, n: u64) -> Option<u64> {
        if self.nelems == 0 {
            return (n == 0).then_some(0);
        }
        let (full, mut rem) = (n / self.nelems, n % self.nelems);
        let mut b = full.checked_mul(self.size)?;
        sig_prefix(&self.sig, true, &mut rem, &mut b);
        Some(b)
    }

    /// Calls `f` with each run of one element's signature, in order (repeats written out).
    pub fn for_each_run(&self, mut f: impl FnMut(Run)) {
        fn walk(sig: &[SigSeg], f: &mut impl FnMut(Run)) {
            for s in sig {
                match s {
                    SigSeg::Run(r) => f(*r),
                    SigSeg::Repeat { count, inner, .. } => (0..*count).for_each(|_| walk(inner, f)),
                }
            }
        }
        walk(&self.sig, &mut f)
    }

    /// The sum of `per_run` over one element's signature, a repeat's counted once and
    /// multiplied: `per_run`'s first error, or `overflow()` where the sum overflows.
    pub fn sum_over_runs<E>(&self, per_run: &dyn Fn(Run) -> Result<u64, E>, overflow: &dyn Fn() -> E) -> Result<u64, E> {
        fn sum<E>(sig: &[SigSeg], f: &dyn Fn(Run) -> Result<u64, E>, overflow: &dyn Fn() -> E) -> Result<u64, E> {
            sig.iter().try_fold(0u64, |acc, s| {
                let part = match s {
                    SigSeg::Run(r) => f(*r)?,
                    SigSeg::Repeat { count, inner, .. } => sum(inner, f, overflow)?.checked_mul(*count).ok_or_else(overflow)?,
                };
                acc.checked_add(part).ok_or_else(overflow)
            })
        }
        sum(&self.sig, per_run, overflow)
    }

    /// The blocks of one element, written out (repeats expanded, touching blocks merged).
    pub fn flat_blocks(&self) -> Vec<Block> {
        let mut v = Vec::new();
        self.walk(1, |r| {
            for i in 0..r.count {
                push_block(&mut v, r.at(i), r.len);
            }
            true
        });
        v
    }

    /// Calls `f` for every block of `count` elements in type-map order, a vector's blocks in
    /// one call (offsets from the first element's address, wrapping: they are only formed, not
    /// checked); stops when `f` returns false.
    fn walk(&self, count: u64, mut f: impl FnMut(Strided) -> bool) {
        let ext = self.extent();
        for i in 0..count {
            if !walk_segs(&self.blocks, (i as i64).wrapping_mul(ext), &mut f) {
                return;
            }
        }
    }

    /// Copies the blocks `walk` gives into or out of packed bytes of `room` bytes: `copy(block
    /// offset, packed offset, bytes)`; stops when the packed bytes are used up.
    fn each_copy(&self, count: u64, room: usize, mut copy: impl FnMut(i64, usize, usize)) {
        let mut o = 0usize;
        self.walk(count, |r| {
            for i in 0..r.count {
                if o >= room {
                    return false;
                }
                let n = (r.len as usize).min(room - o);
                copy(r.at(i), o, n);
                o += n;
            }
            true
        });
    }

    /// Packed bytes of `count` elements.
    pub fn packed_bytes(&self, count: u64) -> Option<u64> {
        packed_bytes(self.size, count)
    }

    /// Copies `count` elements at `src` (user memory with this map) into `dst`, back to back;
    /// stops when `dst` is full.
    ///
    /// # Safety
    /// Every byte the map places (for `count` elements from `src`) is readable.
    pub unsafe fn pack(&self, src: *const u8, count: u64, dst: &mut [u8]) {
        if let Some(off) = self.one_run(count) {
            let n = self.run_bytes(count, dst.len());
            // SAFETY: the run is the caller's `count` elements (the function's contract).
            unsafe { std::ptr::copy_nonoverlapping(src.wrapping_offset(off as isize), dst.as_mut_ptr(), n) };
            return;
        }
        let to = dst.as_mut_ptr();
        self.each_copy(count, dst.len(), |off, o, n| {
            // SAFETY: the caller's memory holds this block (the function's contract); `o + n`
            // is within `dst`.
            unsafe { std::ptr::copy_nonoverlapping(src.wrapping_offset(off as isize), to.add(o), n) }
        });
    }

    /// Copies packed bytes `src` into up to `count` elements at `dst` (user memory with this
    /// map), in type-map order; a short `src` fills the first elements (a shorter message).
    ///
    /// # Safety
    /// Every byte the map places (for `count` elements from `dst`) is writable.
    pub unsafe fn unpack(&self, src: &[u8], dst: *mut u8, count: u64) {
        if let Some(off) = self.one_run(count) {
            let n = self.run_bytes(count, src.len());
            // SAFETY: as in `pack`.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.wrapping_offset(off as isize), n) };
            return;
        }
        self.each_copy(count, src.len(), |off, o, n| {
            // SAFETY: as in `pack`.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(o), dst.wrapping_offset(off as isize), n) }
        });
    }
}

/// `count` blocks of `len` bytes, `stride` bytes apart from `off` (one block: count 1).
#[derive(Clone, Copy)]
struct Strided {
    off: i64,
    len: u64,
    count: u64,
    stride: i64,
}

impl Strided {
    /// Where block `i` starts.
    fn at(&self, i: u64) -> i64 {
        self.off.wrapping_add((i as i64).wrapping_mul(self.stride))
    }
}

/// `walk` over `segs` placed at `base`.
fn walk_segs(segs: &[Seg], base: i64, f: &mut impl FnMut(Strided) -> bool) -> bool {
    for s in segs {
        let go = match s {
            Seg::Block(b) => f(Strided { off: base.wrapping_add(b.off), len: b.len, count: 1, stride: 0 }),
            Seg::Repeat { off, count, stride, inner } => {
                let first = base.wrapping_add(*off);
                match &**inner {
                    // A vector's blocks: one call.
                    [Seg::Block(b)] => f(Strided { off: first.wrapping_add(b.off), len: b.len, count: *count, stride: *stride }),
                    _ => (0..*count).all(|i| walk_segs(inner, first.wrapping_add((i as i64).wrapping_mul(*stride)), f)),
                }
            }
        };
        if !go {
            return false;
        }
    }
    true
}

/// Adds part `p`'s blocks: one longer block when the child's one block fills the stride; the
/// child's segments written out when few; else one repeat of the child's map.
fn place_blocks(out: &mut Vec<Seg>, p: &Part, c: &Layout) -> Result<(), MapErr> {
    if let Some(b) = c.single_block() {
        if p.reps == 1 || (b.len as i64 == p.stride && p.stride > 0) {
            let len = b.len.checked_mul(p.reps).ok_or(MapErr::Overflow)?;
            push_block(out, ck(p.disp.checked_add(b.off))?, len);
            return Ok(());
        }
    }
    if c.blocks.is_empty() {
        return Ok(());
    }
    if flat_fits(out.len(), c.blocks.len(), p.reps) {
        for r in 0..p.reps {
            let base = ck((r as i64).checked_mul(p.stride).and_then(|x| x.checked_add(p.disp)))?;
            for s in c.blocks.iter() {
                match s {
                    Seg::Block(b) => push_block(out, ck(base.checked_add(b.off))?, b.len),
                    Seg::Repeat { off, count, stride, inner } => {
                        out.push(Seg::Repeat { off: ck(base.checked_add(*off))?, count: *count, stride: *stride, inner: inner.clone() })
                    }
                }
            }
        }
    } else {
        out.push(Seg::Repeat { off: p.disp, count: p.reps, stride: p.stride, inner: c.blocks.clone() });
    }
    Ok(())
}

/// Whether `reps` copies of a child of `segs` segments are written out, onto a list of `have`.
fn flat_fits(have: usize, segs: usize, reps: u64) -> bool {
    (segs as u64).saturating_mul(reps) <= FLAT_LIMIT && have < FLAT_BUDGET
}

/// Adds `reps` copies of `c`'s signature: one longer run when it is one run; written out when
/// few; else one repeat.
fn place_sig(out: &mut Vec<SigSeg>, reps: u64, c: &Layout) -> Result<(), MapErr> {
    match &*c.sig {
        [] => {}
        [SigSeg::Run(r)] => push_sig(out, Run { n: r.n.checked_mul(reps).ok_or(MapErr::Overflow)?, ..*r }),
        s if flat_fits(out.len(), s.len(), reps) => {
            for _ in 0..reps {
                for x in s {
                    match x {
                        SigSeg::Run(r) => push_sig(out, *r),
                        rep => out.push(rep.clone()),
                    }
                }
            }
        }
        s => out.push(SigSeg::Repeat { count: reps, inner: Arc::from(s), size: c.size, nelems: c.nelems }),
    }
    Ok(())
}

/// Walks the first `rem` units of `sig` (repeated as needed): bytes, or basic elements where
/// `by_elements`; adds to `other` as many of the other unit, and leaves in `rem` what does not
/// fill a basic element.
fn sig_prefix(sig: &[SigSeg], by_elements: bool, rem: &mut u64, other: &mut u64) {
    for s in sig {
        if *rem == 0 {
            return;
        }
        let (bytes, elems, count, inner) = match s {
            SigSeg::Run(r) => (r.size, 1, r.n, None),
            SigSeg::Repeat { count, inner, size, nelems } => (*size, *nelems, *count, Some(inner)),
        };
        let (unit, gain) = if by_elements { (elems, bytes) } else { (bytes, elems) };
        let whole = (*rem / unit).min(count);
        *other += whole * gain;
        *rem -= whole * unit;
        if whole < count {
            if let Some(inner) = inner {
                sig_prefix(inner, by_elements, rem, other);
            }
            return;
        }
    }
}

/// Packed bytes of `count` elements of `size` bytes each, if they can be addressed.
pub fn packed_bytes(size: u64, count: u64) -> Option<u64> {
    size.checked_mul(count).filter(|&b| b <= isize::MAX as u64)
}

fn push_block(v: &mut Vec<impl BlockList>, off: i64, len: u64) {
    if len == 0 {
        return;
    }
    if let Some(last) = v.last_mut().and_then(|l| l.as_block()) {
        if last.off.checked_add(last.len as i64) == Some(off) {
            last.len += len;
            return;
        }
    }
    v.push(BlockList::block(off, len));
}

/// What `push_block` appends to: a plain list of blocks, or a map's segments.
trait BlockList {
    fn as_block(&mut self) -> Option<&mut Block>;
    fn block(off: i64, len: u64) -> Self;
}

impl BlockList for Block {
    fn as_block(&mut self) -> Option<&mut Block> {
        Some(self)
    }
    fn block(off: i64, len: u64) -> Self {
        Block { off, len }
    }
}

impl BlockList for Seg {
    fn as_block(&mut self) -> Option<&mut Block> {
        match self {
            Seg::Block(b) => Some(b),
            Seg::Repeat { .. } => None,
        }
    }
    fn block(off: i64, len: u64) -> Self {
        Seg::Block(Block { off, len })
    }
}

fn push_sig(v: &mut Vec<SigSeg>, r: Run) {
    if r.n == 0 || r.size == 0 {
        return;
    }
    match v.last_mut() {
        Some(SigSeg::Run(last)) if last.basic == r.basic => last.n += r.n,
        _ => v.push(SigSeg::Run(r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type whose elements are one run packs and unpacks in one copy: the same bytes as
    /// element by element, also into a short buffer, and with a gap type for contrast.
    #[test]
    fn one_run_types_pack_like_element_by_element() {
        let src: Vec<u8> = (0..64u8).collect();
        let run = Layout::predefined(1, &[(0, 4)], 4, 4);
        let mut out = [0u8; 20];
        unsafe { run.pack(src.as_ptr(), 8, &mut out) };
        assert_eq!(&out[..], &src[..20], "a short buffer takes the first bytes");
        let mut back = vec![0u8; 64];
        unsafe { run.unpack(&src[..32], back.as_mut_ptr(), 8) };
        assert_eq!(&back[..32], &src[..32]);
        assert!(back[32..].iter().all(|&b| b == 0));
        // One block of 2 in an extent of 4: element by element.
        let gaps = Layout::predefined(1, &[(0, 2)], 4, 2);
        let mut out = [0u8; 6];
        unsafe { gaps.pack(src.as_ptr(), 3, &mut out) };
        assert_eq!(out, [0, 1, 4, 5, 8, 9]);
    }

    fn double() -> Layout {
        Layout::predefined(1, &[(0, 8)], 8, 8)
    }
    fn int() -> Layout {
        Layout::predefined(2, &[(0, 4)], 4, 4)
    }
    fn char_() -> Layout {
        Layout::predefined(3, &[(0, 1)], 1, 1)
    }

    /// MPI_Type_vector(count, bl, stride) of `c` as parts.
    fn vector(count: u64, bl: u64, stride: i64, c: &Layout) -> Layout {
        let parts: Vec<Part> = (0..count).map(|i| Part::new(i as i64 * stride * c.extent(), bl, c)).collect();
        Layout::compose(&parts, false).unwrap()
    }

    #[test]
    fn contiguous_runs_merge_into_one_block() {
        let d = double();
        let t = Layout::compose(&[Part::new(0, 1000, &d)], false).unwrap();
        assert_eq!(t.flat_blocks(), vec![Block { off: 0, len: 8000 }]);
        assert!(t.dense());
        assert_eq!((t.size, t.extent(), t.nelems, t.basic), (8000, 8000, 1000, Some(1)));
        assert_eq!(&*t.sig, &[SigSeg::Run(Run { basic: 1, size: 8, n: 1000 })]);
    }

    #[test]
    fn vector_bounds_and_pack_round_trip() {
        let d = double();
        let v = vector(3, 2, 4, &d);
        assert_eq!(v.flat_blocks().len(), 3);
        assert_eq!((v.size, v.lb, v.extent(), v.true_extent()), (48, 0, 80, 80));
        assert!(!v.dense());
        let src: Vec<f64> = (0..24).map(|x| x as f64).collect();
        let mut packed = vec![0u8; 96];
        unsafe { v.pack(src.as_ptr() as *const u8, 2, &mut packed) };
        let got: Vec<f64> = packed.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect();
        // Second element starts one extent (10 doubles) later.
        assert_eq!(got, vec![0., 1., 4., 5., 8., 9., 10., 11., 14., 15., 18., 19.]);
        let mut back = vec![-1f64; 24];
        unsafe { v.unpack(&packed, back.as_mut_ptr() as *mut u8, 2) };
        for i in 0..24 {
            let inside = [0, 1, 4, 5, 8, 9, 10, 11, 14, 15, 18, 19].contains(&i);
            assert_eq!(back[i], if inside { i as f64 } else { -1. }, "index {i}");
        }
    }

    #[test]
    fn negative_stride_moves_lb() {
        let d = double();
        let v = vector(3, 1, -2, &d);
        assert_eq!((v.lb, v.ub, v.extent()), (-32, 8, 40));
        assert_eq!((v.true_lb, v.true_extent()), (-32, 40));
        assert_eq!(v.flat_blocks(), vec![Block { off: 0, len: 8 }, Block { off: -16, len: 8 }, Block { off: -32, len: 8 }]);
        let src: Vec<f64> = (0..5).map(|x| x as f64).collect();
        let mut packed = vec![0u8; 24];
        unsafe { v.pack((src.as_ptr() as *const u8).wrapping_add(32), 1, &mut packed) };
        assert_eq!(f64::from_le_bytes(packed[16..24].try_into().unwrap()), 0.);
        assert_eq!(f64::from_le_bytes(packed[0..8].try_into().unwrap()), 4.);
    }

    #[test]
    fn struct_padding_follows_the_largest_alignment() {
        let (d, i, c) = (double(), int(), char_());
        // struct { char c; double d; }: extent 16; struct { int i; char c; }: extent 8.
        let s = Layout::compose(&[Part::new(0, 1, &c), Part::new(8, 1, &d)], true).unwrap();
        assert_eq!((s.size, s.extent(), s.true_extent(), s.basic), (9, 16, 16, None));
        let s = Layout::compose(&[Part::new(0, 1, &i), Part::new(4, 1, &c)], true).unwrap();
        assert_eq!((s.extent(), s.true_extent()), (8, 5));
        assert_eq!(s.flat_blocks(), vec![Block { off: 0, len: 5 }]);
        // A resized member's markers stop the padding.
        let r = c.resized(0, 3).unwrap();
        let s = Layout::compose(&[Part::new(0, 1, &i), Part::new(4, 1, &r)], true).unwrap();
        assert_eq!((s.lb, s.ub), (4, 7), "explicit markers give lb and ub");
    }

    #[test]
    fn elements_count_basic_elements_and_partial_ones() {
        let (d, i) = (double(), int());
        let s = Layout::compose(&[Part::new(0, 2, &i), Part::new(8, 1, &d)], true).unwrap();
        assert_eq!((s.size, s.nelems), (16, 3));
        assert_eq!(s.elements_in(32), Some(6));
        assert_eq!(s.elements_in(16 + 4), Some(4));
        assert_eq!(s.elements_in(16 + 8), Some(5));
        assert_eq!(s.elements_in(16 + 10), None);
        assert_eq!(s.bytes_of_elements(5), Some(24));
    }

    #[test]
    fn overflow_and_size_limits() {
        let d = double();
        let big = Layout::compose(&[Part::new(0, u64::MAX / 4, &d)], false);
        assert_eq!(big.err(), Some(MapErr::Overflow));
        let v = vector(2, 1, 2, &d);
        // Many copies of a small type are one repeat however many they are...
        let many = Layout::compose(&[Part::new(0, 1 << 40, &v)], false).unwrap();
        assert_eq!(many.blocks.len(), 1);
        assert_eq!((many.size, many.extent()), ((1u64 << 40) * 16, (1i64 << 40) * 24));
    }

    /// A caller's list longer than the flat budget is stored as one segment a part past it
    /// (memory in proportion to the list, not a multiple of it), and packs, unpacks and counts
    /// as the same list written out.
    #[test]
    fn long_lists_cost_one_segment_a_part() {
        let (d, i) = (double(), int());
        let v = vector(3, 1, 2, &d);
        let s = Layout::compose(&[Part::new(0, 1, &i), Part::new(8, 1, &d)], true).unwrap();
        let n = FLAT_BUDGET as i64 * 3;
        let parts: Vec<Part> = (0..n).map(|k| Part::new(k * 200 + (k % 7) * 8, 1 + (k % 2) as u64, if k % 3 == 0 { &s } else { &v })).collect();
        let long = Layout::compose(&parts, false).unwrap();
        assert!(long.blocks.len() <= FLAT_BUDGET + parts.len(), "{} segments", long.blocks.len());
        // What the parts are, written out by hand: the oracle.
        let mut want: Vec<Block> = Vec::new();
        for p in &parts {
            for r in 0..p.reps as i64 {
                for b in p.child.flat_blocks() {
                    push_block(&mut want, p.disp + r * p.stride + b.off, b.len);
                }
            }
        }
        assert!(long.blocks.len() < want.len() / 2, "past the budget parts are not written out");
        assert!(long.flat_blocks() == want, "the blocks in order");
        assert_eq!(long.size, want.iter().map(|b| b.len).sum::<u64>());
        assert_eq!(long.nelems, parts.iter().map(|p| p.reps * p.child.nelems).sum::<u64>());
        let span = long.ub as usize;
        let src: Vec<u8> = (0..span).map(|x| (x * 7 % 251) as u8).collect();
        let mut packed = vec![0u8; long.size as usize];
        unsafe { long.pack(src.as_ptr(), 1, &mut packed) };
        let by_hand: Vec<u8> = want.iter().flat_map(|b| src[b.off as usize..b.off as usize + b.len as usize].iter().copied()).collect();
        assert!(packed == by_hand, "packed bytes");
        let mut back = vec![0u8; span];
        unsafe { long.unpack(&packed, back.as_mut_ptr(), 1) };
        assert!(want.iter().all(|b| back[b.off as usize..][..b.len as usize] == src[b.off as usize..][..b.len as usize]), "unpacked bytes");
        // Elements counted into the middle of the list: struct parts hold 2, vector parts 3.
        let per_part = |k: u64| (1 + k % 2) * if k % 3 == 0 { 2 } else { 3 };
        let first: u64 = (0..n as u64 / 2).map(per_part).sum();
        let bytes: u64 = (0..n as u64 / 2).map(|k| (1 + k % 2) * if k % 3 == 0 { 12 } else { 24 }).sum();
        assert_eq!(long.elements_in(bytes), Some(first));
        assert_eq!(long.bytes_of_elements(first), Some(bytes));
    }

    /// A repeat packs, unpacks and counts elements exactly as the same type written out.
    #[test]
    fn repeats_behave_like_the_blocks_they_stand_for() {
        let (d, i) = (double(), int());
        // struct { int; double } at 0 and 8 (3 signature runs would flatten; many copies don't).
        let s = Layout::compose(&[Part::new(0, 1, &i), Part::new(8, 1, &d)], true).unwrap();
        let reps = FLAT_LIMIT + 3;
        // Copies 40 bytes apart (a vector of the struct) and, for contrast, the same written out.
        let rep = Layout::compose(&[Part::strided(0, reps, 40, &s)], false).unwrap();
        let flat_parts: Vec<Part> = (0..reps as i64).map(|k| Part::new(k * 40, 1, &s)).collect();
        let flat = Layout::compose(&flat_parts, false).unwrap();
        assert!(matches!(&*rep.blocks, [Seg::Repeat { .. }]), "{:?}", &rep.blocks[..1]);
        assert!(matches!(&*rep.sig, [SigSeg::Repeat { .. }]));
        assert_eq!(flat.blocks.len() as u64, 2 * reps);
        assert_eq!(rep.flat_blocks(), flat.flat_blocks());
        assert_eq!((rep.size, rep.lb, rep.ub, rep.true_lb, rep.true_ub, rep.nelems), (flat.size, flat.lb, flat.ub, flat.true_lb, flat.true_ub, flat.nelems));
        let mut ra = Vec::new();
        let mut fa = Vec::new();
        rep.for_each_run(|r| ra.push(r));
        flat.for_each_run(|r| fa.push(r));
        assert_eq!(ra, fa);
        for bytes in [0, 4, 8, 12, 16, 24, 100 * 12, 100 * 12 + 4, 100 * 12 + 6, rep.size, rep.size + 4] {
            assert_eq!(rep.elements_in(bytes), flat.elements_in(bytes), "{bytes} bytes");
        }
        for n in [0, 1, 2, 3, 201, 202, 2 * reps - 1, 2 * reps + 1] {
            assert_eq!(rep.bytes_of_elements(n), flat.bytes_of_elements(n), "{n} elements");
        }
        // Two elements of each, packed from the same memory, and a short buffer.
        let span = (2 * rep.extent()) as usize;
        let src: Vec<u8> = (0..span).map(|x| (x * 7 % 251) as u8).collect();
        for room in [2 * rep.size as usize, 1001] {
            let (mut a, mut b) = (vec![0u8; room], vec![0u8; room]);
            unsafe { rep.pack(src.as_ptr(), 2, &mut a) };
            unsafe { flat.pack(src.as_ptr(), 2, &mut b) };
            assert_eq!(a, b, "room {room}");
            let (mut ua, mut ub) = (vec![0u8; span], vec![0u8; span]);
            unsafe { rep.unpack(&a, ua.as_mut_ptr(), 2) };
            unsafe { flat.unpack(&b, ub.as_mut_ptr(), 2) };
            assert_eq!(ua, ub, "room {room}");
        }
        // A repeat of a repeat (a vector of vectors) written out in order.
        let outer = Layout::compose(&[Part::strided(8, 300, -2 * rep.extent(), &rep)], false).unwrap();
        let fb = outer.flat_blocks();
        assert_eq!(fb.len() as u64, 300 * 2 * reps);
        assert_eq!(fb[2 * reps as usize], Block { off: 8 - 2 * rep.extent(), len: 4 });
        assert_eq!(outer.true_lb, 8 - 299 * 2 * rep.extent());
        // Few copies of a repeat are written out as shifted repeats.
        let two = Layout::compose(&[Part::new(0, 2, &rep)], false).unwrap();
        assert_eq!(two.blocks.len(), 2);
        let mut want = rep.flat_blocks();
        for b in rep.flat_blocks() {
            push_block(&mut want, b.off + rep.extent(), b.len);
        }
        assert!(two.flat_blocks() == want, "two copies of a repeat");
    }

    #[test]
    fn short_data_unpacks_a_prefix() {
        let d = double();
        let v = vector(2, 1, 2, &d);
        let mut out = vec![0f64; 4];
        let src = 7f64.to_le_bytes();
        unsafe { v.unpack(&src, out.as_mut_ptr() as *mut u8, 1) };
        assert_eq!(out, vec![7., 0., 0., 0.]);
    }
}
