//! MPI operations made of several engine steps, started as engine tasks (`Comm::start_task`):
//! the non-blocking collectives of an intercommunicator, MPI_Comm_idup, the non-blocking
//! buffer flushes. A task runs on its engine comm's worker in call order with the comm's other
//! non-blocking work, and its request completes with the task's own MPI error (class and text),
//! which the engine's request cannot carry.

use crate::abi_gen::*;
use crate::err::{MpiErr, Res};
use crate::request::Req;
use crate::state::CommRef;
use distcomm::comm::Comm;
use std::sync::{Arc, Mutex};

/// Where a failed task leaves its MPI error for the completion call.
pub type ErrSlot = Arc<Mutex<Option<MpiErr>>>;

/// The error of a task's request: the one the task left, else the engine's (a timeout, an
/// abort, a panic).
pub fn error_of(slot: &Option<ErrSlot>, e: &distcomm::Error) -> MpiErr {
    slot.as_ref().and_then(|s| s.lock().unwrap_or_else(|p| p.into_inner()).clone()).unwrap_or_else(|| crate::err::from_engine(e))
}

/// A request for `task`, queued on `on`'s worker (`mc` is the communicator its errors go to);
/// `after` runs once it succeeded, in the completion call.
pub fn start(mc: &CommRef, on: &Arc<Comm>, name: &str, task: impl FnOnce() -> Res + Send + 'static, after: Option<Box<dyn FnOnce() + Send>>) -> Result<Req, MpiErr> {
    let slot: ErrSlot = Arc::default();
    let left = slot.clone();
    let req = on
        .start_task(name, move || {
            task().map_err(|e| {
                let engine = distcomm::Error::new(distcomm::Status::Remote, e.msg.clone());
                *left.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                engine
            })
        })
        .map_err(|e| MpiErr::from(e).on(mc.handle))?;
    Ok(Req::Coll { comm: mc.clone(), req, after, err: Some(slot) })
}

/// Request `*r` of a non-blocking call: `f` (its blocking form, on the caller's arguments) run
/// as a task on `on`'s worker.
pub fn start_with_caller_args(r: &mut MPI_Request, mc: &CommRef, on: &Arc<Comm>, name: &str, f: impl FnOnce() -> Res + 'static) -> Res {
    let f = CallerArgs(f);
    *r = crate::request::add(start(mc, on, name, move || (f.take())(), None)?);
    Ok(())
}

/// A non-blocking call's arguments (the caller's buffers and arrays, as raw pointers) moved
/// into its task: the standard keeps them valid and untouched until the request completes,
/// so the task may use them on another thread.
pub struct CallerArgs<T>(pub T);

// SAFETY: see above; the pointers are used by one thread at a time (the task's).
unsafe impl<T> Send for CallerArgs<T> {}

impl<T> CallerArgs<T> {
    /// The arguments (a method, so that a closure moves the whole wrapper, not its field).
    pub fn take(self) -> T {
        self.0
    }

    /// A look at them, for a request started again and again (a persistent one).
    pub fn peek(&self) -> &T {
        &self.0
    }
}

impl<T: Copy> CallerArgs<T> {
    /// A copy of them, for a request started again and again (a persistent one).
    pub fn get(&self) -> T {
        self.0
    }
}
