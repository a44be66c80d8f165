//! Point-to-point rings between ranks of one host. Every rank owns one segment under /dev/shm
//! holding an incoming byte ring per same-host peer; the peer appends whole frames (the socket
//! transport's 32-byte header and, for small messages, the body; large ones follow as chunks,
//! see `stream`) and the owner consumes them.
//! A receiver that spins sees a frame within a fraction of a microsecond, with no system call
//! on either side; a receiver thread asleep in a wait is sent a doorbell over the socket (see
//! `socket`); frames for a process that is not waiting at all are picked up by its next wait or
//! by its progress thread's periodic look.
//! The segment is unlinked as soon as every peer has mapped it, so a crash leaves nothing.
//!
//! Memory: `RING_BYTES` per same-host peer and rank (256 KiB; 8 ranks on a host own 1.75 MiB
//! each, 14 MiB in all, and each maps all of it). One writer at a time per ring (the sender
//! serialises its threads), one reader at a time (the owner serialises its threads).

use crate::error::{Error, Result, Status};
use super::shm::{create_segment_file, map_segment, open_segment_file};
use memmap2::MmapMut;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Bytes of frames one ring holds.
pub const RING_BYTES: usize = 256 * 1024;
/// Message bodies up to this size travel inside the ring; larger ones single-copy.
pub const INLINE_MAX: usize = RING_BYTES / 4;
const MAGIC: u64 = 0x4443_5249_4e47_0001; // "DCRING"
const LINE: usize = 128;
const SEG_HEADER: usize = 4096;
/// Per ring: the writer's position, the reader's position, the doorbell flag and the writer's
/// "waiting for room" flag, a line each.
const RING_HEADER: usize = 4 * LINE;
const STRIDE: usize = RING_HEADER + RING_BYTES;
/// Every record starts with its total length; this bit marks padding up to the ring's end.
const PAD: u64 = 1 << 63;
const LEN_WORD: usize = 8;
const ALIGN: usize = 64;

#[repr(C)]
struct SegHeader {
    magic: AtomicU64,
    nonce: AtomicU64,
    rings: AtomicU32,
    _pad: [u8; LINE - 20],
    /// Threads of the owner asleep in a wait: writers ring the doorbell only for them. (On a
    /// line of its own, written only around sleeps: writers read it after every frame.)
    sleepers: AtomicU32,
    _pad2: [u8; LINE - 4],
    /// Threads of the owner spinning in a wait: they also send what waits for room in their
    /// outgoing rings, so a reader that made room need not ring them back.
    spinners: AtomicU32,
    _pad3: [u8; LINE - 4],
    /// Threads of the owner that gave their core away inside a wait (yielding; sleepers count
    /// apart): peers waiting for the owner spin only while none did (see `owner_on_core`).
    off_core: AtomicU32,
}

#[repr(C)]
struct RingHeader {
    /// Bytes ever written (the writer's position; only the writer reads it: the reader polls
    /// the length word of the next record instead).
    tail: AtomicU64,
    _a: [u8; LINE - 8],
    /// Bytes ever consumed (the reader's position).
    head: AtomicU64,
    _b: [u8; LINE - 8],
    /// A doorbell was sent and the reader has not started draining since.
    bell: AtomicU32,
    _c: [u8; LINE - 4],
    /// The writer has frames waiting for room: the reader rings back after draining.
    waiting: AtomicU32,
}

/// A mapped ring segment: ours (incoming rings) or a peer's (our ring in it is outgoing).
pub struct RingSegment {
    map: MmapMut,
    rings: usize,
}

// SAFETY: shared state is accessed through atomics; ring bytes are handed between the one
// writer and the one reader by release/acquire updates of each record's length word (to the
// reader) and of head (back to the writer).
unsafe impl Send for RingSegment {}
unsafe impl Sync for RingSegment {}

/// The name of a rank's ring segment: its pid (so a dead creator's segment can be reclaimed,
/// see `shm::reclaim_stale_segments`) and a random nonce.
pub fn segment_path(pid: u32, nonce: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/distcomm-{pid}-p2p-{nonce:016x}"))
}

fn round_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

