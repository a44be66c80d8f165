//! A comm whose members share a host: its shared-memory arena, set up collectively, and the
//! turn that keeps its collectives in call order.

use super::{lock, Comm, TransportPolicy};
use crate::buffer::{ConstBuf, MutBuf};
use crate::collective::CollArgs;
use crate::dc_log;
use crate::error::{Error, Result, Status};
use crate::log::Level;
use super::arena_pool;
use crate::transport::shm::{self as shm_seg, Arena, Steps};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A comm whose members share a host: its arena, step counter, and the turn that keeps its
/// collectives in call order (the blocking caller and the worker thread may both run them).
pub(super) struct ShmState {
    pub(super) arena: Arc<Arena>,
    pub(super) steps: Steps,
    /// Members' pids when every member lets us read its memory (allgatherv and alltoallv read
    /// single-copy).
    pub(super) pids: Option<Vec<i32>>,
    /// Reusable memory of the collectives: only the thread whose turn it is touches it (a
    /// mutex here would put a locked instruction right after each call's writes to shared
    /// memory, which then waits for them to reach the other cores).
    scratch: std::cell::UnsafeCell<crate::coll::shm::Scratch>,
    /// Sequence number of the collective whose turn it is.
    turn: AtomicU64,
    /// Threads waiting for their turn (rare: a blocking call behind queued non-blocking ones).
    turn_waiters: AtomicU64,
    turn_lock: Mutex<()>,
    turn_cv: Condvar,
}

// SAFETY: `scratch` is used only by the thread whose turn it is (see `scratch`); the rest is
// atomics, locks and the arena (Sync).
unsafe impl Sync for ShmState {}

/// A thread waiting for its turn looks again at least this often: passing the turn does not
/// fence (see `pass_turn`), so a waiter that registered just then may miss its notification.
const TURN_RECHECK: Duration = Duration::from_millis(1);


impl ShmState {
    /// The collectives' scratch memory.
    ///
    /// # Safety
    /// The caller holds the turn (between `wait_turn` and `pass_turn`) and drops the reference
    /// before passing it.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn scratch(&self) -> &mut crate::coll::shm::Scratch {
        &mut *self.scratch.get()
    }

    /// Waits until collective `seq` may run (usually at once: one atomic load).
    pub(super) fn wait_turn(&self, seq: u64, deadline: &dyn Fn() -> Instant, check: &dyn Fn() -> Result<()>) -> Result<()> {
        if self.turn.load(Ordering::Acquire) == seq {
            return Ok(());
        }
        self.turn_waiters.fetch_add(1, Ordering::SeqCst);
        let r = (|| loop {
            let g = lock(&self.turn_lock);
            let t = self.turn.load(Ordering::SeqCst);
            if t == seq {
                return Ok(());
            }
            check()?;
            let now = Instant::now();
            if now >= deadline() {
                return Err(Error::new(Status::Timeout, format!("collective #{t} before this one did not finish in time")));
            }
            let _ = self.turn_cv.wait_timeout(g, (deadline() - now).min(TURN_RECHECK));
        })();
        self.turn_waiters.fetch_sub(1, Ordering::SeqCst);
        r
    }

    pub(super) fn pass_turn(&self, next: u64) {
        // Release, not SeqCst: a full fence here would stall until this call's stores to
        // shared memory reach the readers; waiters recheck every TURN_RECHECK instead.
        self.turn.store(next, Ordering::Release);
        if self.turn_waiters.load(Ordering::Relaxed) > 0 {
            let _g = lock(&self.turn_lock);
            self.turn_cv.notify_all();
        }
    }
}

/// How the members of a comm agree on its arena: through the store (the world comm, at
/// init), or with collectives of the comm numbered from the given one (a new group's).
pub(super) enum Setup {
    Store,
    Collectives(u64),
}

/// Collectives a new group's set-up may run: taking over a kept arena (a broadcast, an
/// allreduce, a barrier; see `take_kept_arena`), then making one (a broadcast, an allreduce).
/// Numbers a set-up does not use stay unused on every member alike.
const REUSE_COLLECTIVES: u64 = 3;
const SETUP_COLLECTIVES: u64 = REUSE_COLLECTIVES + 2;

