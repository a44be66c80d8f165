//! Single-copy transfers between processes of one host (cross-memory attach,
//! `process_vm_readv`): the receiver copies a message straight out of the sender's memory.
//! Whether a peer allows it (same kernel, same user, no ptrace restriction) is probed once at
//! init by reading a known pattern from it.
//!
//! A sender normally keeps its buffer until the receiver's `Fin` says the read is over. Where it
//! has to let go without that word (the receiver is lost or frozen past the grace of a
//! withdrawal, see `messages::cancel_send`), it first *revokes* the message's cookie in a table
//! every process exposes beside its probe pattern; a receiver checks that table after each
//! read and discards what it read from a revoked message instead of delivering memory that its
//! owner may have freed or reused meanwhile.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots of the revocation table: cookies `SLOTS` apart share one (see `slot_of`).
const SLOTS: usize = 4096;
/// Slots in a cache line, and lines of slots.
const PER_LINE: usize = 8;
const LINES: usize = SLOTS / PER_LINE;
/// Set in a slot holding a revoked cookie.
const REVOKED: u64 = 1 << 63;

/// What a process exposes to the peers that read its memory: the probe pattern, then the
/// revocation table. A slot holds the newest single-copy cookie that uses it (`REVOKED` set
/// once revoked); `floor`: every cookie up to it counts as revoked (a revoked cookie whose slot
/// was taken by a newer one moves there, so it is never forgotten).
#[repr(C, align(64))]
struct Exposed {
    probe: [u8; 16],
    floor: AtomicU64,
    _line: [u8; 40],
    slots: [AtomicU64; SLOTS],
}

static EXPOSED: Exposed = Exposed::new();

impl Exposed {
    /// The probe pattern, nothing revoked, no slot taken.
    const fn new() -> Exposed {
        Exposed { probe: *b"distcomm-cma-ok!", floor: AtomicU64::new(0), _line: [0; 40], slots: [const { AtomicU64::new(0) }; SLOTS] }
    }
}

/// The slot of `cookie`: consecutive cookies in different cache lines, so that publishing the
/// next message does not have to take back the line a reader has just read the last one's slot
/// from (that cost a cross-core miss per message: 4% of a 32 KiB sendrecv's time in perf, at
/// the compare-exchange); a line is used again `LINES` cookies later.
fn slot_of(cookie: u64) -> usize {
    let i = cookie as usize % SLOTS;
    (i % LINES) * PER_LINE + i / LINES
}

/// A peer whose memory we may read: its pid and where its [`Exposed`] lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    pub pid: i32,
    base: u64,
}

