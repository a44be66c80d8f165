//! In-process multi-rank tests of every collective against straightforward references.

use half::{bf16, f16};

use super::testing::{run, run_counting, run_ok, run_ok_hosts, run_stats, Hub};
use super::*;
use crate::dtype::{DType, ReduceOp};
use crate::error::Status;

const SIZES: std::ops::RangeInclusive<usize> = 1..=8;

fn seed(parts: &[usize]) -> u64 {
    parts.iter().fold(0x9E37_79B9_7F4A_7C15u64, |h, &p| {
        (h ^ p as u64).wrapping_mul(0x100_0000_01B3).rotate_left(29) | 1
    })
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn bytes(n: usize, s: u64) -> Vec<u8> {
    let mut r = Rng(s | 1);
    (0..n).map(|_| r.next() as u8).collect()
}

/// Test input for one rank: integers over their full range (exercising wrapping); floats chosen
/// so every reduction order gives exact results (multiples of 1/8 below 32 in magnitude; signed
/// powers of two for Prod), which lets us compare different algorithms with one reference.
fn input(dt: DType, op: ReduceOp, count: usize, s: u64) -> Vec<u8> {
    let mut r = Rng(s | 1);
    let mut v = Vec::with_capacity(count * dt.size());
    for _ in 0..count {
        let x = r.next();
        let f = if op == ReduceOp::Prod {
            [1.0, -1.0, 2.0, -2.0, 0.5, -0.5][(x % 6) as usize]
        } else {
            ((x >> 3) % 511) as f64 / 8.0 - 31.875
        };
        match dt {
            DType::Float16 => v.extend_from_slice(&f16::from_f64(f).to_ne_bytes()),
            DType::Bfloat16 => v.extend_from_slice(&bf16::from_f64(f).to_ne_bytes()),
            DType::Float32 => v.extend_from_slice(&(f as f32).to_ne_bytes()),
            DType::Float64 => v.extend_from_slice(&f.to_ne_bytes()),
            _ => v.extend_from_slice(&x.to_ne_bytes()[..dt.size()]),
        }
    }
    v
}

fn dec(dt: DType, b: &[u8]) -> (i128, f64) {
    match dt {
        DType::Float16 => (0, f16::from_ne_bytes(b.try_into().unwrap()).to_f64()),
        DType::Bfloat16 => (0, bf16::from_ne_bytes(b.try_into().unwrap()).to_f64()),
        DType::Float32 => (0, f32::from_ne_bytes(b.try_into().unwrap()) as f64),
        DType::Float64 => (0, f64::from_ne_bytes(b.try_into().unwrap())),
        DType::Int8 => (i8::from_ne_bytes(b.try_into().unwrap()) as i128, 0.0),
        DType::Uint8 => (b[0] as i128, 0.0),
        DType::Int32 => (i32::from_ne_bytes(b.try_into().unwrap()) as i128, 0.0),
        DType::Uint32 => (u32::from_ne_bytes(b.try_into().unwrap()) as i128, 0.0),
        DType::Int64 => (i64::from_ne_bytes(b.try_into().unwrap()) as i128, 0.0),
        DType::Uint64 => (u64::from_ne_bytes(b.try_into().unwrap()) as i128, 0.0),
    }
}

/// Wraps an integer into `dt`'s range (two's complement), returned as a value of that type.
fn wrap(dt: DType, x: i128) -> i128 {
    match dt {
        DType::Int8 => x as i8 as i128,
        DType::Uint8 => x as u8 as i128,
        DType::Int32 => x as i32 as i128,
        DType::Uint32 => x as u32 as i128,
        DType::Int64 => x as i64 as i128,
        _ => x as u64 as i128,
    }
}

fn enc(dt: DType, i: i128, f: f64) -> Vec<u8> {
    match dt {
        DType::Float16 => f16::from_f32(f as f32).to_ne_bytes().to_vec(),
        DType::Bfloat16 => bf16::from_f32(f as f32).to_ne_bytes().to_vec(),
        DType::Float32 => (f as f32).to_ne_bytes().to_vec(),
        DType::Float64 => f.to_ne_bytes().to_vec(),
        _ => (i as u64).to_ne_bytes()[..dt.size()].to_vec(),
    }
}

/// Element-wise reduction of `inputs` (one per rank), the obvious way.
fn reference(dt: DType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
    let esz = dt.size();
    let n = inputs.len();
    let count = inputs[0].len() / esz;
    let mut out = Vec::with_capacity(inputs[0].len());
    for e in 0..count {
        let vals: Vec<(i128, f64)> = inputs
            .iter()
            .map(|v| dec(dt, &v[e * esz..(e + 1) * esz]))
            .collect();
        let (i, f) = if dt.is_float() {
            let fs = vals.iter().map(|v| v.1);
            let f = match op {
                ReduceOp::Sum => fs.sum::<f64>(),
                ReduceOp::Avg if dt == DType::Float64 => fs.sum::<f64>() / n as f64,
                ReduceOp::Avg => (fs.sum::<f64>() as f32 / n as f32) as f64,
                ReduceOp::Prod => fs.product(),
                ReduceOp::Max => fs.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => fs.fold(f64::INFINITY, f64::min),
                _ => unreachable!(),
            };
            (0, f)
        } else {
            let is = vals.iter().map(|v| v.0);
            let i = match op {
                ReduceOp::Sum => wrap(dt, is.sum()),
                ReduceOp::Avg => wrap(dt, is.sum()) / n as i128,
                ReduceOp::Prod => is.fold(1i128, |a, b| wrap(dt, a.wrapping_mul(b))),
                ReduceOp::Max => is.max().unwrap(),
                ReduceOp::Min => is.min().unwrap(),
                ReduceOp::Band => is.fold(-1, |a, b| a & b),
                ReduceOp::Bor => is.fold(0, |a, b| a | b),
                ReduceOp::Bxor => is.fold(0, |a, b| a ^ b),
            };
            (wrap(dt, i), 0.0)
        };
        out.extend(enc(dt, i, f));
    }
    out
}

fn assert_all_eq(outs: &[Vec<u8>], want: &[u8], what: &str) {
    for (r, o) in outs.iter().enumerate() {
        if o != want {
            let first = o.iter().zip(want).position(|(a, b)| a != b);
            panic!(
                "{what}: rank {r} differs (len {} vs {}, first diff at byte {first:?})",
                o.len(),
                want.len()
            );
        }
    }
}

const MAIN_OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg];

