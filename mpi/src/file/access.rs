//! The data access functions, one table of where (an explicit offset, the individual file
//! pointer, the shared one) by how (independent, collective, ordered) by when the caller learns
//! the outcome (a status now, a request, a split collective's end call).
//!
//! Non-blocking calls do their transfer before they return and give a completed request (the
//! standard lets a request be complete at once). Collective writes end with a barrier of the
//! file's group, so that after MPI_File_write_all returns anywhere every member's data is in
//! the file (what a collective read right after it expects, as two-phase I/O gives it).
//! Split collectives run the whole collective in the begin call; the end call gives its status.

use super::io::{data_bytes, transfer, Data};
use super::{with_file, File};
use crate::abi_gen::*;
use crate::api::{out, write_status};
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use distcomm::buffer::{ConstBuf, MutBuf};
use distcomm::collective::CollArgs;
use distcomm::DType;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

/// Where an access starts.
#[derive(Clone, Copy)]
enum Place {
    /// An explicit offset, in etypes of the view.
    At(MPI_Offset),
    /// The process's own file pointer, advanced by the data moved.
    Individual,
    /// The file pointer the group shares, advanced by the data asked for.
    Shared,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Independent,
    Collective,
    /// Collective on the shared pointer, in rank order (MPI_File_read_ordered, write_ordered).
    Ordered,
}

