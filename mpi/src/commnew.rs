//! More ways to make an intracommunicator: MPI_Comm_idup (non-blocking), MPI_Comm_create_group
//! (collective over the group's members only), and MPI_Comm_get_parent (no spawn here).
//!
//! Both make the engine comm with `Comm::new_from_parts`, collective over the new comm's
//! members alone, under a context id each member derives alike from the parent's context and
//! a count of such calls it made (every member makes them in the same order).

use crate::abi_gen::*;
use crate::api::out;
use crate::ctxid::{self, CREATE_GROUP, IDUP};
use crate::err::{MpiErr, Res};
use crate::request;
use crate::state;
use distcomm::comm::Comm;
use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};


/// A caller's output address, written once the request completes.
struct Dest(usize);

pub unsafe fn comm_idup(c: MPI_Comm, newcomm: *mut MPI_Comm, request: *mut MPI_Request) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    let o = out(newcomm, "newcomm").map_err(|e| e.on(c))?;
    let r = out(request, "request").map_err(|e| e.on(c))?;
    // Attributes are copied now, as the call's arguments are read now.
    let attrs = crate::info::copied_attrs(&mc).map_err(|e| e.on(c))?;
    let errh = mc.errhandler.load(Ordering::Relaxed);
    // The task makes the communicator (on the worker that runs the comm's non-blocking
    // collectives, in call order with them); the completion call hands it out.
    let made: Arc<Mutex<Option<MPI_Comm>>> = Arc::new(Mutex::new(None));
    let m2 = made.clone();
    let keep = move |h: MPI_Comm| *m2.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
    let dest = Dest(o as *mut MPI_Comm as usize);
    let after: Option<Box<dyn FnOnce() + Send>> = Some(Box::new(move || {
        if let Some(h) = made.lock().unwrap_or_else(|p| p.into_inner()).take() {
            state::set_attrs(h, attrs);
            // SAFETY: the caller's newcomm stays valid until the request completes (MPI's rule
            // for a non-blocking call's arguments); this runs at completion.
            unsafe { *(dest.0 as *mut MPI_Comm) = h };
        }
    }));
    let req = match mc.inter.get() {
        Some(x) => {
            let mc2 = mc.clone();
            crate::task::start(&mc, &x.union, "MPI_Comm_idup", move || {
                keep(crate::inter::dup_in_order(&mc2)?);
                Ok(())
            }, after)?
        }
        None => {
            let parent: Arc<Comm> = mc.comm.clone();
            let id = ctxid::members_only(parent.context_id(), IDUP, &[], &[]);
            let (rank, members) = (mc.rank(), parent.members().to_vec());
            let f = move || {
                let child = parent.new_from_parts(id, rank, members, true).map_err(MpiErr::from)?;
                keep(state::add_comm(child, errh));
                Ok(())
            };
            crate::task::start(&mc, &mc.comm, "MPI_Comm_idup", f, after)?
        }
    };
    *o = MPI_COMM_NULL;
    *r = request::add(req);
    Ok(())
}

pub unsafe fn comm_idup_with_info(c: MPI_Comm, _info: MPI_Info, newcomm: *mut MPI_Comm, request: *mut MPI_Request) -> Res {
    comm_idup(c, newcomm, request)
}

/// MPI_Comm_create_group: the group's members call it (the parent's others do not); a caller
/// outside the group gets MPI_COMM_NULL.
pub unsafe fn comm_create_group(c: MPI_Comm, g: MPI_Group, tag: c_int, newcomm: *mut MPI_Comm) -> Res {
    state::check_active()?;
    let mc = state::get_comm(c)?;
    let on = |e: MpiErr| e.on(c);
    let o = out(newcomm, "newcomm").map_err(on)?;
    if mc.inter.get().is_some() {
        return Err(MpiErr::new(MPI_ERR_COMM, "MPI_Comm_create_group takes an intracommunicator").on(c));
    }
    if !(0..=crate::api::TAG_UB).contains(&tag) {
        return Err(MpiErr::new(MPI_ERR_TAG, format!("tag {tag} is outside [0, MPI_TAG_UB]")).on(c));
    }
    let m = crate::group::get(g).map_err(on)?;
    let members = mc.comm.members();
    if let Some(w) = m.iter().find(|w| !members.contains(w)) {
        return Err(MpiErr::new(MPI_ERR_GROUP, format!("world rank {w} of the group is not a member of the communicator")).on(c));
    }
    let me = members[mc.rank()];
    let Some(rank) = m.iter().position(|&w| w == me) else {
        *o = MPI_COMM_NULL;
        return Ok(());
    };
    let list: Vec<u32> = m.to_vec();
    let id = ctxid::members_only(mc.comm.context_id(), CREATE_GROUP, &list, &tag.to_le_bytes());
    let child = mc.comm.new_from_parts(id, rank, list, true).map_err(|e| MpiErr::from(e).on(c))?;
    *o = state::add_comm(child, mc.errhandler.load(Ordering::Relaxed));
    Ok(())
}

/// No process here was spawned (MPI_Comm_spawn is not offered): the parent is MPI_COMM_NULL.
pub unsafe fn comm_get_parent(parent: *mut MPI_Comm) -> Res {
    state::check_active()?;
    *out(parent, "parent")? = MPI_COMM_NULL;
    Ok(())
}