/// (dtype, op) pairs: SUM/MAX/AVG for every dtype, plus the remaining ops for a few dtypes.
fn op_matrix() -> Vec<(DType, ReduceOp)> {
    let mut v: Vec<(DType, ReduceOp)> = DType::ALL
        .iter()
        .flat_map(|&d| MAIN_OPS.iter().map(move |&o| (d, o)))
        .collect();
    for d in [
        DType::Int8,
        DType::Uint32,
        DType::Int64,
        DType::Float16,
        DType::Float64,
    ] {
        for o in [
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Band,
            ReduceOp::Bor,
            ReduceOp::Bxor,
        ] {
            if o.valid_for(d) {
                v.push((d, o));
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------- allreduce

fn check_allreduce(
    n: usize,
    dt: DType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    algo: Option<allreduce::Algo>,
) {
    check_allreduce_on(n, None, dt, op, count, in_place, algo)
}

/// `run_ok`, on hosts when `hosts` is given.
fn run_ok_on<R: Send>(
    n: usize,
    hosts: Option<&[usize]>,
    f: impl Fn(&dyn Link) -> crate::Result<R> + Sync,
) -> Vec<R> {
    match hosts {
        Some(h) => {
            assert_eq!(h.len(), n);
            run_ok_hosts(h, f)
        }
        None => run_ok(n, f),
    }
}

fn check_allreduce_on(
    n: usize,
    hosts: Option<&[usize]>,
    dt: DType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    algo: Option<allreduce::Algo>,
) {
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|r| input(dt, op, count, seed(&[r, count, dt as usize, op as usize])))
        .collect();
    let want = reference(dt, op, &inputs);
    let outs = run_ok_on(n, hosts, |l| {
        let mine = &inputs[l.rank()];
        let mut recv = if in_place {
            mine.clone()
        } else {
            vec![0xEE; mine.len()]
        };
        let send = (!in_place).then_some(&mine[..]);
        match algo {
            Some(a) => allreduce::allreduce_with(l, send, &mut recv, dt, op, a)?,
            None => allreduce(l, send, &mut recv, dt, op)?,
        }
        Ok(recv)
    });
    assert_all_eq(
        &outs,
        &want,
        &format!("allreduce n={n} hosts={hosts:?} {dt:?} {op:?} count={count} in_place={in_place} {algo:?}"),
    );
}

#[test]
fn allreduce_all_algorithms_small_counts() {
    use allreduce::Algo;
    for n in SIZES {
        for (dt, op) in op_matrix() {
            for count in [0, 1, 7, 123] {
                for algo in [Algo::Direct, Algo::Ring { seg: 24 }] {
                    let in_place = (n + count + dt as usize).is_multiple_of(2);
                    check_allreduce(n, dt, op, count, in_place, Some(algo));
                }
            }
        }
    }
}

#[test]
fn allreduce_public_dispatch_large() {
    // ~100 KB per rank: above ALLREDUCE_SMALL_BYTES, so the ring with real segments runs.
    for (i, n) in [2usize, 3, 5, 8].into_iter().enumerate() {
        for (j, dt) in DType::ALL.into_iter().enumerate() {
            let op = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max][(i + j) % 3];
            let count = 100_003 / dt.size();
            check_allreduce(n, dt, op, count, (i + j) % 2 == 0, None);
        }
    }
    // Just below and above the threshold.
    let c = tuning::ALLREDUCE_SMALL_BYTES / 4;
    check_allreduce(3, DType::Float32, ReduceOp::Sum, c, false, None);
    check_allreduce(3, DType::Float32, ReduceOp::Sum, c + 1, true, None);
}

/// General (inexact) floats: results depend on the reduction order, so this checks that every
/// rank gets the same bits, every time, whatever the message timing.
#[test]
fn allreduce_inexact_floats_bitwise_identical_and_repeatable() {
    use allreduce::Algo;
    for n in [3usize, 6, 8] {
        for dt in [
            DType::Float32,
            DType::Float16,
            DType::Bfloat16,
            DType::Float64,
        ] {
            for algo in [Algo::Direct, Algo::Ring { seg: 40 }] {
                let count = 301;
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|r| {
                        let mut rg = Rng(seed(&[r, 77]));
                        (0..count)
                            .flat_map(|_| {
                                let f = (rg.next() % 1_000_000) as f64 / 997.0 - 500.0;
                                match dt {
                                    DType::Float32 => (f as f32).to_ne_bytes().to_vec(),
                                    DType::Float64 => f.to_ne_bytes().to_vec(),
                                    DType::Float16 => f16::from_f64(f).to_ne_bytes().to_vec(),
                                    _ => bf16::from_f64(f).to_ne_bytes().to_vec(),
                                }
                            })
                            .collect()
                    })
                    .collect();
                let mut first: Option<Vec<u8>> = None;
                for rep in 0..3 {
                    let outs = run_ok(n, |l| {
                        let mut recv = inputs[l.rank()].clone();
                        let send = inputs[l.rank()].clone();
                        // Mix in-place and out-of-place ranks in one call.
                        if (l.rank() + rep) % 2 == 0 {
                            allreduce::allreduce_with(l, None, &mut recv, dt, ReduceOp::Sum, algo)?;
                        } else {
                            allreduce::allreduce_with(
                                l,
                                Some(&send),
                                &mut recv,
                                dt,
                                ReduceOp::Sum,
                                algo,
                            )?;
                        }
                        Ok(recv)
                    });
                    let want = first.get_or_insert_with(|| outs[0].clone()).clone();
                    assert_all_eq(
                        &outs,
                        &want,
                        &format!("inexact {dt:?} n={n} {algo:?} rep={rep}"),
                    );
                }
            }
        }
    }
}

#[test]
fn half_precision_rounds_once() {
    // 2048 + 1 + 1 + ... : rounding after each step in f16 would stick at 2048.
    use allreduce::Algo;
    for algo in [Algo::Direct, Algo::Ring { seg: 2 }] {
        let n = 5;
        let outs = run_ok(n, |l| {
            let v = if l.rank() == 0 { 2048.0f32 } else { 1.0 };
            let mut buf: Vec<u8> = (0..10)
                .flat_map(|_| f16::from_f32(v).to_ne_bytes())
                .collect();
            allreduce::allreduce_with(l, None, &mut buf, DType::Float16, ReduceOp::Sum, algo)?;
            Ok(buf)
        });
        let want: Vec<u8> = (0..10)
            .flat_map(|_| f16::from_f32(2052.0).to_ne_bytes())
            .collect();
        assert_all_eq(&outs, &want, &format!("f16 single rounding {algo:?}"));
    }
}

// ------------------------------------------------------------------------------------- reduce

fn check_reduce(
    n: usize,
    root: usize,
    dt: DType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
    algo: Option<reduce_coll::Algo>,
) {
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|r| input(dt, op, count, seed(&[r, count, op as usize, 5])))
        .collect();
    let want = reference(dt, op, &inputs);
    let cb = count * dt.size();
    let outs = run_ok(n, |l| {
        let mine = &inputs[l.rank()];
        if l.rank() != root {
            match algo {
                Some(a) => reduce_coll::reduce_with(l, Some(mine), None, cb, dt, op, root, a)?,
                None => reduce(l, Some(mine), None, cb, dt, op, root)?,
            }
            return Ok(None);
        }
        let mut recv = if in_place {
            mine.clone()
        } else {
            vec![0xEE; cb]
        };
        let send = (!in_place).then_some(&mine[..]);
        match algo {
            Some(a) => reduce_coll::reduce_with(l, send, Some(&mut recv), cb, dt, op, root, a)?,
            None => reduce(l, send, Some(&mut recv), cb, dt, op, root)?,
        }
        Ok(Some(recv))
    });
    let got = outs[root].clone().unwrap();
    assert_all_eq(
        &[got],
        &want,
        &format!("reduce n={n} root={root} {dt:?} {op:?} count={count} {algo:?}"),
    );
}

