//! MPI-IO files: open / close / delete, sizes, access modes, groups, error handlers, and
//! independent reads and writes at explicit offsets or the individual file pointer, on the
//! default view (the file is bytes, an etype of MPI_BYTE): each process does its own
//! pread / pwrite. Views, shared file pointers, collective and non-blocking I/O are not here
//! (their functions answer MPI_ERR_UNSUPPORTED_OPERATION).
//!
//! Errors of MPI_File_open and MPI_File_delete go to MPI_FILE_NULL's error handler; files
//! start with the one MPI_FILE_NULL has (MPI_ERRORS_RETURN unless changed: the standard's
//! default for files).

use crate::abi_gen::*;
use crate::api::out;
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::slots::Slots;
use distcomm::buffer::MutBuf;
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub const FILE_BASE: usize = 0x0900_0000;

pub struct File {
    fd: c_int,
    path: CString,
    amode: c_int,
    /// The file's own communicator (a dup of the opening one): open and close agree over it.
    comm: Arc<Comm>,
    errhandler: AtomicUsize,
    /// The individual file pointer, in bytes (the default view).
    pos: AtomicI64,
    /// Serializes the pointer's read-and-advance with the transfer.
    io: Mutex<()>,
    atomic: AtomicUsize,
}

static FILES: Slots<File> = Slots::new(FILE_BASE);
static NULL_ERRH: AtomicUsize = AtomicUsize::new(MPI_ERRORS_RETURN);

pub fn errhandler_of(h: usize) -> Option<MPI_Errhandler> {
    if h == MPI_FILE_NULL {
        return Some(NULL_ERRH.load(Ordering::Relaxed));
    }
    if !FILES.owns(h) {
        return None;
    }
    FILES.get(h).map(|f| f.errhandler.load(Ordering::Relaxed))
}

fn file(h: MPI_File) -> Result<Arc<File>, MpiErr> {
    crate::state::check_active()?;
    match FILES.get(h) {
        Some(f) => Ok(f),
        // Errors on MPI_FILE_NULL go to its own handler (the standard's rule for files).
        None if h == MPI_FILE_NULL => Err(MpiErr::new(MPI_ERR_FILE, "MPI_FILE_NULL is not an open file").on(MPI_FILE_NULL)),
        None => Err(MpiErr::new(MPI_ERR_FILE, format!("{h:#x} is not a valid file (never opened, or closed)")).on(MPI_FILE_NULL)),
    }
}

fn with_file<T>(h: MPI_File, f: impl FnOnce(&Arc<File>) -> Result<T, MpiErr>) -> Result<T, MpiErr> {
    let fl = file(h)?;
    f(&fl).map_err(|e| e.on(h))
}

/// The MPI error class of an errno from open, read, write or unlink.
fn io_class(errno: c_int) -> c_int {
    match errno {
        libc::ENOENT | libc::ENOTDIR => MPI_ERR_NO_SUCH_FILE,
        libc::EEXIST => MPI_ERR_FILE_EXISTS,
        libc::EACCES | libc::EPERM => MPI_ERR_ACCESS,
        libc::ENOSPC => MPI_ERR_NO_SPACE,
        libc::EROFS => MPI_ERR_READ_ONLY,
        libc::EDQUOT => MPI_ERR_QUOTA,
        libc::EISDIR | libc::ENAMETOOLONG | libc::ELOOP => MPI_ERR_BAD_FILE,
        libc::ETXTBSY | libc::EBUSY => MPI_ERR_FILE_IN_USE,
        _ => MPI_ERR_IO,
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn io_err(what: &str, path: &CStr, e: c_int) -> MpiErr {
    MpiErr::new(io_class(e), format!("{what} {:?}: {}", path, std::io::Error::from_raw_os_error(e)))
}

/// The open(2) flags of an access mode, or MPI_ERR_AMODE for one the standard forbids.
fn flags(amode: c_int) -> Result<c_int, MpiErr> {
    let rw = [MPI_MODE_RDONLY, MPI_MODE_WRONLY, MPI_MODE_RDWR].iter().filter(|&&m| amode & m != 0).count();
    if rw != 1 {
        return mpi_err!(MPI_ERR_AMODE, "amode {amode:#x} must have exactly one of MPI_MODE_RDONLY, MPI_MODE_WRONLY and MPI_MODE_RDWR");
    }
    if amode & MPI_MODE_RDONLY != 0 && amode & (MPI_MODE_CREATE | MPI_MODE_EXCL) != 0 {
        return mpi_err!(MPI_ERR_AMODE, "MPI_MODE_RDONLY cannot go with MPI_MODE_CREATE or MPI_MODE_EXCL");
    }
    if amode & MPI_MODE_RDWR != 0 && amode & MPI_MODE_SEQUENTIAL != 0 {
        return mpi_err!(MPI_ERR_AMODE, "MPI_MODE_RDWR cannot go with MPI_MODE_SEQUENTIAL");
    }
    let mut f = if amode & MPI_MODE_RDONLY != 0 {
        libc::O_RDONLY
    } else if amode & MPI_MODE_WRONLY != 0 {
        libc::O_WRONLY
    } else {
        libc::O_RDWR
    };
    if amode & MPI_MODE_CREATE != 0 {
        f |= libc::O_CREAT;
    }
    if amode & MPI_MODE_EXCL != 0 {
        f |= libc::O_EXCL;
    }
    Ok(f | libc::O_CLOEXEC)
}

/// Collective over `comm`: rank 0's int to everyone.
fn bcast_i32(comm: &Comm, v: i32) -> Result<i32, MpiErr> {
    if comm.size() == 1 {
        return Ok(v);
    }
    let mut b = v.to_le_bytes();
    comm.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: distcomm::DType::Int32, root: 0 }).map_err(MpiErr::from)?;
    Ok(i32::from_le_bytes(b))
}

