//! MPI sessions (MPI 4): MPI_Session_init / finalize, the two process sets every MPI job has
//! ("mpi://WORLD" and "mpi://SELF"), groups from them, and the session's error handler.
//!
//! The job's processes are the world that MPI_Init forms (the launcher starts them together),
//! so a session is opened within an initialized library (the world model and the session model
//! mixed, as the standard allows); MPI_Session_init before MPI_Init answers
//! MPI_ERR_UNSUPPORTED_OPERATION, saying so.

use crate::abi_gen::*;
use crate::api::out;
use crate::err::{MpiErr, Res};
use crate::mpi_err;
use crate::slots::Slots;
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub const SESSION_BASE: usize = 0x0A00_0000;

pub struct Session {
    errhandler: AtomicUsize,
}

static SESSIONS: Slots<Session> = Slots::new(SESSION_BASE);

/// The process sets, in the order MPI_Session_get_nth_pset numbers them.
const PSETS: [&str; 2] = ["mpi://WORLD", "mpi://SELF"];

pub fn errhandler_of(h: usize) -> Option<MPI_Errhandler> {
    if !SESSIONS.owns(h) {
        return None;
    }
    SESSIONS.get(h).map(|s| s.errhandler.load(Ordering::Relaxed))
}

fn session(h: MPI_Session) -> Result<Arc<Session>, MpiErr> {
    match SESSIONS.get(h) {
        Some(s) => Ok(s),
        None if h == MPI_SESSION_NULL => mpi_err!(MPI_ERR_SESSION, "MPI_SESSION_NULL is not a session"),
        None => mpi_err!(MPI_ERR_SESSION, "{h:#x} is not a valid session (never made, or finalized)"),
    }
}

/// MPI_ERR_SESSION unless `h` is a live session.
pub fn check(h: MPI_Session) -> Res {
    session(h).map(|_| ())
}

/// Groups made from a session's process sets, and the session (see `comm_create_from_group`).
static GROUP_SESSION: std::sync::Mutex<Vec<(MPI_Group, MPI_Session)>> = std::sync::Mutex::new(Vec::new());

fn group_sessions() -> std::sync::MutexGuard<'static, Vec<(MPI_Group, MPI_Session)>> {
    GROUP_SESSION.lock().unwrap_or_else(|p| p.into_inner())
}

/// A freed group's handle may be reused for a group of no session.
pub fn forget_group(g: MPI_Group) {
    group_sessions().retain(|x| x.0 != g);
}

fn with_session<T>(h: MPI_Session, f: impl FnOnce(&Arc<Session>) -> Result<T, MpiErr>) -> Result<T, MpiErr> {
    let s = session(h)?;
    f(&s).map_err(|e| e.on(h))
}

pub unsafe fn session_init(info: MPI_Info, eh: MPI_Errhandler, out_s: *mut MPI_Session) -> Res {
    let o = out(out_s, "session")?;
    if !crate::state::initialized() || crate::state::finalized() {
        return mpi_err!(MPI_ERR_UNSUPPORTED_OPERATION, "MPI_Session_init outside MPI_Init .. MPI_Finalize is not supported by distcomm's MPI library (the job's processes are formed by MPI_Init)");
    }
    if info != MPI_INFO_NULL {
        let mut n = 0;
        crate::info::info_get_nkeys(info, &mut n)?;
    }
    if !crate::err::valid_errhandler(eh) {
        return mpi_err!(MPI_ERR_ERRHANDLER, "{eh:#x} is not a valid error handler");
    }
    let (h, _) = SESSIONS.add(|_| Session { errhandler: AtomicUsize::new(eh) });
    *o = h;
    Ok(())
}

pub unsafe fn session_finalize(s: *mut MPI_Session) -> Res {
    let p = out(s, "session")?;
    session(*p)?;
    let h = *p;
    let flushed = crate::bsend::session_finalized(h).map_err(|e| e.on(h));
    group_sessions().retain(|x| x.1 != h);
    SESSIONS.remove(h);
    *p = MPI_SESSION_NULL;
    flushed
}

pub unsafe fn session_get_num_psets(h: MPI_Session, _info: MPI_Info, n: *mut c_int) -> Res {
    with_session(h, |_| {
        *out(n, "npset_names")? = PSETS.len() as c_int;
        Ok(())
    })
}

/// With *pset_len 0 the length the name needs (with its NUL) comes back; otherwise the name,
/// cut to *pset_len - 1 characters.
pub unsafe fn session_get_nth_pset(h: MPI_Session, _info: MPI_Info, n: c_int, len: *mut c_int, name: *mut c_char) -> Res {
    with_session(h, |_| {
        let l = out(len, "pset_len")?;
        let Some(p) = usize::try_from(n).ok().and_then(|i| PSETS.get(i)) else {
            return mpi_err!(MPI_ERR_ARG, "n = {n} is not below the number of process sets ({})", PSETS.len());
        };
        if *l <= 0 {
            *l = p.len() as c_int + 1;
            return Ok(());
        }
        let max = *l as usize;
        crate::api::put_str(p, name, std::ptr::null_mut(), max)?;
        *l = p.len() as c_int + 1;
        Ok(())
    })
}

