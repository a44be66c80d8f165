//! MPI-IO files: open / close / delete, sizes, access modes, groups, hints, error handlers,
//! views, and the file pointers. Each process reads and writes the file itself (pread /
//! pwrite through its view, `io.rs`); the data access functions are in `access.rs`, the view's
//! arithmetic in `view.rs`. Files opened on one communicator share a duplicate of it and a set
//! of shared file pointer counters (`group.rs`).
//!
//! Errors of MPI_File_open and MPI_File_delete go to MPI_FILE_NULL's error handler; files
//! start with the one MPI_FILE_NULL has (MPI_ERRORS_RETURN unless changed: the standard's
//! default for files).

mod access;
mod datarep;
mod group;
mod io;
mod view;

pub use access::*;
pub use datarep::{register_datarep, register_datarep_c};
pub use group::IoGroup;

use crate::abi_gen::*;
use crate::api::out;
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::slots::Slots;
use distcomm::buffer::MutBuf;
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use datarep::Datarep;
use view::View;

pub const FILE_BASE: usize = 0x0900_0000;

pub struct File {
    fd: c_int,
    path: CString,
    amode: c_int,
    /// The collectives of the files of the opening communicator go over this (their group's).
    comm: Arc<Comm>,
    group: Arc<IoGroup>,
    /// The group's counter that is this file's shared file pointer (in etypes).
    slot: usize,
    errhandler: AtomicUsize,
    view: Mutex<Arc<View>>,
    /// The individual file pointer, in etypes of the view.
    pos: AtomicI64,
    /// Serializes the pointer's read-and-advance with the transfer.
    io: Mutex<()>,
    atomic: AtomicUsize,
    /// Written since the last MPI_File_sync.
    dirty: std::sync::atomic::AtomicBool,
    /// The open split collective: its begin call's name and status.
    split: Mutex<Option<(&'static str, MPI_Status)>>,
}

impl File {
    fn view(&self) -> Arc<View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn is_atomic(&self) -> bool {
        self.atomic.load(Ordering::Relaxed) != 0
    }

    /// Moves the shared file pointer on by `n` etypes: where it was.
    fn shared_add(&self, n: i64) -> Result<i64, MpiErr> {
        self.group.fetch_add(self.slot, n)
    }

    /// Moves the shared file pointer to `to` (rank 0 in a collective call).
    fn shared_set(&self, to: i64) -> Result<i64, MpiErr> {
        self.group.set(self.slot, to)?;
        Ok(to)
    }

    /// MPI_ERR_READ_ONLY for a write to a file opened MPI_MODE_RDONLY, MPI_ERR_ACCESS for a read
    /// of one opened MPI_MODE_WRONLY.
    fn check_access(&self, write: bool) -> Res {
        if write && self.amode & MPI_MODE_RDONLY != 0 {
            return mpi_err!(MPI_ERR_READ_ONLY, "the file was opened MPI_MODE_RDONLY");
        }
        if !write && self.amode & MPI_MODE_WRONLY != 0 {
            return mpi_err!(MPI_ERR_ACCESS, "the file was opened MPI_MODE_WRONLY");
        }
        Ok(())
    }

