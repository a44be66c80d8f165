//! A one-shot completion flag with a result, and the library's single waiting policy:
//! spin briefly, then yield, then sleep on a condvar (futex) — always with a deadline and a
//! check for abort or peer loss, so no wait can hang and no waiting rank eats a core.

use crate::error::{Error, Result, Status};
use crate::placement::{Seats, Seen};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a finished transfer reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Done {
    /// Bytes moved.
    pub bytes: usize,
    /// World rank of the sender (receives only).
    pub source: u32,
    /// Tag of the message (receives only).
    pub tag: u64,
}

/// Set once by whoever finishes the operation; waited on by anyone.
///
/// Lock-free on the paths every message takes: the finisher claims the slot (one compare and
/// swap), writes the result and publishes it; readers look only after it is published. The
/// mutex exists only for waiters that sleep on the condvar.
pub struct Completion {
    /// PENDING, WRITING (a finisher won and writes `result`), or DONE (`result` is set for good).
    state: AtomicU8,
    result: UnsafeCell<Option<Result<Done>>>,
    sleep_lock: Mutex<()>,
    cv: Condvar,
    /// Waiters asleep on `cv` (notifying is a system call: skipped when nobody sleeps).
    cv_sleepers: AtomicI32,
    /// The eventfd of a waiter sleeping in `poll` (-1: none).
    waker: AtomicI32,
}

const PENDING: u8 = 0;
const WRITING: u8 = 1;
const DONE: u8 = 2;

// SAFETY: `result` is written only by the one finisher that moved `state` from PENDING to
// WRITING, and read only after `state` is DONE (release/acquire), after which nobody writes it.
unsafe impl Sync for Completion {}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion").field("result", &self.result()).finish()
    }
}

impl Default for Completion {
    fn default() -> Completion {
        Completion {
            state: AtomicU8::new(PENDING),
            result: UnsafeCell::new(None),
            sleep_lock: Mutex::new(()),
            cv: Condvar::new(),
            cv_sleepers: AtomicI32::new(0),
            waker: AtomicI32::new(-1),
        }
    }
}

/// The longest single sleep: the waiter re-checks abort and deadline at least this often even
/// if nobody wakes it.
const MAX_SLEEP: Duration = Duration::from_millis(50);

/// How a waiter on shared memory looks for progress, and what it tells the ranks of its host
/// while it waits (see `Completion::wait_with`).
pub trait Poll {
    /// Looks for the op's data; whether anything moved.
    fn poll(&self) -> bool;

    /// Whether the rank this wait depends on holds a core right now (it is not yielding or
    /// asleep in a wait of its own): its answer may come within a few polls, so a waiter that
    /// would yield keeps its core a little longer (adaptive spinning, as a mutex spins while
    /// its owner runs). Ranks sharing a core otherwise hand it back and forth with nothing to
    /// do, a switch (about a microsecond here) each time.
    fn awaited_on_core(&self) -> bool {
        false
    }

    /// Around each yield: this thread gives its core away (`true`), and has it back (`false`).
    fn yielding(&self, _away: bool) {}

    /// Where this wait publishes our CPU and reads the awaited rank's (see `placement`).
    fn seats(&self) -> Option<Seats<'_>> {
        None
    }
}

/// A wait that needs only its seats: it looks for its data itself (as the arena's waits on
/// their flags do).
impl Poll for Seats<'_> {
    fn poll(&self) -> bool {
        false
    }

    fn seats(&self) -> Option<Seats<'_>> {
        Some(*self)
    }
}

/// Polls a waiter makes, at most, between two yields while the rank it waits for holds a core
/// (a few hundred nanoseconds: a switch costs more).
const HOLD_POLLS: u32 = 8;

/// What a waiter should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    Spin,
    /// Yielded; nothing else to do yet (abort and deadline are looked at every few yields:
    /// a yield that switches to another process costs microseconds already, and ranks that
    /// outnumber the cores yield at every wait).
    Yield,
    /// Yielded; now look at abort and the deadline.
    YieldAndCheck,
    Sleep,
}

