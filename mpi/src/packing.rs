//! Point-to-point data of any datatype as the engine moves it: dense types straight from and
//! into the caller's memory, others through a packed buffer of ours (packed before a send
//! starts; unpacked into the caller's memory when the receive completes).

use crate::abi_gen::*;
use crate::datatype::{self, Type};
use crate::err::MpiErr;
use crate::request::Req;
use std::ffi::c_void;
use std::sync::Arc;

/// Where received packed bytes go: `count` elements of `t` at `addr` (the Arc keeps the type
/// map alive even if the handle is freed before the receive completes).
pub struct Unpack {
    addr: usize,
    count: u64,
    t: Arc<Type>,
}

impl Unpack {
    pub fn run(self, data: &[u8]) {
        // SAFETY: the caller's receive buffer holds `count` elements of the type until the
        // receive completes (MPI's rule), and this runs once, at completion.
        unsafe { self.t.map.unpack(data, self.addr as *mut u8, self.count) }
    }
}

/// A send or receive of a non-dense datatype: the engine moves `buf`.
pub struct Packed {
    pub inner: Req,
    pub buf: Vec<u8>,
    pub unpack: Option<Unpack>,
}

/// Bytes that `count` elements of `t` are packed (MPI_ERR_COUNT when negative or too many).
pub fn packed_len(t: &Type, count: i64) -> Result<usize, MpiErr> {
    count_bytes(count, |n| t.map.packed_bytes(n))
}

fn count_bytes(count: i64, bytes: impl FnOnce(u64) -> Option<u64>) -> Result<usize, MpiErr> {
    if count < 0 {
        return crate::mpi_err!(MPI_ERR_COUNT, "count {count} is negative");
    }
    bytes(count as u64).map(|b| b as usize).ok_or_else(|| MpiErr::new(MPI_ERR_COUNT, format!("count {count} overflows")))
}

/// The bytes of `count` elements of a dense predefined `dt` at `buf` where the call is valid
/// (count, buffer); None for any other type and for every error, which the general path then
/// reports. For the shortcuts of the commonest calls: no error is built on their way.
#[inline]
pub(crate) fn dense_run(buf: *const c_void, count: i64, dt: MPI_Datatype) -> Option<usize> {
    let n = dense_bytes(dt, count)?;
    (n == 0 || !buf.is_null()).then_some(n)
}

/// Bytes of `count` elements of a dense predefined `dt` (None: another type, or a count that
/// is negative or too large), without building an error.
#[inline]
pub(crate) fn dense_bytes(dt: MPI_Datatype, count: i64) -> Option<usize> {
    datatype::predefined_ref(dt).filter(|d| d.dense)?.bytes_if_valid(count)
}

/// The caller's bytes of `count` elements of `dt` where `dt` is a dense predefined type (one
/// run at `buf`, nothing to pack): answered without looking the type up, which every send and
/// receive of a basic type would do. None for the other types.
pub(crate) fn dense_predefined(buf: *const c_void, count: i64, dt: MPI_Datatype) -> Option<Result<usize, MpiErr>> {
    let d = datatype::predefined_ref(dt).filter(|d| d.dense)?;
    Some(count_bytes(count, |n| crate::typemap::packed_bytes(d.size as u64, n)).and_then(|len| refuse_null(buf, len, "buf").map(|_| len)))
}

/// The packed bytes of `count` elements of `dt` at `buf`, with the checks of a send or receive
/// (count, committed type, NULL buffer); a dense predefined type without a type lookup.
pub fn checked_len(buf: *const c_void, count: i64, dt: MPI_Datatype) -> Result<usize, MpiErr> {
    if let Some(len) = dense_predefined(buf, count, dt) {
        return len;
    }
    Ok(resolved(buf, count, dt)?.1)
}

/// The committed type behind `dt` and the packed bytes of `count` of it at `buf`, checked as
/// a send or receive buffer.
/// No elements of MPI_DATATYPE_NULL are taken as no bytes, as MPICH takes them (its own test
/// suite receives them from MPI_PROC_NULL); with a count, the null type is refused.
fn resolved(buf: *const c_void, count: i64, dt: MPI_Datatype) -> Result<(Arc<Type>, usize), MpiErr> {
    let dt = if count == 0 && dt == MPI_DATATYPE_NULL { MPI_BYTE } else { dt };
    let t = datatype::resolve(dt)?;
    let len = packed_len(&t, count)?;
    check_typed_buf(buf, &t, len, "buf")?;
    Ok((t, len))
}

