//! The datatype functions: sizes and extents, counts in statuses, the constructors, names,
//! envelopes and contents, and MPI_Pack/Unpack (native and "external32").

use crate::abi_gen::*;
use crate::api::{out, put_str};
use crate::datatype::{self, Type};
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::request;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

// ---- sizes, extents, counts ------------------------------------------------------------------------

/// An int result, MPI_UNDEFINED when it does not fit.
fn int_or_undefined(n: i64) -> c_int {
    if n > c_int::MAX as i64 || n < c_int::MIN as i64 {
        MPI_UNDEFINED
    } else {
        n as c_int
    }
}

pub unsafe fn type_size(dt: MPI_Datatype, size: *mut c_int) -> Res {
    let n = datatype::type_size(dt)?;
    *out(size, "size")? = int_or_undefined(n);
    Ok(())
}

pub unsafe fn type_size_c(dt: MPI_Datatype, size: *mut MPI_Count) -> Res {
    *out(size, "size")? = datatype::type_size(dt)? as MPI_Count;
    Ok(())
}

pub unsafe fn type_size_x(dt: MPI_Datatype, size: *mut MPI_Count) -> Res {
    type_size_c(dt, size)
}

fn status_bytes(st: *const MPI_Status) -> Result<u64, MpiErr> {
    // SAFETY: a non-NULL status from the caller is readable.
    let s = unsafe { st.as_ref() }.ok_or_else(|| MpiErr::new(MPI_ERR_ARG, "status is NULL (MPI_STATUS_IGNORE has no count)"))?;
    Ok(request::count_of(s))
}

/// Whole elements of `dt` in a status (MPI_UNDEFINED when the bytes end inside one).
fn count_in(st: *const MPI_Status, dt: MPI_Datatype) -> Result<i64, MpiErr> {
    let t = datatype::resolve(dt)?;
    let bytes = status_bytes(st)?;
    let size = t.map.size;
    if size == 0 {
        return Ok(0);
    }
    Ok(if bytes % size == 0 { (bytes / size) as i64 } else { MPI_UNDEFINED as i64 })
}

/// Basic elements in a status (MPI_UNDEFINED when the bytes end inside one).
fn elements_in(st: *const MPI_Status, dt: MPI_Datatype) -> Result<i64, MpiErr> {
    let t = datatype::resolve(dt)?;
    Ok(t.map.elements_in(status_bytes(st)?).map_or(MPI_UNDEFINED as i64, |n| n as i64))
}

pub unsafe fn get_count(st: *const MPI_Status, dt: MPI_Datatype, count: *mut c_int) -> Res {
    *out(count, "count")? = int_or_undefined(count_in(st, dt)?);
    Ok(())
}

pub unsafe fn get_count_c(st: *const MPI_Status, dt: MPI_Datatype, count: *mut MPI_Count) -> Res {
    *out(count, "count")? = count_in(st, dt)?;
    Ok(())
}

pub unsafe fn get_elements(st: *const MPI_Status, dt: MPI_Datatype, count: *mut c_int) -> Res {
    *out(count, "count")? = int_or_undefined(elements_in(st, dt)?);
    Ok(())
}

pub unsafe fn get_elements_c(st: *const MPI_Status, dt: MPI_Datatype, count: *mut MPI_Count) -> Res {
    *out(count, "count")? = elements_in(st, dt)?;
    Ok(())
}

pub unsafe fn get_elements_x(st: *const MPI_Status, dt: MPI_Datatype, count: *mut MPI_Count) -> Res {
    get_elements_c(st, dt, count)
}

pub unsafe fn status_set_elements_c(st: *mut MPI_Status, dt: MPI_Datatype, count: MPI_Count) -> Res {
    let t = datatype::resolve(dt)?;
    if count < 0 {
        return mpi_err!(MPI_ERR_COUNT, "count {count} is negative");
    }
    let n = t.map.bytes_of_elements(count as u64).ok_or_else(|| MpiErr::new(MPI_ERR_COUNT, format!("count {count} overflows")))?;
    request::set_count(out(st, "status")?, n as usize);
    Ok(())
}

pub unsafe fn status_set_elements(st: *mut MPI_Status, dt: MPI_Datatype, count: c_int) -> Res {
    status_set_elements_c(st, dt, count as MPI_Count)
}

pub unsafe fn status_set_elements_x(st: *mut MPI_Status, dt: MPI_Datatype, count: MPI_Count) -> Res {
    status_set_elements_c(st, dt, count)
}

