//! Operations, data types and reduction ops as dc-bench names them, and the deterministic test
//! data: every element's value is a function of (rank, index, seed), chosen so that the exact
//! result of every reduction is representable in every type (float sums of small integers,
//! products of +-1 and 2, averages whose sums are multiples of the rank count). Expected results
//! are therefore exact and compared bit for bit. `bench/mpi_bench.c` implements the same scheme.

use distcomm::ffi::{self, dc_dtype, dc_op};
use half::{bf16, f16};

/// The operations dc-bench measures, in the order `-o all` runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Allreduce,
    Broadcast,
    Reduce,
    Allgather,
    ReduceScatter,
    Alltoall,
    Sendrecv,
    Barrier,
    Gather,
    Scatter,
    Allgatherv,
    Alltoallv,
}

pub const ALL_OPS: [Op; 12] = [
    Op::Allreduce,
    Op::Broadcast,
    Op::Reduce,
    Op::Allgather,
    Op::ReduceScatter,
    Op::Alltoall,
    Op::Sendrecv,
    Op::Barrier,
    Op::Gather,
    Op::Scatter,
    Op::Allgatherv,
    Op::Alltoallv,
];

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Allreduce => "allreduce",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::Allgather => "allgather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Alltoall => "alltoall",
            Op::Sendrecv => "sendrecv",
            Op::Barrier => "barrier",
            Op::Gather => "gather",
            Op::Scatter => "scatter",
            Op::Allgatherv => "allgatherv",
            Op::Alltoallv => "alltoallv",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        Some(match s.to_ascii_lowercase().replace('-', "_").as_str() {
            "allreduce" | "all_reduce" => Op::Allreduce,
            "broadcast" | "bcast" => Op::Broadcast,
            "reduce" => Op::Reduce,
            "allgather" | "all_gather" => Op::Allgather,
            "reduce_scatter" | "reducescatter" => Op::ReduceScatter,
            "alltoall" | "all_to_all" => Op::Alltoall,
            "sendrecv" | "send_recv" | "p2p" => Op::Sendrecv,
            "barrier" => Op::Barrier,
            "gather" => Op::Gather,
            "scatter" => Op::Scatter,
            "allgatherv" | "all_gatherv" => Op::Allgatherv,
            "alltoallv" | "all_to_allv" => Op::Alltoallv,
            _ => return None,
        })
    }

    /// Whether the op combines data with a reduction operator.
    pub fn reduces(self) -> bool {
        matches!(self, Op::Allreduce | Op::Reduce | Op::ReduceScatter)
    }

    pub fn has_root(self) -> bool {
        matches!(self, Op::Broadcast | Op::Reduce | Op::Gather | Op::Scatter)
    }

    /// Buffers split into one block per rank (the size is the total of the blocks). The v forms
    /// are timed with every count the block and block j at j * block, as OSU's benchmarks call
    /// them (and as `bench/mpi_bench.c` does).
    pub fn blocked(self) -> bool {
        matches!(
            self,
            Op::Allgather | Op::ReduceScatter | Op::Alltoall | Op::Gather | Op::Scatter | Op::Allgatherv | Op::Alltoallv
        )
    }

    /// nccl-tests' bus bandwidth factor: busbw = algbw * factor.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Op::Allreduce => 2.0 * (n - 1.0) / n,
            Op::Allgather | Op::ReduceScatter | Op::Alltoall => (n - 1.0) / n,
            Op::Gather | Op::Scatter | Op::Allgatherv | Op::Alltoallv => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce | Op::Sendrecv => 1.0,
            Op::Barrier => 0.0,
        }
    }

    /// Which of the (out-of-place, in-place) forms exist for this op in the C API. Broadcast has
    /// one buffer and is reported in the out-of-place columns; alltoall and sendrecv have no
    /// in-place form; barrier moves no data. Gather, scatter and the v forms are timed out of
    /// place only.
    pub fn forms(self) -> (bool, bool) {
        match self {
            Op::Allreduce | Op::Reduce | Op::Allgather | Op::ReduceScatter => (true, true),
            Op::Broadcast | Op::Alltoall | Op::Sendrecv | Op::Barrier => (true, false),
            Op::Gather | Op::Scatter | Op::Allgatherv | Op::Alltoallv => (true, false),
        }
    }
}

