//! Persistent collectives (MPI 4.0: MPI_Barrier_init, MPI_Bcast_init, ... MPI_Exscan_init, and
//! their large-count forms): an inactive persistent request whose MPI_Start starts the
//! non-blocking collective of the same arguments. They are matched in the order of the init
//! calls, and may be started in any order (MPICH's `coll/p_order` starts a broadcast and a
//! barrier in opposite orders on two ranks): so each request runs on a communicator of its own,
//! a duplicate made by the init call (collective, as the init calls are) and freed with it.
//! The info hints are accepted and not used (none is defined for them). Count, displacement
//! and type arrays are copied by the init call (as MPICH does; mpi4py frees its arrays after
//! it), so that each MPI_Start reads the copies.

use crate::abi_gen::*;
use crate::api::*;
use crate::err::{MpiErr, Res};
use crate::request::{self, Persistent, Req};
use crate::state::MpiComm;
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};


/// Makes the inactive persistent request whose MPI_Start calls `start` (the non-blocking
/// collective, writing its request handle), on communicator `c`.
fn persistent_collective(c: MPI_Comm, r: *mut MPI_Request, start: impl Fn(MPI_Comm, *mut MPI_Request) -> Res + Send + 'static) -> Res {
    crate::state::check_active()?;
    let mc = crate::state::get_comm(c)?;
    let r = out(r, "request").map_err(|e| e.on(c))?;
    let own = OwnComm::for_request(&mc)?;
    let start = Box::new(move || -> Result<Req, MpiErr> {
        let mut h = MPI_REQUEST_NULL;
        start(own.handle(), &mut h)?;
        let started = request::take(h)?;
        request::release(h);
        Ok(started)
    });
    *r = request::add(Req::Persistent(Box::new(Persistent { comm: mc, start, active: None })));
    Ok(())
}

/// The communicator of a persistent collective's own: a duplicate of the request's, made by the
/// init call or, when every member has one of an earlier request free, that one again. Making
/// a communicator costs milliseconds (its shared memory); MPI_Request_free is local, so which
/// duplicates are free is agreed at the init call (a bit mask, AND over the members): one whose
/// bit is set everywhere has finished its last collective on every member.
struct OwnComm {
    handle: MPI_Comm,
    /// Its parent's pool and its place there (the first `POOLED` duplicates of a parent).
    home: Option<(Arc<Mutex<Pool>>, u32)>,
}

/// Duplicates of one communicator that persistent requests ran on and left.
struct Pool {
    /// Duplicates made so far (their places, in the order of the init calls).
    made: u32,
    /// Places whose duplicate is free here (bit i), and their handles.
    free: u64,
    comms: [Option<MPI_Comm>; POOLED as usize],
    /// The parent was freed: duplicates left from now on go at once.
    closed: bool,
}

impl Default for Pool {
    fn default() -> Pool {
        Pool { made: 0, free: 0, comms: [None; POOLED as usize], closed: false }
    }
}

/// Duplicates of one communicator kept for reuse (the width of the agreed mask).
const POOLED: u32 = 64;

/// By the parent communicator's address: the pools of communicators alive.
static POOLS: Mutex<Vec<(usize, Arc<Mutex<Pool>>)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pool_of(mc: &MpiComm) -> Arc<Mutex<Pool>> {
    let key = mc as *const MpiComm as usize;
    let mut pools = lock(&POOLS);
    if let Some((_, p)) = pools.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    let p = Arc::new(Mutex::new(Pool::default()));
    pools.push((key, p.clone()));
    p
}

/// The communicator `mc` is going: its free duplicates go now, the others when their requests do.
pub fn release_pool(mc: &MpiComm) {
    let key = mc as *const MpiComm as usize;
    let Some(pool) = ({
        let mut pools = lock(&POOLS);
        pools.iter().position(|(k, _)| *k == key).map(|i| pools.swap_remove(i).1)
    }) else {
        return;
    };
    let comms: Vec<MPI_Comm> = {
        let mut p = lock(&pool);
        p.closed = true;
        p.free = 0;
        p.comms.iter_mut().filter_map(|c| c.take()).collect()
    };
    // Idle (no request holds them), and this may run inside `state::release`: destroyed here.
    for h in comms {
        if let Ok(m) = crate::state::remove_comm(h) {
            m.destroy();
        }
    }
}

