//! Reduction kernels over byte slices: `acc op= src` for every dtype x op pair.
//!
//! Buffers arrive as bytes (native endianness) and may be unaligned. When both (all) slices are
//! aligned for the element type they are reinterpreted as typed slices and reduced with a plain
//! zip loop the compiler vectorises; otherwise the bytes are staged through small aligned stack
//! blocks. float16/bfloat16 are always staged through f32 blocks (converted with `half`'s slice
//! routines, which use F16C where the CPU has it).
//!
//! Semantics:
//! - integers: Sum/Prod/Avg wrap on overflow (no panic in debug builds); Max/Min as usual;
//!   Band/Bor/Bxor bitwise. Avg combines like Sum; `divide` finishes it, truncating toward zero.
//! - floats: Sum/Prod/Avg in the element's own type. Max/Min ignore a NaN operand (like C's
//!   `fmax`/`fmin`) and order `-0.0 < +0.0`, so they are commutative and deterministic.
//!   Bitwise ops are invalid for floats (callers check first); here they leave `acc` unchanged.

use std::ops::{BitAnd, BitOr, BitXor};

use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use half::{bf16, f16};

use crate::dtype::{DType, ReduceOp};

/// Elements per stack block in the staged (unaligned, f16/bf16) paths.
const BLK: usize = 256;

/// A primitive numeric element: every bit pattern is a valid value, no padding.
/// Sealed by construction: only implemented below for the primitive types.
trait Num: Copy + Default + 'static {
    const SZ: usize;
    fn rd(b: &[u8]) -> Self;
    fn wr(self, b: &mut [u8]);
}

trait Int: Num + Ord + BitAnd<Output = Self> + BitOr<Output = Self> + BitXor<Output = Self> {
    fn wadd(self, o: Self) -> Self;
    fn wmul(self, o: Self) -> Self;
    /// `self / n`, truncating toward zero; `n >= 1`.
    fn div_n(self, n: usize) -> Self;
}

trait Flt: Num + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> + PartialOrd {
    fn fmax(self, o: Self) -> Self;
    fn fmin(self, o: Self) -> Self;
    fn div_n(self, n: usize) -> Self;
}

macro_rules! impl_num {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const SZ: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn rd(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b.try_into().unwrap())
            }
            #[inline(always)]
            fn wr(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_ne_bytes())
            }
        }
    )*};
}
impl_num!(i8, u8, i32, u32, i64, u64, u16, f32, f64);

macro_rules! impl_int {
    ($($t:ty => $wide:ty),*) => {$(
        impl Int for $t {
            #[inline(always)]
            fn wadd(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)]
            fn wmul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                // In a wider type so that n need not fit in Self; `/` truncates toward zero.
                // n <= usize::MAX may not fit i64; then |self| < n and the quotient is 0.
                match <$wide>::try_from(n) {
                    Ok(d) => (<$wide>::from(self) / d) as $t,
                    Err(_) => 0,
                }
            }
        }
    )*};
}
impl_int!(i8 => i64, u8 => u64, i32 => i64, u32 => u64, i64 => i64, u64 => u64);

macro_rules! impl_flt {
    ($($t:ty),*) => {$(
        impl Flt for $t {
            #[inline(always)]
            fn fmax(self, o: Self) -> Self {
                // Branch-free selects: NaN operands are ignored (both NaN: self), and equal
                // values (only +-0 differ in bits) combine by AND of the bits: +0 wins.
                let r = if self > o { self } else { o };
                let r = if o.is_nan() { self } else { r };
                if self == o { <$t>::from_bits(self.to_bits() & o.to_bits()) } else { r }
            }
            #[inline(always)]
            fn fmin(self, o: Self) -> Self {
                let r = if self < o { self } else { o };
                let r = if o.is_nan() { self } else { r };
                if self == o { <$t>::from_bits(self.to_bits() | o.to_bits()) } else { r }
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self { self / (n as $t) }
        }
    )*};
}
impl_flt!(f32, f64);

/// Expands `$body` once per op with `$f` bound to that op's element closure, so each loop is
/// monomorphised (and vectorised) per op instead of calling through a function pointer.
macro_rules! with_int_op {
    ($op:expr, $T:ty, $f:ident => $body:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let $f = |a: $T, b: $T| a.wadd(b);
                $body
            }
            ReduceOp::Prod => {
                let $f = |a: $T, b: $T| a.wmul(b);
                $body
            }
            ReduceOp::Max => {
                let $f = |a: $T, b: $T| if b > a { b } else { a };
                $body
            }
            ReduceOp::Min => {
                let $f = |a: $T, b: $T| if b < a { b } else { a };
                $body
            }
            ReduceOp::Band => {
                let $f = |a: $T, b: $T| a & b;
                $body
            }
            ReduceOp::Bor => {
                let $f = |a: $T, b: $T| a | b;
                $body
            }
            ReduceOp::Bxor => {
                let $f = |a: $T, b: $T| a ^ b;
                $body
            }
        }
    };
}