/// Collective over `comm`: whether every rank's `ok` is true.
fn all_ok(comm: &Comm, ok: bool) -> Result<bool, MpiErr> {
    if comm.size() == 1 {
        return Ok(ok);
    }
    let send = [ok as u8];
    let mut recv = vec![0u8; comm.size()];
    comm.collective(CollArgs::Allgather { send: Some(distcomm::buffer::ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: distcomm::DType::Uint8 })
        .map_err(MpiErr::from)?;
    Ok(recv.iter().all(|&b| b == 1))
}

pub unsafe fn file_open(c: MPI_Comm, filename: *const c_char, amode: c_int, _info: MPI_Info, fh: *mut MPI_File) -> Res {
    crate::state::check_active()?;
    let mc = crate::state::get_comm(c)?;
    let null = |e: MpiErr| e.on(MPI_FILE_NULL);
    let o = out(fh, "fh").map_err(null)?;
    if filename.is_null() {
        return Err(null(MpiErr::new(MPI_ERR_ARG, "filename is NULL")));
    }
    // SAFETY: a NUL-terminated string from the caller.
    let path = unsafe { CStr::from_ptr(filename) }.to_owned();
    let fl = flags(amode).map_err(null)?;
    let all: Vec<usize> = (0..mc.size()).collect();
    let comm = mc.comm.new_group(&all).map_err(|e| MpiErr::from(e).on(c))?.expect("every rank is a member of its dup");
    // Rank 0 creates (and, with MPI_MODE_EXCL, is the one that may find it existing); the others
    // open what it made. Every rank learns rank 0's outcome, so all succeed or fail alike.
    let mut fd = -1;
    let mut e = 0;
    if comm.rank() == 0 {
        // SAFETY: a NUL-terminated path; mode 0666 as fopen's (less the umask).
        fd = unsafe { libc::open(path.as_ptr(), fl, 0o666 as libc::c_uint) };
        if fd < 0 {
            e = errno();
        }
    }
    let e0 = bcast_i32(&comm, e).map_err(|x| x.on(c))?;
    if e0 == 0 && comm.rank() != 0 {
        fd = unsafe { libc::open(path.as_ptr(), fl & !(libc::O_CREAT | libc::O_EXCL), 0o666 as libc::c_uint) };
        if fd < 0 {
            e = errno();
        }
    }
    let ok = all_ok(&comm, e0 == 0 && fd >= 0).map_err(|x| x.on(c))?;
    if !ok {
        if fd >= 0 {
            // SAFETY: our fd, closed once.
            unsafe { libc::close(fd) };
        }
        comm.destroy();
        let why = if e0 != 0 { e0 } else if e != 0 { e } else { libc::EIO };
        let mut err = io_err("cannot open", &path, why);
        if e0 == 0 && e == 0 {
            err.msg = format!("another process of the communicator could not open {path:?}");
        }
        return Err(null(err));
    }
    let eh = NULL_ERRH.load(Ordering::Relaxed);
    let (h, _) = FILES.add(|_| File { fd, path, amode, comm, errhandler: AtomicUsize::new(eh), pos: AtomicI64::new(0), io: Mutex::new(()), atomic: AtomicUsize::new(0) });
    if amode & MPI_MODE_APPEND != 0 {
        // The pointers start at the end of the file (the standard's MPI_MODE_APPEND).
        let end = unsafe { libc::lseek(fd, 0, libc::SEEK_END) };
        if let Some(f) = FILES.get(h) {
            f.pos.store(end.max(0), Ordering::Relaxed);
        }
    }
    *o = h;
    Ok(())
}

pub unsafe fn file_close(fh: *mut MPI_File) -> Res {
    crate::state::check_active()?;
    let p = out(fh, "fh")?;
    let h = *p;
    let f = file(h)?;
    // SAFETY: the file's fd, closed once (the handle is removed below).
    let rc = unsafe { libc::close(f.fd) };
    let e = if rc != 0 { errno() } else { 0 };
    // Collective: every process has closed before the file is deleted.
    let barrier = if f.comm.size() > 1 { f.comm.collective(CollArgs::Barrier).map_err(MpiErr::from) } else { Ok(()) };
    FILES.remove(h);
    *p = MPI_FILE_NULL;
    let mut res = barrier.map_err(|x| x.on(h));
    if f.amode & MPI_MODE_DELETE_ON_CLOSE != 0 && f.comm.rank() == 0 {
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::unlink(f.path.as_ptr()) } != 0 && res.is_ok() {
            res = Err(io_err("cannot delete", &f.path, errno()).on(MPI_FILE_NULL));
        }
    }
    f.comm.destroy();
    if e != 0 && res.is_ok() {
        res = Err(io_err("cannot close", &f.path, e).on(MPI_FILE_NULL));
    }
    res
}

