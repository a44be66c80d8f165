//! The library's global state: init/finalize, the world, communicator handles.
//!
//! Handles are integers (pointer-sized): predefined ones are the standard's small values,
//! communicators made here are COMM_BASE + slot. A freed or never-made handle is found
//! missing (MPI_ERR_COMM), never dereferenced.

use crate::abi_gen::*;
use crate::err::MpiErr;
use distcomm::comm::Comm;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

pub const COMM_BASE: usize = 0x1000_0000;

/// An MPI communicator: the engine's comm plus what MPI attaches to it.
pub struct MpiComm {
    pub comm: Arc<Comm>,
    pub errhandler: AtomicUsize,
    pub handle: MPI_Comm,
    /// MPI_Comm_set_name / get_name.
    pub name: Mutex<String>,
    /// User attributes: (keyval, value).
    pub attrs: Mutex<Vec<(c_int, usize)>>,
    /// Set once, right after the handle is made, for an intercommunicator (see inter.rs).
    pub inter: std::sync::OnceLock<crate::inter::Inter>,
    /// Set once, right after the handle is made, for a Cartesian or graph communicator (see
    /// topo.rs).
    pub topo: std::sync::OnceLock<crate::topo::Topo>,
    /// Made by the first MPI_File_open on this communicator (see file/group.rs).
    pub io: std::sync::OnceLock<Arc<crate::file::IoGroup>>,
    /// Made by the first MPI_Psend_init or MPI_Precv_init on it (see partitioned.rs).
    pub partitioned: std::sync::OnceLock<CommRef>,
}

impl MpiComm {
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }
    /// The (local) group's size; `comm.size()` is the remote group's on an intercommunicator.
    pub fn size(&self) -> usize {
        self.inter.get().map_or(self.comm.size(), |x| x.local.len())
    }
    /// World ranks of the (local) group, by rank.
    pub fn group_members(&self) -> Vec<u32> {
        self.inter.get().map_or_else(|| self.comm.members().to_vec(), |x| x.local.clone())
    }
    /// Its files' communicator goes once their last one is closed.
    pub fn release_io(&self) {
        if let Some(g) = self.io.get() {
            g.comm_freed();
        }
    }

    /// Releases the engine comms (MPI_Comm_free, MPI_Finalize).
    pub fn destroy(&self) {
        self.release_io();
        crate::pcoll::release_pool(self);
        if let Some(p) = self.partitioned.get() {
            p.comm.destroy();
        }
        self.comm.destroy();
        if let Some(x) = self.inter.get() {
            x.union.destroy();
        }
        if let Some(t) = self.topo.get() {
            t.neighbors_comm().comm.destroy();
        }
    }
}

/// The communicators made by the program (MPI_Comm_dup, split, ...): handle COMM_BASE + slot.
struct Comms {
    slots: Vec<Option<Arc<MpiComm>>>,
}

static COMMS: RwLock<Comms> = RwLock::new(Comms { slots: Vec::new() });
/// MPI_COMM_WORLD and MPI_COMM_SELF, set by init and kept for the life of the process (MPI is
/// initialized once): found without the table's lock and without counting a reference, four
/// atomic read-modify-writes that a 16 B collective feels (see `CommRef`).
static WORLD: OnceLock<Arc<MpiComm>> = OnceLock::new();
static SELF: OnceLock<Arc<MpiComm>> = OnceLock::new();

/// A communicator found by its handle: a predefined one borrowed for the process's life, or a
/// made one held by a reference count (it stays usable if the program frees its handle
/// meanwhile).
#[derive(Clone)]
pub enum CommRef {
    Predefined(&'static Arc<MpiComm>),
    Made(Arc<MpiComm>),
}

impl std::ops::Deref for CommRef {
    type Target = Arc<MpiComm>;
    fn deref(&self) -> &Arc<MpiComm> {
        match self {
            CommRef::Predefined(c) => c,
            CommRef::Made(c) => c,
        }
    }
}
static INITIALIZED: AtomicBool = AtomicBool::new(false);
static FINALIZED: AtomicBool = AtomicBool::new(false);
static INIT_LOCK: Mutex<()> = Mutex::new(());
pub static THREAD_LEVEL: AtomicI32 = AtomicI32::new(MPI_THREAD_SINGLE);
static MAIN_THREAD: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);
static WORLD_RANK: AtomicI32 = AtomicI32::new(-1);
/// Errhandler of MPI_COMM_SELF and WORLD before init / after finalize.
static DEFAULT_ERRH: AtomicUsize = AtomicUsize::new(MPI_ERRORS_ARE_FATAL);