impl Comm {
    /// Why a wait on shared memory for comm rank `r` cannot end: it destroyed the comm, closed
    /// its connection, or its process is gone (connections are made on demand, so a member we
    /// never talked to is looked at directly).
    pub(super) fn member_gone(&self, shm: &ShmState, r: usize) -> Option<Error> {
        // A member that saw an abort may leave at once: look at its leaving first, then at the
        // abort (marked on the arena before it was announced), so the abort is what we report.
        let left = shm.arena.has_left(r);
        if let Some(by) = shm.arena.aborted_by() {
            self.ctx.abort(&format!("rank {by} aborted the communicator"));
            return self.ctx.abort_error();
        }
        if left {
            let w = self.members[r];
            return Some(Error::new(Status::PeerLost, format!("rank {r} (world rank {w}) has left: it destroyed its communicator")));
        }
        if let Some(x) = shm.arena.lost_member().filter(|&x| x != self.rank) {
            // Another member found it lost; our own view says why, where we have one.
            let w = self.members[x];
            return Some(self.transport().check_alive(w).unwrap_or_else(|| {
                Error::new(Status::PeerLost, format!("rank {x} (world rank {w}) is lost: another member of the communicator found it gone or stopped"))
            }));
        }
        let e = self.transport().check_alive(self.members[r])?;
        if e.status == Status::PeerLost {
            shm.arena.mark_lost(r);
        }
        Some(e)
    }

    /// Bytes of /dev/shm behind this rank (for tests and the memory documentation): the comm's
    /// arena (one segment, which every member reports) and this rank's segment of incoming
    /// point-to-point rings (the world's, one per rank of a host). 0 for what it does not have.
    pub fn shm_bytes(&self) -> (usize, usize) {
        (self.shm.get().map_or(0, |s| s.arena.bytes()), self.transport().incoming_ring_bytes())
    }

    /// Which arena the comm has (its segment's random name), if it has one: for tests of
    /// arenas taken over by new comms.
    pub fn arena_id(&self) -> Option<u64> {
        self.shm.get().map(|s| s.arena.nonce())
    }

    /// Whether the comm can have an arena: the policy allows shared memory, and its members
    /// (two or more) share one host; an error where the policy demands shared memory and the
    /// members span hosts. Every member knows every member's host, so all answer alike.
    pub(super) fn arena_possible(&self) -> Result<bool> {
        let policy = self.world.policy;
        if policy == TransportPolicy::Socket || self.size() < 2 {
            return Ok(false);
        }
        let host = self.world.hosts[self.members[0] as usize];
        if self.members.iter().any(|&w| self.world.hosts[w as usize] != host) {
            if policy == TransportPolicy::Shm {
                return Err(Error::new(Status::Unavailable, "backend \"shm\": the communicator's members are on different hosts"));
            }
            return Ok(false);
        }
        Ok(true)
    }

    /// A new group's arena is set up at its first collective (see `arena_pending`), before
    /// that call takes its number, with the two collectives of its own numbered ahead of it:
    /// every member makes its first collective call at the same point, so all number them
    /// alike. A blocking call sets it up on the calling thread (or waits for the set-up a
    /// non-blocking call queued); a non-blocking call queues the set-up on the comm's worker,
    /// ahead of itself, and does not wait: members may start non-blocking collectives on
    /// several new comms in different orders.
    #[inline(always)]
    pub(super) fn ensure_arena(&self) -> Result<()> {
        // Every blocking collective asks: a load or two, the rest out of line.
        if self.arena_pending.load(Ordering::Relaxed) || self.arena_setup.get().is_some_and(|c| !c.is_done()) {
            return self.ensure_arena_now();
        }
        Ok(())
    }

