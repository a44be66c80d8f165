//! Shared-memory arena of one communicator whose members share a host: per-rank flags and
//! staging slots plus shared result slots, in one segment under /dev/shm that is unlinked as soon
//! as every member has mapped it (so a crash leaves nothing behind).
//!
//! Steps: every collective on the arena is a sequence of numbered steps, the same on every rank.
//! At step `s` a rank writes its staging slot `s % SLOTS`, publishes `stage = s`, and waits until
//! every rank has published at least `s`; two-phase steps then publish `result = s` likewise.
//! A rank that reached step `s` has finished step `s - 1`, so with two slots nobody overwrites
//! data that a peer may still read. A step whose staging fits a part of a slot may take part
//! `(s / SLOTS) % PARTS` of slot `s % SLOTS` instead (`my_part`): a part is reused only every
//! `SLOTS * PARTS` steps, so its writer runs that many steps ahead of its readers unless a whole
//! slot of that parity was used since (see `Steps::part_needs`). The algorithms live in
//! `coll::shm`; this file knows only memory, flags and waiting.
//!
//! Eager mailboxes: small collectives do not step. Each rank has `E` mailbox slots (see Size),
//! used round-robin by collective number; a writer (the root of a broadcast, the contributors
//! of a reduce, everyone in an allreduce...) fills its slot for collective `c` and stamps it
//! `c` with what it calls, and the readers wait for that stamp. Stepped collectives stamp their
//! slot too, so that the members can check that they agree. A slot is reused for collective
//! `c + E` only once every rank has finished collective `c` (each rank publishes the
//! last collective it finished), so writers run up to `E` collectives ahead of the
//! slowest reader. Up to `LARGE_EAGER_MAX_RANKS` ranks, each rank also has `LARGE_EAGER_SLOTS`
//! large mailbox slots (`LARGE_EAGER_BYTES` of data, no header): the stamp stays in the small
//! slot, marked (`LARGE`) to say where the data went. Where every rank has a core, only
//! `SHALLOW_LARGE_SLOTS` of them are used in turn, for data past `SHALLOW_LARGE_FROM` (slots
//! that stay in cache, see there); where the ranks outnumber the cores, all of them, for data
//! past `EAGER_BYTES` (writers run further ahead of readers that wait for a core). Small data
//! keeps the small slots' compact layout (a 16 B allreduce touches the same lines and pages as
//! without them).
//!
//! Waiting spins briefly, yields, then sleeps on a futex in the segment (with a sleeper count so
//! writers only pay for a wake-up when someone sleeps), always with a deadline and an interrupt
//! check (abort, peer loss).
//!
//! Size: for `n` ranks with `E(n)` mailbox slots each and staging slots of `C(n)` bytes,
//!
//! ```text
//! bytes(n) = 4096 + 384 n + 2112 n E(n) + 4096 n L(n) + (2n + 2) C(n)
//! E(n)     = 64 for n <= 128, else max(8, 8192 / n rounded down to a power of two)
//! L(n)     = 16 for n <= 64, else 0
//! C(n)     = clamp(floor4K((64 MiB - 4096 - 384 n - 2112 n E(n) - 4096 n L(n)) / (2n + 2)), C_min(n), 256 KiB)
//! C_min(n) = ceil4K(max(8 n, 4096))   (one 8-byte element per rank's share of a chunk)
//! ```
//!
//! (never exactly `16 n`, see `chunk_for`). So the arena has 256 KiB chunks and 64 slots up to
//! 100 ranks (1.9 MiB at 2, 11.6 MiB at 16, 44.8 MiB at 64) and stays within `ARENA_CAP` (64
//! MiB) above as long as the floor does not bind: 62.8 MiB at 256 (92 KiB chunks, 32 slots),
//! 56.9 MiB at 1024 (20 KiB chunks, 8 slots); from about 1500 ranks the floor makes it grow
//! as about `32 n^2` bytes (97.8 MiB at 2048). `DC_SHM_CHUNK` replaces `C(n)` (still at least
//! `C_min(n)`). The segment is reserved with `posix_fallocate` before anyone touches it (see
//! `create_segment_file`), so a /dev/shm too small for it makes the comm use sockets instead of
//! raising SIGBUS inside a collective.

use crate::completion::{Backoff, Pace};
use crate::placement::Seats;
use crate::error::{Error, Result, Status};
use memmap2::MmapMut;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Double buffering is enough (see the module comment).
pub const SLOTS: usize = 2;
/// Parts of a staging slot that steps staging little (a small broadcast) take in turn, so that
/// a writer may run up to `SLOTS * PARTS - 1` steps ahead of its readers (see `Steps`).
pub const PARTS: usize = 16;
const MAGIC: u64 = 0x4443_5348_4d31_0001; // "DCSHM1"
const LINE: usize = 128;
const HEADER_BYTES: usize = 4096;

/// The default staging slot size: a few of them fit in one core's L2 cache.
pub const DEFAULT_CHUNK: usize = 256 * 1024;

const MAX_SLEEP: Duration = Duration::from_millis(20);

