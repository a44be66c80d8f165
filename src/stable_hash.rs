//! A hasher whose output is fixed by this file, not by the toolchain: ids that ranks derive
//! alike (child contexts, member lists) must agree between builds of different Rust releases,
//! which `DefaultHasher` does not promise. FNV-1a, 64 bits; not for anything an attacker picks.

use std::hash::{Hash, Hasher};

/// FNV-1a over the bytes `Hash` feeds it (integers in little-endian order).
#[derive(Clone, Copy, Debug)]
pub struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl StableHasher {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Hasher for StableHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    // Integers as little-endian bytes on every machine (the default would use native order).
    fn write_u16(&mut self, v: u16) {
        self.write(&v.to_le_bytes())
    }
    fn write_u32(&mut self, v: u32) {
        self.write(&v.to_le_bytes())
    }
    fn write_u64(&mut self, v: u64) {
        self.write(&v.to_le_bytes())
    }
    fn write_usize(&mut self, v: usize) {
        self.write(&(v as u64).to_le_bytes())
    }
    fn write_i64(&mut self, v: i64) {
        self.write(&v.to_le_bytes())
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The stable hash of one value.
pub fn hash_of<T: Hash + ?Sized>(v: &T) -> u64 {
    let mut h = StableHasher::new();
    v.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_by_the_algorithm() {
        // FNV-1a test vectors, and integers hashed as their little-endian bytes.
        let mut h = StableHasher::new();
        h.write(b"");
        assert_eq!(h.finish(), 0xcbf2_9ce4_8422_2325);
        h.write(b"a");
        assert_eq!(h.finish(), 0xaf63_dc4c_8601_ec8c);
        let mut a = StableHasher::new();
        a.write_u64(0x0102_0304_0506_0708);
        let mut b = StableHasher::new();
        b.write(&[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(a.finish(), b.finish());
        assert_ne!(hash_of(&[1u64, 2]), hash_of(&[2u64, 1]));
    }
}
