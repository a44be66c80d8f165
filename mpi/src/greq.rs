//! Generalized requests (MPI_Grequest_start, MPI_Grequest_complete): an operation the program
//! carries out itself, completed by MPI's completion calls like any other. A wait ends once the
//! program calls MPI_Grequest_complete (from any thread); the status comes from its query
//! function, and its free function runs when the request is freed (completed by a wait or
//! test, or MPI_Request_free'd and then completed). MPI_Cancel calls its cancel function.

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use crate::request::{self, Req};
use distcomm::completion::LazyDeadline;
use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct Flags {
    /// MPI_Grequest_complete was called.
    completed: bool,
    /// MPI_Request_free was called before it: MPI_Grequest_complete ends the request.
    freed: bool,
}

/// The program's functions and their argument.
#[derive(Clone, Copy)]
struct Callbacks {
    query: Option<MPI_Grequest_query_function>,
    free: Option<MPI_Grequest_free_function>,
    cancel: Option<MPI_Grequest_cancel_function>,
    extra: usize,
}

impl Callbacks {
    fn call(&self, which: &str, code: c_int) -> Res {
        if code == MPI_SUCCESS {
            Ok(())
        } else {
            Err(MpiErr::new(code, format!("the generalized request's {which} function returned error {code}")))
        }
    }
    fn query(&self) -> Result<MPI_Status, MpiErr> {
        let mut st = request::empty_status();
        if let Some(f) = self.query {
            // SAFETY: the program's query function, with its own argument and a status to fill.
            self.call("query", unsafe { f(self.extra as *mut c_void, &mut st) })?;
        }
        Ok(st)
    }
    fn free(&self) -> Res {
        // SAFETY: the program's free function, called once, with its own argument.
        self.free.map_or(Ok(()), |f| self.call("free", unsafe { f(self.extra as *mut c_void) }))
    }
}

/// A generalized request: what its handle's slot holds, and what MPI_Grequest_complete reaches
/// (by handle) while a waiting thread holds the request.
pub struct Greq(Arc<Shared>);

struct Shared {
    flags: Mutex<Flags>,
    completed: Condvar,
    calls: Callbacks,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The generalized requests not yet done with, by handle.
static OPEN: Mutex<BTreeMap<MPI_Request, Arc<Shared>>> = Mutex::new(BTreeMap::new());

fn forget(shared: &Arc<Shared>) {
    lock(&OPEN).retain(|_, s| !Arc::ptr_eq(s, shared));
}

impl Greq {
    pub fn is_done(&self) -> bool {
        lock(&self.0.flags).completed
    }

    /// Waits (up to `deadline`) for MPI_Grequest_complete; the query function's status, and the
    /// free function called (the request is done with).
    pub fn finish_by(self, deadline: &LazyDeadline) -> Result<MPI_Status, MpiErr> {
        let mut f = lock(&self.0.flags);
        while !f.completed {
            let left = deadline.get().saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(MpiErr::new(MPI_ERR_OTHER, "a generalized request was not completed (MPI_Grequest_complete) within the timeout (DC_TIMEOUT_MS)"));
            }
            f = self.0.completed.wait_timeout(f, left).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
        drop(f);
        forget(&self.0);
        let st = self.0.calls.query();
        let freed = self.0.calls.free();
        let st = st?;
        freed?;
        // The query function's error field is the request's error.
        if st.MPI_ERROR != MPI_SUCCESS {
            return Err(MpiErr::new(st.MPI_ERROR, "the generalized request's query function reported an error in its status"));
        }
        Ok(st)
    }

    /// MPI_Request_get_status: the status once completed, the request kept.
    pub fn peek(&self) -> Option<Result<MPI_Status, MpiErr>> {
        self.is_done().then(|| self.0.calls.query())
    }

    /// MPI_Cancel: the cancel function, told whether the operation has completed.
    pub fn cancel(&self) -> Res {
        let (c, done) = (&self.0.calls, self.is_done() as c_int);
        // SAFETY: the program's cancel function, with its own argument.
        c.cancel.map_or(Ok(()), |f| c.call("cancel", unsafe { f(c.extra as *mut c_void, done) }))
    }

    /// MPI_Request_free of handle `h` (taken out of its slot): done with at once if completed;
    /// else its slot stays taken (the program completes it by this handle) and
    /// MPI_Grequest_complete ends it.
    pub fn release(self, h: MPI_Request) -> Res {
        {
            let mut f = lock(&self.0.flags);
            if !f.completed {
                f.freed = true;
                drop(f);
                request::put_back(h, Req::Generalized(self));
                return Ok(());
            }
        }
        request::release(h);
        forget(&self.0);
        self.0.calls.free()
    }
}

pub unsafe fn grequest_start(
    query: Option<MPI_Grequest_query_function>,
    free: Option<MPI_Grequest_free_function>,
    cancel: Option<MPI_Grequest_cancel_function>,
    extra: *mut c_void,
    req: *mut MPI_Request,
) -> Res {
    crate::state::check_active()?;
    let r = crate::api::out(req, "request")?;
    let calls = Callbacks { query, free, cancel, extra: extra as usize };
    let shared = Arc::new(Shared { flags: Mutex::default(), completed: Condvar::new(), calls });
    let mut open = lock(&OPEN);
    let h = request::add(Req::Generalized(Greq(shared.clone())));
    open.insert(h, shared);
    *r = h;
    Ok(())
}

pub unsafe fn grequest_complete(h: MPI_Request) -> Res {
    crate::state::check_active()?;
    let shared = lock(&OPEN).get(&h).cloned();
    let Some(shared) = shared else {
        return crate::mpi_err!(MPI_ERR_REQUEST, "{h:#x} is not an open generalized request");
    };
    let freed = {
        let mut f = lock(&shared.flags);
        if f.completed {
            return crate::mpi_err!(MPI_ERR_REQUEST, "the generalized request {h:#x} was completed already");
        }
        f.completed = true;
        shared.completed.notify_all();
        f.freed
    };
    if freed {
        // MPI_Request_free'd before: nobody waits for it; it ends here.
        forget(&shared);
        if let Ok(Req::Generalized(_)) = request::take(h) {
            request::release(h);
        }
        return shared.calls.free();
    }
    Ok(())
}