/// Mailbox slots per rank at up to 128 ranks (how far a writer of small collectives may run
/// ahead); fewer above (see `eager_slots`).
pub const EAGER_SLOTS: usize = 64;
/// The fewest mailbox slots per rank, however many ranks.
const MIN_EAGER_SLOTS: usize = 8;
/// What the arena may take of /dev/shm where its floor allows (see the module comment).
pub const ARENA_CAP: usize = 64 << 20;
const PAGE: usize = 4096;
/// Bytes of data a mailbox slot holds: collectives whose posted data fits go through the
/// mailboxes (see `coll::shm::ShmRun::run_eager`).
pub const EAGER_BYTES: usize = 2048;
/// Bytes of data a large mailbox slot holds (see the module comment): up to this, collectives
/// of at most `LARGE_EAGER_MAX_RANKS` ranks go through the mailboxes. Measured against staging
/// them (2 ranks, dc-bench, full LTO, 7 interleaved rounds, medians of new/old time at 3 / 4
/// KiB): allreduce 0.55-0.57 / 0.52, reduce 0.65 / 0.61, broadcast 0.73-0.74 / 0.73-0.74.
pub const LARGE_EAGER_BYTES: usize = 4096;
/// Large mailbox slots per rank: where the ranks outnumber the cores, a writer of such data
/// runs up to this many collectives ahead (a rank that loses its core is caught up with later).
const LARGE_EAGER_SLOTS: usize = 16;
/// The large slots in turn where every rank has a core: four slots of 4 KiB stay in the
/// writer's and the readers' L1 caches, sixteen do not. A writer refilling slots its readers
/// evicted long ago waits on every line: 2 ranks, a loop of 4 KiB copies through rotating
/// slots took 0.26 us with 2-4 slots and 0.49 with 8-64 (C, this VM). With a busy process
/// beside the 2 ranks, four slots were no slower than sixteen; with 4 ranks on 2 cores they
/// were 2-3x slower at 1-4 KiB broadcasts, hence only where every rank has a core.
const SHALLOW_LARGE_SLOTS: usize = 4;
/// With `SHALLOW_LARGE_SLOTS`, the data past this goes to the large slots (the small ones, 64
/// rotating, were slower from there: 2 KiB broadcast 0.34 against 0.22 us, allreduce 0.50
/// against 0.39-0.43; below, the two were level).
const SHALLOW_LARGE_FROM: usize = 1024;
/// The most ranks an arena has large mailbox slots for (4 MiB of them at 64 ranks).
const LARGE_EAGER_MAX_RANKS: usize = 64;
/// The bit of a slot header's size that says the data is in the rank's large slot.
const LARGE: u64 = 1 << 63;
/// A slot: its stamp, signature and length, then the data, the first `IN_STAMP_LINE` bytes of
/// which share the stamp's cache line (a reader of a small broadcast fetches one line).
const SLOT_HEADER: usize = 16;
pub const IN_STAMP_LINE: usize = 64 - SLOT_HEADER;
const EAGER_STRIDE: usize = (SLOT_HEADER + EAGER_BYTES).div_ceil(64) * 64;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    nonce: AtomicU64,
    ranks: AtomicU32,
    chunk: AtomicU32,
    /// Waiters currently asleep on some flag of this arena.
    sleepers: AtomicU32,
    eager: AtomicU32,
    /// Large mailbox slots in turn, as the creator chose (`Layout::large_ring`).
    large_ring: AtomicU32,
}

/// Where things are in the segment.
#[derive(Debug, Clone, Copy)]
struct Layout {
    ranks: usize,
    chunk: usize,
    /// Mailbox slots per rank.
    eager: usize,
    flags_off: usize,
    /// Per rank a line: the last collective it finished (for mailbox reuse).
    done_off: usize,
    mailbox_off: usize,
    /// Large mailbox slots per rank (0 or `LARGE_EAGER_SLOTS`), and where they start.
    large: usize,
    /// How many of them are used in turn (`SHALLOW_LARGE_SLOTS` or all; a power of two):
    /// chosen by the segment's creator, read from the header by the other members.
    large_ring: usize,
    large_off: usize,
    staging_off: usize,
    result_off: usize,
    total: usize,
}

impl Layout {
    fn new(ranks: usize, chunk: usize) -> Layout {
        let eager = eager_slots(ranks);
        assert!(eager.is_power_of_two(), "mailbox slots are masked (see `slot`)");
        let flags_off = HEADER_BYTES;
        let done_off = flags_off + ranks * 2 * LINE;
        let mailbox_off = done_off + ranks * LINE;
        let large = if ranks <= LARGE_EAGER_MAX_RANKS { LARGE_EAGER_SLOTS } else { 0 };
        let large_off = mailbox_off + ranks * eager * EAGER_STRIDE;
        let staging_off = large_off + ranks * large * LARGE_EAGER_BYTES;
        let result_off = staging_off + ranks * SLOTS * chunk;
        let total = result_off + SLOTS * chunk;
        let large_ring = if crate::completion::oversubscribed() { large } else { large.min(SHALLOW_LARGE_SLOTS) };
        Layout { ranks, chunk, eager, flags_off, done_off, mailbox_off, large, large_ring, large_off, staging_off, result_off, total }
    }

    /// Whether data of `len` bytes goes to a large mailbox slot.
    fn in_large_slot(&self, len: usize) -> bool {
        let from = if self.large_ring < self.large { SHALLOW_LARGE_FROM } else { EAGER_BYTES };
        self.large > 0 && len > from
    }
}

fn pow2_floor(x: usize) -> usize {
    if x == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - x.leading_zeros())
    }
}

/// Mailbox slots per rank for `ranks` ranks: `EAGER_SLOTS` up to 128 ranks, then halving as the
/// ranks double (about 16.5 MiB of mailboxes from 128 to 1024 ranks), never below 8.
pub fn eager_slots(ranks: usize) -> usize {
    if ranks <= 128 {
        EAGER_SLOTS
    } else {
        pow2_floor(8192 / ranks).clamp(MIN_EAGER_SLOTS, EAGER_SLOTS)
    }
}

/// The smallest staging slot the algorithms of `coll::shm` work with for `ranks` ranks: the
/// chunked allreduce and reduce_scatter give each rank a share of at least one element (8 bytes
/// at most) of every chunk; a page at least.
pub fn min_chunk(ranks: usize) -> usize {
    (8 * ranks).max(PAGE).div_ceil(PAGE) * PAGE
}

/// The staging slot size for `ranks` ranks: `requested` (`DC_SHM_CHUNK`, rounded down to 64
/// bytes) or else the largest multiple of 4 KiB up to `DEFAULT_CHUNK` that keeps the arena
/// within `ARENA_CAP`; never below `min_chunk`.
pub fn chunk_for(ranks: usize, requested: Option<usize>) -> usize {
    let ranks = ranks.max(1);
    let chunk = match requested {
        Some(c) => c.clamp(PAGE, 64 << 20) / 64 * 64,
        None => {
            let fixed = Layout::new(ranks, 0).total;
            (ARENA_CAP.saturating_sub(fixed) / (2 * ranks + 2) / PAGE * PAGE).min(DEFAULT_CHUNK)
        }
    };
    chunk.max(min_chunk(ranks))
}

/// Bytes of the arena of `ranks` ranks with staging slots of `chunk` bytes.
pub fn arena_bytes(ranks: usize, chunk: usize) -> usize {
    Layout::new(ranks, chunk).total
}

/// A mailbox slot's header line.
#[repr(C)]
struct SlotHeader {
    /// The collective (number, wrapping) whose data the slot holds.
    stamp: AtomicU32,
    sig: AtomicU32,
    len: AtomicU64,
}

/// Which flag of a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    Stage = 0,
    Result = 1,
}

