//! A one-shot completion flag with a result, and the library's single waiting policy:
//! spin briefly, then yield, then sleep on a condvar (futex) — always with a deadline and a
//! check for abort or peer loss, so no wait can hang and no waiting rank eats a core.

use crate::error::{Error, Result, Status};
use std::sync::atomic::{AtomicBool, Ordering};
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
#[derive(Debug, Default)]
pub struct Completion {
    done: AtomicBool,
    result: Mutex<Option<Result<Done>>>,
    cv: Condvar,
}

/// Spin iterations before yielding, and yields before sleeping. A peer on the other core is
/// seen within a microsecond; a wake-up from sleep costs 15-30 us on these machines.
const SPIN_ITERS: u32 = 2000;
const YIELD_ITERS: u32 = 20;
/// The longest single sleep: the waiter re-checks abort and deadline at least this often even
/// if nobody wakes it.
const MAX_SLEEP: Duration = Duration::from_millis(50);

impl Completion {
    pub fn new() -> Completion {
        Completion::default()
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Finishes the operation. The first call wins; later calls are ignored (returns false).
    pub fn complete(&self, r: Result<Done>) -> bool {
        let mut g = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_some() {
            return false;
        }
        *g = Some(r);
        self.done.store(true, Ordering::Release);
        drop(g);
        self.cv.notify_all();
        true
    }

    /// The result, if finished.
    pub fn result(&self) -> Option<Result<Done>> {
        if !self.is_done() {
            return None;
        }
        self.result.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until finished, `deadline` passes (`Timeout`), or `interrupt` reports an error
    /// (abort, peer loss). Returns the operation's result; the op is NOT cancelled on timeout.
    pub fn wait(&self, deadline: Instant, interrupt: &dyn Fn() -> Option<Error>) -> WaitOutcome {
        let mut spins = 0u32;
        loop {
            if let Some(r) = self.result() {
                return WaitOutcome::Finished(r);
            }
            spins += 1;
            if spins < SPIN_ITERS {
                std::hint::spin_loop();
                continue;
            }
            if let Some(e) = interrupt() {
                return WaitOutcome::Interrupted(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return WaitOutcome::TimedOut;
            }
            if spins < SPIN_ITERS + YIELD_ITERS {
                std::thread::yield_now();
                continue;
            }
            let g = self.result.lock().unwrap_or_else(|p| p.into_inner());
            if g.is_none() {
                let nap = (deadline - now).min(MAX_SLEEP);
                let _ = self.cv.wait_timeout(g, nap);
            }
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

/// A deadline `ms` milliseconds from now (saturating far in the future).
pub fn deadline_after(ms: i64) -> Instant {
    let ms = ms.max(0) as u64;
    let now = Instant::now();
    now.checked_add(Duration::from_millis(ms))
        .unwrap_or_else(|| now + Duration::from_secs(86400 * 365))
}

/// Timeout error text shared by every wait.
pub fn timeout_error(what: &str, timeout_ms: i64) -> Error {
    Error::new(Status::Timeout, format!("{what} did not finish within the timeout of {timeout_ms} ms"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
