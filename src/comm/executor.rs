//! The comm's worker thread for non-blocking collectives: started on first use, fed in call
//! order, joined when the comm is destroyed.

use super::{lock, Comm};
use crate::error::{Error, Result, Status};
use std::thread::JoinHandle;

pub(super) type Job = Box<dyn FnOnce() + Send>;

pub(super) struct Executor {
    pub(super) jobs: crossbeam::channel::Sender<Job>,
    pub(super) thread: JoinHandle<()>,
}

impl Comm {
    pub(super) fn submit(&self, job: Job) -> Result<()> {
        let mut ex = lock(&self.executor);
        if ex.is_none() {
            let (tx, rx) = crossbeam::channel::unbounded::<Job>();
            let thread = std::thread::Builder::new()
                .name(format!("dc-coll-r{}", self.rank))
                .spawn(move || {
                    for job in rx {
                        // A job completes its request itself (a panic in it is caught there);
                        // whatever escapes must not end the worker the next jobs wait for.
                        if let Err(e) = crate::panics::catch("a collective worker's job", job) {
                            crate::dc_log!(crate::log::Level::Warn, None, "{}", e.msg);
                        }
                    }
                })
                .map_err(|e| Error::system("spawn collective worker", e))?;
            *ex = Some(Executor { jobs: tx, thread });
        }
        ex.as_ref().unwrap().jobs.send(job).map_err(|_| Error::new(Status::Internal, "collective worker is gone"))
    }
}