pub unsafe fn file_delete(filename: *const c_char, _info: MPI_Info) -> Res {
    crate::state::check_active()?;
    if filename.is_null() {
        return Err(MpiErr::new(MPI_ERR_ARG, "filename is NULL").on(MPI_FILE_NULL));
    }
    // SAFETY: a NUL-terminated string from the caller.
    let path = unsafe { CStr::from_ptr(filename) };
    if unsafe { libc::unlink(path.as_ptr()) } != 0 {
        return Err(io_err("cannot delete", path, errno()).on(MPI_FILE_NULL));
    }
    Ok(())
}

pub unsafe fn file_get_size(h: MPI_File, size: *mut MPI_Offset) -> Res {
    with_file(h, |f| {
        let o = out(size, "size")?;
        // SAFETY: st is ours to fill; the fd is the file's.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(f.fd, &mut st) } != 0 {
            return Err(io_err("cannot stat", &f.path, errno()));
        }
        *o = st.st_size as MPI_Offset;
        Ok(())
    })
}

/// Collective: every process sets the same size (MPI_File_set_size).
pub unsafe fn file_set_size(h: MPI_File, size: MPI_Offset) -> Res {
    with_file(h, |f| {
        if size < 0 {
            return mpi_err!(MPI_ERR_ARG, "size {size} is negative");
        }
        if f.amode & MPI_MODE_RDONLY != 0 {
            return mpi_err!(MPI_ERR_READ_ONLY, "the file was opened MPI_MODE_RDONLY");
        }
        let rc = unsafe { libc::ftruncate(f.fd, size) };
        let e = if rc != 0 { errno() } else { 0 };
        if !all_ok(&f.comm, e == 0)? {
            return Err(io_err("cannot resize", &f.path, if e != 0 { e } else { libc::EIO }));
        }
        Ok(())
    })
}

pub unsafe fn file_sync(h: MPI_File) -> Res {
    with_file(h, |f| {
        if unsafe { libc::fsync(f.fd) } != 0 {
            return Err(io_err("cannot sync", &f.path, errno()));
        }
        Ok(())
    })
}

pub unsafe fn file_get_amode(h: MPI_File, amode: *mut c_int) -> Res {
    with_file(h, |f| {
        *out(amode, "amode")? = f.amode;
        Ok(())
    })
}

pub unsafe fn file_get_group(h: MPI_File, g: *mut MPI_Group) -> Res {
    with_file(h, |f| {
        *out(g, "group")? = crate::group::add(f.comm.members().to_vec());
        Ok(())
    })
}

pub unsafe fn file_get_atomicity(h: MPI_File, flag: *mut c_int) -> Res {
    with_file(h, |f| {
        *out(flag, "flag")? = f.atomic.load(Ordering::Relaxed) as c_int;
        Ok(())
    })
}

/// Each process's transfers are single pread / pwrite calls, atomic on a local file system.
pub unsafe fn file_set_atomicity(h: MPI_File, flag: c_int) -> Res {
    with_file(h, |f| {
        f.atomic.store((flag != 0) as usize, Ordering::Relaxed);
        Ok(())
    })
}

