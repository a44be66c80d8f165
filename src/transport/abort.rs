//! Aborting a communicator: marked, its pending operations failed on every wire, its members told.

use super::endpoint::{ABORT_MISMATCH, SocketTransport, lock};
use super::tcp_io::Sink;
use super::frame::{FrameKind, Header};
use super::ops::CtxState;
use crate::dc_log;
use crate::error::{Error, Status};
use crate::log::Level;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

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
        let fail = |c: &Arc<CtxState>| Err(c.abort_error().unwrap_or_else(|| Error::new(Status::Aborted, "aborted")));
        let ops = lock(&self.matcher).drain_posted(|op| op.ctx.is_aborted());
        for op in ops {
            op.comp.complete(fail(&op.ctx));
        }
        for p in self.active().iter() {
            {
                let mut rx = lock(&p.rx);
                if let Sink::User { op, .. } = &rx.sink {
                    if op.ctx.is_aborted() {
                        let op = op.clone();
                        rx.sink = Sink::Discard;
                        op.filling_from.store(u32::MAX, Ordering::Release);
                        op.comp.complete(fail(&op.ctx));
                    }
                }
            }
            for s in lock(&p.streams_in).iter_mut() {
                if let Some(ctx) = s.op.as_ref().map(|o| o.ctx.clone()).filter(|c| c.is_aborted()) {
                    s.finish(fail(&ctx).err());
                }
            }
            if let Some(out) = p.ring_out.get() {
                for s in lock(&out.tx).streams.iter_mut() {
                    if let Some(op) = s.op.as_ref().filter(|o| o.ctx.is_aborted()).cloned() {
                        s.detach();
                        op.comp.complete(fail(&op.ctx));
                    }
                }
            }
            lock(&p.awaiting_fin).retain(|_, op| {
                let aborted = op.ctx.is_aborted();
                if aborted {
                    op.comp.complete(fail(&op.ctx));
                }
                !aborted
            });
            let mut q = lock(&p.tx);
            let mut i = 0;
            while i < q.len() {
                let aborted = q[i].op.as_ref().is_some_and(|o| o.ctx.is_aborted());
                if aborted && q[i].hdr_off == 0 {
                    let it = q.remove(i).unwrap();
                    let op = it.op.unwrap();
                    op.comp.complete(fail(&op.ctx));
                    continue;
                }
                if aborted {
                    if let Some(op) = q[i].detach() {
                        op.comp.complete(fail(&op.ctx));
                    }
                }
                i += 1;
            }
        }
    }

    pub(super) fn on_remote_abort(&self, ctx_id: u64, from: u32, code: u32) {
        let ctx = lock(&self.ctxs).get(&ctx_id).and_then(|w| w.upgrade());
        let why = match code {
            ABORT_MISMATCH => " after it found mismatched collective arguments (DC_ERR_MISMATCH there)",
            _ => "",
        };
        match ctx {
            Some(c) => {
                if c.abort(&format!("rank {from} aborted the communicator{why}")) {
                    dc_log!(Level::Warn, Some(self.rank as usize), "rank {from} aborted communicator {ctx_id:#x}");
                }
            }
            None => {
                lock(&self.early_aborts).insert(ctx_id);
            }
        }
        self.fail_aborted();
    }
}
