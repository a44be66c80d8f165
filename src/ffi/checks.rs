//! Argument checks shared by the exports: pointers, enum values, sizes, ranks.

use crate::buffer::{ConstBuf, MutBuf};
use crate::comm::Comm;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result, Status};
use std::ffi::{c_char, CStr};
use std::sync::Arc;

fn invalid(msg: String) -> Error {
    Error::new(Status::InvalidArgument, msg)
}

/// The comm behind a handle.
///
/// # Safety
/// `p` must be NULL or a handle returned by the library and not yet destroyed.
pub unsafe fn comm<'a>(p: *const Comm) -> Result<&'a Comm> {
    p.as_ref().ok_or_else(|| invalid("comm is NULL".into()))
}

/// A new strong reference to the comm behind a handle (for work that outlives the call).
///
/// # Safety
/// As for `comm`.
pub unsafe fn comm_arc(p: *const Comm) -> Result<Arc<Comm>> {
    comm(p)?;
    Arc::increment_strong_count(p);
    Ok(Arc::from_raw(p))
}

/// A writable out-pointer.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
pub unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    p.as_mut().ok_or_else(|| invalid(format!("{what} is NULL")))
}

pub fn dtype(v: i32) -> Result<DType> {
    DType::from_raw(v as i64).ok_or_else(|| invalid(format!("invalid dtype {v} (expected DC_INT8..DC_BFLOAT16, 0..9)")))
}

pub fn op(v: i32, dt: DType) -> Result<ReduceOp> {
    let op = ReduceOp::from_raw(v as i64).ok_or_else(|| invalid(format!("invalid op {v} (expected DC_SUM..DC_BXOR, 0..7)")))?;
    if !op.valid_for(dt) {
        return Err(invalid(format!("op {} is not defined for floating dtype {}", op.name(), dt.name())));
    }
    Ok(op)
}

/// Byte size of `count` elements, refusing overflow.
pub fn bytes(count: usize, dt: DType, what: &str) -> Result<usize> {
    count
        .checked_mul(dt.size())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| invalid(format!("{what}: count {count} of {} overflows the address space", dt.name())))
}

pub fn rank_in(r: i32, size: usize, what: &str) -> Result<usize> {
    if r < 0 || r as usize >= size {
        return Err(invalid(format!("{what} {r} is outside [0, {size})")));
    }
    Ok(r as usize)
}

/// Read-only buffer of `len` bytes; NULL only allowed when `len == 0`.
///
/// # Safety
/// A non-NULL `p` must be valid for `len` bytes until the operation completes.
pub unsafe fn src_buf(p: *const libc::c_void, len: usize, what: &str) -> Result<ConstBuf> {
    if p.is_null() && len > 0 {
        return Err(invalid(format!("{what} is NULL")));
    }
    Ok(ConstBuf::new(p as *const u8, len))
}

/// Writable buffer of `len` bytes; NULL only allowed when `len == 0`.
///
/// # Safety
/// As for `src_buf`, writable.
pub unsafe fn dst_buf(p: *mut libc::c_void, len: usize, what: &str) -> Result<MutBuf> {
    if p.is_null() && len > 0 {
        return Err(invalid(format!("{what} is NULL")));
    }
    Ok(MutBuf::new(p as *mut u8, len))
}

/// Reads `n` entries of a caller array.
///
/// # Safety
/// A non-NULL `p` must be valid for `n` reads.
pub unsafe fn array<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    Ok(std::slice::from_raw_parts(p, n))
}

/// Converts per-rank element counts and displacements to bytes; returns them and the byte
/// length the buffer must have. Blocks may not overlap each other.
pub fn layout(counts: &[usize], displs: &[usize], dt: DType, what: &str) -> Result<(Vec<usize>, Vec<usize>, usize)> {
    let mut c = Vec::with_capacity(counts.len());
    let mut d = Vec::with_capacity(counts.len());
    let mut end = 0usize;
    for (i, (&n, &off)) in counts.iter().zip(displs).enumerate() {
        let nb = bytes(n, dt, what)?;
        let ob = bytes(off, dt, what)?;
        let e = ob.checked_add(nb).filter(|&e| e <= isize::MAX as usize).ok_or_else(|| invalid(format!("{what}: block {i} overflows")))?;
        end = end.max(e);
        c.push(nb);
        d.push(ob);
    }
    let mut spans: Vec<(usize, usize)> = d.iter().zip(&c).filter(|(_, &n)| n > 0).map(|(&o, &n)| (o, o + n)).collect();
    spans.sort_unstable();
    if spans.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(invalid(format!("{what}: blocks overlap")));
    }
    Ok((c, d, end))
}

/// An optional C string as UTF-8.
///
/// # Safety
/// A non-NULL `p` must point at a NUL-terminated string.
pub unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>> {
    if p.is_null() {
        return Ok(None);
    }
    CStr::from_ptr(p).to_str().map(|s| Some(s.to_string())).map_err(|_| invalid(format!("{what} is not valid UTF-8")))
}

/// Adds "rank R of N" to errors raised while serving `comm`.
#[inline]
pub fn on_rank<T>(comm: &Comm, f: impl FnOnce() -> Result<T>) -> Result<T> {
    f().map_err(|e| e.context(format!("rank {} of {}", comm.rank(), comm.size())))
}
