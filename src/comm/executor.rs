//! The comm's worker thread for non-blocking collectives: started on first use, fed in call
//! order, joined when the comm is destroyed.
//!
//! A caller that waits for a non-blocking collective still queued runs the queued jobs itself,
//! in order, instead of waiting for the worker to be scheduled: on a busy machine (compute on
//! every core) the worker may not get a core for milliseconds, and even on an idle one handing
//! the job over costs a wake-up. Only one thread runs the comm's jobs at a time (`run`), so
//! they still run one after another in call order.
//!
//! So that "start, then wait at once" (torch's blocking calls, MPI's `Ixxx` + `Wait`) costs no
//! wake-up at all, the worker is not woken for each job while the comm is in use: it looks at
//! the queue every `LOOK_EVERY` and takes a job that nobody has come for within `TAKE_AFTER`
//! (a caller computing meanwhile: the job progresses, as an overlapped allreduce must). A
//! caller that tests a queued job (`kick_queued`) wakes it at once: a test loop is not kept waiting.
//! After `PARK_AFTER` without jobs the worker sleeps until the next one wakes it, so an idle
//! comm costs no CPU.

use super::{lock, Comm};
use crate::completion::Completion;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub(super) type Job = Box<dyn FnOnce() + Send>;

/// How long a queued job waits for its caller before the worker takes it.
const TAKE_AFTER: Duration = Duration::from_micros(200);
/// How often a worker that is not parked looks at the queue.
const LOOK_EVERY: Duration = Duration::from_millis(1);
/// Time without jobs after which the worker parks (is woken by the next job).
const PARK_AFTER: Duration = Duration::from_millis(50);

#[derive(Default)]
struct Jobs {
    queue: VecDeque<(Instant, Job)>,
    closed: bool,
    /// The worker sleeps until woken (set by the worker, read by `submit`).
    parked: bool,
    /// Someone tested a queued job: the worker takes the queued jobs now, whatever their age.
    kicked: bool,
}

#[derive(Default)]
struct Queue {
    jobs: Mutex<Jobs>,
    /// Jobs came to a parked worker, a job was kicked, or the queue closed.
    ready: Condvar,
    /// Held while a job runs (by the worker or a waiting caller).
    run: Mutex<()>,
}

impl Queue {
    fn pop(&self) -> Option<Job> {
        lock(&self.jobs).queue.pop_front().map(|(_, job)| job)
    }

    /// Runs one job (a panic that escapes it must not end the thread the next jobs wait for).
    fn run_one(job: Job) {
        if let Err(e) = crate::panics::catch("a collective worker's job", job) {
            crate::dc_log!(crate::log::Level::Warn, None, "{}", e.msg);
        }
    }

    fn sleep<'a>(&self, g: MutexGuard<'a, Jobs>, d: Duration) -> MutexGuard<'a, Jobs> {
        self.ready.wait_timeout(g, d).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0)
    }

    /// Waits until a job is due for the worker; false when the queue closed and is drained.
    fn next_due(&self) -> bool {
        let mut g = lock(&self.jobs);
        let mut last_job = Instant::now();
        loop {
            g.parked = false;
            match g.queue.front() {
                Some((queued, _)) => {
                    last_job = Instant::now();
                    let age = queued.elapsed();
                    if g.kicked || g.closed || age >= TAKE_AFTER {
                        return true;
                    }
                    g = self.sleep(g, TAKE_AFTER - age);
                }
                None if g.closed => return false,
                None => {
                    g.kicked = false;
                    if last_job.elapsed() < PARK_AFTER {
                        g = self.sleep(g, LOOK_EVERY);
                    } else {
                        g.parked = true;
                        g = self.ready.wait(g).unwrap_or_else(|p| p.into_inner());
                    }
                }
            }
        }
    }

    fn worker(&self) {
        while self.next_due() {
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
        lock(&self.queue.jobs).closed = true;
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
        let mut jobs = lock(&q.jobs);
        jobs.queue.push_back((Instant::now(), job));
        if jobs.parked {
            jobs.parked = false;
            q.ready.notify_one();
        }
        Ok(())
    }

    /// The worker's queue, once a job has started the worker.
    fn job_queue(&self) -> Option<Arc<Queue>> {
        lock(&self.executor).as_ref().map(|e| e.queue.clone())
    }

    /// Someone tests a queued job: the worker takes the queued jobs now (a test must not run a
    /// collective itself: it would block).
    pub fn kick_queued(&self) {
        let Some(queue) = self.job_queue() else { return };
        let mut jobs = lock(&queue.jobs);
        if !jobs.kicked && !jobs.queue.is_empty() {
            jobs.kicked = true;
            queue.ready.notify_one();
        }
    }

    /// A caller waits for `comp`, a non-blocking collective of this comm: while it is still
    /// queued and no job is running, runs the queued jobs (in order) on this thread. Returns
    /// when `comp` is done or a job is running elsewhere (the caller then waits as usual).
    pub fn run_queued_until(&self, comp: &Completion) {
        let Some(queue) = self.job_queue() else { return };
        while !comp.is_done() {
            let Ok(_running) = queue.run.try_lock() else { return };
            match queue.pop() {
                Some(job) => Queue::run_one(job),
                None => return,
            }
        }
    }

    /// Finishes the comm's queued work before the caller's own: waits for the job the worker
    /// runs, if any, and runs the queued ones here, in order. A caller's blocking operation
    /// made of the comm's messages (see `start_task`) calls this first, so it comes after the
    /// non-blocking ones started before it, as it does on every other member.
    pub fn finish_queued(&self) {
        let Some(queue) = self.job_queue() else { return };
        let _running = lock(&queue.run);
        while let Some(job) = queue.pop() {
            Queue::run_one(job);
        }
    }
}