fn extent_of(dt: MPI_Datatype, true_bounds: bool) -> Result<(i64, i64), MpiErr> {
    let m = &datatype::resolve_any(dt)?.0.map;
    Ok(if true_bounds { (m.true_lb, m.true_extent()) } else { (m.lb, m.extent()) })
}

pub unsafe fn type_get_extent_c(dt: MPI_Datatype, lb: *mut MPI_Count, extent: *mut MPI_Count) -> Res {
    let (l, e) = extent_of(dt, false)?;
    *out(lb, "lb")? = l;
    *out(extent, "extent")? = e;
    Ok(())
}

pub unsafe fn type_get_extent_x(dt: MPI_Datatype, lb: *mut MPI_Count, extent: *mut MPI_Count) -> Res {
    type_get_extent_c(dt, lb, extent)
}

pub unsafe fn type_get_extent(dt: MPI_Datatype, lb: *mut MPI_Aint, extent: *mut MPI_Aint) -> Res {
    let (l, e) = extent_of(dt, false)?;
    *out(lb, "lb")? = l as MPI_Aint;
    *out(extent, "extent")? = e as MPI_Aint;
    Ok(())
}

pub unsafe fn type_get_true_extent_c(dt: MPI_Datatype, lb: *mut MPI_Count, extent: *mut MPI_Count) -> Res {
    let (l, e) = extent_of(dt, true)?;
    *out(lb, "true_lb")? = l;
    *out(extent, "true_extent")? = e;
    Ok(())
}

pub unsafe fn type_get_true_extent_x(dt: MPI_Datatype, lb: *mut MPI_Count, extent: *mut MPI_Count) -> Res {
    type_get_true_extent_c(dt, lb, extent)
}

pub unsafe fn type_get_true_extent(dt: MPI_Datatype, lb: *mut MPI_Aint, extent: *mut MPI_Aint) -> Res {
    let (l, e) = extent_of(dt, true)?;
    *out(lb, "true_lb")? = l as MPI_Aint;
    *out(extent, "true_extent")? = e as MPI_Aint;
    Ok(())
}

// ---- names -----------------------------------------------------------------------------------------

pub unsafe fn type_get_name(dt: MPI_Datatype, name: *mut c_char, len: *mut c_int) -> Res {
    put_str(&datatype::name(dt)?, name, len, MPI_MAX_OBJECT_NAME as usize)
}

pub unsafe fn type_set_name(dt: MPI_Datatype, name: *const c_char) -> Res {
    if name.is_null() {
        return mpi_err!(MPI_ERR_ARG, "type_name is NULL");
    }
    // SAFETY: a NUL-terminated string from the caller.
    let mut s = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
    let mut end = s.len().min(MPI_MAX_OBJECT_NAME as usize - 1);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    datatype::set_name(dt, &s)
}

// ---- constructors --------------------------------------------------------------------------------

/// A caller's array of `n` values (MPI_ERR_COUNT for a negative n, MPI_ERR_ARG for NULL).
fn arr<T: Copy>(p: *const T, n: i64, what: &str, f: impl Fn(T) -> i64) -> Result<Vec<i64>, MpiErr> {
    if n < 0 {
        return mpi_err!(MPI_ERR_COUNT, "count {n} is negative");
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    let n = usize::try_from(n).map_err(|_| MpiErr::new(MPI_ERR_COUNT, format!("count {n} is more than this machine can address")))?;
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return mpi_err!(MPI_ERR_NO_MEM, "no memory for a copy of {what} ({n} values)");
    }
    // SAFETY: the caller's array holds `n` values (the standard's contract).
    v.extend(unsafe { std::slice::from_raw_parts(p, n) }.iter().map(|&v| f(v)));
    Ok(v)
}

fn ci(v: c_int) -> i64 {
    v as i64
}
fn ca(v: MPI_Aint) -> i64 {
    v as i64
}
fn cc(v: MPI_Count) -> i64 {
    v
}

unsafe fn put_new(new: *mut MPI_Datatype, f: impl FnOnce() -> Result<MPI_Datatype, MpiErr>) -> Res {
    let o = out(new, "newtype")?;
    *o = f()?;
    Ok(())
}

pub unsafe fn type_contiguous_c(count: MPI_Count, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    put_new(new, || datatype::contiguous_x(count, old, true))
}

pub unsafe fn type_contiguous(count: c_int, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    put_new(new, || datatype::contiguous_x(count as i64, old, false))
}

