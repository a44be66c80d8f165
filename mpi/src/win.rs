//! RMA windows: MPI_Win_create / allocate (and allocate_shared on one process), free, fence,
//! locks, Put / Get / Accumulate / Get_accumulate / Fetch_and_op / Compare_and_swap, the window
//! attributes, names, groups and error handlers.
//!
//! A transfer whose target is this process (the whole story for a window of one process, like
//! mpi4py's on COMM_SELF) is a load or store done at the call. One to another process of the
//! window's group is queued and carried by what ends its epoch: the fence (rma.rs), the
//! complete of a post/start epoch (pscw.rs), or the flush or unlock of a lock (passive.rs,
//! whose server thread applies them at the target).

use crate::abi_gen::*;
use crate::api::out;
use crate::datatype::{self, Type};
use crate::err::{MpiErr, Res};
use crate::keyval::{self, Attrs, Kind};
use crate::mpi_err;
use crate::rma;
use crate::slots::Slots;
use distcomm::comm::Comm;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub const WIN_BASE: usize = 0x0800_0000;

pub struct Win {
    /// A communicator of the window's own (a dup of the creating one): fences and frees order
    /// the group without mixing with the user's collectives.
    comm: Arc<Comm>,
    base: usize,
    // The attribute values live here: MPI_Win_get_attr hands out pointers to them.
    size: MPI_Aint,
    disp_unit: c_int,
    flavor: c_int,
    model: c_int,
    /// Memory MPI_Win_allocate made (freed with the window).
    owned: bool,
    /// MPI_Win_allocate_shared over several processes: the segment every member maps
    /// (unmapped with the window).
    segment: Option<crate::shwin::Segment>,
    /// Every rank's (size, disp_unit), for the checks of transfers to it.
    peers: Vec<(i64, i64)>,
    /// Transfers to other processes waiting for the next fence.
    pending: Mutex<rma::Pending>,
    /// A fence opened an epoch (one without MPI_MODE_NOSUCCEED came last).
    fenced: AtomicBool,
    /// Passive target: the window's lock server and the locks this process holds (windows of
    /// several processes only).
    passive: Option<crate::passive::Passive>,
    /// Post / start / complete / wait epochs (pscw.rs).
    epochs: Mutex<crate::pscw::Epochs>,
    /// This process's window memory as transfers see it; its `in_turn` is taken by every
    /// transfer that reads or writes it (the passive-target server's too).
    local: rma::Local,
    errhandler: AtomicUsize,
    name: Mutex<String>,
    attrs: Attrs,
}

static WINS: Slots<Win> = Slots::new(WIN_BASE);

impl Win {
    /// Queues a transfer to another process (`f` writes its record). Under a lock of that
    /// process it leaves at once, as on other MPI libraries: it is applied there while this
    /// process goes on (programs that wait for a flag another rank sets, as mpi4py's
    /// `util.sync` does, rely on it); the flush or unlock waits for it.
    fn queue(&self, to: &Where, f: impl FnOnce(&mut rma::Pending, usize, &rma::Remote)) -> Res {
        let Some(r) = to.remote() else { return Ok(()) };
        let mut p = lock(&self.pending);
        f(&mut p, self.comm.size(), &r);
        match &self.passive {
            Some(s) if s.holds(r.rank) => s.issue(r.rank, &mut p, self.comm.timeout_ms()),
            _ => Ok(()),
        }
    }
}

pub fn errhandler_of(h: usize) -> Option<MPI_Errhandler> {
    if !WINS.owns(h) {
        return None;
    }
    WINS.get(h).map(|w| w.errhandler.load(Ordering::Relaxed))
}

fn win(h: MPI_Win) -> Result<Arc<Win>, MpiErr> {
    crate::state::check_active()?;
    match WINS.get(h) {
        Some(w) => Ok(w),
        None if h == MPI_WIN_NULL => mpi_err!(MPI_ERR_WIN, "MPI_WIN_NULL is not a window"),
        None => mpi_err!(MPI_ERR_WIN, "{h:#x} is not a valid window (never made, or freed)"),
    }
}

/// The window's checks and its error handler for what follows.
fn with_win<T>(h: MPI_Win, f: impl FnOnce(&Arc<Win>) -> Result<T, MpiErr>) -> Result<T, MpiErr> {
    let w = win(h)?;
    f(&w).map_err(|e| e.on(h))
}

/// Collective over `comm`: every member's (size, disp_unit).
fn all_parts(comm: &distcomm::comm::Comm, size: i64, disp_unit: i64) -> Result<Vec<(i64, i64)>, distcomm::Error> {
    let send: Vec<u8> = [size as u64, disp_unit as u64].iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut recv = vec![0u8; 16 * comm.size()];
    comm.collective(distcomm::collective::CollArgs::Allgather {
        send: Some(distcomm::buffer::ConstBuf::from_slice(&send)),
        recv: distcomm::buffer::MutBuf::from_slice(&mut recv),
        dt: distcomm::DType::Uint64,
    })?;
    Ok(recv.chunks_exact(16).map(|x| (i64::from_le_bytes(x[..8].try_into().unwrap()), i64::from_le_bytes(x[8..].try_into().unwrap()))).collect())
}