#[test]
fn reduce_all_algorithms_small_counts() {
    use reduce_coll::Algo;
    for n in SIZES {
        for (k, (dt, op)) in op_matrix().into_iter().enumerate() {
            for count in [0, 1, 7, 123] {
                for algo in [Algo::Tree, Algo::Ring { seg: 24 }] {
                    let root = (k + count) % n;
                    check_reduce(n, root, dt, op, count, (k + count / 2) % 2 == 0, Some(algo));
                }
            }
        }
    }
}

#[test]
fn reduce_public_dispatch_large() {
    for (i, n) in [2usize, 3, 7].into_iter().enumerate() {
        for (j, dt) in [DType::Int8, DType::Float16, DType::Float32, DType::Bfloat16]
            .into_iter()
            .enumerate()
        {
            let op = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min][(i + j) % 3];
            let count = (tuning::REDUCE_SMALL_BYTES + 1003) / dt.size();
            check_reduce(n, (i + 2 * j) % n, dt, op, count, j % 2 == 0, None);
        }
    }
}

// ----------------------------------------------------------------------------- reduce_scatter

fn check_reduce_scatter(
    n: usize,
    dt: DType,
    op: ReduceOp,
    block_elems: usize,
    in_place: bool,
    algo: Option<reduce_scatter::Algo>,
) {
    let inputs: Vec<Vec<u8>> = (0..n)
        .map(|r| {
            input(
                dt,
                op,
                n * block_elems,
                seed(&[r, block_elems, op as usize, 9]),
            )
        })
        .collect();
    let full = reference(dt, op, &inputs);
    let block = block_elems * dt.size();
    let outs = run_ok(n, |l| {
        let r = l.rank();
        let mut mine = inputs[r].clone();
        let mut recv = vec![0xEE; block];
        let bufs = if in_place {
            ReduceScatterBufs::InPlace(&mut mine)
        } else {
            ReduceScatterBufs::Separate {
                send: &inputs[r],
                recv: &mut recv,
            }
        };
        match algo {
            Some(a) => reduce_scatter::reduce_scatter_with(l, bufs, dt, op, a)?,
            None => reduce_scatter(l, bufs, dt, op)?,
        }
        Ok(if in_place {
            mine[r * block..(r + 1) * block].to_vec()
        } else {
            recv
        })
    });
    for (r, o) in outs.iter().enumerate() {
        assert_all_eq(
            std::slice::from_ref(o),
            &full[r * block..(r + 1) * block],
            &format!("reduce_scatter n={n} rank {r} {dt:?} {op:?} block={block_elems} in_place={in_place} {algo:?}"),
        );
    }
}

#[test]
fn reduce_scatter_all_algorithms_small_counts() {
    use reduce_scatter::Algo;
    for n in SIZES {
        for (k, (dt, op)) in op_matrix().into_iter().enumerate() {
            for block in [0, 1, 7, 61] {
                for algo in [Algo::Direct, Algo::Tree, Algo::Ring { seg: 16 }] {
                    check_reduce_scatter(n, dt, op, block, (k + block + n) % 2 == 0, Some(algo));
                }
            }
        }
    }
}

#[test]
fn reduce_scatter_public_dispatch_large() {
    for (i, n) in [2usize, 3, 8].into_iter().enumerate() {
        for (j, dt) in [DType::Uint8, DType::Float16, DType::Float64, DType::Int32]
            .into_iter()
            .enumerate()
        {
            let op = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max][(i + j) % 3];
            let block = 100_003 / n / dt.size();
            check_reduce_scatter(n, dt, op, block, (i + j) % 2 == 1, None);
        }
    }
}

#[test]
fn reduce_scatter_large_groups_small_and_large_inputs() {
    for (i, n) in [13usize, 33, 64].into_iter().enumerate() {
        for (j, (dt, op)) in [(DType::Float32, ReduceOp::Sum), (DType::Bfloat16, ReduceOp::Avg), (DType::Int64, ReduceOp::Min)].into_iter().enumerate() {
            // Small (the tree, below REDUCE_SCATTER_SMALL_BYTES) and large (the ring).
            for block in [3usize, 70_000 / n / dt.size() + 1] {
                check_reduce_scatter(n, dt, op, block, (i + j) % 2 == 0, None);
            }
        }
    }
    assert_eq!(tuning::reduce_scatter(64, 64 << 10), reduce_scatter::Algo::Tree);
    assert_eq!(tuning::reduce_scatter(8, 64 << 10), reduce_scatter::Algo::Direct);
}

// ---------------------------------------------------------------------------------- broadcast

#[test]
fn broadcast_all_sizes_roots_algorithms() {
    use broadcast::Algo;
    for n in SIZES {
        for root in 0..n {
            for len in [0usize, 1, 7, 1000] {
                for algo in [None, Some(Algo::Tree), Some(Algo::Chain { seg: 100 })] {
                    let data = bytes(len, seed(&[n, root, len]));
                    let outs = run_ok(n, |l| {
                        let mut buf = if l.rank() == root {
                            data.clone()
                        } else {
                            vec![0xEE; len]
                        };
                        match algo {
                            Some(a) => broadcast::broadcast_with(l, &mut buf, root, a)?,
                            None => broadcast(l, &mut buf, root)?,
                        }
                        Ok(buf)
                    });
                    assert_all_eq(
                        &outs,
                        &data,
                        &format!("broadcast n={n} root={root} len={len} {algo:?}"),
                    );
                }
            }
        }
    }
}

#[test]
fn broadcast_large_chain() {
    for (n, root) in [(3usize, 1usize), (8, 5), (2, 0)] {
        let len = tuning::BROADCAST_SMALL_BYTES + 100_003;
        let data = bytes(len, seed(&[n, root]));
        let outs = run_ok(n, |l| {
            let mut buf = if l.rank() == root {
                data.clone()
            } else {
                vec![0; len]
            };
            broadcast(l, &mut buf, root)?;
            Ok(buf)
        });
        assert_all_eq(&outs, &data, &format!("broadcast large n={n}"));
    }
}

// ---------------------------------------------------------------------------------- allgather