/// The library's element types, named as nccl-tests names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dt {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Half,
    Float,
    Double,
    Bfloat16,
}

pub const ALL_DTS: [Dt; 10] =
    [Dt::Int8, Dt::Uint8, Dt::Int32, Dt::Uint32, Dt::Int64, Dt::Uint64, Dt::Half, Dt::Float, Dt::Double, Dt::Bfloat16];

impl Dt {
    pub fn name(self) -> &'static str {
        match self {
            Dt::Int8 => "int8",
            Dt::Uint8 => "uint8",
            Dt::Int32 => "int32",
            Dt::Uint32 => "uint32",
            Dt::Int64 => "int64",
            Dt::Uint64 => "uint64",
            Dt::Half => "half",
            Dt::Float => "float",
            Dt::Double => "double",
            Dt::Bfloat16 => "bfloat16",
        }
    }

    pub fn parse(s: &str) -> Option<Dt> {
        Some(match s.to_ascii_lowercase().as_str() {
            "int8" | "char" | "i8" => Dt::Int8,
            "uint8" | "u8" => Dt::Uint8,
            "int32" | "int" | "i32" => Dt::Int32,
            "uint32" | "u32" => Dt::Uint32,
            "int64" | "i64" => Dt::Int64,
            "uint64" | "u64" => Dt::Uint64,
            "half" | "float16" | "fp16" | "f16" => Dt::Half,
            "float" | "float32" | "fp32" | "f32" => Dt::Float,
            "double" | "float64" | "fp64" | "f64" => Dt::Double,
            "bfloat16" | "bf16" => Dt::Bfloat16,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Dt::Int8 | Dt::Uint8 => 1,
            Dt::Half | Dt::Bfloat16 => 2,
            Dt::Int32 | Dt::Uint32 | Dt::Float => 4,
            Dt::Int64 | Dt::Uint64 | Dt::Double => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dt::Half | Dt::Float | Dt::Double | Dt::Bfloat16)
    }

    pub fn is_unsigned(self) -> bool {
        matches!(self, Dt::Uint8 | Dt::Uint32 | Dt::Uint64)
    }

    pub fn c(self) -> dc_dtype {
        match self {
            Dt::Int8 => ffi::DC_INT8,
            Dt::Uint8 => ffi::DC_UINT8,
            Dt::Int32 => ffi::DC_INT32,
            Dt::Uint32 => ffi::DC_UINT32,
            Dt::Int64 => ffi::DC_INT64,
            Dt::Uint64 => ffi::DC_UINT64,
            Dt::Half => ffi::DC_FLOAT16,
            Dt::Float => ffi::DC_FLOAT32,
            Dt::Double => ffi::DC_FLOAT64,
            Dt::Bfloat16 => ffi::DC_BFLOAT16,
        }
    }

    /// The bits of the integer `v` as an element of this type, in the low `size()` bytes:
    /// integers wrap (two's complement truncation), floats convert (exact for the values used).
    pub fn encode(self, v: i64) -> u64 {
        match self {
            Dt::Half => f16::from_f64(v as f64).to_bits() as u64,
            Dt::Bfloat16 => bf16::from_f64(v as f64).to_bits() as u64,
            Dt::Float => (v as f32).to_bits() as u64,
            Dt::Double => (v as f64).to_bits(),
            _ => (v as u64) & self.mask(),
        }
    }

    pub fn mask(self) -> u64 {
        match self.size() {
            8 => u64::MAX,
            s => (1u64 << (8 * s)) - 1,
        }
    }

    /// Whether two elements (bits in the low `size()` bytes) are the same value: bitwise for
    /// integers, by value for floats (so +0 == -0; NaN matches NaN).
    pub fn same(self, a: u64, b: u64) -> bool {
        if a == b {
            return true;
        }
        if !self.is_float() {
            return false;
        }
        let (x, y) = (self.decode_f64(a), self.decode_f64(b));
        x == y || (x.is_nan() && y.is_nan())
    }

    pub fn decode_f64(self, bits: u64) -> f64 {
        match self {
            Dt::Half => f16::from_bits(bits as u16).to_f64(),
            Dt::Bfloat16 => bf16::from_bits(bits as u16).to_f64(),
            Dt::Float => f32::from_bits(bits as u32) as f64,
            Dt::Double => f64::from_bits(bits),
            _ => bits as f64,
        }
    }

    /// Element `idx` of `buf` (native endianness), zero-extended.
    #[inline]
    pub fn get(self, buf: &[u8], idx: usize) -> u64 {
        let s = self.size();
        let mut b = [0u8; 8];
        b[..s].copy_from_slice(&buf[idx * s..idx * s + s]);
        if cfg!(target_endian = "big") {
            b[..s].reverse();
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        }
    }

    /// Stores the low `size()` bytes of `bits` as element `idx` of `buf`.
    #[inline]
    pub fn put(self, buf: &mut [u8], idx: usize, bits: u64) {
        let s = self.size();
        let b = if cfg!(target_endian = "big") { bits.to_be_bytes() } else { bits.to_le_bytes() };
        if cfg!(target_endian = "big") {
            buf[idx * s..idx * s + s].copy_from_slice(&b[8 - s..]);
        } else {
            buf[idx * s..idx * s + s].copy_from_slice(&b[..s]);
        }
    }
}