pub unsafe fn type_vector(count: c_int, bl: c_int, stride: c_int, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    put_new(new, || datatype::vector(count as i64, bl as i64, stride as i64, old, false, false))
}
pub unsafe fn type_vector_c(count: MPI_Count, bl: MPI_Count, stride: MPI_Count, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    put_new(new, || datatype::vector(count, bl, stride, old, false, true))
}
pub unsafe fn type_create_hvector(count: c_int, bl: c_int, stride: MPI_Aint, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    put_new(new, || datatype::vector(count as i64, bl as i64, stride as i64, old, true, false))
}
pub unsafe fn type_create_hvector_c(count: MPI_Count, bl: MPI_Count, stride: MPI_Count, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    put_new(new, || datatype::vector(count, bl, stride, old, true, true))
}

pub unsafe fn type_indexed(count: c_int, bls: *const c_int, displs: *const c_int, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let (b, d) = (arr(bls, count as i64, "array_of_blocklengths", ci)?, arr(displs, count as i64, "array_of_displacements", ci)?);
    put_new(new, || datatype::indexed(&b, &d, old, false, false))
}
pub unsafe fn type_indexed_c(count: MPI_Count, bls: *const MPI_Count, displs: *const MPI_Count, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let (b, d) = (arr(bls, count, "array_of_blocklengths", cc)?, arr(displs, count, "array_of_displacements", cc)?);
    put_new(new, || datatype::indexed(&b, &d, old, false, true))
}
pub unsafe fn type_create_hindexed(count: c_int, bls: *const c_int, displs: *const MPI_Aint, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let (b, d) = (arr(bls, count as i64, "array_of_blocklengths", ci)?, arr(displs, count as i64, "array_of_displacements", ca)?);
    put_new(new, || datatype::indexed(&b, &d, old, true, false))
}
pub unsafe fn type_create_hindexed_c(count: MPI_Count, bls: *const MPI_Count, displs: *const MPI_Count, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let (b, d) = (arr(bls, count, "array_of_blocklengths", cc)?, arr(displs, count, "array_of_displacements", cc)?);
    put_new(new, || datatype::indexed(&b, &d, old, true, true))
}
pub unsafe fn type_create_indexed_block(count: c_int, bl: c_int, displs: *const c_int, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let d = arr(displs, count as i64, "array_of_displacements", ci)?;
    put_new(new, || datatype::indexed_block(bl as i64, &d, old, false, false))
}
pub unsafe fn type_create_indexed_block_c(count: MPI_Count, bl: MPI_Count, displs: *const MPI_Count, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let d = arr(displs, count, "array_of_displacements", cc)?;
    put_new(new, || datatype::indexed_block(bl, &d, old, false, true))
}
pub unsafe fn type_create_hindexed_block(count: c_int, bl: c_int, displs: *const MPI_Aint, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let d = arr(displs, count as i64, "array_of_displacements", ca)?;
    put_new(new, || datatype::indexed_block(bl as i64, &d, old, true, false))
}
pub unsafe fn type_create_hindexed_block_c(count: MPI_Count, bl: MPI_Count, displs: *const MPI_Count, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let d = arr(displs, count, "array_of_displacements", cc)?;
    put_new(new, || datatype::indexed_block(bl, &d, old, true, true))
}

fn types_of(p: *const MPI_Datatype, n: i64) -> Result<Vec<MPI_Datatype>, MpiErr> {
    Ok(arr(p, n, "array_of_types", |h| h as i64)?.into_iter().map(|h| h as MPI_Datatype).collect())
}

pub unsafe fn type_create_struct(count: c_int, bls: *const c_int, displs: *const MPI_Aint, types: *const MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let n = count as i64;
    let (b, d, t) = (arr(bls, n, "array_of_blocklengths", ci)?, arr(displs, n, "array_of_displacements", ca)?, types_of(types, n)?);
    put_new(new, || datatype::structure(&b, &d, &t, false))
}
pub unsafe fn type_create_struct_c(count: MPI_Count, bls: *const MPI_Count, displs: *const MPI_Count, types: *const MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let (b, d, t) = (arr(bls, count, "array_of_blocklengths", cc)?, arr(displs, count, "array_of_displacements", cc)?, types_of(types, count)?);
    put_new(new, || datatype::structure(&b, &d, &t, true))
}