/// Every this many yields, a waiter looks at abort and the deadline (not at the first: most
/// waits of ranks sharing a core end after one or two yields, and would read the clock twice).
const CHECK_EVERY_YIELDS: u32 = 8;

/// The waiting policy: spin for a short time (a peer on another core is seen within a
/// microsecond; for shared memory the spin outlasts a peer's wake-up from sleep, 15-50 us here,
/// so two ranks never settle into taking turns sleeping), then yield a few times (lets a peer sharing our core run), then sleep (a
/// wake-up costs 15-30 us here, but a rank blocked for long must not eat a core). When the
/// host's ranks outnumber its cores, spinning only steals time from the peer we wait for, so
/// the spin is cut to a minimum.
#[derive(Debug)]
pub struct Backoff {
    spin: Duration,
    yields: u32,
    started: Option<Instant>,
    last_yield: Option<Instant>,
    polls: u32,
    yielded: u32,
    /// Polls held back from yielding since the last yield (see `Poll::awaited_on_core`).
    held: u32,
    /// Whether the spin yields every `spin_slice` (see `yield_while_spinning`).
    slice_yields: bool,
    /// What the last look at the wait's seats found (see `placement`).
    seen: Seen,
    /// The spin as configured; `spin` may be stretched (see `LONG_SPIN`).
    base_spin: Duration,
    /// When the clock was last read in this wait (a long gap means we were not running).
    last_read: Option<Instant>,
}

/// How long a waiter whose awaited rank runs on another core keeps spinning while nothing else
/// wants its own core: about a time slice, so that a peer preempted by other work (a whole
/// slice on a busy machine) is met on its return without a wake-up. Sleeping sooner there is
/// no saving (the core has nothing else to run) and invites the scheduler's balancer to move
/// work onto the idle core and the ranks together again.
const LONG_SPIN: Duration = Duration::from_millis(4);

fn long_spin() -> Duration {
    static LONG: once_cell::sync::Lazy<Duration> =
        once_cell::sync::Lazy::new(|| crate::params::get().long_spin_us.map_or(LONG_SPIN, Duration::from_micros));
    *LONG
}

/// Two clock reads of a spinning wait this far apart (they are microseconds apart while it
/// runs): the thread was preempted, so another task wants its core (`placement::preempted`).
const PREEMPTED_GAP: Duration = Duration::from_micros(500);

/// While spinning, yield this often: if the awaited peer shares our core (the scheduler often
/// starts a launcher's children on one core), it gets to run within this time; if it does not,
/// the yield returns at once and costs a syscall.
fn spin_slice() -> Duration {
    static SLICE: once_cell::sync::Lazy<Duration> = once_cell::sync::Lazy::new(|| Duration::from_micros(crate::params::get().spin_slice_us.unwrap_or(5)));
    *SLICE
}

/// Whether a wait on shared memory yields now and then while it spins (every [`spin_slice`]),
/// for a peer that may share its core. Not when the launcher bound this rank to a part of the
/// host's cores (dcrun, mpirun's default, Slurm's `--cpu-bind`): ranks then hold cores of their
/// own, the awaited peer is never on ours, and a yield only hands the core to whatever else runs
/// there (a busy process keeps it for a whole time slice, milliseconds: measured with one busy
/// process beside 2 bound ranks, a 256-byte ping-pong took 114 us with these yields and 3.4 us
/// without). Unbound ranks (a plain env:// launcher) keep them: there the peer may be on our core,
/// and without them the same ping-pong took 3x longer. `DC_SPIN_SLICE_US` given: always. Only
/// where the wait cannot tell where the awaited rank runs: where it can, it steps aside or
/// yields only when that rank is on its CPU (see `placement`).
fn yield_while_spinning() -> bool {
    static Y: once_cell::sync::Lazy<bool> =
        once_cell::sync::Lazy::new(|| crate::params::get().spin_slice_us.is_some() || !affinity_cpus().is_some_and(|n| n < host_cores()));
    *Y
}