/// Reduction operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redop {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    Band,
    Bor,
    Bxor,
}

pub const ALL_REDOPS: [Redop; 8] =
    [Redop::Sum, Redop::Prod, Redop::Max, Redop::Min, Redop::Avg, Redop::Band, Redop::Bor, Redop::Bxor];

impl Redop {
    pub fn name(self) -> &'static str {
        match self {
            Redop::Sum => "sum",
            Redop::Prod => "prod",
            Redop::Max => "max",
            Redop::Min => "min",
            Redop::Avg => "avg",
            Redop::Band => "band",
            Redop::Bor => "bor",
            Redop::Bxor => "bxor",
        }
    }

    pub fn parse(s: &str) -> Option<Redop> {
        ALL_REDOPS.iter().copied().find(|r| r.name() == s.to_ascii_lowercase())
    }

    pub fn c(self) -> dc_op {
        match self {
            Redop::Sum => ffi::DC_SUM,
            Redop::Prod => ffi::DC_PROD,
            Redop::Max => ffi::DC_MAX,
            Redop::Min => ffi::DC_MIN,
            Redop::Avg => ffi::DC_AVG,
            Redop::Band => ffi::DC_BAND,
            Redop::Bor => ffi::DC_BOR,
            Redop::Bxor => ffi::DC_BXOR,
        }
    }

    pub fn bitwise(self) -> bool {
        matches!(self, Redop::Band | Redop::Bor | Redop::Bxor)
    }

    /// Whether the library defines this op for `dt` (bitwise ops are for integers only).
    pub fn valid_for(self, dt: Dt) -> bool {
        !(self.bitwise() && dt.is_float())
    }
}

