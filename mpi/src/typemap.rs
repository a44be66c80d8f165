//! Type maps: where the bytes of one element of a datatype lie in memory, flattened to a list
//! of (offset, length) blocks in type-map order (adjacent runs merged), with the bounds the
//! standard defines (lb, ub, true bounds, sticky markers from MPI_Type_create_resized), the
//! type signature as runs of basic elements (for MPI_Get_elements), and pack/unpack between
//! user memory and the contiguous bytes the engine moves.

/// Most blocks (and signature runs) one type map may hold: a bound on the memory a caller's
/// constructor arguments can make us allocate.
pub const MAX_BLOCKS: usize = 1 << 22;

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub blocks: Vec<Block>,
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
    pub sig: Vec<Run>,
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
    /// More than MAX_BLOCKS blocks.
    TooBig,
}

fn ck(v: Option<i64>) -> Result<i64, MapErr> {
    v.ok_or(MapErr::Overflow)
}

/// One part of a new type: `reps` elements of `child`, the first at byte `disp`, each next one
/// a child extent further.
pub struct Part<'a> {
    pub disp: i64,
    pub reps: u64,
    pub child: &'a Layout,
}

impl Layout {
    /// A predefined type: its data `blocks` within [0, extent).
    pub fn predefined(handle: usize, blocks: &[(i64, u64)], extent: i64, align: u64) -> Layout {
        let size = blocks.iter().map(|b| b.1).sum();
        let true_lb = blocks.first().map_or(0, |b| b.0);
        let true_ub = blocks.last().map_or(0, |b| b.0 + b.1 as i64);
        Layout {
            blocks: blocks.iter().map(|&(off, len)| Block { off, len }).collect(),
            size,
            lb: 0,
            ub: extent,
            true_lb,
            true_ub,
            explicit_lb: false,
            explicit_ub: false,
            align: align.max(1),
            sig: if size > 0 { vec![Run { basic: handle, size, n: 1 }] } else { Vec::new() },
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

    /// Where the data of `count` elements lies when it is one run of memory (no data; one
    /// element of one block; or one block per element, elements back to back): the run's
    /// offset from the first element's address. Packing such data is one copy, not one per
    /// element.
    pub fn one_run(&self, count: u64) -> Option<i64> {
        if self.size == 0 {
            return Some(0);
        }
        match self.blocks.as_slice() {
            [b] if count <= 1 || self.extent() == b.len as i64 => Some(b.off),
            _ => None,
        }
    }

    /// The bytes of `count` elements' run (`one_run`) that fit in `room`.
    fn run_bytes(&self, count: u64, room: usize) -> usize {
        self.size.checked_mul(count).map_or(room, |t| t.min(room as u64) as usize)
    }

    /// Data in one block at offset 0 and elements back to back: user memory is the wire format.
    pub fn dense(&self) -> bool {
        self.lb == 0 && self.extent() as u64 == self.size && (self.size == 0 || self.blocks == [Block { off: 0, len: self.size }])
    }

    /// The type made of `parts` in order (every constructor is this); `pad` rounds the extent
    /// up to the largest alignment when no resized marker fixes the upper bound (what
    /// MPI_Type_create_struct does, as C compilers pad structs).
    pub fn compose(parts: &[Part], pad: bool) -> Result<Layout, MapErr> {
        // Bound the work before doing it.
        let (mut nblocks, mut nsig): (u64, u64) = (0, 0);
        for p in parts {
            let c = p.child;
            let n = if c.blocks.len() == 1 && c.blocks[0].len as i64 == c.extent() { 1 } else { (c.blocks.len() as u64).checked_mul(p.reps).ok_or(MapErr::TooBig)? };
            nblocks = nblocks.checked_add(n).ok_or(MapErr::TooBig)?;
            let sig_n = if c.sig.len() <= 1 { 1 } else { (c.sig.len() as u64).checked_mul(p.reps).ok_or(MapErr::TooBig)? };
            nsig = nsig.checked_add(sig_n).ok_or(MapErr::TooBig)?;
            if nblocks > MAX_BLOCKS as u64 || nsig > MAX_BLOCKS as u64 {
                return Err(MapErr::TooBig);
            }
        }
        let mut out = Layout {
            blocks: Vec::new(),
            size: 0,
            lb: 0,
            ub: 0,
            true_lb: 0,
            true_ub: 0,
            explicit_lb: false,
            explicit_ub: false,
            align: 1,
            sig: Vec::new(),
            nelems: 0,
            basic: None,
        };
        // Bounds over the parts: all, resized markers only, data only.
        let (mut lb, mut ub): (Option<i64>, Option<i64>) = (None, None);
        let (mut xlb, mut xub): (Option<i64>, Option<i64>) = (None, None);
        let (mut tlb, mut tub): (Option<i64>, Option<i64>) = (None, None);
        let mut basic: Option<Option<usize>> = None;
        for p in parts {
            let c = p.child;
            out.align = out.align.max(c.align);
            basic = Some(match basic {
                None => c.basic,
                Some(b) if b == c.basic => b,
                Some(_) => None,
            });
            if p.reps == 0 {
                continue;
            }
            let ext = c.extent();
            let last = ck(ext.checked_mul(i64::try_from(p.reps - 1).map_err(|_| MapErr::Overflow)?))?;
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
            out.size = c.size.checked_mul(p.reps).and_then(|s| s.checked_add(out.size)).ok_or(MapErr::Overflow)?;
            out.nelems = c.nelems.checked_mul(p.reps).and_then(|s| s.checked_add(out.nelems)).ok_or(MapErr::Overflow)?;
            if out.size > i64::MAX as u64 {
                return Err(MapErr::Overflow);
            }
            // Blocks: a child that is one block filling its extent repeats as one longer block.
            if c.blocks.len() == 1 && c.blocks[0].len as i64 == ext && ext > 0 {
                let len = c.blocks[0].len.checked_mul(p.reps).ok_or(MapErr::Overflow)?;
                push_block(&mut out.blocks, ck(p.disp.checked_add(c.blocks[0].off))?, len);
            } else {
                for r in 0..p.reps {
                    let base = ck((r as i64).checked_mul(ext).and_then(|x| x.checked_add(p.disp)))?;
                    for b in &c.blocks {
                        push_block(&mut out.blocks, ck(base.checked_add(b.off))?, b.len);
                    }
                }
            }
            if c.sig.len() == 1 {
                let r = c.sig[0];
                push_sig(&mut out.sig, Run { n: r.n.checked_mul(p.reps).ok_or(MapErr::Overflow)?, ..r });
            } else {
                for _ in 0..p.reps {
                    for &r in &c.sig {
                        push_sig(&mut out.sig, r);
                    }
                }
            }
        }
        out.basic = basic.flatten();
        out.explicit_lb = xlb.is_some();
        out.explicit_ub = xub.is_some();
        out.lb = xlb.or(lb).unwrap_or(0);
        out.ub = xub.or(ub).unwrap_or(0);
        out.true_lb = tlb.unwrap_or(0);
        out.true_ub = tub.unwrap_or(0);
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
        for &Run { size: s, n: k, .. } in &self.sig {
            if rem == 0 {
                break;
            }
            let run = s * k;
            if rem >= run {
                rem -= run;
                n += k;
            } else {
                if rem % s != 0 {
                    return None;
                }
                n += rem / s;
                rem = 0;
            }
        }
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
        for &Run { size: s, n: k, .. } in &self.sig {
            if rem == 0 {
                break;
            }
            let t = rem.min(k);
            b += t * s;
            rem -= t;
        }
        Some(b)
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
        let mut o = 0usize;
        for i in 0..count {
            let base = src.wrapping_offset((i as i64).wrapping_mul(self.extent()) as isize);
            for b in &self.blocks {
                if o >= dst.len() {
                    return;
                }
                let n = (b.len as usize).min(dst.len() - o);
                // SAFETY: the caller's memory holds this block (the function's contract).
                unsafe { std::ptr::copy_nonoverlapping(base.wrapping_offset(b.off as isize), dst.as_mut_ptr().add(o), n) };
                o += n;
            }
        }
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
        let mut o = 0usize;
        for i in 0..count {
            let base = dst.wrapping_offset((i as i64).wrapping_mul(self.extent()) as isize);
            for b in &self.blocks {
                if o >= src.len() {
                    return;
                }
                let n = (b.len as usize).min(src.len() - o);
                // SAFETY: as in `pack`.
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(o), base.wrapping_offset(b.off as isize), n) };
                o += n;
            }
        }
    }
}

