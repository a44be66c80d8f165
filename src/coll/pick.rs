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
//! One member (rank 0) chooses and tells the others in the call's first step, so every member
//! makes the same choice; only its own times count. Used by the shared-memory allgather of
//! blocks from 1 MiB (staged, or read once): 4 MiB at 2 ranks, 1095 runs of each build
//! interleaved with the ping-pong: in the far minutes 0.24x the time of staging always (268
//! against 1128 us), otherwise 1.03x (223 against 215 us: the choosing step and the tries).

use std::time::Duration;

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
        self.timed += 1;
        if self.timed == 1 {
            return;
        }
        self.estimate = Some(self.estimate.map_or(per_byte, |old| {
            let w = if per_byte < old { WEIGHT_FASTER } else { WEIGHT_SLOWER };
            old + (per_byte.min(old * CLIP) - old) * w
        }));
    }
}

impl Pick {
    /// Whether to take the second way this time: the first until it has an estimate, then the
    /// second until it has one, then the faster (see `SECOND_BELOW`), the other tried every
    /// `EXPLORE_EVERY` calls.
    pub fn second(&mut self) -> bool {
        self.calls += 1;
        match (self.first.estimate, self.second.estimate) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(a), Some(b)) => (b < a * SECOND_BELOW) != (self.calls % EXPLORE_EVERY == 0),
        }
    }

    /// A call of `bytes` took `took` the `second` way (or the first).
    pub fn took(&mut self, second: bool, bytes: usize, took: Duration) {
        let per_byte = took.as_nanos() as f64 / bytes.max(1) as f64;
        if second { &mut self.second } else { &mut self.first }.took(per_byte);
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
        // Two calls each way (the first of each is cold and not counted).
        assert_eq!(calls(&mut p, 1, 50_000, 90_000), 0);
        assert_eq!(calls(&mut p, 1, 5000, 90_000), 0);
        assert_eq!(calls(&mut p, 2, 5000, 9000), 2);
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
}