macro_rules! with_flt_op {
    ($op:expr, $T:ty, $f:ident => $body:expr, $invalid:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => {
                let $f = |a: $T, b: $T| a + b;
                $body
            }
            ReduceOp::Prod => {
                let $f = |a: $T, b: $T| a * b;
                $body
            }
            ReduceOp::Max => {
                let $f = |a: $T, b: $T| a.fmax(b);
                $body
            }
            ReduceOp::Min => {
                let $f = |a: $T, b: $T| a.fmin(b);
                $body
            }
            ReduceOp::Band | ReduceOp::Bor | ReduceOp::Bxor => {
                debug_assert!(false, "bitwise op {:?} on a floating type", $op);
                $invalid
            }
        }
    };
}

#[inline(always)]
fn map2<T: Copy>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (a, s) in acc.iter_mut().zip(src) {
        *a = f(*a, *s);
    }
}

#[inline(always)]
fn map3<T: Copy>(out: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = f(*x, *y);
    }
}

#[inline(always)]
fn int2<T: Int>(op: ReduceOp, acc: &mut [T], src: &[T]) {
    with_int_op!(op, T, f => map2(acc, src, f))
}
#[inline(always)]
fn int3<T: Int>(op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
    with_int_op!(op, T, f => map3(out, a, b, f))
}
#[inline(always)]
fn flt2<T: Flt>(op: ReduceOp, acc: &mut [T], src: &[T]) {
    with_flt_op!(op, T, f => map2(acc, src, f), ())
}
#[inline(always)]
fn flt3<T: Flt>(op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
    with_flt_op!(op, T, f => map3(out, a, b, f), out.copy_from_slice(a))
}

fn load<T: Num>(src: &[u8], dst: &mut [T]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(T::SZ)) {
        *d = T::rd(s);
    }
}
fn store<T: Num>(src: &[T], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(T::SZ)) {
        s.wr(d);
    }
}

/// Reinterprets bytes as `T` when aligned and a whole number of elements.
#[inline(always)]
fn typed<T: Num>(b: &[u8]) -> Option<&[T]> {
    // SAFETY: T is a primitive integer or float (see `Num`): every bit pattern is valid and it
    // has no padding, so viewing initialised bytes as T is sound.
    let (pre, mid, suf) = unsafe { b.align_to::<T>() };
    (pre.is_empty() && suf.is_empty()).then_some(mid)
}
#[inline(always)]
fn typed_mut<T: Num>(b: &mut [u8]) -> Option<&mut [T]> {
    // SAFETY: as in `typed`; writes of any T value leave valid bytes behind.
    let (pre, mid, suf) = unsafe { b.align_to_mut::<T>() };
    (pre.is_empty() && suf.is_empty()).then_some(mid)
}

/// acc op= src over bytes, through `k` on typed slices (directly when aligned, else staged).
#[inline(always)]
fn bytes2<T: Num>(acc: &mut [u8], src: &[u8], k: impl Fn(&mut [T], &[T])) {
    if typed::<T>(acc).is_some() {
        if let Some(s) = typed::<T>(src) {
            k(typed_mut::<T>(acc).unwrap(), s);
            return;
        }
    }
    let mut ba = [T::default(); BLK];
    let mut bb = [T::default(); BLK];
    for (ac, sc) in acc.chunks_mut(BLK * T::SZ).zip(src.chunks(BLK * T::SZ)) {
        let m = ac.len() / T::SZ;
        load(ac, &mut ba[..m]);
        load(sc, &mut bb[..m]);
        k(&mut ba[..m], &bb[..m]);
        store(&ba[..m], ac);
    }
}

/// out = a op b over bytes.
#[inline(always)]
fn bytes3<T: Num>(out: &mut [u8], a: &[u8], b: &[u8], k: impl Fn(&mut [T], &[T], &[T])) {
    if typed::<T>(out).is_some() {
        if let (Some(x), Some(y)) = (typed::<T>(a), typed::<T>(b)) {
            k(typed_mut::<T>(out).unwrap(), x, y);
            return;
        }
    }
    let mut bo = [T::default(); BLK];
    let mut ba = [T::default(); BLK];
    let mut bb = [T::default(); BLK];
    let step = BLK * T::SZ;
    for ((oc, ac), bc) in out.chunks_mut(step).zip(a.chunks(step)).zip(b.chunks(step)) {
        let m = oc.len() / T::SZ;
        load(ac, &mut ba[..m]);
        load(bc, &mut bb[..m]);
        k(&mut bo[..m], &ba[..m], &bb[..m]);
        store(&bo[..m], oc);
    }
}

/// Half-precision formats, handled through f32.
trait Half: Copy + Default + 'static {
    fn to_f32s(bits: &[u16], out: &mut [f32]);
    fn from_f32s(src: &[f32], bits: &mut [u16]);
}
impl Half for f16 {
    fn to_f32s(bits: &[u16], out: &mut [f32]) {
        bits.reinterpret_cast::<f16>().convert_to_f32_slice(out)
    }
    fn from_f32s(src: &[f32], bits: &mut [u16]) {
        bits.reinterpret_cast_mut::<f16>()
            .convert_from_f32_slice(src)
    }
}
impl Half for bf16 {
    fn to_f32s(bits: &[u16], out: &mut [f32]) {
        bits.reinterpret_cast::<bf16>().convert_to_f32_slice(out)
    }
    fn from_f32s(src: &[f32], bits: &mut [u16]) {
        bits.reinterpret_cast_mut::<bf16>()
            .convert_from_f32_slice(src)
    }
}

