//! Aborting a communicator: marked, its pending operations failed on every wire, its members told.

use super::endpoint::{ABORT_MISMATCH, ABORT_PANIC, SocketTransport, lock};
use super::wire::WIRES;
use super::frame::{FrameKind, Header};
use super::ops::CtxState;
use crate::dc_log;
use crate::error::{Error, Status};
use crate::log::Level;
use std::sync::Arc;
use std::time::Duration;

/// Aborts of contexts not created here yet that are kept, at most.
pub(super) const MAX_EARLY_ABORTS: usize = 4096;
/// The WARN line for a full list is said once per process.
static EARLY_FULL_SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long an abort waits to connect to a member it never talked to.
pub(super) const ABORT_CONNECT_WAIT: Duration = Duration::from_secs(5);

impl SocketTransport {
    /// Marks `ctx` aborted (`mark`), fails every pending operation of aborted contexts and tells
    /// `members` (world ranks) why (`code`: 0 for dc_comm_abort, [`ABORT_MISMATCH`]), all before
    /// any goodbye can be queued: a thread the abort releases may destroy the comm at once, and
    /// its goodbye must not reach the peers first (they would report a lost peer instead).
    pub fn abort_ctx(&self, ctx: &Arc<CtxState>, members: &[u32], code: u32, mark: impl FnOnce()) {
        let _order = lock(&self.abort_order);
        mark();
        self.fail_aborted();
        for &m in members {
            if m != self.rank {
                // Members we never talked to are told too (connected to for it, briefly: a
                // dead one must not hold the abort up).
                let p = self.peer(m);
                if self.connect_peer(p, self.connect_wait.min(ABORT_CONNECT_WAIT)).is_ok() {
                    let _ = self.send_control(p, Header { check: code, ..Header::control(FrameKind::Abort, ctx.id) });
                }
            }
        }
    }

    pub(super) fn fail_aborted(&self) {
        let ops = lock(&self.matcher).drain_posted(|op| op.ctx.is_aborted());
        for op in ops {
            op.comp.complete(Err(aborted_error(&op.ctx)));
        }
        for p in self.active().iter() {
            for w in WIRES {
                w.fail_aborted(self, p);
            }
            // A single-copy send may be being read: it completes on the receiver's answer to
            // the withdrawal (one round trip), not before, or the caller could free memory the
            // receiver still reads (a waiter that gives up first revokes it, see `cancel_send`).
            let aborted: Vec<_> = lock(&p.awaiting_fin).iter().filter(|(_, op)| op.ctx.is_aborted()).map(|(&c, op)| (c, op.clone())).collect();
            for (cookie, op) in aborted {
                self.send_withdraw(p, cookie, &op);
            }
        }
    }

    /// Marks context `ctx_id` aborted by world rank `from`, as soon as its `Abort` frame is read
    /// (under the connection's lock): a goodbye read after it, perhaps by another thread, then
    /// finds the context aborted and its waiters report the abort, not a closed connection.
    /// The pending operations are failed afterwards (`fail_aborted`), outside that lock.
    pub(super) fn note_remote_abort(&self, ctx_id: u64, from: u32, code: u32) {
        let ctx = lock(&self.ctxs).get(&ctx_id).and_then(|w| w.upgrade());
        let why = match code {
            ABORT_MISMATCH => " after it found mismatched collective arguments (DC_ERR_MISMATCH there)",
            ABORT_PANIC => " after a panic in the library there (DC_ERR_INTERNAL there, naming it)",
            _ => "",
        };
        match ctx {
            Some(c) => {
                if c.abort(&format!("rank {from} aborted the communicator{why}")) {
                    dc_log!(Level::Warn, Some(self.rank as usize), "rank {from} aborted communicator {ctx_id:#x}");
                }
            }
            None => {
                // Kept until the context is created here; a peer that sends aborts for contexts
                // that never come (a bug, or a hostile peer) cannot grow the list without bound.
                let mut early = lock(&self.early_aborts);
                if early.len() < MAX_EARLY_ABORTS {
                    early.insert(ctx_id);
                } else if !early.contains(&ctx_id) && !EARLY_FULL_SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    dc_log!(Level::Warn, Some(self.rank as usize), "rank {from} aborted communicator {ctx_id:#x}, unknown here; {MAX_EARLY_ABORTS} such aborts are kept already, further ones are dropped");
                }
            }
        }
    }
}

/// What an operation of aborted context `ctx` fails with.
pub(super) fn aborted_error(ctx: &CtxState) -> Error {
    ctx.abort_error().unwrap_or_else(|| Error::new(Status::Aborted, "aborted"))
}