/// Collective over `c`: a window of `size` bytes at `base`.
fn make(base: usize, size: i64, disp_unit: i64, c: MPI_Comm, flavor: c_int, owned: bool, segment: Option<crate::shwin::Segment>) -> Result<MPI_Win, MpiErr> {
    let mc = crate::state::get_comm(c)?;
    let all: Vec<usize> = (0..mc.size()).collect();
    let comm = mc.comm.new_group(&all).map_err(|e| MpiErr::from(e).on(c))?.expect("every rank is a member of its dup");
    let dynamic = flavor == MPI_WIN_FLAVOR_DYNAMIC;
    let peers = if dynamic {
        // Attached memory is checked where it is, by the target (`rma::Local::holds`).
        vec![(i64::MAX, 1); comm.size()]
    } else if let Some(seg) = &segment {
        // Gathered already, to lay the segment out.
        seg.parts()
    } else if comm.size() == 1 {
        vec![(size, disp_unit)]
    } else {
        match all_parts(&comm, size, disp_unit) {
            Ok(p) => p,
            Err(e) => {
                comm.destroy();
                return Err(MpiErr::from(e).on(c));
            }
        }
    };
    let local = rma::Local { base, size: size as usize, disp_unit, turns: Default::default(), attached: dynamic.then(Default::default) };
    let passive = if comm.size() > 1 {
        let all: Vec<usize> = (0..comm.size()).collect();
        match comm.new_group(&all) {
            Ok(Some(server)) => Some(crate::passive::Passive::start(server, local.clone())),
            Ok(None) => None,
            Err(e) => {
                comm.destroy();
                return Err(MpiErr::from(e).on(c));
            }
        }
    } else {
        None
    };
    let (h, _) = WINS.add(|_| Win {
        comm,
        base,
        size: size as MPI_Aint,
        disp_unit: disp_unit as c_int,
        flavor,
        model: MPI_WIN_UNIFIED,
        owned,
        segment,
        peers,
        pending: Mutex::new(rma::Pending::default()),
        fenced: AtomicBool::new(false),
        passive,
        epochs: Mutex::new(crate::pscw::Epochs::default()),
        local,
        // The standard's default for windows.
        errhandler: AtomicUsize::new(MPI_ERRORS_ARE_FATAL),
        name: Mutex::new(String::new()),
        attrs: Mutex::new(Vec::new()),
    });
    Ok(h)
}

fn check_new(size: i64, disp_unit: i64, c: MPI_Comm) -> Res {
    crate::state::check_active()?;
    crate::state::get_comm(c)?;
    if size < 0 {
        return Err(MpiErr::new(MPI_ERR_SIZE, format!("size {size} is negative")).on(c));
    }
    if disp_unit <= 0 || disp_unit > c_int::MAX as i64 {
        return Err(MpiErr::new(MPI_ERR_DISP, format!("disp_unit {disp_unit} is not a positive int")).on(c));
    }
    Ok(())
}

pub unsafe fn win_create_c(base: *mut c_void, size: MPI_Aint, disp_unit: MPI_Aint, _info: MPI_Info, c: MPI_Comm, w: *mut MPI_Win) -> Res {
    check_new(size as i64, disp_unit as i64, c)?;
    let o = out(w, "win").map_err(|e| e.on(c))?;
    *o = make(base as usize, size as i64, disp_unit as i64, c, MPI_WIN_FLAVOR_CREATE, false, None)?;
    Ok(())
}

pub unsafe fn win_create(base: *mut c_void, size: MPI_Aint, disp_unit: c_int, info: MPI_Info, c: MPI_Comm, w: *mut MPI_Win) -> Res {
    win_create_c(base, size, disp_unit as MPI_Aint, info, c, w)
}

unsafe fn allocate(size: MPI_Aint, disp_unit: MPI_Aint, c: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win, flavor: c_int) -> Res {
    check_new(size as i64, disp_unit as i64, c)?;
    let o = out(w, "win").map_err(|e| e.on(c))?;
    let b = out(baseptr as *mut *mut c_void, "baseptr").map_err(|e| e.on(c))?;
    // SAFETY: malloc of at least one byte (a window of 0 bytes still has an address).
    let mem = unsafe { libc::malloc((size as usize).max(1)) };
    if mem.is_null() {
        return Err(MpiErr::new(MPI_ERR_NO_MEM, format!("cannot allocate {size} bytes for the window")).on(c));
    }
    match make(mem as usize, size as i64, disp_unit as i64, c, flavor, true, None) {
        Ok(h) => {
            *o = h;
            *b = mem;
            Ok(())
        }
        Err(e) => {
            // SAFETY: the memory just allocated, never handed out.
            unsafe { libc::free(mem) };
            Err(e)
        }
    }
}

/// MPI_Win_create_dynamic: a window without memory; each process attaches and detaches its
/// own (MPI_Win_attach), and transfers name target memory by its address (MPI_Get_address),
/// checked against what the target has attached when they arrive.
pub unsafe fn win_create_dynamic(_info: MPI_Info, c: MPI_Comm, w: *mut MPI_Win) -> Res {
    check_new(0, 1, c)?;
    let o = out(w, "win").map_err(|e| e.on(c))?;
    *o = make(0, 0, 1, c, MPI_WIN_FLAVOR_DYNAMIC, false, None)?;
    Ok(())
}

/// The attached regions of a dynamic window, or MPI_ERR_RMA_FLAVOR.
fn attached(w: &Win) -> Result<&Mutex<Vec<(usize, usize)>>, MpiErr> {
    match &w.local.attached {
        Some(a) => Ok(a),
        None => mpi_err!(MPI_ERR_RMA_FLAVOR, "the window was not made by MPI_Win_create_dynamic"),
    }
}

pub unsafe fn win_attach(h: MPI_Win, base: *mut c_void, size: MPI_Aint) -> Res {
    with_win(h, |w| {
        let regions = attached(w)?;
        if size < 0 {
            return mpi_err!(MPI_ERR_SIZE, "size {size} is negative");
        }
        if base.is_null() && size > 0 {
            return mpi_err!(MPI_ERR_ARG, "base is NULL");
        }
        let (b, len) = (base as usize, size as usize);
        let Some(end) = b.checked_add(len) else { return mpi_err!(MPI_ERR_ARG, "base + size overflows") };
        let mut v = lock(regions);
        if let Some(&(ob, ol)) = v.iter().find(|&&(ob, ol)| b < ob + ol && ob < end) {
            return mpi_err!(MPI_ERR_RMA_ATTACH, "[{b:#x}, {end:#x}) overlaps memory attached already, [{ob:#x}, {:#x})", ob + ol);
        }
        v.push((b, len));
        Ok(())
    })
}

pub unsafe fn win_detach(h: MPI_Win, base: *const c_void) -> Res {
    with_win(h, |w| {
        let regions = attached(w)?;
        let mut v = lock(regions);
        match v.iter().position(|&(b, _)| b == base as usize) {
            Some(i) => {
                v.remove(i);
                Ok(())
            }
            None => mpi_err!(MPI_ERR_RMA_ATTACH, "no memory attached to this window starts at {base:p}"),
        }
    })
}