pub struct Arena {
    map: MmapMut,
    layout: Layout,
    rank: usize,
    /// The oldest collective every other rank had finished when we last looked (their done
    /// words are read only when this is not recent enough for the slot we want to reuse).
    all_done: AtomicU32,
}

// SAFETY: all cross-thread/process access goes through atomics or through slots whose ownership
// the step protocol hands over with release/acquire flag updates.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

/// `a` is at or past `b` in wrapping step order.
fn reached(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) >= 0
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: word lives in a shared mapping that outlives the call; a shared (non-private)
    // futex because other processes wake it.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec, std::ptr::null::<u32>(), 0);
    }
}

fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: as above.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, std::ptr::null::<libc::timespec>(), std::ptr::null::<u32>(), 0);
    }
}

/// Segments mapped by at most this many ranks are faulted in when mapped (see `map_segment`).
const POPULATE_MAX_RANKS: usize = 128;

/// Maps a segment file shared. With few `ranks` every page is faulted in now (MAP_POPULATE):
/// otherwise the first touch of each page costs a fault inside a collective or a message (64
/// mailbox slots take dozens of pages, met during a job's first calls). With many, each rank
/// touches a small part of a large segment, and populating all of it in every rank (1024 thread
/// ranks: 15 million page-table entries) would cost seconds of init.
pub fn map_segment(file: &File, what: &str, ranks: usize) -> Result<MmapMut> {
    let mut opts = memmap2::MmapOptions::new();
    if ranks <= POPULATE_MAX_RANKS {
        opts.populate();
    }
    // SAFETY: the file is ours (0600, unique name); concurrent modification by the other
    // members is the point and is mediated by atomics.
    unsafe { opts.map_mut(file) }.map_err(|e| Error::system(format!("mmap {what}"), e))
}

/// A segment name no other job uses: our pid (for reclaiming after a crash) and the comm id.
pub fn segment_path(ctx: u64) -> PathBuf {
    PathBuf::from(format!("/dev/shm/distcomm-{}-{:016x}", std::process::id(), ctx))
}

/// Removes segments left by processes that died between creating and unlinking them.
pub fn reclaim_stale_segments() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("distcomm-")) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Bytes free for an unprivileged user in the file system holding `dir` (`statvfs`).
pub fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a writable struct.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Formats a byte count for messages: "11.1 MiB (11639808 bytes)".
pub fn show_bytes(b: u64) -> String {
    format!("{:.1} MiB ({b} bytes)", b as f64 / (1u64 << 20) as f64)
}

/// Asks the CPU to bring the cache line at `p` into our cache without waiting for it (a hint:
/// it never faults, and does nothing where the target has no such instruction).
#[inline(always)]
pub(super) fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch changes no memory and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Creates a new segment file of `len` bytes that only we may open (0600, never an existing
/// one), with all of its pages reserved now (`posix_fallocate`): a file system too small for it
/// (a full or small /dev/shm, as in a container) fails here, with an error saying how much is
/// needed and free, instead of with SIGBUS at the first touch of a page it cannot supply. On
/// failure the file is gone again.
pub(crate) fn create_segment_file(path: &std::path::Path, len: usize) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::system(format!("create {}", path.display()), e))?;
    let fail = |e: Error| {
        let _ = std::fs::remove_file(path);
        Err(e)
    };
    let rc = loop {
        // SAFETY: a file descriptor we own.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if rc != libc::EINTR {
            break rc;
        }
    };
    match rc {
        0 => Ok(file),
        // A file system that cannot reserve (not tmpfs): size it without the guarantee.
        libc::EOPNOTSUPP | libc::ENOSYS => match file.set_len(len as u64) {
            Ok(()) => Ok(file),
            Err(e) => fail(Error::system("size shared-memory segment", e)),
        },
        rc => {
            let dir = path.parent().unwrap_or(std::path::Path::new("/"));
            let free = free_bytes(dir).map_or("unknown".to_string(), show_bytes);
            let why = std::io::Error::from_raw_os_error(rc);
            fail(Error::new(
                Status::Unavailable,
                format!("cannot reserve {} in {} ({why}): {} needed, {free} free", path.display(), dir.display(), show_bytes(len as u64)),
            ))
        }
    }
}

/// Opens a segment file another process created, which must be `len` bytes long.
pub(crate) fn open_segment_file(path: &std::path::Path, len: usize) -> Result<File> {
    let file = OpenOptions::new().read(true).write(true).open(path).map_err(|e| Error::system(format!("open {}", path.display()), e))?;
    let actual = file.metadata().map_err(|e| Error::system("stat segment", e))?.len();
    if actual != len as u64 {
        return Err(Error::new(Status::Unavailable, "shared-memory segment has an unexpected size"));
    }
    Ok(file)
}