/// Half bytes -> f32 values (`out.len()` elements).
fn half_load<H: Half>(b: &[u8], out: &mut [f32]) {
    match typed::<u16>(b) {
        Some(bits) => H::to_f32s(bits, out),
        None => {
            let mut tmp = [0u16; BLK];
            for (bc, oc) in b.chunks(BLK * 2).zip(out.chunks_mut(BLK)) {
                let m = oc.len();
                load(bc, &mut tmp[..m]);
                H::to_f32s(&tmp[..m], oc);
            }
        }
    }
}
/// f32 values -> half bytes, rounding to nearest even once.
fn half_store<H: Half>(src: &[f32], b: &mut [u8]) {
    match typed_mut::<u16>(b) {
        Some(bits) => H::from_f32s(src, bits),
        None => {
            let mut tmp = [0u16; BLK];
            for (sc, bc) in src.chunks(BLK).zip(b.chunks_mut(BLK * 2)) {
                let m = sc.len();
                H::from_f32s(sc, &mut tmp[..m]);
                store(&tmp[..m], bc);
            }
        }
    }
}

fn half2<H: Half>(op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    let mut fa = [0f32; BLK];
    let mut fb = [0f32; BLK];
    for (ac, sc) in acc.chunks_mut(BLK * 2).zip(src.chunks(BLK * 2)) {
        let m = ac.len() / 2;
        half_load::<H>(ac, &mut fa[..m]);
        half_load::<H>(sc, &mut fb[..m]);
        flt2(op, &mut fa[..m], &fb[..m]);
        half_store::<H>(&fa[..m], ac);
    }
}

fn half3<H: Half>(op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) {
    let mut fa = [0f32; BLK];
    let mut fb = [0f32; BLK];
    for ((oc, ac), bc) in out
        .chunks_mut(BLK * 2)
        .zip(a.chunks(BLK * 2))
        .zip(b.chunks(BLK * 2))
    {
        let m = oc.len() / 2;
        half_load::<H>(ac, &mut fa[..m]);
        half_load::<H>(bc, &mut fb[..m]);
        flt2(op, &mut fa[..m], &fb[..m]);
        half_store::<H>(&fa[..m], oc);
    }
}

fn check_lens(dt: DType, a: usize, b: usize) {
    assert_eq!(a, b, "reduce: slice lengths differ");
    debug_assert_eq!(
        a % dt.size(),
        0,
        "reduce: length {a} not a multiple of {}",
        dt.size()
    );
}

