//! The comm's worker thread for non-blocking collectives: started on first use, fed in call
//! order, joined when the comm is destroyed.
//!
//! A caller that waits for a non-blocking collective still queued runs the queued jobs itself,
//! in order, instead of waiting for the worker to be scheduled: on a busy machine (compute on
//! every core) the worker may not get a core for milliseconds, and even on an idle one handing
//! the job over costs a wake-up. Only one thread runs the comm's jobs at a time (`run`), so
//! they still run one after another in call order.

use super::{lock, Comm};
use crate::completion::Completion;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

pub(super) type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    /// Jobs came, or the queue closed.
    ready: Condvar,
    /// Held while a job runs (by the worker or a waiting caller).
    run: Mutex<()>,
}

impl Queue {
    fn pop(&self) -> Option<Job> {
        lock(&self.jobs).0.pop_front()
    }

    /// Runs one job (a panic that escapes it must not end the thread the next jobs wait for).
    fn run_one(job: Job) {
        if let Err(e) = crate::panics::catch("a collective worker's job", job) {
            crate::dc_log!(crate::log::Level::Warn, None, "{}", e.msg);
        }
    }

    fn worker(&self) {
        loop {
            {
                let mut g = lock(&self.jobs);
                while g.0.is_empty() && !g.1 {
                    g = self.ready.wait(g).unwrap_or_else(|p| p.into_inner());
                }
                if g.0.is_empty() {
                    return; // closed and drained
                }
            }
            let _running = lock(&self.run);
            // A waiting caller may have taken it meanwhile.
            if let Some(job) = self.pop() {
                Queue::run_one(job);
            }
        }
    }
}

pub(super) struct Executor {
    queue: Arc<Queue>,
    thread: JoinHandle<()>,
}

impl Executor {
    /// Lets the queued jobs finish and joins the worker.
    pub(super) fn finish(self) {
        lock(&self.queue.jobs).1 = true;
        self.queue.ready.notify_all();
        let _ = self.thread.join();
    }
}

impl Comm {
    pub(super) fn submit(&self, job: Job) -> Result<()> {
        let mut ex = lock(&self.executor);
        if ex.is_none() {
            let queue = Arc::new(Queue::default());
            let q = queue.clone();
            let thread = std::thread::Builder::new()
                .name(format!("dc-coll-r{}", self.rank))
                .spawn(move || q.worker())
                .map_err(|e| Error::system("spawn collective worker", e))?;
            *ex = Some(Executor { queue, thread });
        }
        let q = &ex.as_ref().expect("made above").queue;
        lock(&q.jobs).0.push_back(job);
        q.ready.notify_one();
        Ok(())
    }

    /// A caller waits for `comp`, a non-blocking collective of this comm: while it is still
    /// queued and no job is running, runs the queued jobs (in order) on this thread. Returns
    /// when `comp` is done or a job is running elsewhere (the caller then waits as usual).
    pub fn run_queued_until(&self, comp: &Completion) {
        let Some(queue) = lock(&self.executor).as_ref().map(|e| e.queue.clone()) else { return };
        while !comp.is_done() {
            let Ok(_running) = queue.run.try_lock() else { return };
            match queue.pop() {
                Some(job) => Queue::run_one(job),
                None => return,
            }
        }
    }
}