fn read() -> std::sync::RwLockReadGuard<'static, Comms> {
    COMMS.read().unwrap_or_else(|p| p.into_inner())
}
fn write() -> std::sync::RwLockWriteGuard<'static, Comms> {
    COMMS.write().unwrap_or_else(|p| p.into_inner())
}

pub fn initialized() -> bool {
    INITIALIZED.load(Ordering::Acquire)
}
pub fn finalized() -> bool {
    FINALIZED.load(Ordering::Acquire)
}

pub fn world_rank() -> Option<usize> {
    let r = WORLD_RANK.load(Ordering::Relaxed);
    (r >= 0).then_some(r as usize)
}

/// "rank R" (or "process PID" before init) for messages.
pub fn who() -> String {
    match world_rank() {
        Some(r) => format!("distcomm MPI rank {r}"),
        None => format!("distcomm MPI process {}", std::process::id()),
    }
}

/// Writes `line` to stderr in one write (lines of several ranks do not interleave).
pub fn say(line: &str) {
    // SAFETY: writes the bytes of a live string to fd 2.
    unsafe { libc::write(2, line.as_ptr() as *const libc::c_void, line.len()) };
}

/// MPI_SUCCESS once the library is initialized and not finalized, else MPI_ERR_OTHER.
pub fn check_active() -> Result<(), MpiErr> {
    if !initialized() {
        return crate::mpi_err!(MPI_ERR_OTHER, "MPI is not initialized (call MPI_Init or MPI_Init_thread first)");
    }
    if finalized() {
        return crate::mpi_err!(MPI_ERR_OTHER, "MPI has been finalized");
    }
    Ok(())
}

fn wrap(comm: Arc<Comm>, handle: MPI_Comm) -> Arc<MpiComm> {
    let name = match handle {
        MPI_COMM_WORLD => "MPI_COMM_WORLD",
        MPI_COMM_SELF => "MPI_COMM_SELF",
        _ => "",
    };
    Arc::new(MpiComm { comm, errhandler: AtomicUsize::new(MPI_ERRORS_ARE_FATAL), handle, name: Mutex::new(name.to_string()), attrs: Mutex::new(Vec::new()), inter: std::sync::OnceLock::new(), topo: std::sync::OnceLock::new(), io: std::sync::OnceLock::new(), partitioned: std::sync::OnceLock::new() })
}

/// A communicator that has no handle of its own (a topology's neighbourhood traffic): errors
/// name `handle`, the communicator it serves.
pub fn unlisted(comm: Arc<Comm>, handle: MPI_Comm, errhandler: MPI_Errhandler) -> CommRef {
    let mc = wrap(comm, handle);
    mc.errhandler.store(errhandler, Ordering::Relaxed);
    CommRef::Made(mc)
}

/// Forms the world (the engine's init) and MPI_COMM_SELF; `provided` is the thread level.
pub fn init(required: c_int) -> Result<c_int, MpiErr> {
    let _g = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if initialized() {
        return crate::mpi_err!(MPI_ERR_OTHER, "MPI is already initialized (MPI_Init may be called once)");
    }
    let world = crate::startup::init_world().map_err(|e| e.on(MPI_COMM_SELF))?;
    WORLD_RANK.store(world.rank() as i32, Ordering::Relaxed);
    // MPI_COMM_SELF: a comm of this rank alone (collective over the world, once).
    let me = world.split(world.rank() as i32, 0).map_err(MpiErr::from)?.expect("own color");
    if WORLD.set(wrap(world, MPI_COMM_WORLD)).is_err() || SELF.set(wrap(me, MPI_COMM_SELF)).is_err() {
        return crate::mpi_err!(MPI_ERR_OTHER, "MPI cannot be initialized again after MPI_Finalize");
    }
    *MAIN_THREAD.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::thread::current().id());
    // Every level is offered: the tables here are locked, requests are taken out of theirs
    // while used (see request.rs), and the engine takes operations on one comm from several
    // threads (its matching and wires are shared by all comms of the world).
    let provided = required.clamp(MPI_THREAD_SINGLE, MPI_THREAD_MULTIPLE);
    THREAD_LEVEL.store(provided, Ordering::Relaxed);
    INITIALIZED.store(true, Ordering::Release);
    Ok(provided)
}

