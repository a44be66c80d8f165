//! Collective dispatch: every call is offered to the comm's engines in one order (the device
//! engine for CUDA buffers, the shared-memory arena, then the link over point-to-point), and the
//! first that takes it runs it.

use super::executor::Job;
use super::link::CollLink;
use super::shm::ShmState;
use super::{Comm, CHECK_TAG_BIT};
use crate::collective::CollArgs;
use crate::completion::{Completion, Done};
use crate::coll::shm::ShmRun;
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use crate::request::Request;
use crate::transport::ops::COLL_TAG_BIT;
use crate::transport::socket::{ABORT_MISMATCH, ABORT_PANIC};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The engines a collective can run on, in the order they are offered the call: the first
/// that can take it runs it.
pub(super) enum Engine<'c> {
    /// CUDA device buffers, through the comm's NCCL communicator.
    #[cfg(feature = "nccl")]
    Device(&'c crate::nccl::DeviceComm),
    /// The comm's shared-memory arena (every member on one host). A call it has no algorithm
    /// for goes on to the link within the arena's turn, keeping the call order.
    Shm(&'c ShmState),
    /// Point-to-point messages over the world's transport: any comm, any call.
    Link,
}

impl Comm {
    /// The engine that runs `args`: device, shared memory, link, the first that can.
    #[cfg(feature = "nccl")]
    pub(super) fn engine_for(&self, args: &CollArgs) -> Result<Engine<'_>> {
        if let Some(dev) = self.device.get() {
            if self.on_device(args)? {
                return Ok(Engine::Device(dev));
            }
        }
        Ok(self.host_engine())
    }

    /// Launches `args` on the device engine if that is the one that runs it (None: a host
    /// engine does, in `execute`, in call order).
    #[cfg(feature = "nccl")]
    fn launch_on_device(&self, args: &CollArgs) -> Result<Option<(&crate::nccl::DeviceComm, crate::nccl::DevOp)>> {
        self.flush_device();
        match self.engine_for(args)? {
            Engine::Device(dev) => Ok(Some((dev, self.start_device(dev, args)?))),
            Engine::Shm(_) | Engine::Link => Ok(None),
        }
    }

    /// The engine for host buffers: the arena where the comm has one, else the link.
    fn host_engine(&self) -> Engine<'_> {
        match self.shm.get() {
            Some(shm) => Engine::Shm(shm),
            None => Engine::Link,
        }
    }

    fn next_collective(&self) -> (u64, Instant) {
        (self.coll_seq.fetch_add(1, Ordering::Relaxed), self.deadline())
    }

    /// `deadline` is asked for only when something waits long enough to need it (reading the
    /// clock is a tenth of a small allreduce here).
    pub(super) fn execute(&self, args: &CollArgs, seq: u64, deadline: &dyn Fn() -> Instant) -> Result<()> {
        self.check_usable()?;
        dc_log!(Level::Trace, Some(self.rank), "{} #{seq} starts", args.name());
        let fail = |e: Error| {
            let e = e.context(format!("collective #{seq}"));
            dc_log!(Level::Warn, Some(self.rank), "{} failed: {}", args.name(), e.msg);
            Err(e)
        };
        // A collective needs every member: with one lost, fail at once.
        if let Some(e) = self.lost_member() {
            return fail(e);
        }
        let run = || {
            crate::panics::inject("collective");
            match self.host_engine() {
                Engine::Shm(shm) => self.execute_shm(shm, args, seq, deadline),
                _ => self.detail_check(args, seq, deadline).and_then(|_| self.execute_link(args, seq, deadline())),
            }
        };
        // A panic would leave the others waiting for us (and the arena's turn taken): abort the
        // comm, which tells them, and say what happened.
        let r = crate::panics::catch_named(|| format!("{} (collective #{seq})", args.name()), run).unwrap_or_else(|e| {
            self.abort_because(&format!("rank {}: {}", self.rank, e.msg), ABORT_PANIC);
            Err(e)
        });
        r.or_else(fail)
    }

    /// DC_DEBUG=DETAIL: every member compares every argument (the v-forms' counts too) before
    /// anything moves, on shared memory as on sockets.
    /// (`deadline` is asked for only when the check runs: reading the clock costs a small
    /// collective a tenth of its time.)
    fn detail_check(&self, args: &CollArgs, seq: u64, deadline: &dyn Fn() -> Instant) -> Result<()> {
        if !crate::debug_check::enabled() {
            return Ok(());
        }
        let check = CollLink { comm: self, tag: COLL_TAG_BIT | CHECK_TAG_BIT | seq, sig: crate::debug_check::CHECK_SIG, seq, deadline: deadline() };
        crate::debug_check::verify(&check, args)
    }

    fn execute_link(&self, args: &CollArgs, seq: u64, deadline: Instant) -> Result<()> {
        let link = CollLink { comm: self, tag: COLL_TAG_BIT | seq, sig: args.signature(), seq, deadline };
        // SAFETY: buffers were validated by the C surface and stay valid until we return.
        let r = crate::transport::waits_at_once(|| unsafe { args.run(&link) });
        if let Err(e) = &r {
            if e.status == Status::Mismatch {
                // Only some ranks see a mismatch in the data (e.g. the receiver of a short
                // message); the others would wait for messages that never come until the
                // timeout. Aborting the comm tells them at once. (Shared memory compares every
                // call's arguments on all ranks first, so it needs no abort.)
                self.abort_because(&format!("rank {} found mismatched collective arguments in collective #{seq}", self.rank), ABORT_MISMATCH);
            }
        }
        r
    }

    /// Shared-memory collectives run strictly in call order: wait for our turn, run, pass it on.
    fn execute_shm(&self, shm: &ShmState, args: &CollArgs, seq: u64, deadline: &dyn Fn() -> Instant) -> Result<()> {
        shm.wait_turn(seq, deadline, &|| self.check_usable())?;
        // A lost member (its process died, its connection broke) stops every wait; one that said
        // goodbye stops only a wait for itself: with small collectives running ahead, a member
        // may have finished its last call and left while another's data still comes.
        let interrupt = |r: usize| {
            self.ctx.abort_error().or_else(|| self.lost_member()).or_else(|| self.member_gone(shm, r))
        };
        // The collective's number on the arena: the same on every member (0 is never used).
        let coll = (seq + 1) as u32;
        let r = if let Err(e) = self.detail_check(args, seq, deadline) {
            Err(e)
        } else {
            // SAFETY: we hold the turn until `pass_turn` below; `run` ends with this block.
            let scratch = unsafe { shm.scratch() };
            let mut run = ShmRun::new(&shm.arena, &shm.steps, coll, deadline, &interrupt, scratch, shm.pids.as_deref());
            // SAFETY: buffers were validated by the C surface and stay valid until we return.
            let done = unsafe { run.run_eager(args) }.or_else(|| unsafe { run.run(args) });
            done.unwrap_or_else(|| self.execute_link(args, seq, deadline()))
        };
        shm.arena.finished(coll);
        shm.pass_turn(seq + 1);
        r
    }

    /// Runs a collective on the calling thread.
    pub fn collective(&self, args: CollArgs) -> Result<()> {
        self.check_usable()?;
        args.check_disjoint()?;
        #[cfg(feature = "nccl")]
        if let Some((dev, op)) = self.launch_on_device(&args)? {
            return dev.wait(&op, self.deadline(), self.timeout_ms(), &|| self.ctx.abort_error()).map_err(|e| e.context("on CUDA device memory (NCCL)"));
        }
        self.ensure_arena()?;
        let seq = self.coll_seq.fetch_add(1, Ordering::Relaxed);
        let deadline = crate::completion::LazyDeadline::new(self.timeout_ms());
        self.execute(&args, seq, &|| deadline.get())
    }

    /// Queues a collective on the comm's worker thread; it progresses while the caller computes.
    pub fn start_collective(self: &Arc<Self>, args: CollArgs) -> Result<Request> {
        self.check_usable()?;
        args.check_disjoint()?;
        #[cfg(feature = "nccl")]
        if let Some((_, op)) = self.launch_on_device(&args)? {
            return Ok(Request::device(self.clone(), op, self.deadline()));
        }
        self.ensure_arena_queued()?;
        let (seq, deadline) = self.next_collective();
        let me = self.clone();
        let comp = self.queue_job(move || {
            // `execute` catches panics in the collective; this one catches the job's own.
            crate::panics::catch_named(|| format!("the worker of non-blocking {} (collective #{seq})", args.name()), || {
                crate::panics::inject("worker");
                me.execute(&args, seq, &|| deadline)
            })
            .unwrap_or_else(|e| {
                me.abort_because(&format!("rank {}: {}", me.rank, e.msg), ABORT_PANIC);
                Err(e)
            })
        })?;
        Ok(Request::collective(self.clone(), comp, deadline))
    }

    /// Queues `run` on the comm's worker; the completion its result goes to.
    pub(super) fn queue_job(&self, run: impl FnOnce() -> Result<()> + Send + 'static) -> Result<Arc<Completion>> {
        let comp = Arc::new(Completion::new());
        let done = comp.clone();
        let job: Job = Box::new(move || {
            done.complete(run().map(|_| Done::default()));
        });
        self.submit(job)?;
        Ok(comp)
    }

    /// Queues `task` on the comm's worker, behind the non-blocking collectives and tasks
    /// queued before it; its request completes with the task's result. For a caller's own
    /// multi-step operation (one made of point-to-point messages and collectives) that must
    /// run in call order with the comm's other non-blocking work; `name` names it in errors.
    pub fn start_task(self: &Arc<Self>, name: &str, task: impl FnOnce() -> Result<()> + Send + 'static) -> Result<Request> {
        self.check_usable()?;
        let deadline = crate::completion::deadline_after(self.timeout_ms());
        let name = name.to_string();
        let comp = self.queue_job(move || crate::panics::catch_named(|| format!("the non-blocking {name}"), task).and_then(|r| r))?;
        Ok(Request::collective(self.clone(), comp, deadline))
    }
}