/// Packed bytes of `count` elements of `size` bytes each, if they can be addressed.
pub fn packed_bytes(size: u64, count: u64) -> Option<u64> {
    size.checked_mul(count).filter(|&b| b <= isize::MAX as u64)
}

fn push_block(v: &mut Vec<Block>, off: i64, len: u64) {
    if len == 0 {
        return;
    }
    if let Some(last) = v.last_mut() {
        if last.off.checked_add(last.len as i64) == Some(off) {
            last.len += len;
            return;
        }
    }
    v.push(Block { off, len });
}

fn push_sig(v: &mut Vec<Run>, r: Run) {
    if r.n == 0 || r.size == 0 {
        return;
    }
    match v.last_mut() {
        Some(last) if last.basic == r.basic => last.n += r.n,
        _ => v.push(r),
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
        let parts: Vec<Part> = (0..count).map(|i| Part { disp: i as i64 * stride * c.extent(), reps: bl, child: c }).collect();
        Layout::compose(&parts, false).unwrap()
    }

    #[test]
    fn contiguous_runs_merge_into_one_block() {
        let d = double();
        let t = Layout::compose(&[Part { disp: 0, reps: 1000, child: &d }], false).unwrap();
        assert_eq!(t.blocks, vec![Block { off: 0, len: 8000 }]);
        assert!(t.dense());
        assert_eq!((t.size, t.extent(), t.nelems, t.basic), (8000, 8000, 1000, Some(1)));
        assert_eq!(t.sig, vec![Run { basic: 1, size: 8, n: 1000 }]);
    }

    #[test]
    fn vector_bounds_and_pack_round_trip() {
        let d = double();
        let v = vector(3, 2, 4, &d);
        assert_eq!(v.blocks.len(), 3);
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
        assert_eq!(v.blocks, vec![Block { off: 0, len: 8 }, Block { off: -16, len: 8 }, Block { off: -32, len: 8 }]);
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
        let s = Layout::compose(&[Part { disp: 0, reps: 1, child: &c }, Part { disp: 8, reps: 1, child: &d }], true).unwrap();
        assert_eq!((s.size, s.extent(), s.true_extent(), s.basic), (9, 16, 16, None));
        let s = Layout::compose(&[Part { disp: 0, reps: 1, child: &i }, Part { disp: 4, reps: 1, child: &c }], true).unwrap();
        assert_eq!((s.extent(), s.true_extent()), (8, 5));
        assert_eq!(s.blocks, vec![Block { off: 0, len: 5 }]);
        // A resized member's markers stop the padding.
        let r = c.resized(0, 3).unwrap();
        let s = Layout::compose(&[Part { disp: 0, reps: 1, child: &i }, Part { disp: 4, reps: 1, child: &r }], true).unwrap();
        assert_eq!((s.lb, s.ub), (4, 7), "explicit markers give lb and ub");
    }

    #[test]
    fn elements_count_basic_elements_and_partial_ones() {
        let (d, i) = (double(), int());
        let s = Layout::compose(&[Part { disp: 0, reps: 2, child: &i }, Part { disp: 8, reps: 1, child: &d }], true).unwrap();
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
        let big = Layout::compose(&[Part { disp: 0, reps: u64::MAX / 4, child: &d }], false);
        assert_eq!(big.err(), Some(MapErr::Overflow));
        let v = vector(2, 1, 2, &d);
        let parts = [Part { disp: 0, reps: (MAX_BLOCKS as u64) * 2, child: &v }];
        assert_eq!(Layout::compose(&parts, false).err(), Some(MapErr::TooBig));
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
