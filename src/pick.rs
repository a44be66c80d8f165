//! Choosing between two ways of making a collective by how fast each went lately, for where
//! neither wins everywhere and the machine decides which wins now.
//!
//! The case it was made for: on this VM, copies that one rank writes into shared memory and
//! another then reads (the staged collectives) run 4-6x slower for minutes at a time, while
//! reading the other's buffer once (`process_vm_readv`) is hardly affected. In those minutes a
//! cache line's round trip between the two cores takes 280-360 ns instead of 50-70 (measured
//! side by side, 53 of 509 runs slow in both and 451 fast in both, 5 slow in one): the two vCPUs
//! sit far apart on the host. Which way is faster cannot be known in advance, so it is measured.
//!
//! In a collective one member (rank 0; a broadcast's root) chooses and tells the others with
//! its stamp, so every member makes the same choice; only its own times count. For a large
//! message announced through a shared-memory ring the receiver chooses alone (read it once from
//! the sender's memory, or have it streamed through the ring: the sender does either, see
//! `transport::messages::read_announced`). Used by the shared-memory allgather
//! of blocks from 256 KiB, allreduce and reduce_scatter from 1 MiB (staged, or read once), alltoall,
//! gather and scatter from 256 KiB (staged, or read directly), and
//! broadcast from 64 KiB (staged, or with one copy: read directly, shared out from 256 KiB). 2 ranks, old build
//! (always staged) and new interleaved with the ping-pong, medians of new/old time, far minutes
//! (about 90 runs each) and the rest (about 340): allgather 4 MiB 0.24 (measured when it came)
//! and 1.00; reduce_scatter 1 and 4 MiB 0.28-0.29 and 1.00-1.01; allreduce 1, 4 and 16 MiB
//! 0.24-0.57 and 0.99-1.03.

use std::time::Duration;

/// Calls timed each way, alternately, before the first choice (after one cold call each, not
/// counted); a way's first estimate is its fastest of them, so that one slow try (a page
/// fault, a preemption) does not send the next 30 calls the slower way.
const TRIES: u32 = 3;
/// One call in this many tries the way that looks slower, to notice when the machine changed.
const EXPLORE_EVERY: u64 = 32;
/// Weight of the newest time in a way's running estimate: a faster time counts more than a
/// slower one, which is also counted as at most `CLIP` times the estimate, so that one slow
/// call (a preemption) does not flip the choice while a way that became fast is seen soon.
const WEIGHT_FASTER: f64 = 0.5;
const WEIGHT_SLOWER: f64 = 0.125;
const CLIP: f64 = 2.0;
/// The second way is taken only while its estimate is below this share of the first's: the
/// first is the one that wins on a quiet machine, and a near tie is noise.
const SECOND_BELOW: f64 = 0.8;

/// The two ways' recent times per byte.
#[derive(Debug, Default)]
pub struct Pick {
    first: Way,
    second: Way,
    calls: u64,
}

#[derive(Debug, Default)]
struct Way {
    /// Calls timed; the first of each way is not counted (cold buffers and caches).
    timed: u32,
    estimate: Option<f64>,
}

impl Way {
    fn took(&mut self, per_byte: f64) {
        let trying = !self.settled();
        self.timed += 1;
        if self.timed == 1 {
            return;
        }
        self.estimate = Some(match self.estimate {
            None => per_byte,
            Some(old) if trying => old.min(per_byte),
            Some(old) => {
                let w = if per_byte < old { WEIGHT_FASTER } else { WEIGHT_SLOWER };
                old + (per_byte.min(old * CLIP) - old) * w
            }
        });
    }

    /// Whether this way's tries are over (its cold call and `TRIES` more were timed).
    fn settled(&self) -> bool {
        self.timed > TRIES
    }
}

impl Pick {
    /// Whether to take the second way this time: each in turn until both had their tries (see
    /// `TRIES`), then the faster (see `SECOND_BELOW`), the other tried every `EXPLORE_EVERY`
    /// calls.
    pub fn second(&mut self) -> bool {
        self.calls += 1;
        if let Some(way) = forced() {
            return way;
        }
        match (self.first.estimate, self.second.estimate) {
            (Some(a), Some(b)) if self.first.settled() && self.second.settled() => (b < a * SECOND_BELOW) != (self.calls % EXPLORE_EVERY == 0),
            _ => self.second.timed < self.first.timed,
        }
    }