pub unsafe fn win_allocate_c(size: MPI_Aint, disp_unit: MPI_Aint, _info: MPI_Info, c: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win) -> Res {
    allocate(size, disp_unit, c, baseptr, w, MPI_WIN_FLAVOR_ALLOCATE)
}

pub unsafe fn win_allocate(size: MPI_Aint, disp_unit: c_int, info: MPI_Info, c: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win) -> Res {
    win_allocate_c(size, disp_unit as MPI_Aint, info, c, baseptr, w)
}

/// Shared memory windows: on one process, its own memory; on several (all on this host,
/// else MPI_ERR_RMA_SHARED), one segment they all map, each process's part after the one of
/// the rank before it (`shwin`), which MPI_Win_shared_query finds. Transfers between them go
/// as on any window; loads and stores reach the others' parts directly.
pub unsafe fn win_allocate_shared_c(size: MPI_Aint, disp_unit: MPI_Aint, _info: MPI_Info, c: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win) -> Res {
    crate::state::check_active()?;
    let mc = crate::state::get_comm(c)?;
    if mc.size() == 1 {
        return allocate(size, disp_unit, c, baseptr, w, MPI_WIN_FLAVOR_SHARED);
    }
    check_new(size as i64, disp_unit as i64, c)?;
    let on = |e: MpiErr| e.on(c);
    let o = out(w, "win").map_err(on)?;
    let b = out(baseptr as *mut *mut c_void, "baseptr").map_err(on)?;
    let hosts = &mc.comm.world().hosts;
    let members = mc.group_members();
    if members.iter().any(|&m| hosts[m as usize] != hosts[members[0] as usize]) {
        return Err(MpiErr::new(MPI_ERR_RMA_SHARED, "MPI_Win_allocate_shared: the communicator's processes are not all on one host").on(c));
    }
    let parts = all_parts(&mc.comm, size as i64, disp_unit as i64).map_err(|e| MpiErr::from(e).on(c))?;
    let seg = crate::shwin::Segment::make(&mc.comm, &parts).map_err(on)?;
    let base = seg.base_of(mc.rank());
    *o = make(base, size as i64, disp_unit as i64, c, MPI_WIN_FLAVOR_SHARED, false, Some(seg))?;
    *b = base as *mut c_void;
    Ok(())
}

pub unsafe fn win_allocate_shared(size: MPI_Aint, disp_unit: c_int, info: MPI_Info, c: MPI_Comm, baseptr: *mut c_void, w: *mut MPI_Win) -> Res {
    win_allocate_shared_c(size, disp_unit as MPI_Aint, info, c, baseptr, w)
}

pub unsafe fn win_shared_query_c(h: MPI_Win, rank: c_int, size: *mut MPI_Aint, disp_unit: *mut MPI_Aint, baseptr: *mut c_void) -> Res {
    with_win(h, |w| {
        if rank != MPI_PROC_NULL && !(0..w.comm.size() as c_int).contains(&rank) {
            return mpi_err!(MPI_ERR_RANK, "rank {rank} is not a rank of the window's group (size {})", w.comm.size());
        }
        // Windows of every flavor may be asked (MPI 4.1): beyond a shared segment, only this
        // process's own memory is reachable by load and store; the others' is 0 bytes at NULL.
        // MPI_PROC_NULL: the lowest rank whose memory is not empty.
        let me = w.comm.rank();
        let r = if rank == MPI_PROC_NULL { w.peers.iter().position(|p| p.0 > 0).unwrap_or(0) } else { rank as usize };
        let (s, d, b) = match &w.segment {
            Some(seg) => seg.query(r),
            None if r == me => (w.size as i64, w.disp_unit as i64, w.base),
            None => (0, w.peers[r].1.min(c_int::MAX as i64), 0),
        };
        *out(size, "size")? = s as MPI_Aint;
        *out(disp_unit, "disp_unit")? = d as MPI_Aint;
        *out(baseptr as *mut usize, "baseptr")? = b;
        Ok(())
    })
}

pub unsafe fn win_shared_query(h: MPI_Win, rank: c_int, size: *mut MPI_Aint, disp_unit: *mut c_int, baseptr: *mut c_void) -> Res {
    let mut du: MPI_Aint = 0;
    win_shared_query_c(h, rank, size, &mut du, baseptr)?;
    *out(disp_unit, "disp_unit").map_err(|e| e.on(h))? = du as c_int;
    Ok(())
}

fn barrier(w: &Win) -> Res {
    if w.comm.size() > 1 {
        w.comm.collective(distcomm::collective::CollArgs::Barrier).map_err(MpiErr::from)?;
    }
    Ok(())
}

pub unsafe fn win_free(h: *mut MPI_Win) -> Res {
    crate::state::check_active()?;
    let p = out(h, "win")?;
    let w = win(*p)?;
    let handle = *p;
    if !lock(&w.pending).is_empty() {
        return Err(MpiErr::new(MPI_ERR_RMA_SYNC, "transfers to other processes are still waiting for the fence that ends their epoch").on(handle));
    }
    if w.passive.as_ref().is_some_and(|p| p.holds_any()) {
        return Err(MpiErr::new(MPI_ERR_RMA_SYNC, "this process still holds a lock of the window (MPI_Win_unlock first)").on(handle));
    }
    {
        let mut e = lock(&w.epochs);
        if e.is_open() {
            return Err(MpiErr::new(MPI_ERR_RMA_SYNC, "a post/start epoch is still open on the window (MPI_Win_wait / MPI_Win_complete first)").on(handle));
        }
        crate::pscw::drain(&w.comm, &mut e, w.comm.timeout_ms()).map_err(|e| e.on(handle))?;
    }
    // Collective: no process frees its memory while another may still be in an epoch on it.
    barrier(&w).map_err(|e| e.on(handle))?;
    // The delete callbacks run while the window is still valid (they may query it).
    let deleted = keyval::delete_all(handle, &w.attrs);
    WINS.remove(handle);
    *p = MPI_WIN_NULL;
    if let Some(passive) = &w.passive {
        passive.stop();
    }
    w.comm.destroy();
    if w.owned {
        // SAFETY: the memory `allocate` made for this window, freed once (the window is gone).
        unsafe { libc::free(w.base as *mut c_void) };
    }
    deleted
}

