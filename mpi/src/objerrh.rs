//! Error handlers of windows, files and sessions: the same handler table as communicators'
//! (err.rs), one slot per object. An error on such an object carries the object's handle in
//! `MpiErr::comm`, and `state::errhandler_of` asks `handler_of` here for it.

use crate::abi_gen::*;
use crate::err::{self, MpiErr, Res};
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The handler of a window, file or session handle (None for any other handle).
pub fn handler_of(h: usize) -> Option<MPI_Errhandler> {
    crate::win::errhandler_of(h).or_else(|| crate::file::errhandler_of(h)).or_else(|| crate::session::errhandler_of(h))
}

/// A user handler of any kind: the C shapes are alike (a pointer to a handle, a pointer to the
/// code, varargs), so one table holds them all.
pub fn create<F>(f: Option<F>, eh: *mut MPI_Errhandler) -> Res {
    let Some(f) = f else { return crate::mpi_err!(MPI_ERR_ARG, "the errhandler function is NULL") };
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<MPI_Comm_errhandler_function>());
    // SAFETY: F is one of the ABI's errhandler function pointer types, all of this shape.
    let g: MPI_Comm_errhandler_function = unsafe { std::mem::transmute_copy(&f) };
    *crate::api::out(eh, "errhandler")? = err::new_user_handler(g);
    Ok(())
}

pub fn set(slot: &AtomicUsize, obj: usize, eh: MPI_Errhandler) -> Res {
    if !err::valid_errhandler(eh) {
        return Err(MpiErr::new(MPI_ERR_ARG, format!("{eh:#x} is not a valid error handler")).on(obj));
    }
    slot.store(eh, Ordering::Relaxed);
    Ok(())
}

pub fn get(slot: &AtomicUsize, obj: usize, eh: *mut MPI_Errhandler) -> Res {
    *crate::api::out(eh, "errhandler").map_err(|e| e.on(obj))? = slot.load(Ordering::Relaxed);
    Ok(())
}

/// MPI_*_call_errhandler: the handler is called and the call succeeds once it returns
/// (MPI_ERRORS_RETURN returns at once); the fatal handlers end the job.
pub fn call(slot: &AtomicUsize, obj: usize, code: c_int) -> Res {
    let class = err::class_of(code).unwrap_or(MPI_ERR_UNKNOWN);
    if class == MPI_SUCCESS {
        return Ok(());
    }
    match slot.load(Ordering::Relaxed) {
        h if h >= err::ERRH_BASE => {
            err::call_user_handler(h, obj, code);
            Ok(())
        }
        MPI_ERRORS_RETURN => Ok(()),
        _ => Err(MpiErr::new(class, err::code_string(code).unwrap_or_default()).on(obj)),
    }
}
