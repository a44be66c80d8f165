//! Where a waiting thread and the rank it waits for run, and stepping off a core the two share.
//!
//! Ranks that a launcher left unbound (torchrun, a plain env:// launcher, Slurm without
//! `--cpu-bind`) go wherever the scheduler puts them, and on a busy machine it often puts two
//! ranks that talk to each other on one core with the busy work alone on another: the
//! scheduler's balancer counts tasks, and two on one core beside one on the other looks
//! balanced. The waiter then spins while the rank it waits for sits behind it in the same run
//! queue, and every message costs a time slice (measured: 15 us per 16-byte exchange with one
//! busy process, 145,000 preemptions of each rank in 3 s). Yielding does not cure it (a yield
//! hands the core to the busy process for a slice as often as to the peer); moving does.
//!
//! So each rank publishes the CPU its waiting thread last ran on, in shared memory beside the
//! rings or the arena it waits on (a word per rank: `cpu + 1`, 0 for not known), and a waiter
//! that finds the rank it waits for published on its own CPU steps aside: it narrows its
//! affinity mask to exclude that CPU (the kernel moves it at once) and puts the mask back as it
//! was (which moves nothing), so the user's binding, or lack of one, is unchanged. A thread
//! bound to one CPU cannot step aside; it yields instead, which there hands the core to the
//! peer.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The CPU this thread runs on now, if the kernel says (a vDSO call: a few ns).
pub fn current_cpu() -> Option<u32> {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    u32::try_from(c).ok()
}

/// Publishes `cpu` as where the owner of `word` runs (stored only when it changed: the line is
/// read by peers).
pub fn publish(word: &AtomicU32, cpu: u32) {
    let v = cpu.wrapping_add(1);
    if word.load(Ordering::Relaxed) != v {
        word.store(v, Ordering::Relaxed);
    }
}

/// The CPU the owner of `word` last published.
pub fn published(word: &AtomicU32) -> Option<u32> {
    word.load(Ordering::Relaxed).checked_sub(1)
}

/// A wait's two words: where we run, and where the rank the wait needs runs (None: the wait
/// needs no rank in particular, or one whose placement we cannot see).
#[derive(Clone, Copy)]
pub struct Seats<'a> {
    pub mine: &'a AtomicU32,
    pub awaited: Option<&'a AtomicU32>,
}

/// What a waiter learnt from its seats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The awaited rank runs on another CPU (as far as it last said).
    Apart,
    /// The awaited rank sits on our CPU and we could not move: it runs only if we give the
    /// core away.
    Together,
    /// It sat on our CPU; we moved to another.
    SteppedAside,
    /// Nothing known about the awaited rank.
    Unknown,
}

impl Seats<'_> {
    /// Publishes our CPU and compares it with the awaited rank's, stepping aside when they are
    /// the same (see the module comment).
    pub fn look(&self) -> Seen {
        let Some(cpu) = current_cpu() else { return Seen::Unknown };
        publish(self.mine, cpu);
        match self.awaited.and_then(published) {
            None => Seen::Unknown,
            Some(theirs) if theirs != cpu => Seen::Apart,
            Some(_) if step_aside(cpu) => {
                if let Some(now) = current_cpu() {
                    publish(self.mine, now);
                }
                Seen::SteppedAside
            }
            Some(_) => Seen::Together,
        }
    }
}

/// At most one step aside per thread this often: if the scheduler keeps putting us back (a
/// wake-up onto the waker's core), moving every time would cost more than it saves.
const STEP_ASIDE_EVERY: Duration = Duration::from_millis(1);