const ASSERT_BITS: c_int = MPI_MODE_NOCHECK | MPI_MODE_NOPRECEDE | MPI_MODE_NOPUT | MPI_MODE_NOSTORE | MPI_MODE_NOSUCCEED;

fn check_assert(a: c_int) -> Res {
    if a & !ASSERT_BITS != 0 {
        return mpi_err!(MPI_ERR_ASSERT, "assert {a:#x} has bits that are not MPI_MODE_* assertions");
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Ends the epoch (its transfers to other processes complete here) and, without
/// MPI_MODE_NOSUCCEED, opens the next.
pub unsafe fn win_fence(assert: c_int, h: MPI_Win) -> Res {
    with_win(h, |w| {
        check_assert(assert)?;
        let r = if w.comm.size() > 1 {
            let p = std::mem::take(&mut *lock(&w.pending));
            rma::fence(&w.comm, &w.local, p)
        } else {
            Ok(())
        };
        w.fenced.store(assert & MPI_MODE_NOSUCCEED == 0, Ordering::Relaxed);
        r
    })
}

// ---- post / start / complete / wait (pscw.rs) -------------------------------------------------

/// The window ranks of a group's members, this process left out (its own transfers are done
/// at their calls).
fn epoch_ranks(w: &Win, g: MPI_Group) -> Result<Vec<usize>, MpiErr> {
    let members = crate::group::get(g)?;
    let me = w.comm.rank();
    let mut v = Vec::with_capacity(members.len());
    for &m in members.iter() {
        match w.comm.members().iter().position(|&x| x == m) {
            Some(r) if r == me => {}
            Some(r) => v.push(r),
            None => return mpi_err!(MPI_ERR_GROUP, "process {m} of the group is not in the window's group"),
        }
    }
    Ok(v)
}

pub unsafe fn win_post(g: MPI_Group, assert: c_int, h: MPI_Win) -> Res {
    with_win(h, |w| {
        check_assert(assert)?;
        let origins = epoch_ranks(w, g)?;
        crate::pscw::post(&w.comm, &mut lock(&w.epochs), origins)
    })
}

pub unsafe fn win_start(g: MPI_Group, assert: c_int, h: MPI_Win) -> Res {
    with_win(h, |w| {
        check_assert(assert)?;
        let targets = epoch_ranks(w, g)?;
        crate::pscw::start(&w.comm, &mut lock(&w.epochs), targets)
    })
}

pub unsafe fn win_complete(h: MPI_Win) -> Res {
    with_win(h, |w| {
        let mut p = lock(&w.pending);
        crate::pscw::complete(&w.comm, w.passive.as_ref(), &mut lock(&w.epochs), &mut p, w.comm.timeout_ms())
    })
}

pub unsafe fn win_wait(h: MPI_Win) -> Res {
    with_win(h, |w| crate::pscw::wait(&w.comm, &w.local, &mut lock(&w.epochs), w.comm.timeout_ms()))
}

pub unsafe fn win_test(h: MPI_Win, flag: *mut c_int) -> Res {
    with_win(h, |w| {
        let f = out(flag, "flag")?;
        *f = crate::pscw::test(&w.comm, &w.local, &mut lock(&w.epochs), w.comm.timeout_ms())? as c_int;
        Ok(())
    })
}

fn check_rank(w: &Win, rank: c_int) -> Res {
    if rank == MPI_PROC_NULL || (rank >= 0 && (rank as usize) < w.comm.size()) {
        Ok(())
    } else {
        mpi_err!(MPI_ERR_RANK, "rank {rank} is not a rank of the window's group (size {})", w.comm.size())
    }
}

pub unsafe fn win_lock(lock_type: c_int, rank: c_int, assert: c_int, h: MPI_Win) -> Res {
    with_win(h, |w| {
        if lock_type != MPI_LOCK_EXCLUSIVE && lock_type != MPI_LOCK_SHARED {
            return mpi_err!(MPI_ERR_LOCKTYPE, "{lock_type} is neither MPI_LOCK_EXCLUSIVE nor MPI_LOCK_SHARED");
        }
        check_assert(assert)?;
        at_rank(w, rank, |p, r| p.lock(r, lock_type == MPI_LOCK_EXCLUSIVE, w.comm.timeout_ms()))
    })
}

/// `f` with the window's passive-target state for `rank`, once the rank is checked; nothing
/// for MPI_PROC_NULL or on a window of one process (its transfers are done at their calls).
fn at_rank(w: &Win, rank: c_int, f: impl FnOnce(&crate::passive::Passive, usize) -> Res) -> Res {
    check_rank(w, rank)?;
    match &w.passive {
        Some(p) if rank != MPI_PROC_NULL => f(p, rank as usize),
        _ => Ok(()),
    }
}

/// `f` for every window rank whose lock this process holds.
fn each_held(w: &Win, f: impl Fn(&crate::passive::Passive, usize) -> Res) -> Res {
    if let Some(p) = &w.passive {
        for r in (0..w.comm.size()).filter(|&r| p.holds(r)) {
            f(p, r)?;
        }
    }
    Ok(())
}

/// Unlock: the transfers to `rank` are complete there when it returns.
pub unsafe fn win_unlock(rank: c_int, h: MPI_Win) -> Res {
    with_win(h, |w| at_rank(w, rank, |p, r| p.unlock(r, &mut lock(&w.pending), w.comm.timeout_ms())))
}

pub unsafe fn win_lock_all(assert: c_int, h: MPI_Win) -> Res {
    with_win(h, |w| {
        check_assert(assert)?;
        if let Some(p) = &w.passive {
            for r in 0..w.comm.size() {
                p.lock(r, false, w.comm.timeout_ms())?;
            }
        }
        Ok(())
    })
}

pub unsafe fn win_unlock_all(h: MPI_Win) -> Res {
    with_win(h, |w| each_held(w, |p, r| p.unlock(r, &mut lock(&w.pending), w.comm.timeout_ms())))
}

/// Flush and flush_local: the transfers to `rank` are complete there (local completion is not
/// told apart: the origin's data was copied at the call).
pub unsafe fn win_flush(rank: c_int, h: MPI_Win) -> Res {
    with_win(h, |w| at_rank(w, rank, |p, r| p.flush(r, &mut lock(&w.pending), w.comm.timeout_ms())))
}
pub unsafe fn win_flush_local(rank: c_int, h: MPI_Win) -> Res {
    win_flush(rank, h)
}
pub unsafe fn win_flush_all(h: MPI_Win) -> Res {
    with_win(h, |w| each_held(w, |p, r| p.flush(r, &mut lock(&w.pending), w.comm.timeout_ms())))
}
pub unsafe fn win_flush_local_all(h: MPI_Win) -> Res {
    win_flush_all(h)
}
pub unsafe fn win_sync(h: MPI_Win) -> Res {
    with_win(h, |_| Ok(()))
}

// ---- transfers ---------------------------------------------------------------------------------

/// Where a transfer's target data lies in this process's window: the address of the target
/// buffer (as a datatype buffer: its data starts at its type's true lower bound).
struct Target {
    addr: *mut u8,
    t: Arc<Type>,
    count: u64,
}

/// Where a transfer goes.
enum Where {
    /// MPI_PROC_NULL: nowhere.
    Nowhere,
    Here(Target),
    /// Another process: queued for the fence.
    There { rank: usize, disp: i64, count: u64, t: Arc<Type> },
}

impl Where {
    fn remote(&self) -> Option<rma::Remote<'_>> {
        match self {
            Where::There { rank, disp, count, t } => Some(rma::Remote { rank: *rank, disp: *disp, count: *count, t }),
            _ => None,
        }
    }
}

/// Checks the target data lies within a window of `size` bytes at `disp` * `unit`; gives the
/// bytes it spans, [lo, hi) (empty for no data).
fn check_range(t: &Type, count: i64, disp: MPI_Aint, unit: i64, size: i64) -> Result<(i128, i128), MpiErr> {
    if disp < 0 {
        return mpi_err!(MPI_ERR_RMA_RANGE, "target_disp {disp} is negative");
    }
    let off = (disp as i128) * (unit as i128);
    if count > 0 && t.map.size > 0 {
        let span = (count as i128 - 1) * t.map.extent() as i128;
        let lo = off + t.map.true_lb as i128 + span.min(0);
        let hi = off + t.map.true_ub as i128 + span.max(0);
        if lo < 0 || hi > size as i128 {
            return mpi_err!(MPI_ERR_RMA_RANGE, "the target data [{lo}, {hi}) leaves the window of {size} bytes");
        }
        return Ok((lo, hi));
    }
    Ok((off, off))
}

/// Checks a transfer's target and finds it: in this process's window, or another's.
fn target(w: &Win, rank: c_int, disp: MPI_Aint, count: i64, dt: MPI_Datatype) -> Result<Where, MpiErr> {
    check_rank(w, rank)?;
    let t = datatype::resolve(dt)?;
    if count < 0 {
        return mpi_err!(MPI_ERR_COUNT, "target_count {count} is negative");
    }
    if rank == MPI_PROC_NULL {
        return Ok(Where::Nowhere);
    }
    let r = rank as usize;
    let (size, unit) = w.peers[r];
    let (lo, hi) = check_range(&t, count, disp, unit, size)?;
    if r != w.comm.rank() {
        let locked = w.passive.as_ref().is_some_and(|p| p.holds(r));
        if !locked && !w.fenced.load(Ordering::Relaxed) && !lock(&w.epochs).is_access_target(r) {
            return mpi_err!(
                MPI_ERR_RMA_SYNC,
                "a one-sided transfer to rank {rank} of the window's group of {} outside an epoch that reaches it (a fence, a post/start access epoch, or a lock of that rank)",
                w.comm.size()
            );
        }
        return Ok(Where::There { rank: r, disp: disp as i64, count: count as u64, t });
    }
    if w.local.attached.is_some() && !w.local.holds(lo as u64, (hi - lo) as u64) {
        return mpi_err!(MPI_ERR_RMA_RANGE, "the target data [{lo:#x}, {hi:#x}) is not within memory attached to this dynamic window");
    }
    let off = disp as i128 * unit as i128;
    Ok(Where::Here(Target { addr: (w.base as *mut u8).wrapping_add(off as usize), t, count: count as u64 }))
}

impl Target {
    fn bytes(&self) -> usize {
        self.t.map.packed_bytes(self.count).unwrap_or(0) as usize
    }
    fn read(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.bytes()];
        // SAFETY: the target data lies within the window's memory (checked by `target`).
        unsafe { self.t.map.pack(self.addr, self.count, &mut v) };
        v
    }
    fn write(&self, data: &[u8]) {
        // SAFETY: as in `read`.
        unsafe { self.t.map.unpack(data, self.addr, self.count) }
    }
}