/// `acc[i] = acc[i] op src[i]`, element type `dt`. Both slices have equal length, a multiple of
/// `dt.size()`. `Avg` combines like `Sum` (divide once at the end with [`divide`]). Buffers may
/// be unaligned. float16/bfloat16 are combined in f32 and rounded back once per call, so this is
/// exact-to-one-rounding only for a two-operand reduction; reductions of more operands must
/// [`widen`], reduce in f32 and [`narrow`] once.
pub fn combine(dt: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    check_lens(dt, acc.len(), src.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() && wide::combine(dt, op, acc, src) {
        return;
    }
    combine_any(dt, op, acc, src)
}

/// Whether the CPU has AVX2: the kernels are then compiled a second time for it (the crate is
/// built for baseline x86-64, whose SSE2 vectors are half as wide).
#[cfg(target_arch = "x86_64")]
fn avx2() -> bool {
    static HAS: once_cell::sync::Lazy<bool> = once_cell::sync::Lazy::new(|| std::arch::is_x86_feature_detected!("avx2"));
    *HAS
}

/// The hottest kernels (sum, and product of floats, on aligned buffers) compiled for AVX2 and
/// chosen at run time; the generic kernels cover everything else. (A `target_feature` wrapper
/// around the generic code does not reach its closures, which LLVM keeps out of line.)
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{typed, typed_mut, DType, ReduceOp};

    macro_rules! kernels {
        ($($name2:ident, $name3:ident, $t:ty, |$x:ident, $y:ident| $e:expr;)*) => {$(
            #[target_feature(enable = "avx2")]
            unsafe fn $name2(acc: &mut [$t], src: &[$t]) {
                for (a, &$y) in acc.iter_mut().zip(src) {
                    let $x = *a;
                    *a = $e;
                }
            }
            #[target_feature(enable = "avx2")]
            unsafe fn $name3(out: &mut [$t], a: &[$t], b: &[$t]) {
                for ((o, &$x), &$y) in out.iter_mut().zip(a).zip(b) {
                    *o = $e;
                }
            }
        )*};
    }

    kernels! {
        sum2_f32, sum3_f32, f32, |x, y| x + y;
        sum2_f64, sum3_f64, f64, |x, y| x + y;
        prod2_f32, prod3_f32, f32, |x, y| x * y;
        prod2_f64, prod3_f64, f64, |x, y| x * y;
        sum2_i32, sum3_i32, i32, |x, y| x.wrapping_add(y);
        sum2_u32, sum3_u32, u32, |x, y| x.wrapping_add(y);
        sum2_i64, sum3_i64, i64, |x, y| x.wrapping_add(y);
        sum2_u64, sum3_u64, u64, |x, y| x.wrapping_add(y);
        sum2_i8, sum3_i8, i8, |x, y| x.wrapping_add(y);
        sum2_u8, sum3_u8, u8, |x, y| x.wrapping_add(y);
    }

    macro_rules! dispatch2 {
        ($acc:expr, $src:expr, $f:ident, $t:ty) => {
            match (typed_mut::<$t>($acc), typed::<$t>($src)) {
                // SAFETY: the caller checked that the CPU has AVX2.
                (Some(a), Some(s)) => {
                    unsafe { $f(a, s) };
                    true
                }
                _ => false,
            }
        };
    }

    macro_rules! dispatch3 {
        ($out:expr, $a:expr, $b:expr, $f:ident, $t:ty) => {
            match (typed_mut::<$t>($out), typed::<$t>($a), typed::<$t>($b)) {
                // SAFETY: the caller checked that the CPU has AVX2.
                (Some(o), Some(x), Some(y)) => {
                    unsafe { $f(o, x, y) };
                    true
                }
                _ => false,
            }
        };
    }

    /// `acc op= src` if this (dtype, op) has an AVX2 kernel and the buffers are aligned.
    pub fn combine(dt: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) -> bool {
        use DType::*;
        use ReduceOp::*;
        match (dt, op) {
            (Float32, Sum | Avg) => dispatch2!(acc, src, sum2_f32, f32),
            (Float64, Sum | Avg) => dispatch2!(acc, src, sum2_f64, f64),
            (Float32, Prod) => dispatch2!(acc, src, prod2_f32, f32),
            (Float64, Prod) => dispatch2!(acc, src, prod2_f64, f64),
            (Int32, Sum | Avg) => dispatch2!(acc, src, sum2_i32, i32),
            (Uint32, Sum | Avg) => dispatch2!(acc, src, sum2_u32, u32),
            (Int64, Sum | Avg) => dispatch2!(acc, src, sum2_i64, i64),
            (Uint64, Sum | Avg) => dispatch2!(acc, src, sum2_u64, u64),
            (Int8, Sum | Avg) => dispatch2!(acc, src, sum2_i8, i8),
            (Uint8, Sum | Avg) => dispatch2!(acc, src, sum2_u8, u8),
            _ => false,
        }
    }

    /// `out = a op b` if this (dtype, op) has an AVX2 kernel and the buffers are aligned.
    pub fn combine_into(dt: DType, op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) -> bool {
        use DType::*;
        use ReduceOp::*;
        match (dt, op) {
            (Float32, Sum | Avg) => dispatch3!(out, a, b, sum3_f32, f32),
            (Float64, Sum | Avg) => dispatch3!(out, a, b, sum3_f64, f64),
            (Float32, Prod) => dispatch3!(out, a, b, prod3_f32, f32),
            (Float64, Prod) => dispatch3!(out, a, b, prod3_f64, f64),
            (Int32, Sum | Avg) => dispatch3!(out, a, b, sum3_i32, i32),
            (Uint32, Sum | Avg) => dispatch3!(out, a, b, sum3_u32, u32),
            (Int64, Sum | Avg) => dispatch3!(out, a, b, sum3_i64, i64),
            (Uint64, Sum | Avg) => dispatch3!(out, a, b, sum3_u64, u64),
            (Int8, Sum | Avg) => dispatch3!(out, a, b, sum3_i8, i8),
            (Uint8, Sum | Avg) => dispatch3!(out, a, b, sum3_u8, u8),
            _ => false,
        }
    }
}

#[inline(always)]
fn combine_any(dt: DType, op: ReduceOp, acc: &mut [u8], src: &[u8]) {
    match dt {
        DType::Int8 => bytes2::<i8>(acc, src, |a, s| int2(op, a, s)),
        DType::Uint8 => bytes2::<u8>(acc, src, |a, s| int2(op, a, s)),
        DType::Int32 => bytes2::<i32>(acc, src, |a, s| int2(op, a, s)),
        DType::Uint32 => bytes2::<u32>(acc, src, |a, s| int2(op, a, s)),
        DType::Int64 => bytes2::<i64>(acc, src, |a, s| int2(op, a, s)),
        DType::Uint64 => bytes2::<u64>(acc, src, |a, s| int2(op, a, s)),
        DType::Float32 => bytes2::<f32>(acc, src, |a, s| flt2(op, a, s)),
        DType::Float64 => bytes2::<f64>(acc, src, |a, s| flt2(op, a, s)),
        DType::Float16 => half2::<f16>(op, acc, src),
        DType::Bfloat16 => half2::<bf16>(op, acc, src),
    }
}

