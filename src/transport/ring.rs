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
//! Memory: one ring of `R(L)` bytes per same-host peer and rank, `L` being the ranks of the
//! host; rings only while they fit a cap on the host's sum:
//!
//! ```text
//! bytes(L) = L (4096 + (L - 1) (512 + R(L)))        (every rank's segment, all mapped by all)
//! R(L)     = the largest of 256, 128, 64, 32 KiB with bytes(L) <= RING_CAP (32 MiB)
//! ```
//!
//! so 256 KiB rings up to 11 ranks (0.5 MiB at 2, 3.0 MiB at 4, 14.1 MiB at 8), 128 KiB up to
//! 16 (30.2 MiB), 64 KiB up to 23, 32 KiB up to 32 (31.6 MiB), and from 33 ranks on a host no
//! rings at all: same-host pairs keep their socket (single-copy from `DC_CMA_MIN` bytes). The
//! cap leaves a 64 MiB /dev/shm (Docker's default) room for the collective arena of 16 ranks.
//! Message bodies up to a quarter of the ring travel inside it (`inline_max`) and streams use
//! chunks a little under that (`stream_chunk`): the size is the segment's, read from its
//! header, not a constant. One writer at a time per ring (the sender serialises its threads),
//! one reader at a time (the owner serialises its threads).

use crate::error::{Error, Result, Status};
use super::shm::{create_segment_file, map_segment, open_segment_file, prefetch_line};
use memmap2::MmapMut;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// Bytes of frames one ring holds at most (few ranks on a host).
pub const MAX_RING_BYTES: usize = 256 * 1024;
/// The smallest ring: below that, no rings (see the module comment).
pub const MIN_RING_BYTES: usize = 32 * 1024;
/// What the rings of all ranks of a host may take of /dev/shm together.
pub const RING_CAP: usize = 32 << 20;
const MAGIC: u64 = 0x4443_5249_4e47_0001; // "DCRING"
const LINE: usize = 128;
const SEG_HEADER: usize = 4096;
/// Per ring: the writer's position, the reader's position, the doorbell flag and the writer's
/// "waiting for room" flag, a line each.
const RING_HEADER: usize = 4 * LINE;
/// Every record starts with its total length; this bit marks padding up to the ring's end.
const PAD: u64 = 1 << 63;
const LEN_WORD: usize = 8;
const ALIGN: usize = 64;
/// The largest record whose lines `has_records` asks for ahead.
const PREFETCH_MAX: usize = 10 * ALIGN;

#[repr(C)]
struct SegHeader {
    magic: AtomicU64,
    nonce: AtomicU64,
    rings: AtomicU32,
    ring_bytes: AtomicU32,
    _pad: [u8; LINE - 24],
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
    _pad4: [u8; LINE - 4],
    /// The CPU the owner's waiting thread last ran on, plus one (see `crate::placement`).
    cpu: AtomicU32,
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
    /// Bytes of frames each ring holds.
    ring_bytes: usize,
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

fn check_ring_bytes(ring_bytes: usize) -> Result<()> {
    // A power of two: offsets in the ring are masked, not divided (a 64-bit division takes
    // tens of cycles, and every write, read and look at a ring made one or two).
    if !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes) || !ring_bytes.is_power_of_two() {
        return Err(Error::new(Status::Internal, format!("ring of {ring_bytes} bytes (a power of two from {MIN_RING_BYTES} to {MAX_RING_BYTES} expected)")));
    }
    Ok(())
}

/// Bytes of the segments of all `local` ranks of a host (each with a ring per other rank) with
/// rings of `ring_bytes`.
pub fn host_bytes(local: usize, ring_bytes: usize) -> usize {
    local * segment_bytes(local.saturating_sub(1), ring_bytes)
}

/// Bytes of one rank's segment of `rings` rings of `ring_bytes`.
pub fn segment_bytes(rings: usize, ring_bytes: usize) -> usize {
    SEG_HEADER + rings * (RING_HEADER + ring_bytes)
}

/// The ring size for `local` ranks on a host (us included), or None where even the smallest
/// rings would take more than `RING_CAP` (see the module comment).
pub fn ring_bytes_for(local: usize) -> Option<usize> {
    let mut r = MAX_RING_BYTES;
    while r >= MIN_RING_BYTES {
        if host_bytes(local, r) <= RING_CAP {
            return Some(r);
        }
        r /= 2;
    }
    None
}