#[test]
fn allgather_all_sizes_algorithms() {
    use allgather::Algo;
    for n in SIZES.chain([13, 16, 33, 64]) {
        for block in [0usize, 1, 7, 1000, 300_007 / n] {
            let algos: &[Option<Algo>] = if block > 1000 {
                &[None]
            } else {
                &[None, Some(Algo::Direct), Some(Algo::Bruck), Some(Algo::Ring)]
            };
            for &algo in algos {
                for in_place in [false, true] {
                    let blocks: Vec<Vec<u8>> =
                        (0..n).map(|r| bytes(block, seed(&[r, block]))).collect();
                    let want = blocks.concat();
                    let outs = run_ok(n, |l| {
                        let r = l.rank();
                        let mut recv = vec![0xEE; n * block];
                        let send = if in_place {
                            recv[r * block..(r + 1) * block].copy_from_slice(&blocks[r]);
                            None
                        } else {
                            Some(&blocks[r][..])
                        };
                        match algo {
                            Some(a) => allgather::allgather_with(l, send, &mut recv, block, a)?,
                            None => allgather(l, send, &mut recv)?,
                        }
                        Ok(recv)
                    });
                    assert_all_eq(
                        &outs,
                        &want,
                        &format!("allgather n={n} block={block} {algo:?} in_place={in_place}"),
                    );
                }
            }
        }
    }
}

#[test]
fn ring_allgather_cuts_large_blocks_into_segments() {
    use super::tuning::RING_SEGMENT_BYTES;
    // Two and a bit segments per block, so the last segment is short.
    let n = 2;
    let block = 2 * RING_SEGMENT_BYTES + 1000;
    let blocks: Vec<Vec<u8>> = (0..n).map(|r| bytes(block, seed(&[r, block]))).collect();
    let want = blocks.concat();
    let outs = run_ok(n, |l| {
        let r = l.rank();
        let mut recv = vec![0xEE; n * block];
        allgather::allgather_with(l, Some(&blocks[r][..]), &mut recv, block, allgather::Algo::Ring)?;
        Ok(recv)
    });
    assert_all_eq(&outs, &want, "ring allgather of blocks above the segment size");
}