pub fn is_main_thread() -> bool {
    *MAIN_THREAD.lock().unwrap_or_else(|p| p.into_inner()) == Some(std::thread::current().id())
}

/// Frees every communicator and leaves the job (collective over the world).
pub fn finalize() -> Result<(), MpiErr> {
    let _g = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    check_active()?;
    let world = get_comm(MPI_COMM_WORLD)?;
    // MPI_COMM_SELF's attributes are deleted first, as if it were freed, while every object
    // is still valid (the standard's clean-up hook; mpi4py's callbacks query the comm).
    crate::info::delete_all(&*get_comm(MPI_COMM_SELF)?);
    // Buffered sends still in flight are delivered first (the standard's Finalize does so).
    crate::api::bsend_flush()?;
    // Every rank arrives before anyone leaves: messages in flight are delivered. A rank that
    // failed never arrives: the others still finalize (as under ULFM).
    if let Err(e) = world.comm.collective(distcomm::collective::CollArgs::Barrier) {
        if e.status != distcomm::Status::PeerLost {
            return Err(MpiErr::from(e).on(MPI_COMM_WORLD));
        }
    }
    let slots = std::mem::take(&mut write().slots);
    for c in slots.into_iter().flatten() {
        crate::info::delete_all(&c);
        c.destroy();
    }
    for c in std::mem::take(&mut *FREED.lock().unwrap_or_else(|p| p.into_inner())) {
        c.destroy();
    }
    let s = get_comm(MPI_COMM_SELF)?;
    crate::info::delete_all(&s);
    s.release_io();
    s.comm.destroy();
    world.release_io();
    world.comm.destroy();
    // The world's handle outlives finalize (see `WORLD`): the job's transport goes now.
    world.comm.close_world();
    if let Some(p) = crate::pmi::PMI.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        p.finalize();
    }
    FINALIZED.store(true, Ordering::Release);
    Ok(())
}

pub fn is_comm_handle(h: MPI_Comm) -> bool {
    h == MPI_COMM_WORLD || h == MPI_COMM_SELF || get_comm(h).is_ok()
}

/// The communicator behind a handle, or MPI_ERR_COMM. MPI_COMM_WORLD and MPI_COMM_SELF of an
/// active library are found inline (every call on them asks); the rest out of line.
#[inline]
pub fn get_comm(h: MPI_Comm) -> Result<CommRef, MpiErr> {
    let predefined = match h {
        MPI_COMM_WORLD => WORLD.get(),
        MPI_COMM_SELF => SELF.get(),
        _ => None,
    };
    match predefined {
        Some(c) if initialized() && !finalized() => Ok(CommRef::Predefined(c)),
        _ => find_comm(h),
    }
}

#[inline(never)]
fn find_comm(h: MPI_Comm) -> Result<CommRef, MpiErr> {
    let active = || initialized() && !finalized();
    let found = match h {
        MPI_COMM_WORLD => WORLD.get().filter(|_| active()).map(CommRef::Predefined),
        MPI_COMM_SELF => SELF.get().filter(|_| active()).map(CommRef::Predefined),
        h if h >= COMM_BASE => read().slots.get(h - COMM_BASE).cloned().flatten().map(CommRef::Made),
        _ => None,
    };
    match found {
        Some(x) => Ok(x),
        // Before init and after finalize nothing is found: say which.
        None => {
            check_active()?;
            if h == MPI_COMM_NULL {
                return crate::mpi_err!(MPI_ERR_COMM, "MPI_COMM_NULL is not a communicator");
            }
            crate::mpi_err!(MPI_ERR_COMM, "{h:#x} is not a valid communicator (never made, or freed)")
        }
    }
}

