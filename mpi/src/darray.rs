//! MPI_Type_create_darray(_c): the part of a global array (of `gsizes` elements of the old
//! type, in C or Fortran order) that one process of a `psizes` process grid holds under a
//! block, cyclic or no distribution per dimension. Processes are numbered row-major in the
//! grid (the standard's rule, whatever `order`). The type lists the local elements in array
//! order (the fastest dimension innermost); its lb is 0 and its extent the whole array.

use crate::abi_gen::*;
use crate::datatype::{self, Envelope};
use crate::err::MpiErr;
use crate::mpi_err;
use crate::typemap::{Layout, Part};
use std::ffi::c_int;

/// `count` runs of `len` indices, the first from `first`, each next `period` further.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Runs {
    first: i64,
    len: i64,
    count: i64,
    period: i64,
}

/// One dimension of the distribution: what this process holds of its indices, as runs in
/// increasing order (a cyclic distribution's evenly spaced runs as one `Runs`).
fn runs(gsize: i64, distrib: c_int, darg: c_int, nprocs: i64, coord: i64, d: usize) -> Result<Vec<Runs>, MpiErr> {
    match distrib {
        MPI_DISTRIBUTE_NONE => {
            if nprocs != 1 {
                return mpi_err!(MPI_ERR_ARG, "dimension {d}: MPI_DISTRIBUTE_NONE needs psizes[{d}] = 1, not {nprocs}");
            }
            Ok(vec![Runs { first: 0, len: gsize, count: 1, period: gsize }])
        }
        MPI_DISTRIBUTE_BLOCK => {
            let b = if darg == MPI_DISTRIBUTE_DFLT_DARG {
                (gsize + nprocs - 1) / nprocs
            } else if darg <= 0 {
                return mpi_err!(MPI_ERR_ARG, "dimension {d}: block size {darg} is not positive");
            } else {
                darg as i64
            };
            if b.checked_mul(nprocs).is_none_or(|t| t < gsize) {
                return mpi_err!(MPI_ERR_ARG, "dimension {d}: {nprocs} blocks of {b} do not cover {gsize} elements");
            }
            let start = b * coord;
            let len = (gsize - start).clamp(0, b);
            Ok(if len > 0 { vec![Runs { first: start, len, count: 1, period: len }] } else { vec![] })
        }
        MPI_DISTRIBUTE_CYCLIC => {
            let b = if darg == MPI_DISTRIBUTE_DFLT_DARG {
                1
            } else if darg <= 0 {
                return mpi_err!(MPI_ERR_ARG, "dimension {d}: cyclic block size {darg} is not positive");
            } else {
                darg as i64
            };
            let period = b.checked_mul(nprocs).ok_or_else(|| MpiErr::new(MPI_ERR_ARG, "the cyclic period overflows"))?;
            let first = b * coord;
            if first >= gsize {
                return Ok(vec![]);
            }
            // Runs start every `period` from `first`; all are `b` long but perhaps the last.
            let starts = (gsize - first - 1) / period + 1;
            let last = first + (starts - 1) * period;
            let full = if last + b <= gsize { starts } else { starts - 1 };
            let mut v = Vec::new();
            if full > 0 {
                v.push(Runs { first, len: b, count: full, period });
            }
            if full < starts {
                v.push(Runs { first: last, len: gsize - last, count: 1, period });
            }
            Ok(v)
        }
        _ => mpi_err!(MPI_ERR_ARG, "dimension {d}: distribution {distrib} is not MPI_DISTRIBUTE_BLOCK, _CYCLIC or _NONE"),
    }
}

