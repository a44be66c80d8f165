//! Persistent collectives (MPI 4.0: MPI_Barrier_init, MPI_Bcast_init, ... MPI_Exscan_init, and
//! their large-count forms): an inactive persistent request whose MPI_Start starts the
//! non-blocking collective of the same arguments. They are matched in the order of the init
//! calls, and may be started in any order (MPICH's `coll/p_order` starts a broadcast and a
//! barrier in opposite orders on two ranks): so each request runs on a communicator of its own,
//! a duplicate made by the init call (collective, as the init calls are) and freed with it.
//! The info hints are accepted and not used (none is defined for them).

use crate::abi_gen::*;
use crate::api::*;
use crate::err::{MpiErr, Res};
use crate::request::{self, Persistent, Req};
use std::ffi::{c_int, c_void};


/// Makes the inactive persistent request whose MPI_Start calls `start` (the non-blocking
/// collective, writing its request handle), on communicator `c`.
fn persistent_collective(c: MPI_Comm, r: *mut MPI_Request, start: impl Fn(MPI_Comm, *mut MPI_Request) -> Res + Send + 'static) -> Res {
    crate::state::check_active()?;
    let mc = crate::state::get_comm(c)?;
    let r = out(r, "request").map_err(|e| e.on(c))?;
    let own = OwnComm(dup_groups(&mc)?);
    // A neighbourhood collective needs the topology on its own comm too.
    crate::topo::copy_to(&mc, own.handle())?;
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

/// The communicator of a persistent collective's own, freed with the request.
struct OwnComm(MPI_Comm);

impl OwnComm {
    fn handle(&self) -> MPI_Comm {
        self.0
    }
}

impl Drop for OwnComm {
    fn drop(&mut self) {
        if let Ok(mc) = crate::state::remove_comm(self.0) {
            crate::state::release(mc);
        }
    }
}

/// `name(args.., comm, info, request)` makes a persistent request of `nonblocking(args.., comm,
/// request)`.
macro_rules! persistent_collectives {
    ($($name:ident => $nonblocking:ident($($a:ident: $t:ty),*);)*) => {$(
        #[allow(clippy::too_many_arguments)] // the standard's signature
        pub unsafe fn $name($($a: $t,)* comm: MPI_Comm, _info: MPI_Info, request: *mut MPI_Request) -> Res {
            let args = crate::task::CallerArgs(($($a,)*));
            persistent_collective(comm, request, move |own, h| {
                #[allow(clippy::let_unit_value, unused_parens)]
                let ($($a,)*) = args.get();
                // SAFETY: the caller's arguments, as the standard keeps them for the request.
                unsafe { $nonblocking($($a,)* own, h) }
            })
        }
    )*};
}

persistent_collectives! {
    allgather_init => iallgather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype);
    allgather_init_c => iallgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype);
    allgatherv_init => iallgatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype);
    allgatherv_init_c => iallgatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype);
    allreduce_init => iallreduce(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op);
    allreduce_init_c => iallreduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    alltoall_init => ialltoall(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype);
    alltoall_init_c => ialltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype);
    alltoallv_init => ialltoallv(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype);
    alltoallv_init_c => ialltoallv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtype: MPI_Datatype);
    alltoallw_init => ialltoallw(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtypes: *const MPI_Datatype);
    alltoallw_init_c => ialltoallw_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype);
    barrier_init => ibarrier();
    bcast_init => ibcast(buffer: *mut c_void, count: c_int, datatype: MPI_Datatype, root: c_int);
    bcast_init_c => ibcast_c(buffer: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, root: c_int);
    exscan_init => iexscan(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op);
    exscan_init_c => iexscan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    gather_init => igather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int);
    gather_init_c => igather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int);
    gatherv_init => igatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype, root: c_int);
    gatherv_init_c => igatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype, root: c_int);
    reduce_init => ireduce(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op, root: c_int);
    reduce_init_c => ireduce_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op, root: c_int);
    reduce_scatter_block_init => ireduce_scatter_block(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: c_int, datatype: MPI_Datatype, op: MPI_Op);
    reduce_scatter_block_init_c => ireduce_scatter_block_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    reduce_scatter_init => ireduce_scatter(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const c_int, datatype: MPI_Datatype, op: MPI_Op);
    reduce_scatter_init_c => ireduce_scatter_c(sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    scan_init => iscan(sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, datatype: MPI_Datatype, op: MPI_Op);
    scan_init_c => iscan_c(sendbuf: *const c_void, recvbuf: *mut c_void, count: MPI_Count, datatype: MPI_Datatype, op: MPI_Op);
    scatter_init => iscatter(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int);
    scatter_init_c => iscatter_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int);
    scatterv_init => iscatterv(sendbuf: *const c_void, sendcounts: *const c_int, displs: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype, root: c_int);
    neighbor_allgather_init => ineighbor_allgather(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype);
    neighbor_allgather_init_c => ineighbor_allgather_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype);
    neighbor_allgatherv_init => ineighbor_allgatherv(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype);
    neighbor_allgatherv_init_c => ineighbor_allgatherv_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, displs: *const MPI_Aint, recvtype: MPI_Datatype);
    neighbor_alltoall_init => ineighbor_alltoall(sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int, recvtype: MPI_Datatype);
    neighbor_alltoall_init_c => ineighbor_alltoall_c(sendbuf: *const c_void, sendcount: MPI_Count, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype);
    neighbor_alltoallv_init => ineighbor_alltoallv(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype);
    neighbor_alltoallv_init_c => ineighbor_alltoallv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtype: MPI_Datatype);
    neighbor_alltoallw_init => ineighbor_alltoallw(sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype);
    neighbor_alltoallw_init_c => ineighbor_alltoallw_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype, recvbuf: *mut c_void, recvcounts: *const MPI_Count, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype);
    scatterv_init_c => iscatterv_c(sendbuf: *const c_void, sendcounts: *const MPI_Count, displs: *const MPI_Aint, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: MPI_Count, recvtype: MPI_Datatype, root: c_int);
}