    #[inline(never)]
    fn ensure_arena_now(&self) -> Result<()> {
        if let Some(seq) = self.take_arena_setup() {
            return self.setup_shm(Setup::Collectives(seq));
        }
        if let Some(comp) = self.arena_setup.get() {
            // Its result is the collectives' to report: without an arena they use sockets.
            self.run_queued_until(comp);
            let _ = comp.wait(self.deadline(), &|| None);
        }
        Ok(())
    }

    /// `ensure_arena` for a non-blocking call.
    pub(super) fn ensure_arena_queued(self: &Arc<Self>) -> Result<()> {
        let Some(seq) = self.take_arena_setup() else { return Ok(()) };
        let me = self.clone();
        let comp = self.queue_job(move || me.setup_shm(Setup::Collectives(seq)))?;
        let _ = self.arena_setup.set(comp);
        Ok(())
    }

    /// The number of the set-up's first collective, if this call is the comm's first.
    fn take_arena_setup(&self) -> Option<u64> {
        (self.arena_pending.load(Ordering::Relaxed) && self.arena_pending.swap(false, Ordering::AcqRel))
            .then(|| self.coll_seq.fetch_add(SETUP_COLLECTIVES, Ordering::Relaxed))
    }

    /// A new group's first try (collectives `seq` to `seq + 2`): the arena of a destroyed
    /// comm of the same members (see `arena_pool`) that every member still keeps. Rank 0
    /// offers the ones it keeps (their nonces), an allreduce ANDs the masks of those each
    /// member holds, and the first in all masks is taken; each member then makes its part of
    /// it new, and a barrier lets nobody use it before everyone has.
    fn take_kept_arena(&self, seq: u64, deadline: Instant) -> Result<Option<Arc<Arena>>> {
        let pool = &self.world.arena_pool;
        let mut offer = [0u8; 8 * arena_pool::KEEP];
        let mut offered = Vec::new();
        if self.rank == 0 {
            let chunk = shm_seg::chunk_for(self.size(), crate::params::get().shm_chunk);
            offered = pool.take_all_for(&self.members, chunk);
            for (i, a) in offered.iter().enumerate().take(arena_pool::KEEP) {
                offer[8 * i..8 * i + 8].copy_from_slice(&a.nonce().to_le_bytes());
            }
        }
        self.setup_broadcast(&mut offer, seq, deadline)?;
        let nonces: Vec<u64> = offer.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).take_while(|&x| x != 0).collect();
        if nonces.is_empty() {
            return Ok(None);
        }
        // Each member takes out the offered arenas it keeps (rank 0 took its own) so that
        // they stay until the choice is made; the others go back after it.
        let held: Vec<Arc<Arena>> = if self.rank == 0 { offered } else { nonces.iter().filter_map(|&x| pool.take_nonce(&self.members, x)).collect() };
        let mine = nonces.iter().enumerate().filter(|&(_, &x)| held.iter().any(|a| a.nonce() == x)).fold(0u8, |m, (i, _)| m | 1 << i);
        let all = self.setup_allreduce(mine, crate::dtype::ReduceOp::Band, seq + 1, deadline)?;
        let chosen = (all != 0).then(|| nonces[all.trailing_zeros() as usize]);
        let mut arena = None;
        for a in held {
            if Some(a.nonce()) == chosen {
                arena = Some(a);
            } else {
                pool.keep(&self.members, a);
            }
        }
        let Some(arena) = arena else { return Ok(None) };
        arena.reset_mine();
        self.setup_allreduce(1, crate::dtype::ReduceOp::Min, seq + 2, deadline)?;
        Ok(Some(arena))
    }

    /// The set-up's broadcast of a few bytes from rank 0, as collective `seq`.
    fn setup_broadcast(&self, bytes: &mut [u8], seq: u64, deadline: Instant) -> Result<()> {
        self.execute(&CollArgs::Broadcast { buf: MutBuf::from_slice(bytes), dt: crate::dtype::DType::Uint8, root: 0 }, seq, &|| deadline)
    }

    /// The set-up's allreduce of one byte, as collective `seq`.
    fn setup_allreduce(&self, mine: u8, op: crate::dtype::ReduceOp, seq: u64, deadline: Instant) -> Result<u8> {
        let send = [mine];
        let mut all = [0u8; 1];
        let args = CollArgs::Allreduce { send: Some(ConstBuf::from_slice(&send)), recv: MutBuf::from_slice(&mut all), dt: crate::dtype::DType::Uint8, op };
        self.execute(&args, seq, &|| deadline)?;
        Ok(all[0])
    }

    /// Makes `arena` this comm's, its collectives numbered from the end of the set-up's.
    fn install_arena(&self, arena: Arc<Arena>, how: &Setup) {
        let pids: Option<Vec<i32>> = self.members.iter().map(|&w| self.transport().readable_pid(w)).collect();
        let state = ShmState {
            arena,
            steps: Steps::default(),
            pids,
            scratch: std::cell::UnsafeCell::new(Default::default()),
            // The first collective after the set-up's own.
            turn: AtomicU64::new(match how {
                Setup::Store => self.coll_seq.load(Ordering::Relaxed),
                Setup::Collectives(seq) => seq + SETUP_COLLECTIVES,
            }),
            turn_waiters: AtomicU64::new(0),
            turn_lock: Mutex::new(()),
            turn_cv: Condvar::new(),
        };
        let _ = self.shm.set(state);
    }

    /// Maps one shared segment for all members if the policy allows and every member can
    /// (same host, same /dev/shm, room in it for the segment); otherwise the comm stays on
    /// sockets. Collective. The segment's size grows linearly with the members and is capped
    /// (see `transport::shm`): rank 0 reserves all of it before anyone maps it, and a /dev/shm
    /// without room for it is a WARN line and sockets (under backend "shm": the error).
    pub(super) fn setup_shm(&self, how: Setup) -> Result<()> {
        if !self.arena_possible()? {
            return Ok(());
        }
        let policy = self.world.policy;
        let n = self.size();
        // The world comm's setup talks through the store, not the comm: collectives over
        // sockets would open connections (made on demand) that shared memory never needs
        // afterwards. A subgroup's goes through its members: the store's host (world rank 0)
        // may not be among them and may have finished.
        let store = matches!(how, Setup::Store).then_some(&*self.world.store);
        let at = |k: u64| match how {
            Setup::Collectives(seq) => seq + REUSE_COLLECTIVES + k,
            Setup::Store => unreachable!("the store's set-up runs no collectives"),
        };
        let deadline = self.deadline();
        if let Setup::Collectives(seq) = how {
            if let Some(arena) = self.take_kept_arena(seq, deadline)? {
                dc_log!(Level::Info, Some(self.rank), "communicator {:#x}: shared memory, {} ranks, the arena of a destroyed communicator", self.ctx.id, n);
                self.install_arena(arena, &how);
                return Ok(());
            }
        }
        let key = format!("shm/{:016x}", self.ctx.id);
        // Rank 0 creates the segment and tells the others its name parts: ok, pid, chunk, nonce;
        // if it could not, the bytes it needed and found free in /dev/shm.
        let mut info = [0u8; 40];
        let mut created = None;
        let mut failure = None;
        if self.rank == 0 {
            shm_seg::reclaim_stale_segments();
            let requested = crate::params::get().shm_chunk;
            let chunk = shm_seg::chunk_for(n, requested);
            let nonce = crate::init::random_u64();
            let path = shm_seg::segment_path(self.ctx.id);
            match Arena::create(&path, n, chunk, nonce) {
                Ok(a) => {
                    info[0] = 1;
                    info[4..8].copy_from_slice(&std::process::id().to_le_bytes());
                    info[8..16].copy_from_slice(&(chunk as u64).to_le_bytes());
                    info[16..24].copy_from_slice(&nonce.to_le_bytes());
                    created = Some((a, path));
                }
                Err(e) => {
                    let need = shm_seg::arena_bytes(n, chunk) as u64;
                    let free = shm_seg::free_bytes(std::path::Path::new("/dev/shm")).unwrap_or(0);
                    info[24..32].copy_from_slice(&need.to_le_bytes());
                    info[32..40].copy_from_slice(&free.to_le_bytes());
                    let then = if policy == TransportPolicy::Shm { "backend \"shm\" fails" } else { "collectives over sockets" };
                    dc_log!(Level::Warn, Some(self.rank), "communicator {:#x} of {n} ranks: no shared-memory arena, {then}: {}", self.ctx.id, e.msg);
                    failure = Some(e.msg);
                }
            }
        }
        match store {
            None => self.setup_broadcast(&mut info, at(0), deadline)?,
            Some(store) if self.rank == 0 => store.set(&key, &info)?,
            Some(store) => {
                let v = store.get(&key, self.deadline()).map_err(|e| e.context("waiting for rank 0 to set up shared memory"))?;
                if v.len() != info.len() {
                    return Err(Error::new(Status::Rendezvous, format!("malformed shared-memory announcement under {key}")));
                }
                info.copy_from_slice(&v);
            }
        }
        let pid = u32::from_le_bytes(info[4..8].try_into().unwrap());
        let chunk = u64::from_le_bytes(info[8..16].try_into().unwrap()) as usize;
        let nonce = u64::from_le_bytes(info[16..24].try_into().unwrap());
        if info[0] != 1 && policy == TransportPolicy::Shm {
            let need = u64::from_le_bytes(info[24..32].try_into().unwrap());
            let free = u64::from_le_bytes(info[32..40].try_into().unwrap());
            let why = failure.unwrap_or_else(|| format!("{} needed, {} free in /dev/shm", shm_seg::show_bytes(need), shm_seg::show_bytes(free)));
            return Err(Error::new(Status::Unavailable, format!("backend \"shm\": rank 0 could not reserve the shared-memory arena of {n} ranks: {why}")));
        }
        let arena = match created {
            Some((a, _)) => Some(a),
            None if info[0] == 1 => {
                let path = std::path::PathBuf::from(format!("/dev/shm/distcomm-{pid}-{:016x}", self.ctx.id));
                Arena::open(&path, n, chunk, nonce, self.rank).map_err(|e| dc_log!(Level::Info, Some(self.rank), "cannot map the shared segment: {}", e.msg)).ok()
            }
            None => None,
        };
        // Everyone says whether it mapped the segment; then it can be unlinked.
        let ok = [u8::from(arena.is_some())];
        let mut all_ok = [0u8; 1];
        match store {
            None => all_ok[0] = self.setup_allreduce(ok[0], crate::dtype::ReduceOp::Min, at(1), deadline)?,
            Some(store) => {
                let ranks: Vec<usize> = (0..n).collect();
                let said = crate::rendezvous::exchange_among(store, &format!("{key}/mapped"), self.rank, &ranks, &ok, self.deadline())?;
                all_ok[0] = u8::from(said.iter().all(|v| v.as_slice() == [1]));
                // Rank 0 usually hosts the store and may go on and exit at once: it waits
                // until the others have read what they need from it.
                if self.rank != 0 {
                    if store.add(&format!("{key}/read"), 1)? == n as i64 - 1 {
                        store.set(&format!("{key}/all_read"), b"1")?;
                    }
                } else {
                    store.get(&format!("{key}/all_read"), self.deadline())?;
                }
            }
        }
        if self.rank == 0 {
            let _ = std::fs::remove_file(shm_seg::segment_path(self.ctx.id));
        }
        match (all_ok[0], arena) {
            (1, Some(arena)) => {
                dc_log!(Level::Info, Some(self.rank), "communicator {:#x}: shared memory, {} ranks, {} bytes", self.ctx.id, n, arena.bytes());
                self.install_arena(Arc::new(arena), &how);
                Ok(())
            }
            _ if policy == TransportPolicy::Shm => {
                Err(Error::new(Status::Unavailable, "backend \"shm\": not every member can map the same shared-memory segment (different hosts or /dev/shm)"))
            }
            _ => Ok(()),
        }
    }
}