fn free_comm(h: MPI_Comm) {
    if let Ok(mc) = crate::state::remove_comm(h) {
        crate::state::release(mc);
    }
}

impl OwnComm {
    /// Its handle (a method: the request's closure must own the whole OwnComm, not the field).
    fn handle(&self) -> MPI_Comm {
        self.handle
    }

    /// Collective over `mc`.
    fn for_request(mc: &MpiComm) -> Result<OwnComm, MpiErr> {
        if mc.inter.get().is_some() {
            return Ok(OwnComm { handle: dup_with_topology(mc)?, home: None });
        }
        let pool = pool_of(mc);
        let mine = lock(&pool).free;
        let mut all = mine.to_le_bytes();
        if mc.size() > 1 {
            let and = distcomm::collective::CollArgs::Allreduce {
                send: None,
                recv: distcomm::buffer::MutBuf::from_slice(&mut all),
                dt: distcomm::DType::Uint64,
                op: distcomm::ReduceOp::Band,
            };
            mc.comm.collective(and).map_err(|e| MpiErr::from(e).on(mc.handle))?;
        }
        let common = u64::from_le_bytes(all);
        if common != 0 {
            let place = common.trailing_zeros();
            let handle = {
                let mut p = lock(&pool);
                p.free &= !(1u64 << place);
                p.comms[place as usize].take().expect("a free place has its communicator")
            };
            // Errors go where the parent's go now.
            crate::state::get_comm(handle)?.errhandler.store(mc.errhandler.load(Ordering::Relaxed), Ordering::Relaxed);
            return Ok(OwnComm { handle, home: Some((pool, place)) });
        }
        let handle = dup_with_topology(mc)?;
        let place = {
            let mut p = lock(&pool);
            p.made += 1;
            p.made - 1
        };
        Ok(OwnComm { handle, home: (place < POOLED).then_some((pool, place)) })
    }
}

/// A duplicate of `mc` with its topology (a neighbourhood collective needs it on its own comm).
fn dup_with_topology(mc: &MpiComm) -> Result<MPI_Comm, MpiErr> {
    let h = dup_groups(mc)?;
    crate::topo::copy_to(mc, h)?;
    Ok(h)
}

impl Drop for OwnComm {
    fn drop(&mut self) {
        if let Some((pool, place)) = &self.home {
            let mut p = lock(pool);
            if !p.closed {
                p.comms[*place as usize] = Some(self.handle);
                p.free |= 1u64 << place;
                return;
            }
        }
        free_comm(self.handle);
    }
}

/// How many entries of an array argument a collective reads, known at the init call.
struct Lens {
    /// The group the arrays index: the communicator's, or the remote one of an intercommunicator.
    group: usize,
    /// The local group (MPI_Reduce_scatter's counts).
    local: usize,
    rank: c_int,
    inter: bool,
    /// In and out degree of a topology (neighbourhood collectives).
    ins: usize,
    outs: usize,
}

impl Lens {
    fn of(c: MPI_Comm) -> Result<Lens, MpiErr> {
        crate::state::check_active()?;
        let mc = crate::state::get_comm(c)?;
        let (ins, outs) = match mc.topo.get() {
            Some(_) => crate::topo::neighborhood(c).map(|(_, i, o)| (i.len(), o.len()))?,
            None => (0, 0),
        };
        Ok(Lens { group: mc.comm.size(), local: mc.size(), rank: mc.rank() as c_int, inter: mc.inter.get().is_some(), ins, outs })
    }

    /// The arrays only the root reads (MPI_Gatherv's receive side, MPI_Scatterv's send side).
    fn at_root(&self, root: c_int) -> usize {
        let here = if self.inter { root == MPI_ROOT } else { root == self.rank };
        if here {
            self.group
        } else {
            0
        }
    }
}

