//! MPI_Type_create_f90_integer/real/complex: the datatype of a Fortran 90 KIND chosen by
//! range and precision. It has the type map of the predefined type of that size (MPI_REAL4,
//! MPI_INTEGER8, MPI_COMPLEX16, ...) and the F90 combiner with (p, r) or (r) as contents, as
//! the standard asks; it is predefined: one handle per (p, r), never freed.

use crate::abi_gen::*;
use crate::datatype::{self, Envelope, Type};
use crate::err::MpiErr;
use crate::mpi_err;
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::{Arc, Mutex};

static MADE: Mutex<Option<HashMap<(c_int, c_int, c_int), MPI_Datatype>>> = Mutex::new(None);

pub fn is_f90(combiner: c_int) -> bool {
    matches!(combiner, MPI_COMBINER_F90_INTEGER | MPI_COMBINER_F90_REAL | MPI_COMBINER_F90_COMPLEX)
}

/// A limit the kind must meet: MPI_UNDEFINED (or any negative value, as Fortran's
/// SELECTED_*_KIND takes it) asks for nothing.
fn within(v: c_int, max: c_int) -> bool {
    v < 0 || v <= max
}

/// The bytes of a REAL with precision p and range r (gfortran's kinds 4, 8 and 16; MPICH
/// chooses the same), or None when no kind has them.
fn real_bytes(p: c_int, r: c_int) -> Option<usize> {
    [(6, 37, 4), (15, 307, 8), (33, 4931, 16)].iter().find(|&&(mp, mr, _)| within(p, mp) && within(r, mr)).map(|k| k.2)
}

/// The bytes of an INTEGER of range r (10^-r < n < 10^r).
fn int_bytes(r: c_int) -> Option<usize> {
    [(2, 1), (4, 2), (9, 4), (18, 8), (38, 16)].iter().find(|&&(mr, _)| within(r, mr)).map(|k| k.1)
}

fn made(combiner: c_int, p: c_int, r: c_int, base: MPI_Datatype, ints: Vec<c_int>) -> Result<MPI_Datatype, MpiErr> {
    let mut m = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let m = m.get_or_insert_with(HashMap::new);
    if let Some(&h) = m.get(&(combiner, p, r)) {
        return Ok(h);
    }
    let (b, _) = datatype::resolve_any(base)?;
    let t = Type { dt: b.dt, map: b.map.clone(), env: Envelope { combiner, ints, addrs: vec![], larges: vec![], types: vec![] } };
    let h = datatype::handle_for(&Arc::new(t));
    m.insert((combiner, p, r), h);
    Ok(h)
}

fn pr_check(p: c_int, r: c_int) -> Result<(), MpiErr> {
    if p == MPI_UNDEFINED && r == MPI_UNDEFINED {
        return mpi_err!(MPI_ERR_ARG, "p and r are both MPI_UNDEFINED (one of them must be given)");
    }
    Ok(())
}

pub fn real(p: c_int, r: c_int) -> Result<MPI_Datatype, MpiErr> {
    pr_check(p, r)?;
    let base = match real_bytes(p, r) {
        Some(4) => MPI_REAL4,
        Some(8) => MPI_REAL8,
        Some(_) => MPI_REAL16,
        None => return mpi_err!(MPI_ERR_ARG, "no REAL kind has precision {p} and range {r}"),
    };
    made(MPI_COMBINER_F90_REAL, p, r, base, vec![p, r])
}

pub fn complex(p: c_int, r: c_int) -> Result<MPI_Datatype, MpiErr> {
    pr_check(p, r)?;
    let base = match real_bytes(p, r) {
        Some(4) => MPI_COMPLEX8,
        Some(8) => MPI_COMPLEX16,
        Some(_) => MPI_COMPLEX32,
        None => return mpi_err!(MPI_ERR_ARG, "no COMPLEX kind has precision {p} and range {r}"),
    };
    made(MPI_COMBINER_F90_COMPLEX, p, r, base, vec![p, r])
}

pub fn integer(r: c_int) -> Result<MPI_Datatype, MpiErr> {
    let base = match int_bytes(r) {
        Some(1) => MPI_INTEGER1,
        Some(2) => MPI_INTEGER2,
        Some(4) => MPI_INTEGER4,
        Some(8) => MPI_INTEGER8,
        Some(_) => MPI_INTEGER16,
        None => return mpi_err!(MPI_ERR_ARG, "no INTEGER kind has range {r}"),
    };
    made(MPI_COMBINER_F90_INTEGER, 0, r, base, vec![r])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_precision_and_range() {
        let size = |h| datatype::get(h).unwrap().size;
        assert_eq!(size(real(6, 30).unwrap()), 4);
        assert_eq!(size(real(7, MPI_UNDEFINED).unwrap()), 8);
        assert_eq!(size(real(MPI_UNDEFINED, 300).unwrap()), 8);
        assert_eq!(size(real(33, 4931).unwrap()), 16);
        assert_eq!(real(34, 10).err().map(|e| e.class), Some(MPI_ERR_ARG));
        assert_eq!(real(MPI_UNDEFINED, MPI_UNDEFINED).err().map(|e| e.class), Some(MPI_ERR_ARG));
        assert_eq!(size(complex(15, 300).unwrap()), 16);
        assert_eq!(size(integer(1).unwrap()), 1);
        assert_eq!(size(integer(9).unwrap()), 4);
        assert_eq!(size(integer(19).unwrap()), 16);
        assert_eq!(integer(39).err().map(|e| e.class), Some(MPI_ERR_ARG));
        // One handle per request, predefined: the F90 combiner, (p, r), no freeing.
        let h = real(6, 30).unwrap();
        assert_eq!(real(6, 30).unwrap(), h);
        let (t, committed) = datatype::resolve_any(h).unwrap();
        assert!(committed);
        assert_eq!((t.env.combiner, t.env.ints.clone()), (MPI_COMBINER_F90_REAL, vec![6, 30]));
        assert_eq!(datatype::free(h).err().map(|e| e.class), Some(MPI_ERR_TYPE));
        assert_eq!(datatype::get(h).unwrap().kind, datatype::get(MPI_REAL4).unwrap().kind);
    }
}