/// A 64-bit mix of (rank, index, seed) (splitmix64's finaliser over an odd-constant combination).
#[inline]
pub fn hash(r: u64, i: u64, s: u64) -> u64 {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (r.wrapping_add(1)).wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ (s.wrapping_add(1)).wrapping_mul(0x1656_67B1_9E37_79F9);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What the data of one check is for; decides the value range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gen {
    /// Data movement: any bits for integers, integers in [-128, 128] for floats.
    Move,
    /// Input of a reduction with this operator.
    Reduce(Redop),
}

/// Test data for `n` ranks: the value of element `i` of rank `r`'s input, as an integer to be
/// encoded with `Dt::encode`.
#[derive(Debug, Clone, Copy)]
pub struct Data {
    pub gen: Gen,
    pub dt: Dt,
    pub n: usize,
    /// Range of summands: n*range stays within 120, so sums are exact in bfloat16 (8-bit
    /// significand) and averages never wrap in int8.
    range: i64,
}

impl Data {
    pub fn new(gen: Gen, dt: Dt, n: usize) -> Data {
        let range = (120 / n.max(1) as i64).clamp(1, 8);
        Data { gen, dt, n, range }
    }

    #[inline]
    pub fn value(&self, r: usize, i: usize, seed: u64) -> i64 {
        let h = hash(r as u64, i as u64, seed);
        let uns = self.dt.is_unsigned();
        let fl = self.dt.is_float();
        let k = self.range;
        match self.gen {
            Gen::Move if fl => (h % 257) as i64 - 128,
            Gen::Move => h as i64,
            Gen::Reduce(Redop::Sum) if uns => (h % (2 * k as u64 + 1)) as i64,
            Gen::Reduce(Redop::Sum) => (h % (2 * k as u64 + 1)) as i64 - k,
            Gen::Reduce(Redop::Prod) => match h % 8 {
                0 => 2,
                1 if uns => 3,
                1 | 2 if !uns => -1,
                _ => 1,
            },
            Gen::Reduce(Redop::Max | Redop::Min) if uns => (h % 201) as i64,
            Gen::Reduce(Redop::Max | Redop::Min) => (h % 201) as i64 - 100,
            Gen::Reduce(Redop::Avg) => {
                // A per-element base every rank shares, plus +t/-t in rank pairs (0 for an odd
                // last rank): the sum is exactly n * base.
                let half = (k / 2).max(1);
                let hb = hash(u32::MAX as u64, i as u64, seed);
                let base = if uns { half + (hb % (half as u64 + 1)) as i64 } else { (hb % (2 * half as u64 + 1)) as i64 - half };
                let t = (hash(0x1_0000_0000 + (r / 2) as u64, i as u64, seed) % (half as u64 + 1)) as i64;
                if r % 2 == 1 {
                    -t
                } else if r + 1 == self.n {
                    0
                } else {
                    t
                }
                .wrapping_add(base)
            }
            Gen::Reduce(Redop::Band | Redop::Bor | Redop::Bxor) => h as i64,
        }
    }

    /// The exact reduction of element `i` over all ranks' inputs (integers wrap).
    pub fn reduced(&self, i: usize, seed: u64) -> i64 {
        let Gen::Reduce(op) = self.gen else { unreachable!("reduced() of movement data") };
        let mut acc = self.value(0, i, seed);
        for r in 1..self.n {
            let v = self.value(r, i, seed);
            acc = match op {
                Redop::Sum | Redop::Avg => acc.wrapping_add(v),
                Redop::Prod => acc.wrapping_mul(v),
                Redop::Max => acc.max(v),
                Redop::Min => acc.min(v),
                Redop::Band => acc & v,
                Redop::Bor => acc | v,
                Redop::Bxor => acc ^ v,
            };
        }
        if op == Redop::Avg {
            acc / self.n as i64
        } else {
            acc
        }
    }

    /// Encoded bits of rank `r`'s element `i`.
    #[inline]
    pub fn bits(&self, r: usize, i: usize, seed: u64) -> u64 {
        self.dt.encode(self.value(r, i, seed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for op in ALL_OPS {
            assert_eq!(Op::parse(op.name()), Some(op));
        }
        for dt in ALL_DTS {
            assert_eq!(Dt::parse(dt.name()), Some(dt));
        }
        for r in ALL_REDOPS {
            assert_eq!(Redop::parse(r.name()), Some(r));
        }
    }

    #[test]
    fn avg_sums_are_multiples_of_n() {
        for n in 1..10 {
            for dt in ALL_DTS {
                let d = Data::new(Gen::Reduce(Redop::Avg), dt, n);
                for i in 0..200 {
                    let sum: i64 = (0..n).map(|r| d.value(r, i, 7)).sum();
                    assert_eq!(sum % n as i64, 0);
                    if dt.is_unsigned() {
                        assert!((0..n).all(|r| d.value(r, i, 7) >= 0));
                    }
                }
            }
        }
    }

    #[test]
    fn reduction_inputs_are_exact_in_every_type() {
        for n in [2, 3, 4, 8, 16] {
            for dt in ALL_DTS {
                for op in [Redop::Sum, Redop::Max, Redop::Avg] {
                    let d = Data::new(Gen::Reduce(op), dt, n);
                    for i in 0..100 {
                        let e = d.reduced(i, 3);
                        if dt.is_float() {
                            assert_eq!(dt.decode_f64(dt.encode(e)), e as f64, "{dt:?} {op:?} {e}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn element_access() {
        let mut b = vec![0u8; 32];
        for dt in ALL_DTS {
            dt.put(&mut b, 1, dt.encode(-3));
            assert_eq!(dt.get(&b, 1), dt.encode(-3));
            assert!(dt.same(dt.get(&b, 1), dt.encode(-3)));
        }
        assert!(Dt::Float.same(0.0f32.to_bits() as u64, (-0.0f32).to_bits() as u64));
    }
}