#[allow(clippy::too_many_arguments)]
pub fn darray(size: c_int, rank: c_int, gsizes: &[i64], distribs: &[c_int], dargs: &[c_int], psizes: &[c_int], order: c_int, old_h: MPI_Datatype, large: bool) -> Result<MPI_Datatype, MpiErr> {
    let nd = gsizes.len();
    if size <= 0 || rank < 0 || rank >= size {
        return mpi_err!(MPI_ERR_ARG, "rank {rank} of size {size} is not a process of the grid");
    }
    if nd == 0 {
        return mpi_err!(MPI_ERR_ARG, "ndims must be positive");
    }
    if order != MPI_ORDER_C && order != MPI_ORDER_FORTRAN {
        return mpi_err!(MPI_ERR_ARG, "order {order} is neither MPI_ORDER_C nor MPI_ORDER_FORTRAN");
    }
    if let Some(d) = (0..nd).find(|&d| gsizes[d] <= 0 || psizes[d] <= 0) {
        return mpi_err!(MPI_ERR_ARG, "dimension {d}: gsize {} and psize {} must be positive", gsizes[d], psizes[d]);
    }
    let procs = psizes.iter().try_fold(1i64, |a, &p| a.checked_mul(p as i64)).unwrap_or(i64::MAX);
    if procs != size as i64 {
        return mpi_err!(MPI_ERR_ARG, "the process grid has {procs} processes, size is {size}");
    }
    // Row-major coordinates of `rank` in the grid.
    let mut coords = vec![0i64; nd];
    let mut rest = rank as i64;
    for d in (0..nd).rev() {
        coords[d] = rest % psizes[d] as i64;
        rest /= psizes[d] as i64;
    }
    let (old, _) = datatype::resolve_any(old_h)?;
    let keep = if old_h >= datatype::TYPE_BASE { Some(old.clone()) } else { None };
    let ext = old.map.extent();
    let fast_first: Vec<usize> = if order == MPI_ORDER_C { (0..nd).rev().collect() } else { (0..nd).collect() };
    // From the fastest dimension out: each level places runs of the level below, whose
    // extent is set to the span of one index of this dimension.
    let mut cur = old.map.clone();
    let mut stride = ext;
    for (level, &d) in fast_first.iter().enumerate() {
        let r = runs(gsizes[d], distribs[d], dargs[d], psizes[d] as i64, coords[d], d)?;
        // The innermost level places elements of the old type itself (its extent apart).
        let child = if level == 0 { cur.clone() } else { cur.resized(0, stride).map_err(datatype::map_err)? };
        let overflow = || MpiErr::new(MPI_ERR_ARG, "the array's byte offsets overflow");
        // One run of each kind, then the parts that place them (evenly spaced ones as one).
        let blocks: Vec<Layout> = r.iter().map(|x| Layout::compose(&[Part::new(0, x.len as u64, &child)], false).map_err(datatype::map_err)).collect::<Result<_, _>>()?;
        let mut parts = Vec::with_capacity(r.len());
        for (x, block) in r.iter().zip(&blocks) {
            let disp = x.first.checked_mul(stride).ok_or_else(overflow)?;
            let step = x.period.checked_mul(stride).ok_or_else(overflow)?;
            parts.push(Part::strided(disp, x.count as u64, step, block));
        }
        cur = Layout::compose(&parts, false).map_err(datatype::map_err)?;
        stride = stride.checked_mul(gsizes[d]).ok_or_else(|| MpiErr::new(MPI_ERR_ARG, "the array's size in bytes overflows"))?;
    }
    let map = cur.resized(0, stride).map_err(datatype::map_err)?;
    let mut env = Envelope { combiner: MPI_COMBINER_DARRAY, ints: vec![size, rank, nd as c_int], addrs: vec![], larges: vec![], types: vec![(old_h, keep)] };
    if large {
        env.larges = gsizes.to_vec();
    } else {
        for &g in gsizes {
            env.ints.push(c_int::try_from(g).map_err(|_| MpiErr::new(MPI_ERR_ARG, format!("gsize {g} does not fit an int")))?);
        }
    }
    env.ints.extend_from_slice(distribs);
    env.ints.extend_from_slice(dargs);
    env.ints.extend_from_slice(psizes);
    env.ints.push(order);
    Ok(datatype::finish(map, env))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(h: MPI_Datatype) -> Vec<(i64, u64)> {
        datatype::resolve_any(h).unwrap().0.map.flat_blocks().iter().map(|b| (b.off, b.len)).collect()
    }

    #[test]
    fn block_and_cyclic_parts_of_a_grid() {
        // 4x6 ints on a 2x2 grid, C order, block x block: rank 1 is row 0, column 1 of the grid
        // and holds rows 0-1, columns 3-5.
        let b = MPI_DISTRIBUTE_BLOCK;
        let d = MPI_DISTRIBUTE_DFLT_DARG;
        let t = darray(4, 1, &[4, 6], &[b, b], &[d, d], &[2, 2], MPI_ORDER_C, MPI_INT, false).unwrap();
        assert_eq!(offsets(t), vec![(12, 12), (36, 12)]);
        let m = datatype::resolve_any(t).unwrap().0.map.clone();
        assert_eq!((m.lb, m.extent(), m.size), (0, 96, 24));
        let e = datatype::resolve_any(t).unwrap().0.env.clone();
        assert_eq!(e.ints, vec![4, 1, 2, 4, 6, b, b, d, d, 2, 2, MPI_ORDER_C]);
        // Fortran order: the first dimension is the fastest; rank 1 is still grid (0, 1).
        let f = darray(4, 1, &[4, 6], &[b, b], &[d, d], &[2, 2], MPI_ORDER_FORTRAN, MPI_INT, false).unwrap();
        assert_eq!(offsets(f), vec![(48, 8), (64, 8), (80, 8)]);
        // Cyclic(1) over 3 processes of 7 elements: rank 1 holds 1 and 4.
        let c = MPI_DISTRIBUTE_CYCLIC;
        let y = darray(3, 1, &[7], &[c], &[d], &[3], MPI_ORDER_C, MPI_INT, true).unwrap();
        assert_eq!(offsets(y), vec![(4, 4), (16, 4)]);
        assert_eq!(datatype::resolve_any(y).unwrap().0.env.larges, vec![7]);
        // A block beyond the end holds nothing, and the extent is still the array.
        let z = darray(3, 2, &[4], &[b], &[d], &[3], MPI_ORDER_C, MPI_INT, false).unwrap();
        assert_eq!((datatype::resolve_any(z).unwrap().0.map.size, datatype::resolve_any(z).unwrap().0.map.extent()), (0, 16));
        for h in [t, f, y, z] {
            datatype::free(h).unwrap();
        }
    }

    /// A cyclic distribution of many elements is one strided part, not a part per run, and
    /// holds the same elements as written out.
    #[test]
    fn cyclic_runs_stay_compact() {
        let (c, d) = (MPI_DISTRIBUTE_CYCLIC, MPI_DISTRIBUTE_DFLT_DARG);
        // 10 elements, cyclic(3) over 2: rank 0 holds 0-2 and 6-8, rank 1 3-5 and 9.
        let a = darray(2, 0, &[10], &[c], &[3], &[2], MPI_ORDER_C, MPI_INT, false).unwrap();
        let b = darray(2, 1, &[10], &[c], &[3], &[2], MPI_ORDER_C, MPI_INT, false).unwrap();
        assert_eq!(offsets(a), vec![(0, 12), (24, 12)]);
        assert_eq!(offsets(b), vec![(12, 12), (36, 4)]);
        // 2^34 elements cyclic(1) over 2: 2^33 runs, stored in one segment.
        let big = darray(2, 1, &[1 << 34], &[c], &[d], &[2], MPI_ORDER_C, MPI_CHAR, true).unwrap();
        let m = datatype::resolve_any(big).unwrap().0.map.clone();
        assert_eq!((m.blocks.len(), m.size, m.extent(), m.true_lb), (1, 1 << 33, 1 << 34, 1));
        for h in [a, b, big] {
            datatype::free(h).unwrap();
        }
    }

    #[test]
    fn bad_grids_are_arg_errors() {
        let (b, d) = (MPI_DISTRIBUTE_BLOCK, MPI_DISTRIBUTE_DFLT_DARG);
        let e = |r: Result<MPI_Datatype, MpiErr>| r.err().map(|e| e.class);
        assert_eq!(e(darray(4, 0, &[4], &[b], &[d], &[2], MPI_ORDER_C, MPI_INT, false)), Some(MPI_ERR_ARG), "grid of 2, size 4");
        assert_eq!(e(darray(2, 2, &[4], &[b], &[d], &[2], MPI_ORDER_C, MPI_INT, false)), Some(MPI_ERR_ARG));
        assert_eq!(e(darray(2, 0, &[5], &[b], &[2], &[2], MPI_ORDER_C, MPI_INT, false)), Some(MPI_ERR_ARG), "2 blocks of 2 < 5");
        assert_eq!(e(darray(2, 0, &[4], &[MPI_DISTRIBUTE_NONE], &[d], &[2], MPI_ORDER_C, MPI_INT, false)), Some(MPI_ERR_ARG));
        assert_eq!(e(darray(1, 0, &[4], &[99], &[d], &[1], MPI_ORDER_C, MPI_INT, false)), Some(MPI_ERR_ARG));
        assert_eq!(e(darray(1, 0, &[4], &[b], &[d], &[1], 5, MPI_INT, false)), Some(MPI_ERR_ARG));
    }
}