pub unsafe fn type_create_subarray(nd: c_int, sizes: *const c_int, subs: *const c_int, starts: *const c_int, order: c_int, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let n = nd as i64;
    let (a, b, c) = (arr(sizes, n, "array_of_sizes", ci)?, arr(subs, n, "array_of_subsizes", ci)?, arr(starts, n, "array_of_starts", ci)?);
    put_new(new, || datatype::subarray(&a, &b, &c, order, old, false))
}
pub unsafe fn type_create_subarray_c(nd: c_int, sizes: *const MPI_Count, subs: *const MPI_Count, starts: *const MPI_Count, order: c_int, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let n = nd as i64;
    let (a, b, c) = (arr(sizes, n, "array_of_sizes", cc)?, arr(subs, n, "array_of_subsizes", cc)?, arr(starts, n, "array_of_starts", cc)?);
    put_new(new, || datatype::subarray(&a, &b, &c, order, old, true))
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn type_create_darray(size: c_int, rank: c_int, nd: c_int, gsizes: *const c_int, distribs: *const c_int, dargs: *const c_int, psizes: *const c_int, order: c_int, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let n = nd as i64;
    let g = arr(gsizes, n, "array_of_gsizes", ci)?;
    darray_tail(size, rank, &g, distribs, dargs, psizes, order, old, new, false)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn type_create_darray_c(size: c_int, rank: c_int, nd: c_int, gsizes: *const MPI_Count, distribs: *const c_int, dargs: *const c_int, psizes: *const c_int, order: c_int, old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    let n = nd as i64;
    let g = arr(gsizes, n, "array_of_gsizes", cc)?;
    darray_tail(size, rank, &g, distribs, dargs, psizes, order, old, new, true)
}
#[allow(clippy::too_many_arguments)]
unsafe fn darray_tail(size: c_int, rank: c_int, g: &[i64], distribs: *const c_int, dargs: *const c_int, psizes: *const c_int, order: c_int, old: MPI_Datatype, new: *mut MPI_Datatype, large: bool) -> Res {
    let n = g.len() as i64;
    let to_int = |v: i64| v as c_int;
    let d: Vec<c_int> = arr(distribs, n, "array_of_distribs", ci)?.into_iter().map(to_int).collect();
    let a: Vec<c_int> = arr(dargs, n, "array_of_dargs", ci)?.into_iter().map(to_int).collect();
    let p: Vec<c_int> = arr(psizes, n, "array_of_psizes", ci)?.into_iter().map(to_int).collect();
    put_new(new, || crate::darray::darray(size, rank, g, &d, &a, &p, order, old, large))
}

pub unsafe fn type_create_resized(old: MPI_Datatype, lb: MPI_Aint, extent: MPI_Aint, new: *mut MPI_Datatype) -> Res {
    put_new(new, || datatype::resized(old, lb as i64, extent as i64, false))
}
pub unsafe fn type_create_resized_c(old: MPI_Datatype, lb: MPI_Count, extent: MPI_Count, new: *mut MPI_Datatype) -> Res {
    put_new(new, || datatype::resized(old, lb, extent, true))
}

pub unsafe fn type_dup(old: MPI_Datatype, new: *mut MPI_Datatype) -> Res {
    // The copy callbacks run first: one that fails makes no type (see keyval.rs), and leaves
    // MPI_DATATYPE_NULL (as MPICH does).
    if !new.is_null() {
        *new = MPI_DATATYPE_NULL;
    }
    datatype::resolve_any(old)?;
    let attrs = crate::keyval::type_copied(old)?;
    put_new(new, || datatype::dup(old))?;
    crate::keyval::type_set_all(*new, attrs);
    Ok(())
}

pub unsafe fn type_commit(dt: *mut MPI_Datatype) -> Res {
    datatype::commit(*out(dt, "datatype")?)
}

pub unsafe fn type_free(dt: *mut MPI_Datatype) -> Res {
    let h = out(dt, "datatype")?;
    // The attributes' delete callbacks run while the type is still valid (they may query it).
    let deleted = if *h >= datatype::TYPE_BASE && datatype::resolve_any(*h).is_ok() { crate::keyval::type_freed(*h) } else { Ok(()) };
    datatype::free(*h)?;
    *h = MPI_DATATYPE_NULL;
    deleted
}

/// MPI_Type_get_value_index: the predefined pair type of (value, index), or MPI_DATATYPE_NULL.
pub unsafe fn type_get_value_index(value: MPI_Datatype, index: MPI_Datatype, pair: *mut MPI_Datatype) -> Res {
    let p = out(pair, "pair_type")?;
    datatype::resolve_any(value)?;
    datatype::resolve_any(index)?;
    *p = match (value, index) {
        (MPI_FLOAT, MPI_INT) => MPI_FLOAT_INT,
        (MPI_DOUBLE, MPI_INT) => MPI_DOUBLE_INT,
        (MPI_LONG, MPI_INT) => MPI_LONG_INT,
        (MPI_INT, MPI_INT) => MPI_2INT,
        (MPI_SHORT, MPI_INT) => MPI_SHORT_INT,
        (MPI_LONG_DOUBLE, MPI_INT) => MPI_LONG_DOUBLE_INT,
        (MPI_REAL, MPI_REAL) => MPI_2REAL,
        (MPI_DOUBLE_PRECISION, MPI_DOUBLE_PRECISION) => MPI_2DOUBLE_PRECISION,
        (MPI_INTEGER, MPI_INTEGER) => MPI_2INTEGER,
        _ => MPI_DATATYPE_NULL,
    };
    Ok(())
}

// ---- envelopes and contents ----------------------------------------------------------------------

fn envelope_of(dt: MPI_Datatype) -> Result<Arc<Type>, MpiErr> {
    Ok(datatype::resolve_any(dt)?.0)
}

pub unsafe fn type_get_envelope_c(dt: MPI_Datatype, ni: *mut MPI_Count, na: *mut MPI_Count, nc: *mut MPI_Count, nd: *mut MPI_Count, combiner: *mut c_int) -> Res {
    let t = envelope_of(dt)?;
    let e = &t.env;
    *out(ni, "num_integers")? = e.ints.len() as MPI_Count;
    *out(na, "num_addresses")? = e.addrs.len() as MPI_Count;
    *out(nc, "num_large_counts")? = e.larges.len() as MPI_Count;
    *out(nd, "num_datatypes")? = e.types.len() as MPI_Count;
    *out(combiner, "combiner")? = e.combiner;
    Ok(())
}

pub unsafe fn type_get_envelope(dt: MPI_Datatype, ni: *mut c_int, na: *mut c_int, nd: *mut c_int, combiner: *mut c_int) -> Res {
    let t = envelope_of(dt)?;
    let e = &t.env;
    if !e.larges.is_empty() {
        return mpi_err!(MPI_ERR_TYPE, "the datatype was made by a large-count constructor: use MPI_Type_get_envelope_c");
    }
    *out(ni, "num_integers")? = e.ints.len() as c_int;
    *out(na, "num_addresses")? = e.addrs.len() as c_int;
    *out(nd, "num_datatypes")? = e.types.len() as c_int;
    *out(combiner, "combiner")? = e.combiner;
    Ok(())
}

/// Copies `v` into the caller's array of `max` entries (MPI_ERR_ARG when it is too short).
unsafe fn fill<T: Copy>(v: &[T], p: *mut T, max: i64, what: &str) -> Res {
    if (max as i128) < v.len() as i128 {
        return mpi_err!(MPI_ERR_ARG, "{what} holds {max} entries, the datatype has {}", v.len());
    }
    if v.is_empty() {
        return Ok(());
    }
    if p.is_null() {
        return mpi_err!(MPI_ERR_ARG, "{what} is NULL");
    }
    // SAFETY: the caller's array holds `max` >= v.len() entries.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p, v.len()) };
    Ok(())
}

/// The old types as handles for the caller: predefined ones as they are, derived ones as new
/// handles the caller frees (the standard's rule).
fn type_handles(t: &Type) -> Vec<MPI_Datatype> {
    // An F90 type is predefined: its own handle, which the caller does not free.
    t.env.types.iter().map(|(h, keep)| keep.as_ref().filter(|k| !crate::f90::is_f90(k.env.combiner)).map_or(*h, datatype::handle_for)).collect()
}

fn contents_check(t: &Type) -> Res {
    if t.env.combiner == MPI_COMBINER_NAMED {
        return mpi_err!(MPI_ERR_ARG, "a predefined datatype has no contents (its combiner is MPI_COMBINER_NAMED)");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn type_get_contents(dt: MPI_Datatype, mi: c_int, ma: c_int, md: c_int, ints: *mut c_int, addrs: *mut MPI_Aint, types: *mut MPI_Datatype) -> Res {
    let t = envelope_of(dt)?;
    contents_check(&t)?;
    if !t.env.larges.is_empty() {
        return mpi_err!(MPI_ERR_TYPE, "the datatype was made by a large-count constructor: use MPI_Type_get_contents_c");
    }
    if (md as i64) < t.env.types.len() as i64 {
        return mpi_err!(MPI_ERR_ARG, "array_of_datatypes holds {md} entries, the datatype has {}", t.env.types.len());
    }
    fill(&t.env.ints, ints, mi as i64, "array_of_integers")?;
    fill(&t.env.addrs, addrs, ma as i64, "array_of_addresses")?;
    fill(&type_handles(&t), types, md as i64, "array_of_datatypes")
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn type_get_contents_c(
    dt: MPI_Datatype,
    mi: MPI_Count,
    ma: MPI_Count,
    mc: MPI_Count,
    md: MPI_Count,
    ints: *mut c_int,
    addrs: *mut MPI_Aint,
    larges: *mut MPI_Count,
    types: *mut MPI_Datatype,
) -> Res {
    let t = envelope_of(dt)?;
    contents_check(&t)?;
    if md < t.env.types.len() as i64 {
        return mpi_err!(MPI_ERR_ARG, "array_of_datatypes holds {md} entries, the datatype has {}", t.env.types.len());
    }
    fill(&t.env.ints, ints, mi, "array_of_integers")?;
    fill(&t.env.addrs, addrs, ma, "array_of_addresses")?;
    fill(&t.env.larges, larges, mc, "array_of_large_counts")?;
    fill(&type_handles(&t), types, md, "array_of_datatypes")
}

// ---- pack and unpack -----------------------------------------------------------------------------

fn check_comm(c: MPI_Comm) -> Res {
    crate::state::check_active()?;
    crate::state::get_comm(c).map(|_| ())
}

/// `*position` as an offset into a buffer of `size` bytes.
fn position(p: *mut MPI_Count, size: i64) -> Result<(&'static mut MPI_Count, usize), MpiErr> {
    let pos = out(p, "position")?;
    if *pos < 0 || *pos > size {
        return mpi_err!(MPI_ERR_ARG, "position {} is outside the buffer of {size} bytes", *pos);
    }
    let at = *pos as usize;
    Ok((pos, at))
}

fn pack_any(inbuf: *const c_void, incount: i64, dt: MPI_Datatype, outbuf: *mut c_void, outsize: i64, pos: *mut MPI_Count, ext32: bool) -> Res {
    if outsize < 0 {
        return mpi_err!(MPI_ERR_ARG, "outsize {outsize} is negative");
    }
    let t = datatype::resolve(dt)?;
    let data = crate::packing::pack_copy(inbuf, incount, dt)?;
    let data = if ext32 { crate::external32::encode(&t.map, &data, incount as u64)? } else { data };
    let (p, at) = position(pos, outsize)?;
    if data.len() as u64 > (outsize as u64 - at as u64) {
        return mpi_err!(MPI_ERR_TRUNCATE, "{} packed bytes do not fit at position {at} of {outsize}", data.len());
    }
    if !data.is_empty() {
        if outbuf.is_null() {
            return mpi_err!(MPI_ERR_BUFFER, "outbuf is NULL");
        }
        // SAFETY: the caller's buffer holds `outsize` bytes, and at + len <= outsize.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (outbuf as *mut u8).add(at), data.len()) };
    }
    *p += data.len() as MPI_Count;
    Ok(())
}

fn unpack_any(inbuf: *const c_void, insize: i64, pos: *mut MPI_Count, outbuf: *mut c_void, outcount: i64, dt: MPI_Datatype, ext32: bool) -> Res {
    if insize < 0 {
        return mpi_err!(MPI_ERR_ARG, "insize {insize} is negative");
    }
    let t = datatype::resolve(dt)?;
    let native = crate::packing::packed_len(&t, outcount)?;
    let need = if ext32 { crate::external32::size(&t.map, outcount as u64)? as usize } else { native };
    let (p, at) = position(pos, insize)?;
    if need as u64 > insize as u64 - at as u64 {
        return mpi_err!(MPI_ERR_TRUNCATE, "{need} bytes to unpack but {} left in the buffer", insize as u64 - at as u64);
    }
    crate::packing::check_typed_buf(outbuf, &t, native, "outbuf")?;
    if need == 0 {
        return Ok(());
    }
    if inbuf.is_null() {
        return mpi_err!(MPI_ERR_BUFFER, "inbuf is NULL");
    }
    // SAFETY: the caller's buffer holds `insize` bytes, and at + need <= insize.
    let src = unsafe { std::slice::from_raw_parts((inbuf as *const u8).add(at), need) };
    let conv;
    let data = if ext32 {
        conv = crate::external32::decode(&t.map, src, outcount as u64)?;
        &conv[..]
    } else {
        src
    };
    // SAFETY: the caller's output buffer holds `outcount` elements of the type.
    unsafe { t.map.unpack(data, outbuf as *mut u8, outcount as u64) };
    *p += need as MPI_Count;
    Ok(())
}

/// `f` on a position held as MPI_Count, for the int and MPI_Aint forms.
fn with_pos<T: Copy + TryFrom<i64> + Into<i64>>(p: *mut T, f: impl FnOnce(*mut MPI_Count) -> Res) -> Res {
    let r = out(p, "position")?;
    let mut pos: MPI_Count = (*r).into();
    f(&mut pos)?;
    *r = T::try_from(pos).map_err(|_| MpiErr::new(MPI_ERR_ARG, format!("position {pos} does not fit the argument")))?;
    Ok(())
}

fn with_pos_aint(p: *mut MPI_Aint, f: impl FnOnce(*mut MPI_Count) -> Res) -> Res {
    let r = out(p, "position")?;
    let mut pos: MPI_Count = *r as MPI_Count;
    f(&mut pos)?;
    *r = pos as MPI_Aint;
    Ok(())
}

fn on(c: MPI_Comm) -> impl Fn(MpiErr) -> MpiErr {
    move |e| e.on(c)
}

pub unsafe fn pack(inbuf: *const c_void, incount: c_int, dt: MPI_Datatype, outbuf: *mut c_void, outsize: c_int, pos: *mut c_int, c: MPI_Comm) -> Res {
    check_comm(c)?;
    with_pos(pos, |p| pack_any(inbuf, incount as i64, dt, outbuf, outsize as i64, p, false)).map_err(on(c))
}
pub unsafe fn pack_c(inbuf: *const c_void, incount: MPI_Count, dt: MPI_Datatype, outbuf: *mut c_void, outsize: MPI_Count, pos: *mut MPI_Count, c: MPI_Comm) -> Res {
    check_comm(c)?;
    pack_any(inbuf, incount, dt, outbuf, outsize, pos, false).map_err(on(c))
}
pub unsafe fn unpack(inbuf: *const c_void, insize: c_int, pos: *mut c_int, outbuf: *mut c_void, outcount: c_int, dt: MPI_Datatype, c: MPI_Comm) -> Res {
    check_comm(c)?;
    with_pos(pos, |p| unpack_any(inbuf, insize as i64, p, outbuf, outcount as i64, dt, false)).map_err(on(c))
}
pub unsafe fn unpack_c(inbuf: *const c_void, insize: MPI_Count, pos: *mut MPI_Count, outbuf: *mut c_void, outcount: MPI_Count, dt: MPI_Datatype, c: MPI_Comm) -> Res {
    check_comm(c)?;
    unpack_any(inbuf, insize, pos, outbuf, outcount, dt, false).map_err(on(c))
}

fn pack_size_any(incount: i64, dt: MPI_Datatype, c: MPI_Comm) -> Result<i64, MpiErr> {
    check_comm(c)?;
    let t = datatype::resolve(dt).map_err(on(c))?;
    Ok(crate::packing::packed_len(&t, incount).map_err(on(c))? as i64)
}
pub unsafe fn pack_size(incount: c_int, dt: MPI_Datatype, c: MPI_Comm, size: *mut c_int) -> Res {
    let n = pack_size_any(incount as i64, dt, c)?;
    *out(size, "size").map_err(on(c))? = int_or_undefined(n);
    Ok(())
}
pub unsafe fn pack_size_c(incount: MPI_Count, dt: MPI_Datatype, c: MPI_Comm, size: *mut MPI_Count) -> Res {
    let n = pack_size_any(incount, dt, c)?;
    *out(size, "size").map_err(on(c))? = n;
    Ok(())
}

fn datarep(d: *const c_char) -> Res {
    if d.is_null() {
        return mpi_err!(MPI_ERR_ARG, "datarep is NULL");
    }
    // SAFETY: a NUL-terminated string from the caller.
    let s = unsafe { std::ffi::CStr::from_ptr(d) };
    if s.to_bytes() != b"external32" {
        return mpi_err!(MPI_ERR_ARG, "data representation {:?} is not \"external32\"", s.to_string_lossy());
    }
    Ok(())
}

pub unsafe fn pack_external(d: *const c_char, inbuf: *const c_void, incount: c_int, dt: MPI_Datatype, outbuf: *mut c_void, outsize: MPI_Aint, pos: *mut MPI_Aint) -> Res {
    datarep(d)?;
    with_pos_aint(pos, |p| pack_any(inbuf, incount as i64, dt, outbuf, outsize as i64, p, true))
}
pub unsafe fn pack_external_c(d: *const c_char, inbuf: *const c_void, incount: MPI_Count, dt: MPI_Datatype, outbuf: *mut c_void, outsize: MPI_Count, pos: *mut MPI_Count) -> Res {
    datarep(d)?;
    pack_any(inbuf, incount, dt, outbuf, outsize, pos, true)
}
pub unsafe fn unpack_external(d: *const c_char, inbuf: *const c_void, insize: MPI_Aint, pos: *mut MPI_Aint, outbuf: *mut c_void, outcount: c_int, dt: MPI_Datatype) -> Res {
    datarep(d)?;
    with_pos_aint(pos, |p| unpack_any(inbuf, insize as i64, p, outbuf, outcount as i64, dt, true))
}
pub unsafe fn unpack_external_c(d: *const c_char, inbuf: *const c_void, insize: MPI_Count, pos: *mut MPI_Count, outbuf: *mut c_void, outcount: MPI_Count, dt: MPI_Datatype) -> Res {
    datarep(d)?;
    unpack_any(inbuf, insize, pos, outbuf, outcount, dt, true)
}

fn pack_external_size_any(d: *const c_char, incount: i64, dt: MPI_Datatype) -> Result<i64, MpiErr> {
    datarep(d)?;
    let t = datatype::resolve(dt)?;
    if incount < 0 {
        return mpi_err!(MPI_ERR_COUNT, "count {incount} is negative");
    }
    Ok(crate::external32::size(&t.map, incount as u64)? as i64)
}
pub unsafe fn pack_external_size(d: *const c_char, incount: c_int, dt: MPI_Datatype, size: *mut MPI_Aint) -> Res {
    let n = pack_external_size_any(d, incount as i64, dt)?;
    *out(size, "size")? = n as MPI_Aint;
    Ok(())
}
pub unsafe fn pack_external_size_c(d: *const c_char, incount: MPI_Count, dt: MPI_Datatype, size: *mut MPI_Count) -> Res {
    let n = pack_external_size_any(d, incount, dt)?;
    *out(size, "size")? = n;
    Ok(())
}

/// MPI_Type_match_size: the sized Fortran type of a type class and byte size.
pub unsafe fn type_match_size(typeclass: c_int, size: c_int, dt: *mut MPI_Datatype) -> Res {
    let o = out(dt, "datatype")?;
    let t = match (typeclass, size) {
        (MPIX_TYPECLASS_LOGICAL, 1) => MPI_LOGICAL1,
        (MPIX_TYPECLASS_LOGICAL, 2) => MPI_LOGICAL2,
        (MPIX_TYPECLASS_LOGICAL, 4) => MPI_LOGICAL4,
        (MPIX_TYPECLASS_LOGICAL, 8) => MPI_LOGICAL8,
        (MPI_TYPECLASS_INTEGER, 1) => MPI_INTEGER1,
        (MPI_TYPECLASS_INTEGER, 2) => MPI_INTEGER2,
        (MPI_TYPECLASS_INTEGER, 4) => MPI_INTEGER4,
        (MPI_TYPECLASS_INTEGER, 8) => MPI_INTEGER8,
        (MPI_TYPECLASS_INTEGER, 16) => MPI_INTEGER16,
        (MPI_TYPECLASS_REAL, 2) => MPI_REAL2,
        (MPI_TYPECLASS_REAL, 4) => MPI_REAL4,
        (MPI_TYPECLASS_REAL, 8) => MPI_REAL8,
        (MPI_TYPECLASS_REAL, 16) => MPI_REAL16,
        (MPI_TYPECLASS_COMPLEX, 4) => MPI_COMPLEX4,
        (MPI_TYPECLASS_COMPLEX, 8) => MPI_COMPLEX8,
        (MPI_TYPECLASS_COMPLEX, 16) => MPI_COMPLEX16,
        (MPI_TYPECLASS_COMPLEX, 32) => MPI_COMPLEX32,
        _ => return mpi_err!(MPI_ERR_ARG, "no predefined datatype of type class {typeclass} and size {size}"),
    };
    *o = t;
    Ok(())
}