#[test]
fn allgatherv_uneven_permuted_with_gaps() {
    use allgather::Algo;
    for n in SIZES.chain([13, 16, 33, 64]) {
        for scale in [0usize, 1, 13, 40_000 / n] {
            // Counts vary (some zero); blocks laid out in reverse rank order with gaps.
            let counts: Vec<usize> = (0..n)
                .map(|i| {
                    if i % 3 == 1 {
                        0
                    } else {
                        scale * (i + 1) / 2 + i % 2
                    }
                })
                .collect();
            let mut displs = vec![0; n];
            let mut at = 5;
            for i in (0..n).rev() {
                displs[i] = at;
                at += counts[i] + 3;
            }
            let total = at;
            let blocks: Vec<Vec<u8>> = (0..n)
                .map(|r| bytes(counts[r], seed(&[r, scale, 3])))
                .collect();
            for algo in [None, Some(Algo::Direct), Some(Algo::Bruck), Some(Algo::Ring)] {
                for in_place in [false, true] {
                    let outs = run_ok(n, |l| {
                        let r = l.rank();
                        let mut recv = vec![0xEE; total];
                        let send = if in_place {
                            recv[displs[r]..displs[r] + counts[r]].copy_from_slice(&blocks[r]);
                            None
                        } else {
                            Some(&blocks[r][..])
                        };
                        match algo {
                            Some(a) => {
                                let ranges: Vec<_> =
                                    (0..n).map(|i| displs[i]..displs[i] + counts[i]).collect();
                                allgather::allgatherv_with(l, send, &mut recv, &ranges, a)?
                            }
                            None => allgatherv(l, send, &mut recv, &counts, &displs)?,
                        }
                        Ok(recv)
                    });
                    let mut want = vec![0xEE; total];
                    for i in 0..n {
                        want[displs[i]..displs[i] + counts[i]].copy_from_slice(&blocks[i]);
                    }
                    assert_all_eq(
                        &outs,
                        &want,
                        &format!("allgatherv n={n} scale={scale} {algo:?}"),
                    );
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------- gather/scatter

#[test]
fn gather_scatter_all_sizes_roots() {
    for n in SIZES {
        for root in 0..n {
            for block in [0usize, 1, 7, 1000] {
                let blocks: Vec<Vec<u8>> = (0..n)
                    .map(|r| bytes(block, seed(&[r, root, block])))
                    .collect();
                let all = blocks.concat();
                let outs = run_ok(n, |l| {
                    let mut recv = (l.rank() == root).then(|| vec![0xEE; n * block]);
                    gather(l, &blocks[l.rank()], recv.as_deref_mut(), root)?;
                    Ok(recv)
                });
                assert_eq!(
                    outs[root].as_ref().unwrap(),
                    &all,
                    "gather n={n} root={root} block={block}"
                );
                let outs = run_ok(n, |l| {
                    let mut recv = vec![0xEE; block];
                    scatter(l, (l.rank() == root).then_some(&all[..]), &mut recv, root)?;
                    Ok(recv)
                });
                for (r, o) in outs.iter().enumerate() {
                    assert_eq!(
                        o, &blocks[r],
                        "scatter n={n} root={root} block={block} rank {r}"
                    );
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------- alltoall

#[test]
fn alltoall_all_sizes() {
    for n in SIZES.chain([13, 16, 33, 64]) {
        for block in [0usize, 1, 7, 1000, 100_003 / n / n] {
            let sends: Vec<Vec<u8>> = (0..n)
                .map(|r| bytes(n * block, seed(&[r, block, 11])))
                .collect();
            let outs = run_ok(n, |l| {
                let mut recv = vec![0xEE; n * block];
                alltoall(l, &sends[l.rank()], &mut recv)?;
                Ok(recv)
            });
            for (r, o) in outs.iter().enumerate() {
                let want: Vec<u8> = (0..n)
                    .flat_map(|j| sends[j][r * block..(r + 1) * block].to_vec())
                    .collect();
                assert_eq!(o, &want, "alltoall n={n} block={block} rank {r}");
            }
        }
    }
}

#[test]
fn alltoall_bruck_all_sizes() {
    for n in LARGE.into_iter().chain([4, 6, 7]) {
        for block in [1usize, 7, 300] {
            let sends: Vec<Vec<u8>> = (0..n).map(|r| bytes(n * block, seed(&[r, block, 12]))).collect();
            let outs = run_ok(n, |l| {
                let mut recv = vec![0xEE; n * block];
                alltoall::bruck(l, &sends[l.rank()], &mut recv, block)?;
                Ok(recv)
            });
            for (r, o) in outs.iter().enumerate() {
                let want: Vec<u8> = (0..n).flat_map(|j| sends[j][r * block..(r + 1) * block].to_vec()).collect();
                assert_eq!(o, &want, "bruck alltoall n={n} block={block} rank {r}");
            }
        }
    }
}

#[test]
fn alltoallv_uneven() {
    for n in SIZES {
        for scale in [0usize, 1, 9, 2000] {
            // count(i -> j) bytes from rank i to rank j.
            let cnt = |i: usize, j: usize| {
                if (i + j) % 4 == 3 {
                    0
                } else {
                    scale * ((i * 3 + j) % 5) + (i + j) % 2
                }
            };
            let res = run_ok(n, |l| {
                let r = l.rank();
                // Send blocks in reverse order with a gap; receive blocks in order with gaps.
                let scounts: Vec<usize> = (0..n).map(|j| cnt(r, j)).collect();
                let mut sdispls = vec![0; n];
                let mut at = 2;
                for j in (0..n).rev() {
                    sdispls[j] = at;
                    at += scounts[j] + 1;
                }
                let mut send = vec![0u8; at];
                for j in 0..n {
                    send[sdispls[j]..sdispls[j] + scounts[j]]
                        .copy_from_slice(&bytes(scounts[j], seed(&[r, j, scale])));
                }
                let rcounts: Vec<usize> = (0..n).map(|i| cnt(i, r)).collect();
                let mut rdispls = vec![0; n];
                let mut at = 1;
                for i in 0..n {
                    rdispls[i] = at;
                    at += rcounts[i] + 2;
                }
                let mut recv = vec![0xEE; at];
                alltoallv(l, &send, &scounts, &sdispls, &mut recv, &rcounts, &rdispls)?;
                Ok((recv, rcounts, rdispls))
            });
            for (r, (recv, rc, rd)) in res.iter().enumerate() {
                for i in 0..n {
                    assert_eq!(
                        &recv[rd[i]..rd[i] + rc[i]],
                        &bytes(rc[i], seed(&[i, r, scale]))[..],
                        "alltoallv n={n} {i}->{r}"
                    );
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------ barrier

#[test]
fn barrier_all_sizes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for n in SIZES {
        for round in 0..3 {
            let arrived = AtomicUsize::new(0);
            run_ok(n, |l| {
                if l.rank() == round % n {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                arrived.fetch_add(1, Ordering::SeqCst);
                barrier(l)?;
                assert_eq!(
                    arrived.load(Ordering::SeqCst),
                    n,
                    "rank {} left the barrier early",
                    l.rank()
                );
                Ok(())
            });
        }
    }
}

// ------------------------------------------------------------------------------------- errors

#[test]
fn invalid_arguments_fail_before_sending() {
    let n = 3;
    let st = |r: Vec<crate::Result<()>>| {
        r.into_iter()
            .map(|x| x.err().map(|e| e.status))
            .collect::<Vec<_>>()
    };
    let inv = vec![Some(Status::InvalidArgument); n];
    // Each case fails locally on every rank (where only the root could tell, the others are
    // given the same bad arguments on purpose), and no rank may have sent anything.
    type Case<'a> = (&'a str, Box<dyn Fn(&dyn Link) -> crate::Result<()> + Sync>);
    let cases: Vec<Case> = vec![
        (
            "allreduce len",
            Box::new(|l| {
                allreduce(
                    l,
                    Some(&[0u8; 8]),
                    &mut [0u8; 4],
                    DType::Int32,
                    ReduceOp::Sum,
                )
            }),
        ),
        (
            "allreduce elems",
            Box::new(|l| allreduce(l, None, &mut [0u8; 6], DType::Int32, ReduceOp::Sum)),
        ),
        (
            "allreduce op",
            Box::new(|l| allreduce(l, None, &mut [0u8; 8], DType::Float32, ReduceOp::Bxor)),
        ),
        (
            "broadcast root",
            Box::new(|l| broadcast(l, &mut [0u8; 8], 3)),
        ),
        (
            "reduce root",
            Box::new(|l| {
                reduce(
                    l,
                    Some(&[0u8; 4]),
                    Some(&mut [0u8; 4]),
                    4,
                    DType::Int32,
                    ReduceOp::Sum,
                    7,
                )
            }),
        ),
        (
            "reduce count",
            Box::new(|l| {
                reduce(
                    l,
                    Some(&[0u8; 4]),
                    Some(&mut [0u8; 4]),
                    8,
                    DType::Int32,
                    ReduceOp::Sum,
                    0,
                )
            }),
        ),
        (
            "allgather len",
            Box::new(|l| allgather(l, Some(&[0u8; 4]), &mut [0u8; 11])),
        ),
        (
            "allgather in place",
            Box::new(|l| allgather(l, None, &mut [0u8; 10])),
        ),
        (
            "allgatherv bounds",
            Box::new(|l| allgatherv(l, None, &mut [0u8; 10], &[4, 4, 4], &[0, 4, 8])),
        ),
        (
            "allgatherv overlap",
            Box::new(|l| allgatherv(l, None, &mut [0u8; 10], &[4, 4, 2], &[0, 3, 8])),
        ),
        (
            "allgatherv counts",
            Box::new(|l| allgatherv(l, None, &mut [0u8; 10], &[4, 4], &[0, 4])),
        ),
        (
            "gather root",
            Box::new(|l| gather(l, &[0u8; 4], Some(&mut [0u8; 12]), 3)),
        ),
        // Only the root can tell; the others stand in with the same status instead of waiting.
        (
            "scatter root buf",
            Box::new(|l| match l.rank() {
                0 => scatter(l, Some(&[0u8; 11]), &mut [0u8; 4], 0),
                _ => Err(crate::err!(Status::InvalidArgument, "stand-in")),
            }),
        ),
        (
            "gather root recv",
            Box::new(|l| match l.rank() {
                1 => gather(l, &[0u8; 4], Some(&mut [0u8; 11]), 1),
                _ => Err(crate::err!(Status::InvalidArgument, "stand-in")),
            }),
        ),
        (
            "reduce root recv",
            Box::new(|l| match l.rank() {
                2 => reduce(l, None, None, 4, DType::Int32, ReduceOp::Sum, 2),
                _ => Err(crate::err!(Status::InvalidArgument, "stand-in")),
            }),
        ),
        (
            "reduce_scatter len",
            Box::new(|l| {
                reduce_scatter(
                    l,
                    ReduceScatterBufs::Separate {
                        send: &[0u8; 8],
                        recv: &mut [0u8; 4],
                    },
                    DType::Int32,
                    ReduceOp::Sum,
                )
            }),
        ),
        (
            "reduce_scatter in place",
            Box::new(|l| {
                reduce_scatter(
                    l,
                    ReduceScatterBufs::InPlace(&mut [0u8; 8]),
                    DType::Int32,
                    ReduceOp::Sum,
                )
            }),
        ),
        (
            "reduce_scatter elems",
            Box::new(|l| {
                reduce_scatter(
                    l,
                    ReduceScatterBufs::InPlace(&mut [0u8; 6]),
                    DType::Int32,
                    ReduceOp::Sum,
                )
            }),
        ),
        (
            "alltoall len",
            Box::new(|l| alltoall(l, &[0u8; 10], &mut [0u8; 10])),
        ),
        (
            "alltoall recv len",
            Box::new(|l| alltoall(l, &[0u8; 9], &mut [0u8; 6])),
        ),
        (
            "alltoallv self",
            Box::new(|l| {
                alltoallv(
                    l,
                    &[0u8; 9],
                    &[3, 3, 3],
                    &[0, 3, 6],
                    &mut [0u8; 9],
                    &[2, 2, 2],
                    &[0, 3, 6],
                )
            }),
        ),
        (
            "alltoallv recv overlap",
            Box::new(|l| {
                alltoallv(
                    l,
                    &[0u8; 9],
                    &[3, 3, 3],
                    &[0, 3, 6],
                    &mut [0u8; 9],
                    &[3, 3, 3],
                    &[0, 2, 6],
                )
            }),
        ),
        (
            "alltoallv send bounds",
            Box::new(|l| {
                alltoallv(
                    l,
                    &[0u8; 9],
                    &[3, 3, 3],
                    &[0, 3, 7],
                    &mut [0u8; 9],
                    &[3, 3, 3],
                    &[0, 3, 6],
                )
            }),
        ),
    ];
    for (what, f) in &cases {
        let (res, sent) = run_counting(n, |l| f(l));
        assert_eq!(st(res), inv, "{what}");
        assert_eq!(sent, 0, "{what}: messages were sent");
    }
}

#[test]
fn mismatched_lengths_are_reported() {
    // Rank 1 gathers a different block size: the root sees a Mismatch naming rank 1.
    let res = run(3, |l| {
        let block = if l.rank() == 1 { 3 } else { 4 };
        let mut recv = (l.rank() == 0).then(|| vec![0u8; 12]);
        gather(l, &vec![1u8; block], recv.as_deref_mut(), 0)
    });
    let e = res[0].clone().unwrap_err();
    assert_eq!(e.status, Status::Mismatch, "{e}");
    assert!(e.msg.contains("rank 1"), "{e}");
    // Direct allreduce where one rank's count is smaller.
    let res = run(3, |l| {
        let mut buf = vec![0u8; if l.rank() == 2 { 8 } else { 16 }];
        allreduce::allreduce_with(
            l,
            None,
            &mut buf,
            DType::Int32,
            ReduceOp::Sum,
            allreduce::Algo::Direct,
        )
    });
    assert!(
        res[0].is_err() && res[1].is_err() && res[2].is_err(),
        "{res:?}"
    );
    assert_eq!(res[0].clone().unwrap_err().status, Status::Mismatch);
}

// ------------------------------------------------------------------- large groups, hierarchy

/// Group sizes for the large-group algorithms (trees, tree gathers): powers of two, one off
/// them, primes.
const LARGE: [usize; 9] = [1, 2, 3, 5, 8, 13, 16, 33, 64];

/// Three hosts of 1, 4 and 5 ranks, interleaved: host 0 = {4}, host 1 = {1, 5, 7, 8},
/// host 2 = {0, 2, 3, 6, 9}.
const HOSTS_1_4_5: [usize; 10] = [2, 1, 2, 2, 0, 1, 2, 1, 1, 2];

/// Other placements: two hosts alternating, four hosts round-robin (32 ranks), one lone rank
/// beside a host of six, hosts with arbitrary ids.
fn placements() -> Vec<Vec<usize>> {
    vec![
        HOSTS_1_4_5.to_vec(),
        (0..8).map(|r| r % 2).collect(),
        (0..32).map(|r| r % 4).collect(),
        vec![7, 7, 7, 3, 7, 7, 7],
        vec![90, 5, 5, 90, 12, 12, 5, 90, 12, 5, 5],
    ]
}

#[test]
fn tuning_keeps_small_groups_and_switches_large_ones() {
    use tuning::*;
    for n in 2..=DIRECT_MAX_RANKS {
        assert_eq!(tuning::allreduce(n, 16), allreduce::Algo::Direct);
        assert_eq!(tuning::allreduce(n, ALLREDUCE_SMALL_BYTES), allreduce::Algo::Direct);
        assert!(matches!(tuning::allreduce(n, ALLREDUCE_SMALL_BYTES + 4), allreduce::Algo::Ring { .. }));
        assert_eq!(tuning::barrier(n), barrier::Algo::Dissemination);
        assert_eq!(tuning::gather(n), gather::Algo::Direct);
        assert_eq!(tuning::reduce(n, REDUCE_SMALL_BYTES), reduce_coll::Algo::Tree);
        assert!(matches!(tuning::reduce(n, REDUCE_SMALL_BYTES + 4), reduce_coll::Algo::Ring { .. }));
    }
    for n in [9, 16, 256, 1024] {
        assert_eq!(tuning::allreduce(n, 16), allreduce::Algo::Tree);
        assert_eq!(tuning::barrier(n), barrier::Algo::Tree);
        assert_eq!(tuning::gather(n), gather::Algo::Tree);
        let t = allreduce_tree_max_bytes(n);
        assert!(t > ALLREDUCE_SMALL_BYTES, "n={n}: {t}");
        assert_eq!(tuning::allreduce(n, t), allreduce::Algo::Tree);
        assert!(matches!(tuning::allreduce(n, t + 4), allreduce::Algo::Ring { .. }));
    }
    // The fd target's 1 MiB allreduce at 256 and 1024 ranks runs on the tree.
    assert_eq!(tuning::allreduce(256, 1 << 20), allreduce::Algo::Tree);
    assert_eq!(tuning::allreduce(1024, 1 << 20), allreduce::Algo::Tree);
    assert!(matches!(tuning::allreduce(1024, 64 << 20), allreduce::Algo::Ring { .. }));
    assert_eq!(tuning::broadcast(1024, 4 << 20, false), broadcast::Algo::Tree);
    assert!(matches!(tuning::broadcast(8, 4 << 20, false), broadcast::Algo::Chain { .. }));
    assert_eq!(tuning::broadcast(8, 4 << 20, true), broadcast::Algo::Tree, "a crowded host takes the tree");
    assert_eq!(tuning::allgather(8, 1000), allgather::Algo::Direct);
    assert_eq!(tuning::allgather(9, 1000), allgather::Algo::Bruck);
    assert_eq!(tuning::allgather(1024, ALLGATHER_SMALL_BYTES + 1), allgather::Algo::Ring);
    assert!(!alltoall_bruck(8, 16) && alltoall_bruck(9, 16) && !alltoall_bruck(9, ALLTOALL_BRUCK_MAX_BLOCK + 1));
    assert_eq!(ceil_log2(1), 0);
    assert_eq!(ceil_log2(2), 1);
    assert_eq!(ceil_log2(5), 3);
    assert_eq!(ceil_log2(1024), 10);
}

#[test]
fn allreduce_tree_all_sizes() {
    for n in LARGE {
        let counts: &[usize] = if n <= 16 { &[0, 1, 7, 123] } else { &[1, 123] };
        for (dt, op) in op_matrix() {
            for &count in counts {
                let in_place = (n + count + dt as usize).is_multiple_of(2);
                check_allreduce(n, dt, op, count, in_place, Some(allreduce::Algo::Tree));
            }
        }
    }
}

#[test]
fn allreduce_large_groups_public_dispatch_and_ring() {
    for (i, n) in [13usize, 16, 33, 64].into_iter().enumerate() {
        for (j, dt) in [DType::Float32, DType::Int8, DType::Bfloat16, DType::Uint64]
            .into_iter()
            .enumerate()
        {
            let op = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max][(i + j) % 3];
            check_allreduce(n, dt, op, 5, (i + j) % 2 == 0, None);
            check_allreduce(n, dt, op, 61, (i + j) % 2 == 1, Some(allreduce::Algo::Ring { seg: 24 }));
        }
    }
    // Either side of the tree/ring threshold.
    for n in [13usize, 33] {
        let c = tuning::allreduce_tree_max_bytes(n) / 4;
        check_allreduce(n, DType::Float32, ReduceOp::Sum, c, false, None);
        check_allreduce(n, DType::Float32, ReduceOp::Sum, c + 1, true, None);
    }
}

#[test]
fn allreduce_at_256_ranks() {
    let n = 256;
    for (dt, op, count) in [
        (DType::Int32, ReduceOp::Sum, 4),
        (DType::Float16, ReduceOp::Avg, 9),
        (DType::Float64, ReduceOp::Max, 3),
    ] {
        check_allreduce(n, dt, op, count, false, None);
    }
}

#[test]
fn allreduce_hierarchical_all_ops() {
    let hosts = HOSTS_1_4_5;
    let n = hosts.len();
    for (dt, op) in op_matrix() {
        for count in [0, 1, 7, 123] {
            let in_place = (count + dt as usize).is_multiple_of(2);
            check_allreduce_on(n, Some(&hosts), dt, op, count, in_place, None);
        }
    }
    for (i, h) in placements().iter().enumerate() {
        for (j, dt) in [DType::Float32, DType::Int64, DType::Float16].into_iter().enumerate() {
            let op = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min][(i + j) % 3];
            check_allreduce_on(h.len(), Some(h), dt, op, 33, (i + j) % 2 == 0, None);
        }
    }
    // Large: rings and chains inside the levels.
    for (j, dt) in [DType::Float32, DType::Bfloat16, DType::Uint8].into_iter().enumerate() {
        let op = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max][j];
        check_allreduce_on(n, Some(&hosts), dt, op, 300_007 / dt.size(), j % 2 == 0, None);
    }
}

/// General (inexact) floats through the tree and the hierarchy: every rank gets the same bits,
/// every time, with in-place and out-of-place ranks mixed.
#[test]
fn allreduce_tree_and_hierarchy_inexact_bitwise_identical() {
    let hosts = HOSTS_1_4_5;
    let cases = [
        (13, None, Some(allreduce::Algo::Tree)),
        (33, None, Some(allreduce::Algo::Tree)),
        (hosts.len(), Some(&hosts[..]), None),
    ];
    for (n, h, algo) in cases {
        for dt in [DType::Float32, DType::Float16, DType::Bfloat16, DType::Float64] {
            for count in [301usize, 70_001] {
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|r| {
                        let mut rg = Rng(seed(&[r, 78]));
                        (0..count)
                            .flat_map(|_| {
                                let f = (rg.next() % 1_000_000) as f64 / 997.0 - 500.0;
                                match dt {
                                    DType::Float32 => (f as f32).to_ne_bytes().to_vec(),
                                    DType::Float64 => f.to_ne_bytes().to_vec(),
                                    DType::Float16 => f16::from_f64(f).to_ne_bytes().to_vec(),
                                    _ => bf16::from_f64(f).to_ne_bytes().to_vec(),
                                }
                            })
                            .collect()
                    })
                    .collect();
                let mut first: Option<Vec<u8>> = None;
                for rep in 0..2 {
                    let outs = run_ok_on(n, h, |l| {
                        let mut recv = inputs[l.rank()].clone();
                        let send = inputs[l.rank()].clone();
                        let send = ((l.rank() + rep) % 2 == 1).then_some(&send[..]);
                        match algo {
                            Some(a) => allreduce::allreduce_with(l, send, &mut recv, dt, ReduceOp::Sum, a)?,
                            None => allreduce(l, send, &mut recv, dt, ReduceOp::Sum)?,
                        }
                        Ok(recv)
                    });
                    let want = first.get_or_insert_with(|| outs[0].clone()).clone();
                    assert_all_eq(&outs, &want, &format!("inexact n={n} hosts={h:?} {dt:?} {algo:?} rep={rep}"));
                }
            }
        }
    }
}

#[test]
fn half_precision_rounds_once_in_the_tree_and_the_hierarchy() {
    let hosts = HOSTS_1_4_5;
    for (n, h, algo) in [
        (13usize, None, Some(allreduce::Algo::Tree)),
        (hosts.len(), Some(&hosts[..]), None),
    ] {
        let outs = run_ok_on(n, h, |l| {
            let v = if l.rank() == 0 { 2048.0f32 } else { 1.0 };
            let mut buf: Vec<u8> = (0..10).flat_map(|_| f16::from_f32(v).to_ne_bytes()).collect();
            match algo {
                Some(a) => allreduce::allreduce_with(l, None, &mut buf, DType::Float16, ReduceOp::Sum, a)?,
                None => allreduce(l, None, &mut buf, DType::Float16, ReduceOp::Sum)?,
            }
            Ok(buf)
        });
        let want: Vec<u8> = (0..10)
            .flat_map(|_| f16::from_f32(2048.0 + (n - 1) as f32).to_ne_bytes())
            .collect();
        assert_all_eq(&outs, &want, &format!("f16 single rounding n={n} hosts={h:?}"));
    }
}

fn check_barrier(n: usize, hosts: Option<&[usize]>, algo: Option<barrier::Algo>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    for round in 0..2 {
        let arrived = AtomicUsize::new(0);
        run_ok_on(n, hosts, |l| {
            if l.rank() == (round * 7 + 3) % n {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            arrived.fetch_add(1, Ordering::SeqCst);
            match algo {
                Some(a) => barrier::barrier_with(l, a)?,
                None => barrier(l)?,
            }
            assert_eq!(arrived.load(Ordering::SeqCst), n, "rank {} left the barrier early (n={n} hosts={hosts:?} {algo:?})", l.rank());
            Ok(())
        });
    }
}

#[test]
fn barrier_tree_and_hierarchical() {
    for n in LARGE {
        check_barrier(n, None, Some(barrier::Algo::Tree));
        check_barrier(n, None, None);
    }
    for h in placements() {
        check_barrier(h.len(), Some(&h), None);
    }
}

#[test]
fn broadcast_large_groups_and_hierarchical() {
    use broadcast::Algo;
    let mut cases: Vec<(usize, Option<Vec<usize>>)> =
        [13usize, 16, 33, 64].into_iter().map(|n| (n, None)).collect();
    cases.extend(placements().into_iter().map(|h| (h.len(), Some(h))));
    for (n, h) in &cases {
        let n = *n;
        let roots: Vec<usize> = if h.is_some() { (0..n).collect() } else { vec![0, 1, n / 2, n - 1] };
        for root in roots {
            for len in [0usize, 1, 1000] {
                let algos: &[Option<Algo>] = if h.is_some() {
                    &[None]
                } else {
                    &[None, Some(Algo::Tree), Some(Algo::Chain { seg: 100 })]
                };
                for &algo in algos {
                    let data = bytes(len, seed(&[n, root, len, 4]));
                    let outs = run_ok_on(n, h.as_deref(), |l| {
                        let mut buf = if l.rank() == root { data.clone() } else { vec![0xEE; len] };
                        match algo {
                            Some(a) => broadcast::broadcast_with(l, &mut buf, root, a)?,
                            None => broadcast(l, &mut buf, root)?,
                        }
                        Ok(buf)
                    });
                    assert_all_eq(&outs, &data, &format!("broadcast n={n} hosts={h:?} root={root} len={len} {algo:?}"));
                }
            }
        }
    }
    // Large buffers: the chain inside a host, the model's choice in a large flat group.
    let len = tuning::BROADCAST_SMALL_BYTES + 100_003;
    let data = bytes(len, 99);
    for (n, h) in [(HOSTS_1_4_5.len(), Some(&HOSTS_1_4_5[..])), (16, None)] {
        for root in [0, 6] {
            let outs = run_ok_on(n, h, |l| {
                let mut buf = if l.rank() == root { data.clone() } else { vec![0; len] };
                broadcast(l, &mut buf, root)?;
                Ok(buf)
            });
            assert_all_eq(&outs, &data, &format!("large broadcast n={n} hosts={h:?} root={root}"));
        }
    }
}

#[test]
fn reduce_large_groups_tree_and_ring_with_tree_gather() {
    use reduce_coll::Algo;
    for (i, n) in [13usize, 16, 33].into_iter().enumerate() {
        for (k, (dt, op)) in op_matrix().into_iter().enumerate().filter(|(k, _)| k % 3 == i) {
            for count in [1, 7, 123] {
                for algo in [Algo::Tree, Algo::Ring { seg: 24 }] {
                    let root = (k * 5 + count) % n;
                    check_reduce(n, root, dt, op, count, (k + count) % 2 == 0, Some(algo));
                }
            }
        }
    }
    check_reduce(64, 63, DType::Int32, ReduceOp::Sum, 100, true, Some(Algo::Tree));
    check_reduce(64, 17, DType::Float16, ReduceOp::Avg, 100, false, Some(Algo::Ring { seg: 8 }));
    // Public dispatch above the large-group threshold: ring + tree gather.
    let c = (tuning::REDUCE_SMALL_BYTES * 2) / 4;
    check_reduce(13, 5, DType::Float32, ReduceOp::Sum, c, false, None);
}

#[test]
fn gather_scatter_large_groups() {
    for n in [13usize, 16, 33, 64] {
        for root in [0, 1, n / 2, n - 1] {
            for block in [0usize, 1, 7, 1000] {
                let blocks: Vec<Vec<u8>> = (0..n).map(|r| bytes(block, seed(&[r, root, block, 6]))).collect();
                let all = blocks.concat();
                let outs = run_ok(n, |l| {
                    let mut recv = (l.rank() == root).then(|| vec![0xEE; n * block]);
                    gather(l, &blocks[l.rank()], recv.as_deref_mut(), root)?;
                    Ok(recv)
                });
                assert_eq!(outs[root].as_ref().unwrap(), &all, "gather n={n} root={root} block={block}");
                let outs = run_ok(n, |l| {
                    let mut recv = vec![0xEE; block];
                    scatter(l, (l.rank() == root).then_some(&all[..]), &mut recv, root)?;
                    Ok(recv)
                });
                for (r, o) in outs.iter().enumerate() {
                    assert_eq!(o, &blocks[r], "scatter n={n} root={root} block={block} rank {r}");
                }
            }
        }
    }
}

/// With connections opened on demand, distinct peers are what a collective costs in
/// connections: at 256 ranks, allreduce (16 B and 1 MiB) and barrier must touch ~2 per rank
/// on average (trees and rings), not N-1.
#[test]
fn large_groups_touch_few_distinct_peers() {
    let n = 256;
    let avg = |p: &[usize]| p.iter().sum::<usize>() as f64 / p.len() as f64;
    let small = |l: &dyn Link| {
        let mut v = vec![0u8; 16];
        v[..4].copy_from_slice(&(l.rank() as i32).to_ne_bytes());
        allreduce(l, None, &mut v, DType::Int32, ReduceOp::Sum)?;
        assert_eq!(i32::from_ne_bytes(v[..4].try_into().unwrap()), (n * (n - 1) / 2) as i32);
        Ok(())
    };
    let large = |l: &dyn Link| {
        let mut v = vec![1u8; 1 << 20];
        allreduce(l, None, &mut v, DType::Uint8, ReduceOp::Sum)?;
        assert!(v.iter().all(|&b| b == n as u8), "1 MiB allreduce result");
        Ok(())
    };
    type Step<'a> = &'a (dyn Fn(&dyn Link) -> crate::Result<()> + Sync);
    let cases: Vec<(&str, Vec<Step>)> = vec![
        ("allreduce 16 B", vec![&small]),
        ("allreduce 1 MiB", vec![&large]),
        ("barrier", vec![&|l: &dyn Link| barrier(l)]),
        ("all three", vec![&small, &large, &|l: &dyn Link| barrier(l)]),
    ];
    for (what, steps) in cases {
        let (_, st) = run_stats(Hub::new(n), |l| {
            for s in &steps {
                s(l)?;
            }
            Ok(())
        });
        let (a, max) = (avg(&st.peers), *st.peers.iter().max().unwrap());
        eprintln!("{n} ranks, {what}: distinct peers per rank avg {a:.2}, max {max}; {} messages", st.sent);
        assert!(a <= 3.0, "{what}: {a} distinct peers per rank on average");
        assert!(max <= 2 * tuning::ceil_log2(n), "{what}: a rank touched {max} peers");
    }
    // Hierarchical, 16 hosts of 16 ranks placed round-robin. A little above the flat case: the
    // 1 MiB allreduce reduces within each host on a ring (16 ranks, above the tree threshold)
    // and allreduces across the 16 leaders on a ring, beside the trees of the small calls
    // (measured: 3.05 on average, 10 at most).
    let hosts: Vec<usize> = (0..n).map(|r| r % 16).collect();
    let (_, st) = run_stats(Hub::with_hosts(n, Some(hosts)), |l| {
        small(l)?;
        large(l)?;
        barrier(l)
    });
    let a = avg(&st.peers);
    eprintln!("{n} ranks on 16 hosts, all three: distinct peers per rank avg {a:.2}, max {}", st.peers.iter().max().unwrap());
    assert!(a <= 3.5, "hierarchical: {a} distinct peers per rank on average");
}