/// How many CPUs this thread may run on (its affinity mask), if the kernel says.
fn affinity_cpus() -> Option<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size passed is the set's.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    // SAFETY: `set` was filled by the kernel.
    (r == 0).then(|| unsafe { libc::CPU_COUNT(&set) } as usize).filter(|&n| n > 0)
}

/// The cores this host gives the job: what the launcher saw (`DC_LOCAL_CORES`, which `dcrun`
/// sets before it binds each rank to its share), else the cores online as far as our cgroup's
/// cpuset allows. Not our own affinity mask: a launcher that binds each rank to a core of its
/// own would make every rank look like it shares one core with all the others.
pub fn host_cores() -> usize {
    if let Some(n) = crate::params::get().local_cores {
        return n;
    }
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    cgroup_cpuset_size().map_or(online, |n| n.min(online))
}

/// The number of CPUs in our cgroup (v2) cpuset, if it says.
fn cgroup_cpuset_size() -> Option<usize> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let list = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cpuset.cpus.effective")).ok()?;
    cpu_list_len(&list)
}

/// How many CPUs a list like "0-3,8,10-11" names.
fn cpu_list_len(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.trim().parse::<usize>().ok()?.checked_sub(a.trim().parse::<usize>().ok()?)? + 1,
            None => part.trim().parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (n > 0).then_some(n)
}

/// Whether this host runs more ranks than it has cores (`LOCAL_WORLD_SIZE` from the launcher).
pub fn oversubscribed() -> bool {
    static OVER: once_cell::sync::Lazy<bool> = once_cell::sync::Lazy::new(|| {
        let cores = host_cores();
        let local = crate::params::get().local_world_size.unwrap_or(1);
        local > cores
    });
    *OVER
}


impl Backoff {
    /// For waits on memory another process writes directly (shared-memory flags).
    pub fn for_shared_memory() -> Backoff {
        static SPIN: once_cell::sync::Lazy<Duration> =
            once_cell::sync::Lazy::new(|| Duration::from_micros(crate::params::get().spin_us.unwrap_or(if oversubscribed() { 0 } else { 200 })));
        Backoff { slice_yields: yield_while_spinning(), ..Backoff::new(*SPIN, if oversubscribed() { 200 } else { 32 }) }
    }

    /// For waits that another thread of this process (the progress thread) must end: spinning
    /// long would take the core it needs.
    pub fn for_progress_thread() -> Backoff {
        static SPIN: once_cell::sync::Lazy<Duration> =
            once_cell::sync::Lazy::new(|| Duration::from_micros(crate::params::get().spin_us.unwrap_or(if oversubscribed() { 0 } else { 5 })));
        Backoff::new(*SPIN, 16)
    }

    pub fn new(spin: Duration, yields: u32) -> Backoff {
        Backoff { spin, yields, started: None, last_yield: None, polls: 0, yielded: 0, held: 0, slice_yields: true, seen: Seen::Unknown, base_spin: spin, last_read: None }
    }

    /// Progress was made: spin again from the start (without reading the clock now).
    pub fn restart(&mut self) {
        self.started = None;
        self.spin = self.base_spin;
        self.last_read = None;
        self.yielded = 0;
        self.held = 0;
    }

    /// Call after each unsuccessful check; says how to wait before the next one.
    pub fn next(&mut self) -> Pace {
        self.next_for(None)
    }

