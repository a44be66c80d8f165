//! Whether bodies past `inline_max_unpicked` that fit a ring inline go inline (two copies, the
//! sender done at once) or are read single-copy (one copy each, and hand-offs: announce, read,
//! answer), chosen by how fast blocking exchanges (`dc_sendrecv`, `MPI_Sendrecv`) went lately
//! each way: from 24-32 KiB where a host's ranks outnumber its cores ("crowded"), from 16 KiB
//! elsewhere. Crowded, the time that matters is the exchange's, which includes waiting for the
//! peers' turns on the cores; uncrowded, the copies through the ring are what this VM's slow
//! minutes slow down most (see `inline_max_unpicked`). Each exchange times
//! itself by size class (`pick`; single-copy is the first way, inline the second, taken while
//! clearly faster) and sets the way every send of such a body takes. Exchanges in a ring of
//! ranks, each the same number of calls, try the ways in the same calls, so each rank's time is
//! that of everyone going one way. Neither wins everywhere on this VM, whose copies through
//! shared memory run 2-4x slower in some minutes than in others: on 2026-12-06 single-copy took
//! 0.51-0.83x the inline time at 64 KiB with 4 ranks on 2 cores, on 2026-12-07 inline took
//! 0.35-0.45x the single-copy time (6.6 against 18.5 us).
//!
//! The same for large messages, streamed or read once, was tried and left out: at 16 MiB with
//! 4 ranks a stream forced for all took 0.54x a read's time, but single calls ran 3-4 or 7-12
//! ms either way, and the ranks' picks, each timing its own exchanges, settled on different
//! ways, which was slower than either (the receiver's own pick stays, see `read_announced`).

use super::endpoint::{lock, SocketTransport};
use crate::pick::BySize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The largest body a ring takes inline (a quarter of the largest ring).
const INLINE_MAX: usize = super::ring::MAX_RING_BYTES / 4;

/// The exchanges' recent times each way, and the way the latest chose.
pub struct Crowded {
    pick: Mutex<BySize>,
    inline: AtomicBool,
}

impl Default for Crowded {
    /// Before any exchange chose: single-copy where ranks outnumber the cores, inline elsewhere.
    /// Only exchanges are timed, and a ping-pong of plain sends went faster inline in the VM's
    /// fast minutes (2 ranks, one way, 24 / 32 / 48 / 64 KiB: 3.9 / 5.0 / 7.4 / 9.6 us inline,
    /// 7.2 / 8.5 / 11.2 / 14.0 single-copy; in its slow minutes the other way round, 9.9 / 18.0
    /// / 20.6 against 7.2 / 8.6 / 11.3), so a program that sends without exchanging keeps them
    /// inline there.
    fn default() -> Crowded {
        Crowded { pick: Mutex::default(), inline: AtomicBool::new(!crate::completion::oversubscribed()) }
    }
}

/// An exchange under way that chose a way: report its time with `crowded_exchange_took`.
#[derive(Clone, Copy, Debug)]
pub struct Trial {
    inline: bool,
    len: usize,
}

impl Crowded {
    /// Whether bodies past `inline_max_unpicked` go inline now.
    pub fn inline(&self) -> bool {
        self.inline.load(Ordering::Relaxed)
    }
}

impl SocketTransport {
    /// A blocking exchange that sends `len` bytes starts: where that is a crowded body, the way
    /// such bodies go now, to report the exchange's time with.
    pub fn crowded_exchange_starts(&self, len: usize) -> Option<Trial> {
        if len <= inline_max_unpicked() || len > INLINE_MAX {
            return None;
        }
        let inline = lock(&self.crowded.pick).of(len, inline_max_unpicked()).second();
        self.crowded.inline.store(inline, Ordering::Relaxed);
        Some(Trial { inline, len })
    }

    /// The exchange of `trial` took `took`.
    pub fn crowded_exchange_took(&self, trial: Trial, took: Duration) {
        lock(&self.crowded.pick).of(trial.len, inline_max_unpicked()).took(trial.inline, trial.len, took);
    }
}

/// The largest body that always goes inline: larger ones that fit the ring are read
/// single-copy (each rank copies once where inline it copies twice), unless the sender's
/// yields lately lost its core (a busy process beside us keeps the cores it is handed, so every
/// hand-off of a single-copy exchange, announce, read and answer, can wait for a time slice;
/// inline, the sender is done at once) or the exchanges chose inline (see the module's comment;
/// before any exchange chose, inline where ranks have a core each, see `Crowded::default`).
///
/// Where ranks outnumber the cores, measured (dc-bench sendrecv, 5-7 interleaved rounds, medians
/// of single-copy/inline time) at 4 / 8 ranks on 2 cores: 16 KiB 1.40 / 1.46, 24 KiB 1.07 /
/// 0.75, 32 KiB 1.19 / 0.47-0.54, 48 KiB 0.77 / 0.44, 64 KiB 0.51-0.83 / 0.43-0.65 idle; beside
/// a busy process under a plain launcher 16 KiB 1.65 / 2.30, 24 KiB 1.59 / 1.04, 64 KiB
/// 0.41-0.74 / 0.83-1.07. Hence 32 KiB up to two ranks a core and 24 KiB beyond. (Beside the
/// busy process, with and without the yields' test, single-copy/inline was level: 0.97-1.03
/// at 4 ranks, 0.88-1.27 at 8.)
///
/// Elsewhere 16 KiB: 2 ranks, idle, 5 interleaved rounds (2026-12-08), single-copy against
/// inline 36 / 48 / 60 / 64 KiB 5.9 / 6.7 / 7.5 / 7.8 against 5.9 / 7.8 / 9.5 / 10.4 us (32 KiB
/// level, 16 KiB 4.4 against 2.9); beside a busy process 64 KiB 15.5-16.5 against 19.5-23.5
/// (dcrun) and 14.6-16.6 against 19.7-28.6 (unbound); in the VM's slow minutes 64 KiB 9-10
/// against 36-40 us, 16 / 24 / 32 KiB 5.6-6.3 / 6.1-6.8 / 6.7-7.9 against 10.1-12.7 /
/// 14.5-15.4 / 19.2-20.2 (inline, the writer's stores to lines the reader held wait on each
/// line), and 8 KiB 5.0-5.9 against 5.6-7.5 (close: inline below 16 KiB). But on 2026-12-06
/// inline took 0.53-0.66x the single-copy time at 40-64 KiB: the machine decides, so it is
/// measured as where crowded (inline taken while clearly faster, see `pick`).
pub(super) fn inline_max_unpicked() -> usize {
    static MAX: once_cell::sync::Lazy<usize> = once_cell::sync::Lazy::new(|| {
        if !crate::completion::oversubscribed() {
            return 16 * 1024;
        }
        let (local, cores) = (crate::params::get().local_world_size.unwrap_or(1), crate::completion::host_cores());
        if local <= 2 * cores { 32 * 1024 } else { 24 * 1024 }
    });
    *MAX
}