    /// A call of `bytes` took `took` the `second` way (or the first).
    pub fn took(&mut self, second: bool, bytes: usize, took: Duration) {
        let per_byte = took.as_nanos() as f64 / bytes.max(1) as f64;
        if second { &mut self.second } else { &mut self.first }.took(per_byte);
    }
}

/// The way `DC_PICK` forces, if it does (see `params`).
fn forced() -> Option<bool> {
    static FORCED: once_cell::sync::Lazy<Option<bool>> = once_cell::sync::Lazy::new(|| crate::params::get().pick_way);
    *FORCED
}

/// A `Pick` for each size class (a power of two from `MIN` bytes, the last one open-ended):
/// a way's time per byte changes with the size (what stays in cache), and a program that
/// alternates sizes should not have one size's times choose for another.
#[derive(Debug, Default)]
pub struct BySize {
    classes: [Pick; 8],
}

impl BySize {
    /// The `Pick` of calls of `bytes` (at least `min`) bytes.
    pub fn of(&mut self, bytes: usize, min: usize) -> &mut Pick {
        let class = (bytes / min.max(1)).max(1).ilog2() as usize;
        &mut self.classes[class.min(self.classes.len() - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` calls where the first way takes `first_ns` and the second `second_ns` (per 1000
    /// bytes): how many took the second.
    fn calls(p: &mut Pick, n: u64, first_ns: u64, second_ns: u64) -> u64 {
        let mut seconds = 0;
        for _ in 0..n {
            let s = p.second();
            seconds += u64::from(s);
            p.took(s, 1000, Duration::from_nanos(if s { second_ns } else { first_ns }));
        }
        seconds
    }

    #[test]
    fn tries_both_then_keeps_the_faster_and_follows_a_change() {
        let mut p = Pick::default();
        // Four calls each way, in turn (the first of each is cold and not counted).
        assert_eq!(calls(&mut p, 1, 50_000, 90_000), 0);
        assert_eq!(calls(&mut p, 7, 5000, 9000), 4);
        // The first is faster: the second only as exploration.
        assert_eq!(calls(&mut p, 640, 5000, 9000), 20);
        // A near tie keeps the first.
        assert_eq!(calls(&mut p, 320, 5000, 4600), 10);
        // One very slow call of the first does not flip the choice.
        assert_eq!(calls(&mut p, 1, 500_000, 4600), 0);
        assert!(calls(&mut p, 30, 5000, 4600) <= 1, "only an exploration");
        // The first way becomes 4x slower: within a few calls the second is taken, and then
        // the first only as exploration.
        let switched = calls(&mut p, 10, 20_000, 5000);
        assert!(switched >= 6, "{switched} of 10");
        assert_eq!(calls(&mut p, 640, 20_000, 5000), 640 - 20);
        // And back: explorations of the first find it fast again and it is taken again.
        let back = calls(&mut p, 400, 4000, 5000);
        assert!(back < 400 - 100, "{back} of 400 still the second way");
        assert_eq!(calls(&mut p, 64, 4000, 5000), 2);
    }

    #[test]
    fn one_slow_try_does_not_decide() {
        let mut p = Pick::default();
        // The first way's first timed call is 4x slow, its others fast: its fastest counts.
        let firsts = [50_000, 20_000, 5000, 5000];
        for (i, t) in firsts.into_iter().enumerate() {
            assert!(!p.second(), "try {i}");
            p.took(false, 1000, Duration::from_nanos(t));
            assert!(p.second(), "try {i}");
            p.took(true, 1000, Duration::from_nanos(6000));
        }
        assert_eq!(calls(&mut p, 31 - 8, 5000, 6000), 0);
    }

    #[test]
    fn each_size_class_has_its_own_pick() {
        let mut by = BySize::default();
        const MIB: usize = 1 << 20;
        // Times at 1 MiB do not reach 2 MiB or 3 MiB (the same class).
        calls(by.of(MIB, MIB), 4, 5000, 9000);
        assert!(by.of(MIB + 1, MIB).first.estimate.is_some());
        assert!(by.of(2 * MIB, MIB).first.estimate.is_none());
        calls(by.of(3 * MIB, MIB), 4, 5000, 9000);
        assert!(by.of(2 * MIB, MIB).first.estimate.is_some());
        // Far beyond the last class: the last one.
        calls(by.of(1 << 40, MIB), 4, 5000, 9000);
        assert!(by.of(128 * MIB, MIB).first.estimate.is_some());
    }
}
