//! The memory of MPI_Win_allocate_shared over several processes of one host: one segment under
//! /dev/shm that every member maps, each member's part right after the one of the rank before
//! it (contiguous, as MPICH lays them out by default), unlinked as soon as every member has
//! mapped it (so nothing is left behind by a crash), unmapped when the window is freed.

use crate::abi_gen::*;
use crate::err::MpiErr;
use distcomm::buffer::MutBuf;
use distcomm::collective::CollArgs;
use distcomm::comm::Comm;
use distcomm::{DType, ReduceOp};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};

/// A mapped segment and where each rank's part lies in it.
pub struct Segment {
    addr: usize,
    len: usize,
    /// Per rank: offset of its part, its size and disp_unit.
    parts: Vec<(usize, i64, i64)>,
}

/// Bytes of the buffer rank 0 sends the others: a status byte, then the segment's path.
const NAME_BYTES: usize = 128;

impl Segment {
    /// Collective over `comm` (every member on this host): makes, maps and unlinks the segment
    /// of the members' parts, `parts[r]` = (size, disp_unit) of rank r.
    pub fn make(comm: &Comm, parts: &[(i64, i64)]) -> Result<Segment, MpiErr> {
        let mut offsets = Vec::with_capacity(parts.len());
        let mut total = 0usize;
        for &(size, _) in parts {
            offsets.push(total);
            total = total.checked_add(size as usize).ok_or_else(|| MpiErr::new(MPI_ERR_SIZE, "the window's parts add up to more than the address space"))?;
        }
        let len = total.max(1);
        // Rank 0 makes the file and sends its path (or its failure) to the others.
        let mut name = [0u8; NAME_BYTES];
        let mut fd = -1;
        if comm.rank() == 0 {
            match create(len) {
                Ok((f, path)) => {
                    fd = f;
                    name[1..1 + path.len()].copy_from_slice(path.as_bytes());
                }
                Err(e) => {
                    name[0] = 1;
                    let why = e.as_bytes();
                    name[1..1 + why.len().min(NAME_BYTES - 2)].copy_from_slice(&why[..why.len().min(NAME_BYTES - 2)]);
                }
            }
        }
        let sent = comm.collective(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut name), dt: DType::Uint8, root: 0 });
        let text = String::from_utf8_lossy(&name[1..]).trim_end_matches('\0').to_string();
        if let Err(e) = sent {
            if fd >= 0 {
                // Nobody else will map it: rank 0's file goes at once.
                // SAFETY: our descriptor, and the path we made.
                unsafe { libc::close(fd) };
                unlink(&text);
            }
            return Err(MpiErr::from(e));
        }
        if name[0] != 0 {
            return Err(MpiErr::new(MPI_ERR_NO_MEM, format!("cannot make the shared window's segment of {len} bytes: {text}")));
        }
        if fd < 0 {
            let path = CString::new(text.clone()).map_err(|_| MpiErr::new(MPI_ERR_INTERN, "a segment path with a NUL"))?;
            // SAFETY: a valid NUL-terminated path.
            fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        }
        let addr = if fd >= 0 {
            // SAFETY: mapping `len` bytes of a file of at least that size; checked below.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
            // SAFETY: our descriptor; the mapping keeps the file.
            unsafe { libc::close(fd) };
            (p != libc::MAP_FAILED).then_some(p as usize)
        } else {
            None
        };
        // Everyone has opened the file (or failed to): it can go, whatever happens next.
        let mut failed = [u8::from(addr.is_none())];
        let r = comm.collective(CollArgs::Allreduce { send: None, recv: MutBuf::from_slice(&mut failed), dt: DType::Uint8, op: ReduceOp::Max });
        if comm.rank() == 0 {
            unlink(&text);
        }
        let seg = addr.map(|addr| Segment { addr, len, parts: offsets.iter().zip(parts).map(|(&o, &(s, d))| (o, s, d)).collect() });
        r.map_err(MpiErr::from)?;
        match seg {
            Some(seg) if failed[0] == 0 => Ok(seg),
            _ => Err(MpiErr::new(MPI_ERR_NO_MEM, format!("a member could not map the shared window's segment {text}"))),
        }
    }

    /// Where rank `r`'s part starts in this process's mapping.
    pub fn base_of(&self, r: usize) -> usize {
        self.addr + self.parts[r].0
    }

    /// Every rank's (size, disp_unit).
    pub fn parts(&self) -> Vec<(i64, i64)> {
        self.parts.iter().map(|&(_, s, d)| (s, d)).collect()
    }

    /// Rank `r`'s (size, disp_unit, base here).
    pub fn query(&self, r: usize) -> (i64, i64, usize) {
        let (_, size, unit) = self.parts[r];
        (size, unit, self.base_of(r))
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `make`, unmapped once (the window is gone).
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

fn unlink(path: &str) {
    if let Ok(c) = CString::new(path) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::unlink(c.as_ptr()) };
    }
}

/// Makes a file of `len` bytes under /dev/shm (reserved: a /dev/shm too small fails here, not
/// with SIGBUS at first touch); its descriptor and path, or why not.
fn create(len: usize) -> Result<(i32, String), String> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let path = format!("/dev/shm/dc-win-{}-{}-{nanos:x}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
    let c = CString::new(path.clone()).map_err(|e| e.to_string())?;
    // SAFETY: a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(format!("{path}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: our new file.
    let rc = unsafe { libc::posix_fallocate(fd, 0, len as libc::off_t) };
    if rc != 0 {
        // SAFETY: as above.
        unsafe {
            libc::close(fd);
            libc::unlink(c.as_ptr());
        }
        return Err(format!("{path}: {} bytes: {}", len, std::io::Error::from_raw_os_error(rc)));
    }
    Ok((fd, path))
}