    /// `next` for a waiter that polls shared memory: it holds on to its core while the rank it
    /// waits for has one, and says when it yields (see `Poll`).
    pub fn next_for(&mut self, waiter: Option<&dyn Poll>) -> Pace {
        self.polls = self.polls.wrapping_add(1);
        // No spinning at all when it is cut to nothing (ranks outnumber cores): the peer we
        // wait for may need our core, so yield at once.
        if self.yielded == 0 && !self.spin.is_zero() {
            // Read the clock only every 64 polls, and not at all in a wait that ends within
            // them (most waits between two spinning cores do): spinning stays cheap.
            if self.polls % 64 != 0 {
                std::hint::spin_loop();
                return Pace::Spin;
            }
            let now = Instant::now();
            let start = *self.started.get_or_insert(now);
            if self.last_read.is_some_and(|t| now - t > PREEMPTED_GAP) {
                crate::placement::preempted(now);
                // Preempted in the long spin: the core is wanted after all; stop spinning.
                self.spin = self.spin.min(self.base_spin);
            }
            self.last_read = Some(now);
            if now - start < self.spin {
                // Where the awaited rank is known, a waiter on its core steps aside (or, bound,
                // yields to it), and one apart from it spins on: a yield there would only
                // hand the core to whatever else runs on it. Where it is not known, an
                // unbound waiter yields now and then in case the peer shares its core.
                let seen = waiter.and_then(|w| w.seats()).map_or(Seen::Unknown, |s| s.look());
                self.seen = seen;
                let last = *self.last_yield.get_or_insert(now);
                if seen == Seen::Together || (seen == Seen::Unknown && self.slice_yields && now - last >= spin_slice()) {
                    self.last_yield = Some(now);
                    std::thread::yield_now();
                }
                std::hint::spin_loop();
                return Pace::Spin;
            }
        }
        // Past the spin, a waiter whose awaited rank runs on another core sleeps at once: that
        // rank is not running (preempted, or busy elsewhere), and a yield would hand our core
        // to whatever else runs here for a whole time slice, while a sleeper is woken by the
        // rank's next write (and, having slept, gets its core back promptly).
        // A contended core (another task wants it) gets the normal spin only: spinning on
        // spends the time slice the waiter needs when its peer is back, and a sleeper is woken
        // ahead of the busy work.
        if self.seen == Seen::Apart {
            let now = self.last_read.unwrap_or_else(Instant::now);
            if self.spin < long_spin() && !crate::placement::core_contended(now) {
                self.spin = long_spin();
                return Pace::Spin;
            }
            return self.sleep();
        }
        if self.yielded < self.yields {
            if let Some(w) = waiter {
                if self.held < HOLD_POLLS && w.awaited_on_core() {
                    self.held += 1;
                    std::hint::spin_loop();
                    return Pace::Spin;
                }
                self.held = 0;
            }
            // Yields lately lost the core to work that keeps it (see `placement`): sleep.
            if crate::placement::yields_lose_the_core() {
                return self.sleep();
            }
            if let Some(w) = waiter {
                w.yielding(true);
                crate::placement::yield_core();
                w.yielding(false);
            } else {
                crate::placement::yield_core();
            }
            self.yielded += 1;
            return if self.yielded % CHECK_EVERY_YIELDS == 0 { Pace::YieldAndCheck } else { Pace::Yield };
        }
        self.sleep()
    }

    /// The waiter sleeps next: the clock's gap across the sleep is no preemption.
    fn sleep(&mut self) -> Pace {
        self.last_read = None;
        Pace::Sleep
    }
}

impl Completion {
    pub fn new() -> Completion {
        Completion::default()
    }