pub unsafe fn file_get_info(h: MPI_File, info: *mut MPI_Info) -> Res {
    with_file(h, |_| crate::info::info_create(info))
}

pub unsafe fn file_set_info(h: MPI_File, info: MPI_Info) -> Res {
    with_file(h, |_| {
        let mut n = 0;
        crate::info::info_get_nkeys(info, &mut n)
    })
}

// ---- data ------------------------------------------------------------------------------------------

fn status_of(st: *mut MPI_Status, bytes: usize) {
    let mut s = crate::request::empty_status();
    crate::request::set_count(&mut s, bytes);
    crate::api::write_status(st, s);
}

fn read_at(f: &File, off: MPI_Offset, buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, st: *mut MPI_Status) -> Result<usize, MpiErr> {
    if f.amode & MPI_MODE_WRONLY != 0 {
        return mpi_err!(MPI_ERR_ACCESS, "the file was opened MPI_MODE_WRONLY");
    }
    if off < 0 {
        return mpi_err!(MPI_ERR_ARG, "offset {off} is negative");
    }
    let i = crate::packing::incoming(buf, count, dt)?;
    let mut done = 0usize;
    while done < i.len {
        // SAFETY: the destination holds i.len bytes (the caller's buffer or our packed one).
        let n = unsafe { libc::pread(f.fd, i.ptr.add(done) as *mut c_void, i.len - done, off + done as i64) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(io_err("cannot read", &f.path, e));
        }
        if n == 0 {
            break; // end of file: the status says how much was read
        }
        done += n as usize;
    }
    if let Some((tmp, unpack)) = i.tmp {
        unpack.run(&tmp[..]);
    }
    status_of(st, done);
    Ok(done)
}

fn write_at(f: &File, off: MPI_Offset, buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, st: *mut MPI_Status) -> Result<usize, MpiErr> {
    if f.amode & MPI_MODE_RDONLY != 0 {
        return mpi_err!(MPI_ERR_READ_ONLY, "the file was opened MPI_MODE_RDONLY");
    }
    if off < 0 {
        return mpi_err!(MPI_ERR_ARG, "offset {off} is negative");
    }
    let o = crate::packing::outgoing(buf, count, dt)?;
    let mut done = 0usize;
    while done < o.len {
        // SAFETY: the source holds o.len bytes.
        let n = unsafe { libc::pwrite(f.fd, o.ptr.add(done) as *const c_void, o.len - done, off + done as i64) };
        if n < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(io_err("cannot write", &f.path, e));
        }
        done += n as usize;
    }
    status_of(st, done);
    Ok(done)
}

pub unsafe fn file_read_at_c(h: MPI_File, off: MPI_Offset, buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, st: *mut MPI_Status) -> Res {
    with_file(h, |f| read_at(f, off, buf, count, dt, st).map(|_| ()))
}
pub unsafe fn file_read_at(h: MPI_File, off: MPI_Offset, buf: *mut c_void, count: c_int, dt: MPI_Datatype, st: *mut MPI_Status) -> Res {
    file_read_at_c(h, off, buf, count as MPI_Count, dt, st)
}
pub unsafe fn file_write_at_c(h: MPI_File, off: MPI_Offset, buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, st: *mut MPI_Status) -> Res {
    with_file(h, |f| write_at(f, off, buf, count, dt, st).map(|_| ()))
}
pub unsafe fn file_write_at(h: MPI_File, off: MPI_Offset, buf: *const c_void, count: c_int, dt: MPI_Datatype, st: *mut MPI_Status) -> Res {
    file_write_at_c(h, off, buf, count as MPI_Count, dt, st)
}

pub unsafe fn file_read_c(h: MPI_File, buf: *mut c_void, count: MPI_Count, dt: MPI_Datatype, st: *mut MPI_Status) -> Res {
    with_file(h, |f| {
        let _g = f.io.lock().unwrap_or_else(|p| p.into_inner());
        let n = read_at(f, f.pos.load(Ordering::Relaxed), buf, count, dt, st)?;
        f.pos.fetch_add(n as i64, Ordering::Relaxed);
        Ok(())
    })
}
pub unsafe fn file_read(h: MPI_File, buf: *mut c_void, count: c_int, dt: MPI_Datatype, st: *mut MPI_Status) -> Res {
    file_read_c(h, buf, count as MPI_Count, dt, st)
}
pub unsafe fn file_write_c(h: MPI_File, buf: *const c_void, count: MPI_Count, dt: MPI_Datatype, st: *mut MPI_Status) -> Res {
    with_file(h, |f| {
        let _g = f.io.lock().unwrap_or_else(|p| p.into_inner());
        let n = write_at(f, f.pos.load(Ordering::Relaxed), buf, count, dt, st)?;
        f.pos.fetch_add(n as i64, Ordering::Relaxed);
        Ok(())
    })
}
pub unsafe fn file_write(h: MPI_File, buf: *const c_void, count: c_int, dt: MPI_Datatype, st: *mut MPI_Status) -> Res {
    file_write_c(h, buf, count as MPI_Count, dt, st)
}