/// A new handle for `comm`, inheriting `errhandler`.
pub fn add_comm(comm: Arc<Comm>, errhandler: MPI_Errhandler) -> MPI_Comm {
    let mut c = write();
    let slot = c.slots.iter().position(|s| s.is_none()).unwrap_or_else(|| {
        c.slots.push(None);
        c.slots.len() - 1
    });
    let h = COMM_BASE + slot;
    let mc = wrap(comm, h);
    mc.errhandler.store(errhandler, Ordering::Relaxed);
    c.slots[slot] = Some(mc);
    h
}

/// Sets the attributes a new communicator starts with (a dup's copies).
pub fn set_attrs(h: MPI_Comm, attrs: Vec<(c_int, usize)>) {
    if let Ok(c) = get_comm(h) {
        crate::keyval::attached(&attrs);
        *c.attrs.lock().unwrap_or_else(|p| p.into_inner()) = attrs;
    }
}

/// Removes a user communicator's handle (MPI_Comm_free); predefined ones cannot be freed.
pub fn remove_comm(h: MPI_Comm) -> Result<Arc<MpiComm>, MpiErr> {
    if h == MPI_COMM_WORLD || h == MPI_COMM_SELF {
        return crate::mpi_err!(MPI_ERR_COMM, "MPI_COMM_WORLD and MPI_COMM_SELF cannot be freed");
    }
    let _ = get_comm(h)?;
    let mut c = write();
    c.slots.get_mut(h - COMM_BASE).and_then(|s| s.take()).ok_or_else(|| MpiErr::new(MPI_ERR_COMM, "communicator freed twice"))
}

/// MPI_COMM_WORLD's timeout (the one for waits on no communicator), once it exists.
pub fn world_timeout_ms() -> Option<i64> {
    get_comm(MPI_COMM_WORLD).ok().map(|w| w.comm.timeout_ms())
}

/// The intracommunicator behind `c`, for `what` (MPI_ERR_COMM for an intercommunicator).
pub fn intra_comm(c: MPI_Comm, what: &str) -> Result<CommRef, MpiErr> {
    check_active()?;
    let mc = get_comm(c)?;
    if mc.inter.get().is_some() {
        return Err(MpiErr::new(MPI_ERR_COMM, format!("{what} needs an intracommunicator, not an intercommunicator")).on(c));
    }
    Ok(mc)
}

/// Communicators the program freed while operations of theirs were pending (a receive
/// posted before MPI_Comm_free still gets its message): destroyed once nothing holds them.
static FREED: Mutex<Vec<Arc<MpiComm>>> = Mutex::new(Vec::new());

/// The end of a communicator whose handle was freed: its engine comms go now, or, while a
/// request still holds it, at a later free (or MPI_Finalize) that finds it released.
pub fn release(mc: Arc<MpiComm>) {
    let mut freed = FREED.lock().unwrap_or_else(|p| p.into_inner());
    freed.push(mc);
    // Only this list holds one whose count is 1: nobody can take a new reference to it.
    freed.retain(|m| {
        let held = Arc::strong_count(m) > 1;
        if !held {
            m.destroy();
        }
        held
    });
}

/// The error handler that errors on `comm` go to.
pub fn errhandler_of(comm: MPI_Comm) -> MPI_Errhandler {
    // Errors of windows, files and sessions carry their handle (see objerrh.rs).
    if let Some(h) = crate::objerrh::handler_of(comm) {
        return h;
    }
    match get_comm(comm) {
        Ok(c) => c.errhandler.load(Ordering::Relaxed),
        Err(_) => DEFAULT_ERRH.load(Ordering::Relaxed),
    }
}

/// Ends the whole job: aborts `comm` (its peers' pending calls fail, so they end too) and
/// the world, then exits with `code`.
pub fn abort_job(comm: MPI_Comm, code: c_int) -> ! {
    if let Ok(c) = get_comm(comm) {
        c.comm.abort();
    }
    if let Ok(w) = get_comm(MPI_COMM_WORLD) {
        w.comm.abort();
    }
    if let Ok(mut g) = crate::pmi::PMI.try_lock() {
        if let Some(p) = g.as_mut() {
            p.abort(code, "MPI job aborted");
        }
    }
    // An exit status of 0 would tell the launcher this rank succeeded: the job must end.
    let status = match code & 0xff {
        0 => 1,
        s => s,
    };
    // SAFETY: fflush(NULL) writes out the program's stdio buffers (what it printed before the
    // error); _exit ends the process without running the engine's (aborted) destructors.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(status)
    }
}
