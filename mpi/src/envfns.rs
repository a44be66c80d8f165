//! Small local functions of the environment: added error classes (the calls; the table is
//! `errclass`), MPI_Info_create_env, MPI_Get_hw_resource_info, MPI_Dims_create and the F90
//! datatype constructors (the mapping is `f90`).

use crate::abi_gen::*;
use crate::api::out;
use crate::err::{MpiErr, Res};
use crate::errclass;
use crate::mpi_err;
use std::ffi::{c_char, c_int, CStr};

pub unsafe fn add_error_class(errorclass: *mut c_int) -> Res {
    *out(errorclass, "errorclass")? = errclass::add_class()?;
    Ok(())
}

pub unsafe fn add_error_code(errorclass: c_int, errorcode: *mut c_int) -> Res {
    let p = out(errorcode, "errorcode")?;
    *p = errclass::add_code(errorclass)?;
    Ok(())
}

pub unsafe fn add_error_string(errorcode: c_int, string: *const c_char) -> Res {
    if string.is_null() {
        return mpi_err!(MPI_ERR_ARG, "string is NULL");
    }
    // SAFETY: a NUL-terminated string from the caller.
    let s = unsafe { CStr::from_ptr(string) }.to_string_lossy();
    errclass::add_string(errorcode, &s)
}

pub unsafe fn remove_error_class(errorclass: c_int) -> Res {
    errclass::remove_class(errorclass)
}

pub unsafe fn remove_error_code(errorcode: c_int) -> Res {
    errclass::remove_code(errorcode)
}

pub unsafe fn remove_error_string(errorcode: c_int) -> Res {
    errclass::remove_string(errorcode)
}

/// MPI_Info_create_env: what the program was started with, for the given argv ("command" is
/// argv[0], "argv" the others joined by spaces, as MPICH gives them) and the working
/// directory ("wdir"). With no arguments (argc 0 or argv NULL) only "wdir".
pub unsafe fn info_create_env(argc: c_int, argv: *mut *mut c_char, info: *mut MPI_Info) -> Res {
    let o = out(info, "info")?;
    if argc < 0 {
        return mpi_err!(MPI_ERR_ARG, "argc {argc} is negative");
    }
    let mut args = Vec::new();
    if !argv.is_null() {
        for i in 0..argc as usize {
            // SAFETY: argv holds argc pointers (the caller's contract, as for main's).
            let a = unsafe { *argv.add(i) };
            if a.is_null() {
                break;
            }
            // SAFETY: each is a NUL-terminated string.
            args.push(unsafe { CStr::from_ptr(a) }.to_string_lossy().into_owned());
        }
    }
    let mut entries = Vec::new();
    if let Some((cmd, rest)) = args.split_first() {
        entries.push(("command".to_string(), cmd.clone()));
        if !rest.is_empty() {
            entries.push(("argv".to_string(), rest.join(" ")));
        }
    }
    if let Ok(d) = std::env::current_dir() {
        entries.push(("wdir".to_string(), d.to_string_lossy().into_owned()));
    }
    *o = crate::info::add(entries);
    Ok(())
}

/// MPI_Get_hw_resource_info (MPI 4.1): a new info object. The standard names no key this
/// library can fill with a value it knows to be right (MPICH's answer is empty too), so it
/// is empty; the caller frees it.
pub unsafe fn get_hw_resource_info(hw_info: *mut MPI_Info) -> Res {
    *out(hw_info, "hw_info")? = crate::info::add(Vec::new());
    Ok(())
}