/// The world ranks of a process set, or MPI_ERR_ARG for a name that is none.
fn members(name: *const c_char) -> Result<(&'static str, Vec<u32>), MpiErr> {
    if name.is_null() {
        return mpi_err!(MPI_ERR_ARG, "pset_name is NULL");
    }
    // SAFETY: a NUL-terminated string from the caller.
    let s = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    let world = crate::state::get_comm(MPI_COMM_WORLD)?;
    if s.eq_ignore_ascii_case(PSETS[0]) {
        Ok((PSETS[0], world.comm.members().to_vec()))
    } else if s.eq_ignore_ascii_case(PSETS[1]) {
        Ok((PSETS[1], vec![world.rank() as u32]))
    } else {
        mpi_err!(MPI_ERR_ARG, "{s:?} is not a process set (there are \"mpi://WORLD\" and \"mpi://SELF\")")
    }
}

pub unsafe fn session_get_pset_info(h: MPI_Session, name: *const c_char, info: *mut MPI_Info) -> Res {
    with_session(h, |_| {
        let (_, m) = members(name)?;
        crate::info::with_pairs(&[("mpi_size", m.len().to_string())], info)
    })
}

pub unsafe fn session_get_info(h: MPI_Session, info: *mut MPI_Info) -> Res {
    with_session(h, |_| {
        let level = match crate::state::THREAD_LEVEL.load(Ordering::Relaxed) {
            MPI_THREAD_SINGLE => "MPI_THREAD_SINGLE",
            MPI_THREAD_FUNNELED => "MPI_THREAD_FUNNELED",
            MPI_THREAD_SERIALIZED => "MPI_THREAD_SERIALIZED",
            _ => "MPI_THREAD_MULTIPLE",
        };
        crate::info::with_pairs(&[("thread_level", level.to_string())], info)
    })
}

pub unsafe fn group_from_session_pset(h: MPI_Session, name: *const c_char, g: *mut MPI_Group) -> Res {
    with_session(h, |_| {
        let o = out(g, "newgroup")?;
        let (_, m) = members(name)?;
        *o = crate::group::add(m);
        if *o != MPI_GROUP_EMPTY {
            group_sessions().push((*o, h));
        }
        Ok(())
    })
}

pub unsafe fn session_create_errhandler(f: Option<MPI_Session_errhandler_function>, eh: *mut MPI_Errhandler) -> Res {
    crate::objerrh::create(f, eh)
}

pub unsafe fn session_set_errhandler(h: MPI_Session, eh: MPI_Errhandler) -> Res {
    with_session(h, |s| crate::objerrh::set(&s.errhandler, h, eh))
}

pub unsafe fn session_get_errhandler(h: MPI_Session, eh: *mut MPI_Errhandler) -> Res {
    with_session(h, |s| crate::objerrh::get(&s.errhandler, h, eh))
}

pub unsafe fn session_call_errhandler(h: MPI_Session, code: c_int) -> Res {
    with_session(h, |s| crate::objerrh::call(&s.errhandler, h, code))
}

/// MPI_Comm_create_from_group: collective over the group's processes only (the members derive
/// the new comm's context from the world's, the tag and the member list: see `ctxid`; no
/// message goes to the processes outside it).
pub unsafe fn comm_create_from_group(g: MPI_Group, tag: *const c_char, _info: MPI_Info, eh: MPI_Errhandler, newcomm: *mut MPI_Comm) -> Res {
    crate::state::check_active()?;
    let o = out(newcomm, "newcomm")?;
    let m = crate::group::get(g)?;
    if tag.is_null() {
        return mpi_err!(MPI_ERR_ARG, "stringtag is NULL");
    }
    // SAFETY: a NUL-terminated string from the caller.
    let tag = unsafe { CStr::from_ptr(tag) }.to_bytes();
    if tag.len() >= MPI_MAX_STRINGTAG_LEN as usize {
        return mpi_err!(MPI_ERR_ARG, "stringtag is {} bytes, longer than MPI_MAX_STRINGTAG_LEN - 1", tag.len());
    }
    if !crate::err::valid_errhandler(eh) {
        return mpi_err!(MPI_ERR_ARG, "{eh:#x} is not a valid error handler");
    }
    let world = crate::state::get_comm(MPI_COMM_WORLD)?;
    if !m.contains(&(world.rank() as u32)) {
        return mpi_err!(MPI_ERR_GROUP, "the calling process (world rank {}) is not in the group", world.rank());
    }
    // Group members are world ranks, which are the world comm's ranks.
    let rank = m.iter().position(|&r| r as usize == world.rank()).unwrap_or_default();
    let id = crate::ctxid::members_only(world.comm.context_id(), crate::ctxid::CREATE_FROM_GROUP, &m, tag);
    let c = world.comm.new_from_parts(id, rank, m.to_vec(), true).map_err(MpiErr::from)?;
    *o = crate::state::add_comm(c, eh);
    // Its buffered sends may use the session's buffer.
    if let Some(&(_, s)) = group_sessions().iter().find(|x| x.0 == g) {
        crate::bsend::comm_from_session(*o, s);
    }
    Ok(())
}
