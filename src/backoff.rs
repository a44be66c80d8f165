//! Randomised pauses for retries, so that many ranks that fail at once (a busy store, a peer
//! not listening yet) do not come back in step.

use std::time::Duration;

/// A small pseudo-random source for retry pauses (xorshift, seeded once per retry loop).
pub(crate) struct Jitter(u64);

impl Jitter {
    pub(crate) fn new() -> Jitter {
        // The OS's random numbers; the stack address tells threads apart should that fail.
        let here = 0u8;
        let seed = getrandom::u64().unwrap_or_else(|_| crate::init::random_u64());
        Jitter((seed ^ (&here as *const u8 as u64).rotate_left(32)) | 1)
    }

    /// A fraction drawn uniformly from [0, 1).
    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A duration drawn uniformly from `[d/2, 3d/2)`.
    pub(crate) fn around(&mut self, d: Duration) -> Duration {
        d.mul_f64(0.5 + self.next_unit())
    }

    /// A duration drawn uniformly from `[0, d)`.
    pub(crate) fn up_to(&mut self, d: Duration) -> Duration {
        d.mul_f64(self.next_unit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_stay_in_their_ranges_and_vary() {
        let mut j = Jitter::new();
        let d = Duration::from_millis(100);
        let around: Vec<Duration> = (0..1000).map(|_| j.around(d)).collect();
        assert!(around.iter().all(|&x| x >= d / 2 && x < d * 3 / 2));
        let up: Vec<Duration> = (0..1000).map(|_| j.up_to(d)).collect();
        assert!(up.iter().all(|&x| x < d));
        assert!(up.iter().any(|&x| x < d / 4) && up.iter().any(|&x| x > d * 3 / 4), "spread over the range");
    }
}