pub unsafe fn file_seek(h: MPI_File, off: MPI_Offset, whence: c_int) -> Res {
    with_file(h, |f| {
        let _g = f.io.lock().unwrap_or_else(|p| p.into_inner());
        let base = match whence {
            MPI_SEEK_SET => 0,
            MPI_SEEK_CUR => f.pos.load(Ordering::Relaxed),
            MPI_SEEK_END => {
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                if unsafe { libc::fstat(f.fd, &mut st) } != 0 {
                    return Err(io_err("cannot stat", &f.path, errno()));
                }
                st.st_size
            }
            _ => return mpi_err!(MPI_ERR_ARG, "whence {whence} is not MPI_SEEK_SET, MPI_SEEK_CUR or MPI_SEEK_END"),
        };
        let p = base.checked_add(off).filter(|&p| p >= 0).ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("seeking to {base} + {off} leaves the file")))?;
        f.pos.store(p, Ordering::Relaxed);
        Ok(())
    })
}

pub unsafe fn file_get_position(h: MPI_File, off: *mut MPI_Offset) -> Res {
    with_file(h, |f| {
        *out(off, "offset")? = f.pos.load(Ordering::Relaxed);
        Ok(())
    })
}

/// On the default view a byte offset is the offset itself.
pub unsafe fn file_get_byte_offset(h: MPI_File, off: MPI_Offset, disp: *mut MPI_Offset) -> Res {
    with_file(h, |_| {
        *out(disp, "disp")? = off;
        Ok(())
    })
}

// ---- error handlers ---------------------------------------------------------------------------------

pub unsafe fn file_create_errhandler(f: Option<MPI_File_errhandler_function>, eh: *mut MPI_Errhandler) -> Res {
    crate::objerrh::create(f, eh)
}

pub unsafe fn file_set_errhandler(h: MPI_File, eh: MPI_Errhandler) -> Res {
    if h == MPI_FILE_NULL {
        crate::state::check_active()?;
        return crate::objerrh::set(&NULL_ERRH, h, eh);
    }
    with_file(h, |f| crate::objerrh::set(&f.errhandler, h, eh))
}

pub unsafe fn file_get_errhandler(h: MPI_File, eh: *mut MPI_Errhandler) -> Res {
    if h == MPI_FILE_NULL {
        crate::state::check_active()?;
        return crate::objerrh::get(&NULL_ERRH, h, eh);
    }
    with_file(h, |f| crate::objerrh::get(&f.errhandler, h, eh))
}

pub unsafe fn file_call_errhandler(h: MPI_File, code: c_int) -> Res {
    if h == MPI_FILE_NULL {
        crate::state::check_active()?;
        return crate::objerrh::call(&NULL_ERRH, h, code);
    }
    with_file(h, |f| crate::objerrh::call(&f.errhandler, h, code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_modes_follow_the_standard() {
        assert_eq!(flags(MPI_MODE_RDONLY).unwrap() & libc::O_ACCMODE, libc::O_RDONLY);
        assert_eq!(flags(MPI_MODE_WRONLY | MPI_MODE_CREATE).unwrap() & (libc::O_ACCMODE | libc::O_CREAT), libc::O_WRONLY | libc::O_CREAT);
        assert_eq!(flags(MPI_MODE_RDONLY | MPI_MODE_CREATE).unwrap_err().class, MPI_ERR_AMODE);
        assert_eq!(flags(MPI_MODE_RDONLY | MPI_MODE_RDWR).unwrap_err().class, MPI_ERR_AMODE);
        assert_eq!(flags(MPI_MODE_CREATE).unwrap_err().class, MPI_ERR_AMODE);
        assert_eq!(flags(MPI_MODE_RDWR | MPI_MODE_SEQUENTIAL).unwrap_err().class, MPI_ERR_AMODE);
        assert_eq!(io_class(libc::ENOENT), MPI_ERR_NO_SUCH_FILE);
        assert_eq!(io_class(libc::EEXIST), MPI_ERR_FILE_EXISTS);
    }
}