    pub fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }

    /// Finishes the operation. The first call wins; later calls are ignored (returns false).
    pub fn complete(&self, r: Result<Done>) -> bool {
        if self.state.compare_exchange(PENDING, WRITING, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        // SAFETY: we won the slot; nobody reads it before DONE.
        unsafe { *self.result.get() = Some(r) };
        self.state.store(DONE, Ordering::SeqCst);
        // A condvar sleeper counts itself before its last look at `state` (both SeqCst): either
        // it sees DONE or we see it counted. Taking the lock before notifying makes sure it is
        // inside the wait by then.
        if self.cv_sleepers.load(Ordering::SeqCst) > 0 {
            drop(self.sleep_lock.lock().unwrap_or_else(|p| p.into_inner()));
            self.cv.notify_all();
        }
        crate::waker::wake(self.waker.load(Ordering::SeqCst));
        true
    }

    /// The result, if finished.
    pub fn result(&self) -> Option<Result<Done>> {
        if !self.is_done() {
            return None;
        }
        // SAFETY: DONE (acquired above): written once, never again.
        unsafe { (*self.result.get()).clone() }
    }

    /// Waits until finished, `deadline` passes (`Timeout`), or `interrupt` reports an error
    /// (abort, peer loss). Returns the operation's result; the op is NOT cancelled on timeout.
    pub fn wait(&self, deadline: Instant, interrupt: &dyn Fn() -> Option<Error>) -> WaitOutcome {
        self.wait_with(&|| deadline, interrupt, None, None)
    }

    /// Like `wait`, but when it is time to sleep, `idle(max, fd)` is called instead of sleeping on
    /// the condvar: e.g. sleep in `poll` on the sockets whose data would complete the op, so the
    /// waiter wakes straight from the kernel instead of through the progress thread. `fd` (an
    /// eventfd) becomes readable when the op is completed by anyone; `idle` must poll it too.
    /// `poll`, if given, looks for the op's data in shared memory without sleeping: it is
    /// called while spinning and yielding, and spinning then lasts as long as for shared memory;
    /// when it reports progress (data moved, as while a large message streams through shared
    /// memory), the wait starts spinning anew instead of going to sleep mid-transfer.
    /// `deadline` is asked for only when the wait is past spinning (most are over before).
    pub fn wait_with(&self, deadline: &dyn Fn() -> Instant, interrupt: &dyn Fn() -> Option<Error>, idle: Option<&dyn Fn(Duration, i32)>, poll: Option<&dyn Poll>) -> WaitOutcome {
        let mut backoff = if poll.is_some() { Backoff::for_shared_memory() } else { Backoff::for_progress_thread() };
        loop {
            if let Some(r) = self.result() {
                return WaitOutcome::Finished(r);
            }
            let pace = backoff.next_for(poll);
            if let (Some(poll), Pace::Spin | Pace::Yield | Pace::YieldAndCheck) = (poll, pace) {
                if poll.poll() {
                    backoff.restart();
                }
            }
            if matches!(pace, Pace::Spin | Pace::Yield) {
                continue;
            }
            if let Some(e) = interrupt() {
                return WaitOutcome::Interrupted(e);
            }
            let now = Instant::now();
            let deadline = deadline();
            if now >= deadline {
                return WaitOutcome::TimedOut;
            }
            if pace == Pace::YieldAndCheck {
                continue;
            }
            let nap = (deadline - now).min(MAX_SLEEP);
            if let Some(idle) = idle {
                let fd = crate::waker::thread_fd();
                self.waker.store(fd, Ordering::SeqCst);
                if self.state.load(Ordering::SeqCst) != DONE {
                    idle(nap, fd);
                }
                self.waker.store(-1, Ordering::SeqCst);
                crate::waker::drain(fd);
                continue;
            }
            let g = self.sleep_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.cv_sleepers.fetch_add(1, Ordering::SeqCst);
            if self.state.load(Ordering::SeqCst) != DONE {
                drop(self.cv.wait_timeout(g, nap));
            } else {
                drop(g);
            }
            self.cv_sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// How a wait ended.
#[derive(Debug)]
pub enum WaitOutcome {
    Finished(Result<Done>),
    TimedOut,
    Interrupted(Error),
}

/// When an operation started, read from the coarse monotonic clock (a few ns, where the fine
/// one costs tens in a VM; a kernel tick of resolution, plenty for millisecond timeouts).
#[derive(Debug, Clone, Copy)]
pub struct Stamp(Duration);

impl Stamp {
    pub fn now() -> Stamp {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC_COARSE exists on every Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        Stamp(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// The deadline `ms` milliseconds after this stamp (saturating far in the future).
    pub fn deadline_after(self, ms: i64) -> Instant {
        let spent = Stamp::now().0.saturating_sub(self.0);
        instant_in(Duration::from_millis(ms.max(0) as u64).saturating_sub(spent))
    }
}

/// A deadline `ms` milliseconds from the first time it is asked for (the clock is read then,
/// not at creation: a call that never waits long never reads it), or from a `Stamp` taken when
/// the operation started.
pub struct LazyDeadline {
    ms: i64,
    since: Option<Stamp>,
    at: std::cell::OnceCell<Instant>,
}

impl LazyDeadline {
    pub fn new(ms: i64) -> LazyDeadline {
        LazyDeadline { ms, since: None, at: std::cell::OnceCell::new() }
    }

    /// `ms` milliseconds after `started`.
    pub fn since(started: Stamp, ms: i64) -> LazyDeadline {
        LazyDeadline { ms, since: Some(started), at: std::cell::OnceCell::new() }
    }

    pub fn get(&self) -> Instant {
        *self.at.get_or_init(|| match self.since {
            Some(started) => started.deadline_after(self.ms),
            None => deadline_after(self.ms),
        })
    }
}

/// A deadline `ms` milliseconds from now (saturating far in the future).
pub fn deadline_after(ms: i64) -> Instant {
    instant_in(Duration::from_millis(ms.max(0) as u64))
}

/// Now plus `d`, saturating a year ahead where the clock cannot represent it.
fn instant_in(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or_else(|| now + Duration::from_secs(86400 * 365))
}

/// Timeout error text shared by every wait.
pub fn timeout_error(what: &str, timeout_ms: i64) -> Error {
    Error::new(Status::Timeout, format!("{what} did not finish within the timeout of {timeout_ms} ms"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use crate::placement::PREEMPTED_AT;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    /// A waiter whose awaited rank holds a core or not, counting its yields.
    struct Fake {
        on_core: Cell<bool>,
        away: Cell<i32>,
        yields: Cell<u32>,
    }

    impl Poll for Fake {
        fn poll(&self) -> bool {
            false
        }
        fn awaited_on_core(&self) -> bool {
            self.on_core.get()
        }
        fn yielding(&self, away: bool) {
            assert_eq!(self.away.get(), i32::from(!away), "yields are announced in pairs");
            self.away.set(i32::from(away));
            self.yields.set(self.yields.get() + u32::from(away));
        }
    }

    #[test]
    fn a_waiter_keeps_its_core_a_little_while_the_awaited_rank_has_one() {
        let w = Fake { on_core: Cell::new(true), away: Cell::new(0), yields: Cell::new(0) };
        let mut b = Backoff::new(Duration::ZERO, 100);
        for _ in 0..HOLD_POLLS {
            assert_eq!(b.next_for(Some(&w)), Pace::Spin);
        }
        assert_eq!(w.yields.get(), 0);
        assert_eq!(b.next_for(Some(&w)), Pace::Yield, "held long enough: yield");
        assert_eq!((w.yields.get(), w.away.get()), (1, 0));
        assert_eq!(b.next_for(Some(&w)), Pace::Spin, "and hold again after the yield");
        w.on_core.set(false);
        assert_eq!(b.next_for(Some(&w)), Pace::Yield, "the awaited rank gave its core away: yield at once");
        assert_eq!(w.yields.get(), 2);
        assert_eq!(b.next(), Pace::Yield, "without a waiter, as before");
    }

    #[test]
    fn a_waiter_sleeps_instead_of_yielding_while_yields_lose_the_core() {
        let w = Fake { on_core: Cell::new(false), away: Cell::new(0), yields: Cell::new(0) };
        let mut b = Backoff::new(Duration::ZERO, 100);
        assert_eq!(b.next_for(Some(&w)), Pace::Yield, "ranks that outnumber the cores yield");
        // Two yields handed back only milliseconds later, close together (a busy process).
        let t = Instant::now();
        crate::placement::note_yield(t, t + Duration::from_millis(3));
        crate::placement::note_yield(t + Duration::from_millis(4), t + Duration::from_millis(7));
        let mut b = Backoff::new(Duration::ZERO, 100);
        assert_eq!(b.next_for(Some(&w)), Pace::Sleep, "sleep at once: the peer's write wakes us");
        assert_eq!(Backoff::new(Duration::ZERO, 100).next(), Pace::Sleep, "without a waiter too");
        assert_eq!(w.yields.get(), 1, "no yield during the spell");
    }

    /// Runs a seated wait that never ends until the backoff says sleep: the paces and the time.
    fn wait_until_sleep(b: &mut Backoff, w: &Seats<'_>) -> (Vec<Pace>, Duration) {
        let t0 = Instant::now();
        let mut paces = Vec::new();
        while paces.last() != Some(&Pace::Sleep) {
            paces.push(b.next_for(Some(w)));
        }
        (paces, t0.elapsed())
    }

    #[test]
    fn a_waiter_apart_from_the_awaited_rank_spins_then_sleeps_without_yielding() {
        let here = crate::placement::current_cpu().unwrap();
        let (mine, theirs) = (AtomicU32::new(0), AtomicU32::new(0));
        crate::placement::publish(&theirs, here + 1);
        let w = Seats { mine: &mine, awaited: Some(&theirs) };
        let seated = || Backoff { slice_yields: false, ..Backoff::new(Duration::from_micros(200), 32) };

        // A core nobody else wants: the long spin, then sleep.
        PREEMPTED_AT.set(None);
        let mut b = seated();
        let (paces, took) = wait_until_sleep(&mut b, &w);
        assert!(paces[..paces.len() - 1].iter().all(|p| *p == Pace::Spin), "no yields");
        assert!(took >= LONG_SPIN || PREEMPTED_AT.get().is_some(), "spun about a time slice unless preempted meanwhile ({took:?})");
        assert!(crate::placement::published(&mine).is_some(), "and said where it runs");

        // A core another task wants (this thread was preempted lately): the normal spin only.
        PREEMPTED_AT.set(Some(Instant::now()));
        let mut b = seated();
        let (paces, took) = wait_until_sleep(&mut b, &w);
        assert!(paces[..paces.len() - 1].iter().all(|p| *p == Pace::Spin), "no yields");
        assert!(took >= Duration::from_micros(200));
        assert_eq!(b.spin, b.base_spin, "not stretched");

        // A sleep between two looks is not a preemption: after it, the wait sleeps again
        // without marking the core contended (which would cut the next waits' long spin).
        PREEMPTED_AT.set(None);
        let mut b = seated();
        wait_until_sleep(&mut b, &w);
        std::thread::sleep(Duration::from_millis(2));
        let before = PREEMPTED_AT.get();
        let mut after_sleep = Pace::Spin;
        for _ in 0..256 {
            after_sleep = b.next_for(Some(&w));
            if after_sleep == Pace::Sleep {
                break;
            }
        }
        assert_eq!(after_sleep, Pace::Sleep, "still asleep-bound");
        assert_eq!(PREEMPTED_AT.get(), before, "the sleep did not count as a preemption");

        // Without seats (or not knowing the awaited rank), the yields come first, as before.
        let mut b = Backoff::new(Duration::ZERO, 3);
        assert_eq!((b.next(), b.next(), b.next(), b.next()), (Pace::Yield, Pace::Yield, Pace::Yield, Pace::Sleep));
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(cpu_list_len("0-3,8,10-11\n"), Some(7));
        assert_eq!(cpu_list_len("5"), Some(1));
        assert_eq!(cpu_list_len(""), None);
        assert_eq!(cpu_list_len("3-1"), None);
        assert_eq!(cpu_list_len("x"), None);
        assert!(host_cores() >= 1);
    }

    #[test]
    fn completes_across_threads() {
        let c = Arc::new(Completion::new());
        let c2 = c.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c2.complete(Ok(Done { bytes: 7, source: 1, tag: 2 }));
        });
        match c.wait(deadline_after(5000), &|| None) {
            WaitOutcome::Finished(Ok(d)) => assert_eq!(d.bytes, 7),
            other => panic!("unexpected {other:?}"),
        }
        t.join().unwrap();
        assert!(!c.complete(Ok(Done::default())), "second completion must be ignored");
    }

    #[test]
    fn times_out_and_interrupts() {
        let c = Completion::new();
        let t0 = Instant::now();
        assert!(matches!(c.wait(deadline_after(50), &|| None), WaitOutcome::TimedOut));
        assert!(t0.elapsed() >= Duration::from_millis(50));
        let e = Error::new(Status::Aborted, "x");
        assert!(matches!(c.wait(deadline_after(5000), &|| Some(e.clone())), WaitOutcome::Interrupted(_)));
    }
}