fn same_size(origin: usize, t: &Target, what: &str) -> Res {
    sizes_match(origin, t.bytes(), what)
}

fn sizes_match(origin: usize, target: usize, what: &str) -> Res {
    if origin != target {
        return mpi_err!(MPI_ERR_TYPE, "the {what} data is {origin} bytes and the target data {target} bytes: their type signatures differ");
    }
    Ok(())
}

fn same_size_as(origin: usize, to: &Where, what: &str) -> Res {
    match to {
        Where::Nowhere => Ok(()),
        Where::Here(t) => same_size(origin, t, what),
        Where::There { count, t, .. } => sizes_match(origin, t.map.packed_bytes(*count).unwrap_or(0) as usize, what),
    }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn put_c(oaddr: *const c_void, ocount: MPI_Count, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: MPI_Count, tdt: MPI_Datatype, h: MPI_Win) -> Res {
    with_win(h, |w| {
        let data = crate::packing::pack_copy(oaddr, ocount, odt)?;
        let to = target(w, rank, disp, tcount, tdt)?;
        same_size_as(data.len(), &to, "origin")?;
        match &to {
            Where::Here(t) => w.local.in_turn(|| t.write(&data)),
            Where::There { .. } => w.queue(&to, |p, n, r| rma::put(p, n, r, &data))?,
            Where::Nowhere => {}
        }
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn put(oaddr: *const c_void, ocount: c_int, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: c_int, tdt: MPI_Datatype, h: MPI_Win) -> Res {
    put_c(oaddr, ocount as MPI_Count, odt, rank, disp, tcount as MPI_Count, tdt, h)
}

/// Unpacks `data` into `count` elements of `dt` at `buf` (the origin of a get).
fn to_origin(buf: *mut c_void, count: i64, dt: MPI_Datatype, data: &[u8], what: &str) -> Res {
    let t = datatype::resolve(dt)?;
    let len = crate::packing::packed_len(&t, count)?;
    crate::packing::check_typed_buf(buf, &t, len, what)?;
    if len != data.len() {
        return mpi_err!(MPI_ERR_TYPE, "the {what} data is {len} bytes and the target data {} bytes: their type signatures differ", data.len());
    }
    // SAFETY: the caller's buffer holds `count` elements of the type.
    unsafe { t.map.unpack(data, buf as *mut u8, count as u64) };
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn get_c(oaddr: *mut c_void, ocount: MPI_Count, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: MPI_Count, tdt: MPI_Datatype, h: MPI_Win) -> Res {
    with_win(h, |w| {
        datatype::resolve(odt)?;
        if ocount < 0 {
            return mpi_err!(MPI_ERR_COUNT, "origin_count {ocount} is negative");
        }
        match target(w, rank, disp, tcount, tdt)? {
            Where::Here(t) => to_origin(oaddr, ocount, odt, &w.local.in_turn(|| t.read()), "origin"),
            to @ Where::There { .. } => {
                let ot = landing(oaddr, ocount, odt, &to, "origin")?;
                w.queue(&to, |p, n, r| rma::get(p, n, r, None, oaddr as usize, ocount as u64, ot))
            }
            Where::Nowhere => Ok(()),
        }
    })
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn get(oaddr: *mut c_void, ocount: c_int, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: c_int, tdt: MPI_Datatype, h: MPI_Win) -> Res {
    get_c(oaddr, ocount as MPI_Count, odt, rank, disp, tcount as MPI_Count, tdt, h)
}

/// Checks the origin buffer a remote get's data will land in; its type.
fn landing(buf: *mut c_void, count: i64, dt: MPI_Datatype, to: &Where, what: &str) -> Result<Arc<Type>, MpiErr> {
    let t = datatype::resolve(dt)?;
    let len = crate::packing::packed_len(&t, count)?;
    crate::packing::check_typed_buf(buf, &t, len, what)?;
    same_size_as(len, to, what)?;
    Ok(t)
}

/// target = origin (op) target, element by element, on packed bytes of `basic` elements.
pub(crate) fn combine(op: MPI_Op, basic: Option<usize>, origin: &[u8], target: &mut [u8]) -> Res {
    match op {
        MPI_REPLACE => {
            target.copy_from_slice(origin);
            return Ok(());
        }
        MPI_NO_OP => return Ok(()),
        o if o >= crate::op::OP_BASE => return mpi_err!(MPI_ERR_OP, "one-sided accumulate operations take predefined ops only, not user op {op:#x}"),
        _ => {}
    }
    if origin.is_empty() {
        return Ok(());
    }
    let dt = basic.and_then(datatype::predefined).ok_or_else(|| MpiErr::new(MPI_ERR_TYPE, "accumulate needs data of one predefined type"))?;
    crate::op::plan(op, &dt)?;
    let n = origin.len() / dt.size.max(1);
    if dt.size == dt.extent {
        crate::op::apply(&crate::op::Local::Predef(op, dt), n, origin, target);
        return Ok(());
    }
    // A padded pair (MPI_DOUBLE_INT, MPI_LONG_DOUBLE_INT...): its packed bytes are not its
    // memory layout, which the op works on.
    let t = datatype::predef_type(dt);
    let (mut o, mut at) = (vec![0u8; n * dt.extent], vec![0u8; n * dt.extent]);
    // SAFETY: both buffers hold `n` elements of the type's extent; the packed ones `n` of its size.
    unsafe {
        t.map.unpack(origin, o.as_mut_ptr(), n as u64);
        t.map.unpack(target, at.as_mut_ptr(), n as u64);
    }
    crate::op::apply(&crate::op::Local::Predef(op, dt), n, &o, &mut at);
    // SAFETY: as above.
    unsafe { t.map.pack(at.as_ptr(), n as u64, target) };
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn accumulate_c(oaddr: *const c_void, ocount: MPI_Count, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: MPI_Count, tdt: MPI_Datatype, op: MPI_Op, h: MPI_Win) -> Res {
    with_win(h, |w| {
        let data = crate::packing::pack_copy(oaddr, ocount, odt)?;
        let to = target(w, rank, disp, tcount, tdt)?;
        same_size_as(data.len(), &to, "origin")?;
        match &to {
            Where::Here(t) => w.local.in_turn(|| {
                let mut cur = t.read();
                combine(op, t.t.map.basic, &data, &mut cur)?;
                t.write(&cur);
                Ok::<(), MpiErr>(())
            })?,
            Where::There { t, .. } => {
                // The op's checks at the origin: the target applies it without a way to answer.
                combine(op, t.map.basic, &data, &mut data.clone())?;
                w.queue(&to, |p, n, r| rma::accumulate(p, n, r, op, &data))?;
            }
            Where::Nowhere => {}
        }
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn accumulate(oaddr: *const c_void, ocount: c_int, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: c_int, tdt: MPI_Datatype, op: MPI_Op, h: MPI_Win) -> Res {
    accumulate_c(oaddr, ocount as MPI_Count, odt, rank, disp, tcount as MPI_Count, tdt, op, h)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn get_accumulate_c(
    oaddr: *const c_void,
    ocount: MPI_Count,
    odt: MPI_Datatype,
    raddr: *mut c_void,
    rcount: MPI_Count,
    rdt: MPI_Datatype,
    rank: c_int,
    disp: MPI_Aint,
    tcount: MPI_Count,
    tdt: MPI_Datatype,
    op: MPI_Op,
    h: MPI_Win,
) -> Res {
    with_win(h, |w| {
        // With MPI_NO_OP the origin buffer is ignored (the standard's words).
        let data = if op == MPI_NO_OP { Vec::new() } else { crate::packing::pack_copy(oaddr, ocount, odt)? };
        datatype::resolve(rdt)?;
        let t = match target(w, rank, disp, tcount, tdt)? {
            Where::Here(t) => t,
            to @ Where::There { .. } => {
                let rt = landing(raddr, rcount, rdt, &to, "result")?;
                if op != MPI_NO_OP {
                    same_size_as(data.len(), &to, "origin")?;
                    let Where::There { t, .. } = &to else { unreachable!() };
                    combine(op, t.map.basic, &data, &mut data.clone())?;
                }
                return w.queue(&to, |p, n, r| rma::get(p, n, r, Some((op, &data)), raddr as usize, rcount as u64, rt));
            }
            Where::Nowhere => return Ok(()),
        };
        w.local.in_turn(|| {
            let mut cur = t.read();
            to_origin(raddr, rcount, rdt, &cur, "result")?;
            if op != MPI_NO_OP {
                same_size(data.len(), &t, "origin")?;
                combine(op, t.t.map.basic, &data, &mut cur)?;
                t.write(&cur);
            }
            Ok(())
        })
    })
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn get_accumulate(
    oaddr: *const c_void,
    ocount: c_int,
    odt: MPI_Datatype,
    raddr: *mut c_void,
    rcount: c_int,
    rdt: MPI_Datatype,
    rank: c_int,
    disp: MPI_Aint,
    tcount: c_int,
    tdt: MPI_Datatype,
    op: MPI_Op,
    h: MPI_Win,
) -> Res {
    get_accumulate_c(oaddr, ocount as MPI_Count, odt, raddr, rcount as MPI_Count, rdt, rank, disp, tcount as MPI_Count, tdt, op, h)
}

pub unsafe fn fetch_and_op(oaddr: *const c_void, raddr: *mut c_void, dt: MPI_Datatype, rank: c_int, disp: MPI_Aint, op: MPI_Op, h: MPI_Win) -> Res {
    get_accumulate_c(oaddr, 1, dt, raddr, 1, dt, rank, disp, 1, dt, op, h)
}

pub unsafe fn compare_and_swap(oaddr: *const c_void, caddr: *const c_void, raddr: *mut c_void, dt: MPI_Datatype, rank: c_int, disp: MPI_Aint, h: MPI_Win) -> Res {
    with_win(h, |w| {
        let new = crate::packing::pack_copy(oaddr, 1, dt)?;
        let cmp = crate::packing::pack_copy(caddr, 1, dt)?;
        let t = match target(w, rank, disp, 1, dt)? {
            Where::Here(t) => t,
            to @ Where::There { .. } => {
                let rt = landing(raddr, 1, dt, &to, "result")?;
                same_size_as(new.len(), &to, "origin")?;
                same_size_as(cmp.len(), &to, "compare")?;
                return w.queue(&to, |p, n, r| rma::compare_and_swap(p, n, r, &cmp, &new, raddr as usize, rt));
            }
            Where::Nowhere => return Ok(()),
        };
        w.local.in_turn(|| {
            let cur = t.read();
            to_origin(raddr, 1, dt, &cur, "result")?;
            if cur == cmp {
                t.write(&new);
            }
            Ok(())
        })
    })
}

// ---- attributes, names, groups, info, error handlers ----------------------------------------------

pub unsafe fn win_get_attr(h: MPI_Win, k: c_int, value: *mut c_void, flag: *mut c_int) -> Res {
    with_win(h, |w| {
        let f = out(flag, "flag")?;
        let v = out(value as *mut usize, "attribute_val")?;
        // MPI_WIN_BASE's value is the base itself; the others point to theirs.
        *v = match k {
            MPI_WIN_BASE => w.base,
            MPI_WIN_SIZE => &w.size as *const MPI_Aint as usize,
            MPI_WIN_DISP_UNIT => &w.disp_unit as *const c_int as usize,
            MPI_WIN_CREATE_FLAVOR => &w.flavor as *const c_int as usize,
            MPI_WIN_MODEL => &w.model as *const c_int as usize,
            _ => return keyval::get_into(Kind::Win, &w.attrs, k, value, f),
        };
        *f = 1;
        Ok(())
    })
}

pub unsafe fn win_set_attr(h: MPI_Win, k: c_int, val: *mut c_void) -> Res {
    with_win(h, |w| keyval::set(Kind::Win, h, &w.attrs, k, val))
}

pub unsafe fn win_delete_attr(h: MPI_Win, k: c_int) -> Res {
    with_win(h, |w| keyval::delete(Kind::Win, h, &w.attrs, k))
}

pub unsafe fn win_create_keyval(copy: Option<MPI_Win_copy_attr_function>, delete: Option<MPI_Win_delete_attr_function>, k: *mut c_int, extra: *mut c_void) -> Res {
    // MPI_WIN_NULL_COPY_FN and MPI_WIN_NULL_DELETE_FN are NULL (0), MPI_WIN_DUP_FN is 1.
    *out(k, "win_keyval")? = keyval::create(Kind::Win, copy.map_or(0, |f| f as usize), delete.map_or(0, |f| f as usize), extra);
    Ok(())
}

pub unsafe fn win_free_keyval(k: *mut c_int) -> Res {
    keyval::free(Kind::Win, out(k, "win_keyval")?)
}

pub unsafe fn win_set_name(h: MPI_Win, name: *const c_char) -> Res {
    with_win(h, |w| {
        if name.is_null() {
            return mpi_err!(MPI_ERR_ARG, "win_name is NULL");
        }
        // SAFETY: a NUL-terminated string from the caller.
        let s = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned();
        *w.name.lock().unwrap_or_else(|p| p.into_inner()) = truncate(s, MPI_MAX_OBJECT_NAME as usize - 1);
        Ok(())
    })
}

pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

pub unsafe fn win_get_name(h: MPI_Win, name: *mut c_char, len: *mut c_int) -> Res {
    if h == MPI_WIN_NULL {
        // The null handle's name (as MPICH gives it; mpi4py's test_win expects it).
        crate::state::check_active()?;
        return crate::api::put_str("MPI_WIN_NULL", name, len, MPI_MAX_OBJECT_NAME as usize);
    }
    with_win(h, |w| {
        let s = w.name.lock().unwrap_or_else(|p| p.into_inner()).clone();
        crate::api::put_str(&s, name, len, MPI_MAX_OBJECT_NAME as usize)
    })
}

pub unsafe fn win_get_group(h: MPI_Win, g: *mut MPI_Group) -> Res {
    with_win(h, |w| {
        *out(g, "group")? = crate::group::add(w.comm.members().to_vec());
        Ok(())
    })
}

/// Hints may be ignored (the standard's words): none are kept, the info must be valid.
pub unsafe fn win_set_info(h: MPI_Win, info: MPI_Info) -> Res {
    with_win(h, |_| {
        let mut n = 0;
        crate::info::info_get_nkeys(info, &mut n)
    })
}

pub unsafe fn win_get_info(h: MPI_Win, info: *mut MPI_Info) -> Res {
    with_win(h, |_| crate::info::info_create(info))
}

pub unsafe fn win_create_errhandler(f: Option<MPI_Win_errhandler_function>, eh: *mut MPI_Errhandler) -> Res {
    crate::objerrh::create(f, eh)
}

pub unsafe fn win_set_errhandler(h: MPI_Win, eh: MPI_Errhandler) -> Res {
    with_win(h, |w| crate::objerrh::set(&w.errhandler, h, eh))
}

pub unsafe fn win_get_errhandler(h: MPI_Win, eh: *mut MPI_Errhandler) -> Res {
    with_win(h, |w| crate::objerrh::get(&w.errhandler, h, eh))
}

pub unsafe fn win_call_errhandler(h: MPI_Win, code: c_int) -> Res {
    with_win(h, |w| crate::objerrh::call(&w.errhandler, h, code))
}

// ---- request-based transfers (Rput, Rget, Raccumulate, Rget_accumulate) -------------------------

/// The transfer made by `op`, then carried to its target at once (a flush of that target under
/// the lock that a request-based call needs) and returned as a completed request: the
/// operation is complete at the origin and at the target when the call returns.
fn requested(rank: c_int, h: MPI_Win, req: *mut MPI_Request, op: impl FnOnce() -> Res) -> Res {
    let r = out(req, "request")?;
    with_win(h, |w| {
        let remote = rank != MPI_PROC_NULL && rank >= 0 && (rank as usize) != w.comm.rank();
        if remote && !w.passive.as_ref().is_some_and(|p| p.holds(rank as usize)) {
            return mpi_err!(MPI_ERR_RMA_SYNC, "a request-based one-sided call needs a passive-target epoch: lock window rank {rank} (or lock_all) first");
        }
        Ok(())
    })?;
    op()?;
    if rank != MPI_PROC_NULL {
        // SAFETY: win_flush takes no pointers.
        unsafe { win_flush(rank, h) }?;
    }
    *r = crate::request::add(crate::request::Req::Done(crate::request::empty_status()));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn rput_c(oaddr: *const c_void, ocount: MPI_Count, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: MPI_Count, tdt: MPI_Datatype, h: MPI_Win, req: *mut MPI_Request) -> Res {
    requested(rank, h, req, || put_c(oaddr, ocount, odt, rank, disp, tcount, tdt, h))
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn rput(oaddr: *const c_void, ocount: c_int, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: c_int, tdt: MPI_Datatype, h: MPI_Win, req: *mut MPI_Request) -> Res {
    rput_c(oaddr, ocount as MPI_Count, odt, rank, disp, tcount as MPI_Count, tdt, h, req)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn rget_c(oaddr: *mut c_void, ocount: MPI_Count, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: MPI_Count, tdt: MPI_Datatype, h: MPI_Win, req: *mut MPI_Request) -> Res {
    requested(rank, h, req, || get_c(oaddr, ocount, odt, rank, disp, tcount, tdt, h))
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn rget(oaddr: *mut c_void, ocount: c_int, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: c_int, tdt: MPI_Datatype, h: MPI_Win, req: *mut MPI_Request) -> Res {
    rget_c(oaddr, ocount as MPI_Count, odt, rank, disp, tcount as MPI_Count, tdt, h, req)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn raccumulate_c(oaddr: *const c_void, ocount: MPI_Count, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: MPI_Count, tdt: MPI_Datatype, op: MPI_Op, h: MPI_Win, req: *mut MPI_Request) -> Res {
    requested(rank, h, req, || accumulate_c(oaddr, ocount, odt, rank, disp, tcount, tdt, op, h))
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn raccumulate(oaddr: *const c_void, ocount: c_int, odt: MPI_Datatype, rank: c_int, disp: MPI_Aint, tcount: c_int, tdt: MPI_Datatype, op: MPI_Op, h: MPI_Win, req: *mut MPI_Request) -> Res {
    raccumulate_c(oaddr, ocount as MPI_Count, odt, rank, disp, tcount as MPI_Count, tdt, op, h, req)
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn rget_accumulate_c(
    oaddr: *const c_void,
    ocount: MPI_Count,
    odt: MPI_Datatype,
    raddr: *mut c_void,
    rcount: MPI_Count,
    rdt: MPI_Datatype,
    rank: c_int,
    disp: MPI_Aint,
    tcount: MPI_Count,
    tdt: MPI_Datatype,
    op: MPI_Op,
    h: MPI_Win,
    req: *mut MPI_Request,
) -> Res {
    requested(rank, h, req, || get_accumulate_c(oaddr, ocount, odt, raddr, rcount, rdt, rank, disp, tcount, tdt, op, h))
}
#[allow(clippy::too_many_arguments)]
pub unsafe fn rget_accumulate(
    oaddr: *const c_void,
    ocount: c_int,
    odt: MPI_Datatype,
    raddr: *mut c_void,
    rcount: c_int,
    rdt: MPI_Datatype,
    rank: c_int,
    disp: MPI_Aint,
    tcount: c_int,
    tdt: MPI_Datatype,
    op: MPI_Op,
    h: MPI_Win,
    req: *mut MPI_Request,
) -> Res {
    rget_accumulate_c(oaddr, ocount as MPI_Count, odt, raddr, rcount as MPI_Count, rdt, rank, disp, tcount as MPI_Count, tdt, op, h, req)
}