/// The balanced factorisation of MPI_Dims_create: the zero entries of `dims` get factors of
/// nnodes / (product of the others), as close to each other as the greedy placement of the
/// prime factors (largest first, each onto the smallest entry so far) makes them, in
/// non-increasing order.
pub fn dims_fill(nnodes: c_int, dims: &mut [c_int]) -> Result<(), MpiErr> {
    if nnodes < 0 {
        return mpi_err!(MPI_ERR_ARG, "nnodes {nnodes} is negative");
    }
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return mpi_err!(MPI_ERR_DIMS, "dims holds {d}: entries must be 0 (free) or positive");
    }
    let fixed: i64 = dims.iter().filter(|&&d| d > 0).map(|&d| d as i64).product();
    let free = dims.iter().filter(|&&d| d == 0).count();
    if nnodes == 0 {
        // No nodes: only a grid with a free entry (all zeros) or with no entries means it.
        if free == 0 && !dims.is_empty() {
            return mpi_err!(MPI_ERR_DIMS, "nnodes 0 is not the product of the fixed dims ({fixed})");
        }
        return Ok(());
    }
    if nnodes as i64 % fixed != 0 || (free == 0 && fixed != nnodes as i64) {
        return mpi_err!(MPI_ERR_DIMS, "nnodes {nnodes} is not a multiple of the product of the fixed dims ({fixed})");
    }
    if free == 0 {
        return Ok(());
    }
    let mut rest = nnodes as i64 / fixed;
    let mut primes = Vec::new();
    let mut f = 2;
    while f * f <= rest {
        while rest % f == 0 {
            primes.push(f);
            rest /= f;
        }
        f += 1;
    }
    if rest > 1 {
        primes.push(rest);
    }
    let mut got = vec![1i64; free];
    for p in primes.into_iter().rev() {
        let i = (0..free).min_by_key(|&i| got[i]).unwrap_or(0);
        got[i] *= p;
    }
    got.sort_unstable_by(|a, b| b.cmp(a));
    let mut it = got.into_iter();
    for d in dims.iter_mut().filter(|d| **d == 0) {
        *d = it.next().unwrap_or(1) as c_int;
    }
    Ok(())
}

pub unsafe fn dims_create(nnodes: c_int, ndims: c_int, d: *mut c_int) -> Res {
    if ndims < 0 {
        return mpi_err!(MPI_ERR_DIMS, "ndims {ndims} is negative");
    }
    if ndims == 0 {
        return dims_fill(nnodes, &mut []);
    }
    if d.is_null() {
        return mpi_err!(MPI_ERR_ARG, "dims is NULL");
    }
    // SAFETY: the caller's array holds ndims ints.
    dims_fill(nnodes, unsafe { std::slice::from_raw_parts_mut(d, ndims as usize) })
}

pub unsafe fn type_create_f90_real(p: c_int, r: c_int, newtype: *mut MPI_Datatype) -> Res {
    *out(newtype, "newtype")? = crate::f90::real(p, r)?;
    Ok(())
}

pub unsafe fn type_create_f90_complex(p: c_int, r: c_int, newtype: *mut MPI_Datatype) -> Res {
    *out(newtype, "newtype")? = crate::f90::complex(p, r)?;
    Ok(())
}

pub unsafe fn type_create_f90_integer(r: c_int, newtype: *mut MPI_Datatype) -> Res {
    *out(newtype, "newtype")? = crate::f90::integer(r)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: c_int, v: &[c_int]) -> Result<Vec<c_int>, c_int> {
        let mut v = v.to_vec();
        dims_fill(n, &mut v).map(|_| v).map_err(|e| e.class)
    }

    #[test]
    fn dims_are_balanced_and_non_increasing() {
        assert_eq!(d(12, &[0, 0, 0]), Ok(vec![3, 2, 2]));
        assert_eq!(d(12, &[0, 3, 0]), Ok(vec![2, 3, 2]));
        assert_eq!(d(16, &[0, 0]), Ok(vec![4, 4]));
        assert_eq!(d(7, &[0, 0]), Ok(vec![7, 1]));
        assert_eq!(d(1, &[0, 0, 0]), Ok(vec![1, 1, 1]));
        assert_eq!(d(6, &[2, 3]), Ok(vec![2, 3]));
        assert_eq!(d(12, &[0, 5]), Err(MPI_ERR_DIMS));
        assert_eq!(d(6, &[2, 2]), Err(MPI_ERR_DIMS));
        assert_eq!(d(4, &[-1, 0]), Err(MPI_ERR_DIMS));
        assert_eq!(d(-1, &[0]), Err(MPI_ERR_ARG));
        assert_eq!(d(0, &[0, 0]), Ok(vec![0, 0]));
    }
}