/// A cookie for a single-copy message (or an offer): unique in this process, so the
/// revocation table can be shared by every transport of it (ranks as threads).
pub fn new_cookie() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Before a message announced with `cookie` can be read: it takes its slot (a revoked cookie
/// found there moves to the floor first, so readers never see it as valid again).
pub fn publish(cookie: u64) {
    EXPOSED.publish(cookie)
}

/// The message `cookie` is let go of without its reader's `Fin`: a read of it that ends after
/// this returns is discarded by the reader (see [`check_still_valid`]). Call before the
/// buffer is released.
pub fn revoke(cookie: u64) {
    EXPOSED.revoke(cookie)
}

impl Exposed {
    fn publish(&self, cookie: u64) {
        let slot = &self.slots[slot_of(cookie)];
        let mut old = slot.load(Ordering::Acquire);
        loop {
            if old & REVOKED != 0 {
                self.floor.fetch_max(old & !REVOKED, Ordering::SeqCst);
            }
            match slot.compare_exchange_weak(old, cookie, Ordering::SeqCst, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => old = now,
            }
        }
    }

    fn revoke(&self, cookie: u64) {
        let slot = &self.slots[slot_of(cookie)];
        if slot.compare_exchange(cookie, cookie | REVOKED, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            // Its slot went to a newer cookie while it waited: the floor covers it.
            self.floor.fetch_max(cookie, Ordering::SeqCst);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

impl Remote {
    /// Where `cookie`'s slot of [`Exposed`] lies in the peer's memory.
    fn slot_at(&self, cookie: u64) -> u64 {
        self.base + std::mem::offset_of!(Exposed, slots) as u64 + 8 * slot_of(cookie) as u64
    }

    /// Where the floor of [`Exposed`] lies in the peer's memory.
    fn floor_at(&self) -> u64 {
        self.base + std::mem::offset_of!(Exposed, floor) as u64
    }
}

/// Whether `cookie` was not revoked, from its slot as read after the data: the slot still
/// holding it says so at once (a revocation marks it, and a slot once taken by a newer cookie
/// never holds it again); a slot taken by a newer cookie sends us to the floor.
fn valid_given_slot(peer: Remote, cookie: u64, slot: u64) -> io::Result<bool> {
    if slot == cookie {
        return Ok(true);
    }
    if slot == cookie | REVOKED {
        return Ok(false);
    }
    let mut floor = 0u64;
    // SAFETY: reading 8 bytes into a local word.
    unsafe { read(peer.pid, peer.floor_at(), &mut floor as *mut u64 as *mut u8, 8)? };
    Ok(floor < cookie)
}

/// Whether `cookie`, read from `peer`'s memory just before, was still its sender's then (not
/// revoked). Reads the slot (then, if need be, the floor) after the data: a revocation that
/// came before the data read ended is seen.
pub fn check_still_valid(peer: Remote, cookie: u64) -> io::Result<bool> {
    std::sync::atomic::fence(Ordering::SeqCst);
    let mut slot = 0u64;
    // SAFETY: reading 8 bytes into a local word.
    unsafe { read(peer.pid, peer.slot_at(cookie), &mut slot as *mut u64 as *mut u8, 8)? };
    valid_given_slot(peer, cookie, slot)
}

/// Reads the `len` bytes of single-copy message `cookie` at `remote` in `peer`'s memory into
/// `dst`, and fails if the sender revoked it meanwhile (the bytes may be torn: not to be used).
///
/// # Safety
/// `dst` must be valid for `len` writable bytes.
pub unsafe fn read_message(peer: Option<Remote>, cookie: u64, remote: u64, dst: *mut u8, len: usize) -> io::Result<()> {
    let Some(peer) = peer else { return Err(io::Error::from_raw_os_error(libc::ESRCH)) };
    let ok = match read_with_table(peer, cookie, remote, dst, len)? {
        Some(ok) => ok,
        None => check_still_valid(peer, cookie)?,
    };
    if !ok {
        return Err(io::Error::other("its sender let go of it while it was read (revoked after a withdrawal it did not see answered)"));
    }
    Ok(())
}

/// The data and, behind it in the same call, the cookie's slot: one system call where separate
/// ones for the table cost up to a third of a 72 KiB message's time (measured). The kernel
/// copies the remote pieces in order, and x86 keeps loads in order, so the slot is read after
/// the data. Whether it says valid; None where it was not read (a short read: the rest of the
/// data was read by itself, and the caller checks).
#[cfg(target_arch = "x86_64")]
unsafe fn read_with_table(peer: Remote, cookie: u64, remote: u64, dst: *mut u8, len: usize) -> io::Result<Option<bool>> {
    let mut slot = 0u64;
    let local = [
        libc::iovec { iov_base: dst as *mut libc::c_void, iov_len: len },
        libc::iovec { iov_base: &mut slot as *mut u64 as *mut libc::c_void, iov_len: 8 },
    ];
    let far = [
        libc::iovec { iov_base: remote as usize as *mut libc::c_void, iov_len: len },
        libc::iovec { iov_base: peer.slot_at(cookie) as usize as *mut libc::c_void, iov_len: 8 },
    ];
    let n = libc::process_vm_readv(peer.pid, local.as_ptr(), 2, far.as_ptr(), 2, 0);
    if n == (len + 8) as isize {
        return valid_given_slot(peer, cookie, slot).map(Some);
    }
    // An error or a short read: the data from where it stopped, then a separate check.
    let done = if n < 0 { 0 } else { (n as usize).min(len) };
    read(peer.pid, remote + done as u64, dst.add(done), len - done)?;
    Ok(None)
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn read_with_table(peer: Remote, _cookie: u64, remote: u64, dst: *mut u8, len: usize) -> io::Result<Option<bool>> {
    read(peer.pid, remote, dst, len)?;
    Ok(None)
}

/// Messages at least this large go single-copy between ranks of one host over their sockets
/// (`DC_CMA_MIN` bytes; 0 turns single-copy off).
pub fn threshold() -> usize {
    static T: once_cell::sync::Lazy<usize> =
        once_cell::sync::Lazy::new(|| crate::params::get().cma_min.unwrap_or(256 * 1024));
    *T
}

/// Between ranks with shared-memory rings, messages at least this large are read single-copy
/// once announced (see `messages::ring_message_single_copy`): `DC_CMA_MIN` when set, else
/// every message that does not go inline in the ring (over a quarter of it, `ring_wire::goes_inline`;
/// measured here, sendrecv 72 KiB and 160 KiB against streaming them: 0.13x the time idle,
/// 0.38-0.44x beside a busy process under a plain launcher).
pub fn ring_threshold() -> usize {
    static T: once_cell::sync::Lazy<usize> = once_cell::sync::Lazy::new(|| crate::params::get().cma_min.unwrap_or(1));
    *T
}

/// What a rank publishes so peers can probe it: "pid:probe-address".
pub fn advertisement() -> String {
    format!("{}:{:x}", std::process::id(), &EXPOSED as *const Exposed as usize)
}

/// Reads `len` bytes at `remote` in process `pid` into `dst`.
///
/// # Safety
/// `dst` must be valid for `len` writable bytes.
pub unsafe fn read(pid: i32, remote: u64, dst: *mut u8, len: usize) -> io::Result<()> {
    transfer(libc::process_vm_readv, "process_vm_readv", pid, remote, dst, len)
}

/// Whether collectives may write into the other processes' memory (`write`). Not under
/// valgrind's memcheck (its preload library is in `LD_PRELOAD`): bytes another process writes
/// are invisible to it, so it would call the results uninitialised (CI's C tests under memcheck
/// did once allreduces from 64 KiB could write their results). Then they read instead, which
/// `process_vm_readv`'s checked wrapper sees. Every process of a checked job should run under it.
pub fn writes_to_peers() -> bool {
    static OK: once_cell::sync::Lazy<bool> = once_cell::sync::Lazy::new(|| !std::env::var("LD_PRELOAD").is_ok_and(|p| p.contains("vgpreload_memcheck")));
    *OK
}

/// Writes `len` bytes at `src` to `remote` in process `pid` (the same permission as reading).
///
/// # Safety
/// `src` must be valid for `len` readable bytes.
pub unsafe fn write(pid: i32, remote: u64, src: *const u8, len: usize) -> io::Result<()> {
    transfer(libc::process_vm_writev, "process_vm_writev", pid, remote, src as *mut u8, len)
}

/// `process_vm_readv` or `process_vm_writev` (the same signature).
type VmCall = unsafe extern "C" fn(libc::pid_t, *const libc::iovec, libc::c_ulong, *const libc::iovec, libc::c_ulong, libc::c_ulong) -> isize;

/// Moves `len` bytes between `local` here and `remote` in `pid` with `call`, resuming after
/// short transfers and interruptions.
unsafe fn transfer(call: VmCall, name: &str, pid: i32, remote: u64, local: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let here = libc::iovec { iov_base: local.add(done) as *mut libc::c_void, iov_len: len - done };
        let far = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
        let n = call(pid, &here, 1, &far, 1, 0);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{name} moved nothing")));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether the process behind `advertisement` lets us read its memory; where, if so.
pub fn probe(advertisement: &str) -> Option<Remote> {
    if threshold() == 0 {
        return None;
    }
    let (pid, addr) = advertisement.split_once(':')?;
    let pid: i32 = pid.parse().ok()?;
    let addr = u64::from_str_radix(addr, 16).ok()?;
    let mut got = [0u8; 16];
    // SAFETY: reading 16 bytes into a local array.
    unsafe { read(pid, addr, got.as_mut_ptr(), got.len()) }.ok()?;
    (got == EXPOSED.probe).then_some(Remote { pid, base: addr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_itself_and_refuses_nonsense() {
        let me = probe(&advertisement()).expect("a process may read itself");
        assert_eq!(me.pid, std::process::id() as i32);
        assert_eq!(probe("1:0"), None);
        assert_eq!(probe("garbage"), None);
    }

    /// Every slot serves one cookie of every `SLOTS`, consecutive cookies sit in different
    /// lines, and the slots start on a line.
    #[test]
    fn consecutive_cookies_take_slots_in_different_lines() {
        let mut seen = vec![false; SLOTS];
        for c in 1..=SLOTS as u64 {
            let s = slot_of(c);
            assert!(!std::mem::replace(&mut seen[s], true), "cookie {c}: slot {s} twice");
            assert_eq!(slot_of(c + SLOTS as u64), s);
            assert_ne!(s / PER_LINE, slot_of(c + 1) / PER_LINE, "cookies {c} and {} share a line", c + 1);
        }
        assert_eq!((std::mem::offset_of!(Exposed, slots) % 64, std::mem::align_of::<Exposed>()), (0, 64));
    }

    #[test]
    fn a_revoked_cookie_reads_as_revoked_and_stays_so_when_its_slot_is_reused() {
        // A table of the test's own (the process's one serves the other tests meanwhile),
        // read through process_vm_readv as a peer reads it.
        let t: Box<Exposed> = Box::new(Exposed::new());
        let me = Remote { pid: std::process::id() as i32, base: &*t as *const Exposed as u64 };
        let valid = |c| check_still_valid(me, c).unwrap();
        let (a, b) = (10, 11);
        t.publish(a);
        t.publish(b);
        assert!(valid(a) && valid(b));
        t.revoke(a);
        assert!(!valid(a), "a revoked message must not be delivered");
        assert!(valid(b), "revoking one message leaves the others valid");
        // A newer cookie takes a's slot: a stays revoked (through the floor), b stays valid.
        let c = a + SLOTS as u64;
        t.publish(c);
        assert!(!valid(a) && valid(c) && valid(b));
        // Revoking a cookie whose slot went to a newer one: the floor covers it.
        let d = 2 * SLOTS as u64 + 5;
        t.publish(d);
        t.publish(d + SLOTS as u64);
        t.revoke(d);
        assert!(!valid(d) && valid(d + SLOTS as u64));
        // The message read with its slot in one call says the same.
        let src: Vec<u8> = (0..100_000).map(|i| i as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let read = |c, dst: &mut [u8]| unsafe { read_message(Some(me), c, src.as_ptr() as u64, dst.as_mut_ptr(), dst.len()) };
        read(b, &mut dst).expect("a valid message reads");
        assert!(dst == src);
        for gone in [a, d] {
            let e = read(gone, &mut dst).unwrap_err();
            assert!(e.to_string().contains("let go of it"), "{e}");
        }
    }
}
