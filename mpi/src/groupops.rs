//! Group set operations (MPI_Group_union, intersection, difference) and rank ranges
//! (MPI_Group_range_incl, range_excl), on groups as ordered lists of world ranks.

use crate::abi_gen::*;
use crate::api::out;
use crate::err::{MpiErr, Res};
use crate::group;
use std::ffi::c_int;

fn set_op(g1: MPI_Group, g2: MPI_Group, newgroup: *mut MPI_Group, f: fn(&[u32], &[u32]) -> Vec<u32>) -> Res {
    crate::state::check_active()?;
    let (a, b) = (group::get(g1)?, group::get(g2)?);
    let o = out(newgroup, "newgroup")?;
    *o = group::add(f(&a, &b));
    Ok(())
}

/// The first group's members in order, then the second's that are not in the first.
fn union(a: &[u32], b: &[u32]) -> Vec<u32> {
    a.iter().copied().chain(b.iter().copied().filter(|x| !a.contains(x))).collect()
}

pub unsafe fn group_union(g1: MPI_Group, g2: MPI_Group, newgroup: *mut MPI_Group) -> Res {
    set_op(g1, g2, newgroup, union)
}

pub unsafe fn group_intersection(g1: MPI_Group, g2: MPI_Group, newgroup: *mut MPI_Group) -> Res {
    set_op(g1, g2, newgroup, |a, b| a.iter().copied().filter(|x| b.contains(x)).collect())
}

pub unsafe fn group_difference(g1: MPI_Group, g2: MPI_Group, newgroup: *mut MPI_Group) -> Res {
    set_op(g1, g2, newgroup, |a, b| a.iter().copied().filter(|x| !b.contains(x)).collect())
}

/// The group ranks that `n` (first, last, stride) triplets name, in order; each must be a rank
/// of a group of `size` and named once (MPI_ERR_RANK), no stride may be 0 (MPI_ERR_ARG).
fn expand(n: c_int, ranges: *const [c_int; 3], size: usize) -> Result<Vec<usize>, MpiErr> {
    if n < 0 {
        return crate::mpi_err!(MPI_ERR_ARG, "n = {n} is negative");
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    if ranges.is_null() {
        return crate::mpi_err!(MPI_ERR_ARG, "ranges is NULL");
    }
    // SAFETY: the caller's array holds n triplets.
    let rs = unsafe { std::slice::from_raw_parts(ranges, n as usize) };
    let mut seen = vec![false; size];
    let mut out = Vec::new();
    for (i, &[first, last, stride]) in rs.iter().enumerate() {
        if stride == 0 {
            return crate::mpi_err!(MPI_ERR_ARG, "ranges[{i}] has stride 0");
        }
        let in_group = |r: c_int| r >= 0 && (r as usize) < size;
        if !in_group(first) || !in_group(last) {
            return crate::mpi_err!(MPI_ERR_RANK, "ranges[{i}] = ({first}, {last}, {stride}) leaves the group (size {size})");
        }
        let mut r = i64::from(first);
        while (stride > 0 && r <= i64::from(last)) || (stride < 0 && r >= i64::from(last)) {
            let k = r as usize;
            if std::mem::replace(&mut seen[k], true) {
                return crate::mpi_err!(MPI_ERR_RANK, "rank {k} is named twice in ranges");
            }
            out.push(k);
            r += i64::from(stride);
        }
    }
    Ok(out)
}

pub unsafe fn group_range_incl(g: MPI_Group, n: c_int, ranges: *mut *mut c_int, newgroup: *mut MPI_Group) -> Res {
    crate::state::check_active()?;
    let m = group::get(g)?;
    let o = out(newgroup, "newgroup")?;
    // C's `int ranges[][3]` is a pointer to triplets.
    let ks = expand(n, ranges as *const [c_int; 3], m.len())?;
    *o = group::add(ks.into_iter().map(|k| m[k]).collect());
    Ok(())
}

pub unsafe fn group_range_excl(g: MPI_Group, n: c_int, ranges: *mut *mut c_int, newgroup: *mut MPI_Group) -> Res {
    crate::state::check_active()?;
    let m = group::get(g)?;
    let o = out(newgroup, "newgroup")?;
    let ks = expand(n, ranges as *const [c_int; 3], m.len())?;
    *o = group::add(m.iter().enumerate().filter(|(k, _)| !ks.contains(k)).map(|(_, &w)| w).collect());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_expand_in_order_both_ways_and_refuse_repeats() {
        let r = [[0, 6, 3], [5, 1, -4]];
        assert_eq!(expand(2, r.as_ptr(), 8).unwrap(), [0, 3, 6, 5, 1]);
        assert_eq!(expand(1, [[2, 2, 1]].as_ptr(), 3).unwrap(), [2]);
        assert_eq!(expand(1, [[0, 4, 1]].as_ptr(), 3).unwrap_err().class, MPI_ERR_RANK);
        assert_eq!(expand(2, [[0, 1, 1], [1, 2, 1]].as_ptr(), 3).unwrap_err().class, MPI_ERR_RANK);
        assert_eq!(expand(1, [[0, 1, 0]].as_ptr(), 3).unwrap_err().class, MPI_ERR_ARG);
        assert_eq!(union(&[3, 1], &[1, 0, 3, 2]), [3, 1, 0, 2]);
    }
}