impl Arena {
    /// Creates and maps the segment (the comm's rank 0).
    pub fn create(path: &PathBuf, ranks: usize, chunk: usize, nonce: u64) -> Result<Arena> {
        let layout = Layout::new(ranks, chunk);
        let file = create_segment_file(path, layout.total)?;
        let arena = Arena::map(&file, layout, 0)?;
        let h = arena.header();
        h.nonce.store(nonce, Ordering::Relaxed);
        h.ranks.store(ranks as u32, Ordering::Relaxed);
        h.chunk.store(chunk as u32, Ordering::Relaxed);
        h.eager.store(layout.eager as u32, Ordering::Relaxed);
        h.large_ring.store(layout.large_ring as u32, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
        Ok(arena)
    }

    /// Maps a segment another member created, checking that it is the one we were told about.
    pub fn open(path: &PathBuf, ranks: usize, chunk: usize, nonce: u64, rank: usize) -> Result<Arena> {
        let layout = Layout::new(ranks, chunk);
        let file = open_segment_file(path, layout.total)?;
        let mut arena = Arena::map(&file, layout, rank)?;
        let h = arena.header();
        // The creator's choice, whatever ours would be: the ranks must take the same slots.
        let ring = h.large_ring.load(Ordering::Relaxed) as usize;
        let ring_fits = (layout.large == 0 && ring == 0) || (ring.is_power_of_two() && ring <= layout.large);
        let same_layout = ring_fits && h.ranks.load(Ordering::Relaxed) as usize == ranks && h.chunk.load(Ordering::Relaxed) as usize == chunk && h.eager.load(Ordering::Relaxed) as usize == layout.eager;
        if h.magic.load(Ordering::Acquire) != MAGIC || h.nonce.load(Ordering::Relaxed) != nonce || !same_layout {
            return Err(Error::new(Status::Unavailable, "shared-memory segment belongs to someone else"));
        }
        arena.layout.large_ring = ring;
        Ok(arena)
    }

    fn map(file: &File, layout: Layout, rank: usize) -> Result<Arena> {
        let map = map_segment(file, "shared-memory segment", layout.ranks)?;
        Ok(Arena { map, layout, rank, all_done: AtomicU32::new(0) })
    }

    pub fn ranks(&self) -> usize {
        self.layout.ranks
    }

    /// The random number rank 0 gave the segment when it made it: names it among a process's
    /// arenas (see `comm::arena_pool`).
    pub fn nonce(&self) -> u64 {
        self.header().nonce.load(Ordering::Relaxed)
    }

    /// Makes this rank's part of the arena as it was when the segment was new, for a new
    /// communicator of the same members that takes the arena over from a destroyed one: its
    /// flags, its done line (with the left mark; on rank 0 the abort and lost marks too) and
    /// its mailbox stamps. Only once every member destroyed the old communicator, and before
    /// any member uses the arena again (the set-up's collectives order both).
    pub fn reset_mine(&self) {
        let zero_line = |off: usize| {
            for i in 0..LINE / 4 {
                // SAFETY: in bounds (a whole line of the layout), aligned; atomics only.
                unsafe { &*(self.base().add(off + 4 * i) as *const AtomicU32) }.store(0, Ordering::Relaxed);
            }
        };
        zero_line(self.layout.flags_off + self.rank * 2 * LINE);
        zero_line(self.layout.flags_off + (self.rank * 2 + 1) * LINE);
        zero_line(self.layout.done_off + self.rank * LINE);
        for c in 0..self.layout.eager as u32 {
            let (h, _) = self.slot(self.rank, c);
            h.stamp.store(0, Ordering::Relaxed);
            h.sig.store(0, Ordering::Relaxed);
            h.len.store(0, Ordering::Relaxed);
        }
        self.all_done.store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Bytes per staging slot.
    pub fn chunk(&self) -> usize {
        self.layout.chunk
    }

    /// Mailbox slots per rank.
    pub fn eager_slots(&self) -> usize {
        self.layout.eager
    }

    /// Size of the mapping (for the memory-use documentation and tests).
    pub fn bytes(&self) -> usize {
        self.layout.total
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (page aligned, all-atomic fields).
        unsafe { &*(self.map.as_ptr() as *const Header) }
    }

    fn flag(&self, rank: usize, f: Flag) -> &AtomicU32 {
        let off = self.layout.flags_off + (rank * 2 + f as usize) * LINE;
        // SAFETY: in bounds and 4-byte aligned; only accessed atomically.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }

    fn base(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }

    /// This rank's staging slot for step `s` (writable until it publishes `s`).
    #[allow(clippy::mut_from_ref)]
    pub fn my_stage(&self, s: u32) -> &mut [u8] {
        let off = self.layout.staging_off + (self.rank * SLOTS + s as usize % SLOTS) * self.layout.chunk;
        // SAFETY: the step protocol makes this rank the only user of its slot for step s until
        // it publishes; callers do not keep the slice past the step.
        unsafe { std::slice::from_raw_parts_mut(self.base().add(off), self.layout.chunk) }
    }

    /// Rank `r`'s staging slot for step `s` (readable once every rank published `s`).
    pub fn stage(&self, r: usize, s: u32) -> &[u8] {
        let off = self.layout.staging_off + (r * SLOTS + s as usize % SLOTS) * self.layout.chunk;
        // SAFETY: in bounds; read-only while the step protocol guarantees no writer.
        unsafe { std::slice::from_raw_parts(self.base().add(off), self.layout.chunk) }
    }

    /// This rank's part of its staging slot for a step that stages at most `part_bytes` (see
    /// the module comment); writable until it publishes `s`.
    #[allow(clippy::mut_from_ref)]
    pub fn my_part(&self, s: u32) -> &mut [u8] {
        let (at, len) = self.part_of(s);
        &mut self.my_stage(s)[at..at + len]
    }

    /// Rank `r`'s part of its staging slot for step `s` (see `my_part`).
    pub fn part(&self, r: usize, s: u32) -> &[u8] {
        let (at, len) = self.part_of(s);
        &self.stage(r, s)[at..at + len]
    }

    /// Bytes of a part of a staging slot.
    pub fn part_bytes(&self) -> usize {
        self.layout.chunk / PARTS / 64 * 64
    }

    fn part_of(&self, s: u32) -> (usize, usize) {
        let len = self.part_bytes();
        ((s as usize / SLOTS) % PARTS * len, len)
    }

    /// Word `i` of rank `r`'s staging slot for step `s`, for atomic updates by several ranks
    /// (work counters of a step that everyone published).
    pub fn stage_word(&self, r: usize, s: u32, i: usize) -> &AtomicU64 {
        assert!((i + 1) * 8 <= self.layout.chunk, "word {i} is outside the slot");
        let at = self.stage(r, s).as_ptr() as usize + i * 8;
        // SAFETY: in bounds (checked), 8-byte aligned (slots start at page multiples), and the
        // mapping lives as long as `self`; every access to the word is atomic.
        unsafe { &*(at as *const AtomicU64) }
    }

    /// The shared result slot for step `s`: a disjoint piece per owner is written before
    /// `Result` is published, and read by everyone after all published it.
    pub fn result_ptr(&self, s: u32) -> *mut u8 {
        let off = self.layout.result_off + (s as usize % SLOTS) * self.layout.chunk;
        // SAFETY: in bounds of the mapping.
        unsafe { self.base().add(off) }
    }

    /// Publishes that this rank has reached `s` on `f`, waking sleepers.
    pub fn publish(&self, f: Flag, s: u32) {
        let w = self.flag(self.rank, f);
        w.store(s, Ordering::Release);
        self.wake_sleepers(w);
    }

    /// Waits until every rank has published at least `s` on `f`.
    /// `deadline` is asked for only once the wait is past its spinning (a short wait reads no
    /// clock).
    pub fn wait_all(&self, f: Flag, s: u32, deadline: &dyn Fn() -> Instant, interrupt: &dyn Fn(usize) -> Option<Error>) -> Result<()> {
        for r in 0..self.layout.ranks {
            if r != self.rank {
                self.wait_one(r, f, s, deadline, interrupt)?;
            }
        }
        Ok(())
    }

    /// After a store to `w`: wakes the waiters asleep on this arena, if any. The fence keeps the
    /// look at `sleepers` from passing the store (x86 orders a store before a later load only
    /// with one): a waiter that had just counted itself asleep and then read the old value
    /// would otherwise sleep until its timeout (`MAX_SLEEP`) on a word that had moved. The
    /// waiter's side is its read-modify-write of `sleepers`. Measured on small collectives (2
    /// ranks, 5 interleaved rounds): within the noise.
    fn wake_sleepers(&self, w: &AtomicU32) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.header().sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake_all(w);
        }
    }

    /// Waits until rank `r` has published at least `s` on `f`.
    pub fn wait_one(&self, r: usize, f: Flag, s: u32, deadline: &dyn Fn() -> Instant, interrupt: &dyn Fn(usize) -> Option<Error>) -> Result<()> {
        self.wait_word(self.flag(r, f), s, r, deadline, interrupt, &|| format!("rank {r} did not reach step {s} on shared memory"))
    }

    /// Waits until `w`, which rank `r` writes, reaches `s` (wrapping order); on timeout the
    /// error says `late()`. `interrupt(r)` is asked about that rank (or the whole comm): a
    /// member that finished and left is no reason to stop waiting for another.
    fn wait_word(
        &self,
        w: &AtomicU32,
        s: u32,
        r: usize,
        deadline: &dyn Fn() -> Instant,
        interrupt: &dyn Fn(usize) -> Option<Error>,
        late: &dyn Fn() -> String,
    ) -> Result<()> {
        let mut backoff = Backoff::for_shared_memory();
        let seats = Seats { mine: self.cpu_word(self.rank), awaited: Some(self.cpu_word(r)) };
        loop {
            let v = w.load(Ordering::Acquire);
            if reached(v, s) {
                return Ok(());
            }
            let pace = backoff.next_for(Some(&seats));
            if matches!(pace, Pace::Spin | Pace::Yield) {
                continue;
            }
            if let Some(e) = interrupt(r) {
                // A peer that finished this step and then left is not a failure.
                return if reached(w.load(Ordering::Acquire), s) { Ok(()) } else { Err(e) };
            }
            let now = Instant::now();
            let deadline = deadline();
            if now >= deadline {
                // Before blaming `r`: a member that is gone is the likelier cause (`r` may be
                // waiting for it), and the error should name that one.
                if let Some(e) = (0..self.layout.ranks).filter(|&q| q != self.rank && q != r && !self.has_left(q)).find_map(interrupt) {
                    return Err(e);
                }
                return Err(Error::new(Status::Timeout, format!("timed out: {}", late())));
            }
            if pace == Pace::YieldAndCheck {
                continue;
            }
            let h = self.header();
            h.sleepers.fetch_add(1, Ordering::SeqCst);
            if !reached(w.load(Ordering::SeqCst), s) {
                futex_wait(w, v, (deadline - now).min(MAX_SLEEP));
            }
            h.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Arena {
    /// Where rank `r`'s waiting thread last ran (a quarter into its done line, which only `r`
    /// writes).
    fn cpu_word(&self, r: usize) -> &AtomicU32 {
        // SAFETY: in bounds (a line is 128 bytes), aligned; only accessed atomically.
        unsafe { &*(self.base().add(self.layout.done_off + r * LINE + LINE / 4) as *const AtomicU32) }
    }

    fn done_word(&self, r: usize) -> &AtomicU32 {
        // SAFETY: in bounds, line aligned; only accessed atomically.
        unsafe { &*(self.base().add(self.layout.done_off + r * LINE) as *const AtomicU32) }
    }

    /// Set once rank `r` destroyed its communicator (in the second half of its done line).
    fn left_word(&self, r: usize) -> &AtomicU32 {
        // SAFETY: in bounds (a line is 128 bytes), aligned; only accessed atomically.
        unsafe { &*(self.base().add(self.layout.done_off + r * LINE + LINE / 2) as *const AtomicU32) }
    }

    /// Tells the other members that we are gone (we destroyed the communicator): a wait for us
    /// that can no longer end stops, as one for a peer that closed its connection does.
    pub fn leave(&self) {
        self.left_word(self.rank).store(1, Ordering::Release);
    }

    /// Marks the communicator aborted by rank `by`, for every member at once (their waits on
    /// the arena see it before any frame could tell them). Kept in the first member's left
    /// word's neighbour: the header has no room to spare, and this line is written once.
    pub fn mark_aborted(&self, by: usize) {
        let _ = self.abort_word().compare_exchange(0, by as u32 + 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The member that aborted the communicator, if one did (see `mark_aborted`).
    pub fn aborted_by(&self) -> Option<usize> {
        match self.abort_word().load(Ordering::Acquire) {
            0 => None,
            v => Some(v as usize - 1),
        }
    }

    /// Marks member `r` lost (its process died or stopped, or its connection broke), as one
    /// member found: the others' waits on the arena, which may be for a member that is alive
    /// but itself stuck on `r`, then fail naming `r` rather than whoever they waited on. The
    /// first loss marked stays.
    pub fn mark_lost(&self, r: usize) {
        let _ = self.lost_word().compare_exchange(0, r as u32 + 1, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The member a member found lost, if one did (see `mark_lost`).
    pub fn lost_member(&self) -> Option<usize> {
        match self.lost_word().load(Ordering::Acquire) {
            0 => None,
            v => Some(v as usize - 1),
        }
    }

    fn lost_word(&self) -> &AtomicU32 {
        // SAFETY: in bounds (rank 0's done line, just after the abort word), aligned; atomics only.
        unsafe { &*(self.base().add(self.layout.done_off + LINE / 2 + LINE / 4 + 4) as *const AtomicU32) }
    }

    fn abort_word(&self) -> &AtomicU32 {
        // SAFETY: in bounds (rank 0's done line, three quarters in), aligned; atomics only.
        unsafe { &*(self.base().add(self.layout.done_off + LINE / 2 + LINE / 4) as *const AtomicU32) }
    }

    /// Whether rank `r` destroyed its communicator (see `leave`).
    pub fn has_left(&self, r: usize) -> bool {
        r < self.layout.ranks && self.left_word(r).load(Ordering::Acquire) != 0
    }

    /// Bytes of data a collective may post in a mailbox slot on this arena.
    pub fn eager_capacity(&self) -> usize {
        if self.layout.large > 0 { LARGE_EAGER_BYTES } else { EAGER_BYTES }
    }

    /// Rank `r`'s large mailbox slot for collective `c` (the arena has them).
    fn large_slot(&self, r: usize, c: u32) -> *mut u8 {
        let (large, ring) = (self.layout.large, self.layout.large_ring);
        let off = self.layout.large_off + (r * large + (c as usize & (ring - 1))) * LARGE_EAGER_BYTES;
        // SAFETY: in bounds (see `Layout`).
        unsafe { self.base().add(off) }
    }

    fn slot(&self, r: usize, c: u32) -> (&SlotHeader, *mut u8) {
        // `eager_slots` is a power of two: a mask, not a division (every small collective
        // looks at a slot of each member).
        let eager = self.layout.eager;
        let off = self.layout.mailbox_off + (r * eager + (c as usize & (eager - 1))) * EAGER_STRIDE;
        // SAFETY: in bounds; the header is atomics only, the data follows it.
        unsafe { (&*(self.base().add(off) as *const SlotHeader), self.base().add(off + SLOT_HEADER)) }
    }

    /// This rank has finished collective `c` (every collective on the arena says so, so that
    /// mailbox slots can be reused).
    pub fn finished(&self, c: u32) {
        let w = self.done_word(self.rank);
        w.store(c, Ordering::Release);
        self.wake_sleepers(w);
    }

    /// Fills this rank's mailbox slot for collective `c`: what it calls (`sig`, a size of
    /// `len` bytes) and `data` (at most `eager_capacity`, past `EAGER_BYTES` in the large
    /// slot; empty when the collective is not run through the mailboxes, and the stamp only
    /// lets the others check that they agree), first waiting until every rank finished the
    /// collective that used the slot before.
    pub fn post(&self, c: u32, sig: u32, len: u64, data: &[u8], deadline: &dyn Fn() -> Instant, interrupt: &dyn Fn(usize) -> Option<Error>) -> Result<()> {
        assert!(data.len() <= self.eager_capacity() && len & LARGE == 0);
        let large = self.layout.in_large_slot(data.len());
        let before = c.wrapping_sub(if large { self.layout.large_ring } else { self.layout.eager } as u32);
        if !reached(self.all_done.load(Ordering::Relaxed), before) {
            let mut oldest = c;
            for r in (0..self.layout.ranks).filter(|&r| r != self.rank) {
                self.wait_word(self.done_word(r), before, r, deadline, interrupt, &|| format!("rank {r} did not finish collective #{before} on shared memory"))?;
                let d = self.done_word(r).load(Ordering::Acquire);
                if !reached(d, oldest) {
                    oldest = d;
                }
            }
            // Collectives are in order on a comm (the turn), so this only moves forward.
            self.all_done.store(oldest, Ordering::Relaxed);
        }
        let (h, small) = self.slot(self.rank, c);
        let at = if large { self.large_slot(self.rank, c) } else { small };
        // SAFETY: the slot is ours until stamped: every reader of its previous use is done.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        h.sig.store(sig, Ordering::Relaxed);
        h.len.store(if large { len | LARGE } else { len }, Ordering::Relaxed);
        h.stamp.store(c, Ordering::Release);
        self.wake_sleepers(&h.stamp);
        Ok(())
    }

    /// Asks the CPU to bring the line of rank `r`'s mailbox slot for collective `c` that holds
    /// its stamp and first bytes into our cache, without waiting for it. A reader that is
    /// behind its writer (a broadcast's root runs ahead) then overlaps the next collective's
    /// cache miss with the rest of this one: in the minutes when this VM's cores sit far apart
    /// (a miss 150 ns), that miss was most of a 16 B broadcast. (Prefetching a larger slot's
    /// data lines too made 1-2 KiB broadcasts 8-15% slower: lines the writer has yet to fill.)
    pub fn prefetch_slot(&self, r: usize, c: u32) {
        let (h, _) = self.slot(r, c);
        prefetch_line(h as *const SlotHeader as *const u8);
    }

    /// Rank `r`'s stamp for collective `c` (signature, size), if it has posted it.
    pub fn peek(&self, r: usize, c: u32) -> Option<(u32, u64)> {
        let (h, _) = self.slot(r, c);
        (h.stamp.load(Ordering::Acquire) == c).then(|| (h.sig.load(Ordering::Relaxed), h.len.load(Ordering::Relaxed) & !LARGE))
    }

    /// Waits for rank `r`'s mailbox slot for collective `c`; its signature, size and data area
    /// (all of the small or the large slot, where `r` posted; meaningful only as far as `r`
    /// posted data), valid until this rank says it `finished` collective `c`.
    pub fn fetch(&self, r: usize, c: u32, deadline: &dyn Fn() -> Instant, interrupt: &dyn Fn(usize) -> Option<Error>) -> Result<(u32, u64, &[u8])> {
        let (h, small) = self.slot(r, c);
        self.wait_word(&h.stamp, c, r, deadline, interrupt, &|| format!("rank {r} did not reach this collective on shared memory"))?;
        let len = h.len.load(Ordering::Relaxed);
        let data = if len & LARGE != 0 && self.layout.large > 0 {
            // SAFETY: stamped (acquired above) and not reused before we finish `c`.
            unsafe { std::slice::from_raw_parts(self.large_slot(r, c), LARGE_EAGER_BYTES) }
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(small, EAGER_BYTES) }
        };
        Ok((h.sig.load(Ordering::Relaxed), len & !LARGE, data))
    }
}

/// A per-comm step counter: every rank advances it identically.
#[derive(Debug, Default)]
pub struct Steps {
    taken: AtomicU64,
    /// The latest step every rank is known to have reached (see `all_reached`).
    everyone: AtomicU32,
    /// The latest step of each parity that staged in whole slots (see `part_needs`).
    whole: [AtomicU32; SLOTS],
}

impl Steps {
    /// Takes the next step number.
    pub fn next(&self) -> u32 {
        (self.taken.fetch_add(1, Ordering::Relaxed) + 1) as u32
    }

    /// Whether every rank is known to have reached step `s`. A step that did not wait for
    /// everyone (a broadcast's root leaves once it has staged) leaves this behind, and the next
    /// step must wait for it before it overwrites a staging slot (double buffering).
    pub fn all_reached(&self, s: u32) -> bool {
        reached(self.everyone.load(Ordering::Relaxed), s)
    }

    /// Every rank has reached step `s`.
    pub fn everyone_reached(&self, s: u32) {
        self.everyone.store(s, Ordering::Relaxed);
    }

    /// Step `s` stages in whole slots.
    pub fn staged_whole(&self, s: u32) {
        self.whole[s as usize % SLOTS].store(s, Ordering::Relaxed);
    }

    /// The step every rank must have reached before we write our part of a slot at step `s`
    /// (see `Arena::my_part`): its readers are done with the step that last used that part,
    /// `SLOTS * PARTS` steps back, and with the last step that used the whole slot. Never later
    /// than the `s - 1` a whole slot needs.
    pub fn part_needs(&self, s: u32) -> u32 {
        let cycle = s.wrapping_sub((SLOTS * PARTS) as u32 - 1);
        let whole = self.whole[s as usize % SLOTS].load(Ordering::Relaxed).wrapping_add(1);
        let need = if reached(whole, cycle) { whole } else { cycle };
        let before = s.wrapping_sub(1);
        if reached(need, before) { before } else { need }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn two_ranks_exchange_through_steps() {
        let path = segment_path(0xabcdef ^ std::process::id() as u64);
        let a0 = Arc::new(Arena::create(&path, 2, 4096, 7).unwrap());
        let a1 = Arc::new(Arena::open(&path, 2, 4096, 7, 1).unwrap());
        std::fs::remove_file(&path).unwrap();
        assert!(Arena::open(&path, 2, 4096, 7, 1).is_err(), "unlinked segment still opens");
        let far = Instant::now() + Duration::from_secs(10);
        let t = std::thread::spawn(move || {
            for s in 1..=1000u32 {
                a1.my_stage(s)[0] = s as u8;
                a1.publish(Flag::Stage, s);
                a1.wait_all(Flag::Stage, s, &|| far, &|_| None).unwrap();
                assert_eq!(a1.stage(0, s)[0], (s as u8).wrapping_mul(3));
            }
        });
        for s in 1..=1000u32 {
            a0.my_stage(s)[0] = (s as u8).wrapping_mul(3);
            a0.publish(Flag::Stage, s);
            a0.wait_all(Flag::Stage, s, &|| far, &|_| None).unwrap();
            assert_eq!(a0.stage(1, s)[0], s as u8);
        }
        t.join().unwrap();
    }

    #[test]
    fn the_arena_keeps_its_size_for_few_ranks_and_its_cap_for_many() {
        for n in 2..=16 {
            assert_eq!((chunk_for(n, None), eager_slots(n)), (DEFAULT_CHUNK, EAGER_SLOTS), "{n} ranks");
        }
        assert_eq!(arena_bytes(2, DEFAULT_CHUNK), 1_979_136);
        assert_eq!(arena_bytes(16, DEFAULT_CHUNK), 12_134_400);
        assert_eq!((Layout::new(64, 0).large, Layout::new(65, 0).large), (LARGE_EAGER_SLOTS, 0));
        for n in 2..=4096 {
            let c = chunk_for(n, None);
            assert!(c >= min_chunk(n) && c >= 8 * n && c % 64 == 0, "{n} ranks: chunk {c}");
            let e = eager_slots(n);
            assert!(e.is_power_of_two() && (MIN_EAGER_SLOTS..=EAGER_SLOTS).contains(&e));
            if c > min_chunk(n) + PAGE {
                assert!(arena_bytes(n, c) <= ARENA_CAP, "{n} ranks: {} bytes", arena_bytes(n, c));
            }
        }
        assert!(arena_bytes(1024, chunk_for(1024, None)) <= ARENA_CAP);
        // DC_SHM_CHUNK: taken as asked, rounded to 64 bytes, but never below the floor.
        assert_eq!(chunk_for(4, Some(100_000)), 99_968);
        assert_eq!(chunk_for(1024, Some(4096)), min_chunk(1024));
    }

    use crate::buffer::{ConstBuf, MutBuf};
    use crate::collective::CollArgs;
    use crate::dtype::{DType, ReduceOp};

    /// Runs `body(me, arena, run)` on a thread per rank of a fresh arena of `n` ranks, where
    /// `run` makes one collective of `coll::shm` on it (through the mailboxes where it can,
    /// else in steps; `mailboxes_only`: a collective that cannot go through them fails).
    fn on_ranks(n: usize, chunk: usize, tag: u64, mailboxes_only: bool, body: fn(usize, &Arena, &mut dyn FnMut(CollArgs))) {
        use crate::coll::shm::{Scratch, ShmRun};
        let path = segment_path(tag ^ (n as u64) << 20 ^ std::process::id() as u64);
        let first = Arc::new(Arena::create(&path, n, chunk, 3).unwrap());
        let arenas: Vec<Arc<Arena>> = (0..n).map(|r| if r == 0 { first.clone() } else { Arc::new(Arena::open(&path, n, chunk, 3, r).unwrap()) }).collect();
        std::fs::remove_file(&path).unwrap();
        let far = Instant::now() + Duration::from_secs(120);
        let threads: Vec<_> = arenas
            .into_iter()
            .enumerate()
            .map(|(me, a)| {
                std::thread::spawn(move || {
                    let (steps, mut scratch) = (Steps::default(), Scratch::default());
                    let mut coll = 0u32;
                    let mut run = |args: CollArgs| {
                        coll += 1;
                        let (deadline, interrupt) = (|| far, |_| None);
                        let mut r = ShmRun::new(&a, &steps, coll, &deadline, &interrupt, &mut scratch, None);
                        // SAFETY: the buffers outlive the call.
                        let eager = unsafe { r.run_eager(&args) };
                        assert!(eager.is_some() || !mailboxes_only, "rank {me}: not through the mailboxes");
                        let done = eager.or_else(|| unsafe { r.run(&args) }).expect("an arena algorithm");
                        a.finished(coll);
                        done.unwrap();
                    };
                    body(me, &a, &mut run);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    /// The algorithms of `coll::shm` on arenas of many ranks with the sizes chosen here (fewer
    /// mailbox slots, small chunks, the floor), one thread per rank.
    fn run_many(n: usize, chunk: usize) {
        on_ranks(n, chunk, 0x6d61_6e79_0000, false, |me, a, run| {
            let (n, chunk) = (a.layout.ranks, a.layout.chunk);
            assert_eq!(a.eager_slots(), eager_slots(n));
            // More small collectives than mailbox slots (slot reuse), then the chunked
            // allreduce (one f64 per rank's share of a chunk at the floor).
            for k in 0..(2 * eager_slots(n) + 3) {
                let send = ((me + k) as f64).to_le_bytes();
                let mut recv = [0u8; 8];
                run(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Float64, op: ReduceOp::Sum });
                assert_eq!(f64::from_le_bytes(recv), (n * (n - 1) / 2 + n * k) as f64);
            }
            let count = 3 * chunk / 8 + 5;
            let send: Vec<u8> = (0..count).flat_map(|i| ((me + i % 5) as f64).to_le_bytes()).collect();
            let mut recv = vec![0u8; send.len()];
            run(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Float64, op: ReduceOp::Sum });
            for (i, v) in recv.chunks(8).enumerate() {
                assert_eq!(f64::from_le_bytes(v.try_into().unwrap()), (n * (n - 1) / 2 + n * (i % 5)) as f64, "rank {me} element {i}");
            }
            // reduce_scatter: one element per rank, and alltoall: blocks of 24 bytes.
            let mut block = [0u8; 8];
            let input: Vec<u8> = (0..n).flat_map(|j| ((me * j) as f64).to_le_bytes()).collect();
            run(CollArgs::ReduceScatter { send: Some(ConstBuf::from_slice(&input)), recv: MutBuf::from_slice(&mut block), dt: DType::Float64, op: ReduceOp::Sum });
            assert_eq!(f64::from_le_bytes(block), (me * n * (n - 1) / 2) as f64);
            let send: Vec<u8> = (0..n * 24).map(|i| (i / 24 * 3 + me) as u8).collect();
            let mut recv = vec![0u8; n * 24];
            run(CollArgs::Alltoall { send: ConstBuf::from_slice(&send), recv: MutBuf::from_slice(&mut recv), dt: DType::Uint8 });
            assert!((0..n * 24).all(|i| recv[i] == (me * 3 + i / 24) as u8), "rank {me}: alltoall");
        });
    }

    /// Broadcasts and allreduces of 16 B to 4 KiB through the mailboxes, the small slots and the
    /// large ones (past 1 KiB, four in turn), the root moving and running ahead: more calls
    /// than either kind has slots, so both are reused. Every byte checked.
    #[test]
    fn mailboxes_take_up_to_4_kib_in_small_and_large_slots() {
        on_ranks(3, 64 << 10, 0x6c61_7267_0000, true, |me, a, run| {
            assert_eq!((a.eager_capacity(), a.layout.large_ring), (LARGE_EAGER_BYTES, SHALLOW_LARGE_SLOTS));
            let (n, sizes) = (3, [16usize, 2049, 4096, 1025, 3000, 2048, 48, 1024, 4000]);
            for k in 0..(3 * EAGER_SLOTS) {
                let len = sizes[k % sizes.len()];
                let root = k / 40 % n;
                let mut buf: Vec<u8> = (0..len).map(|i| if me == root { (i * 7 + k) as u8 } else { 0 }).collect();
                run(CollArgs::Broadcast { buf: MutBuf::from_slice(&mut buf), dt: DType::Uint8, root });
                assert!(buf.iter().enumerate().all(|(i, &b)| b == (i * 7 + k) as u8), "rank {me}: broadcast {k} of {len} bytes");
                if k % 5 == 0 {
                    let send: Vec<u8> = (0..512).flat_map(|i| ((me + i + k) as f64).to_le_bytes()).collect();
                    let mut recv = vec![0u8; send.len()];
                    run(CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut recv), dt: DType::Float64, op: ReduceOp::Sum });
                    for (i, v) in recv.chunks(8).enumerate() {
                        assert_eq!(f64::from_le_bytes(v.try_into().unwrap()), (3 + 3 * (i + k)) as f64, "rank {me}: allreduce {k}");
                    }
                }
            }
        });
    }

    /// The members take the large slots in the turn the creator chose (its ranks may outnumber
    /// the cores where ours do not), and a header with a turn that cannot be is refused.
    #[test]
    fn members_take_the_creators_turn_of_large_slots() {
        let path = segment_path(0x7475_726e ^ std::process::id() as u64);
        let a0 = Arena::create(&path, 2, 4096, 9).unwrap();
        for (ring, opens) in [(LARGE_EAGER_SLOTS, true), (SHALLOW_LARGE_SLOTS, true), (3, false), (2 * LARGE_EAGER_SLOTS, false)] {
            a0.header().large_ring.store(ring as u32, Ordering::Relaxed);
            let a1 = Arena::open(&path, 2, 4096, 9, 1);
            assert_eq!(a1.as_ref().map(|a| a.layout.large_ring).ok(), opens.then_some(ring), "turn of {ring}");
        }
        std::fs::remove_file(&path).unwrap();
        let deep = Layout { large_ring: LARGE_EAGER_SLOTS, ..a0.layout };
        assert!(!deep.in_large_slot(EAGER_BYTES) && deep.in_large_slot(EAGER_BYTES + 1));
        let shallow = Layout { large_ring: SHALLOW_LARGE_SLOTS, ..a0.layout };
        assert!(!shallow.in_large_slot(SHALLOW_LARGE_FROM) && shallow.in_large_slot(SHALLOW_LARGE_FROM + 1));
    }

    #[test]
    fn many_ranks_on_the_chosen_chunks() {
        // 160 ranks: 32 mailbox slots, chunks of 168 KiB.
        assert_eq!((eager_slots(160), chunk_for(160, None)), (32, 168 << 10));
        run_many(160, chunk_for(160, None));
    }

    #[test]
    fn many_ranks_on_the_floor() {
        // 512 ranks on 4 KiB chunks: every rank's share of a chunk is one f64.
        assert_eq!(min_chunk(512), 8 * 512);
        run_many(512, min_chunk(512));
    }

    #[test]
    fn waiting_times_out_and_wraps() {
        assert!(reached(5, 5) && reached(6, 5) && !reached(4, 5));
        assert!(reached(2, u32::MAX), "wrapping order");
        let path = segment_path(0x1234 ^ std::process::id() as u64);
        let a = Arena::create(&path, 2, 64, 1).unwrap();
        std::fs::remove_file(&path).unwrap();
        let t0 = Instant::now();
        let until = Instant::now() + Duration::from_millis(100);
        let e = a.wait_all(Flag::Stage, 1, &|| until, &|_| None).unwrap_err();
        assert_eq!(e.status, Status::Timeout);
        assert!(t0.elapsed() >= Duration::from_millis(100));
    }
}
