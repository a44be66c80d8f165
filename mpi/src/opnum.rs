//! The predefined ops on floating-point elements applied here: real (float, double, long
//! double), complex of each, and MINLOC/MAXLOC pairs whose value or index is not an int.
//! One generic kernel per op class over `Num`, so every format gets the same semantics.

use crate::abi_gen::*;
use crate::ldouble::F80;

/// A real floating-point format as it lies in memory.
pub trait Num: Copy {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(&self, b: &mut [u8]);
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn lt(&self, o: &Self) -> bool;
    fn eq(&self, o: &Self) -> bool;
}

macro_rules! native {
    ($t:ty) => {
        impl Num for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b[..Self::SIZE].try_into().unwrap())
            }
            fn store(&self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_ne_bytes());
            }
            fn add(self, o: Self) -> Self {
                self + o
            }
            fn sub(self, o: Self) -> Self {
                self - o
            }
            fn mul(self, o: Self) -> Self {
                self * o
            }
            fn min(self, o: Self) -> Self {
                <$t>::min(self, o)
            }
            fn max(self, o: Self) -> Self {
                <$t>::max(self, o)
            }
            fn lt(&self, o: &Self) -> bool {
                self < o
            }
            fn eq(&self, o: &Self) -> bool {
                self == o
            }
        }
    };
}
native!(f32);
native!(f64);

impl Num for F80 {
    const SIZE: usize = 16;
    fn load(b: &[u8]) -> Self {
        F80::load(b)
    }
    fn store(&self, b: &mut [u8]) {
        F80::store(self, b)
    }
    fn add(self, o: Self) -> Self {
        F80::add(self, o)
    }
    fn sub(self, o: Self) -> Self {
        F80::sub(self, o)
    }
    fn mul(self, o: Self) -> Self {
        F80::mul(self, o)
    }
    fn min(self, o: Self) -> Self {
        F80::min(self, o)
    }
    fn max(self, o: Self) -> Self {
        F80::max(self, o)
    }
    fn lt(&self, o: &Self) -> bool {
        F80::lt(self, o)
    }
    fn eq(&self, o: &Self) -> bool {
        F80::eq(self, o)
    }
}

/// inout = in (op) inout on reals: MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX (checked by op::plan).
pub fn real<T: Num>(op: MPI_Op, inv: &[u8], inout: &mut [u8]) {
    for (a, b) in inv.chunks_exact(T::SIZE).zip(inout.chunks_exact_mut(T::SIZE)) {
        let (x, y) = (T::load(a), T::load(b));
        let r = match op {
            MPI_SUM => x.add(y),
            MPI_PROD => x.mul(y),
            MPI_MIN => x.min(y),
            MPI_MAX => x.max(y),
            _ => unreachable!("checked by plan"),
        };
        r.store(b);
    }
}

/// inout = in (op) inout on complex numbers (real part, then imaginary): MPI_SUM, MPI_PROD.
pub fn complex<T: Num>(op: MPI_Op, inv: &[u8], inout: &mut [u8]) {
    let n = T::SIZE;
    for (a, b) in inv.chunks_exact(2 * n).zip(inout.chunks_exact_mut(2 * n)) {
        let (ar, ai) = (T::load(a), T::load(&a[n..]));
        let (br, bi) = (T::load(b), T::load(&b[n..]));
        let (r, i) = match op {
            MPI_SUM => (ar.add(br), ai.add(bi)),
            // (ar + i ai)(br + i bi), the textbook formula (as MPICH computes it).
            MPI_PROD => (ar.mul(br).sub(ai.mul(bi)), ar.mul(bi).add(ai.mul(br))),
            _ => unreachable!("checked by plan"),
        };
        r.store(b);
        i.store(&mut b[n..]);
    }
}