/// A NULL buffer is refused when it holds data, except for a derived type whose data does not
/// start at its address (MPI_BOTTOM with absolute displacements from MPI_Get_address).
pub fn check_typed_buf(buf: *const c_void, t: &Type, len: usize, what: &str) -> Result<(), MpiErr> {
    if t.env.combiner == MPI_COMBINER_NAMED || t.map.true_lb == 0 {
        return refuse_null(buf, len, what);
    }
    Ok(())
}

fn refuse_null(buf: *const c_void, len: usize, what: &str) -> Result<(), MpiErr> {
    if buf.is_null() && len > 0 {
        return crate::mpi_err!(MPI_ERR_BUFFER, "{what} is NULL with a non-zero count");
    }
    Ok(())
}

/// The bytes a send moves.
pub struct Outgoing {
    pub ptr: *const u8,
    pub len: usize,
    pub keep: Option<Vec<u8>>,
}

pub fn outgoing(buf: *const c_void, count: i64, dt: MPI_Datatype) -> Result<Outgoing, MpiErr> {
    if let Some(len) = dense_predefined(buf, count, dt) {
        return Ok(Outgoing { ptr: buf as *const u8, len: len?, keep: None });
    }
    let (t, len) = resolved(buf, count, dt)?;
    if let Some(off) = t.map.one_run(count as u64) {
        return Ok(Outgoing { ptr: (buf as *const u8).wrapping_offset(off as isize), len, keep: None });
    }
    let mut v = vec![0u8; len];
    // SAFETY: the caller's buffer holds `count` elements of the type.
    unsafe { t.map.pack(buf as *const u8, count as u64, &mut v) };
    Ok(Outgoing { ptr: v.as_ptr(), len, keep: Some(v) })
}

/// The packed bytes of `count` elements at `buf`, always a copy (buffered sends, replace).
pub fn pack_copy(buf: *const c_void, count: i64, dt: MPI_Datatype) -> Result<Vec<u8>, MpiErr> {
    let (t, len) = resolved(buf, count, dt)?;
    let mut v = vec![0u8; len];
    // SAFETY: as in `outgoing`.
    unsafe { t.map.pack(buf as *const u8, count as u64, &mut v) };
    Ok(v)
}

/// Where a receive puts the bytes.
pub struct Incoming {
    pub ptr: *mut u8,
    pub len: usize,
    pub tmp: Option<(Vec<u8>, Unpack)>,
}

pub fn incoming(buf: *mut c_void, count: i64, dt: MPI_Datatype) -> Result<Incoming, MpiErr> {
    if let Some(len) = dense_predefined(buf, count, dt) {
        return Ok(Incoming { ptr: buf as *mut u8, len: len?, tmp: None });
    }
    let (t, len) = resolved(buf as *const c_void, count, dt)?;
    if let Some(off) = t.map.one_run(count as u64) {
        return Ok(Incoming { ptr: (buf as *mut u8).wrapping_offset(off as isize), len, tmp: None });
    }
    let mut v = vec![0u8; len];
    let ptr = v.as_mut_ptr();
    Ok(Incoming { ptr, len, tmp: Some((v, Unpack { addr: buf as usize, count: count as u64, t })) })
}

/// The request of an operation on packed bytes (or the operation itself when there are none).
pub fn wrap(inner: Req, buf: Option<Vec<u8>>, unpack: Option<Unpack>) -> Req {
    match (buf, unpack) {
        (None, None) => inner,
        (buf, unpack) => Req::Packed(Box::new(Packed { inner, buf: buf.unwrap_or_default(), unpack })),
    }
}

pub fn wrap_recv(inner: Req, tmp: Option<(Vec<u8>, Unpack)>) -> Req {
    match tmp {
        None => inner,
        Some((buf, u)) => wrap(inner, Some(buf), Some(u)),
    }
}