/// An argument of a persistent collective as each MPI_Start passes it on.
trait StartArg {
    type T;
    fn arg(&self) -> Self::T;
}

/// A plain argument (a buffer, a count, a handle).
struct Plain<T>(T);

impl<T: Copy> StartArg for Plain<T> {
    type T = T;
    fn arg(&self) -> T {
        self.0
    }
}

/// An array argument copied at the init call (its first `n` entries), or NULL kept.
struct Copied<T>(Option<Vec<T>>, *const T);

impl<T: Copy> Copied<T> {
    fn of(p: *const T, n: usize) -> Copied<T> {
        if p.is_null() || n == 0 {
            return Copied(None, p);
        }
        // SAFETY: the caller's array holds the `n` entries the collective reads.
        Copied(Some(unsafe { std::slice::from_raw_parts(p, n) }.to_vec()), p)
    }
}

impl<T> StartArg for Copied<T> {
    type T = *const T;
    fn arg(&self) -> *const T {
        self.0.as_ref().map_or(self.1, |v| v.as_ptr())
    }
}

macro_rules! start_arg {
    ($a:ident) => {
        Plain($a)
    };
    ($a:ident, $n:expr) => {
        Copied::of($a, $n)
    };
}

/// `name(args.., comm, info, request)` makes a persistent request of `nonblocking(args.., comm,
/// request)`; an argument written `name: type = n` is an array of which the init call copies
/// `n` entries (`n` may use the Lens named first and the arguments before it).
macro_rules! persistent_collectives {
    ($l:ident; $($name:ident => $nonblocking:ident($($a:ident: $t:ty $(= $n:expr)?),*);)*) => {$(
        #[allow(clippy::too_many_arguments)] // the standard's signature
        pub unsafe fn $name($($a: $t,)* comm: MPI_Comm, _info: MPI_Info, request: *mut MPI_Request) -> Res {
            #[allow(unused_variables)]
            let $l = Lens::of(comm).map_err(|e| e.on(comm))?;
            $(let $a = start_arg!($a $(, $n)?);)*
            let args = crate::task::CallerArgs(($($a,)*));
            persistent_collective(comm, request, move |own, h| {
                #[allow(clippy::let_unit_value, unused_parens)]
                let ($($a,)*) = args.peek();
                // SAFETY: the caller's buffers (kept for the request, as the standard says) and
                // our copies of its arrays.
                unsafe { $nonblocking($($a.arg(),)* own, h) }
            })
        }
    )*};
}