/// MINLOC/MAXLOC on (value V, index I) pairs, the index `off` bytes into each `ext`-byte
/// element: the smaller/larger value, and on a tie the smaller index.
pub fn pair<V: Num, I: Num>(min: bool, off: usize, ext: usize, inv: &[u8], inout: &mut [u8]) {
    for (a, b) in inv.chunks_exact(ext).zip(inout.chunks_exact_mut(ext)) {
        let (va, vb) = (V::load(a), V::load(b));
        let (ia, ib) = (I::load(&a[off..]), I::load(&b[off..]));
        let better = if min { va.lt(&vb) } else { vb.lt(&va) };
        if better {
            va.store(b);
            ia.store(&mut b[off..]);
        } else if va.eq(&vb) && ia.lt(&ib) {
            ia.store(&mut b[off..]);
        }
    }
}

/// An int index for `pair`.
impl Num for i32 {
    const SIZE: usize = 4;
    fn load(b: &[u8]) -> Self {
        i32::from_ne_bytes(b[..4].try_into().unwrap())
    }
    fn store(&self, b: &mut [u8]) {
        b[..4].copy_from_slice(&self.to_ne_bytes());
    }
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    fn sub(self, o: Self) -> Self {
        self.wrapping_sub(o)
    }
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
    fn min(self, o: Self) -> Self {
        Ord::min(self, o)
    }
    fn max(self, o: Self) -> Self {
        Ord::max(self, o)
    }
    fn lt(&self, o: &Self) -> bool {
        self < o
    }
    fn eq(&self, o: &Self) -> bool {
        self == o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f64s(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn complex_products() {
        // (1 + 2i)(3 + 4i) = -5 + 10i; sums add parts.
        let mut io = f64s(&[3.0, 4.0]);
        complex::<f64>(MPI_PROD, &f64s(&[1.0, 2.0]), &mut io);
        assert_eq!(io, f64s(&[-5.0, 10.0]));
        let mut io = f64s(&[3.0, 4.0, 0.5, 0.0]);
        complex::<f64>(MPI_SUM, &f64s(&[1.0, 2.0, 0.5, -1.0]), &mut io);
        assert_eq!(io, f64s(&[4.0, 6.0, 1.0, -1.0]));
        let fl: Vec<u8> = [1f32, 2.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let mut io: Vec<u8> = [3f32, 4.0].iter().flat_map(|x| x.to_ne_bytes()).collect();
        complex::<f32>(MPI_PROD, &fl, &mut io);
        assert_eq!(io, [-5f32, 10.0].iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn long_double_reals_and_complex() {
        let ld = |v: &[f64]| -> Vec<u8> { v.iter().flat_map(|&x| F80::from_f64(x).0).collect() };
        let back = |b: &[u8]| -> Vec<f64> { b.chunks(16).map(|c| F80::load(c).to_f64()).collect() };
        let mut io = ld(&[1.0, 5.0, -2.0]);
        real::<F80>(MPI_SUM, &ld(&[2.0, 0.25, 2.0]), &mut io);
        assert_eq!(back(&io), vec![3.0, 5.25, 0.0]);
        real::<F80>(MPI_MIN, &ld(&[4.0, 1.0, -1.0]), &mut io);
        assert_eq!(back(&io), vec![3.0, 1.0, -1.0]);
        real::<F80>(MPI_PROD, &ld(&[2.0, 3.0, 0.5]), &mut io);
        assert_eq!(back(&io), vec![6.0, 3.0, -0.5]);
        let mut io = ld(&[3.0, 4.0]);
        complex::<F80>(MPI_PROD, &ld(&[1.0, 2.0]), &mut io);
        assert_eq!(back(&io), vec![-5.0, 10.0]);
    }

    #[test]
    fn pairs_with_float_indices() {
        // MPI_2DOUBLE_PRECISION: (value, index) both doubles.
        let mut io = f64s(&[2.0, 7.0, 1.0, 3.0]);
        pair::<f64, f64>(true, 8, 16, &f64s(&[2.0, 5.0, 4.0, 1.0]), &mut io);
        assert_eq!(io, f64s(&[2.0, 5.0, 1.0, 3.0]));
        pair::<f64, f64>(false, 8, 16, &f64s(&[9.0, 8.0, 1.0, 0.0]), &mut io);
        assert_eq!(io, f64s(&[9.0, 8.0, 1.0, 0.0]));
    }
}