    fn size(&self) -> Result<i64, MpiErr> {
        // SAFETY: st is ours to fill; the fd is the file's.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(self.fd, &mut st) } != 0 {
            return Err(io_err("cannot stat", &self.path, errno()));
        }
        Ok(st.st_size)
    }
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

/// Where the file pointers of a new file start: its end for MPI_MODE_APPEND (in bytes, the
/// default view's etypes), else 0.
fn start_of(fd: c_int, amode: c_int) -> i64 {
    // SAFETY: an open fd of ours.
    if amode & MPI_MODE_APPEND != 0 { unsafe { libc::lseek(fd, 0, libc::SEEK_END) }.max(0) } else { 0 }
}

/// Collective over `comm`: rank 0's numbers to everyone.
fn bcast_i64s<const N: usize>(comm: &Comm, mut v: [i64; N]) -> Result<[i64; N], MpiErr> {
    if comm.size() > 1 {
        let mut b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        comm.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut b), dt: distcomm::DType::Int64, root: 0 }).map_err(MpiErr::from)?;
        for (x, c) in v.iter_mut().zip(b.chunks_exact(8)) {
            *x = i64::from_le_bytes(c.try_into().expect("8 bytes"));
        }
    }
    Ok(v)
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
    if mc.inter.get().is_some() {
        return Err(MpiErr::new(MPI_ERR_COMM, "files are opened on intracommunicators, not intercommunicators").on(c));
    }
    let group = IoGroup::of(&mc).map_err(|e| e.on(c))?;
    let comm = group.comm.clone();
    // Rank 0 creates (and, with MPI_MODE_EXCL, is the one that may find it existing); the others
    // open what it made. Every rank learns rank 0's outcome, so all succeed or fail alike.
    // Rank 0 also takes the shared file pointer's counter, at the end of the file for
    // MPI_MODE_APPEND.
    let mut fd = -1;
    let mut e = 0;
    let mut slot = -1;
    if comm.rank() == 0 {
        // SAFETY: a NUL-terminated path; mode 0666 as fopen's (less the umask).
        fd = unsafe { libc::open(path.as_ptr(), fl, 0o666 as libc::c_uint) };
        if fd < 0 {
            e = errno();
        } else {
            match group.take_slot(start_of(fd, amode)) {
                Ok(Some(s)) => slot = s as i64,
                Ok(None) => e = libc::EMFILE,
                Err(_) => e = libc::EIO,
            }
        }
    }
    let [e0, slot] = bcast_i64s(&comm, [e as i64, slot]).map_err(|x| x.on(c))?;
    let e0 = e0 as c_int;
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
        if comm.rank() == 0 && slot >= 0 {
            group.give_slot(slot as usize);
        }
        let why = if e0 != 0 { e0 } else if e != 0 { e } else { libc::EIO };
        let mut err = io_err("cannot open", &path, why);
        if e0 == 0 && e == 0 {
            err.msg = format!("another process of the communicator could not open {path:?}");
        }
        return Err(null(err));
    }
    let eh = NULL_ERRH.load(Ordering::Relaxed);
    let start = start_of(fd, amode);
    group.file_opened();
    let (h, _) = FILES.add(|_| File {
        fd,
        path,
        amode,
        comm,
        group,
        slot: slot as usize,
        errhandler: AtomicUsize::new(eh),
        view: Mutex::new(Arc::new(View::bytes())),
        pos: AtomicI64::new(start),
        io: Mutex::new(()),
        atomic: AtomicUsize::new(0),
        dirty: std::sync::atomic::AtomicBool::new(false),
        split: Mutex::new(None),
    });
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
    let barrier = access::barrier(&f);
    FILES.remove(h);
    *p = MPI_FILE_NULL;
    let mut res = barrier.map_err(|x| x.on(h));
    if f.amode & MPI_MODE_DELETE_ON_CLOSE != 0 && f.comm.rank() == 0 {
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::unlink(f.path.as_ptr()) } != 0 && res.is_ok() {
            res = Err(io_err("cannot delete", &f.path, errno()).on(MPI_FILE_NULL));
        }
    }
    if f.comm.rank() == 0 {
        f.group.give_slot(f.slot);
    }
    f.group.file_closed();
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
        *o = f.size()?;
        Ok(())
    })
}

