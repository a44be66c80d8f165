//! Moving a process's data between its memory and the file through its view: the caller's
//! elements packed (or taken in place when dense), converted for external32, and read or
//! written range by range with pread / pwrite. In atomic mode the ranges' span is locked
//! (open file description locks) for the whole access, so that another process sees all of it
//! or none.

use super::view::View;
use super::{errno, io_err, File};
use crate::abi_gen::*;
use crate::datatype::Type;
use crate::err::MpiErr;
use crate::mpi_err;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// The caller's buffer and which way the data goes.
#[derive(Clone, Copy)]
pub enum Data {
    Read(*mut c_void),
    Write(*const c_void),
}

impl From<*mut c_void> for Data {
    fn from(p: *mut c_void) -> Data {
        Data::Read(p)
    }
}

impl From<*const c_void> for Data {
    fn from(p: *const c_void) -> Data {
        Data::Write(p)
    }
}

impl Data {
    pub fn is_write(self) -> bool {
        matches!(self, Data::Write(_))
    }
}

/// The bytes `count` elements of `dt` take in the view's data (a whole number of etypes), and
/// the type.
pub fn data_bytes(view: &View, count: MPI_Count, dt: MPI_Datatype) -> Result<(u64, Arc<Type>), MpiErr> {
    if count < 0 {
        return mpi_err!(MPI_ERR_COUNT, "count {count} is negative");
    }
    let t = crate::datatype::resolve(dt)?;
    let n = t.map.size.checked_mul(count as u64).ok_or_else(|| MpiErr::new(MPI_ERR_COUNT, format!("{count} elements overflow")))?;
    if n % view.esize != 0 {
        return mpi_err!(MPI_ERR_ARG, "{n} bytes are not a whole number of the view's etypes ({} bytes each)", view.esize);
    }
    Ok((n, t))
}

/// Reads or writes `count` elements of `dt` at the view's etype offset `at`: the bytes moved
/// (a read stops at the end of the file).
pub fn transfer(f: &File, view: &View, at: i64, data: Data, count: MPI_Count, dt: MPI_Datatype) -> Result<usize, MpiErr> {
    if at < 0 {
        return mpi_err!(MPI_ERR_ARG, "offset {at} is negative");
    }
    let (bytes, t) = data_bytes(view, count, dt)?;
    let pos = (at as u64).checked_mul(view.esize).ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("offset {at} overflows")))?;
    view.datarep.check(&t, "the datatype")?;
    let _lock = if f.is_atomic() && bytes > 0 { Some(RangeLock::take(f, view, pos, bytes, data.is_write())?) } else { None };
    match data {
        Data::Write(buf) => {
            let o = crate::packing::outgoing(buf, count, dt)?;
            // SAFETY: `outgoing` gives o.len readable bytes.
            let native = unsafe { std::slice::from_raw_parts(o.ptr, o.len) };
            let converted = view.datarep.to_file(native, buf, count, &t, dt)?;
            let src = converted.as_deref().unwrap_or(native);
            let mut done = 0usize;
            if bytes > 0 {
                f.dirty.store(true, std::sync::atomic::Ordering::Release);
            }
            view.for_each_range(pos, bytes, |off, n| {
                pwrite_all(f, &src[done..done + n], off)?;
                done += n;
                Ok(true)
            })?;
            Ok(done)
        }
        Data::Read(buf) => {
            let size = t.map.size;
            let whole = |done: usize| if size == 0 { 0 } else { done as u64 / size };
            if view.datarep.reads_into_caller() {
                // The program's conversion reads the file's bytes into its buffer.
                let mut file = vec![0u8; bytes as usize];
                let done = read_ranges(f, view, pos, bytes, &mut file)?;
                let n = whole(done);
                view.datarep.from_file(&mut file[..(n * size) as usize], buf, n, &t, dt)?;
                return Ok(done);
            }
            let i = crate::packing::incoming(buf, count, dt)?;
            // SAFETY: `incoming` gives i.len writable bytes (the caller's or ours).
            let dst = unsafe { std::slice::from_raw_parts_mut(i.ptr, i.len) };
            let done = read_ranges(f, view, pos, bytes, dst)?;
            if view.datarep.converts_reads() {
                let n = whole(done);
                view.datarep.from_file(&mut dst[..(n * size) as usize], buf, n, &t, dt)?;
            }
            if let Some((tmp, unpack)) = i.tmp {
                unpack.run(&tmp[..done]);
            }
            Ok(done)
        }
    }
}

/// Reads the view's `bytes` from data byte `pos` into `dst`: the bytes read (fewer at the end
/// of the file).
fn read_ranges(f: &File, view: &View, pos: u64, bytes: u64, dst: &mut [u8]) -> Result<usize, MpiErr> {
    let mut done = 0usize;
    view.for_each_range(pos, bytes, |off, n| {
        let got = pread_full(f, &mut dst[done..done + n], off)?;
        done += got;
        Ok(got == n)
    })?;
    Ok(done)
}

fn pwrite_all(f: &File, mut src: &[u8], mut off: i64) -> Result<(), MpiErr> {
    while !src.is_empty() {
        // SAFETY: src is readable for its length; the fd is the file's.
        let n = unsafe { libc::pwrite(f.fd, src.as_ptr() as *const c_void, src.len(), off) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(io_err("cannot write", &f.path, e));
        }
        src = &src[n as usize..];
        off += n as i64;
    }
    Ok(())
}

/// Fills `dst` from `off` up to the end of the file: the bytes read.
fn pread_full(f: &File, dst: &mut [u8], off: i64) -> Result<usize, MpiErr> {
    let mut got = 0;
    while got < dst.len() {
        // SAFETY: dst is writable for its length; the fd is the file's.
        let n = unsafe { libc::pread(f.fd, dst[got..].as_mut_ptr() as *mut c_void, dst.len() - got, off + got as i64) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(io_err("cannot read", &f.path, e));
        }
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    Ok(got)
}

/// An open file description lock on the bytes an access spans, released when dropped.
struct RangeLock<'a> {
    f: &'a File,
    start: i64,
    len: i64,
}

impl<'a> RangeLock<'a> {
    fn take(f: &'a File, view: &View, pos: u64, bytes: u64, write: bool) -> Result<RangeLock<'a>, MpiErr> {
        let (mut lo, mut hi) = (i64::MAX, 0i64);
        view.for_each_range(pos, bytes, |off, n| {
            lo = lo.min(off);
            hi = hi.max(off + n as i64);
            Ok(true)
        })?;
        let l = RangeLock { f, start: lo, len: hi - lo };
        l.set(if write { libc::F_WRLCK } else { libc::F_RDLCK })?;
        Ok(l)
    }

    fn set(&self, kind: c_int) -> Result<(), MpiErr> {
        // SAFETY: a zeroed flock is valid; the fields set below are the ones F_OFD_SETLKW reads.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = self.start;
        fl.l_len = self.len;
        loop {
            // SAFETY: the fd is the file's; fl is a valid flock.
            if unsafe { libc::fcntl(self.f.fd, libc::F_OFD_SETLKW, &mut fl) } == 0 {
                return Ok(());
            }
            let e = errno();
            if e != libc::EINTR {
                return Err(io_err("cannot lock a range of", &self.f.path, e));
            }
        }
    }
}

impl Drop for RangeLock<'_> {
    fn drop(&mut self) {
        let _ = self.set(libc::F_UNLCK);
    }
}