impl RingSegment {
    /// Creates and maps a segment of `rings` empty rings of `ring_bytes` each (a power of
    /// two from `MIN_RING_BYTES` to `MAX_RING_BYTES`), all reserved before it is touched.
    pub fn create(path: &Path, rings: usize, ring_bytes: usize, nonce: u64) -> Result<RingSegment> {
        check_ring_bytes(ring_bytes)?;
        let file = create_segment_file(path, segment_bytes(rings, ring_bytes))?;
        let map = map_segment(&file, "ring segment", 0)?;
        let seg = RingSegment { map, rings, ring_bytes };
        let h = seg.header();
        h.nonce.store(nonce, Ordering::Relaxed);
        h.rings.store(rings as u32, Ordering::Relaxed);
        h.ring_bytes.store(ring_bytes as u32, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Maps a peer's segment, checking that it is the one the peer announced (its size, which
    /// the file must have before it is mapped, included).
    pub fn open(path: &Path, rings: usize, ring_bytes: usize, nonce: u64) -> Result<RingSegment> {
        check_ring_bytes(ring_bytes)?;
        let file = open_segment_file(path, segment_bytes(rings, ring_bytes))?;
        let map = map_segment(&file, "ring segment", 0)?;
        let seg = RingSegment { map, rings, ring_bytes };
        let h = seg.header();
        if h.magic.load(Ordering::Acquire) != MAGIC
            || h.nonce.load(Ordering::Relaxed) != nonce
            || h.rings.load(Ordering::Relaxed) as usize != rings
            || h.ring_bytes.load(Ordering::Relaxed) as usize != ring_bytes
        {
            return Err(Error::new(Status::Unavailable, "ring segment belongs to someone else"));
        }
        Ok(seg)
    }

    /// Bytes of frames each ring holds.
    pub fn ring_bytes(&self) -> usize {
        self.ring_bytes
    }

    /// Bytes of the mapping.
    pub fn bytes(&self) -> usize {
        self.map.len()
    }

    /// Message bodies up to this size travel inside the ring; larger ones single-copy (or are
    /// streamed).
    pub fn inline_max(&self) -> usize {
        self.ring_bytes / 4
    }

    /// Bytes of message per streamed chunk: a little under `inline_max`, so that four chunk
    /// records (frame header and length word included) fill the ring (see `stream`).
    pub fn stream_chunk(&self) -> usize {
        self.inline_max() - 128
    }

    fn header(&self) -> &SegHeader {
        // SAFETY: the map is at least SEG_HEADER bytes, page aligned; SegHeader is atomics.
        unsafe { &*(self.map.as_ptr() as *const SegHeader) }
    }

    fn ring_header(&self, i: usize) -> &RingHeader {
        assert!(i < self.rings);
        // SAFETY: in bounds (checked), line aligned, atomics only.
        unsafe { &*(self.map.as_ptr().add(SEG_HEADER + i * (RING_HEADER + self.ring_bytes)) as *const RingHeader) }
    }

    fn data(&self, i: usize) -> *mut u8 {
        // SAFETY: in bounds (ring_header checked i).
        unsafe { (self.map.as_ptr() as *mut u8).add(SEG_HEADER + i * (RING_HEADER + self.ring_bytes) + RING_HEADER) }
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
        let ring = self.ring_bytes;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let need = round_up(LEN_WORD + len);
        assert!(need <= ring / 2, "record of {len} bytes is too large for the ring");
        let h = self.ring_header(i);
        let tail = h.tail.load(Ordering::Relaxed);
        let off = tail as usize & (ring - 1);
        let to_end = ring - off;
        let pad = if need > to_end { to_end } else { 0 };
        // Room for the record and the zeroed word after it.
        let fits = |head: u64| (tail - head) as usize + pad + need + ALIGN <= ring;
        if !fits(*head) {
            *head = h.head.load(Ordering::Acquire);
            if !fits(*head) {
                return false;
            }
        }
        let data = self.data(i);
        let at = if pad > 0 { 0 } else { off };
        let next = (at + need) & (ring - 1);
        // SAFETY: [at, at + need) and the word at `next` are free (checked against head, with
        // one ALIGN to spare); `at`, `next` and `off` are 64-aligned and below the ring's size.
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
    /// `off` must be 8-aligned and below the ring's size - 8, `data` a ring's data pointer.
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

    /// Whether ring `i` has records to read. If the next one is small but spans more cache
    /// lines than the one its length word lies in, asks for the rest now: their transfers from
    /// the writer's core then overlap the reader's locking and matching instead of following
    /// them (a 32-512 B exchange about 10% faster; for larger records the copy dominates and
    /// asking ahead measured level or worse).
    pub fn has_records(&self, i: usize) -> bool {
        let (h, ring) = (self.ring_header(i), self.ring_bytes);
        let off = h.head.load(Ordering::Relaxed) as usize & (ring - 1);
        let data = self.data(i);
        // SAFETY: head is 64-aligned; the word is only accessed atomically.
        let word = unsafe { self.len_word(data, off) }.load(Ordering::Acquire);
        if word > ALIGN as u64 && word <= PREFETCH_MAX as u64 {
            // Not padding (its bit is above PREFETCH_MAX); within the ring (checked).
            let end = off + (word as usize).min(ring - off);
            // SAFETY: [off, end) lies within the ring; a prefetch reads nothing.
            (off + ALIGN..end).step_by(ALIGN).for_each(|at| prefetch_line(unsafe { data.add(at) }));
        }
        word != 0
    }

    /// Consumes every record of ring `i` in order, handing each (without its length word) to
    /// `f`; a record's space is released once `f` returns. The caller is the only reader.
    pub fn drain(&self, i: usize, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while self.take_next(i, |rec| {
            f(rec);
            true
        }) {
            n += 1;
        }
        n
    }

    /// Hands the next record of ring `i` (without its length word) to `take` and consumes it
    /// if `take` says so (padding before it is consumed either way); whether it was consumed
    /// (false also when the ring is empty). The caller is the only reader.
    pub fn take_next(&self, i: usize, take: impl FnOnce(&[u8]) -> bool) -> bool {
        let h = self.ring_header(i);
        if h.bell.load(Ordering::Relaxed) != 0 {
            // A doorbell is pending: clear it before looking, so a writer that comes after the
            // look rings again.
            h.bell.store(0, Ordering::SeqCst);
            fence(Ordering::SeqCst);
        }
        let (data, ring) = (self.data(i), self.ring_bytes);
        let mut head = h.head.load(Ordering::Relaxed);
        let (off, size) = loop {
            let off = head as usize & (ring - 1);
            // SAFETY: off is 64-aligned and below the ring's size.
            let word = unsafe { self.len_word(data, off) }.load(Ordering::Acquire);
            if word == 0 {
                return false;
            }
            let size = (word & !PAD) as usize;
            // Every record, padding included, is a positive multiple of ALIGN.
            if size > ring - off || size % ALIGN != 0 || size == 0 {
                // Only a broken writer produces this: stop reading this ring rather than misread.
                return false;
            }
            if word & PAD == 0 {
                break (off, size);
            }
            head += size as u64;
            h.head.store(head, Ordering::Release);
        };
        // SAFETY: the record lies within the ring (checked) and stays until head moves.
        if !take(unsafe { std::slice::from_raw_parts(data.add(off + LEN_WORD), size - LEN_WORD) }) {
            return false;
        }
        h.head.store(head + size as u64, Ordering::Release);
        true
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

    /// Where the owner's waiting thread runs (see `crate::placement`): the owner writes it,
    /// peers waiting for the owner read it.
    pub fn cpu_word(&self) -> &AtomicU32 {
        &self.header().cpu
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
        seg_of(rings, MAX_RING_BYTES)
    }

    fn seg_of(rings: usize, ring_bytes: usize) -> (RingSegment, RingSegment, PathBuf) {
        let nonce = 0x1234_5678_9abc_def0 ^ u64::from(std::process::id());
        let path = PathBuf::from(format!("/dev/shm/distcomm-{}-p2p-test-{rings}-{ring_bytes}-{nonce:x}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let a = RingSegment::create(&path, rings, ring_bytes, nonce).unwrap();
        let b = RingSegment::open(&path, rings, ring_bytes, nonce).unwrap();
        std::fs::remove_file(&path).unwrap();
        (a, b, path)
    }

    #[test]
    fn records_arrive_whole_and_in_order_across_the_wrap() {
        for ring_bytes in [MAX_RING_BYTES, MIN_RING_BYTES] {
            records_wrap(ring_bytes);
        }
    }

    fn records_wrap(ring_bytes: usize) {
        let (owner, writer, _) = seg_of(2, ring_bytes);
        let mut next_in = 0u32;
        let mut next_out = 0u32;
        let mut head = 0;
        // Sizes that do not divide the ring, so records wrap with padding many times.
        for round in 0..200 {
            let blen = (round * 977) % (ring_bytes / 13);
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
        let big = vec![7u8; writer.inline_max()];
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
        assert_eq!(owner.drain(0, |r| assert_eq!(r.len(), round_up(LEN_WORD + big.len()) - LEN_WORD)), 3);
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
        let mut r = MAX_RING_BYTES;
        while r >= MIN_RING_BYTES {
            let (owner, writer, _) = seg_of(1, r);
            let header = [0u8; crate::transport::frame::HEADER_LEN];
            let chunk = vec![1u8; writer.stream_chunk()];
            let mut head = 0;
            let mut n = 0;
            while writer.try_write(0, &[&header, &chunk], &mut head) {
                n += 1;
            }
            assert_eq!(n, 4, "ring of {r} bytes");
            assert_eq!(owner.drain(0, |_| {}), 4);
            r /= 2;
        }
    }

    #[test]
    fn ring_sizes_shrink_with_the_ranks_and_stop_under_the_cap() {
        assert_eq!(ring_bytes_for(2), Some(MAX_RING_BYTES));
        assert_eq!(ring_bytes_for(8), Some(MAX_RING_BYTES));
        assert_eq!(ring_bytes_for(16), Some(128 << 10));
        assert_eq!(ring_bytes_for(32), Some(MIN_RING_BYTES));
        assert_eq!(ring_bytes_for(33), None);
        assert_eq!(ring_bytes_for(1024), None);
        let mut last = MAX_RING_BYTES;
        for l in 2..=64 {
            if let Some(r) = ring_bytes_for(l) {
                assert!(r <= last && host_bytes(l, r) <= RING_CAP, "{l} ranks");
                last = r;
            }
        }
        assert_eq!(host_bytes(2, MAX_RING_BYTES), 2 * (4096 + 512 + MAX_RING_BYTES));
    }

    #[test]
    fn a_segment_too_large_for_dev_shm_is_refused_and_not_left_behind() {
        // Only on a size-limited tmpfs, which refuses a reservation larger than itself at once.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a writable struct.
        if unsafe { libc::statfs(c"/dev/shm".as_ptr(), &mut st) } != 0 || st.f_type != libc::TMPFS_MAGIC || st.f_blocks == 0 {
            return;
        }
        let total = st.f_blocks as usize * st.f_bsize as usize;
        let path = PathBuf::from(format!("/dev/shm/distcomm-{}-p2p-test-huge", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let rings = total / (RING_HEADER + MIN_RING_BYTES) + 16;
        let e = RingSegment::create(&path, rings, MIN_RING_BYTES, 1).err().expect("more than /dev/shm reserved");
        assert!(e.msg.contains("needed") && e.msg.contains("free"), "{}", e.msg);
        assert!(!path.exists());
    }

    #[test]
    fn a_segment_of_someone_else_is_refused() {
        let nonce = 99u64;
        let path = PathBuf::from(format!("/dev/shm/distcomm-{}-p2p-test-refuse", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let _a = RingSegment::create(&path, 2, MIN_RING_BYTES, nonce).unwrap();
        assert!(RingSegment::open(&path, 2, MIN_RING_BYTES, nonce + 1).is_err());
        assert!(RingSegment::open(&path, 3, MIN_RING_BYTES, nonce).is_err(), "longer than the file");
        assert!(RingSegment::open(&path, 1, MIN_RING_BYTES, nonce).is_err(), "shorter than the file");
        assert!(RingSegment::open(&path, 1, 2 * MIN_RING_BYTES, nonce).is_err(), "other ring size");
        assert!(RingSegment::open(&path, 2, MIN_RING_BYTES, nonce).is_ok());
        std::fs::remove_file(&path).unwrap();
    }
}
