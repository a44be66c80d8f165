//! C `long double` for reductions. On x86_64 it is the x87 80-bit extended format stored in 16
//! bytes (the last 6 are padding); Rust has no such type, so the arithmetic runs on the x87
//! unit itself (inline asm with memory operands), which rounds exactly as C code would.
//! Comparisons need no FPU: the format orders like sign-magnitude integers. Elsewhere the
//! format is not known here, and `SUPPORTED` is false (the ops answer "unsupported").

/// One long double as it lies in memory (16 bytes, of which the first 10 hold the value).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(16))]
pub struct F80(pub [u8; 16]);

/// Whether this target's long double is the x87 format handled here.
pub const SUPPORTED: bool = cfg!(target_arch = "x86_64");

#[cfg(target_arch = "x86_64")]
mod x87 {
    use std::arch::asm;

    /// b = a (op) b, one x87 instruction on two values loaded from memory.
    macro_rules! binop {
        ($name:ident, $insn:literal) => {
            pub fn $name(a: &[u8; 16], b: &mut [u8; 16]) {
                // SAFETY: both point to 10 readable bytes (b writable); the x87 stack is
                // empty on entry (the ABI's rule) and left empty: two loads, one pop, one store.
                unsafe {
                    asm!(
                        "fld tbyte ptr [{a}]",
                        "fld tbyte ptr [{b}]",
                        $insn,
                        "fstp tbyte ptr [{b}]",
                        a = in(reg) a.as_ptr(),
                        b = in(reg) b.as_mut_ptr(),
                        // All eight named, as the asm rules ask of code that uses the stack.
                        out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
                        out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
                        options(nostack),
                    );
                }
            }
        };
    }
    // After the loads st(1) = a, st(0) = b; "fXXXp st(1), st" leaves st(1) op st(0) = a op b.
    binop!(add, "faddp st(1), st");
    binop!(mul, "fmulp st(1), st");
    binop!(sub, "fsubp st(1), st");

    pub fn from_f64(x: f64) -> [u8; 16] {
        let mut out = [0u8; 16];
        // SAFETY: loads 8 bytes, stores 10 into a 16-byte buffer; the x87 stack is left empty.
        unsafe {
            asm!("fld qword ptr [{x}]", "fstp tbyte ptr [{o}]", x = in(reg) &x, o = in(reg) out.as_mut_ptr(), out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _, out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _, options(nostack));
        }
        out
    }

    pub fn to_f64(v: &[u8; 16]) -> f64 {
        let mut x = 0f64;
        // SAFETY: loads 10 bytes, stores 8; the x87 stack is left empty.
        unsafe {
            asm!("fld tbyte ptr [{v}]", "fstp qword ptr [{x}]", v = in(reg) v.as_ptr(), x = in(reg) &mut x, out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _, out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _, options(nostack));
        }
        x
    }
}

impl F80 {
    pub fn load(b: &[u8]) -> F80 {
        let mut v = [0u8; 16];
        v[..10].copy_from_slice(&b[..10]);
        F80(v)
    }

    /// Writes the 10 bytes of the value; the padding of `b` is left as it was.
    pub fn store(&self, b: &mut [u8]) {
        b[..10].copy_from_slice(&self.0[..10]);
    }

    fn exp_bits(&self) -> u16 {
        u16::from_le_bytes([self.0[8], self.0[9]])
    }

    fn mant(&self) -> u64 {
        u64::from_le_bytes(self.0[..8].try_into().unwrap())
    }

    pub fn is_nan(&self) -> bool {
        // Exponent all ones with a fraction beyond the explicit integer bit.
        self.exp_bits() & 0x7fff == 0x7fff && self.mant() << 1 != 0
    }

    /// An integer that orders as the value does (for values that are not NaN; -0 == +0).
    fn key(&self) -> i128 {
        let mag = (((self.exp_bits() & 0x7fff) as i128) << 64) | self.mant() as i128;
        if self.exp_bits() & 0x8000 != 0 {
            -mag
        } else {
            mag
        }
    }