persistent_collectives! {
    l;
    allgather_init => iallgather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype);
    allgather_init_c => iallgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype);
    allgatherv_init => iallgatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int = l.group, displs: *const c_int = l.group, recvtype: MPI_Datatype);
    allgatherv_init_c => iallgatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count = l.group, displs: *const MPI_Aint = l.group, recvtype: MPI_Datatype);
    allreduce_init => iallreduce(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op);
    allreduce_init_c => iallreduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    alltoall_init => ialltoall(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype);
    alltoall_init_c => ialltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype);
    alltoallv_init => ialltoallv(sendbuf: *const c_void, sendcounts: *const c_int = l.group, sdispls: *const c_int = l.group, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int = l.group, rdispls: *const c_int = l.group, recvtype: MPI_Datatype);
    alltoallv_init_c => ialltoallv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count = l.group, sdispls: *const MPI_Aint = l.group, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count = l.group, rdispls: *const MPI_Aint = l.group, recvtype: MPI_Datatype);
    alltoallw_init => ialltoallw(sendbuf: *const c_void, sendcounts: *const c_int = l.group, sdispls: *const c_int = l.group, sendtypes: *const MPI_Datatype = l.group, recvbuf: *mut c_void, recvcounts: *const c_int = l.group, rdispls: *const c_int = l.group, recvtypes: *const MPI_Datatype = l.group);
    alltoallw_init_c => ialltoallw_c(sendbuf: *const c_void, sendcounts: *const MPI_Count = l.group, sdispls: *const MPI_Aint = l.group, sendtypes: *const MPI_Datatype = l.group, recvbuf: *mut c_void, recvcounts: *const MPI_Count = l.group, rdispls: *const MPI_Aint = l.group, recvtypes: *const MPI_Datatype = l.group);
    barrier_init => ibarrier();
    bcast_init => ibcast(buffer: *mut c_void, count: c_int, datatype: MPI_Datatype, root: c_int);
    bcast_init_c => ibcast_c(buffer: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, root: c_int);
    exscan_init => iexscan(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op);
    exscan_init_c => iexscan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    gather_init => igather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int);
    gather_init_c => igather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int);
    gatherv_init => igatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int = l.at_root(root), displs: *const c_int = l.at_root(root), recvtype: MPI_Datatype, root: c_int);
    gatherv_init_c => igatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count = l.at_root(root), displs: *const MPI_Aint = l.at_root(root), recvtype: MPI_Datatype, root: c_int);
    reduce_init => ireduce(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op, root: c_int);
    reduce_init_c => ireduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, root: c_int);
    reduce_scatter_block_init => ireduce_scatter_block(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: c_int, datatype: MPI_Datatype, op: MPI_Op);
    reduce_scatter_block_init_c => ireduce_scatter_block_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    reduce_scatter_init => ireduce_scatter(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const c_int = l.local, datatype: MPI_Datatype, op: MPI_Op);
    reduce_scatter_init_c => ireduce_scatter_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const MPI_Count = l.local, datatype: MPI_Datatype, op: MPI_Op);
    scan_init => iscan(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op);
    scan_init_c => iscan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    scatter_init => iscatter(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int);
    scatter_init_c => iscatter_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int);
    scatterv_init => iscatterv(sendbuf: *const c_void, sendcounts: *const c_int = l.at_root(root), displs: *const c_int = l.at_root(root), sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int);
    neighbor_allgather_init => ineighbor_allgather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype);
    neighbor_allgather_init_c => ineighbor_allgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype);
    neighbor_allgatherv_init => ineighbor_allgatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int = l.ins, displs: *const c_int = l.ins, recvtype: MPI_Datatype);
    neighbor_allgatherv_init_c => ineighbor_allgatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count = l.ins, displs: *const MPI_Aint = l.ins, recvtype: MPI_Datatype);
    neighbor_alltoall_init => ineighbor_alltoall(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype);
    neighbor_alltoall_init_c => ineighbor_alltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype);
    neighbor_alltoallv_init => ineighbor_alltoallv(sendbuf: *const c_void, sendcounts: *const c_int = l.outs, sdispls: *const c_int = l.outs, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int = l.ins, rdispls: *const c_int = l.ins, recvtype: MPI_Datatype);
    neighbor_alltoallv_init_c => ineighbor_alltoallv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count = l.outs, sdispls: *const MPI_Aint = l.outs, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count = l.ins, rdispls: *const MPI_Aint = l.ins, recvtype: MPI_Datatype);
    neighbor_alltoallw_init => ineighbor_alltoallw(sendbuf: *const c_void, sendcounts: *const c_int = l.outs, sdispls: *const MPI_Aint = l.outs, sendtypes: *const MPI_Datatype = l.outs, recvbuf: *mut c_void, recvcounts: *const c_int = l.ins, rdispls: *const MPI_Aint = l.ins, recvtypes: *const MPI_Datatype = l.ins);
    neighbor_alltoallw_init_c => ineighbor_alltoallw_c(sendbuf: *const c_void, sendcounts: *const MPI_Count = l.outs, sdispls: *const MPI_Aint = l.outs, sendtypes: *const MPI_Datatype = l.outs, recvbuf: *mut c_void, recvcounts: *const MPI_Count = l.ins, rdispls: *const MPI_Aint = l.ins, recvtypes: *const MPI_Datatype = l.ins);
    scatterv_init_c => iscatterv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count = l.at_root(root), displs: *const MPI_Aint = l.at_root(root), sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int);
}