/// Collective: every process sets the same size (MPI_File_set_size).
pub unsafe fn file_set_size(h: MPI_File, size: MPI_Offset) -> Res {
    with_file(h, |f| {
        if size < 0 {
            return mpi_err!(MPI_ERR_ARG, "size {size} is negative");
        }
        f.check_access(true)?;
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
        // Nothing written here since the last sync: nothing to flush (as ROMIO skips it).
        if !f.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
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

// ---- views and file pointers -------------------------------------------------------------------------

/// The pointer `whence` and `off` (etypes) name: from the start of the view, from `cur`, or
/// from the end of the file's data in the view.
fn seek_target(f: &File, off: MPI_Offset, whence: c_int, cur: impl FnOnce() -> Result<i64, MpiErr>) -> Result<i64, MpiErr> {
    let base = match whence {
        MPI_SEEK_SET => 0,
        MPI_SEEK_CUR => cur()?,
        MPI_SEEK_END => {
            let v = f.view();
            (v.data_before(f.size()?) / v.esize) as i64
        }
        _ => return mpi_err!(MPI_ERR_ARG, "whence {whence} is not MPI_SEEK_SET, MPI_SEEK_CUR or MPI_SEEK_END"),
    };
    base.checked_add(off).filter(|&p| p >= 0).ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("seeking to {base} + {off} etypes leaves the file")))
}

pub unsafe fn file_seek(h: MPI_File, off: MPI_Offset, whence: c_int) -> Res {
    with_file(h, |f| {
        let _g = f.io.lock().unwrap_or_else(|p| p.into_inner());
        let p = seek_target(f, off, whence, || Ok(f.pos.load(Ordering::Relaxed)))?;
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

/// Collective: every member names the same place; rank 0 moves the pointer.
pub unsafe fn file_seek_shared(h: MPI_File, off: MPI_Offset, whence: c_int) -> Res {
    with_file(h, |f| {
        let to = if f.comm.rank() == 0 { seek_target(f, off, whence, || f.shared_add(0)).and_then(|p| f.shared_set(p)) } else { Ok(0) };
        access::bcast_i64(f, to)?;
        Ok(())
    })
}

pub unsafe fn file_get_position_shared(h: MPI_File, off: *mut MPI_Offset) -> Res {
    with_file(h, |f| {
        let o = out(off, "offset")?;
        *o = f.shared_add(0)?;
        Ok(())
    })
}

/// The absolute byte offset of the view's etype offset `off`.
pub unsafe fn file_get_byte_offset(h: MPI_File, off: MPI_Offset, disp: *mut MPI_Offset) -> Res {
    with_file(h, |f| {
        let o = out(disp, "disp")?;
        if off < 0 {
            return mpi_err!(MPI_ERR_ARG, "offset {off} is negative");
        }
        let v = f.view();
        let pos = (off as u64).checked_mul(v.esize).ok_or_else(|| MpiErr::new(MPI_ERR_ARG, format!("offset {off} overflows")))?;
        *o = v.byte_offset(pos)?;
        Ok(())
    })
}

/// Collective: a new view; both file pointers go back to its start.
pub unsafe fn file_set_view(h: MPI_File, disp: MPI_Offset, etype: MPI_Datatype, filetype: MPI_Datatype, datarep: *const c_char, _info: MPI_Info) -> Res {
    with_file(h, |f| {
        if datarep.is_null() {
            return mpi_err!(MPI_ERR_ARG, "datarep is NULL");
        }
        // SAFETY: a NUL-terminated string from the caller.
        let rep = Datarep::parse(&unsafe { CStr::from_ptr(datarep) }.to_string_lossy())?;
        let disp = if disp == MPI_DISPLACEMENT_CURRENT {
            if f.amode & MPI_MODE_SEQUENTIAL == 0 {
                return mpi_err!(MPI_ERR_ARG, "MPI_DISPLACEMENT_CURRENT needs a file opened MPI_MODE_SEQUENTIAL");
            }
            // Rank 0 reads the pointer before it moves it back to 0 below.
            let now = access::bcast_i64(f, if f.comm.rank() == 0 { f.shared_add(0) } else { Ok(0) })?;
            let old = f.view();
            old.byte_offset(now as u64 * old.esize)?
        } else {
            disp
        };
        let v = View::new(disp, etype, filetype, rep, f.amode & MPI_MODE_RDONLY != 0)?;
        if f.split.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            return mpi_err!(MPI_ERR_OTHER, "a split collective is open on this file");
        }
        let _g = f.io.lock().unwrap_or_else(|p| p.into_inner());
        *f.view.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(v);
        f.pos.store(0, Ordering::Relaxed);
        drop(_g);
        // Every member has its new view before the shared pointer moves under it.
        let reset = if f.comm.rank() == 0 { f.shared_set(0) } else { Ok(0) };
        access::bcast_i64(f, reset)?;
        Ok(())
    })
}

/// The view: its displacement, etype and filetype (derived ones as new handles the caller
/// frees) and data representation.
pub unsafe fn file_get_view(h: MPI_File, disp: *mut MPI_Offset, etype: *mut MPI_Datatype, filetype: *mut MPI_Datatype, datarep: *mut c_char) -> Res {
    with_file(h, |f| {
        let v = f.view();
        let (d, e, t) = (out(disp, "disp")?, out(etype, "etype")?, out(filetype, "filetype")?);
        if datarep.is_null() {
            return mpi_err!(MPI_ERR_ARG, "datarep is NULL");
        }
        let handle = |(h, t): &(MPI_Datatype, Arc<crate::datatype::Type>)| if crate::datatype::predefined(*h).is_some() { *h } else { crate::datatype::handle_for(t) };
        *d = v.disp;
        *e = handle(&v.etype);
        *t = handle(&v.filetype);
        let name = v.datarep.name().as_bytes();
        // SAFETY: the caller's buffer holds MPI_MAX_DATAREP_STRING bytes (the standard's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr(), datarep as *mut u8, name.len());
            *datarep.add(name.len()) = 0;
        }
        Ok(())
    })
}

/// The extent of a datatype in the file: its extent in memory (the views store types whose
/// elements keep their size).
pub unsafe fn file_get_type_extent_c(h: MPI_File, dt: MPI_Datatype, extent: *mut MPI_Count) -> Res {
    with_file(h, |f| {
        let o = out(extent, "extent")?;
        let (t, _) = crate::datatype::resolve_any(dt)?;
        f.view().datarep.check(&t, "the datatype")?;
        *o = t.map.extent() as MPI_Count;
        Ok(())
    })
}
pub unsafe fn file_get_type_extent(h: MPI_File, dt: MPI_Datatype, extent: *mut MPI_Aint) -> Res {
    let mut x: MPI_Count = 0;
    file_get_type_extent_c(h, dt, &mut x)?;
    *out(extent, "extent")? = x as MPI_Aint;
    Ok(())
}

/// Collective: the file keeps at least `size` bytes of storage (rank 0 allocates them).
pub unsafe fn file_preallocate(h: MPI_File, size: MPI_Offset) -> Res {
    with_file(h, |f| {
        if size < 0 {
            return mpi_err!(MPI_ERR_ARG, "size {size} is negative");
        }
        f.check_access(true)?;
        let done = if f.comm.rank() == 0 && size > 0 {
            // SAFETY: the file's fd.
            match unsafe { libc::posix_fallocate(f.fd, 0, size) } {
                0 => Ok(0),
                e => Err(io_err("cannot preallocate", &f.path, e)),
            }
        } else {
            Ok(0)
        };
        access::bcast_i64(f, done)?;
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