/// Where the outcome goes.
enum Out {
    Status(*mut MPI_Status),
    Request(*mut MPI_Request),
    /// A split collective's begin call: its status waits for the end call of this name.
    Split(&'static str),
}

/// Data access `count` elements of `dt` through file `h`.
fn access(h: MPI_File, place: Place, mode: Mode, data: Data, count: MPI_Count, dt: MPI_Datatype, to: Out) -> Res {
    with_file(h, |f| {
        if let Out::Split(_) = to {
            if let Some((begun, _)) = *f.split.lock().unwrap_or_else(|p| p.into_inner()) {
                return mpi_err!(MPI_ERR_OTHER, "a split collective ({begun}) is still open on this file: only one at a time");
            }
        }
        let r = f.check_access(data.is_write()).and_then(|()| moved(f, place, mode, data, count, dt));
        // A collective write waits for every member, whatever happened here.
        let synced = if mode != Mode::Independent && data.is_write() { barrier(f) } else { Ok(()) };
        let n = r?;
        synced?;
        let mut st = crate::request::empty_status();
        crate::request::set_count(&mut st, n);
        match to {
            Out::Status(p) => write_status(p, st),
            Out::Request(p) => *out(p, "request")? = crate::request::add(crate::request::Req::Done(st)),
            Out::Split(name) => *f.split.lock().unwrap_or_else(|p| p.into_inner()) = Some((name, st)),
        }
        Ok(())
    })
}

/// The transfer of one access: bytes moved.
fn moved(f: &File, place: Place, mode: Mode, data: Data, count: MPI_Count, dt: MPI_Datatype) -> Result<usize, MpiErr> {
    let view = f.view();
    match (place, mode) {
        (Place::At(off), _) => transfer(f, &view, off, data, count, dt),
        (Place::Individual, _) => {
            let _g = f.io.lock().unwrap_or_else(|p| p.into_inner());
            let n = transfer(f, &view, f.pos.load(Ordering::Relaxed), data, count, dt)?;
            f.pos.fetch_add((n as u64 / view.esize) as i64, Ordering::Relaxed);
            Ok(n)
        }
        (Place::Shared, Mode::Ordered) => {
            let etypes = (data_bytes(&view, count, dt)?.0 / view.esize) as i64;
            let (mine, total) = rank_order(f, etypes)?;
            let base = if f.comm.rank() == 0 { f.shared_add(total) } else { Ok(0) };
            let base = bcast_i64(f, base)?;
            transfer(f, &view, base + mine, data, count, dt)
        }
        (Place::Shared, _) => {
            let etypes = (data_bytes(&view, count, dt)?.0 / view.esize) as i64;
            let at = f.shared_add(etypes)?;
            transfer(f, &view, at, data, count, dt)
        }
    }
}

/// This rank's etypes before it in rank order, and the group's total.
fn rank_order(f: &File, etypes: i64) -> Result<(i64, i64), MpiErr> {
    let mut all = vec![0u8; 8 * f.comm.size()];
    f.comm
        .collective(CollArgs::Allgather { send: Some(ConstBuf::from_slice(&etypes.to_le_bytes())), recv: MutBuf::from_slice(&mut all), dt: DType::Int64 })
        .map_err(MpiErr::from)?;
    let n: Vec<i64> = all.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    Ok((n[..f.comm.rank()].iter().sum(), n.iter().sum()))
}

/// Rank 0's value (or its error) to every member.
pub(super) fn bcast_i64(f: &File, v: Result<i64, MpiErr>) -> Result<i64, MpiErr> {
    if f.comm.size() == 1 {
        return v;
    }
    // [ok, value]: the others learn that rank 0 failed, and fail too.
    let b = super::bcast_i64s(&f.comm, match &v {
        Ok(x) => [1, *x],
        Err(_) => [0, 0],
    })?;
    match (v, b[0]) {
        (Err(e), _) => Err(e),
        (Ok(_), 1) => Ok(b[1]),
        _ => mpi_err!(MPI_ERR_OTHER, "rank 0 of the file's group could not update the shared file pointer"),
    }
}

pub(super) fn barrier(f: &File) -> Res {
    if f.comm.size() == 1 {
        return Ok(());
    }
    f.comm.collective(CollArgs::Barrier).map_err(MpiErr::from)
}

/// A split collective's end call: the status of the begin call named `begun`.
fn split_end(h: MPI_File, begun: &'static str, st: *mut MPI_Status) -> Res {
    with_file(h, |f| {
        let mut s = f.split.lock().unwrap_or_else(|p| p.into_inner());
        match *s {
            Some((name, status)) if name == begun => {
                *s = None;
                write_status(st, status);
                Ok(())
            }
            Some((name, _)) => mpi_err!(MPI_ERR_OTHER, "the open split collective is {name}, not {begun}"),
            None => mpi_err!(MPI_ERR_OTHER, "no {begun} is open on this file"),
        }
    })
}

/// The `_c` form (MPI_Count) and the int form of each data access function.
macro_rules! data_access {
    ($($name:ident $name_c:ident ($($pre:ident: $pt:ty),*; $buf:ty; $($post:ident: $qt:ty),*) => $place:expr, $mode:expr, $to:expr;)*) => {$(
        pub unsafe fn $name_c(h: MPI_File, $($pre: $pt,)* buf: $buf, count: MPI_Count, dt: MPI_Datatype $(, $post: $qt)*) -> Res {
            access(h, $place, $mode, Data::from(buf), count, dt, $to)
        }
        pub unsafe fn $name(h: MPI_File, $($pre: $pt,)* buf: $buf, count: c_int, dt: MPI_Datatype $(, $post: $qt)*) -> Res {
            access(h, $place, $mode, Data::from(buf), count as MPI_Count, dt, $to)
        }
    )*};
}

use Mode::{Collective, Independent, Ordered};
use Place::{At, Individual, Shared};

data_access! {
    file_read_at file_read_at_c (off: MPI_Offset; *mut c_void; st: *mut MPI_Status) => At(off), Independent, Out::Status(st);
    file_write_at file_write_at_c (off: MPI_Offset; *const c_void; st: *mut MPI_Status) => At(off), Independent, Out::Status(st);
    file_iread_at file_iread_at_c (off: MPI_Offset; *mut c_void; r: *mut MPI_Request) => At(off), Independent, Out::Request(r);
    file_iwrite_at file_iwrite_at_c (off: MPI_Offset; *const c_void; r: *mut MPI_Request) => At(off), Independent, Out::Request(r);
    file_read_at_all file_read_at_all_c (off: MPI_Offset; *mut c_void; st: *mut MPI_Status) => At(off), Collective, Out::Status(st);
    file_write_at_all file_write_at_all_c (off: MPI_Offset; *const c_void; st: *mut MPI_Status) => At(off), Collective, Out::Status(st);
    file_iread_at_all file_iread_at_all_c (off: MPI_Offset; *mut c_void; r: *mut MPI_Request) => At(off), Collective, Out::Request(r);
    file_iwrite_at_all file_iwrite_at_all_c (off: MPI_Offset; *const c_void; r: *mut MPI_Request) => At(off), Collective, Out::Request(r);
    file_read_at_all_begin file_read_at_all_begin_c (off: MPI_Offset; *mut c_void;) => At(off), Collective, Out::Split("MPI_File_read_at_all_begin");
    file_write_at_all_begin file_write_at_all_begin_c (off: MPI_Offset; *const c_void;) => At(off), Collective, Out::Split("MPI_File_write_at_all_begin");

    file_read file_read_c (; *mut c_void; st: *mut MPI_Status) => Individual, Independent, Out::Status(st);
    file_write file_write_c (; *const c_void; st: *mut MPI_Status) => Individual, Independent, Out::Status(st);
    file_iread file_iread_c (; *mut c_void; r: *mut MPI_Request) => Individual, Independent, Out::Request(r);
    file_iwrite file_iwrite_c (; *const c_void; r: *mut MPI_Request) => Individual, Independent, Out::Request(r);
    file_read_all file_read_all_c (; *mut c_void; st: *mut MPI_Status) => Individual, Collective, Out::Status(st);
    file_write_all file_write_all_c (; *const c_void; st: *mut MPI_Status) => Individual, Collective, Out::Status(st);
    file_iread_all file_iread_all_c (; *mut c_void; r: *mut MPI_Request) => Individual, Collective, Out::Request(r);
    file_iwrite_all file_iwrite_all_c (; *const c_void; r: *mut MPI_Request) => Individual, Collective, Out::Request(r);
    file_read_all_begin file_read_all_begin_c (; *mut c_void;) => Individual, Collective, Out::Split("MPI_File_read_all_begin");
    file_write_all_begin file_write_all_begin_c (; *const c_void;) => Individual, Collective, Out::Split("MPI_File_write_all_begin");

    file_read_shared file_read_shared_c (; *mut c_void; st: *mut MPI_Status) => Shared, Independent, Out::Status(st);
    file_write_shared file_write_shared_c (; *const c_void; st: *mut MPI_Status) => Shared, Independent, Out::Status(st);
    file_iread_shared file_iread_shared_c (; *mut c_void; r: *mut MPI_Request) => Shared, Independent, Out::Request(r);
    file_iwrite_shared file_iwrite_shared_c (; *const c_void; r: *mut MPI_Request) => Shared, Independent, Out::Request(r);
    file_read_ordered file_read_ordered_c (; *mut c_void; st: *mut MPI_Status) => Shared, Ordered, Out::Status(st);
    file_write_ordered file_write_ordered_c (; *const c_void; st: *mut MPI_Status) => Shared, Ordered, Out::Status(st);
    file_read_ordered_begin file_read_ordered_begin_c (; *mut c_void;) => Shared, Ordered, Out::Split("MPI_File_read_ordered_begin");
    file_write_ordered_begin file_write_ordered_begin_c (; *const c_void;) => Shared, Ordered, Out::Split("MPI_File_write_ordered_begin");
}

pub unsafe fn file_read_at_all_end(h: MPI_File, _buf: *mut c_void, st: *mut MPI_Status) -> Res {
    split_end(h, "MPI_File_read_at_all_begin", st)
}
pub unsafe fn file_write_at_all_end(h: MPI_File, _buf: *const c_void, st: *mut MPI_Status) -> Res {
    split_end(h, "MPI_File_write_at_all_begin", st)
}
pub unsafe fn file_read_all_end(h: MPI_File, _buf: *mut c_void, st: *mut MPI_Status) -> Res {
    split_end(h, "MPI_File_read_all_begin", st)
}
pub unsafe fn file_write_all_end(h: MPI_File, _buf: *const c_void, st: *mut MPI_Status) -> Res {
    split_end(h, "MPI_File_write_all_begin", st)
}
pub unsafe fn file_read_ordered_end(h: MPI_File, _buf: *mut c_void, st: *mut MPI_Status) -> Res {
    split_end(h, "MPI_File_read_ordered_begin", st)
}
pub unsafe fn file_write_ordered_end(h: MPI_File, _buf: *const c_void, st: *mut MPI_Status) -> Res {
    split_end(h, "MPI_File_write_ordered_begin", st)
}