impl RingSegment {
    /// Creates and maps a segment of `rings` empty rings.
    pub fn create(path: &Path, rings: usize, nonce: u64) -> Result<RingSegment> {
        let file = create_segment_file(path, SEG_HEADER + rings * STRIDE)?;
        let map = map_segment(&file, "ring segment")?;
        let seg = RingSegment { map, rings };
        let h = seg.header();
        h.nonce.store(nonce, Ordering::Relaxed);
        h.rings.store(rings as u32, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Maps a peer's segment, checking that it is the one the peer announced.
    pub fn open(path: &Path, rings: usize, nonce: u64) -> Result<RingSegment> {
        let file = open_segment_file(path, SEG_HEADER + rings * STRIDE)?;
        let map = map_segment(&file, "ring segment")?;
        let seg = RingSegment { map, rings };
        let h = seg.header();
        if h.magic.load(Ordering::Acquire) != MAGIC || h.nonce.load(Ordering::Relaxed) != nonce || h.rings.load(Ordering::Relaxed) as usize != rings {
            return Err(Error::new(Status::Unavailable, "ring segment belongs to someone else"));
        }
        Ok(seg)
    }

    fn header(&self) -> &SegHeader {
        // SAFETY: the map is at least SEG_HEADER bytes, page aligned; SegHeader is atomics.
        unsafe { &*(self.map.as_ptr() as *const SegHeader) }
    }

    fn ring_header(&self, i: usize) -> &RingHeader {
        assert!(i < self.rings);
        // SAFETY: in bounds (checked), line aligned, atomics only.
        unsafe { &*(self.map.as_ptr().add(SEG_HEADER + i * STRIDE) as *const RingHeader) }
    }

    fn data(&self, i: usize) -> *mut u8 {
        // SAFETY: in bounds (ring_header checked i).
        unsafe { (self.map.as_ptr() as *mut u8).add(SEG_HEADER + i * STRIDE + RING_HEADER) }
    }

    // ---- writer side (a peer's segment) ---------------------------------------------------

    /// Appends one record (`parts` back to back) to ring `i` if it has room; false if not.
    /// `head` is the writer's last look at the reader's position: the shared one (a cache line
    /// the reader writes) is read again only when that look shows too little room.
    ///
    /// The record's length word is written last: it is what the reader polls, so a small
    /// frame and its "ready" mark travel in one cache line. The word after the record is
    /// zeroed first (the reader stops there), so nothing a lap ago looks like a record.
    pub fn try_write(&self, i: usize, parts: &[&[u8]], head: &mut u64) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let need = round_up(LEN_WORD + len);
        assert!(need <= RING_BYTES / 2, "record of {len} bytes is too large for the ring");
        let h = self.ring_header(i);
        let tail = h.tail.load(Ordering::Relaxed);
        let off = (tail % RING_BYTES as u64) as usize;
        let to_end = RING_BYTES - off;
        let pad = if need > to_end { to_end } else { 0 };
        // Room for the record and the zeroed word after it.
        let fits = |head: u64| (tail - head) as usize + pad + need + ALIGN <= RING_BYTES;
        if !fits(*head) {
            *head = h.head.load(Ordering::Acquire);
            if !fits(*head) {
                return false;
            }
        }
        let data = self.data(i);
        let at = if pad > 0 { 0 } else { off };
        let next = (at + need) % RING_BYTES;
        // SAFETY: [at, at + need) and the word at `next` are free (checked against head, with
        // one ALIGN to spare); `at`, `next` and `off` are 64-aligned and below RING_BYTES.
        unsafe {
            self.len_word(data, next).store(0, Ordering::Relaxed);
            let mut p = data.add(at + LEN_WORD);
            for part in parts {
                std::ptr::copy_nonoverlapping(part.as_ptr(), p, part.len());
                p = p.add(part.len());
            }
            self.len_word(data, at).store(need as u64, Ordering::Release);
            if pad > 0 {
                // Only now may the reader jump from `off` to the record at 0.
                self.len_word(data, off).store(pad as u64 | PAD, Ordering::Release);
            }
        }
        h.tail.store(tail + (pad + need) as u64, Ordering::Relaxed);
        true
    }

    /// The length word at byte `off` of a ring's data.
    ///
    /// # Safety
    /// `off` must be 8-aligned and below RING_BYTES - 8, `data` a ring's data pointer.
    unsafe fn len_word<'a>(&'a self, data: *mut u8, off: usize) -> &'a AtomicU64 {
        &*(data.add(off) as *const AtomicU64)
    }

    /// After a write: whether the owner needs a doorbell to notice it soon (a thread of it
    /// sleeps in a wait and no doorbell is pending); marks one pending if so.
    pub fn needs_bell(&self, i: usize) -> bool {
        fence(Ordering::SeqCst);
        if self.header().sleepers.load(Ordering::SeqCst) == 0 {
            return false;
        }
        self.ring_header(i).bell.swap(1, Ordering::SeqCst) == 0
    }

    /// The writer could not append everything: the owner should ring back once it drained.
    pub fn mark_waiting(&self, i: usize) {
        self.ring_header(i).waiting.store(1, Ordering::SeqCst);
    }

    // ---- reader side (our segment) --------------------------------------------------------

    /// After a drain: whether the writer waits for room (and should be rung); clears it.
    pub fn take_waiting(&self, i: usize) -> bool {
        self.ring_header(i).waiting.load(Ordering::SeqCst) != 0 && self.ring_header(i).waiting.swap(0, Ordering::SeqCst) != 0
    }

    /// Whether ring `i` has records to read.
    pub fn has_records(&self, i: usize) -> bool {
        let h = self.ring_header(i);
        let off = (h.head.load(Ordering::Relaxed) % RING_BYTES as u64) as usize;
        // SAFETY: head is 64-aligned; the word is only accessed atomically.
        unsafe { self.len_word(self.data(i), off) }.load(Ordering::Acquire) != 0
    }

    /// Consumes every record of ring `i` in order, handing each (without its length word) to
    /// `f`; a record's space is released once `f` returns. The caller is the only reader.
    pub fn drain(&self, i: usize, mut f: impl FnMut(&[u8])) -> usize {
        let h = self.ring_header(i);
        if h.bell.load(Ordering::Relaxed) != 0 {
            // A doorbell is pending: clear it before looking, so a writer that comes after the
            // look rings again.
            h.bell.store(0, Ordering::SeqCst);
            fence(Ordering::SeqCst);
        }
        let data = self.data(i);
        let mut head = h.head.load(Ordering::Relaxed);
        let mut n = 0;
        loop {
            let off = (head % RING_BYTES as u64) as usize;
            // SAFETY: off is 64-aligned and below RING_BYTES.
            let word = unsafe { self.len_word(data, off) }.load(Ordering::Acquire);
            if word == 0 {
                return n;
            }
            let size = (word & !PAD) as usize;
            // Every record, padding included, is a positive multiple of ALIGN.
            if size > RING_BYTES - off || size % ALIGN != 0 || size == 0 {
                // Only a broken writer produces this: stop reading this ring rather than misread.
                return n;
            }
            if word & PAD == 0 {
                // SAFETY: the record lies within the ring (checked) and stays until head moves.
                let rec = unsafe { std::slice::from_raw_parts(data.add(off + LEN_WORD), size - LEN_WORD) };
                f(rec);
                n += 1;
            }
            head += size as u64;
            h.head.store(head, Ordering::Release);
        }
    }

    /// A thread of ours is about to sleep in a wait: writers ring from now on. The caller
    /// drains once more afterwards (a writer that did not see it yet rang no doorbell).
    pub fn sleep_start(&self) {
        self.header().sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    pub fn sleep_stop(&self) {
        self.header().sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// A thread of ours spins in a wait (and flushes our outgoing rings as it does).
    pub fn spin_start(&self) {
        self.header().spinners.fetch_add(1, Ordering::SeqCst);
    }

    /// The spinning thread stops (to sleep or because its wait ended). The caller flushes its
    /// outgoing rings once more afterwards: a reader that saw it spinning did not ring back.
    pub fn spin_stop(&self) {
        self.header().spinners.fetch_sub(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// A thread of ours gives its core away inside a wait (`true`, it yields), or has it back.
    pub fn off_core(&self, away: bool) {
        let w = &self.header().off_core;
        if away {
            w.fetch_add(1, Ordering::Relaxed);
        } else {
            w.fetch_sub(1, Ordering::Relaxed);
        }
    }

    // ---- reader side, about the writer (its segment) ---------------------------------------

    /// Whether the owner holds its core: none of its threads yields or sleeps in a wait (a
    /// hint: it may also be busy elsewhere, or preempted).
    pub fn owner_on_core(&self) -> bool {
        let h = self.header();
        h.off_core.load(Ordering::Relaxed) == 0 && h.sleepers.load(Ordering::Relaxed) == 0
    }

    /// Whether a thread of this segment's owner spins in a wait (it then sends what waits
    /// for room in its rings by itself).
    pub fn owner_spins(&self) -> bool {
        fence(Ordering::SeqCst);
        self.header().spinners.load(Ordering::SeqCst) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(rings: usize) -> (RingSegment, RingSegment, PathBuf) {
        let nonce = 0x1234_5678_9abc_def0 ^ u64::from(std::process::id());
        let path = PathBuf::from(format!("/dev/shm/distcomm-{}-p2p-test-{rings}-{nonce:x}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let a = RingSegment::create(&path, rings, nonce).unwrap();
        let b = RingSegment::open(&path, rings, nonce).unwrap();
        std::fs::remove_file(&path).unwrap();
        (a, b, path)
    }

    #[test]
    fn records_arrive_whole_and_in_order_across_the_wrap() {
        let (owner, writer, _) = seg(2);
        let mut next_in = 0u32;
        let mut next_out = 0u32;
        let mut head = 0;
        // Sizes that do not divide the ring, so records wrap with padding many times.
        for round in 0..200 {
            let blen = (round * 977) % 20_000;
            while writer.try_write(1, &[&next_in.to_le_bytes(), &(blen as u32).to_le_bytes(), &vec![next_in as u8; blen]], &mut head) {
                next_in += 1;
            }
            owner.drain(1, |rec| {
                let k = u32::from_le_bytes(rec[..4].try_into().unwrap());
                let blen = u32::from_le_bytes(rec[4..8].try_into().unwrap()) as usize;
                assert_eq!(k, next_out);
                assert!(rec[8..8 + blen].iter().all(|&b| b == k as u8));
                next_out += 1;
            });
            assert!(!owner.has_records(1));
        }
        assert_eq!(next_in, next_out);
        assert!(next_out > 1000);
        assert!(!owner.has_records(0), "ring 0 untouched");
    }

    #[test]
    fn a_full_ring_refuses_and_the_doorbell_rings_once_until_drained() {
        let (owner, writer, _) = seg(1);
        let big = vec![7u8; INLINE_MAX];
        let mut n = 0;
        let mut head = 0;
        while writer.try_write(0, &[&big], &mut head) {
            n += 1;
        }
        assert_eq!(n, 3, "three 64 KiB records (plus length words) fit in 256 KiB");
        assert!(!writer.needs_bell(0), "no doorbell while nobody of the owner waits");
        owner.sleep_start();
        assert!(writer.needs_bell(0));
        assert!(!writer.needs_bell(0), "one doorbell while it is pending");
        assert_eq!(owner.drain(0, |r| assert_eq!(r.len(), round_up(LEN_WORD + INLINE_MAX) - LEN_WORD)), 3);
        assert!(writer.try_write(0, &[&big], &mut head), "room again, seen through a fresh look at the reader's position");
        assert!(writer.needs_bell(0), "the drain cleared the pending doorbell");
        owner.sleep_stop();
        assert!(writer.try_write(0, &[&big], &mut head));
        assert!(!writer.needs_bell(0), "nobody sleeps");
    }

    #[test]
    fn peers_see_whether_the_owner_holds_its_core() {
        let (owner, peer_view, _) = seg(1);
        assert!(peer_view.owner_on_core());
        owner.off_core(true);
        assert!(!peer_view.owner_on_core(), "yielding");
        owner.off_core(false);
        assert!(peer_view.owner_on_core());
        owner.sleep_start();
        assert!(!peer_view.owner_on_core(), "asleep");
        owner.sleep_stop();
        assert!(peer_view.owner_on_core());
    }

    #[test]
    fn four_stream_chunks_fill_the_ring() {
        let (owner, writer, _) = seg(1);
        let header = [0u8; crate::transport::frame::HEADER_LEN];
        let chunk = vec![1u8; crate::transport::stream::CHUNK];
        let mut head = 0;
        let mut n = 0;
        while writer.try_write(0, &[&header, &chunk], &mut head) {
            n += 1;
        }
        assert_eq!(n, 4);
        assert_eq!(owner.drain(0, |_| {}), 4);
    }

    #[test]
    fn a_segment_of_someone_else_is_refused() {
        let nonce = 99u64;
        let path = PathBuf::from(format!("/dev/shm/distcomm-{}-p2p-test-refuse", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let _a = RingSegment::create(&path, 2, nonce).unwrap();
        assert!(RingSegment::open(&path, 2, nonce + 1).is_err());
        assert!(RingSegment::open(&path, 3, nonce).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