    pub fn lt(&self, o: &F80) -> bool {
        !self.is_nan() && !o.is_nan() && self.key() < o.key()
    }

    pub fn eq(&self, o: &F80) -> bool {
        !self.is_nan() && !o.is_nan() && self.key() == o.key()
    }

    /// The smaller of two (a NaN gives way to a number, as f64::min does).
    pub fn min(self, o: F80) -> F80 {
        if self.is_nan() || o.lt(&self) {
            o
        } else {
            self
        }
    }

    pub fn max(self, o: F80) -> F80 {
        if self.is_nan() || self.lt(&o) {
            o
        } else {
            self
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub fn add(self, o: F80) -> F80 {
        let mut r = o.0;
        x87::add(&self.0, &mut r);
        F80(r)
    }
    #[cfg(target_arch = "x86_64")]
    pub fn mul(self, o: F80) -> F80 {
        let mut r = o.0;
        x87::mul(&self.0, &mut r);
        F80(r)
    }
    #[cfg(target_arch = "x86_64")]
    pub fn sub(self, o: F80) -> F80 {
        let mut r = o.0;
        x87::sub(&self.0, &mut r);
        F80(r)
    }
    #[cfg(target_arch = "x86_64")]
    pub fn from_f64(x: f64) -> F80 {
        F80(x87::from_f64(x))
    }
    #[cfg(target_arch = "x86_64")]
    pub fn to_f64(&self) -> f64 {
        x87::to_f64(&self.0)
    }

    // Not reached where SUPPORTED is false: op::plan refuses long double there first.
    #[cfg(not(target_arch = "x86_64"))]
    pub fn add(self, _: F80) -> F80 {
        unreachable!("long double arithmetic on a target without x87")
    }
    #[cfg(not(target_arch = "x86_64"))]
    pub fn mul(self, _: F80) -> F80 {
        unreachable!("long double arithmetic on a target without x87")
    }
    #[cfg(not(target_arch = "x86_64"))]
    pub fn sub(self, _: F80) -> F80 {
        unreachable!("long double arithmetic on a target without x87")
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_is_extended_precision() {
        let (a, b) = (F80::from_f64(1.5), F80::from_f64(-4.0));
        assert_eq!(a.add(b).to_f64(), -2.5);
        assert_eq!(a.mul(b).to_f64(), -6.0);
        assert_eq!(a.sub(b).to_f64(), 5.5, "a - b, not b - a");
        // 1 + 2^-60 is exact in 64 mantissa bits (not in a double): subtracting 1 gives 2^-60.
        let one = F80::from_f64(1.0);
        let tiny = F80::from_f64(2f64.powi(-60));
        assert_eq!(one.add(tiny).sub(one).to_f64(), 2f64.powi(-60));
        // Known bytes: 1.0 is mantissa 1<<63, exponent 0x3fff.
        assert_eq!(&one.0[..10], &[0, 0, 0, 0, 0, 0, 0, 0x80, 0xff, 0x3f]);
    }

    #[test]
    fn order_and_nan() {
        let v: Vec<F80> = [-3.0, -0.5, 0.0, 1e-300, 2.0, 1e300].iter().map(|&x| F80::from_f64(x)).collect();
        for i in 0..v.len() {
            for j in 0..v.len() {
                assert_eq!(v[i].lt(&v[j]), i < j, "{i} {j}");
            }
        }
        assert!(F80::from_f64(-0.0).eq(&F80::from_f64(0.0)));
        let nan = F80::from_f64(f64::NAN);
        assert!(nan.is_nan() && !F80::from_f64(f64::INFINITY).is_nan());
        assert_eq!(nan.min(v[4]).to_f64(), 2.0);
        assert_eq!(v[4].max(nan).to_f64(), 2.0);
        assert_eq!(v[0].max(v[5]).to_f64(), 1e300);
        // store keeps the padding of the destination.
        let mut b = [0xaau8; 16];
        v[4].store(&mut b);
        assert_eq!(&b[10..], &[0xaa; 6]);
    }
}
