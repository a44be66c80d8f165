//! Spare buffers for the bodies of messages that arrive before their receive: the buffer a
//! receive has copied out of is kept for the next such body instead of going back to malloc.
//!
//! Why: a body buffer is allocated by the thread that reads the socket and freed by the one
//! that receives, and glibc gives the freed memory of a thread's arena back to the kernel
//! (`madvise`) as soon as its free top grows past the trim threshold, so every next body
//! faulted its pages in afresh. Measured (dc-bench over sockets, 2 ranks, broadcast of 64 KiB,
//! where the root runs ahead and every message arrives unexpected): a third of the receiving
//! side's time went to page faults and `madvise`; with trimming turned off for the test the
//! broadcast took 0.54-0.72x the time.

use super::tcp_io::STAGE_LEN;
use std::sync::Mutex;

/// Bodies kept, at most, and their bytes: a sender may run ahead by many messages (up to its
/// eager credit, `flow::max_unexpected_bytes`), so a handful would not cover a burst.
const KEEP: usize = 64;
const KEEP_BYTES: usize = 8 << 20;
/// Smaller buffers are cheap to allocate (and stay in malloc's bins); larger messages go by
/// rendezvous, straight into their receive (see `flow::rendezvous_bytes`).
const KEEP_MIN: usize = 16 * 1024;
const KEEP_MAX: usize = 1 << 20;

#[derive(Default)]
pub(super) struct SpareBodies(Mutex<Shelf>);

#[derive(Default)]
struct Shelf {
    bufs: Vec<Vec<u8>>,
    /// Their capacities together.
    bytes: usize,
}

impl SpareBodies {
    fn shelf(&self) -> std::sync::MutexGuard<'_, Shelf> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty buffer for a body of `len` bytes: a kept one that holds it all (the smallest
    /// such), else a new one of at most a stage's capacity, whatever the header claims (the
    /// caller grows it as bytes come).
    pub(super) fn take(&self, len: usize) -> Vec<u8> {
        if (KEEP_MIN..=KEEP_MAX).contains(&len) {
            let mut shelf = self.shelf();
            let fit = shelf.bufs.iter().enumerate().filter(|(_, v)| v.capacity() >= len).min_by_key(|(_, v)| v.capacity()).map(|(i, _)| i);
            if let Some(i) = fit {
                let v = shelf.bufs.swap_remove(i);
                shelf.bytes -= v.capacity();
                return v;
            }
        }
        Vec::with_capacity(len.min(STAGE_LEN))
    }

    /// Keeps `body` (its bytes delivered) for a later one, if it is worth keeping and the
    /// shelf has room.
    pub(super) fn give(&self, mut body: Vec<u8>) {
        if !(KEEP_MIN..=KEEP_MAX).contains(&body.capacity()) {
            return;
        }
        body.clear();
        let mut shelf = self.shelf();
        if shelf.bufs.len() < KEEP && shelf.bytes + body.capacity() <= KEEP_BYTES {
            shelf.bytes += body.capacity();
            shelf.bufs.push(body);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_mid_sized_buffers_up_to_its_limits_and_hands_out_the_smallest_that_fits() {
        let s = SpareBodies::default();
        assert_eq!(s.take(64 << 10).capacity(), STAGE_LEN, "nothing kept yet: a new buffer");
        for cap in [8 << 10, 2 << 20, 64 << 10, 512 << 10, 128 << 10] {
            s.give(Vec::with_capacity(cap));
        }
        let caps = |s: &SpareBodies| {
            let mut c: Vec<usize> = s.shelf().bufs.iter().map(|v| v.capacity()).collect();
            c.sort();
            c
        };
        assert_eq!(caps(&s), vec![64 << 10, 128 << 10, 512 << 10], "8 KiB and 2 MiB are not kept");
        let v = s.take(100 << 10);
        assert!(v.capacity() >= 128 << 10 && v.capacity() < 512 << 10 && v.is_empty());
        assert_eq!(s.take(600 << 10).capacity(), STAGE_LEN, "none holds it: a new one, of a stage at first");
        assert_eq!(s.take(1000).capacity(), 1000, "small bodies get their own");
        let mut used = s.take(300 << 10);
        used.extend_from_slice(&[1, 2, 3]);
        s.give(used);
        assert!(s.take(200 << 10).is_empty(), "a kept buffer comes back empty");
        // At most KEEP_BYTES in all, and at most KEEP buffers.
        for _ in 0..40 {
            s.give(Vec::with_capacity(1 << 20));
        }
        let bytes = s.shelf().bytes;
        assert!(bytes <= KEEP_BYTES && bytes > KEEP_BYTES - KEEP_MAX, "{bytes}");
        assert_eq!(caps(&s).iter().sum::<usize>(), bytes);
        let s = SpareBodies::default();
        for _ in 0..KEEP + 10 {
            s.give(Vec::with_capacity(KEEP_MIN));
        }
        assert_eq!(s.shelf().bufs.len(), KEEP);
    }
}