thread_local! {
    static LAST_STEP: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Moves this thread off `cpu` to another CPU its affinity mask allows, and leaves the mask as
/// it was. False where it cannot: a mask of that one CPU, too soon after the last move, or a
/// kernel that refuses.
pub fn step_aside(cpu: u32) -> bool {
    let now = Instant::now();
    if LAST_STEP.get().is_some_and(|t| now.duration_since(t) < STEP_ASIDE_EVERY) {
        return false;
    }
    LAST_STEP.set(Some(now));
    let cpu = cpu as usize;
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
    let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: the size passed is the set's.
    if cpu >= 8 * size || unsafe { libc::sched_getaffinity(0, size, &mut mask) } != 0 {
        return false;
    }
    // SAFETY: `mask` was filled by the kernel; `cpu` is within the set.
    if !unsafe { libc::CPU_ISSET(cpu, &mask) } || unsafe { libc::CPU_COUNT(&mask) } < 2 {
        return false;
    }
    let mut elsewhere = mask;
    // SAFETY: as above.
    unsafe { libc::CPU_CLR(cpu, &mut elsewhere) };
    // SAFETY: valid sets of the size passed. The first call migrates this thread (the current
    // CPU is not in the new mask); the second restores the mask, which moves nothing.
    let moved = unsafe { libc::sched_setaffinity(0, size, &elsewhere) } == 0;
    if moved {
        // SAFETY: as above.
        unsafe { libc::sched_setaffinity(0, size, &mask) };
    }
    moved
}

/// Whether other tasks want this thread's core, as of `now`: one of its waits found itself
/// preempted within the last [`CONTENDED_FOR`] (see [`preempted`]), or over the last few
/// milliseconds it waited in the run queue more than a tenth of the time (`run_delay` in
/// `/proc/thread-self/schedstat`; a busy process on the core makes it about half, the
/// library's own progress thread waking now and then well under a hundredth). The file is read
/// at most every [`CONTENTION_WINDOW`] (a read is a system call, about a microsecond); without
/// it only preemptions count.
pub fn core_contended(now: Instant) -> bool {
    if PREEMPTED_AT.get().is_some_and(|t| now.duration_since(t) < CONTENDED_FOR) {
        return true;
    }
    CONTENTION.with(|c| {
        let mut c = c.borrow_mut();
        if c.since.is_some_and(|(t, _)| now.duration_since(t) < CONTENTION_WINDOW) {
            return c.verdict;
        }
        let Some(delay) = c.run_delay() else { return false };
        if let Some((t, before)) = c.since {
            let waited = Duration::from_nanos(delay.saturating_sub(before));
            c.verdict = waited * 10 > now.duration_since(t);
        }
        c.since = Some((now, delay));
        c.verdict
    })
}

/// A wait of this thread found itself preempted at `at` (two of its clock reads far apart):
/// another task wants its core.
pub fn preempted(at: Instant) {
    PREEMPTED_AT.set(Some(at));
}

/// Yields the core (`sched_yield`), noting whether it was lost: whether we got it back only
/// after [`LOST_YIELD`] (see [`yields_lose_the_core`]).
pub fn yield_core() {
    // Every fourth yield is timed: two clock reads on each made a 16 B exchange of 4 ranks on
    // the 2 cores 5% slower (they yield at every wait), and lost yields come by the hundred
    // where they come at all.
    let n = YIELDS.get().wrapping_add(1);
    YIELDS.set(n);
    if n % TIME_EVERY_YIELDS != 0 {
        std::thread::yield_now();
        return;
    }
    let before = Instant::now();
    std::thread::yield_now();
    note_yield(before, Instant::now());
}

/// A timed yield of this thread left the core at `before` and had it back at `after`.
pub(crate) fn note_yield(before: Instant, after: Instant) {
    if after.saturating_duration_since(before) > LOST_YIELD {
        if LAST_LOST_YIELD.get().is_some_and(|t| after.saturating_duration_since(t) < LOST_YIELDS_WITHIN) {
            NO_YIELDS_UNTIL.set(Some(after + NO_YIELDS_FOR));
        }
        LAST_LOST_YIELD.set(Some(after));
    }
}

/// Whether yields of this thread lately lost its core: two of them, close
/// together, gave it back only after a millisecond or more. Something that does not yield back
/// then runs beside us (a busy process keeps the core it is handed for its whole time slice),
/// and a waiter should sleep rather than yield: its peer's write wakes it. Ranks that
/// outnumber the cores, alone on the host, hand the core back within microseconds (measured, 4
/// ranks on the 2 cores, 128 KiB ring sendrecv: 11 yields of 3000 exchanges over 0.3 ms, 3
/// over 1 ms; with one busy process 667 and 585 of 300) and keep yielding. With that busy
/// process and the ranks bound two to a core (dcrun did that then), waits that yield took
/// 750-810 us per 16 B exchange and 1.4-1.5 ms at 128 KiB, sleeping at once 36-54 and 195-207
/// us (unbound ranks, which the scheduler moves away from the busy process, do well either
/// way: 3-7 us); without it, sleeping at once would cost 20x at 16 B (34 against 1.8 us),
/// hence the test.
pub fn yields_lose_the_core() -> bool {
    // No clock read unless a spell is on (ranks that outnumber the cores yield at every wait).
    let Some(until) = NO_YIELDS_UNTIL.get() else { return false };
    if Instant::now() < until {
        return true;
    }
    NO_YIELDS_UNTIL.set(None);
    false
}

/// One yield in this many is timed (see `yield_core`).
const TIME_EVERY_YIELDS: u32 = 4;

/// A yield that gave the core back only this much later lost it (see `yield_core`).
const LOST_YIELD: Duration = Duration::from_millis(1);

/// Two lost yields this close together start a spell without yields...
const LOST_YIELDS_WITHIN: Duration = Duration::from_millis(50);

/// ...this long; the yields after it look again (two lost ones cost a few milliseconds: a few
/// hundredths of this).
const NO_YIELDS_FOR: Duration = Duration::from_millis(200);

/// A thread preempted within this long counts as contended (see `core_contended`).
const CONTENDED_FOR: Duration = Duration::from_millis(100);

/// The shortest span `core_contended` judges over.
const CONTENTION_WINDOW: Duration = Duration::from_millis(5);

#[derive(Default)]
struct Contention {
    /// This thread's schedstat file (opened by the thread itself: `thread-self` is resolved
    /// then); None until first asked, Some(None) where it cannot be read.
    file: Option<Option<std::fs::File>>,
    /// When we last read it, and its run_delay then (ns).
    since: Option<(Instant, u64)>,
    verdict: bool,
}

impl Contention {
    fn run_delay(&mut self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let f = self.file.get_or_insert_with(|| std::fs::File::open("/proc/thread-self/schedstat").ok()).as_ref()?;
        let mut buf = [0u8; 96];
        let n = f.read_at(&mut buf, 0).ok()?;
        std::str::from_utf8(&buf[..n]).ok()?.split_whitespace().nth(1)?.parse().ok()
    }
}

thread_local! {
    static CONTENTION: std::cell::RefCell<Contention> = std::cell::RefCell::new(Contention::default());
    /// When a wait of this thread last found itself preempted (see `preempted`).
    pub(crate) static PREEMPTED_AT: Cell<Option<Instant>> = const { Cell::new(None) };
    /// When a yield of this thread last lost its core, and until when it does not yield (see
    /// `yield_core`).
    static LAST_LOST_YIELD: Cell<Option<Instant>> = const { Cell::new(None) };
    static NO_YIELDS_UNTIL: Cell<Option<Instant>> = const { Cell::new(None) };
    /// Yields of this thread so far (see `yield_core`).
    static YIELDS: Cell<u32> = const { Cell::new(0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_lost_yields_close_together_stop_yields_for_a_while() {
        let base = Instant::now();
        let ms = Duration::from_millis;
        assert!(!yields_lose_the_core(), "a new thread yields");
        note_yield(base, base + Duration::from_micros(50));
        note_yield(base, base + Duration::from_micros(900));
        assert!(!yields_lose_the_core(), "yields handed back within a millisecond are not lost");
        note_yield(base, base + ms(2));
        assert!(!yields_lose_the_core(), "one lost yield is not enough");
        note_yield(base + ms(60), base + ms(62));
        assert!(!yields_lose_the_core(), "nor two lost yields far apart");
        note_yield(base + ms(70), base + ms(72));
        assert!(yields_lose_the_core(), "two lost yields close together start a spell");
        assert_eq!(NO_YIELDS_UNTIL.get(), Some(base + ms(72) + NO_YIELDS_FOR), "for NO_YIELDS_FOR");
        NO_YIELDS_UNTIL.set(Some(Instant::now()));
        assert!(!yields_lose_the_core(), "the spell ends");
        assert_eq!(NO_YIELDS_UNTIL.get(), None, "and is forgotten (no clock read while none is on)");
        // Every TIME_EVERY_YIELDS-th real yield is timed; quick ones start nothing.
        for _ in 0..2 * TIME_EVERY_YIELDS {
            yield_core();
        }
        assert_eq!(YIELDS.get(), 2 * TIME_EVERY_YIELDS);
    }

    /// Binds the calling thread to `cpu` alone.
    fn pin_to(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the size passed is the set's.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(cpu, &mut one) };
        assert_eq!(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) }, 0);
    }

    fn cpus() -> usize {
        // SAFETY: as in step_aside.
        let mut mask: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut mask) };
        unsafe { libc::CPU_COUNT(&mask) as usize }
    }

    #[test]
    fn words_say_cpu_plus_one_and_zero_is_unknown() {
        let w = AtomicU32::new(0);
        assert_eq!(published(&w), None);
        publish(&w, 0);
        assert_eq!((w.load(Ordering::Relaxed), published(&w)), (1, Some(0)));
        publish(&w, 5);
        assert_eq!(published(&w), Some(5));
    }

    #[test]
    fn a_waiter_sharing_the_awaited_cpu_moves_and_keeps_its_mask() {
        std::thread::spawn(|| {
            let before = cpus();
            let here = current_cpu().expect("sched_getcpu");
            let (mine, theirs) = (AtomicU32::new(0), AtomicU32::new(0));
            publish(&theirs, here);
            // Before the first look: the step it takes is no earlier than this.
            let t0 = Instant::now();
            let seen = Seats { mine: &mine, awaited: Some(&theirs) }.look();
            if before < 2 {
                assert_eq!(seen, Seen::Together, "one CPU: nowhere to go");
                return;
            }
            assert_eq!(seen, Seen::SteppedAside);
            assert_ne!(current_cpu(), Some(here), "moved off the shared CPU");
            assert_eq!(published(&mine), current_cpu(), "and said where it went");
            assert_eq!(cpus(), before, "the affinity mask is as it was");
            // A second look within the rate limit cannot move again (judged only when the test
            // was not held up past the limit meanwhile, as it may be beside other tests).
            publish(&theirs, current_cpu().unwrap());
            let second = Seats { mine: &mine, awaited: Some(&theirs) }.look();
            if t0.elapsed() < STEP_ASIDE_EVERY {
                assert_eq!(second, Seen::Together);
            }
            let elsewhere = AtomicU32::new(0);
            publish(&elsewhere, current_cpu().unwrap() + 1);
            assert_eq!(Seats { mine: &mine, awaited: Some(&elsewhere) }.look(), Seen::Apart);
            assert_eq!(Seats { mine: &mine, awaited: None }.look(), Seen::Unknown);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_sharing_its_core_with_a_busy_one_finds_it_contended() {
        std::thread::spawn(|| {
            let here = current_cpu().unwrap() as usize;
            pin_to(here);
            if CONTENTION.with(|c| c.borrow_mut().run_delay()).is_none() {
                return; // no schedstat here: nothing to judge by
            }
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            let busy = std::thread::spawn(move || {
                pin_to(here);
                while !s2.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
            let t0 = Instant::now();
            let mut seen = false;
            while !seen && t0.elapsed() < Duration::from_secs(5) {
                std::hint::spin_loop();
                seen = core_contended(Instant::now());
            }
            stop.store(true, Ordering::Relaxed);
            busy.join().unwrap();
            assert!(seen, "a spinning thread on our core is contention");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_bound_to_one_cpu_stays() {
        std::thread::spawn(|| {
            let here = current_cpu().unwrap() as usize;
            pin_to(here);
            assert!(!step_aside(here as u32));
            assert_eq!(current_cpu(), Some(here as u32));
        })
        .join()
        .unwrap();
    }
}