/// `out[i] = a[i] op b[i]` (same rules as [`combine`]), saving the copy of `a` into `out`.
pub fn combine_into(dt: DType, op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) {
    check_lens(dt, out.len(), a.len());
    check_lens(dt, out.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() && wide::combine_into(dt, op, out, a, b) {
        return;
    }
    combine_into_any(dt, op, out, a, b)
}

#[inline(always)]
fn combine_into_any(dt: DType, op: ReduceOp, out: &mut [u8], a: &[u8], b: &[u8]) {
    match dt {
        DType::Int8 => bytes3::<i8>(out, a, b, |o, x, y| int3(op, o, x, y)),
        DType::Uint8 => bytes3::<u8>(out, a, b, |o, x, y| int3(op, o, x, y)),
        DType::Int32 => bytes3::<i32>(out, a, b, |o, x, y| int3(op, o, x, y)),
        DType::Uint32 => bytes3::<u32>(out, a, b, |o, x, y| int3(op, o, x, y)),
        DType::Int64 => bytes3::<i64>(out, a, b, |o, x, y| int3(op, o, x, y)),
        DType::Uint64 => bytes3::<u64>(out, a, b, |o, x, y| int3(op, o, x, y)),
        DType::Float32 => bytes3::<f32>(out, a, b, |o, x, y| flt3(op, o, x, y)),
        DType::Float64 => bytes3::<f64>(out, a, b, |o, x, y| flt3(op, o, x, y)),
        DType::Float16 => half3::<f16>(op, out, a, b),
        DType::Bfloat16 => half3::<bf16>(op, out, a, b),
    }
}

fn map1<T: Num>(buf: &mut [u8], f: impl Fn(T) -> T) {
    match typed_mut::<T>(buf) {
        Some(t) => t.iter_mut().for_each(|x| *x = f(*x)),
        None => buf.chunks_exact_mut(T::SZ).for_each(|c| f(T::rd(c)).wr(c)),
    }
}

fn half_div<H: Half>(buf: &mut [u8], n: usize) {
    let mut fa = [0f32; BLK];
    for c in buf.chunks_mut(BLK * 2) {
        let m = c.len() / 2;
        half_load::<H>(c, &mut fa[..m]);
        fa[..m].iter_mut().for_each(|x| *x /= n as f32);
        half_store::<H>(&fa[..m], c);
    }
}

/// Divides every element by `n` (finishing `Avg`). Integers truncate toward zero; floats divide
/// in their own type (float16/bfloat16 through f32, one rounding). `n <= 1` leaves `buf` as is.
pub fn divide(dt: DType, buf: &mut [u8], n: usize) {
    debug_assert_eq!(buf.len() % dt.size(), 0);
    if n <= 1 {
        return;
    }
    match dt {
        DType::Int8 => map1::<i8>(buf, |x| x.div_n(n)),
        DType::Uint8 => map1::<u8>(buf, |x| x.div_n(n)),
        DType::Int32 => map1::<i32>(buf, |x| x.div_n(n)),
        DType::Uint32 => map1::<u32>(buf, |x| x.div_n(n)),
        DType::Int64 => map1::<i64>(buf, |x| Int::div_n(x, n)),
        DType::Uint64 => map1::<u64>(buf, |x| Int::div_n(x, n)),
        DType::Float32 => map1::<f32>(buf, |x| Flt::div_n(x, n)),
        DType::Float64 => map1::<f64>(buf, |x| Flt::div_n(x, n)),
        DType::Float16 => half_div::<f16>(buf, n),
        DType::Bfloat16 => half_div::<bf16>(buf, n),
    }
}

/// float16/bfloat16 bytes -> float32 bytes; `dst.len() == 2 * src.len()`. Exact.
pub fn widen(dt: DType, src: &[u8], dst: &mut [u8]) {
    assert_eq!(dst.len(), 2 * src.len(), "widen: dst must be twice src");
    debug_assert_eq!(src.len() % 2, 0);
    let f: fn(&[u8], &mut [f32]) = match dt {
        DType::Float16 => half_load::<f16>,
        DType::Bfloat16 => half_load::<bf16>,
        _ => panic!("widen: {} is not a half-precision type", dt.name()),
    };
    match typed_mut::<f32>(dst) {
        Some(out) => f(src, out),
        None => {
            let mut tmp = [0f32; BLK];
            for (sc, dc) in src.chunks(BLK * 2).zip(dst.chunks_mut(BLK * 4)) {
                let m = sc.len() / 2;
                f(sc, &mut tmp[..m]);
                store(&tmp[..m], dc);
            }
        }
    }
}

/// float32 bytes -> float16/bfloat16 bytes with one round-to-nearest-even;
/// `src.len() == 2 * dst.len()`.
pub fn narrow(dt: DType, src: &[u8], dst: &mut [u8]) {
    assert_eq!(src.len(), 2 * dst.len(), "narrow: src must be twice dst");
    debug_assert_eq!(dst.len() % 2, 0);
    let f: fn(&[f32], &mut [u8]) = match dt {
        DType::Float16 => half_store::<f16>,
        DType::Bfloat16 => half_store::<bf16>,
        _ => panic!("narrow: {} is not a half-precision type", dt.name()),
    };
    match typed::<f32>(src) {
        Some(vals) => f(vals, dst),
        None => {
            let mut tmp = [0f32; BLK];
            for (sc, dc) in src.chunks(BLK * 4).zip(dst.chunks_mut(BLK * 2)) {
                let m = dc.len() / 2;
                load(sc, &mut tmp[..m]);
                f(&tmp[..m], dc);
            }
        }
    }
}

/// Whether reducing more than two operands of `dt` with `op` must go through f32 (`widen`,
/// reduce, `narrow`) to round once: half-precision Sum/Prod/Avg. Max/Min are exact in any type.
pub fn needs_widen(dt: DType, op: ReduceOp) -> bool {
    matches!(dt, DType::Float16 | DType::Bfloat16)
        && matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Avg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    /// Random element bytes: integers over their full range, floats small and NaN-free
    /// (with some +-0.0 to exercise Max/Min on signed zeros).
    fn gen(dt: DType, n: usize, rng: &mut Rng) -> Vec<u8> {
        let mut v = Vec::with_capacity(n * dt.size());
        for _ in 0..n {
            let r = rng.next();
            let fv = match r % 17 {
                0 => 0.0,
                1 => -0.0,
                _ => ((r >> 8) % 2001) as f64 / 16.0 - 62.5,
            };
            match dt {
                DType::Float32 => v.extend_from_slice(&(fv as f32).to_ne_bytes()),
                DType::Float64 => v.extend_from_slice(&(fv + 1.0 / 3.0).to_ne_bytes()),
                DType::Float16 => v.extend_from_slice(&f16::from_f64(fv).to_ne_bytes()),
                DType::Bfloat16 => v.extend_from_slice(&bf16::from_f64(fv).to_ne_bytes()),
                _ => v.extend_from_slice(&r.to_ne_bytes()[..dt.size()]),
            }
        }
        v
    }

    fn int_signed(dt: DType) -> bool {
        matches!(dt, DType::Int8 | DType::Int32 | DType::Int64)
    }

    /// Decodes an integer element to i128 (sign- or zero-extended).
    fn dec_int(dt: DType, b: &[u8]) -> i128 {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        let u = u64::from_ne_bytes(w) as i128; // little-endian assumption, fine for tests
        let bits = 8 * dt.size() as u32;
        if int_signed(dt) && bits < 128 && (u >> (bits - 1)) & 1 == 1 {
            u - (1i128 << bits)
        } else {
            u
        }
    }

    fn enc_int(dt: DType, x: i128) -> Vec<u8> {
        let bits = 8 * dt.size() as u32;
        let u = (x & ((1i128 << bits) - 1)) as u64;
        u.to_ne_bytes()[..dt.size()].to_vec()
    }

    fn dec_f(dt: DType, b: &[u8]) -> f64 {
        match dt {
            DType::Float32 => f32::from_ne_bytes(b.try_into().unwrap()) as f64,
            DType::Float64 => f64::from_ne_bytes(b.try_into().unwrap()),
            DType::Float16 => f16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
            DType::Bfloat16 => bf16::from_ne_bytes(b.try_into().unwrap()).to_f64(),
            _ => unreachable!(),
        }
    }

    /// Encodes with one rounding from the op's working type (f32 for halves, own type else).
    fn enc_f(dt: DType, x: f64) -> Vec<u8> {
        match dt {
            DType::Float32 => (x as f32).to_ne_bytes().to_vec(),
            DType::Float64 => x.to_ne_bytes().to_vec(),
            DType::Float16 => f16::from_f32(x as f32).to_ne_bytes().to_vec(),
            DType::Bfloat16 => bf16::from_f32(x as f32).to_ne_bytes().to_vec(),
            _ => unreachable!(),
        }
    }

    /// Scalar reference for one element.
    fn ref_elem(dt: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
        if !dt.is_float() {
            let (x, y) = (dec_int(dt, a), dec_int(dt, b));
            let r = match op {
                ReduceOp::Sum | ReduceOp::Avg => x + y,
                ReduceOp::Prod => x.wrapping_mul(y),
                ReduceOp::Max => x.max(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Band => x & y,
                ReduceOp::Bor => x | y,
                ReduceOp::Bxor => x ^ y,
            };
            return enc_int(dt, r);
        }
        let (x, y) = (dec_f(dt, a), dec_f(dt, b));
        let zero_sign = |neg_wins: bool| {
            let (nx, ny) = (x.is_sign_negative(), y.is_sign_negative());
            let neg = if neg_wins { nx || ny } else { nx && ny };
            if neg {
                -0.0
            } else {
                0.0
            }
        };
        // f32 arithmetic for f32/f16/bf16 (halves reduce in f32), f64 for f64.
        let r = match op {
            ReduceOp::Sum | ReduceOp::Avg if dt == DType::Float64 => x + y,
            ReduceOp::Sum | ReduceOp::Avg => (x as f32 + y as f32) as f64,
            ReduceOp::Prod if dt == DType::Float64 => x * y,
            ReduceOp::Prod => (x as f32 * y as f32) as f64,
            ReduceOp::Max if x == y => zero_sign(false),
            ReduceOp::Min if x == y => zero_sign(true),
            ReduceOp::Max => x.max(y),
            ReduceOp::Min => x.min(y),
            _ => unreachable!(),
        };
        // Equal nonzero values: zero_sign path must not be used.
        let r = if matches!(op, ReduceOp::Max | ReduceOp::Min) && x == y && x != 0.0 {
            x
        } else {
            r
        };
        enc_f(dt, r)
    }

    fn reference(dt: DType, op: ReduceOp, a: &[u8], b: &[u8]) -> Vec<u8> {
        let s = dt.size();
        a.chunks(s)
            .zip(b.chunks(s))
            .flat_map(|(x, y)| ref_elem(dt, op, x, y))
            .collect()
    }

    /// Copies `data` into a fresh buffer at byte offset `off`, returning (storage, offset).
    fn at_offset(data: &[u8], off: usize) -> Vec<u8> {
        let mut v = vec![0xAAu8; data.len() + off + 3];
        v[off..off + data.len()].copy_from_slice(data);
        v
    }

    #[test]
    fn combine_matches_reference_all_types_ops_alignments() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for dt in DType::ALL {
            for op in ReduceOp::ALL {
                if !op.valid_for(dt) {
                    continue;
                }
                for n in [0usize, 1, 3, 255, 256, 257, 1000] {
                    let a = gen(dt, n, &mut rng);
                    let b = gen(dt, n, &mut rng);
                    let want = reference(dt, op, &a, &b);
                    let len = a.len();
                    for (oa, ob, oo) in [(0, 0, 0), (1, 0, 0), (0, 1, 1), (3, 5, 2), (1, 1, 1)] {
                        // combine
                        let mut acc = at_offset(&a, oa);
                        let src = at_offset(&b, ob);
                        combine(dt, op, &mut acc[oa..oa + len], &src[ob..ob + len]);
                        assert_eq!(
                            &acc[oa..oa + len],
                            &want[..],
                            "combine {dt:?} {op:?} n={n} off={oa},{ob}"
                        );
                        assert!(acc[..oa].iter().chain(&acc[oa + len..]).all(|&x| x == 0xAA));
                        // combine_into
                        let mut out = at_offset(&vec![0u8; len], oo);
                        let x = at_offset(&a, oa);
                        combine_into(
                            dt,
                            op,
                            &mut out[oo..oo + len],
                            &x[oa..oa + len],
                            &src[ob..ob + len],
                        );
                        assert_eq!(
                            &out[oo..oo + len],
                            &want[..],
                            "combine_into {dt:?} {op:?} n={n}"
                        );
                        assert!(out[..oo].iter().chain(&out[oo + len..]).all(|&x| x == 0xAA));
                    }
                }
            }
        }
    }

    #[test]
    fn integer_wrapping_and_negatives() {
        let i8s = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
        let mut acc = i8s(&[127, -128, -5, 100]);
        combine(
            DType::Int8,
            ReduceOp::Sum,
            &mut acc,
            &i8s(&[1, -1, -7, 100]),
        );
        assert_eq!(acc, i8s(&[-128, 127, -12, -56]));
        let mut acc = i8s(&[64, -3]);
        combine(DType::Int8, ReduceOp::Prod, &mut acc, &i8s(&[4, 5]));
        assert_eq!(acc, i8s(&[0, -15]));
        let mut acc = u64::MAX.to_ne_bytes().to_vec();
        combine(DType::Uint64, ReduceOp::Sum, &mut acc, &2u64.to_ne_bytes());
        assert_eq!(acc, 1u64.to_ne_bytes());
        let mut acc = (-3i32).to_ne_bytes().to_vec();
        combine(
            DType::Int32,
            ReduceOp::Max,
            &mut acc,
            &(-7i32).to_ne_bytes(),
        );
        assert_eq!(acc, (-3i32).to_ne_bytes());
        combine(
            DType::Int32,
            ReduceOp::Min,
            &mut acc,
            &(-7i32).to_ne_bytes(),
        );
        assert_eq!(acc, (-7i32).to_ne_bytes());
    }

    #[test]
    fn divide_truncates_toward_zero() {
        let i32s = |v: &[i32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let mut b = i32s(&[7, -7, 6, -1, i32::MIN, i32::MAX]);
        divide(DType::Int32, &mut b, 3);
        assert_eq!(b, i32s(&[2, -2, 2, 0, i32::MIN / 3, i32::MAX / 3]));
        let mut b = vec![(-128i8) as u8, 127, (-9i8) as u8];
        divide(DType::Int8, &mut b, 200);
        assert_eq!(b, vec![0, 0, 0]);
        let mut b = vec![(-9i8) as u8, 255u8];
        divide(DType::Int8, &mut b, 2);
        assert_eq!(b, vec![(-4i8) as u8, 0]);
        let mut b = vec![255u8, 10];
        divide(DType::Uint8, &mut b, 4);
        assert_eq!(b, vec![63, 2]);
        let mut b: Vec<u8> = [u64::MAX, 10]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        divide(DType::Uint64, &mut b, 7);
        assert_eq!(
            b,
            [u64::MAX / 7, 1]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect::<Vec<u8>>()
        );
        let mut b: Vec<u8> = [i64::MIN, -13]
            .iter()
            .flat_map(|x| x.to_ne_bytes())
            .collect();
        divide(DType::Int64, &mut b, 4);
        assert_eq!(
            b,
            [i64::MIN / 4, -3]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect::<Vec<u8>>()
        );
        // Unaligned float64.
        let mut st = [0u8; 17];
        st[1..].copy_from_slice(
            &[1.0f64, -3.0]
                .iter()
                .flat_map(|x| x.to_ne_bytes())
                .collect::<Vec<u8>>(),
        );
        divide(DType::Float64, &mut st[1..], 3);
        assert_eq!(f64::from_ne_bytes(st[1..9].try_into().unwrap()), 1.0 / 3.0);
        assert_eq!(f64::from_ne_bytes(st[9..17].try_into().unwrap()), -1.0);
        let mut h = f16::from_f32(3.0).to_ne_bytes().to_vec();
        divide(DType::Float16, &mut h, 2);
        assert_eq!(h, f16::from_f32(1.5).to_ne_bytes());
        let mut f = 1.0f32.to_ne_bytes().to_vec();
        divide(DType::Float32, &mut f, 1);
        assert_eq!(f, 1.0f32.to_ne_bytes());
    }

    #[test]
    fn float_max_min_nan_and_zero() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let a = f32s(&[f32::NAN, 1.0, 0.0, -0.0, -0.0, f32::NEG_INFINITY]);
        let b = f32s(&[2.0, f32::NAN, -0.0, 0.0, -0.0, -1.0]);
        let mut m = a.clone();
        combine(DType::Float32, ReduceOp::Max, &mut m, &b);
        assert_eq!(m, f32s(&[2.0, 1.0, 0.0, 0.0, -0.0, -1.0]));
        // Commutative bitwise.
        let mut m2 = b.clone();
        combine(DType::Float32, ReduceOp::Max, &mut m2, &a);
        assert_eq!(m, m2);
        let mut m = a.clone();
        combine(DType::Float32, ReduceOp::Min, &mut m, &b);
        assert_eq!(m, f32s(&[2.0, 1.0, -0.0, -0.0, -0.0, f32::NEG_INFINITY]));
        let mut m2 = b.clone();
        combine(DType::Float32, ReduceOp::Min, &mut m2, &a);
        assert_eq!(m, m2);
    }

    #[test]
    fn widen_narrow_round_trip_and_rounding() {
        for dt in [DType::Float16, DType::Bfloat16] {
            // Every bit pattern that is not NaN survives the round trip.
            let src: Vec<u8> = (0..=u16::MAX)
                .filter(|&b| {
                    if dt == DType::Float16 {
                        !f16::from_bits(b).is_nan()
                    } else {
                        !bf16::from_bits(b).is_nan()
                    }
                })
                .flat_map(|b| b.to_ne_bytes())
                .collect();
            for off in [0usize, 1] {
                let s = at_offset(&src, off);
                let mut wide = at_offset(&vec![0u8; src.len() * 2], 1 - off);
                let wl = src.len() * 2;
                widen(
                    dt,
                    &s[off..off + src.len()],
                    &mut wide[1 - off..1 - off + wl],
                );
                for (h, w) in src.chunks(2).zip(wide[1 - off..].chunks(4)) {
                    let want = dec_f(dt, h) as f32;
                    assert_eq!(
                        f32::from_ne_bytes(w.try_into().unwrap()).to_bits(),
                        want.to_bits()
                    );
                }
                let mut back = at_offset(&vec![0u8; src.len()], off);
                narrow(
                    dt,
                    &wide[1 - off..1 - off + wl],
                    &mut back[off..off + src.len()],
                );
                assert_eq!(&back[off..off + src.len()], &src[..]);
            }
        }
        // Ties round to even. f16: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 -> 1;
        // 1 + 3*2^-11 lies between 1+2^-10 and 1+2^-9 -> 1 + 2^-9 (even mantissa).
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let mut out = vec![0u8; 6];
        narrow(
            DType::Float16,
            &f32s(&[1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 65520.0]),
            &mut out,
        );
        let got: Vec<f32> = out
            .chunks(2)
            .map(|c| f16::from_ne_bytes(c.try_into().unwrap()).to_f32())
            .collect();
        assert_eq!(got, vec![1.0, 1.0 + 2f32.powi(-9), f32::INFINITY]);
        // bf16: 1 + 2^-8 halfway between 1 and 1 + 2^-7 -> 1; 1 + 3*2^-8 -> 1 + 2^-6.
        narrow(
            DType::Bfloat16,
            &f32s(&[
                1.0 + 2f32.powi(-8),
                1.0 + 3.0 * 2f32.powi(-8),
                1.0 + 2f32.powi(-8) + 2f32.powi(-20),
            ]),
            &mut out,
        );
        let got: Vec<f32> = out
            .chunks(2)
            .map(|c| bf16::from_ne_bytes(c.try_into().unwrap()).to_f32())
            .collect();
        assert_eq!(got, vec![1.0, 1.0 + 2f32.powi(-6), 1.0 + 2f32.powi(-7)]);
    }

    #[test]
    fn half_combine_rounds_once_per_call() {
        // 2048 + 1 in f16 is a tie between 2048 and 2050 -> 2048 (even).
        let h = |x: f32| f16::from_f32(x).to_ne_bytes().to_vec();
        let mut acc = h(2048.0);
        combine(DType::Float16, ReduceOp::Sum, &mut acc, &h(1.0));
        assert_eq!(acc, h(2048.0));
        // Through f32: 2048 + 1 + 1 = 2050 exactly, rounded once.
        let mut w = vec![0u8; 4];
        let mut one = vec![0u8; 4];
        widen(DType::Float16, &h(2048.0), &mut w);
        widen(DType::Float16, &h(1.0), &mut one);
        combine(DType::Float32, ReduceOp::Sum, &mut w, &one);
        combine(DType::Float32, ReduceOp::Sum, &mut w, &one);
        let mut out = vec![0u8; 2];
        narrow(DType::Float16, &w, &mut out);
        assert_eq!(out, h(2050.0));
    }
}
